"""LangGraph checkpoints and pending writes on SQLite: the write path and reads.

Invariant: `put_txn` and `put_writes_txn` run inside a transaction the engine
opened, check in docs/semantics.md §3's order (fence, then version/identity), and
append their event in that same transaction; they never commit, so several
callers' writes can share one durable commit. History is append-only. What
is encoded, checked and decoded is `core/checkpoints.py`'s.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from ..core import envelopes
from ..core.checkpoints import (
    _FENCED_SOURCES,
    EncodedCheckpoint,
    EncodedWrite,
    Row,
    SkeletonRow,
    WriteRow,
    check_version,
    split_tuple,
    stored_put,
)
from ..core.claims import RunToken
from ..core.encryption import Encryption
from ..core.events import checkpoint_event_text, writes_event_text
from ..core.lending import lent_writes, unlent_rows
from ..core.stored_json import loads_json
from ..core.value_reads import RowCells, resolve_rows
from ..core.values import PREFIX, Blob, Held, StaleParent, is_tail
from ..errors import FencedSqliteError, UndecodableRow
from . import claims, events, schema

__all__ = [
    "fetch_tuple",
    "put_txn",
    "put_writes_txn",
    "read_resolved",
    "read_skeleton",
    "resolved",
]

_dumps = orjson.dumps


def put_txn(
    conn: sqlite3.Connection,
    enc: EncodedCheckpoint,
    token: int | None,
    *,
    now: float,
    require_claim: bool,
) -> bool:
    """Store one checkpoint and its event; return False for an identical retry.

    The common put reads one cell before its INSERT: the position, which
    `claims.next_seq_if_fenced` returns only when the fence (and, for a put
    `needs_version_check` checks, the version) holds; otherwise the checks
    run one by one and decide.

    Raises:
        StaleClaim, ThreadBusy: the fence refused the write.
        CheckpointConflict: the parent is not the latest (fenced input/loop
            puts), or a different checkpoint is stored under this id.
    """
    # The encoded row's cells in one unpacking (attribute reads of a named
    # tuple cost a lookup each, fifteen a put).
    thread_id, ns, cid, parent_id, envelope, values_type, blob, md, source, step, run_id = enc[:11]
    sum_ = enc.checksum
    # `needs_version_check(source, token)`, inlined.
    version = token is not None and source in _FENCED_SOURCES and type(token) is not RunToken
    position = claims.next_seq_if_fenced(
        conn,
        thread_id,
        token,
        now=now,
        require_claim=require_claim,
        latest=(ns, parent_id) if version else None,
    )
    if position is None:
        row = claims.check_fence(conn, thread_id, token, now=now, require_claim=require_claim)
        position = row.next_seq
    else:
        version = False  # checked, in the same transaction
    inserted = conn.execute(
        schema.INSERT_CHECKPOINT,
        (
            thread_id,
            ns,
            cid,
            position,
            parent_id,
            envelope,
            values_type,
            blob,
            md,
            source,
            step,
            run_id,
            token,
            now,
            sum_,
        ),
    ).rowcount
    if not inserted:
        stored = conn.execute(schema.GET_STORED_IDENTITY, (thread_id, ns, cid)).fetchone()
        return stored_put(enc, token, stored, lambda: _latest_before(conn, enc, position))
    if version:
        # Checked after the insert (which a conflict rolls back) so that the
        # common case costs one statement less.
        check_version(enc, token, lambda: _latest_before(conn, enc, position))
    if enc.blobs:
        store_blobs(conn, thread_id, ns, enc.blobs)
    if enc.borrows is not None and (
        parent_id is None
        or conn.execute(schema.HOLDS_REFS, (thread_id, ns, parent_id, enc.borrows)).fetchone()
        is None
    ):
        # The parent this put's values name rows of is gone or was replaced
        # (deleted and put again) since this process read it: those rows may
        # be gone. Rolled back; the saver encodes the values whole and retries.
        raise StaleParent(thread_id, ns, parent_id)
    for lent in lent_writes(enc.blobs):
        if conn.execute(schema.HOLDS_WRITE, (thread_id, ns, *lent)).fetchone() is None:
            # A pending write its values name is not stored as this process
            # holds it (another's won, or it failed): rolled back; the saver
            # encodes the values again, naming no write.
            raise StaleParent(thread_id, ns, parent_id)
    events.append_text(
        conn,
        thread_id,
        position,
        "checkpoint",
        checkpoint_event_text(step, source, parent_id, run_id),
        ns,
        cid,
        token=token,
        now=now,
    )
    return True


def store_blobs(conn: sqlite3.Connection, thread_id: str, ns: str, blobs: Sequence[Blob]) -> None:
    """Insert a put's value rows; the single extensions it names become prefix rows."""
    rows = []
    for b in blobs:
        if b.codec == PREFIX:
            gone = conn.execute(schema.DELETE_TAIL, (thread_id, ns, b.channel, b.key)).rowcount
            if not gone:
                continue  # removed meanwhile, or a prefix already
        rows.append((thread_id, ns, *b, b.codec != PREFIX and is_tail(b)))
    conn.executemany(schema.INSERT_BLOB, rows)


