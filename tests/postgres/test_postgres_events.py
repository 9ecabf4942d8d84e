"""The PostgreSQL store's event log: contiguous seqs per commit, incarnations, and waits
woken by LISTEN/NOTIFY from other processes (real ones, with their own connections)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.configs import saver_config
from support.processes import pg_child, run_together
from support.puts import new_checkpoint, put
from support.waiting import until

from langgraph_fenced_sqlite import (
    InvalidArgument,
    ManualClock,
    ReplayUnavailable,
    StaleClaim,
    ThreadBusy,
)
from langgraph_fenced_sqlite.postgres import sql
from langgraph_fenced_sqlite.runner import queue as runqueue


def test_each_write_appends_one_event_and_a_refused_or_repeated_one_spends_no_seq(
    open_pg: Any, clock: ManualClock
) -> None:
    """put → `checkpoint`, put_writes → `writes`; a retry, a refusal or a no-op leaves no gap."""
    saver = open_pg()
    granted = saver.claim("t", "alice", 10)
    cp = new_checkpoint()
    put(saver, "t", token=granted.token, checkpoint=cp, source="update", step=1)
    put(
        saver, "t", token=granted.token, checkpoint=cp, source="update", step=1
    )  # identical retry: no event
    with pytest.raises(ThreadBusy):
        put(saver, "t", source="update", step=1)  # refused: nothing
    wconf = saver_config("t", token=granted.token, checkpoint_id=cp["id"])
    saver.put_writes(wconf, [("a", 1), ("b", 2)], "task-1")
    saver.put_writes(wconf, [("a", 1), ("b", 2)], "task-1")  # first writer wins: no-op
    assert saver.append_events("t", granted.token, [("note", {"x": 1})]) == [3]
    got = saver.events_after("t")
    assert [(e.seq, e.kind) for e in got] == [(1, "checkpoint"), (2, "writes"), (3, "note")]
    assert got[0].checkpoint_id == cp["id"] and got[0].token == granted.token
    assert got[0].ts == clock.now()
    assert got[1].data == {"task_id": "task-1", "task_path": "", "channels": ["a", "b"]}
    assert saver.events_after("t", 1, 1) == got[1:2]
    with pytest.raises(StaleClaim):
        saver.append_events("t", granted.token + 99, [("note", {})])
    with pytest.raises(InvalidArgument, match="events"):
        saver.append_events("t", granted.token, [("note", "not an object")])
    assert saver.events_after("t", 3) == []
    assert saver.events_after("never-written") == []


def test_concurrent_commits_get_contiguous_seqs(open_pg: Any) -> None:
    """Four threads on their own connections append to one thread: seqs 1..N, none twice."""
    granted = open_pg().claim("t", "alice", 60)
    savers = [open_pg() for _ in range(4)]
    errors: list[BaseException] = []

    def work(saver: Any) -> None:
        try:
            for _ in range(15):
                saver.append_events("t", granted.token, [("a", {}), ("b", {})])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(s,)) for s in savers]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    got = savers[0].events_after("t", 0, 1000)
    assert [e.seq for e in got] == list(range(1, 4 * 15 * 2 + 1))
    # Each commit's two events are adjacent: a and b alternate.
    assert [e.kind for e in got] == ["a", "b"] * 60


def test_delete_thread_starts_a_new_incarnation(open_pg: Any) -> None:
    """A reader of the deleted thread is told (ReplayUnavailable), never shown the new seqs."""
    saver = open_pg()
    put(saver, "t", source="update", step=1)
    [old] = saver.events_after("t")
    saver.delete_thread("t")
    saver.delete_thread("t")  # twice: still incarnation 2
    put(saver, "t", source="update", step=1)
    with pytest.raises(ReplayUnavailable) as gone:
        saver.events_after("t", old)
    assert gone.value.incarnation == 2
    [new] = saver.events_after("t", 0, incarnation=2)
    assert (new.seq, new.incarnation) == (1, 2)


def test_wait_events_returns_at_once_or_empty_after_the_timeout(open_pg: Any) -> None:
    """Events already there come back at once; none within the timeout is []."""
    saver = open_pg()
    put(saver, "t", source="update", step=1)
    started = time.monotonic()
    assert [e.seq for e in saver.wait_events("t", 0, timeout=5)] == [1]
    assert time.monotonic() - started < 2
    started = time.monotonic()
    assert saver.wait_events("t", 1, timeout=0.2) == []
    assert 0.2 <= time.monotonic() - started < 2


@pytest.mark.slow
@pytest.mark.subprocess
def test_wait_events_wakes_for_another_process_commit(
    open_pg: Any, pg_dsn: str, tmp_path: Any
) -> None:
    """A waiter wakes for another process's commit on its NOTIFY: the waiter's safety
    poll is 5 s, so only the notification can wake it within 1 s."""
    saver = open_pg(clock=None, poll_interval=5)
    put(
        saver, "other", source="update", step=1
    )  # a thread created first, so the waiter's read is not its first
    flag = str(tmp_path / "go")
    args = {"dsn": pg_dsn, "thread": "t", "flag": flag, "delay": 0.3, "notify": True}
    results: list[Any] = []
    child = threading.Thread(
        target=lambda: results.extend(run_together([pg_child("put_later", args)], flag))
    )
    child.start()
    got = saver.wait_events("t", 0, timeout=30)
    woke_at = time.time()
    child.join(timeout=60)
    [(code, out, err)] = results
    assert code == 0, err
    assert [e.kind for e in got] == ["checkpoint"]
    lag = woke_at - json.loads(out)["committed_at"]
    assert lag < 1, lag


def test_without_notify_a_waiter_finds_the_commit_by_its_safety_poll(open_pg: Any) -> None:
    """A writer with `notify=False` (on its own connection, as another host) sends no
    NOTIFY: the waiter still returns the commit, by its poll (0.3 s here), not at once."""
    waiter = open_pg(clock=None, poll_interval=0.3)
    writer = open_pg(clock=None, notify=False)
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.extend(waiter.wait_events("t", timeout=30)))
    thread.start()
    time.sleep(0.5)
    started = time.monotonic()
    put(writer, "t", source="update", step=1)
    thread.join(timeout=30)
    assert [e.kind for e in got] == ["checkpoint"]
    assert time.monotonic() - started < 3


def test_one_notification_per_commit_naming_the_thread_and_none_with_notify_off(
    open_pg: Any, pg_dsn: str
) -> None:
    """A commit of ours sends one NOTIFY whose payload is the thread id (a fenced put,
    an unfenced one, put_writes, caller events); `notify=False` sends none."""
    loud, quiet = open_pg(), open_pg(notify=False)
    with psycopg.connect(pg_dsn, autocommit=True) as listener:
        # A waiter holds the listen key of each thread it waits on.
        for thread_id in ("t", "u", "v"):
            listener.execute(sql.HEAR, {"thread_id": thread_id, "timeout": "1s"})
        listener.execute("LISTEN lgfs_events")
        granted = loud.claim("t", "alice", 10)
        cid = put(loud, "t", token=granted.token, source="update", step=1)
        loud.put_writes(saver_config("t", token=granted.token, checkpoint_id=cid), [("a", 1)], "x")
        loud.append_events("t", granted.token, [("note", {})])
        put(quiet, "u", source="update", step=1)
        put(loud, "v", source="update", step=1)
        put(loud, "nobody-waits", source="update", step=1)  # no NOTIFY: nobody holds its key
        got = [n.payload for n in listener.notifies(timeout=1)]
    assert got == ["t", "t", "t", "v"]


def test_only_the_commits_that_end_a_run_notify_the_runs_channel(open_pg: Any, pg_dsn: str) -> None:
    """`lgfs_runs` (what a worker waiting for a thread listens to) hears each run's end,
    by the one-statement end and the statements alike, and an operator's release; not a
    run's begin, its steps, a plain claim or a take-over (the thread is held again)."""
    saver = open_pg()
    with psycopg.connect(pg_dsn, autocommit=True) as listener:
        for thread_id in ("t", "u", "v", "w"):
            listener.execute(sql.HEAR, {"thread_id": thread_id, "timeout": "1s"})
        listener.execute("LISTEN lgfs_runs")
        run = saver.begin_run("t", "w", 60, run_id="r1")
        cid = put(saver, "t", token=run.token, source="update", step=1)
        saver.put_writes(saver_config("t", token=run.token, checkpoint_id=cid), [("a", 1)], "x")
        saver.append_events("t", run.token, [("note", {})])
        assert saver.end_run("t", run.token, "run_completed", {})  # one statement: its hint
        run = saver.begin_run("u", "w", 60, run_id="r2")
        assert saver.end_run("u", run.token, "run_failed", {"error": "boom"})
        run = saver.begin_run("v", "w", 60, run_id="r3")
        with psycopg.connect(pg_dsn, autocommit=True) as other:  # someone else's checkpoint:
            other.execute(  # the end's hint is wrong, and the statements end the run
                "UPDATE lgfs_threads SET next_seq = next_seq + 1 WHERE thread_id = 'v'"
            )
        assert saver.end_run("v", run.token, "run_completed", {})
        saver.claim("w", "alice", 60)
        saver.take_over("w", "bob", 60)
        saver.force_release("w", operator="ops")
        run = saver.begin_run("nobody-waits", "w", 60, run_id="r4")
        assert saver.end_run("nobody-waits", run.token, "run_completed", {})  # no NOTIFY
        got = [n.payload for n in listener.notifies(timeout=1)]
    assert got == ["t", "u", "v", "w"]
    assert [e.kind for e in saver.events_after("v")][-1] == "run_completed"


