"""`FencedPostgresSaver(readonly=True)`: reads only, refused twice, and on a hot standby.

A read-only store refuses every write with `ReadOnlyStore` before anything is
sent (no round trip, no pool connection taken), as a read-only SQLite store
refuses before touching its file; and every transaction it runs is READ ONLY
in the server, so a write on a path wrongly marked as a read fails there too.
It never creates or migrates the schema: opened where `setup()` never ran it
raises `UnsupportedFormat`, as a read-only SQLite store does on a file that
was never set up. The replica tests read a real streaming replica of the
session's server (`start_replica`: `pg_basebackup -R`, about a second).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool
from support.configs import saver_config

from langgraph_fenced_sqlite import (
    FencedSqliteSaver,
    InvalidArgument,
    ReadOnlyStore,
    RetentionPolicy,
    UnsupportedFormat,
)
from langgraph_fenced_sqlite.postgres import FencedPostgresSaver, sql
from langgraph_fenced_sqlite.testing.postgres_server import (
    round_trips,
    start_replica,
    wait_replayed,
)


def _fill(dsn: str) -> dict[str, Any]:
    """Set up a store on `dsn` with a claimed thread "t": checkpoints, writes, events."""
    with FencedPostgresSaver.from_conn_string(dsn) as saver:
        saver.setup()
        claim = saver.claim("t", "alice", 3600)
        first = saver.put(claim.config(), empty_checkpoint(), {"source": "input", "step": -1}, {})
        second = empty_checkpoint()
        config = saver.put(
            claim.config(first), second, {"source": "loop", "step": 0, "run_id": "r1"}, {}
        )
        saver.put_writes(claim.config(config), [("ch", {"v": 1})], "task-1")
        (note,) = saver.append_events("t", claim.token, [("note", {"n": 1})])
        saver.put(saver_config("idle"), empty_checkpoint(), {"source": "update", "step": 0}, {})
    return {"config": config, "first": first, "token": claim.token, "note": note}


def _rows(dsn: str) -> dict[str, list[Any]]:
    """Every row of the store's tables, and the token sequence: what "nothing changed" compares."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        out = {
            t: conn.execute(f"SELECT * FROM {t} AS r ORDER BY r::text").fetchall()
            for t in sql.TABLES
        }
        tokens = conn.execute("SELECT last_value, is_called FROM lgfs_tokens").fetchall()
    out["lgfs_tokens"] = tokens
    return out


def _reads(saver: FencedPostgresSaver, filled: dict[str, Any]) -> None:
    """Every read of the store works on it, with what `_fill` stored."""
    config, token = filled["config"], filled["token"]
    found = saver.get_tuple(config)
    assert found is not None and found.pending_writes == [("task-1", "ch", {"v": 1})]
    assert saver.get(config) is not None
    assert [t.config for t in saver.list(saver_config("t"))][0] == found.config
    assert [w.channel for w in saver.pending_writes(config)] == ["ch"]
    assert saver.current_claim("t").token == token  # type: ignore[union-attr]
    assert [c.thread_id for c in saver.claims()] == ["t"]
    assert [e.kind for e in saver.events_after("t")][-1] == "note"
    before_note = filled["note"] - 1
    assert [e.kind for e in saver.wait_events("t", before_note, timeout=5)] == ["note"]
    with saver.watch("t", before_note) as watch:
        assert next(watch).kind == "note"
    assert len(saver.history("t")) == len(saver.history_records("t")) == 2
    assert saver.inspect_checkpoint("t") is not None
    assert saver.diff_checkpoints("t") is not None
    assert [t["thread_id"] for t in saver.threads()] == ["idle", "t"]
    assert saver.thread_summary("t") is not None and saver.thread_status("t") is not None
    assert saver.namespaces("t") == [""] and saver.resolve_namespace("t", "") == ""
    assert saver.stats()["checkpoints"] == 3
    assert saver.clock.now() > 0
    saver.setup()  # only checks the schema, as a read-only SQLite store's does nothing
    assert asyncio.run(saver.aget_tuple(config)) == found


Writes = list[tuple[str, Callable[[], Any]]]


