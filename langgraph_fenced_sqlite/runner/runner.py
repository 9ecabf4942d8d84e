"""`FencedRunner`: run a compiled LangGraph graph under a claim on its thread.

Invariant: every invocation runs under a claim of its own, with a fresh run
id in its checkpoints' metadata, taken with `saver.begin_run` and given back
with `saver.end_run` (see `runs.py`: each is one commit with its lifecycle
event), so the runner adds exactly two commits per invocation, plus one
renewal per `renew_every` for long runs. An invocation that lost its claim
records nothing and releases nothing: the run that superseded it has already
logged it. A run stopped by the runner (claim taken over, cancel asked from
any process, deadline) starts no further step: LangGraph's `RunControl` is
drained, and an async run's task is cancelled where it awaits the graph.
Each end is logged once, as what it was: completed, interrupted, failed,
cancelled (a cancel asked, a stream closed early, a task cancelled) or timed
out.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar, cast

from langchain_core.runnables import RunnableConfig
from langgraph.graph.state import StateGraph
from langgraph.runtime import RunControl

from ..clock import to_seconds
from ..core.claims import Claim
from ..core.fenced_store import FencedStore
from ..core.lease import Outcome, RunLease, RunRenewer, judge_end, raise_for
from ..core.retention import ThreadTTL
from ..core.runs import RUN_STRATEGIES
from ..core.validation import check_name, config_target
from ..errors import FencedSqliteError, StaleClaim, ThreadBusy, bad_argument
from .queue import Place, queued, wake_head

__all__ = ["STRATEGIES", "FencedRunner"]

logger = logging.getLogger("langgraph_fenced_sqlite.runner")
T = TypeVar("T")

STRATEGIES = RUN_STRATEGIES
"""What an invocation does when its thread is busy (see `FencedRunner.invoke`)."""


@dataclass(frozen=True)
class _Call:
    """One invocation's validated arguments."""

    config: RunnableConfig
    key: tuple[str, str]  # (real path of the file, thread id): its local queue
    strategy: str
    wait: float
    timeout: float | None = None
    principal: str | None = None
    control: RunControl | None = None  # the caller's own, if given

    @property
    def thread_id(self) -> str:
        return self.key[1]

    @property
    def run_id(self) -> str:
        return self.config["metadata"]["run_id"]


# --- the runner -------------------------------------------------------------------------