def test_a_runs_only_wait_sleeps_through_a_runs_steps_and_wakes_at_its_end(
    open_pg: Any, pg_dsn: str
) -> None:
    """A worker waiting for a thread ("enqueue") waits with a runs-only poller: the run's
    steps do not wake it (each wakes every listener of `lgfs_events`: a watch's wait
    returns at the first), its end does, and the wait returns every event after its
    position. The safety poll (`poll_interval`) is far off."""
    saver = open_pg(poll_interval=30)
    run = saver.begin_run("t", "w", 60, run_id="r1")
    seq, incarnation = saver._event_tail("t")
    returned: dict[str, list[str]] = {}
    pollers = {"runs": saver._poller(keep=True, runs_only=True), "all": saver._poller(keep=True)}

    def wait(name: str) -> None:
        got = pollers[name].wait("t", seq, limit=100, timeout=20, incarnation=incarnation)
        returned[name] = [e.kind for e in got]

    threads = [threading.Thread(target=wait, args=(name,)) for name in pollers]
    for thread in threads:
        thread.start()
    with psycopg.connect(pg_dsn, autocommit=True) as admin:  # both listen, idle
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            listening = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle' "
                "AND query IN ('LISTEN lgfs_runs', 'LISTEN lgfs_events')"
            ).fetchone()
            if listening is not None and listening[0] == 2:
                break
            time.sleep(0.01)
    time.sleep(0.2)  # each read the log after it listened
    put(saver, "t", token=run.token, source="update", step=1)
    threads[1].join(10)
    assert returned == {"all": ["checkpoint"]}  # woken by the step; the runs-only wait sleeps
    time.sleep(0.3)
    assert "runs" not in returned
    assert saver.end_run("t", run.token, "run_completed", {})
    threads[0].join(10)
    assert returned["runs"] == ["checkpoint", "run_completed"]
    for poller in pollers.values():
        poller.close()


