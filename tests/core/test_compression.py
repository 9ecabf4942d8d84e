"""zstd for stored values (core/compression.py): what a row's frame must be to be inflated."""

from __future__ import annotations

import os
import threading

import pytest
from backports import zstd

from langgraph_fenced_sqlite.core.compression import ZSTD, compress, inflate


def _value(n: int) -> bytes:
    # Bytes that compress (a few words, repeated with noise), as stored values do.
    words = [os.urandom(3).hex() for _ in range(50)]
    return " ".join(words[i % 50] + str(i % 7) for i in range(n)).encode()


def test_a_frame_is_standard_zstd_states_its_size_and_reads_back() -> None:
    data = _value(600)
    codec, frame = compress(data)
    assert codec == ZSTD and len(frame) < len(data)
    assert zstd.get_frame_info(frame).decompressed_size == len(data)
    assert zstd.decompress(frame) == data  # any zstd reader reads it
    assert inflate(frame, len(data)) == data and inflate(frame) == data


def test_short_or_incompressible_values_are_stored_as_they_are() -> None:
    assert compress(b"x" * 100) == ("", b"x" * 100)
    noise = os.urandom(4096)
    assert compress(noise) == ("", noise)


@pytest.mark.parametrize(
    "damage",
    ["trailing bytes", "a second frame", "another stated size", "cut short"],
)
def test_a_frame_that_is_not_exactly_one_whole_frame_of_its_size_is_refused(damage: str) -> None:
    data = _value(600)
    frame = compress(data)[1]
    size = len(data)
    if damage == "trailing bytes":
        frame += b"\x00"
    elif damage == "a second frame":
        frame += compress(data)[1]
    elif damage == "another stated size":
        size += 1
    else:
        frame = frame[:-5]
    with pytest.raises(ValueError):
        inflate(frame, size)


def test_threads_compress_and_inflate_at_once_each_on_its_own_context() -> None:
    values = [_value(200 + 37 * i) for i in range(8)]
    failures: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(200):
                data = values[i]
                codec, frame = compress(data)
                assert codec == ZSTD and inflate(frame, len(data)) == data
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
