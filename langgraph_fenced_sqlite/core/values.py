"""Channel values stored once each, a growing list as what it gained (docs/semantics.md §7a).

This module writes them (`encode_values`) and holds what this process put or
read (`ValueCache`); `value_reads.py` reads them back (`resolve_rows`).

A checkpoint of this layout (`values_type == REFS`) holds no channel value:
its `values_blob` is the JSON object `{channel: key}`, one key per channel of
its `channel_values`, each naming a row of the store's value table in the
same thread and namespace. A value row holds a whole value, or, for a list
that extends a stored list (the same leading elements, byte for byte, then
new ones: what `add_messages` and `operator.add` produce), the key of that
list's row (`base`) and the new elements' bytes, or, when another channel's
whole value in the parent holds those bytes (the input a chat's step gains),
a cell naming them there (`BORROW`), or, when a pending write of the parent
holds them (the reply a chat's step gains), a cell naming that write. A
value unchanged since the parent checkpoint is not stored again: the
checkpoint names its parent's row.

Invariant: a key names content. It is the CRC-32 and the size of the whole
value's encoded bytes and the CRC-32 of the channel version it was stored
under, base64url-encoded (a value of at most 16 bytes: its tag, items and
bytes themselves), so one key never names two different values (a retry stores nothing new), and
a reader rebuilds the value from the chain's rows and refuses it
unless its bytes give the key's CRC and size: the checkpoint's own checksum
covers the keys, so it covers every byte its values are read from. Each
value row carries a checksum of its own cells too (`checksums.blob_checksum`),
checked before its bytes are decompressed.

Whether an element is unchanged is decided from encoded bytes only: every
value is encoded on every put, as LangGraph's savers do, and compared with
the parent's bytes. What is new is all that is proven (`DataOnlySerializer.prove`),
checksummed and compressed; bytes this process already proved or read are
not proven again.

A read never follows an unbounded chain: the n-th extension of a whole list
covers the last `SPAN**p` extensions, for the largest `p < LEVELS` with
`n % SPAN**p == 0`, so a chain has at most `(SPAN - 1) * LEVELS` rows after
its whole value (and one prefix row, `PREFIX`, before them), and every
`SPAN**LEVELS`-th extension is stored whole.
"""

from __future__ import annotations

import base64
import operator
import secrets
import struct
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from .checksums import _crc32, blob_checksum
from .compression import ZSTD, compress
from .encryption import (
    AES,
    AES_SUFFIX,
    Encryption,
    blob_aad,
    encryption_of,
)
from .serde import DataOnlySerializer

_dumps = orjson.dumps

__all__ = [
    "BORROW",
    "LEVELS",
    "REFS",
    "REFS_ERROR",
    "SPAN",
    "CODECS",
    "SEALED",
    "Blob",
    "StaleParent",
    "Encoded",
    "Held",
    "LENT",
    "Lent",
    "ValueCache",
    "encode_values",
    "is_tail",
    "names_value",
]

# The `values_type` of a checkpoint whose values are in the value table.
REFS = "lgfs-refs"
# What a display read (`resolve_rows(strict=False)`) puts in place of the
# values of a checkpoint whose value rows are missing or damaged, with the
# reason; never stored.
REFS_ERROR = "lgfs-refs-unreadable"
SPAN = 64
LEVELS = 2
# The codec of a value row whose value is the first `size` bytes of its
# base's: a single extension, once a merged row holds its elements again.
PREFIX = "prefix"
# The codec of a single extension whose new elements another channel's whole
# value in the same thread and namespace holds, byte for byte (in a chat, the
# human message its input checkpoint's `__start__` channel holds): its cell is
# the JSON object `{"c": channel, "k": key, "o": offset}` naming those bytes,
# and `size` their length. A read takes them from that row (`value_reads`);
# the collection of unneeded rows keeps the row while a borrower needs it.
BORROW = "borrow"
# A `BORROW` row may instead name bytes a pending write of the parent checkpoint
# holds (in a chat, the reply its step gains, which the reply's write to the
# parent carried): its cell is `{"w": [checkpoint_id, task_id, idx], "o":
# offset, "s": checksum}`, the write's key, the offset of the bytes within the
# write's msgpack, and the write row's checksum as the put saw it (the put's
# transaction refuses the put unless the write holds it). A read takes them
# from that write row, which it reads as the value row `(LENT, "cid/task/idx")`
# (`value_reads`); every removal of a write makes its borrowers whole first.
LENT = "~write"
# The codecs of a sealed value row (encryption.py): its bytes, or its zstd frame, sealed.
SEALED = frozenset({AES, ZSTD + AES_SUFFIX})
# Every codec a value row may hold: in clear (none, zstd), a prefix, a borrow, sealed.
CODECS = frozenset({"", ZSTD, PREFIX, BORROW}) | SEALED
# A single extension is borrowed only when its bytes are at least this long
# (a borrow cell takes ~40 bytes), from a value at most this long (the search
# costs the put a scan of it).
_MIN_BORROW = 128
_MAX_DONOR = 256 * 1024
# The values type of a checkpoint whose values a read rebuilt from sealed
# value rows (`resolve_rows(enc=...)`): random per process, so no stored
# row can hold it, and its reader decodes it as msgpack this process opened
# (`DataOnlySerializer.loads_opened`), not as a cell stored in clear.
RESOLVED = "lgfs-resolved-" + secrets.token_hex(8)


