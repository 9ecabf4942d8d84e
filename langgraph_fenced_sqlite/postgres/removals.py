"""The PostgreSQL store's removals and copies: delete_thread, delete_for_runs, copy_thread,
prune (LangGraph's strategies and retention policies), sweep, expiry, retract_turn.

Invariant: as in `txns` (the store's other transactions), a removal or copy
that writes a thread fences it first (`txns.fence`: the thread's row lock,
the token check and the position of its event in one statement), and each
function runs inside the transaction `PgConnection.run` opened, so raising
rolls everything back. Whatever removes checkpoints frees, in the same
transaction, the value rows no remaining checkpoint of the thread needs
(`values.collect`; all of them when every checkpoint went), and a copy
copies the value rows its checkpoints name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ..core.activity import is_inactive, last_activity
from ..core.claims import claim_live
from ..core.envelopes import channel_versions
from ..core.events import NewEvent
from ..core.retention import (
    PARKED,
    Expired,
    ExpiryFacts,
    PruneResult,
    RetentionPolicy,
    Retraction,
    ThreadTTL,
    judge_expiry,
    plan_prune,
    plan_retraction,
    retracted_event,
    skeleton_node,
)
from ..core.subgraph_runs import parents_of, past_namespaces_by
from ..errors import CheckpointConflict
from . import sql
from .events import append, raise_floor
from .txns import fence
from .values import collect, delete_all, unlend

Cursor = Any  # a psycopg cursor returning tuples


def delete_thread(cur: Cursor, thread_id: str) -> None:
    """Remove a thread's checkpoints, writes and events, end its claim, start a new incarnation.

    The claim's holder is fenced off; a reader at a position of the old
    incarnation gets `ReplayUnavailable`. An unknown thread: nothing happens.
    """
    params = {"thread_id": thread_id}
    cur.execute(sql.NEW_INCARNATION, params)
    cur.execute(sql.DELETE_THREAD_WRITES, params)
    cur.execute(sql.DELETE_THREAD_CHECKPOINTS, params)
    delete_all(cur, thread_id)
    cur.execute(sql.DELETE_THREAD_EVENTS, params)
    cur.execute(sql.FORGET_THREAD_TTL, params)


def delete_for_runs(
    cur: Cursor,
    run_ids: list[str],
    token: int | None,
    *,
    now: float | None,
    require_claim: bool,
    notify: bool = True,
) -> None:
    """Remove the runs' checkpoints and writes, fenced like a write on every thread they touch.

    Threads are fenced (locked) in id order, so two such calls cannot
    deadlock, and all before anything is removed; each gets one
    `runs_deleted` event.
    """
    cur.execute(sql.THREADS_OF_RUNS, {"runs": run_ids})
    threads = [r[0] for r in cur.fetchall()]
    positions = {t: fence(cur, t, token, now=now, require_claim=require_claim) for t in threads}
    for thread_id, position in positions.items():
        params: dict[str, Any] = {"thread_id": thread_id, "runs": run_ids}
        cur.execute(sql.DELETE_CHECKPOINTS_OF_RUNS, params)
        removed = [(r[0], r[1]) for r in cur.fetchall()]
        params.update(namespaces=[r[0] for r in removed], ids=[r[1] for r in removed])
        if removed:
            collect(cur, thread_id)
        cur.execute(sql.DELETE_WRITES_OF_RUNS, params)
        writes = unlend(cur, thread_id)
        data = {
            "run_ids": run_ids,
            "checkpoints": [list(k) for k in removed],
            "writes": writes,
        }
        new = [NewEvent("runs_deleted", data)]
        append(cur, thread_id, position, new, token=token, now=now, notify=notify)


def copy_thread(
    cur: Cursor,
    source: str,
    target: str,
    token: int | None,
    *,
    now: float | None,
    require_claim: bool,
    notify: bool = True,
) -> None:
    """Copy every checkpoint and write of `source` into `target`, fenced on the target.

    Each copied checkpoint gets a `checkpoint` event at its position, then
    one `copied` event names them; copying again changes nothing and logs
    nothing.

    Raises:
        CheckpointConflict: the target holds a different checkpoint under one
            of the source's ids; nothing is copied.
    """
    position = fence(cur, target, token, now=now, require_claim=require_claim)
    cur.execute(sql.COPY_CONFLICTS, {"source": source, "target": target})
    conflicts = cur.fetchall()
    if conflicts:
        ns, cid = conflicts[0]
        names = ", ".join(repr(c[1]) for c in conflicts)
        raise CheckpointConflict(
            target,
            ns,
            cid,
            cid,
            message=(
                f"copy_thread {source!r} -> {target!r}: the target holds different "
                f"checkpoints under {names}; nothing was copied"
            ),
        )
    cur.execute(sql.COPY_CHECKPOINTS, {"source": source, "target": target, "position": position})
    copied = sorted(cur.fetchall(), key=lambda r: r[2])
    # Writes land at the `copied` commit's position, after every copied checkpoint.
    params = {"source": source, "target": target, "position": position + len(copied)}
    cur.execute(sql.COPY_WRITES, params)
    writes = cur.rowcount
    new = [
        NewEvent(
            "checkpoint",
            {"step": step, "source": src, "parent_checkpoint_id": parent, "copied_from": source},
            ns,
            cid,
        )
        for ns, cid, _, step, src, parent in copied
    ]
    if copied or writes:
        summary = {
            "source_thread_id": source,
            "checkpoints": len(copied),
            "copied": [[r[0], r[1]] for r in copied],
            "writes": writes,
        }
        new.append(NewEvent("copied", summary))
    append(cur, target, position, new, token=token, now=now, notify=notify)


def prune(
    cur: Cursor,
    thread_id: str,
    strategy: str,
    token: int | None,
    *,
    now: float | None,
    require_claim: bool,
    notify: bool = True,
    note: dict[str, Any] | None = None,
) -> PruneResult:
    """LangGraph's prune, with the SQLite store's results (`retention.keep_latest_txn`,
    `retention.delete_all_checkpoints_txn`), fenced like a write on the thread.

    `keep_latest` keeps each namespace's latest and the delta chain it needs,
    removes orphan writes (counted), and raises the replay floor to the first
    event of a checkpoint still stored; `delete` removes every checkpoint and
    write and raises the floor past every event. Either logs one `pruned`
    event when anything went, at the seq the fence took (the floor stops
    there, so the event itself is never below it).
    """
    params: dict[str, Any] = {"thread_id": thread_id}
    if token is None:
        # An unknown thread holds nothing to remove: an unfenced prune passes
        # it by without creating its row (as SQLite's `fence_existing`); a
        # token is checked even there (StaleClaim).
        cur.execute(sql.GET_FLOOR, params)
        if cur.fetchone() is None:
            return PruneResult(thread_id)
    position = fence(cur, thread_id, token, now=now, require_claim=require_claim)
    cur.execute(sql.GET_FLOOR, params)
    before = int(cur.fetchone()[0])
    writes = orphans = 0
    if strategy == "delete":
        cur.execute(sql.DELETE_ALL_RETURNING, params)
        removed = [(r[0], r[1]) for r in sorted(cur.fetchall(), key=lambda r: r[2])]
        cur.execute(sql.DELETE_THREAD_WRITES, params)
        writes = cur.rowcount
        delete_all(cur, thread_id)
        target = position
    else:
        # The SQLite store's rule: each namespace's latest and the delta
        # chain it still needs stay (a naive "all but the latest" would
        # silently corrupt a DeltaChannel's state).
        nodes = _skeleton(cur, params)
        removed = plan_prune(nodes, RetentionPolicy(), 0.0, keep_latest_only=True)
        params.update(namespaces=[k[0] for k in removed], ids=[k[1] for k in removed])
        target = _remove_planned(cur, params, removed, before)
        cur.execute(sql.DELETE_ORPHAN_WRITES, params)
        orphans = unlend(cur, thread_id)
    floor = raise_floor(cur, thread_id, min(target, position), None) if target > before else before
    new = []
    if removed or writes or orphans or floor > before:
        done = writes if strategy == "delete" else orphans
        data = {"strategy": strategy, "checkpoints": [list(k) for k in removed], "writes": done}
        new.append(NewEvent("pruned", {**data, **(note or {})}))
    append(cur, thread_id, position, new, token=token, now=now, notify=notify)
    return PruneResult(thread_id, removed, floor, floor - before, orphans)


def _remove_planned(
    cur: Cursor, params: dict[str, Any], removed: list[tuple[str, str]], floor: int
) -> int:
    """Remove the planned checkpoints (`params` names them) with their writes; return
    where the floor goes: events go with their checkpoints, so up to the first event
    about a checkpoint still stored, else past the last about a removed one."""
    if not removed:
        return floor
    cur.execute(sql.DELETE_CHECKPOINTS_BY_KEY, params)
    collect(cur, params["thread_id"])  # first: borrow rows it frees need no making whole
    cur.execute(sql.DELETE_WRITES_OF_PRUNED, params)
    unlend(cur, params["thread_id"])
    cur.execute(sql.FIRST_EVENT_OF_STORED, params)
    first_kept = cur.fetchone()[0]
    if first_kept is None:
        cur.execute(sql.PAST_LAST_EVENT_OF, {**params, "floor": floor})
        first_kept = cur.fetchone()[0]
    return max(floor, int(first_kept or floor))


def prune_policy(
    cur: Cursor,
    thread_id: str,
    policy: RetentionPolicy,
    token: int | None,
    *,
    now: float | None,
    notify: bool = True,
) -> PruneResult:
    """A `RetentionPolicy`'s prune of one thread, as the SQLite store's `retention.prune_txn`.

    Needs no claim and logs no event (the latest of each namespace stays, so
    no owner's next write depends on what goes); a given `token` is checked
    all the same. `max_age` is judged by the store's clock (the database's
    unless one was injected). Removes the planned checkpoints with their
    writes, orphan writes (counted) and past subgraph runs' writes, then
    raises the floor: to the first event of a kept checkpoint, and to keep at
    most `max_events`.
    """
    params: dict[str, Any] = {"thread_id": thread_id, "now": now}
    if token is not None:
        position = fence(cur, thread_id, token, now=now, require_claim=False)
        append(cur, thread_id, position, [], token=token, now=now, notify=notify)  # no seq spent
    cur.execute(sql.LOCK_FOR_PRUNE, params)
    row = cur.fetchone()
    if row is None:
        return PruneResult(thread_id)
    before, next_seq, clock = int(row[0]), int(row[1]), float(row[2])
    nodes = _skeleton(cur, params)
    past: set[str] = set()
    if policy.max_subgraph_runs is not None:
        past = past_namespaces_by(_parents(cur, thread_id), nodes, policy.max_subgraph_runs)
    removed = plan_prune(nodes, policy, clock, past=past)
    params.update(namespaces=[k[0] for k in removed], ids=[k[1] for k in removed])
    target = _remove_planned(cur, params, removed, before)
    cur.execute(sql.DELETE_ORPHAN_WRITES, params)
    orphans = unlend(cur, thread_id)
    for ns in sorted(past):
        cur.execute(sql.DELETE_NS_ORPHAN_WRITES, {"thread_id": thread_id, "ns": ns})
        orphans += unlend(cur, thread_id)
    if policy.max_events is not None:
        target = max(target, next_seq - policy.max_events)
    floor = raise_floor(cur, thread_id, target, None) if target > before else before
    return PruneResult(thread_id, removed, floor, floor - before, orphans)


def sweep_thread(
    cur: Cursor,
    thread_id: str,
    policy: RetentionPolicy,
    *,
    now: float | None,
    idle_for: float | None,
) -> PruneResult | str | None:
    """Prune one thread by `policy` if it still qualifies (the SQLite store's
    `maintenance.sweep_thread_txn`), inside its own transaction.

    Returns:
        The prune's result; `"busy"` for a thread under a live claim; None
        for a thread written within `idle_for` (or gone since the listing).
    """
    cur.execute(sql.SWEEP_THREAD, {"thread_id": thread_id, "now": now})
    row = cur.fetchone()
    if row is None:
        return None
    token, expires_at, clock, last_cp, last_ev = row
    if idle_for is not None and not is_inactive(last_activity(last_cp, last_ev), clock, idle_for):
        return None
    if claim_live(token, expires_at, clock):
        return "busy"  # idle, yet claimed: someone may be about to write
    return prune_policy(cur, thread_id, policy, None, now=now)


# --- thread expiry (the SQLite store's `maintenance.expire_thread_txn`) -------------------


def _expiry_facts(
    cur: Cursor, thread_id: str, now: float | None
) -> tuple[ExpiryFacts, float] | None:
    """Lock the thread's row; return its expiry facts and the time judged at (`now`, or the
    database's clock read after the lock was had)."""
    cur.execute(sql.TTL_FACTS, {"thread_id": thread_id, "now": now})
    row = cur.fetchone()
    if row is None:
        return None
    ttl, strategy, seen, token, expires_at, last_cp, last_ev, at = row
    live = bool(claim_live(token, expires_at, float(at)))
    return ExpiryFacts(ttl, strategy, seen, last_cp, last_ev, live), float(at)


