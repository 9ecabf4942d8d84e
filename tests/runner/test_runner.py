"""FencedRunner in one process: strategies, lifecycle events, release, streaming."""

from __future__ import annotations

import asyncio
import contextlib
import operator
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import get_runtime
from langgraph.types import Command, interrupt
from support.configs import config

from langgraph_fenced_sqlite import (
    ClaimError,
    FencedRunner,
    FencedSqliteSaver,
    RetentionPolicy,
    RunCancelled,
    RunTimedOut,
    StaleClaim,
    TenantMismatch,
    ThreadBusy,
)
from langgraph_fenced_sqlite.runner import queue as runqueue

ROOT = Path(__file__).resolve().parents[2]
RUN_KINDS = (
    "run_started",
    "run_completed",
    "run_interrupted",
    "run_failed",
    "run_superseded",
    "run_cancelled",
    "run_timed_out",
)


class State(TypedDict, total=False):
    """The test graph's state: a log of node visits and the turn's flags."""

    log: Annotated[list[str], operator.add]
    turn: str
    block: bool
    fail: str


class Gate:
    """Hold a node until the test opens the gate; tell the test it is held."""

    def __init__(self) -> None:
        """Start closed, with no node entered and no call counted."""
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.calls = 0

    def hold(self) -> None:
        """Tell the test the node is held, then wait for the gate to open."""
        self.entered.set()
        assert self.opened.wait(30), "the test never opened the gate"


def build(gate: Gate | None = None) -> StateGraph:
    """Return three nodes in a row; `slow` waits at the gate when the input says `block`."""
    gate = gate or Gate()

    def first(state: State) -> State:
        gate.calls += 1
        return {"log": [f"{state['turn']}:first"]}

    def slow(state: State) -> State:
        if state.get("block"):
            gate.hold()
        if state.get("fail") == "value":
            raise ValueError("node failed")
        if state.get("fail") == "keyboard":
            raise KeyboardInterrupt
        get_stream_writer()({"custom": state["turn"]})
        return {"log": [f"{state['turn']}:slow"]}

    def last(state: State) -> State:
        return {"log": [f"{state['turn']}:last"]}

    g = StateGraph(State)
    g.add_node("first", first)
    g.add_node("slow", slow)
    g.add_node("last", last)
    g.add_edge(START, "first")
    g.add_edge("first", "slow")
    g.add_edge("slow", "last")
    g.add_edge("last", END)
    return g


def inp(turn: str, *, block: bool = False, fail: str = "") -> State:
    """A turn's input; every key is given, since channels keep their last value."""
    return {"turn": turn, "block": block, "fail": fail}


def run_events(store: FencedSqliteSaver, thread_id: str = "t") -> list[tuple[str, str | None]]:
    """(kind, run_id) of every runner event of the thread, in order."""
    return [
        (e.kind, e.data.get("run_id")) for e in all_events(store, thread_id) if e.kind in RUN_KINDS
    ]


def all_events(store: FencedSqliteSaver, thread_id: str = "t") -> list[Any]:
    """Return every event of the thread."""
    return store.events_after(thread_id, 0, 10_000)


def history(store: Any, thread_id: str = "t") -> list[Any]:
    """The thread's checkpoints, newest first, through LangGraph's `list` (both stores)."""
    return list(store.list({"configurable": {"thread_id": thread_id}}))


def thread_rows(store: Any, query: str) -> list[tuple[Any, ...]]:
    """Run `query` on the store's threads table (`threads` in SQLite, `lgfs_threads` in PG)."""
    if isinstance(store, FencedSqliteSaver):
        con = sqlite3.connect(store.path)
        try:
            return con.execute(query.format(threads="threads")).fetchall()
        finally:
            con.close()

    def job(cur: Any) -> list[tuple[Any, ...]]:
        cur.execute(query.format(threads="lgfs_threads"))
        return [tuple(r) for r in cur.fetchall()]

    return store._engine.run("test", job)


def in_thread(fn: Any, *args: Any, **kwargs: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Run fn in a thread; the dict gets "result" or "error"."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["result"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            out["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    return thread, out


def wait_for(predicate: Any, what: str) -> None:
    """Wait (generously) for a condition another thread brings about."""
    deadline = time.monotonic() + 30
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.005)


@pytest.fixture
def store(either_store: Any) -> Any:
    """The test's store: each test runs on a SQLite file and on PostgreSQL."""
    return either_store


@pytest.fixture
def gate() -> Any:
    """A gate for the test graph's `slow` node, opened at teardown."""
    g = Gate()
    yield g
    g.opened.set()


@pytest.fixture
def runner(store: FencedSqliteSaver, gate: Gate) -> FencedRunner:
    """A runner over the test graph on the test's store."""
    return FencedRunner(build(gate).compile(checkpointer=store), store, holder="me")


# --- basics -----------------------------------------------------------------------------


def test_invoke_logs_lifecycle_tags_checkpoints_and_releases(
    runner: FencedRunner, store: FencedSqliteSaver
) -> None:
    """A run logs started/completed around its writes, tags every checkpoint, releases."""
    out = runner.invoke(inp("a"), config(run_id="r1"), durability="sync")
    assert out["log"] == ["a:first", "a:slow", "a:last"]
    assert store.current_claim("t") is None
    evs = all_events(store)
    assert evs[0].kind == "run_started" and evs[-1].kind == "run_completed"
    assert {e.token for e in evs} == {evs[0].token}
    assert (
        evs[-1].data["checkpoint_id"]
        == store.get_tuple(config()).config["configurable"]["checkpoint_id"]
    )
    turn1 = history(store)
    assert turn1 and all(c.metadata["run_id"] == "r1" for c in turn1)
    runner.invoke(inp("b"), config(run_id="r2"))
    store.delete_for_runs(["r2"])
    assert [c.metadata["run_id"] for c in history(store)] == ["r1"] * len(turn1)
    assert run_events(store) == [
        ("run_started", "r1"),
        ("run_completed", "r1"),
        ("run_started", "r2"),
        ("run_completed", "r2"),
    ]


