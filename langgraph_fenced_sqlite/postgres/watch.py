"""Waiting for a PostgreSQL store's events on behalf of a watch (`watch.EventWatch`).

Invariant: as `wait_events` (listen first, then read, then wait, re-reading
the table on every notification naming the thread and on every safety poll:
`events.wait_plan`, the one wait loop), on a listener connection of its own,
opened per wait and closed when it returns. A watch's `close()` (from any
thread) or its store's ends a wait within `SLICE` seconds: notifications are
awaited in slices of at most that, between which the wait looks whether it
was stopped. psycopg cannot interrupt a blocked `notifies()` from another
thread, and a cancelled `await_` ends at once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING, Any

import psycopg

from ..errors import StoreError
from ..events import Event
from ..watch import AsyncEventWatch, EventWatch
from . import events, sql

__all__ = ["SLICE", "PgEventPoller", "PgWatchAPI"]

SLICE = 0.25
"""The longest a stopped wait goes on (seconds): an idle watch wakes this often."""


class _Stopped(Exception):
    """The wait was stopped (the watch or the store closed) while it waited."""


class PgEventPoller:
    """`watch.Poller` for `FencedPostgresSaver`: LISTEN/NOTIFY, woken by `close()`."""

    def __init__(self, saver: Any) -> None:
        """Wait on `saver` (a `FencedPostgresSaver`); nothing is opened yet."""
        self._saver = saver
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether `close()` was called or the store is closed."""
        return self._closed or self._saver._engine.closed

    def close(self) -> None:
        """End a wait in progress within `SLICE` s; never blocks; twice is fine."""
        self._closed = True

    def _connect_error(self, exc: psycopg.Error) -> StoreError:
        return StoreError("wait_events", self._saver._engine.where, message=str(exc))

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
        if self.closed or (stop is not None and stop.is_set()):
            return []
        conninfo, kwargs = self._saver._engine.listener_params()
        try:
            conn = psycopg.connect(conninfo, autocommit=True, **kwargs)
        except psycopg.Error as exc:
            raise self._connect_error(exc) from exc

        def notifies(seconds: float) -> set[str] | None:
            end = time.monotonic() + seconds
            while True:
                if self.closed or (stop is not None and stop.is_set()):
                    raise _Stopped
                left = end - time.monotonic()
                if left <= 0:
                    return None
                got = {n.payload for n in conn.notifies(timeout=min(left, SLICE), stop_after=1)}
                if got:
                    return got

        with conn:
            try:
                conn.execute(sql.LISTEN)
                return events.drive(
                    events.wait_plan(thread_id, float(timeout), self._saver._poll_interval),
                    lambda: self._saver.events_after(
                        thread_id, after_seq, limit, incarnation=incarnation
                    ),
                    notifies,
                )
            except _Stopped:
                return []
            except psycopg.Error as exc:
                raise self._connect_error(exc) from exc

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
        if self.closed or (stop is not None and stop.is_set()):
            return []
        conninfo, kwargs = self._saver._engine.listener_params()
        try:
            conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **kwargs)
        except psycopg.Error as exc:
            raise self._connect_error(exc) from exc
        async with conn:
            try:
                await conn.execute(sql.LISTEN)
                plan = events.wait_plan(thread_id, float(timeout), self._saver._poll_interval)
                step = next(plan)
                while True:
                    if step == events.READ:
                        reply: Any = await self._saver.aevents_after(
                            thread_id, after_seq, limit, incarnation=incarnation
                        )
                    else:
                        reply = None
                        end = time.monotonic() + float(step)
                        while reply is None and time.monotonic() < end:
                            if self.closed or (stop is not None and stop.is_set()):
                                return []
                            left = min(end - time.monotonic(), SLICE)
                            got = {
                                n.payload
                                async for n in conn.notifies(timeout=max(left, 0), stop_after=1)
                            }
                            reply = got or None
                    step = plan.send(reply)
            except StopIteration as done:
                return list(done.value)
            except psycopg.Error as exc:
                raise self._connect_error(exc) from exc


class PgWatchAPI:
    """`watch` / `awatch` for `FencedPostgresSaver` (mixed in), as the SQLite saver's."""

    if TYPE_CHECKING:  # the saver's (its events half)

        def _check_wait(
            self,
            thread_id: str,
            after_seq: int | Event,
            limit: int,
            timeout: float,
            incarnation: int | None,
        ) -> tuple[int, int | None]: ...

    def watch(
        self,
        thread_id: str,
        after_seq: int | Event = 0,
        *,
        batch: int = 100,
        incarnation: int | None = None,
    ) -> EventWatch:
        """Iterate over every event after `after_seq`, once each, in order, forever.

        As the SQLite saver's `watch`: close the returned watch (`close()`, or
        use it as a context manager) to end it, and a blocked iteration
        returns (within `SLICE` s); closing the store ends its watches too.
        It wakes on LISTEN/NOTIFY from any host. A thread deleted and
        re-created under it raises `ReplayUnavailable`.
        """
        seq, inc = self._check_wait(thread_id, after_seq, batch, 1.0, incarnation)
        return EventWatch(PgEventPoller(self), thread_id, seq, batch, inc)

    def awatch(
        self,
        thread_id: str,
        after_seq: int | Event = 0,
        *,
        batch: int = 100,
        incarnation: int | None = None,
    ) -> AsyncEventWatch:
        """Async twin of `watch` (an async iterator; cancel or `aclose()` it)."""
        seq, inc = self._check_wait(thread_id, after_seq, batch, 1.0, incarnation)
        return AsyncEventWatch(PgEventPoller(self), thread_id, seq, batch, inc)
