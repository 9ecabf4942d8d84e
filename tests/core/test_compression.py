"""zstd for stored values (core/compression.py): what a row's frame must be to be inflated."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
from typing import Any

import pytest
from backports import zstd

from langgraph_fenced_sqlite.core import compression
from langgraph_fenced_sqlite.core.compression import (
    DICTIONARY_ID,
    DICTIONARY_MAX,
    ZSTD,
    compress,
    inflate,
)

_DICTIONARY = os.path.join(os.path.dirname(compression.__file__), "values.zdict")


def _value(n: int) -> bytes:
    # Bytes that compress (a few words, repeated with noise), as stored values do.
    words = [os.urandom(3).hex() for _ in range(50)]
    return " ".join(words[i % 50] + str(i % 7) for i in range(n)).encode()


def test_a_frame_is_standard_zstd_states_its_size_and_reads_back() -> None:
    data = _value(600)
    assert len(data) > DICTIONARY_MAX
    codec, frame = compress(data)
    assert codec == ZSTD and len(frame) < len(data)
    assert zstd.get_frame_info(frame).decompressed_size == len(data)
    assert zstd.get_frame_info(frame).dictionary_id == 0
    assert zstd.decompress(frame) == data  # any zstd reader reads it
    assert inflate(frame, len(data)) == data and inflate(frame) == data


def test_a_short_frame_names_the_shipped_dictionary_that_any_zstd_reader_can_be_given() -> None:
    """`zstd -d -D core/values.zdict` reads what the store holds, as any zstd library does."""
    data = _message("Every checkpoint stores the state its step left behind. " * 3 + _words(80))
    codec, frame = compress(data)
    assert codec == ZSTD and zstd.get_frame_info(frame).dictionary_id == DICTIONARY_ID
    with open(_DICTIONARY, "rb") as f:
        shipped = zstd.ZstdDict(f.read())
    assert shipped.dict_id == DICTIONARY_ID
    assert zstd.decompress(frame, zstd_dict=shipped) == data
    with pytest.raises(zstd.ZstdError, match="Dictionary mismatch"):
        zstd.decompress(frame)  # it does need the dictionary
    assert inflate(frame, len(data)) == data


def _words(n: int) -> str:
    # Words from a vocabulary of letters, none repeated in order: a chat's text
    # that no dictionary has seen.
    return " ".join(
        "".join("etaoinshrdlu"[(i * k * 7 + k) % 12] for k in range(2, 2 + i % 8)) for i in range(n)
    )


def _message(text: str) -> bytes:
    from langchain_core.messages import AIMessage

    from langgraph_fenced_sqlite.core.serde import DataOnlySerializer

    return DataOnlySerializer().pack([AIMessage(content=text, id="ai-1")])[1]


def test_a_short_frame_is_never_longer_than_without_the_dictionary() -> None:
    """A message is shorter against the dictionary; text unlike it (hex) keeps its own frame."""
    hexed = random.Random(1).randbytes(600).hex().encode()
    for data, shorter in (
        (_message(_words(200)), True),
        (_message(" ".join(f"{i * 7919 % 10007:x}" for i in range(200))), False),
        (hexed, None),  # either way: whichever frame is shorter
    ):
        alone = zstd.compress(data, level=3)  # as every frame was stored before the dictionary
        frame = compress(data)[1]
        named = zstd.get_frame_info(frame).dictionary_id == DICTIONARY_ID
        assert len(frame) <= len(alone), (len(frame), len(alone))
        if shorter is not None:
            assert named == shorter
        if shorter:
            assert len(frame) < len(alone) * 0.95
        assert inflate(alone, len(data)) == data  # frames stored before still read
        assert inflate(frame, len(data)) == data


def test_a_frame_naming_another_dictionary_is_refused_by_name() -> None:
    data = _value(600)
    other = zstd.train_dict([_value(50 + i) for i in range(400)], 4096)
    frame = zstd.compress(data, zstd_dict=other)
    assert zstd.get_frame_info(frame).dictionary_id == other.dict_id
    with pytest.raises(ValueError, match=f"dictionary {other.dict_id}, unknown here"):
        inflate(frame, len(data))


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


def test_the_dictionary_script_trains_one_that_names_its_id(tmp_path: Any) -> None:
    """scripts/make_dictionary.py writes a dictionary whose frames name the ID asked for."""
    out = tmp_path / "d.zdict"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run(
        [sys.executable, os.path.join(root, "scripts", "make_dictionary.py"), str(out)]
        + ["--samples", "800", "--size", "8192", "--dict-id", "40000"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    trained = zstd.ZstdDict(out.read_bytes())
    assert trained.dict_id == 40000 and len(out.read_bytes()) <= 8192
    data = _message(_words(150))
    frame = zstd.compress(data, zstd_dict=trained)
    assert zstd.get_frame_info(frame).dictionary_id == 40000
    assert len(frame) < len(zstd.compress(data, level=3))
