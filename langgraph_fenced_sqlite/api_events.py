"""The event-log half of `FencedSqliteSaver`: append, read, wait, watch, compact.

Invariant: appends are fenced and run in one engine transaction; waits and
watches read on a connection of their own (an `EventPoller`), never the
store's, so they never block its writes. Mixed into `FencedSqliteSaver`,
which provides `_engine` and `_poll_interval`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from . import claims, events
from .clock import read_now, to_seconds
from .events import Event, EventPoller
from .validation import check_int, check_name
from .watch import AsyncEventWatch, EventWatch

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["EventsAPI"]


class EventsAPI:
    """The per-thread event log (see CONTRACT §4)."""

    _engine: Engine
    _poll_interval: float

    def append_events(self, thread_id: str, token: int, events_: Iterable[Any]) -> list[int]:
        """Append caller events under the claim carrying `token`, in one commit.

        Args:
            events_: `(kind, data)` pairs or `{"kind": ..., "data": {...}}` dicts.

        Returns:
            Their seqs, consecutive.
        """
        check_name(thread_id, "thread_id")
        check_int(token, "token")
        new = events.normalize_caller_events(events_)
        now = read_now(self._engine.clock)

        def job(conn: Any) -> list[int]:
            row = claims.check_fence(conn, thread_id, token, now=now, require_claim=True)
            return events.append(conn, thread_id, row, new, token=token, now=now) if new else []

        return self._engine.write("append_events", job)

    async def aappend_events(self, thread_id: str, token: int, events_: Iterable[Any]) -> list[int]:
        """Async twin of `append_events`."""
        return await self._engine.arun(self.append_events, thread_id, token, events_)

    def events_after(self, thread_id: str, after_seq: int = 0, limit: int = 100) -> list[Event]:
        """Return up to `limit` events with `seq > after_seq`, ascending.

        Raises:
            ReplayUnavailable: `after_seq + 1` is below the floor.
        """
        check_name(thread_id, "thread_id")
        check_int(after_seq, "after_seq")
        check_int(limit, "limit", minimum=1)
        return self._engine.read(
            "events_after", lambda c: events.read_after(c, thread_id, after_seq, limit)
        )

    async def aevents_after(
        self, thread_id: str, after_seq: int = 0, limit: int = 100
    ) -> list[Event]:
        """Async twin of `events_after`."""
        return await self._engine.arun(self.events_after, thread_id, after_seq, limit)

    def wait_events(
        self, thread_id: str, after_seq: int = 0, *, limit: int = 100, timeout: float = 30.0
    ) -> list[Event]:
        """Return events after `after_seq`, waiting up to `timeout` s for a commit.

        Reads on a connection of its own (never blocking this saver's writes),
        polling every `poll_interval` for commits from any process.
        """
        self._check_wait(thread_id, after_seq, limit, timeout)
        poller = self._poller()
        try:
            return poller.wait(thread_id, after_seq, limit=limit, timeout=float(timeout))
        finally:
            poller.close()

    async def await_events(
        self, thread_id: str, after_seq: int = 0, *, limit: int = 100, timeout: float = 30.0
    ) -> list[Event]:
        """Async twin of `wait_events`; cancelling the task ends the wait at once."""
        self._check_wait(thread_id, after_seq, limit, timeout)
        poller = self._poller()
        try:
            return await poller.await_(thread_id, after_seq, limit=limit, timeout=float(timeout))
        finally:
            poller.close()

    def _check_wait(self, thread_id: str, after_seq: int, limit: int, timeout: float) -> None:
        check_name(thread_id, "thread_id")
        check_int(after_seq, "after_seq")
        check_int(limit, "limit", minimum=1)
        to_seconds(timeout, "timeout")
        self._engine.run("wait_events", lambda c: None)  # closed/forked stores fail here

    def _poller(self) -> EventPoller:
        return EventPoller(self._engine.path, self._engine.busy_timeout, self._poll_interval)

    def watch(self, thread_id: str, after_seq: int = 0, *, batch: int = 100) -> EventWatch:
        """Iterate over every event after `after_seq`, once each, in order, forever.

        Close the returned watch (`close()`, or use it as a context manager)
        to end it; a blocked iteration then returns promptly.
        """
        self._check_wait(thread_id, after_seq, batch, 1.0)
        return EventWatch(self._poller(), thread_id, after_seq, batch)

    def awatch(self, thread_id: str, after_seq: int = 0, *, batch: int = 100) -> AsyncEventWatch:
        """Async twin of `watch` (an async iterator; cancel or `aclose()` it)."""
        self._check_wait(thread_id, after_seq, batch, 1.0)
        return AsyncEventWatch(self._poller(), thread_id, after_seq, batch)

    def compact_events(self, thread_id: str, before_seq: int) -> int:
        """Raise the replay floor to `min(before_seq, next seq)`; never lower it.

        Returns:
            The floor afterwards.
        """
        check_name(thread_id, "thread_id")
        check_int(before_seq, "before_seq", minimum=1)
        return self._engine.write(
            "compact_events", lambda c: events.raise_floor(c, thread_id, before_seq)
        )

    async def acompact_events(self, thread_id: str, before_seq: int) -> int:
        """Async twin of `compact_events`."""
        return await self._engine.arun(self.compact_events, thread_id, before_seq)
