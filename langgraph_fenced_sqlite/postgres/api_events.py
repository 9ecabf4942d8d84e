"""The event-log half of `FencedPostgresSaver`: append, read, wait across hosts, compact.

Invariant: reads and appends are one transaction each, from `events.py`;
`wait_events`/`await_events` run `events.wait_plan`, the one wait loop, on a
listener connection of their own (opened per wait, closed when it returns),
so a waiter never holds the store's connection or a pool's. Mixed into
`FencedPostgresSaver`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg

from .. import events as shared_events
from ..api_events import _position
from ..clock import to_seconds
from ..errors import StoreError
from ..events import Event
from ..validation import check_int, check_name
from . import events, sql, txns
from .connection import PgConnection

__all__ = ["PgEventsAPI"]


class PgEventsAPI:
    """The per-thread event log (see docs/semantics.md §5), woken by LISTEN/NOTIFY."""

    _engine: PgConnection
    _notify: bool
    _poll_interval: float

    def _now(self) -> float | None:
        raise NotImplementedError  # the saver's

    def append_events(self, thread_id: str, token: int, events_: Iterable[Any]) -> list[int]:
        """Append caller events under the claim carrying `token`, in one commit.

        Args:
            events_: `(kind, data)` pairs or `{"kind": ..., "data": {...}}` dicts.

        Returns:
            Their seqs, consecutive.

        Raises:
            StaleClaim: `token` is not the thread's claim; nothing is appended.
        """
        check_name(thread_id, "thread_id")
        check_int(token, "token")
        new = shared_events.normalize_caller_events(events_)
        if not new:
            return []
        now = self._now()
        return self._engine.run(
            "append_events",
            lambda cur: txns.append_events(
                cur, thread_id, token, new, now=now, notify=self._notify
            ),
        )

    async def aappend_events(self, thread_id: str, token: int, events_: Iterable[Any]) -> list[int]:
        """Async twin of `append_events`."""
        return await self._engine.arun(self.append_events, thread_id, token, events_)

    def events_after(
        self,
        thread_id: str,
        after_seq: int | Event = 0,
        limit: int = 100,
        *,
        incarnation: int | None = None,
    ) -> list[Event]:
        """Return up to `limit` events with `seq > after_seq`, ascending.

        A position is `after_seq` in `incarnation` (or the last `Event` seen).

        Raises:
            ReplayUnavailable: the position is of another incarnation than the
                thread's (the error's `incarnation` is the current one).
        """
        check_name(thread_id, "thread_id")
        seq, inc = _position(thread_id, after_seq, incarnation)
        check_int(limit, "limit", minimum=1)
        return self._engine.run(
            "events_after", lambda cur: events.read_after(cur, thread_id, seq, limit, inc)
        )

    async def aevents_after(
        self,
        thread_id: str,
        after_seq: int | Event = 0,
        limit: int = 100,
        *,
        incarnation: int | None = None,
    ) -> list[Event]:
        """Async twin of `events_after`."""
        return await self._engine.arun(
            self.events_after, thread_id, after_seq, limit, incarnation=incarnation
        )

    def wait_events(
        self,
        thread_id: str,
        after_seq: int | Event = 0,
        *,
        limit: int = 100,
        timeout: float = 30.0,
        incarnation: int | None = None,
    ) -> list[Event]:
        """Return events after `after_seq`, waiting up to `timeout` s for a commit from any host.

        Listens (LISTEN) on a connection of its own, then reads, then waits
        for a notification naming the thread, re-reading the table on each
        (and every `poll_interval` s regardless).

        Raises:
            ReplayUnavailable: as `events_after`.
            StoreError: the listener connection failed, or the store is closed.
        """
        seq, inc = self._check_wait(thread_id, after_seq, limit, timeout, incarnation)
        conninfo, kwargs = self._engine.listener_params()
        try:
            conn = psycopg.connect(conninfo, autocommit=True, **kwargs)
        except psycopg.Error as exc:
            raise StoreError("wait_events", self._engine.where, message=str(exc)) from exc
        with conn:

            def notifies(seconds: float) -> set[str] | None:
                got = {n.payload for n in conn.notifies(timeout=seconds, stop_after=1)}
                return got or None

            try:
                conn.execute(sql.LISTEN)
                return events.drive(
                    events.wait_plan(thread_id, float(timeout), self._poll_interval),
                    lambda: self.events_after(thread_id, seq, limit, incarnation=inc),
                    notifies,
                )
            except psycopg.Error as exc:
                raise StoreError("wait_events", self._engine.where, message=str(exc)) from exc

    async def await_events(
        self,
        thread_id: str,
        after_seq: int | Event = 0,
        *,
        limit: int = 100,
        timeout: float = 30.0,
        incarnation: int | None = None,
    ) -> list[Event]:
        """Async twin of `wait_events`; cancelling the task ends the wait at once."""
        seq, inc = self._check_wait(thread_id, after_seq, limit, timeout, incarnation)
        conninfo, kwargs = self._engine.listener_params()
        try:
            conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **kwargs)
        except psycopg.Error as exc:
            raise StoreError("wait_events", self._engine.where, message=str(exc)) from exc
        async with conn:
            try:
                await conn.execute(sql.LISTEN)
                plan = events.wait_plan(thread_id, float(timeout), self._poll_interval)
                try:
                    step = next(plan)
                    while True:
                        if step == events.READ:
                            reply: Any = await self.aevents_after(
                                thread_id, seq, limit, incarnation=inc
                            )
                        else:
                            got = {
                                n.payload
                                async for n in conn.notifies(timeout=float(step), stop_after=1)
                            }
                            reply = got or None
                        step = plan.send(reply)
                except StopIteration as done:
                    return list(done.value)
            except psycopg.Error as exc:
                raise StoreError("wait_events", self._engine.where, message=str(exc)) from exc

    def compact_events(
        self, thread_id: str, before_seq: int, *, incarnation: int | None = None
    ) -> int:
        """Raise the replay floor to `min(before_seq, next seq)`; never lower it.

        Events below the floor are removed; a reader asking from below it gets
        `ReplayUnavailable` (never a silent gap), as on the SQLite store.

        Args:
            thread_id: The thread.
            before_seq: Events below this seq go.
            incarnation: The incarnation `before_seq` belongs to. If the
                thread is in another one (it was deleted and re-created),
                nothing changes. None means the current incarnation.

        Returns:
            The floor afterwards.
        """
        check_name(thread_id, "thread_id")
        check_int(before_seq, "before_seq", minimum=1)
        if incarnation is not None:
            check_int(incarnation, "incarnation", minimum=1)
        return self._engine.run(
            "compact_events",
            lambda cur: events.raise_floor(cur, thread_id, before_seq, incarnation),
        )

    async def acompact_events(
        self, thread_id: str, before_seq: int, *, incarnation: int | None = None
    ) -> int:
        """Async twin of `compact_events`."""
        return await self._engine.arun(
            self.compact_events, thread_id, before_seq, incarnation=incarnation
        )

    def _check_wait(
        self,
        thread_id: str,
        after_seq: int | Event,
        limit: int,
        timeout: float,
        incarnation: int | None,
    ) -> tuple[int, int | None]:
        check_name(thread_id, "thread_id")
        position = _position(thread_id, after_seq, incarnation)
        check_int(limit, "limit", minimum=1)
        to_seconds(timeout, "timeout")
        self._engine._check("wait_events")
        return position
