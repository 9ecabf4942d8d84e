"""The idle listener connections a PostgreSQL store keeps for its next waiters.

Invariant: a connection in `IdleListeners` is idle and clean: in no
transaction, listening to nothing, holding no session lock
(`PgEventPoller.close`/`aclose` give back only such a one); one taken is the
taker's alone. Opening a connection costs a fork and a login on the server
(measured on loopback: 2.9 ms, with 3.5 ms of the server's CPU and 0.6 ms
of the client's), which every `wait_events` call and every "enqueue"
waiter paid. Async ones are kept with their event loop and used on it
only. At most `KEEP` of each are kept; `close()` closes them, and so does
dropping the store unclosed (a saver on the caller's connection or pool is
often never closed) or the interpreter's exit. A process forked meanwhile
takes none of its parent's (their sockets are the parent's).
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from typing import Any

from psycopg.pq import TransactionStatus

__all__ = ["IdleListeners"]

# A kept connection (a psycopg `Connection`, or an `AsyncConnection`) and the
# event loop whose waits it serves (None: sync waits).
_Kept = tuple["asyncio.AbstractEventLoop | None", Any]


class IdleListeners:
    """Up to `KEEP` idle sync listener connections of one store, and `KEEP` async ones."""

    # A waiter mostly waits alone, then another does: two of each cover that
    # (and a watch alongside) without holding many idle backends per process.
    KEEP = 2

    def __init__(self) -> None:
        """Keep none yet."""
        self._lock = threading.Lock()
        self._idle: list[_Kept] = []
        self._closed = False
        self._pid = os.getpid()
        self._finalizer = weakref.finalize(self, _close_all, self._lock, self._idle, self._pid)

    def take(self, loop: asyncio.AbstractEventLoop | None = None) -> Any:
        """Return a kept connection for sync waits (`loop` None) or async ones on `loop`.

        The connection is the caller's alone now; None if none is kept. A
        kept async one whose loop is closed is closed on the way.
        """
        if os.getpid() != self._pid:
            return None
        with self._lock:
            for i in range(len(self._idle) - 1, -1, -1):
                owner, conn = self._idle[i]
                if owner is not loop and (owner is None or not owner.is_closed()):
                    continue
                del self._idle[i]
                if owner is loop and not conn.closed:
                    if conn.info.transaction_status == TransactionStatus.IDLE:
                        return conn
                _finish(owner, conn)
        return None

    def give(self, conn: Any, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Keep `conn` (idle, listening to nothing, holding no lock) for `loop`'s waits.

        Closes it instead when `KEEP` of its kind are kept, or the store closed.
        """
        with self._lock:
            kept = sum(1 for owner, _ in self._idle if (owner is None) == (loop is None))
            keep = not (self._closed or conn.closed) and kept < self.KEEP
            if keep and os.getpid() == self._pid:
                self._idle.append((loop, conn))
                return
        _finish(loop, conn)

    def discard(self) -> None:
        """Close the kept connections, and keep what is given back from now on.

        For a kept one found dead: the others likely are too (a server
        restart ends them all), and only I/O would tell.
        """
        _close_all(self._lock, self._idle, self._pid)

    def close(self) -> None:
        """Close the kept connections, and keep none from now on."""
        with self._lock:
            self._closed = True
        self._finalizer()


def _finish(loop: asyncio.AbstractEventLoop | None, conn: Any) -> None:
    # An async connection is closed without awaiting (nothing uses it): its
    # socket, at once, as `PgEventPoller` closes one.
    if loop is None:
        conn.close()
    else:
        conn.pgconn.finish()


def _close_all(lock: threading.Lock, idle: list[_Kept], pid: int) -> None:
    # `IdleListeners.close()`/`discard()`, or its store dropped unclosed, or exit.
    with lock:
        kept = idle[:]
        idle.clear()
    if os.getpid() == pid:
        for loop, conn in kept:
            _finish(loop, conn)
