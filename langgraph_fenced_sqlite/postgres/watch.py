"""Waiting for a PostgreSQL store's events: `wait_events`, `await_events` and watches.

Invariant: one wait implementation, `PgEventPoller` (a `watch.Poller`):
hold the thread's listen key (`sql.HEAR`: commits of the thread notify only
while someone holds it), listen, then read, then wait, re-reading the table on every
notification naming the thread and on every safety poll (`core/waiting.py`'s `wait_plan`,
the one wait loop, through `drive`/`adrive`), on a listener
connection of its own, so a waiter never holds the store's connection or a
pool's. The poller keeps that connection from one wait to the next: a
watch following a busy thread is one backend for its whole life, not a new
one (a fork and a login on the server) per batch of events. Each wait
LISTENs and ends with UNLISTEN, so between waits the connection receives
nothing and never holds back the server's notification queue, however long
the consumer takes. `close()` gives it back to the store
(`listeners.IdleListeners`: listening to nothing, holding no `lead` lock),
so the next wait, watch or "enqueue" waiter of the process does not open
another; a wait in progress closes it on its way out, the store's close
closes what it kept, and a watch dropped unclosed frees it with the poller. A listener
found broken (the server restarted, the backend was terminated) is
replaced and the table re-read, so no commit is missed. A watch's `close()` (from any
thread) or its store's ends a wait within `SLICE` seconds: notifications
are awaited in slices of at most that, between which the wait looks whether
it was stopped (psycopg cannot interrupt a blocked `notifies()` from
another thread). A cancelled `await_` ends at once.

A hot standby cannot `LISTEN` (and no NOTIFY reaches it: notifications are
not replicated): there the wait goes on without it, finding the commits its
replay brings by the safety poll alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from ..core import waiting
from ..core.events import Event
from ..core.waiting import Stopped
from ..errors import StoreError
from . import sql

__all__ = ["SLICE", "PgEventPoller"]

SLICE = 0.25
"""The longest a stopped wait goes on (seconds): a waiting watch wakes this often."""

# How long a waiter waits for a commit in flight before it listens without
# the listen key (`sql.HEAR`): a slice, so a stopped wait (a watch's close)
# is never held longer than while it waits for notifications.
HEAR_TIMEOUT = f"{int(SLICE * 1000)}ms"


def _lock_timeout(seconds: float) -> dict[str, str]:
    """`sql.LEAD_TIMEOUT`'s parameters: wait for the lock `seconds` (at least 1 ms)."""
    return {"timeout": f"{max(1, int(seconds * 1000))}ms"}


