"""Thread expiry on PostgreSQL (migration 12, `removals.expire_thread`): nothing written when
nothing is due, due threads found through indexes, the trigger un-parks, the database's clock.

The contract (both stores) is case 41; these are what only the server shows:
row versions (`xmin`), query plans, its own clock.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from langgraph_fenced_sqlite import Expiry, ManualClock
from langgraph_fenced_sqlite.postgres import sql
from langgraph_fenced_sqlite.testing._helpers import put_chain


def _versions(dsn: str) -> list[tuple[Any, ...]]:
    # Every thread row's version: an UPDATE, even to the same values, changes its xmin.
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT thread_id, xmin::text, ttl_seen FROM lgfs_threads ORDER BY 1"
        ).fetchall()
    return [tuple(r) for r in rows]


def test_a_pass_with_nothing_due_writes_no_row(
    open_pg: Any, pg_dsn: str, clock: ManualClock
) -> None:
    store = open_pg(expiry=Expiry(default_ttl=3600))
    for i in range(20):
        put_chain(store, f"t{i}", 2)
    store.set_thread_ttl("t0", 7200, strategy="keep_latest")
    store.expire()
    before = _versions(pg_dsn)
    commits = store.commit_stats()["commits"]
    for _ in range(10):
        clock.advance(60)
        report = store.expire()
        assert report.expired == [] and report.scheduled == 0
    assert _versions(pg_dsn) == before
    assert store.commit_stats()["commits"] == commits


@pytest.mark.parametrize(
    "query,params",
    [
        ("TTL_DUE_OWN", {"now": 0.0}),
        ("TTL_DUE_DEFAULT", {"before": 0.0}),
        ("TTL_UNSEEN", {"limit": 10}),
        ("TTL_UNSEEN_OWN", {"limit": 10}),
    ],
)
def test_due_and_unseen_threads_can_be_found_through_an_index(
    open_pg: Any, pg_dsn: str, query: str, params: dict[str, Any]
) -> None:
    open_pg()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        # A table this small is read whole by choice; forbid that to see the index serves.
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(
            r[0] for r in conn.execute("EXPLAIN " + getattr(sql, query), params).fetchall()
        )
    assert "lgfs_threads_ttl_" in plan and "Seq Scan" not in plan, plan


def test_a_parked_thread_is_unparked_by_its_next_commit(open_pg: Any, clock: ManualClock) -> None:
    store = open_pg(expiry=Expiry(default_ttl=100, strategy="keep_latest"))
    put_chain(store, "t", 3)
    store.expire()
    clock.advance(200)
    assert [e.thread_id for e in store.expire().expired] == ["t"]
    clock.advance(500)
    assert store.expire().expired == []
    put_chain(store, "t", 2)
    clock.advance(150)
    done = store.expire().expired
    assert [(e.thread_id, len(e.checkpoints)) for e in done] == [("t", 2)]


def test_the_database_clock_judges_expiry(open_pg: Any) -> None:
    store = open_pg(clock=None, expiry=Expiry(default_ttl=0.3))
    put_chain(store, "t", 2)
    assert store.expire().expired == []
    time.sleep(0.5)
    assert [e.thread_id for e in store.expire().expired] == ["t"]
