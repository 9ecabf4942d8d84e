"""LangGraph checkpoints and pending writes as both stores store them: encoding, checks, decoding.

Invariant: encoding and decoding happen outside any transaction, the same for
both stores, so both store, refuse and rebuild the same values. Every row
carries `checksums.checksum` of its value cells (docs/semantics.md §7), and
every row read is checked against it (`check_row`, `check_cells`) before
anything in it is decoded: damage is an `UndecodableRow`, never a different
valid value. The version checks of docs/semantics.md §3 (`check_version`,
`stored_put`) are decided here; each store runs them in its transaction.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT

from ..errors import CheckpointConflict, FencedSqliteError, SerializationError, UndecodableRow
from . import envelopes
from .checksums import REBUILT, checkpoint_checksum, write_checksum
from .claims import RunToken
from .compression import compress_typed
from .encryption import encryption_of
from .serde import write_context
from .slices import SLICE, find_slice, open_slice
from .stored_json import (
    MAX_INT,
    MIN_INT,
    NOT_FINE,
    PLAIN,
    dumps_json,
    json_kind,
    loads_json,
)
from .validation import flat_metadata
from .values import REFS, REFS_ERROR, RESOLVED, Held

__all__ = [
    "EncodedCheckpoint",
    "EncodedWrite",
    "check_row",
    "decode_tuple",
    "encode_checkpoint",
    "encode_writes",
    "step_role",
]

ENVELOPE_FORMAT = 1


_ABSENT = object()


_FENCED_SOURCES = frozenset({"input", "loop"})


# `tuple.__new__`: what a named tuple's own (Python) `__new__` calls.
_new_tuple = tuple.__new__


# Named tuples, not frozen dataclasses: every put builds one, and a frozen
# dataclass sets each field through `object.__setattr__`.
class EncodedCheckpoint(NamedTuple):
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
    checksum: int
    # The value rows this checkpoint adds (`values.Blob`; empty: its values are inline).
    blobs: tuple[Any, ...]
    # The parent's refs this checkpoint's values name rows of, as read or put
    # here; the store checks, in the put's transaction, that the parent still
    # holds them (None: it names only rows it adds).
    borrows: bytes | None
    # What this process then holds of its values (`values.ValueCache`); None: inline.
    held: dict[str, Any] | None


class EncodedWrite(NamedTuple):
    """One pending write ready for the database."""

    task_id: str
    idx: int
    task_path: str
    channel: str
    type: str
    blob: bytes
    special: bool
    checksum: int


def encode_checkpoint(
    serde: SerializerProtocol,
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    thread_id: str,
    checkpoint_ns: str,
    *,
    plain_envelope: bool | None = None,
    plain_metadata: bool = False,
    envelope: dict[str, Any] | None = None,
    values: tuple[str, bytes, tuple[Any, ...], bytes | None, dict[str, Any]] | None = None,
) -> EncodedCheckpoint:
    """Encode a `put`'s arguments; raises `SerializationError` on non-data.

    `plain_envelope` is what `check_checkpoint` found (True: `PLAIN` JSON,
    encoded by orjson; False: not, encoded by `json`), so the envelope is not
    walked twice; None: walked here. `plain_metadata` True: `metadata` is an
    exact dict that `check_checkpoint` found `PLAIN`, so the stored metadata
    (it plus the config's keys) is judged with no second walk. `envelope`:
    the checkpoint without its channel values, as `check_checkpoint` built it
    (a dict of the caller's that this changes); None: built here.
    `values` is `(values_type, values_blob, blobs, borrows, held)` when the channel
    values are encoded already (`values.encode_values`); None: encoded
    here, inline.
    """
    if envelope is None:
        envelope = {k: v for k, v in checkpoint.items() if k != "channel_values"}
    envelope["format"] = ENVELOPE_FORMAT
    if values is None:
        values_type, values_blob = serde.dumps_typed(checkpoint.get("channel_values", {}))
        enc = encryption_of(serde)
        if enc is not None:
            # Compressed, then sealed (ciphertext does not compress).
            values_type, values_blob = enc.seal_typed(*compress_typed(values_type, values_blob))
        blobs: tuple[Any, ...] = ()
        borrows = held = None
    else:
        values_type, values_blob, blobs, borrows, held = values
    config_md = config.get("metadata")
    if config_md is not None and type(config_md) is not dict:
        flat = flat_metadata(config_md)
        if flat is not None:
            # A graph's ChainMap, as one dict of the same items in the same
            # order: LangGraph reads it through ChainMap's Python methods.
            config = {**config, "metadata": flat}
    md = get_serializable_checkpoint_metadata(config, metadata)
    run_id = md.get("run_id")
    step = md.get("step")
    source = md.get("source")
    # "format" is an int: a plain envelope stays plain.
    kind = None if plain_envelope is None else PLAIN if plain_envelope else NOT_FINE
    # Stored compressed against a sample envelope (`envelopes.pack`).
    envelope_text = envelopes.pack(dumps_json(envelope, "checkpoint", kind=kind))
    md_kind = None
    if plain_metadata:
        # Equal to `metadata` (a C comparison): nothing added from the config
        # and no NUL removed, so each value is `metadata`'s own or the exact
        # str that `replace` returned for it; plain as `metadata` is.
        md_kind = PLAIN if md == metadata else _metadata_kind(md, metadata)
    metadata_text = dumps_json(md, "metadata", kind=md_kind)
    # `EncodedCheckpoint(...)` in field order, without the named
    # tuple's Python `__new__` and its keywords (5k instructions a put).
    result: EncodedCheckpoint = _new_tuple(
        EncodedCheckpoint,
        (
            thread_id,
            checkpoint_ns,
            checkpoint["id"],
            config["configurable"].get("checkpoint_id"),
            envelope_text,
            values_type,
            values_blob,
            metadata_text,
            # The columns copy what they can hold; the metadata keeps it exactly.
            source if isinstance(source, str) else None,
            step if isinstance(step, int) and not isinstance(step, bool) else None,
            str(run_id) if run_id is not None else None,
            checkpoint_checksum(envelope_text, values_type, values_blob, metadata_text),
            blobs,
            borrows,
            held,
        ),
    )
    return result


def _metadata_kind(md: Mapping[str, Any], metadata: Any) -> int | None:
    """Return `PLAIN` if `md` is, given that `metadata` (an exact dict) is; else None.

    `md` is `metadata` plus the config's keys (LangGraph's
    `get_checkpoint_metadata`): only what `metadata` does not hold as the
    same object is judged (as `json_kind` would); None leaves the whole walk
    to `dumps_json`.
    """
    # `json_kind` of the added entries, one by one (no dict built): what
    # `get_checkpoint_metadata` adds or replaces is a str (NUL removed), an
    # int, a bool or a float; any other entry, or a key not plain ASCII, is
    # walked as `json_kind` walks it.
    get = metadata.get
    for k, v in md.items():
        if v is get(k, _ABSENT):
            continue
        if type(k) is str and k.isascii():
            kind = type(v)
            if kind is str:
                if v.isascii():
                    continue
            elif kind is int:
                if MIN_INT <= v <= MAX_INT:
                    continue
            elif kind is bool or v is None:
                continue
        if json_kind({k: v}) != PLAIN:
            return None
    return PLAIN


def encode_writes(
    serde: SerializerProtocol,
    writes: Sequence[tuple[str, Any]],
    task_id: str,
    task_path: str,
    *,
    compress: bool = False,
    within: Mapping[str, Held] | None = None,
    lend: list[tuple[str, int, bytes, int]] | None = None,
) -> list[EncodedWrite]:
    """Encode `put_writes`' arguments, mapping special channels to their idx.

    `compress`: a value that compresses is stored so (`compress_typed`).
    With the serializer's `encryption`, each value is compressed, then sealed.
    `within`: the values of the writes' checkpoint, as this process holds
    them; a value they hold byte for byte is stored as a slice of them
    (`slices.SLICE`). Not given with encryption.
    `lend`: gets `(task_id, idx, msgpack, checksum)` of each write stored
    with its bytes (not a slice, not a special channel's, not sealed), which
    a child checkpoint's value may name (`values.LENT`).
    """
    out = []
    enc = encryption_of(serde)
    compress = compress or enc is not None
    for idx, (channel, value) in enumerate(writes):
        raw = None
        try:
            type_, blob = serde.dumps_typed(value)
            cell = None if within is None or type_ != "msgpack" else find_slice(within, blob)
            if cell is not None:
                type_, blob = SLICE, cell
            else:
                raw = blob if type_ == "msgpack" else None
                if compress:
                    type_, blob = compress_typed(type_, blob)
            if enc is not None:
                type_, blob = enc.seal_typed(type_, blob)
        except SerializationError as exc:
            # Name the channel and the node: "type X refused" alone sends the
            # user hunting through every node of the graph.
            raise write_context(exc, channel=channel, task_id=task_id, task_path=task_path) from exc
        special_idx = WRITES_IDX_MAP.get(channel)  # one lookup: special, and its idx
        special = special_idx is not None
        idx_ = idx if special_idx is None else special_idx
        sum_ = write_checksum(channel, type_, blob)
        if lend is not None and raw is not None and not special and enc is None:
            lend.append((task_id, idx_, raw, sum_))
        row = (task_id, idx_, task_path, channel, type_, blob, special, sum_)
        out.append(_new_tuple(EncodedWrite, row))
    return out


# A task that wrote one of these ends its step without a checkpoint: LangGraph
# puts none after a step with an error (the run raises) or an interrupt (the
# run stops until resumed; the writes stay pending on the step's checkpoint).
_STEP_ENDERS = frozenset({ERROR, INTERRUPT})


def step_role(
    key: tuple[str, str, str], encoded: Sequence[EncodedWrite]
) -> tuple[tuple[str, str, str] | None, tuple[str, str, str] | None]:
    """`(awaits, closes)` for a `put_writes` of `encoded` to checkpoint `key` (group commit).

    A step's writes await its put, which names `key` as its parent, to share
    its commit: `(key, None)`. A write of an error or an interrupt ends the
    step instead (`_STEP_ENDERS`): no put follows, so it awaits nothing and
    takes the writes awaiting that put into its own commit, as the put would
    have: `(None, key)`. Before, it waited a whole bound (up to
    `groupcommit.FOLLOW_MAX_S`) on every interrupted run, and so did a
    resumed task's `__resume__` write that interrupted again or failed.
    """
    for w in encoded:
        if w.special and w.channel in _STEP_ENDERS:
            return None, key
    return key, None


def run_id_of(config: RunnableConfig) -> str | None:
    """Return the run id a config carries in its metadata, if any."""
    metadata = config.get("metadata")
    flat = flat_metadata(metadata)  # a graph's ChainMap, read in C
    run_id = (metadata or {}).get("run_id") if flat is None else flat.get("run_id")
    return None if run_id is None else str(run_id)


def needs_version_check(source: str | None, token: int | None) -> bool:
    """Whether a put must name the namespace's latest checkpoint as its parent.

    Only fenced puts of a graph's own steps are checked (docs/semantics.md §3):
    sources "input" and "loop", with a token, unless a run took it by its run
    id (`run_fence.RunToken`: such a run may start from any checkpoint).
    """
    return token is not None and source in _FENCED_SOURCES and type(token) is not RunToken


def check_version(
    enc: EncodedCheckpoint, token: int | None, latest: Callable[[], str | None]
) -> None:
    """Refuse a fenced input/loop put whose parent is not the namespace's latest.

    `latest()` returns the namespace's latest checkpoint committed before
    this one; it is called only when the put is checked.

    Raises:
        CheckpointConflict: the parent is not the latest.
    """
    if not needs_version_check(enc.source, token):
        return
    latest_id = latest()
    if latest_id != enc.parent_id:
        raise CheckpointConflict(enc.thread_id, enc.checkpoint_ns, enc.parent_id, latest_id)


def stored_put(
    enc: EncodedCheckpoint,
    token: int | None,
    stored: Sequence[Any] | None,
    latest: Callable[[], str | None],
) -> bool:
    """Decide a put whose checkpoint id is already stored; return False for an identical retry.

    `stored` is the stored row's `GET_STORED_IDENTITY` columns. An identical
    retry comes first: a retried put of the (now latest) checkpoint succeeds,
    although its parent is no longer latest. Any other put of a stored id
    fails, in docs/semantics.md §3's order: the version (`check_version`),
    then the identity.

    Raises:
        CheckpointConflict: the version check, or a different checkpoint under this id.
    """
    mine = (enc.parent_id, enc.envelope, enc.values_type, enc.values_blob, enc.metadata)
    if stored is not None and _same_put(tuple(stored), mine):
        return False
    check_version(enc, token, latest)
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


def _same_put(stored: tuple[Any, ...], mine: tuple[Any, ...]) -> bool:
    # The same cells; or the same but for how the envelope was compressed (a
    # retry by another zstd build may pack the same text differently).
    if stored == mine:
        return True
    if stored[:1] + stored[2:] != mine[:1] + mine[2:]:
        return False
    try:
        return bool(envelopes.unpack(stored[1]) == envelopes.unpack(mine[1]))
    except ValueError:
        return False


# One stored checkpoint row, as `schema._CHECKPOINT_COLUMNS` orders it (the
# cells are typed `Any`: a damaged file may hold any SQL value in any of them).
Row = tuple[Any, ...]


# One write row: (task_id, channel, type, blob, task_path, idx, checksum).
WriteRow = tuple[Any, ...]


# What a decode may raise from a hostile cell that passed its checksum (a row
# forged with a valid one): each becomes an `UndecodableRow`.
_DECODE_ERRORS = (
    FencedSqliteError,
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
    RecursionError,
    OverflowError,
)


def split_tuple(rows: Sequence[Row]) -> tuple[Row, list[WriteRow]] | None:
    """Split `GET_TUPLE_*`'s rows into the checkpoint row and its writes.

    Returns:
        None if no checkpoint was found, else the checkpoint row (with the
        statement's trailing 0) and its write rows in `writes_sort_key`
        order.
    """
    if not rows:
        return None
    row = rows[0]
    if row[12] != 0:
        # SQLite runs a UNION ALL's arms in order, so this is a result with
        # no checkpoint (writes of one not stored); the search only makes
        # that order no assumption.
        found = next((r for r in rows if r[12] == 0), None)
        if found is None:
            return None
        row = found
    writes = [r[:7] for r in rows if r is not row]
    if len(writes) > 1:
        sort_writes(writes)
    return row, writes


_WRITE_ORDER = operator.itemgetter(4, 0, 5)  # task_path, task_id, idx


def sort_writes(writes: list[WriteRow]) -> None:
    """Sort write rows as `ORDER BY task_path, task_id, idx` would, in place.

    Python orders str by code point, as SQLite's BINARY collation orders
    UTF-8 bytes; cells of mixed types (damage) are ordered as SQLite orders
    them: NULL, numbers, text, blobs.
    """
    try:
        writes.sort(key=_WRITE_ORDER)
    except TypeError:
        writes.sort(key=lambda w: (_sql_rank(w[4]), _sql_rank(w[0]), _sql_rank(w[5])))


def _sql_rank(value: Any) -> tuple[int, Any]:
    if value is None:
        return (0, 0)
    if isinstance(value, (int, float)):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    return (3, bytes(value))


_NONE = type(None)


# (index in a checkpoint row, column, the SQL types it may hold as Python types)
_ROW_TYPES = (
    (3, "parent_checkpoint_id", (str, _NONE)),
    (4, "envelope", (str,)),
    (5, "values_type", (str,)),
    (6, "values_blob", (bytes,)),
    (7, "metadata", (str,)),
    (8, "position", (int,)),
    (9, "token", (int, _NONE)),
    (10, "created_at", (int, float)),
)


def check_row(row: Row) -> None:
    """Check a checkpoint row's checksum and cell types before anything is decoded.

    Raises:
        UndecodableRow: the checksum is missing or does not hold, or a cell
            holds the wrong SQL type.
    """
    check_cells(row[0], row[2], row[3], row[4:8], row[11], row)


def decode_metadata(row: Row) -> dict[str, Any]:
    """Return a checked row's metadata, which must be a JSON object.

    Raises:
        UndecodableRow: the metadata is not a JSON object.
    """
    return _metadata(row[0], row[2], row[7])


def _metadata(thread_id: Any, cid: Any, text: Any) -> dict[str, Any]:
    try:
        md = loads_json(text, "metadata")
    except FencedSqliteError as exc:
        raise UndecodableRow(thread_id, cid, str(exc)) from exc
    if not isinstance(md, dict):
        raise UndecodableRow(thread_id, cid, f"metadata is JSON {type(md).__name__}, not an object")
    return md


def decode_write(
    serde: SerializerProtocol,
    thread_id: str,
    cid: str,
    write: WriteRow,
    values: tuple[Any, Any] | None = None,
) -> Any:
    """Return the value of one write row, checking its checksum and cells first.

    `values` is its checkpoint row's `(values_type, values_blob)` as read
    (`value_reads.resolve_rows`): a write stored as a slice of them
    (`slices.SLICE`) is read from them; None: such a write is refused.

    Raises:
        UndecodableRow: the row is damaged, or its value does not decode.
    """
    task_id, channel, type_, blob, _path, idx, stored = write
    if stored is None or stored != write_checksum(channel, type_, blob):
        reason = "no checksum" if stored is None else "checksum mismatch"
        raise UndecodableRow(thread_id, cid, f"{_where(write)}: {reason}: the row was damaged")
    if type(task_id) is not str or type(channel) is not str or type(type_) is not str:
        raise UndecodableRow(thread_id, cid, f"{_where(write)}: a key cell holds the wrong type")
    if type(blob) is not bytes:
        raise UndecodableRow(thread_id, cid, f"{_where(write)}: blob holds {type(blob).__name__}")
    try:
        if type_ == SLICE:
            if values is None:
                raise ValueError("a slice of its checkpoint's values, which were not read")
            data = open_slice(values[0], values[1], blob)
            if values[0] == RESOLVED:
                return serde.loads_opened(data)  # type: ignore[attr-defined]
            return serde.loads_typed(("msgpack", data))
        return serde.loads_typed((type_, blob))
    except _DECODE_ERRORS as exc:
        raise UndecodableRow(thread_id, cid, f"{_where(write)}: {exc}") from exc


def _where(write: WriteRow) -> str:
    # Built only for an error: every read of a write row would pay its reprs.
    return f"write {write[0]!r:.60}/{write[5]!r:.20} ({write[1]!r:.60})"


def decode_tuple(
    serde: SerializerProtocol, row: Row, writes: Sequence[WriteRow]
) -> CheckpointTuple:
    """Rebuild a `CheckpointTuple`; a row that does not decode is `UndecodableRow`."""
    check_row(row)
    return decode_checked(serde, row[0], row[1], row[2], row[3], row[4:8], writes)


def decode_checked(
    serde: SerializerProtocol,
    thread_id: str,
    ns: str,
    cid: str,
    parent_id: str | None,
    stored: Sequence[Any],
    writes: Sequence[WriteRow],
) -> CheckpointTuple:
    """Rebuild a `CheckpointTuple` from cells `check_cells` passed.

    `stored` is `(envelope, values_type, values_blob, metadata)`. A row whose
    values are in the value table reaches here resolved (`value_reads.resolve_rows`)
    unless its value rows are missing or damaged.

    Raises:
        UndecodableRow: a cell, or a write, does not decode.
    """
    envelope, values_type, values_blob, metadata = stored
    try:
        env = loads_json(envelopes.unpack(envelope), "checkpoint envelope")
        if not isinstance(env, dict):
            raise UndecodableRow(
                thread_id, cid, f"envelope is JSON {type(env).__name__}, not an object"
            )
        fmt = env.pop("format", None)
        if fmt != ENVELOPE_FORMAT:
            raise UndecodableRow(thread_id, cid, f"unknown checkpoint envelope format {fmt!r}")
        if env.get("id") != cid:
            # Checksums cover one row's cells, not which row they sit in.
            raise UndecodableRow(thread_id, cid, "the envelope is another checkpoint's")
        if values_type == REFS:
            raise UndecodableRow(
                thread_id, cid, "its channel values' rows are missing or damaged (lgfs doctor)"
            )
        if values_type == REFS_ERROR and type(values_blob) is bytes:
            raise UndecodableRow(thread_id, cid, values_blob.decode())
        if values_type == RESOLVED:
            # Rebuilt here from sealed value rows this process opened.
            values = serde.loads_opened(values_blob)  # type: ignore[attr-defined]
        else:
            values = serde.loads_typed((values_type, values_blob))
        if not isinstance(values, dict):
            raise UndecodableRow(
                thread_id, cid, f"channel_values is {type(values).__name__}, not a dict"
            )
        env["channel_values"] = values
    except UndecodableRow:
        raise
    except _DECODE_ERRORS as exc:
        raise UndecodableRow(thread_id, cid, str(exc)) from exc
    pending: list[tuple[str, str, Any]] = []
    if writes:
        opened = (values_type, values_blob)
        pending = [(w[0], w[1], decode_write(serde, thread_id, cid, w, opened)) for w in writes]
    md = _metadata(thread_id, cid, metadata)
    return checkpoint_tuple(thread_id, ns, cid, parent_id, env, md, pending)


def checkpoint_tuple(
    thread_id: str,
    ns: str,
    cid: str,
    parent_id: str | None,
    checkpoint: Any,
    metadata: Any,
    pending: list[tuple[str, str, Any]],
) -> CheckpointTuple:
    """Return the `CheckpointTuple` of decoded parts, with its config and its parent's."""
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
    # `tuple.__new__` is what the named tuple's own (Python) `__new__` calls.
    result: CheckpointTuple = _new_tuple(
        CheckpointTuple, (config, checkpoint, metadata, parent, pending)
    )
    return result


# A retention skeleton row: ns, id, parent, position, source, run_id,
# created_at, step, delta counters and channel_versions (decoded objects).
SkeletonRow = tuple[str, str, str | None, int, str | None, str | None, float, int | None, Any, Any]


def check_cells(
    thread_id: Any, cid: Any, parent_id: Any, cells: Sequence[Any], stored: Any, row: Row | None
) -> None:
    """`check_row` of a row's cells: `cells` is `(envelope, values_type, values_blob, metadata)`.

    `row` is the whole row (`_CHECKPOINT_COLUMNS`) when its position, token
    and created_at are to be checked too; None when the statement that read
    the cells checked their types already (`schema._TYPES_OK`).

    Raises:
        UndecodableRow: as `check_row`.
    """
    envelope, values_type, values_blob, metadata = cells
    if stored is None:
        raise UndecodableRow(
            thread_id, cid, "the row has no checksum (written outside this library?)"
        )
    if stored is not REBUILT and stored != checkpoint_checksum(
        envelope, values_type, values_blob, metadata
    ):
        raise UndecodableRow(
            thread_id, cid, "checksum mismatch: the row was damaged or changed outside this library"
        )
    # A blob holding the envelope's bytes has the text's checksum: types count too.
    # One test for the common row (every row of every read comes here), the
    # loop below only to name the cell of a row that fails it.
    if (
        type(envelope) is str
        and type(values_type) is str
        and type(values_blob) is bytes
        and type(metadata) is str
        and (parent_id is None or type(parent_id) is str)
        and (
            row is None
            or (
                type(row[8]) is int
                and (row[9] is None or type(row[9]) is int)
                and type(row[10]) in (int, float)
            )
        )
    ):
        return
    given = (None, None, None, parent_id, *cells)
    for i, column, types in _ROW_TYPES if row is not None else _ROW_TYPES[:5]:
        value = row[i] if row is not None else given[i]
        if type(value) not in types:
            raise UndecodableRow(thread_id, cid, f"{column} holds {type(value).__name__}")
