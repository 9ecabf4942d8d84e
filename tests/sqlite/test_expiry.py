"""Thread expiry on SQLite (`maintenance.py`, migration 5 -> 6): the disk stays asleep when
nothing is due, due threads are found through indexes, the trigger un-parks, old files migrate.

The contract (both stores) is case 41 (`testing/cases_expiry.py`); these are
what only a SQLite file shows: its `data_version`, its WAL's size, its query
plans.
"""

from __future__ import annotations

import gc
import os
import sqlite3
import warnings
from typing import Any

import pytest

from langgraph_fenced_sqlite import (
    Expiry,
    FencedSqliteSaver,
    InvalidArgument,
    ManualClock,
    ReadOnlyStore,
    ThreadTTL,
)
from langgraph_fenced_sqlite.sqlite import schema
from langgraph_fenced_sqlite.testing._helpers import put_chain


def _data_version(conn: sqlite3.Connection) -> int:
    # Another connection's view: it changes when anyone else commits a change.
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


def _wal_bytes(path: str) -> int:
    return os.path.getsize(path + "-wal") if os.path.exists(path + "-wal") else 0


def test_a_pass_with_nothing_due_writes_nothing_to_the_file(
    open_store: Any, db_path: str, clock: ManualClock
) -> None:
    store = open_store(expiry=Expiry(default_ttl=3600, strategy="keep_latest"))
    for i in range(50):
        put_chain(store, f"t{i}", 3)
    store.set_thread_ttl("t0", 7200, strategy="delete")
    store.expire()  # the first pass sees every thread once (a write)
    watcher = sqlite3.connect(db_path)
    try:
        before = (_data_version(watcher), _wal_bytes(db_path), os.path.getsize(db_path))
        commits = store.commit_stats()["commits"]
        for _ in range(20):
            clock.advance(60)
            report = store.expire()
            assert report.expired == [] and report.scheduled == 0
        after = (_data_version(watcher), _wal_bytes(db_path), os.path.getsize(db_path))
        assert after == before
        assert store.commit_stats()["commits"] == commits
        clock.advance(3600)  # now everything but t0 is due: the disk wakes
        assert len(store.expire().expired) == 49
        assert _data_version(watcher) != before[0]
    finally:
        watcher.close()


@pytest.mark.parametrize(
    "query", ["TTL_DUE_OWN", "TTL_DUE_DEFAULT", "TTL_UNSEEN", "TTL_UNSEEN_OWN"]
)
def test_due_and_unseen_threads_are_found_through_an_index(open_store: Any, query: str) -> None:
    store = open_store()
    plan = store._engine.read(
        "plan", lambda c: c.execute("EXPLAIN QUERY PLAN " + getattr(schema, query), (0,)).fetchall()
    )
    # Each step reads an index (a partial one holds only the rows wanted: its
    # SCAN reads no other thread); none scans the table.
    steps = [str(row[-1]) for row in plan]
    assert steps and all("USING INDEX threads_" in s for s in steps), steps


def test_a_parked_thread_is_unparked_by_its_next_commit(
    open_store: Any, clock: ManualClock
) -> None:
    store = open_store(expiry=Expiry(default_ttl=100, strategy="keep_latest"))
    put_chain(store, "t", 3)
    store.expire()
    clock.advance(200)
    assert [e.thread_id for e in store.expire().expired] == ["t"]  # trimmed, then parked

    def seen() -> Any:
        return store._engine.read(
            "seen", lambda c: c.execute("SELECT ttl_seen FROM threads").fetchone()[0]
        )

    assert seen() == float("inf")
    clock.advance(500)
    assert store.expire().expired == []  # parked: nothing left to trim, nothing read
    put_chain(store, "t", 2)  # written again: un-parked by the commit itself
    assert seen() is None
    clock.advance(50)
    assert store.expire().scheduled == 1
    clock.advance(100)
    done = store.expire().expired
    assert [(e.thread_id, len(e.checkpoints)) for e in done] == [("t", 2)]


def test_delete_thread_takes_its_ttl_with_it(open_store: Any) -> None:
    store = open_store()
    put_chain(store, "t", 1)
    store.set_thread_ttl("t", 60, strategy="keep_latest")
    store.delete_thread("t")
    assert store.thread_ttl("t") is None
    put_chain(store, "t", 1)
    assert store.thread_ttl("t") is None


