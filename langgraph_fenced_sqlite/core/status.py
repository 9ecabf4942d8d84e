"""A thread's status (idle, running, interrupted, failed), judged in one place.

Invariant: `judge` is the only rule that turns what a thread holds (its claim,
its latest root checkpoint's pending writes, its latest run event) into a
status, and `pending_interrupts` / `failed_tasks` are the only readers of a
checkpoint's `__interrupt__` and `__error__` writes. `lgfs threads` (its
STATUS column and `--status` filter), `lgfs show` and applications all get a
status through `FencedSqliteSaver.thread_status` or `threads()`, which read
those facts in one snapshot and call `judge`. Pure functions: no SQL, no I/O.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from ..errors import bad_argument
from .claims import claim_live
from .run_fence import BY_RUN, IDLE_AFTER
from .validation import check_iterable

__all__ = [
    "THREAD_STATES",
    "Failure",
    "ThreadStatus",
    "Waiting",
    "check_states",
    "failed_tasks",
    "judge",
    "pending_interrupts",
    "task_node",
]

# What `judge` can say; "unknown" only for a thread whose rows are damaged.
THREAD_STATES = ("idle", "running", "interrupted", "failed", "unknown")

# LangGraph's reserved channels and task id (private constants since 1.0).
INTERRUPT, RESUME, ERROR, TASKS = "__interrupt__", "__resume__", "__error__", "__pregel_tasks"
NULL_TASK_ID = "00000000-0000-0000-0000-000000000000"
# The run lifecycle events the runner logs (`run_superseded` always precedes
# the new run's `run_started`, so it is never the latest). A run that timed
# out failed; one cancelled ended as a completed one did.
# An operator's release or take-over ends what the run before it says.
RUN_EVENTS = frozenset(
    {
        "run_started",
        "run_completed",
        "run_interrupted",
        "run_failed",
        "run_cancelled",
        "run_timed_out",
        "claim_released_by_operator",
        "claim_taken_over",
    }
)
# The events that end a run (its release commits with each): what a worker
# waiting for the thread ("enqueue") waits for. Not `run_started` (a run
# began) nor `claim_taken_over` (an operator holds the thread now).
RUN_ENDS = RUN_EVENTS - {"run_started", "claim_taken_over"}
_FAILED = frozenset({"run_failed", "run_timed_out"})
_REPR = re.compile(r"^([A-Za-z_][\w.]*)\((.*)\)$", re.S)


@dataclass(frozen=True)
class Waiting:
    """An `interrupt()` not answered yet.

    Attributes:
        node: The node that called `interrupt()` ("?" when its task path names none).
        task_id: The task that is waiting.
        value: The payload given to `interrupt()`.
        interrupt_id: LangGraph's id of the interrupt (resume by it), if stored.
    """

    node: str
    task_id: str
    value: Any
    interrupt_id: str | None = None


@dataclass(frozen=True)
class Failure:
    """Why a thread's latest run or task failed.

    Attributes:
        node: The node whose task raised, or None (the run failed outside a node).
        error: The error's type name.
        message: The error's message (or its stored repr).
        run_id: The failed run, when the event log names it.
    """

    node: str | None
    error: str
    message: str
    run_id: str | None = None

    @property
    def reason(self) -> str:
        """Say the failure in one line: `ValueError: the model call failed`.

        A message stored as the error's repr (`ValueError('...')`) is given
        by its text.
        """
        detail = _plain(self.message)
        return self.error if detail == self.error else f"{self.error}: {detail}"


@dataclass(frozen=True)
class ThreadStatus:
    """What a thread is doing, as `FencedSqliteSaver.thread_status` judges it.

    `state` is one of `THREAD_STATES`; the first of these that holds decides:
      - `running`: a live claim holds the thread (`holder`, `token`,
        `expires_at`, `expires_in` and the claim's `run_id` say whose and
        until when); `waiting` may still list interrupts it is resuming.
        Also a run fenced by its id (`fence_runs`), whose claim is never
        live: while the claim is still its own, it wrote the thread in the
        last `idle_after` seconds (30), and neither `failed` nor
        `interrupted` holds.
      - `failed`: the latest root checkpoint holds an error write, or the
        latest run event is `run_failed` (or `run_timed_out`), or a run
        started and its claim expired without the run ending (a crashed
        worker; not a run fenced by its id, which ends unannounced);
        `failure` says which, `reason` in one line.
      - `interrupted`: the latest root checkpoint waits at an `interrupt()`
        (`waiting`; `node` is the first node waiting: of a `Send`-ed task,
        or, for an interrupt inside a subgraph, the parent's node that runs
        it), or the latest run stopped at a static interrupt (`node` None).
      - `idle`: none of these: never run under a runner, completed,
        cancelled, or its claim released by an operator (an expired claim
        left behind is still reported in `holder`/`token`/`expires_at`).
      - `unknown`: a cell of the thread's row is damaged; `error` says which.

    A run's end stops counting once a root checkpoint is committed after it
    under another token (the thread was run again without a runner).
    `node` and `reason` say the same in one word each (for a table cell or a
    filter); `to_dict` gives it all as plain data, as `threads()` carries it.

    Attributes:
        thread_id: The thread.
        state: See above.
        checkpoint_id: The latest root checkpoint, if any.
        holder: The claim's holder, if a claim (live or expired) is recorded.
        token: The claim's fencing token.
        expires_at: The claim's expiry (store clock, epoch seconds).
        expires_in: Seconds from the judgement until expiry (negative: expired).
        run_id: The run the claim was granted for (`running`), else the run
            the latest run event names (the failed, interrupted or ended run).
        waiting: The unanswered interrupts of the latest root checkpoint.
        failure: Why the thread failed (`state == "failed"`).
        error: An `UndecodableRow` as a dict (`state == "unknown"`).
    """

    thread_id: str
    state: str
    checkpoint_id: str | None = None
    holder: str | None = None
    token: int | None = None
    expires_at: float | None = None
    expires_in: float | None = None
    run_id: str | None = None
    waiting: tuple[Waiting, ...] = ()
    failure: Failure | None = None
    error: dict[str, Any] | None = None

    @property
    def node(self) -> str | None:
        """The node an `interrupted` thread waits at (its first interrupt's), else None.

        None also for a static interrupt (`interrupt_before/after`): no node waits.
        """
        return self.waiting[0].node if self.state == "interrupted" and self.waiting else None

    @property
    def reason(self) -> str | None:
        """Why a thread is `failed` (`Failure.reason`) or `unknown` (the error), else None."""
        if self.failure is not None:
            return self.failure.reason
        if self.error is not None:
            return str(self.error.get("message"))
        return None

    def to_dict(self) -> dict[str, Any]:
        """Return the status as plain data: every attribute, `node` and `reason` too.

        Values are not copied: an interrupt's payload is the decoded object.
        """
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["waiting"] = [_fields(w) for w in self.waiting]
        out["failure"] = None if self.failure is None else _fields(self.failure)
        out.update(node=self.node, reason=self.reason)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ThreadStatus:
        """Rebuild a status from `to_dict`'s data (`node` and `reason` are derived)."""
        own = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in own}
        values["waiting"] = tuple(Waiting(**w) for w in data.get("waiting") or ())
        failure = data.get("failure")
        values["failure"] = None if failure is None else Failure(**failure)
        return cls(**values)


