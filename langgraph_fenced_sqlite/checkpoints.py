"""LangGraph checkpoints and pending writes: encoding, the write path, reads.

Invariant: `put_txn` and `put_writes_txn` run inside a transaction the engine
opened, check in CONTRACT §3's order (fence, then version/identity), and
append their event in that same transaction; they never commit, so several
callers' writes could later share one durable commit. Encoding and decoding
happen outside the store's lock; history is append-only.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from . import claims, events, schema
from .errors import CheckpointConflict, SerializationError, UndecodableRow
from .serde import dumps_json, loads_json, write_context

ENVELOPE_FORMAT = 1
_FENCED_SOURCES = frozenset({"input", "loop"})


@dataclass(frozen=True)
class EncodedCheckpoint:
    """A checkpoint ready for the database: all encoding already done."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_id: str | None
    envelope: str
    values_type: str
    values_blob: bytes
    metadata: str
    source: str | None
    step: int | None
    run_id: str | None


@dataclass(frozen=True)
class EncodedWrite:
    """One pending write ready for the database."""

    task_id: str
    idx: int
    task_path: str
    channel: str
    type: str
    blob: bytes
    special: bool


def encode_checkpoint(
    serde: SerializerProtocol,
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    thread_id: str,
    checkpoint_ns: str,
) -> EncodedCheckpoint:
    """Encode a `put`'s arguments; raises `SerializationError` on non-data."""
    envelope = {k: v for k, v in checkpoint.items() if k != "channel_values"}
    envelope["format"] = ENVELOPE_FORMAT
    values_type, values_blob = serde.dumps_typed(checkpoint.get("channel_values", {}))
    md = get_serializable_checkpoint_metadata(config, metadata)
    run_id = md.get("run_id")
    step = md.get("step")
    return EncodedCheckpoint(
        thread_id=thread_id,
        checkpoint_ns=checkpoint_ns,
        checkpoint_id=checkpoint["id"],
        parent_id=config["configurable"].get("checkpoint_id"),
        envelope=dumps_json(envelope, "checkpoint"),
        values_type=values_type,
        values_blob=values_blob,
        metadata=dumps_json(md, "metadata"),
        source=md.get("source"),
        step=step if isinstance(step, int) and not isinstance(step, bool) else None,
        run_id=str(run_id) if run_id is not None else None,
    )


def encode_writes(
    serde: SerializerProtocol, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
) -> list[EncodedWrite]:
    """Encode `put_writes`' arguments, mapping special channels to their idx."""
    out = []
    for idx, (channel, value) in enumerate(writes):
        try:
            type_, blob = serde.dumps_typed(value)
        except SerializationError as exc:
            # Name the channel and the node: "type X refused" alone sends the
            # user hunting through every node of the graph.
            raise write_context(exc, channel=channel, task_id=task_id, task_path=task_path) from exc
        special = channel in WRITES_IDX_MAP
        out.append(
            EncodedWrite(
                task_id, WRITES_IDX_MAP.get(channel, idx), task_path, channel, type_, blob, special
            )
        )
    return out


def run_id_of(config: RunnableConfig) -> str | None:
    """Return the run id a config carries in its metadata, if any."""
    run_id = (config.get("metadata") or {}).get("run_id")
    return None if run_id is None else str(run_id)


