"""Fencing by run id, with no runner (`fence_runs=True`): a run's first write claims its thread.

Invariant: a write that carries no token but a run id (LangGraph's
`config["metadata"]["run_id"]`, which the Agent Server sets on every run and
which subgraphs inherit) is fenced by the claim its run took: the first write
of a run claims the thread with a fresh token (`decide`, in the store's
transaction), every later write of that run carries the token (`RunFences`,
this process's memory of it), so a later run's claim fences off every earlier
run exactly as a runner's takeover would. A run's claim is never live for
the fence (it expires when granted): writes without a run id, `claim`, leases
and runners meet it as they meet an expired claim, and take the thread over.
Whether the run is still running is judged from its writes
(`status.judge`, `IDLE_AFTER`), never enforced.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..errors import StaleClaim, ThreadBusy
from . import events
from .claims import RunToken
from .runs import started_event, superseded_data

__all__ = [
    "BY_RUN",
    "IDLE_AFTER",
    "RUN_HOLDER",
    "RunFences",
    "claim_events",
    "decide",
    "end_event",
]

# The holder of a claim a run's first write took, and the strategy its
# `run_started` names: what tells such a claim from a runner's or a lease's.
RUN_HOLDER = "langgraph-run"
BY_RUN = "fence_runs"
# A run's claim is judged `running` while the thread was written within this
# many seconds (LangGraph tells a checkpointer nothing when a run ends).
IDLE_AFTER = 30.0
# LangGraph's reserved channels whose write ends a run (private since 1.0).
_ENDS = {"__interrupt__": "run_interrupted", "__error__": "run_failed"}


class RunFences:
    """The run claims this process's writes took: each run's token on each thread.

    Keyed by thread and run, so that runs overlapping on one thread (what
    fencing is for) each keep their own token, and an earlier one's next
    write is refused by the fence. Bounded (least recently used out): a run
    forgotten costs its next write one more transaction, which finds the
    claim still the run's (`decide`) or refuses a run fenced off since.
    Safe from any thread.
    """

    def __init__(self, size: int = 4096) -> None:
        """Remember at most `size` runs' claims."""
        self._held: OrderedDict[tuple[str, str], tuple[RunToken, bool]] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()
        # Held around a claim: a run's concurrent first writes (LangGraph sends a
        # step's writes and put together) claim once, the others take its token.
        self.claiming = threading.Lock()

    def get(self, thread_id: str, run_id: str) -> RunToken | None:
        """Return the token `run_id` took on `thread_id`, if this process took it."""
        with self._lock:
            held = self._held.get((thread_id, run_id))
            if held is None:
                return None
            self._held.move_to_end((thread_id, run_id))
            return held[0]

    def put(self, thread_id: str, run_id: str, token: int) -> RunToken:
        """Remember that `run_id` holds `thread_id` with `token`; return it as a `RunToken`."""
        held = RunToken(token)
        with self._lock:
            self._held[(thread_id, run_id)] = (held, False)
            self._held.move_to_end((thread_id, run_id))
            while len(self._held) > self._size:
                self._held.popitem(last=False)
        return held

    def ending(self, thread_id: str, run_id: str) -> bool:
        """Mark `run_id`'s run on `thread_id` as ended; True the first time (log it once)."""
        with self._lock:
            held = self._held.get((thread_id, run_id))
            if held is None or held[1]:
                return False
            self._held[(thread_id, run_id)] = (held[0], True)
            return True


def decide(
    thread_id: str,
    run_id: str,
    *,
    token: int | None,
    holder: str | None,
    claim_run_id: str | None,
    live: bool,
    wrote: Callable[[], bool],
    latest: Callable[[], str | None],
) -> int | None:
    """Decide a run's write with no token, from the thread's claim (the rule both stores apply).

    Args:
        thread_id: The thread.
        run_id: The write's run id.
        token, holder, claim_run_id: The thread's recorded claim (None: none).
        live: Whether that claim is live (a run's never is).
        wrote: Whether `run_id` has written the thread (read only if needed).
        latest: The thread's latest root checkpoint, for `ThreadBusy`.

    Returns:
        The token the run already holds, or None: grant it a new one.

    Raises:
        ThreadBusy: a claim that is not a run's is live (a runner, a lease).
        StaleClaim: `run_id` wrote the thread before, and a later claim
            fenced it off.
    """
    if token is not None and claim_run_id == run_id:
        return token
    if live:
        raise ThreadBusy(thread_id, holder, latest())
    if wrote():
        raise StaleClaim(
            thread_id,
            None,
            token,
            holder,
            token,
            message=(
                f"run {run_id!r} is stale for thread {thread_id!r}: a later run or "
                "claim has taken the thread since it wrote; nothing was written"
            ),
        )
    return None


def claim_events(
    run_id: str,
    *,
    old_token: int | None,
    old_holder: str | None,
    old_run: str | None,
    was_live: bool,
) -> list[events.NewEvent]:
    """Return what a run's claim logs, with its grant: `run_started` (with `idle_after`).

    A claim it replaced that was not a run's own (an expired runner's or
    lease's) is fenced off from now on, and logged as `run_superseded`, as a
    runner's takeover logs it. A previous run's claim ends silently: the
    server started this run after it.
    """
    new = []
    if old_token is not None and old_holder != RUN_HOLDER:
        info = superseded_data(old_run, old_token, old_holder, was_live, run_id, None, None, BY_RUN)
        new.append(events.NewEvent("run_superseded", info))
    started = started_event(run_id, RUN_HOLDER, BY_RUN, None, None)
    new.append(events.NewEvent(started.kind, {**started.data, "idle_after": IDLE_AFTER}))
    return new


def end_event(run_id: str | None, writes: Any) -> events.NewEvent | None:
    """Return the end a root namespace's writes mark for their run, or None.

    An `__interrupt__` write stops the run at an `interrupt()`
    (`run_interrupted`), an `__error__` write fails it (`run_failed`, with
    the error's type and message, as a runner logs them).
    """
    for channel, value in writes:
        kind = _ENDS.get(channel)
        if kind == "run_interrupted":
            return events.NewEvent(kind, {"run_id": run_id, "by": BY_RUN})
        if kind == "run_failed":
            error, message = type(value).__name__, str(value)[:500]  # as a runner logs it
            return events.NewEvent(
                kind, {"run_id": run_id, "by": BY_RUN, "error": error, "message": message}
            )
    return None
