"""Value rows naming a pending write's bytes (`values.LENT`, core/lending.py)."""

from __future__ import annotations

from typing import Any
from unittest.mock import ANY

import orjson
import pytest

from langgraph_fenced_sqlite.core import values
from langgraph_fenced_sqlite.core.checksums import blob_checksum, write_checksum
from langgraph_fenced_sqlite.core.compression import compress_typed, inflate
from langgraph_fenced_sqlite.core.lending import lend_late, lent_bytes, lent_cell, unlent_rows
from langgraph_fenced_sqlite.core.serde import DataOnlySerializer

SERDE = DataOnlySerializer()


def _reply(n: int) -> str:
    return f"reply {n}: " + " ".join(f"w{(n * 31 + i * 17) % 997}" for i in range(60))


def _write(cid: str, value: Any) -> tuple[values.Lent, tuple[str, str, bytes, int]]:
    """A pending write of `value` to `messages`, as held (`Lent`) and as stored."""
    type_, raw = SERDE.dumps_typed(value)
    stored_type, blob = compress_typed(type_, raw)
    checksum = write_checksum("messages", stored_type, blob)
    return values.Lent(cid, "task", 0, raw, checksum), ("messages", stored_type, blob, checksum)


def _encode(lent: tuple[values.Lent, ...], n: int = 3) -> values.Encoded:
    parent = values.encode_values(
        SERDE, {"messages": [_reply(i) for i in range(n)]}, {"messages": "1"}, None
    )
    return values.encode_values(
        SERDE,
        {"messages": [_reply(i) for i in range(n + 1)]},
        {"messages": "2"},
        parent.held,
        parent.refs,
        lent,
    )


def test_a_new_element_a_parent_write_holds_is_a_borrow_row_naming_the_write() -> None:
    held, stored = _write("c0", [_reply(3)])
    (row,) = _encode((held,)).blobs
    assert row.codec == values.BORROW and row.size > 128
    named = lent_cell(row.data)
    assert named == ("c0", "task", 0, 1, stored[3])  # after the write's array header
    assert lent_bytes(stored, named[4], named[3], row.size, None) == held.data[1:]


def test_no_write_holding_the_bytes_or_none_held_stores_them() -> None:
    other, _ = _write("c0", [_reply(9)])
    for lent in ((), (other,)):
        (row,) = _encode(lent).blobs
        assert row.codec == "zstd"


@pytest.mark.parametrize(
    "cell",
    [
        b'{"c":"__start__","k":"abc","o":1}',  # names a row, not a write
        b'{"w":["c0","task",0],"o":1}',  # no checksum
        b'{"w":["c0","task","0"],"o":1,"s":5}',  # idx not a number
        b'{"w":["c0","task",0],"o":-1,"s":5}',  # before the write's start
        b'{"w":["c0","task"],"o":1,"s":5}',
        b'{"w":',
        "text, not bytes",
    ],
)
def test_a_cell_that_names_no_write_is_refused(cell: Any) -> None:
    assert lent_cell(cell) is None


def test_a_write_damaged_or_replaced_gives_no_bytes() -> None:
    _, (channel, type_, blob, checksum) = _write("c0", [_reply(3)])
    with pytest.raises(ValueError, match="damaged or replaced"):
        lent_bytes((channel, type_, blob[:-1] + b"x", checksum), checksum, 1, 10, None)
    with pytest.raises(ValueError, match="damaged or replaced"):
        lent_bytes((channel, type_, blob, checksum), checksum + 1, 1, 10, None)
    with pytest.raises(ValueError, match="does not hold"):
        lent_bytes((channel, type_, blob, checksum), checksum, 1, 10**6, None)


def test_a_removal_makes_a_borrow_row_whole_from_the_bytes_it_removes() -> None:
    held, stored = _write("c0", [_reply(3)])
    (row,) = _encode((held,)).blobs
    borrower = ("", *row)
    damaged = ("", *row[:1], "other-key", *row[2:])
    gone = {("", "c0", "task", 0): stored}
    ((ns, whole, cell),) = unlent_rows([borrower], gone)
    assert ns == "" and cell == row.data
    assert (whole.key, whole.base, whole.ordinal, whole.size) == (
        row.key,
        row.base,
        row.ordinal,
        row.size,
    )
    assert whole.codec == "zstd" and inflate(whole.data) == held.data[1:]
    cells = (whole.channel, whole.key, whole.base, whole.type, whole.items, whole.ordinal)
    assert whole.checksum == blob_checksum(*cells, whole.codec, whole.size, whole.data)
    # A write not removed, or one damaged: the row is left as it is.
    assert unlent_rows([borrower], {("", "c1", "task", 0): stored}) == []
    bad = {("", "c0", "task", 0): (*stored[:2], stored[2] + b"x", stored[3])}
    assert unlent_rows([borrower, damaged], bad) == []


