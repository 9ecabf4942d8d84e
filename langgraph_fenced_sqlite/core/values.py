"""Channel values stored once each, a growing list as what it gained (docs/semantics.md §7a).

A checkpoint of this layout (`values_type == REFS`) holds no channel value:
its `values_blob` is the JSON object `{channel: key}`, one key per channel of
its `channel_values`, each naming a row of the store's value table in the
same thread and namespace. A value row holds a whole value, or, for a list
that extends a stored list (the same leading elements, byte for byte, then
new ones: what `add_messages` and `operator.add` produce), the key of that
list's row (`base`) and the new elements' bytes. A value unchanged since the
parent checkpoint is not stored again: the checkpoint names its parent's row.

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import orjson
import ormsgpack

from ..errors import UndecodableRow
from .checksums import REBUILT, _crc32, blob_checksum, checkpoint_checksum
from .compression import ZSTD, compress, inflate
from .encryption import (
    AES,
    AES_SUFFIX,
    NO_KEY,
    PLAINTEXT_REFUSED,
    CellRefused,
    Encryption,
    blob_aad,
    encryption_of,
)
from .serde import DataOnlySerializer

_dumps = orjson.dumps

__all__ = [
    "LEVELS",
    "REFS",
    "REFS_ERROR",
    "SPAN",
    "Blob",
    "StaleParent",
    "Encoded",
    "Held",
    "RowCells",
    "ValueCache",
    "encode_values",
    "is_tail",
    "packed_parts",
    "resolve_rows",
    "wanted",
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
# The codecs of a sealed value row (encryption.py): its bytes, or its zstd frame, sealed.
_SEALED = frozenset({AES, ZSTD + AES_SUFFIX})
_CODECS = frozenset({"", ZSTD, PREFIX}) | _SEALED
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
    # own first: (key, items, ordinal, body bytes). The next merged row
    # stores them again, so they become prefixes of it (`PREFIX`).
    recent: tuple[tuple[str, int, int, int], ...] = ()
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
) -> Encoded:
    """Encode a checkpoint's `channel_values` against its parent's, as this process holds them.

    `parent` is what this process holds of the parent's values, `parent_refs`
    the parent's refs cell (which the store checks the parent still holds).

    Raises:
        SerializationError: a value does not encode or prove (`dumps_typed`'s errors).
    """
    refs: dict[str, str] = {}
    blobs: list[Blob] = []
    held: dict[str, Held] = {}
    enc = encryption_of(serde)
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
            h = _encode(serde, channel, value, version, prev, blobs, enc)
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
        return _encode_list(serde, channel, value, version, prev, data, needs_proof, out, enc)
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
            out.append(_row(channel, key, base[1], "msgpack", n, ordinal, added, enc))
            older = (a for a in prev.anchors if a[0] <= base[0])
            anchors = ((ordinal, key, len(body), crc), *older)
            if span == 1:
                recent = ((key, n, ordinal, len(body)), *prev.recent)
                return Held(key, "msgpack", n, body, crc, anchors, recent)
            _as_prefixes(channel, key, prev.recent, out)
            return Held(key, "msgpack", n, body, crc, anchors)
    crc = _crc32(body)
    if len(body) <= _SMALL and enc is None:
        key = _small_key("msgpack", n, body)
    else:
        key = _key(_seal(crc, "msgpack", n), len(body), version)
    out.append(_row(channel, key, None, "msgpack", n, 0, body, enc))
    if prev is not None and start:
        _as_prefixes(channel, key, prev.recent, out)
    return Held(key, "msgpack", n, body, crc, ((0, key, len(body), crc),))


def is_tail(blob: Blob) -> bool:
    """Whether a value row is a single extension (a later merged row will hold its bytes too)."""
    return blob.base is not None and blob.ordinal % SPAN != 0


def _as_prefixes(
    channel: str, key: str, recent: Sequence[tuple[str, int, int, int]], out: list[Blob]
) -> None:
    # The single extensions whose elements the new row `key` now holds too:
    # each becomes the prefix of it that it is (the store rewrites those rows).
    for k, items, ordinal, size in recent:
        sum_ = blob_checksum(channel, k, key, "msgpack", items, ordinal, PREFIX, size, b"")
        out.append(Blob(channel, k, key, "msgpack", items, ordinal, PREFIX, size, b"", sum_))


def _seal(crc: int, type_: str, count: int) -> int:
    # The key's CRC: the body's, then the value's tag and element count, so
    # that the key covers every cell a read rebuilds the value from.
    return _crc32(f"{type_}:{count}".encode(), crc)


def wanted(thread_id: Any, ns: Any, refs: Any) -> list[tuple[Any, Any, str, str]]:
    """Return the value rows `(thread, ns, channel, key)` a checkpoint's refs name.

    Refs that are not a JSON object of strings name nothing: the checkpoint
    then fails its decode (`assemble`), which says why.
    """
    try:
        decoded = _load_refs(refs)
    except ValueError:  # damage: `resolve_rows` names it
        return []
    return [(thread_id, ns, channel, key) for channel, key in decoded.items() if type(key) is str]


def _load_refs(refs: Any) -> dict[str, Any]:
    if type(refs) is not bytes:
        raise ValueError(f"refs cell holds {type(refs).__name__}")
    decoded = orjson.loads(refs)  # orjson.JSONDecodeError is a ValueError
    if type(decoded) is not dict:
        raise ValueError(f"refs are JSON {type(decoded).__name__}, not an object")
    return decoded


def index(rows: Iterable[BlobRow]) -> dict[tuple[Any, ...], BlobRow]:
    """Index value rows (thread, ns, channel, key, ...) by their first four cells."""
    return {tuple(row[:4]): row for row in rows}


# Cells 4-11 of a value row: base, type, count, ordinal, codec, size, data, checksum.
_MAX_CHAIN = (SPAN - 1) * LEVELS + 3


class RowCells(NamedTuple):
    """Where a store's checkpoint row holds the cells `resolve_rows` reads (indexes).

    `thread` and `ns` are None for rows of a read that named them.
    """

    thread: int | None
    ns: int | None
    cid: int
    envelope: int
    values_type: int
    values_blob: int
    metadata: int
    checksum: int


def resolve_rows(
    rows: list[Any],
    cells: RowCells,
    fetch: Callable[[list[tuple[Any, ...]]], Iterable[BlobRow]],
    *,
    thread_id: Any = None,
    ns: Any = None,
    strict: bool = True,
    keep: Callable[[str, str, str, bytes, dict[str, Held]], None] | None = None,
    cached: Callable[[str, str, str], tuple[bytes, dict[str, Held]] | None] | None = None,
    enc: Encryption | None = None,
) -> list[Any]:
    """Return `rows` with each value-table checkpoint's values inline, as the old layout held them.

    A row of this layout whose checksum holds has its refs replaced by the
    msgpack map of its values (the bytes `dumps_typed(channel_values)`
    gives) and its checksum by that of the row so rebuilt, so that every
    reader decodes it as it decodes any row, through the same checks. Its
    value rows come from `fetch(wanted)`, which the store runs in the same
    snapshot as the read of `rows`. A row whose checksum does not hold is
    left as it is (its reader refuses it); one whose value rows are missing
    or damaged raises `UndecodableRow` (`strict`), or has its values
    replaced by `REFS_ERROR` and the reason, which its reader raises as
    `UndecodableRow` (for display and `doctor`: one such row does not stop
    a page).

    `keep(thread, ns, cid, refs, held)` is told what each resolved row holds.
    `cached(thread, ns, cid)` returns what this process put or read of that
    checkpoint: when its refs are the row's, the values are its bytes, which
    the row's keys name (no value row is read).

    `enc` opens sealed value rows, and refuses rows in clear unless its
    `accept_plaintext` says otherwise; None refuses sealed rows.
    With `enc`, a resolved row's values type is `RESOLVED` (not one a file
    can hold), so its reader knows them opened here, not stored in clear.
    """
    todo: list[tuple[int, Any, Any, dict[str, Held] | None]] = []
    want: list[tuple[Any, ...]] = []
    for i, row in enumerate(rows):
        if row[cells.values_type] != REFS:
            continue
        refs = row[cells.values_blob]
        if type(refs) is not bytes or row[cells.checksum] != checkpoint_checksum(
            row[cells.envelope], REFS, refs, row[cells.metadata]
        ):
            continue
        t = thread_id if cells.thread is None else row[cells.thread]
        n = ns if cells.ns is None else row[cells.ns]
        hit = None if cached is None else cached(t, n, row[cells.cid])
        if hit is not None and hit[0] == refs:
            todo.append((i, t, n, hit[1]))
            continue
        todo.append((i, t, n, None))
        want.extend(wanted(t, n, refs))
    if not todo:
        return rows
    found = index(fetch(want)) if want else {}
    # Values rebuilt so far, by (thread, namespace, channel, key): a page's
    # checkpoints name the same values and extend each other's chains, so
    # each row is checked and decompressed once per read, not per checkpoint.
    memo: dict[tuple[Any, ...], Held] = {}
    out = list(rows)
    for i, t, n, held in todo:
        row = rows[i]
        cid = row[cells.cid]
        try:
            if held is None:
                held = _rebuild_all(t, n, cid, row[cells.values_blob], found, memo, enc)
            kind, cell = "msgpack" if enc is None else RESOLVED, _packed(t, cid, held)
        except UndecodableRow as exc:
            if strict:
                raise
            kind, cell = REFS_ERROR, exc.reason.encode("utf-8", "backslashreplace")
        new = list(row)
        new[cells.values_type] = kind
        new[cells.values_blob] = cell
        # Rebuilt from checked rows: taken as holding (`REBUILT`); a row of
        # unreadable values is sealed as it is, for its reader to refuse.
        new[cells.checksum] = (
            REBUILT
            if kind != REFS_ERROR
            else checkpoint_checksum(row[cells.envelope], kind, cell, row[cells.metadata])
        )
        out[i] = tuple(new)
        if keep is not None and kind != REFS_ERROR and held is not None:
            keep(t, n, cid, row[cells.values_blob], held)
    return out


def _rebuild_all(
    thread_id: Any,
    ns: Any,
    cid: Any,
    refs: Any,
    rows: Mapping[tuple[Any, ...], BlobRow],
    memo: dict[tuple[Any, ...], Held],
    enc: Encryption | None = None,
) -> dict[str, Held]:
    try:
        decoded = _load_refs(refs)
    except ValueError as exc:
        raise UndecodableRow(thread_id, cid, f"channel values: {exc}") from exc
    held: dict[str, Held] = {}
    for channel, key in decoded.items():
        if type(key) is not str:
            raise UndecodableRow(thread_id, cid, f"channel {channel!r}: key is not a string")
        held[channel] = _rebuild(thread_id, ns, cid, channel, key, rows, memo, enc)
    return held


def _packed(thread_id: Any, cid: Any, held: Mapping[str, Held]) -> bytes:
    # The channel values as one msgpack map, as `dumps_typed(channel_values)`
    # encodes it (`packed_parts`, joined).
    try:
        return b"".join(packed_parts(held))
    except ValueError as exc:
        raise UndecodableRow(thread_id, cid, str(exc)) from exc


def packed_parts(held: Mapping[str, Held]) -> list[bytes]:
    """Return the parts of the msgpack map of `held`'s values, in order, bodies not copied.

    Joined, they are the bytes `dumps_typed(channel_values)` gives: each key,
    then its value's bytes (a tagged value's as the map holds it: None as
    nil, bytes as bin; a list's array header and body apart, so that a long
    body is copied once, by the join).

    Raises:
        ValueError: a value's tag is not one a map holds.
    """
    parts = [map_header(len(held))]
    for channel, h in held.items():
        parts.append(ormsgpack.packb(channel))
        if h.type == "msgpack":
            if h.items >= 0:
                parts.append(array_header(h.items))
            parts.append(h.body)
        elif h.type == "null":
            parts.append(b"\xc0")
        elif h.type in ("bytes", "bytearray"):
            parts.append(ormsgpack.packb(h.body))
        else:
            raise ValueError(f"channel {channel!r}: tag {h.type!r} refused")
    return parts


def _rebuild(
    thread_id: str,
    ns: str,
    cid: str,
    channel: str,
    key: str,
    rows: Mapping[tuple[Any, ...], Any],
    memo: dict[tuple[Any, ...], Held],
    enc: Encryption | None = None,
) -> Held:
    done = memo.get((thread_id, ns, channel, key))
    if done is not None:
        return done
    # The chain's rows down to its whole value, or to a value this read has
    # already rebuilt (`memo`), which the rows above it extend.
    chain: list[Any] = []
    below: Held | None = None
    at: Any = key
    while at is not None:
        below = memo.get((thread_id, ns, channel, at)) if chain else None
        if below is not None:
            break
        row = rows.get((thread_id, ns, channel, at))
        if row is None or len(chain) >= _MAX_CHAIN:
            why = "is missing" if row is None else "extends too long a chain"
            raise UndecodableRow(thread_id, cid, f"channel {channel!r}: value {at!r} {why}")
        chain.append((row, _verified(thread_id, cid, row, enc)))
        at = row[4]
    crc = 0
    size = 0
    parts: list[bytes] = []
    anchors: list[tuple[int, str, int, int]] = []
    if below is not None:
        crc, size, parts = below.crc, len(below.body), [below.body]
        anchors = list(reversed(below.anchors))
    for row, data in reversed(chain):
        if row[8] == PREFIX:
            # The first `size` bytes of what its base holds.
            if not row[9] <= size:
                raise UndecodableRow(
                    thread_id, cid, f"channel {channel!r}: value {row[3]!r}: longer than its base"
                )
            cut = b"".join(parts)[: row[9]]
            parts, size, crc = [cut], len(cut), _crc32(cut)
        else:
            crc = _crc32(data, crc)
            size += len(data)
            parts.append(data)
        anchors.append((row[7], row[3], size, crc))
    body = b"".join(parts)
    top = chain[0][0]
    type_, count = top[5], top[6]
    if key.startswith("="):
        matches = key == _small_key(type_, count, body) and len(body) <= _SMALL
    else:
        matches = len(key) == 16 and _key_matches(key, _seal(crc, type_, count), len(body))
    if not matches:
        raise UndecodableRow(
            thread_id, cid, f"channel {channel!r}: value {key!r} does not match its rows"
        )
    anchors.reverse()
    # The single extensions at the head of the chain (`Held.recent`), those
    # of the value it was rebuilt on included when all above it are.
    recent = []
    for (row, _), (_, _, at, _) in zip(chain, anchors, strict=False):
        if row[8] == PREFIX or row[7] % SPAN == 0:
            break
        recent.append((row[3], row[6], row[7], at))
    else:
        if below is not None:
            recent.extend(below.recent)
    held = Held(key, type_, count, body, crc, tuple(anchors), tuple(recent))
    memo[(thread_id, ns, channel, key)] = held
    return held


class _Verified:
    """Value rows already checked and inflated in this process, by their stored cells; bounded.

    A row is read again by every read of a checkpoint it belongs to: a
    history page reads the rows its chains share, the next page many of the
    same. Keyed by every stored cell (its bytes and checksum included), so a
    row changed or damaged on disk since is a miss, checked anew; and by the
    `Encryption` that opened it (None: none), so a store without that key
    never gets another's opened bytes. Least recently used rows go first
    once their inflated bytes pass `max_bytes`.
    """

    def __init__(self, max_bytes: int = 32 * 1024 * 1024) -> None:
        self._max = max_bytes
        self._bytes = 0
        self._rows: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, cells: tuple[Any, ...]) -> bytes | None:
        with self._lock:
            data = self._rows.get(cells)
            if data is not None:
                self._rows.move_to_end(cells)
            return data

    def put(self, cells: tuple[Any, ...], data: bytes) -> None:
        if len(data) > self._max // 16:
            return  # a value that big would push out many rows to be read once
        with self._lock:
            if cells in self._rows:
                return
            self._rows[cells] = data
            self._bytes += len(data)
            while self._bytes > self._max:
                _, gone = self._rows.popitem(last=False)
                self._bytes -= len(gone)


_VERIFIED = _Verified()


def _verified(thread_id: str, cid: str, row: Sequence[Any], enc: Encryption | None) -> bytes:
    """Return a value row's bytes (none for a prefix row), checked and opened once per process."""
    cells = (enc, *row[2:12])
    try:
        data = _VERIFIED.get(cells)
    except TypeError:  # a cell that cannot be hashed: damaged, and `_check_blob` says so
        data = None
    if data is not None:
        return data
    _check_blob(thread_id, cid, row, enc)
    data = _inflate(thread_id, cid, row, enc)
    _VERIFIED.put(cells, data)
    return data


