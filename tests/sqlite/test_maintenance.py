"""`sweep` (one transaction per thread) and `vacuum` (refused while a writer is active).

Files come from real graphs (`support.graphs.make_ops_file`: a subgraph, an interrupt,
the runner); the interleaving and the held write lock are real processes, and
interleaving is read from commit order, never from timings.
"""

from __future__ import annotations

import json
import os
import sqlite3
from typing import Any

import pytest
from langgraph.types import Command
from support.configs import config
from support.files import dump, file_fixtures
from support.graphs import DAY, build_ops_graph, make_ops_file
from support.processes import WRITE_LOCKER, python, reap
from support.puts import put_chain

from langgraph_fenced_sqlite import (
    FencedSqliteSaver,
    InvalidArgument,
    ManualClock,
    PruneResult,
    ReadOnlyStore,
    RetentionPolicy,
    StoreBusy,
    SweepResult,
    ThreadBusy,
)

KEEP_WHAT_RESUMES = RetentionPolicy(max_checkpoints=0, max_subgraph_runs=0)


# The six-thread file, made once, and `ops_file`, a private copy each test works on.
ops_master, ops_file = file_fixtures(make_ops_file, "ops_master", "ops_file", "ops.db")


def states(saver: FencedSqliteSaver, thread_ids: list[str]) -> dict[str, Any]:
    graph = build_ops_graph(saver)
    return {t: graph.get_state(config(t)).values for t in thread_ids}


def rows_of(path: str, thread_id: str) -> dict[str, list[Any]]:
    return {table: [r for r in rows if r[0] == thread_id] for table, rows in dump(path).items()}


THREADS = ["done", "waiting", "broken", "busy", "old", "plain"]


def test_sweep_prunes_only_threads_idle_long_enough(ops_file: str) -> None:
    with FencedSqliteSaver(ops_file) as saver:
        others = {t: rows_of(ops_file, t) for t in THREADS if t != "old"}
        before = states(saver, THREADS)
        old_namespaces = saver.namespaces("old")
        dry = saver.sweep(KEEP_WHAT_RESUMES, inactive_for=30 * DAY, dry_run=True)
        assert {t: rows_of(ops_file, t) for t in others} == others
        done = saver.sweep(KEEP_WHAT_RESUMES, inactive_for=30 * DAY)
        assert done == dry
        assert [r.thread_id for r in done.pruned] == ["old"] and done.busy == []
        assert {ns for ns, _ in done.pruned[0].checkpoints} == set(old_namespaces)
        assert saver.namespaces("old") == [""]
        assert len(saver.history("old", limit=100)) == 1
        assert states(saver, THREADS) == before
    assert {t: rows_of(ops_file, t) for t in others} == others


def test_a_sweep_of_every_thread_leaves_live_claims_alone_and_resumes_still_work(
    ops_file: str,
) -> None:
    with FencedSqliteSaver(ops_file) as saver:
        busy = rows_of(ops_file, "busy")
        before = states(saver, THREADS)
        seen: list[PruneResult] = []
        done = saver.sweep(KEEP_WHAT_RESUMES, on_thread=seen.append)
        assert isinstance(done, SweepResult) and done.busy == ["busy"]
        assert [r.thread_id for r in done.pruned] == sorted(t for t in THREADS if t != "busy")
        assert seen == done.pruned
        assert rows_of(ops_file, "busy") == busy
        assert states(saver, THREADS) == before
        assert saver.thread_status("waiting").node == "ask"
        graph = build_ops_graph(saver)
        out = graph.invoke(Command(resume="approved"), config("waiting"))
        assert out["items"][-1] == "approved"
        assert saver.thread_status("waiting").state == "idle"


def test_each_thread_decides_in_its_own_transaction(open_store: Any, clock: ManualClock) -> None:
    """A thread claimed or written after the sweep listed it is left alone."""
    store = open_store()
    graph = build_ops_graph(store)
    for t in ("a", "b", "c"):
        graph.invoke({"count": 0}, config(t))
        graph.invoke(Command(resume="ok"), config(t))
    clock.advance(10 * DAY)
    untouched = {t: rows_of(store.path, t) for t in ("b", "c")}

    def meanwhile(result: PruneResult) -> None:
        if result.thread_id == "a":
            store.claim("c", "late-worker", 60)
            store.append_events("c", store.current_claim("c").token, [("note", {})])
            store.release("c", store.current_claim("c").token)
            store.claim("b", "late-worker", 60)

    done = store.sweep(KEEP_WHAT_RESUMES, inactive_for=5 * DAY, on_thread=meanwhile)
    assert [r.thread_id for r in done.pruned] == ["a"] and done.pruned[0].checkpoints
    assert done.busy == ["b"]  # claimed after the listing
    # "c" was written after the listing: no longer idle, not swept.
    assert rows_of(store.path, "c")["checkpoints"] == untouched["c"]["checkpoints"]
    assert rows_of(store.path, "b")["checkpoints"] == untouched["b"]["checkpoints"]


