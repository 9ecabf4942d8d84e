"""Leases: claims held for a `with` block or a run, renewed in the background.

Invariant: a lease releases its claim on exit whatever happened inside, and
only with its own token, so a lease that lost its claim can never release
its successor's. Renewal that finds the claim gone marks the lease `lost`
(and stops a run); any other renewal failure is logged and retried until the
claim would expire. A run is stopped at most once, for the first reason
found: its claim taken over, a cancel asked for it, or its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from langchain_core.runnables import RunnableConfig

from ..clock import to_seconds
from ..errors import FencedSqliteError, RunCancelled, RunTimedOut, StaleClaim
from .claims import Claim

if TYPE_CHECKING:
    from langgraph.runtime import RunControl

    from .fenced_store import FencedStore
    from .saver_claims import ClaimsBase

__all__ = ["AsyncLease", "Lease"]

T = TypeVar("T")

logger = logging.getLogger("langgraph_fenced_sqlite.lease")


class _LeaseBase:
    def __init__(
        self,
        saver: ClaimsBase,
        thread_id: str,
        holder: str,
        ttl: float | timedelta,
        renew_every: float | timedelta | None,
        *,
        take_over: bool,
    ) -> None:
        self.saver = saver
        self.thread_id = thread_id
        self.holder = holder
        self.ttl = to_seconds(ttl, "ttl")
        self.renew_every = (
            self.ttl / 3 if renew_every is None else to_seconds(renew_every, "renew_every")
        )
        self._take_over = take_over
        self._claim: Claim | None = None
        self.lost = False
        """True once a renewal found the claim taken over, released or deleted."""

    @property
    def claim(self) -> Claim:
        """The claim held (the latest renewal of it)."""
        if self._claim is None:
            raise RuntimeError("the lease is not held: enter it first")
        return self._claim

    @property
    def token(self) -> int:
        """The fencing token of the claim."""
        return self.claim.token

    def config(self, config: RunnableConfig | None = None, **configurable: Any) -> RunnableConfig:
        """Return a config for the graph carrying the thread id and the token."""
        return self.claim.config(config, **configurable)

    def _renew_failed(self, exc: BaseException) -> bool:
        """Record a failed renewal; return True when renewing should stop."""
        if isinstance(exc, StaleClaim):
            self.lost = True
            logger.warning("lease on %r lost: %s", self.thread_id, exc)
            return True
        expires = self._claim.expires_at if self._claim else 0.0
        if self.saver.clock.now() >= expires:
            logger.error("lease on %r: renewal kept failing past expiry: %r", self.thread_id, exc)
            return True
        logger.warning("lease on %r: renewal failed, retrying: %r", self.thread_id, exc)
        return False


class Lease(_LeaseBase):
    """A claim held while a `with` block runs, renewed by a daemon thread.

    Use `saver.lease(thread_id, holder, ttl=30)`.
    """

    def __enter__(self) -> Lease:
        grant = self.saver.take_over if self._take_over else self.saver.claim
        self._claim = grant(self.thread_id, self.holder, self.ttl)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._renew_loop, name=f"lease-{self.thread_id}", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.saver.release(self.thread_id, self.claim.token)

    def _renew_loop(self) -> None:
        interval = self.renew_every
        while not self._stop.wait(interval):
            try:
                self._claim = self.saver.renew(self.thread_id, self.claim.token, self.ttl)
                interval = self.renew_every
            except Exception as exc:  # noqa: BLE001 - every failure is judged below
                if self._renew_failed(exc):
                    return
                interval = min(self.renew_every, 0.5)


class AsyncLease(_LeaseBase):
    """A claim held while an `async with` block runs, renewed by a task.

    Use `saver.alease(thread_id, holder, ttl=30)`.
    """

    async def __aenter__(self) -> AsyncLease:
        grant = self.saver.atake_over if self._take_over else self.saver.aclaim
        pending = asyncio.ensure_future(grant(self.thread_id, self.holder, self.ttl))
        try:
            self._claim = await asyncio.shield(pending)
        except asyncio.CancelledError:
            # The grant runs on a worker thread that cancellation cannot stop,
            # so it may still be granted: wait for it and give it back, or the
            # thread would stay claimed by nobody until the ttl runs out.
            with contextlib.suppress(Exception):  # not granted: nothing to give back
                granted = await pending
                await self.saver.arelease(self.thread_id, granted.token)
            raise
        self._task = asyncio.create_task(self._renew_loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        # Shielded: a cancelled block must still give its claim back.
        await asyncio.shield(self.saver.arelease(self.thread_id, self.claim.token))

    async def _renew_loop(self) -> None:
        interval = self.renew_every
        while True:
            await asyncio.sleep(interval)
            try:
                self._claim = await self.saver.arenew(self.thread_id, self.claim.token, self.ttl)
                interval = self.renew_every
            except Exception as exc:  # noqa: BLE001 - every failure is judged below
                if self._renew_failed(exc):
                    return
                interval = min(self.renew_every, 0.5)


# --- runs: renewed by one thread per runner, stopped from it ---------------------------------

_RENEWER_IDLE = 1.0  # seconds a renewer thread lingers with nothing to renew


@dataclass(frozen=True)
class Stop:
    """Why a run was stopped: `kind` is "superseded", "cancelled" or "timed_out"."""

    kind: str
    error: FencedSqliteError


class RunLease:
    """One run's claim in flight: when to renew it, and how to stop the run.

    A stop drains the run's `RunControl` (LangGraph then starts no further
    step) and, for an async run awaiting the graph, cancels its task from the
    task's own loop, so a node awaiting a model call stops at once.
    """

    def __init__(
        self, claim: Claim, run_id: str, control: RunControl, timeout: float | None
    ) -> None:
        """Hold `claim` for run `run_id`, to be stopped through `control` (and its task)."""
        self.claim, self.run_id, self.control, self.timeout = claim, run_id, control, timeout
        self.due = 0.0
        self.deadline: float | None = None
        self.stopped: Stop | None = None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._inside = False  # the task is awaiting the graph: a cancel lands there
        self._cancels = 0  # cancels this lease sent to the task and not yet taken back

    def stop(self, kind: str, error: FencedSqliteError) -> None:
        """Stop the run (first reason wins), from any thread."""
        with self._lock:
            if self.stopped is not None:
                return
            self.stopped = Stop(kind, error)
            loop = self._loop
        self.control.request_drain(kind)
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nothing left to stop
                loop.call_soon_threadsafe(self._cancel_task)

    def _cancel_task(self) -> None:  # on the task's loop, so `_inside` cannot change meanwhile
        if self._inside and self._task is not None and not self._task.done():
            self._cancels += 1
            self._task.cancel()

    async def inside(self, step: Callable[[], Awaitable[T]]) -> T:
        """Await `step()` (the graph, or its next chunk) where a stop may cancel it.

        Raises:
            FencedSqliteError: the run was stopped before this step began.
        """
        with self._lock:  # a stop either sees the loop (and cancels there) or is seen here
            self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
            stopped = self.stopped
        if stopped is not None:
            raise stopped.error
        self._inside = True
        try:
            return await step()
        finally:
            self._inside = False

    def own_cancel(self, exc: BaseException) -> bool:
        """Say whether `exc` is a cancel this lease sent (and take it back from the task).

        False when the task was also cancelled by someone else: that cancel
        must propagate.
        """
        if not isinstance(exc, asyncio.CancelledError) or not self._cancels:
            return False
        task, self._cancels = self._task, 0
        uncancel = getattr(task, "uncancel", None)  # Python 3.11+
        return uncancel is None or uncancel() == 0


class RunRenewer:
    """One daemon thread per runner that renews every run's claim when due.

    A thread rather than a task per run: it keeps renewing while an event
    loop is blocked by a synchronous node, and costs nothing per invocation.
    Each renewal also reads whether a cancel was asked for the run; the
    thread also wakes at each run's deadline.
    """

    def __init__(self, saver: FencedStore, ttl: float, every: float) -> None:
        """Renew claims on `saver` for `ttl` seconds, every `every` seconds."""
        self._saver, self._ttl, self._every = saver, ttl, every
        self._cond = threading.Condition()
        self._runs: set[RunLease] = set()
        self._thread: threading.Thread | None = None

    def add(self, run: RunLease) -> None:
        """Renew `run` from now on (starting the thread if needed); its deadline starts now."""
        with self._cond:
            now = time.monotonic()
            run.due = now + self._every
            if run.timeout is not None:
                run.deadline = now + run.timeout
            self._runs.add(run)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="runner-renew", daemon=True)
                self._thread.start()
            self._cond.notify()

    def remove(self, run: RunLease) -> None:
        """Stop renewing `run`."""
        with self._cond:
            self._runs.discard(run)

    def renew_now(self, thread_id: str) -> None:
        """Renew the runs on `thread_id` at once (a cancel was just asked in this process)."""
        with self._cond:
            for run in self._runs:
                if run.claim.thread_id == thread_id:
                    run.due = 0.0
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    if not self._runs:
                        self._cond.wait(_RENEWER_IDLE)
                        if not self._runs:
                            self._thread = None
                            return
                        continue
                    now = time.monotonic()
                    due = [r for r in self._runs if r.due <= now]
                    late = [r for r in self._runs if _deadline(r) <= now]
                    if due or late:
                        break
                    wake = min(min(r.due, _deadline(r)) for r in self._runs)
                    self._cond.wait(wake - now)
            for run in late:
                assert run.timeout is not None
                run.stop("timed_out", RunTimedOut(run.claim.thread_id, run.run_id, run.timeout))
            for run in due:
                self._renew(run)

    def _renew(self, run: RunLease) -> None:
        try:
            run.claim, cancel_by = self._saver.renew_run(
                run.claim.thread_id, run.claim.token, self._ttl
            )
            run.due = time.monotonic() + self._every
            if cancel_by is not None:
                run.stop("cancelled", RunCancelled(run.claim.thread_id, run.run_id, cancel_by))
        except StaleClaim as exc:
            with self._cond:
                active = run in self._runs  # else it just ended: not a loss
                self._runs.discard(run)
            if active:
                logger.warning("run %s lost its claim: %s", run.run_id, exc)
                run.stop("superseded", exc)
        except Exception as exc:  # noqa: BLE001 - judged by the claim's expiry below
            if not run.claim.live(self._saver.clock.now()) or self._saver.closed:
                logger.error("run %s: renewal kept failing past expiry: %r", run.run_id, exc)
                self.remove(run)
            else:
                logger.warning("run %s: renewal failed, retrying: %r", run.run_id, exc)
                run.due = time.monotonic() + min(self._every, 0.5)


# The end event of a run the runner stopped, by why (a superseded run logs nothing).
_STOP_KINDS = {"cancelled": "run_cancelled", "timed_out": "run_timed_out"}


@dataclass(frozen=True)
class Outcome:
    """How a run that raised ends: the event to log (None: none) and what to raise."""

    kind: str | None
    error: BaseException
    data: dict[str, Any] = field(default_factory=dict)


def judge_end(run: RunLease, exc: BaseException) -> Outcome:
    """Judge how a run ended from what it raised (on the run's own thread or loop)."""
    stop, ours = run.stopped, run.own_cancel(exc)
    why: dict[str, Any] = {}
    if stop is not None and stop.kind == "cancelled":
        why = {"reason": "cancel_requested", "by": getattr(stop.error, "by", None)}
    elif stop is not None and stop.kind == "timed_out":
        why = {"timeout": getattr(stop.error, "timeout", None)}
    if isinstance(exc, GeneratorExit) or (isinstance(exc, asyncio.CancelledError) and not ours):
        # The consumer went away: it gets its own exception back.
        if stop is not None:
            return Outcome(_STOP_KINDS.get(stop.kind), exc, why)
        reason = "stream_closed" if isinstance(exc, GeneratorExit) else "task_cancelled"
        return Outcome("run_cancelled", exc, {"reason": reason})
    # What the stop itself makes the graph raise: our cancel, LangGraph's
    # drain, or (taken over) the fence refusing a write.
    fenced = isinstance(exc, StaleClaim) and stop is not None and stop.kind == "superseded"
    # Imported here: langgraph.errors loads langgraph.types and, through it,
    # langchain_core's tracers and langsmith (about 0.7 s), which `lgfs` and
    # every saver that never runs a FencedRunner would pay at import.
    from langgraph.errors import GraphDrained

    if stop is not None and (ours or exc is stop.error or isinstance(exc, GraphDrained) or fenced):
        return Outcome(_STOP_KINDS.get(stop.kind), stop.error, why)
    return Outcome("run_failed", exc, {"error": type(exc).__name__, "message": str(exc)[:500]})


def raise_for(outcome: Outcome, exc: BaseException) -> NoReturn:
    """Raise what the caller of a run that raised `exc` gets (chained to `exc`)."""
    if outcome.error is exc:
        raise exc
    raise outcome.error from exc


def _deadline(run: RunLease) -> float:
    """When the renewer must stop `run` for its timeout (never, once stopped)."""
    if run.deadline is None or run.stopped is not None:
        return float("inf")
    return run.deadline
