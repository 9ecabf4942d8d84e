"""Stored data integrity: checksums on every insert, checked on every read, and cells
of any shape giving package errors (CONTRACT §7; contract cases 34 and 35 hold the rest).

Damage is planted with plain sqlite3, as a failing disk or another tool would.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from langgraph_fenced_sqlite import serde
from langgraph_fenced_sqlite.errors import SerializationError
from langgraph_fenced_sqlite.serde import dumps_json, loads_json
from langgraph_fenced_sqlite.testing._helpers import plain_config, values_checkpoint

# serde.MAX_JSON_DEPTH, the documented bound (checked below).
MAX_JSON_DEPTH = 200


@pytest.mark.parametrize(
    "text",
    [b"{}", 5, None, 1.5, "NaN", '{"a": Infinity}', "{", "1" * 5000, "[" * 100_000],
)
def test_loads_json_raises_only_serialization_errors(text: Any) -> None:
    with pytest.raises(SerializationError):
        loads_json(text)


def test_json_nesting_is_bounded_on_read_and_on_write() -> None:
    assert getattr(serde, "MAX_JSON_DEPTH", None) == MAX_JSON_DEPTH
    ok: Any = []
    for _ in range(MAX_JSON_DEPTH - 1):
        ok = [ok]
    assert loads_json(dumps_json(ok, "x")) == ok
    deep = [ok]
    with pytest.raises(SerializationError, match=f"deeper than {MAX_JSON_DEPTH}") as info:
        dumps_json(deep, "metadata")
    assert "metadata" in str(info.value)
    with pytest.raises(SerializationError, match="deeper"):
        loads_json("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), "event data")
    very: Any = []
    for _ in range(100_000):
        very = [very]
    with pytest.raises(SerializationError, match="deeper"):
        dumps_json(very, "metadata")


def test_deep_metadata_is_refused_at_put_changing_nothing(open_store: Any, db_path: str) -> None:
    store = open_store()
    store.put(plain_config("t"), values_checkpoint(), {"source": "input", "step": -1}, {})
    conn = sqlite3.connect(db_path)
    before = conn.execute("SELECT count(*) FROM checkpoints").fetchone()
    deep: Any = {}
    for _ in range(MAX_JSON_DEPTH + 5):
        deep = {"d": deep}
    with pytest.raises(SerializationError, match="metadata"):
        store.put(plain_config("u"), values_checkpoint(), {"source": "input", "deep": deep}, {})
    assert conn.execute("SELECT count(*) FROM checkpoints").fetchone() == before
    conn.close()
