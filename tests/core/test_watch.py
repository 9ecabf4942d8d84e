"""watch()/awatch(): every event once, in order, with no gap; closing; cancelling.

Waits are bounded (joins and `asyncio.wait_for`), never timed: a broken
promise fails within the bound instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sqlite3
import threading
import time
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from langgraph_fenced_sqlite import (
    AsyncEventWatch,
    EventWatch,
    FencedSqliteSaver,
    ReplayUnavailable,
    StoreClosed,
    StoreError,
)

BOUND = 20.0


def open_fds(path: str) -> int:
    """Count this process's open descriptors on the database's WAL file.

    Each connection opens the WAL on its own descriptor and closes it when
    closed. (The main file is no measure: SQLite's unix VFS keeps a closed
    connection's descriptor for reuse while another connection of the
    process holds a lock on that file.)
    """
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target == path + "-wal":
            count += 1
    return count


def commit_in_background(
    saver: FencedSqliteSaver, token: int, n: int, batch: int
) -> threading.Thread:
    """Append n events on thread "t" in commits of `batch`, from another thread."""

    def run() -> None:
        i = 0
        while i < n:
            size = min(batch, n - i)
            saver.append_events("t", token, [("e", {"i": i + k + 1}) for k in range(size)])
            i += size
            time.sleep(0.001)

    th = threading.Thread(target=run)
    th.start()
    return th


def take(watch: EventWatch, n: int) -> list[Any]:
    """Take n events from a sync watch on a thread; fail (closing it) past the bound."""
    got: list[Any] = []

    def run() -> None:
        for event in watch:
            got.append(event)
            if len(got) == n:
                return

    th = threading.Thread(target=run)
    th.start()
    th.join(BOUND)
    if th.is_alive():
        watch.close()
        th.join(BOUND)
        raise AssertionError(f"watch stalled after {[e.seq for e in got]}")
    return got


@pytest.fixture
def claimed(open_store: Any) -> tuple[FencedSqliteSaver, int]:
    """A store (fast polling) and a claim on thread "t"."""
    saver = open_store(poll_interval=0.01)
    return saver, saver.claim("t", "w", 600).token


def test_watch_delivers_every_event_once_in_order(claimed: Any, open_store: Any) -> None:
    """watch() delivers 150 events committed in batches once each, in order."""
    saver, token = claimed
    writer = open_store()  # commits through another connection, as a worker would
    th = commit_in_background(writer, token, 150, batch=3)
    with saver.watch("t", 0, batch=7) as watch:
        got = take(watch, 150)
        assert watch.last_seq == 150
    th.join(BOUND)
    assert [e.seq for e in got] == list(range(1, 151))
    assert [e.data["i"] for e in got] == list(range(1, 151))


async def test_awatch_delivers_every_event_once_in_order(claimed: Any, open_store: Any) -> None:
    """awatch() delivers 150 events committed in batches once each, in order."""
    saver, token = claimed
    writer = open_store()
    th = commit_in_background(writer, token, 150, batch=4)
    got: list[Any] = []

    async def consume() -> None:
        async with saver.awatch("t", 0, batch=5) as watch:
            async for event in watch:
                got.append(event)
                if len(got) == 150:
                    break
            assert watch.last_seq == 150

    await asyncio.wait_for(consume(), BOUND)
    await asyncio.to_thread(th.join, BOUND)
    assert [e.seq for e in got] == list(range(1, 151))


def test_watch_resumes_from_after_seq(claimed: Any) -> None:
    """A watch starts after `after_seq`."""
    saver, token = claimed
    saver.append_events("t", token, [("e", {}) for _ in range(5)])
    with saver.watch("t", 3) as watch:
        assert [e.seq for e in take(watch, 2)] == [4, 5]


def test_watch_below_floor_raises_replay_unavailable(claimed: Any) -> None:
    """Resuming below the floor raises ReplayUnavailable with the floor."""
    saver, token = claimed
    saver.append_events("t", token, [("e", {}) for _ in range(6)])
    saver.compact_events("t", 5)
    with saver.watch("t", 2) as watch:
        with pytest.raises(ReplayUnavailable) as info:
            next(watch)
    assert (info.value.thread_id, info.value.floor) == ("t", 5)
    # From just below the floor is fine.
    with saver.watch("t", 4) as watch:
        assert [e.seq for e in take(watch, 2)] == [5, 6]


async def test_awatch_below_floor_raises_replay_unavailable(claimed: Any) -> None:
    """awatch resuming below the floor raises ReplayUnavailable."""
    saver, token = claimed
    saver.append_events("t", token, [("e", {}) for _ in range(6)])
    saver.compact_events("t", 5)
    async with saver.awatch("t", 0) as watch:
        with pytest.raises(ReplayUnavailable) as info:
            await asyncio.wait_for(watch.__anext__(), BOUND)
    assert info.value.floor == 5


def test_watch_that_falls_below_a_raised_floor_raises(claimed: Any) -> None:
    """A watch overtaken by compaction raises instead of skipping events."""
    # A subscriber that stalls while the log is compacted past it must learn
    # it missed events, never silently skip them.
    saver, token = claimed
    saver.append_events("t", token, [("e", {}) for _ in range(3)])
    with saver.watch("t", 0) as watch:
        assert [e.seq for e in take(watch, 1)] == [1]
        # The watch buffers what it read: drain it, then compact past it.
        while watch.last_seq < 3:
            next(watch)
        saver.append_events("t", token, [("e", {}) for _ in range(3)])
        saver.compact_events("t", 6)
        with pytest.raises(ReplayUnavailable):
            next(watch)


def test_close_from_another_thread_ends_a_blocked_watch(claimed: Any) -> None:
    """close() from another thread ends a blocked iteration; the store works on."""
    saver, token = claimed
    watch = saver.watch("t", 0)
    ended = threading.Event()
    seen: list[Any] = []

    def consume() -> None:
        seen.extend(watch)
        ended.set()

    th = threading.Thread(target=consume)
    th.start()
    time.sleep(0.1)  # let it block in its wait
    watch.close()
    th.join(BOUND)
    assert ended.is_set() and seen == []
    with pytest.raises(StopIteration):
        next(watch)
    # The store is unaffected.
    assert saver.append_events("t", token, [("e", {})]) == [1]


def test_close_releases_the_watch_connection(claimed: Any, db_path: str) -> None:
    """close() releases the watch's connection even when nobody iterates again."""
    # A watch reads on a connection of its own. close() must release it even
    # when nobody iterates again (the common "for ... : break; close()").
    saver, token = claimed
    saver.append_events("t", token, [("e", {})])
    base = open_fds(db_path)
    watch = saver.watch("t", 0)
    # A watch holds a connection only while it waits: none before the first
    # iteration, none between iterations.
    assert open_fds(db_path) == base
    assert next(watch).seq == 1
    assert open_fds(db_path) == base
    watch.close()
    assert open_fds(db_path) == base
    with pytest.raises(StopIteration):
        next(watch)
    with saver.watch("t", 0) as watch:
        next(watch)
    assert open_fds(db_path) == base