def _writes(saver: FencedPostgresSaver, filled: dict[str, Any]) -> Writes:
    """Every write of the store, each with valid arguments, and the operation it names."""
    config, token = filled["config"], filled["token"]
    new = {"source": "update", "step": 0}
    return [
        ("put", lambda: saver.put(saver_config("u"), empty_checkpoint(), new, {})),
        ("put_writes", lambda: saver.put_writes(config, [("ch", 2)], "task-2")),
        ("claim", lambda: saver.claim("u", "bob", 10)),
        ("take_over", lambda: saver.take_over("t", "bob", 10)),
        ("take_over", lambda: saver.take_over("t", "bob", 10, operator="ops")),
        ("renew", lambda: saver.renew("t", token, 10)),
        ("release", lambda: saver.release("t", token)),
        ("force_release", lambda: saver.force_release("t", operator="ops")),
        ("begin_run(reject)", lambda: saver.begin_run("u", "bob", 10, run_id="r2")),
        ("renew_run", lambda: saver.renew_run("t", token, 10)),
        ("end_run(run_completed)", lambda: saver.end_run("t", token, "run_completed")),
        ("cancel_run", lambda: saver.cancel_run("t", by="ops")),
        ("delete_unclaimed_thread", lambda: saver.delete_unclaimed_thread("idle", "bob")),
        ("append_events", lambda: saver.append_events("t", token, [("x", {})])),
        ("compact_events", lambda: saver.compact_events("t", 2)),
        ("delete_thread", lambda: saver.delete_thread("idle")),
        ("delete_for_runs", lambda: saver.delete_for_runs(["r1"], token=token)),
        ("copy_thread", lambda: saver.copy_thread("idle", "copy")),
        ("prune", lambda: saver.prune(["idle"], strategy="delete")),
        ("prune", lambda: saver.prune(["idle"], strategy="keep_latest", dry_run=True)),
        ("prune", lambda: saver.prune(["t"], strategy=RetentionPolicy(max_checkpoints=1))),
        ("sweep", lambda: saver.sweep(RetentionPolicy(max_checkpoints=1), dry_run=True)),
        ("retract_turn", lambda: saver.retract_turn("t", token)),
        ("vacuum", lambda: saver.vacuum()),
        ("put", lambda: asyncio.run(saver.aput(saver_config("u"), empty_checkpoint(), new, {}))),
        ("claim", lambda: asyncio.run(saver.aclaim("u", "bob", 10))),
    ]


def _refused(write: Callable[[], Any], op: str, where: str) -> None:
    with pytest.raises(ReadOnlyStore) as caught:
        write()
    assert caught.value.op == op and caught.value.code == "read_only_store"
    assert f"{op} on {where}: the store is read-only" in str(caught.value), str(caught.value)


def test_every_write_is_refused_before_a_statement_is_sent_and_reads_work(pg_dsn: str) -> None:
    """Reads answer; each write raises ReadOnlyStore naming it, sending nothing; nothing changes."""
    filled = _fill(pg_dsn)
    before = _rows(pg_dsn)
    with FencedPostgresSaver.from_conn_string(pg_dsn, readonly=True) as saver:
        assert saver.readonly
        _reads(saver, filled)
        conn = saver._engine._conn
        for op, write in _writes(saver, filled):
            assert round_trips(conn, lambda w=write, o=op: _refused(w, o, saver.path)) == 0, op
        # Its session is read-only, so a read costs what it costs a writable store.
        with FencedPostgresSaver.from_conn_string(pg_dsn) as writable:
            usual = round_trips(writable._engine._conn, lambda: writable.current_claim("t"))
        assert round_trips(conn, lambda: saver.current_claim("t")) == usual
        # Validation still comes first, as on SQLite: a bad argument is named.
        with pytest.raises(InvalidArgument) as bad:
            saver.claim("t", "", 10)
        assert bad.value.argument == "holder"
    assert _rows(pg_dsn) == before
    with pytest.raises(InvalidArgument) as bad:
        FencedPostgresSaver.from_conn_string(pg_dsn, readonly="yes").__enter__()
    assert bad.value.argument == "readonly"


def test_a_pooled_readonly_store_takes_no_connection_for_a_write(pg_dsn: str) -> None:
    """On a pool, a refused write asks the pool for nothing; a writable saver on it still writes."""
    filled = _fill(pg_dsn)
    with ConnectionPool(pg_dsn, min_size=1, max_size=2, open=True) as pool:
        saver = FencedPostgresSaver(pool, readonly=True)
        _reads(saver, filled)
        asked = pool.get_stats()["requests_num"]
        for op, write in _writes(saver, filled):
            _refused(write, op, saver.path)
        assert pool.get_stats()["requests_num"] == asked
        # The read-only transactions left the pool's sessions writable for others.
        writer = FencedPostgresSaver(pool)
        assert writer.claim("u", "bob", 10).token > filled["token"]


@pytest.mark.parametrize("how", ["from_conn_string", "connection", "pool"])
def test_the_server_refuses_a_write_sent_as_a_read(pg_dsn: str, how: str) -> None:
    """A write on a path marked read-only (a bug) still fails, in the server: ReadOnlyStore.

    Three ways in: the session of `from_conn_string` is read-only; a caller's
    connection or pool is not, so each transaction is made READ ONLY.
    """
    _fill(pg_dsn)
    before = _rows(pg_dsn)

    def sneak(cur: Any) -> None:
        cur.execute("DELETE FROM lgfs_events")

    def check(saver: FencedPostgresSaver) -> None:
        with pytest.raises(ReadOnlyStore, match="read-only transaction") as caught:
            saver._engine.run("sneak", sneak, read_only=True)
        assert isinstance(caught.value.__cause__, psycopg.errors.ReadOnlySqlTransaction)

    if how == "from_conn_string":
        with FencedPostgresSaver.from_conn_string(pg_dsn, readonly=True) as saver:
            check(saver)
    elif how == "connection":
        with psycopg.connect(pg_dsn) as conn:  # not in autocommit: psycopg begins it
            check(FencedPostgresSaver(conn, readonly=True))
            assert conn.execute("SELECT 1").fetchone() == (1,)  # rolled back, usable
    else:
        with ConnectionPool(pg_dsn, min_size=1, max_size=1, open=True) as pool:
            check(FencedPostgresSaver(pool, readonly=True))
    assert _rows(pg_dsn) == before


