"""An operator's maintenance on SQLite: sweeping idle threads, expiring them by their TTL,
reclaiming the file's free space.

Invariant: a sweep is one transaction per thread, each deciding inside itself
whether its thread still qualifies (no live claim, idle long enough), so a
sweep never holds the write lock longer than one thread's prune and never
prunes a thread that a run claimed meanwhile; expiry likewise, one thread per
transaction, judged again inside it (`retention.judge_expiry`). `vacuum` runs with no
transaction of its own (SQLite's VACUUM cannot run in one) and, unless
forced, refuses while a writer is active: a live claim anywhere in the file,
or another connection holding the write lock.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from ..core.activity import is_inactive, last_activity
from ..core.encryption import Encryption
from ..core.maintenance import VacuumReport, file_bytes
from ..core.rekey import CellKeys, Reseal, ThreadCells
from ..core.repack import Rewrite, RowChanged
from ..core.retention import (
    PARKED,
    Expired,
    ExpiryFacts,
    PruneResult,
    RetentionPolicy,
    ThreadTTL,
    judge_expiry,
)
from ..errors import StoreBusy, ThreadBusy
from . import checkpoints, claims, retention, schema
from .connection import is_busy

__all__ = [
    "expire_thread_txn",
    "repack_read",
    "repack_txn",
    "see_threads_txn",
    "set_thread_ttl_txn",
    "sweep_thread_txn",
    "vacuum_job",
]


def repack_read(
    conn: sqlite3.Connection, thread_id: str, enc: Encryption | None = None
) -> tuple[list[Any], list[tuple[str, str, bytes, dict[str, Any]]]]:
    """Read a thread's checkpoints in order, those in the value table resolved (one snapshot).

    Returns:
        The rows, and `(ns, cid, refs, held)` of each that was resolved.
    """
    held: list[tuple[str, str, bytes, dict[str, Any]]] = []
    rows = conn.execute(schema.THREAD_CHECKPOINTS_IN_ORDER, (thread_id,)).fetchall()
    rows = checkpoints.resolved(
        conn,
        rows,
        checkpoints.FULL_CELLS,
        strict=False,
        keep=lambda _t, ns, cid, refs, h: held.append((ns, cid, refs, h)),
        enc=enc,
    )
    return rows, held


def repack_txn(conn: sqlite3.Connection, thread_id: str, rewrites: Sequence[Rewrite]) -> None:
    """Apply a thread's planned rewrites, all or none (`RowChanged`: one row is not as read)."""
    for r in rewrites:
        changed = conn.execute(
            schema.REPACK_CHECKPOINT,
            (r.refs, r.checksum, thread_id, r.ns, r.cid, r.old_type, r.old_checksum),
        ).rowcount
        if not changed:
            raise RowChanged(r.cid)
        if r.blobs:
            checkpoints.store_blobs(conn, thread_id, r.ns, r.blobs)
        if r.borrows is not None:
            parent_id, refs = r.borrows
            held = conn.execute(schema.HOLDS_REFS, (thread_id, r.ns, parent_id, refs)).fetchone()
            if held is None:
                raise RowChanged(parent_id)


def thread_ids(conn: sqlite3.Connection) -> list[str]:
    """Return the id of every thread a sweep visits (tombstones hold nothing to prune)."""
    return [r[0] for r in conn.execute(schema.THREAD_IDS) if isinstance(r[0], str)]


def sweep_thread_txn(
    conn: sqlite3.Connection,
    thread_id: str,
    policy: RetentionPolicy,
    *,
    now: float,
    idle_for: float | None,
    dry_run: bool,
) -> PruneResult | str | None:
    """Prune one thread by `policy` if it still qualifies, inside its own transaction.

    Returns:
        The prune's result; `"busy"` for a thread under a live claim; None
        for a thread written within `idle_for` (or gone since the listing).

    Raises:
        UndecodableRow: a row of the thread is damaged (nothing changes).
    """
    row = claims.read_thread(conn, thread_id)
    if row is None:
        return None
    if idle_for is not None:
        last_cp, last_ev = conn.execute(schema.THREAD_ACTIVITY, (thread_id, thread_id)).fetchone()
        if not is_inactive(last_activity(last_cp, last_ev), now, idle_for):
            return None
    if row.live(now):
        return "busy"  # idle, yet claimed: someone may be about to write
    return retention.prune_txn(conn, thread_id, policy, now=now, dry_run=dry_run)


# --- thread expiry --------------------------------------------------------------------


