"""Contract cases 29 and 30: bad input is refused, hostile rows are never decoded."""

from __future__ import annotations

import json
import math
import os
import pickle
import sqlite3
import sys
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import ormsgpack
from langgraph.checkpoint.serde import jsonplus

from ..core import envelopes
from ..errors import SerializationError, StoreClosed, UndecodableRow
from ._helpers import AnyCall as _Call
from ._helpers import dump as _dump
from ._helpers import expect_error as _expect
from ._helpers import plain_config as _config
from ._helpers import plant as _plant_row
from ._helpers import put_chain as _put_chain
from ._helpers import values_checkpoint as _checkpoint
from .harness import ContractEnv, contract_case, raw

# --- 29. bad input ------------------------------------------------------------------

_BAD_NAMES: list[tuple[Any, type[BaseException]]] = [
    ("", ValueError),
    ("x" * 100_000, ValueError),
    ("a\x00b", ValueError),
    (5, TypeError),
    (None, TypeError),
    (b"bytes", TypeError),
]
_BAD_SECONDS: list[tuple[Any, type[BaseException]]] = [
    (0, ValueError),
    (-1, ValueError),
    (-0.5, ValueError),
    (math.nan, ValueError),
    (math.inf, ValueError),
    ("10", TypeError),
    (True, TypeError),
    (None, TypeError),
]


def _bad_calls(store: Any, token: int, cp_id: str) -> list[tuple[str, _Call, type]]:
    """Every (argument name, call, error class) of case 29."""
    calls: list[tuple[str, _Call, type]] = []
    cp = _config("t", checkpoint_id=cp_id)
    md = {"source": "loop", "step": 5}
    for bad, err in _BAD_NAMES:
        calls += [
            ("thread_id", lambda b=bad: store.claim(b, "alice", 10), err),
            ("holder", lambda b=bad: store.claim("fresh", b, 10), err),
            ("thread_id", lambda b=bad: store.take_over(b, "alice", 10), err),
            ("holder", lambda b=bad: store.take_over("t", b, 10), err),
            ("thread_id", lambda b=bad: store.renew(b, token, 10), err),
            ("thread_id", lambda b=bad: store.release(b, token), err),
            ("thread_id", lambda b=bad: store.append_events(b, token, [("k", {})]), err),
            ("thread_id", lambda b=bad: store.events_after(b, 0, 10), err),
            ("thread_id", lambda b=bad: store.compact_events(b, 5), err),
            ("thread_id", lambda b=bad: store.delete_thread(b), err),
            ("thread_id", lambda b=bad: store.history(b), err),
            ("thread_id", lambda b=bad: store.wait_events(b, 0, timeout=0.01), err),
        ]
        if bad != "":  # "" is the root namespace
            calls.append(("checkpoint_ns", lambda b=bad: store.history("t", checkpoint_ns=b), err))
        if bad not in ("", None):  # before=None means "from the newest"
            calls.append(("before", lambda b=bad: store.history("t", before=b), err))
        if not (isinstance(bad, int) or bad is None):
            # LangGraph turns an int thread id into a str; None means "no thread".
            calls += [
                ("thread_id", lambda b=bad: store.get_tuple(_config(b)), err),
                ("thread_id", lambda b=bad: store.put(_config(b), _checkpoint(), md, {}), err),
            ]
        if bad not in ("", None):
            calls += [
                (
                    "checkpoint_ns",
                    lambda b=bad: store.put(_config("t", b), _checkpoint(), md, {}),
                    err,
                ),
                (
                    "checkpoint_ns",
                    lambda b=bad: store.put_writes(
                        {"configurable": {**cp["configurable"], "checkpoint_ns": b}},
                        [("c", 1)],
                        "task",
                    ),
                    err,
                ),
                (
                    "checkpoint_id",
                    lambda b=bad: store.get_tuple(_config("t", checkpoint_id=b)),
                    err,
                ),
            ]
        if bad is not None:
            calls += [
                ("task_id", lambda b=bad: store.put_writes(cp, [("c", 1)], b), err),
                (
                    "checkpoint",
                    lambda b=bad: store.put(cp, {**_checkpoint(), "id": b}, md, {}),
                    err,
                ),
            ]
    for bad, err in _BAD_SECONDS:
        calls += [
            ("ttl", lambda b=bad: store.claim("fresh", "alice", b), err),
            ("ttl", lambda b=bad: store.take_over("t", "alice", b), err),
            ("ttl", lambda b=bad: store.renew("t", token, b), err),
            ("timeout", lambda b=bad: store.wait_events("t", 0, timeout=b), err),
        ]
    for bad, err in [("1", TypeError), (1.0, TypeError), (None, TypeError), (True, TypeError)]:
        calls += [
            ("token", lambda b=bad: store.renew("t", b, 10), err),
            ("token", lambda b=bad: store.release("t", b), err),
            ("token", lambda b=bad: store.append_events("t", b, [("k", {})]), err),
        ]
    calls += [
        ("limit", lambda: store.events_after("t", 0, 0), ValueError),
        ("limit", lambda: store.history("t", limit=0), ValueError),
        ("limit", lambda: list(store.list(None, limit=0)), ValueError),
        ("limit", lambda: store.wait_events("t", 0, limit=0, timeout=1), ValueError),
        ("after_seq", lambda: store.events_after("t", -1, 10), ValueError),
        ("before_seq", lambda: store.compact_events("t", 0), ValueError),
        ("thread_id", lambda: store.get_tuple({"configurable": {}}), ValueError),
        ("config", lambda: store.get_tuple("t"), TypeError),
        ("checkpoint_id", lambda: store.put_writes(_config("t"), [("c", 1)], "task"), ValueError),
        ("filter", lambda: list(store.list(None, filter=[("a", 1)])), TypeError),
        ("events", lambda: store.append_events("t", token, "kind"), TypeError),
    ]
    return calls