def _check_blob(thread_id: str, cid: str, row: Sequence[Any], enc: Encryption | None) -> None:
    channel, key, base, type_, count, ordinal, codec, size, data, stored = row[2:12]
    if stored is None or stored != blob_checksum(
        channel, key, base, type_, count, ordinal, codec, size, data
    ):
        raise UndecodableRow(
            thread_id, cid, f"channel {channel!r}: value {key!r}: checksum mismatch (damaged)"
        )
    if not (
        type(type_) is str
        and type(count) is int
        and type(ordinal) is int
        and type(size) is int
        and type(data) is bytes
        and codec in _CODECS
        and (codec != PREFIX or (data == b"" and base is not None))
        and 0 <= size < 2**31
    ):
        raise UndecodableRow(thread_id, cid, f"channel {channel!r}: value {key!r}: bad cells")
    if codec in _SEALED:
        if enc is None:
            raise UndecodableRow(thread_id, cid, f"channel {channel!r}: {NO_KEY}")
    elif codec != PREFIX and enc is not None and not enc.accept_plaintext:
        # A prefix row holds no bytes (its base's are sealed); any other in clear is refused.
        raise UndecodableRow(thread_id, cid, f"channel {channel!r}: {PLAINTEXT_REFUSED}")


def _inflate(thread_id: str, cid: str, row: Sequence[Any], enc: Encryption | None) -> bytes:
    codec, size, data = row[8], row[9], row[10]
    if codec == PREFIX:
        return b""
    if codec in _SEALED and enc is not None:
        codec = "" if codec == AES else codec[: -len(AES_SUFFIX)]
        aad = blob_aad(row[2], row[3], row[4], row[5], row[6], row[7], codec, size)
        try:
            data = enc.open(aad, data)
        except CellRefused as exc:
            raise UndecodableRow(
                thread_id, cid, f"channel {row[2]!r}: value {row[3]!r}: {exc}"
            ) from exc
    if not codec:
        out = data
    else:
        try:
            out = inflate(data, size)
        except ValueError as exc:
            raise UndecodableRow(
                thread_id, cid, f"channel {row[2]!r}: value {row[3]!r}: {exc}"
            ) from exc
    if len(out) != size:
        raise UndecodableRow(thread_id, cid, f"channel {row[2]!r}: value {row[3]!r}: wrong size")
    return out


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

    def forget(self, thread_id: str, ns: str) -> None:
        """Drop the namespace's entry."""
        with self._lock:
            old = self._entries.pop((thread_id, ns), None)
            if old is not None:
                self._bytes -= old[3]
