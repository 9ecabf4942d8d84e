"""The event-log half of `FencedSqliteSaver`: its primitives behind `EventsBase`, and watches.

Invariant: appends are fenced and run in one engine transaction; waits and
watches read on a connection of their own (an `EventPoller`), never the
store's, so they never block its writes, and wake on the file's doorbell.
Mixed into `FencedSqliteSaver`, which provides `_engine` and `_poll_interval`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import claims, events
from .base_events import EventsBase
from .clock import read_now
from .events import Event, EventPoller, NewEvent
from .twins import async_twin
from .validation import check_int, check_name
from .watch import AsyncEventWatch, EventWatch

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["EventsAPI"]


class EventsAPI(EventsBase):
    """The per-thread event log (see `EventsBase`), on one SQLite file, with watches."""

    _engine: Engine
    _poll_interval: float

    def _append_events(self, thread_id: str, token: int, new: list[NewEvent]) -> list[int]:
        now = read_now(self._engine.clock)

        def job(conn: Any) -> list[int]:
            # The fence is checked even with nothing to append: a stale token fails.
            row = claims.check_fence(conn, thread_id, token, now=now, require_claim=True)
            return events.append(conn, thread_id, row, new, token=token, now=now) if new else []

        return self._engine.write("append_events", job)

    def _events_after(
        self, thread_id: str, seq: int, limit: int, incarnation: int | None
    ) -> list[Event]:
        return self._engine.read(
            "events_after", lambda c: events.read_after(c, thread_id, seq, limit, incarnation)
        )

    def _check_usable(self, op: str) -> None:
        self._engine.check(op)

    def _wait_events(
        self, thread_id: str, seq: int, limit: int, timeout: float, incarnation: int | None
    ) -> list[Event]:
        return self._poller().wait(
            thread_id, seq, limit=limit, timeout=timeout, incarnation=incarnation
        )

    async def _await_events(
        self, thread_id: str, seq: int, limit: int, timeout: float, incarnation: int | None
    ) -> list[Event]:
        return await self._poller().await_(
            thread_id, seq, limit=limit, timeout=timeout, incarnation=incarnation
        )

    def _poller(self) -> EventPoller:
        # No connection yet: it is opened by the first poll (in a worker
        # thread for async waits) and closed when each wait returns.
        poller = EventPoller(self._engine.path, self._engine.busy_timeout, self._poll_interval)
        self._engine.register(poller)
        return poller

    def watch(
        self,
        thread_id: str,
        after_seq: int | Event = 0,
        *,
        batch: int = 100,
        incarnation: int | None = None,
    ) -> EventWatch:
        """Iterate over every event after `after_seq`, once each, in order, forever.

        Close the returned watch (`close()`, or use it as a context manager)
        to end it; a blocked iteration then returns promptly. Closing the
        store ends its watches too. The watch keeps
        the incarnation of the first event it delivers: if the thread is
        deleted and re-created meanwhile, iterating raises `ReplayUnavailable`.
        A position is `after_seq` in `incarnation` (or the last `Event`
        seen, which carries both). A bare seq (`incarnation=None`) is a
        position in incarnation 1, the only one until `delete_thread`;
        `after_seq=0` without one reads the current incarnation from its start.
        """
        seq, inc = self._check_wait(thread_id, after_seq, batch, 1.0, incarnation)
        return EventWatch(self._poller(), thread_id, seq, batch, inc)

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
        return AsyncEventWatch(self._poller(), thread_id, seq, batch, inc)

    def compact_events(
        self, thread_id: str, before_seq: int, *, incarnation: int | None = None
    ) -> int:
        """Raise the replay floor to `min(before_seq, next seq)`; never lower it.

        Args:
            thread_id: The thread.
            before_seq: Events below this seq go.
            incarnation: The incarnation `before_seq` belongs to. If the
                thread is in another one (it was deleted and re-created),
                nothing changes: every event of that incarnation is gone
                already, and the new one's were not seen by the caller.
                None means the current incarnation.

        Returns:
            The floor afterwards.
        """
        check_name(thread_id, "thread_id")
        check_int(before_seq, "before_seq", minimum=1)
        if incarnation is not None:
            check_int(incarnation, "incarnation", minimum=1)
        return self._engine.write(
            "compact_events",
            lambda c: events.raise_floor(c, thread_id, before_seq, incarnation=incarnation),
        )

    acompact_events = async_twin(compact_events)
