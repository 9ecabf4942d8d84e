"""The checksum stored beside every value (docs/semantics.md §7).

Invariant: a row's checksum is computed from exactly the cells it covers, in
one fixed order, by this one function, on write (in Python) and in
migrations (as the SQL function the engine registers); a read recomputes it
and refuses the row on any difference, so damage is never decoded.

What each row's checksum covers (and nothing else):

- checkpoints: `(envelope, values_type, values_blob, metadata)`
- writes: `(channel, type, blob)`
- events: `(kind, data)`
- value rows (`values.Blob`): `(channel, key, base, type, count, ordinal, codec, size, data)`,
  `data` as stored (compressed or not); the checkpoint's checksum covers
  their keys, and a key the CRC of the value rebuilt from them (values.py)
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from typing import Any

__all__ = [
    "REBUILT",
    "blob_checksum",
    "checkpoint_checksum",
    "checkpoint_checksum_of_bytes",
    "checksum",
    "event_checksum",
    "write_checksum",
]


class _Rebuilt:
    """The type of `REBUILT` (one instance)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "REBUILT"


# The checksum cell of a row that `value_reads.resolve_rows` rebuilt from rows it
# checked (the checkpoint's own checksum over its value keys, each value
# row's checksum, each value's bytes against its key): its readers take it
# as holding, instead of hashing the rebuilt values a second and a third
# time. No cell read from a store can be this object.
REBUILT = _Rebuilt()

_NULL = b"\xff\xff\xff\xff"
# Prefixes a number. A damaged cell may hold one where text or a blob belongs;
# `bytes(n)` would allocate n zero bytes (a huge n exhausts memory), and no
# length prefix (< 2**32 - 2) can equal this marker or `_NULL`.
_NUMBER = b"\xfe\xff\xff\xff"
_LENGTH = struct.Struct("<I").pack
# The prefixes of short cells, made once: a `pack` call costs as much as
# hashing a few hundred bytes, and most cells (types, channels, ids, metadata,
# small envelopes) are short. About 40 KB.
_SHORT = 1024
_PREFIXES = tuple(_LENGTH(n) for n in range(_SHORT))

# CRC-32 (zlib's polynomial and value, so every stored checksum reads the
# same) from ISA-L where it is installed: it folds 16 bytes a step with
# carry-less multiplies where zlib 1.2/1.3 looks up tables byte by byte,
# about 7x fewer instructions on a checkpoint's few KB. Every read hashes
# every value it returns, and with zlib's crc32 that was a ninth of a
# `list` page's CPU. Same function, same bytes: only its speed differs
# (tests/core/test_checksums.py pins the values against zlib's).
try:
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - isal has no wheel for this platform
    _crc32 = zlib.crc32


def checksum(*parts: Any) -> int:
    """Return the CRC-32 of `parts`, each length-prefixed, as stored beside a value.

    Length prefixes make the split between parts count: moving bytes from one
    cell to its neighbour changes the checksum. `None` and empty differ too.
    Every stored value's row carries this (docs/semantics.md §7); a read recomputes it,
    so a flipped bit, appended bytes or a cut cell is caught, never decoded.

    Args:
        *parts: Cell values as SQLite hands them over: `str`, `bytes`,
            `None`, or (from a damaged cell) `int` / `float`.

    Returns:
        An unsigned 32-bit integer.
    """
    # Every read runs this once per row (and every write once per row): the
    # parts are joined and hashed in one crc32 call, which gives exactly the
    # value of hashing them one after another (CRC-32 is a running sum) at
    # a fraction of the calls. Exact types first: they are the common case.
    chunks: list[bytes] = []
    add = chunks.append
    for part in parts:
        kind = type(part)
        if kind is bytes:
            data = part
        elif kind is str:
            try:
                data = part.encode()
            except UnicodeEncodeError:
                # Lone surrogates: from a damaged TEXT cell read leniently.
                data = part.encode("utf-8", "surrogatepass")
        elif part is None:
            add(_NULL)
            continue
        else:
            data = _other(part, add)
        add(_LENGTH(len(data)))
        add(data)
    return _crc32(b"".join(chunks))