class FencedRunner:
    """Run a compiled graph so that one invocation at a time writes each thread.

    Every invocation claims its thread (a fresh fencing token), runs the graph
    with that token and a fresh run id, renews the claim in the background,
    logs its lifecycle in the thread's event log, and releases the claim
    however it ends. A run whose claim is taken over, or that is asked to
    stop (`cancel`, from any process) or outlives its `timeout=`, starts no
    further node. Safe from any number of threads, tasks and processes.
    """

    def __init__(
        self,
        graph: Any,
        saver: FencedStore,
        *,
        holder: str | None = None,
        ttl: float | timedelta = 30.0,
        renew_every: float | timedelta | None = None,
        tenant: str | None = None,
        principal: str | None = None,
        thread_ttl: ThreadTTL | None = None,
    ) -> None:
        """Wrap `graph`, whose checkpointer must be `saver` (or unset).

        The runner's copy of the graph uses `saver.for_graph(graph)`: the
        types its schemas declare are read back with no configuration.

        Args:
            graph: A compiled LangGraph graph (`StateGraph(...).compile(...)`).
            saver: The store every invocation claims its thread in: a
                `FencedSqliteSaver`, or a `FencedPostgresSaver` for workers
                on several hosts (the same runs, events and errors).
            holder: Who claims (shown in `ThreadBusy`); defaults to
                `"<hostname>:<pid>:<random>"`.
            ttl: How long a claim lives without renewal. A crashed process's
                threads are free again after this.
            renew_every: Seconds between renewals; defaults to `ttl / 3`. A
                takeover or a cancel asked from another process is seen
                within one renewal.
            tenant: The tenant every run is for: another tenant's thread (or
                one written without a tenant) is refused with
                `TenantMismatch` before it is touched, and a new thread
                becomes this tenant's. None (default): any thread.
            principal: Who runs act for (a user, a service), named in their
                events; each call may name another.
            thread_ttl: A time to live every run gives its thread as it
                starts (`saver.set_thread_ttl`, right after the run's claim is
                granted, so no sweep expires the thread meanwhile); None:
                threads keep theirs (or the store's default).

        Raises:
            InvalidArgument: (a `ValueError`) the graph is compiled with
                another checkpointer, or a bad `ttl`/`renew_every`/`holder`/
                `tenant`/`principal`.
        """
        if not isinstance(saver, FencedStore):
            raise bad_argument(
                "saver",
                f"expected a FencedSqliteSaver or FencedPostgresSaver, got {type(saver).__name__}",
            )
        current = getattr(graph, "checkpointer", None)
        # LangGraph's strict mode compiles with a copy of the saver (same
        # connection, derived serializer); that copy is the saver too.
        if current is not None and not (
            isinstance(current, FencedStore) and current._engine is saver._engine
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
        self.tenant = _optional_name(tenant, "tenant")
        self.principal = _optional_name(principal, "principal")
        if thread_ttl is not None and not isinstance(thread_ttl, ThreadTTL):
            raise bad_argument("thread_ttl", f"expected a ThreadTTL or None, got {thread_ttl!r}")
        self.thread_ttl = thread_ttl
        self._renewer = RunRenewer(saver, self.ttl, self.renew_every)
        self._queue_path = os.path.realpath(saver.path)

    # --- public API ---------------------------------------------------------------------

    def invoke(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        strategy: str = "reject",
        wait_timeout: float | timedelta = 60.0,
        timeout: float | timedelta | None = None,
        principal: str | None = None,
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
            timeout: How long the run may take once it holds the thread, in
                seconds (None: no limit). Then it stops, as a cancelled run
                does, and logs `run_timed_out`.
            principal: Who this run acts for (default: the runner's).
            **kwargs: Passed to `graph.invoke` (`durability`, `context`,
                `control`...).

        Returns:
            What `graph.invoke` returns.

        Raises:
            ThreadBusy: the thread is busy (`"reject"`) or stayed busy for
                `wait_timeout` (`"enqueue"`); nothing ran.
            TenantMismatch: the thread is another tenant's; nothing ran.
            StaleClaim: another invocation (or an operator) took the thread
                over; this run started no node after that was seen, and its
                end is not logged (the takeover logged `run_superseded`).
            RunCancelled: `cancel` was asked for this run (`run_cancelled`).
            RunTimedOut: the run outlived `timeout` (`run_timed_out`).
            StoreError: the claim or release could not commit (an unreleased
                claim expires after `ttl`).
        """
        call = self._prepare(config, strategy, wait_timeout, timeout, principal, kwargs)
        run = self._begin(call)
        try:
            config_ = run.claim.config(call.config)
            result = self.graph.invoke(input, config_, control=run.control, **kwargs)
            state = self._state_to_check(run, call, kwargs)
            static = state is not None and bool(self.graph.get_state(state).next)
        except BaseException as exc:
            outcome = judge_end(run, exc)
            self._end(run, call, outcome)
            raise_for(outcome, exc)
        self._complete(run, call, static)
        return result

    async def ainvoke(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        strategy: str = "reject",
        wait_timeout: float | timedelta = 60.0,
        timeout: float | timedelta | None = None,
        principal: str | None = None,
        **kwargs: Any,
    ) -> dict[str, Any] | Any:
        """Async twin of `invoke`; a stopped run is cancelled where it awaits.

        A task cancelled by its caller still releases its claim (and logs
        `run_cancelled`).
        """
        call = self._prepare(config, strategy, wait_timeout, timeout, principal, kwargs)
        run = await self._abegin(call)
        try:
            config_ = run.claim.config(call.config)
            result = await run.inside(
                lambda: self.graph.ainvoke(input, config_, control=run.control, **kwargs)
            )
            state = self._state_to_check(run, call, kwargs)
            static = state is not None and bool((await self.graph.aget_state(state)).next)
        except BaseException as exc:
            outcome = judge_end(run, exc)
            await self._shielded(self._end, run, call, outcome)
            raise_for(outcome, exc)
        await self._shielded(self._complete, run, call, static)
        return result

    def stream(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        strategy: str = "reject",
        wait_timeout: float | timedelta = 60.0,
        timeout: float | timedelta | None = None,
        principal: str | None = None,
        **kwargs: Any,
    ) -> Generator[dict[str, Any] | Any, None, None]:
        """Stream the graph on the config's thread under a claim, as `graph.stream` does.

        The claim is taken when iteration starts (so a busy thread raises
        `ThreadBusy` from the first `next()`) and released when the stream
        ends or is closed (closed early: `run_cancelled`). A stopped run also
        ends between two chunks. Arguments and errors are `invoke`'s;
        `**kwargs` go to `graph.stream` (`stream_mode`, `subgraphs`...).

        Yields:
            Exactly what `graph.stream` yields.
        """
        call = self._prepare(config, strategy, wait_timeout, timeout, principal, kwargs)
        return self._stream(input, call, kwargs)

    def astream(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        strategy: str = "reject",
        wait_timeout: float | timedelta = 60.0,
        timeout: float | timedelta | None = None,
        principal: str | None = None,
        **kwargs: Any,
    ) -> AsyncGenerator[dict[str, Any] | Any, None]:
        """Async twin of `stream`; close it with `aclose()` if you stop early.

        Yields:
            Exactly what `graph.astream` yields.
        """
        call = self._prepare(config, strategy, wait_timeout, timeout, principal, kwargs)
        return self._astream(input, call, kwargs)

    def cancel(self, thread_id: str, *, by: str | None = None) -> Claim | None:
        """Ask the run holding the thread, in any process, to stop.

        The request is recorded in the file (`cancel_requested`); the run
        sees it at its next renewal (at once in this runner's process),
        starts no further node, releases the thread and logs
        `run_cancelled`; its caller gets `RunCancelled`. A run of this
        thread that starts later is not affected.

        Args:
            thread_id: The thread whose run should stop.
            by: Who asks (default: the runner's principal, else its holder).

        Returns:
            The claim asked to stop, or None when nothing holds the thread.

        Raises:
            TenantMismatch: the thread is another tenant's; nothing changes.
        """
        check_name(thread_id, "thread_id")
        who = (self.principal or self.holder) if by is None else check_name(by, "by")
        claim = self.saver.cancel_run(thread_id, by=who, tenant=self.tenant)
        if claim is not None:
            self._renewer.renew_now(thread_id)
        return claim

    async def acancel(self, thread_id: str, *, by: str | None = None) -> Claim | None:
        """Async twin of `cancel`."""
        return await self._hop(self.cancel, thread_id, by=by)

    def delete_thread(self, thread_id: str) -> None:
        """Delete a thread unless a run holds it, in any process.

        Claims the thread and deletes it (claim included) in one transaction.

        Raises:
            ThreadBusy: the thread has a live claim; nothing is deleted.
            TenantMismatch: the thread is another tenant's; nothing is deleted.
        """
        check_name(thread_id, "thread_id")
        self.saver.delete_unclaimed_thread(thread_id, self.holder, tenant=self.tenant)

    async def adelete_thread(self, thread_id: str) -> None:
        """Async twin of `delete_thread`."""
        return await self._hop(self.delete_thread, thread_id)

    def _hop(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Awaitable[T]:
        # The store's own worker threads (`hop.Hop`), as its async calls use.
        return self.saver._engine.arun(fn, *args, **kwargs)

    async def _shielded(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` on a worker thread to the end, even if the caller is cancelled.

        The caller still sees `CancelledError` at once; the work itself (a claim,
        or a release) is never abandoned half way, so a cancelled task's claim is
        always released or recorded.
        """
        return await asyncio.shield(asyncio.ensure_future(self._hop(fn, *args)))

    def waiting(self, thread_id: str) -> int:
        """Return how many `"enqueue"` invocations in this process wait for the thread."""
        return queued((self._queue_path, thread_id))

    # --- internals --------------------------------------------------------------------

    def _prepare(
        self,
        config: RunnableConfig | None,
        strategy: str,
        wait: Any,
        timeout: Any,
        principal: Any,
        kwargs: dict[str, Any],
    ) -> _Call:
        if strategy not in STRATEGIES:
            raise bad_argument(
                "strategy", f"expected one of {', '.join(STRATEGIES)}, got {strategy!r}"
            )
        seconds = to_seconds(wait, "wait_timeout")
        limit = None if timeout is None else to_seconds(timeout, "timeout")
        who = self.principal if principal is None else check_name(principal, "principal")
        control = kwargs.pop("control", None)
        if control is not None and not isinstance(control, RunControl):
            raise bad_argument("control", f"expected a RunControl, got {type(control).__name__}")
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
        return _Call(cast(RunnableConfig, run_config), key, strategy, seconds, limit, who, control)

    def _start(self, call: _Call, renew: bool = True) -> RunLease:
        claim = self.saver.begin_run(
            call.thread_id,
            self.holder,
            self.ttl,
            run_id=call.run_id,
            strategy=call.strategy,
            tenant=self.tenant,
            principal=call.principal,
        )
        run = RunLease(claim, call.run_id, call.control or RunControl(), call.timeout)
        if self.thread_ttl is not None:
            try:
                ttl = self.thread_ttl
                self.saver.set_thread_ttl(call.thread_id, ttl.seconds, strategy=ttl.strategy)
            except BaseException:
                self.saver.release(call.thread_id, claim.token)
                raise
        if renew:
            self._renewer.add(run)
        return run

    def _begin(self, call: _Call) -> RunLease:
        if call.strategy != "enqueue":
            return self._start(call)
        place = Place(call.key, call.wait, None)
        try:
            while True:
                if not place.my_turn():
                    place.event.wait(place.pause())
                    continue
                try:
                    return self._start(call)
                except ThreadBusy as exc:
                    place.busy = exc
                if not place.looked:  # then once more at once: a release just before is seen
                    place.look(self._tail(call.thread_id))
                    continue
                place.wait_release(self.saver)
        finally:
            place.leave()

    async def _abegin(self, call: _Call) -> RunLease:
        if call.strategy != "enqueue":
            return await self._astart(call)
        place = Place(call.key, call.wait, asyncio.get_running_loop())
        try:
            while True:
                if not place.my_turn():
                    await place.await_(place.pause())
                    continue
                try:
                    return await self._astart(call)
                except ThreadBusy as exc:
                    place.busy = exc
                if not place.looked:
                    place.look(await self._hop(self._tail, call.thread_id))
                    continue
                await place.await_release(self.saver)
        finally:
            await place.aleave()

    def _tail(self, thread_id: str) -> tuple[int, int] | None:
        # Where the thread's log ends, for a refused "enqueue" head to wait
        # after; None (back to polling) if it cannot be read.
        try:
            return self.saver._event_tail(thread_id)
        except FencedSqliteError:
            return None

    async def _astart(self, call: _Call) -> RunLease:
        # The claim commits on a worker thread that cancellation cannot stop;
        # a caller cancelled meanwhile gives the claim back once it is granted.
        future = asyncio.ensure_future(self._hop(self._start, call, False))
        try:
            run = await asyncio.shield(future)
        except asyncio.CancelledError as exc:
            why: BaseException = exc
            future.add_done_callback(lambda done: self._abandon(done, call, why))
            raise
        self._renewer.add(run)  # only once the caller has it: an abandoned claim just expires
        return run

    def _abandon(self, done: asyncio.Future[RunLease], call: _Call, exc: BaseException) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        run = done.result()
        args = (run, call, judge_end(run, exc))
        threading.Thread(target=self._end, args=args, daemon=True).start()

    def _event(self, run: RunLease, call: _Call, data: dict[str, Any]) -> dict[str, Any]:
        return {"run_id": run.run_id, "tenant": self.tenant, "principal": call.principal, **data}

    def _end(self, run: RunLease, call: _Call, outcome: Outcome) -> None:
        """Log how a run that raised ended, and release its claim (if still its own)."""
        self._renewer.remove(run)
        try:
            if outcome.kind is not None:  # None: superseded, logged by the run that took over
                data = self._event(run, call, outcome.data)
                self.saver.end_run(run.claim.thread_id, run.claim.token, outcome.kind, data)
        except Exception as finish_exc:  # noqa: BLE001 - the run's own error propagates
            # The claim then expires after ttl (renewal has stopped).
            logger.error("run %s: could not record its end: %r", run.run_id, finish_exc)
        finally:
            wake_head(call.key)

    def _complete(self, run: RunLease, call: _Call, static: bool) -> None:
        self._renewer.remove(run)
        thread_id, token = run.claim.thread_id, run.claim.token
        try:
            self.saver.end_run(
                thread_id,
                token,
                "run_completed",
                self._event(run, call, {}),
                static_interrupt=static,
                raise_stale=True,
            )
        except StaleClaim as exc:
            raise StaleClaim(
                thread_id,
                token,
                exc.current_token,
                exc.holder,
                exc.latest_token,
                message=(
                    f"run {run.run_id} on thread {thread_id!r} finished, but token {token} "
                    f"was superseded first ({exc.situation}); its end was not recorded"
                ),
            ) from None
        finally:
            wake_head(call.key)

    def _state_to_check(
        self, run: RunLease, call: _Call, kwargs: dict[str, Any]
    ) -> RunnableConfig | None:
        """Return a config to read the state with if a static interrupt may have stopped the run.

        Dynamic interrupts leave `__interrupt__` writes, which the release
        transaction finds; static ones (and drains) leave only tasks still to
        run, so the state is read, but only when the graph or call sets them up.
        """
        if (
            kwargs.get("interrupt_before")
            or kwargs.get("interrupt_after")
            or call.control is not None
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
            config_ = run.claim.config(call.config)
            inner = self.graph.stream(input, config_, control=run.control, **kwargs)
            for chunk in inner:
                yield chunk
                if run.stopped is not None:  # seen between two chunks: go no further
                    raise run.stopped.error
            state = self._state_to_check(run, call, kwargs)
            static = state is not None and bool(self.graph.get_state(state).next)
        except BaseException as exc:  # GeneratorExit too: the consumer closed us
            if inner is not None:
                inner.close()
            outcome = judge_end(run, exc)
            self._end(run, call, outcome)
            raise_for(outcome, exc)
        self._complete(run, call, static)

    async def _astream(
        self, input: Any, call: _Call, kwargs: dict[str, Any]
    ) -> AsyncGenerator[dict[str, Any] | Any, None]:
        run = await self._abegin(call)
        inner = None
        try:
            config_ = run.claim.config(call.config)
            inner = self.graph.astream(input, config_, control=run.control, **kwargs)
            while True:
                try:
                    chunk = await run.inside(inner.__anext__)
                except StopAsyncIteration:
                    break
                yield chunk
            state = self._state_to_check(run, call, kwargs)
            static = state is not None and bool((await self.graph.aget_state(state)).next)
        except BaseException as exc:
            outcome = judge_end(run, exc)
            try:
                if inner is not None:
                    await inner.aclose()
            finally:
                await self._shielded(self._end, run, call, outcome)
            raise_for(outcome, exc)
        await self._shielded(self._complete, run, call, static)


def _optional_name(value: Any, name: str) -> str | None:
    return None if value is None else check_name(value, name)
