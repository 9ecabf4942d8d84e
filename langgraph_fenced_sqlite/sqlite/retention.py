"""Removing history on SQLite: retention, retraction, deletion, copying, in transactions.

Invariant: history only shrinks here, each operation in the one transaction
the engine opened, applying `core/retention.py`'s plans, and moves the
replay floor only up. Whatever removes or replaces a thread's whole history
or a run's (`delete_for_runs`, `prune(strategy="delete")`, `copy_thread`) is
fenced like a write (`claims.check_fence`, on every thread it touches, before
anything changes) and logs an event naming what it did on each thread.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from ..core.retention import (
    PruneResult,
    RetentionPolicy,
    Retraction,
    _Node,
    plan_prune,
    plan_retraction,
    retracted_event,
    skeleton_node,
)
from ..errors import CheckpointConflict
from . import checkpoints, claims, events, schema, subgraph_runs

__all__ = ["copy_thread_txn", "delete_thread_txn", "prune_txn", "retract_txn"]


def _skeleton(conn: sqlite3.Connection, thread_id: str) -> list[_Node]:
    # Only the two JSON fields retention needs are extracted, in SQL: decoding
    # every checkpoint's whole metadata dominated pruning long threads.
    return [skeleton_node(*row) for row in checkpoints.read_skeleton(conn, thread_id)]


def _remove(conn: sqlite3.Connection, thread_id: str, keys: Iterable[tuple[str, str]]) -> int:
    rows = [(thread_id, ns, cid) for ns, cid in keys]
    conn.executemany(schema.DELETE_CHECKPOINT, rows)
    if rows:
        # The values only the removed checkpoints named go with them (first:
        # their borrow rows then need no making whole).
        conn.execute(schema.COLLECT_BLOBS, (thread_id,))
    gone = []
    for row in rows:
        gone.extend(conn.execute(schema.DELETE_WRITES_OF_CHECKPOINT, row).fetchall())
    checkpoints.unlend(conn, thread_id, gone)
    return len(gone)


def _delete_writes(conn: sqlite3.Connection, statement: str, args: tuple[Any, ...]) -> int:
    """Run one of `schema`'s removals of writes (args: the thread first); return how many went.

    The borrow rows naming their bytes are made whole (`checkpoints.unlend`).
    """
    gone = conn.execute(statement, args).fetchall()
    checkpoints.unlend(conn, args[0], gone)
    return len(gone)


def keep_latest_txn(
    conn: sqlite3.Connection,
    thread_id: str,
    token: int | None,
    *,
    now: float,
    require_claim: bool,
    dry_run: bool = False,
    note: dict[str, Any] | None = None,
) -> PruneResult:
    """LangGraph's `prune(strategy="keep_latest")`: fenced, then logged as `pruned`.

    Keeps the latest checkpoint of each namespace (and what it needs), as
    `prune_txn`; a live claim that is not `token`'s refuses it first.

    Args:
        note: More fields for the `pruned` event's data (an expiry's `ttl`).
    """
    if fence_existing(conn, thread_id, token, now=now, require_claim=require_claim) is None:
        return PruneResult(thread_id)
    result = prune_txn(
        conn, thread_id, RetentionPolicy(), now=now, keep_latest_only=True, dry_run=dry_run
    )
    if not dry_run and (result.checkpoints or result.writes_removed):
        data = {
            "strategy": "keep_latest",
            "checkpoints": [list(k) for k in result.checkpoints],
            "writes": result.writes_removed,
            **(note or {}),
        }
        row = claims.read_thread(conn, thread_id)  # re-read: the floor may have moved
        assert row is not None
        events.append(conn, thread_id, row, [events.NewEvent("pruned", data)], token=token, now=now)
    return result


def prune_txn(
    conn: sqlite3.Connection,
    thread_id: str,
    policy: RetentionPolicy,
    *,
    now: float,
    keep_latest_only: bool = False,
    dry_run: bool = False,
) -> PruneResult:
    """Apply `policy` to one thread (no claim needed, nothing logged)."""
    nodes = _skeleton(conn, thread_id)
    past: set[str] = set()
    if policy.max_subgraph_runs is not None and not keep_latest_only:
        # Past runs' namespaces go whole: none of them counts as kept below.
        past = subgraph_runs.past_namespaces(conn, thread_id, nodes, policy.max_subgraph_runs)
    removed = plan_prune(nodes, policy, now, keep_latest_only=keep_latest_only, past=past)
    floor_row = conn.execute(schema.GET_FLOOR, (thread_id,)).fetchone()
    floor, next_seq = floor_row if floor_row else (1, 1)
    if dry_run:
        # Report the floor the real prune would reach, without changing anything.
        target = floor
        if removed:
            kept = {(n.ns, n.cid) for n in nodes} - set(removed)
            first_kept = _first_event_of(conn, thread_id, kept, floor)
            if first_kept is None:
                first_kept = _past_last_event_of(conn, thread_id, set(removed), floor)
            target = max(target, first_kept)
        if policy.max_events is not None:
            target = max(target, next_seq - policy.max_events)
        new_floor = min(target, next_seq) if target > floor else floor
        orphans = conn.execute(schema.COUNT_ORPHAN_WRITES, (thread_id,)).fetchone()[0]
        for ns in past:
            orphans += conn.execute(schema.COUNT_NS_ORPHAN_WRITES, (thread_id, ns)).fetchone()[0]
        return PruneResult(thread_id, removed, new_floor, new_floor - floor, orphans)
    _remove(conn, thread_id, removed)
    # After the checkpoints: the latest of each namespace is kept, so which
    # writes are orphans does not depend on what was just removed. A past
    # run's namespace has no latest left: whatever writes remain there go.
    orphans = _delete_writes(conn, schema.DELETE_ORPHAN_WRITES, (thread_id,))
    for ns in past:
        orphans += _delete_writes(conn, schema.DELETE_NS_ORPHAN_WRITES, (thread_id, ns))
    target = floor
    if removed:
        # Events go with their checkpoints: the floor moves up to the first
        # event that concerns a checkpoint still stored. If none is left (its
        # events were compacted, or it was copied in), only past the last
        # event of a removed one: later events (caller's, `retracted`,
        # `copied`) concern nothing removed and stay.
        first_kept = conn.execute(schema.EVENT_SEQS_OF_CHECKPOINTS, (thread_id,)).fetchone()[0]
        if first_kept is None:
            first_kept = _past_last_event_of(conn, thread_id, set(removed), floor)
        target = max(target, first_kept)
    if policy.max_events is not None:
        target = max(target, next_seq - policy.max_events)
    new_floor = events.raise_floor(conn, thread_id, target) if target > floor else floor
    return PruneResult(thread_id, removed, new_floor, max(0, new_floor - floor), orphans)


def _first_event_of(
    conn: sqlite3.Connection, thread_id: str, keys: set[tuple[str, str]], floor: int
) -> int | None:
    # What EVENT_SEQS_OF_CHECKPOINTS would answer once the others are removed.
    after = floor - 1
    while True:
        rows = conn.execute(schema.EVENTS_AFTER, (thread_id, after, 500)).fetchall()
        for seq, _kind, ns, cid, *_ in rows:
            if cid is not None and (ns, cid) in keys:
                return seq
        if len(rows) < 500:
            return None
        after = rows[-1][0]


def _past_last_event_of(
    conn: sqlite3.Connection, thread_id: str, keys: set[tuple[str, str]], floor: int
) -> int:
    # One past the last event (at or above the floor) about one of `keys`;
    # the floor itself if there is none.
    after, past = floor - 1, floor
    while True:
        rows = conn.execute(schema.EVENTS_AFTER, (thread_id, after, 500)).fetchall()
        for seq, _kind, ns, cid, *_ in rows:
            if cid is not None and (ns, cid) in keys:
                past = seq + 1
        if len(rows) < 500:
            return past
        after = rows[-1][0]


def fence_existing(
    conn: sqlite3.Connection,
    thread_id: str,
    token: int | None,
    *,
    now: float,
    require_claim: bool,
) -> claims.ThreadRow | None:
    """Fence a write on `thread_id`; None when it is unknown and no token is given.

    An unknown thread holds nothing to remove, so an unfenced call passes it
    by without creating its row; a token is checked even there (a token on an
    unclaimed thread is `StaleClaim`).
    """
    if token is None and claims.read_thread(conn, thread_id) is None:
        return None
    return claims.check_fence(conn, thread_id, token, now=now, require_claim=require_claim)


def delete_all_checkpoints_txn(
    conn: sqlite3.Connection,
    thread_id: str,
    token: int | None,
    *,
    now: float,
    require_claim: bool,
) -> PruneResult:
    """LangGraph's `prune(strategy="delete")`: every checkpoint, write and event.

    Fenced: a live claim that is not `token`'s refuses it (`ThreadBusy`, or
    `StaleClaim` for a wrong token) before anything changes. The floor moves
    past every event, then one `pruned` event names what went, so a reader
    learns why the log jumped.
    """
    row = fence_existing(conn, thread_id, token, now=now, require_claim=require_claim)
    if row is None:
        return PruneResult(thread_id)
    removed = [(n.ns, n.cid) for n in _skeleton(conn, thread_id)]
    writes = conn.execute(schema.THREAD_WRITE_COUNT, (thread_id,)).fetchone()[0]
    conn.execute(schema.DELETE_THREAD_CHECKPOINTS, (thread_id,))
    conn.execute(schema.DELETE_THREAD_BLOBS, (thread_id,))
    conn.execute(schema.DELETE_THREAD_WRITES, (thread_id,))
    conn.execute(schema.DELETE_THREAD_RUNS, (thread_id,))
    floor = events.raise_floor(conn, thread_id, row.next_seq)
    if removed or writes or floor > row.floor:
        data = {"strategy": "delete", "checkpoints": [list(k) for k in removed], "writes": writes}
        # The floor is now next_seq and no event is left, so the thread row
        # read above still gives the next seq.
        events.append(conn, thread_id, row, [events.NewEvent("pruned", data)], token=token, now=now)
    return PruneResult(thread_id, removed, floor, floor - row.floor)


def delete_thread_txn(conn: sqlite3.Connection, thread_id: str) -> None:
    """Remove checkpoints, writes, events, floor and claim of one thread.

    The thread row stays as a tombstone of the next incarnation (floor 1, no
    claim), so a reader of the old one gets `ReplayUnavailable` instead of
    the new one's seqs as if they followed its own. An unknown thread: nothing.
    """
    # First: whether the thread is more than a tombstone depends on its rows.
    conn.execute(schema.TOMBSTONE_THREAD, (thread_id, thread_id))
    conn.execute(schema.DELETE_THREAD_CHECKPOINTS, (thread_id,))
    conn.execute(schema.DELETE_THREAD_BLOBS, (thread_id,))
    conn.execute(schema.DELETE_THREAD_WRITES, (thread_id,))
    conn.execute(schema.DELETE_THREAD_RUNS, (thread_id,))
    conn.execute(schema.DELETE_THREAD_EVENTS, (thread_id,))
    conn.execute(schema.FORGET_THREAD_TTL, (thread_id,))


def delete_for_runs_txn(
    conn: sqlite3.Connection,
    run_ids: Sequence[str],
    token: int | None,
    *,
    now: float,
    require_claim: bool,
) -> dict[str, int]:
    """Remove the checkpoints (with their writes) and writes of the given runs.

    Every thread holding a row of those runs is fenced first (with `token`,
    or unfenced); the first refusal raises and nothing changes. Each thread
    then gets one `runs_deleted` event naming what went.

    Returns:
        The seq of each affected thread's event, by thread id.
    """
    runs = list(dict.fromkeys(run_ids))
    touched: dict[str, list[str]] = {}
    for run_id in runs:
        for (thread_id,) in conn.execute(schema.THREADS_OF_RUN, (run_id, run_id)).fetchall():
            touched.setdefault(thread_id, []).append(run_id)
    rows = {
        t: claims.check_fence(conn, t, token, now=now, require_claim=require_claim)
        for t in sorted(touched)
    }
    seqs: dict[str, int] = {}
    for thread_id, row in rows.items():
        removed: list[tuple[str, str]] = []
        writes = 0
        for run_id in touched[thread_id]:
            keys = conn.execute(schema.CHECKPOINTS_OF_RUN_IN_THREAD, (thread_id, run_id)).fetchall()
            removed.extend((ns, cid) for ns, cid in keys)
            writes += _remove(conn, thread_id, keys)
            writes += _delete_writes(conn, schema.DELETE_WRITES_OF_RUN, (thread_id, run_id))
            conn.execute(schema.DELETE_THREAD_RUN, (thread_id, run_id))
        data = {
            "run_ids": touched[thread_id],
            "checkpoints": [list(k) for k in removed],
            "writes": writes,
        }
        (seqs[thread_id],) = events.append(
            conn, thread_id, row, [events.NewEvent("runs_deleted", data)], token=token, now=now
        )
    return seqs


def copy_thread_txn(
    conn: sqlite3.Connection,
    source: str,
    target: str,
    token: int | None,
    *,
    now: float,
    require_claim: bool,
) -> int:
    """Copy every checkpoint and write of `source` into `target`, in commit order.

    Fenced on the target. Each copied checkpoint is a new commit of the
    target: it takes the target's next position and appends a `checkpoint`
    event naming the source (positions are event seqs, so the log and
    positions stay contiguous and ordered); a last `copied` event names what
    was copied. Idempotent: a checkpoint the target already holds identically
    (an earlier copy) is left as it is, and so is a write it already has;
    when nothing at all is new, nothing is appended.

    Returns:
        How many checkpoints were copied.

    Raises:
        CheckpointConflict: the target holds a different checkpoint under an
            id of the source's (named in the message); nothing changes.
    """
    row = claims.check_fence(conn, target, token, now=now, require_claim=require_claim)
    new: list[events.NewEvent] = []
    copied: list[tuple[str, str]] = []
    clashes: list[tuple[str, str]] = []
    before = conn.total_changes
    for node in _skeleton(conn, source):
        position = row.next_seq + len(new)
        args = (target, position, source, node.ns, node.cid)
        if not conn.execute(schema.COPY_CHECKPOINT, args).rowcount:
            same = conn.execute(schema.COPY_IDENTITY, (source, target, node.ns, node.cid))
            if not same.fetchone()[0]:
                clashes.append((node.ns, node.cid))
            continue
        conn.execute(schema.COPY_WRITES_OF_CHECKPOINT, args)
        copied.append((node.ns, node.cid))
        data = {
            "step": node.step,
            "source": node.source,
            "parent_checkpoint_id": node.parent,
            "copied_from": source,
        }
        new.append(events.NewEvent("checkpoint", data, node.ns, node.cid))
    if copied:
        # The value rows the copies name (keys name content: a row the target
        # holds already is the same value), not counted among the changes.
        changes = conn.total_changes
        conn.execute(schema.COPY_BLOBS, (target, source))
        before += conn.total_changes - changes
    if clashes:
        names = ", ".join(f"{ns!r}/{cid!r}" for ns, cid in clashes)
        ns, cid = clashes[0]
        raise CheckpointConflict(
            target,
            ns,
            cid,
            cid,
            message=(
                f"copy_thread {source!r} -> {target!r}: the target already holds different "
                f"checkpoints under the ids (namespace/id) {names}; nothing was copied"
            ),
        )
    # Writes of checkpoints the target already had, and writes whose
    # checkpoint the source never stored (LangGraph sends writes first), land
    # at the position of the `copied` commit, after the last copied one.
    position = row.next_seq + len(new)
    done = set(copied)
    for ns, cid in conn.execute(schema.WRITE_KEYS_OF_THREAD, (source,)).fetchall():
        if (ns, cid) not in done:
            conn.execute(schema.COPY_WRITES_OF_CHECKPOINT, (target, position, source, ns, cid))
    changed = conn.total_changes - before
    if not changed:
        return 0  # everything was copied before: a no-op, no event
    summary: dict[str, Any] = {
        "source_thread_id": source,
        "checkpoints": len(copied),
        "copied": [list(k) for k in copied],
        "writes": changed - len(copied),
    }
    new.append(events.NewEvent("copied", summary))
    events.append(conn, target, row, new, token=token, now=now)
    return len(copied)


def retract_txn(
    conn: sqlite3.Connection,
    thread_id: str,
    token: int,
    run_id: str | None,
    *,
    now: float,
) -> Retraction:
    """Remove one turn (docs/semantics.md §6) under the claim carrying `token`."""
    row = claims.check_fence(conn, thread_id, token, now=now, require_claim=True)
    turn = plan_retraction(
        _skeleton(conn, thread_id),
        run_id,
        lambda ns, cid: subgraph_runs.parents(conn, thread_id, ns, cid),
    )
    if turn is None:
        return Retraction(thread_id, None, [], 0, None)
    run_id, targets, start = turn
    writes = _remove(conn, thread_id, targets)
    if run_id is not None:
        writes += _delete_writes(conn, schema.DELETE_WRITES_OF_RUN, (thread_id, run_id))
    else:
        writes += _delete_writes(conn, schema.DELETE_WRITES_FROM_POSITION, (thread_id, start))
    if not targets and not writes:
        return Retraction(thread_id, run_id, [], 0, None)
    (seq,) = events.append(
        conn, thread_id, row, [retracted_event(run_id, targets, writes)], token=token, now=now
    )
    return Retraction(thread_id, run_id, targets, writes, seq)
