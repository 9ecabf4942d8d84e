"""Contract cases 34 and 35 (cells): stored data is checked before it is trusted.

Each case plants damage with plain sqlite3, as a failing disk, a stray tool or
an attacker would, then reads through every API that shows that row. A
damaged value must be `UndecodableRow`, never a different value; a cell of
the wrong shape or SQL type must be a package error naming it, never a raw
`TypeError`, `RecursionError` or `sqlite3` error; and a refused call leaves
the file as it was. (Case 35's argument half is in `cases_edges_input`.)
"""

from __future__ import annotations

import base64
import os
import pickle
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, TypeVar

from ..core import envelopes
from ..errors import FencedSqliteError, StoreError, UndecodableRow
from ._helpers import AnyCall as _Call
from ._helpers import dump as _dump
from ._helpers import expect_error as _expect
from ._helpers import plain_config as _config
from ._helpers import plant as _plant
from ._helpers import put_chain as _put_chain
from ._helpers import values_checkpoint as _checkpoint
from .harness import ContractEnv, contract_case

_E = TypeVar("_E", bound=FencedSqliteError)

_DEEP = "[" * 100_000 + "]" * 100_000


def _cell(path: str, table: str, column: str, where: str) -> Any:
    conn = sqlite3.connect(path)
    conn.text_factory = bytes  # raw cell bytes, whatever they are
    try:
        return conn.execute(f"SELECT {column} FROM {table} WHERE {where}").fetchone()[0]
    finally:
        conn.close()


def _set_raw(path: str, table: str, column: str, where: str, data: bytes, text: bool) -> None:
    # CAST keeps a TEXT column TEXT even when `data` is not valid UTF-8.
    value = "CAST(? AS TEXT)" if text else "?"
    _plant(path, f"UPDATE {table} SET {column} = {value} WHERE {where}", (data,))


def _damages(data: bytes, other: bytes) -> dict[str, bytes]:
    """Each way case 34 damages a cell holding `data` (`other`: a neighbour's cell)."""
    mid = len(data) // 2

    def flip(bit: int) -> bytes:
        return data[:mid] + bytes([data[mid] ^ bit]) + data[mid + 1 :]

    return {
        "flipped low bit": flip(0x04),
        "flipped high bit": flip(0x80),  # in text: bytes that are not UTF-8
        "appended bytes": data + b"\x00\x01junk",
        "cut": data[: max(0, len(data) - 3)],
        # A neighbour's cell, or (where both are alike) a different valid one.
        "replaced": other if other != data else b"null",
    }


# --- 34. damage in place ------------------------------------------------------------

# The cells a checkpoint row's checksum covers, and whether each is TEXT.
_CHECKPOINT_CELLS = [
    ("envelope", True),
    ("values_type", True),
    ("values_blob", False),
    ("metadata", True),
]


@contract_case(34)
def case_damaged_checkpoint_and_write_cells_are_undecodable(env: ContractEnv) -> None:
    """A flipped bit, appended bytes, a cut or a replaced cell is UndecodableRow everywhere."""
    store = env.open()
    ids = _put_chain(store, "t", 2)
    latest = _config("t", checkpoint_id=ids[1])
    store.put_writes(latest, [("chan", {"value": "éé" * 20}), ("other", b"raw")], "task")
    good = store.get_tuple(latest)
    assert good is not None
    targets: list[tuple[str, str, bool, str, str]] = [
        ("checkpoints", col, text, f"checkpoint_id = '{ids[1]}'", f"checkpoint_id = '{ids[0]}'")
        for col, text in _CHECKPOINT_CELLS
    ]
    targets += [
        ("writes", col, text, "channel = 'chan'" if col != "channel" else "idx = 0", "idx = 1")
        for col, text in [("channel", True), ("type", True), ("blob", False)]
    ]
    reads: dict[str, _Call] = {
        "get_tuple latest": lambda: store.get_tuple(_config("t")),
        "get_tuple by id": lambda: store.get_tuple(latest),
        "list": lambda: list(store.list(_config("t"))),
        "history": lambda: store.history("t"),
    }
    for table, column, text, where, neighbour in targets:
        original = _cell(env.path, table, column, where)
        other = _cell(env.path, table, column, neighbour)
        for damage, data in _damages(original, other).items():
            label = f"{table}.{column} {damage}"
            _set_raw(env.path, table, column, where, data, text)
            for what, read in reads.items():
                exc = _expect(read, UndecodableRow)
                assert exc.thread_id == "t" and exc.checkpoint_id == ids[1], (label, what, exc)
                assert "t" in str(exc) and ids[1] in str(exc), (label, what, str(exc))
            shown = store.inspect_checkpoint("t", checkpoint_id=ids[1])
            assert shown is not None, label
            if table == "checkpoints":
                assert shown["error"]["code"] == "undecodable_row", (label, shown["error"])
                assert shown["checkpoint"] is None and shown["metadata"] is None, label
                records = store.history_records("t")
                assert records[0]["error"]["code"] == "undecodable_row", (label, records[0])
                assert "step" not in records[0], label
                exc = _expect(lambda: store.prune(["t"]), UndecodableRow)
                assert exc.checkpoint_id == ids[1], (label, exc)
            else:
                errors = [w for w in shown["writes"] if w["error"]]
                assert len(errors) == 1 and errors[0]["value"] is None, (label, shown["writes"])
            _set_raw(env.path, table, column, where, original, text)
            assert store.get_tuple(latest) == good, f"{label}: restoring did not restore"


