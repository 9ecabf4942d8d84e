"""Waiting for a PostgreSQL store's events: `wait_events`, `await_events` and watches.

Invariant: one wait implementation, `PgEventPoller` (a `watch.Poller`):
listen first, then read, then wait, re-reading the table on every
notification naming the thread and on every safety poll (`events.wait_plan`,
the one wait loop, through `events.drive`/`events.adrive`), on a listener
connection of its own, opened per wait and closed when it returns, so a
waiter never holds the store's connection or a pool's. A watch's `close()`
(from any thread) or its store's ends a wait within `SLICE` seconds:
notifications are awaited in slices of at most that, between which the wait
looks whether it was stopped (psycopg cannot interrupt a blocked
`notifies()` from another thread). A cancelled `await_` ends at once.

A hot standby cannot `LISTEN` (and no NOTIFY reaches it: notifications are
not replicated): there the wait goes on without it, finding the commits its
replay brings by the safety poll alone.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from ..errors import StoreError
from ..events import Event
from . import events, sql

__all__ = ["SLICE", "PgEventPoller"]

SLICE = 0.25
"""The longest a stopped wait goes on (seconds): a waiting watch wakes this often."""


class _Stopped(Exception):
    """The wait was stopped (the watch or the store closed) while it waited."""


class PgEventPoller:
    """`watch.Poller` for `FencedPostgresSaver`: LISTEN/NOTIFY, ended by `close()`."""

    def __init__(self, saver: Any) -> None:
        """Wait on `saver` (a `FencedPostgresSaver`); nothing is opened yet."""
        self._saver = saver
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether `close()` was called or the store is closed."""
        return self._closed or bool(self._saver._engine.closed)

    def close(self) -> None:
        """End a wait in progress within `SLICE` s; never blocks; twice is fine."""
        self._closed = True

    def _stopped(self, stop: threading.Event | asyncio.Event | None) -> bool:
        return self.closed or (stop is not None and stop.is_set())

    def _error(self, exc: psycopg.Error) -> StoreError:
        return StoreError("wait_events", self._saver._engine.where, message=str(exc))

    def _plan(self, thread_id: str, timeout: float) -> Any:
        return events.wait_plan(thread_id, float(timeout), self._saver._poll_interval)

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
        conninfo, kwargs = self._saver._engine.listener_params()
        try:
            conn = psycopg.connect(conninfo, autocommit=True, **kwargs)
        except psycopg.Error as exc:
            raise self._error(exc) from exc

        def notifies(seconds: float) -> set[str] | None:
            end = time.monotonic() + seconds
            while not self._stopped(stop):
                left = end - time.monotonic()
                if left <= 0:
                    return None
                got = {n.payload for n in conn.notifies(timeout=min(left, SLICE), stop_after=1)}
                if got:
                    return got
            raise _Stopped

        def read() -> list[Event]:
            return self._saver._events_after(thread_id, after_seq, limit, incarnation)

        with conn:
            try:
                try:
                    conn.execute(sql.LISTEN)
                except pg_errors.ReadOnlySqlTransaction:
                    pass  # a hot standby: `notifies` only times out, so each wait polls
                return events.drive(self._plan(thread_id, timeout), read, notifies)
            except _Stopped:
                return []
            except psycopg.Error as exc:
                raise self._error(exc) from exc

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
        conninfo, kwargs = self._saver._engine.listener_params()
        try:
            conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **kwargs)
        except psycopg.Error as exc:
            raise self._error(exc) from exc

        async def notifies(seconds: float) -> set[str] | None:
            end = time.monotonic() + seconds
            while not self._stopped(stop):
                left = end - time.monotonic()
                if left <= 0:
                    return None
                got = {
                    n.payload async for n in conn.notifies(timeout=min(left, SLICE), stop_after=1)
                }
                if got:
                    return got
            raise _Stopped

        def read() -> Any:
            saver = self._saver
            return saver._engine.arun(saver._events_after, thread_id, after_seq, limit, incarnation)

        async with conn:
            try:
                try:
                    await conn.execute(sql.LISTEN)
                except pg_errors.ReadOnlySqlTransaction:
                    pass  # a hot standby: `notifies` only times out, so each wait polls
                return await events.adrive(self._plan(thread_id, timeout), read, notifies)
            except _Stopped:
                return []
            except psycopg.Error as exc:
                raise self._error(exc) from exc