async def test_ainvoke_and_fresh_run_ids(runner: FencedRunner, store: FencedSqliteSaver) -> None:
    """ainvoke behaves like invoke; each invocation without a run id gets a new one."""
    out = await runner.ainvoke(inp("a"), config())
    out = await runner.ainvoke(inp("b"), config())
    assert out["log"][-1] == "b:last"
    kinds = run_events(store)
    assert [k for k, _ in kinds] == ["run_started", "run_completed"] * 2
    assert kinds[0][1] == kinds[1][1] != kinds[2][1] == kinds[3][1]
    assert store.current_claim("t") is None


def test_graph_without_checkpointer_is_given_the_saver(store: FencedSqliteSaver) -> None:
    """A graph compiled without a checkpointer runs on the runner's saver."""
    runner = FencedRunner(build().compile(), store)
    runner.invoke(inp("a"), config())
    assert store.get_tuple(config()) is not None
    other = InMemorySaver()
    with pytest.raises(ValueError, match="checkpointer"):
        FencedRunner(build().compile(checkpointer=other), store)


def test_bad_arguments_are_refused_before_anything_runs(
    runner: FencedRunner, store: FencedSqliteSaver, gate: Gate
) -> None:
    """Unknown strategy, no thread id, bad timeouts: errors naming the argument."""
    with pytest.raises(ValueError, match="strategy"):
        runner.invoke(inp("a"), config(), strategy="queue")
    with pytest.raises(ValueError, match="thread_id"):
        runner.invoke(inp("a"), {"configurable": {}})
    with pytest.raises(ValueError, match="wait_timeout"):
        runner.invoke(inp("a"), config(), strategy="enqueue", wait_timeout=-1)
    with pytest.raises(ValueError, match="ttl"):
        FencedRunner(runner.graph, store, ttl=0)
    assert gate.calls == 0 and all_events(store) == []


# --- graph interrupts -------------------------------------------------------------------


def test_graph_interrupt_is_logged_and_resumed(store: FencedSqliteSaver) -> None:
    """A dynamic interrupt ends as run_interrupted; the resume completes."""

    def ask(state: State) -> State:
        answer = interrupt("approve?")
        return {"log": [f"answer:{answer}"]}

    g = StateGraph(State)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    runner = FencedRunner(g.compile(checkpointer=store), store)
    first = runner.invoke({"log": []}, config(run_id="ask"))
    assert "__interrupt__" in first
    done = runner.invoke(Command(resume="yes"), config(run_id="resume"))
    assert done["log"] == ["answer:yes"]
    assert run_events(store) == [
        ("run_started", "ask"),
        ("run_interrupted", "ask"),
        ("run_started", "resume"),
        ("run_completed", "resume"),
    ]
    assert all_events(store)[1].kind != "run_interrupted"  # graph writes come between


def test_static_interrupt_is_logged(store: FencedSqliteSaver) -> None:
    """interrupt_before (compiled or per call) ends as run_interrupted."""
    runner = FencedRunner(build().compile(checkpointer=store, interrupt_before=["slow"]), store)
    runner.invoke(inp("a"), config(run_id="1"))
    runner.invoke(None, config(run_id="2"))
    plain = FencedRunner(build().compile(checkpointer=store), store)
    plain.invoke(inp("b"), config("u", run_id="3"), interrupt_after=["first"])
    assert run_events(store)[1] == ("run_interrupted", "1")
    assert run_events(store)[3] == ("run_completed", "2")
    assert run_events(store, "u")[1] == ("run_interrupted", "3")


async def test_static_interrupt_is_logged_async(store: FencedSqliteSaver) -> None:
    """The async paths detect static interrupts too (ainvoke and astream)."""
    runner = FencedRunner(build().compile(checkpointer=store, interrupt_after=["first"]), store)
    await runner.ainvoke(inp("a"), config(run_id="1"))
    chunks = [c async for c in runner.astream(None, config(run_id="2"), stream_mode="updates")]
    assert chunks[0] == {"slow": {"log": ["a:slow"]}}
    assert run_events(store) == [
        ("run_started", "1"),
        ("run_interrupted", "1"),
        ("run_started", "2"),
        ("run_completed", "2"),
    ]


# --- release however the run ends --------------------------------------------------------


@pytest.mark.parametrize("fail,error", [("value", ValueError), ("keyboard", KeyboardInterrupt)])
def test_release_on_exception(
    runner: FencedRunner, store: FencedSqliteSaver, fail: str, error: type
) -> None:
    """An exception (KeyboardInterrupt too) propagates, is logged, and the claim goes."""
    with pytest.raises(error):
        runner.invoke(inp("a", fail=fail), config(run_id="r"))
    assert store.current_claim("t") is None
    assert run_events(store) == [("run_started", "r"), ("run_failed", "r")]
    assert all_events(store)[-1].data["error"] == error.__name__
    runner.invoke(inp("b"), config())  # the thread is free


