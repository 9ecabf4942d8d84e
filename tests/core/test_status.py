"""`thread_status` and `threads(status=..., inactive_for=...)` on real graph runs.

Two files of real runs: the agent file (`support.graphs.make_agent_file`:
tool calls, a `Send` fan-out, a subgraph, interrupts, a failed model call)
for idle, running, interrupted and failed; the ops file
(`support.graphs.make_ops_file`: the real runner and LangGraph, a subgraph
and an interrupt) for what an operator filters on. A crashed worker is a
real process killed with SIGKILL while its node runs.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from datetime import timedelta
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.types import Command
from support.configs import config
from support.graphs import (
    DAY,
    QUESTION,
    UUID_THREAD,
    build_agent,
    build_ops_graph,
    make_agent_file,
    make_ops_file,
)
from support.processes import TESTS_DIR, python, reap

from langgraph_fenced_sqlite import (
    THREAD_STATES,
    Event,
    Failure,
    FencedRunner,
    FencedSqliteSaver,
    InvalidArgument,
    ManualClock,
    ThreadStatus,
    Waiting,
    claim_live,
)
from langgraph_fenced_sqlite.core.status import judge


@pytest.fixture(scope="module")
def agent_db(tmp_path_factory: Any) -> str:
    """The agent file (read-only use)."""
    path = str(tmp_path_factory.mktemp("status") / "agent.db")
    make_agent_file(path)
    return path


def test_each_thread_of_the_agent_file_has_its_status(agent_db: str) -> None:
    with FencedSqliteSaver(agent_db) as saver:
        got = {t: saver.thread_status(t) for t in ("chat-1", "chat-2", "chat-3", "chat-4")}
        running, idle = saver.thread_status("chat-5"), saver.thread_status("chat-6")
        latest = saver.history_records("chat-1", limit=1)[0]
        assert saver.thread_status("nobody") is None
        assert saver.thread_status(UUID_THREAD).state == "idle"  # type: ignore[union-attr]
    one = got["chat-1"]
    assert isinstance(one, ThreadStatus) and one.state == "interrupted"
    assert one.checkpoint_id == latest["checkpoint_id"] and one.run_id == latest["run_id"]
    assert [(w.node, w.value["question"]) for w in one.waiting] == [("review", "send the report?")]
    assert one.holder is None  # the run released its claim when it stopped
    assert [w.node for w in got["chat-2"].waiting] == ["worker"]  # type: ignore[union-attr]
    assert got["chat-2"].waiting[0].value == {"approve city": "Lyon"}  # type: ignore[union-attr]
    assert [(w.node, w.value) for w in got["chat-3"].waiting] == [  # type: ignore[union-attr]
        ("research", "summary ok?")
    ]
    four = got["chat-4"]
    assert four is not None and four.state == "failed" and four.failure is not None
    assert (four.failure.node, four.failure.error) == ("agent", "ValueError")
    assert "model timed out" in four.failure.message
    assert running is not None and running.state == "running"
    assert running.holder == "worker-7" and running.expires_in is not None
    assert 3000 < running.expires_in <= 3600
    assert idle is not None and idle.state == "idle" and idle.waiting == () and idle.failure is None


async def test_the_async_twin_answers_the_same(agent_db: str) -> None:
    with FencedSqliteSaver(agent_db) as saver:
        sync = saver.thread_status("chat-2")
        assert await saver.athread_status("chat-2") == sync


def test_a_run_whose_claim_expired_without_an_end_is_failed_until_taken_over(
    tmp_path: Any,
) -> None:
    """A crashed worker: `run_started` logged, checkpoints written, no end, claim expired."""
    clock = ManualClock(1_000_000.0)
    with FencedSqliteSaver(str(tmp_path / "crash.db"), clock=clock) as saver:
        claim = saver.begin_run("t", "worker-9", 30, run_id="run-9")
        graph = build_agent(saver)
        graph.invoke({"messages": [HumanMessage(QUESTION)]}, claim.config(config("t")))
        assert saver.thread_status("t").state == "running"  # type: ignore[union-attr]
        clock.advance(31)
        crashed = saver.thread_status("t")
        assert crashed is not None and crashed.state == "failed" and crashed.failure is not None
        assert crashed.failure.error == "claim_expired" and crashed.run_id == "run-9"
        assert "worker-9" in crashed.failure.message and crashed.expires_in == -1.0
        assert claim_live(crashed.token, crashed.expires_at, clock.now()) is False
        saver.take_over("t", "worker-10", 30)
        assert saver.thread_status("t").holder == "worker-10"  # type: ignore[union-attr]


def test_a_graph_run_after_a_failed_run_is_judged_by_its_own_checkpoint(tmp_path: Any) -> None:
    """`run_failed` stops counting once a later root checkpoint was written outside that run."""
    with FencedSqliteSaver(str(tmp_path / "later.db")) as saver:
        claim = saver.begin_run("t", "w", 30, run_id="run-1")
        saver.end_run("t", claim.token, "run_failed", {"error": "StoreBusy", "message": "locked"})
        failed = saver.thread_status("t")
        assert failed is not None and failed.state == "failed" and failed.failure is not None
        assert (failed.failure.node, failed.failure.error) == (None, "StoreBusy")
        build_agent(saver).invoke({"messages": [HumanMessage("hi")]}, config("t"))
        assert saver.thread_status("t").state == "interrupted"  # type: ignore[union-attr]


def test_a_damaged_thread_row_is_unknown_not_an_exception(tmp_path: Any) -> None:
    path = str(tmp_path / "damaged.db")
    with FencedSqliteSaver(path) as saver:
        saver.claim("t", "w", 30)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE threads SET expires_at = 'soon'")
    conn.close()
    with FencedSqliteSaver(path) as saver:
        found = saver.thread_status("t")
    assert found is not None and found.state == "unknown"
    assert found.error is not None and found.error["code"] == "undecodable_row"


def _event(kind: str, token: int | None, **data: Any) -> Event:
    return Event("t", 5, kind, data, "", None, token, 0.0)


def _by_run(**data: Any) -> Event:
    return _event("run_started", 3, run_id="r", strategy="fence_runs", **data)


_BY_RUN: dict[str, Any] = {"token": 3, "expires_at": 10.0, "last_run": _by_run()}


@pytest.mark.parametrize(
    ("kwargs", "state"),
    [
        ({}, "idle"),
        ({"token": 3, "expires_at": 200.0}, "running"),
        ({"token": 3, "expires_at": 50.0}, "idle"),  # a plain claim that ran out
        ({"token": 3, "expires_at": 50.0, "last_run": _event("run_started", 3)}, "failed"),
        ({"token": 4, "expires_at": 50.0, "last_run": _event("run_started", 3)}, "idle"),
        ({"last_run": _event("run_failed", 3, error="X", message="m")}, "failed"),
        ({"last_run": _event("run_interrupted", 3)}, "interrupted"),  # a static interrupt
        ({"last_run": _event("run_completed", 3)}, "idle"),
        ({"waiting": [Waiting("n", "task", 1)]}, "interrupted"),
        ({"waiting": [Waiting("n", "task", 1)], "token": 3, "expires_at": 200.0}, "running"),
        ({"last_run": _event("run_timed_out", 3)}, "failed"),  # a deadline ended it
        ({"last_run": _event("run_cancelled", 3)}, "idle"),
        ({"last_run": _event("claim_released_by_operator", None)}, "idle"),
        ({"failures": [Failure("agent", "ValueError", "ValueError('x')")]}, "failed"),
        # A run fenced by its id (`fence_runs`): its claim expires when granted.
        ({**_BY_RUN, "active_at": 90.0}, "running"),  # wrote 10 s ago
        ({**_BY_RUN, "active_at": 60.0}, "idle"),  # not for 40 s: it ended, not failed
        ({**_BY_RUN}, "idle"),  # no activity known
        ({**_BY_RUN, "active_at": 99.0, "waiting": [Waiting("n", "task", 1)]}, "interrupted"),
        ({**_BY_RUN, "active_at": 99.0, "failures": [Failure("a", "E", "m")]}, "failed"),
        ({**_BY_RUN, "active_at": 99.0, "token": 4}, "idle"),  # a later claim, not the run's
        ({**_BY_RUN, "active_at": 95.0, "last_run": _by_run(idle_after=2)}, "idle"),
    ],
)
def test_the_rule(kwargs: dict[str, Any], state: str) -> None:
    """`judge`, the one rule, on each combination of facts it weighs."""
    facts: dict[str, Any] = {
        "holder": "w" if "token" in kwargs else None,
        "token": None,
        "expires_at": None,
        "claim_run_id": None,
        "checkpoint_id": "c",
        "waiting": (),
        "failures": (),
        "last_run": None,
        **kwargs,
    }
    assert judge("t", now=100.0, **facts).state == state


def test_the_one_line_forms_and_the_plain_data_round_trip(agent_db: str) -> None:
    """`node`/`reason` (a STATUS cell, a filter) and `to_dict` (`threads()`) say the same.

    One fixed "now" for both readings: `expires_in` is relative to it, and two
    readings of a real clock a millisecond apart differed (seen once in CI).
    """
    with FencedSqliteSaver(agent_db, clock=ManualClock(time.time())) as saver:
        got = {t: saver.thread_status(t) for t in ("chat-1", "chat-4", "chat-5")}
        summaries = {t["thread_id"]: t["status"] for t in saver.threads()}
    one, four, five = got["chat-1"], got["chat-4"], got["chat-5"]
    assert one is not None and four is not None and five is not None
    assert (one.node, one.reason) == ("review", None)
    assert four.node is None and four.failure is not None
    assert four.failure.message == "ValueError('model timed out')"  # as stored
    assert four.reason == "ValueError: model timed out"  # its text, in one line
    assert four.failure.run_id == four.run_id is not None
    assert five.node is None and five.reason is None  # running: nothing waits, nothing failed
    for status in (one, four, five):
        data = status.to_dict()
        assert summaries[status.thread_id] == data
        assert (data["node"], data["reason"]) == (status.node, status.reason)
        assert ThreadStatus.from_dict(data) == status
    assert set(THREAD_STATES) >= {s["state"] for s in summaries.values()}


def test_a_crash_after_a_long_run_is_still_failed(tmp_path: Any) -> None:
    """The run's start is found however many events the run logged after it."""
    clock = ManualClock(1_000_000.0)
    with FencedSqliteSaver(str(tmp_path / "long.db"), clock=clock) as saver:
        claim = saver.begin_run("t", "worker-9", 30, run_id="run-9")
        graph = build_agent(saver)
        graph.invoke({"messages": [HumanMessage(QUESTION)]}, claim.config(config("t")))
        latest = saver.get_tuple(claim.config(config("t")))
        assert latest is not None
        where = claim.config(latest.config)
        for i in range(1100):  # each a `writes` event, all under the run's token
            saver.put_writes(where, [("notes", i)], f"task-{i}")
        assert saver.thread_summary("t")["events"] > 1100  # type: ignore[index]
        clock.advance(31)
        crashed = saver.thread_status("t")
    assert crashed is not None and crashed.state == "failed" and crashed.failure is not None
    assert crashed.failure.error == "claim_expired" and crashed.run_id == "run-9"