def test_a_damaged_thread_is_reported_and_the_sweep_goes_on(ops_file: str) -> None:
    conn = sqlite3.connect(ops_file)
    with conn:
        conn.execute("UPDATE checkpoints SET metadata = '{bad' WHERE thread_id = 'done'")
    conn.close()
    with FencedSqliteSaver(ops_file) as saver:
        done = saver.sweep(KEEP_WHAT_RESUMES)
    assert [e["thread_id"] for e in done.errors] == ["done"]
    assert done.errors[0]["code"] == "undecodable_row"
    assert "done" not in [r.thread_id for r in done.pruned]
    assert "plain" in [r.thread_id for r in done.pruned]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"policy": "keep_latest"}, "policy"),
        ({"policy": KEEP_WHAT_RESUMES, "inactive_for": 0}, "inactive_for"),
        ({"policy": KEEP_WHAT_RESUMES, "inactive_for": "30d"}, "inactive_for"),
        ({"policy": KEEP_WHAT_RESUMES, "dry_run": "yes"}, "dry_run"),
        ({"policy": KEEP_WHAT_RESUMES, "on_thread": 3}, "on_thread"),
    ],
)
def test_bad_sweep_arguments_name_themselves_and_touch_nothing(
    store: FencedSqliteSaver, db_path: str, kwargs: dict[str, Any], name: str
) -> None:
    build_ops_graph(store).invoke({"count": 0}, config("t"))
    rows = dump(db_path)
    with pytest.raises((InvalidArgument, TypeError, ValueError)) as info:
        store.sweep(**kwargs)
    assert name in str(info.value)
    assert dump(db_path) == rows


async def test_asweep(store: FencedSqliteSaver) -> None:
    graph = build_ops_graph(store)
    graph.invoke({"count": 0}, config("t"))
    graph.invoke(Command(resume="ok"), config("t"))
    done = await store.asweep(KEEP_WHAT_RESUMES)
    assert [r.thread_id for r in done.pruned] == ["t"] and done.pruned[0].checkpoints


SWEEPER = """
import json, sys
from langgraph_fenced_sqlite import FencedSqliteSaver, RetentionPolicy

def between(result):
    print(json.dumps({"pruned": result.thread_id, "removed": len(result.checkpoints)}), flush=True)
    sys.stdin.readline()  # the other process writes now

with FencedSqliteSaver(sys.argv[1]) as saver:
    done = saver.sweep(RetentionPolicy(max_checkpoints=0), on_thread=between)
    print(json.dumps({"done": [r.thread_id for r in done.pruned]}), flush=True)
"""


def _put_chain(saver: FencedSqliteSaver, thread_id: str, n: int, start: int = 0) -> None:
    """Put `n` more checkpoints on the thread's chain, after its latest."""
    latest = saver.history_records(thread_id, limit=1)
    parent = latest[0]["checkpoint_id"] if latest else None
    put_chain(saver, thread_id, n, start=start, parent=parent)


