"""Reading values stored once (docs/semantics.md §7): a checkpoint's refs back to its values.

`resolve_rows` replaces each value-table checkpoint's refs by the msgpack
map of its values, rebuilt from the value rows its keys name (`core/values.py`
writes them) and the rows those extend, checked as it goes: each row's own
checksum before its bytes are opened or decompressed, the rebuilt bytes
against the key's CRC-32 and size. A read follows at most `_MAX_CHAIN` rows
per value.

Invariant: what comes back is the bytes that were put, or `UndecodableRow`
naming the channel; never another value. Rows already checked in this
process are not checked again (`_Verified`, keyed by every stored cell).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import orjson
import ormsgpack

from ..errors import UndecodableRow
from .checksums import REBUILT, _crc32, blob_checksum, checkpoint_checksum
from .compression import inflate
from .encryption import (
    AES,
    AES_SUFFIX,
    NO_KEY,
    PLAINTEXT_REFUSED,
    CellRefused,
    Encryption,
    blob_aad,
)
from .lending import lent_bytes, lent_cell, lent_key
from .values import (
    BORROW,
    CODECS,
    LENT,
    LEVELS,
    PREFIX,
    REFS,
    REFS_ERROR,
    RESOLVED,
    SEALED,
    SPAN,
    BlobRow,
    Held,
    array_header,
    map_header,
    names_value,
)

__all__ = ["RowCells", "index", "packed_parts", "resolve_rows", "wanted"]


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
            if row[8] == BORROW:
                data = _borrowed(thread_id, ns, cid, row, data, rows, memo, enc)
            crc = _crc32(data, crc)
            size += len(data)
            parts.append(data)
        anchors.append((row[7], row[3], size, crc))
    body = b"".join(parts)
    top = chain[0][0]
    type_, count = top[5], top[6]
    if not names_value(key, type_, count, body, crc):
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
        recent.append((row[3], row[6], row[7], at, row[8] == BORROW))
    else:
        if below is not None:
            recent.extend(below.recent)
    held = Held(key, type_, count, body, crc, tuple(anchors), tuple(recent))
    memo[(thread_id, ns, channel, key)] = held
    return held


def _borrowed(
    thread_id: str,
    ns: str,
    cid: str,
    row: Sequence[Any],
    cell: bytes,
    rows: Mapping[tuple[Any, ...], Any],
    memo: dict[tuple[Any, ...], Held],
    enc: Encryption | None,
) -> bytes:
    # The bytes a `BORROW` row names: `size` bytes at offset `o` of another
    # channel's whole value (a row with no base, so the walk is one row), or
    # of a pending write (`LENT`).
    where = f"channel {row[2]!r}: value {row[3]!r}"
    if cell.startswith(b'{"w":'):
        return _lent(thread_id, ns, cid, row, cell, rows, enc, where)
    try:
        named = orjson.loads(cell)
    except ValueError:
        named = None
    if (
        type(named) is not dict
        or type(named.get("c")) is not str
        or type(named.get("k")) is not str
        or type(named.get("o")) is not int
        or named["c"] == row[2]
        or named["o"] < 0
    ):
        raise UndecodableRow(thread_id, cid, f"{where}: a borrow cell that names no value")
    donor = rows.get((thread_id, ns, named["c"], named["k"]))
    if donor is not None and donor[4] is not None:
        raise UndecodableRow(thread_id, cid, f"{where}: borrows from a value not stored whole")
    held = _rebuild(thread_id, ns, cid, named["c"], named["k"], rows, memo, enc)
    data = held.body[named["o"] : named["o"] + row[9]]
    if len(held.anchors) != 1 or len(data) != row[9]:
        raise UndecodableRow(thread_id, cid, f"{where}: borrows bytes its donor does not hold")
    return data


def _lent(
    thread_id: str,
    ns: str,
    cid: str,
    row: Sequence[Any],
    cell: bytes,
    rows: Mapping[tuple[Any, ...], Any],
    enc: Encryption | None,
    where: str,
) -> bytes:
    # The bytes a `LENT` cell names within a pending write's msgpack. The
    # store reads the write with the value rows, as the row `(LENT, key)`:
    # its channel, type, idx, then its blob and checksum in cells 10 and 11.
    named = lent_cell(cell)
    if named is None:
        raise UndecodableRow(thread_id, cid, f"{where}: a borrow cell that names no write")
    write_cid, task_id, idx, offset, checksum = named
    donor = rows.get((thread_id, ns, LENT, lent_key(write_cid, task_id, idx)))
    if donor is None:
        raise UndecodableRow(thread_id, cid, f"{where}: borrows from a write that is missing")
    write = (donor[4], donor[5], donor[10], donor[11])
    # Checked and opened once per process, as a value row is (`_verified`):
    # keyed by the write's stored cells and what the cell names of them.
    cells = (enc, LENT, *write, checksum, offset, row[9])
    try:
        data = _VERIFIED.get(cells)
    except TypeError:  # a cell that cannot be hashed: damaged, and `lent_bytes` says so
        data = None
    if data is not None:
        return data
    try:
        data = lent_bytes(write, checksum, offset, row[9], enc)
    except ValueError as exc:
        raise UndecodableRow(thread_id, cid, f"{where}: {exc}") from None
    _VERIFIED.put(cells, data)
    return data


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
        and codec in CODECS
        and (codec != PREFIX or (data == b"" and base is not None))
        and (codec != BORROW or base is not None)
        and 0 <= size < 2**31
    ):
        raise UndecodableRow(thread_id, cid, f"channel {channel!r}: value {key!r}: bad cells")
    if codec in SEALED:
        if enc is None:
            raise UndecodableRow(thread_id, cid, f"channel {channel!r}: {NO_KEY}")
    elif codec not in (PREFIX, BORROW) and enc is not None and not enc.accept_plaintext:
        # A prefix or borrow row holds no bytes of a value (its base's or its
        # donor's are sealed); any other in clear is refused.
        raise UndecodableRow(thread_id, cid, f"channel {channel!r}: {PLAINTEXT_REFUSED}")


def _inflate(thread_id: str, cid: str, row: Sequence[Any], enc: Encryption | None) -> bytes:
    codec, size, data = row[8], row[9], row[10]
    if codec == PREFIX:
        return b""
    if codec == BORROW:
        return data  # the cell naming the bytes (`_borrowed`)
    if codec in SEALED and enc is not None:
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