def _fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def _plain(message: str) -> str:
    """Return the text of an error stored as its repr (`ValueError('text')`), else `message`."""
    match = _REPR.match(message)
    if match is None:
        return message
    try:
        args = ast.literal_eval(f"({match.group(2)},)")
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return message
    return args[0] if len(args) == 1 and isinstance(args[0], str) else message


def check_states(status: str | Iterable[str] | None) -> frozenset[str] | None:
    """Check a `status` filter argument: a state or states of `THREAD_STATES` (None: any).

    Raises:
        InvalidArgument: (`status`) not a string or iterable of them, or an unknown state.
    """
    if status is None:
        return None
    wanted = [status] if isinstance(status, str) else check_iterable(status, "status")
    for state in wanted:
        if state not in THREAD_STATES:
            raise bad_argument("status", f"expected one of {THREAD_STATES}, got {state!r}")
    return frozenset(wanted)


def task_node(task_path: Any, sends: Sequence[Any] | None = None) -> str:
    """Return the node a pending write's task ran, from its stored task path.

    A pulled task's path names its node (`~__pregel_pull, review`); a pushed
    one (`Send`) names its index in the checkpoint's `__pregel_tasks` value,
    given as `sends`. "?" when neither says.
    """
    parts = str(task_path or "").lstrip("~").split(", ")
    if len(parts) >= 2 and parts[0] == "__pregel_pull":
        return parts[1]
    if len(parts) >= 2 and parts[0] == "__pregel_push" and parts[1].isdigit():
        index = int(parts[1])
        if sends is not None and 0 <= index < len(sends):
            send = sends[index]
            node = getattr(send, "node", None)
            if node is None and isinstance(getattr(send, "data", None), dict):
                node = send.data.get("node")  # a Send outside the allow-list (TaggedValue)
            if isinstance(node, str):
                return node
    return "?"


def _sends(channel_values: dict[str, Any] | None) -> Sequence[Any] | None:
    sends = (channel_values or {}).get(TASKS)
    return sends if isinstance(sends, (list, tuple)) else None