async def test_release_on_cancellation(
    runner: FencedRunner, store: FencedSqliteSaver, gate: Gate
) -> None:
    """Cancelling the task running ainvoke releases the claim and logs run_cancelled."""
    task = asyncio.ensure_future(runner.ainvoke(inp("a", block=True), config(run_id="r")))
    await asyncio.to_thread(gate.entered.wait, 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert store.current_claim("t") is None
    assert run_events(store) == [("run_started", "r"), ("run_cancelled", "r")]
    assert all_events(store)[-1].data["reason"] == "task_cancelled"
    gate.opened.set()


async def test_cancelled_while_claiming_gives_the_claim_back(
    runner: FencedRunner, store: FencedSqliteSaver
) -> None:
    """A task cancelled while its claim commits still releases that claim."""
    for _ in range(20):
        task = asyncio.ensure_future(runner.ainvoke(inp("a"), config(), strategy="interrupt"))
        await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
    # Each task returns as soon as it is cancelled, while its claim may still
    # be committing on a worker thread (to be given back once granted): "no
    # claim" alone can be seen between one run's release and the next one's
    # grant, before that run ends (it failed so in CI on PostgreSQL: 20
    # started, 19 ended). So let every claim attempt finish first (they run
    # on the loop's default executor), then wait for every granted claim to end.
    await asyncio.get_running_loop().shutdown_default_executor()

    def ends() -> tuple[list[str], int]:
        kinds = [k for k, _ in run_events(store)]
        # Each claim granted ends exactly once: released as cancelled, or taken
        # over (logged by the next one) before its release landed.
        return kinds, kinds.count("run_cancelled") + kinds.count("run_superseded")

    deadline = time.monotonic() + 30
    while True:
        kinds, ended = ends()
        if store.current_claim("t") is None and kinds.count("run_started") == ended:
            break
        assert time.monotonic() < deadline, f"gave up waiting for every claim to end: {kinds}"
        await asyncio.sleep(0.005)  # the loop runs the callbacks that give claims back
    kinds, ended = ends()
    assert "run_failed" not in kinds
    assert kinds.count("run_started") == ended > 0


def test_stream_closed_early_releases(runner: FencedRunner, store: FencedSqliteSaver) -> None:
    """Closing a stream before its end releases the claim."""
    stream = runner.stream(inp("a"), config(run_id="r"), stream_mode="updates")
    assert next(stream) == {"first": {"log": ["a:first"]}}
    assert store.current_claim("t") is not None
    stream.close()
    assert store.current_claim("t") is None
    assert run_events(store) == [("run_started", "r"), ("run_cancelled", "r")]
    assert all_events(store)[-1].data["reason"] == "stream_closed"


async def test_astream_closed_early_releases(
    runner: FencedRunner, store: FencedSqliteSaver
) -> None:
    """Closing an async stream before its end releases the claim."""
    stream = runner.astream(inp("a"), config(run_id="r"), stream_mode="updates")
    assert await stream.__anext__() == {"first": {"log": ["a:first"]}}
    await stream.aclose()
    assert store.current_claim("t") is None
    assert run_events(store) == [("run_started", "r"), ("run_cancelled", "r")]
    assert all_events(store)[-1].data["reason"] == "stream_closed"


# --- stream yields what LangGraph yields ---------------------------------------------------

MODES: list[Any] = ["values", "updates", "custom", ["updates", "custom", "values"]]


@pytest.mark.parametrize("mode", MODES, ids=str)
def test_stream_yields_what_langgraph_yields(store: FencedSqliteSaver, mode: Any) -> None:
    """runner.stream and graph.stream on the same input yield the same chunks."""
    runner = FencedRunner(build().compile(checkpointer=store), store)
    bare = build().compile(checkpointer=InMemorySaver())
    for turn in ("a", "b"):
        ours = list(runner.stream(inp(turn), config(), stream_mode=mode))
        theirs = list(bare.stream(inp(turn), config(), stream_mode=mode))
        assert ours == theirs and ours
    assert [k for k, _ in run_events(store)] == ["run_started", "run_completed"] * 2


@pytest.mark.parametrize("mode", MODES, ids=str)
async def test_astream_yields_what_langgraph_yields(store: FencedSqliteSaver, mode: Any) -> None:
    """runner.astream and graph.astream on the same input yield the same chunks."""
    runner = FencedRunner(build().compile(checkpointer=store), store)
    bare = build().compile(checkpointer=InMemorySaver())
    ours = [c async for c in runner.astream(inp("a"), config(), stream_mode=mode)]
    theirs = [c async for c in bare.astream(inp("a"), config(), stream_mode=mode)]
    assert ours == theirs and ours
    assert store.current_claim("t") is None


# --- strategies ------------------------------------------------------------------------------


def test_reject_raises_at_once_and_runs_nothing(
    runner: FencedRunner, store: FencedSqliteSaver, gate: Gate
) -> None:
    """A busy thread refuses a "reject" invocation: no node runs, no event is logged."""
    store.claim("t", "someone-else", 30)
    with pytest.raises(ThreadBusy) as info:
        runner.invoke(inp("a"), config())
    assert info.value.holder == "someone-else"
    assert gate.calls == 0 and all_events(store) == []


def test_enqueue_runs_in_arrival_order(
    runner: FencedRunner, store: FencedSqliteSaver, gate: Gate
) -> None:
    """Waiting invocations run one at a time, in the order they arrived."""
    holder, held = in_thread(runner.invoke, inp("h", block=True), config(run_id="h"))
    assert gate.entered.wait(30)
    waiters = []
    for i in range(4):
        waiters.append(
            in_thread(runner.invoke, inp(f"w{i}"), config(run_id=f"w{i}"), strategy="enqueue")
        )
        wait_for(lambda n=i + 1: runner.waiting("t") == n, "the waiter to queue")
    gate.opened.set()
    for thread, out in [(holder, held), *waiters]:
        thread.join(30)
        assert "error" not in out, out
    started = [r for k, r in run_events(store) if k == "run_started"]
    assert started == ["h", "w0", "w1", "w2", "w3"]
    assert [k for k, _ in run_events(store)] == ["run_started", "run_completed"] * 5
    assert runner.waiting("t") == 0


async def test_aenqueue_runs_in_arrival_order(
    runner: FencedRunner, store: FencedSqliteSaver
) -> None:
    """The async twin keeps arrival order too (one process, one event loop)."""
    claim = store.claim("t", "other", 30)
    tasks = []
    for i in range(3):
        tasks.append(
            asyncio.ensure_future(
                runner.ainvoke(inp(f"w{i}"), config(run_id=f"w{i}"), strategy="enqueue")
            )
        )
        while runner.waiting("t") < i + 1:
            await asyncio.sleep(0.001)
    store.release("t", claim.token)
    await asyncio.gather(*tasks)
    assert [r for k, r in run_events(store) if k == "run_started"] == ["w0", "w1", "w2"]


def test_enqueue_head_rests_between_a_hot_threads_steps(
    store: FencedSqliteSaver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused head waiting on a thread whose events come fast reads them at most every `_COOL`.

    Every waiter of every process would otherwise wake and read the log at
    every commit of the run it waits for (3x the CPU per run, measured).
    On PostgreSQL the head waits with a runs-only poller, which the steps do
    not wake at all (`test_postgres_events.py`): a wait returns steps only
    when they landed as it began, and only a run of such waits makes it rest.
    """
    monkeypatch.setattr(runqueue, "_BACKOFF_MIN", 0.4)  # one pause: 0.2-0.4 s
    monkeypatch.setattr(runqueue, "_COOL", 0.1)
    claim = store.claim("t", "other", 30)
    waits: list[float] = []
    make = store._poller

    asked: list[dict[str, Any]] = []

    def counting(**kwargs: Any) -> Any:
        asked.append(kwargs)
        poller = make(**kwargs)
        wait = poller.wait

        def counted(*args: Any, **kw: Any) -> Any:
            waits.append(time.monotonic())
            return wait(*args, **kw)

        poller.wait = counted
        return poller

    monkeypatch.setattr(store, "_poller", counting)
    stop = threading.Event()

    def steps() -> None:  # a run's steps' events, every 5 ms
        while not stop.wait(0.005):
            store.append_events("t", claim.token, [{"kind": "tick", "data": {}}])

    place = runqueue.Place(("x", "t"), 60, None)
    ticking = threading.Thread(target=steps)
    ticking.start()
    try:
        place.look(store._event_tail("t"))
        began = time.monotonic()
        place.wait_release(store)
        waited = time.monotonic() - began
    finally:
        stop.set()
        ticking.join()
        place.leave()
    # A tick comes within 5 ms of listening: from the third such wake on,
    # the head rests 0.1 s after each, so it waits at most once per 0.1 s
    # after its first 3. (Listening throughout, it woke at every tick: once
    # per 5 ms.)
    assert asked == [{"keep": True, "runs_only": True}]
    if isinstance(store, FencedSqliteSaver):  # the doorbell rings at every tick
        assert 3 <= len(waits) <= 3 + waited / 0.1
    else:
        assert 1 <= len(waits) <= 3 + waited / 0.1
    assert place.tail is not None and place.tail[0] >= len(waits)
    assert len(store.events_after("t", limit=1000)) >= 2 * len(waits)  # ticks went on


def test_enqueue_head_waits_past_a_run_end_that_another_runs_start_follows(
    store: FencedSqliteSaver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's end followed by another run's start (it won the claim) does not end the wait.

    A try would only be refused (measured with 8 processes on one thread:
    one refused begin_run per run less); the head waits for that run's end.
    """
    monkeypatch.setattr(runqueue, "_BACKOFF_MIN", 20.0)  # one pause: 10-20 s, not reached
    first = store.begin_run("t", "a", 30, run_id="a")
    place = runqueue.Place(("x", "t"), 60, None)
    ended: list[float] = []
    try:
        place.look(store._event_tail("t"))
        store.end_run("t", first.token, "run_completed")
        second = store.begin_run("t", "b", 30, run_id="b")

        def end_later() -> None:
            time.sleep(0.3)
            ended.append(time.monotonic())
            store.end_run("t", second.token, "run_completed")

        ender = threading.Thread(target=end_later)
        ender.start()
        place.wait_release(store)
        returned = time.monotonic()
        ender.join()
    finally:
        place.leave()
    # Returned by b's end (before the change: at once, on a's), not by the pause.
    assert ended and ended[0] <= returned < ended[0] + 5
    assert [k for k, _ in run_events(store)] == ["run_started", "run_completed"] * 2


def test_enqueue_times_out_with_thread_busy(runner: FencedRunner, store: FencedSqliteSaver) -> None:
    """Past wait_timeout, "enqueue" raises ThreadBusy and ran nothing."""
    store.claim("t", "other", 30)
    with pytest.raises(ThreadBusy) as info:
        runner.invoke(inp("a"), config(), strategy="enqueue", wait_timeout=0.05)
    assert info.value.holder == "other"
    assert all_events(store) == [] and runner.waiting("t") == 0


def test_interrupt_fences_off_the_running_invocation(
    runner: FencedRunner, store: FencedSqliteSaver, gate: Gate
) -> None:
    """Strategy "interrupt" takes over mid-graph; the old run fails, writing nothing more."""
    old, out = in_thread(
        runner.invoke, inp("old", block=True), config(run_id="old"), durability="sync"
    )
    assert gate.entered.wait(30)
    last_old = store.get_tuple(config()).config["configurable"]["checkpoint_id"]
    result = runner.invoke(inp("new"), config(run_id="new"), strategy="interrupt")
    assert result["log"][0] == "old:first"  # it ran from the last durable checkpoint
    gate.opened.set()
    old.join(30)
    assert isinstance(out.get("error"), StaleClaim)
    evs = all_events(store)
    fence = next(e.seq for e in evs if e.kind == "run_superseded")
    old_token = evs[0].token
    assert max(e.seq for e in evs if e.token == old_token) < fence
    assert run_events(store) == [
        ("run_started", "old"),
        ("run_superseded", "old"),
        ("run_started", "new"),
        ("run_completed", "new"),
    ]
    superseded = next(e for e in evs if e.kind == "run_superseded")
    assert superseded.data["by_run_id"] == "new" and superseded.data["was_live"]
    new_first = next(e for e in evs if e.kind == "checkpoint" and e.seq > fence)
    assert new_first.data["parent_checkpoint_id"] == last_old
    assert store.current_claim("t") is None


@pytest.mark.parametrize("durability", ["sync", "exit"])
def test_rollback_removes_exactly_the_superseded_run(
    runner: FencedRunner, store: FencedSqliteSaver, gate: Gate, durability: str
) -> None:
    """Strategy "rollback" retracts the superseded run's rows, never an earlier turn's."""
    runner.invoke(inp("t1"), config(run_id="t1"), durability=durability)
    turn1 = [(c.config["configurable"]["checkpoint_id"], c.metadata) for c in history(store)]
    old, out = in_thread(
        runner.invoke, inp("t2", block=True), config(run_id="t2"), durability=durability
    )
    assert gate.entered.wait(30)
    result = runner.invoke(
        inp("t3"), config(run_id="t3"), strategy="rollback", durability=durability
    )
    gate.opened.set()
    old.join(30)
    assert isinstance(out.get("error"), StaleClaim)
    assert result["log"] == ["t1:first", "t1:slow", "t1:last", "t3:first", "t3:slow", "t3:last"]
    runs = [c.metadata["run_id"] for c in history(store)]
    assert "t2" not in runs and runs.count("t1") == len(turn1)
    kept = {cid: md for cid, md in turn1}
    assert all(
        kept[c.config["configurable"]["checkpoint_id"]] == c.metadata
        for c in history(store)
        if c.metadata["run_id"] == "t1"
    )
    superseded = next(e for e in all_events(store) if e.kind == "run_superseded")
    assert superseded.data["run_id"] == "t2"
    wrote = durability == "sync"
    assert (superseded.data["retracted_checkpoints"] > 0) is wrote
    assert any(e.kind == "retracted" for e in all_events(store)) is wrote


@pytest.mark.parametrize("forget", ["compact_events", "prune"])
def test_rollback_finds_the_superseded_run_after_its_events_are_gone(
    open_store: Any, gate: Gate, forget: str
) -> None:
    """Rollback retracts the superseded run by the claim's run id, not by its run_started event.

    SQLite only: event compaction and event retention are its features.
    """
    store = open_store()
    runner = FencedRunner(build(gate).compile(checkpointer=store), store, holder="me")
    runner.invoke(inp("t1"), config(run_id="t1"))
    old, out = in_thread(runner.invoke, inp("t2", block=True), config(run_id="t2"))
    assert gate.entered.wait(30)
    assert "t2" in [c.metadata["run_id"] for c in history(store)]
    # The superseded run's run_started event goes: it used to be the only
    # way rollback found the run, so nothing was retracted.
    if forget == "compact_events":
        floor = store.compact_events("t", all_events(store)[-1].seq + 1)
    else:
        (pruned,) = store.prune(["t"], strategy=RetentionPolicy(max_events=0))
        floor = pruned.floor
    assert all(e.kind != "run_started" for e in store.events_after("t", floor - 1, 1000))
    result = runner.invoke(inp("t3"), config(run_id="t3"), strategy="rollback")
    gate.opened.set()
    old.join(30)
    assert isinstance(out.get("error"), StaleClaim)
    assert result["log"] == ["t1:first", "t1:slow", "t1:last", "t3:first", "t3:slow", "t3:last"]
    assert "t2" not in [c.metadata["run_id"] for c in history(store)]
    superseded = next(
        e for e in store.events_after("t", floor - 1, 1000) if e.kind == "run_superseded"
    )
    assert superseded.data["run_id"] == "t2" and superseded.data["retracted_checkpoints"] > 0


def test_a_plain_claim_after_a_run_carries_no_run_id(
    runner: FencedRunner, store: FencedSqliteSaver
) -> None:
    """A run id leaves the claim row on release: taking over a later claim retracts nothing."""
    runner.invoke(inp("t1"), config(run_id="t1"))
    assert thread_rows(store, "SELECT run_id FROM {threads} WHERE thread_id = 't'") == [(None,)]
    if isinstance(store, FencedSqliteSaver):
        # Its `run_started` goes too, which rollback could otherwise find by
        # scanning the events (the PostgreSQL store reads the claim row only).
        store.compact_events("t", all_events(store)[-1].seq + 1)
    before = len(history(store))
    store.claim("t", "manual", 30)
    runner.invoke(inp("t2"), config(run_id="t2"), strategy="rollback")
    runs = [c.metadata["run_id"] for c in history(store)]
    assert runs.count("t1") == before


def test_taking_over_a_re_created_thread_works(
    runner: FencedRunner, store: FencedSqliteSaver
) -> None:
    """Superseding a plain claim in a later incarnation of a thread reads that incarnation."""
    runner.invoke(inp("t1"), config(run_id="t1"))
    store.delete_thread("t")
    runner.invoke(inp("t2"), config(run_id="t2"))
    manual = store.claim("t", "manual", 30)
    # More events than one page of the scan for the superseded run's id.
    store.append_events("t", manual.token, [("note", {})] * 100)
    result = runner.invoke(inp("t3"), config(run_id="t3"), strategy="rollback")
    assert result["log"][-3:] == ["t3:first", "t3:slow", "t3:last"]
    superseded = next(e for e in all_events(store) if e.kind == "run_superseded")
    assert superseded.data["run_id"] is None and superseded.incarnation == 2


def test_rollback_of_a_foreign_claim_retracts_nothing(
    runner: FencedRunner, store: FencedSqliteSaver
) -> None:
    """A claim no runner logged has no run id to retract: earlier turns stay."""
    runner.invoke(inp("t1"), config(run_id="t1"))
    before = len(history(store))
    store.claim("t", "manual", 30)
    runner.invoke(inp("t2"), config(run_id="t2"), strategy="rollback")
    runs = [c.metadata["run_id"] for c in history(store)]
    assert runs.count("t1") == before
    superseded = next(e for e in all_events(store) if e.kind == "run_superseded")
    assert superseded.data["run_id"] is None and superseded.data["holder"] == "manual"


@pytest.mark.parametrize("durability", ["sync", "exit"])
def test_run_that_finished_after_losing_its_claim_raises(
    runner: FencedRunner, store: FencedSqliteSaver, durability: str
) -> None:
    """A run taken over after its last write still learns it lost: StaleClaim, nothing logged."""
    stream = runner.stream(
        inp("a"), config(run_id="r"), stream_mode="updates", durability=durability
    )
    for chunk in stream:
        if "last" in chunk:  # LangGraph yields the last update after the last write
            break
    thief = store.take_over("t", "thief", 30)
    with pytest.raises(StaleClaim, match="finished, but token") as info:
        next(stream)
    assert (info.value.holder, info.value.current_token) == ("thief", thief.token)
    assert "'thief'" in str(info.value)
    assert run_events(store) == [("run_started", "r")]
    assert store.current_claim("t") == thief  # its release changed nothing


# --- runs an operator can steer: takeover, cancel, timeout ---------------------------------


class Steps:
    """What the steering graph's nodes did, for the test to read."""

    def __init__(self) -> None:
        """Start with no node run."""
        self.ran: list[str] = []
        self.entered = threading.Event()
        self.cancelled = threading.Event()


def steer_graph(steps: Steps, *, node: str = "sync") -> StateGraph:
    """first -> wait -> last, where `wait` lasts until the runner stops the run.

    The sync `wait` returns once the run's `RunControl` is drained (so a test
    needs no sleep to know the stop was seen); the async one awaits a long
    sleep that only a cancel ends early.
    """

    def first(state: State) -> State:
        steps.ran.append("first")
        return {"log": ["first"]}

    def wait(state: State) -> State:
        steps.entered.set()
        deadline = time.monotonic() + 30
        while not get_runtime().control.drain_requested:
            assert time.monotonic() < deadline, "the runner never stopped the run"
            time.sleep(0.005)
        steps.ran.append("wait")
        return {"log": ["wait"]}

    async def await_(state: State) -> State:
        steps.entered.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            steps.cancelled.set()
            raise
        steps.ran.append("wait")
        return {"log": ["wait"]}

    def last(state: State) -> State:
        steps.ran.append("last")
        return {"log": ["last"]}

    g = StateGraph(State)
    g.add_node("first", first)
    g.add_node("wait", wait if node == "sync" else await_)
    g.add_node("last", last)
    g.add_edge(START, "first")
    g.add_edge("first", "wait")
    g.add_edge("wait", "last")
    g.add_edge("last", END)
    return g


def steer_runner(store: FencedSqliteSaver, steps: Steps, node: str = "sync", **kw: Any) -> Any:
    """A runner over the steering graph that renews (and so notices) quickly."""
    graph = steer_graph(steps, node=node).compile(checkpointer=store)
    return FencedRunner(graph, store, holder="me", ttl=5, renew_every=0.02, **kw)


@pytest.mark.parametrize("durability", ["sync", "exit"])
def test_taken_over_sync_run_starts_no_further_node(
    store: FencedSqliteSaver, durability: str
) -> None:
    """A sync run whose claim is taken over stops at the next node boundary."""
    steps = Steps()
    runner = steer_runner(store, steps)
    thread, out = in_thread(runner.invoke, inp("a"), config(run_id="r"), durability=durability)
    assert steps.entered.wait(30)
    thief = store.take_over("t", "operator", 30)
    thread.join(30)
    # `wait` ran to its end (LangGraph cannot stop a node mid-call); `last`
    # never started, even with durability="exit" (no write to be refused).
    assert steps.ran == ["first", "wait"]
    error = out.get("error")
    assert isinstance(error, StaleClaim), out
    assert (error.holder, error.current_token) == ("operator", thief.token)
    assert "'operator'" in str(error)
    assert run_events(store) == [("run_started", "r")]  # its end is not logged
    assert store.current_claim("t") == thief


async def test_taken_over_async_run_is_cancelled_mid_node(store: FencedSqliteSaver) -> None:
    """An async run whose claim is taken over is cancelled in the node it awaits."""
    steps = Steps()
    runner = steer_runner(store, steps, node="async")
    task = asyncio.ensure_future(runner.ainvoke(inp("a"), config(run_id="r")))
    assert await asyncio.to_thread(steps.entered.wait, 30)
    thief = await store.atake_over("t", "operator", 30)
    with pytest.raises(StaleClaim) as info:
        await task
    assert steps.cancelled.is_set() and steps.ran == ["first"]
    assert info.value.holder == "operator"
    assert run_events(store) == [("run_started", "r")]
    assert await store.acurrent_claim("t") == thief
    # The cancel the runner sent its task was taken back (Python 3.11+ counts them).
    assert getattr(asyncio.current_task(), "cancelling", lambda: 0)() == 0


def test_superseded_run_names_who_took_over_after_that_run_ended(
    runner: FencedRunner, store: FencedSqliteSaver, gate: Gate
) -> None:
    """StaleClaim names the run that took over, even once it has released the thread."""
    slow = FencedRunner(runner.graph, store, holder="old", ttl=30, renew_every=25)
    old, out = in_thread(
        slow.invoke, inp("old", block=True), config(run_id="old"), durability="sync"
    )
    assert gate.entered.wait(30)
    runner.invoke(inp("new"), config(run_id="new"), strategy="interrupt")
    assert store.current_claim("t") is None  # the new run is over
    new_token = next(e.token for e in all_events(store) if e.kind == "run_completed")
    gate.opened.set()
    old.join(30)
    error = out.get("error")
    assert isinstance(error, StaleClaim), out
    assert (error.current_token, error.holder, error.latest_token) == (None, "me", new_token)
    assert "'me'" in str(error) and f"token {new_token}" in str(error)


@pytest.mark.parametrize("api", ["sync", "async"])
def test_cancel_stops_the_run_and_logs_it(store: FencedSqliteSaver, api: str) -> None:
    """runner.cancel records the request; the run stops, releases and logs run_cancelled."""
    steps = Steps()
    runner = steer_runner(store, steps, node=api, principal="alice")
    if api == "sync":
        thread, out = in_thread(runner.invoke, inp("a"), config(run_id="r"), durability="sync")
    else:
        thread, out = in_thread(
            lambda: asyncio.run(runner.ainvoke(inp("a"), config(run_id="r"), durability="sync"))
        )
    assert steps.entered.wait(30)
    asked = runner.cancel("t", by="ops")
    assert asked is not None and asked.holder == "me"
    thread.join(30)
    error = out.get("error")
    assert isinstance(error, RunCancelled), out
    assert (error.thread_id, error.run_id, error.by) == ("t", "r", "ops")
    assert "last" not in steps.ran and steps.cancelled.is_set() == (api == "async")
    kinds = [(e.kind, e.data.get("run_id")) for e in all_events(store) if e.kind != "writes"]
    kinds = [k for k in kinds if k[0] != "checkpoint"]
    assert kinds == [("run_started", "r"), ("cancel_requested", "r"), ("run_cancelled", "r")]
    ended = all_events(store)[-1]
    assert ended.data["reason"] == "cancel_requested" and ended.data["by"] == "ops"
    assert ended.data["principal"] == "alice"
    assert store.current_claim("t") is None
    # What the run made durable stays: the thread resumes where it stopped.
    left = runner.graph.get_state(config()).next
    assert left == (("last",) if api == "sync" else ("wait",))


def test_cancel_goes_with_its_claim(runner: FencedRunner, store: FencedSqliteSaver) -> None:
    """A cancel is for the claim it found: a later run of the thread is not affected."""
    assert runner.cancel("t") is None  # nothing holds it: nothing recorded
    assert all_events(store) == []
    claim = store.claim("t", "manual", 30)
    assert store.cancel_run("t", by="ops") == claim
    assert all_events(store)[-1].data == {
        "run_id": None,
        "token": claim.token,
        "holder": "manual",
        "by": "ops",
        "tenant": None,
    }
    store.release("t", claim.token)
    runner.invoke(inp("a"), config(run_id="after"))
    assert run_events(store)[-1] == ("run_completed", "after")


@pytest.mark.parametrize("api", ["sync", "async"])
def test_timeout_stops_the_run_as_run_timed_out(store: FencedSqliteSaver, api: str) -> None:
    """A run past its timeout= stops (next node boundary, or at once when async)."""
    steps = Steps()
    runner = steer_runner(store, steps, node=api)
    if api == "sync":
        with pytest.raises(RunTimedOut) as info:
            runner.invoke(inp("a"), config(run_id="r"), timeout=0.05)
    else:
        with pytest.raises(TimeoutError) as info:
            asyncio.run(
                runner.ainvoke(inp("a"), config(run_id="r"), timeout=timedelta(seconds=0.05))
            )
    assert isinstance(info.value, RunTimedOut) and info.value.timeout == 0.05
    assert "last" not in steps.ran
    assert run_events(store) == [("run_started", "r"), ("run_timed_out", "r")]
    assert all_events(store)[-1].data["timeout"] == 0.05
    assert store.current_claim("t") is None


def test_cancelled_stream_ends_between_chunks(store: FencedSqliteSaver) -> None:
    """A cancelled stream yields nothing of the nodes it did not start."""
    steps = Steps()
    runner = steer_runner(store, steps)
    stream = runner.stream(inp("a"), config(run_id="r"), stream_mode="updates")
    assert next(stream) == {"first": {"log": ["first"]}}
    # Cancel once `wait` has started, while the consumer waits for the next chunk.
    # Cancelling while the stream is suspended after `first` raced the renewer
    # (every 0.02 s): on a loaded machine it saw the cancel before the stream was
    # resumed, and `wait` rightly never started (seen under pytest-xdist).
    canceller = threading.Thread(target=lambda: steps.entered.wait(30) and runner.cancel("t"))
    canceller.start()
    with pytest.raises(RunCancelled):
        for chunk in stream:
            assert "last" not in chunk
    canceller.join(30)
    assert steps.ran == ["first", "wait"]
    assert run_events(store)[-1] == ("run_cancelled", "r")


async def test_astream_left_through_aclosing_is_cancelled(
    runner: FencedRunner, store: FencedSqliteSaver, gate: Gate
) -> None:
    """Leaving `aclosing(runner.astream(...))` after one chunk logs run_cancelled."""
    async with contextlib.aclosing(runner.astream(inp("a"), config(run_id="r"))) as stream:
        async for _chunk in stream:
            break
    assert run_events(store) == [("run_started", "r"), ("run_cancelled", "r")]
    assert all_events(store)[-1].data["reason"] == "stream_closed"
    assert await store.acurrent_claim("t") is None


def test_steering_arguments_are_checked_before_anything_runs(
    runner: FencedRunner, store: FencedSqliteSaver, gate: Gate
) -> None:
    """Bad timeout, principal, tenant or control: errors naming the argument."""
    for kwargs, name in (
        ({"timeout": -1}, "timeout"),
        ({"timeout": "soon"}, "timeout"),
        ({"principal": ""}, "principal"),
        ({"control": "drain"}, "control"),
    ):
        with pytest.raises(ValueError, match=name):
            runner.invoke(inp("a"), config(), **kwargs)
    with pytest.raises(ValueError, match="tenant"):
        FencedRunner(runner.graph, store, tenant="")
    with pytest.raises(ValueError, match="by"):
        runner.cancel("t", by="")
    assert gate.calls == 0 and all_events(store) == []


# --- tenants and principals --------------------------------------------------------------


def test_a_tenant_runner_refuses_another_tenants_thread(
    store: FencedSqliteSaver, gate: Gate
) -> None:
    """TenantMismatch comes before the thread is touched: no claim, no event, no node."""
    graph = build(gate).compile(checkpointer=store)
    acme = FencedRunner(graph, store, holder="a", tenant="acme", principal="alice")
    globex = FencedRunner(graph, store, holder="g", tenant="globex")
    acme.invoke(inp("a"), config(run_id="r1"))
    before, calls = all_events(store), gate.calls
    for attempt in (
        lambda: globex.invoke(inp("b"), config(), strategy="interrupt"),
        lambda: globex.delete_thread("t"),
        lambda: globex.cancel("t"),
    ):
        with pytest.raises(TenantMismatch) as info:
            attempt()
        assert (info.value.tenant, info.value.thread_tenant) == ("globex", "acme")
        assert isinstance(info.value, ClaimError) and "nothing was touched" in str(info.value)
    assert all_events(store) == before and gate.calls == calls
    assert store.current_claim("t") is None
    # The owner goes on; a runner without a tenant (an operator's) may too.
    acme.invoke(inp("c"), config(run_id="r2"), principal="bob")
    FencedRunner(graph, store, holder="ops").invoke(inp("d"), config(run_id="r3"))
    named = [
        (e.kind, e.data["tenant"], e.data["principal"])
        for e in all_events(store)
        if e.kind in RUN_KINDS
    ]
    assert named == [
        ("run_started", "acme", "alice"),
        ("run_completed", "acme", "alice"),
        ("run_started", "acme", "bob"),
        ("run_completed", "acme", "bob"),
        ("run_started", None, None),
        ("run_completed", None, None),
    ]


def test_a_tenant_runner_refuses_a_thread_written_without_a_tenant(
    store: FencedSqliteSaver, gate: Gate
) -> None:
    """A thread with history and no tenant is nobody's to adopt; an empty one is."""
    graph = build(gate).compile(checkpointer=store)
    FencedRunner(graph, store).invoke(inp("a"), config("old"))
    acme = FencedRunner(graph, store, tenant="acme")
    with pytest.raises(TenantMismatch) as info:
        acme.invoke(inp("b"), config("old"))
    assert info.value.thread_tenant is None
    store.claim("fresh", "someone", 30)  # a row, but nothing in it yet
    acme.invoke(inp("c"), config("fresh"), strategy="interrupt")
    with pytest.raises(TenantMismatch):
        FencedRunner(graph, store, tenant="globex").invoke(inp("d"), config("fresh"))
    acme.delete_thread("fresh")
    with pytest.raises(TenantMismatch):  # a deleted thread stays its tenant's
        FencedRunner(graph, store, tenant="globex").invoke(inp("e"), config("fresh"))


# --- renewal and deletion ------------------------------------------------------------------


@pytest.mark.parametrize("api", ["sync", "async"])
def test_claim_is_renewed_in_the_background(
    open_store: Any, clock: Any, gate: Gate, api: str
) -> None:
    """A run longer than renew_every keeps its claim alive (store clock moved by hand)."""
    store = open_store()
    runner = FencedRunner(build(gate).compile(checkpointer=store), store, ttl=10, renew_every=0.01)
    if api == "sync":
        thread, out = in_thread(runner.invoke, inp("a", block=True), config())
    else:
        thread, out = in_thread(lambda: asyncio.run(runner.ainvoke(inp("a", block=True), config())))
    assert gate.entered.wait(30)
    first = store.current_claim("t")
    assert first is not None
    now = clock.advance(8)
    wait_for(lambda: store.current_claim("t").expires_at >= now + 10, "a renewal")
    clock.advance(8)  # past the first expiry: still ours
    with pytest.raises(ThreadBusy):
        store.claim("t", "other", 5)
    gate.opened.set()
    thread.join(30)
    assert "error" not in out


def test_delete_thread_refuses_a_live_run(
    runner: FencedRunner, store: FencedSqliteSaver, gate: Gate
) -> None:
    """delete_thread claims first: a thread with a run in flight is refused."""
    runner.invoke(inp("t1"), config())
    thread, out = in_thread(runner.invoke, inp("t2", block=True), config())
    assert gate.entered.wait(30)
    with pytest.raises(ThreadBusy):
        runner.delete_thread("t")
    assert store.get_tuple(config()) is not None
    gate.opened.set()
    thread.join(30)
    asyncio.run(runner.adelete_thread("t"))
    assert store.get_tuple(config()) is None and all_events(store) == []
    assert store.current_claim("t") is None
    runner.invoke(inp("t3"), config())
    assert all_events(store)[0].seq == 1


def test_deleting_a_thread_that_never_existed_leaves_no_row(
    runner: FencedRunner, store: FencedSqliteSaver
) -> None:
    """The runner's delete of an unknown id claims it, and leaves nothing behind."""
    runner.delete_thread("never-there")
    assert thread_rows(store, "SELECT count(*) FROM {threads}") == [(0,)]
    assert store.events_after("never-there", 5) == []


# --- the benchmark cannot rot ------------------------------------------------------------


def test_benchmark_quick_run(tmp_path: Path) -> None:
    """benchmarks/bench_runner.py --quick runs and prints its table."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_runner.py"), "--quick"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "FencedRunner" in result.stdout and "SqliteSaver" in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_saver_run_lifecycle_is_two_commits_with_their_events(tmp_path: Any) -> None:
    """begin_run claims and logs run_started together; end_run logs and releases together."""
    with FencedSqliteSaver(str(tmp_path / "runs.db")) as saver:
        first = saver.begin_run("t", "a", 30, run_id="r1")
        assert [(e.kind, e.token) for e in saver.events_after("t")] == [
            ("run_started", first.token)
        ]
        with pytest.raises(ThreadBusy):
            saver.begin_run("t", "b", 30, run_id="r2")
        second = saver.begin_run("t", "b", 30, run_id="r2", strategy="interrupt")
        kinds = [(e.kind, e.data.get("run_id")) for e in saver.events_after("t")]
        assert kinds == [("run_started", "r1"), ("run_superseded", "r1"), ("run_started", "r2")]
        assert saver.end_run("t", first.token, "run_failed") is False  # superseded: no-op
        assert saver.end_run("t", second.token, "run_completed") is True
        assert saver.events_after("t")[-1].kind == "run_completed"
        assert saver.current_claim("t") is None
        saver.claim("t", "c", 30)
        with pytest.raises(ThreadBusy):
            saver.delete_unclaimed_thread("t", "janitor")
        assert saver.events_after("t")  # nothing was deleted


def test_a_runner_gives_each_runs_thread_its_ttl(store: Any) -> None:
    """`thread_ttl=` sets the thread's TTL as its run starts, on either store."""
    from langgraph_fenced_sqlite import ThreadTTL

    runner = FencedRunner(build().compile(), store, thread_ttl=ThreadTTL(86400, "keep_latest"))
    assert store.thread_ttl("t") is None
    runner.invoke(inp("a"), config())
    assert store.thread_ttl("t") == ThreadTTL(86400.0, "keep_latest")
    with pytest.raises(ValueError, match="thread_ttl"):
        FencedRunner(build().compile(), store, thread_ttl=86400)  # type: ignore[arg-type]