def test_one_waiting_poller_leads_a_thread_and_the_next_once_it_closes(open_pg: Any) -> None:
    """Of the workers waiting for one thread's run to end, one listens and tries (`lead`);
    the others wait for it asleep, each up to its pause, and the next leads once it
    closes (it got the thread, gave up, or died: the server frees its lock)."""
    saver = open_pg()
    first, second, third = (saver._poller(keep=True, runs_only=True) for _ in range(3))
    try:
        assert first.lead("t", 1.0)
        assert first.lead("t", 0.0)  # held: no statement
        began = time.monotonic()
        assert not second.lead("t", 0.3)
        assert 0.25 <= time.monotonic() - began < 5
        assert second.lead("u", 0.3)  # another thread has a lead of its own
        stop = threading.Event()
        stop.set()
        began = time.monotonic()
        assert not third.lead("t", 10, stop=stop)  # stopped: at once
        assert time.monotonic() - began < 1
        closer = threading.Timer(0.2, first.close)
        closer.start()
        began = time.monotonic()
        assert second.lead("t", 10)  # woken by the lock's release, not a poll
        assert 0.15 <= time.monotonic() - began < 5
        closer.join()
        # Closed while it waits for the lock (from another thread): the wait ends
        # within a slice, and its session, and any lock it got, go with it.
        assert third.lead("v", 1.0)  # nobody holds "v"
        closer = threading.Timer(0.2, third.close)
        closer.start()
        began = time.monotonic()
        assert not third.lead("t", 10)  # second leads "t"; third is closed meanwhile
        assert time.monotonic() - began < 5
        closer.join()
        assert third._conn is None  # dropped: no session holds "v" any more
        assert second.lead("v", 1.0)
    finally:
        for poller in (first, second, third):
            poller.close()


