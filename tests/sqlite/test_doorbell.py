"""The doorbell: a ring from another process wakes a listener; no ring, no wake.

The bell is only a hint (docs/semantics.md §5: watchers must still see every commit),
so what matters is that a listener opened before a ring always wakes for it,
across processes, and that a place where no bell can be had says so (None)
instead of pretending to listen.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from langgraph_fenced_sqlite.sqlite.doorbell import Listener, Ringer, bell_path


def test_ring_from_another_process_wakes_a_listener(tmp_path) -> None:
    db = str(tmp_path / "x.db")
    listener = Listener.open(db)
    assert listener is not None
    try:
        assert listener.wait(0.05) is False  # nothing rang yet
        code = (
            "import sys; from langgraph_fenced_sqlite.sqlite.doorbell import Ringer; "
            "r = Ringer(sys.argv[1]); assert not r.mute; r.ring(); r.close()"
        )
        subprocess.run([sys.executable, "-c", code, db], check=True, timeout=60)
        # The ring landed before this wait began: listening started at open.
        assert listener.wait(30.0) is True
        assert listener.wait(0.05) is False  # drained: one ring, one wake
    finally:
        listener.close()


def test_a_waiting_listener_wakes_when_another_thread_rings(tmp_path) -> None:
    db = str(tmp_path / "x.db")
    listener, ringer = Listener.open(db), Ringer(db)
    assert listener is not None
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(listener.wait(30.0)))
    waiter.start()
    ringer.ring()
    waiter.join(timeout=60)
    assert woke == [True]
    ringer.close()
    listener.close()
    listener.close()  # twice is fine
    assert listener.wait(0.01) is False


def test_a_replaced_bell_is_listened_to_again(tmp_path) -> None:
    db = str(tmp_path / "x.db")
    listener = Listener.open(db)
    assert listener is not None
    try:
        os.unlink(bell_path(db))  # an operator removes it: the old watch wakes once
        assert listener.wait(30.0) is True
        ringer = Ringer(db)  # a writer recreates it and rings
        ringer.ring()
        assert listener.wait(30.0) is True
        ringer.close()
    finally:
        listener.close()


def test_no_bell_where_it_cannot_be_created(tmp_path) -> None:
    missing = str(tmp_path / "no-such-dir" / "x.db")
    assert Listener.open(missing) is None
    ringer = Ringer(missing)
    assert ringer.mute
    ringer.ring()  # a mute bell is a no-op, never an error


# --- one hub per process -----------------------------------------------------------------

BOUND = 30.0


def _fds_to(target: str) -> int:
    """Count this process's descriptors whose target is `target` (a path or an anon inode)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == target:
                count += 1
        except OSError:
            continue
    return count


def test_one_inotify_descriptor_serves_every_listener(tmp_path) -> None:
    """More listeners than a user may hold inotify instances (128) all hear their own bell.

    Each used to own an instance: the 129th found none, and closing each
    cost the kernel a grace period on the path of every wait that ended.
    """
    before = _fds_to("anon_inode:inotify")
    listeners = [Listener.open(str(tmp_path / f"x{i}.db")) for i in range(200)]
    try:
        assert all(listener is not None for listener in listeners)
        assert _fds_to("anon_inode:inotify") <= before + 1
        Ringer(str(tmp_path / "x150.db")).ring()
        assert listeners[150].wait(BOUND) is True  # type: ignore[union-attr]
        assert listeners[149].wait(0) is False  # type: ignore[union-attr]
    finally:
        for listener in listeners:
            if listener is not None:
                listener.close()


def test_close_from_another_thread_ends_a_blocked_wait(tmp_path) -> None:
    """close() wakes a wait blocked in another thread at once; it returns False."""
    listener = Listener.open(str(tmp_path / "x.db"))
    assert listener is not None
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(listener.wait(3600)))
    waiter.start()
    while not listener._bell.cond._waiters:  # type: ignore[attr-defined]
        threading.Event().wait(0.001)  # until it waits (not a timing assertion)
    listener.close()
    waiter.join(BOUND)
    assert woke == [False]


