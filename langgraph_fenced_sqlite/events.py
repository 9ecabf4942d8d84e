"""The per-thread event log: appended in the writer's transaction, read by seq.

Invariant: a thread's events are numbered 1, 2, 3, ... contiguously in commit
order; seqs are taken from the thread row inside the same transaction as the
change they describe, so a rolled-back write spends no seq. The replay floor
only moves up, and events below it are gone. Waiting reads on a connection of
its own (never the store's), so a watcher never blocks a writer.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import schema
from .claims import ThreadRow
from .errors import ReplayUnavailable, UndecodableRow, bad_argument
from .serde import dumps_json, loads_json
from .validation import check_iterable, check_json, check_name

__all__ = ["Event", "EventPoller"]


@dataclass(frozen=True)
class Event:
    """One record of a thread's event log.

    Attributes:
        thread_id: The thread.
        seq: Its number, 1, 2, 3, ... per thread.
        kind: `checkpoint`, `writes`, `retracted`, `pruned` or a caller's kind.
        data: A JSON object (never channel values).
        checkpoint_ns: The namespace of the checkpoint it concerns, if any.
        checkpoint_id: The checkpoint it concerns, if any.
        token: The fencing token of the write, if fenced.
        ts: Store-clock seconds since the epoch at commit.
    """

    thread_id: str
    seq: int
    kind: str
    data: dict[str, Any]
    checkpoint_ns: str | None = None
    checkpoint_id: str | None = None
    token: int | None = None
    ts: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Return the event as a JSON-ready dict."""
        return {
            "thread_id": self.thread_id,
            "seq": self.seq,
            "kind": self.kind,
            "data": self.data,
            "checkpoint_ns": self.checkpoint_ns,
            "checkpoint_id": self.checkpoint_id,
            "token": self.token,
            "ts": self.ts,
        }


@dataclass(frozen=True)
class NewEvent:
    """An event about to be appended (no seq yet)."""

    kind: str
    data: Mapping[str, Any]
    checkpoint_ns: str | None = None
    checkpoint_id: str | None = None


def normalize_caller_events(events: Iterable[Any]) -> list[NewEvent]:
    """Validate caller events: `(kind, data)` pairs or `{"kind", "data"}` dicts.

    Raises:
        InvalidArgument: (naming `events`, or `events[i]...`) not a list of
            events, an event of the wrong shape, an empty/too long/non-UTF-8
            kind, data that is not a JSON object with string keys.
        SerializationError: data holds a value JSON cannot store (naming it).
    """
    out: list[NewEvent] = []
    for i, item in enumerate(check_iterable(events, "events")):
        if isinstance(item, Mapping):
            kind, data = item.get("kind"), item.get("data", {})
        elif isinstance(item, tuple) and len(item) == 2:
            kind, data = item
        else:
            raise bad_argument("events", f"each event must be (kind, data) or a dict, got {item!r}")
        if not isinstance(kind, str) or not kind or len(kind) > 200:
            raise bad_argument("events", f"kind must be a non-empty string, got {kind!r}")
        check_name(kind, f"events[{i}] kind")
        if not isinstance(data, Mapping):
            raise bad_argument("events", f"data must be a JSON object, got {type(data).__name__}")
        check_json(dict(data), f"events[{i}] data")
        dumps_json(dict(data), "events data")
        out.append(NewEvent(kind, dict(data)))
    return out


def append(
    conn: sqlite3.Connection,
    thread_id: str,
    row: ThreadRow,
    events: Iterable[NewEvent],
    *,
    token: int | None,
    now: float,
) -> list[int]:
    """Append `events` with consecutive seqs, starting at the row's `next_seq`.

    Args:
        row: The thread row read in this transaction (no event appended since).

    Returns:
        The seqs given, in order.
    """
    seqs: list[int] = []
    for seq, event in enumerate(events, start=row.next_seq):
        conn.execute(
            schema.INSERT_EVENT,
            (
                thread_id,
                seq,
                event.kind,
                event.checkpoint_ns,
                event.checkpoint_id,
                dumps_json(dict(event.data), "event data"),
                token,
                now,
            ),
        )
        seqs.append(seq)
    return seqs