class StaleParent(Exception):
    """A put's values name rows of a parent that no longer holds them (never leaves the saver).

    The saver then encodes the values whole, naming no row it does not add,
    and puts again.
    """


class Blob(NamedTuple):
    """One row of a store's value table (its thread and namespace aside)."""

    channel: str
    key: str
    base: str | None
    type: str
    items: int  # a list's elements in the whole value; -1: not a list (stored whole)
    ordinal: int  # extensions since the whole value its chain starts from (0: whole)
    codec: str  # "" or "zstd"
    size: int  # `data` uncompressed
    data: bytes
    checksum: int


# The columns a store reads a value row as (after its thread and namespace).
BlobRow = tuple[Any, ...]


class Lent(NamedTuple):
    """A pending write this process stored, whose bytes a child's value may name (`LENT`)."""

    checkpoint_id: str
    task_id: str
    idx: int
    data: bytes  # its msgpack, as encoded (not compressed)
    checksum: int  # its row's, as stored (`checksums.write_checksum`)


class Held(NamedTuple):
    """A stored value whose encoded bytes this process holds (proven or read here)."""

    key: str
    type: str
    items: int
    body: bytes  # a list: its elements' bytes, joined (no array header)
    crc: int
    # The rows a read of it follows: (ordinal, key, bytes of the body so far,
    # CRC of the body so far), its own first.
    anchors: tuple[tuple[int, str, int, int], ...]
    # The single extensions since the chain's last merged or whole row, its
    # own first: (key, items, ordinal, body bytes, whether a borrow row). The
    # next merged row stores them again, so they become prefixes of it
    # (`PREFIX`); a borrow row, which holds no bytes, only where the store
    # asks for it (`encode_values`' `keep_borrows`).
    recent: tuple[tuple[str, int, int, int, bool], ...] = ()
    # The object a put encoded, or a read decoded, these bytes from or into
    # (`Seen`): a later put under the same version, of the same object, the
    # same at its top level, is not encoded again.
    seen: Seen | None = None


class Seen(NamedTuple):
    """The object a value's bytes came from, its channel version, and its top level then."""

    version: Any
    value: Any
    # What `value` held at its top level, references not copies: a list's or
    # a tuple's elements (`_SEQUENCE`), a dict's or an object's attributes'
    # (key, value) pairs (`_MAPPING`), nothing for an immutable scalar.
    kind: int
    shape: tuple[Any, ...]


_SCALAR, _SEQUENCE, _MAPPING = 0, 1, 2
# Scalars that cannot change: the object's identity is its value.
_IMMUTABLE = frozenset({str, int, float, bool, bytes, type(None)})


def _top(value: Any) -> tuple[int, tuple[Any, ...]] | None:
    # `Seen.kind` and `Seen.shape` of `value` now; None: nothing to compare by
    # (slots, a C type), so it is encoded on every put.
    t = type(value)
    if t in _IMMUTABLE:
        return _SCALAR, ()
    if t is list or t is tuple:
        return _SEQUENCE, tuple(value)
    attrs = value if t is dict else getattr(value, "__dict__", None)
    if type(attrs) is not dict:
        return None
    return _MAPPING, tuple(attrs.items())