def test_a_timed_out_run_is_failed_and_says_so(tmp_path: Any) -> None:
    with FencedSqliteSaver(str(tmp_path / "late.db")) as saver:
        claim = saver.begin_run("t", "w", 30, run_id="run-1")
        saver.end_run(
            "t", claim.token, "run_timed_out", {"run_id": "run-1", "message": "ran past 5s"}
        )
        late = saver.thread_status("t")
        failed = [t["thread_id"] for t in saver.threads(status="failed")]
    assert late is not None and late.state == "failed"
    assert late.reason == "run_timed_out: ran past 5s" and late.run_id == "run-1"
    assert failed == ["t"]


# --- on the ops file: thread_status and threads(status=..., inactive_for=...) ---------------------


# What an operator reads of a status; an idle thread that never ran under a
# runner (or was released) says nothing more than its state.
SAID = ("state", "holder", "expires_at", "node", "reason", "run_id")
IDLE = ("idle", None, None, None, None, None)


def said(status: ThreadStatus | None) -> tuple[Any, ...]:
    """The fields of `SAID`, in order."""
    assert status is not None
    return tuple(getattr(status, name) for name in SAID)


@pytest.fixture(scope="module")
def ops_file(tmp_path_factory: Any) -> str:
    """The six-thread file (read-only use)."""
    path = str(tmp_path_factory.mktemp("ops") / "ops.db")
    make_ops_file(path)
    return path