def test_a_file_of_schema_6_migrates_and_its_threads_expire(
    tmp_path: Any, clock: ManualClock
) -> None:
    path = str(tmp_path / "old.db")
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=wal")
    from langgraph_fenced_sqlite.core.checksums import checksum

    conn.create_function(schema.CHECKSUM_FUNCTION, -1, checksum, deterministic=True)
    for step in schema.MIGRATIONS[:6]:  # up to thread search, before expiry
        for statement in step:
            conn.execute(statement)
    conn.execute(schema.SET_APPLICATION_ID)
    conn.execute(schema.set_user_version(6))
    conn.commit()
    conn.close()
    with FencedSqliteSaver(path, clock=clock) as store:
        put_chain(store, "t", 2)
    with FencedSqliteSaver(path, clock=clock, expiry=Expiry(default_ttl=10)) as store:
        assert store.stats()["schema_version"] == schema.SCHEMA_VERSION == 8
        clock.advance(20)
        assert [e.thread_id for e in store.expire().expired] == ["t"]


def test_a_read_only_store_refuses_to_expire_and_to_sweep(open_store: Any, db_path: str) -> None:
    open_store().close()
    reader = open_store(readonly=True)
    with pytest.raises(ReadOnlyStore):
        reader.expire()
    with pytest.raises(InvalidArgument, match="expiry"):
        FencedSqliteSaver(db_path, readonly=True, expiry=Expiry(sweep_every=1))
    with pytest.raises(InvalidArgument, match="expiry"):
        FencedSqliteSaver(db_path, expiry={"default_ttl": 1})  # type: ignore[arg-type]


def test_bad_expiry_options_are_refused_before_the_file_is_made(tmp_path: Any) -> None:
    path = str(tmp_path / "never.db")
    for bad, name in (
        (lambda: Expiry(default_ttl=0), "default_ttl"),
        (lambda: Expiry(strategy="archive"), "strategy"),
        (lambda: Expiry(sweep_every=-5), "sweep_every"),
        (lambda: Expiry(on_expire=3), "on_expire"),  # type: ignore[arg-type]
        (lambda: ThreadTTL(ttl="1d"), "ttl"),  # type: ignore[arg-type]
    ):
        with pytest.raises((InvalidArgument, TypeError, ValueError), match=name):
            bad()
    with pytest.raises(InvalidArgument, match="expiry"):
        FencedSqliteSaver(path, expiry=5)  # type: ignore[arg-type]
    assert not os.path.exists(path)


def test_a_saver_dropped_unclosed_warns_and_its_sweeper_ends(db_path: str) -> None:
    import time

    saver = FencedSqliteSaver(db_path, expiry=Expiry(default_ttl=60, sweep_every=3600))
    sweeper = saver._sweeper
    assert sweeper is not None
    deadline = time.monotonic() + 10
    while sweeper.passes < 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # its first pass done, it waits holding the saver weakly
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del saver
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) for w in caught), caught
    sweeper._thread.join(10)
    assert not sweeper.alive


def test_close_from_async_code_stops_the_sweeper(db_path: str) -> None:
    import asyncio

    async def main() -> Any:
        async with FencedSqliteSaver.from_conn_string(
            db_path, expiry=Expiry(default_ttl=60, sweep_every=0.01)
        ) as saver:
            await saver.aset_thread_ttl("t", 30)
            assert await saver.athread_ttl("t") == ThreadTTL(30.0)
            await asyncio.sleep(0.05)
            return saver._sweeper

    sweeper = asyncio.run(main())
    assert sweeper is not None and not sweeper.alive and sweeper.passes >= 1


def test_a_failed_pass_is_logged_and_the_sweeper_goes_on(
    db_path: str, clock: ManualClock, caplog: Any
) -> None:
    import logging
    import time

    calls: list[str] = []

    def flaky(expired: Any) -> None:
        calls.append(expired.thread_id)
        if len(calls) == 1:
            raise RuntimeError("the callback failed")

    expiry = Expiry(default_ttl=10, sweep_every=0.01, on_expire=flaky)
    with caplog.at_level(logging.ERROR, logger="langgraph_fenced_sqlite.sweeper"):
        with FencedSqliteSaver(db_path, clock=clock, expiry=expiry) as store:
            put_chain(store, "a", 1)
            put_chain(store, "b", 1)
            clock.advance(20)
            deadline = time.monotonic() + 20
            while len(calls) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            sweeper = store._sweeper
            assert sweeper is not None and sweeper.alive
    assert sorted(calls) == ["a", "b"], calls  # the second pass expired the other thread
    assert "expire pass failed" in caplog.text and "the callback failed" in caplog.text
