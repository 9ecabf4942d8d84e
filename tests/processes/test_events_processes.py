"""Events across real processes: writers and watchers in children, crashes included.

Children are `python -m langgraph_fenced_sqlite.testing.child_events ...`;
each prints JSON lines, flushed, so the parent knows exactly what a child
delivered before it stopped or was killed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest

from langgraph_fenced_sqlite import FencedSqliteSaver
from langgraph_fenced_sqlite.testing.child_events import LineReader, run_child, spawn

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

BOUND = 60.0
N = 200


def start_writer(path: str, token: int, *, seed: int) -> LineReader:
    """A child committing N events, one per commit, 0-5 ms apart."""
    return LineReader(
        spawn("append", path=path, thread_id="t", token=token, count=N, max_pause_ms=5, seed=seed)
    )


def finish_writer(writer: LineReader) -> None:
    done = writer.next_line(BOUND)
    assert done == {"done": True, "seqs": list(range(1, N + 1))}
    assert writer.finish(BOUND) == 0


@pytest.fixture
def watched(open_store: Any) -> tuple[FencedSqliteSaver, int]:
    """A store polling every 5 ms and a claim on thread "t" for the children."""
    saver = open_store(poll_interval=0.005)
    return saver, saver.claim("t", "parent", 600).token


def test_parent_watch_sees_every_child_commit_in_order(watched: Any) -> None:
    """watch() sees exactly seqs 1..200 a child commits at random intervals."""
    saver, token = watched
    writer = start_writer(saver.path, token, seed=1)
    got: list[Any] = []
    watch = saver.watch("t", 0)

    def consume() -> None:
        for event in watch:
            got.append(event)
            if len(got) == N:
                return

    th = threading.Thread(target=consume)
    th.start()
    th.join(BOUND)
    stalled = th.is_alive()
    watch.close()
    th.join(BOUND)
    finish_writer(writer)
    assert not stalled, f"watch stalled at {watch.last_seq}"
    assert [e.seq for e in got] == list(range(1, N + 1))
    assert [e.data["i"] for e in got] == list(range(1, N + 1))


async def test_parent_awatch_sees_every_child_commit_in_order(watched: Any) -> None:
    """awatch() sees exactly seqs 1..200 a child commits at random intervals."""
    saver, token = watched
    writer = await asyncio.to_thread(start_writer, saver.path, token, seed=2)
    got: list[Any] = []

    async def consume() -> None:
        async with saver.awatch("t", 0, batch=16) as watch:
            async for event in watch:
                got.append(event)
                if len(got) == N:
                    return

    await asyncio.wait_for(consume(), BOUND)
    await asyncio.to_thread(finish_writer, writer)
    assert [e.seq for e in got] == list(range(1, N + 1))


def test_watcher_resumes_in_a_new_process(watched: Any) -> None:
    """A watcher process that stops at n, resumed by a new process from n, sees the rest."""
    # Watcher A (its own process) stops after 80 events; watcher B, a new
    # process, resumes from A's last seq while the writer is still writing.
    saver, token = watched
    watcher_a = LineReader(spawn("watch", path=saver.path, thread_id="t", after_seq=0, count=80))
    assert watcher_a.next_line(BOUND) == {"ready": True}
    writer = start_writer(saver.path, token, seed=3)
    lines_a = list(watcher_a.lines_until(lambda line: "stopped" in line, BOUND))
    assert watcher_a.finish(BOUND) == 0
    n = lines_a[-1]["last_seq"]
    seen_a = [line["seq"] for line in lines_a[:-1]]
    assert seen_a == list(range(1, 81)) and n == 80

    watcher_b = LineReader(spawn("watch", path=saver.path, thread_id="t", after_seq=n, count=N - n))
    lines_b = list(watcher_b.lines_until(lambda line: "stopped" in line, BOUND))
    assert watcher_b.finish(BOUND) == 0
    finish_writer(writer)
    seen_b = [line["seq"] for line in lines_b if "seq" in line]
    assert seen_b == list(range(n + 1, N + 1))
    assert [line["data"]["i"] for line in lines_b if "seq" in line] == seen_b


def test_watcher_killed_mid_stream_resumes_from_its_last_line(watched: Any) -> None:
    """A SIGKILLed watcher resumed from its last printed seq sees exactly the rest."""
    # SIGKILL: the watcher gets no chance to clean up. Everything it printed
    # was delivered; a new process resuming from the last printed seq sees
    # exactly the rest, once each.
    saver, token = watched
    writer = start_writer(saver.path, token, seed=4)
    victim = LineReader(spawn("watch", path=saver.path, thread_id="t", after_seq=0))
    assert victim.next_line(BOUND) == {"ready": True}
    seen: list[int] = []
    while len(seen) < 50:
        seen.append(victim.next_line(BOUND)["seq"])
    os.kill(victim.proc.pid, signal.SIGKILL)
    assert victim.finish(BOUND) == -signal.SIGKILL
    last = seen[-1]
    assert seen == list(range(1, last + 1))

    finish_writer(writer)
    rest = run_child("watch", path=saver.path, thread_id="t", after_seq=last, count=N - last)
    assert [line["seq"] for line in rest if "seq" in line] == list(range(last + 1, N + 1))
    assert rest[-1] == {"stopped": True, "last_seq": N}


def test_wait_events_returns_a_commit_from_another_process(watched: Any) -> None:
    """wait_events returns a commit another process makes meanwhile."""
    saver, token = watched
    result: list[Any] = []
    th = threading.Thread(target=lambda: result.extend(saver.wait_events("t", 0, timeout=BOUND)))
    th.start()
    lines = run_child("append", path=saver.path, thread_id="t", token=token, count=1, kind="remote")
    th.join(BOUND)
    assert lines == [{"done": True, "seqs": [1]}]
    assert [(e.seq, e.kind, e.data) for e in result] == [(1, "remote", {"i": 1})]


def test_a_stale_child_writer_spends_no_seq(watched: Any) -> None:
    """A child with a taken-over token appends nothing and spends no seq."""
    # The child's token is taken over mid-stream: its refused commit must
    # neither appear nor leave a gap for the new holder.
    saver, token = watched
    saver.take_over("t", "new", 600)
    proc = spawn("append", path=saver.path, thread_id="t", token=token, count=1)
    _, err = proc.communicate(timeout=BOUND)
    assert proc.returncode != 0 and "StaleClaim" in err
    fresh = saver.take_over("t", "newer", 600)
    assert saver.append_events("t", fresh.token, [("e", {})]) == [1]


def test_child_watch_learns_its_thread_was_deleted_and_re_created(watched: Any) -> None:
    """A watcher in another process gets ReplayUnavailable naming the new incarnation."""
    saver, token = watched
    saver.append_events("t", token, [("old", {"i": i}) for i in range(3)])
    watcher = LineReader(spawn("watch", path=saver.path, thread_id="t", timeout=BOUND))
    assert watcher.next_line(BOUND) == {"ready": True}
    assert [watcher.next_line(BOUND)["seq"] for _ in range(3)] == [1, 2, 3]
    saver.delete_thread("t")
    fresh = saver.claim("t", "parent", 600)
    saver.append_events("t", fresh.token, [("new", {"i": i}) for i in range(5)])
    # It used to go on with seqs 4 and 5 of the new thread, skipping its 1-3.
    assert watcher.next_line(BOUND) == {
        "replay_unavailable": True,
        "incarnation": 2,
        "floor": 1,
        "last_seq": 3,
    }
    assert watcher.finish(BOUND) == 0


# --- the doorbell, its safety poll and its fallback (issue 11, item 3) ---------------------


# Without the doorbell, these waits would sleep for an hour (their safety poll)
# or a watch's whole 60 s slice: finishing within this bound takes the bell.
BELL_BOUND = 30.0


@pytest.fixture
def bell_only(open_store: Any) -> tuple[FencedSqliteSaver, int]:
    """A store whose waits poll at most once an hour: only the doorbell can wake them in time."""
    saver = open_store(poll_interval=3600)
    return saver, saver.claim("t", "parent", 600).token


def test_the_bell_alone_wakes_wait_events_for_each_child_commit(bell_only: Any) -> None:
    """Hour-long wait_events calls return each child commit: all N within the bound."""
    saver, token = bell_only
    writer = start_writer(saver.path, token, seed=5)
    seqs: list[int] = []

    def consume() -> None:
        while len(seqs) < N:
            got = saver.wait_events("t", seqs[-1] if seqs else 0, timeout=3600)
            seqs.extend(e.seq for e in got)

    th = threading.Thread(target=consume)
    th.start()
    th.join(BELL_BOUND)
    stalled = th.is_alive()
    saver.close()  # ends a stalled wait
    th.join(BOUND)
    finish_writer(writer)
    assert not stalled, f"no wake-up after seq {seqs[-1] if seqs else 0}: the bell did not ring"
    assert seqs == list(range(1, N + 1))


async def test_the_bell_alone_wakes_await_events_for_each_child_commit(bell_only: Any) -> None:
    """The async twin: hour-long await_events calls return each child commit in time."""
    saver, token = bell_only
    writer = await asyncio.to_thread(start_writer, saver.path, token, seed=6)
    seqs: list[int] = []

    async def consume() -> None:
        while len(seqs) < N:
            got = await saver.await_events("t", seqs[-1] if seqs else 0, timeout=3600)
            seqs.extend(e.seq for e in got)

    try:
        await asyncio.wait_for(consume(), BELL_BOUND)
    except asyncio.TimeoutError:
        pytest.fail(f"no wake-up after seq {seqs[-1] if seqs else 0}: the bell did not ring")
    finally:
        await asyncio.to_thread(finish_writer, writer)
    assert seqs == list(range(1, N + 1))


def test_the_bell_alone_wakes_a_watch_for_each_child_commit(bell_only: Any) -> None:
    """watch() sees seqs 1..N within the bound, well inside one 60 s wait slice."""
    saver, token = bell_only
    writer = start_writer(saver.path, token, seed=7)
    with saver.watch("t", 0) as watch:
        got: list[int] = []

        def consume() -> None:
            for event in watch:
                got.append(event.seq)
                if len(got) == N:
                    return

        th = threading.Thread(target=consume)
        th.start()
        th.join(BELL_BOUND)
    th.join(BOUND)
    finish_writer(writer)
    assert got == list(range(1, N + 1))


# A writer that rings no bell (plain sqlite3, or an older version of this
# library): it commits one more event, a copy of the last with the next seq.
_RAW_WRITER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
cols = [row[1] for row in conn.execute("PRAGMA table_info(events)")]
picked = ", ".join("seq + 1" if c == "seq" else c for c in cols)
conn.execute("BEGIN IMMEDIATE")
conn.execute(
    f"INSERT INTO events ({', '.join(cols)}) SELECT {picked} FROM events "
    "WHERE thread_id = 't' ORDER BY seq DESC LIMIT 1"
)
conn.execute("COMMIT")
conn.close()
"""


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_commit_that_rings_no_bell_is_seen_by_the_safety_poll(
    open_store: Any, db_path: str, api: str
) -> None:
    """A watcher listening to the bell still sees a raw sqlite3 commit (default options)."""
    saver = open_store()
    claim = saver.claim("t", "parent", 600)
    saver.append_events("t", claim.token, [("e", {"i": 1})])
    got: list[Any] = []

    async def follow_async() -> None:
        async with saver.awatch("t", 1) as awatch:
            async for event in awatch:
                got.append(event)
                return

    def follow() -> None:
        if api == "async":
            asyncio.run(follow_async())
            return
        with saver.watch("t", 1) as watch:
            for event in watch:
                got.append(event)
                return

    th = threading.Thread(target=follow)
    th.start()
    subprocess.run([sys.executable, "-c", _RAW_WRITER, db_path], check=True, timeout=BOUND)
    th.join(BELL_BOUND)  # less than a watch's 60 s slice: the safety poll found it
    saver.close()  # ends a stalled watch
    th.join(BOUND)
    assert [(e.seq, e.data) for e in got] == [(2, {"i": 1})]


def test_without_a_bell_watchers_poll_and_see_every_commit(
    watched: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no bell can be had (as without inotify), watch() polls and misses nothing."""
    from langgraph_fenced_sqlite.sqlite import doorbell

    monkeypatch.setattr(doorbell, "_LIBC", None)  # as on a system without inotify
    assert doorbell.Listener.open(watched[0].path) is None
    saver, token = watched
    writer = start_writer(saver.path, token, seed=8)
    watch = saver.watch("t", 0)
    got: list[int] = []
    listening: list[bool] = []

    def consume() -> None:
        for event in watch:
            got.append(event.seq)
            listening.append(watch._poller.listening)
            if len(got) == N:
                return

    th = threading.Thread(target=consume)
    th.start()
    th.join(BOUND)
    watch.close()
    th.join(BOUND)
    finish_writer(writer)
    assert got == list(range(1, N + 1))
    assert not any(listening)
