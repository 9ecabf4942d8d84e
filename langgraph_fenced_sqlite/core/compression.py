"""zstd for stored values: compress when it pays, decompress within a stated size.

Invariant: compressed bytes are what a row stores and what its checksum
covers (checksums.py), so damage is caught before anything is decompressed;
decompression never produces more than the size the row (or the frame)
states, and a frame that does not end there is refused.
"""

from __future__ import annotations

try:  # pragma: no cover - Python 3.14 ships it
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - before 3.14: PEP 784's backport
    from backports import zstd

__all__ = ["COMPRESS_MIN", "ZSTD", "ZSTD_MSGPACK", "compress", "compress_typed", "inflate"]

# Values at least this long are compressed (when that makes them smaller):
# below it, a zstd frame costs more than it saves.
COMPRESS_MIN = 128
# The codec of a value row (`values.Blob.codec`).
ZSTD = "zstd"
# The serializer tag of a compressed msgpack value (a pending write's `type`).
ZSTD_MSGPACK = "zstd+msgpack"
_LEVEL = 3
# The most a stored value may decompress to.
MAX_SIZE = 2**31 - 1


def compress(data: bytes) -> tuple[str, bytes]:
    """Return `(codec, stored)`: `("zstd", frame)` if that is smaller, else `("", data)`."""
    if len(data) >= COMPRESS_MIN:
        packed = zstd.compress(data, _LEVEL)
        if len(packed) < len(data):
            return ZSTD, packed
    return "", data


def compress_typed(type_: str, data: bytes) -> tuple[str, bytes]:
    """Return a serializer's `(tag, bytes)` compressed as `ZSTD_MSGPACK` when that pays."""
    if type_ != "msgpack":
        return type_, data
    codec, stored = compress(data)
    return (ZSTD_MSGPACK, stored) if codec else (type_, data)


def inflate(data: bytes, size: int | None = None) -> bytes:
    """Decompress one zstd frame of `size` bytes (None: the size its header states).

    Raises:
        ValueError: not one whole frame, or not of the stated size.
    """
    if size is None:
        try:
            size = zstd.get_frame_info(data).decompressed_size
        except zstd.ZstdError as exc:
            raise ValueError(f"not a zstd frame: {exc}") from exc
    if type(data) is not bytes or size is None or not 0 <= size <= MAX_SIZE:
        raise ValueError(f"zstd frame of unstated or too large size {size!r}")
    try:
        stated = zstd.get_frame_info(data).decompressed_size
    except zstd.ZstdError as exc:
        raise ValueError(f"not a zstd frame: {exc}") from exc
    if stated != size:
        # Ours always state their size: so one-shot decompression (no
        # decompressor object per value) is bounded by it.
        raise ValueError(f"the zstd frame states {stated!r} bytes, not {size}")
    try:
        out = zstd.decompress(data)
    except zstd.ZstdError as exc:
        raise ValueError(f"corrupt zstd frame: {exc}") from exc
    if len(out) != size:
        raise ValueError("the zstd frame is not of its stated size")
    return out
