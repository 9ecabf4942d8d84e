"""The PostgreSQL store's run lifecycle: a claim and its first event, an end event and its release.

Invariant: the same meaning as the SQLite store's `runs.py`, one transaction
each. `begin_run` locks the thread's row (`LOCK_RUN_THREAD`), judges the
tenant and the claim there, then draws the token after the lock and takes
the commit's position in the same statement (`SET_RUN_CLAIM`, the grant and
the fence under its new token). A run that does not take over (and
`delete_unclaimed`, and a plain claim: `txns.lock_unless_live`) first reads
the row without locking it, in the locking statement (`_lock_unless_busy`):
that read may only refuse, so a refused poll on a busy thread neither waits
for the holder's row lock nor makes the holder's next write wait for its
own, and whatever it reads as free is decided under the lock. `run_started` (with
`run_superseded`, and for "rollback" the retraction and its `retracted`
event) commits with the claim. A worker's turn (no take-over, no tenant)
runs these steps in one statement and round trip (`begin_run_batch`, the
server function `lgfs_begin_run`), which leaves to them only an expired
claim to supersede. `end_run` begins with `FENCE` on the run's
token: a run that lost its claim records and releases nothing; its one
round trip (`end_run_batch`) is the fence, the release and the event in one
statement, which refuses itself rather than log an event made from a wrong
guess of the latest checkpoint. A cancel is
recorded on the claim it is for (`cancel_by`), in the statement that takes its
event's position, and read back by that claim's renewal (`txns.renew_run`).
Each function runs inside the transaction `PgConnection.run` opened.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from psycopg.rows import tuple_row
from psycopg.types.numeric import Int8

from ..core import run_fence
from ..core.checkpoints import EncodedWrite
from ..core.checksums import checksum
from ..core.claims import Claim, claim_live
from ..core.events import NewEvent
from ..core.retention import retracted_event
from ..core.runs import (
    OPERATOR_RELEASED,
    OPERATOR_TOOK_OVER,
    RUN_STRATEGIES,
    end_event,
    started_event,
    superseded_data,
)
from ..core.stored_json import dumps_json
from ..errors import TenantMismatch, ThreadBusy
from . import removals, sql, txns
from .connection import Execute, Send
from .events import append

__all__ = [
    "LatestRoots",
    "begin_run",
    "begin_run_batch",
    "cancel_run",
    "delete_unclaimed",
    "end_run",
    "end_run_batch",
    "force_release",
    "operator_take_over",
]

Cursor = Any
_TAKE_OVER = frozenset({"interrupt", "rollback"})
assert _TAKE_OVER <= set(RUN_STRATEGIES)
_INTERRUPT = "__interrupt__"  # LangGraph's channel for interrupt writes


def _adopts(thread_id: str, tenant: str | None, owner: str | None, holds_data: bool) -> bool:
    """The SQLite store's `runs.check_tenant` rule, on cells read under the row lock.

    Raises:
        TenantMismatch: the thread belongs to another tenant, or to none.
    """
    if tenant is None or owner == tenant:
        return False
    if owner is None and not holds_data:
        return True
    raise TenantMismatch(thread_id, tenant, owner)


def _lock(cur: Cursor, thread_id: str, now: float | None) -> tuple[Any, ...]:
    """Lock (creating) the thread's row; return its run cells (see `sql.LOCK_RUN_THREAD`)."""
    return txns.lock_run_thread(cur, thread_id, now)


def _lock_unless_busy(
    cur: Cursor, thread_id: str, tenant: str | None, now: float | None
) -> tuple[Any, ...]:
    """`txns.lock_unless_live`, refusing another tenant's thread (first) as the lock would.

    Raises:
        TenantMismatch: the thread is another tenant's.
        ThreadBusy: the thread has a live claim.
    """

    def judge(cells: Sequence[Any]) -> None:
        _adopts(thread_id, tenant, cells[5], cells[6])

    return txns.lock_unless_live(cur, thread_id, now, judge=judge)