@contract_case(34)
def case_damaged_event_cells_are_undecodable_naming_the_seq(env: ContractEnv) -> None:
    """A damaged event kind or data is UndecodableRow naming the thread and the seq."""
    store = env.open()
    claim = store.claim("t", "alice", 60)
    store.append_events("t", claim.token, [("mine", {"note": "ünï" * 10}), ("yours", {"n": 1})])
    good = store.events_after("t", 0)
    assert [e.seq for e in good] == [1, 2]
    for column in ("kind", "data"):
        original = _cell(env.path, "events", column, "seq = 1")
        other = _cell(env.path, "events", column, "seq = 2")
        for damage, data in _damages(original, other).items():
            label = f"events.{column} {damage}"
            _set_raw(env.path, "events", column, "seq = 1", data, True)
            for what, read in {
                "events_after": lambda: store.events_after("t", 0),
                "wait_events": lambda: store.wait_events("t", 0, timeout=5),
            }.items():
                exc = _expect(read, UndecodableRow)
                assert exc.thread_id == "t" and exc.checkpoint_id is None, (label, what, exc)
                assert "seq 1" in str(exc) and "'t'" in str(exc), (label, what, str(exc))
            # Events before the damage still read.
            assert store.events_after("t", 1) == good[1:], label
            _set_raw(env.path, "events", column, "seq = 1", original, True)
            assert store.events_after("t", 0) == good, f"{label}: restoring did not restore"


_CHILD_READER = """
import base64, pickle, sys
from langgraph_fenced_sqlite import FencedSqliteSaver
path, thread_id, checkpoint_id = sys.argv[1:4]
with FencedSqliteSaver(path) as saver:
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "",
              "checkpoint_id": checkpoint_id}}
    got = saver.get_tuple(config)
    events = [e.to_dict() for e in saver.events_after(thread_id, 0)]
    out = (got.checkpoint, got.metadata, got.pending_writes, events)
sys.stdout.write(base64.b64encode(pickle.dumps(out)).decode())
"""


