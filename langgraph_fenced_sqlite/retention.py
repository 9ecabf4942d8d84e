"""Removing history: retention policies, retraction, deletion, copying.

Invariant: history only shrinks here, each operation in the one transaction
the engine opened. Pruning keeps the latest checkpoint of every namespace and
every ancestor a kept checkpoint still needs (the parent chain back to a delta
snapshot), and moves the replay floor only up. Retraction is fenced and
removes one run's checkpoints and writes, nothing committed before it began.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from . import checkpoints, claims, events, schema
from .clock import to_seconds
from .errors import bad_argument

__all__ = ["PruneResult", "RetentionPolicy", "Retraction"]


@dataclass(frozen=True)
class RetentionPolicy:
    """How much history `prune` keeps; `None` means no limit on that axis.

    The latest checkpoint of each namespace, and any checkpoint a kept one
    still needs, are always kept.

    Attributes:
        max_checkpoints: Keep at most this many newest checkpoints per thread.
        max_age: Remove checkpoints older than this (seconds or timedelta),
            by the store's clock.
        max_events: Keep at most this many newest events (raises the floor).
    """

    max_checkpoints: int | None = None
    max_age: float | timedelta | None = None
    max_events: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_checkpoints", "max_events"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise bad_argument(name, f"expected a non-negative int or None, got {value!r}")
        if self.max_age is not None:
            to_seconds(self.max_age, "max_age")

    @property
    def max_age_seconds(self) -> float | None:
        """`max_age` in seconds, or None."""
        return None if self.max_age is None else to_seconds(self.max_age, "max_age")


@dataclass(frozen=True)
class PruneResult:
    """What a prune removed (or, with `dry_run`, would remove).

    Attributes:
        thread_id: The thread pruned.
        checkpoints: `(checkpoint_ns, checkpoint_id)` of removed checkpoints.
        floor: The replay floor afterwards.
        events_removed: How many events went below the floor.
    """

    thread_id: str
    checkpoints: list[tuple[str, str]] = field(default_factory=list)
    floor: int = 1
    events_removed: int = 0


@dataclass(frozen=True)
class Retraction:
    """What `retract_turn` removed.

    Attributes:
        thread_id: The thread.
        run_id: The run removed (None when found by the `input` checkpoint).
        checkpoints: `(checkpoint_ns, checkpoint_id)` removed, oldest first.
        writes: How many pending writes were removed.
        seq: The seq of the `retracted` event (None if nothing was removed).
    """

    thread_id: str
    run_id: str | None
    checkpoints: list[tuple[str, str]]
    writes: int
    seq: int | None


@dataclass(frozen=True)
class _Node:
    ns: str
    cid: str
    parent: str | None
    position: int
    source: str | None
    run_id: str | None
    created_at: float
    step: int | None
    # Delta channels not snapshotted here (nonzero counters) that also have a
    # version in this checkpoint: the ones LangGraph rebuilds from ancestors.
    replays: bool = False


def _skeleton(conn: sqlite3.Connection, thread_id: str) -> list[_Node]:
    # Only the two JSON fields retention needs are extracted, in SQL: decoding
    # every checkpoint's whole metadata dominated pruning long threads.
    return [
        _Node(ns, cid, parent, pos, source, run_id, created, step, _replays(counters, versions))
        for ns, cid, parent, pos, source, run_id, created, step, counters, versions in (
            checkpoints.read_skeleton(conn, thread_id)
        )
    ]


def _replays(counters: dict[str, Any] | None, versions: dict[str, Any] | None) -> bool:
    # DeltaChannel (beta) stores deltas between snapshots. LangGraph rebuilds
    # a delta channel that has a version here but no stored value by walking
    # the ancestors' writes back to a snapshot (`_delta_channels_to_replay`).
    # Nonzero counters name the delta channels not snapshotted here; one with
    # no version was never written and needs no walk, yet its superstep
    # counter grows every step, so counting it would keep all history.
    if not counters:
        return False
    versioned = versions or {}
    return any(
        name in versioned and any(part for part in value) for name, value in counters.items()
    )


def _close_over_ancestors(nodes: Sequence[_Node], keep: set[tuple[str, str]]) -> None:
    by_key = {(n.ns, n.cid): n for n in nodes}
    stack = list(keep)
    while stack:
        node = by_key.get(stack.pop())
        if node is None or not node.parent or not node.replays:
            continue
        parent_key = (node.ns, node.parent)
        if parent_key in by_key and parent_key not in keep:
            keep.add(parent_key)
            stack.append(parent_key)


def _remove(conn: sqlite3.Connection, thread_id: str, keys: Iterable[tuple[str, str]]) -> int:
    rows = [(thread_id, ns, cid) for ns, cid in keys]
    conn.executemany(schema.DELETE_CHECKPOINT, rows)
    before = conn.total_changes
    conn.executemany(schema.DELETE_WRITES_OF_CHECKPOINT, rows)
    return conn.total_changes - before


def prune_txn(
    conn: sqlite3.Connection,
    thread_id: str,
    policy: RetentionPolicy,
    *,
    now: float,
    keep_latest_only: bool = False,
    dry_run: bool = False,
) -> PruneResult:
    """Apply `policy` to one thread (no claim needed)."""
    nodes = _skeleton(conn, thread_id)
    latest: dict[str, _Node] = {}
    for node in nodes:
        latest[node.ns] = node
    keep = {(n.ns, n.cid) for n in latest.values()}
    newest_first = sorted(nodes, key=lambda n: n.position, reverse=True)
    max_age = policy.max_age_seconds
    for rank, node in enumerate(newest_first):
        if keep_latest_only:
            break
        if policy.max_checkpoints is not None and rank >= policy.max_checkpoints:
            continue
        if max_age is not None and node.created_at < now - max_age:
            continue
        keep.add((node.ns, node.cid))
    _close_over_ancestors(nodes, keep)
    removed = [(n.ns, n.cid) for n in nodes if (n.ns, n.cid) not in keep]
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
        return PruneResult(thread_id, removed, new_floor, new_floor - floor)
    _remove(conn, thread_id, removed)
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
    return PruneResult(thread_id, removed, new_floor, max(0, new_floor - floor))


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


def delete_all_checkpoints_txn(conn: sqlite3.Connection, thread_id: str) -> None:
    """LangGraph's `prune(strategy="delete")`: every checkpoint, write and event."""
    conn.execute(schema.DELETE_THREAD_CHECKPOINTS, (thread_id,))
    conn.execute(schema.DELETE_THREAD_WRITES, (thread_id,))
    events.raise_floor(conn, thread_id, 1 << 62)


