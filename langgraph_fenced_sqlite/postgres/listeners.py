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

import psycopg
from psycopg.pq import TransactionStatus

__all__ = ["IdleListeners"]


class IdleListeners:
    """Up to `KEEP` idle listener connections of one store (sync, and async per event loop)."""

    # A waiter mostly waits alone, then another does: two of each cover that
    # (and a watch alongside) without holding many idle backends per process.
    KEEP = 2

    def __init__(self) -> None:
        """Keep none yet."""
        self._lock = threading.Lock()
        self._idle: list[psycopg.Connection[Any]] = []
        # Async ones, each with the loop it was opened on (usable there only).
        self._aidle: list[tuple[asyncio.AbstractEventLoop, psycopg.AsyncConnection[Any]]] = []
        self._closed = False
        self._pid = os.getpid()
        self._finalizer = weakref.finalize(
            self, _close_all, self._lock, self._idle, self._aidle, self._pid
        )

    def take(self) -> psycopg.Connection[Any] | None:
        """Return a kept connection (the caller's alone now), or None if none is kept."""
        if os.getpid() != self._pid:
            return None
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE:
                    return conn
                conn.close()
        return None

    def give(self, conn: psycopg.Connection[Any]) -> None:
        """Keep `conn` (idle, listening to nothing, holding no lock), or close it."""
        with self._lock:
            keep = not (self._closed or conn.closed) and len(self._idle) < self.KEEP
            if keep and os.getpid() == self._pid:
                self._idle.append(conn)
                return
        conn.close()

    def take_async(self, loop: asyncio.AbstractEventLoop) -> psycopg.AsyncConnection[Any] | None:
        """`take` for async waits: a connection opened on `loop`, or None."""
        if os.getpid() != self._pid:
            return None
        with self._lock:
            for i in range(len(self._aidle) - 1, -1, -1):
                owner, conn = self._aidle[i]
                if owner is not loop and not owner.is_closed():
                    continue
                del self._aidle[i]
                if owner is loop and not conn.closed:
                    if conn.info.transaction_status == TransactionStatus.IDLE:
                        return conn
                conn.pgconn.finish()  # its loop is gone, or it is: its socket, at once
        return None

    def give_async(
        self, loop: asyncio.AbstractEventLoop, conn: psycopg.AsyncConnection[Any]
    ) -> None:
        """`give` for a connection opened on `loop`."""
        with self._lock:
            keep = not (self._closed or conn.closed) and len(self._aidle) < self.KEEP
            if keep and os.getpid() == self._pid:
                self._aidle.append((loop, conn))
                return
        conn.pgconn.finish()

    def discard(self) -> None:
        """Close the kept connections, and keep what is given back from now on.

        For a kept one found dead: the others likely are too (a server
        restart ends them all), and only I/O would tell.
        """
        _close_all(self._lock, self._idle, self._aidle, self._pid)

    def close(self) -> None:
        """Close the kept connections, and keep none from now on."""
        with self._lock:
            self._closed = True
        self._finalizer()


def _close_all(
    lock: threading.Lock,
    idle: list[psycopg.Connection[Any]],
    aidle: list[tuple[asyncio.AbstractEventLoop, psycopg.AsyncConnection[Any]]],
    pid: int,
) -> None:
    # `IdleListeners.close()`, or its store dropped unclosed, or exit. An
    # async connection is closed without awaiting (nothing uses it): its
    # socket, at once, as `PgEventPoller` closes one.
    with lock:
        conns, aconns = idle[:], [conn for _, conn in aidle]
        idle.clear()
        aidle.clear()
    if os.getpid() == pid:
        for conn in conns:
            conn.close()
        for aconn in aconns:
            aconn.pgconn.finish()
