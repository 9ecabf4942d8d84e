"""The PostgreSQL store's event log: appended in the writer's transaction, waited for by LISTEN.

Invariant: a thread's events are numbered 1, 2, 3, ... contiguously in
commit order within an incarnation: each commit's first seq is the position
its fence took, and `append` takes (or gives back) the rest while the row is
locked, so a rolled-back write spends none. Events are decoded by the SQLite
store's `events.decode_event` (checksum first). A waiter listens first, then
reads, then waits: a commit between its read and its wait has already queued
its notification, so no wake-up is lost. A notification's payload (the
thread id) is only a hint to re-read; a slow safety poll covers anything
else (a listener connection that dropped, a commit with notify off).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..core.checksums import checksum
from ..core.events import Event, NewEvent, decode_event
from ..core.status import RUN_ENDS
from ..core.stored_json import dumps_json
from ..errors import ReplayUnavailable
from . import sql
from .connection import Execute, Send

Cursor = Any


def append(
    cur: Cursor,
    thread_id: str,
    first_seq: int,
    events: Sequence[NewEvent],
    *,
    token: int | None,
    now: float | None,
    notify: bool,
) -> list[int]:
    """Append `events` from `first_seq`, the position this commit's fence took.

    With no events, the position is given back (the commit spent no seq).

    Returns:
        The seqs given, in order.
    """
    if len(events) != 1:
        cur.execute(sql.ADJUST_SEQ, {"thread_id": thread_id, "n": len(events) - 1})
    if not events:
        return []
    seqs = list(range(first_seq, first_seq + len(events)))
    datas = [dumps_json(dict(e.data), "event data") for e in events]
    if not notify:
        statement = sql.INSERT_EVENTS
    elif any(e.kind in RUN_ENDS for e in events):
        statement = sql.INSERT_EVENTS_NOTIFY_END
    else:
        statement = sql.INSERT_EVENTS_NOTIFY
    cur.execute(
        statement,
        {
            "thread_id": thread_id,
            "token": token,
            "now": now,
            "seqs": seqs,
            "kinds": [e.kind for e in events],
            "nss": [e.checkpoint_ns for e in events],
            "cids": [e.checkpoint_id for e in events],
            "datas": datas,
            "sums": [checksum(e.kind, d) for e, d in zip(events, datas, strict=True)],
        },
    )
    return seqs


def read_after(
    cur: Cursor, thread_id: str, after_seq: int, limit: int, incarnation: int | None
) -> list[Event]:
    """Return up to `limit` events with `seq > after_seq`, ascending (as the SQLite store's).

    Raises:
        ReplayUnavailable: `after_seq + 1` is below the thread's floor, or the
            position is of another incarnation than the thread's.
        UndecodableRow: an event row is damaged.
    """
    cur.execute(sql.GET_REPLAY_BOUNDS, {"thread_id": thread_id})
    row = cur.fetchone()
    if row is None:
        return []
    floor, current = int(row[0]), int(row[1])
    _check_position(thread_id, after_seq, incarnation, floor, current)
    cur.execute(sql.EVENTS_AFTER, {"thread_id": thread_id, "after": after_seq, "limit": limit})
    return [decode_event(thread_id, tuple(r), current) for r in cur.fetchall()]


def read_tail(cur: Cursor, thread_id: str) -> tuple[int, int] | None:
    """Return the thread's last event seq (0: none yet) and incarnation; None if unknown."""
    cur.execute(sql.GET_EVENT_TAIL, {"thread_id": thread_id})
    row = cur.fetchone()
    return None if row is None else (int(row[0]), int(row[1]))


def read_after_batch(
    thread_id: str, after_seq: int, limit: int, incarnation: int | None
) -> Send[list[Event]]:
    """`read_after` as one statement, one round trip (`PgConnection.run`'s `batch`).

    The same checks and errors as `read_after`'s, on the bounds the statement
    read in the events' snapshot (the reader raises them).
    """
    params = {"thread_id": thread_id, "after": after_seq, "limit": limit}

    def send(execute: Execute) -> Callable[[], list[Event]]:
        found = execute(sql.EVENTS_AFTER_WITH_BOUNDS, params)

        def finish() -> list[Event]:
            rows = found.fetchall()
            if not rows:
                return []
            floor, current = int(rows[0][0]), int(rows[0][1])
            _check_position(thread_id, after_seq, incarnation, floor, current)
            found_rows = [r[2:] for r in rows if r[2] is not None]
            return [decode_event(thread_id, tuple(r), current) for r in found_rows]

        return finish

    return send


def _check_position(
    thread_id: str, after_seq: int, incarnation: int | None, floor: int, current: int
) -> None:
    wanted = incarnation if incarnation is not None else (1 if after_seq > 0 else current)
    if wanted != current:
        raise ReplayUnavailable(
            thread_id,
            floor,
            current,
            message=(
                f"thread {thread_id!r} is in incarnation {current} (it was deleted and "
                f"re-created); a position in incarnation {wanted} cannot be resumed: "
                f"read again from seq 0 with incarnation={current}"
            ),
        )
    if after_seq + 1 < floor:
        raise ReplayUnavailable(thread_id, floor, current)


def raise_floor(cur: Cursor, thread_id: str, before_seq: int, incarnation: int | None) -> int:
    """Raise the floor to `min(before_seq, next_seq)` and drop the events below it.

    As the SQLite store's `events.raise_floor`: never lowers it, and changes
    nothing when the thread is in another incarnation than `incarnation`.

    Returns:
        The floor afterwards (1 for an unknown thread).
    """
    params = {"thread_id": thread_id, "before": before_seq, "incarnation": incarnation}
    cur.execute(sql.RAISE_FLOOR, params)
    row = cur.fetchone()
    if row is None:  # unknown, or another incarnation: nothing changed
        cur.execute(sql.GET_FLOOR, params)
        row = cur.fetchone()
        return 1 if row is None else int(row[0])
    floor = int(row[0])
    cur.execute(sql.DELETE_EVENTS_BELOW, {"thread_id": thread_id, "floor": floor})
    return floor
