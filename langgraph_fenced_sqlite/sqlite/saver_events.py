"""The event-log half of `FencedSqliteSaver`: its primitives behind `EventsBase`.

Invariant: appends are fenced and run in one engine transaction; waits and
watches read on a connection of their own (an `EventPoller`), never the
store's, so they never block its writes, and wake on the file's doorbell.
Mixed into `FencedSqliteSaver`, which provides `_engine` and `_poll_interval`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..clock import read_now
from ..core.events import Event, NewEvent
from ..core.saver_events import EventsBase
from . import claims, events
from .events import EventPoller

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

    def _event_tail(self, thread_id: str) -> tuple[int, int] | None:
        row = self._engine.read("event_tail", claims.read_thread, thread_id)
        return None if row is None else (row.next_seq - 1, row.incarnation)

    def _poller(self, *, keep: bool = True, runs_only: bool = False) -> EventPoller:
        # No connection yet: it is opened by the first poll (in a worker
        # thread for async waits) and closed when each wait returns (a
        # SQLite connection is cheap to open: `keep` changes nothing here).
        # The doorbell rings for every commit of the file: `runs_only`
        # changes nothing either (a waiter rests on a hot thread instead).
        poller = EventPoller(self._engine.path, self._engine.busy_timeout, self._poll_interval)
        self._engine.register(poller)
        return poller

    def _compact_events(self, thread_id: str, before_seq: int, incarnation: int | None) -> int:
        return self._engine.write(
            "compact_events",
            lambda c: events.raise_floor(c, thread_id, before_seq, incarnation=incarnation),
        )
