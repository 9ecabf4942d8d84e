"""zstd for stored values: compress when it pays, decompress within a stated size.

Invariant: compressed bytes are what a row stores and what its checksum
covers (checksums.py), so damage is caught before anything is decompressed;
decompression never produces more than the size the row (or the frame)
states, and a frame that does not end there is refused.
"""

from __future__ import annotations

import threading
from typing import Any

try:  # pragma: no cover - Python 3.14 ships it
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - before 3.14: PEP 784's backport
    from backports import zstd

__all__ = [
    "COMPRESS_MIN",
    "ZSTD",
    "ZSTD_MSGPACK",
    "compress",
    "compress_typed",
    "compress_with",
    "dictionary",
    "inflate",
]

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


def dictionary(content: bytes) -> Any:
    """A raw-content zstd dictionary: `content` is history every frame may refer to.

    For short records of one shape (a few hundred bytes, where a frame of
    their own finds little to refer to), `content` is a sample of that shape.
    """
    return zstd.ZstdDict(content, is_raw=True)


def compress_with(data: bytes, zdict: Any) -> bytes:
    """Return `data` as one zstd frame (its size stated) compressed against `zdict`."""
    # A compressor per thread and dictionary, kept: making one (and loading
    # its dictionary) took twice as long as compressing an envelope.
    kept: dict[int, Any] | None = getattr(_LOCAL, "compressors", None)
    if kept is None:
        kept = _LOCAL.compressors = {}
    compressor = kept.get(id(zdict))
    if compressor is None:
        compressor = kept[id(zdict)] = zstd.ZstdCompressor(level=_LEVEL, zstd_dict=zdict)
    frame: bytes = compressor.compress(data, mode=zstd.ZstdCompressor.FLUSH_FRAME)
    return frame


_LOCAL = threading.local()


def compress_typed(type_: str, data: bytes) -> tuple[str, bytes]:
    """Return a serializer's `(tag, bytes)` compressed as `ZSTD_MSGPACK` when that pays."""
    if type_ != "msgpack":
        return type_, data
    codec, stored = compress(data)
    return (ZSTD_MSGPACK, stored) if codec else (type_, data)


def inflate(
    data: bytes, size: int | None = None, *, zdict: Any = None, limit: int = MAX_SIZE
) -> bytes:
    """Decompress one zstd frame of `size` bytes (None: the size its header states).

    `zdict` is the dictionary it was compressed with (`dictionary`), if any;
    `limit` the most it may state.

    Raises:
        ValueError: not one whole frame, or not of the stated size.
    """
    if size is None:
        try:
            size = zstd.get_frame_info(data).decompressed_size
        except zstd.ZstdError as exc:
            raise ValueError(f"not a zstd frame: {exc}") from exc
    if type(data) is not bytes or size is None or not 0 <= size <= limit:
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
        out = zstd.decompress(data) if zdict is None else zstd.decompress(data, zstd_dict=zdict)
    except zstd.ZstdError as exc:
        raise ValueError(f"corrupt zstd frame: {exc}") from exc
    if len(out) != size:
        raise ValueError("the zstd frame is not of its stated size")
    return out
