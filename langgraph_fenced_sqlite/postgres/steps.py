"""One commit per graph step on PostgreSQL: a step's writes wait for its put.

Invariant: a fenced `put_writes` that names the put expected to follow it
(`Step.awaits`) waits in `Steps`, bounded and adaptive by the SQLite
store's rules (`core/steps.py`'s `FollowPolicy`), until that put (`closes`)
takes it into its own transaction, or the bound runs out and it runs
alone. A write leaves the queue exactly once: taken by a put (RUNNING,
answered only after the COMMIT that holds it, or its failure) or by its
own caller (DONE, never run later). A waiter is a thread (`wait_for_put`,
`answered`) or a coroutine (`await_put`, `aanswered`, woken through
`Step.notify` from whichever thread the put ran on); either kind is taken
by a put of either kind. `PgConnection` sends what a put took
(`postgres/connection.py`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from ..core import steps as follow
from ..core.steps import DONE, PENDING, RUNNING, FollowPolicy, Key

__all__ = ["Step", "Steps"]

# How long past its arrival a write awaiting its put may wait at most, a
# commit in flight included (the policy's bound runs down only after it),
# as a multiple of the bound's most (`follow.FOLLOW_MAX_S`).
_FOLLOW_DEADLINE = 4


class Step:
    """A fenced write waiting for its put (`Steps`); the fields `FollowPolicy` reads."""

    __slots__ = (
        "arrived",
        "awaits",
        "batch",
        "closes",
        "deadline",
        "error",
        "followed",
        "job",
        "op",
        "result",
        "state",
        "wake",
    )

    def __init__(
        self, op: str, job: Any, batch: Any, awaits: Key | None, closes: Key | None = None
    ) -> None:
        self.op, self.job, self.batch = op, job, batch
        self.awaits, self.closes = awaits, closes
        self.followed = False
        self.arrived = time.monotonic()
        self.deadline = self.arrived + _FOLLOW_DEADLINE * follow.FOLLOW_MAX_S
        self.state = PENDING
        self.result: Any = None
        self.error: BaseException | None = None
        # An async waiter's future (`Steps.await_put`), set while it waits.
        self.wake: asyncio.Future[None] | None = None

    def notify(self) -> None:
        """Wake the coroutine waiting on this step, from any thread (under `Steps._changed`)."""
        wake = self.wake
        if wake is not None:
            self.wake = None
            try:
                wake.get_loop().call_soon_threadsafe(_settle, wake)
            except RuntimeError:  # its loop is closed: nobody is waiting
                pass


def _settle(wake: asyncio.Future[None]) -> None:
    if not wake.done():
        wake.set_result(None)


class Steps(FollowPolicy):
    """The writes waiting for their step's put, and the policy of the wait."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._changed = threading.Condition(self._mutex)
        self._queue: list[Step] = []
        self._following()
        self._in_flight = 0  # fenced writes being committed now (a pool runs several)

    def wait_for_put(self, step: Step) -> bool:
        """Queue `step` and wait (bounded) for its put; True once a put took it.

        False: no put came (or no wait was due); `step` is out of the queue
        and its caller runs it alone. True: wait for `answered`.
        """
        with self._mutex:
            self._queue.append(step)
            try:
                self._follow(step)
            except BaseException:
                # Interrupted while queued: it must never run later. (Once a
                # put took it, it may still commit: the caller never hears.)
                if step.state == PENDING:
                    self._queue.remove(step)
                    step.state = DONE
                raise
            if step.state == PENDING:  # ran out, or no wait was due
                self._queue.remove(step)
                step.state = DONE
                return False
            return True

    def answered(self, step: Step) -> Any:
        """Wait until the put that took `step` answered it; return or raise its outcome."""
        with self._mutex:
            while step.state != DONE:
                self._changed.wait()
        if step.error is not None:
            raise step.error
        return step.result

    async def await_put(self, step: Step) -> bool:
        """Async twin of `wait_for_put`: the same wait, as a coroutine that holds no thread."""
        loop = asyncio.get_running_loop()
        with self._mutex:
            self._queue.append(step)
            started = self._follow_start(step, asynchronous=True)
        try:
            if started is not None:
                bound, backoff = started
                try:
                    while True:
                        with self._mutex:
                            left = self._follow_left(step, bound)
                            if left <= 0:
                                break
                            wake = step.wake = loop.create_future()
                        timer = loop.call_later(left, _settle, wake)
                        try:
                            await wake
                        finally:
                            timer.cancel()
                finally:
                    with self._mutex:
                        step.wake = None
                        self._waiting -= 1
                with self._mutex:
                    self._follow_done(step, backoff, asynchronous=True)
        except BaseException:
            # Cancelled while queued: it must never run later (as `wait_for_put`).
            with self._mutex:
                if step.state == PENDING:
                    self._queue.remove(step)
                    step.state = DONE
            raise
        with self._mutex:
            if step.state == PENDING:  # ran out, or no wait was due
                self._queue.remove(step)
                step.state = DONE
                return False
            return True

    async def aanswered(self, step: Step) -> Any:
        """Async twin of `answered`."""
        loop = asyncio.get_running_loop()
        while True:
            with self._mutex:
                if step.state == DONE:
                    break
                wake = step.wake = loop.create_future()
            await wake
        if step.error is not None:
            raise step.error
        return step.result

    def take(self, closes: Key, joins: bool) -> list[Step]:
        """A put whose parent is `closes` arrived: return the writes it takes (`joins`).

        Not `joins` (a put that cannot share its batch): the writes awaiting
        it only stop waiting, and run alone.
        """
        put = Step("put", None, None, None, closes)
        with self._mutex:
            if not self._queue:
                self._put_seen(closes)  # as `_closing` would have
                return []
            # Those it takes wake once, when answered; the others now.
            self._closing(put, wake=not joins)
            if not joins:
                for s in self._queue:
                    if s.followed:
                        s.notify()
                return []
            taken = [s for s in self._queue if s.awaits == closes and s.state == PENDING]
            for s in taken:
                s.state = RUNNING
                self._queue.remove(s)
            return taken

    def answer(self, steps: list[Step]) -> None:
        """Hand each of `steps` its outcome (set already) and wake its caller."""
        with self._mutex:
            for s in steps:
                s.state = DONE
                s.notify()
            self._changed.notify_all()

    def committed(self) -> None:
        """A call that writes committed (`stats()["commits"]`)."""
        with self._mutex:
            self._stats["commits"] += 1

    def begin(self) -> float:
        """A fenced write starts committing; return when."""
        now = time.monotonic()
        with self._mutex:
            self._in_flight += 1
            if self._leading_since is None:
                self._leading_since = now
        return now

    def end(self, began: float, committed: bool) -> None:
        """The fenced write begun at `began` ended (`committed`: and its COMMIT counts)."""
        now = time.monotonic()
        with self._mutex:
            if committed:
                self._timed(now - began, counted=False)  # `run` counts each COMMIT
            self._in_flight -= 1
            if not self._in_flight:
                self._leading_since = None
                self._ended = now