class PgEventPoller:
    """`watch.Poller` for `FencedPostgresSaver`: LISTEN/NOTIFY, ended by `close()`."""

    def __init__(self, saver: Any, *, keep: bool = True, runs_only: bool = False) -> None:
        """Wait on `saver` (a `FencedPostgresSaver`); nothing is opened yet.

        Args:
            keep: Keep the listener between waits (a watch). False (one
                wait): the wait does not stop listening as it ends;
                `close()`, right after, does as it gives the listener back.
            runs_only: Wake only for the commits that end a run (channel
                `lgfs_runs`), and for the safety poll: what a worker waiting
                for a thread needs, asleep through the run's steps. A wait
                still returns every event after its position when it reads.
        """
        self._saver = saver
        self._keep = keep
        self._runs_only = runs_only
        self._listen_sql, self._unlisten_sql = (
            (sql.LISTEN_RUNS, sql.UNLISTEN_RUNS) if runs_only else (sql.LISTEN, sql.UNLISTEN)
        )
        self._closed = False
        # The listening connection, kept between waits (sync waits use one,
        # async ones the other, on the loop that opened it). `_lock` is held
        # by a wait for its whole length, so `close()` closes only a
        # connection no wait is using; a wait closes it on its way out.
        self._conn: psycopg.Connection[Any] | None = None
        self._aconn: psycopg.AsyncConnection[Any] | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._listens = self._alistens = False
        # Threads whose `sql.LEAD` lock its connection holds (`lead`; a
        # poller serves sync waits or async ones, as a runner's place does).
        self._led: set[str] = set()
        # Threads whose listen key (`sql.HEAR`) its connection holds: their
        # commits notify while it does.
        self._heard: set[str] = set()
        self._lock = threading.Lock()

    @property
    def closed(self) -> bool:
        """Whether `close()` was called or the store is closed."""
        return self._closed or bool(self._saver._engine.closed)

    def close(self) -> None:
        """End a wait in progress within `SLICE` s; never waits for one.

        With no wait in progress, a sync listener goes back to its store for
        the next wait (`listeners.IdleListeners`), first made to listen to
        nothing and hold no `lead` lock (one round trip); one that cannot
        is closed. A wait in progress closes its listener on its way out.
        """
        self._closed = True
        if self._lock.acquire(blocking=False):
            try:
                self._give_back()
            finally:
                self._lock.release()

    def _give_back(self) -> None:
        # With `_lock` held, no wait in progress. A kept poller's waits
        # stopped listening as they ended; a one-wait poller's did not.
        conn, engine = self._conn, self._saver._engine
        if conn is None or conn.closed or engine.closed:
            self._drop()
            return
        self._conn = None
        try:
            if self._listens and not self._keep:
                conn.execute(self._unlisten_sql)
            if self._led or self._heard:
                conn.execute(sql.UNLEAD_ALL)
        except psycopg.Error:
            conn.close()  # its session's locks go with it
        else:
            engine.listeners.give(conn)
        self._drop()

    async def aclose(self) -> None:
        """`close()` for an async caller: its loop's listener goes back to the store as well.

        Made to listen to nothing and hold no `lead` lock first (awaited);
        one that cannot, or a caller cancelled meanwhile, closes it.
        """
        self._closed = True
        if not self._lock.acquire(blocking=False):
            return  # a wait in progress closes its listener on its way out
        try:
            aconn, loop, engine = self._aconn, self._aloop, self._saver._engine
            if aconn is not None and loop is asyncio.get_running_loop() and not engine.closed:
                self._aconn = self._aloop = None
                try:
                    if self._alistens and not self._keep:
                        await aconn.execute(self._unlisten_sql)
                    if self._led or self._heard:
                        await aconn.execute(sql.UNLEAD_ALL)
                except psycopg.Error:
                    aconn.pgconn.finish()  # its session's locks go with it
                except BaseException:
                    aconn.pgconn.finish()  # cancelled mid-statement
                    raise
                else:
                    engine.listeners.give(aconn, loop)
            self._give_back()
        finally:
            self._lock.release()

    def __del__(self) -> None:
        # A watch dropped unclosed: its listener goes with it, quietly.
        with contextlib.suppress(Exception):
            self._drop()

    def _drop(self) -> None:
        # With `_lock` held. An async connection is closed without awaiting
        # (no wait uses it): its socket, at once.
        conn, self._conn = self._conn, None
        aconn, self._aconn, self._aloop = self._aconn, None, None
        self._led.clear()  # its session's locks go with it
        self._heard.clear()
        if conn is not None:
            conn.close()
        if aconn is not None:
            aconn.pgconn.finish()

    def _stopped(self, stop: threading.Event | asyncio.Event | None) -> bool:
        return self.closed or (stop is not None and stop.is_set())

    def _slices(
        self, seconds: float, stop: threading.Event | asyncio.Event | None
    ) -> Iterator[float]:
        """The timeouts, at most `SLICE` each, that make up a wait of `seconds`.

        Between two it looks whether the wait was stopped (`Stopped`); it
        ends when the time is up.
        """
        end = time.monotonic() + seconds
        while not self._stopped(stop):
            left = end - time.monotonic()
            if left <= 0:
                return
            yield min(left, SLICE)
        raise Stopped

    def _error(self, exc: psycopg.Error) -> StoreError:
        return StoreError("wait_events", self._saver._engine.where, message=str(exc))

    def _plan(self, thread_id: str, timeout: float) -> Any:
        return waiting.wait_plan(thread_id, float(timeout), self._saver._poll_interval)

    def lead(self, thread_id: str, seconds: float, stop: threading.Event | None = None) -> bool:
        """Become the one waiter (of every process) that tries `thread_id` when its run ends.

        Takes `sql.LEAD`'s session lock on the kept connection (not
        listening between waits), waiting for it up to `seconds` in slices
        of at most `SLICE`; holds it until the poller closes (the waiter got
        the thread, gave up, or its process died: the server frees it). The
        others wait for it asleep in the server, not woken by every run's
        end to race for the claim. Anything unexpected (a broken connection,
        a standby) answers True: the waiter tries as every waiter did.

        Returns:
            Whether this poller leads; False when `seconds` passed or it was
            stopped first.
        """
        if thread_id in self._led:
            return True
        with self._lock:
            try:
                conn = self._connection()
                for piece in self._slices(seconds, stop):
                    conn.execute(sql.LEAD_TIMEOUT, _lock_timeout(piece))
                    try:
                        conn.execute(sql.LEAD, {"thread_id": thread_id})
                    except pg_errors.LockNotAvailable:
                        continue
                    self._led.add(thread_id)
                    return True
                return False
            except Stopped:
                return False
            except psycopg.Error:
                self._drop()
                return True
            except BaseException:
                # Interrupted mid-statement: whether the lock was had is unknown,
                # so the connection goes (and any lock with its session), never
                # back to the store.
                self._drop()
                raise
            finally:
                if self.closed:  # closed meanwhile (its close() could not drop it): the lock goes
                    self._drop()

    async def alead(
        self, thread_id: str, seconds: float, stop: asyncio.Event | None = None
    ) -> bool:
        """Async twin of `lead`, on the running loop's connection."""
        if thread_id in self._led:
            return True
        if not self._lock.acquire(blocking=False):
            return True  # another wait uses the poller: try as every waiter did
        try:
            conn = await self._aconnection()
            for piece in self._slices(seconds, stop):
                await conn.execute(sql.LEAD_TIMEOUT, _lock_timeout(piece))
                try:
                    await conn.execute(sql.LEAD, {"thread_id": thread_id})
                except pg_errors.LockNotAvailable:
                    continue
                self._led.add(thread_id)
                return True
            return False
        except Stopped:
            return False
        except psycopg.Error:
            self._drop()
            return True
        except BaseException:
            self._drop()  # cancelled mid-wait: the connection may be mid-operation
            raise
        finally:
            if self.closed:
                self._drop()
            self._lock.release()

    def _connection(self) -> psycopg.Connection[Any]:
        """The kept connection, or a new one (with `_lock` held)."""
        conn = self._conn
        if conn is None or conn.closed:
            self._led.clear()  # a lock held by a closed session is gone
            self._heard.clear()
            engine = self._saver._engine
            conn = engine.listeners.take()
            if conn is None:
                conninfo, kwargs = engine.listener_params()
                conn = psycopg.connect(conninfo, autocommit=True, **kwargs)
            self._conn = conn
        return conn

    async def _aconnection(self) -> psycopg.AsyncConnection[Any]:
        """`_connection` for async waits, on a connection of the running loop's."""
        loop = asyncio.get_running_loop()
        conn = self._aconn
        if conn is not None and (conn.closed or self._aloop is not loop):
            self._aconn = None  # broken, or another loop's: not usable here
            conn.pgconn.finish()
            conn = None
        if conn is None:
            self._led.clear()
            self._heard.clear()
            engine = self._saver._engine
            conn = engine.listeners.take(loop)
            if conn is None:
                conninfo, kwargs = engine.listener_params()
                conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **kwargs)
            self._aconn, self._aloop = conn, loop
        return conn

    def _listening(self, thread_id: str) -> psycopg.Connection[Any]:
        """The kept connection (or a new one), listening (with `_lock` held).

        First it holds `thread_id`'s listen key (`sql.HEAR`), so every
        commit of the thread from then on notifies; the wait's first read
        comes after both.

        Each wait listens anew, and a wait's end stops listening (`_unlisten`):
        a connection kept between waits receives nothing while nobody reads it,
        so it never holds back the server's notification queue. A connection
        that died between waits fails its LISTEN: the store's kept ones are
        dropped too (a restart ends them all), and one new one is opened.

        Returns:
            The connection; `_listens` says whether it listens (not on a standby).
        """
        for last in (False, True):
            conn = self._connection()
            try:
                self._hear(conn, thread_id)
                conn.execute(self._listen_sql)
                self._listens = True
                return conn
            except pg_errors.ReadOnlySqlTransaction:
                self._listens = False  # a hot standby: each wait polls
                return conn
            except psycopg.OperationalError:
                if last or not conn.closed:
                    raise
                self._saver._engine.listeners.discard()
        raise AssertionError("unreachable")

    def _hear(self, conn: psycopg.Connection[Any], thread_id: str) -> None:
        """Hold `thread_id`'s listen key on `conn` (`sql.HEAR`), unless it does already.

        It waits for a commit of the thread in flight that found nobody
        listening (it holds the key until it commits), then the read sees
        that commit. Past `HEAR_TIMEOUT` (a transaction of the caller's held
        open) it goes on without: its commits are found by the safety poll.
        """
        if thread_id in self._heard:
            return
        try:
            conn.execute(sql.HEAR, {"thread_id": thread_id, "timeout": HEAR_TIMEOUT})
        except pg_errors.LockNotAvailable:
            return
        self._heard.add(thread_id)

    def _unlisten(self) -> None:
        conn = self._conn
        if conn is None or conn.closed or not self._listens:
            return
        try:
            conn.execute(self._unlisten_sql)
        except psycopg.Error:
            self._drop()

    async def _alistening(self, thread_id: str) -> psycopg.AsyncConnection[Any]:
        """`_listening` for async waits, on a connection of the running loop's."""
        for last in (False, True):
            conn = await self._aconnection()
            try:
                await self._ahear(conn, thread_id)
                await conn.execute(self._listen_sql)
                self._alistens = True
                return conn
            except pg_errors.ReadOnlySqlTransaction:
                self._alistens = False
                return conn
            except psycopg.OperationalError:
                if last or not conn.closed:
                    raise
                self._saver._engine.listeners.discard()
        raise AssertionError("unreachable")

    async def _ahear(self, conn: psycopg.AsyncConnection[Any], thread_id: str) -> None:
        """Async twin of `_hear`."""
        if thread_id in self._heard:
            return
        try:
            await conn.execute(sql.HEAR, {"thread_id": thread_id, "timeout": HEAR_TIMEOUT})
        except pg_errors.LockNotAvailable:
            return
        self._heard.add(thread_id)

    async def _aunlisten(self) -> None:
        conn = self._aconn
        if conn is None or conn.closed or not self._alistens:
            return
        try:
            await conn.execute(self._unlisten_sql)
        except psycopg.Error:
            self._drop()

    def wait(
        self,
        thread_id: str,
        after_seq: int,
        *,
        limit: int,
        timeout: float,
        stop: threading.Event | None = None,
        incarnation: int | None = None,
    ) -> list[Event]:
        """Return events after `after_seq`, waiting up to `timeout` s; [] once stopped."""
        if self._stopped(stop):
            return []
        with self._lock:
            try:
                conn = self._listening(thread_id)
            except psycopg.Error as exc:
                self._drop()
                raise self._error(exc) from exc
            except BaseException:
                self._drop()  # interrupted mid-statement (waiting for the listen key)
                raise

            def notifies(seconds: float) -> set[str] | None:
                nonlocal conn
                for piece in self._slices(seconds, stop):
                    try:
                        got = {n.payload for n in conn.notifies(timeout=piece, stop_after=1)}
                    except psycopg.OperationalError:
                        if not conn.closed:
                            raise
                        # The listener broke: listen anew, and re-read what
                        # may have committed while nobody listened.
                        conn = self._listening(thread_id)
                        return {thread_id}
                    if got:
                        return got
                return None

            def read() -> list[Event]:
                return self._saver._events_after(thread_id, after_seq, limit, incarnation)

            try:
                return waiting.drive(self._plan(thread_id, timeout), read, notifies)
            except Stopped:
                return []
            except psycopg.Error as exc:
                self._drop()  # in whatever state it is: the next wait opens another
                raise self._error(exc) from exc
            finally:
                if self.closed:  # this poller's close(), or the store's
                    self._drop()
                elif self._keep:
                    self._unlisten()

    async def await_(
        self,
        thread_id: str,
        after_seq: int,
        *,
        limit: int,
        timeout: float,
        stop: asyncio.Event | None = None,
        incarnation: int | None = None,
    ) -> list[Event]:
        """Async twin of `wait`; cancelling the awaiting task ends it at once."""
        if self._stopped(stop):
            return []
        # One wait at a time, and never blocking the loop: a second
        # concurrent wait on one poller (not something a watch does) gets a
        # connection of its own for its length.
        if not self._lock.acquire(blocking=False):
            other = PgEventPoller(self._saver, keep=False, runs_only=self._runs_only)
            try:
                return await other.await_(
                    thread_id,
                    after_seq,
                    limit=limit,
                    timeout=timeout,
                    stop=stop,
                    incarnation=incarnation,
                )
            finally:
                await other.aclose()
        try:
            try:
                conn = await self._alistening(thread_id)
            except psycopg.Error as exc:
                self._drop()
                raise self._error(exc) from exc
            except BaseException:
                self._drop()  # cancelled mid-statement (waiting for the listen key)
                raise

            async def notifies(seconds: float) -> set[str] | None:
                nonlocal conn
                for piece in self._slices(seconds, stop):
                    try:
                        got = {n.payload async for n in conn.notifies(timeout=piece, stop_after=1)}
                    except psycopg.OperationalError:
                        if not conn.closed:
                            raise
                        conn = await self._alistening(thread_id)  # listen anew, then re-read
                        return {thread_id}
                    if got:
                        return got
                return None

            def read() -> Any:
                saver = self._saver
                return saver._engine.arun(
                    saver._events_after, thread_id, after_seq, limit, incarnation
                )

            try:
                result = await waiting.adrive(self._plan(thread_id, timeout), read, notifies)
            except Stopped:
                result = []
            except psycopg.Error as exc:
                self._drop()
                raise self._error(exc) from exc
            except BaseException:
                # Cancelled mid-wait: the connection may be mid-operation.
                self._drop()
                raise
            try:
                if self.closed:  # this poller's close(), or the store's
                    self._drop()
                elif self._keep:
                    await self._aunlisten()
            except BaseException:
                self._drop()  # cancelled while it stopped listening
                raise
            return result
        finally:
            self._lock.release()
