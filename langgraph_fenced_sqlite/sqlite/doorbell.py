"""A doorbell beside the database: rung after every commit, waited on by watchers.

Invariant: the bell only ever says "look again"; it carries no data, and a
watcher never trusts it alone. SQLite cannot notify other connections, and
file signals on the `-wal` file fire before a commit is visible (and miss
commits), so a writer rings a sidecar file (`<db>-bell`) *after* its COMMIT
returned, and a watcher listens *before* it reads: a commit that lands
between the watcher's read and its wait has rung a bell the watcher is
already listening to, so the wait returns at once. Where the bell cannot be
used (not Linux, no inotify, a read-only directory) `Listener.open` returns
None and the watcher falls back to polling; it keeps a slow safety poll of
`PRAGMA data_version` in any case, so no commit from any process (or from a
writer that does not ring) is ever missed, only seen later.

One inotify instance serves the whole process, read by one daemon thread
(the hub): closing an instance costs the kernel a grace period (10-20 ms
measured here, on the path of every wait that ends) and a user may hold only
128 of them (`fs.inotify.max_user_instances`). A `Listener` is a handle on
one bell that owns no descriptor: it counts the rings the hub heard since it
was opened, so `close()` from any thread, task or event loop never races a
wait for a descriptor.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import ctypes.util
import os
import select
import struct
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["Listener", "Ringer", "bell_path"]

# inotify(7) constants (linux/inotify.h).
_IN_MODIFY = 0x00000002
_IN_ATTRIB = 0x00000004
_IN_DELETE_SELF = 0x00000400
_IN_MOVE_SELF = 0x00000800
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_IN_CLOEXEC = os.O_CLOEXEC
# A ring is a write (MODIFY); the others mean the bell was deleted, moved or
# replaced: wake everyone (look again) and watch the file now at the path.
_MASK = _IN_MODIFY | _IN_ATTRIB | _IN_DELETE_SELF | _IN_MOVE_SELF
_MOVED = _IN_ATTRIB | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_IGNORED
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then `len` bytes of name)
# A bell nobody listens to stays watched a little while, so that a watch's
# next wait (or the next `wait_events` on the file) finds it ready instead of
# adding and removing a watch per event; not longer, since each ring of a
# watched bell wakes the hub; and no more than a few.
_IDLE_BELLS = 8
_IDLE_SECONDS = 2.0


def bell_path(db_path: str) -> str:
    """Return the doorbell file of the database at `db_path`."""
    return db_path + "-bell"


class Ringer:
    """The writer's side: one cheap write to the bell file after each commit."""

    def __init__(self, db_path: str) -> None:
        """Open (creating if needed) the bell of `db_path`; a bell that cannot be opened is mute."""
        self._fd: int | None = None
        if not hasattr(os, "pwrite"):  # not a POSIX system: nobody could listen anyway
            return
        with contextlib.suppress(OSError):
            self._fd = os.open(bell_path(db_path), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)

    @property
    def mute(self) -> bool:
        """Whether ringing does nothing (the bell could not be opened)."""
        return self._fd is None

    def ring(self) -> None:
        """Signal every listener that a commit landed (one `pwrite` of one byte)."""
        if self._fd is not None:
            try:
                os.pwrite(self._fd, b"\x01", 0)
            except OSError:
                # A failed ring costs only latency: listeners' safety poll
                # still sees the commit. Never fail a commit that is durable.
                self.close()

    def close(self) -> None:
        """Close the bell's file descriptor; twice is fine."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


def _create(path: str) -> bool:
    """Create the bell if no writer has yet; return whether it exists now."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        return True
    except OSError:
        return os.path.exists(path)  # a read-only place: only if a writer made it


class _Bell:
    """One bell file as the hub watches it: how often it rang, and who waits."""

    __slots__ = ("cond", "key", "rings", "users", "wakers", "wds")

    def __init__(self, key: str) -> None:
        self.key = key
        # Held by the hub thread and by waiters for a few instructions only
        # (never across a wait or a system call): an event loop may take it.
        self.cond = threading.Condition(threading.Lock())
        self.rings = 0
        self.users = 0  # open listeners (changed under the hub's lock)
        self.wds: set[int] = set()
        self.wakers: set[Callable[[], None]] = set()  # async waits: thread-safe callbacks

    def ring(self) -> None:
        with self.cond:
            self.rings += 1
            self.cond.notify_all()
            wakers = list(self.wakers)
        for wake in wakers:
            wake()