def pending_interrupts(
    writes: Sequence[dict[str, Any]], channel_values: dict[str, Any] | None = None
) -> tuple[Waiting, ...]:
    """Return the interrupts a checkpoint's pending writes leave unanswered.

    An `__interrupt__` write is answered by a `__resume__` write of the same
    task, or by one of LangGraph's null task (a `Command(resume=...)` for the
    whole checkpoint).

    Args:
        writes: The checkpoint's writes as `inspect_checkpoint` returns them
            (`task_id`, `task_path`, `channel`, `value`, `error`).
        channel_values: The checkpoint's values (names the nodes of `Send` tasks).
    """
    resumed = {w["task_id"] for w in writes if w["channel"] == RESUME}
    if NULL_TASK_ID in resumed:
        return ()
    sends = _sends(channel_values)
    out = []
    for w in writes:
        if w["channel"] != INTERRUPT or w["task_id"] in resumed or w.get("error"):
            continue
        node = task_node(w.get("task_path"), sends)
        values = w["value"] if isinstance(w["value"], (list, tuple)) else [w["value"]]
        for item in values:
            payload = getattr(item, "value", item)
            interrupt_id = getattr(item, "id", None)
            if isinstance(getattr(item, "data", None), dict) and "value" in item.data:
                payload, interrupt_id = item.data["value"], item.data.get("id")  # TaggedValue
            out.append(Waiting(node, w["task_id"], payload, _str_or_none(interrupt_id)))
    return tuple(out)


def failed_tasks(
    writes: Sequence[dict[str, Any]], channel_values: dict[str, Any] | None = None
) -> tuple[Failure, ...]:
    """Return the tasks of a checkpoint whose pending writes record an error."""
    sends = _sends(channel_values)
    out = []
    for w in writes:
        if w["channel"] != ERROR:
            continue
        value = w["value"]
        if isinstance(value, BaseException):
            error, message = type(value).__name__, str(value)
        else:
            message = str(value) if w.get("error") is None else w["error"]["message"]
            match = _REPR.match(message)
            error = match.group(1).rsplit(".", 1)[-1] if match else "error"
        out.append(Failure(task_node(w.get("task_path"), sends), error, message))
    return tuple(out)


def judge(
    thread_id: str,
    *,
    now: float,
    holder: str | None,
    token: int | None,
    expires_at: float | None,
    claim_run_id: str | None,
    checkpoint_id: str | None,
    waiting: Sequence[Waiting],
    failures: Sequence[Failure],
    last_run: Any | None,
    active_at: float | None = None,
) -> ThreadStatus:
    """Decide a thread's status from what it holds (the one rule; see `ThreadStatus`).

    Args:
        thread_id: The thread.
        now: The store clock's time.
        holder: The recorded claim's holder (None: no claim).
        token: The recorded claim's token.
        expires_at: The recorded claim's expiry.
        claim_run_id: The run the claim was granted for.
        checkpoint_id: The latest root checkpoint.
        waiting: Its unanswered interrupts (`pending_interrupts`).
        failures: Its failed tasks (`failed_tasks`).
        last_run: The thread's latest run lifecycle `Event` (`RUN_EVENTS`), if any.
        active_at: When the thread was last written (its latest event's
            time): a run fenced by its id (`fence_runs`) is running while
            this is recent. Needed only when the claim is such a run's.
    """
    base = ThreadStatus(
        thread_id,
        "idle",
        checkpoint_id=checkpoint_id,
        holder=holder,
        token=token,
        expires_at=expires_at,
        expires_in=None if expires_at is None else round(expires_at - now, 3),
        waiting=tuple(waiting),
    )
    if claim_live(token, expires_at, now):
        return replace(base, state="running", run_id=claim_run_id)
    kind = getattr(last_run, "kind", None)
    data = getattr(last_run, "data", None) or {}
    run_id = data.get("run_id") if isinstance(data.get("run_id"), str) else None
    failure = failures[0] if failures else None
    if failure is None and kind in _FAILED:
        error = str(data.get("error") or kind)
        failure = Failure(None, error, str(data.get("message") or error), run_id)
    # A run fenced by its id (`fence_runs`) whose claim it still is: its claim
    # is never live, and LangGraph tells no checkpointer when a run ends.
    by_run = (
        kind == "run_started"
        and token is not None
        and getattr(last_run, "token", None) == token
        and data.get("strategy") == BY_RUN
    )
    if failure is None and kind == "run_started" and token is not None and not by_run:
        if getattr(last_run, "token", None) == token:
            # The run's claim expired with no end logged: its worker stopped.
            message = f"run {run_id!r} of {holder!r} stopped without ending; its claim expired"
            failure = Failure(None, "claim_expired", message, run_id)
    if failure is not None:
        if failure.run_id is None:  # a failed task's: of the run the latest event names
            failure = replace(failure, run_id=run_id)
        return replace(base, state="failed", failure=failure, run_id=run_id)
    if waiting or kind == "run_interrupted":
        return replace(base, state="interrupted", run_id=run_id)
    if by_run and active_at is not None:
        idle_after = data.get("idle_after")
        if not isinstance(idle_after, (int, float)) or isinstance(idle_after, bool):
            idle_after = IDLE_AFTER
        if now - active_at < idle_after:
            return replace(base, state="running", run_id=run_id)
    return replace(base, run_id=run_id)


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None