def unlend(conn: sqlite3.Connection, thread_id: str, gone: Sequence[Any]) -> None:
    """Make whole the thread's borrow rows naming writes just removed (`lending.unlent_rows`).

    `gone` holds the removed writes as `schema._GONE` returns them. In the
    removal's transaction: a borrow row never outlives the bytes it names.
    """
    lent = {tuple(w[:4]): tuple(w[4:]) for w in gone}
    if not lent:
        return
    borrowers = conn.execute(schema.LENT_BORROWERS, (thread_id,)).fetchall()
    rows = unlent_rows(borrowers, lent) if borrowers else []
    conn.executemany(
        schema.UNLEND_BLOB,
        [
            (b.codec, b.size, b.data, b.checksum, thread_id, ns, b.channel, b.key, cell)
            for ns, b, cell in rows
        ],
    )


def _latest_before(conn: sqlite3.Connection, enc: EncodedCheckpoint, position: int) -> str | None:
    """Return the namespace's latest checkpoint committed before `position` (this commit's)."""
    row = conn.execute(
        schema.GET_LATEST_ID_BEFORE, (enc.thread_id, enc.checkpoint_ns, position)
    ).fetchone()
    return None if row is None else row[0]


# --- put's decisions, the same for both stores -------------------------------------------


def put_writes_txn(
    conn: sqlite3.Connection,
    thread_id: str,
    checkpoint_ns: str,
    checkpoint_id: str,
    writes: Sequence[EncodedWrite],
    token: int | None,
    *,
    run_id: str | None,
    now: float,
    require_claim: bool,
) -> int:
    """Store pending writes and their one event; return how many rows changed.

    Regular writes are first-writer-wins per `(task_id, idx)`; special
    channels are last-writer-wins among writers whose token is not older,
    and an unfenced write the fence accepted (no live claim) always wins.
    """
    position = claims.next_seq_if_fenced(
        conn, thread_id, token, now=now, require_claim=require_claim
    )
    if position is None:
        row = claims.check_fence(conn, thread_id, token, now=now, require_claim=require_claim)
        position = row.next_seq
    changed = 0
    # An unfenced write got past the fence only if no claim is live (none,
    # released, or expired unreplaced): it then replaces special-channel
    # writes whatever token they carry, or it would be accepted and dropped.
    unfenced = token is None
    # Each encoded write unpacked once (its attributes cost a lookup each).
    for task_id, idx, task_path, channel, type_, blob, special, sum_ in writes:
        params = (
            thread_id,
            checkpoint_ns,
            checkpoint_id,
            task_id,
            idx,
            task_path,
            channel,
            type_,
            blob,
            position,
            run_id,
            token,
            sum_,
        )
        if special:
            changed += conn.execute(schema.UPSERT_WRITE_LAST_WINS, (*params, unfenced)).rowcount
        else:
            changed += conn.execute(schema.INSERT_WRITE_FIRST_WINS, params).rowcount
    if changed:
        first = writes[0]
        events.append_text(
            conn,
            thread_id,
            position,
            "writes",
            writes_event_text(first.task_id, first.task_path, [w.channel for w in writes]),
            checkpoint_ns,
            checkpoint_id,
            token=token,
            now=now,
        )
    return changed


# --- reads --------------------------------------------------------------------------


def fetch_tuple(
    conn: sqlite3.Connection,
    thread_id: str,
    checkpoint_ns: str,
    checkpoint_id: str | None,
    strict: bool = False,
    keep: Keep | None = None,
    enc: Encryption | None = None,
) -> tuple[Row, list[WriteRow]] | None:
    """Read one checkpoint row (latest by position if no id) and its writes, values inline.

    Runs inside a read transaction (`Engine.read`): the value rows are read
    in the same snapshot (`resolved`; `strict` and `keep` as its).
    """
    sql, params = schema.get_tuple(thread_id, checkpoint_ns, checkpoint_id)
    rows = resolved(
        conn, conn.execute(sql, params).fetchall(), FULL_CELLS, strict=strict, keep=keep, enc=enc
    )
    found = split_tuple(rows)
    return None if found is None else (found[0][:12], found[1])


