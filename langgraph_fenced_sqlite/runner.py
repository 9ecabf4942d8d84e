"""`FencedRunner`: run a compiled LangGraph graph under a claim on its thread.

Invariant: every invocation runs under a claim of its own, with a fresh run
id in its checkpoints' metadata, taken with `saver.begin_run` and given back
with `saver.end_run` (see `runs.py`: each is one commit with its lifecycle
event), so the runner adds exactly two commits per invocation, plus one
renewal per `renew_every` for long runs. An invocation that lost its claim
records nothing and releases nothing: the run that superseded it has already
logged it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Generator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.graph.state import StateGraph

from .claims import Claim
from .clock import to_seconds
from .errors import StaleClaim, ThreadBusy, bad_argument
from .runs import RUN_STRATEGIES
from .saver import FencedSqliteSaver
from .validation import check_name, config_target

__all__ = ["STRATEGIES", "FencedRunner"]

logger = logging.getLogger("langgraph_fenced_sqlite.runner")

STRATEGIES = RUN_STRATEGIES
"""What an invocation does when its thread is busy (see `FencedRunner.invoke`)."""

_BACKOFF_MIN, _BACKOFF_MAX = 0.01, 0.5  # enqueue polling, seconds
_RENEWER_IDLE = 1.0  # seconds a renewer thread lingers with nothing to renew


@dataclass(eq=False)
class _Run:
    """One invocation in flight: its claim, and when to renew it next."""

    claim: Claim
    run_id: str
    due: float = 0.0


@dataclass(frozen=True)
class _Call:
    """One invocation's validated arguments."""

    config: RunnableConfig
    key: tuple[str, str]  # (real path of the file, thread id): its local queue
    strategy: str
    wait: float

    @property
    def thread_id(self) -> str:
        return self.key[1]

    @property
    def run_id(self) -> str:
        return self.config["metadata"]["run_id"]


# --- in-process arrival order for "enqueue" -------------------------------------------------

_queues_lock = threading.Lock()
_queues: dict[tuple[str, str], deque[_Place]] = {}


class _Place:
    """An "enqueue" invocation's place in its thread's queue in this process.

    Only the head of a queue tries to claim; the others wait to be woken by
    the one before them leaving. The head polls the claim with jittered
    exponential backoff (other processes cannot wake it) and is woken at once
    when a run of this process releases the thread.
    """

    def __init__(self, call: _Call, loop: asyncio.AbstractEventLoop | None) -> None:
        self._key, self._loop = call.key, loop
        self.event = threading.Event()
        self.aevent = asyncio.Event() if loop is not None else None
        self._deadline = time.monotonic() + call.wait
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
        _wake_head(self._key)

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


def _wake_head(key: tuple[str, str]) -> None:
    with _queues_lock:
        queue = _queues.get(key)
        head = queue[0] if queue else None
    if head is not None:
        head.wake()


# --- background renewal ---------------------------------------------------------------------


class _Renewer:
    """One daemon thread per runner that renews every claim in flight when due.

    A thread rather than a task per run: it keeps renewing while an event
    loop is blocked by a synchronous node, and costs nothing per invocation.
    """

    def __init__(self, saver: FencedSqliteSaver, ttl: float, every: float) -> None:
        self._saver, self._ttl, self._every = saver, ttl, every
        self._cond = threading.Condition()
        self._runs: set[_Run] = set()
        self._thread: threading.Thread | None = None

    def add(self, run: _Run) -> None:
        """Renew `run` every `renew_every` from now on (starting the thread if needed)."""
        with self._cond:
            run.due = time.monotonic() + self._every
            self._runs.add(run)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="runner-renew", daemon=True)
                self._thread.start()
            self._cond.notify()

    def remove(self, run: _Run) -> None:
        """Stop renewing `run`."""
        with self._cond:
            self._runs.discard(run)

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
                    if due:
                        break
                    self._cond.wait(min(r.due for r in self._runs) - now)
            for run in due:
                self._renew(run)

    def _renew(self, run: _Run) -> None:
        try:
            run.claim = self._saver.renew(run.claim.thread_id, run.claim.token, self._ttl)
            run.due = time.monotonic() + self._every
        except StaleClaim as exc:
            with self._cond:
                active = run in self._runs  # else it just ended: not a loss
                self._runs.discard(run)
            if active:
                logger.warning("run %s lost its claim: %s", run.run_id, exc)
        except Exception as exc:  # noqa: BLE001 - judged by the claim's expiry below
            if not run.claim.live(self._saver.clock.now()) or self._saver.closed:
                logger.error("run %s: renewal kept failing past expiry: %r", run.run_id, exc)
                self.remove(run)
            else:
                logger.warning("run %s: renewal failed, retrying: %r", run.run_id, exc)
                run.due = time.monotonic() + min(self._every, 0.5)


