"""Group commit of a step: LangGraph's writes wait for the put that follows them.

LangGraph sends each task's `put_writes` from a background thread and then
the step's `put` (a child of the checkpoint the writes belong to), a few
hundred microseconds later. A write that awaits that put lets it join its
commit: one durable COMMIT per step instead of one per call. These tests pin
the behaviour users rely on: the joint commit (and that each caller still
returns only after it), that a failed put in it changes nothing and does not
take the writes with it, that a write whose put never follows stops waiting
(and backs off on that thread), and the commits a real graph makes.

The wait's bounds are set generous here (`FOLLOW_MIN_S`), so that what is
asserted does not depend on the machine's speed: the wait ends the moment
the put is queued, and never lasts the bound in the cases that join.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.channels.delta import DeltaChannel
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send
from support.configs import saver_config
from support.graphs import TrailState, asks_graph, chain_graph
from support.puts import new_checkpoint
from support.waiting import follow_bound, interrupt_when, put_writes_in_thread, store_held, until

from langgraph_fenced_sqlite import FencedSqliteSaver, StaleClaim
from langgraph_fenced_sqlite.core import steps


def _a_step(saver: FencedSqliteSaver, parent: dict[str, Any]) -> tuple[Any, threading.Thread]:
    """A step as LangGraph sends it: a task's write (another thread) that waits, then its put.

    Returns the write's outcome (None or its exception) and its thread, ended.
    """
    group = saver._engine._group
    waited = group.stats()["waited"]
    out: dict[str, Any] = {}
    writer = put_writes_in_thread(saver, parent, out)
    until(lambda: group.stats()["waited"] == waited + 1)
    saver.put(parent, new_checkpoint({"step": 1}), {"source": "loop", "step": 1}, {})
    writer.join(30)
    return out["writes"], writer


def _only_the_write_landed(saver: FencedSqliteSaver, parent: dict[str, Any]) -> None:
    """The write `put_writes_in_thread` made is stored under `parent`, still the latest."""
    stored = saver.get_tuple(parent)
    assert stored is not None and [(w[1], w[2]) for w in stored.pending_writes] == [("x", 1)]
    latest = saver.get_tuple(saver_config("t"))
    assert latest is not None
    assert latest.config["configurable"]["checkpoint_id"] == parent["configurable"]["checkpoint_id"]


def test_a_steps_writes_and_its_put_share_one_commit(tmp_path: Any, generous: None) -> None:
    with FencedSqliteSaver(str(tmp_path / "s.db")) as saver:
        parent = saver.put(
            saver_config("t"), new_checkpoint({"step": 0}), {"source": "loop", "step": 0}, {}
        )
        before = saver._engine._group.stats()
        out: dict[str, Any] = {}
        writer = put_writes_in_thread(saver, parent, out)
        until(lambda: saver._engine._group.stats()["waited"] == before["waited"] + 1)
        child = saver.put(parent, new_checkpoint({"step": 1}), {"source": "loop", "step": 1}, {})
        writer.join(30)
        after = saver._engine._group.stats()
        assert out["writes"] is None
        assert after["commits"] == before["commits"] + 1  # one COMMIT for both calls
        assert after["joined"] == before["joined"] + 1 and after["ran_out"] == before["ran_out"]
    # Both are durable and visible to a reader that opens the file afresh.
    with FencedSqliteSaver(str(tmp_path / "s.db")) as reader:
        stored = reader.get_tuple(parent)
        assert stored is not None and [(w[1], w[2]) for w in stored.pending_writes] == [("x", 1)]
        latest = reader.get_tuple(saver_config("t"))
        assert latest is not None
        assert (
            latest.config["configurable"]["checkpoint_id"] == child["configurable"]["checkpoint_id"]
        )


class _CountingLock:
    """A store's lock that counts, per thread, the times it was taken."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.taken: dict[int, int] = {}

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            me = threading.get_ident()
            self.taken[me] = self.taken.get(me, 0) + 1
        return got

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_a_write_joined_by_its_put_is_answered_without_taking_the_stores_lock(
    tmp_path: Any, generous: None
) -> None:
    """The put's caller leads the batch that holds the write; the write wakes once, answered.

    Before, the put's arrival woke the write only for it to block again on
    the store's lock until the commit ended: two sleeps and wake-ups per
    task per step (each 20-40 us of CPU on a VM), on LangGraph's threads.
    """
    with FencedSqliteSaver(str(tmp_path / "s.db")) as saver:
        parent = saver.put(
            saver_config("t"), new_checkpoint({"step": 0}), {"source": "loop", "step": 0}, {}
        )
        counting = saver._engine._lock = _CountingLock()
        group = saver._engine._group
        before = group.stats()
        outcome, writer = _a_step(saver, parent)
        assert outcome is None
        assert group.stats()["commits"] == before["commits"] + 1
        assert counting.taken.get(writer.ident, 0) == 0  # never took the lock
        assert counting.taken[threading.get_ident()] == 1  # the put's caller led
        stored = saver.get_tuple(parent)
        assert stored is not None and [(w[1], w[2]) for w in stored.pending_writes] == [("x", 1)]


