"""Contract cases 1-7: opening, refusing files, round trips, history, reopen, close, busy."""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

from langgraph.checkpoint.base import ERROR, INTERRUPT, RESUME, SCHEDULED, WRITES_IDX_MAP
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Interrupt, Send

from ..errors import (
    CheckpointNotFound,
    ReplayUnavailable,
    StoreBusy,
    StoreClosed,
    StoreError,
    ThreadBusy,
    UnsupportedFormat,
)
from ..sqlite import schema
from ._helpers import AnyCall as _Call
from ._helpers import dump as _dump
from ._helpers import expect_error as _expect
from ._helpers import plain_config as _config
from ._helpers import put_chain as _put_chain
from ._helpers import values_checkpoint as _checkpoint
from .harness import ContractEnv, contract_case, raw

# --- helpers -----------------------------------------------------------------------


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _seqs(store: Any, thread_id: str) -> list[int]:
    return [e.seq for e in store.events_after(thread_id, 0, 10_000)]


# --- 1. opening ---------------------------------------------------------------------


@contract_case(1)
def case_new_file_is_wal_full_and_versioned(env: ContractEnv) -> None:
    """A new file opens in WAL mode with synchronous=FULL and records its schema version."""
    assert not os.path.exists(env.path)
    store = env.open()
    stats = store.stats()
    assert stats["journal_mode"] == "wal", stats
    assert stats["synchronous"] == 2, stats  # FULL
    assert stats["schema_version"] == schema.SCHEMA_VERSION, stats
    conn = sqlite3.connect(env.path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION
        assert conn.execute("PRAGMA application_id").fetchone()[0] == schema.APPLICATION_ID
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


@contract_case(1)
def case_second_open_takes_no_write_lock(env: ContractEnv) -> None:
    """A second open of a set-up file migrates nothing: it succeeds while the write lock is held."""
    first = env.open()
    _put_chain(first, "t", 2)
    before = _dump(env.path)
    blocker = sqlite3.connect(env.path, isolation_level=None, timeout=0)
    try:
        blocker.execute("BEGIN IMMEDIATE")  # hold the file's write lock
        # Any write during open (a migration, a pragma that writes) would
        # wait for that lock and fail with StoreBusy after 0.2 s.
        second = env.open(busy_timeout=0.2)
        assert second.stats()["schema_version"] == schema.SCHEMA_VERSION
        assert second.get_tuple(_config("t")) is not None
        blocker.execute("ROLLBACK")
    finally:
        blocker.close()
    assert _dump(env.path) == before


# --- 2. refusing files --------------------------------------------------------------


@contract_case(2)
def case_newer_schema_is_refused_unchanged(env: ContractEnv) -> None:
    """A file of a newer schema is refused with UnsupportedFormat, byte for byte unchanged."""
    raw(env.open()).close()
    conn = sqlite3.connect(env.path)
    conn.execute(f"PRAGMA user_version = {schema.SCHEMA_VERSION + 7}")
    conn.commit()
    conn.close()
    before = _read_bytes(env.path)
    exc = _expect(env.open, UnsupportedFormat)
    assert "newer" in str(exc) and env.path in str(exc), str(exc)
    assert str(schema.SCHEMA_VERSION + 7) in str(exc), str(exc)
    assert _read_bytes(env.path) == before
    assert not os.path.exists(env.path + "-wal") or _read_bytes(env.path + "-wal") == b""


@contract_case(2)
def case_non_database_is_refused_unchanged(env: ContractEnv) -> None:
    """A file that is not a database is refused with UnsupportedFormat and left unchanged."""
    content = b"this is a text file, not a database\n" * 200
    with open(env.path, "wb") as f:
        f.write(content)
    exc = _expect(env.open, UnsupportedFormat)
    assert env.path in str(exc), str(exc)
    assert _read_bytes(env.path) == content
    assert not os.path.exists(env.path + "-wal")


@contract_case(2)
def case_other_applications_database_is_refused_unchanged(env: ContractEnv) -> None:
    """An SQLite file of another application (tables, user_version or application_id) is refused."""
    variants = [
        ["CREATE TABLE notes (body TEXT)", "INSERT INTO notes VALUES ('keep me')"],
        ["CREATE TABLE notes (body TEXT)", "PRAGMA user_version = 1"],
        ["PRAGMA journal_mode = wal", "CREATE TABLE t (x)", "PRAGMA user_version = 1"],
        # No tables at all, but the file says whose it is.
        ["PRAGMA application_id = 1234"],
    ]
    for statements in variants:
        conn = sqlite3.connect(env.path, isolation_level=None)
        for statement in statements:
            conn.execute(statement)
        conn.close()
        before = _read_bytes(env.path)
        exc = _expect(env.open, UnsupportedFormat)
        assert env.path in str(exc), str(exc)
        assert _read_bytes(env.path) == before, statements
        os.remove(env.path)


def _open_at(env: ContractEnv, path: str) -> None:
    """Open (and close) a store on a path other than the env's file."""
    from ..sqlite.saver import FencedSqliteSaver

    FencedSqliteSaver(path, clock=env.clock).close()


@contract_case(2)
def case_missing_directory_is_refused(env: ContractEnv) -> None:
    """A path in a missing directory is a StoreError naming the path; nothing is created."""
    missing_dir = os.path.join(os.path.dirname(env.path), "no", "such", "dir")
    path = os.path.join(missing_dir, "x.db")
    exc = _expect(lambda: _open_at(env, path), StoreError)
    assert not isinstance(exc, StoreClosed)
    assert path in str(exc) and "open" in str(exc), str(exc)
    assert not os.path.exists(os.path.join(os.path.dirname(env.path), "no"))


# --- 3. round trips -----------------------------------------------------------------


_UNICODE = "héllo wörld — 你好, мир 🙂 \u200b\U0001f680 'quotes' \"double\" \\ back"


def _rich_values() -> dict[str, Any]:
    return {
        "text": _UNICODE,
        "ключ-🙂": {"nested": [1, -2, 3.5, None, True, False, "二", {"deeper": [[], {}]}]},
        "ints": [0, 2**63 - 1, -(2**63)],
        "float": 1e-300,
        "bytes": b"\x00\x01\xff" * 10,
        "when": datetime(2024, 2, 29, 12, 30, tzinfo=timezone.utc),
        "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "decimal": Decimal("3.14159265358979323846"),
        "set": {1, 2, 3},
        "send": Send("node", {"arg": _UNICODE}),
        "big_text": "é漢🙂x" * 500_000,  # ~2 MB of UTF-8
        "big_bytes": os.urandom(3 * 1024 * 1024),
    }


@contract_case(3)
def case_values_metadata_and_writes_round_trip(env: ContractEnv) -> None:
    """Checkpoints, metadata and pending writes read back exactly as written (unicode, MBs)."""
    store = env.open()
    thread_id, ns = "线程-ü-🙂", "子图:ü|x"
    cp = _checkpoint(_rich_values())
    cp["versions_seen"] = {"node-ü": {"text": cp["channel_versions"]["text"]}}
    metadata = {
        "source": "loop",
        "step": 7,
        "parents": {"": "parent-id"},
        "ünïcode": {"list": [1, "二", None, True, 1.5], "empty": {}},
        "run_id": "run-🙂",
    }
    stored = store.put(_config(thread_id, ns), cp, metadata, cp["channel_versions"])
    assert stored["configurable"] == {
        "thread_id": thread_id,
        "checkpoint_ns": ns,
        "checkpoint_id": cp["id"],
    }
    got = store.get_tuple(stored)
    assert got is not None
    assert got.checkpoint == cp, "checkpoint differs after a round trip"
    assert got.metadata == metadata
    assert got.config["configurable"] == stored["configurable"]
    assert got.parent_config is None
    listed = list(store.list(_config(thread_id, ns)))
    assert [t.checkpoint for t in listed] == [cp]


@contract_case(3)
def case_pending_writes_round_trip_in_langgraph_order(env: ContractEnv) -> None:
    """Pending writes, every WRITES_IDX_MAP channel included, read back as InMemorySaver's."""
    assert set(WRITES_IDX_MAP) == {ERROR, SCHEDULED, INTERRUPT, RESUME}
    store = env.open()
    reference = InMemorySaver()
    cp = _checkpoint({"x": 1})
    batches: list[tuple[list[tuple[str, Any]], str, str]] = [
        (
            [
                ("messages", [{"role": "user", "content": _UNICODE}]),
                ("频道", {"nested": {"a": [1, 2, {"b": None}]}}),
                ("large", "x" * (1024 * 1024)),
            ],
            "task-b",
            "~__pregel_pull, node-b",
        ),
        (
            [
                (INTERRUPT, [Interrupt(value={"question": _UNICODE}, id="interrupt-1")]),
                (RESUME, ["yes", {"why": "ü"}]),
                (SCHEDULED, None),
                (ERROR, "ValueError('boom')"),
            ],
            "task-a",
            "~__pregel_pull, node-a",
        ),
        ([("regular", 1), ("regular", 2)], "task-c", ""),
    ]
    results = []
    for saver in (store, reference):
        config = saver.put(_config("t"), cp, {"source": "loop", "step": 0, "parents": {}}, {})
        for writes, task_id, task_path in batches:
            saver.put_writes(config, writes, task_id, task_path)
        got = saver.get_tuple(config)
        assert got is not None
        results.append(got.pending_writes)
    ours, theirs = results
    assert ours == theirs, f"pending writes differ from InMemorySaver's:\n{ours}\n{theirs}"
    assert ours is not None
    assert {w[1] for w in ours} >= set(WRITES_IDX_MAP)


@contract_case(3)
def case_special_channels_are_last_writer_wins(env: ContractEnv) -> None:
    """Special channels are replaced by a later write; regular writes keep the first value."""
    store = env.open()
    config = store.put(_config("t"), _checkpoint(), {"source": "loop", "step": 0}, {})
    store.put_writes(config, [(RESUME, "first"), ("regular", "first")], "task")
    store.put_writes(config, [(RESUME, "second"), ("regular", "second")], "task")
    got = store.get_tuple(config)
    assert got is not None
    assert sorted((w[1], w[2]) for w in got.pending_writes) == [
        (RESUME, "second"),
        ("regular", "first"),
    ]


# --- 4. history ---------------------------------------------------------------------


@contract_case(4)
def case_history_pages_newest_first(env: ContractEnv) -> None:
    """`history` pages newest first by the last id of each page; an unknown `before` raises."""
    store = env.open()
    c1, c2, c3, c4, c5 = _put_chain(store, "t", 5)
    _put_chain(store, "other", 2)

    def ids(**kwargs: Any) -> list[str]:
        return [t.checkpoint["id"] for t in store.history("t", limit=2, **kwargs)]

    assert ids() == [c5, c4]
    assert ids(before=c4) == [c3, c2]
    assert ids(before=c2) == [c1]
    assert ids(before=c1) == []
    page = store.history("t", limit=2)
    assert [t.checkpoint["channel_values"] for t in page] == [{"step": 4}, {"step": 3}]
    assert page[0].parent_config is not None
    assert page[0].parent_config["configurable"]["checkpoint_id"] == c4
    for missing in ("not-a-checkpoint", _put_chain(store, "elsewhere", 1)[0]):
        exc = _expect(lambda m=missing: store.history("t", before=m, limit=2), CheckpointNotFound)
        assert exc.thread_id == "t" and exc.checkpoint_id == missing, exc.to_dict()
    assert store.history("never-written", limit=3) == []


@contract_case(4)
def case_history_paging_visits_every_checkpoint_once(env: ContractEnv) -> None:
    """Paging by the last id of each page visits every checkpoint exactly once, any page size."""
    store = env.open()
    written = _put_chain(store, "t", 11)
    _put_chain(store, "t", 3, ns="sub:1")
    for size in (1, 2, 3, 4, 10, 11, 50):
        seen: list[str] = []
        before = None
        while True:
            page = store.history("t", before=before, limit=size)
            assert len(page) <= size
            if not page:
                break
            seen.extend(t.checkpoint["id"] for t in page)
            before = page[-1].checkpoint["id"]
        assert seen == written[::-1], size


@contract_case(4)
def case_list_pages_by_either_shape_of_before(env: ContractEnv) -> None:
    """`list`'s `before` is a config or a checkpoint's own key (LangGraph's Agent Server's)."""
    store = env.open()
    written = _put_chain(store, "t", 7)
    _put_chain(store, "other", 2)
    config = {"configurable": {"thread_id": "t"}}
    for shape in ("config", "key"):
        seen: list[str] = []
        before: Any = None
        for _ in range(len(written)):  # bounded: a `before` read as none repeats page 1
            page = list(store.list(config, before=before, limit=3))
            if not page:
                break
            seen.extend(t.checkpoint["id"] for t in page)
            last = page[-1].config["configurable"]
            if shape == "config":
                before = {"configurable": dict(last)}
            else:  # the Agent Server's: the checkpoint's key, no `configurable`
                before = {k: last[k] for k in ("thread_id", "checkpoint_ns", "checkpoint_id")}
        assert seen == written[::-1], shape


# --- 5. reopen ----------------------------------------------------------------------


@contract_case(5, needs={"reopen"})
def case_reopen_keeps_everything(env: ContractEnv) -> None:
    """After close and reopen, checkpoints, writes, claims, tokens, seqs and floors remain."""
    store = env.open()
    granted = store.claim("t", "alice", 100)
    fenced = granted.config()
    ids = _put_chain(store, "t", 3, config=fenced)
    latest = store.get_tuple(_config("t"))
    assert latest is not None
    writes_config = {"configurable": {**fenced["configurable"], **latest.config["configurable"]}}
    store.put_writes(writes_config, [("w", {"ü": 1})], "task")
    store.append_events("t", granted.token, [("note", {"n": 1}), ("note", {"n": 2})])
    floor = store.compact_events("t", 3)
    other = store.claim("t2", "bob", 5)
    store.release("t2", other.token)
    before_events = store.events_after("t", floor - 1, 100)
    before_latest = store.get_tuple(_config("t"))
    before_list = [t.checkpoint["id"] for t in store.list(_config("t"))]
    counter = store.stats()["token_counter"]

    store = env.reopen(store)
    assert store.current_claim("t") == granted
    assert store.current_claim("t2") is None
    assert store.get_tuple(_config("t")) == before_latest
    assert [t.checkpoint["id"] for t in store.list(_config("t"))] == before_list == ids[::-1]
    assert store.events_after("t", floor - 1, 100) == before_events
    exc = _expect(lambda: store.events_after("t", 0, 100), ReplayUnavailable)
    assert exc.floor == floor == 3
    assert store.stats()["token_counter"] == counter
    # The claim is still live and still fences: the same token writes on.
    busy = _expect(lambda: store.claim("t", "carol", 10), ThreadBusy)
    assert busy.holder == "alice"
    seqs = store.append_events("t", granted.token, [("after-reopen", {})])
    assert seqs == [before_events[-1].seq + 1]
    taken = store.take_over("t", "carol", 10)
    assert taken.token > max(granted.token, other.token)


# --- 6. closing ---------------------------------------------------------------------


@contract_case(6)
def case_close_twice_then_calls_raise_store_closed(env: ContractEnv) -> None:
    """`close()` twice is fine; any call after it raises `StoreClosed`."""
    store = env.open()
    raw(store).close()
    raw(store).close()
    try:
        store.get_tuple({"configurable": {"thread_id": "t"}})
    except StoreClosed:
        pass
    else:
        raise AssertionError("get_tuple after close() did not raise StoreClosed")


@contract_case(6)
def case_every_call_after_close_raises_store_closed(env: ContractEnv) -> None:
    """Reads, writes, claims and events after `close()` (sync or async) all raise StoreClosed."""
    store = env.open()
    granted = store.claim("t", "alice", 10)
    ids = _put_chain(store, "t", 1, config=granted.config())
    store.close()
    store.close()
    cp_config = _config("t", checkpoint_id=ids[0])
    calls: dict[str, _Call] = {
        "get_tuple": lambda: store.get_tuple(cp_config),
        "list": lambda: list(store.list(None)),
        "put": lambda: store.put(cp_config, _checkpoint(), {"source": "loop", "step": 1}, {}),
        "put_writes": lambda: store.put_writes(cp_config, [("c", 1)], "task"),
        "history": lambda: store.history("t"),
        "claim": lambda: store.claim("u", "bob", 5),
        "renew": lambda: store.renew("t", granted.token, 5),
        "release": lambda: store.release("t", granted.token),
        "append_events": lambda: store.append_events("t", granted.token, [("k", {})]),
        "events_after": lambda: store.events_after("t", 0, 10),
        "wait_events": lambda: store.wait_events("t", 0, limit=10, timeout=0.01),
        "compact_events": lambda: store.compact_events("t", 2),
        "delete_thread": lambda: store.delete_thread("t"),
        "setup": lambda: store.setup(),
        "stats": lambda: store.stats(),
    }
    for op, call in calls.items():
        exc = _expect(call, StoreClosed)
        assert env.path in str(exc), (op, str(exc))
    # What was committed before close is still there for the next store.
    again = env.open()
    assert again.current_claim("t") == granted


# --- 7. busy ------------------------------------------------------------------------


@contract_case(7)
def case_blocked_write_raises_store_busy_and_reads_go_on(env: ContractEnv) -> None:
    """A write behind another connection's write transaction waits busy_timeout, then StoreBusy."""
    store = env.open(busy_timeout=0.2)
    ids = _put_chain(store, "t", 2)
    before = _dump(env.path)
    seqs_before = _seqs(store, "t")
    blocker = sqlite3.connect(env.path, isolation_level=None, timeout=0)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        blocker.execute("UPDATE meta SET value = value WHERE key = 'token_counter'")
        parent = _config("t", checkpoint_id=ids[-1])
        writes: dict[str, _Call] = {
            "put": lambda: store.put(parent, _checkpoint(), {"source": "loop", "step": 9}, {}),
            "put_writes": lambda: store.put_writes(parent, [("c", 1)], "task"),
            "claim": lambda: store.claim("t", "alice", 10),
        }
        for op, call in writes.items():
            started = time.monotonic()
            exc = _expect(call, StoreBusy)
            elapsed = time.monotonic() - started
            assert exc.op == op and exc.path == env.path, exc.to_dict()
            assert op in str(exc) and env.path in str(exc), str(exc)
            # It waited (about) busy_timeout, not zero; the bound only avoids a hang.
            assert exc.waited_s >= 0.19 and elapsed >= 0.19, (exc.waited_s, elapsed)
            assert elapsed < 30
            # Reads on the same file go on meanwhile, through the same store.
            assert store.get_tuple(_config("t")).checkpoint["id"] == ids[-1]
            assert [t.checkpoint["id"] for t in store.list(_config("t"))] == ids[::-1]
            assert _seqs(store, "t") == seqs_before
        blocker.execute("ROLLBACK")
    finally:
        blocker.close()
    assert _dump(env.path) == before, "a refused write changed the file"
    # Once the lock is free, the next write lands with the next seq: none was spent.
    _put_chain(store, "t", 1, config=_config("t", checkpoint_id=ids[-1]))
    assert _seqs(store, "t") == list(range(1, len(seqs_before) + 2))