def test_each_thread_gets_the_status_an_operator_expects(ops_file: str) -> None:
    with FencedSqliteSaver(ops_file) as saver:
        status = {t: saver.thread_status(t) for t in ("done", "waiting", "broken", "busy", "old")}
        plain = saver.thread_status("plain")
        unknown = saver.thread_status("nobody")
    assert status["done"].state == "idle" and status["done"].holder is None
    assert status["old"].state == "idle"
    assert said(plain) == IDLE and plain is not None
    assert (plain.waiting, plain.failure, plain.error) == ((), None, None)
    assert unknown is None  # no such thread
    waiting = status["waiting"]
    assert (waiting.state, waiting.node) == ("interrupted", "ask")
    assert waiting.run_id is not None  # the runner's run that stopped there
    broken = status["broken"]
    assert broken.state == "failed" and broken.reason == "ValueError: the model call failed"
    busy = status["busy"]
    assert (busy.state, busy.holder) == ("running", "worker-9")
    assert busy.expires_at is not None


def test_threads_carries_the_status_and_filters_by_it(ops_file: str) -> None:
    with FencedSqliteSaver(ops_file) as saver:
        every = {t["thread_id"]: t["status"] for t in saver.threads()}
        failed = [t["thread_id"] for t in saver.threads(status="failed")]
        either = {t["thread_id"] for t in saver.threads(status=["running", "interrupted"])}
        idle_long = [t["thread_id"] for t in saver.threads(inactive_for=timedelta(days=30))]
        idle_long_s = [t["thread_id"] for t in saver.threads(inactive_for=30 * DAY)]
        both = saver.threads(status="failed", inactive_for=30 * DAY)
        single = saver.thread_status("waiting")
    assert set(every) == {"done", "waiting", "broken", "busy", "old", "plain"}
    assert single is not None and every["waiting"] == single.to_dict()
    assert {k: every["waiting"][k] for k in SAID} == {
        "state": "interrupted",
        "holder": None,
        "expires_at": None,
        "node": "ask",
        "reason": None,
        "run_id": single.run_id,
    }
    assert failed == ["broken"]
    assert either == {"busy", "waiting"}
    assert idle_long == idle_long_s == ["old"]
    assert both == []


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"status": "sleeping"}, "status"),
        ({"status": ["idle", 3]}, "status"),
        ({"status": 3}, "status"),
        ({"inactive_for": -1}, "inactive_for"),
        ({"inactive_for": "7d"}, "inactive_for"),
    ],
)
def test_bad_filters_name_the_argument(ops_file: str, kwargs: dict[str, Any], name: str) -> None:
    with FencedSqliteSaver(ops_file) as saver:
        with pytest.raises((InvalidArgument, TypeError, ValueError)) as info:
            saver.threads(**kwargs)
    assert name in str(info.value)


