"""FencedRunner across real processes: every strategy, a SIGKILL, safe deletion, steering."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.configs import config
from support.processes import lgfs, start, wait_for_file

from langgraph_fenced_sqlite import (
    FencedRunner,
    FencedSqliteSaver,
    SystemClock,
    ThreadBusy,
)

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

# The graph both sides run: `slow` waits for `<gate>/<turn>.open` when the
# input says `block`, after creating `<gate>/<turn>.entered`.
GRAPH_SRC = """
import operator, os, time
from typing import Annotated, TypedDict
from langgraph.graph import END, START, StateGraph

class State(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    turn: str
    block: bool

def build(gate_dir):
    def first(state):
        return {"log": [state["turn"] + ":first"]}

    def slow(state):
        if state.get("block"):
            open(os.path.join(gate_dir, state["turn"] + ".entered"), "w").close()
            while not os.path.exists(os.path.join(gate_dir, state["turn"] + ".open")):
                time.sleep(0.005)
        return {"log": [state["turn"] + ":slow"]}

    def last(state):
        return {"log": [state["turn"] + ":last"]}

    g = StateGraph(State)
    for name, fn in (("first", first), ("slow", slow), ("last", last)):
        g.add_node(name, fn)
    g.add_edge(START, "first")
    g.add_edge("first", "slow")
    g.add_edge("slow", "last")
    g.add_edge("last", END)
    return g
"""

WORKER_SRC = (
    GRAPH_SRC
    + """
import asyncio, json, sys
from langgraph_fenced_sqlite import FencedRunner, FencedSqliteSaver, FencedSqliteError, ThreadBusy

db, gate_dir, thread, turn, strategy, api, durability, ttl, probe = sys.argv[1:10]
inputs = {"turn": turn, "block": True}
config = {"configurable": {"thread_id": thread}, "metadata": {"run_id": turn}}

def open_store(db):
    if db.startswith("pg:"):
        from langgraph_fenced_sqlite.postgres import FencedPostgresSaver
        return FencedPostgresSaver.from_conn_string(db[3:])
    return FencedSqliteSaver(db)

with open_store(db) as saver:
    runner = FencedRunner(build(gate_dir).compile(checkpointer=saver), saver, ttl=float(ttl))
    if probe == "probe":
        try:
            runner.invoke(inputs, config)
        except ThreadBusy:
            open(os.path.join(gate_dir, turn + ".busy"), "w").close()
        else:
            raise SystemExit("the thread was not busy")
    if os.environ.get("LGFS_TEST_BACKOFF"):  # an enqueue's poll, made as slow as asked
        from langgraph_fenced_sqlite.runner import queue as runqueue
        runqueue._BACKOFF_MIN = runqueue._BACKOFF_MAX = float(os.environ["LGFS_TEST_BACKOFF"])
    refusals = []
    begin_run = saver.begin_run

    def counted(*args, **kwargs):  # gates/<turn>.refused<n> on the n-th refused begin_run
        try:
            return begin_run(*args, **kwargs)
        except ThreadBusy:
            refusals.append(1)
            open(os.path.join(gate_dir, f"{turn}.refused{len(refusals)}"), "w").close()
            raise

    saver.begin_run = counted
    try:
        wait = float(os.environ.get("LGFS_TEST_WAIT", "60"))
        kw = {"strategy": strategy, "durability": durability, "wait_timeout": wait}
        if api == "async":
            out = asyncio.run(runner.ainvoke(inputs, config, **kw))
        else:
            out = runner.invoke(inputs, config, **kw)
        print(json.dumps({"log": out["log"]}))
    except FencedSqliteError as exc:
        print(json.dumps({"error": exc.code}))
"""
)

_graph_ns: dict[str, Any] = {}
# The same build() for this process's side (compiled without this module's
# `from __future__ import annotations`, so the TypedDict resolves).
exec(compile(GRAPH_SRC, "graph_src", "exec", dont_inherit=True), _graph_ns)
build = _graph_ns["build"]
RUN_KINDS = (
    "run_started",
    "run_completed",
    "run_interrupted",
    "run_failed",
    "run_superseded",
    "run_cancelled",
    "run_timed_out",
)


class Workers:
    """Start worker processes on one store; kill leftovers at teardown."""

    def __init__(self, tmp: Path, db: str | None = None) -> None:
        """Write the worker script and make the gates directory in `tmp`.

        `db` is the store: a SQLite file (default: one in `tmp`) or
        `"pg:" + dsn` for PostgreSQL.
        """
        self.tmp = tmp
        self.db = db or str(tmp / "runner.db")
        self.gates = tmp / "gates"
        self.gates.mkdir()
        self.script = tmp / "worker.py"
        self.script.write_text(WORKER_SRC)
        self.procs: list[subprocess.Popen[str]] = []

    def start(
        self,
        turn: str,
        *,
        strategy: str = "reject",
        api: str = "sync",
        durability: str = "sync",
        ttl: float = 30.0,
        probe: bool = False,
        thread: str = "t",
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[str]:
        """Start a worker that runs `turn` (blocking in `slow` until its gate opens).

        `env` adds to its environment: `LGFS_TEST_BACKOFF` (seconds: an
        "enqueue" polls no faster), `LGFS_TEST_WAIT` (its `wait_timeout`).
        """
        args = [self.db, str(self.gates), thread, turn, strategy, api, durability, str(ttl)]
        proc = start(
            [sys.executable, str(self.script), *args, "probe" if probe else "-"], env=env or {}
        )
        self.procs.append(proc)
        return proc

    def wait_file(self, name: str, proc: subprocess.Popen[str]) -> None:
        """Wait until the worker creates gates/<name> (failing if it exits)."""
        wait_for_file(self.gates / name, proc, name)

    def open_gate(self, turn: str) -> None:
        """Let the worker running `turn` go on."""
        (self.gates / f"{turn}.open").touch()

    def result(self, proc: subprocess.Popen[str]) -> dict[str, Any]:
        """Wait for the worker and return the JSON it printed last."""
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])

    def close(self) -> None:
        """Kill the workers still running and reap them all."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


@pytest.fixture
def sqlite_workers(tmp_path: Path) -> Any:
    """Workers on a file in the test's temporary directory."""
    w = Workers(tmp_path)
    yield w
    w.close()


@pytest.fixture(params=["sqlite", "postgres"])
def workers(request: Any, tmp_path: Path) -> Any:
    """Workers on a SQLite file, or on a fresh PostgreSQL schema (each test runs on both)."""
    db = None
    if request.param == "postgres":
        db = "pg:" + request.getfixturevalue("pg_dsn")
    w = Workers(tmp_path, db)
    yield w
    w.close()


def _open_local(db: str) -> Any:
    """Open this process's store on the workers' (their clock: the system's, or the database's)."""
    if db.startswith("pg:"):
        from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

        opener = FencedPostgresSaver.from_conn_string(db[3:])
        saver = opener.__enter__()
        saver.setup()  # before any worker starts: they share this schema
        return saver
    return FencedSqliteSaver(db, clock=SystemClock())


@pytest.fixture
def local(workers: Workers) -> Any:
    """This process's runner on the workers' store."""
    saver = _open_local(workers.db)
    try:
        yield FencedRunner(build(str(workers.gates)).compile(checkpointer=saver), saver)
    finally:
        saver.close()


@pytest.fixture
def sqlite_local(sqlite_workers: Workers) -> Any:
    """This process's runner on the SQLite workers' file."""
    saver = _open_local(sqlite_workers.db)
    try:
        yield FencedRunner(build(str(sqlite_workers.gates)).compile(checkpointer=saver), saver)
    finally:
        saver.close()


def turn(name: str) -> dict[str, Any]:
    """Return the input of a turn that does not block."""
    return {"turn": name, "block": False}


def lifecycle(saver: FencedSqliteSaver, thread: str = "t") -> list[tuple[str, Any]]:
    """Return (kind, run id) of the thread's runner events, in order."""
    return [
        (e.kind, e.data.get("run_id"))
        for e in saver.events_after(thread, 0, 10_000)
        if e.kind in RUN_KINDS
    ]


def assert_fenced(saver: FencedSqliteSaver, old_run: str, thread: str = "t") -> None:
    """No event (so no checkpoint or write) under the old run's token after the fence."""
    evs = saver.events_after(thread, 0, 10_000)
    old = next(e.token for e in evs if e.kind == "run_started" and e.data["run_id"] == old_run)
    fence = next(e.seq for e in evs if e.kind == "run_superseded" and e.data["run_id"] == old_run)
    assert max(e.seq for e in evs if e.token == old) < fence
    assert all(e.token > old for e in evs if e.seq >= fence and e.token is not None)


@pytest.mark.parametrize("api", ["sync", "async"])
def test_reject_then_enqueue_across_processes(
    workers: Workers, local: FencedRunner, api: str
) -> None:
    """A busy thread rejects at once, and an "enqueue" in another process waits its turn."""
    p1 = workers.start("p1", api=api)
    workers.wait_file("p1.entered", p1)
    with pytest.raises(ThreadBusy) as info:
        local.invoke(turn("x"), config(run_id="x"))
    assert info.value.holder.split(":")[1] == str(p1.pid)
    p2 = workers.start(
        "p2", strategy="enqueue", api="async" if api == "sync" else "sync", probe=True
    )
    workers.wait_file("p2.busy", p2)
    time.sleep(0.3)  # let p2 start polling (not an assertion: it only makes the wait real)
    workers.open_gate("p1")
    workers.open_gate("p2")
    assert workers.result(p1)["log"] == ["p1:first", "p1:slow", "p1:last"]
    assert workers.result(p2)["log"][-3:] == ["p2:first", "p2:slow", "p2:last"]
    assert lifecycle(local.saver) == [
        ("run_started", "p1"),
        ("run_completed", "p1"),
        ("run_started", "p2"),
        ("run_completed", "p2"),
    ]
    assert local.saver.current_claim("t") is None


@pytest.mark.parametrize("api", ["sync", "async"])
def test_enqueue_is_woken_by_a_run_ending_in_another_process(
    workers: Workers, local: FencedRunner, api: str
) -> None:
    """A refused "enqueue" waits on the thread's log: another process's run ending lets it in.

    Its poll is made an hour apart here (and its wait_timeout too), so only
    that wake-up can let it run before `result()` gives up after 120 s. The
    steps of the run it waits for log events too; those must not make it
    try (it would be refused again: the lifecycle shows no extra start).
    """
    p1 = workers.start("p1", api=api)
    workers.wait_file("p1.entered", p1)
    slow = {"LGFS_TEST_BACKOFF": "3600", "LGFS_TEST_WAIT": "7200"}
    p2 = workers.start("p2", strategy="enqueue", api="async" if api == "sync" else "sync", env=slow)
    workers.wait_file("p2.refused2", p2)  # refused, read the log's end, refused again: waiting
    workers.open_gate("p2")
    workers.open_gate("p1")
    assert workers.result(p1)["log"] == ["p1:first", "p1:slow", "p1:last"]
    assert workers.result(p2)["log"][-3:] == ["p2:first", "p2:slow", "p2:last"]
    assert lifecycle(local.saver) == [
        ("run_started", "p1"),
        ("run_completed", "p1"),
        ("run_started", "p2"),
        ("run_completed", "p2"),
    ]
    # Refused when it came and once more after reading the log's end; p1's
    # steps did not make it try again.
    assert sorted(p.name for p in workers.gates.glob("p2.refused*")) == [
        "p2.refused1",
        "p2.refused2",
    ]


@pytest.mark.parametrize("api", ["sync", "async"])
def test_interrupt_across_processes(workers: Workers, local: FencedRunner, api: str) -> None:
    """Strategy "interrupt" fences off another process's run and goes on from its checkpoint."""
    p1 = workers.start("p1", api=api)
    workers.wait_file("p1.entered", p1)
    out = local.invoke(turn("new"), config(run_id="new"), strategy="interrupt")
    assert out["log"] == ["p1:first", "new:first", "new:slow", "new:last"]
    workers.open_gate("p1")
    assert workers.result(p1) == {"error": "stale_claim"}
    assert lifecycle(local.saver) == [
        ("run_started", "p1"),
        ("run_superseded", "p1"),
        ("run_started", "new"),
        ("run_completed", "new"),
    ]
    assert_fenced(local.saver, "p1")
    assert local.saver.current_claim("t") is None


@pytest.mark.parametrize("durability", ["sync", "exit"])
def test_rollback_across_processes(workers: Workers, local: FencedRunner, durability: str) -> None:
    """Strategy "rollback" removes exactly the superseded run's rows, not the earlier turn's."""
    local.invoke(turn("t1"), config(run_id="t1"), durability=durability)
    saver = local.saver
    turn1 = {c.config["configurable"]["checkpoint_id"] for c in saver.list(config(run_id="t1"))}
    p2 = workers.start("t2", durability=durability)
    workers.wait_file("t2.entered", p2)
    out = local.invoke(turn("t3"), config(run_id="t3"), strategy="rollback", durability=durability)
    assert out["log"] == ["t1:first", "t1:slow", "t1:last", "t3:first", "t3:slow", "t3:last"]
    workers.open_gate("t2")
    assert workers.result(p2) == {"error": "stale_claim"}
    history = list(saver.list(config(run_id="t3")))
    assert {c.metadata["run_id"] for c in history} == {"t1", "t3"}
    assert turn1 <= {c.config["configurable"]["checkpoint_id"] for c in history}
    assert lifecycle(saver)[2:] == [
        ("run_started", "t2"),
        ("run_superseded", "t2"),
        ("run_started", "t3"),
        ("run_completed", "t3"),
    ]
    assert_fenced(saver, "t2")


def test_killed_worker_is_taken_over_after_its_ttl(workers: Workers, local: FencedRunner) -> None:
    """A worker killed with SIGKILL holds its thread until the ttl, then "enqueue" gets it."""
    p1 = workers.start("p1", ttl=1.0)
    workers.wait_file("p1.entered", p1)
    os.kill(p1.pid, signal.SIGKILL)
    p1.wait()
    out = local.invoke(turn("after"), config(run_id="after"), strategy="enqueue", wait_timeout=60)
    assert out["log"] == ["p1:first", "after:first", "after:slow", "after:last"]
    assert lifecycle(local.saver) == [
        ("run_started", "p1"),
        ("run_superseded", "p1"),
        ("run_started", "after"),
        ("run_completed", "after"),
    ]
    superseded = next(e for e in local.saver.events_after("t") if e.kind == "run_superseded")
    assert superseded.data["was_live"] is False


def test_delete_thread_refuses_a_run_in_another_process(
    workers: Workers, local: FencedRunner
) -> None:
    """runner.delete_thread refuses while another process runs the thread."""
    p1 = workers.start("p1")
    workers.wait_file("p1.entered", p1)
    with pytest.raises(ThreadBusy):
        local.delete_thread("t")
    assert local.saver.get_tuple(config(run_id="x")) is not None
    workers.open_gate("p1")
    workers.result(p1)
    local.delete_thread("t")
    assert local.saver.get_tuple(config(run_id="x")) is None
    assert local.saver.events_after("t") == []


# --- steering a run in another process: takeover, cancel, timeout ---------------------------

# Seconds the child's slow node lasts when nothing stops it: only a bound for a
# test that fails. Every test stops the node well before; 8 s was too short for
# `lgfs runs cancel` to start up on a loaded machine (seen under pytest-xdist, the
# run had ended before the cancel came).
SLOW = 60.0

# A child running first -> slow -> after on thread "t", leaving marker files:
# slow.entered, slow.done (the slow node reached its end), after.ran. The sync
# slow node returns early once the run is drained (LangGraph cannot stop a
# node mid-call; this one looks), the async one only ends early if cancelled.
STEER_SRC = """
import asyncio, json, os, sys, time
from typing import TypedDict
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import get_runtime
from langgraph_fenced_sqlite import FencedRunner, FencedSqliteError, FencedSqliteSaver

class State(TypedDict, total=False):
    n: int

db, marks, api, durability, timeout, slow_s = sys.argv[1:7]
entered = []

def mark(name):
    open(os.path.join(marks, name), "w").close()

def first(state):
    return {"n": 1}

def slow_sync(state):
    entered.append(time.monotonic())
    mark("slow.entered")
    control, end = get_runtime().control, time.monotonic() + float(slow_s)
    while time.monotonic() < end and not control.drain_requested:
        time.sleep(0.01)
    mark("slow.done")
    return {"n": 2}

async def slow_async(state):
    entered.append(time.monotonic())
    mark("slow.entered")
    await asyncio.sleep(float(slow_s))
    mark("slow.done")
    return {"n": 2}

def after(state):
    mark("after.ran")
    return {"n": 3}

g = StateGraph(State)
g.add_node("first", first)
g.add_node("slow", slow_sync if api == "sync" else slow_async)
g.add_node("after", after)
g.add_edge(START, "first")
g.add_edge("first", "slow")
g.add_edge("slow", "after")
g.add_edge("after", END)
config = {"configurable": {"thread_id": "t"}, "metadata": {"run_id": "child"}}
kw = {"durability": durability}
if timeout != "-":
    kw["timeout"] = float(timeout)
with FencedSqliteSaver(db) as saver:
    runner = FencedRunner(g.compile(checkpointer=saver), saver, holder="child", ttl=1.5)
    try:
        if api == "async":
            asyncio.run(runner.ainvoke({"n": 0}, config, **kw))
        else:
            runner.invoke({"n": 0}, config, **kw)
        out = {"code": None}
    except FencedSqliteError as exc:
        out = exc.to_dict()
    out["entered_to_end"] = time.monotonic() - entered[0] if entered else None
    print(json.dumps(out))
"""


class Steered:
    """A child process running the steering graph, and its marker files."""

    def __init__(self, workers: Workers, api: str, durability: str, timeout: str = "-") -> None:
        """Start the child on the workers' file."""
        self.marks = workers.tmp / "marks"
        self.marks.mkdir()
        script = workers.tmp / "steer.py"
        script.write_text(STEER_SRC)
        args = [workers.db, str(self.marks), api, durability, timeout, str(SLOW)]
        self.proc = start([sys.executable, str(script), *args])
        workers.procs.append(self.proc)
        self.workers = workers

    def entered(self) -> None:
        """Wait until the child is in its slow node (failing if it exits first)."""
        wait_for_file(self.marks / "slow.entered", self.proc, "its slow node")

    def has(self, name: str) -> bool:
        """Whether the child left marker `name`."""
        return (self.marks / name).exists()

    def result(self) -> dict[str, Any]:
        """Wait for the child; return what it reported."""
        return self.workers.result(self.proc)


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_run_taken_over_by_another_process_starts_no_further_node(
    sqlite_workers: Workers, api: str
) -> None:
    """Another worker takes the thread over: the run stops (async: mid-node) and says who."""
    child = Steered(sqlite_workers, api, durability="exit")  # no write of its own to be refused
    child.entered()
    with FencedSqliteSaver(sqlite_workers.db) as saver:
        new = saver.begin_run("t", "parent", 30, run_id="new", strategy="interrupt")
        out = child.result()
        assert (out["code"], out["holder"], out["current_token"]) == (
            "stale_claim",
            "parent",
            new.token,
        )
        assert not child.has("after.ran")  # the next node never started
        if api == "async":
            # Cancelled in the node it awaited, long before that node's end.
            assert not child.has("slow.done")
            assert out["entered_to_end"] < SLOW
        assert lifecycle(saver) == [
            ("run_started", "child"),
            ("run_superseded", "child"),
            ("run_started", "new"),
        ]
        assert saver.end_run("t", new.token, "run_completed")


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_cancel_from_another_process_stops_the_run(
    sqlite_workers: Workers, sqlite_local: FencedRunner, api: str
) -> None:
    """`runner.cancel` (sync child) or `lgfs runs cancel` (async child) stops the run."""
    child = Steered(sqlite_workers, api, durability="sync")
    child.entered()
    if api == "sync":
        asked = sqlite_local.cancel("t", by="oncall")
        assert asked is not None and asked.holder == "child"
    else:
        done = lgfs("runs", "cancel", sqlite_workers.db, "t", "--by", "oncall", "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["cancel_requested"] is True
    out = child.result()
    assert (out["code"], out["run_id"], out["by"]) == ("run_cancelled", "child", "oncall")
    assert not child.has("after.ran")
    if api == "async":
        assert not child.has("slow.done")
    saver = sqlite_local.saver
    assert lifecycle(saver) == [("run_started", "child"), ("run_cancelled", "child")]
    kinds = [e.kind for e in saver.events_after("t", 0, 10_000)]
    assert kinds.index("cancel_requested") < kinds.index("run_cancelled")
    ended = saver.events_after("t", 0, 10_000)[-1]
    assert (ended.data["reason"], ended.data["by"]) == ("cancel_requested", "oncall")
    assert saver.current_claim("t") is None


def test_a_run_past_its_timeout_in_another_process_is_stopped(sqlite_workers: Workers) -> None:
    """timeout= stops an async run mid-node, logged as run_timed_out (not run_failed)."""
    child = Steered(sqlite_workers, "async", durability="sync", timeout="0.5")
    out = child.result()
    assert (out["code"], out["timeout"]) == ("run_timed_out", 0.5)
    assert not child.has("slow.done") and not child.has("after.ran")
    with FencedSqliteSaver(sqlite_workers.db) as saver:
        assert lifecycle(saver) == [("run_started", "child"), ("run_timed_out", "child")]
        assert saver.current_claim("t") is None
