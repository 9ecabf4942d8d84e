"""The stored checksum's values never change (checksums.py, docs/semantics.md §7).

Every existing file's rows carry checksums computed by earlier versions: a
faster implementation must give exactly the same value for every input, or
each of those rows would read as damaged.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from langgraph_fenced_sqlite.core.checksums import (
    checkpoint_checksum,
    checksum,
    event_checksum,
    write_checksum,
)


def _reference(*parts: Any) -> int:
    """The checksum as first written: one crc32 step per prefix and per part."""
    crc = 0
    for part in parts:
        if isinstance(part, str):
            try:
                data = part.encode()
            except UnicodeEncodeError:
                data = part.encode("utf-8", "surrogatepass")
        elif isinstance(part, bytes):
            data = part
        elif part is None:
            crc = zlib.crc32(b"\xff\xff\xff\xff", crc)
            continue
        elif isinstance(part, (bytearray, memoryview)):
            data = bytes(part)
        else:
            crc = zlib.crc32(b"\xfe\xff\xff\xff", crc)
            data = repr(part).encode("ascii", "backslashreplace")
        crc = zlib.crc32(data, zlib.crc32(struct.pack("<I", len(data)), crc))
    return crc


# Values computed by the version that wrote the first files (before the
# single-crc32 implementation): pinned, so that no change can drift from them.
_PINNED = [
    ((), 0),
    ((None,), 4294967295),
    (("",), 558161692),
    ((b"",), 558161692),
    (("a", b"b"), 1362949747),
    (("ab", b""), 3341107353),
    (("", b"ab"), 1897436143),
    (('{"a":1}', "msgpack", b"\x81\xa1a\x01", '{"step":1}'), 2576173968),
    (("\ud800x",), 2035840083),
    (("é€😀",), 3929052514),
    ((1,), 2218443318),
    ((1.5,), 2005170186),
    ((True,), 2627371461),
    ((bytearray(b"xy"),), 842349262),
    ((memoryview(b"xy"),), 842349262),
    ((2**70,), 1528192297),
    ((None, None, "x"), 2243413008),
]


@pytest.mark.parametrize(("parts", "expected"), _PINNED)
def test_checksums_of_existing_rows_are_unchanged(parts: tuple[Any, ...], expected: int) -> None:
    assert checksum(*parts) == expected


class _Text(str):
    pass


class _Blob(bytes):
    pass


_CELL = st.one_of(
    st.none(),
    st.text(),
    st.binary(),
    st.integers(),
    st.floats(allow_nan=False),
    st.booleans(),
    st.text().map(_Text),
    st.binary().map(_Blob),
    st.binary().map(bytearray),
)


@given(st.lists(_CELL, max_size=6))
def test_checksum_equals_the_step_by_step_crc_for_any_cells(parts: list[Any]) -> None:
    assert checksum(*parts) == _reference(*parts)


_SURROGATES = st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF))


@given(
    st.tuples(_CELL, _CELL, _CELL, _CELL), st.tuples(st.text(), st.text(), st.binary(), _SURROGATES)
)
def test_a_rows_checksum_helpers_give_checksums_value(cells: Any, typical: Any) -> None:
    """The fixed-arity helpers every read and write runs are `checksum` exactly,
    for any cells (a damaged one too) and for lone surrogates (lenient text)."""
    for four in (cells, typical):
        assert checkpoint_checksum(*four) == checksum(*four) == _reference(*four)
        assert write_checksum(*four[:3]) == checksum(*four[:3]) == _reference(*four[:3])
        for two in (four[:2], (four[0], four[3]), (four[1], four[3])):
            assert event_checksum(*two) == checksum(*two) == _reference(*two)