def see_threads(
    cur: Cursor, thread_ids: list[str], default: ThreadTTL | None, now: float | None
) -> int:
    """Remember the activity of threads no sweep has seen (park those holding nothing).

    Returns:
        How many were scheduled or parked.
    """
    done = 0
    for thread_id in sorted(thread_ids):  # id order: two sweeps lock rows alike
        found = _expiry_facts(cur, thread_id, now)
        if found is None or found[0].seen is not None:
            continue  # gone, or seen by another sweep meanwhile
        verdict, _rule, activity = judge_expiry(found[0], default, found[1])
        if verdict == "skip":
            continue
        seen = PARKED if verdict == "park" else activity
        cur.execute(sql.SET_TTL_SEEN, {"thread_id": thread_id, "seen": seen})
        done += 1
    return done


def expire_thread(
    cur: Cursor,
    thread_id: str,
    default: ThreadTTL | None,
    *,
    now: float | None,
    notify: bool = True,
) -> Expired | str | None:
    """Expire one due-looking thread if it still is due, judged on its locked row.

    Returns:
        What was expired; `"busy"`, `"scheduled"`, or None (as SQLite's).
    """
    found = _expiry_facts(cur, thread_id, now)
    if found is None:
        return None
    verdict, rule, activity = judge_expiry(found[0], default, found[1])
    if verdict in ("skip", "busy"):
        return None if verdict == "skip" else "busy"
    if verdict in ("park", "schedule"):
        seen = PARKED if verdict == "park" else activity
        cur.execute(sql.SET_TTL_SEEN, {"thread_id": thread_id, "seen": seen})
        return None if verdict == "park" else "scheduled"
    assert rule is not None
    if rule.strategy == "delete":
        delete_thread(cur, thread_id)  # parks it (FORGET_THREAD_TTL)
        return Expired(thread_id, "delete", rule.seconds, activity)
    note = {"ttl": rule.seconds, "last_activity": activity}
    result = prune(
        cur, thread_id, "keep_latest", None, now=now, require_claim=False, notify=notify, note=note
    )
    seq = None
    if result.checkpoints or result.writes_removed:
        cur.execute(sql.GET_NEXT_SEQ, {"thread_id": thread_id})
        seq = int(cur.fetchone()[0]) - 1
    # Trimmed to its latest: nothing left to expire until it is written again.
    cur.execute(sql.SET_TTL_SEEN, {"thread_id": thread_id, "seen": PARKED})
    return Expired(thread_id, "keep_latest", rule.seconds, activity, result.checkpoints, seq)