def seen(version: Any, value: Any) -> Seen | None:
    """Return `Seen` of `value` under `version` (None: no version, or no top level to compare)."""
    top = None if version is None else _top(value)
    return None if top is None else Seen(version, value, *top)


def _unchanged(s: Seen, value: Any, version: Any) -> bool:
    # The same object under the same version, the same at its top level. The
    # held references keep the old elements alive, so an `is` never matches
    # a new object at a reused address.
    if s.value is not value or version is None or s.version != version:
        return False
    top = _top(value)
    if top is None or top[0] != s.kind or len(top[1]) != len(s.shape):
        return False
    if s.kind == _SEQUENCE:
        return all(map(operator.is_, top[1], s.shape))
    return all(
        v is w and (k is j or (type(k) is type(j) and k == j))
        for (k, v), (j, w) in zip(top[1], s.shape, strict=True)
    )


class Encoded(NamedTuple):
    """A checkpoint's channel values, encoded for the value table."""

    refs: bytes
    blobs: tuple[Blob, ...]
    held: dict[str, Held]
    # The parent's refs, when these name rows of the parent's.
    borrows: bytes | None

    @property
    def row(self) -> tuple[str, bytes, tuple[Blob, ...], bytes | None, dict[str, Held]]:
        """The checkpoint row's share: `encode_checkpoint`'s `values`."""
        return REFS, self.refs, self.blobs, self.borrows, self.held


def array_header(n: int) -> bytes:
    """Return msgpack's header of an array of `n` elements."""
    return _header(n, 0x90, b"\xdc", b"\xdd")


def map_header(n: int) -> bytes:
    """Return msgpack's header of a map of `n` entries."""
    return _header(n, 0x80, b"\xde", b"\xdf")


def _header(n: int, fixed: int, two: bytes, four: bytes) -> bytes:
    # msgpack's smallest header for `n`: in the type byte, then 16, then 32 bits.
    if n < 16:
        return bytes((fixed | n,))
    if n < 0x10000:
        return two + n.to_bytes(2, "big")
    return four + n.to_bytes(4, "big")


def _span(ordinal: int) -> int | None:
    """The extensions a row at `ordinal` covers; None: it is stored whole."""
    if ordinal % SPAN**LEVELS == 0:
        return None
    span = 1
    while ordinal % (span * SPAN) == 0:
        span *= SPAN
    return span


def _key(crc: int, size: int, version: Any) -> str:
    # 16 characters (base64url of the three 32-bit numbers): every checkpoint's
    # refs, and each row's key and base, hold keys.
    packed = _KEY.pack(crc, size, _crc32(repr(version).encode()))
    return base64.urlsafe_b64encode(packed).decode()


def _key_matches(key: str, crc: int, size: int) -> bool:
    # Whether `key` (a `_key`) names a value whose sealed CRC and size are these.
    try:
        named_crc, named_size, _ = _KEY.unpack(base64.urlsafe_b64decode(key.encode()))
    except (ValueError, struct.error):
        return False
    return named_crc == crc and named_size == size


_KEY = struct.Struct(">III")


def names_value(key: str, type_: str, count: int, body: bytes, crc: int) -> bool:
    """Whether `key` names the value of tag `type_`, `count` elements and `body`.

    `crc` is the body's CRC-32 (a reader has it from the rows it joined):
    the key scheme this module writes, checked by `value_reads` on every read.
    """
    if key.startswith("="):
        return key == _small_key(type_, count, body) and len(body) <= _SMALL
    return len(key) == 16 and _key_matches(key, _seal(crc, type_, count), len(body))


# A value this short is named by itself (`_small_key`): every `None`, `[]`
# or small flag a graph writes turn after turn is then one row, and its key
# cannot name two values.
_SMALL = 16


def _small_key(type_: str, items: int, body: bytes) -> str:
    return f"={type_}.{items}.{body.hex()}"