def delete_thread_txn(conn: sqlite3.Connection, thread_id: str) -> None:
    """Remove checkpoints, writes, events, floor and claim of one thread."""
    conn.execute(schema.DELETE_THREAD_CHECKPOINTS, (thread_id,))
    conn.execute(schema.DELETE_THREAD_WRITES, (thread_id,))
    conn.execute(schema.DELETE_THREAD_EVENTS, (thread_id,))
    conn.execute(schema.DELETE_THREAD_ROW, (thread_id,))


def delete_for_runs_txn(conn: sqlite3.Connection, run_ids: Sequence[str]) -> None:
    """Remove the checkpoints (with their writes) and writes of the given runs."""
    for run_id in run_ids:
        for thread_id, ns, cid in conn.execute(schema.CHECKPOINTS_OF_RUN, (run_id,)).fetchall():
            _remove(conn, thread_id, [(ns, cid)])
        conn.execute(schema.DELETE_WRITES_OF_RUN_ANY_THREAD, (run_id,))


def copy_thread_txn(
    conn: sqlite3.Connection, source: str, target: str, *, now: float, require_claim: bool
) -> int:
    """Copy every checkpoint and write of `source` into `target`, in commit order.

    Each copied checkpoint is a new commit of the target: it takes the
    target's next position and appends a `checkpoint` event naming the source
    (positions are event seqs, so the log and positions stay contiguous and
    ordered); a last `copied` event sums the copy up.

    Returns:
        How many checkpoints were copied.
    """
    row = claims.check_fence(conn, target, None, now=now, require_claim=require_claim)
    new: list[events.NewEvent] = []
    copied: set[tuple[str, str]] = set()
    for node in _skeleton(conn, source):
        position = row.next_seq + len(new)
        conn.execute(schema.COPY_CHECKPOINT, (target, position, source, node.ns, node.cid))
        conn.execute(
            schema.COPY_WRITES_OF_CHECKPOINT, (target, position, source, node.ns, node.cid)
        )
        copied.add((node.ns, node.cid))
        data = {
            "step": node.step,
            "source": node.source,
            "parent_checkpoint_id": node.parent,
            "copied_from": source,
        }
        new.append(events.NewEvent("checkpoint", data, node.ns, node.cid))
    # Writes whose checkpoint the source never stored (LangGraph sends writes
    # first) come along too, at the position after the last copied commit.
    position = row.next_seq + len(new)
    for ns, cid in conn.execute(schema.WRITE_KEYS_OF_THREAD, (source,)).fetchall():
        if (ns, cid) not in copied:
            conn.execute(schema.COPY_WRITES_OF_CHECKPOINT, (target, position, source, ns, cid))
    new.append(events.NewEvent("copied", {"source_thread_id": source, "checkpoints": len(new)}))
    events.append(conn, target, row, new, token=None, now=now)
    return len(new) - 1


def retract_txn(
    conn: sqlite3.Connection,
    thread_id: str,
    token: int,
    run_id: str | None,
    *,
    now: float,
) -> Retraction:
    """Remove one turn (CONTRACT §5) under the claim carrying `token`."""
    row = claims.check_fence(conn, thread_id, token, now=now, require_claim=True)
    nodes = _skeleton(conn, thread_id)
    if run_id is None:
        roots = [n for n in nodes if n.ns == ""]
        if roots and roots[-1].run_id is not None:
            run_id = roots[-1].run_id
    if run_id is not None:
        targets = [n for n in nodes if n.run_id == run_id]
        writes = _remove(conn, thread_id, [(n.ns, n.cid) for n in targets])
        writes += conn.execute(schema.DELETE_WRITES_OF_RUN, (thread_id, run_id)).rowcount
    else:
        inputs = [n for n in nodes if n.ns == "" and n.source == "input"]
        if not inputs:
            return Retraction(thread_id, None, [], 0, None)
        start = inputs[-1].position
        targets = [n for n in nodes if n.position >= start]
        writes = _remove(conn, thread_id, [(n.ns, n.cid) for n in targets])
        writes += conn.execute(schema.DELETE_WRITES_FROM_POSITION, (thread_id, start)).rowcount
    if not targets and not writes:
        return Retraction(thread_id, run_id, [], 0, None)
    removed = [(n.ns, n.cid) for n in targets]
    data = {"run_id": run_id, "checkpoints": [list(k) for k in removed], "writes": writes}
    (seq,) = events.append(
        conn, thread_id, row, [events.NewEvent("retracted", data)], token=token, now=now
    )
    return Retraction(thread_id, run_id, removed, writes, seq)
