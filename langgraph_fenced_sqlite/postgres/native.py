"""The PostgreSQL store's own async connections: the hot async calls without a thread hop.

Invariant: a native connection is the store's own, opened from the same
parameters as its listeners (`PgConnection.listener_params`), in autocommit,
with the session of the store's connection where our statements could tell
(`sql.SESSION`: the same role, or none is used; the same `search_path`,
timeouts and read-only default, copied). It serves one call at a time, on
the event loop it was opened on, and goes back idle (in no transaction) or
closed: `send.asend_batch` closes one it leaves in doubt. At most `KEEP`
are open per loop; a call that finds none free takes the thread hop, as
every async call did before (measured on loopback: the hop costs about
65 us a call, 13 of them a 5-node `ainvoke`). One that cannot be opened
(the server's connection limit, say) makes the next `RETRY_S` seconds take
the hop. One the server ended while idle (a restart, `pg_terminate_backend`)
is found before use and replaced, so it fails no call. `close()` closes
them, and so do dropping the store unclosed and the interpreter's exit; a
process forked meanwhile uses none of its parent's (their sockets are the
parent's).
"""

from __future__ import annotations

import asyncio
import os
import select
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from . import sql

__all__ = ["NativeConns"]

# A kept connection and the event loop it serves.
_Kept = tuple[asyncio.AbstractEventLoop, "psycopg.AsyncConnection[Any]"]


class NativeConns:
    """The async connections of one store, at most `KEEP` per event loop."""

    # Two cover a call and the next step's write arriving meanwhile; more
    # concurrent calls on one loop take the hop (and the pool behind it).
    KEEP = 2
    RETRY_S = 5.0

    def __init__(
        self,
        params: Callable[[], tuple[str, dict[str, Any]]],
        session: Callable[[], Awaitable[tuple[Any, ...]]],
    ) -> None:
        """Open none yet.

        Args:
            params: Return `(conninfo, kwargs)` that open a connection to the
                store's server (`PgConnection.listener_params`).
            session: Read `sql.SESSION` on the store's own connection.
        """
        self._params = params
        self._session = session
        self._wanted: tuple[Any, ...] | None = None
        self._lock = threading.Lock()
        self._idle: list[_Kept] = []
        self._open: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, int] = (
            weakref.WeakKeyDictionary()
        )
        self._retry_at = 0.0
        self._off = False  # the store's role cannot be had here: never again
        self._closed = False
        self._pid = os.getpid()
        self._finalizer = weakref.finalize(self, _close_all, self._lock, self._idle, self._pid)

    async def take(self, loop: asyncio.AbstractEventLoop) -> psycopg.AsyncConnection[Any] | None:
        """Return an idle connection for `loop`, opening one if fewer than `KEEP` are open.

        None: take the hop (all busy, the store closed, a fork, or no
        connection could be opened lately). The connection is the caller's
        until it is given back (`give`).
        """
        if os.getpid() != self._pid:
            return None
        with self._lock:
            for i in range(len(self._idle) - 1, -1, -1):
                owner, kept = self._idle[i]
                if owner is loop:
                    del self._idle[i]
                    if not _ended(kept):
                        return kept
                    # The server ended it while idle (a restart, an operator's
                    # pg_terminate_backend): closed here, not failed on use.
                    kept.pgconn.finish()
                    self._open[loop] = self._open.get(loop, 1) - 1
                elif owner.is_closed():  # its loop is gone: nobody will use it
                    del self._idle[i]
                    kept.pgconn.finish()
            count = self._open.get(loop, 0)
            if self._closed or self._off or count >= self.KEEP:
                return None
            if time.monotonic() < self._retry_at:
                return None
            self._open[loop] = count + 1
        conn: psycopg.AsyncConnection[Any] | None = None
        try:
            conn = await self._connect()
        finally:
            if conn is None:
                self._forget(loop)
        return conn

    def give(self, loop: asyncio.AbstractEventLoop, conn: psycopg.AsyncConnection[Any]) -> None:
        """Take back `conn` from a call on `loop`: kept if idle, else (or once closed) closed."""
        clean = not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE
        with self._lock:
            if clean and not self._closed and os.getpid() == self._pid:
                self._idle.append((loop, conn))
                return
        self._forget(loop)
        if not conn.closed:
            conn.pgconn.finish()

    def close(self) -> None:
        """Close the idle connections; those in use are closed when given back."""
        with self._lock:
            self._closed = True
        self._finalizer()

    def _forget(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            count = self._open.get(loop, 0)
            if count > 1:
                self._open[loop] = count - 1
            else:
                self._open.pop(loop, None)

    async def _connect(self) -> psycopg.AsyncConnection[Any] | None:
        # A new connection with the store's session; None if there is none to have.
        try:
            if self._wanted is None:
                self._wanted = tuple(await self._session())
            conninfo, kwargs = self._params()
            conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **kwargs)
        except Exception:  # noqa: BLE001 - the hop serves meanwhile, and reports its own errors
            self._retry_at = time.monotonic() + self.RETRY_S
            return None
        try:
            cur = await conn.execute(sql.SESSION)
            have = await cur.fetchone()
            wanted = self._wanted
            if have is None or have[0] != wanted[0]:
                # Another role (the pool's `configure` set one): our
                # statements might see other rows, or none. The hop, always.
                self._off = True
                conn.pgconn.finish()
                return None
            if tuple(have[1:]) != wanted[1:]:
                settings = dict(zip(sql.SESSION_SETTINGS, wanted[1:], strict=True))
                await conn.execute(sql.SET_SESSION, settings)
        except BaseException as exc:
            conn.pgconn.finish()
            if isinstance(exc, Exception):
                self._retry_at = time.monotonic() + self.RETRY_S
                return None
            raise
        return conn


def _ended(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether the server ended idle `conn`: anything to read on it says so.

    An idle native connection listens to nothing and is in no transaction,
    so the server sends it nothing but its last words (FATAL, then EOF).
    One `poll` with no wait: about a microsecond (`select` where there is no
    `poll`: Windows, whose `select` takes a socket of any number).
    """
    fd = conn.pgconn.socket
    if not hasattr(select, "poll"):
        return bool(select.select([fd], [], [], 0)[0])
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _close_all(lock: threading.Lock, idle: list[_Kept], pid: int) -> None:
    # `NativeConns.close()`, or its store dropped unclosed, or exit.
    with lock:
        kept = idle[:]
        idle.clear()
    if os.getpid() != pid:
        return
    for _, conn in kept:
        conn.pgconn.finish()
