"""The per-thread event log on SQLite: appended in the writer's transaction, read by seq.

Invariant: a thread's events are numbered 1, 2, 3, ... contiguously in commit
order; seqs are taken from the thread row inside the same transaction as the
change they describe, so a rolled-back write spends no seq. The replay floor
only moves up, and events below it are gone. Waiting reads on a connection of
its own (never the store's), so a watcher never blocks a writer; its loop is
`core/waiting.py`'s.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import threading
from collections.abc import Callable, Iterable

from ..core import waiting
from ..core.checksums import event_checksum
from ..core.claims import ThreadRow
from ..core.events import (
    SAFETY_POLL,
    Event,
    NewEvent,
    _floor_of,
    decode_event,
)
from ..core.hop import ASYNC_WORKERS, Hop
from ..core.stored_json import dumps_json
from ..core.waiting import Stopped
from ..errors import ReplayUnavailable
from . import schema
from .doorbell import Listener

__all__ = ["EventPoller", "append", "raise_floor", "read_after"]


# Where async waits run their polls (I/O, never on the loop): the lighter hop
# every async call of a store takes, shared by this process's pollers (a
# poller is not its store's: it reads on a connection of its own).
_POLL_HOP = Hop(ASYNC_WORKERS, "lgfs-poll")


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
        text = dumps_json(dict(event.data), "event data")
        append_text(
            conn,
            thread_id,
            seq,
            event.kind,
            text,
            event.checkpoint_ns,
            event.checkpoint_id,
            token=token,
            now=now,
        )
        seqs.append(seq)
    return seqs


def append_text(
    conn: sqlite3.Connection,
    thread_id: str,
    seq: int,
    kind: str,
    text: str,
    checkpoint_ns: str | None,
    checkpoint_id: str | None,
    *,
    token: int | None,
    now: float,
) -> None:
    """Append one event at `seq` whose data is `text`, as `dumps_json` wrote it.

    Every put and put_writes appends exactly one, with the text of
    `checkpoint_event_text` / `writes_event_text`.
    """
    conn.execute(
        schema.INSERT_EVENT,
        (
            thread_id,
            seq,
            kind,
            checkpoint_ns,
            checkpoint_id,
            text,
            token,
            now,
            event_checksum(kind, text),
        ),
    )


def read_after(
    conn: sqlite3.Connection,
    thread_id: str,
    after_seq: int,
    limit: int,
    incarnation: int | None = None,
) -> list[Event]:
    """Return up to `limit` events with `seq > after_seq`, ascending.

    A position is `(incarnation, after_seq)`. A bare seq (`incarnation=None`)
    is a position in incarnation 1, the only one until a `delete_thread`;
    `after_seq=0` without an incarnation reads the current one from its start.

    Raises:
        ReplayUnavailable: `after_seq + 1` is below the thread's floor, or the
            position is of another incarnation than the thread's (its
            `incarnation` field names the current one: resume from 0 there).
        UndecodableRow: an event row is damaged (its checksum does not hold,
            or a cell has the wrong type or shape); `checkpoint_id` is None
            and the message names the seq.
    """
    bounds = conn.execute(schema.GET_REPLAY_BOUNDS, (thread_id,)).fetchone()
    if bounds is None:
        return []
    floor, current = _floor_of(thread_id, bounds)
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
    rows = conn.execute(schema.EVENTS_AFTER, (thread_id, after_seq, limit)).fetchall()
    # Every stored event is of the current incarnation: `delete_thread`
    # removes the old one's in the transaction that raises the number.
    return [decode_event(thread_id, row, current) for row in rows]


def raise_floor(
    conn: sqlite3.Connection, thread_id: str, before_seq: int, *, incarnation: int | None = None
) -> int:
    """Raise the floor to `min(before_seq, next_seq)` and drop events below it.

    Args:
        incarnation: The incarnation `before_seq` is a seq of; if the thread
            is in another one, nothing changes (None: the current one).

    Returns:
        The floor afterwards (never lower than before).
    """
    row = conn.execute(schema.GET_FLOOR, (thread_id,)).fetchone()
    if row is None:
        return 1
    floor, next_seq = _floor_of(thread_id, row)
    if incarnation is not None:
        current = _floor_of(
            thread_id, conn.execute(schema.GET_REPLAY_BOUNDS, (thread_id,)).fetchone()
        )[1]
        if current != incarnation:
            # Every event of that incarnation is gone already; the seq says
            # nothing about the current one's, which its reader has not seen.
            return floor
    target = min(before_seq, next_seq)
    if target > floor:
        conn.execute(schema.SET_FLOOR, (target, thread_id, target))
        conn.execute(schema.DELETE_EVENTS_BELOW, (thread_id, target))
        return target
    return floor


class EventPoller:
    """Wait for a thread's events on a read-only connection of its own.

    SQLite cannot notify other connections, so writers ring a doorbell after
    each commit (`doorbell.py`) and a wait listens to it: it starts listening
    before it first reads, reads, then sleeps until the bell rings. Each
    look asks `PRAGMA data_version` (which changes when any other connection,
    in any process, commits) and reads the log only when it changed. As a
    safety net a wait also looks every `max(poll_interval, SAFETY_POLL)` s,
    so a commit that rings no bell is seen too, only later. Where no bell
    can be had (not Linux, no inotify, a read-only directory without one) it
    polls every `poll_interval` instead.

    The connection and the listener exist only during a wait: opened by its
    first poll and closed when the wait returns, so a watch dropped between
    iterations holds no file descriptor, whatever the garbage collector does
    (the process's one inotify descriptor belongs to the doorbell's hub).
    One poller serves one consumer at a time; `close()` (also from another
    thread, or by the store's own `close()`) ends a wait in progress
    promptly.
    """

    def __init__(self, path: str, busy_timeout: float, poll_interval: float) -> None:
        """Prepare to wait on `path`, polling every `poll_interval` s where it has no bell."""
        self.path = path
        self.poll_interval = poll_interval
        self.safety_interval = max(poll_interval, SAFETY_POLL)
        """How often a wait that has a bell looks anyway (seconds)."""
        self._busy_timeout = busy_timeout
        self._conn: sqlite3.Connection | None = None
        self._version: int | None = None
        # Guards the connection: a poll (in a worker thread for async waits)
        # and close() from another thread never use it at the same time.
        self._lock = threading.Lock()
        self._closed = False
        self._wake = threading.Event()
        # The current wait's doorbell (None: polling). `_listen` asks the
        # wait's first poll to open it, before it reads.
        self._bell: Listener | None = None
        self._listen = False
        # Set when the wait ended while a poll still ran in a worker thread
        # (a cancelled await): that poll closes the connection on its way out.
        self._release_after_poll = False
        # Statement trace for diagnostics (benchmarks count an idle watch's
        # statements): set on each connection the poller opens.
        self.trace: Callable[[str], object] | None = None

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._closed

    @property
    def listening(self) -> bool:
        """Whether the wait in progress listens to a doorbell (False: it polls)."""
        bell = self._bell
        return bell is not None and not bell.closed

    def lead(self, thread_id: str, seconds: float, stop: threading.Event | None = None) -> bool:
        """`watch.Poller.lead`: every waiting process tries (no election across processes)."""
        return True

    async def alead(
        self, thread_id: str, seconds: float, stop: asyncio.Event | None = None
    ) -> bool:
        """Async twin of `lead`."""
        return True

    def close(self) -> None:
        """End any wait in progress and close the connection; never blocks; twice is fine."""
        self._closed = True
        self._wake.set()
        bell = self._bell
        if bell is not None:
            bell.close()  # wakes a wait blocked on it, from any thread
        self._end_wait()

    async def aclose(self) -> None:
        """`watch.Poller.aclose`: `close()` (nothing to give back)."""
        self.close()

    def _end_wait(self) -> None:
        # Never blocks: an async wait ends on the event loop, where waiting for
        # a poll still running in a worker thread would stall the loop. The
        # flag is set before trying the lock, and a poll reads it after
        # releasing the lock, so one of the two always closes the connection.
        self._release_after_poll = True
        if self._lock.acquire(blocking=False):
            try:
                if self._conn is not None:
                    conn, self._conn = self._conn, None
                    conn.close()
                if self._bell is not None:
                    bell, self._bell = self._bell, None
                    bell.close()
            finally:
                self._lock.release()

    def _poll(
        self, thread_id: str, after_seq: int, limit: int, incarnation: int | None = None
    ) -> list[Event] | None:
        """Return new events ([] if none), or None once the poller is closed.

        The wait's first poll starts listening to the bell before it reads.

        Raises:
            StoreError: the file failed (deleted, damaged, not ours any more).
            ReplayUnavailable: `after_seq + 1` is below the floor.
        """
        from .connection import connect, translate

        try:
            with self._lock:
                if self._closed:
                    return None
                try:
                    if self._conn is None:
                        self._conn = connect(self.path, self._busy_timeout, readonly=True)
                        if self.trace is not None:
                            self._conn.set_trace_callback(self.trace)
                    if self._listen:  # after the file opened (no stray bell), before the read
                        self._listen = False
                        if self._bell is not None:  # left by a poll whose wait ended
                            self._bell.close()
                        self._bell = Listener.open(self.path)
                    return self._read(thread_id, after_seq, limit, incarnation)
                except sqlite3.Error as exc:
                    raise translate("wait_events", self.path, exc) from exc
        finally:
            if self._release_after_poll:
                self._end_wait()

    def _begin_wait(self) -> None:
        self._version = None
        self._release_after_poll = False
        self._listen = True

    def _read(
        self, thread_id: str, after_seq: int, limit: int, incarnation: int | None
    ) -> list[Event]:
        conn = self._conn
        assert conn is not None
        current = conn.execute(schema.GET_DATA_VERSION).fetchone()[0]
        if current == self._version:
            return []
        conn.execute("BEGIN")
        try:
            events = read_after(conn, thread_id, after_seq, limit, incarnation)
        finally:
            conn.execute("COMMIT")
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
        incarnation: int | None = None,
    ) -> list[Event]:
        """Return events after `after_seq`, waiting up to `timeout` for some.

        Returns early with [] when `stop` is set or the poller is closed.
        The loop is `waiting.wait_plan`'s; this drives it with a poll and a
        wait for the bell (or, without one, for `poll_interval`).
        """

        def read() -> list[Event]:
            events = self._poll(thread_id, after_seq, limit, incarnation)
            if events is None:
                raise Stopped
            return events

        def wake(seconds: float) -> None:
            if stop is not None and stop.is_set():
                raise Stopped
            bell = self._bell
            if bell is not None and not bell.closed:
                bell.wait(seconds)  # close() wakes it
                if self._closed:
                    raise Stopped
            elif self._wake.wait(min(self.poll_interval, seconds)):
                raise Stopped  # closed

        self._begin_wait()
        try:
            return waiting.drive(self._plan(thread_id, timeout), read, wake)
        except Stopped:
            return []
        finally:
            self._end_wait()

    async def await_(
        self,
        thread_id: str,
        after_seq: int,
        *,
        limit: int,
        timeout: float,
        stop: asyncio.Event | None = None,
        incarnation: int | None = None,
    ) -> list[Event]:
        """Async twin of `wait`; cancelling the awaiting task ends it at once.

        Each poll runs in a worker thread: opening the connection and reading
        are I/O, and must never stall the event loop (docs/semantics.md §8); the
        bell is awaited on the loop (the doorbell's thread wakes it). Returns []
        without polling again once `stop` is set or the poller is closed.
        """

        async def read() -> list[Event]:
            if self._closed or (stop is not None and stop.is_set()):
                raise Stopped
            events = await _POLL_HOP.run(
                functools.partial(self._poll, thread_id, after_seq, limit, incarnation)
            )
            if events is None:
                raise Stopped
            return events

        async def wake(seconds: float) -> None:
            bell = self._bell
            if bell is not None and not bell.closed:
                await bell.await_ring(seconds)
            else:
                await asyncio.sleep(min(self.poll_interval, seconds))

        self._begin_wait()
        try:
            return await waiting.adrive(self._plan(thread_id, timeout), read, wake)
        except Stopped:
            return []
        finally:
            self._end_wait()

    def _plan(self, thread_id: str, timeout: float) -> waiting.Plan:
        # Every wake-up re-reads (a bell names no thread): None for the plan.
        return waiting.wait_plan(thread_id, timeout, self.safety_interval)
