"""The event-log half of `FencedPostgresSaver`: its primitives behind `EventsBase`.

Invariant: reads, appends and compactions are one transaction each, from
`events.py` and `txns.py`; waits and watches run `watch.PgEventPoller`, the
one wait implementation (LISTEN/NOTIFY on a connection of its own, so a
waiter never holds the store's connection or a pool's). Mixed into
`FencedPostgresSaver`, which provides `_engine`, `_now`, `_notify` and
`_poll_interval`.
"""

from __future__ import annotations

from ..core.events import Event, NewEvent
from ..core.saver_events import EventsBase
from . import events, txns
from .half import PgHalf
from .watch import PgEventPoller

__all__ = ["PgEventsAPI"]


class PgEventsAPI(PgHalf, EventsBase):
    """The per-thread event log (see `EventsBase`), woken by LISTEN/NOTIFY."""

    def _append_events(self, thread_id: str, token: int, new: list[NewEvent]) -> list[int]:
        # The fence is checked even with nothing to append (a stale token
        # fails, as on SQLite); `events.append` gives the seq back.
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
        # One round trip: a waiter woken by a NOTIFY reads its events in one.
        batch = events.read_after_batch(thread_id, seq, limit, incarnation)
        got: list[Event] = self._engine.run("events_after", batch=batch, read_only=True)
        return got

    def _check_usable(self, op: str) -> None:
        self._engine._check(op)

    def _event_tail(self, thread_id: str) -> tuple[int, int] | None:
        return self._engine.run(
            "event_tail", lambda cur: events.read_tail(cur, thread_id), read_only=True
        )

    def _poller(self, *, keep: bool = True, runs_only: bool = False) -> PgEventPoller:
        return PgEventPoller(self, keep=keep, runs_only=runs_only)

    def _compact_events(self, thread_id: str, before_seq: int, incarnation: int | None) -> int:
        return self._engine.run(
            "compact_events",
            lambda cur: events.raise_floor(cur, thread_id, before_seq, incarnation),
        )
