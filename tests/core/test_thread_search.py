"""`core/thread_search.py`: what a search asks, and the index both stores keep for it.

The search's behaviour on both stores is contract case 40
(`testing/cases_search.py`); here, what the contract cannot see: which keys
the index answers (the same list in the core and in both stores' migrations),
and that damaged metadata neither fails a write nor reaches the index.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

from langgraph_fenced_sqlite import FencedSqliteSaver
from langgraph_fenced_sqlite.core.thread_search import UNINDEXED_KEYS, thread_query
from langgraph_fenced_sqlite.postgres.sql_functions import THREAD_TAGS
from langgraph_fenced_sqlite.sqlite import schema
from langgraph_fenced_sqlite.testing._helpers import step_checkpoint, token_config


def test_both_stores_leave_out_exactly_the_keys_the_core_reads_per_thread() -> None:
    """A key left out of an index but not in `UNINDEXED_KEYS` would never be found."""
    (listed,) = re.findall(r"key NOT IN \(('[^)]*')\)", schema._TAGGED)
    assert {k.strip().strip("'") for k in listed.split(",")} == set(UNINDEXED_KEYS)
    removed = re.findall(r"'(\$\.[a-z]+)'", schema._TAG_SOURCE)
    assert removed == [f"$.{k}" for k in UNINDEXED_KEYS]
    (pg_listed,) = re.findall(r"m - '\{([^}]*)\}'::text\[\]", THREAD_TAGS)
    assert pg_listed.split(",") == list(UNINDEXED_KEYS)


def test_a_query_splits_its_metadata_between_the_index_and_the_latest_checkpoint() -> None:
    q = thread_query({"user": "ann", "step": 3, "note": None, "source": "loop"}, limit=None)
    assert q.indexed == [("user", "ann")]
    assert q.unindexed == [("step", 3), ("note", None), ("source", "loop")]
    assert q.window == (True, -1, 0) and not q.in_sql and q.needs_activity
    by_id = thread_query(sort_by="thread_id", order="asc", limit=5, offset=2)
    assert by_id.in_sql and not by_id.needs_activity and by_id.window == (False, 5, 2)
    assert not thread_query(sort_by="thread_id", status="idle").in_sql


def _tags(path: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            "SELECT thread_id, key, value FROM thread_tags ORDER BY 1, 2"
        ).fetchall()
    finally:
        conn.close()


def test_damaged_metadata_fails_no_write_and_indexes_nothing(tmp_path: Any) -> None:
    """A row stored below the API with metadata that is not a JSON object (damage)."""
    path = str(tmp_path / "f.db")
    with FencedSqliteSaver(path) as saver:
        metadata = {"source": "loop", "step": 0, "parents": {}, "user": "ann", "n": 1.5}
        saver.put(token_config("t", None, None), step_checkpoint(0), metadata, {})
        saver.put(token_config("u", None, None), step_checkpoint(0), metadata, {})
    assert _tags(path) == [
        ("t", "n", 1.5),
        ("t", "user", "ann"),
        ("u", "n", 1.5),
        ("u", "user", "ann"),
    ]
    conn = sqlite3.connect(path)
    for n, damaged in enumerate(["{not json", "[1, 2]", "null"]):
        conn.execute(
            "INSERT INTO checkpoints SELECT thread_id, checkpoint_ns, ?, position + ?, "
            "parent_checkpoint_id, envelope, values_type, values_blob, ?, source, step, run_id, "
            "token, created_at, checksum FROM checkpoints WHERE thread_id = 't' AND position = 1",
            (f"damaged-{n}", n + 1, damaged),
        )
    conn.commit()
    conn.close()
    assert _tags(path) == [("u", "n", 1.5), ("u", "user", "ann")]  # t's latest says nothing
    with FencedSqliteSaver(path) as saver:
        assert [t["thread_id"] for t in saver.search_threads(metadata={"user": "ann"})] == ["u"]
        assert saver.count_threads(metadata={"n": 1.5}) == 1
