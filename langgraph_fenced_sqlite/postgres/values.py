"""The PostgreSQL store's value table (core/values.py, docs/semantics.md §7): store, read, free.

Invariant: a put's value rows are stored in the put's transaction after its
fence took the thread's row lock (`lgfs_put_values`, or `store_blobs` then
`check_parent` statement by statement), and every removal of a thread's
checkpoints frees, in its own transaction and under that same lock, the
value rows no remaining checkpoint of the thread needs (`collect`): so no
put names a row that a removal committing meanwhile frees, and a put whose
parent was removed or replaced since this process read it is refused
(`StaleParent`), never stored naming rows that may be gone. Value rows are
read in the snapshot of the checkpoint rows they resolve (the same
statement, or a REPEATABLE READ transaction), and resolved by the SQLite
store's rules (`value_reads.resolve_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from psycopg.types.numeric import Int8

from ..core.checkpoints import EncodedCheckpoint
from ..core.encryption import Encryption
from ..core.lending import lent_writes, unlent_rows
from ..core.rekey import CellKeys, Reseal, ThreadCells
from ..core.repack import Rewrite, RowChanged
from ..core.value_reads import RowCells, resolve_rows
from ..core.values import PREFIX, Blob, Held, StaleParent
from . import sql

__all__ = [
    "FULL_CELLS",
    "MustRead",
    "check_parent",
    "collect",
    "delete_all",
    "inline_threads",
    "put_params",
    "read_blobs",
    "repack_read",
    "repack_txn",
    "resolved",
    "resolved_from",
    "store_blobs",
    "unlend",
]

Cursor = Any  # a psycopg cursor returning tuples
Keep = Callable[[str, str, str, bytes, dict[str, Held]], None]
Cached = Callable[[str, str, str], tuple[bytes, dict[str, Held]] | None]

# Where a `CHECKPOINT_COLUMNS` row holds the cells `value_reads.resolve_rows` reads.
FULL_CELLS = RowCells(0, 1, 2, 4, 5, 6, 7, 11)

# `sql.INSERT_BLOBS`' arrays, in `values.Blob`'s order.
_ARRAYS = (
    "channels",
    "keys",
    "bases",
    "types",
    "items",
    "ordinals",
    "codecs",
    "sizes",
    "datas",
    "sums",
)
_INTS = frozenset({"items", "ordinals", "sizes", "sums"})


# --- a put's value rows -----------------------------------------------------------------


def put_params(blobs: Sequence[Blob], borrows: bytes | None) -> dict[str, Any]:
    """Return `sql.put_at_fence(len(blobs))`'s value-row parameters (and `borrows`).

    Integers are sent as int8 whatever their size: psycopg keys its prepared
    statements by the types it sent (see `txns`).
    """
    params: dict[str, Any] = {"borrows": borrows}
    for blob, names in zip(blobs, sql.put_values_param_names(len(blobs)), strict=True):
        channel, key, base, type_, items, ordinal, codec, size, data, checksum = blob
        cells = (channel, key, base, type_, Int8(items), Int8(ordinal), codec, Int8(size))
        params.update(zip(names, (*cells, data, Int8(checksum)), strict=True))
    return params


def store_blobs(cur: Cursor, thread_id: str, ns: str, blobs: Sequence[Blob]) -> None:
    """Store a put's value rows as `lgfs_put_values` does, statement by statement.

    The single extensions whose elements a merged row of this put holds too
    become prefixes of it (if they still are single extensions); the other
    rows are inserted unless their key is stored.
    """
    if not blobs:
        return
    columns = list(zip(*blobs, strict=True))
    params: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
    for name, column in zip(_ARRAYS, columns, strict=True):
        params[name] = [Int8(v) for v in column] if name in _INTS else list(column)
    if any(b.codec == PREFIX for b in blobs):
        cur.execute(sql.PREFIX_BLOBS, params)
    if any(b.codec != PREFIX for b in blobs):
        cur.execute(sql.INSERT_BLOBS, params)


def check_parent(cur: Cursor, enc: EncodedCheckpoint) -> None:
    """Refuse a put whose values name rows of a parent that no longer holds the refs read,
    or a pending write not stored as named (`values.LENT`).

    Raises:
        StaleParent: the parent was deleted or replaced (deleted and put
            again) since this process read it; its rows may be gone. The
            caller rolls back, and the saver stores the values whole (or,
            for a write, encodes them again naming none).
    """
    for cid, task_id, idx, checksum in lent_writes(enc.blobs):
        key = {"thread_id": enc.thread_id, "checkpoint_ns": enc.checkpoint_ns}
        named = {"checkpoint_id": cid, "task_id": task_id, "idx": idx, "checksum": checksum}
        cur.execute(sql.HOLDS_WRITE, {**key, **named})
        if cur.fetchone() is None:
            # A pending write its values name is not stored as this process
            # holds it: the saver encodes the values again, naming no write.
            raise StaleParent(enc.thread_id, enc.checkpoint_ns, enc.parent_id)
    if enc.borrows is None:
        return
    if enc.parent_id is not None:
        cur.execute(
            sql.HOLDS_REFS,
            {
                "thread_id": enc.thread_id,
                "checkpoint_ns": enc.checkpoint_ns,
                "parent_id": enc.parent_id,
                "borrows": enc.borrows,
            },
        )
        if cur.fetchone() is not None:
            return
    raise StaleParent(enc.thread_id, enc.checkpoint_ns, enc.parent_id)


def collect(cur: Cursor, thread_id: str) -> None:
    """Free the thread's value rows that none of its checkpoints needs (`sql.COLLECT_BLOBS`).

    Called by every removal of a thread's checkpoints, in its transaction,
    after its fence (or row lock) and its deletes.
    """
    cur.execute(sql.COLLECT_BLOBS, {"thread_id": thread_id})


def unlend(cur: Cursor, thread_id: str) -> int:
    """Run after a removal of writes that returned them (`sql._GONE`); return how many went.

    Makes whole the thread's borrow rows naming those writes'
    bytes (`lending.unlent_rows`), in the removal's transaction: a borrow
    row never outlives the bytes it names.
    """
    gone = cur.fetchall()
    lent = {tuple(w[:4]): tuple(w[4:]) for w in gone}
    if lent:
        cur.execute(sql.LENT_BORROWERS, {"thread_id": thread_id})
        borrowers = cur.fetchall()
        rows = unlent_rows(borrowers, lent) if borrowers else []
        if rows:
            cur.executemany(
                sql.UNLEND_BLOB,
                [
                    {
                        "thread_id": thread_id,
                        "checkpoint_ns": ns,
                        "channel": b.channel,
                        "key": b.key,
                        "codec": b.codec,
                        "size": b.size,
                        "data": b.data,
                        "checksum": Int8(b.checksum),
                        "cell": cell,
                    }
                    for ns, b, cell in rows
                ],
            )
    return len(gone)


def delete_all(cur: Cursor, thread_id: str) -> None:
    """Remove every value row of the thread (its checkpoints all went)."""
    cur.execute(sql.DELETE_THREAD_BLOBS, {"thread_id": thread_id})


# --- reads --------------------------------------------------------------------------------


def read_blobs(cur: Cursor, want: Iterable[tuple[Any, ...]]) -> list[Any]:
    """Read the value rows `want` names `(thread, ns, channel, key)`, and those they extend."""
    keys = list(want)
    cur.execute(
        sql.READ_BLOBS,
        {
            "threads": [k[0] for k in keys],
            "namespaces": [k[1] for k in keys],
            "channels": [k[2] for k in keys],
            "keys": [k[3] for k in keys],
        },
    )
    rows: list[Any] = cur.fetchall()
    return rows


def resolved(
    cur: Cursor,
    rows: list[Any],
    *,
    strict: bool,
    keep: Keep | None = None,
    enc: Encryption | None = None,
) -> list[Any]:
    """`value_reads.resolve_rows` of `CHECKPOINT_COLUMNS` rows read on `cur`, in its snapshot.

    For a transaction of one snapshot (`saver_inspect.read_snapshot`): the
    value rows are read there, after the rows they resolve.
    """
    return resolve_rows(
        rows, FULL_CELLS, lambda want: read_blobs(cur, want), strict=strict, keep=keep, enc=enc
    )


class MustRead(Exception):
    """A value row must be read that a one-statement read left out (never leaves the saver)."""


def resolved_from(
    rows: list[Any],
    blobs: list[Any],
    *,
    strict: bool,
    skipped: Callable[[Any], bool] = lambda row: False,
    keep: Keep | None = None,
    cached: Cached | None = None,
    enc: Encryption | None = None,
) -> list[Any]:
    """`value_reads.resolve_rows` of rows whose value rows one statement read with them.

    `skipped(row)` says whether the statement left a row's value rows out
    (it named the checkpoint as one this process holds).

    Raises:
        MustRead: a row the statement left out is no longer held here (the
            process put another meanwhile): read again, value rows included.
        UndecodableRow: (`strict`) a value row is missing or damaged.
    """

    def fetch(want: list[tuple[Any, ...]]) -> list[Any]:
        named = {(w[0], w[1]) for w in want}
        if any(skipped(r) and (r[0], r[1]) in named for r in rows):
            raise MustRead
        return blobs

    return resolve_rows(rows, FULL_CELLS, fetch, strict=strict, keep=keep, cached=cached, enc=enc)


# --- repack: older rows' values moved into the value table ------------------------------


def inline_threads(cur: Cursor) -> list[str]:
    """Return the threads holding checkpoints whose values are inline (`repack`)."""
    cur.execute(sql.THREADS_WITH_INLINE_VALUES)
    return [r[0] for r in cur.fetchall()]


def repack_read(
    cur: Cursor, thread_id: str, enc: Encryption | None = None
) -> tuple[list[Any], list[tuple[str, str, bytes, dict[str, Held]]]]:
    """Read a thread's checkpoints in order, those in the value table resolved (one snapshot).

    Returns:
        The rows, and `(ns, cid, refs, held)` of each that was resolved.
    """
    held: list[tuple[str, str, bytes, dict[str, Held]]] = []
    cur.execute(sql.THREAD_CHECKPOINTS_IN_ORDER, {"thread_id": thread_id})
    rows = [tuple(r) for r in cur.fetchall()]
    rows = resolved(
        cur,
        rows,
        strict=False,
        keep=lambda _t, ns, cid, refs, h: held.append((ns, cid, refs, h)),
        enc=enc,
    )
    return rows, held


def repack_txn(cur: Cursor, thread_id: str, rewrites: Sequence[Rewrite]) -> None:
    """Apply a thread's planned rewrites, all or none (`RowChanged`: one row is not as read).

    The thread's row is locked first, as every write and removal of the
    thread locks it, so no collection runs while rows are named here.
    """
    cur.execute(sql.LOCK_FOR_PRUNE, {"thread_id": thread_id, "now": None})
    for r in rewrites:
        key = {"thread_id": thread_id, "checkpoint_ns": r.ns}
        cur.execute(
            sql.REPACK_CHECKPOINT,
            {
                **key,
                "checkpoint_id": r.cid,
                "refs": r.refs,
                "checksum": Int8(r.checksum),
                "old_type": r.old_type,
                "old_checksum": Int8(r.old_checksum),
            },
        )
        if not cur.rowcount:
            raise RowChanged(r.cid)
        store_blobs(cur, thread_id, r.ns, r.blobs)
        if r.borrows is not None:
            parent_id, refs = r.borrows
            cur.execute(sql.HOLDS_REFS, {**key, "parent_id": parent_id, "borrows": refs})
            if cur.fetchone() is None:
                raise RowChanged(parent_id)


# --- rekey: every value cell sealed under the current key (core/rekey.py) ----------------


def rekey_read(cur: Cursor, thread_id: str) -> ThreadCells:
    """Read a thread's value cells (`rekey.ThreadCells`), in the transaction's snapshot."""
    key = {"thread_id": thread_id}
    out = []
    for statement in (sql.REKEY_READ_CHECKPOINTS, sql.REKEY_READ_WRITES, sql.REKEY_READ_BLOBS):
        cur.execute(statement, key)
        out.append([tuple(bytes(c) if isinstance(c, memoryview) else c for c in r) for r in cur])
    return out[0], out[1], out[2]


_RESEAL = {
    "checkpoints": sql.REKEY_CHECKPOINT,
    "writes": sql.REKEY_WRITE,
    "blobs": sql.REKEY_BLOB,
}


def rekey_txn(cur: Cursor, thread_id: str, reseals: Sequence[Reseal]) -> None:
    """Apply a thread's reseals, all or none (`RowChanged`: one row is not as read).

    The thread's row is locked first, as every write and removal of the thread locks it.
    """
    cur.execute(sql.LOCK_FOR_PRUNE, {"thread_id": thread_id, "now": None})
    for r in reseals:
        params = {
            "type": r.cells[0],
            "data": r.cells[1],
            "checksum": Int8(r.checksum),
            "old_checksum": Int8(r.old_checksum),
            "thread_id": thread_id,
            **dict(zip("abcd", r.ident, strict=False)),
        }
        cur.execute(_RESEAL[r.table], params)
        if not cur.rowcount:
            raise RowChanged(r.ident)


def cell_keys(cur: Cursor) -> CellKeys:
    """Count the store's value cells by the key they are sealed under (`doctor`)."""
    out = CellKeys()
    cur.execute(sql.CELL_KEYS)
    for key_id, n in cur.fetchall():
        out.add(key_id, int(n))
    cur.execute(sql.BLOBS_NAMED_IN_CLEAR)
    out.named_in_clear = int(cur.fetchone()[0])
    return out