# Where rows hold the cells `value_reads.resolve_rows` reads: `_CHECKPOINT_COLUMNS`
# rows, and `schema.read_tuple`'s (whose thread and namespace the read named).
FULL_CELLS = RowCells(0, 1, 2, 4, 5, 6, 7, 11)
NARROW_CELLS = RowCells(None, None, 0, 2, 3, 4, 5, 6)
# `schema.read_page`'s rows of a query that did not name both (their thread and namespace first).
PAGE_CELLS = RowCells(0, 1, 2, 4, 5, 6, 7, 8)
Keep = Callable[[str, str, str, bytes, dict[str, Held]], None]
Cached = Callable[[str, str, str], tuple[bytes, dict[str, Held]] | None]


def resolved(
    conn: sqlite3.Connection,
    rows: list[Any],
    cells: RowCells,
    *,
    thread_id: str | None = None,
    ns: str | None = None,
    strict: bool = True,
    keep: Keep | None = None,
    cached: Cached | None = None,
    enc: Encryption | None = None,
) -> list[Any]:
    """`value_reads.resolve_rows` of rows just read on `conn`, value rows read in its snapshot."""
    return resolve_rows(
        rows,
        cells,
        lambda want: conn.execute(schema.READ_BLOBS, (_dumps(want).decode(),)).fetchall(),
        thread_id=thread_id,
        ns=ns,
        strict=strict,
        keep=keep,
        cached=cached,
        enc=enc,
    )


class _MustRead(Exception):
    """A value row must be read (`resolved_from_cache`)."""


def _must_read(_want: Any) -> list[Any]:
    raise _MustRead


def resolved_from_cache(
    rows: list[Any],
    cells: RowCells,
    thread_id: str | None,
    ns: str | None,
    cached: Cached,
    enc: Encryption | None = None,
) -> list[Any] | None:
    """`resolved` rows when no value row need be read (all inline, or held here); else None."""
    try:
        return resolve_rows(
            rows, cells, _must_read, thread_id=thread_id, ns=ns, cached=cached, enc=enc
        )
    except _MustRead:
        return None


def read_resolved(
    conn: sqlite3.Connection,
    sql: str,
    params: Any,
    cells: RowCells,
    thread_id: str | None,
    ns: str | None,
    keep: Keep | None,
    cached: Cached | None = None,
    enc: Encryption | None = None,
) -> list[Any]:
    """Run one read statement and `resolved` its rows (an `Engine.read` job)."""
    rows = conn.execute(sql, params).fetchall()
    return resolved(
        conn, rows, cells, thread_id=thread_id, ns=ns, keep=keep, cached=cached, enc=enc
    )


def fetch_writes_for(
    conn: sqlite3.Connection, rows: Sequence[Row]
) -> dict[tuple[str, str, str], list[WriteRow]]:
    """Read the writes of a page of checkpoints in one query."""
    out: dict[tuple[str, str, str], list[WriteRow]] = {(r[0], r[1], r[2]): [] for r in rows}
    if not rows:
        return out
    sql, params = schema.writes_of_checkpoints(list(out))
    for t, ns, cid, *write in conn.execute(sql, params):
        out[(t, ns, cid)].append(tuple(write))
    return out


def read_skeleton(conn: sqlite3.Connection, thread_id: str) -> list[SkeletonRow]:
    """Return what retention reasons about for each checkpoint of a thread, by position.

    Each row's checksum is checked (in SQL, no blob leaves SQLite) and its
    cells are typed before retention compares or decodes any of them.

    Raises:
        UndecodableRow: a row is damaged, or a cell has the wrong type or shape.
    """
    out: list[SkeletonRow] = []
    for row in conn.execute(schema.CHECKPOINT_SKELETON, (thread_id,)):
        ns, cid, parent, position, source, run_id, created, step, counters, envelope = row[:10]
        sealed, shaped = row[10:]
        if not sealed:
            raise UndecodableRow(
                thread_id, cid, "checksum missing or mismatched: the row was damaged"
            )
        if not shaped:
            raise UndecodableRow(thread_id, cid, "metadata is not a JSON object")
        for column, value, types in (
            ("parent_checkpoint_id", parent, (str, type(None))),
            ("position", position, (int,)),
            ("source", source, (str, type(None))),
            ("run_id", run_id, (str, type(None))),
            ("created_at", created, (int, float)),
            ("step", step, (int, type(None))),
        ):
            if type(value) not in types:
                raise UndecodableRow(thread_id, cid, f"{column} holds {type(value).__name__}")
        try:
            counters = None if counters is None else loads_json(counters, "delta counters")
        except FencedSqliteError as exc:
            raise UndecodableRow(thread_id, cid, str(exc)) from exc
        versions = envelopes.channel_versions(thread_id, cid, envelope)
        if not isinstance(counters, (dict, type(None))) or not all(
            isinstance(v, list) for v in (counters or {}).values()
        ):
            raise UndecodableRow(thread_id, cid, "metadata's delta counters have the wrong shape")
        created = float(created)
        out.append((ns, cid, parent, position, source, run_id, created, step, counters, versions))
    return out