class _Hub:
    """The process's one inotify instance, the thread that reads it, and its bells."""

    def __init__(self, fd: int) -> None:
        assert _LIBC is not None
        self._libc = _LIBC
        self.pid = os.getpid()
        self.fd = fd
        self.alive = True
        # Guards the maps below. Held for at most one inotify system call.
        self._lock = threading.Lock()
        self._bells: dict[str, _Bell] = {}
        self._by_wd: dict[int, set[_Bell]] = {}
        self._idle: collections.OrderedDict[str, tuple[_Bell, float]] = collections.OrderedDict()
        thread = threading.Thread(target=self._run, name="lgfs-doorbell", daemon=True)
        thread.start()

    def subscribe(self, path: str) -> _Bell | None:
        """Return the bell at `path`, watched from now on; None if it cannot be."""
        if not _create(path):
            return None
        key = os.path.realpath(path)  # one bell per file, however it is spelled
        with self._lock:
            bell = self._bells.get(key)
            if bell is None or not bell.wds:  # new, or its file went and could not be watched
                wd = self._libc.inotify_add_watch(self.fd, os.fsencode(key), _MASK)
                if wd < 0:
                    return None
                if bell is None:
                    bell = self._bells[key] = _Bell(key)
                self._add(bell, wd)
            self._idle.pop(key, None)
            bell.users += 1
            return bell

    def unsubscribe(self, bell: _Bell) -> None:
        """Forget one listener of `bell`; keep the bell watched a while if it was the last."""
        with self._lock:
            bell.users -= 1
            if bell.users > 0 or self._bells.get(bell.key) is not bell:
                return
            self._idle[bell.key] = (bell, time.monotonic())
            while len(self._idle) > _IDLE_BELLS:
                self._forget(self._idle.popitem(last=False)[1][0])

    def _expire(self) -> float | None:
        """Forget bells idle for `_IDLE_SECONDS`; return ms until the next is due (None: none)."""
        with self._lock:
            now = time.monotonic()
            while self._idle:
                bell, since = next(iter(self._idle.values()))
                if now - since < _IDLE_SECONDS:
                    return (since + _IDLE_SECONDS - now) * 1000.0
                self._forget(bell)
        return None

    def _add(self, bell: _Bell, wd: int) -> None:
        bell.wds.add(wd)
        self._by_wd.setdefault(wd, set()).add(bell)

    def _forget(self, bell: _Bell) -> None:
        # With the lock held.
        self._bells.pop(bell.key, None)
        self._idle.pop(bell.key, None)
        for wd in bell.wds:
            sharing = self._by_wd.get(wd, set())
            sharing.discard(bell)
            if not sharing:
                self._by_wd.pop(wd, None)
                self._libc.inotify_rm_watch(self.fd, wd)
        bell.wds.clear()

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        try:
            while True:
                # Wakes for events, and then drops the idle bells that are
                # due (a bell that never rings again costs nothing meanwhile).
                if not poller.poll(self._expire()):
                    continue
                data = os.read(self.fd, 64 * 1024)
                if not data:
                    break
                self._dispatch(data)
        except OSError:
            pass
        finally:
            # Nothing will ring here any more: wake every listener (they look
            # again, then rely on their safety poll) and let the next
            # `Listener.open` start a new hub.
            self.alive = False
            with self._lock:
                bells = list(self._bells.values())
            for bell in bells:
                bell.ring()

    def _dispatch(self, data: bytes) -> None:
        rung: set[_Bell] = set()
        moved: set[_Bell] = set()
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            offset += _EVENT.size + length
            with self._lock:
                if mask & _IN_Q_OVERFLOW:  # events were lost: every bell may have rung
                    rung.update(self._bells.values())
                    continue
                bells = set(self._by_wd.get(wd, ()))
                if mask & _IN_IGNORED:  # the watch is gone (its inode was deleted)
                    self._by_wd.pop(wd, None)
                    for bell in bells:
                        bell.wds.discard(wd)
            rung |= bells
            if mask & _MOVED:
                moved |= bells
        for bell in moved:
            self._rewatch(bell)
        for bell in rung:
            bell.ring()

    def _rewatch(self, bell: _Bell) -> None:
        # The bell was deleted, moved or replaced (an operator's `rm`, a
        # restore): watch the file now at its path too. The old inode keeps
        # its watch while writers still hold it open, and still rings.
        # A bell nobody listens to is dropped instead: re-creating it could
        # race a deletion of its whole directory.
        with self._lock:
            if bell.users == 0:
                self._forget(bell)
                return
        if not _create(bell.key):
            return
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(bell.key), _MASK)
        if wd < 0:
            return
        with self._lock:
            if self._bells.get(bell.key) is bell:
                self._add(bell, wd)
            elif wd not in self._by_wd:
                self._libc.inotify_rm_watch(self.fd, wd)