@contract_case(29)
def case_bad_input_is_rejected_before_the_file_is_touched(env: ContractEnv) -> None:
    """Bad ids, ttls, timeouts and types raise a ValueError/TypeError naming the argument."""
    for kwargs, name in [
        ({"busy_timeout": 0}, "busy_timeout"),
        ({"busy_timeout": -1}, "busy_timeout"),
        ({"poll_interval": 0}, "poll_interval"),
        ({"require_claim": "yes"}, "require_claim"),
        ({"allowed_types": ["not-a-type"]}, "allowed_types"),
    ]:
        exc = _expect(lambda k=kwargs: env.open(**k), (ValueError, TypeError))
        assert name in str(exc), (kwargs, str(exc))
    assert not os.path.exists(env.path), "a refused open created the file"

    store = env.open()
    granted = store.claim("t", "alice", 10)
    cp_id = _put_chain(store, "t", 1, config=granted.config())[0]
    before = _dump(env.path)
    watcher = sqlite3.connect(env.path)
    version = watcher.execute("PRAGMA data_version").fetchone()[0]
    try:
        calls = _bad_calls(store, granted.token, cp_id)
        for name, call, err in calls:
            exc = _expect(call, (ValueError, TypeError))
            assert isinstance(exc, err), (name, type(exc), str(exc))
            assert name in str(exc), (name, str(exc))
        # No other connection committed anything meanwhile (data_version would move).
        assert watcher.execute("PRAGMA data_version").fetchone()[0] == version
    finally:
        watcher.close()
    assert _dump(env.path) == before
    # The checks run before the store is consulted at all: a closed store still
    # names the bad argument instead of raising StoreClosed.
    store.close()
    for name, call, err in calls:
        exc = _expect(call, (ValueError, TypeError, StoreClosed))
        assert isinstance(exc, err), (name, type(exc), str(exc))


# --- 30. hostile rows ---------------------------------------------------------------


@dataclass
class Parcel:
    """A user type outside the default allow-list (for case 30)."""

    label: str
    weight: float