def begin_run(
    cur: Cursor,
    thread_id: str,
    holder: str,
    ttl: float,
    *,
    run_id: str,
    strategy: str,
    now: float | None,
    notify: bool,
    tenant: str | None = None,
    principal: str | None = None,
) -> Claim:
    """Claim the thread for a run (taking it over for interrupt/rollback) and log it.

    Raises:
        TenantMismatch: the thread is another tenant's; nothing changes.
        ThreadBusy: the thread has a live claim and the strategy does not
            take over; nothing changes.
    """
    take_over = strategy in _TAKE_OVER
    locked = (
        _lock(cur, thread_id, now) if take_over else _lock_unless_busy(cur, thread_id, tenant, now)
    )
    old_holder, old_token, expires_at, at, old_run, owner, holds_data, _ = locked
    adopt = _adopts(thread_id, tenant, owner, holds_data)
    was_live = bool(claim_live(old_token, expires_at, at))
    if was_live and not take_over:
        raise ThreadBusy(thread_id, old_holder, txns.latest_id(cur, thread_id))
    if adopt:
        cur.execute(sql.SET_TENANT, {"tenant": tenant, "thread_id": thread_id})
    # The grant and the fence under its new token in one statement.
    args = {"thread_id": thread_id, "holder": holder, "at": at, "ttl": ttl, "run_id": run_id}
    new_token, new_expiry, seq = txns._one(cur, sql.SET_RUN_CLAIM, args)
    claim = Claim(thread_id, holder, int(new_token), float(new_expiry))
    position = int(seq)
    new: list[NewEvent] = []
    if old_token is not None:
        # A claim existed (live, or expired and left by a crashed holder): its
        # holder is fenced off from now on; the superseded run cannot log it.
        info = superseded_data(
            old_run, int(old_token), old_holder, was_live, run_id, principal, tenant, strategy
        )
        if strategy == "rollback" and old_run is not None:
            retracted, checkpoints, writes = _retract(cur, thread_id, old_run)
            new.extend(retracted)
            info["retracted_checkpoints"] = checkpoints
            info["retracted_writes"] = writes
        new.append(NewEvent("run_superseded", info))
    new.append(started_event(run_id, holder, strategy, tenant, principal))
    append(cur, thread_id, position, new, token=claim.token, now=now, notify=notify)
    return claim


def begin_run_batch(
    thread_id: str,
    holder: str,
    ttl: float,
    *,
    run_id: str,
    strategy: str,
    now: float | None,
    notify: bool,
    tenant: str | None = None,
    principal: str | None = None,
) -> Send[Claim] | None:
    """Return `begin_run` as one statement in one round trip (a `batch`), or None.

    For a run that does not take over and names no tenant: a live claim
    (read without the lock, or under it: a grant that won the race) raises
    ThreadBusy from what the statement read, a thread with no claim is
    granted with its `run_started` event (made here), and an expired claim
    to supersede refuses the batch: `begin_run` decides statement by
    statement. None (statement by statement) for the others.
    """
    if strategy in _TAKE_OVER or tenant is not None:
        return None
    text = dumps_json(
        dict(started_event(run_id, holder, strategy, None, principal).data), "event data"
    )
    params = {
        "thread_id": thread_id,
        "holder": holder,
        "ttl": ttl,
        "run_id": run_id,
        "now": now,
        "data": text,
        "checksum": Int8(checksum("run_started", text)),
        "notify": notify,
    }

    def send(execute: Execute) -> Callable[[], Claim]:
        done = execute(sql.BEGIN_RUN_AT_LOCK, params)

        def granted() -> Claim:
            row = done.fetchone()
            assert row is not None  # the function returns one row or refuses
            ok, who, token, expires_at, latest = row
            if not ok:
                raise ThreadBusy(thread_id, who, latest)
            return Claim(thread_id, holder, int(token), float(expires_at))

        return granted

    return send


