"""`thread_status` and `threads(status=..., inactive_for=...)` on threads made by real graphs.

The file comes from `_ops.make_ops_file` (the real runner and LangGraph, a
subgraph and an interrupt); a crashed worker is a real process killed with
SIGKILL while its node runs.
"""

from __future__ import annotations

import json
import os
import signal
from datetime import timedelta
from typing import Any

import pytest
from _ops import DAY, TESTS_DIR, build_graph, config, make_ops_file, python
from langgraph.types import Command

from langgraph_fenced_sqlite import (
    THREAD_STATES,
    FencedRunner,
    FencedSqliteSaver,
    InvalidArgument,
    ManualClock,
    ThreadStatus,
)

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
        static = build_graph(saver, interrupt_before=["sub"])
        FencedRunner(static, saver).invoke({"count": 0}, config("t"))
        status = saver.thread_status("t")
    assert status.state == "interrupted" and status.node is None


def test_a_resumed_thread_is_idle_again(tmp_path: Any) -> None:
    with FencedSqliteSaver(str(tmp_path / "r.db")) as saver:
        runner = FencedRunner(build_graph(saver), saver)
        runner.invoke({"count": 0}, config("t"))
        assert saver.thread_status("t").state == "interrupted"
        runner.invoke(Command(resume="ok"), config("t"))
        assert saver.thread_status("t").state == "idle"


CRASHER = """
import json, sys, os
sys.path.insert(0, sys.argv[2])
from _ops import State, config
from langgraph.graph import START, StateGraph
from langgraph_fenced_sqlite import FencedRunner, FencedSqliteSaver

def slow(state):
    print(json.dumps({"in_node": os.getpid()}), flush=True)
    sys.stdin.readline()  # blocks until the parent kills this process
    return {"items": ["never"]}

g = StateGraph(State)
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
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        for pipe in (worker.stdin, worker.stdout, worker.stderr):
            assert pipe is not None
            pipe.close()
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
        graph = build_graph(saver)
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