def _other(part: object, add: Callable[[bytes], None]) -> bytes:
    """Return the bytes hashed for a part that is not exactly `str`, `bytes` or None."""
    if isinstance(part, str):
        try:
            return part.encode()
        except UnicodeEncodeError:
            return part.encode("utf-8", "surrogatepass")
    if isinstance(part, (bytes, bytearray, memoryview)):
        return bytes(part)
    add(_NUMBER)
    return repr(part).encode("ascii", "backslashreplace")


def checkpoint_checksum(envelope: Any, values_type: Any, values_blob: Any, metadata: Any) -> int:
    """Return `checksum(envelope, values_type, values_blob, metadata)`, a checkpoint row's.

    The same value, computed without `checksum`'s loop for the cells every
    stored row holds (text, text, blob, text): every read of every
    checkpoint runs this.
    """
    if (
        type(envelope) is str
        and type(values_type) is str
        and type(values_blob) is bytes
        and type(metadata) is str
    ):
        try:
            env, kind, meta = envelope.encode(), values_type.encode(), metadata.encode()
        except UnicodeEncodeError:
            return checksum(envelope, values_type, values_blob, metadata)
        return checkpoint_checksum_of_bytes(env, kind, values_blob, meta)
    return checksum(envelope, values_type, values_blob, metadata)


def checkpoint_checksum_of_bytes(
    envelope: bytes, values_type: bytes, values_blob: bytes, metadata: bytes
) -> int:
    """Return `checkpoint_checksum` of a row whose text cells are given as their UTF-8 bytes.

    For a reader that holds those bytes already (`list` reads them so), all
    four cells exactly `bytes`.
    """
    n_env, n_kind, n_blob, n_meta = len(envelope), len(values_type), len(values_blob), len(metadata)
    return _crc32(
        b"".join(
            (
                _PREFIXES[n_env] if n_env < _SHORT else _LENGTH(n_env),
                envelope,
                _PREFIXES[n_kind] if n_kind < _SHORT else _LENGTH(n_kind),
                values_type,
                _PREFIXES[n_blob] if n_blob < _SHORT else _LENGTH(n_blob),
                values_blob,
                _PREFIXES[n_meta] if n_meta < _SHORT else _LENGTH(n_meta),
                metadata,
            )
        )
    )


def write_checksum(channel: Any, type_: Any, blob: Any) -> int:
    """Return `checksum(channel, type_, blob)`, a write row's, as `checkpoint_checksum` does."""
    if type(channel) is str and type(type_) is str and type(blob) is bytes:
        try:
            chan, kind = channel.encode(), type_.encode()
        except UnicodeEncodeError:
            return checksum(channel, type_, blob)
        n_chan, n_kind, n_blob = len(chan), len(kind), len(blob)
        return _crc32(
            b"".join(
                (
                    _PREFIXES[n_chan] if n_chan < _SHORT else _LENGTH(n_chan),
                    chan,
                    _PREFIXES[n_kind] if n_kind < _SHORT else _LENGTH(n_kind),
                    kind,
                    _PREFIXES[n_blob] if n_blob < _SHORT else _LENGTH(n_blob),
                    blob,
                )
            )
        )
    return checksum(channel, type_, blob)


def event_checksum(kind: Any, data: Any) -> int:
    """Return `checksum(kind, data)`, an event row's, as `checkpoint_checksum` does."""
    if type(kind) is str and type(data) is str:
        try:
            k, d = kind.encode(), data.encode()
        except UnicodeEncodeError:
            return checksum(kind, data)
        n_k, n_d = len(k), len(d)
        return _crc32(
            b"".join(
                (
                    _PREFIXES[n_k] if n_k < _SHORT else _LENGTH(n_k),
                    k,
                    _PREFIXES[n_d] if n_d < _SHORT else _LENGTH(n_d),
                    d,
                )
            )
        )
    return checksum(kind, data)


def blob_checksum(
    channel: Any,
    key: Any,
    base: Any,
    type_: Any,
    count: Any,
    ordinal: Any,
    codec: Any,
    size: Any,
    data: Any,
) -> int:
    """Return the checksum of a value row's cells (`values.Blob`), `data` as stored."""
    return checksum(channel, key, base, type_, count, ordinal, codec, size, data)
