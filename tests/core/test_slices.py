"""Writes stored as slices of their checkpoint's values (core/slices.py): where a slice is found."""

from __future__ import annotations

from typing import Any

import pytest

from langgraph_fenced_sqlite.core.serde import DataOnlySerializer
from langgraph_fenced_sqlite.core.slices import find_slice, open_slice
from langgraph_fenced_sqlite.core.values import encode_values

SERDE = DataOnlySerializer()
LONG = "a message long enough to be worth sharing " * 5


def _held(values: dict[str, Any]) -> Any:
    versions = {channel: "1" for channel in values}
    return encode_values(SERDE, values, versions, None).held


def _packed(values: dict[str, Any]) -> bytes:
    type_, data = SERDE.dumps_typed(values)
    assert type_ == "msgpack"
    return data


@pytest.mark.parametrize(
    ("values", "write"),
    [
        # Inside another value: the input checkpoint's `__start__` dict.
        ({"messages": ["old"], "__start__": {"messages": [LONG]}}, [LONG]),
        # A channel's whole list, its array header a part of its own.
        ({"flag": True, "docs": [LONG, LONG + "!"]}, [LONG, LONG + "!"]),
        # A scalar channel's whole value.
        ({"n": 1, "text": LONG}, LONG),
    ],
)
def test_a_write_its_checkpoint_holds_is_found_and_opens_to_its_bytes(
    values: dict[str, Any], write: Any
) -> None:
    data = SERDE.dumps_typed(write)[1]
    cell = find_slice(_held(values), data)
    assert cell is not None and len(cell) == 12
    assert open_slice("msgpack", _packed(values), cell) == data


def test_a_write_not_held_or_too_short_is_stored_whole() -> None:
    held = _held({"messages": [LONG, LONG]})
    assert find_slice(held, SERDE.dumps_typed([LONG])[1]) is None  # a head: another header
    assert find_slice(held, SERDE.dumps_typed("elsewhere " * 20)[1]) is None
    assert find_slice(_held({"s": "short"}), SERDE.dumps_typed("short")[1]) is None


def test_a_slice_of_other_bytes_or_unread_values_is_refused() -> None:
    values = {"__start__": {"messages": [LONG]}}
    cell = find_slice(_held(values), SERDE.dumps_typed([LONG])[1])
    assert cell is not None
    with pytest.raises(ValueError, match="do not hold"):
        open_slice("msgpack", _packed({"__start__": {"messages": [LONG + "?"]}}), cell)
    with pytest.raises(ValueError, match="not readable"):
        open_slice("lgfs-refs", b"{}", cell)
    with pytest.raises(ValueError, match="wrong size"):
        open_slice("msgpack", _packed(values), cell[:8])