def set_thread_ttl_txn(
    conn: sqlite3.Connection, thread_id: str, ttl: float | None, strategy: str | None
) -> None:
    """Set (or, with None, clear) a thread's own TTL; a sweep then looks at it afresh."""
    conn.execute(schema.ENSURE_THREAD, (thread_id,))
    conn.execute(schema.SET_THREAD_TTL, (ttl, strategy, thread_id))


def thread_ttl(conn: sqlite3.Connection, thread_id: str) -> tuple[Any, Any] | None:
    """Return a thread's own `(ttl, strategy)` cells, or None for an unknown thread."""
    row = conn.execute(schema.GET_THREAD_TTL, (thread_id,)).fetchone()
    return None if row is None else (row[0], row[1])


def unseen_ttl_threads(conn: sqlite3.Connection, with_default: bool, limit: int) -> list[str]:
    """Return up to `limit` threads no sweep has seen (all, or only those with their own TTL)."""
    sql = schema.TTL_UNSEEN if with_default else schema.TTL_UNSEEN_OWN
    return [r[0] for r in conn.execute(sql, (limit,))]


def due_ttl_threads(
    conn: sqlite3.Connection, now: float, default_ttl: float | None
) -> list[tuple[str, Any, Any]]:
    """Return `(thread_id, token, expires_at)` of every due-looking thread (indexed reads)."""
    rows = conn.execute(schema.TTL_DUE_OWN, (now,)).fetchall()
    if default_ttl is not None:
        rows += conn.execute(schema.TTL_DUE_DEFAULT, (now - default_ttl,)).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def _facts(conn: sqlite3.Connection, thread_id: str, now: float) -> ExpiryFacts | None:
    row = conn.execute(schema.TTL_FACTS, (thread_id,)).fetchone()
    if row is None:
        return None
    claim = claims.read_thread(conn, thread_id)
    live = claim is not None and claim.live(now)
    ttl = row[0] if isinstance(row[0], (int, float)) else None
    strategy = row[1] if isinstance(row[1], str) else None
    seen = row[2] if isinstance(row[2], (int, float)) else None
    return ExpiryFacts(ttl, strategy, seen, row[3], row[4], live)


def see_threads_txn(
    conn: sqlite3.Connection, thread_ids: Sequence[str], default: ThreadTTL | None, now: float
) -> int:
    """Remember the activity of threads no sweep has seen (park those holding nothing).

    A due one is only scheduled here (its activity remembered): the pass's
    due read then expires it in a transaction of its own.

    Returns:
        How many were scheduled or parked.
    """
    done = 0
    for thread_id in thread_ids:
        facts = _facts(conn, thread_id, now)
        if facts is None or facts.seen is not None:
            continue  # gone, or seen by another sweep meanwhile
        verdict, _rule, activity = judge_expiry(facts, default, now)
        if verdict == "park":
            conn.execute(schema.SET_TTL_SEEN, (PARKED, thread_id))
        elif verdict != "skip":
            conn.execute(schema.SET_TTL_SEEN, (activity, thread_id))
        else:
            continue
        done += 1
    return done


def expire_thread_txn(
    conn: sqlite3.Connection, thread_id: str, default: ThreadTTL | None, now: float
) -> Expired | str | None:
    """Expire one due-looking thread, if it still is due, inside its own transaction.

    Judged again here (`retention.judge_expiry`), so that two sweepers, or a
    writer or claimant meanwhile, are seen: a thread another sweep expired
    is parked, one written since is only rescheduled.

    Returns:
        What was expired; `"busy"` (a live claim holds it), `"scheduled"`
        (written since it was seen), or None (nothing to do).

    Raises:
        UndecodableRow: a row of the thread is damaged (nothing changes).
    """
    facts = _facts(conn, thread_id, now)
    if facts is None:
        return None
    verdict, rule, activity = judge_expiry(facts, default, now)
    if verdict in ("skip", "busy"):
        return None if verdict == "skip" else "busy"
    if verdict == "park":
        conn.execute(schema.SET_TTL_SEEN, (PARKED, thread_id))
        return None
    if verdict == "schedule":
        conn.execute(schema.SET_TTL_SEEN, (activity, thread_id))
        return "scheduled"
    assert rule is not None
    if rule.strategy == "delete":
        retention.delete_thread_txn(conn, thread_id)  # parks it (FORGET_THREAD_TTL)
        return Expired(thread_id, "delete", rule.seconds, activity)
    note = {"ttl": rule.seconds, "last_activity": activity}
    result = retention.keep_latest_txn(
        conn, thread_id, None, now=now, require_claim=False, note=note
    )
    seq = None
    if result.checkpoints or result.writes_removed:
        seq = int(conn.execute(schema.GET_FLOOR, (thread_id,)).fetchone()[1]) - 1
    # Trimmed to its latest: nothing left to expire until it is written again.
    conn.execute(schema.SET_TTL_SEEN, (PARKED, thread_id))
    return Expired(thread_id, "keep_latest", rule.seconds, activity, result.checkpoints, seq)