def _failure(exc: BaseException) -> dict[str, Any]:
    return {"error": type(exc).__name__, "message": str(exc)[:500]}


# --- the runner -------------------------------------------------------------------------


class FencedRunner:
    """Run a compiled graph so that one invocation at a time writes each thread.

    Every invocation claims its thread (a fresh fencing token), runs the graph
    with that token and a fresh run id, renews the claim in the background,
    logs its lifecycle in the thread's event log, and releases the claim
    however it ends. Safe from any number of threads, tasks and processes.
    """

    def __init__(
        self,
        graph: Any,
        saver: FencedSqliteSaver,
        *,
        holder: str | None = None,
        ttl: float | timedelta = 30.0,
        renew_every: float | timedelta | None = None,
    ) -> None:
        """Wrap `graph`, whose checkpointer must be `saver` (or unset).

        The runner's copy of the graph uses `saver.for_graph(graph)`: the
        types its schemas declare are read back with no configuration.

        Args:
            graph: A compiled LangGraph graph (`StateGraph(...).compile(...)`).
            saver: The store every invocation claims its thread in.
            holder: Who claims (shown in `ThreadBusy`); defaults to
                `"<hostname>:<pid>:<random>"`.
            ttl: How long a claim lives without renewal. A crashed process's
                threads are free again after this.
            renew_every: Seconds between renewals; defaults to `ttl / 3`.

        Raises:
            InvalidArgument: (a `ValueError`) the graph is compiled with
                another checkpointer, or a bad `ttl`/`renew_every`/`holder`.
        """
        if not isinstance(saver, FencedSqliteSaver):
            raise bad_argument("saver", f"expected a FencedSqliteSaver, got {type(saver).__name__}")
        current = getattr(graph, "checkpointer", None)
        # LangGraph's strict mode compiles with a copy of the saver (same
        # connection, derived serializer); that copy is the saver too.
        if current is not None and not (
            isinstance(current, FencedSqliteSaver) and current._engine is saver._engine
        ):
            raise bad_argument("graph", "compile it with checkpointer=saver (or no checkpointer)")
        if isinstance(getattr(graph, "builder", None), StateGraph):
            # Bound to the graph's schema types, so a worker that only resumes
            # (reads before it writes anything) in a fresh process rebuilds them.
            graph = graph.copy(update={"checkpointer": (current or saver).for_graph(graph)})
        elif current is None:
            graph = graph.copy(update={"checkpointer": saver})
        self.graph = graph
        self.saver = saver
        self.holder = check_name(
            holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}", "holder"
        )
        self.ttl = to_seconds(ttl, "ttl")
        self.renew_every = (
            self.ttl / 3 if renew_every is None else to_seconds(renew_every, "renew_every")
        )
        self._renewer = _Renewer(saver, self.ttl, self.renew_every)
        self._queue_path = os.path.realpath(saver.path)

    # --- public API ---------------------------------------------------------------------

    def invoke(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        strategy: str = "reject",
        wait_timeout: float | timedelta = 60.0,
        **kwargs: Any,
    ) -> dict[str, Any] | Any:
        """Run the graph on the config's thread under a claim, as `graph.invoke` does.

        Args:
            input: The graph input (`None` or a `Command` to resume).
            config: A `RunnableConfig` naming the thread in
                `config["configurable"]["thread_id"]`; a run id in
                `config["metadata"]["run_id"]` is used, else one is made.
            strategy: What to do when the thread is busy: `"reject"` raises
                `ThreadBusy` at once; `"enqueue"` waits its turn (in arrival
                order within this process) up to `wait_timeout`; `"interrupt"`
                takes the thread over, fencing off the run in progress, and
                runs from the last durable checkpoint; `"rollback"` does the
                same, then removes the superseded run's checkpoints and writes.
            wait_timeout: How long `"enqueue"` waits, in seconds.
            **kwargs: Passed to `graph.invoke` (`durability`, `context`...).

        Returns:
            What `graph.invoke` returns.

        Raises:
            ThreadBusy: the thread is busy (`"reject"`) or stayed busy for
                `wait_timeout` (`"enqueue"`); nothing ran.
            StaleClaim: another invocation superseded this one (its end is
                not logged: the one that took over logged `run_superseded`).
            StoreError: the claim or release could not commit (an unreleased
                claim expires after `ttl`).
        """
        call = self._prepare(config, strategy, wait_timeout)
        run = self._begin(call)
        try:
            result = self.graph.invoke(input, run.claim.config(call.config), **kwargs)
            state = self._state_to_check(run, kwargs)
            static = state is not None and bool(self.graph.get_state(state).next)
        except BaseException as exc:
            self._fail(run, call, exc)
            raise
        self._complete(run, call, static)
        return result

    async def ainvoke(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        strategy: str = "reject",
        wait_timeout: float | timedelta = 60.0,
        **kwargs: Any,
    ) -> dict[str, Any] | Any:
        """Async twin of `invoke`; a cancelled task still releases its claim."""
        call = self._prepare(config, strategy, wait_timeout)
        run = await self._abegin(call)
        try:
            result = await self.graph.ainvoke(input, run.claim.config(call.config), **kwargs)
            state = self._state_to_check(run, kwargs)
            static = state is not None and bool((await self.graph.aget_state(state)).next)
        except BaseException as exc:
            await _shielded(self._fail, run, call, exc)
            raise
        await _shielded(self._complete, run, call, static)
        return result

    def stream(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        strategy: str = "reject",
        wait_timeout: float | timedelta = 60.0,
        **kwargs: Any,
    ) -> Generator[dict[str, Any] | Any, None, None]:
        """Stream the graph on the config's thread under a claim, as `graph.stream` does.

        The claim is taken when iteration starts (so a busy thread raises
        `ThreadBusy` from the first `next()`) and released when the stream
        ends or is closed. Arguments and errors are `invoke`'s; `**kwargs` go
        to `graph.stream` (`stream_mode`, `subgraphs`...).

        Yields:
            Exactly what `graph.stream` yields.
        """
        return self._stream(input, self._prepare(config, strategy, wait_timeout), kwargs)

    def astream(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        strategy: str = "reject",
        wait_timeout: float | timedelta = 60.0,
        **kwargs: Any,
    ) -> AsyncGenerator[dict[str, Any] | Any, None]:
        """Async twin of `stream`; close it with `aclose()` if you stop early.

        Yields:
            Exactly what `graph.astream` yields.
        """
        return self._astream(input, self._prepare(config, strategy, wait_timeout), kwargs)

    def delete_thread(self, thread_id: str) -> None:
        """Delete a thread unless a run holds it, in any process.

        Claims the thread and deletes it (claim included) in one transaction.

        Raises:
            ThreadBusy: the thread has a live claim; nothing is deleted.
        """
        check_name(thread_id, "thread_id")

        self.saver.delete_unclaimed_thread(thread_id, self.holder)

    async def adelete_thread(self, thread_id: str) -> None:
        """Async twin of `delete_thread`."""
        return await asyncio.to_thread(self.delete_thread, thread_id)

    def waiting(self, thread_id: str) -> int:
        """Return how many `"enqueue"` invocations in this process wait for the thread."""
        with _queues_lock:
            return len(_queues.get((self._queue_path, thread_id), ()))

    # --- internals --------------------------------------------------------------------

    def _prepare(self, config: RunnableConfig | None, strategy: str, wait: Any) -> _Call:
        if strategy not in STRATEGIES:
            raise bad_argument(
                "strategy", f"expected one of {', '.join(STRATEGIES)}, got {strategy!r}"
            )
        seconds = to_seconds(wait, "wait_timeout")
        thread_id, _, _ = config_target(config)
        run_config: dict[str, Any] = dict(config or {})
        metadata = dict(run_config.get("metadata") or {})
        # A caller's run id is kept (it must be unique: LangGraph treats a
        # repeated one as a resumption, and rollback retracts by it).
        run_id = metadata.get("run_id") or run_config.get("run_id") or uuid.uuid4()
        metadata["run_id"] = check_name(str(run_id), 'config["metadata"]["run_id"]')
        run_config["metadata"] = metadata
        run_config["configurable"] = {**run_config["configurable"], "thread_id": thread_id}
        key = (self._queue_path, thread_id)
        return _Call(cast(RunnableConfig, run_config), key, strategy, seconds)

    def _start(self, call: _Call, renew: bool = True) -> _Run:
        claim = self.saver.begin_run(
            call.thread_id, self.holder, self.ttl, run_id=call.run_id, strategy=call.strategy
        )
        run = _Run(claim, call.run_id)
        if renew:
            self._renewer.add(run)
        return run

    def _begin(self, call: _Call) -> _Run:
        if call.strategy != "enqueue":
            return self._start(call)
        place = _Place(call, None)
        try:
            while True:
                if place.my_turn():
                    try:
                        return self._start(call)
                    except ThreadBusy as exc:
                        place.busy = exc
                place.event.wait(place.pause())
        finally:
            place.leave()

    async def _abegin(self, call: _Call) -> _Run:
        if call.strategy != "enqueue":
            return await self._astart(call)
        place = _Place(call, asyncio.get_running_loop())
        try:
            while True:
                if place.my_turn():
                    try:
                        return await self._astart(call)
                    except ThreadBusy as exc:
                        place.busy = exc
                await place.await_(place.pause())
        finally:
            place.leave()

    async def _astart(self, call: _Call) -> _Run:
        # The claim commits on a worker thread that cancellation cannot stop;
        # a caller cancelled meanwhile gives the claim back once it is granted.
        future = asyncio.ensure_future(asyncio.to_thread(self._start, call, False))
        try:
            run = await asyncio.shield(future)
        except asyncio.CancelledError as exc:
            why: BaseException = exc
            future.add_done_callback(lambda done: self._abandon(done, call, why))
            raise
        self._renewer.add(run)  # only once the caller has it: an abandoned claim just expires
        return run

    def _abandon(self, done: asyncio.Future[_Run], call: _Call, exc: BaseException) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        threading.Thread(target=self._fail, args=(done.result(), call, exc), daemon=True).start()

    def _finish(
        self, run: _Run, call: _Call, kind: str, data: dict[str, Any], static: bool
    ) -> bool:
        self._renewer.remove(run)
        data = {"run_id": run.run_id, **data}
        try:
            return self.saver.end_run(
                run.claim.thread_id, run.claim.token, kind, data, static_interrupt=static
            )
        finally:
            _wake_head(call.key)

    def _fail(self, run: _Run, call: _Call, exc: BaseException) -> None:
        try:
            self._finish(run, call, "run_failed", _failure(exc), False)
        except Exception as finish_exc:  # noqa: BLE001 - the run's own error propagates
            # The claim then expires after ttl (renewal has stopped).
            logger.error("run %s: could not record its end: %r", run.run_id, finish_exc)

    def _complete(self, run: _Run, call: _Call, static: bool) -> None:
        if not self._finish(run, call, "run_completed", {}, static):
            current = self.saver.current_claim(run.claim.thread_id)
            raise StaleClaim(
                run.claim.thread_id,
                run.claim.token,
                current.token if current else None,
                message=(
                    f"run {run.run_id} on thread {run.claim.thread_id!r} finished, but "
                    f"token {run.claim.token} was superseded first; its end was not recorded"
                ),
            )

    def _state_to_check(self, run: _Run, kwargs: dict[str, Any]) -> RunnableConfig | None:
        """Return a config to read the state with if a static interrupt may have stopped the run.

        Dynamic interrupts leave `__interrupt__` writes, which the release
        transaction finds; static ones (and drains) leave only tasks still to
        run, so the state is read, but only when the graph or call sets them up.
        """
        if (
            kwargs.get("interrupt_before")
            or kwargs.get("interrupt_after")
            or kwargs.get("control") is not None
            or getattr(self.graph, "interrupt_before_nodes", None)
            or getattr(self.graph, "interrupt_after_nodes", None)
        ):
            return {"configurable": {"thread_id": run.claim.thread_id}}
        return None

    def _stream(
        self, input: Any, call: _Call, kwargs: dict[str, Any]
    ) -> Generator[dict[str, Any] | Any, None, None]:
        run = self._begin(call)
        inner = None
        try:
            inner = self.graph.stream(input, run.claim.config(call.config), **kwargs)
            yield from inner
            state = self._state_to_check(run, kwargs)
            static = state is not None and bool(self.graph.get_state(state).next)
        except BaseException as exc:  # GeneratorExit too: the consumer closed us
            if inner is not None:
                inner.close()
            self._fail(run, call, exc)
            raise
        self._complete(run, call, static)

    async def _astream(
        self, input: Any, call: _Call, kwargs: dict[str, Any]
    ) -> AsyncGenerator[dict[str, Any] | Any, None]:
        run = await self._abegin(call)
        inner = None
        try:
            inner = self.graph.astream(input, run.claim.config(call.config), **kwargs)
            async for chunk in inner:
                yield chunk
            state = self._state_to_check(run, kwargs)
            static = state is not None and bool((await self.graph.aget_state(state)).next)
        except BaseException as exc:
            try:
                if inner is not None:
                    await inner.aclose()
            finally:
                await _shielded(self._fail, run, call, exc)
            raise
        await _shielded(self._complete, run, call, static)


async def _shielded(fn: Any, *args: Any) -> Any:
    """Run `fn(*args)` on a worker thread to the end, even if the caller is cancelled.

    The caller still sees `CancelledError` at once; the work itself (a claim,
    or a release) is never abandoned half way, so a cancelled task's claim is
    always released or recorded.
    """
    return await asyncio.shield(asyncio.ensure_future(asyncio.to_thread(fn, *args)))
