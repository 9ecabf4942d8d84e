"""Run lifecycle transactions on SQLite: a claim and its first event, an end event and its release.

Invariant: a run's `run_started` event commits in the same transaction as its
claim (with `run_superseded`, and the retraction for "rollback"), and its end
event in the same transaction as its release, so running under a claim costs
exactly two commits. A run that lost its claim records and releases nothing:
the run that superseded it has already logged it. A tenant's call meets
another tenant's thread only to refuse it (`TenantMismatch`, before any
change). A cancel is recorded on the claim it is for, with its event, and
read back by that claim's renewal. Runs inside a transaction the engine opened.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from ..core import run_fence
from ..core.claims import Claim, tenant_cells
from ..core.runs import (
    _INTERRUPT,
    _SCAN_PAGE,
    _TAKE_OVER,
    OPERATOR_RELEASED,
    OPERATOR_TOOK_OVER,
    _previous,
    end_event,
    started_event,
    superseded_data,
)
from ..errors import TenantMismatch
from . import claims, events, retention, schema

__all__ = ["begin_run_txn", "cancel_run_txn", "claim_run_txn", "end_run_txn"]


def superseded_run_id(
    conn: sqlite3.Connection, thread_id: str, token: int, incarnation: int
) -> str | None:
    """Return the run id a run logged under `token`, scanning back from the end.

    The `run_started` event commits with its claim, so it is the first event
    under that token: the scan stops at the first older token it meets.
    `incarnation` is the thread's current one (the scan's positions are in it).
    """
    floor, next_seq = conn.execute(schema.GET_FLOOR, (thread_id,)).fetchone()
    hi = next_seq - 1
    while hi >= floor:
        lo = max(floor, hi - _SCAN_PAGE + 1)
        page = events.read_after(conn, thread_id, lo - 1, hi - lo + 1, incarnation)
        for event in reversed(page):
            if event.token == token and event.kind == "run_started":
                run_id = event.data.get("run_id")
                return run_id if isinstance(run_id, str) else None
            if event.token is not None and event.token < token:
                return None
        hi = lo - 1
    return None


def check_tenant(conn: sqlite3.Connection, thread_id: str, tenant: str | None) -> bool:
    """Refuse another tenant's thread; return whether the thread is `tenant`'s to adopt.

    A call without a tenant may use any thread. A tenant's call may use its
    own threads, and adopts a thread without a tenant that holds nothing yet
    (no checkpoint, no event); one written without a tenant is refused, since
    nothing says whose it is. A deleted thread keeps its tenant.

    Raises:
        TenantMismatch: the thread belongs to another tenant, or to none.
    """
    if tenant is None:
        return False
    row = conn.execute(schema.GET_TENANT, (thread_id,)).fetchone()
    if row is None:
        return True
    owner, holds_data = tenant_cells(thread_id, row[0], row[1])
    if owner == tenant:
        return False
    if owner is None and not holds_data:
        return True
    raise TenantMismatch(thread_id, tenant, owner)


def begin_run_txn(
    conn: sqlite3.Connection,
    thread_id: str,
    holder: str,
    ttl: float,
    *,
    run_id: str,
    strategy: str,
    now: float,
    tenant: str | None = None,
    principal: str | None = None,
) -> Claim:
    """Claim the thread for a run (taking it over for interrupt/rollback) and log it.

    The run's tenant (recorded on a thread it adopts) and principal are named
    in `run_started` and `run_superseded`.

    Raises:
        TenantMismatch: the thread is another tenant's; nothing changes.
        ThreadBusy: the thread has a live claim and the strategy does not
            take over; nothing changes.
    """
    adopt = check_tenant(conn, thread_id, tenant)
    before = claims.read_thread(conn, thread_id)
    claim = claims.grant(
        conn, thread_id, holder, ttl, now=now, force=strategy in _TAKE_OVER, run_id=run_id
    )
    if adopt:
        conn.execute(schema.SET_TENANT, (tenant, thread_id))
    new: list[events.NewEvent] = []
    if before is not None and before.token is not None:
        # A claim existed (live, or expired and left by a crashed holder): its
        # holder is fenced off from now on. Log that from this side, since
        # the superseded run can no longer write anything.
        old_run = before.run_id
        if old_run is None:
            # A claim granted before the claim row recorded its run (schema
            # 1 files): its `run_started` event, if compaction left it.
            old_run = superseded_run_id(conn, thread_id, before.token, before.incarnation)
        info = superseded_data(
            old_run,
            before.token,
            before.holder,
            before.live(now),
            run_id,
            principal,
            tenant,
            strategy,
        )
        if strategy == "rollback" and old_run is not None:
            # Only the superseded run's own rows: nothing from an earlier turn,
            # even when it had not written anything yet.
            done = retention.retract_txn(conn, thread_id, claim.token, old_run, now=now)
            info["retracted_checkpoints"] = len(done.checkpoints)
            info["retracted_writes"] = done.writes
        new.append(events.NewEvent("run_superseded", info))
    new.append(started_event(run_id, holder, strategy, tenant, principal))
    row = claims.read_thread(conn, thread_id)  # re-read: a retraction appended an event
    assert row is not None
    events.append(conn, thread_id, row, new, token=claim.token, now=now)
    return claim


def end_run_txn(
    conn: sqlite3.Connection,
    thread_id: str,
    token: int,
    kind: str,
    data: dict[str, Any],
    *,
    now: float,
    static_interrupt: bool,
    raise_stale: bool = False,
) -> bool:
    """Log a run's end and release its claim, if the claim is still its own.

    A `run_completed` whose latest root checkpoint has pending interrupts (or
    that stopped at a static interrupt) is logged as `run_interrupted`.

    Returns:
        False when the run was superseded (nothing logged or released).

    Raises:
        StaleClaim: with `raise_stale`, instead of returning False.
    """
    row = claims.read_thread(conn, thread_id)
    if row is None or row.token != token:
        # Superseded (or deleted): record nothing, release nothing.
        if raise_stale:
            raise claims.stale(conn, thread_id, token)
        return False
    latest = None
    if kind == "run_completed":
        found = conn.execute(schema.GET_LATEST_ID, (thread_id, "")).fetchone()
        if found is not None:
            channels = [
                w[1] for w in conn.execute(schema.WRITES_OF_CHECKPOINT, (thread_id, "", found[0]))
            ]
            latest = (found[0], channels.count(_INTERRUPT))
    event = end_event(kind, data, latest=latest, static_interrupt=static_interrupt)
    events.append(conn, thread_id, row, [event], token=token, now=now)
    claims.release(conn, thread_id, token)
    return True


def cancel_run_txn(
    conn: sqlite3.Connection, thread_id: str, by: str, *, now: float, tenant: str | None = None
) -> Claim | None:
    """Ask the run holding the thread to stop, and log `cancel_requested`.

    The request is recorded on the current claim (its renewal reads it) and
    goes with it: a later claim never sees it.

    Returns:
        The claim asked to stop (live or expired), or None when nothing holds
        the thread (nothing changes).

    Raises:
        TenantMismatch: the thread is another tenant's; nothing changes.
    """
    check_tenant(conn, thread_id, tenant)
    found = conn.execute(schema.REQUEST_CANCEL, (by, thread_id)).fetchone()
    if found is None:
        return None
    holder, token, expires_at = claims.claim_row(thread_id, *found[:3])
    assert token is not None  # the statement only matches a claimed thread
    row = claims.read_thread(conn, thread_id)
    assert row is not None
    data = {"run_id": row.run_id, "token": token, "holder": holder, "by": by, "tenant": tenant}
    events.append(
        conn, thread_id, row, [events.NewEvent("cancel_requested", data)], token=None, now=now
    )
    return Claim(thread_id, holder or "", token, expires_at or 0.0)


def delete_unclaimed_txn(
    conn: sqlite3.Connection,
    thread_id: str,
    holder: str,
    ttl: float,
    *,
    now: float,
    tenant: str | None = None,
) -> None:
    """Claim the thread (refusing a live claim) and delete it, claim included.

    Raises:
        TenantMismatch: the thread is another tenant's; nothing is deleted.
        ThreadBusy: the thread has a live claim; nothing is deleted.
    """
    check_tenant(conn, thread_id, tenant)
    existed = claims.read_thread(conn, thread_id) is not None
    claims.grant(conn, thread_id, holder, ttl, now=now, force=False)
    retention.delete_thread_txn(conn, thread_id)
    if not existed:
        # The claim created the row; a thread that never existed has no
        # reader to warn, so it leaves no tombstone behind.
        conn.execute(schema.DELETE_THREAD_ROW, (thread_id,))


# --- an operator's hand on a claim ------------------------------------------------------------


def force_release_txn(
    conn: sqlite3.Connection, thread_id: str, operator: str, *, now: float
) -> Claim | None:
    """End the thread's claim, whoever holds it, and log who did it, in one commit.

    The released token is fenced off like a taken-over one: its holder's next
    fenced write or renewal is `StaleClaim`, its release and end of run change
    nothing (`end_run_txn` returns False). The event is unfenced (no token).

    Returns:
        The claim that was released, or None when the thread had none
        (nothing changes, nothing is logged).
    """
    row = claims.read_thread(conn, thread_id)
    if row is None or row.token is None:
        return None
    previous = Claim(thread_id, row.holder or "", row.token, row.expires_at or 0.0)
    claims.release(conn, thread_id, row.token)
    event = events.NewEvent(OPERATOR_RELEASED, _previous(row, operator, now))
    events.append(conn, thread_id, row, [event], token=None, now=now)
    return previous


def operator_take_over_txn(
    conn: sqlite3.Connection,
    thread_id: str,
    holder: str,
    operator: str,
    ttl: float,
    *,
    now: float,
) -> Claim:
    """Take the thread over for `holder` (fencing off any holder) and log it, in one commit.

    `holder` gets a new token until `now + ttl`; the `claim_taken_over`
    event carries that token and names `operator`, the previous holder and
    token (None when the thread had no claim).
    """
    before = claims.ensure_thread(conn, thread_id)
    claim = claims.grant(conn, thread_id, holder, ttl, now=now, force=True)
    data = {**_previous(before, operator, now), "holder": holder, "expires_at": claim.expires_at}
    row = claims.read_thread(conn, thread_id)
    assert row is not None
    event = events.NewEvent(OPERATOR_TOOK_OVER, data)
    events.append(conn, thread_id, row, [event], token=claim.token, now=now)
    return claim


# --- a run's own claim (`fence_runs`) ------------------------------------------------------


def claim_run_txn(conn: sqlite3.Connection, thread_id: str, run_id: str, *, now: float) -> int:
    """Return the token `run_id` holds on the thread, claiming it first if needed.

    The claim (expired when granted: `core.run_fence`) and its events commit
    together; a run that already holds the thread changes nothing.

    Raises:
        ThreadBusy: a claim that is not a run's is live.
        StaleClaim: `run_id` wrote the thread and was fenced off since.
    """
    before = claims.read_thread(conn, thread_id)
    held = run_fence.decide(
        thread_id,
        run_id,
        token=None if before is None else before.token,
        holder=None if before is None else before.holder,
        claim_run_id=None if before is None else before.run_id,
        live=before is not None and bool(before.live(now)),
        wrote=lambda: conn.execute(schema.RUN_WROTE, (thread_id, run_id)).fetchone() is not None,
        latest=lambda: claims._latest(conn, thread_id),
    )
    if held is not None:
        return held
    claim = claims.grant(
        conn, thread_id, run_fence.RUN_HOLDER, 0.0, now=now, force=False, run_id=run_id
    )
    new = run_fence.claim_events(
        run_id,
        old_token=None if before is None else before.token,
        old_holder=None if before is None else before.holder,
        old_run=None if before is None else before.run_id,
        was_live=False,
    )
    row = claims.read_thread(conn, thread_id)
    assert row is not None
    events.append(conn, thread_id, row, new, token=claim.token, now=now)
    return claim.token