def test_the_states_are_documented() -> None:
    assert THREAD_STATES[:4] == ("idle", "running", "interrupted", "failed")
    assert all(s in (ThreadStatus.__doc__ or "") for s in THREAD_STATES)


def test_an_operator_release_makes_a_thread_idle_and_a_takeover_running(
    tmp_path: Any,
) -> None:
    path = str(tmp_path / "t.db")
    make_ops_file(path)
    with FencedSqliteSaver(path) as saver:
        saver.take_over("done", "alice@host", 60, operator="alice@host")
        assert saver.thread_status("done").state == "running"
        assert saver.thread_status("done").holder == "alice@host"
        saver.force_release("done", operator="alice@host")
        assert said(saver.thread_status("done")) == IDLE
        # Released from a waiting thread: it still waits at its interrupt.
        saver.force_release("busy", operator="alice@host")
        assert saver.thread_status("busy").state == "interrupted"


def test_a_static_interrupt_is_interrupted(tmp_path: Any) -> None:
    with FencedSqliteSaver(str(tmp_path / "s.db")) as saver:
        static = build_ops_graph(saver, interrupt_before=["sub"])
        FencedRunner(static, saver).invoke({"count": 0}, config("t"))
        status = saver.thread_status("t")
    assert status.state == "interrupted" and status.node is None