def refuse_if_writer(conn: sqlite3.Connection, path: str, now: float) -> None:
    """Refuse a vacuum while a writer is active: the write lock held, or a live claim.

    Probes the write lock without waiting (`BEGIN IMMEDIATE` at a zero busy
    timeout, rolled back at once; the connection's timeout is restored).

    Raises:
        StoreBusy: another connection holds the write lock.
        ThreadBusy: a thread has a live claim (the first, by thread id).
    """
    (saved,) = conn.execute(schema.get_pragma("busy_timeout")).fetchone()
    conn.execute(schema.set_pragma("busy_timeout", 0))
    try:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if not is_busy(exc):
                raise  # the engine names it (a StoreError), by its result code
            raise StoreBusy(
                "vacuum",
                path,
                0.0,
                message=(
                    f"vacuum on {path}: another connection holds the write lock (a writer "
                    "is active); nothing was changed (force=True, `lgfs vacuum --force`, "
                    "waits for it)"
                ),
            ) from exc
        try:
            for thread_id, *_ in conn.execute(schema.LIST_CLAIMS).fetchall():
                row = claims.read_thread(conn, thread_id)
                if row is not None and row.live(now):
                    raise ThreadBusy(
                        thread_id,
                        row.holder,
                        message=(
                            f"vacuum on {path}: thread {thread_id!r} has a live claim "
                            f"(holder {row.holder!r}), so a writer may be active; nothing "
                            "was changed (force=True, `lgfs vacuum --force`, vacuums all the same)"
                        ),
                    )
        finally:
            conn.execute("ROLLBACK")
    finally:
        conn.execute(schema.set_pragma("busy_timeout", int(saved)))


def vacuum_job(conn: sqlite3.Connection, path: str, *, now: float, force: bool) -> VacuumReport:
    """Rebuild the file without its free pages, then truncate the WAL (no transaction open).

    Raises:
        StoreBusy: unless `force`, a writer holds the write lock; with
            `force`, the lock was not had within the busy timeout.
        ThreadBusy: unless `force`, a thread has a live claim.
    """
    before = file_bytes(path)
    if not force:
        refuse_if_writer(conn, path, now)
    conn.execute(schema.VACUUM)
    conn.execute(schema.WAL_CHECKPOINT_TRUNCATE).fetchone()
    return VacuumReport(path, before, file_bytes(path))


# --- rekey: every value cell sealed under the current key (core/rekey.py) ----------------


def rekey_read(conn: sqlite3.Connection, thread_id: str) -> ThreadCells:
    """Read a thread's value cells (`rekey.ThreadCells`), in one snapshot."""
    return (
        conn.execute(schema.REKEY_READ_CHECKPOINTS, (thread_id,)).fetchall(),
        conn.execute(schema.REKEY_READ_WRITES, (thread_id,)).fetchall(),
        conn.execute(schema.REKEY_READ_BLOBS, (thread_id,)).fetchall(),
    )


_RESEAL = {
    "checkpoints": schema.REKEY_CHECKPOINT,
    "writes": schema.REKEY_WRITE,
    "blobs": schema.REKEY_BLOB,
}


def rekey_txn(conn: sqlite3.Connection, thread_id: str, reseals: Sequence[Reseal]) -> None:
    """Apply a thread's reseals, all or none (`RowChanged`: one row is not as read)."""
    for r in reseals:
        params = (*r.cells, r.checksum, thread_id, *r.ident, r.old_checksum)
        if not conn.execute(_RESEAL[r.table], params).rowcount:
            raise RowChanged(r.ident)


def cell_keys(conn: sqlite3.Connection) -> CellKeys:
    """Count the file's value cells by the key they are sealed under (`doctor`)."""
    out = CellKeys()
    for key_id, n in conn.execute(schema.CELL_KEYS):
        out.add(key_id, n)
    out.named_in_clear = conn.execute(schema.BLOBS_NAMED_IN_CLEAR).fetchone()[0]
    return out
