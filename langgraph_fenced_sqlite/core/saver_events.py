"""The event log as both stores offer it: append, read, wait, watch, compact, over primitives.

Invariant: every public method here checks its arguments (the same checks and
errors on either store) before it calls one store primitive. A reader's
position is an `(incarnation, seq)` pair (or the last `Event` seen), checked
by `position`, so a thread re-created by `delete_thread` is never a silent
gap. Waits read on a connection of their own, never the store's, so they
never block its writes; how a wait wakes (SQLite's doorbell, PostgreSQL's
LISTEN/NOTIFY) is the store's primitive (`sqlite.saver_events.EventsAPI`,
`postgres.saver_events.PgEventsAPI`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..clock import to_seconds
from ..errors import bad_argument
from .events import Event, NewEvent, normalize_caller_events
from .store import UsesStore
from .twins import async_twin
from .validation import check_int, check_name
from .watch import AsyncEventWatch, EventWatch, Poller

__all__ = ["EventsBase", "position"]


def position(
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


class EventsBase(UsesStore):
    """The per-thread event log (see docs/semantics.md §5), a mixin of both savers.

    A store implements the `_`-prefixed primitives below; everything public
    is written here once.
    """

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
        return self._append_events(thread_id, token, normalize_caller_events(events_))

    aappend_events = async_twin(append_events)

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
        seq, inc = position(thread_id, after_seq, incarnation)
        check_int(limit, "limit", minimum=1)
        return self._events_after(thread_id, seq, limit, inc)

    aevents_after = async_twin(events_after)

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
        and wakes when a commit from any process or host is announced: on
        SQLite by the file's doorbell (else it polls every `poll_interval`;
        see `FencedSqliteSaver`), on PostgreSQL by a NOTIFY naming the
        thread (and re-reads every `poll_interval` s regardless).
        A position is `after_seq` in `incarnation` (or the last `Event`
        seen, which carries both). A bare seq (`incarnation=None`) is a
        position in incarnation 1, the only one until `delete_thread`;
        `after_seq=0` without one reads the current incarnation from its start.

        Raises:
            ReplayUnavailable: as `events_after`.
            StoreError: the file or the listener connection failed, or the
                store is closed.
        """
        seq, inc = self._check_wait(thread_id, after_seq, limit, timeout, incarnation)
        return self._wait_events(thread_id, seq, limit, float(timeout), inc)

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

        Nothing here waits on the event loop: each read runs in a worker thread.
        """
        seq, inc = self._check_wait(thread_id, after_seq, limit, timeout, incarnation)
        return await self._await_events(thread_id, seq, limit, float(timeout), inc)

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
        to end it; a blocked iteration then returns promptly (on PostgreSQL
        within `postgres.watch.SLICE`). Closing the store ends its watches
        too. The watch keeps
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

        Events below the floor are removed; a reader asking from below it gets
        `ReplayUnavailable`, never a silent gap.

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
        return self._compact_events(thread_id, before_seq, incarnation)

    acompact_events = async_twin(compact_events)

    def _check_wait(
        self,
        thread_id: str,
        after_seq: int | Event,
        limit: int,
        timeout: float,
        incarnation: int | None,
    ) -> tuple[int, int | None]:
        check_name(thread_id, "thread_id")
        found = position(thread_id, after_seq, incarnation)
        check_int(limit, "limit", minimum=1)
        to_seconds(timeout, "timeout")
        # Closed or forked stores fail here, without the store's lock: a sync
        # call may hold it for a whole busy_timeout, and awatch/await_events
        # run this on the event loop.
        self._check_usable("wait_events")
        return found

    # --- the store's primitives: checked arguments in ------------------------------------

    def _append_events(self, thread_id: str, token: int, new: list[NewEvent]) -> list[int]:
        raise NotImplementedError

    def _events_after(
        self, thread_id: str, seq: int, limit: int, incarnation: int | None
    ) -> list[Event]:
        raise NotImplementedError

    def _check_usable(self, op: str) -> None:
        """Fail now, taking no lock, if a call `op` could not run (closed, forked, re-entrant)."""
        raise NotImplementedError

    def _event_tail(self, thread_id: str) -> tuple[int, int] | None:
        """The thread's last event seq (0: none yet) and its incarnation; None if unknown.

        A position to wait after for what commits next (the runner's
        "enqueue" head waits there for the holder's run to end).
        """
        raise NotImplementedError

    def _wait_events(
        self, thread_id: str, seq: int, limit: int, timeout: float, incarnation: int | None
    ) -> list[Event]:
        poller = self._poller(keep=False)  # one wait: what it opened is closed with it
        try:
            return poller.wait(
                thread_id, seq, limit=limit, timeout=timeout, incarnation=incarnation
            )
        finally:
            poller.close()

    async def _await_events(
        self, thread_id: str, seq: int, limit: int, timeout: float, incarnation: int | None
    ) -> list[Event]:
        poller = self._poller(keep=False)
        try:
            return await poller.await_(
                thread_id, seq, limit=limit, timeout=timeout, incarnation=incarnation
            )
        finally:
            await poller.aclose()

    def _poller(self, *, keep: bool = True, runs_only: bool = False) -> Poller:
        """A new poller for one watch (or, `keep=False`, one wait): SQLite's, PostgreSQL's.

        `keep`: the poller serves several waits (a watch), so a store whose
        listener is costly to open (PostgreSQL) keeps it between them.
        `runs_only`: its waits need to wake only when a run ends
        (`status.RUN_ENDS`); a store that can tell those commits apart
        (PostgreSQL's `lgfs_runs` channel) sleeps through the others. A
        wait still returns every event after its position.
        """
        raise NotImplementedError

    def _compact_events(self, thread_id: str, before_seq: int, incarnation: int | None) -> int:
        raise NotImplementedError
