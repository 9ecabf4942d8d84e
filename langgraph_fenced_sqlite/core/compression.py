"""zstd for stored values: compress when it pays, decompress within a stated size.

Invariant: compressed bytes are what a row stores and what its checksum
covers (checksums.py), so damage is caught before anything is decompressed;
decompression never produces more than the size the row (or the frame)
states, and a frame that does not end there is refused.
"""

from __future__ import annotations

import threading
from importlib import resources

try:  # pragma: no cover - Python 3.14 ships it
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - before 3.14: PEP 784's backport
    from backports import zstd

import zstandard

__all__ = [
    "COMPRESS_MIN",
    "DICTIONARY_ID",
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
# Values up to this long are also compressed against the dictionary
# (`values.zdict`, trained by scripts/make_dictionary.py on packed LangChain
# messages and prose), and the shorter frame kept: a frame of a KB or two then
# finds its framing and its entropy tables there instead of paying for them
# (a chat message of 1.2 KB: 703 bytes instead of 796), while text unlike the
# dictionary's (hex, say) keeps its own tables. Longer values find enough in
# themselves: the dictionary would save them a percent or two.
DICTIONARY_MAX = 4096
# The ID the dictionary's frames name in their header, so a reader knows which
# dictionary a frame needs (0: none). Never to change: a new dictionary gets a
# new ID, and readers keep the old one.
DICTIONARY_ID = 0x6C676673


def compress(data: bytes) -> tuple[str, bytes]:
    """Return `(codec, stored)`: `("zstd", frame)` if that is smaller, else `("", data)`."""
    if len(data) >= COMPRESS_MIN:
        packed = _VALUES.compress(data)
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
    if type(data) is not bytes:
        raise ValueError(f"a zstd frame held as {type(data).__name__}")
    if size is not None:
        try:
            stated = zstandard.frame_content_size(data)
        except zstandard.ZstdError as exc:
            raise ValueError(f"not a zstd frame: {exc}") from None
        if stated != size:
            # Ours always state their size: so decompression is bounded by it.
            raise ValueError(f"the zstd frame states {stated!r} bytes, not {size}")
    return _VALUES.inflate(data)


class RecordCodec:
    """zstd frames on contexts kept per thread: any value, or short records against `sample`.

    Contexts are kept per thread and reused: made per call (as
    `backports.zstd`'s functions do, with no way to reuse a finished
    decompressor) they cost more than the work on a value of a few KB
    (measured: a 200-byte envelope five times; a 4 KB value compressed in
    22.8 us instead of 17.6 and inflated in 10.9 instead of 6.3, a 1.2 KB
    message 6.5/5.0 us instead of 1.8/0.8). `zstandard` (python-zstandard,
    which LangGraph's `langsmith` already requires) keeps them; its frames
    are standard zstd, the same bytes either way.

    With a `sample`, each frame is compressed against it: on its own a
    record of a few hundred bytes finds little to refer back to; against a
    sample of its shape (a raw-content dictionary) it finds most of itself.

    Invariant: `inflate` returns exactly what `compress` was given, refuses
    anything but one whole frame that states its size, and never allocates
    more than `limit`.
    """

    def __init__(
        self, sample: bytes | None, limit: int, trained: zstandard.ZstdCompressionDict | None = None
    ) -> None:
        """Compress against `sample` (None: none; never to change for stored frames); inflate up
        to `limit`.

        `trained` (only without `sample`): a dictionary with an ID that inputs up to
        `DICTIONARY_MAX` bytes are also compressed against (the shorter frame kept);
        such a frame names it, and `inflate` reads frames that name it or none.
        """
        self._dict = (
            None
            if sample is None
            else zstandard.ZstdCompressionDict(sample, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
        )
        self._trained = trained
        if trained is not None:
            trained.precompute_compress(level=_LEVEL)  # its tables built once, not per frame
        self._limit = limit
        self._local = threading.local()
        # With a sample: tables sized for a record of about a KB against it,
        # not for any input (`_LEVEL`'s defaults): KBs per thread, not MBs.
        # Without: `_LEVEL`, sized by each input.
        self._params = (
            None
            if sample is None
            else zstandard.ZstdCompressionParameters.from_level(
                _LEVEL, source_size=1024, dict_size=len(sample), write_content_size=1
            )
        )

    def compress(self, data: bytes) -> bytes:
        """Return `data` as one frame that states its size."""
        local = self._local
        short: bytes | None = None
        if self._trained is not None and len(data) <= DICTIONARY_MAX:
            against = getattr(local, "against", None)
            if against is None:
                against = local.against = zstandard.ZstdCompressor(
                    dict_data=self._trained, level=_LEVEL, write_content_size=True
                )
            short = against.compress(data)
        compressor = getattr(local, "compressor", None)
        if compressor is None:
            if self._dict is None:
                compressor = zstandard.ZstdCompressor(level=_LEVEL, write_content_size=True)
            else:
                compressor = zstandard.ZstdCompressor(
                    dict_data=self._dict, compression_params=self._params
                )
            local.compressor = compressor
        frame: bytes = compressor.compress(data)
        return frame if short is None or len(frame) <= len(short) else short

    def inflate(self, frame: bytes) -> bytes:
        """Return what `frame` holds.

        Raises:
            ValueError: not one whole frame, not of its stated size, or stating more than `limit`.
        """
        try:
            size = zstandard.frame_content_size(frame)
            whole = zstd.get_frame_size(frame) == len(frame)
            named = zstandard.get_frame_parameters(frame).dict_id
        except (zstandard.ZstdError, zstd.ZstdError) as exc:
            raise ValueError(f"not a zstd frame: {exc}") from None
        if not 0 <= size <= self._limit:
            raise ValueError(f"zstd frame of unstated or too large size {size!r}")
        if not whole:
            raise ValueError("bytes follow the zstd frame")
        local = self._local
        if named:
            if self._trained is None or named != self._trained.dict_id():
                raise ValueError(
                    f"a zstd frame compressed against dictionary {named}, unknown here"
                )
            decompressor = getattr(local, "trained", None)
            if decompressor is None:
                decompressor = local.trained = zstandard.ZstdDecompressor(dict_data=self._trained)
            return self._whole(decompressor, frame, size)
        decompressor = getattr(local, "decompressor", None)
        if decompressor is None:
            decompressor = local.decompressor = (
                zstandard.ZstdDecompressor()
                if self._dict is None
                else zstandard.ZstdDecompressor(dict_data=self._dict)
            )
        return self._whole(decompressor, frame, size)

    @staticmethod
    def _whole(decompressor: zstandard.ZstdDecompressor, frame: bytes, size: int) -> bytes:
        try:
            out: bytes = decompressor.decompress(frame)
        except zstandard.ZstdError as exc:
            raise ValueError(f"corrupt zstd frame: {exc}") from None
        if len(out) != size:
            raise ValueError("the zstd frame is not of its stated size")
        return out


def _dictionary() -> zstandard.ZstdCompressionDict:
    # The shipped dictionary; one that does not name `DICTIONARY_ID` is not it.
    data = resources.files(__package__).joinpath("values.zdict").read_bytes()
    trained = zstandard.ZstdCompressionDict(data, dict_type=zstandard.DICT_TYPE_FULLDICT)
    if trained.dict_id() != DICTIONARY_ID:  # pragma: no cover - a broken install
        raise ImportError(f"values.zdict names dictionary {trained.dict_id()}, not {DICTIONARY_ID}")
    # Build its decompression tables now, under the import lock: the object
    # builds them on first use, and the per-thread decompressors share it.
    sample = zstandard.ZstdCompressor(dict_data=trained).compress(b"lgfs " * 40)
    zstandard.ZstdDecompressor(dict_data=trained).decompress(sample)
    return trained


# Stored values and pending writes (`compress`, `inflate`): no sample, any
# size, the short ones against the dictionary.
_VALUES = RecordCodec(None, MAX_SIZE, _dictionary())
