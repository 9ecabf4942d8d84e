"""Moving the values of checkpoints written before the value table into it (`repack`).

Invariant: a checkpoint is repacked only from a row whose checksum holds and
whose values decode (`checkpoints.decode_tuple`), and its new refs name
values encoded as a put encodes them (`values.encode_values`), against its
parent's when the parent was read or repacked just before; what it reads
back is what it read back before. The store applies a thread's rewrites in
one transaction, each only if its row is still the one read (same type,
same checksum), so a thread changed meanwhile is left as it was.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from ..errors import UndecodableRow
from . import checkpoints as cps
from .checksums import checkpoint_checksum
from .maintenance import RepackReport
from .values import REFS, Blob, Held, encode_values

__all__ = ["RowChanged", "Rewrite", "apply_thread", "plan_thread", "repack_threads"]

# How many recent checkpoints' values a plan keeps to encode a child against
# (a child of an older one is stored whole): a long thread's every version
# would not fit in memory.
_RECENT = 16


class Rewrite(NamedTuple):
    """One checkpoint's values moved to the value table."""

    ns: str
    cid: str
    old_type: str
    old_checksum: int
    refs: bytes
    checksum: int
    blobs: tuple[Blob, ...]
    # (parent id, its refs) when the new refs name rows of the parent's.
    borrows: tuple[str, bytes] | None
    inline_bytes: int


def plan_thread(
    serde: Any,
    thread_id: str,
    rows: Sequence[Sequence[Any]],
    held: Iterable[tuple[str, str, bytes, dict[str, Held]]],
) -> tuple[list[Rewrite], list[dict[str, Any]]]:
    """Plan a thread's rewrites from its checkpoint rows, oldest first.

    `rows` are `_CHECKPOINT_COLUMNS` rows in position order, those of the
    value table already resolved; `held` names those (`(ns, cid, refs,
    held)`), which are parents to encode against, not rows to rewrite.

    Returns:
        The rewrites, and one `{"thread_id", "checkpoint_id", "reason"}`
        per inline row that does not decode (left as it is).
    """
    already = {(ns, cid): (refs, h) for ns, cid, refs, h in held}
    recent: OrderedDict[tuple[str, str], tuple[bytes, dict[str, Held]]] = OrderedDict()
    rewrites: list[Rewrite] = []
    skipped: list[dict[str, Any]] = []
    for row in rows:
        ns, cid, parent_id = row[1], row[2], row[3]
        key = (ns, cid)
        if key in already:
            _remember(recent, key, already[key])
            continue
        try:
            tup = cps.decode_tuple(serde, tuple(row[:12]), [])
        except UndecodableRow as exc:
            skipped.append({"thread_id": thread_id, "checkpoint_id": cid, "reason": exc.reason})
            continue
        checkpoint = tup.checkpoint
        parent = recent.get((ns, parent_id)) if parent_id else None
        encoded = encode_values(
            serde,
            checkpoint.get("channel_values", {}),
            checkpoint.get("channel_versions", {}),
            None if parent is None else parent[1],
            None if parent is None else parent[0],
        )
        _remember(recent, key, (encoded.refs, encoded.held))
        envelope, metadata = row[4], row[7]
        rewrites.append(
            Rewrite(
                ns,
                cid,
                row[5],
                row[11],
                encoded.refs,
                checkpoint_checksum(envelope, REFS, encoded.refs, metadata),
                encoded.blobs,
                None if encoded.borrows is None else (parent_id, encoded.borrows),
                len(row[6]),
            )
        )
    return rewrites, skipped


def _remember(
    recent: OrderedDict[tuple[str, str], tuple[bytes, dict[str, Held]]],
    key: tuple[str, str],
    entry: tuple[bytes, dict[str, Held]],
) -> None:
    recent[key] = entry
    recent.move_to_end(key)
    while len(recent) > _RECENT:
        recent.popitem(last=False)


class RowChanged(Exception):
    """A row `repack` planned from changed before its transaction (never leaves the saver)."""


# A thread's checkpoint rows in commit order (those of the value table
# resolved), and `(ns, cid, refs, held)` of each resolved one: one snapshot.
ReadThread = Callable[
    [str], tuple[Sequence[Sequence[Any]], Iterable[tuple[str, str, bytes, dict[str, Held]]]]
]


def apply_thread(
    thread_id: str,
    changes: list[Any],
    write: Callable[[str, list[Any]], None],
    *,
    dry_run: bool,
    skipped: list[dict[str, Any]],
    verb: str,
) -> bool:
    """Apply a thread's planned changes in its one transaction (`write`), unless `dry_run`.

    Returns:
        False when the thread was written since it was read (`RowChanged`:
        nothing applied), after reporting it in `skipped`; else True.
    """
    if dry_run:
        return True
    try:
        write(thread_id, changes)
    except RowChanged:
        reason = f"the thread was written while it was {verb}; run again"
        skipped.append({"thread_id": thread_id, "checkpoint_id": None, "reason": reason})
        return False
    return True


def repack_threads(
    serde: Any,
    threads: Iterable[str],
    read: ReadThread,
    write: Callable[[str, list[Rewrite]], None],
    *,
    dry_run: bool,
) -> RepackReport:
    """Plan each thread's rewrites from one read, then apply them in one transaction each.

    `write(thread_id, rewrites)` applies a thread's rewrites all or none,
    raising `RowChanged` (nothing applied) when a row is not as read: the
    thread is reported as skipped. With `dry_run`, nothing is written.
    """
    report = RepackReport(dry_run=dry_run)
    for thread_id in threads:
        rows, held = read(thread_id)
        rewrites, skipped = plan_thread(serde, thread_id, rows, held)
        report.skipped.extend(skipped)
        if not rewrites or not apply_thread(
            thread_id, rewrites, write, dry_run=dry_run, skipped=report.skipped, verb="repacked"
        ):
            continue
        report.threads.append(thread_id)
        report.checkpoints += len(rewrites)
        report.inline_bytes += sum(r.inline_bytes for r in rewrites)
        report.stored_bytes += sum(len(b.data) for r in rewrites for b in r.blobs)
    return report
