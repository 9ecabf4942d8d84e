"""A pending write its own checkpoint's values hold, stored as a slice of them (semantics §7).

LangGraph's input step writes what its input checkpoint holds: the
`__start__` task's writes are the input, and the input checkpoint's
`__start__` channel holds it, byte for byte. In a chat that is every human
message a second time. Such a write is stored as a slice of its
checkpoint's channel values (type `SLICE`; its cell: the offset, length and
CRC-32 of its bytes within the msgpack map of the values that
`value_reads.resolve_rows` rebuilds), not as a second copy.

Why it is safe to share: a checkpoint's values never change once stored (a
different put of the same id is `CheckpointConflict`; `rekey` reseals a row,
its bytes the same), and every removal takes a checkpoint's writes with it
or before it, never after, so a slice never outlives the bytes it names. A
reader checks the CRC-32 before decoding, so a slice whose checkpoint holds
other bytes (a row changed outside this library) is `UndecodableRow`, never
another value. Only stores without encryption write slices; any reader reads
them.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

from .checksums import _crc32
from .value_reads import packed_parts
from .values import RESOLVED, Held

__all__ = ["SLICE", "find_slice", "open_slice"]

# The type cell of a write stored as a slice of its checkpoint's values.
SLICE = "lgfs-slice"
# Shorter writes are stored as they are: a slice saves little and costs a search.
_MIN_BYTES = 128
# Longer values are not searched (a long history's list): a write is rarely
# inside one, and the search would cost every step.
_MAX_SEARCH = 256 * 1024
_CELL = struct.Struct(">III")  # offset, length, CRC-32


def find_slice(held: Mapping[str, Held], data: bytes) -> bytes | None:
    """Return the `SLICE` cell naming `data` within `held`'s packed values; None: not there.

    `held` is a stored checkpoint's values as this process holds them
    (`values.ValueCache`); `data` a write's msgpack bytes.
    """
    if len(data) < _MIN_BYTES:
        return None
    try:
        parts = packed_parts(held)
    except ValueError:
        return None
    at = 0
    before = b""
    for part in parts:
        if len(before) <= 5 and data.startswith(before) and part.startswith(data[len(before) :]):
            # A list's array header is a part of its own: a write that is a
            # channel's whole list starts there, header and all.
            return _cell(at - len(before), data)
        if len(data) <= len(part) <= _MAX_SEARCH:
            found = part.find(data)
            if found >= 0:
                return _cell(at + found, data)
        at += len(part)
        before = part
    return None


def _cell(offset: int, data: bytes) -> bytes:
    return _CELL.pack(offset, len(data), _crc32(data))


def open_slice(values_type: Any, values: Any, cell: Any) -> bytes:
    """Return the bytes a `SLICE` cell names within its checkpoint's resolved values.

    `values_type` and `values` are the checkpoint row's cells after
    `value_reads.resolve_rows`: a msgpack map (`"msgpack"`, or `RESOLVED` when
    opened here from sealed rows).

    Raises:
        ValueError: the values are not a resolved map, or do not hold the
            bytes the cell names (reason in the message).
    """
    if values_type not in ("msgpack", RESOLVED) or type(values) is not bytes:
        raise ValueError("a slice of its checkpoint's values, which are not readable")
    if type(cell) is not bytes or len(cell) != _CELL.size:
        raise ValueError("a slice cell of the wrong size")
    offset, size, crc = _CELL.unpack(cell)
    data = values[offset : offset + size]
    if len(data) != size or _crc32(data) != crc:
        raise ValueError("a slice of bytes its checkpoint's values do not hold")
    return data
