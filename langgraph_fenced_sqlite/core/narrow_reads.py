"""The narrow reads of `get_tuple` and `list`: fewer cells, a page decoded at once.

Invariant: what these return, or raise, is what `checkpoints.decode_tuple`
returns or raises for the same stored row (docs/semantics.md §7). Every
value's checksum is checked before anything in it is decoded, and a row
the fast path does not take (not what this library writes, or refused by
one of its checks) goes through `checkpoints`' own checks on the same
cells: the fast path only ever accepts what they accept. The rows come
from `schema.read_tuple` and `schema.read_page`, which read only the cells
returned or checked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ormsgpack
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol

from .checkpoints import (
    ENVELOPE_FORMAT,
    Row,
    WriteRow,
    check_cells,
    checkpoint_tuple,
    decode_checked,
    decode_write,
    sort_writes,
)
from .checksums import REBUILT, checkpoint_checksum_of_bytes, write_checksum
from .envelopes import unpack_bytes
from .serde import READ_OPTION, DataOnlySerializer, forget_read_errors
from .slices import SLICE
from .stored_json import loads_canonical
from .values import RESOLVED

__all__ = ["decode_page", "decode_read", "split_read"]


def split_read(rows: Sequence[Row]) -> tuple[Row, list[WriteRow]] | None:
    """Split `schema.read_tuple`'s rows into the checkpoint row and its writes.

    Returns:
        None if no checkpoint was found, else the checkpoint row
        (`schema._READ_COLUMNS`, then its types flag) and its write rows in
        `writes_sort_key` order.
    """
    if not rows:
        return None
    row = rows[0]
    if row[7] == 1:
        # A write row first: SQLite runs a UNION ALL's arms in order, so this
        # is a result with no checkpoint (writes of one not stored); the
        # search only makes that order no assumption.
        found = next((r for r in rows if r[7] != 1), None)
        if found is None:
            return None
        row = found
    if len(rows) == 1:
        return row, []
    writes = [r[:7] for r in rows if r is not row]
    if len(writes) > 1:
        sort_writes(writes)
    return row, writes


def decode_read(
    serde: SerializerProtocol,
    thread_id: str,
    ns: str,
    row: Row,
    writes: Sequence[WriteRow],
    at: int = 0,
) -> CheckpointTuple:
    """Rebuild a `CheckpointTuple` from a narrow read's row, checked as `check_row` checks.

    The row holds `schema._READ_COLUMNS` from index `at`: 0 for
    `split_read`'s row and for `split_read_page`'s of a query that named the
    thread and namespace, 2 for its others (after their thread and
    namespace). Its types flag must be 0 (the caller reads a flagged
    row again in full, through `decode_tuple`, which names the cell).

    Raises:
        UndecodableRow: as `decode_tuple`.
    """
    cid, parent_id = row[at], row[at + 1]
    cells = row[at + 2 : at + 6]
    check_cells(thread_id, cid, parent_id, cells, row[at + 6], None)
    return decode_checked(serde, thread_id, ns, cid, parent_id, cells, writes)


def decode_page(
    serde: SerializerProtocol,
    thread_id: Any,
    ns: Any,
    rows: Sequence[Row],
    at: int,
    read_in_full: Callable[[str, str, str], CheckpointTuple],
) -> list[CheckpointTuple]:
    """Rebuild the checkpoints of `schema.read_page`'s rows, checked as `decode_tuple` checks.

    `at` is 0 when the query named the thread and the namespace (`thread_id`
    and `ns`; rows start with the checkpoint id), 2 when rows start with
    their own. A checkpoint row whose types flag is not 0 is passed to
    `read_in_full(thread_id, ns, checkpoint_id)`, which reads it again and
    names the cell. Pending writes come in `writes_sort_key` order.

    A row takes one path when it is what this library writes (its checksum
    holds over the bytes read, its JSON is orjson's canonical text, its
    values a dict, each write's cells typed and sealed): `decode_read`'s
    checks, in one loop for the page, with no str decoded and encoded back
    and no call per cell. Any other row, and a row that one of those checks
    refuses, goes through `decode_read`'s (and `decode_write`'s) own checks
    on the same cells, which return its value or raise its error as they
    always did: this path only ever accepts what they accept.

    Raises:
        UndecodableRow: as `decode_tuple`.
    """
    # The last cell: 1 for a write row; 0 or 2 (`_PAGE_TYPES_OK`) for a checkpoint's.
    flag = at + 8
    checkpoints: list[Row] = []
    # A checkpoint's writes by its key: its id alone when the query named the
    # thread and namespace (one str to hash, not a tuple of three).
    writes: dict[Any, list[WriteRow]] = {}
    for r in rows:
        if r[flag] != 1:
            checkpoints.append(r)
            continue
        key = r[:3] if at else r[0]
        found = writes.get(key)
        if found is None:
            writes[key] = [r[at + 1 : at + 8]]
        else:
            found.append(r[at + 1 : at + 8])
    page: list[CheckpointTuple] = []
    add = page.append
    loads = serde.loads_typed
    # The default serializer's msgpack is read with no method frame per value
    # (`DataOnlySerializer.plain_msgpack_hook`: a third of a small value's
    # cost); a serializer of the user's is called as it is.
    hook = None
    if isinstance(serde, DataOnlySerializer) and (
        type(serde).loads_typed is DataOnlySerializer.loads_typed
    ):
        hook = serde.plain_msgpack_hook()
    # A cell stored in clear takes the hook only where it may be read at
    # all; with encryption on, `loads_typed` opens or refuses it. Values
    # rebuilt here from sealed value rows (`RESOLVED`) take it always.
    clear = hook is not None and serde.reads_plaintext  # type: ignore[attr-defined]
    for r in checkpoints:
        if at:
            thread_id, ns = r[0], r[1]
            found = writes.get(r[:3])
            r = r[2:]
        else:
            found = writes.get(r[0])
        cid, parent_id, envelope, values_type, values_blob, metadata, stored, _, types_ok = r
        if types_ok != 0:
            add(read_in_full(thread_id, ns, cid))
            continue
        if found is None:
            found = []
        elif len(found) > 1:
            sort_writes(found)
        # `_PAGE_TYPES_OK` found the envelope and the metadata TEXT, read as their bytes.
        plain = (clear and values_type == "msgpack") or (
            hook is not None and values_type == RESOLVED
        )
        if (
            stored is not None
            and type(values_type) is str
            and type(values_blob) is bytes
            and (parent_id is None or type(parent_id) is str)
            and (plain or values_type.isascii())
            and (
                stored is REBUILT
                or stored
                == checkpoint_checksum_of_bytes(
                    envelope,
                    _MSGPACK if plain and values_type == "msgpack" else values_type.encode(),
                    values_blob,
                    metadata,
                )
            )
        ):
            try:
                env = loads_canonical(unpack_bytes(envelope))
            except ValueError:
                env = None  # `decode_checked` names what is wrong with it
            if (
                type(env) is dict
                and env.pop("format", None) == ENVELOPE_FORMAT
                and env.get("id") == cid
            ):
                # A value that does not decode: `decode_checked` raises its error.
                try:
                    if plain:
                        values = _unpackb(values_blob, ext_hook=hook, option=READ_OPTION)
                    else:
                        values = loads((values_type, values_blob))
                except Exception:
                    forget_read_errors()
                    values = None
                except BaseException:
                    forget_read_errors()
                    raise
                md = loads_canonical(metadata) if type(values) is dict else None
                if type(md) is dict:
                    env["channel_values"] = values
                    pending: list[tuple[str, str, Any]] = []
                    opened = (values_type, values_blob)
                    for w in found:
                        task_id, channel, type_, blob, _, _, sealed = w
                        if (
                            type_ != SLICE  # `decode_write` reads a slice, once
                            and type(task_id) is str
                            and type(channel) is str
                            and type(type_) is str
                            and type(blob) is bytes
                            and sealed is not None
                            and sealed == write_checksum(channel, type_, blob)
                        ):
                            try:
                                if clear and type_ == "msgpack":
                                    value = _unpackb(blob, ext_hook=hook, option=READ_OPTION)
                                else:
                                    value = loads((type_, blob))
                            except Exception:
                                forget_read_errors()
                                value = decode_write(serde, thread_id, cid, w, opened)
                            except BaseException:
                                forget_read_errors()
                                raise
                        else:
                            value = decode_write(serde, thread_id, cid, w, opened)
                        pending.append((task_id, channel, value))
                    add(checkpoint_tuple(thread_id, ns, cid, parent_id, env, md, pending))
                    continue
        # Refused above, or not what this library writes: `decode_read`'s
        # checks decide, on the cells as the sqlite3 module reads TEXT
        # (`lenient_text` of the same bytes).
        cells = (envelope.decode(*_LENIENT), values_type, values_blob, metadata.decode(*_LENIENT))
        check_cells(thread_id, cid, parent_id, cells, stored, None)
        add(decode_checked(serde, thread_id, ns, cid, parent_id, cells, found))
    return page


_MSGPACK = b"msgpack"  # the values type the default serializer writes, as UTF-8
_unpackb = ormsgpack.unpackb
# What `connection.lenient_text` decodes TEXT cells with.
_LENIENT = ("utf-8", "surrogateescape")