def test_the_cache_lends_only_its_namespaces_latest_writes_within_its_bounds() -> None:
    cache = values.ValueCache()
    a, _ = _write("c0", [_reply(1)])
    b, _ = _write("c1", [_reply(2)])
    cache.lend("t", "", [a])
    assert cache.lent("t", "", "c0") == (a,)
    cache.lend("t", "", [b])  # a later checkpoint's: the earlier one's go
    assert cache.lent("t", "", "c0") == () and cache.lent("t", "", "c1") == (b,)
    cache.lend("t", "", [b] * 40)
    assert len(cache.lent("t", "", "c1")) == values._LENT_WRITES
    cache.forget("t", "")
    assert cache.lent("t", "", "c1") == ()
    big = values.Lent("c9", "task", 0, b"x" * (values._LENT_BYTES // 2 + 1), 0)
    cache.lend("u", "", [big])
    cache.lend("v", "", [big])  # over the bound: the least recent goes
    assert cache.lent("u", "", "c9") == () and cache.lent("v", "", "c9") == (big,)


def test_a_borrow_cell_is_json_naming_the_write_key() -> None:
    held, stored = _write("c0", [_reply(3)])
    (row,) = _encode((held,)).blobs
    assert orjson.loads(row.data) == {"w": ["c0", "task", 0], "o": 1, "s": stored[3]}


def test_a_write_that_came_while_the_put_encoded_is_named_after_all() -> None:
    """`lend_late`: a single extension stored whole becomes a borrow row, so marked in `recent`."""
    held, _ = _write("c0", [_reply(3)])
    enc = _encode(())
    (row,) = enc.blobs
    assert row.codec == "zstd" and enc.held["messages"].recent == ((row.key, 4, 1, ANY, False),)
    late = lend_late(enc.blobs, enc.held, (held,))
    assert late is not None
    (lent,), now = late
    assert lent.codec == values.BORROW and lent.key == row.key and lent.size == row.size
    assert lent_cell(lent.data)[:3] == ("c0", "task", 0)  # type: ignore[index]
    assert now["messages"].recent == ((row.key, 4, 1, ANY, True),)
    assert now["messages"].body == enc.held["messages"].body
    other, _ = _write("c0", [_reply(8)])
    assert lend_late(enc.blobs, enc.held, (other,)) is None
    assert lend_late(enc.blobs, enc.held, ()) is None


@pytest.mark.parametrize("keep_borrows", [False, True])
def test_a_merged_row_makes_borrow_rows_prefixes_unless_the_store_keeps_them(
    keep_borrows: bool,
) -> None:
    """SQLite rewrites them (the space is reused at once); PostgreSQL keeps them (no dead rows)."""
    serde, versions, parent, refs = SERDE, 0, None, None
    replies: list[str] = []
    codecs = []
    for n in range(values.SPAN + 1):
        replies = [*replies, _reply(n)]
        held, _ = _write(f"c{n}", [replies[-1]])
        versions += 1
        enc = values.encode_values(
            serde,
            {"messages": replies},
            {"messages": str(versions)},
            parent,
            refs,
            (held,),
            keep_borrows=keep_borrows,
        )
        codecs.append([b.codec for b in enc.blobs])
        parent, refs = enc.held, enc.refs
    # The first list is stored whole, each later one borrows its element...
    assert codecs[0] == ["zstd"] and all(c == [values.BORROW] for c in codecs[1 : values.SPAN])
    # ...until the merged row, which holds them again: then the 63 borrow rows
    # become its prefixes, unless kept.
    merged = codecs[values.SPAN]
    assert merged.count("zstd") == 1
    assert merged.count(values.PREFIX) == (0 if keep_borrows else values.SPAN - 1)
