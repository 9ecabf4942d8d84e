"""The seam both stores share (`core/saver.py`, `twins.py`): one public API, two stores.

What a user relies on here: `pending_writes` returns a checkpoint's writes
with the task path and index that `get_tuple` leaves out, the same on both
stores; `list` pages across the page size without losing or repeating a
checkpoint, sync and async; async twins keep their sync method's signature;
and either saver works as an `async with` context manager.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from support.configs import saver_config
from support.puts import put

from langgraph_fenced_sqlite import FencedSqliteSaver, InvalidArgument, UndecodableRow
from langgraph_fenced_sqlite.core.saver import StoredWrite


def test_pending_writes_carry_task_path_and_idx_in_get_tuple_order(either_store: Any) -> None:
    cid = put(either_store, "t", step=1)
    either_store.put_writes(
        saver_config("t", checkpoint_id=cid), [("a", 1), ("b", {"x": [2]})], "task-1", "path:1"
    )
    either_store.put_writes(saver_config("t", checkpoint_id=cid), [("c", "three")], "task-2")
    got = either_store.pending_writes(saver_config("t", checkpoint_id=cid))
    assert all(isinstance(w, StoredWrite) for w in got)
    assert sorted(got) == [
        ("task-1", "path:1", 0, "a", 1),
        ("task-1", "path:1", 1, "b", {"x": [2]}),
        ("task-2", "", 0, "c", "three"),
    ]
    # The same writes, in the same order, as LangGraph's view of them.
    pending = either_store.get_tuple(saver_config("t", checkpoint_id=cid)).pending_writes
    assert [(w.task_id, w.channel, w.value) for w in got] == [tuple(p) for p in pending]
    # No id: the latest checkpoint's; no checkpoint: nothing.
    assert either_store.pending_writes(saver_config("t")) == got
    assert either_store.pending_writes(saver_config("nobody")) == []
    assert asyncio.run(either_store.apending_writes(saver_config("t", checkpoint_id=cid))) == got


def test_pending_writes_refuses_a_bad_config_by_name(either_store: Any) -> None:
    with pytest.raises(InvalidArgument) as err:
        either_store.pending_writes({"configurable": {"thread_id": ""}})
    assert "thread_id" in err.value.argument


def test_pending_writes_reports_a_damaged_write(store: FencedSqliteSaver) -> None:
    cid = put(store, "t", step=1)
    store.put_writes(saver_config("t", checkpoint_id=cid), [("a", 1)], "task-1")
    import sqlite3

    conn = sqlite3.connect(store.path)
    with conn:
        conn.execute("UPDATE writes SET blob = x'00'")
    conn.close()
    with pytest.raises(UndecodableRow):
        store.pending_writes(saver_config("t", checkpoint_id=cid))


def test_list_pages_across_the_page_size_sync_and_async(either_store: Any) -> None:
    # 100 a page: 230 checkpoints are three pages; each comes once, newest first.
    ids = [put(either_store, "t", step=1) for _ in range(230)]
    newest_first = sorted(ids, reverse=True)
    assert [
        t.config["configurable"]["checkpoint_id"] for t in either_store.list(None)
    ] == newest_first

    async def alist(**kw: Any) -> list[str]:
        return [
            t.config["configurable"]["checkpoint_id"] async for t in either_store.alist(None, **kw)
        ]

    assert asyncio.run(alist()) == newest_first
    assert asyncio.run(alist(limit=150)) == newest_first[:150]
    assert len(list(either_store.list(None, limit=200))) == 200


def test_async_twins_keep_the_sync_signature_and_name() -> None:
    from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

    for cls in (FencedSqliteSaver, FencedPostgresSaver):
        for name in ("claim", "take_over", "renew", "release", "get_tuple", "put", "prune"):
            twin = getattr(cls, f"a{name}")
            assert inspect.iscoroutinefunction(twin), (cls, name)
            assert twin.__name__ == f"a{name}"
            assert inspect.signature(twin) == inspect.signature(getattr(cls, name))
            assert twin.__doc__ == f"Async twin of `{name}`."


def test_either_saver_is_an_async_context_manager(either_store: Any) -> None:
    async def main() -> bool:
        async with either_store as s:
            assert s is either_store
            await s.aput(saver_config("t"), empty_checkpoint(), {"source": "loop", "step": 1}, {})
        return bool(either_store.closed)

    assert asyncio.run(main())


def test_metadata_whose_source_or_step_is_not_langgraphs_reads_back_exactly(
    either_store: Any,
) -> None:
    """Metadata reads back as written, whatever `source` holds (a dict, a list).

    The `source` column copies only a string: a dict used to reach SQLite's
    bind and fail as StoreError ("type 'dict' is not supported").
    """
    for n, md in enumerate(
        ({"source": {"a": 1}, "step": 1}, {"source": ["x"], "step": "x"}, {"step": 1.5})
    ):
        cp = empty_checkpoint()
        either_store.put(saver_config(f"t{n}"), cp, md, {})
        got = either_store.get_tuple(saver_config(f"t{n}"))
        assert got is not None and got.checkpoint["id"] == cp["id"]
        assert {k: got.metadata[k] for k in md} == md
        assert [e.data["source"] for e in either_store.events_after(f"t{n}")] == [None]