_HUB: _Hub | None = None
_HUB_LOCK = threading.Lock()


def _the_hub() -> _Hub | None:
    """Return this process's hub, starting it if needed; None where inotify cannot be had."""
    global _HUB
    if _LIBC is None:
        return None
    hub = _HUB
    if hub is not None and hub.alive and hub.pid == os.getpid():
        return hub
    with _HUB_LOCK:
        hub = _HUB
        if hub is None or not hub.alive or hub.pid != os.getpid():
            fd = _LIBC.inotify_init1(_IN_CLOEXEC)
            if fd < 0:
                return None
            try:
                hub = _HUB = _Hub(fd)
            except RuntimeError:  # no thread can be started (interpreter shutting down)
                os.close(fd)
                return None
        return hub


def _after_fork_in_child() -> None:
    # The hub's thread did not survive the fork, and its descriptor is the
    # parent's instance (reading it would steal the parent's events).
    global _HUB, _HUB_LOCK
    hub, _HUB, _HUB_LOCK = _HUB, None, threading.Lock()
    if hub is not None:
        with contextlib.suppress(OSError):
            os.close(hub.fd)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Listener:
    """The watcher's side: a handle on one bell that wakes its waits when the bell rings.

    Listening starts at `open` and counts every ring from then on, so a ring
    that lands before a wait begins makes that wait return at once. `wait`
    (blocking) and `await_ring` (on an event loop, which it never blocks) may
    run in any thread; `close()` may come from any thread at any time and
    ends the waits in progress.
    """

    def __init__(self, hub: _Hub, bell: _Bell) -> None:
        """Wrap a subscription to `bell` (use `Listener.open`)."""
        self._hub, self._bell = hub, bell
        with bell.cond:
            self._seen = bell.rings
        self._closed = False
        self._waker: Callable[[], None] | None = None

    @classmethod
    def open(cls, db_path: str) -> Listener | None:
        """Start listening to the bell of `db_path`, or return None where no bell can be had.

        Listening starts here, before the caller's first read, so a commit
        made after this returns is never slept through. Creates the bell if
        no writer has yet (touches the file system: call it off the loop).
        """
        hub = _the_hub()
        if hub is None:
            return None
        bell = hub.subscribe(bell_path(db_path))
        return None if bell is None else cls(hub, bell)

    @property
    def closed(self) -> bool:
        """Whether `close()` was called (every wait then returns False at once)."""
        return self._closed

    def _take(self) -> bool:
        # With the bell's lock held: did it ring since the last look?
        rang = self._bell.rings != self._seen and not self._closed
        self._seen = self._bell.rings
        return rang

    def wait(self, timeout: float) -> bool:
        """Block until the bell rings, `timeout` seconds pass or `close()` is called.

        Returns:
            True if it rang since the last wait (look again), False on
            timeout or once closed.
        """
        bell = self._bell
        deadline = time.monotonic() + max(0.0, timeout)
        with bell.cond:
            while not self._closed and bell.rings == self._seen:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                bell.cond.wait(remaining)
            return self._take()

    async def await_ring(self, timeout: float) -> bool:
        """Async twin of `wait`: the loop sleeps until the hub wakes it; nothing blocks it."""
        loop = asyncio.get_running_loop()
        woke: asyncio.Future[None] = loop.create_future()

        def wake() -> None:  # called from the hub's thread, or by close()
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(_resolve, woke)

        bell = self._bell
        with bell.cond:
            if self._closed or bell.rings != self._seen:
                return self._take()
            bell.wakers.add(wake)
            self._waker = wake
        timer = loop.call_later(max(0.0, timeout), _resolve, woke)
        try:
            await woke
        finally:
            timer.cancel()
            with bell.cond:
                bell.wakers.discard(wake)
                self._waker = None
        with bell.cond:
            return self._take()

    def close(self) -> None:
        """Stop listening and end every wait in progress at once; twice is fine."""
        bell = self._bell
        with bell.cond:
            if self._closed:
                return
            self._closed = True
            bell.cond.notify_all()
            waker = self._waker
        if waker is not None:
            waker()
        self._hub.unsubscribe(bell)
