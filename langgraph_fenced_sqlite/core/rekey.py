"""Sealing a store's value cells under the current key (`rekey`), and counting them by key.

Invariant: a cell is resealed only from one that opens (under a key of the
ring) or, stored in clear, whose checksum holds and whose value decodes
under the data-only rules; what it reads back afterwards is what it read
back before. Its row's checksum is recomputed over the new cells. The store
applies a thread's reseals in one transaction, each only if its row still
holds the checksum read, so a thread changed meanwhile is left as it was
(`RowChanged`) and reported; a cell that does not open is left as it is and
reported, never dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..errors import bad_argument
from .checksums import blob_checksum, checkpoint_checksum, write_checksum
from .compression import ZSTD, compress, compress_typed
from .encryption import (
    AES,
    AES_SUFFIX,
    KEY_ENV,
    CellRefused,
    Encryption,
    blob_aad,
    encryption_of,
    key_id_of_cell,
)
from .lending import lent_bytes, lent_cell
from .repack import apply_thread
from .slices import SLICE
from .validation import check_bool
from .values import BORROW, PREFIX, REFS

__all__ = [
    "CLEAR",
    "CellKeys",
    "Reseal",
    "RekeyReport",
    "plan_reseals",
    "rekey_options",
    "rekey_threads",
]

# The key id `CellKeys` counts a cell stored in clear under.
CLEAR = "clear"
# Why a cell in clear is left so: sealing it would vouch for what may have been planted.
_CLEAR_REFUSED = "in clear: sealed only by a store opened with accept_plaintext=True (a migration)"


@dataclass
class RekeyReport:
    """What `rekey` resealed (or, with `dry_run`, would reseal).

    Attributes:
        key_id: The current key's id, which every resealed cell is now under.
        threads: The threads that held a cell in clear or under an older key.
        cells: How many cells were resealed, by what they were under
            (`"clear"` or a key id).
        skipped: One entry per cell or thread left as it was: `thread_id`,
            `checkpoint_id` (None for a thread) and `reason` (does not open,
            does not decode, changed meanwhile).
        dry_run: Whether nothing was written.
    """

    key_id: str
    threads: list[str] = field(default_factory=list)
    cells: dict[str, int] = field(default_factory=dict)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    dry_run: bool = False


class Reseal(NamedTuple):
    """One row's value cell sealed anew: `table`'s row `ident`, if it still holds `old_checksum`.

    `cells` are the new values of the row's `(type, data)` columns (the
    checkpoints' `values_type, values_blob`; the writes' `type, blob`; the
    value rows' `codec, data`), `checksum` the row's new checksum.
    """

    table: str  # "checkpoints" | "writes" | "blobs"
    ident: tuple[Any, ...]
    old_checksum: int
    cells: tuple[str, bytes]
    checksum: int
    was: str  # "clear" or the key id it was sealed under


# A thread's cells as a store reads them, in one snapshot:
# checkpoints: (ns, cid, envelope, values_type, values_blob, metadata, checksum)
# writes: (ns, cid, task_id, idx, channel, type, blob, checksum)
# blobs: (ns, channel, key, base, type, count, ordinal, codec, size, data, checksum)
ThreadCells = tuple[Sequence[Sequence[Any]], Sequence[Sequence[Any]], Sequence[Sequence[Any]]]


def rekey_options(serde: Any, dry_run: Any) -> tuple[Any, Encryption]:
    """Check `rekey`'s arguments; return the serializer clear cells are decoded with, and the ring.

    Raises:
        InvalidArgument: `dry_run` is not a bool, or the store has no `encryption`.
    """
    check_bool(dry_run, "dry_run")
    enc = encryption_of(serde)
    if enc is None:
        raise bad_argument(
            "encryption",
            "rekey needs a keyring: the store opened with encryption=... "
            f"(lgfs: --key-file or ${KEY_ENV})",
        )
    return serde.refusing().with_encryption(None), enc


def _typed(
    serde: Any, enc: Encryption, tag: Any, data: Any
) -> tuple[tuple[str, bytes] | None, str, str | None]:
    # (new (tag, cell) or None when already current, was, why it is skipped)
    if type(tag) is not str or type(data) is not bytes:
        return None, CLEAR, "a cell holds the wrong type"
    if tag.endswith(AES_SUFFIX):
        was = key_id_of_cell(data) or CLEAR
        if enc.current(data):
            return None, was, None
        try:
            inner, plain = enc.open_typed(tag, data)
        except CellRefused as exc:
            return None, was, str(exc)
        return enc.seal_typed(inner, plain), was, None
    if tag in (REFS, SLICE):
        return None, CLEAR, None  # names value rows, or bytes of them; holds no value
    if not enc.accept_plaintext:
        return None, CLEAR, _CLEAR_REFUSED
    try:
        serde.loads_typed((tag, data))
    except Exception as exc:  # noqa: BLE001 - reported, the cell left as it is
        return None, CLEAR, f"in clear and does not decode: {exc}"
    return enc.seal_typed(*compress_typed(tag, data)), CLEAR, None


def plan_reseals(
    serde: Any, enc: Encryption, thread_id: str, cells: ThreadCells
) -> tuple[list[Reseal], list[dict[str, Any]]]:
    """Plan the reseals of one thread's cells: those in clear or under a key not current.

    Returns:
        The reseals, and one `{"thread_id", "checkpoint_id", "reason"}` per
        cell left as it is (its checksum does not hold, it does not open or
        decode).
    """
    checkpoints, writes, blobs = cells
    out: list[Reseal] = []
    skipped: list[dict[str, Any]] = []

    def skip(cid: Any, reason: str) -> None:
        skipped.append({"thread_id": thread_id, "checkpoint_id": cid, "reason": reason})

    for ns, cid, envelope, vtype, vblob, metadata, stored in checkpoints:
        if stored != checkpoint_checksum(envelope, vtype, vblob, metadata):
            skip(cid, "checkpoint: checksum mismatch (damaged)")
            continue
        new, was, why = _typed(serde, enc, vtype, vblob)
        if why is not None:
            skip(cid, f"checkpoint values: {why}")
        elif new is not None:
            sum_ = checkpoint_checksum(envelope, new[0], new[1], metadata)
            out.append(Reseal("checkpoints", (ns, cid), stored, new, sum_, was))
    for ns, cid, task_id, idx, channel, wtype, wblob, stored in writes:
        if stored != write_checksum(channel, wtype, wblob):
            skip(cid, f"write {task_id!r}/{idx}: checksum mismatch (damaged)")
            continue
        new, was, why = _typed(serde, enc, wtype, wblob)
        if why is not None:
            skip(cid, f"write {task_id!r}/{idx}: {why}")
        elif new is not None:
            sum_ = write_checksum(channel, new[0], new[1])
            out.append(Reseal("writes", (ns, cid, task_id, idx), stored, new, sum_, was))
    lent = {(w[0], w[1], w[2], w[3]): (w[4], w[5], w[6], w[7]) for w in writes}
    for ns, channel, key, base, type_, count, ordinal, codec, size, data, stored in blobs:
        named = lent_cell(data) if codec == BORROW else None
        if codec in (PREFIX, BORROW) and named is None:
            continue  # holds no bytes of a value
        if stored != blob_checksum(channel, key, base, type_, count, ordinal, codec, size, data):
            skip(None, f"value {key!r} ({channel!r}): checksum mismatch (damaged)")
            continue
        if named is not None:
            # A borrow row naming a write's bytes (`values.LENT`): its write is
            # resealed (its checksum changes), so it is made whole, sealed.
            write = lent.get((ns, *named[:3]))
            try:
                if write is None:
                    raise ValueError("borrows from a write that is missing")
                added = lent_bytes(write, named[4], named[3], size, enc)
            except ValueError as exc:
                skip(None, f"value {key!r} ({channel!r}): {exc}")
                continue
            inner, plain = compress(added)
            was = CLEAR
        elif codec in (AES, ZSTD + AES_SUFFIX):
            inner = "" if codec == AES else ZSTD
            was = key_id_of_cell(data) or CLEAR
            if enc.current(data):
                continue
            aad = blob_aad(channel, key, base, type_, count, ordinal, inner, size)
            try:
                plain = enc.open(aad, data)
            except CellRefused as exc:
                skip(None, f"value {key!r} ({channel!r}): {exc}")
                continue
        elif codec in ("", ZSTD):
            if not enc.accept_plaintext:
                skip(None, f"value {key!r} ({channel!r}): {_CLEAR_REFUSED}")
                continue
            inner, was, plain = codec, CLEAR, data
        else:
            skip(None, f"value {key!r} ({channel!r}): unknown codec {codec!r}")
            continue
        aad = blob_aad(channel, key, base, type_, count, ordinal, inner, size)
        sealed = enc.seal(aad, plain)
        new_codec = inner + AES_SUFFIX if inner else AES
        sum_ = blob_checksum(channel, key, base, type_, count, ordinal, new_codec, size, sealed)
        out.append(Reseal("blobs", (ns, channel, key), stored, (new_codec, sealed), sum_, was))
    return out, skipped


def rekey_threads(
    serde: Any,
    enc: Encryption,
    threads: Iterable[str],
    read: Callable[[str], ThreadCells],
    write: Callable[[str, list[Reseal]], None],
    *,
    dry_run: bool,
) -> RekeyReport:
    """Plan each thread's reseals from one read, then apply them in one transaction each.

    `write(thread_id, reseals)` applies a thread's reseals all or none,
    raising `RowChanged` (nothing applied) when a row is not as read: the
    thread is reported as skipped. With `dry_run`, nothing is written.
    """
    report = RekeyReport(key_id=enc.key_id, dry_run=dry_run)
    for thread_id in threads:
        reseals, skipped = plan_reseals(serde, enc, thread_id, read(thread_id))
        report.skipped.extend(skipped)
        if not reseals or not apply_thread(
            thread_id, reseals, write, dry_run=dry_run, skipped=report.skipped, verb="resealed"
        ):
            continue
        report.threads.append(thread_id)
        for r in reseals:
            report.cells[r.was] = report.cells.get(r.was, 0) + 1
    return report


@dataclass
class CellKeys:
    """How many value cells a store holds in clear and under each key id (`doctor`).

    Attributes:
        cells: Cell count by key id (`"clear"`: not sealed), over inline
            checkpoint values, pending writes and value rows.
        named_in_clear: Value rows named by their own bytes (values of at
            most 16 bytes written before encryption was on: `rekey` seals
            their cells, not their names).
    """

    cells: dict[str, int] = field(default_factory=dict)
    named_in_clear: int = 0

    def add(self, key_id: str | None, n: int) -> None:
        """Count `n` cells under `key_id` (None: in clear)."""
        k = CLEAR if key_id is None else key_id
        self.cells[k] = self.cells.get(k, 0) + n

    @property
    def clear(self) -> int:
        """How many cells are stored in clear."""
        return self.cells.get(CLEAR, 0)
