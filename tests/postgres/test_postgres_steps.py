"""One commit per graph step on PostgreSQL: a step's writes and its put share one transaction.

As on SQLite (tests/sqlite/test_steps.py): a fenced `put_writes` waits, bounded,
for the step's put (a child of its checkpoint), and the put's thread sends
both in one pipeline, one implicit transaction, one round trip. Pinned here
against the real server: the commits and round trips a 5-node chain invoke
makes, that each caller still gets exactly its own error when the joint
batch is refused (and a refused write changes nothing), that the joint
batch is atomic, and async callers. The wait's bounds are generous
(`steps.FOLLOW_MIN_S`) where a join is asserted: the wait ends the
moment the put arrives, so nothing here depends on the machine's speed.
"""

from __future__ import annotations

import asyncio
import operator
import os
import tempfile
import threading
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send
from support.configs import saver_config
from support.graphs import asks_graph, chain_graph
from support.puts import put_next
from support.waiting import follow_bound, put_writes_in_thread, until

from langgraph_fenced_sqlite import CheckpointConflict, StaleClaim
from langgraph_fenced_sqlite.core import steps
from langgraph_fenced_sqlite.postgres import send as pg_send
from langgraph_fenced_sqlite.testing.postgres_server import round_trips


def _writes_in_thread(saver: Any, config: Any, out: dict[str, Any]) -> threading.Thread:
    thread = put_writes_in_thread(saver, config, out)
    until(lambda: saver._engine.steps._queue)  # waiting for its put
    return thread


def _events(saver: Any, thread_id: str = "t") -> list[tuple[str, str | None]]:
    return [(e.kind, e.checkpoint_id) for e in saver.events_after(thread_id, 0, limit=100)]


def test_a_steps_writes_and_its_put_are_one_commit_in_one_round_trip(
    open_pg: Any, generous: None
) -> None:
    saver = open_pg()
    claim = saver.claim("t", "w", 60)
    parent = put_next(saver, claim.token)
    before = saver.commit_stats()
    out: dict[str, Any] = {}
    thread = _writes_in_thread(
        saver, saver_config("t", token=claim.token, checkpoint_id=parent["id"]), out
    )
    box: dict[str, Any] = {}
    trips = round_trips(
        saver._engine._conn, lambda: box.setdefault("cp", put_next(saver, claim.token, parent))
    )
    thread.join()
    after = saver.commit_stats()
    assert out["writes"] is None
    # The writes' statement and the put's, one pipeline, one wait for the
    # server. The trace may count a second: psycopg reads what has arrived
    # (without waiting) after sending each statement, and on a loaded
    # machine the first's result may be there before the second is sent.
    assert trips <= 2
    assert after["commits"] - before["commits"] == 1
    assert after["joined"] - before["joined"] == 1
    assert _events(saver)[-2:] == [("writes", parent["id"]), ("checkpoint", box["cp"]["id"])]
    got = saver.get_tuple(saver_config("t", checkpoint_id=parent["id"]))
    assert [(w[1], w[2]) for w in got.pending_writes] == [("x", 1)]


def _sent(conn: Any, call: Any) -> list[str]:
    """Run `call`; return the protocol messages the client sent on `conn`, in order."""
    fd, path = tempfile.mkstemp(suffix=".trace")
    try:
        conn.pgconn.trace(fd)
        try:
            call()
        finally:
            conn.pgconn.untrace()
        with open(path) as f:
            rows = [line.split("\t") for line in f]
    finally:
        os.close(fd)
        os.unlink(path)
    return [row[3].strip() for row in rows if len(row) > 3 and row[1] == "F"]


@pytest.mark.parametrize("writers", [1, 2])
def test_a_steps_writes_and_its_put_are_sent_as_one_statement(
    open_pg: Any, generous: None, writers: int
) -> None:
    """psycopg's cost is per statement: the joint batch is one, not a pipeline of each call's."""
    saver = open_pg()
    claim = saver.claim("t", "w", 60)
    parent = put_next(saver, claim.token)
    outs: list[dict[str, Any]] = [{} for _ in range(writers)]
    threads = []
    config = saver_config("t", token=claim.token, checkpoint_id=parent["id"])
    for i, out in enumerate(outs):
        # Task i writes i + 1 values: each call's own count of writes.
        writes = [("x", n) for n in range(i + 1)]

        def run(out: dict[str, Any] = out, writes: Any = writes, task: str = f"task{i}") -> None:
            try:
                out["writes"] = saver.put_writes(config, writes, task)
            except Exception as exc:  # noqa: BLE001 - recorded for the assertions
                out["writes"] = exc

        threads.append(threading.Thread(target=run))
        threads[-1].start()
        until(lambda n=i + 1: len(saver._engine.steps._queue) == n)
    box: dict[str, Any] = {}
    sent = _sent(
        saver._engine._conn, lambda: box.setdefault("cp", put_next(saver, claim.token, parent))
    )
    for thread in threads:
        thread.join()
    assert [out["writes"] for out in outs] == [None] * writers
    assert sent.count("Execute") == 1 and sent.count("Sync") == 1, sent
    assert saver.commit_stats()["joined"] == writers
    kinds = [k for k, _ in _events(saver)]
    assert kinds == ["checkpoint", *["writes"] * writers, "checkpoint"]
    got = saver.get_tuple(saver_config("t", checkpoint_id=parent["id"]))
    expected = [(f"task{i}", "x", n) for i in range(writers) for n in range(i + 1)]
    assert sorted(got.pending_writes) == expected