async def test_aclose_releases_the_awatch_connection(claimed: Any, db_path: str) -> None:
    """aclose() releases the awatch connection and ends iteration."""
    saver, token = claimed
    saver.append_events("t", token, [("e", {})])
    base = open_fds(db_path)
    watch = saver.awatch("t", 0)
    assert (await watch.__anext__()).seq == 1
    await watch.aclose()
    assert open_fds(db_path) == base
    with pytest.raises(StopAsyncIteration):
        await watch.__anext__()


async def test_aclose_from_another_task_ends_the_consumer(claimed: Any) -> None:
    """aclose() from another task ends a waiting consumer cleanly."""
    # The consumer is suspended between polls when another task closes the
    # watch: it must end cleanly, not poll a closed connection.
    saver, token = claimed
    watch = saver.awatch("t", 0)
    seen: list[Any] = []

    async def consume() -> None:
        async for event in watch:
            seen.append(event)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.1)
    await watch.aclose()
    await asyncio.wait_for(task, BOUND)
    assert seen == []
    assert saver.append_events("t", token, [("e", {})]) == [1]


async def test_cancelling_the_consumer_ends_an_awatch(claimed: Any, db_path: str) -> None:
    """Cancelling the consuming task ends an awatch and frees its connection."""
    saver, token = claimed
    base = open_fds(db_path)

    async def consume() -> None:
        async with saver.awatch("t", 0) as watch:
            async for _ in watch:
                pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.1)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=BOUND)
    assert done and task.cancelled()
    assert open_fds(db_path) == base  # `async with` closed it on the way out
    assert saver.append_events("t", token, [("e", {})]) == [1]
    assert [e.seq for e in await saver.await_events("t", 0, timeout=BOUND)] == [1]


