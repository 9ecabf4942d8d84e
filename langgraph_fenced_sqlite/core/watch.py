"""Watches: iterate over a thread's events forever, once each, in order.

Invariant: a watch resumes each wait from the last seq it delivered, so a
subscriber sees every event once with no gap, or gets `ReplayUnavailable`.
A watch holds a connection only while it waits for events (see
`EventPoller`, and `postgres.watch.PgEventPoller` for the PostgreSQL store):
one dropped between iterations holds none, and closing the watch, or the
store it came from, ends a wait in progress promptly.
It remembers the incarnation of the first event it delivers, so a thread
deleted and re-created under it is `ReplayUnavailable`, never a silent gap.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Protocol

from .events import Event

__all__ = ["AsyncEventWatch", "EventWatch", "Poller"]


class Poller(Protocol):
    """What a watch waits with: each store's poller (`events.EventPoller` for
    SQLite, `postgres.watch.PgEventPoller` for PostgreSQL)."""

    @property
    def closed(self) -> bool:
        """Whether `close()` was called (or the store is closed)."""
        ...

    def close(self) -> None:
        """End any wait in progress promptly, never waiting for it; let the connection go."""
        ...

    async def aclose(self) -> None:
        """`close()` for an async caller (a store may give its loop's connection back)."""
        ...

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
        """Return events after `after_seq`, waiting up to `timeout` s; [] once stopped."""
        ...

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
        """Async twin of `wait`."""
        ...

    def lead(self, thread_id: str, seconds: float, stop: threading.Event | None = None) -> bool:
        """Become the one waiter of every process that tries `thread_id` when its run ends.

        Waits up to `seconds`; False if another leads meanwhile. A store
        that cannot elect one across processes answers True at once.
        """
        ...

    async def alead(
        self, thread_id: str, seconds: float, stop: asyncio.Event | None = None
    ) -> bool:
        """Async twin of `lead`."""
        ...


# Each wait is bounded so a watch notices `close()` even if nobody signals it
# (close() does wake a waiting watch). Each new wait opens a connection, which
# costs an idle watcher about 1 ms of CPU: long slices keep that rare.
_WAIT_SLICE = 60.0


class EventWatch(Iterator[Event]):
    """A blocking iterator over a thread's events; `close()` ends it promptly.

    Iteration ends (StopIteration) once the watch or its store is closed.
    """

    def __init__(
        self,
        poller: Poller,
        thread_id: str,
        after_seq: int,
        batch: int,
        incarnation: int | None = None,
    ) -> None:
        self._poller = poller
        self.thread_id = thread_id
        self.last_seq = after_seq
        """The seq of the last event delivered."""
        self.incarnation = incarnation
        """The incarnation of the events delivered (None until the first)."""
        self._batch = batch
        self._buffer: list[Event] = []
        self._stop = threading.Event()

    def __iter__(self) -> EventWatch:
        return self

    def __next__(self) -> Event:
        while not self._buffer:
            if self._stop.is_set() or self._poller.closed:
                raise StopIteration
            self._buffer = self._poller.wait(
                self.thread_id,
                self.last_seq,
                limit=self._batch,
                timeout=_WAIT_SLICE,
                stop=self._stop,
                incarnation=self.incarnation,
            )
        event = self._buffer.pop(0)
        self.last_seq, self.incarnation = event.seq, event.incarnation
        return event

    def close(self) -> None:
        """End the watch and release its connection.

        An iteration blocked in another thread returns promptly. A
        PostgreSQL store keeps the connection for its next wait.
        """
        self._stop.set()
        self._poller.close()

    def __enter__(self) -> EventWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncEventWatch(AsyncIterator[Event]):
    """An async iterator over a thread's events; cancel the task or `aclose()` it.

    Iteration ends (StopAsyncIteration) once the watch or its store is closed.
    """

    def __init__(
        self,
        poller: Poller,
        thread_id: str,
        after_seq: int,
        batch: int,
        incarnation: int | None = None,
    ) -> None:
        self._poller = poller
        self.thread_id = thread_id
        self.last_seq = after_seq
        """The seq of the last event delivered."""
        self.incarnation = incarnation
        """The incarnation of the events delivered (None until the first)."""
        self._batch = batch
        self._buffer: list[Event] = []
        # aclose() from another task while one awaits a poll: the awaiting
        # one sees `_stop` and never polls again.
        self._stop = asyncio.Event()

    def __aiter__(self) -> AsyncEventWatch:
        return self

    async def __anext__(self) -> Event:
        while not self._buffer:
            if self._stop.is_set() or self._poller.closed:
                raise StopAsyncIteration
            self._buffer = await self._poller.await_(
                self.thread_id,
                self.last_seq,
                limit=self._batch,
                timeout=_WAIT_SLICE,
                stop=self._stop,
                incarnation=self.incarnation,
            )
        event = self._buffer.pop(0)
        self.last_seq, self.incarnation = event.seq, event.incarnation
        return event

    async def aclose(self) -> None:
        """End the watch and release its connection (a waiting consumer ends promptly).

        A PostgreSQL store keeps the connection for its next wait on this loop.
        """
        self._stop.set()
        await self._poller.aclose()

    async def __aenter__(self) -> AsyncEventWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