def _skeleton(cur: Cursor, params: dict[str, Any]) -> list[Any]:
    """`sql.PRUNE_SKELETON`'s rows of `params["thread_id"]`, as `retention.skeleton_node`s."""
    cur.execute(sql.PRUNE_SKELETON, params)
    thread_id, nodes = params["thread_id"], []
    for ns, cid, parent, position, source, run_id, created, step, counters, cell in cur.fetchall():
        versions = channel_versions(thread_id, cid, cell)
        nodes.append(
            skeleton_node(
                ns, cid, parent, position, source, run_id, created, step, counters, versions
            )
        )
    return nodes


def _parents(cur: Cursor, thread_id: str) -> Callable[[str, str], dict[str, Any]]:
    """Read a checkpoint's metadata `parents` of `thread_id` ({} if missing or unreadable)."""

    def parents(ns: str, cid: str) -> dict[str, Any]:
        cur.execute(sql.CHECKPOINT_PARENTS, {"thread_id": thread_id, "ns": ns, "cid": cid})
        found = cur.fetchone()
        return parents_of(None if found is None else found[0])

    return parents


class _TurnRow(NamedTuple):
    """One `sql.TURN_SKELETON` row (a `retention.TurnNode`)."""

    ns: str
    cid: str
    position: int
    source: str | None
    run_id: str | None


