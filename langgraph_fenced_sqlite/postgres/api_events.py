"""The event-log half of `FencedPostgresSaver`: its primitives behind `EventsBase`.

Invariant: reads and appends are one transaction each, from `events.py` and
`txns.py`; `wait_events`/`await_events` run `events.wait_plan`, the one wait
loop, through `events.drive`/`events.adrive` on a listener connection of
their own (opened per wait, closed when it returns), so a waiter never holds
the store's connection or a pool's. Mixed into `FencedPostgresSaver`, which
provides `_engine`, `_now`, `_notify` and `_poll_interval`.
"""

from __future__ import annotations

from typing import Any

import psycopg

from ..base_events import EventsBase
from ..errors import StoreError
from ..events import Event, NewEvent
from . import events, sql, txns
from .half import PgHalf

__all__ = ["PgEventsAPI"]


class PgEventsAPI(EventsBase, PgHalf):
    """The per-thread event log (see `EventsBase`), woken by LISTEN/NOTIFY."""

    def _append_events(self, thread_id: str, token: int, new: list[NewEvent]) -> list[int]:
        if not new:
            return []
        now = self._now()
        return self._engine.run(
            "append_events",
            lambda cur: txns.append_events(
                cur, thread_id, token, new, now=now, notify=self._notify
            ),
        )

    def _events_after(
        self, thread_id: str, seq: int, limit: int, incarnation: int | None
    ) -> list[Event]:
        return self._engine.run(
            "events_after", lambda cur: events.read_after(cur, thread_id, seq, limit, incarnation)
        )

    def _check_usable(self, op: str) -> None:
        self._engine._check(op)

    def _listener_error(self, exc: psycopg.Error) -> StoreError:
        return StoreError("wait_events", self._engine.where, message=str(exc))

    def _wait_events(
        self, thread_id: str, seq: int, limit: int, timeout: float, incarnation: int | None
    ) -> list[Event]:
        conninfo, kwargs = self._engine.listener_params()
        try:
            conn = psycopg.connect(conninfo, autocommit=True, **kwargs)
        except psycopg.Error as exc:
            raise self._listener_error(exc) from exc
        with conn:

            def notifies(seconds: float) -> set[str] | None:
                got = {n.payload for n in conn.notifies(timeout=seconds, stop_after=1)}
                return got or None

            try:
                conn.execute(sql.LISTEN)
                return events.drive(
                    events.wait_plan(thread_id, timeout, self._poll_interval),
                    lambda: self._events_after(thread_id, seq, limit, incarnation),
                    notifies,
                )
            except psycopg.Error as exc:
                raise self._listener_error(exc) from exc

    async def _await_events(
        self, thread_id: str, seq: int, limit: int, timeout: float, incarnation: int | None
    ) -> list[Event]:
        conninfo, kwargs = self._engine.listener_params()
        try:
            conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **kwargs)
        except psycopg.Error as exc:
            raise self._listener_error(exc) from exc
        async with conn:

            async def notifies(seconds: float) -> set[str] | None:
                got = {n.payload async for n in conn.notifies(timeout=seconds, stop_after=1)}
                return got or None

            def read() -> Any:
                return self._engine.arun(self._events_after, thread_id, seq, limit, incarnation)

            try:
                await conn.execute(sql.LISTEN)
                return await events.adrive(
                    events.wait_plan(thread_id, timeout, self._poll_interval), read, notifies
                )
            except psycopg.Error as exc:
                raise self._listener_error(exc) from exc