class _Mkdir:
    """Pickles to `os.mkdir(path)`: unpickling it creates a directory."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))


def hostile_payloads(marker: str) -> dict[str, tuple[str, bytes]]:
    """Return `(type tag, blob)` rows that would create `marker` if they were decoded naively.

    Args:
        marker: A path that must not exist afterwards.
    """

    def ext(code: int, parts: list[Any]) -> bytes:
        return ormsgpack.packb(
            {"v": ormsgpack.Ext(code, ormsgpack.packb(parts))}, option=ormsgpack.OPT_NON_STR_KEYS
        )

    return {
        "pickle": ("pickle", pickle.dumps(_Mkdir(marker))),
        "unknown tag": ("definitely-not-a-tag", b"\x00\x01"),
        "legacy json tag": ("json", b'{"lc": 1, "type": "constructor"}'),
        "os.mkdir": ("msgpack", ext(jsonplus.EXT_CONSTRUCTOR_POS_ARGS, ["os", "mkdir", [marker]])),
        "builtins.eval": (
            "msgpack",
            ext(
                jsonplus.EXT_CONSTRUCTOR_SINGLE_ARG,
                ["builtins", "eval", f"__import__('os').mkdir({marker!r})"],
            ),
        ),
        "method": (
            "msgpack",
            ext(jsonplus.EXT_METHOD_SINGLE_ARG, ["os", "mkdir", marker, "__call__"]),
        ),
        "kw ctor": (
            "msgpack",
            ext(jsonplus.EXT_CONSTRUCTOR_KW_ARGS, ["subprocess", "Popen", {"args": ["true"]}]),
        ),
        "pydantic": (
            "msgpack",
            ext(jsonplus.EXT_PYDANTIC_V2, ["os", "mkdir", {"path": marker}, None]),
        ),
        # A module nobody imported: decoding must not even import it.
        "unimported module": (
            "msgpack",
            ext(jsonplus.EXT_CONSTRUCTOR_SINGLE_ARG, [_UNIMPORTED, "check", marker]),
        ),
    }


_UNIMPORTED = "tabnanny"


@contract_case(30)
def case_hostile_rows_raise_undecodable_and_run_nothing(env: ContractEnv) -> None:
    """Rows tagged pickle/unknown, or naming a type outside the allow-list, raise UndecodableRow."""
    store = env.open()
    marker = os.path.join(os.path.dirname(env.path), "code-ran")
    imported_before = _UNIMPORTED in sys.modules
    for label, (tag, blob) in hostile_payloads(marker).items():
        thread_id = f"t-{label}"
        cp_id = _put_chain(store, thread_id, 1)[0]
        cp = _config(thread_id, checkpoint_id=cp_id)
        store.put_writes(cp, [("chan", "fine")], "task")
        for table, sql in [
            (
                "checkpoints",
                "UPDATE checkpoints SET values_type = ?, values_blob = ? WHERE thread_id = ?",
            ),
            ("writes", "UPDATE writes SET type = ?, blob = ? WHERE thread_id = ?"),
        ]:
            _plant(env.path, sql, (tag, blob, thread_id))
            reads: dict[str, _Call] = {
                "get_tuple latest": lambda t=thread_id: store.get_tuple(_config(t)),
                "get_tuple by id": lambda c=cp: store.get_tuple(c),
                "list": lambda t=thread_id: list(store.list(_config(t))),
                "history": lambda t=thread_id: store.history(t),
            }
            for what, read in reads.items():
                exc = _expect(read, UndecodableRow)
                assert exc.thread_id == thread_id and exc.checkpoint_id == cp_id, (
                    label,
                    table,
                    what,
                    exc.to_dict(),
                )
                assert thread_id in str(exc) and cp_id in str(exc), str(exc)
                assert not os.path.exists(marker), f"{label} in {table} ran code"
            if table == "checkpoints":  # restore, so the writes row is what fails next
                _plant(env.path, sql, (*_encoded({"step": 0}), thread_id))
    assert imported_before or _UNIMPORTED not in sys.modules, "decoding imported a module"
    # The store stays usable.
    assert store.get_tuple(_config("clean")) is None
    _put_chain(store, "clean", 1)


def _encoded(value: Any) -> tuple[str, bytes]:
    from ..core.serde import DataOnlySerializer

    return DataOnlySerializer().dumps_typed(value)


def _plant(path: str, sql: str, params: tuple[Any, ...]) -> None:
    # With a valid checksum: these rows test the decoder, not the checksum.
    _plant_row(path, sql, params, reseal=True)


@contract_case(30)
def case_bad_envelope_or_allowed_type_with_bad_args_is_undecodable(env: ContractEnv) -> None:
    """An unknown envelope format, or an allowed type that fails to build, is UndecodableRow."""
    store = env.open()
    cp_id = _put_chain(store, "t", 1)[0]
    bad_uuid = ormsgpack.packb(
        ormsgpack.Ext(jsonplus.EXT_CONSTRUCTOR_SINGLE_ARG, ormsgpack.packb(["uuid", "UUID", "no"]))
    )
    # Values inline, as every row before the value table held them (still read).
    inline = "UPDATE checkpoints SET values_type = 'msgpack', values_blob = ? WHERE thread_id = 't'"
    _plant(env.path, inline, (bad_uuid,))
    exc = _expect(lambda: store.get_tuple(_config("t")), UndecodableRow)
    assert exc.checkpoint_id == cp_id and "uuid.UUID" in str(exc), str(exc)
    # The envelope as its JSON text (`envelopes.unpack`; a store reads JSON
    # cells as rows from before it packed them), with an unknown format.
    with closing(sqlite3.connect(env.path)) as conn:
        (cell,) = conn.execute("SELECT envelope FROM checkpoints WHERE thread_id = 't'").fetchone()
    envelope = json.loads(envelopes.unpack(cell))
    envelope["format"] = 99
    _plant(
        env.path,
        "UPDATE checkpoints SET values_type = 'msgpack', values_blob = ?, envelope = ? "
        "WHERE thread_id = 't'",
        (_encoded({"step": 0})[1], json.dumps(envelope)),
    )
    exc = _expect(lambda: store.get_tuple(_config("t")), UndecodableRow)
    assert exc.checkpoint_id == cp_id and "99" in str(exc), str(exc)


class _Opaque:
    """A plain class: LangGraph has no data encoding for it, so no reader could rebuild it."""


@contract_case(30)
def case_non_allowed_type_is_refused_at_put_naming_it(env: ContractEnv) -> None:
    """What no reader could rebuild is refused at put, naming it; a user type needs an allow.

    A value with no data encoding is refused and nothing lands. A user type is
    stored and read back by the store that stored it (it learned the class),
    and a store that neither stored nor allows it refuses it, naming the type.
    """
    store = env.open()
    ids = _put_chain(store, "t", 1)
    parent = _config("t", checkpoint_id=ids[0])
    before = _dump(env.path)
    qualname = f"{_Opaque.__module__}.{_Opaque.__qualname__}"
    for call in (
        lambda: store.put(parent, _checkpoint({"p": _Opaque()}), {"source": "loop"}, {}),
        lambda: store.put(parent, _checkpoint({"p": [{"deep": _Opaque()}]}), {}, {}),
        lambda: store.put_writes(parent, [("c", _Opaque())], "task"),
    ):
        exc = _expect(call, SerializationError)
        assert exc.type_name == qualname and qualname in str(exc), exc.to_dict()
    exc = _expect(
        lambda: store.put(parent, _checkpoint(), {"source": "loop", "x": Parcel("m", 0)}, {}),
        SerializationError,
    )
    assert "metadata" in str(exc), str(exc)
    assert _dump(env.path) == before
    values = {"p": Parcel("box", 1.5)}
    config = store.put(parent, _checkpoint(values), {"source": "loop", "step": 1}, {})
    got = store.get_tuple(config)
    assert got is not None and got.checkpoint["channel_values"] == values
    refused = _expect(lambda: env.open().get_tuple(config), UndecodableRow)
    assert f"{Parcel.__module__}.{Parcel.__name__}" in str(refused), str(refused)


@contract_case(30)
def case_allowed_types_make_a_user_type_round_trip(env: ContractEnv) -> None:
    """`allowed_types=[...]` and `with_allowlist([...])` let a user type be stored and rebuilt."""
    key = (Parcel.__module__, Parcel.__name__)
    for allowed in ([Parcel], [key]):
        store = env.open(allowed_types=allowed)
        cp = _checkpoint({"p": Parcel("box", 1.5), "many": [Parcel("a", 1.0)]})
        config = store.put(_config("t"), cp, {"source": "input", "step": -1}, {})
        store.put_writes(config, [("c", Parcel("w", 2.0))], "task")
        got = store.get_tuple(config)
        assert got is not None
        assert got.checkpoint["channel_values"] == cp["channel_values"]
        assert got.pending_writes == [("task", "c", Parcel("w", 2.0))]
        raw(store).delete_thread("t")
    # A plain store cannot read it back...
    plain = env.open()
    config = raw(env.open(allowed_types=[Parcel])).put(
        _config("u"), _checkpoint({"p": Parcel("x", 0.0)}), {"source": "input"}, {}
    )
    _expect(lambda: plain.get_tuple(config), UndecodableRow)
    # ...but its allow-listed clone can, and can write it too, on the same connection.
    clone = raw(plain).with_allowlist([key])
    assert clone is not raw(plain)
    got = clone.get_tuple(config)
    assert got is not None and got.checkpoint["channel_values"] == {"p": Parcel("x", 0.0)}
    clone.put(config, _checkpoint({"p": Parcel("y", 1.0)}), {"source": "loop", "step": 0}, {})
    got = raw(plain).with_allowlist([key]).get_tuple(_config("u"))
    assert got is not None and got.checkpoint["channel_values"] == {"p": Parcel("y", 1.0)}
    # Already-allowed types give back the same saver.
    assert raw(plain).with_allowlist([("uuid", "UUID")]) is raw(plain)