def put_txn(
    conn: sqlite3.Connection,
    enc: EncodedCheckpoint,
    token: int | None,
    *,
    now: float,
    require_claim: bool,
) -> bool:
    """Store one checkpoint and its event; return False for an identical retry.

    Raises:
        StaleClaim, ThreadBusy: the fence refused the write.
        CheckpointConflict: the parent is not the latest (fenced input/loop
            puts), or a different checkpoint is stored under this id.
    """
    row = claims.check_fence(conn, enc.thread_id, token, now=now, require_claim=require_claim)
    key = (enc.thread_id, enc.checkpoint_ns, enc.checkpoint_id)
    position = row.next_seq
    inserted = conn.execute(
        schema.INSERT_CHECKPOINT,
        (
            *key,
            position,
            enc.parent_id,
            enc.envelope,
            enc.values_type,
            enc.values_blob,
            enc.metadata,
            enc.source,
            enc.step,
            enc.run_id,
            token,
            now,
        ),
    ).rowcount
    if not inserted:
        # Identity before version: a retried put of the (now latest)
        # checkpoint must succeed, although its parent is no longer latest.
        stored = conn.execute(schema.GET_STORED_IDENTITY, key).fetchone()
        mine = (enc.parent_id, enc.envelope, enc.values_type, enc.values_blob, enc.metadata)
        if tuple(stored) == mine:
            return False
        raise CheckpointConflict(
            enc.thread_id,
            enc.checkpoint_ns,
            enc.checkpoint_id,
            enc.checkpoint_id,
            message=(
                f"thread {enc.thread_id!r} namespace {enc.checkpoint_ns!r}: a different "
                f"checkpoint is already stored as {enc.checkpoint_id!r}"
            ),
        )
    if token is not None and enc.source in _FENCED_SOURCES:
        # Checked after the insert (which a conflict rolls back) so that the
        # common case costs one statement less.
        latest = conn.execute(schema.GET_LATEST_ID_BEFORE, (*key[:2], position)).fetchone()
        latest_id = None if latest is None else latest[0]
        if latest_id != enc.parent_id:
            raise CheckpointConflict(enc.thread_id, enc.checkpoint_ns, enc.parent_id, latest_id)
    data = {"step": enc.step, "source": enc.source, "parent_checkpoint_id": enc.parent_id}
    if enc.run_id is not None:
        data["run_id"] = enc.run_id
    events.append(
        conn,
        enc.thread_id,
        row,
        [events.NewEvent("checkpoint", data, enc.checkpoint_ns, enc.checkpoint_id)],
        token=token,
        now=now,
    )
    return True


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
    channels are last-writer-wins among writers whose token is not older.
    """
    row = claims.check_fence(conn, thread_id, token, now=now, require_claim=require_claim)
    position = row.next_seq
    changed = 0
    unowned = row.token is None
    for w in writes:
        params = (
            thread_id,
            checkpoint_ns,
            checkpoint_id,
            w.task_id,
            w.idx,
            w.task_path,
            w.channel,
            w.type,
            w.blob,
            position,
            run_id,
            token,
        )
        if w.special:
            changed += conn.execute(schema.UPSERT_WRITE_LAST_WINS, (*params, unowned)).rowcount
        else:
            changed += conn.execute(schema.INSERT_WRITE_FIRST_WINS, params).rowcount
    if changed:
        data = {
            "task_id": writes[0].task_id,
            "task_path": writes[0].task_path,
            "channels": [w.channel for w in writes],
        }
        events.append(
            conn,
            thread_id,
            row,
            [events.NewEvent("writes", data, checkpoint_ns, checkpoint_id)],
            token=token,
            now=now,
        )
    return changed


# --- reads --------------------------------------------------------------------------

# One stored checkpoint row, as `schema._CHECKPOINT_COLUMNS` orders it.
Row = tuple[str, str, str, str | None, str, str, bytes, str, int, int | None, float]
WriteRow = tuple[str, str, str, bytes, str, int]


def fetch_tuple(
    conn: sqlite3.Connection, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
) -> tuple[Row, list[WriteRow]] | None:
    """Read one checkpoint row (latest by position if no id) and its writes."""
    if checkpoint_id:
        row = conn.execute(
            schema.GET_CHECKPOINT_BY_ID, (thread_id, checkpoint_ns, checkpoint_id)
        ).fetchone()
    else:
        row = conn.execute(schema.GET_LATEST_CHECKPOINT, (thread_id, checkpoint_ns)).fetchone()
    if row is None:
        return None
    writes = conn.execute(schema.WRITES_OF_CHECKPOINT, (row[0], row[1], row[2])).fetchall()
    return tuple(row), [tuple(w) for w in writes]


def fetch_writes_for(
    conn: sqlite3.Connection, rows: Sequence[Row]
) -> dict[tuple[str, str, str], list[WriteRow]]:
    """Read the writes of a page of checkpoints in one query."""
    out: dict[tuple[str, str, str], list[WriteRow]] = {(r[0], r[1], r[2]): [] for r in rows}
    if not rows:
        return out
    sql, params = schema.writes_of_checkpoints(list(out))
    for t, ns, cid, task_id, channel, type_, blob, task_path, idx in conn.execute(sql, params):
        out[(t, ns, cid)].append((task_id, channel, type_, blob, task_path, idx))
    return out


def decode_tuple(
    serde: SerializerProtocol, row: Row, writes: Sequence[WriteRow]
) -> CheckpointTuple:
    """Rebuild a `CheckpointTuple`; a row that does not decode is `UndecodableRow`."""
    thread_id, ns, cid, parent_id, envelope, values_type, values_blob, metadata = row[:8]
    try:
        env = loads_json(envelope)
        fmt = env.pop("format", None)
        if fmt != ENVELOPE_FORMAT:
            raise SerializationError(
                f"envelope format {fmt!r}", message=f"unknown checkpoint envelope format {fmt!r}"
            )
        env["channel_values"] = serde.loads_typed((values_type, values_blob))
        pending = [
            (task_id, channel, serde.loads_typed((type_, blob)))
            for task_id, channel, type_, blob, _path, _idx in writes
        ]
        md = loads_json(metadata)
    except (SerializationError, ValueError, TypeError, KeyError) as exc:
        raise UndecodableRow(thread_id, cid, str(exc)) from exc
    config: RunnableConfig = {
        "configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}
    }
    parent: RunnableConfig | None = None
    if parent_id:
        parent = {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": parent_id,
            }
        }
    return CheckpointTuple(config, env, md, parent, pending)