def test_a_refused_put_runs_each_call_alone_and_the_writes_still_commit(
    open_pg: Any, generous: None
) -> None:
    saver = open_pg()
    claim = saver.claim("t", "w", 60)
    parent = put_next(saver, claim.token)
    put_next(saver, claim.token, parent)  # now `parent` is no longer the latest
    out: dict[str, Any] = {}
    thread = _writes_in_thread(
        saver, saver_config("t", token=claim.token, checkpoint_id=parent["id"]), out
    )
    with pytest.raises(CheckpointConflict):
        put_next(saver, claim.token, parent)
    thread.join()
    assert out["writes"] is None
    assert saver.commit_stats()["joined"] == 1
    # The writes once (their event once), the conflicting put not at all.
    assert [k for k, _ in _events(saver)] == ["checkpoint", "checkpoint", "writes"]


def test_a_stale_write_in_a_joint_batch_gets_its_own_error_and_changes_nothing(
    open_pg: Any, generous: None
) -> None:
    saver = open_pg()
    old = saver.claim("t", "w", 60)
    parent = put_next(saver, old.token)
    new = saver.take_over("t", "w2", 60)
    out: dict[str, Any] = {}
    thread = _writes_in_thread(
        saver, saver_config("t", token=old.token, checkpoint_id=parent["id"]), out
    )
    child = put_next(saver, new.token, parent)
    thread.join()
    assert isinstance(out["writes"], StaleClaim)
    assert saver.commit_stats()["joined"] == 1
    assert _events(saver) == [("checkpoint", parent["id"]), ("checkpoint", child["id"])]
    assert saver.get_tuple(saver_config("t", checkpoint_id=parent["id"])).pending_writes == []


def test_a_stale_put_and_its_writes_both_get_stale_claim(open_pg: Any, generous: None) -> None:
    saver = open_pg()
    old = saver.claim("t", "w", 60)
    parent = put_next(saver, old.token)
    saver.take_over("t", "w2", 60)
    out: dict[str, Any] = {}
    thread = _writes_in_thread(
        saver, saver_config("t", token=old.token, checkpoint_id=parent["id"]), out
    )
    with pytest.raises(StaleClaim):
        put_next(saver, old.token, parent)
    thread.join()
    assert isinstance(out["writes"], StaleClaim)
    assert _events(saver) == [("checkpoint", parent["id"])]


def test_a_joint_batch_refused_in_a_later_statement_commits_none_of_it(open_pg: Any) -> None:
    saver = open_pg()
    conn = saver._engine._conn
    conn.execute("CREATE TABLE scratch (x int)")

    def send(execute: Any) -> Any:
        execute("INSERT INTO scratch VALUES (%(x)s)", {"x": 1})
        execute("SELECT lgfs_refuse(%(why)s)", {"why": "test"})
        return lambda: None

    assert pg_send.send_batch(conn, send, read_only=False, refusable=True) is None
    assert conn.execute("SELECT count(*) FROM scratch").fetchone() == (0,)
    # The connection is usable again, prepared statements included.
    assert saver.claim("t", "w", 60).token > 0