@pytest.mark.subprocess
async def test_await_ring_wakes_for_another_process_and_ends_on_close(tmp_path) -> None:
    """await_ring returns True for a ring from another process, False once closed."""
    import asyncio

    db = str(tmp_path / "x.db")
    listener = Listener.open(db)
    assert listener is not None
    code = (
        "import sys; from langgraph_fenced_sqlite.sqlite.doorbell import Ringer; "
        "r = Ringer(sys.argv[1]); r.ring(); r.close()"
    )
    waiting = asyncio.ensure_future(listener.await_ring(3600))
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, db)
    assert await proc.wait() == 0
    assert await asyncio.wait_for(waiting, BOUND) is True
    waiting = asyncio.ensure_future(listener.await_ring(3600))
    await asyncio.sleep(0)  # it waits now
    await asyncio.to_thread(listener.close)  # from another thread
    assert await asyncio.wait_for(waiting, BOUND) is False


def test_a_forked_child_listens_with_a_hub_of_its_own(tmp_path) -> None:
    """After fork, the child hears rings on a hub of its own; the parent's keeps working."""
    db = str(tmp_path / "x.db")
    parent = Listener.open(db)  # the parent's hub is running
    assert parent is not None
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(ready_r)
            child = Listener.open(db)
            os.write(ready_w, b"x")
            code = 0 if child is not None and child.wait(BOUND) else 1
        finally:
            os._exit(code)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"x"
        ringer = Ringer(db)
        ringer.ring()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert parent.wait(BOUND) is True  # the child's exit closed nothing of ours
        ringer.ring()
        assert parent.wait(BOUND) is True
        ringer.close()
    finally:
        os.close(ready_r)
        parent.close()


# --- the store rings -----------------------------------------------------------------------


@pytest.mark.subprocess
def test_each_commit_of_a_store_in_another_process_rings(tmp_path) -> None:
    """A listener wakes for each of several commits another process makes, one at a time."""
    db = str(tmp_path / "x.db")
    from langgraph_fenced_sqlite import FencedSqliteSaver

    FencedSqliteSaver(db).close()
    listener = Listener.open(db)
    assert listener is not None
    code = (
        "import sys\n"
        "from langgraph_fenced_sqlite import FencedSqliteSaver\n"
        "with FencedSqliteSaver(sys.argv[1]) as s:\n"
        "    claim = s.claim('t', 'w', 60)\n"
        "    for i in range(5):\n"
        "        sys.stdin.readline()\n"
        "        s.append_events('t', claim.token, [('e', {})])\n"
        "        print('committed', flush=True)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, db], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert listener.wait(BOUND) is True  # the claim
        for _ in range(5):
            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert proc.stdout.readline() == "committed\n"
            assert listener.wait(BOUND) is True
        proc.stdin.close()
        assert proc.wait(BOUND) == 0
    finally:
        proc.stdout.close()
        listener.close()


def test_the_bell_is_made_by_the_first_commit_and_closed_with_the_store(tmp_path) -> None:
    """A store that only reads (or refuses its file) makes no bell; close() closes its own."""
    from langgraph_fenced_sqlite import FencedSqliteSaver, UnsupportedFormat

    db = str(tmp_path / "x.db")
    with FencedSqliteSaver(db) as saver:
        setup_rang = os.path.exists(bell_path(db))  # creating the schema is a commit
    os.unlink(bell_path(db))
    with FencedSqliteSaver(db) as saver:
        saver.events_after("t", 0)
        assert not os.path.exists(bell_path(db))  # reads ring nothing
        saver.claim("t", "w", 60)
        assert os.path.exists(bell_path(db))
        assert _fds_to(bell_path(db)) == 1
    assert _fds_to(bell_path(db)) == 0
    assert setup_rang

    other = tmp_path / "other.db"
    other.write_bytes(b"not a database" * 100)
    with pytest.raises(UnsupportedFormat):
        FencedSqliteSaver(str(other))
    assert not os.path.exists(bell_path(str(other)))


def test_a_bell_nobody_listens_to_is_dropped_and_comes_back(tmp_path) -> None:
    """A listener opened after the last one closed (and its bell was dropped) still hears."""
    from langgraph_fenced_sqlite.sqlite import doorbell

    db = str(tmp_path / "x.db")
    first = Listener.open(db)
    assert first is not None
    hub = first._hub
    first.close()
    key = bell_path(os.path.realpath(db))
    ringer = Ringer(db)
    for _ in range(int(BOUND / 0.05)):  # rings wake the hub, which drops it once due
        if key not in hub._bells:
            break
        ringer.ring()
        threading.Event().wait(0.05)
    assert key not in hub._bells
    assert all(key != bell.key for bells in hub._by_wd.values() for bell in bells)
    again = Listener.open(db)
    assert again is not None
    ringer.ring()
    assert again.wait(BOUND) is True
    again.close()
    ringer.close()
    assert doorbell._the_hub() is hub  # one hub throughout
