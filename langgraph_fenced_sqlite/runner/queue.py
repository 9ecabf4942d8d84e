"""In-process arrival order for `strategy="enqueue"`: one queue per (file, thread).

Invariant: only the head of a queue tries to claim its thread; the others
wait to be woken by the one before them leaving, so invocations of one
process run in the order they arrived. Across processes nothing is ordered:
a head refused by another process's run waits on the thread's event log (the
store's own wake-up: SQLite's doorbell, PostgreSQL's NOTIFY) from where it
stood when refused, and tries again as soon as a run's end lands there
(`status.RUN_ENDS`: `run_completed` and the other ends commit with their
release). On PostgreSQL it listens only to the commits that end a run (a
runs-only poller: channel `lgfs_runs`), asleep through the run's steps;
SQLite's doorbell rings for every commit of the file. On PostgreSQL one
waiting process at a time waits so (`Poller.lead`: a session advisory
lock); the others wait for that lock, asleep in the server, for longer
than a pause (`_FOLLOW`), and are not woken by the run's end to race for
the claim. A run's end that another run's start already follows wakes
nobody to try: that run won the claim. A wait that returns
steps' events at once (woken by them, or finding them as it began) counts
as quick: after `_HOT_WAKES` quick ones in a row (a hot thread, whose steps
keep committing within `_BUSY_GAP` of each other) a head rests `_COOL` after
each, so a waiter reads at most that often. A release that
logs nothing (a plain `release`, an expiry, a listener that failed) is
still found by the jittered exponential backoff that bounds each wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from ..core.status import RUN_ENDS, RUN_EVENTS
from ..errors import FencedSqliteError, ThreadBusy

if TYPE_CHECKING:
    from ..core.watch import Poller

__all__ = ["Place", "queued", "wake_head"]

_BACKOFF_MIN, _BACKOFF_MAX = 0.01, 0.5  # enqueue polling, seconds
_PAGE = 100  # events read per wake-up while waiting for a release
_FOLLOW = _BACKOFF_MAX  # longest wait to lead before a follower tries the claim itself
# A hot thread: `_HOT_WAKES` waits in a row ended by steps' events within
# `_BUSY_GAP` s; there a head rests `_COOL` s after each wake (its hand-off
# may be as late).
_BUSY_GAP, _HOT_WAKES, _COOL = 0.05, 3, 0.02

# --- in-process arrival order for "enqueue" -------------------------------------------------

_queues_lock = threading.Lock()
_queues: dict[tuple[str, str], deque[Place]] = {}


class Place:
    """An "enqueue" invocation's place in its thread's queue in this process.

    Only the head of a queue tries to claim; the others wait to be woken by
    the one before them leaving. The head polls the claim with jittered
    exponential backoff (other processes cannot wake it) and is woken at once
    when a run of this process releases the thread.
    """

    def __init__(
        self, key: tuple[str, str], wait: float, loop: asyncio.AbstractEventLoop | None
    ) -> None:
        """Join the back of `key`'s queue, to wait up to `wait` seconds (on `loop` if async)."""
        self._key, self._loop = key, loop
        self.event = threading.Event()
        self.aevent = asyncio.Event() if loop is not None else None
        self._deadline = time.monotonic() + wait
        self._delay = _BACKOFF_MIN
        self.busy: ThreadBusy | None = None
        # Where the head waits in the thread's log ((seq, incarnation)), once
        # read after a refusal (`looked`); the poller it waits with.
        self.tail: tuple[int, int] | None = None
        self.looked = False
        self._poller: Poller | None = None
        self._quick = 0  # waits in a row that steps' events ended within `_BUSY_GAP`
        with _queues_lock:
            _queues.setdefault(self._key, deque()).append(self)

    def leave(self) -> None:
        """Leave the queue (closing any poller) and wake whoever is now at its head."""
        if self._poller is not None:
            self._poller.close()
        self._dequeue()

    async def aleave(self) -> None:
        """Async twin of `leave` (the poller gives its loop's connection back)."""
        try:
            if self._poller is not None:
                await self._poller.aclose()
        finally:
            self._dequeue()

    def _dequeue(self) -> None:
        with _queues_lock:
            queue = _queues[self._key]
            queue.remove(self)
            if not queue:
                del _queues[self._key]
        wake_head(self._key)

    def wake(self) -> None:
        """Wake the waiter, from any thread."""
        if self.aevent is None:
            self.event.set()
            return
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody to wake
            self._loop.call_soon_threadsafe(self.aevent.set)  # type: ignore[union-attr]

    def my_turn(self) -> bool:
        """Return whether this place is at the head (clearing any stale wake-up)."""
        (self.event if self.aevent is None else self.aevent).clear()
        with _queues_lock:
            return _queues[self._key][0] is self

    def pause(self) -> float:
        """Return how long to wait before looking again; raise once out of time.

        Raises:
            ThreadBusy: `wait_timeout` has passed.
        """
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            busy, thread_id = self.busy, self._key[1]
            where = f"claimed by {busy.holder!r}" if busy else "awaited here by earlier calls"
            raise ThreadBusy(
                thread_id,
                busy.holder if busy else None,
                busy.latest_checkpoint_id if busy else None,
                message=f"thread {thread_id!r} stayed {where} for the whole wait_timeout",
            )
        pause = min(self._delay * random.uniform(0.5, 1.0), remaining)
        self._delay = min(self._delay * 2, _BACKOFF_MAX)
        return pause

    def look(self, tail: tuple[int, int] | None) -> None:
        """Record where the thread's log ended just after a refusal: the head waits after it."""
        self.tail, self.looked = tail, True

    def wait_release(self, saver: Any) -> None:
        """As the head, refused: wait for the run to end (an event past the tail) or `pause()`.

        Raises:
            ThreadBusy: `wait_timeout` has passed.
        """
        deadline = time.monotonic() + self.pause()
        if self.tail is not None:
            if self._poller is None:
                self._poller = saver._poller(keep=True, runs_only=True)
            led = self._poller.lead(self._key[1], self._follow(deadline), stop=self.event)
            if led and time.monotonic() >= deadline:  # led once its pause was over
                deadline = time.monotonic() + self.pause()
            while led and self.tail and (left := deadline - time.monotonic()) > 0:
                seq, inc = self.tail
                listening = time.monotonic()
                try:
                    got = self._poller.wait(
                        self._key[1],
                        seq,
                        limit=_PAGE,
                        timeout=left,
                        stop=self.event,
                        incarnation=inc,
                    )
                except FencedSqliteError:  # compacted past, re-created, a listener failed
                    self.tail, self.looked = None, False  # read again after this pause
                    break
                rest = self._rest(got, listening)
                if rest is None or (rest and self.event.wait(min(rest, left))):
                    return
        self.event.wait(max(0.0, deadline - time.monotonic()))

    async def await_release(self, saver: Any) -> None:
        """Async twin of `wait_release`."""
        deadline = time.monotonic() + self.pause()
        if self.tail is not None:
            if self._poller is None:
                self._poller = saver._poller(keep=True, runs_only=True)
            led = await self._poller.alead(self._key[1], self._follow(deadline), stop=self.aevent)
            if led and time.monotonic() >= deadline:
                deadline = time.monotonic() + self.pause()
            while led and self.tail and (left := deadline - time.monotonic()) > 0:
                seq, inc = self.tail
                listening = time.monotonic()
                try:
                    got = await self._poller.await_(
                        self._key[1],
                        seq,
                        limit=_PAGE,
                        timeout=left,
                        stop=self.aevent,
                        incarnation=inc,
                    )
                except FencedSqliteError:
                    self.tail, self.looked = None, False
                    break
                rest = self._rest(got, listening)
                if rest:
                    await self.await_(min(rest, left))
                if rest is None or self.aevent.is_set():  # type: ignore[union-attr]
                    return
        await self.await_(max(0.0, deadline - time.monotonic()))

    def _follow(self, deadline: float) -> float:
        # How long to wait to lead (`Poller.lead`): past this pause's
        # `deadline`, up to `_FOLLOW` (jittered), never past wait_timeout. A
        # follower need not try the claim meanwhile: the leader tries it at
        # every run's end, and hands the lead on once it has the thread (its
        # poller closes; a dead process's lock goes with its session). Only
        # a leader that stopped trying (a wedged process, a partitioned host)
        # keeps the others from a free thread, each for at most `_FOLLOW`.
        # (Trying at every pause, 8 processes on one thread were refused 0.8
        # times per run more, and each refusal takes CPU from the run.)
        now = time.monotonic()
        follow = now + random.uniform(_FOLLOW / 2, _FOLLOW)
        return max(0.0, min(self._deadline, max(deadline, follow)) - now)

    def _rest(self, got: list[Any], listening: float) -> float | None:
        # None if a wait (begun at `listening`) that returned `got` is over:
        # nothing came (timed out, or woken in this process) or a run's end
        # did. Else how long to rest before listening again: `_COOL` once
        # `_HOT_WAKES` waits in a row had steps' events within `_BUSY_GAP`
        # (a hot thread, whose every commit would wake and make read every
        # waiter of every process: measured with 8 processes on one thread,
        # 3x the CPU per run), else none: a run's last few steps come fast
        # and its end right after them, which a rest would make late. A
        # run's end that lands during a rest is read when it is over.
        if not got:
            return None
        self.tail = (got[-1].seq, self.tail[1])  # type: ignore[index]
        # A refused head tries again once a run ended, unless another run
        # began after that end (it won the race for the claim): then it
        # waits for that run's end, as a try would only be refused.
        # Nor does a run's start or end make a thread hot: a head that lost
        # the race listens again at once (resting, it would be late for the
        # end of the run that won).
        latest = next((e.kind for e in reversed(got) if e.kind in RUN_EVENTS), None)
        if latest in RUN_ENDS:
            return None
        if latest is not None:
            self._quick = 0
            return 0.0
        quick = time.monotonic() - listening < _BUSY_GAP
        self._quick = self._quick + 1 if quick else 0
        return _COOL if self._quick >= _HOT_WAKES else 0.0

    async def await_(self, timeout: float) -> None:
        """Wait (async) to be woken, or for `timeout` seconds."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.aevent.wait(), timeout)  # type: ignore[union-attr]


def queued(key: tuple[str, str]) -> int:
    """Return how many invocations wait in `key`'s queue in this process."""
    with _queues_lock:
        return len(_queues.get(key, ()))


def wake_head(key: tuple[str, str]) -> None:
    """Wake the invocation at the head of `key`'s queue, if any."""
    with _queues_lock:
        queue = _queues.get(key)
        head = queue[0] if queue else None
    if head is not None:
        head.wake()