def _row(
    channel: str,
    key: str,
    base: str | None,
    type_: str,
    count: int,
    ordinal: int,
    data: bytes,
    enc: Encryption | None,
) -> Blob:
    codec, stored = compress(data)
    if enc is not None:
        # Compressed first: ciphertext does not compress.
        aad = blob_aad(channel, key, base, type_, count, ordinal, codec, len(data))
        stored = enc.seal(aad, stored)
        codec = codec + AES_SUFFIX if codec else AES
    sum_ = blob_checksum(channel, key, base, type_, count, ordinal, codec, len(data), stored)
    return Blob(channel, key, base, type_, count, ordinal, codec, len(data), stored, sum_)


def encode_values(
    serde: Any,
    values: Mapping[str, Any],
    versions: Mapping[str, Any],
    parent: Mapping[str, Held] | None,
    parent_refs: bytes | None = None,
    lent: Sequence[Lent] = (),
    *,
    keep_borrows: bool = False,
) -> Encoded:
    """Encode a checkpoint's `channel_values` against its parent's, as this process holds them.

    `parent` is what this process holds of the parent's values, `parent_refs`
    the parent's refs cell (which the store checks the parent still holds),
    `lent` the parent's pending writes this process stored (a new element
    they hold is named there, `LENT`; the store checks each is still stored).
    `keep_borrows`: a merged row leaves the borrow rows before it as they are
    (PostgreSQL, where a rewritten row is a dead version until vacuumed);
    else they become prefixes of it, as every single extension does (SQLite,
    which reuses the space at once, and no longer keeps their donors named).

    Raises:
        SerializationError: a value does not encode or prove (`dumps_typed`'s errors).
    """
    refs: dict[str, str] = {}
    blobs: list[Blob] = []
    held: dict[str, Held] = {}
    enc = encryption_of(serde)
    # Values a single extension may borrow its bytes from: the parent's, stored
    # whole (never with encryption: a borrower would name bytes sealed apart).
    donors = None
    if parent and enc is None:
        donors = _Donors(
            {
                c: h
                for c, h in parent.items()
                if len(h.anchors) == 1 and _MIN_BORROW <= len(h.body) <= _MAX_DONOR
            },
            lendable(lent),
        )
    for channel, value in values.items():
        prev = parent.get(channel) if parent else None
        version = versions.get(channel)
        if prev is not None and prev.seen is not None and _unchanged(prev.seen, value, version):
            # LangGraph bumps a channel's version whenever it changes it: the
            # parent's value, the very object its bytes came from, under the
            # same version, is the parent's row, not encoded again. A new
            # object under an old version is encoded and compared by bytes.
            h = prev
        else:
            h = _encode(serde, channel, value, version, prev, blobs, enc, donors, keep_borrows)
            s = seen(version, value)
            if s is not None:
                h = h._replace(seen=s)
        refs[channel] = h.key
        held[channel] = h
    named = {b.key for b in blobs}
    borrows = None
    if parent is not None and any(h.key not in named or h.anchors[1:] for h in held.values()):
        borrows = parent_refs
    return Encoded(_dumps(refs), tuple(blobs), held, borrows)


def _encode(
    serde: Any,
    channel: str,
    value: Any,
    version: Any,
    prev: Held | None,
    out: list[Blob],
    enc: Encryption | None,
    donors: _Donors | None = None,
    keep_borrows: bool = False,
) -> Held:
    # Every value is encoded and compared by its bytes: a put may carry a
    # changed value under an unchanged version (LangGraph's own savers
    # would return the old one; this one returns what was put).
    # A serializer of the user's (one that overrides `dumps_typed`) encodes
    # and proves each value its own way; ours proves only what is new.
    ours = (
        isinstance(serde, DataOnlySerializer)
        and type(serde).dumps_typed is DataOnlySerializer.dumps_typed
    )
    if ours:
        type_, data, needs_proof = serde.pack(value)
    else:
        type_, data = serde.dumps_typed(value)
        needs_proof = False
    if ours and type(value) is list and type_ == "msgpack":
        return _encode_list(
            serde, channel, value, version, prev, data, needs_proof, out, enc, donors, keep_borrows
        )
    if prev is not None and prev.items < 0 and prev.type == type_ and prev.body == data:
        return prev
    if needs_proof:
        serde.prove(value, data)
    crc = _crc32(data)
    if len(data) <= _SMALL and enc is None:
        key = _small_key(type_, -1, data)
    else:
        key = _key(_seal(crc, type_, -1), len(data), version)
    out.append(_row(channel, key, None, type_, -1, 0, data, enc))
    return Held(key, type_, -1, data, crc, ((0, key, len(data), crc),))


