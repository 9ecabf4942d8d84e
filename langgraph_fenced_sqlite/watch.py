"""Watches: iterate over a thread's events forever, once each, in order.

Invariant: a watch resumes each wait from the last seq it delivered, so a
subscriber sees every event once with no gap, or gets `ReplayUnavailable`.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator

from .events import Event, EventPoller

__all__ = ["AsyncEventWatch", "EventWatch"]

# Each wait is bounded so a watch notices `close()` even if nobody signals it.
_WAIT_SLICE = 5.0


class EventWatch(Iterator[Event]):
    """A blocking iterator over a thread's events; `close()` ends it promptly."""

    def __init__(self, poller: EventPoller, thread_id: str, after_seq: int, batch: int) -> None:
        self._poller = poller
        self.thread_id = thread_id
        self.last_seq = after_seq
        """The seq of the last event delivered."""
        self._batch = batch
        self._buffer: list[Event] = []
        self._stop = threading.Event()
        self._closed = False

    def __iter__(self) -> EventWatch:
        return self

    def __next__(self) -> Event:
        while not self._buffer:
            if self._stop.is_set():
                self._finish()
                raise StopIteration
            self._buffer = self._poller.wait(
                self.thread_id,
                self.last_seq,
                limit=self._batch,
                timeout=_WAIT_SLICE,
                stop=self._stop,
            )
        event = self._buffer.pop(0)
        self.last_seq = event.seq
        return event

    def close(self) -> None:
        """End the watch; an iteration blocked in another thread returns promptly."""
        self._stop.set()

    def _finish(self) -> None:
        if not self._closed:
            self._closed = True
            self._poller.close()

    def __enter__(self) -> EventWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        self._finish()


class AsyncEventWatch(AsyncIterator[Event]):
    """An async iterator over a thread's events; cancel the task or `aclose()` it."""

    def __init__(self, poller: EventPoller, thread_id: str, after_seq: int, batch: int) -> None:
        self._poller = poller
        self.thread_id = thread_id
        self.last_seq = after_seq
        """The seq of the last event delivered."""
        self._batch = batch
        self._buffer: list[Event] = []
        self._closed = False

    def __aiter__(self) -> AsyncEventWatch:
        return self

    async def __anext__(self) -> Event:
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            self._buffer = await self._poller.await_(
                self.thread_id, self.last_seq, limit=self._batch, timeout=_WAIT_SLICE
            )
        event = self._buffer.pop(0)
        self.last_seq = event.seq
        return event

    async def aclose(self) -> None:
        """End the watch and close its connection."""
        if not self._closed:
            self._closed = True
            self._poller.close()

    async def __aenter__(self) -> AsyncEventWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
