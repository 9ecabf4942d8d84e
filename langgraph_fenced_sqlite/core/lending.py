"""Value rows that name a pending write's bytes (`values.LENT`, docs/semantics.md §7a).

A chat's step gains the reply its node wrote: the write to the parent
checkpoint holds the reply's bytes, and the child's list gains the same
bytes. The child's new row is then a `BORROW` row whose cell names the
write (`{"w": [checkpoint_id, task_id, idx], "o": offset, "s": checksum}`),
not a second copy; a later merged row holds the bytes again, and the borrow
row, holding none, stays as it is.

Invariant: a borrow row never outlives the bytes it names. The put that
stores one checks, in its transaction, that the write is stored with the
checksum the cell names; every removal of writes makes the borrow rows
naming them whole first (`unlent_rows`), in the same transaction, from the
bytes it removes; `rekey` makes them whole, sealed, before it seals their
writes. A reader checks the write's checksum and the value's key CRC, so a
damaged or replaced write reads as `UndecodableRow`, never as other bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from .checksums import write_checksum
from .compression import ZSTD, ZSTD_MSGPACK, inflate
from .encryption import AES_SUFFIX, NO_KEY, CellRefused, Encryption
from .values import (
    BORROW,
    SPAN,
    Blob,
    Held,
    Lent,
    _borrowable,
    _cell_row,
    _Donors,
    _row,
    lendable,
)

__all__ = ["lend_late", "lent_bytes", "lent_cell", "lent_key", "lent_writes", "unlent_rows"]

# A stored value row as a removal reads it: ns, channel, key, base, type,
# items, ordinal, codec, size, data, checksum.
Row = tuple[Any, ...]


def lent_cell(cell: Any) -> tuple[str, str, int, int, int] | None:
    """Return `(checkpoint_id, task_id, idx, offset, checksum)` of a `LENT` borrow cell.

    None: `cell` is not one (a borrow of another channel's value, or damage).
    """
    if type(cell) is not bytes or not cell.startswith(b'{"w":'):
        return None
    try:
        named = orjson.loads(cell)
    except ValueError:
        return None
    if type(named) is not dict:
        return None
    w, o, s = named.get("w"), named.get("o"), named.get("s")
    if (
        type(w) is not list
        or len(w) != 3
        or type(w[0]) is not str
        or type(w[1]) is not str
        or type(w[2]) is not int
        or type(o) is not int
        or type(s) is not int
        or o < 0
    ):
        return None
    return w[0], w[1], w[2], o, s


def lent_writes(blobs: Iterable[Blob]) -> list[tuple[str, str, int, int]]:
    """The pending writes a put's value rows name (`LENT`): `(cid, task_id, idx, checksum)`."""
    out = []
    for b in blobs:
        named = lent_cell(b.data) if b.codec == BORROW else None
        if named is not None:
            out.append((named[0], named[1], named[2], named[4]))
    return out


def lent_key(checkpoint_id: str, task_id: str, idx: int) -> str:
    """The key a read finds a lent write's row under (`LENT`): `cid/task_id/idx`."""
    return f"{checkpoint_id}/{task_id}/{idx}"


def lent_bytes(
    write: tuple[Any, Any, Any, Any],
    checksum: int,
    offset: int,
    size: int,
    enc: Encryption | None,
) -> bytes:
    """Return the `size` bytes at `offset` of a write's msgpack, as a `LENT` cell names them.

    `write` is the write row's `(channel, type, blob, checksum)`; `checksum`
    the one the cell names.

    Raises:
        ValueError: the write is damaged or not the one named, does not open
            (sealed, and no key), or does not hold those bytes (why, in the message).
    """
    channel, type_, blob, stored = write
    if stored != checksum or stored != write_checksum(channel, type_, blob):
        raise ValueError("borrows from a write that was damaged or replaced")
    try:
        if enc is not None:
            type_, blob = enc.open_typed(type_, blob)
        elif type(type_) is str and type_.endswith(AES_SUFFIX):
            raise CellRefused(NO_KEY)
    except CellRefused as exc:
        raise ValueError(str(exc)) from None
    if type_ == ZSTD_MSGPACK:
        blob = inflate(blob)
    elif type_ != "msgpack":
        raise ValueError(f"borrows from a write of type {type_!r}")
    data: bytes = blob[offset : offset + size]
    if len(data) != size:
        raise ValueError("borrows bytes its write does not hold")
    return data


def unlent_rows(
    borrowers: Iterable[Row],
    gone: Mapping[tuple[Any, ...], tuple[Any, Any, Any, Any]],
    enc: Encryption | None = None,
) -> list[tuple[str, Blob, bytes]]:
    """Make whole the borrow rows that name writes a removal is taking (`gone`).

    `borrowers` are value rows of one thread (`Row`); `gone` maps `(ns, cid,
    task_id, idx)` of each write removed to its `(channel, type, blob,
    checksum)`. Returns `(ns, row, cell it replaces)` per borrower naming
    one: the same key, base and ordinal, its bytes stored (compressed,
    sealed with `enc`). A borrower whose write does not give its bytes
    (damaged) is left as it is: it reads as `UndecodableRow`, as it would have.
    """
    out = []
    for ns, channel, key, base, type_, items, ordinal, codec, size, data, _ in borrowers:
        named = lent_cell(data) if codec == BORROW else None
        write = None if named is None else gone.get((ns, *named[:3]))
        if named is None or write is None:
            continue
        try:
            added = lent_bytes(write, named[4], named[3], size, enc)
        except ValueError:
            continue
        out.append((ns, _row(channel, key, base, type_, items, ordinal, added, enc), data))
    return out


def lend_late(
    blobs: Sequence[Blob], held: Mapping[str, Held], lent: Sequence[Lent]
) -> tuple[tuple[Blob, ...], dict[str, Held]] | None:
    """Name in `lent` the bytes of the single extensions a put's rows hold themselves.

    A write that came while the put was encoding (LangGraph sends a step's
    writes and its put from different threads) was not there to borrow
    from: its bytes were encoded into the put's rows. Returns the put's rows
    and held values with each such row a borrow row (so marked in
    `Held.recent`); None: nothing changed.
    """
    if not lent:
        return None
    donors = _Donors({}, lendable(lent))
    out = list(blobs)
    lending: dict[str, set[str]] = {}
    for i, b in enumerate(blobs):
        if b.codec not in ("", ZSTD) or b.base is None or b.ordinal % SPAN == 0:
            continue  # not a single extension holding its own bytes in clear
        data = inflate(b.data) if b.codec == ZSTD else b.data
        cell = _borrowable(b.channel, data, donors)
        if cell is not None:
            out[i] = _cell_row(
                b.channel, b.key, b.base, b.items, b.ordinal, BORROW, len(data), cell
            )
            lending.setdefault(b.channel, set()).add(b.key)
    if not lending:
        return None
    now = dict(held)
    for channel, keys in lending.items():
        h = now.get(channel)
        if h is not None:
            recent = tuple((*r[:4], r[4] or r[0] in keys) for r in h.recent)
            now[channel] = h._replace(recent=recent)
    return tuple(out), now