def test_a_follower_waits_for_the_lead_past_its_pause_and_listens_once_it_leads(
    open_pg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An "enqueue" head that another waiter leads does not try the claim at every pause.

    It waits for the lead up to `runqueue._FOLLOW` (the leader tries at every
    run's end; trying too, 8 processes on one thread were refused 0.8 times
    per run more), and listens as soon as it leads, however late in its pause.
    """
    monkeypatch.setattr(runqueue, "_FOLLOW", 0.6)
    with open_pg() as store:
        store.claim("t", "other", 30)
        leader = store._poller(keep=True, runs_only=True)
        assert leader.lead("t", 1.0)
        place = runqueue.Place(("x", "t"), 60, None)  # first pause: 5-10 ms
        try:
            place.look(store._event_tail("t"))
            began = time.monotonic()
            place.wait_release(store)  # led throughout: waits 0.3-0.6 s, then would try
            waited = time.monotonic() - began
            assert 0.3 <= waited < 5
            assert "t" not in place._poller._led  # type: ignore[union-attr]

            poller = place._poller
            assert poller is not None
            waits: list[float] = []
            wait = poller.wait

            def counted(*args: Any, **kwargs: Any) -> Any:
                waits.append(time.monotonic())
                return wait(*args, **kwargs)

            poller.wait = counted  # type: ignore[method-assign]
            monkeypatch.setattr(runqueue, "_FOLLOW", 10.0)  # the lead comes first, however late
            # Timed from before the timer starts: the lead is given up 0.15 s
            # after that, so the wait (once it leads) begins no sooner.
            began = time.monotonic()
            threading.Timer(0.15, leader.close).start()
            place.wait_release(store)  # leads at 0.15 s, past its pause: listens for another
            assert "t" in poller._led
            assert len(waits) == 1 and waits[0] - began >= 0.15
        finally:
            place.leave()
            leader.close()


async def test_a_wait_after_the_kept_listeners_died_opens_a_new_one(
    open_pg: Any, pg_dsn: str
) -> None:
    """Listeners the server ended while kept (a restart ends them all) are dropped
    together: the next wait, sync or async, opens a live one, and fails on none of them."""
    saver = open_pg(clock=None)
    claim = saver.claim("t", "w", 60)
    saver.append_events("t", claim.token, [("e", {})])
    listeners = saver._engine.listeners
    sync_pollers = [saver._poller(keep=True) for _ in range(listeners.KEEP)]
    async_pollers = [saver._poller(keep=True) for _ in range(listeners.KEEP)]
    for poller in sync_pollers:  # all at once: a connection each
        assert poller.lead("t" + str(id(poller)), 1.0)
    for poller in async_pollers:
        assert await poller.alead("t" + str(id(poller)), 1.0)
    for poller in sync_pollers:
        poller.close()
    for poller in async_pollers:
        await poller.aclose()
    assert len(_kept_sync(listeners)) == len(_kept_async(listeners)) == listeners.KEEP == 2
    pids = [c.info.backend_pid for c in _kept_sync(listeners)]
    pids += [c.info.backend_pid for _, c in _kept_async(listeners)]
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        for pid in pids:
            while _alive(admin, pid):
                time.sleep(0.01)
    assert [e.seq for e in saver.wait_events("t", 0, timeout=5)] == [1]
    assert [e.seq for e in await saver.await_events("t", 0, timeout=5)] == [1]
    kept = [c.info.backend_pid for c in _kept_sync(listeners)]
    kept += [c.info.backend_pid for _, c in _kept_async(listeners)]
    assert len(kept) == 2 and not set(kept) & set(pids)


def test_a_lead_interrupted_mid_statement_drops_its_connection_and_the_lock(
    open_pg: Any, pg_dsn: str
) -> None:
    """Ctrl-C in `lead` (here: right after the lock was had): the connection is
    closed, never given back to the store holding the lock; another waiter leads at once."""
    saver = open_pg(clock=None)
    poller = saver._poller(keep=True, runs_only=True)
    conn = poller._connection()
    real = conn.execute

    def interrupted(query: Any, *args: Any, **kwargs: Any) -> Any:
        result = real(query, *args, **kwargs)
        if query == sql.LEAD:
            raise KeyboardInterrupt
        return result

    conn.execute = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        poller.lead("t", 1.0)
    poller.close()
    assert conn.closed and not _kept_sync(saver._engine.listeners)
    with psycopg.connect(pg_dsn, autocommit=True) as other:
        other.execute("SET lock_timeout = '5s'")
        other.execute(sql.LEAD, {"thread_id": "t"})  # free


async def test_async_waits_reuse_their_loops_listener_given_back_clean(
    open_pg: Any, pg_dsn: str
) -> None:
    """The async twin: `await_events`, `awatch` and an async "enqueue" waiter give their
    loop's listener back (listening to nothing, no `lead` lock) for the next async wait
    on that loop; a connection of another loop is never used."""
    saver = open_pg(clock=None)
    claim = saver.claim("t", "w", 60)
    saver.append_events("t", claim.token, [("e", {})])
    listeners = saver._engine.listeners

    def kept() -> int:
        (pair,) = _kept_async(listeners)
        return int(pair[1].info.backend_pid)

    assert [e.seq for e in await saver.await_events("t", 0, timeout=5)] == [1]
    pid = kept()
    for _ in range(3):
        assert [e.seq for e in await saver.await_events("t", 0, timeout=5)] == [1]
        assert kept() == pid
    async with saver.awatch("t") as watch:
        assert (await watch.__anext__()).seq == 1
        assert watch._poller._aconn.info.backend_pid == pid
    assert kept() == pid

    place = runqueue.Place(("x", "t"), 60, asyncio.get_running_loop())
    place._poller = saver._poller(keep=True, runs_only=True)
    assert await place._poller.alead("t", 1.0)
    await place.aleave()
    assert kept() == pid
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        listening = "SELECT query FROM pg_stat_activity WHERE pid = %s"
        assert admin.execute(listening, (pid,)).fetchone() == (sql.UNLEAD_ALL,)
        admin.execute("SET lock_timeout = '5s'")
        admin.execute(sql.LEAD, {"thread_id": "t"})  # free at once

    # Another loop (another thread's) opens its own; this loop's stays kept.
    other = await asyncio.to_thread(lambda: asyncio.run(saver.await_events("t", 0, timeout=5)))
    assert [e.seq for e in other] == [1]
    owners = {c.info.backend_pid: loop for loop, c in _kept_async(listeners)}
    assert len(owners) == 2 and owners[pid] is asyncio.get_running_loop()


def test_a_saver_dropped_unclosed_closes_the_listener_it_kept(pg_dsn: str) -> None:
    """A saver on the caller's connection is often never closed: dropped, it
    closes the listener it kept (quietly: no ResourceWarning, no backend left)."""
    import gc

    from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

    with (
        psycopg.connect(pg_dsn, autocommit=True) as conn,
        psycopg.connect(pg_dsn, autocommit=True) as admin,
    ):
        saver = FencedPostgresSaver(conn)
        saver.setup()
        assert saver.wait_events("t", 0, timeout=0.01) == []
        (kept,) = _kept_sync(saver._engine.listeners)
        pid = kept.info.backend_pid
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del saver, kept
            gc.collect()
        assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
        deadline = time.monotonic() + 10
        while _alive(admin, pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(admin, pid)


async def test_an_async_waiter_leads_on_its_own_loops_connection(open_pg: Any) -> None:
    """`alead` is `lead` for an async waiter, and cancelling it ends its wait at once."""
    saver = open_pg()
    first, second = (saver._poller(keep=True, runs_only=True) for _ in range(2))
    try:
        assert await first.alead("t", 1.0)
        assert not await second.alead("t", 0.3)
        waiting = asyncio.create_task(second.alead("t", 30))
        await asyncio.sleep(0.2)
        waiting.cancel()
        began = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert time.monotonic() - began < 1
        first.close()
        assert await second.alead("t", 10)
    finally:
        first.close()
        second.close()


async def test_await_events_wakes_on_notify_and_cancels_at_once(open_pg: Any) -> None:
    """The async wait wakes for a commit made meanwhile; cancelling it ends it promptly."""
    saver = open_pg(clock=None, poll_interval=10)
    waiting = asyncio.create_task(saver.await_events("t", 0, timeout=30))
    await asyncio.sleep(0.3)
    started = time.monotonic()
    await asyncio.to_thread(put, saver, "t", source="update", step=1)
    got = await asyncio.wait_for(waiting, 10)
    assert [e.kind for e in got] == ["checkpoint"]
    assert time.monotonic() - started < 5  # not the 10 s safety poll
    idle = asyncio.create_task(saver.await_events("t", 1, timeout=30))
    await asyncio.sleep(0.2)
    idle.cancel()
    started = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await idle
    assert time.monotonic() - started < 1


def test_compact_events_raises_the_floor_as_on_sqlite(open_pg: Any, tmp_path: Path) -> None:
    """compact_events removes events below the floor; reading from below it is ReplayUnavailable.

    The same calls give the same answers on both stores.
    """
    from langgraph_fenced_sqlite import FencedSqliteSaver

    def scenario(saver: Any) -> list[Any]:
        claim = saver.claim("t", "w", 60)
        saver.append_events("t", claim.token, [("k", {"i": i}) for i in range(5)])
        out: list[Any] = [saver.compact_events("t", 4), saver.compact_events("t", 2)]
        out += [saver.compact_events("t", 10**6), saver.compact_events("nobody", 3)]
        with pytest.raises(ReplayUnavailable) as below:
            saver.events_after("t", 2)
        out += [below.value.floor, saver.events_after("t", 5)]
        with pytest.raises(InvalidArgument, match="before_seq"):
            saver.compact_events("t", 0)
        with pytest.raises(InvalidArgument, match="incarnation"):
            saver.compact_events("t", 1, incarnation=0)
        # Another incarnation's position changes nothing in the new one.
        saver.delete_thread("t")
        again = saver.claim("t", "w", 60)
        saver.append_events("t", again.token, [("k", {})])
        out += [saver.compact_events("t", 3, incarnation=1)]
        out += [[e.kind for e in saver.events_after("t", 0)]]
        return out

    with FencedSqliteSaver(str(tmp_path / "t.db")) as lite:
        expected = scenario(lite)
    # 5 events are seqs 1-5: the floor stops at the next seq, 6.
    assert expected == [4, 4, 6, 1, 6, [], 1, ["k"]]
    assert scenario(open_pg()) == expected


def test_a_database_from_before_the_floor_migrates_to_it(open_pg: Any, pg_dsn: str) -> None:
    """setup() on a database of schema 4 (before the floor) adds it; nothing is lost."""
    previous = 4  # the schema version before migration 4 (the floor) ran
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.MIGRATIONS[0])
        for v in range(1, previous):
            conn.execute(sql.MIGRATIONS[v])
            conn.execute(sql.SET_VERSION, (v + 1,))
        conn.execute(
            "INSERT INTO lgfs_threads (thread_id, next_seq) VALUES ('t', 2);"
            "INSERT INTO lgfs_events (thread_id, seq, kind, data, ts, checksum) "
            "VALUES ('t', 1, 'k', '{}', 0, 0)"
        )
    saver = open_pg()  # runs setup()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        versions = [r[0] for r in conn.execute("SELECT v FROM lgfs_migrations ORDER BY v")]
        assert versions == list(range(2, sql.SCHEMA_VERSION + 1))
        assert conn.execute("SELECT floor FROM lgfs_threads").fetchall() == [(1,)]
        assert conn.execute("SELECT count(*) FROM lgfs_events").fetchone() == (1,)
    assert saver.compact_events("t", 2) == 2
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM lgfs_events").fetchone() == (0,)


def test_a_watch_sees_another_processs_commits_once_in_order_and_close_ends_it(
    open_pg: Any, pg_dsn: str, tmp_path: Any
) -> None:
    """watch() on PostgreSQL: every event of another process's commits, once, in order;
    close() from another thread ends the blocked iteration."""
    saver = open_pg(clock=None)
    watch = saver.watch("t")
    seen: list[int] = []
    consumer = threading.Thread(target=lambda: seen.extend(e.seq for e in watch))
    consumer.start()
    flag = str(tmp_path / "go")
    args = {"dsn": pg_dsn, "thread": "t", "flag": flag, "n": 40}
    [(code, out, err)] = run_together([pg_child("append_events", args)], flag)
    assert code == 0, err
    written = json.loads(out)
    assert written == list(range(1, 41))
    deadline = time.monotonic() + 30
    while watch.last_seq < 40 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert consumer.is_alive(), "the watch ended on its own"
    watch.close()
    consumer.join(timeout=10)
    assert not consumer.is_alive(), "close() did not end the blocked iteration"
    assert seen == written


def test_closing_the_store_ends_its_watches_and_a_recreated_thread_is_replay_unavailable(
    open_pg: Any,
) -> None:
    """Closing the store ends a blocked watch; a watch across delete_thread raises."""
    saver = open_pg(clock=None)
    claim = saver.claim("t", "w", 60)
    saver.append_events("t", claim.token, [("e", {})])
    watch = saver.watch("t")
    assert next(watch).seq == 1
    saver.delete_thread("t")
    again = saver.claim("t", "w", 60)
    saver.append_events("t", again.token, [("e", {}), ("e", {})])
    with pytest.raises(ReplayUnavailable):
        next(watch)
    blocked = saver.watch("t", 2, incarnation=2)
    ended = threading.Event()
    consumer = threading.Thread(target=lambda: (list(blocked), ended.set()))
    consumer.start()
    time.sleep(0.3)
    assert not ended.is_set(), "the watch returned with nothing to return"
    saver.close()
    consumer.join(timeout=10)
    assert ended.is_set(), "closing the store did not end its watch"


async def test_awatch_sees_commits_and_aclose_ends_it(open_pg: Any) -> None:
    """awatch() delivers each event once, in order; aclose() from another task ends it."""
    saver = open_pg(clock=None)
    claim = saver.claim("t", "w", 60)
    watch = saver.awatch("t")
    seen: list[int] = []

    async def consume() -> None:
        async for event in watch:
            seen.append(event.seq)

    task = asyncio.ensure_future(consume())
    for i in range(5):
        await saver.aappend_events("t", claim.token, [("e", {"i": i})])
    deadline = time.monotonic() + 30
    while len(seen) < 5 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert not task.done()
    await watch.aclose()
    await asyncio.wait_for(task, 10)
    assert seen == [1, 2, 3, 4, 5]


def _kept_sync(listeners: Any) -> list[Any]:
    """The sync listener connections a store keeps (`IdleListeners`)."""
    return [conn for loop, conn in listeners._idle if loop is None]


def _kept_async(listeners: Any) -> list[tuple[Any, Any]]:
    """The async ones, each with its event loop."""
    return [(loop, conn) for loop, conn in listeners._idle if loop is not None]


def _alive(admin: Any, pid: int) -> bool:
    return bool(
        admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0]
    )


def test_a_watch_listens_on_one_connection_for_its_life_and_survives_losing_it(
    open_pg: Any, pg_dsn: str
) -> None:
    """One listener backend per watch, not one per wait (a fork and a login each, before).

    Between waits it does not listen (each wait LISTENs, then UNLISTENs), so
    notifications nobody reads never hold back the server's queue.

    A listener the server ended between two waits is replaced by the next
    wait, which re-reads the table: the event committed meanwhile arrives.
    `close()` gives the listener back to the store (for its next wait);
    closing the store closes it.
    """
    saver = open_pg(clock=None)
    claim = saver.claim("t", "w", 60)
    watch = saver.watch("t")
    pids = set()
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        for i in range(5):
            saver.append_events("t", claim.token, [("e", {"i": i})])
            assert next(watch).seq == i + 1
            pids.add(watch._poller._conn.info.backend_pid)
        assert len(pids) == 1, pids
        (pid,) = pids
        assert _alive(admin, pid)
        # Between waits it does not listen: nothing it would not read piles up.
        last = "SELECT query FROM pg_stat_activity WHERE pid = %s"
        assert admin.execute(last, (pid,)).fetchone() == (sql.UNLISTEN,)
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        later = threading.Timer(0.5, lambda: saver.append_events("t", claim.token, [("e", {})]))
        later.start()
        assert next(watch).seq == 6  # waited on the lost listener, then on a new one
        later.join()
        new = watch._poller._conn.info.backend_pid
        assert new != pid and _alive(admin, new)
        watch.close()
        assert _alive(admin, new)  # kept by the store, idle
        saver.close()
        deadline = time.monotonic() + 10
        while _alive(admin, new) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(admin, new), "the store's close() left the listener open"


def test_waits_reuse_one_listener_given_back_clean_and_the_stores_close_closes_it(
    open_pg: Any, pg_dsn: str
) -> None:
    """Each `wait_events` call, watch and "enqueue" waiter once opened a connection of its own
    (a fork and a login: 2.9 ms, 3.5 ms of server CPU); one given back is used by the next.

    Given back, it listens to nothing and holds no `lead` lock (another
    process's waiter leads at once); one the server ended meanwhile is
    replaced; the store's close closes what it kept.
    """
    saver = open_pg(clock=None)
    claim = saver.claim("t", "w", 60)
    saver.append_events("t", claim.token, [("e", {})])
    listeners = saver._engine.listeners
    with psycopg.connect(pg_dsn, autocommit=True) as admin:

        def kept() -> int:
            (conn,) = _kept_sync(listeners)
            return int(conn.info.backend_pid)

        assert [e.seq for e in saver.wait_events("t", 0, timeout=5)] == [1]
        pid = kept()
        for _ in range(3):
            assert [e.seq for e in saver.wait_events("t", 0, timeout=5)] == [1]
            assert kept() == pid  # the same backend each time
        # Given back listening to nothing (a NOTIFY does not reach it) and
        # holding no lock: neither the thread's listen key (`sql.HEAR`,
        # dropped last) nor any other.
        listening = "SELECT query FROM pg_stat_activity WHERE pid = %s"
        assert admin.execute(listening, (pid,)).fetchone() == (sql.UNLEAD_ALL,)
        held = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s"
        assert admin.execute(held, (pid,)).fetchone() == (0,)
        admin.execute("NOTIFY lgfs_events, 't'")
        (conn,) = _kept_sync(listeners)
        assert list(conn.notifies(timeout=0.2)) == []

        # A waiter that led a thread gives its listener back without the lock.
        poller = saver._poller(keep=True, runs_only=True)
        assert poller.lead("t", 1.0)
        assert poller._conn.info.backend_pid == pid  # type: ignore[union-attr]
        other = psycopg.connect(pg_dsn, autocommit=True)
        try:
            other.execute("SET lock_timeout = '50ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                other.execute(sql.LEAD, {"thread_id": "t"})
            poller.close()
            assert kept() == pid
            other.execute("SET lock_timeout = '5s'")
            other.execute(sql.LEAD, {"thread_id": "t"})  # free at once
        finally:
            other.close()

        # Ended by the server while kept: the next wait opens another.
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        while _alive(admin, pid):
            time.sleep(0.01)
        assert [e.seq for e in saver.wait_events("t", 0, timeout=5)] == [1]
        new = kept()
        assert new != pid
        saver.close()
        assert not _kept_sync(listeners)
        deadline = time.monotonic() + 10
        while _alive(admin, new) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(admin, new), "the store's close() left the listener open"


async def test_an_awatch_listens_on_one_connection_for_its_life(open_pg: Any, pg_dsn: str) -> None:
    saver = open_pg(clock=None)
    claim = saver.claim("t", "w", 60)
    watch = saver.awatch("t")
    pids = set()
    for i in range(5):
        await saver.aappend_events("t", claim.token, [("e", {"i": i})])
        assert (await watch.__anext__()).seq == i + 1
        pids.add(watch._poller._aconn.info.backend_pid)
    assert len(pids) == 1, pids
    (pid,) = pids
    await watch.aclose()
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        assert _alive(admin, pid)  # given back to the store, idle
        saver.close()
        deadline = time.monotonic() + 10
        while _alive(admin, pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(admin, pid), "the store's close() left the listener open"


def test_a_saver_on_a_pool_made_as_langgraph_documents_listens_and_reads(pg_dsn: str) -> None:
    """LangGraph's docs make PostgresSaver's pool with `kwargs={"autocommit": True,
    "row_factory": dict_row}`: a waiter's own connection still opens, in autocommit, and
    reads tuples (it once passed `autocommit` twice)."""
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    with ConnectionPool(pg_dsn, min_size=1, max_size=2, kwargs=kwargs) as pool:
        saver = FencedPostgresSaver(pool)
        saver.setup()
        claim = saver.claim("t", "w", 60)
        (seq,) = saver.append_events("t", claim.token, [("note", {"n": 1})])
        # Nothing after `seq` yet: the waiter listens on a connection of its own.
        later = threading.Timer(0.2, saver.append_events, ("t", claim.token, [("note", {})]))
        later.start()
        events = saver.wait_events("t", seq, timeout=5)
        later.join()
        assert [(e.seq, e.kind) for e in events] == [(seq + 1, "note")]
        saver.close()


def _in_transaction(pg_dsn: str) -> tuple[Any, Any]:
    """A saver on a connection whose caller holds a transaction open around its calls."""
    from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

    conn = psycopg.connect(pg_dsn)
    return conn, FencedPostgresSaver(conn)


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_waiter_arriving_while_a_commit_that_heard_nobody_is_in_flight_reads_it(
    open_pg: Any, pg_dsn: str, api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit notifies only if a waiter holds the thread's listen key (`sql.HEAR`).

    One that found nobody holds the key until it commits: a waiter arriving
    meanwhile waits for that commit before it listens and reads, so it
    reads the commit (no NOTIFY needed). The safety poll is 30 s away here,
    and the waiter waits for the key up to 10 s: a loaded machine's delay
    before the commit below must not make it go on without.
    """
    from langgraph_fenced_sqlite.postgres import watch

    monkeypatch.setattr(watch, "HEAR_TIMEOUT", "10s")
    saver = open_pg(poll_interval=30)
    claim = saver.claim("t", "w", 60)
    (seq,) = saver.append_events("t", claim.token, [("before", {})])
    conn, writer = _in_transaction(pg_dsn)
    box: dict[str, Any] = {}
    try:
        with conn.transaction():
            writer.append_events("t", claim.token, [("in flight", {})])  # heard nobody
            if api == "sync":
                waiter = threading.Thread(
                    target=lambda: box.setdefault("got", saver.wait_events("t", seq, timeout=20))
                )
            else:
                waiter = threading.Thread(
                    target=lambda: box.setdefault(
                        "got", asyncio.run(saver.await_events("t", seq, timeout=20))
                    )
                )
            waiter.start()
            # The waiter waits for the listen key, held by the commit in flight.
            with psycopg.connect(pg_dsn, autocommit=True) as admin:
                waiting = (
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                )
                until(lambda: admin.execute(waiting).fetchone()[0] == 1)
            started = time.monotonic()
        waiter.join(20)
        assert time.monotonic() - started < 5  # not the 30 s safety poll
    finally:
        conn.close()
    assert [(e.seq, e.kind) for e in box["got"]] == [(seq + 1, "in flight")]


def test_a_waiter_that_cannot_get_the_listen_key_in_time_still_finds_commits_by_polling(
    open_pg: Any, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller's transaction held open past `HEAR_TIMEOUT`: the waiter goes on without the
    key, and its safety poll finds what that transaction commits (it sent no NOTIFY)."""
    from langgraph_fenced_sqlite.postgres import watch

    monkeypatch.setattr(watch, "HEAR_TIMEOUT", "100ms")
    saver = open_pg(poll_interval=0.3)
    claim = saver.claim("t", "w", 60)
    (seq,) = saver.append_events("t", claim.token, [("before", {})])
    conn, writer = _in_transaction(pg_dsn)
    box: dict[str, Any] = {}
    try:
        with conn.transaction():
            writer.append_events("t", claim.token, [("late", {})])
            waiter = threading.Thread(
                target=lambda: box.setdefault("got", saver.wait_events("t", seq, timeout=20))
            )
            waiter.start()
            time.sleep(0.5)  # past HEAR_TIMEOUT: it listens without the key
            assert waiter.is_alive()
        waiter.join(20)
    finally:
        conn.close()
    assert [(e.seq, e.kind) for e in box["got"]] == [(seq + 1, "late")]


def test_a_waiter_is_woken_when_its_listener_has_another_search_path(
    pg_server: Any,
) -> None:
    """A store whose schema comes from a `SET search_path` (not in its conninfo): its waiters'
    own connections are on the default schema, yet its commits notify them (the listen key
    names the thread, not the schema)."""
    import secrets

    from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

    schema = f"t_{secrets.token_hex(8)}"
    conn = psycopg.connect(pg_server.dsn, autocommit=True)
    try:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"SET search_path TO {schema}")
        saver = FencedPostgresSaver(conn, poll_interval=30)
        saver.setup()
        claim = saver.claim("t", "w", 60)
        (seq,) = saver.append_events("t", claim.token, [("before", {})])
        later = threading.Timer(0.3, saver.append_events, ("t", claim.token, [("after", {})]))
        started = time.monotonic()
        later.start()
        got = saver.wait_events("t", seq, timeout=20)
        later.join()
        assert [e.kind for e in got] == ["after"]
        assert time.monotonic() - started < 5  # woken, not the 30 s safety poll
        saver.close()
    finally:
        conn.close()


def test_a_wait_cancelled_while_it_waits_for_the_listen_key_drops_its_connection(
    open_pg: Any, pg_dsn: str
) -> None:
    """Cancelled mid-statement, the listener is in doubt: closed, never given back or reused."""
    saver = open_pg(poll_interval=30)
    claim = saver.claim("t", "w", 60)
    conn, writer = _in_transaction(pg_dsn)
    try:
        with conn.transaction():
            writer.append_events("t", claim.token, [("in flight", {})])  # holds the key

            async def run() -> Any:
                poller = saver._poller(keep=True)
                task = asyncio.ensure_future(poller.await_("t", 0, limit=10, timeout=20))
                with psycopg.connect(pg_dsn, autocommit=True) as admin:
                    waiting = (
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                    )
                    while admin.execute(waiting).fetchone()[0] != 1:
                        await asyncio.sleep(0.005)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                return poller

            poller = asyncio.run(run())
        assert poller._aconn is None  # dropped: not kept for a next wait
        assert _kept_async(saver._engine.listeners) == []
    finally:
        conn.close()