def test_a_waiting_watcher_never_blocks_writes(open_store: Any) -> None:
    """Puts, writes, renewals and appends complete while a watcher waits."""
    # busy_timeout=0.5: if the watcher held a lock the writes below would
    # fail with StoreBusy instead of hanging.
    saver = open_store(poll_interval=0.01, busy_timeout=0.5)
    claim = saver.claim("t", "w", 600)
    watch = saver.watch("t", 0)
    got: list[Any] = []

    def consume() -> None:
        for event in watch:
            got.append(event)
            if len(got) == 3:
                return

    th = threading.Thread(target=consume)
    th.start()
    time.sleep(0.1)  # the watcher is now waiting
    cp = empty_checkpoint()
    saver.put(claim.config(), cp, {"source": "input", "step": -1, "parents": {}}, {})
    saver.put_writes(claim.config(checkpoint_ns="", checkpoint_id=cp["id"]), [("x", 1)], "task")
    saver.renew("t", claim.token, 600)
    saver.append_events("t", claim.token, [("e", {})])
    th.join(BOUND)
    with watch:
        pass
    assert not th.is_alive()
    assert [e.kind for e in got] == ["checkpoint", "writes", "e"]


def test_a_blocked_sync_wait_does_not_block_the_same_store(claimed: Any) -> None:
    """A thread blocked in wait_events does not block the same store's writes."""
    # wait_events on one thread, writes through the same store on another.
    saver, token = claimed
    result: list[Any] = []
    th = threading.Thread(target=lambda: result.extend(saver.wait_events("t", 0, timeout=BOUND)))
    th.start()
    time.sleep(0.1)
    assert saver.append_events("t", token, [("e", {})]) == [1]
    th.join(BOUND)
    assert [e.seq for e in result] == [1]


def test_watch_types_and_validation(claimed: Any) -> None:
    """watch()/awatch() return their types and check their arguments."""
    saver, _ = claimed
    with saver.watch("t") as watch:
        assert isinstance(watch, EventWatch) and watch.last_seq == 0
    assert isinstance(saver.awatch("t"), AsyncEventWatch)
    with pytest.raises(ValueError, match="after_seq"):
        saver.watch("t", -1)
    with pytest.raises(ValueError, match="limit"):
        saver.watch("t", 0, batch=0)
    with pytest.raises(ValueError, match="thread_id"):
        saver.watch("")
    with pytest.raises(ValueError, match="timeout"):
        saver.wait_events("t", 0, timeout=0)
    with pytest.raises(ValueError, match="timeout"):
        saver.wait_events("t", 0, timeout=-1)


def test_watch_on_a_closed_store_raises(open_store: Any) -> None:
    """watch() and wait_events() on a closed store raise StoreClosed."""
    saver = open_store()
    saver.close()
    with pytest.raises(StoreClosed):
        saver.watch("t")
    with pytest.raises(StoreClosed):
        saver.wait_events("t", 0, timeout=1)


def test_closing_the_store_ends_its_watches(claimed: Any, open_store: Any, db_path: str) -> None:
    """Closing a store ends its watches and closes their connections, GC or not.

    Pinned the other way before: a watch kept its connection (and went on)
    after its store closed, so an abandoned watch held a file descriptor until
    the garbage collector found it.
    """
    saver, token = claimed
    writer = open_store()
    base = open_fds(db_path)
    watch = saver.watch("t", 0)
    awatch = saver.awatch("t", 0)
    writer.append_events("t", token, [("e", {})])
    assert next(watch).seq == 1
    blocked: list[Any] = []
    consumer = threading.Thread(target=lambda: blocked.extend(watch))  # waits for seq 2
    consumer.start()
    time.sleep(0.1)  # let it block in its wait (not a timing assertion)
    saver.close()
    consumer.join(BOUND)
    assert not consumer.is_alive() and blocked == []
    with pytest.raises(StopIteration):
        next(watch)
    with pytest.raises(StopAsyncIteration):
        asyncio.run(awatch.__anext__())
    assert open_fds(db_path) == base - 1  # the store's own is gone; only the writer's left


# --- raw sqlite3 errors and abandoned watches -------------------------------------------


def _break_the_log(db_path: str) -> None:
    conn = sqlite3.connect(db_path)
    conn.execute("DROP TABLE events")  # a damaged file, as a waiter meets it
    conn.commit()
    conn.close()