@contract_case(34, needs=("processes",))
def case_accepted_values_read_back_equal_in_a_fresh_process(env: ContractEnv) -> None:
    """What a put, put_writes and append_events accepted reads back equal in another process."""
    store = env.open()
    text = 'héllo — 你好 🙂 \u200b \\ "q" \x7f'
    values = {
        "text": text,
        "nested": {"a": [1, -2, 3.5, None, True, {"b": [[], {}]}], "ключ": "二"},
        "ints": [0, 2**63 - 1, -(2**63)],
        "bytes": bytes(range(256)),
        "when": datetime(2024, 2, 29, 12, 30, tzinfo=timezone.utc),
        "set": {1, 2, 3},
        "big": os.urandom(256 * 1024),
    }
    cp = _checkpoint(values)
    metadata = {"source": "input", "step": -1, "parents": {}, "note": text, "n": [1, {"x": None}]}
    config = store.put(_config("t"), cp, metadata, cp["channel_versions"])
    writes = [("chan", {"v": text}), ("__interrupt__", [text]), ("blob", b"\x00" * 10)]
    store.put_writes(config, writes, "task-ü")
    claim = store.claim("t", "alice", 60)
    store.append_events("t", claim.token, [("mine", {"text": text, "list": [1.5, None]})])
    expected_events = [e.to_dict() for e in store.events_after("t", 0)]
    done = subprocess.run(
        [sys.executable, "-c", _CHILD_READER, env.path, "t", cp["id"]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    checkpoint, got_md, pending, got_events = pickle.loads(base64.b64decode(done.stdout))
    assert checkpoint == cp, "the checkpoint differs in a fresh process"
    assert got_md == metadata
    assert sorted(pending, key=repr) == sorted([("task-ü", c, v) for c, v in writes], key=repr)
    assert got_events == expected_events and got_events[-1]["data"]["text"] == text


# --- 35. cells of the wrong shape or SQL type -----------------------------------------


def _refused(env: ContractEnv, call: _Call, errors: type[_E], *names: str) -> _E:
    """Call `call`; check it raises `errors` naming each of `names`, changing nothing."""
    before = _dump(env.path)
    exc = _expect(call, errors)
    for name in names:
        assert name in str(exc), (name, str(exc))
    assert _dump(env.path) == before, f"a refused call changed the file: {exc}"
    return exc


@contract_case(35)
def case_checkpoint_cells_of_the_wrong_shape_are_undecodable(env: ContractEnv) -> None:
    """Envelopes or metadata that are not objects, nest too deep or are not JSON."""
    store = env.open()
    ids = _put_chain(store, "t", 2)
    where = f"checkpoint_id = '{ids[1]}'"
    # Its JSON text (`envelopes.unpack`): a store reads a JSON cell as well.
    original = envelopes.unpack(_cell(env.path, "checkpoints", "envelope", where).decode())
    # (column, planted value, a word the error names, whether prune reads it)
    plants: list[tuple[str, str, str, bool]] = [
        ("envelope", value, "envelope", True)
        for value in ["[1, 2]", '"text"', "5", "null", "not json", _DEEP]
    ]
    plants += [("metadata", value, "metadata", True) for value in ["[]", '"x"', "{oops", _DEEP]]
    plants += [("envelope", '{"format": 1}', "envelope", False)]
    # Packed (`envelopes.PACKED`), but not base64, or not a zstd frame.
    plants += [("envelope", envelopes.PACKED + value, "envelope", True) for value in ["!", "AAAA"]]
    plants += [("envelope", original.replace('"format":1', '"format":"1"'), "format", False)]
    for column, value, named, prune_reads in plants:
        saved = _cell(env.path, "checkpoints", column, where)
        update = f"UPDATE checkpoints SET {column} = ? WHERE {where}"
        _plant(env.path, update, (value,), reseal=True)
        for read in (
            lambda: store.get_tuple(_config("t")),
            lambda: list(store.list(_config("t"))),
            lambda: list(store.list(_config("t"), filter={"step": 1})),
            lambda: store.history("t"),
        ):
            exc = _refused(env, read, UndecodableRow, "'t'", ids[1])
            assert exc.checkpoint_id == ids[1] and (named in str(exc) or "another" in str(exc))
        shown = store.inspect_checkpoint("t")
        assert shown is not None and shown["error"]["code"] == "undecodable_row", shown
        if column == "metadata":
            record = store.history_records("t")[0]
            assert record["error"]["code"] == "undecodable_row", record
        if prune_reads:
            _refused(env, lambda: store.prune(["t"]), UndecodableRow, ids[1])
        _plant(env.path, f"UPDATE checkpoints SET {column} = ? WHERE {where}", (saved.decode(),))
        _plant(env.path, "UPDATE checkpoints SET checksum = checksum", reseal=True)
        assert store.get_tuple(_config("t")) is not None


@contract_case(35)
def case_event_cells_of_the_wrong_shape_are_undecodable(env: ContractEnv) -> None:
    """Event data that is not JSON, not an object or nested too deep names thread and seq."""
    store = env.open()
    claim = store.claim("t", "alice", 60)
    store.append_events("t", claim.token, [("mine", {"n": 1})])
    for value in ["not json", "[1, 2]", "7", _DEEP, '{"a": NaN}']:
        _plant(env.path, "UPDATE events SET data = ? WHERE seq = 1", (value,), reseal=True)
        exc = _refused(env, lambda: store.events_after("t", 0), UndecodableRow, "'t'", "seq 1")
        assert exc.checkpoint_id is None
    _plant(env.path, "UPDATE events SET data = '{\"n\":1}' WHERE seq = 1", reseal=True)
    assert [e.data for e in store.events_after("t", 0)] == [{"n": 1}]


# (label, plant SQL, the call that reads it, the words the error must name)
_TypePlant = tuple[str, str, Callable[[Any, int], Any], tuple[str, ...]]


def _type_plants(ids: list[str]) -> list[_TypePlant]:
    cp = _config("t", checkpoint_id=ids[-1])

    def latest(s: Any, _t: int) -> Any:
        return s.get_tuple(_config("t"))

    def events(s: Any, _t: int) -> Any:
        return s.events_after("t", 0)

    def claim(s: Any, _t: int) -> Any:
        return s.claim("t", "bob", 10)

    def fenced_put(s: Any, token: int) -> Any:
        config = {"configurable": {**cp["configurable"], "__fence_token__": token}}
        return s.put(config, _checkpoint(), {"source": "loop", "step": 9}, {})

    cps = "UPDATE checkpoints SET {} WHERE checkpoint_id = '" + ids[-1] + "'"
    return [
        ("envelope as a blob", cps.format("envelope = CAST(envelope AS BLOB)"), latest, ()),
        ("values as text", cps.format("values_blob = 'x'"), latest, ("values_blob",)),
        ("position as text", cps.format("position = 'x'"), latest, ("position",)),
        ("created_at as text", cps.format("created_at = 'x'"), latest, ("created_at",)),
        ("token as blob", cps.format("token = x'01'"), latest, ("token",)),
        ("write blob as text", "UPDATE writes SET blob = 'x'", latest, ("blob",)),
        ("write channel as blob", "UPDATE writes SET channel = CAST(channel AS BLOB)", latest, ()),
        ("event ts as text", "UPDATE events SET ts = 'x' WHERE seq = 1", events, ("ts", "seq 1")),
        ("event data as blob", "UPDATE events SET data = CAST(data AS BLOB)", events, ("seq",)),
        ("expires_at as text", "UPDATE threads SET expires_at = 'x'", claim, ("expires_at",)),
        ("claim token as text", "UPDATE threads SET token = 'x'", fenced_put, ("token",)),
        ("floor as text", "UPDATE threads SET floor = 'x'", events, ("floor",)),
        ("holder as blob", "UPDATE threads SET holder = x'00'", claim, ("holder",)),
    ]


@contract_case(35)
def case_cells_of_the_wrong_sql_type_are_package_errors(env: ContractEnv) -> None:
    """Text where a number belongs, a blob where text belongs: a package error naming it."""
    store = env.open()
    ids = _put_chain(store, "t", 2)
    store.put_writes(_config("t", checkpoint_id=ids[-1]), [("chan", 1)], "task")
    token = store.claim("t", "alice", 60).token
    store.append_events("t", token, [("mine", {"n": 1})])
    store.release("t", token)
    pristine = _dump(env.path)
    for label, sql, call, names in _type_plants(ids):
        _plant(env.path, sql, reseal=True)
        before = _dump(env.path)
        try:
            call(store, token)
        except FencedSqliteError as exc:
            for name in names:
                assert name in str(exc), (label, name, str(exc))
        except Exception as exc:  # a raw error is the failure this case looks for
            raise AssertionError(f"{label}: raw {type(exc).__name__}: {exc}") from exc
        else:
            raise AssertionError(f"{label}: read as if nothing were wrong")
        assert _dump(env.path) == before, f"{label}: a refused call changed the file"
        for summary in (store.threads, store.stats):
            summary()  # never a raw error for one bad cell
        _restore(env.path, pristine)


def _restore(path: str, rows: list[tuple[Any, ...]]) -> None:
    conn = sqlite3.connect(path)
    try:
        tables = sorted({row[0] for row in rows})
        for table in tables:
            conn.execute(f"DELETE FROM {table}")
            for row in (r for r in rows if r[0] == table):
                marks = ", ".join("?" for _ in row[1:])
                conn.execute(f"INSERT INTO {table} VALUES ({marks})", row[1:])
        conn.commit()
    finally:
        conn.close()


@contract_case(35)
def case_a_missing_or_damaged_token_counter_is_a_store_error(env: ContractEnv) -> None:
    """Without an integer token counter, claim raises StoreError and issues no token."""
    store = env.open()
    first = store.claim("t", "alice", 60)
    store.release("t", first.token)
    for sql in (
        "UPDATE meta SET value = 'x' WHERE key = 'token_counter'",
        "DELETE FROM meta WHERE key = 'token_counter'",
    ):
        _plant(env.path, sql)
        for call in (
            lambda: store.claim("u", "bob", 10),
            lambda: store.take_over("t", "bob", 10),
        ):
            exc = _refused(env, call, StoreError, "token counter", env.path)
            assert not isinstance(exc, UndecodableRow)
        assert store.stats()["token_counter"] in (None, "x")
        store.threads()
        assert store.claims() == []
