"""An operator's hand on a claim: `force_release` and `take_over(operator=...)`.

Both fence off the holder exactly as a takeover does (its next fenced write
and renewal are `StaleClaim`, its release and end of run change nothing) and
log one event naming the operator in the same commit. The real-process and
`lgfs` versions are in `test_cli_ops.py`.
"""

from __future__ import annotations

from typing import Any

import pytest
from _ops import build_graph, config
from conftest import dump

from langgraph_fenced_sqlite import (
    FencedSqliteSaver,
    InvalidArgument,
    StaleClaim,
    ThreadBusy,
)


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: Any, open_store: Any) -> Any:
    """The test's store: each test runs on a SQLite file and on PostgreSQL."""
    if request.param == "sqlite":
        return open_store()
    return request.getfixturevalue("open_pg")()


def _events(saver: FencedSqliteSaver, thread_id: str) -> list[Any]:
    return saver.events_after(thread_id, 0, limit=1000)


def _everything(store: Any, db_path: str) -> Any:
    """Every row of the SQLite file; on PostgreSQL, the thread's claim, events and counts."""
    if isinstance(store, FencedSqliteSaver):
        return dump(db_path)
    return store.current_claim("t"), _events(store, "t"), store.stats()


def test_force_release_fences_off_the_holder_and_logs_the_operator(
    store: FencedSqliteSaver,
) -> None:
    graph = build_graph(store)
    claim = store.claim("t", "worker-1", 60)
    graph.invoke({"count": 0}, claim.config())
    before = len(_events(store, "t"))
    released = store.force_release("t", operator="alice@host")
    assert released == claim
    assert store.current_claim("t") is None
    (event,) = _events(store, "t")[before:]
    assert (event.kind, event.token) == ("claim_released_by_operator", None)
    assert event.data == {
        "operator": "alice@host",
        "previous_holder": "worker-1",
        "previous_token": claim.token,
        "previous_run_id": None,
        "was_live": True,
    }
    # The superseded holder: every fenced call refused, its release a no-op.
    with pytest.raises(StaleClaim):
        store.renew("t", claim.token, 60)
    with pytest.raises(StaleClaim):
        store.append_events("t", claim.token, [("note", {})])
    assert store.end_run("t", claim.token, "run_completed") is False
    assert store.release("t", claim.token) is False
    # The thread is free at once, with a greater token.
    assert store.claim("t", "worker-2", 60).token > claim.token


def test_the_released_holders_next_graph_write_is_stale(store: FencedSqliteSaver) -> None:
    graph = build_graph(store)
    claim = store.claim("t", "worker-1", 60)
    graph.invoke({"count": 0}, claim.config())
    store.force_release("t", operator="alice@host")
    with pytest.raises(StaleClaim):
        graph.invoke({"count": 5}, claim.config())


def test_force_release_of_an_unclaimed_thread_changes_nothing(
    store: FencedSqliteSaver, db_path: str
) -> None:
    build_graph(store).invoke({"count": 0}, config("t"))
    rows = _everything(store, db_path)
    assert store.force_release("t", operator="alice@host") is None
    assert store.force_release("nobody", operator="alice@host") is None
    assert _everything(store, db_path) == rows  # on PostgreSQL: no row for "nobody" either


def test_an_expired_claim_is_released_and_said_so(store: Any, clock: Any) -> None:
    claim = store.claim("t", "worker-1", 5)
    clock.advance(10)
    store.force_release("t", operator="bob")
    (event,) = _events(store, "t")
    assert event.data["was_live"] is False and event.data["previous_token"] == claim.token


def test_an_operator_take_over_logs_and_holds_the_thread(store: FencedSqliteSaver) -> None:
    graph = build_graph(store)
    old = store.claim("t", "worker-1", 60)
    graph.invoke({"count": 0}, old.config())
    before = len(_events(store, "t"))
    new = store.take_over("t", "alice@host", 120, operator="alice@host")
    assert new.token > old.token and new.holder == "alice@host"
    (event,) = _events(store, "t")[before:]
    assert (event.kind, event.token) == ("claim_taken_over", new.token)
    assert event.data == {
        "operator": "alice@host",
        "previous_holder": "worker-1",
        "previous_token": old.token,
        "previous_run_id": None,
        "was_live": True,
        "holder": "alice@host",
        "expires_at": new.expires_at,
    }
    with pytest.raises(StaleClaim):
        graph.invoke({"count": 1}, old.config())
    with pytest.raises(ThreadBusy):
        store.claim("t", "worker-2", 60)


def test_a_plain_take_over_still_logs_nothing(store: FencedSqliteSaver) -> None:
    store.claim("t", "worker-1", 60)
    store.take_over("t", "worker-2", 60)
    assert _events(store, "t") == []


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda s: s.force_release("t", operator=""), "operator"),
        (lambda s: s.force_release("t", operator=3), "operator"),
        (lambda s: s.force_release("", operator="x"), "thread_id"),
        (lambda s: s.take_over("t", "h", 60, operator=""), "operator"),
        (lambda s: s.take_over("t", "h", -1, operator="x"), "ttl"),
    ],
)
def test_bad_arguments_name_themselves_and_touch_nothing(
    store: FencedSqliteSaver, db_path: str, call: Any, name: str
) -> None:
    store.claim("t", "worker-1", 60)
    rows = _everything(store, db_path)
    with pytest.raises((InvalidArgument, TypeError, ValueError)) as info:
        call(store)
    assert name in str(info.value)
    assert _everything(store, db_path) == rows


async def test_async_twins(store: FencedSqliteSaver) -> None:
    first = await store.aclaim("t", "worker-1", 60)
    taken = await store.atake_over("t", "ops", 60, operator="ops")
    assert taken.token > first.token
    released = await store.aforce_release("t", operator="ops")
    assert released == taken
    kinds = [e.kind for e in _events(store, "t")]
    assert kinds == ["claim_taken_over", "claim_released_by_operator"]