def _retract(cur: Cursor, thread_id: str, run_id: str) -> tuple[list[NewEvent], int, int]:
    """Remove the superseded run's checkpoints (with their writes) and writes.

    Returns:
        The `retracted` event (none when nothing was removed), and how many
        checkpoints and writes went.
    """
    _, removed, writes = removals.remove_turn(cur, thread_id, run_id)
    if not removed and not writes:
        return [], 0, 0
    return [retracted_event(run_id, removed, writes)], len(removed), writes


def end_run(
    cur: Cursor,
    thread_id: str,
    token: int,
    kind: str,
    data: dict[str, Any],
    *,
    now: float | None,
    notify: bool,
    static_interrupt: bool,
    raise_stale: bool,
) -> bool:
    """Log a run's end (named by `end_event`) and release its claim, if it is still its own.

    Returns False when the run was superseded (nothing logged or released),
    or raises `StaleClaim` instead with `raise_stale`.
    """
    cur.execute(sql.FENCE, {"thread_id": thread_id, "token": token})
    interrupts = None
    if kind == "run_completed":
        # Sent before the fence's result is read (one round trip for both in
        # a pipeline), and run after the fence took the lock; unused if stale.
        interrupts = cur.connection.cursor(row_factory=tuple_row)
        interrupts.execute(sql.LATEST_INTERRUPTS, {"thread_id": thread_id})
    found = cur.fetchone()
    if found is None:
        if raise_stale:
            raise txns.stale(cur, thread_id, token)
        return False
    latest = None
    if interrupts is not None:
        row = interrupts.fetchone()
        latest = (row[0], int(row[1])) if row else None
    event = end_event(kind, data, latest=latest, static_interrupt=static_interrupt)
    append(cur, thread_id, int(found[0]), [event], token=token, now=now, notify=notify)
    txns.release(cur, thread_id, token)
    return True


def end_run_batch(
    thread_id: str,
    token: int,
    kind: str,
    data: dict[str, Any],
    *,
    latest: tuple[str, int] | None,
    static_interrupt: bool,
    raise_stale: bool,
    now: float | None,
    notify: bool,
) -> Send[bool] | None:
    """Return `end_run` as one statement in one round trip (a `batch`), or None.

    The event is made here, before the fence: a `run_completed` one from
    `latest` (the latest root checkpoint's id and pending interrupts, as
    this saver committed them: `LatestRoots`), which `END_RUN_AT_FENCE`
    checks under the lock. None (statement by statement) for a
    `run_completed` without it. A stale token ends it there (False: the
    run was superseded), unless `raise_stale`; that, or another latest,
    refuses the batch, and `end_run` decides.
    """
    completed = kind == "run_completed"
    if completed and latest is None:
        return None
    event = end_event(kind, data, latest=latest, static_interrupt=static_interrupt)
    text = dumps_json(dict(event.data), "event data")
    params = {
        "thread_id": thread_id,
        "token": token,
        "now": now,
        "kind": event.kind,
        "data": text,
        "checksum": Int8(checksum(event.kind, text)),
        "check_latest": completed,
        "latest_id": latest[0] if latest else None,
        "interrupts": latest[1] if latest else 0,
        "raise_stale": raise_stale,
    }
    statement = sql.END_RUN_AT_FENCE_NOTIFY if notify else sql.END_RUN_AT_FENCE

    def send(execute: Execute) -> Callable[[], bool]:
        done = execute(statement, params)

        def ended() -> bool:
            row = done.fetchone()
            assert row is not None  # the statement returns one row
            return row[0] != 0  # 0: the fence matched nothing, a superseded run

        return ended

    return send