def test_a_write_whose_put_was_interrupted_while_queued_leads_itself(tmp_path: Any) -> None:
    """Ctrl-C in the put's caller before it led: the write riding on it still lands.

    The put was queued behind another call, so the write awaiting it took it
    as its leader; interrupted, the put leaves the queue and the write,
    told so, leads its own batch once the store is free.
    """
    with FencedSqliteSaver(str(tmp_path / "s.db")) as saver:
        parent = saver.put(
            saver_config("t"), new_checkpoint({"step": 0}), {"source": "loop", "step": 0}, {}
        )
        group = saver._engine._group
        group._commit_s = 30.0  # commits look costly: the write waits for its put
        out: dict[str, Any] = {}
        with store_held(saver._engine):
            writer = put_writes_in_thread(saver, parent, out)
            until(lambda: group.queued() == 1)
            helper = interrupt_when(lambda: group.queued() == 2)
            with pytest.raises(KeyboardInterrupt):
                saver.put(parent, new_checkpoint({"step": 1}), {"source": "loop", "step": 1}, {})
            helper.join(30)
        writer.join(30)
        assert out["writes"] is None and group.queued() == 0
        _only_the_write_landed(saver, parent)  # the interrupted put never did


def test_a_refused_put_in_the_joint_commit_changes_nothing_and_keeps_the_writes(
    tmp_path: Any, generous: None
) -> None:
    with FencedSqliteSaver(str(tmp_path / "s.db")) as saver:
        old = saver.claim("t", "old", 30)
        parent = saver.put(
            old.config(), new_checkpoint({"step": 0}), {"source": "loop", "step": 0}, {}
        )
        current = saver.take_over("t", "new", 30)
        fenced = current.config()["configurable"]
        parent_now = {"configurable": {**parent["configurable"], **fenced}}
        before = saver._engine._group.stats()
        out: dict[str, Any] = {}
        writer = put_writes_in_thread(saver, parent_now, out)
        until(lambda: saver._engine._group.stats()["waited"] == before["waited"] + 1)
        stale = {"configurable": {**parent["configurable"], **old.config()["configurable"]}}
        with pytest.raises(StaleClaim):
            saver.put(stale, new_checkpoint({"step": 1}), {"source": "loop", "step": 1}, {})
        writer.join(30)
        assert out["writes"] is None
        assert saver._engine._group.stats()["commits"] == before["commits"] + 1
        _only_the_write_landed(saver, parent)  # the refused put left nothing