def _encode_list(
    serde: DataOnlySerializer,
    channel: str,
    value: list[Any],
    version: Any,
    prev: Held | None,
    data: bytes,
    needs_proof: bool,
    out: list[Blob],
    enc: Encryption | None = None,
    donors: _Donors | None = None,
    keep_borrows: bool = False,
) -> Held:
    # `data` is the whole list's msgpack: its array header, then each
    # element's bytes. The parent's list is a prefix of it when its body is.
    n = len(value)
    body = data[len(array_header(n)) :]
    start = 0
    if (
        prev is not None
        and prev.type == "msgpack"
        and 0 <= prev.items <= n
        and body.startswith(prev.body)
    ):
        if prev.items == n:
            return prev
        start = prev.items
    if needs_proof:
        if start:
            new = body[len(prev.body) :]  # type: ignore[union-attr]
            serde.prove(value[start:], array_header(n - start) + new)
        else:
            serde.prove(value, data)
    if prev is not None and start:
        ordinal = prev.anchors[0][0] + 1
        span = _span(ordinal)
        base = None
        if span is not None:
            base = next((a for a in prev.anchors if a[0] == ordinal - span), None)
        if base is not None:
            added = body[base[2] :]
            crc = _crc32(added, base[3])
            key = _key(_seal(crc, "msgpack", n), len(body), version)
            cell = _borrowable(channel, added, donors) if span == 1 else None
            if cell is None:
                out.append(_row(channel, key, base[1], "msgpack", n, ordinal, added, enc))
            else:
                out.append(_cell_row(channel, key, base[1], n, ordinal, BORROW, len(added), cell))
            older = (a for a in prev.anchors if a[0] <= base[0])
            anchors = ((ordinal, key, len(body), crc), *older)
            if span == 1:
                recent = ((key, n, ordinal, len(body), cell is not None), *prev.recent)
                return Held(key, "msgpack", n, body, crc, anchors, recent)
            _as_prefixes(channel, key, prev.recent, out, keep_borrows)
            return Held(key, "msgpack", n, body, crc, anchors)
    crc = _crc32(body)
    if len(body) <= _SMALL and enc is None:
        key = _small_key("msgpack", n, body)
    else:
        key = _key(_seal(crc, "msgpack", n), len(body), version)
    out.append(_row(channel, key, None, "msgpack", n, 0, body, enc))
    if prev is not None and start:
        _as_prefixes(channel, key, prev.recent, out, keep_borrows)
    return Held(key, "msgpack", n, body, crc, ((0, key, len(body), crc),))


def lendable(lent: Sequence[Lent]) -> tuple[Lent, ...]:
    """The writes of `lent` a single extension may borrow from: searched, not too long."""
    return tuple(w for w in lent if _MIN_BORROW <= len(w.data) <= _MAX_DONOR)


class _Donors(NamedTuple):
    # What a single extension may borrow its bytes from (`_borrowable`).
    values: Mapping[str, Held]  # the parent's whole values, by channel
    writes: tuple[Lent, ...]  # the parent's pending writes this process stored


def _borrowable(channel: str, added: bytes, donors: _Donors | None) -> bytes | None:
    # The `BORROW` cell naming `added` within another channel's whole value,
    # or within a pending write (`LENT`); None: no donor holds it.
    if donors is None or len(added) < _MIN_BORROW:
        return None
    for c, h in donors.values.items():
        if c != channel and len(added) <= len(h.body):
            at = h.body.find(added)
            if at >= 0:
                return _dumps({"c": c, "k": h.key, "o": at})
    for w in donors.writes:
        if len(added) <= len(w.data):
            at = w.data.find(added)
            if at >= 0:
                return _dumps({"w": [w.checkpoint_id, w.task_id, w.idx], "o": at, "s": w.checksum})
    return None


def _cell_row(
    channel: str, key: str, base: str, count: int, ordinal: int, codec: str, size: int, cell: bytes
) -> Blob:
    # A list row that holds no bytes of the value, only `cell` (`BORROW`, `PREFIX`).
    sum_ = blob_checksum(channel, key, base, "msgpack", count, ordinal, codec, size, cell)
    return Blob(channel, key, base, "msgpack", count, ordinal, codec, size, cell, sum_)