class LatestRoots:
    """What this saver last committed as each thread's latest root checkpoint: `end_run`'s hint.

    Only a hint: `END_RUN_AT_FENCE` checks it under the thread's lock, so a
    hint that another writer (or an idempotent retry of an older put) made
    wrong costs the statement-by-statement path, never a wrong event. A run
    puts its checkpoints, then its interrupt writes (`__interrupt__`, each
    `(task_id, idx)` one row), then ends: what is counted here. At most
    `size` threads are remembered (the oldest forgotten first).
    """

    def __init__(self, size: int = 1024) -> None:
        """Remember up to `size` threads."""
        self._size = size
        self._lock = threading.Lock()
        self._roots: dict[str, tuple[str, set[tuple[str, int]]]] = {}

    def put(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> None:
        """Note a committed put: in the root namespace, the thread's new latest."""
        if checkpoint_ns != "":
            return
        with self._lock:
            self._roots.pop(thread_id, None)
            self._roots[thread_id] = (checkpoint_id, set())
            if len(self._roots) > self._size:
                del self._roots[next(iter(self._roots))]

    def put_writes(self, key: tuple[str, str, str], writes: Sequence[EncodedWrite]) -> None:
        """Note committed writes: interrupts of the latest root checkpoint are counted."""
        thread_id, checkpoint_ns, checkpoint_id = key
        with self._lock:
            root = self._roots.get(thread_id)
            if checkpoint_ns == "" and root is not None and root[0] == checkpoint_id:
                root[1].update((w.task_id, w.idx) for w in writes if w.channel == _INTERRUPT)

    def take(self, thread_id: str) -> tuple[str, int] | None:
        """Forget the thread (its run ends); return its latest root id and interrupt count."""
        with self._lock:
            root = self._roots.pop(thread_id, None)
        return None if root is None else (root[0], len(root[1]))


def cancel_run(
    cur: Cursor,
    thread_id: str,
    by: str,
    *,
    now: float | None,
    notify: bool,
    tenant: str | None = None,
) -> Claim | None:
    """Ask the run holding the thread to stop, and log `cancel_requested` (unfenced).

    Returns:
        The claim asked to stop (live or expired), or None when nothing holds
        the thread (nothing changes).

    Raises:
        TenantMismatch: the thread is another tenant's; nothing changes.
    """
    if tenant is not None:
        row = txns._one(cur, sql.GET_TENANT, {"thread_id": thread_id})
        if row is not None:
            _adopts(thread_id, tenant, row[0], row[1])
    found = txns._one(cur, sql.REQUEST_CANCEL, {"by": by, "thread_id": thread_id})
    if found is None:
        return None
    holder, token, expires_at, run_id, position = found
    data = {"run_id": run_id, "token": token, "holder": holder, "by": by, "tenant": tenant}
    append(
        cur,
        thread_id,
        int(position),
        [NewEvent("cancel_requested", data)],
        token=None,
        now=now,
        notify=notify,
    )
    return Claim(thread_id, holder or "", int(token), float(expires_at or 0.0))


def delete_unclaimed(
    cur: Cursor,
    thread_id: str,
    holder: str,
    ttl: float,
    *,
    now: float | None,
    tenant: str | None = None,
) -> None:
    """Claim the thread (refusing a live claim) and delete it, claim included.

    A live claim is refused without taking the row lock (`_lock_unless_busy`).

    Raises:
        TenantMismatch: the thread is another tenant's; nothing is deleted.
        ThreadBusy: the thread has a live claim; nothing is deleted.
    """
    locked = _lock_unless_busy(cur, thread_id, tenant, now)
    old_holder, old_token, expires_at, at, _, owner, holds_data, created = locked
    _adopts(thread_id, tenant, owner, holds_data)
    if claim_live(old_token, expires_at, at):
        raise ThreadBusy(thread_id, old_holder, txns.latest_id(cur, thread_id))
    txns.set_claim(cur, thread_id, holder, ttl, at=at, run_id=None)
    removals.delete_thread(cur, thread_id)
    if created:
        # The lock created the row; a thread that never existed has no reader
        # to warn, so it leaves no row behind.
        cur.execute(sql.DELETE_THREAD_ROW, {"thread_id": thread_id})


# --- an operator's hand on a claim (the SQLite store's events and data) -----------------


def _previous(
    operator: str, holder: Any, token: Any, run_id: Any, was_live: bool
) -> dict[str, Any]:
    return {
        "operator": operator,
        "previous_holder": holder,
        "previous_token": None if token is None else int(token),
        "previous_run_id": run_id,
        "was_live": was_live,
    }


def force_release(
    cur: Cursor, thread_id: str, operator: str, *, now: float | None, notify: bool
) -> Claim | None:
    """End the thread's claim, whoever holds it, and log `claim_released_by_operator`.

    The released token is fenced off like a taken-over one. The event is
    unfenced (no token).

    Returns:
        The claim released, or None when the thread had none (nothing
        changes, nothing is logged).
    """
    found = txns._one(cur, sql.LOCK_CLAIM, {"thread_id": thread_id, "now": now})
    if found is None or found[1] is None:
        return None
    holder, token, expires_at, run_id, at = found
    previous = Claim(thread_id, holder or "", int(token), float(expires_at or 0.0))
    txns.release(cur, thread_id, int(token))
    data = _previous(operator, holder, token, run_id, bool(claim_live(token, expires_at, at)))
    position = int(txns._one(cur, sql.TAKE_POSITION, {"thread_id": thread_id, "n": 1})[0])
    event = NewEvent(OPERATOR_RELEASED, data)
    append(cur, thread_id, position, [event], token=None, now=now, notify=notify)
    return previous


def operator_take_over(
    cur: Cursor,
    thread_id: str,
    holder: str,
    operator: str,
    ttl: float,
    *,
    now: float | None,
    notify: bool,
) -> Claim:
    """Take the thread over for `holder` (fencing off any holder), logging `claim_taken_over`.

    The event carries the new token and names `operator`, the previous holder
    and token (None when the thread had no claim).
    """
    old_holder, old_token, expires_at, at, old_run, _, _, _ = _lock(cur, thread_id, now)
    was_live = bool(claim_live(old_token, expires_at, at))
    claim = txns.set_claim(cur, thread_id, holder, ttl, at=at, run_id=None)
    position = txns.fence(cur, thread_id, claim.token, now=now, require_claim=True)
    data = {
        **_previous(operator, old_holder, old_token, old_run, was_live),
        "holder": holder,
        "expires_at": claim.expires_at,
    }
    event = NewEvent(OPERATOR_TOOK_OVER, data)
    append(cur, thread_id, position, [event], token=claim.token, now=now, notify=notify)
    return claim


# --- a run's own claim (`fence_runs`) ------------------------------------------------------


def claim_run(cur: Cursor, thread_id: str, run_id: str, *, now: float | None, notify: bool) -> int:
    """Return the token `run_id` holds on the thread, claiming it first if needed.

    The SQLite store's `runs.claim_run_txn`, under the thread's row lock: the
    claim (expired when granted: `core.run_fence`) and its events commit together.

    Raises:
        ThreadBusy: a claim that is not a run's is live.
        StaleClaim: `run_id` wrote the thread and was fenced off since.
    """
    old_holder, old_token, expires_at, at, old_run, *_ = _lock(cur, thread_id, now)
    key = {"thread_id": thread_id, "run_id": run_id}
    held = run_fence.decide(
        thread_id,
        run_id,
        token=None if old_token is None else int(old_token),
        holder=old_holder,
        claim_run_id=old_run,
        live=bool(claim_live(old_token, expires_at, at)),
        wrote=lambda: bool(txns._one(cur, sql.RUN_WROTE, key)[0]),
        latest=lambda: txns.latest_id(cur, thread_id),
    )
    if held is not None:
        return held
    args = {"thread_id": thread_id, "holder": run_fence.RUN_HOLDER, "at": at, "ttl": 0.0}
    new_token, _, seq = txns._one(cur, sql.SET_RUN_CLAIM, {**args, "run_id": run_id})
    new = run_fence.claim_events(
        run_id,
        old_token=None if old_token is None else int(old_token),
        old_holder=old_holder,
        old_run=old_run,
        was_live=False,
    )
    append(cur, thread_id, int(seq), new, token=int(new_token), now=now, notify=notify)
    return int(new_token)