def test_a_readonly_store_needs_the_schema_at_this_version_and_never_migrates(
    pg_dsn: str, tmp_path: Any
) -> None:
    """Missing (no setup()) or older: UnsupportedFormat at open, as on SQLite; nothing is made."""
    # SQLite's read-only open of a file that was never set up, for comparison.
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with pytest.raises(UnsupportedFormat, match="read-only store cannot"):
        FencedSqliteSaver(str(empty), readonly=True)

    with pytest.raises(UnsupportedFormat) as missing:
        FencedPostgresSaver.from_conn_string(pg_dsn, readonly=True).__enter__()
    assert "setup() has not run" in str(missing.value) and missing.value.op == "open"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute(sql.HAS_MIGRATIONS_TABLE).fetchone() == (False,)  # nothing created

        _fill(pg_dsn)
        conn.execute("DELETE FROM lgfs_migrations WHERE v = %s", (sql.SCHEMA_VERSION,))
        with pytest.raises(UnsupportedFormat, match="needs migrating"):
            FencedPostgresSaver(conn, readonly=True)
        writable = FencedPostgresSaver(conn)  # a writable store opens, setup() migrates
        writable.setup()
        saver = FencedPostgresSaver(conn, readonly=True)
        conn.execute("INSERT INTO lgfs_migrations VALUES (%s)", (sql.SCHEMA_VERSION + 1,))
        with pytest.raises(UnsupportedFormat, match="newer") as newer:
            saver.setup()
        assert newer.value.op == "setup"
        top = conn.execute("SELECT max(v) FROM lgfs_migrations").fetchone()
        assert top == (sql.SCHEMA_VERSION + 1,)


# --- a real hot standby --------------------------------------------------------------------


@pytest.fixture(scope="module")
def replica(pg_server: Any) -> Iterator[Any]:
    """A streaming hot standby of the session's server, for this module's tests."""
    server = start_replica(pg_server)
    try:
        yield server
    finally:
        server.stop()


def _on(replica: Any, dsn: str) -> str:
    """The replica's DSN for the schema `dsn` uses (the same search_path)."""
    return make_conninfo(replica.dsn, options=conninfo_to_dict(dsn)["options"])


def test_a_readonly_store_reads_a_hot_standby(pg_server: Any, replica: Any, pg_dsn: str) -> None:
    """On a streaming replica a readonly store reads; a writable one's writes are ReadOnlyStore."""
    filled = _fill(pg_dsn)
    wait_replayed(pg_server, replica)
    on_replica = _on(replica, pg_dsn)
    with FencedPostgresSaver.from_conn_string(on_replica, readonly=True) as saver:
        _reads(saver, filled)
        for op, write in _writes(saver, filled):
            _refused(write, op, saver.path)
    with ConnectionPool(on_replica, min_size=1, max_size=1, open=True) as pool:
        _reads(FencedPostgresSaver(pool, readonly=True), filled)
    # Opened writable by mistake: the standby refuses each write, named as ours.
    with FencedPostgresSaver.from_conn_string(on_replica) as writable:
        for op, write in (
            ("claim", lambda: writable.claim("u", "bob", 10)),
            ("put", lambda: writable.put(saver_config("u"), empty_checkpoint(), {"step": 0}, {})),
            ("setup", writable.setup),
            ("vacuum", writable.vacuum),
        ):
            with pytest.raises(ReadOnlyStore, match="the store is read-only") as caught:
                write()
            assert caught.value.op == op


def test_waits_on_a_standby_wake_by_the_safety_poll(
    pg_server: Any, replica: Any, pg_dsn: str
) -> None:
    """A standby cannot LISTEN: wait_events and await_events still wake for the primary's."""
    filled = _fill(pg_dsn)
    wait_replayed(pg_server, replica)
    on_replica = _on(replica, pg_dsn)
    with (
        FencedPostgresSaver.from_conn_string(pg_dsn) as primary,
        FencedPostgresSaver.from_conn_string(
            on_replica, readonly=True, poll_interval=0.05
        ) as saver,
    ):
        got: list[Any] = []
        note = filled["note"]
        waiter = threading.Thread(
            target=lambda: got.extend(saver.wait_events("t", note, timeout=30))
        )
        waiter.start()
        started = time.monotonic()
        primary.append_events("t", filled["token"], [("from-primary", {})])
        waiter.join(timeout=30)
        assert [e.kind for e in got] == ["from-primary"]
        assert time.monotonic() - started < 10  # not the 30 s timeout

        async def await_one() -> list[Any]:
            waiting = asyncio.create_task(saver.await_events("t", note + 1, timeout=30))
            await asyncio.to_thread(primary.append_events, "t", filled["token"], [("again", {})])
            return await waiting

        assert [e.kind for e in asyncio.run(await_one())] == ["again"]