def test_waits_and_watches_raise_store_errors_not_sqlite3(claimed: Any, db_path: str) -> None:
    """wait_events, await_events, watch and awatch on a damaged file raise StoreError.

    They used to let the raw sqlite3.OperationalError through, where
    events_after raises StoreError for the same file.
    """
    saver, token = claimed
    watch = saver.watch("t", 0)
    awatch = saver.awatch("t", 0)
    _break_the_log(db_path)
    with pytest.raises(StoreError) as caught:
        saver.wait_events("t", 0, timeout=0.2)
    assert "no such table" in str(caught.value) and db_path in str(caught.value)
    with pytest.raises(StoreError) as sync_caught:
        asyncio.run(saver.await_events("t", 0, timeout=0.2))
    with pytest.raises(StoreError):
        next(watch)
    with pytest.raises(StoreError):
        asyncio.run(awatch.__anext__())
    with pytest.raises(StoreError):
        saver.events_after("t", 0)
    assert not isinstance(sync_caught.value, sqlite3.Error)
    watch.close()
    asyncio.run(awatch.aclose())
    assert open_fds(db_path) == 1  # only the store's own connection is left


def test_abandoned_watches_hold_no_connection(claimed: Any, db_path: str) -> None:
    """A watch or awatch dropped mid-iteration holds no descriptor, with the GC off."""
    saver, token = claimed
    saver.append_events("t", token, [("e", {}), ("e", {})])
    base = open_fds(db_path)
    gc.disable()
    try:
        kept = saver.watch("t", 0)  # still referenced, never closed
        assert next(kept).seq == 1
        assert open_fds(db_path) == base
        for _event in saver.watch("t", 0):
            break
        assert open_fds(db_path) == base

        async def drop_awatch() -> None:
            awatch = saver.awatch("t", 0)
            assert (await awatch.__anext__()).seq == 1
            async for _event in saver.awatch("t", 1):
                break

        asyncio.run(drop_awatch())
        assert open_fds(db_path) == base
        saver.close()
        assert [e.seq for e in kept] == [2]  # what it had read, then the end
        assert open_fds(db_path) == base - 1
    finally:
        gc.enable()


# --- incarnations (contract case 31) ------------------------------------------------------------


def _append(store: FencedSqliteSaver, n: int) -> None:
    claim = store.claim("t", "w", 60)
    store.append_events("t", claim.token, [("e", {"i": i}) for i in range(n)])
    store.release("t", claim.token)


def test_watch_keeps_its_incarnation_across_a_delete(store: FencedSqliteSaver) -> None:
    """A watch from 0 that read incarnation 1 raises ReplayUnavailable after delete_thread."""
    _append(store, 3)
    with store.watch("t", 0) as watch:
        assert [next(watch).seq for _ in range(3)] == [1, 2, 3]
        assert watch.incarnation == 1
        store.delete_thread("t")
        claim = store.claim("t", "w", 60)
        store.append_events("t", claim.token, [("new", {"i": i}) for i in range(5)])
        # It used to go on with seq 4 of the new thread, skipping its 1-3.
        with pytest.raises(ReplayUnavailable) as info:
            next(watch)
        assert info.value.incarnation == 2
    with store.watch("t", 0, incarnation=info.value.incarnation) as again:
        assert [(e.seq, e.incarnation) for e in (next(again) for _ in range(5))] == [
            (s, 2) for s in range(1, 6)
        ]


async def test_awatch_keeps_its_incarnation_across_a_delete(store: FencedSqliteSaver) -> None:
    """The async watch remembers its incarnation too; resuming from an Event works."""
    _append(store, 2)
    watch = store.awatch("t", 0)
    try:
        first = await asyncio.wait_for(watch.__anext__(), BOUND)
        second = await asyncio.wait_for(watch.__anext__(), BOUND)
        assert [first.seq, second.seq, watch.incarnation] == [1, 2, 1]
        await store.adelete_thread("t")
        _append(store, 4)
        with pytest.raises(ReplayUnavailable) as info:
            await asyncio.wait_for(watch.__anext__(), BOUND)
        assert info.value.incarnation == 2
    finally:
        await watch.aclose()
    resumed = store.awatch("t", first)  # a position of incarnation 1
    try:
        with pytest.raises(ReplayUnavailable):
            await asyncio.wait_for(resumed.__anext__(), BOUND)
    finally:
        await resumed.aclose()
    got = await store.await_events("t", 1, incarnation=2, timeout=BOUND)
    assert [(e.seq, e.incarnation) for e in got] == [(2, 2), (3, 2), (4, 2)]