def remove_turn(
    cur: Cursor, thread_id: str, run_id: str | None
) -> tuple[str | None, list[tuple[str, str]], int]:
    """Remove one turn, chosen by `retention.plan_retraction` (the SQLite store's rule).

    Returns:
        The run removed (None when found by its input checkpoint, or when
        there was no turn), the `(ns, id)` keys removed oldest first, and
        how many writes went.
    """
    cur.execute(sql.TURN_SKELETON, {"thread_id": thread_id})
    nodes = [_TurnRow(*r) for r in cur.fetchall()]
    turn = plan_retraction(nodes, run_id, _parents(cur, thread_id))
    if turn is None:
        return None, [], 0
    run_id, keys, start = turn
    params: dict[str, Any] = {
        "thread_id": thread_id,
        "run_id": run_id,
        "start": start,
        "namespaces": [k[0] for k in keys],
        "ids": [k[1] for k in keys],
    }
    cur.execute(sql.DELETE_CHECKPOINTS_BY_KEY, params)
    if keys:
        collect(cur, thread_id)
    cur.execute(sql.DELETE_WRITES_OF_TURN, params)
    writes = unlend(cur, thread_id)
    return run_id, keys, writes


def retract(
    cur: Cursor,
    thread_id: str,
    token: int,
    run_id: str | None,
    *,
    now: float | None,
    notify: bool = True,
) -> Retraction:
    """Remove one turn under the claim carrying `token`, logged as `retracted`."""
    position = fence(cur, thread_id, token, now=now, require_claim=True)
    run_id, keys, writes = remove_turn(cur, thread_id, run_id)
    new = [retracted_event(run_id, keys, writes)] if keys or writes else []
    seqs = append(cur, thread_id, position, new, token=token, now=now, notify=notify)
    if not seqs:
        return Retraction(thread_id, run_id, [], 0, None)
    return Retraction(thread_id, run_id, keys, writes, seqs[0])
