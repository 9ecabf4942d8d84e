"""In-process arrival order for `strategy="enqueue"`: one queue per (file, thread).

Invariant: only the head of a queue tries to claim its thread; the others
wait to be woken by the one before them leaving, so invocations of one
process run in the order they arrived. Across processes nothing is ordered:
the head polls the claim with jittered exponential backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections import deque

from .errors import ThreadBusy

__all__ = ["Place", "queued", "wake_head"]

_BACKOFF_MIN, _BACKOFF_MAX = 0.01, 0.5  # enqueue polling, seconds

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
        with _queues_lock:
            _queues.setdefault(self._key, deque()).append(self)

    def leave(self) -> None:
        """Leave the queue and wake whoever is now at its head."""
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
