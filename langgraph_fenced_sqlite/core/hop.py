"""The one thread hop an async call pays: a store's own worker threads.

Invariant: every async call of a store runs its sync twin on a worker
thread of the store's `Hop`, and its outcome goes back to the caller's event
loop with one `call_soon_threadsafe`. That is the whole hop: measured here
it costs about half of `loop.run_in_executor` (whose concurrent future, its
callbacks and `wrap_future` chain come on top) and less than `to_thread`,
which also copies the context. A call whose await was cancelled before a
worker took it never runs; one a worker took runs to its end (it may commit:
docs/caveats.md). Threads are made only when no worker is idle, up to
`limit`; beyond that, calls queue in order. `close()` lets the workers
finish what is queued (it finds the store closed) and exit, without waiting
for them: it may itself be running on one (`aclose`). Workers are daemon
threads; at interpreter exit every open hop is closed and its workers
joined, so a call in progress finishes (as `ThreadPoolExecutor`'s would).
"""

from __future__ import annotations

import asyncio
import atexit
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["ASYNC_WORKERS", "Hop", "HopClosed", "on_worker"]

T = TypeVar("T")

# Worker threads of a store's hop (made only as calls need them).
ASYNC_WORKERS = 32

# A worker's item: the caller's loop, its future, the call. None: exit.
_Item = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[[], Any]] | None

_OPEN: weakref.WeakSet[Hop] = weakref.WeakSet()

# `on` is set in every hop's worker threads (`on_worker`).
_WORKER = threading.local()


def on_worker() -> bool:
    """Return whether the calling thread is a hop's worker, running an async caller's call."""
    return getattr(_WORKER, "on", False)


class HopClosed(RuntimeError):
    """Raised by `Hop.run` after `close()`: the call was not run."""


class Hop:
    """Worker threads that run a store's sync calls for its async callers."""

    def __init__(self, limit: int, name: str) -> None:
        """Make no thread yet: the first call makes the first.

        Args:
            limit: At most this many worker threads.
            name: Their names' prefix.
        """
        self._limit = limit
        self._name = name
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # one count per worker waiting for work
        self._lock = threading.Lock()  # guards the two below
        self._threads: list[threading.Thread] = []
        self._closed = False
        _OPEN.add(self)
        # Workers hold the queue, never the hop: a hop dropped unclosed (its
        # store dropped without close()) is collected, and its workers exit.
        weakref.finalize(self, _stop, self._queue, self._threads)

    async def run(self, fn: Callable[[], T]) -> T:
        """Run `fn()` on a worker thread and return (or raise) what it did.

        Raises:
            HopClosed: the hop is closed (nothing ran).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._submit((loop, future, fn))
        return await future

    def close(self) -> None:
        """Take no more calls; the workers exit once the queued ones have run. Never waits."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            n = len(self._threads)
        for _ in range(n):
            self._queue.put(None)

    def _submit(self, item: _Item) -> None:
        with self._lock:
            if self._closed:
                raise HopClosed("the store's worker threads are closed")
            self._queue.put(item)
            if self._idle.acquire(blocking=False):
                return  # an idle worker takes it
            if len(self._threads) < self._limit:
                thread = threading.Thread(
                    target=_work,
                    args=(self._queue, self._idle),
                    name=f"{self._name}_{len(self._threads) + 1}",
                    daemon=True,
                )
                self._threads.append(thread)
                thread.start()

    def _join(self) -> None:
        self.close()
        me = threading.current_thread()
        for thread in list(self._threads):
            if thread is not me:
                thread.join()


def _stop(work: queue.SimpleQueue[_Item], threads: list[threading.Thread]) -> None:
    # A collected hop's workers: one exit each, after what is queued.
    for _ in threads:
        work.put(None)


def _work(work: queue.SimpleQueue[_Item], idle: threading.Semaphore) -> None:
    _WORKER.on = True
    get = work.get
    while True:
        item = get()
        if item is None:
            return
        loop, future, fn = item
        del item
        if future.cancelled():  # cancelled while queued: never runs
            idle.release()
            continue
        try:
            outcome: tuple[Any, BaseException | None] = (fn(), None)
        except BaseException as exc:  # handed to the caller, as an executor does
            outcome = (None, exc)
        # Idle before the caller wakes: its next call finds this thread,
        # rather than making another.
        idle.release()
        try:
            loop.call_soon_threadsafe(_settle, future, *outcome)
        except RuntimeError:
            pass  # the caller's loop is closed: nobody is waiting
        del loop, future, fn, outcome


def _settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():  # cancelled meanwhile: the outcome is dropped
        return
    if exc is None:
        future.set_result(result)
    else:
        future.set_exception(exc)


@atexit.register
def _close_all() -> None:
    # Daemon workers still run while atexit handlers do: let each finish.
    for hop in list(_OPEN):
        hop._join()
