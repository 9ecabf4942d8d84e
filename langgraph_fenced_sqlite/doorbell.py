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
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import select
import sys

__all__ = ["Listener", "Ringer", "bell_path"]

# inotify(7) constants (linux/inotify.h).
_IN_MODIFY = 0x00000002
_IN_ATTRIB = 0x00000004
_IN_CLOSE_WRITE = 0x00000008
_IN_DELETE_SELF = 0x00000400
_IN_MOVE_SELF = 0x00000800
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_MASK = _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_DELETE_SELF | _IN_MOVE_SELF


def bell_path(db_path: str) -> str:
    """Return the doorbell file of the database at `db_path`."""
    return db_path + "-bell"


class Ringer:
    """The writer's side: one cheap write to the bell file after each commit."""

    def __init__(self, db_path: str) -> None:
        """Open (creating if needed) the bell of `db_path`; a bell that cannot be opened is mute."""
        self._fd: int | None = None
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
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


class Listener:
    """The watcher's side: an inotify descriptor that becomes readable when the bell rings."""

    def __init__(self, fd: int, path: str) -> None:
        """Wrap an inotify descriptor already watching `path` (use `Listener.open`)."""
        self._fd: int | None = fd
        self._path = path
        self._inode = _inode(path)

    @classmethod
    def open(cls, db_path: str) -> Listener | None:
        """Start listening to the bell of `db_path`, or return None where no bell can be had.

        Listening starts here, before the caller's first read, so a commit
        made after this returns is never slept through.
        """
        if _LIBC is None:
            return None
        path = bell_path(db_path)
        try:
            # Create the bell if no writer has yet (a read-only place: None).
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        except OSError:
            if not os.path.exists(path):
                return None
        fd = _LIBC.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return None
        if _LIBC.inotify_add_watch(fd, os.fsencode(path), _MASK) < 0:
            os.close(fd)
            return None
        return cls(fd, path)

    def fileno(self) -> int:
        """Return the descriptor to wait on (readable once the bell rang)."""
        if self._fd is None:
            raise ValueError("listener is closed")
        return self._fd

    def wait(self, timeout: float) -> bool:
        """Block until the bell rings or `timeout` seconds pass; drain what rang.

        Returns:
            True if it rang (look again), False on timeout.
        """
        if self._fd is None:
            return False
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        rang = bool(poller.poll(max(0.0, timeout) * 1000.0))
        if rang:
            self.drain()
            self._rearm()
        return rang

    def _rearm(self) -> None:
        # A bell deleted or replaced (an operator's `rm`, a restore) leaves the
        # watch on a dead inode: watch the file now at the path instead.
        inode = _inode(self._path)
        if inode == self._inode or self._fd is None or _LIBC is None:
            return
        with contextlib.suppress(OSError):
            os.close(os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        _LIBC.inotify_add_watch(self._fd, os.fsencode(self._path), _MASK)
        self._inode = _inode(self._path)

    def drain(self) -> None:
        """Consume the pending notifications (the caller is about to look again)."""
        if self._fd is None:
            return
        while True:
            try:
                if not os.read(self._fd, 4096):
                    return
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                return

    def close(self) -> None:
        """Stop listening and close the descriptor; twice is fine."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