@pytest.mark.slow
@pytest.mark.subprocess
def test_another_process_writes_between_two_threads_prunes(db_path: str) -> None:
    """The sweep holds the write lock for one thread's prune at a time, never between.

    The sweeper stops after each thread's commit until this process has
    written to an unrelated thread; that write must land (a sweep holding the
    lock across threads would leave it waiting until StoreBusy), and what it
    sees on disk right after its commit is exactly the threads swept so far.
    """
    swept = [f"s{i}" for i in range(5)]
    with FencedSqliteSaver(db_path) as setup:
        for t in swept:
            _put_chain(setup, t, 4)
    sweeper = python(SWEEPER, db_path)
    order: list[tuple[str, list[str]]] = []
    try:
        assert sweeper.stdin is not None and sweeper.stdout is not None
        with FencedSqliteSaver(db_path, busy_timeout=5) as writer:
            for i in range(len(swept)):
                line = sweeper.stdout.readline()
                assert line, sweeper.stderr.read() if sweeper.stderr else ""
                pruned = json.loads(line)["pruned"]
                _put_chain(writer, "other", 1, start=i)  # commits, or StoreBusy fails the test
                done_so_far = [t for t in swept if len(writer.history_records(t, limit=10)) == 1]
                order.append((pruned, done_so_far))
                sweeper.stdin.write("go\n")
                sweeper.stdin.flush()
            final = json.loads(sweeper.stdout.readline())
            other = writer.events_after("other", 0, limit=100)
        assert sweeper.wait(timeout=60) == 0
    finally:
        reap(sweeper)
    # Commit order: the writer's i-th commit came after exactly i+1 threads' prunes.
    assert order == [(t, swept[: i + 1]) for i, t in enumerate(swept)]
    steps = [e.data["step"] for e in other if e.kind == "checkpoint"]
    assert steps == list(range(len(swept)))
    assert [e.seq for e in other] == list(range(1, len(other) + 1))
    assert final["done"] == swept  # "other" came after the sweep listed the threads


# --- vacuum ---------------------------------------------------------------------------


def _grow_and_free(saver: FencedSqliteSaver) -> None:
    """Write a big thread and delete it, leaving free pages behind."""
    graph = build_ops_graph(saver)
    for i in range(20):
        graph.invoke({"count": 0, "items": ["x" * 20000]}, config(f"big-{i}"))
        saver.delete_thread(f"big-{i}")
    graph.invoke({"count": 7}, config("kept"))


def test_vacuum_reclaims_free_space_and_keeps_every_row(store: FencedSqliteSaver) -> None:
    _grow_and_free(store)
    rows = dump(store.path)
    report = store.vacuum()
    assert report.path == store.path
    assert report.bytes_after < report.bytes_before
    assert report.bytes_after == os.path.getsize(store.path) + os.path.getsize(store.path + "-wal")
    assert dump(store.path) == rows
    assert build_ops_graph(store).get_state(config("kept")).values["count"] == 1


def test_vacuum_refuses_a_live_claim_unless_forced(store: FencedSqliteSaver) -> None:
    _grow_and_free(store)
    store.claim("kept", "worker-1", 60)
    size = os.path.getsize(store.path)
    with pytest.raises(ThreadBusy) as info:
        store.vacuum()
    assert info.value.thread_id == "kept" and info.value.holder == "worker-1"
    assert "live claim" in str(info.value) and "force" in str(info.value)
    assert os.path.getsize(store.path) == size
    report = store.vacuum(force=True)
    assert report.bytes_after < report.bytes_before
    assert store.current_claim("kept") is not None


def test_vacuum_ignores_an_expired_claim(open_store: Any, clock: ManualClock) -> None:
    store = open_store()
    _grow_and_free(store)
    store.claim("kept", "gone-worker", 5)
    clock.advance(10)
    assert store.vacuum().bytes_after < os.path.getsize(store.path) + 10**9


@pytest.mark.slow
@pytest.mark.subprocess
def test_vacuum_refuses_while_another_process_holds_the_write_lock(db_path: str) -> None:
    with FencedSqliteSaver(db_path, busy_timeout=0.5) as store:
        _grow_and_free(store)
        locker = python(WRITE_LOCKER, db_path)
        try:
            assert locker.stdout is not None and locker.stdin is not None
            assert locker.stdout.readline() == "locked\n"
            with pytest.raises(StoreBusy) as info:
                store.vacuum()
            assert "write lock" in str(info.value)
            with pytest.raises(StoreBusy):
                store.vacuum(force=True)  # waited its busy_timeout, then gave up
            locker.stdin.write("done\n")
            locker.stdin.flush()
            assert locker.wait(timeout=60) == 0
        finally:
            reap(locker)
        report = store.vacuum()
        assert report.bytes_after < report.bytes_before
        # The probe left the store as it was: writes still work.
        build_ops_graph(store).invoke({"count": 1}, config("after"))


def test_a_read_only_store_cannot_vacuum(db_path: str) -> None:
    FencedSqliteSaver(db_path).close()
    with FencedSqliteSaver(db_path, readonly=True) as reader:
        with pytest.raises(ReadOnlyStore):
            reader.vacuum()


async def test_avacuum(store: FencedSqliteSaver) -> None:
    _grow_and_free(store)
    report = await store.avacuum()
    assert report.bytes_after < report.bytes_before
    with pytest.raises(InvalidArgument):
        await store.avacuum(force="yes")  # type: ignore[arg-type]