def test_a_write_whose_put_never_follows_runs_alone_after_the_bound(
    open_pg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    follow_bound(monkeypatch, 0.05)
    saver = open_pg()
    claim = saver.claim("t", "w", 60)
    parent = put_next(saver, claim.token)
    saver.put_writes(
        saver_config("t", token=claim.token, checkpoint_id=parent["id"]), [("x", 1)], "task-1"
    )
    stats = saver.commit_stats()
    assert (stats["waited"], stats["ran_out"], stats["joined"]) == (1, 1, 0)
    assert [k for k, _ in _events(saver)] == ["checkpoint", "writes"]


def _invokes(saver: Any, graph: Any, config: Any, runs: int = 1) -> dict[str, int]:
    """Invoke `graph` (a `chain_graph`) `runs` times (durability "sync"); return how the
    stats moved."""
    before = saver.commit_stats()
    for _ in range(runs):
        graph.invoke({"count": 0}, config, durability="sync")
    after = saver.commit_stats()
    return {key: after[key] - before[key] for key in after}


def _xact_commits(saver: Any, monitor: Any) -> int:
    # The saver's backend reports its counters when it next goes idle.
    saver._engine._conn.execute("SELECT pg_stat_force_next_flush()")
    monitor.execute("SELECT pg_stat_clear_snapshot()")
    row = monitor.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    return int(row[0])


def test_a_chain_invoke_commits_once_per_step(open_pg: Any, pg_dsn: str, generous: None) -> None:
    saver = open_pg(clock=None)
    graph = chain_graph(saver, trail=False)
    config = saver.claim("t", "w", 3600).config()
    # Warm until psycopg has prepared every statement an invoke sends (on
    # its 6th use; a step's joint statement differs with its writes' count,
    # and some are sent once an invoke): each prepare is a Parse of its own,
    # which the server counts as a transaction.
    for _ in range(6):
        graph.invoke({"count": 0}, config, durability="sync")
    runs = 5
    monitor = psycopg.connect(pg_dsn, autocommit=True)
    try:
        before, xact = saver.commit_stats(), _xact_commits(saver, monitor)
        trips = round_trips(
            saver._engine._conn,
            lambda: [graph.invoke({"count": 0}, config, durability="sync") for _ in range(runs)],
        )
        # Less the saver's statement of the second `_xact_commits` (its
        # flush); the monitor's own statements may add up to 2 (below).
        xacts = _xact_commits(saver, monitor) - xact - 1
        after = saver.commit_stats()
    finally:
        monitor.close()
    assert graph.get_state(config).values == {"count": 5}
    # A write LangGraph's put overtook cannot join it: it commits alone once
    # its wait runs out (see the next test). One such write is tolerated.
    late = after["ran_out"] - before["ran_out"]
    assert late <= 1
    # An invoke: the input's put, then six steps (the input's writes, five
    # nodes'), each writes + put; and one read. Alone: 13 commits, 14 trips.
    assert after["joined"] - before["joined"] + late == 6 * runs
    assert after["commits"] - before["commits"] == 7 * runs + late
    # The server's count agrees: those 7 and the read (the monitor's own
    # statements may add up to 2). Each call alone made 14.
    assert 8 * runs <= xacts <= 8 * runs + 2 + late
    # One wait per joint batch (each call alone: 14 per invoke); the trace
    # may count a second in a few of them (see the test above).
    assert 8 * runs <= trips < 9 * runs + late


def test_an_unclaimed_invoke_commits_once_per_step_too(open_pg: Any, generous: None) -> None:
    """A graph run without a claim writes unfenced: its writes join their step's put as
    fenced ones do (each unfenced call took six round trips and a commit of its own)."""
    saver = open_pg(clock=None)
    graph = chain_graph(saver, trail=False)
    config = {"configurable": {"thread_id": "plain"}}
    graph.invoke({"count": 0}, config, durability="sync")
    moved = _invokes(saver, graph, config, runs=3)
    assert graph.get_state(config).values == {"count": 5}
    # Every write shares its put's commit, unless LangGraph's put reaches the
    # store first: it sends a step's writes and its put to its executor, and
    # on a loaded machine the put can overtake a write (pinned by logging the
    # arrivals: about one run in 25 with both cores busy, each time one write
    # of the 18 arriving after its put; the test above saw it in CI too).
    # That write cannot share a commit already made: its wait runs out and it
    # commits alone.
    assert moved["joined"] + moved["ran_out"] == 6 * 3 and moved["ran_out"] <= 1
    assert moved["commits"] == 7 * 3 + moved["ran_out"]
    assert all(e.token is None for e in saver.events_after("plain"))


@pytest.mark.parametrize("api", ["invoke", "ainvoke"])
def test_an_interrupt_or_an_error_waits_for_no_put(open_pg: Any, generous: None, api: str) -> None:
    """As on SQLite (`test_steps`): no checkpoint follows such a step, so its write leads
    at once, fenced or not."""
    from langgraph.types import Command

    saver = open_pg(clock=None)
    app = asks_graph(saver)

    def run(arg: Any, config: Any) -> Any:
        if api == "invoke":
            return app.invoke(arg, config, durability="sync")
        return asyncio.run(app.ainvoke(arg, config, durability="sync"))

    before = saver.commit_stats()
    for config in ({"configurable": {"thread_id": "plain"}}, saver.claim("t", "w", 60).config()):
        run({"count": 0, "trail": []}, config)
        assert app.get_state(config).interrupts[0].value == "go on?"
        with pytest.raises(RuntimeError, match="boom"):
            run(Command(resume="boom"), config)
    after = saver.commit_stats()
    assert after["ran_out"] == before["ran_out"]
    # Per run: __start__'s and first's writes joined their puts, the resumed
    # task's `__resume__` write its error's write (before, it ran out).
    assert after["joined"] - before["joined"] == 2 * 3


def test_a_caller_that_puts_what_it_wrote_stops_waiting_for_itself(
    open_pg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on SQLite (`test_steps`): `update_state` writes, then puts, from the caller's
    thread; seen twice, its writes lead at once, and its invokes still join every step."""
    follow_bound(monkeypatch, 0.5)
    saver = open_pg(clock=None)
    graph = chain_graph(saver, trail=False)
    config = {"configurable": {"thread_id": "t"}}
    graph.invoke({"count": 0}, config, durability="sync")
    before = saver.commit_stats()
    for i in range(6):
        graph.update_state(config, {"count": i})
    after = saver.commit_stats()
    assert after["ran_out"] - before["ran_out"] == 2
    assert after["skipped"] - before["skipped"] == 4
    moved = _invokes(saver, graph, config)
    assert moved["commits"] == 7 and moved["joined"] == 6


def test_async_callers_share_the_step_commit_too(open_pg: Any, generous: None) -> None:
    saver = open_pg(clock=None)
    graph = chain_graph(saver, trail=False)
    config = saver.claim("t", "w", 3600).config()
    before = saver.commit_stats()

    async def run() -> Any:
        return await graph.ainvoke({"count": 0}, config, durability="sync")

    assert asyncio.run(run()) == {"count": 5}
    after = saver.commit_stats()
    assert after["joined"] - before["joined"] == 6
    assert after["commits"] - before["commits"] == 7


class _Fan(TypedDict):
    trail: Annotated[list[str], operator.add]


def test_an_async_fan_out_wider_than_max_waiting_is_one_commit_per_step(
    open_pg: Any, generous: None
) -> None:
    """Eight branches through `ainvoke`: the step's eight writes and its put, one commit.

    As on SQLite (test_steps.py): async callers' writes wait on the store's
    hop workers, so more than `MAX_WAITING` of them may (`MAX_WAITING_ASYNC`).
    """
    width = steps.MAX_WAITING + 4
    builder = StateGraph(_Fan)
    builder.add_node("split", lambda s: {"trail": ["split"]})
    builder.add_node("branch", lambda s: {"trail": ["branch"]})
    builder.add_edge(START, "split")
    builder.add_conditional_edges(
        "split", lambda s: [Send("branch", s) for _ in range(width)], ["branch"]
    )
    builder.add_edge("branch", END)
    saver = open_pg(clock=None)
    graph = builder.compile(checkpointer=saver)
    config = saver.claim("t", "w", 3600).config()
    before = saver.commit_stats()
    result = asyncio.run(graph.ainvoke({"trail": []}, config, durability="sync"))
    after = saver.commit_stats()
    assert result["trail"].count("branch") == width
    # input, __start__, split, the eight branches: four commits.
    assert after["commits"] - before["commits"] == 4
    assert after["joined"] - before["joined"] == 2 + width
    assert after["skipped"] == before["skipped"]


@pytest.mark.parametrize("api", ["invoke", "ainvoke"])
def test_with_durability_async_writes_that_run_ahead_of_their_puts_all_land(
    open_pg: Any, generous: None, api: str
) -> None:
    """LangGraph's default durability, "async": the loop does not wait for a step's put.

    It chains each put after the previous one and runs the next step at
    once, so several steps' writes can await their puts at the same time
    (seen: four of one chain invoke, each arriving ~0.7 ms after the last,
    while the puts crawled one round trip each). Past `MAX_WAITING` a write
    leads alone instead of waiting: more commits than one per step, which
    the tests above pin with durability "sync". What a user relies on here
    is that every write lands with its checkpoint, whichever way it went.
    """
    saver = open_pg(clock=None)
    graph = chain_graph(saver, trail=False)
    config = saver.claim("t", "w", 3600).config()
    before = saver.commit_stats()
    for _ in range(3):
        if api == "invoke":
            assert graph.invoke({"count": 0}, config) == {"count": 5}
        else:
            assert asyncio.run(graph.ainvoke({"count": 0}, config)) == {"count": 5}
    after = saver.commit_stats()
    delta = {k: after[k] - before[k] for k in after}
    # Six steps' writes per invoke: each either waited (and was joined or
    # ran out) or led at once; nothing is dropped or counted twice.
    assert delta["waited"] + delta["skipped"] == 6 * 3
    assert delta["joined"] + delta["ran_out"] == delta["waited"]
    assert 7 * 3 <= delta["commits"] <= 13 * 3
    # Every checkpoint but each invoke's last carries its step's writes.
    history = list(graph.get_state_history(config))
    assert len(history) == 7 * 3
    for state in history:
        stored = saver.get_tuple(state.config)
        assert stored is not None
        assert bool(stored.pending_writes) == (state.next != ())