def test_a_write_whose_put_never_follows_stops_waiting_and_backs_off(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    follow_bound(monkeypatch, 0.05)
    with FencedSqliteSaver(str(tmp_path / "s.db")) as saver:
        parent = saver.put(
            saver_config("t"), new_checkpoint({"step": 0}), {"source": "loop", "step": 0}, {}
        )
        other = saver.put(
            saver_config("u"), new_checkpoint({"step": 0}), {"source": "loop", "step": 0}, {}
        )
        group = saver._engine._group
        before = group.stats()
        for i in range(4):  # the same caller writes, then would put: nothing can follow
            saver.put_writes(parent, [("x", i)], f"task-{i}")
        after = group.stats()
        # Waited and ran out (forgiven), waited and ran out again, then skipped twice.
        assert after["waited"] - before["waited"] == 2
        assert after["ran_out"] - before["ran_out"] == 2
        assert after["skipped"] - before["skipped"] == 2
        assert after["commits"] - before["commits"] == 4  # every write still committed
        saver.put_writes(other, [("x", 0)], "task-0")  # another thread is not held back
        assert group.stats()["waited"] == after["waited"] + 1
        stored = saver.get_tuple(parent)
        assert stored is not None and len(stored.pending_writes) == 4


@pytest.mark.parametrize("api", ["invoke", "ainvoke"])
def test_a_caller_that_puts_what_it_wrote_stops_waiting_for_itself(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    """LangGraph's `update_state` writes for the checkpoint it builds on and then puts the
    new one, both from the caller's thread: that write can never be joined, and every
    update waited out a whole bound (about 2.3 ms in use; 2x the stock savers' time).
    Seen twice, the caller's writes lead at once. Its invokes, whose writes come from
    LangGraph's worker threads (or tasks), still commit once per step."""
    follow_bound(monkeypatch, 0.5)
    with FencedSqliteSaver(str(tmp_path / "s.db")) as saver:
        app = chain_graph(saver)
        group = saver._engine._group
        config = {"configurable": {"thread_id": "t"}}

        def invoke() -> None:
            if api == "invoke":
                app.invoke({"count": 0, "trail": []}, config, durability="sync")
            else:
                asyncio.run(app.ainvoke({"count": 0, "trail": []}, config, durability="sync"))

        invoke()
        before = group.stats()
        for i in range(6):
            app.update_state(config, {"trail": [f"edit{i}"]})
        after = group.stats()
        assert after["ran_out"] - before["ran_out"] == 2  # then judged: it puts what it wrote
        assert after["skipped"] - before["skipped"] == 4
        assert after["commits"] - before["commits"] == 12  # each write and put still commits
        assert app.get_state(config).values["trail"][-6:] == [f"edit{i}" for i in range(6)]
        for _ in range(2):
            before = group.stats()
            invoke()
            after = group.stats()
            assert after["commits"] - before["commits"] == 7
            assert after["joined"] - before["joined"] == 6 and after["ran_out"] == before["ran_out"]
            app.update_state(config, {"trail": ["again"]})
            assert group.stats()["ran_out"] == after["ran_out"]  # still judged


def test_no_write_waits_when_commits_are_cheap(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(steps, "CHEAP_COMMIT_S", 1e9)  # every commit counts as cheap
    with FencedSqliteSaver(str(tmp_path / "s.db")) as saver:
        parent = saver.put(
            saver_config("t"), new_checkpoint({"step": 0}), {"source": "loop", "step": 0}, {}
        )
        saver.put_writes(parent, [("x", 1)], "task-1")
        stats = saver._engine._group.stats()
        assert stats["waited"] == 0 and stats["skipped"] == 1


def _fanout(saver: FencedSqliteSaver, width: int) -> Any:
    graph = StateGraph(TrailState)
    graph.add_node("split", lambda s: {"trail": ["split"]})
    graph.add_node("branch", lambda s: {"trail": ["branch"]})
    graph.add_node("join", lambda s: {"trail": ["join"]})
    graph.add_edge(START, "split")
    graph.add_conditional_edges(
        "split", lambda s: [Send("branch", s) for _ in range(width)], ["branch"]
    )
    graph.add_edge("branch", "join")
    graph.add_edge("join", END)
    return graph.compile(checkpointer=saver)


@pytest.mark.parametrize("api", ["invoke", "ainvoke"])
def test_a_chain_commits_once_per_step(tmp_path: Any, generous: None, api: str) -> None:
    """Five nodes, durability "sync": the input checkpoint, then one commit per step.

    Six steps (`__start__` and the five nodes) each send their writes and
    then their put; without group commit they took 13 commits (measured on
    the first version), as LangGraph's own savers do.
    """
    with FencedSqliteSaver(str(tmp_path / "s.db")) as saver:
        app = chain_graph(saver)
        group = saver._engine._group
        for i in range(3):
            before = group.stats()
            config = {"configurable": {"thread_id": f"t{i}"}}
            if api == "invoke":
                result = app.invoke({"count": 0, "trail": []}, config, durability="sync")
            else:
                result = asyncio.run(
                    app.ainvoke({"count": 0, "trail": []}, config, durability="sync")
                )
            after = group.stats()
            assert result["count"] == 5
            assert after["commits"] - before["commits"] == 7
            assert after["ran_out"] == before["ran_out"]
            assert app.get_state(config).values["trail"] == [f"n{k}" for k in range(5)]


@pytest.mark.parametrize("api", ["invoke", "ainvoke"])
def test_an_interrupt_or_an_error_waits_for_no_put(tmp_path: Any, generous: None, api: str) -> None:
    """No checkpoint follows a step whose task interrupted or failed: its write leads at
    once. It waited a whole bound (up to 3 ms) for a put that never came, on every
    interrupted run, and backed off the thread's next steps."""
    from langgraph.types import Command

    with FencedSqliteSaver(str(tmp_path / "s.db")) as saver:
        app = asks_graph(saver)
        group = saver._engine._group

        def run(arg: Any, config: Any) -> Any:
            if api == "invoke":
                return app.invoke(arg, config, durability="sync")
            return asyncio.run(app.ainvoke(arg, config, durability="sync"))

        before = group.stats()
        config = {"configurable": {"thread_id": "t"}}
        run({"count": 0, "trail": []}, config)
        assert app.get_state(config).interrupts[0].value == "go on?"
        with pytest.raises(RuntimeError, match="boom"):
            run(Command(resume="boom"), config)
        assert app.get_state(config).tasks[0].error is not None
        after = group.stats()
        assert after["ran_out"] == before["ran_out"]
        # __start__'s and first's writes joined their puts; the resumed task's
        # `__resume__` write joined its error's write, which took the put's place.
        assert after["waited"] - before["waited"] == 3
        assert after["joined"] - before["joined"] == 3


@pytest.mark.parametrize("api", ["invoke", "ainvoke"])
def test_a_fan_out_commits_once_per_step(tmp_path: Any, generous: None, api: str) -> None:
    """Three branches in one superstep: their three writes and the step's put, one commit."""
    with FencedSqliteSaver(str(tmp_path / "s.db")) as saver:
        app = _fanout(saver, 3)
        group = saver._engine._group
        before = group.stats()
        config = {"configurable": {"thread_id": "t"}}
        if api == "invoke":
            result = app.invoke({"count": 0, "trail": []}, config, durability="sync")
        else:
            result = asyncio.run(app.ainvoke({"count": 0, "trail": []}, config, durability="sync"))
        after = group.stats()
        assert result["trail"].count("branch") == 3
        # input, __start__, split, the three branches, join: five commits.
        assert after["commits"] - before["commits"] == 5
        assert after["ran_out"] == before["ran_out"]


def test_an_async_fan_out_wider_than_max_waiting_commits_once_per_step(
    tmp_path: Any, generous: None
) -> None:
    """Eight branches through `ainvoke`: every write waits, the step is one commit.

    At most `MAX_WAITING` (4) writes of sync callers wait at once, since they
    wait on LangGraph's thread pool, which the step's put needs too. Async
    callers' writes wait on the store's own hop workers, made as needed, so
    up to `MAX_WAITING_ASYNC` may: before, the fifth write led at once and
    the step took two commits or more.
    """
    width = steps.MAX_WAITING + 4
    assert width <= steps.MAX_WAITING_ASYNC
    with FencedSqliteSaver(str(tmp_path / "s.db")) as saver:
        app = _fanout(saver, width)
        group = saver._engine._group
        before = group.stats()
        config = {"configurable": {"thread_id": "t"}}
        result = asyncio.run(app.ainvoke({"count": 0, "trail": []}, config, durability="sync"))
        after = group.stats()
        assert result["trail"].count("branch") == width
        # input, __start__, split, the eight branches, join: five commits.
        assert after["commits"] - before["commits"] == 5
        assert after["skipped"] == before["skipped"]
        assert after["ran_out"] == before["ran_out"]


def test_writes_of_one_step_that_wait_together_after_a_back_off_all_commit(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three tasks' writes wait on one thread that had backed off: each is answered.

    They share the thread's back-off entry; once, all three removed it and
    the second removal raised `KeyError` out of `put_writes` (seen in the
    README's human-review example under load).
    """
    follow_bound(monkeypatch, 0.05)
    with FencedSqliteSaver(str(tmp_path / "s.db")) as saver:
        parent = saver.put(
            saver_config("t"), new_checkpoint({"step": 0}), {"source": "loop", "step": 0}, {}
        )
        saver.put_writes(parent, [("x", 0)], "solo-0")  # waits, runs out: forgiven
        saver.put_writes(parent, [("x", 1)], "solo-1")  # waits, runs out: back-off
        saver.put_writes(parent, [("x", 2)], "solo-2")  # skipped
        saver.put_writes(parent, [("x", 3)], "solo-3")  # skipped; the next ones wait
        monkeypatch.setattr(steps, "FOLLOW_MIN_S", 5.0)
        monkeypatch.setattr(steps, "FOLLOW_MAX_S", 5.0)
        group = saver._engine._group
        before = group.stats()
        outcomes: dict[str, Any] = {}

        def write(i: int) -> None:
            try:
                outcomes[i] = saver.put_writes(parent, [("x", i)], f"task-{i}")
            except Exception as exc:  # noqa: BLE001 - recorded for the assertions
                outcomes[i] = exc

        writers = [threading.Thread(target=write, args=(i,)) for i in range(3)]
        for writer in writers:
            writer.start()
        until(lambda: group.stats()["waited"] == before["waited"] + 3)
        saver.put(parent, new_checkpoint({"step": 1}), {"source": "loop", "step": 1}, {})
        for writer in writers:
            writer.join(30)
        assert outcomes == {0: None, 1: None, 2: None}
        after = group.stats()
        assert after["joined"] - before["joined"] == 3
        assert after["commits"] - before["commits"] == 1
        stored = saver.get_tuple(parent)
        assert stored is not None and len(stored.pending_writes) == 7


def test_an_interrupted_wait_leaves_the_write_unwritten(tmp_path: Any, generous: None) -> None:
    """Ctrl-C while a write waits for its put: the caller hears it, the write never lands."""
    with FencedSqliteSaver(str(tmp_path / "s.db")) as saver:
        parent = saver.put(
            saver_config("t"), new_checkpoint({"step": 0}), {"source": "loop", "step": 0}, {}
        )
        group = saver._engine._group
        waited = group.stats()["waited"]

        def interrupt_when_waiting() -> None:
            until(lambda: group.stats()["waited"] == waited + 1)
            os.kill(os.getpid(), signal.SIGINT)  # a real signal: it ends a blocked wait

        helper = threading.Thread(target=interrupt_when_waiting)
        helper.start()
        with pytest.raises(KeyboardInterrupt):
            saver.put_writes(parent, [("x", 1)], "task-1")
        helper.join(30)
        saver.put(parent, new_checkpoint({"step": 1}), {"source": "loop", "step": 1}, {})
        stored = saver.get_tuple(parent)
        assert stored is not None and stored.pending_writes == []
        assert group.queued() == 0


def test_a_write_interrupted_while_queued_behind_another_call_never_lands(
    tmp_path: Any,
) -> None:
    """Ctrl-C while a put waits for the store's lock: it must not run later.

    Before, it stayed queued, and the next caller's batch committed it
    although its own caller had been told it was interrupted.
    """
    with FencedSqliteSaver(str(tmp_path / "s.db")) as saver:
        parent = saver.put(
            saver_config("t"), new_checkpoint({"step": 0}), {"source": "loop", "step": 0}, {}
        )
        group = saver._engine._group
        with store_held(saver._engine):
            helper = interrupt_when(lambda: group.queued() == 1)
            with pytest.raises(KeyboardInterrupt):
                saver.put(parent, new_checkpoint({"step": 1}), {"source": "loop", "step": 1}, {})
            helper.join(30)
        assert group.queued() == 0
        saver.put_writes(parent, [("x", 1)], "task-after")  # a later write runs alone
        latest = saver.get_tuple(saver_config("t"))
        assert latest is not None
        assert (
            latest.config["configurable"]["checkpoint_id"]
            == parent["configurable"]["checkpoint_id"]
        )


def test_a_write_that_arrives_during_a_commit_waits_from_its_end(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LangGraph sends a thread's puts one after another: the put a write awaits
    may be queued behind the commit in progress, so the wait starts at its end.

    Before, the first step of each invoke missed its put on a slow disk (its
    write arrived while the input checkpoint was committing): 8.5 syncs per
    5-node chain at fsync +2 ms instead of 7.3.
    """
    follow_bound(monkeypatch, 0.05)
    with FencedSqliteSaver(str(tmp_path / "s.db")) as saver:
        parent = saver.put(
            saver_config("t"), new_checkpoint({"step": 0}), {"source": "loop", "step": 0}, {}
        )
        group = saver._engine._group
        group._commit_s = 30.0  # a disk whose commits take long (as measured)
        release, committing = threading.Event(), threading.Event()

        def slow(conn: Any) -> None:
            committing.set()
            release.wait(30)

        other = threading.Thread(target=saver._engine.write, args=("slow", slow))
        other.start()
        assert committing.wait(30)
        before = group.stats()
        out: dict[str, Any] = {}
        writer = put_writes_in_thread(saver, parent, out)
        until(lambda: group.stats()["waited"] == before["waited"] + 1)
        threading.Event().wait(0.2)  # longer than the bound alone would allow
        release.set()
        other.join(30)
        saver.put(parent, new_checkpoint({"step": 1}), {"source": "loop", "step": 1}, {})
        writer.join(30)
        after = group.stats()
        assert out["writes"] is None
        assert after["joined"] - before["joined"] == 1 and after["ran_out"] == before["ran_out"]
        assert after["commits"] - before["commits"] == 2  # the slow batch, then writes + put


def test_a_write_waits_out_a_commit_longer_than_commits_usually_take(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bound does not run down while another batch commits, however long it takes.

    Before, the wait counted from that commit's expected end (the measured
    COMMIT time), but a batch also runs its writes' SQL first, and on a busy
    machine it takes longer: the first step of a chain often ran out just
    before its put arrived (7.7 commits per 5-node chain at load 2, not 7).
    """
    follow_bound(monkeypatch, 0.05)
    with FencedSqliteSaver(str(tmp_path / "s.db")) as saver:
        parent = saver.put(
            saver_config("t"), new_checkpoint({"step": 0}), {"source": "loop", "step": 0}, {}
        )
        group = saver._engine._group
        release, committing = threading.Event(), threading.Event()

        def slow(conn: Any) -> None:
            committing.set()
            release.wait(30)

        other = threading.Thread(target=saver._engine.write, args=("slow", slow))
        other.start()
        assert committing.wait(30)
        before = group.stats()
        out: dict[str, Any] = {}
        writer = put_writes_in_thread(saver, parent, out)
        until(lambda: group.stats()["waited"] == before["waited"] + 1)
        threading.Event().wait(0.3)  # the commit lasts six bounds (and 0.3 s >> COMMIT time)
        release.set()
        other.join(30)
        saver.put(parent, new_checkpoint({"step": 1}), {"source": "loop", "step": 1}, {})
        writer.join(30)
        after = group.stats()
        assert out["writes"] is None
        assert after["joined"] - before["joined"] == 1 and after["ran_out"] == before["ran_out"]
        assert after["commits"] - before["commits"] == 2  # the slow batch, then writes + put


def test_one_late_put_costs_its_own_step_only(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread's first wait that runs out does not make its next write lead at once.

    Before, one late put (a busy machine) made the next step skip its wait
    as well: two extra commits where one was missed.
    """
    follow_bound(monkeypatch, 0.05)
    with FencedSqliteSaver(str(tmp_path / "s.db")) as saver:
        parent = saver.put(
            saver_config("t"), new_checkpoint({"step": 0}), {"source": "loop", "step": 0}, {}
        )
        group = saver._engine._group
        saver.put_writes(parent, [("x", 0)], "late")  # its put never comes: runs out
        assert group.stats()["ran_out"] == 1
        monkeypatch.setattr(steps, "FOLLOW_MIN_S", 5.0)  # the next put is on time
        monkeypatch.setattr(steps, "FOLLOW_MAX_S", 5.0)
        before = group.stats()
        outcome, _ = _a_step(saver, parent)
        after = group.stats()
        assert outcome is None
        assert after["skipped"] == before["skipped"] and after["joined"] == before["joined"] + 1
        assert after["commits"] - before["commits"] == 1


class DeltaState(TypedDict):
    """A list kept in a `DeltaChannel`: LangGraph puts only after its writes returned."""

    items: Annotated[list[str], DeltaChannel(lambda state, writes: [*state, *sum(writes, [])])]


def test_writes_whose_put_waits_for_them_back_off(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `DeltaChannel` write is awaited by LangGraph before it sends the put.

    Surprise pinned here: for such writes the put cannot join (it is sent
    only once the write returned), so every wait would run out; the back-off
    keeps that to a few waits, whatever the number of steps.
    """
    follow_bound(monkeypatch, 0.05)
    graph = StateGraph(DeltaState)
    previous = START
    for i in range(5):
        graph.add_node(f"n{i}", lambda s, i=i: {"items": [f"n{i}"]})
        graph.add_edge(previous, f"n{i}")
        previous = f"n{i}"
    graph.add_edge(previous, END)
    with FencedSqliteSaver(str(tmp_path / "s.db")) as saver:
        app = graph.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "t"}}
        for _ in range(4):
            result = app.invoke({"items": ["in"]}, config, durability="sync")
        assert result["items"].count("n4") == 4
        stats = saver._engine._group.stats()
        assert stats["joined"] == 0  # pinned: the put never joins these writes
        # 24 awaited writes (6 per invoke); waits at the 1st, 2nd (the first
        # run-out is forgiven), 5th, 10th and 19th.
        assert stats["ran_out"] <= 5 and stats["skipped"] >= 19, stats


@pytest.mark.parametrize("api", ["invoke", "ainvoke"])
def test_a_put_that_encodes_for_longer_than_the_wait_still_commits_with_its_writes(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    """A long history's put encodes for longer than a write waits: its writes wait on.

    A put announces its thread when called (`FollowPolicy.announce`), before
    it encodes, and writes awaiting a put of that thread wait on; before,
    each step's writes ran out and committed alone: one more fsync per step
    on a long chat.
    """
    # The bound (20 ms) stays above a loaded machine's thread wake-ups (the
    # next put is called from another thread once the previous returned);
    # the encode (200 ms) is ten times it.
    follow_bound(monkeypatch, 0.02)
    real = FencedSqliteSaver._encode_put

    def slow(self: FencedSqliteSaver, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.2)  # what encoding a long history's values takes
        return real(self, *args, **kwargs)

    monkeypatch.setattr(FencedSqliteSaver, "_encode_put", slow)
    with FencedSqliteSaver(str(tmp_path / "s.db")) as saver:
        app = chain_graph(saver)
        group = saver._engine._group
        before = group.stats()
        config = {"configurable": {"thread_id": "t"}}
        if api == "invoke":
            result = app.invoke({"count": 0, "trail": []}, config, durability="sync")
        else:
            result = asyncio.run(app.ainvoke({"count": 0, "trail": []}, config, durability="sync"))
        after = group.stats()
        assert result["count"] == 5
        assert after["commits"] - before["commits"] == 7
        assert after["ran_out"] == before["ran_out"]
        assert group._announced == {}  # every announce withdrawn
