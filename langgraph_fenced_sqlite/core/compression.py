"""zstd for stored values: compress when it pays, decompress within a stated size.

Invariant: compressed bytes are what a row stores and what its checksum
covers (checksums.py), so damage is caught before anything is decompressed;
decompression never produces more than the size the row (or the frame)
states, and a frame that does not end there is refused.
"""

from __future__ import annotations

import threading

try:  # pragma: no cover - Python 3.14 ships it
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - before 3.14: PEP 784's backport
    from backports import zstd

import zstandard

__all__ = [
    "COMPRESS_MIN",
    "ZSTD",
    "ZSTD_MSGPACK",
    "RecordCodec",
    "compress",
    "compress_typed",
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


# Kept zstd contexts, one per thread (`_contexts`): made per call, as the
# one-shot functions of `backports.zstd` do, a context costs more than the
# work on a value of a few KB (measured on a 4 KB value: compressing 22.8 us
# per call, 17.6 us on a kept context; inflating 10.9 us and 6.3 us; on a
# 1.2 KB message 6.5 and 1.8 us, 5.0 and 0.8 us). The frames are the same
# bytes either way: standard zstd, level 3, stating their size.
_LOCAL = threading.local()


def _contexts() -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
    kept: tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor] | None = getattr(
        _LOCAL, "kept", None
    )
    if kept is None:
        kept = _LOCAL.kept = (
            zstandard.ZstdCompressor(level=_LEVEL, write_content_size=True),
            zstandard.ZstdDecompressor(),
        )
    return kept


def compress(data: bytes) -> tuple[str, bytes]:
    """Return `(codec, stored)`: `("zstd", frame)` if that is smaller, else `("", data)`."""
    if len(data) >= COMPRESS_MIN:
        packed: bytes = _contexts()[0].compress(data)
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
        # Ours always state their size: so decompression is bounded by it.
        raise ValueError(f"the zstd frame states {stated!r} bytes, not {size}")
    try:
        whole = zstd.get_frame_size(data) == len(data)
    except zstd.ZstdError as exc:
        raise ValueError(f"not a zstd frame: {exc}") from exc
    if not whole:
        raise ValueError("bytes follow the zstd frame")
    try:
        out: bytes = _contexts()[1].decompress(data)
    except zstandard.ZstdError as exc:
        raise ValueError(f"corrupt zstd frame: {exc}") from None
    if len(out) != size:
        raise ValueError("the zstd frame is not of its stated size")
    return out


class RecordCodec:
    """zstd for short records of one shape, each a frame compressed against `sample`.

    On its own a record of a few hundred bytes finds little to refer back
    to; against a sample of its shape (a raw-content dictionary) it finds
    most of itself. Contexts are kept per thread and reused: made per call
    (as `backports.zstd`'s functions do, with no way to reuse a finished
    decompressor) they cost five times the work on such a record, which
    every read of a checkpoint decodes. `zstandard` (python-zstandard, which
    LangGraph's `langsmith` already requires) keeps them; its frames are
    standard zstd.

    Invariant: `inflate` returns exactly what `compress` was given, refuses
    anything but one whole frame that states its size, and never allocates
    more than `limit`.
    """

    def __init__(self, sample: bytes, limit: int) -> None:
        """Compress against `sample` (never to change for stored frames); inflate up to `limit`."""
        self._dict = zstandard.ZstdCompressionDict(sample, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
        self._limit = limit
        self._local = threading.local()
        # Tables sized for a record of about a KB against the sample, not
        # for any input (`_LEVEL`'s defaults): KBs per thread, not MBs.
        self._params = zstandard.ZstdCompressionParameters.from_level(
            _LEVEL, source_size=1024, dict_size=len(sample), write_content_size=1
        )

    def compress(self, data: bytes) -> bytes:
        """Return `data` as one frame that states its size."""
        local = self._local
        compressor = getattr(local, "compressor", None)
        if compressor is None:
            compressor = local.compressor = zstandard.ZstdCompressor(
                dict_data=self._dict, compression_params=self._params
            )
        frame: bytes = compressor.compress(data)
        return frame

    def inflate(self, frame: bytes) -> bytes:
        """Return what `frame` holds.

        Raises:
            ValueError: not one whole frame, not of its stated size, or stating more than `limit`.
        """
        try:
            size = zstandard.frame_content_size(frame)
            whole = zstd.get_frame_size(frame) == len(frame)
        except (zstandard.ZstdError, zstd.ZstdError) as exc:
            raise ValueError(f"not a zstd frame: {exc}") from None
        if not 0 <= size <= self._limit:
            raise ValueError(f"zstd frame of unstated or too large size {size!r}")
        if not whole:
            raise ValueError("bytes follow the zstd frame")
        local = self._local
        decompressor = getattr(local, "decompressor", None)
        if decompressor is None:
            decompressor = local.decompressor = zstandard.ZstdDecompressor(dict_data=self._dict)
        try:
            out: bytes = decompressor.decompress(frame)
        except zstandard.ZstdError as exc:
            raise ValueError(f"corrupt zstd frame: {exc}") from None
        if len(out) != size:
            raise ValueError("the zstd frame is not of its stated size")
        return out