def read_after(conn: sqlite3.Connection, thread_id: str, after_seq: int, limit: int) -> list[Event]:
    """Return up to `limit` events with `seq > after_seq`, ascending.

    Raises:
        ReplayUnavailable: `after_seq + 1` is below the thread's floor.
    """
    floor_row = conn.execute(schema.GET_FLOOR, (thread_id,)).fetchone()
    if floor_row is None:
        return []
    floor = floor_row[0]
    if isinstance(floor, bool) or not isinstance(floor, int):
        raise UndecodableRow(thread_id, None, f"the replay floor cell holds {floor!r}")
    if after_seq + 1 < floor:
        raise ReplayUnavailable(thread_id, floor)
    rows = conn.execute(schema.EVENTS_AFTER, (thread_id, after_seq, limit)).fetchall()
    return [
        Event(thread_id, seq, kind, _event_data(thread_id, seq, cid, data), ns, cid, token, ts)
        for seq, kind, ns, cid, data, token, ts in rows
    ]


def _event_data(thread_id: str, seq: Any, checkpoint_id: Any, text: Any) -> dict[str, Any]:
    # A damaged cell is an error naming the event, never a raw JSON/TypeError
    # nor a value of another shape than the JSON object that was written.
    try:
        data = loads_json(text)
    except (ValueError, TypeError, RecursionError) as exc:
        raise UndecodableRow(thread_id, checkpoint_id, f"event {seq} data: {exc}") from exc
    if not isinstance(data, dict):
        reason = f"event {seq} data is not a JSON object: {type(data).__name__}"
        raise UndecodableRow(thread_id, checkpoint_id, reason)
    return data


def raise_floor(conn: sqlite3.Connection, thread_id: str, before_seq: int) -> int:
    """Raise the floor to `min(before_seq, next_seq)` and drop events below it.

    Returns:
        The floor afterwards (never lower than before).
    """
    row = conn.execute(schema.GET_FLOOR, (thread_id,)).fetchone()
    if row is None:
        return 1
    floor, next_seq = row
    target = min(before_seq, next_seq)
    if target > floor:
        conn.execute(schema.SET_FLOOR, (target, thread_id, target))
        conn.execute(schema.DELETE_EVENTS_BELOW, (thread_id, target))
        return target
    return floor


class EventPoller:
    """Wait for a thread's events on a read-only connection of its own.

    SQLite cannot notify other connections, so this polls: each round asks
    `PRAGMA data_version` (which changes when any other connection, in any
    process, commits) and reads the log only when it changed. An idle waiter
    therefore costs one cheap pragma per `poll_interval`. One poller serves
    one consumer at a time; `close()` it when done.
    """

    def __init__(self, path: str, busy_timeout: float, poll_interval: float) -> None:
        """Open a read-only connection to `path`, polled every `poll_interval` s."""
        from .engine import connect

        self.poll_interval = poll_interval
        self._conn = connect(path, busy_timeout, readonly=True)
        self._version: int | None = None

    def close(self) -> None:
        """Close the poller's connection."""
        self._conn.close()

    def _poll(self, thread_id: str, after_seq: int, limit: int) -> list[Event]:
        current = self._conn.execute(schema.GET_DATA_VERSION).fetchone()[0]
        if current == self._version:
            return []
        self._conn.execute("BEGIN")
        try:
            events = read_after(self._conn, thread_id, after_seq, limit)
        finally:
            self._conn.execute("COMMIT")
        # Only remember the version once nothing was found: a caller asking
        # again from a later seq must still read what is already there.
        self._version = None if events else current
        return events

    def wait(
        self,
        thread_id: str,
        after_seq: int,
        *,
        limit: int,
        timeout: float,
        stop: threading.Event | None = None,
    ) -> list[Event]:
        """Return events after `after_seq`, waiting up to `timeout` for some.

        Returns early with [] when `stop` is set.
        """
        deadline = time.monotonic() + timeout
        self._version = None
        while True:
            events = self._poll(thread_id, after_seq, limit)
            if events:
                return events
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            pause = min(self.poll_interval, remaining)
            if stop is None:
                time.sleep(pause)
            elif stop.wait(pause):
                return []

    async def await_(
        self,
        thread_id: str,
        after_seq: int,
        *,
        limit: int,
        timeout: float,
        stop: asyncio.Event | None = None,
    ) -> list[Event]:
        """Async twin of `wait`; cancelling the awaiting task ends it at once.

        Returns [] without polling again once `stop` is set: another task may
        close this poller's connection while this one sleeps.
        """
        deadline = time.monotonic() + timeout
        self._version = None
        while True:
            if stop is not None and stop.is_set():
                return []
            # A data_version probe and an indexed read take microseconds and
            # do not wait for writers (WAL readers never block), so they run
            # on the loop rather than paying a thread hop per poll.
            events = self._poll(thread_id, after_seq, limit)
            if events:
                return events
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            await asyncio.sleep(min(self.poll_interval, remaining))
