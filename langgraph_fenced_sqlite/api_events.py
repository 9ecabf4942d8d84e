"""The event-log half of `FencedSqliteSaver`: append, read, wait, watch, compact.

Invariant: appends are fenced and run in one engine transaction; waits and
watches read on a connection of their own (an `EventPoller`), never the
store's, so they never block its writes. A reader's position is an
`(incarnation, seq)` pair (or the last `Event` seen), checked by
`events.read_after`, so a thread re-created by `delete_thread` is never a
silent gap. Mixed into `FencedSqliteSaver`, which provides `_engine` and
`_poll_interval`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from . import claims, events
from .clock import read_now, to_seconds
from .errors import bad_argument
from .events import Event, EventPoller
from .validation import check_int, check_name
from .watch import AsyncEventWatch, EventWatch

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["EventsAPI"]


def _position(
    thread_id: str, after_seq: int | Event, incarnation: int | None
) -> tuple[int, int | None]:
    """Return `(seq, incarnation)` of a reader's position; bad input names the argument."""
    if incarnation is not None:
        check_int(incarnation, "incarnation", minimum=1)
    if isinstance(after_seq, Event):
        if after_seq.thread_id != thread_id:
            raise bad_argument(
                "after_seq",
                f"an event of thread {after_seq.thread_id!r} is no position in {thread_id!r}",
            )
        if incarnation is not None and incarnation != after_seq.incarnation:
            raise bad_argument(
                "incarnation",
                f"{incarnation} contradicts the event's incarnation {after_seq.incarnation}",
            )
        return after_seq.seq, after_seq.incarnation
    return check_int(after_seq, "after_seq"), incarnation


class EventsAPI:
    """The per-thread event log (see docs/semantics.md §5)."""

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

    def events_after(
        self,
        thread_id: str,
        after_seq: int | Event = 0,
        limit: int = 100,
        *,
        incarnation: int | None = None,
    ) -> list[Event]:
        """Return up to `limit` events with `seq > after_seq`, ascending.

        A position is `after_seq` in `incarnation` (or the last `Event`
        seen, which carries both). A bare seq (`incarnation=None`) is a
        position in incarnation 1, the only one until `delete_thread`;
        `after_seq=0` without one reads the current incarnation from its start.

        Args:
            thread_id: The thread.
            after_seq: The last seq seen (or the last `Event` seen).
            limit: At most this many events.
            incarnation: The incarnation `after_seq` belongs to.

        Raises:
            ReplayUnavailable: `after_seq + 1` is below the floor, or the
                position is of another incarnation than the thread's (the
                error's `incarnation` is the current one: read it from 0).
        """
        check_name(thread_id, "thread_id")
        seq, inc = _position(thread_id, after_seq, incarnation)
        check_int(limit, "limit", minimum=1)
        return self._engine.read(
            "events_after", lambda c: events.read_after(c, thread_id, seq, limit, inc)
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
        """Return events after `after_seq`, waiting up to `timeout` s for a commit.

        Reads on a connection of its own (never blocking this saver's writes)
        and wakes when a commit from any process rings the file's doorbell
        (else it polls every `poll_interval`; see `FencedSqliteSaver`).
        A position is `after_seq` in `incarnation` (or the last `Event`
        seen, which carries both). A bare seq (`incarnation=None`) is a
        position in incarnation 1, the only one until `delete_thread`;
        `after_seq=0` without one reads the current incarnation from its start.

        Raises:
            ReplayUnavailable: as `events_after`.
            StoreError: the file failed (deleted, damaged) or the store is closed.
        """
        seq, inc = self._check_wait(thread_id, after_seq, limit, timeout, incarnation)
        return self._poller().wait(
            thread_id, seq, limit=limit, timeout=float(timeout), incarnation=inc
        )

    async def await_events(
        self,
        thread_id: str,
        after_seq: int | Event = 0,
        *,
        limit: int = 100,
        timeout: float = 30.0,
        incarnation: int | None = None,
    ) -> list[Event]:
        """Async twin of `wait_events`; cancelling the task ends the wait at once.

        Nothing here waits on the event loop: each poll runs in a worker thread.
        """
        seq, inc = self._check_wait(thread_id, after_seq, limit, timeout, incarnation)
        return await self._poller().await_(
            thread_id, seq, limit=limit, timeout=float(timeout), incarnation=inc
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
        # Closed or forked stores fail here, without the store's lock: a sync
        # call may hold it for a whole busy_timeout, and awatch/await_events
        # run this on the event loop.
        self._engine.check("wait_events")
        return position

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

    async def acompact_events(
        self, thread_id: str, before_seq: int, *, incarnation: int | None = None
    ) -> int:
        """Async twin of `compact_events`."""
        return await self._engine.arun(
            self.compact_events, thread_id, before_seq, incarnation=incarnation
        )