def test_a_resumed_thread_is_idle_again(tmp_path: Any) -> None:
    with FencedSqliteSaver(str(tmp_path / "r.db")) as saver:
        runner = FencedRunner(build_ops_graph(saver), saver)
        runner.invoke({"count": 0}, config("t"))
        assert saver.thread_status("t").state == "interrupted"
        runner.invoke(Command(resume="ok"), config("t"))
        assert saver.thread_status("t").state == "idle"


CRASHER = """
import json, sys, os
sys.path.insert(0, sys.argv[2])
from support.configs import config
from support.graphs import OpsState
from langgraph.graph import START, StateGraph
from langgraph_fenced_sqlite import FencedRunner, FencedSqliteSaver

def slow(state):
    print(json.dumps({"in_node": os.getpid()}), flush=True)
    sys.stdin.readline()  # blocks until the parent kills this process
    return {"items": ["never"]}

g = StateGraph(OpsState)
g.add_node("slow", slow)
g.add_edge(START, "slow")
with FencedSqliteSaver(sys.argv[1]) as saver:
    FencedRunner(g.compile(checkpointer=saver), saver, holder="crasher", ttl=60).invoke(
        {"count": 0}, config("t")
    )
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_worker_killed_mid_run_is_failed_once_its_claim_expires(tmp_path: Any) -> None:
    path = str(tmp_path / "crash.db")
    FencedSqliteSaver(path).close()
    worker = python(CRASHER, path, TESTS_DIR)
    try:
        assert worker.stdout is not None
        line = worker.stdout.readline()
        assert json.loads(line)["in_node"] == worker.pid, worker.stderr.read() if not line else ""
        os.kill(worker.pid, signal.SIGKILL)
        assert worker.wait(timeout=60) == -signal.SIGKILL
    finally:
        reap(worker)
    with FencedSqliteSaver(path) as saver:
        live = saver.thread_status("t")
        claim = saver.current_claim("t")
    assert (live.state, live.holder) == ("running", "crasher")  # its claim is still live
    assert claim is not None
    # A store whose clock is past the claim's expiry judges the crash.
    with FencedSqliteSaver(path, clock=ManualClock(claim.expires_at + 1)) as later:
        status = later.thread_status("t")
        failed = [t["thread_id"] for t in later.threads(status="failed")]
    assert status.state == "failed" and status.holder == "crasher"
    assert status.reason is not None and "stopped without ending" in status.reason
    assert "'crasher'" in status.reason
    assert failed == ["t"]


def test_an_ended_run_stops_counting_once_the_thread_moves_on(tmp_path: Any) -> None:
    """A thread run by plain `graph.invoke` after a runner's run is judged by its checkpoints."""
    with FencedSqliteSaver(str(tmp_path / "m.db")) as saver:
        graph = build_ops_graph(saver)
        FencedRunner(graph, saver).invoke({"count": 0}, config("t"))
        assert saver.thread_status("t").state == "interrupted"
        graph.invoke(Command(resume="ok"), config("t"))
        assert saver.thread_status("t").state == "idle"
        try:
            FencedRunner(graph, saver).invoke({"boom": True}, config("t"))
        except ValueError:
            pass
        assert saver.thread_status("t").state == "failed"
        graph.invoke({"count": 1, "boom": False}, config("t"))  # again, without a runner
        assert saver.thread_status("t").state == "interrupted"
        graph.invoke(Command(resume="ok"), config("t"))
        assert saver.thread_status("t").state == "idle"