def is_tail(blob: Blob) -> bool:
    """Whether a value row is a single extension (a later merged row will hold its bytes too)."""
    return blob.base is not None and blob.ordinal % SPAN != 0


def _as_prefixes(
    channel: str,
    key: str,
    recent: Sequence[tuple[str, int, int, int, bool]],
    out: list[Blob],
    keep_borrows: bool,
) -> None:
    # The single extensions whose elements the new row `key` now holds too:
    # each becomes the prefix of it that it is (the store rewrites those
    # rows), but a borrow row with `keep_borrows`.
    for k, items, ordinal, size, borrowed in recent:
        if borrowed and keep_borrows:
            continue
        out.append(_cell_row(channel, k, key, items, ordinal, PREFIX, size, b""))


def _seal(crc: int, type_: str, count: int) -> int:
    # The key's CRC: the body's, then the value's tag and element count, so
    # that the key covers every cell a read rebuilds the value from.
    return _crc32(f"{type_}:{count}".encode(), crc)


# What `ValueCache.lend` holds at most: writes per namespace, and bytes in all.
_LENT_WRITES = 16
_LENT_BYTES = 8 * 1024 * 1024


class ValueCache:
    """The latest checkpoint's values each (thread, namespace) put or read here, bounded by bytes.

    A put encodes against its parent's entry; a parent not here is read
    first (which fills the entry). Thread-safe.
    """

    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        """Keep entries up to `max_bytes` of encoded values in all (least recent go first)."""
        self._max = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[tuple[str, str], tuple[str, bytes, dict[str, Held], int]] = (
            OrderedDict()
        )
        # The puts encoding (`expect`), and the values of those encoded and
        # not yet returned (`putting`), by (thread, ns, cid).
        self._expected: set[tuple[str, str, str]] = set()
        self._putting: dict[tuple[str, str, str], dict[str, Held]] = {}
        # The pending writes this process stored to each namespace's latest
        # checkpoint it wrote to (`lend`), and their bytes in all.
        self._lent: OrderedDict[tuple[str, str], tuple[str, tuple[Lent, ...]]] = OrderedDict()
        self._lent_bytes = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    def get(self, thread_id: str, ns: str, cid: str) -> tuple[bytes, dict[str, Held]] | None:
        """Return `(refs, held)` of checkpoint `cid` if it is its namespace's entry."""
        with self._lock:
            entry = self._entries.get((thread_id, ns))
            if entry is None or entry[0] != cid:
                return None
            self._entries.move_to_end((thread_id, ns))
            return entry[1], entry[2]

    def expect(self, thread_id: str, ns: str, cid: str) -> None:
        """Note that a put of checkpoint `cid` is encoding (`putting` follows, always)."""
        with self._lock:
            self._expected.add((thread_id, ns, cid))

    def putting(self, thread_id: str, ns: str, cid: str, held: dict[str, Held] | None) -> None:
        """Hold the values of checkpoint `cid` while its put runs (None: the put returned).

        LangGraph runs a step's first task while the put of the step's
        checkpoint is still encoding and committing: its writes find the
        values here (`holding`).
        """
        key = (thread_id, ns, cid)
        with self._changed:
            if held is None:
                self._putting.pop(key, None)
                self._expected.discard(key)
            else:
                self._putting[key] = held
            self._changed.notify_all()

    def holding(
        self, thread_id: str, ns: str, cid: str, wait: float = 0.005
    ) -> dict[str, Held] | None:
        """Return the values of checkpoint `cid` if its namespace's entry, or a running put's.

        A put of it still encoding is waited for, up to `wait` seconds (the
        writes then wait for its commit anyway).
        """
        key = (thread_id, ns, cid)
        with self._changed:
            entry = self._entries.get((thread_id, ns))
            if entry is not None and entry[0] == cid:
                return entry[2]
            if key in self._expected:
                self._changed.wait_for(
                    lambda: key in self._putting or key not in self._expected, wait
                )
            return self._putting.get(key)

    def lend(self, thread_id: str, ns: str, writes: Sequence[Lent]) -> None:
        """Hold pending writes just stored, all to one checkpoint (`lent` hands them out).

        Only the namespace's latest checkpoint written to keeps its writes
        here, at most `_LENT_WRITES` of them, within `_LENT_BYTES` in all.
        """
        if not writes:
            return
        cid = writes[0].checkpoint_id
        with self._lock:
            old = self._lent.pop((thread_id, ns), None)
            kept: tuple[Lent, ...] = ()
            if old is not None:
                self._lent_bytes -= sum(len(w.data) for w in old[1])
                if old[0] == cid:
                    kept = old[1]
            held = (*kept, *writes)[-_LENT_WRITES:]
            self._lent[(thread_id, ns)] = (cid, held)
            self._lent_bytes += sum(len(w.data) for w in held)
            while self._lent_bytes > _LENT_BYTES and self._lent:
                _, (_, dropped) = self._lent.popitem(last=False)
                self._lent_bytes -= sum(len(w.data) for w in dropped)

    def lent(self, thread_id: str, ns: str, cid: str) -> tuple[Lent, ...]:
        """Return the writes to checkpoint `cid` this process stored and still holds (`lend`)."""
        with self._lock:
            entry = self._lent.get((thread_id, ns))
            return entry[1] if entry is not None and entry[0] == cid else ()

    def latest(self, thread_id: str, ns: str) -> tuple[str, bytes] | None:
        """Return `(cid, refs)` of the namespace's entry, if it has one."""
        with self._lock:
            entry = self._entries.get((thread_id, ns))
            return None if entry is None else (entry[0], entry[1])

    def put(self, thread_id: str, ns: str, cid: str, refs: bytes, held: dict[str, Held]) -> None:
        """Make checkpoint `cid` its namespace's entry."""
        size = sum(len(h.body) for h in held.values())
        if size > self._max:
            self.forget(thread_id, ns)
            return
        with self._lock:
            old = self._entries.pop((thread_id, ns), None)
            if old is not None:
                self._bytes -= old[3]
            self._entries[(thread_id, ns)] = (cid, refs, held, size)
            self._bytes += size
            while self._bytes > self._max and self._entries:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= dropped[3]

    def note(self, thread_id: str, ns: str, cid: str, checkpoint: Mapping[str, Any]) -> None:
        """Record the objects a read decoded checkpoint `cid`'s values into, if it is the entry.

        LangGraph puts the next checkpoint with those very objects: a channel
        it did not change is then not encoded again (`Held.seen`).
        """
        values = checkpoint.get("channel_values") or {}
        versions = checkpoint.get("channel_versions") or {}
        with self._lock:
            entry = self._entries.get((thread_id, ns))
            if entry is None or entry[0] != cid:
                return
            held = dict(entry[2])
            for channel, value in values.items():
                h = held.get(channel)
                s = None if h is None else seen(versions.get(channel), value)
                if s is not None:
                    held[channel] = h._replace(seen=s)  # type: ignore[union-attr]
            self._entries[(thread_id, ns)] = (entry[0], entry[1], held, entry[3])

    def unnote(self, thread_id: str, ns: str) -> None:
        """Let go of the objects `note` recorded for the namespace (a new read is starting).

        What that read decodes is noted instead; the objects of the last one
        are then garbage, freed now rather than kept alive (and promoted by
        the garbage collector) while the new ones are built.
        """
        with self._lock:
            entry = self._entries.get((thread_id, ns))
            if entry is None or not any(h.seen is not None for h in entry[2].values()):
                return
            held = {
                c: h._replace(seen=None) if h.seen is not None else h for c, h in entry[2].items()
            }
            self._entries[(thread_id, ns)] = (entry[0], entry[1], held, entry[3])

    def forget_thread(self, thread_id: str) -> None:
        """Drop every entry of the thread."""
        with self._lock:
            for key in [k for k in self._entries if k[0] == thread_id]:
                self._bytes -= self._entries.pop(key)[3]
            for key in [k for k in self._lent if k[0] == thread_id]:
                self._lent_bytes -= sum(len(w.data) for w in self._lent.pop(key)[1])

    def forget(self, thread_id: str, ns: str) -> None:
        """Drop the namespace's entry."""
        with self._lock:
            old = self._entries.pop((thread_id, ns), None)
            if old is not None:
                self._bytes -= old[3]
            lent = self._lent.pop((thread_id, ns), None)
            if lent is not None:
                self._lent_bytes -= sum(len(w.data) for w in lent[1])
