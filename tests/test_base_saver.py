"""The seam both stores share (`core/saver.py`, `core/twins.py`): one public API, two stores.

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

from langgraph_fenced_sqlite import FencedSqliteSaver, InvalidArgument, UndecodableRow
from langgraph_fenced_sqlite.core.saver import StoredWrite


@pytest.fixture(params=["sqlite", "postgres"])
def saver(request: pytest.FixtureRequest) -> Any:
    """A saver of each store (the PostgreSQL one on the session's throwaway server)."""
    if request.param == "sqlite":
        return request.getfixturevalue("store")
    return request.getfixturevalue("open_pg")()


def _config(thread_id: str, cid: str | None = None) -> Any:
    conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
    if cid is not None:
        conf["checkpoint_id"] = cid
    return {"configurable": conf}


def _put(saver: Any, thread_id: str) -> str:
    cp = empty_checkpoint()
    saver.put(_config(thread_id), cp, {"source": "loop", "step": 1}, {})
    return str(cp["id"])


def test_pending_writes_carry_task_path_and_idx_in_get_tuple_order(saver: Any) -> None:
    cid = _put(saver, "t")
    saver.put_writes(_config("t", cid), [("a", 1), ("b", {"x": [2]})], "task-1", "path:1")
    saver.put_writes(_config("t", cid), [("c", "three")], "task-2")
    got = saver.pending_writes(_config("t", cid))
    assert all(isinstance(w, StoredWrite) for w in got)
    assert sorted(got) == [
        ("task-1", "path:1", 0, "a", 1),
        ("task-1", "path:1", 1, "b", {"x": [2]}),
        ("task-2", "", 0, "c", "three"),
    ]
    # The same writes, in the same order, as LangGraph's view of them.
    pending = saver.get_tuple(_config("t", cid)).pending_writes
    assert [(w.task_id, w.channel, w.value) for w in got] == [tuple(p) for p in pending]
    # No id: the latest checkpoint's; no checkpoint: nothing.
    assert saver.pending_writes(_config("t")) == got
    assert saver.pending_writes(_config("nobody")) == []
    assert asyncio.run(saver.apending_writes(_config("t", cid))) == got


def test_pending_writes_refuses_a_bad_config_by_name(saver: Any) -> None:
    with pytest.raises(InvalidArgument) as err:
        saver.pending_writes({"configurable": {"thread_id": ""}})
    assert "thread_id" in err.value.argument


def test_pending_writes_reports_a_damaged_write(store: FencedSqliteSaver) -> None:
    cid = _put(store, "t")
    store.put_writes(_config("t", cid), [("a", 1)], "task-1")
    import sqlite3

    conn = sqlite3.connect(store.path)
    with conn:
        conn.execute("UPDATE writes SET blob = x'00'")
    conn.close()
    with pytest.raises(UndecodableRow):
        store.pending_writes(_config("t", cid))


def test_list_pages_across_the_page_size_sync_and_async(saver: Any) -> None:
    # 100 a page: 230 checkpoints are three pages; each comes once, newest first.
    ids = [_put(saver, "t") for _ in range(230)]
    newest_first = sorted(ids, reverse=True)
    assert [t.config["configurable"]["checkpoint_id"] for t in saver.list(None)] == newest_first

    async def alist(**kw: Any) -> list[str]:
        return [t.config["configurable"]["checkpoint_id"] async for t in saver.alist(None, **kw)]

    assert asyncio.run(alist()) == newest_first
    assert asyncio.run(alist(limit=150)) == newest_first[:150]
    assert len(list(saver.list(None, limit=200))) == 200


def test_async_twins_keep_the_sync_signature_and_name() -> None:
    from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

    for cls in (FencedSqliteSaver, FencedPostgresSaver):
        for name in ("claim", "take_over", "renew", "release", "get_tuple", "put", "prune"):
            twin = getattr(cls, f"a{name}")
            assert inspect.iscoroutinefunction(twin), (cls, name)
            assert twin.__name__ == f"a{name}"
            assert inspect.signature(twin) == inspect.signature(getattr(cls, name))
            assert twin.__doc__ == f"Async twin of `{name}`."


def test_either_saver_is_an_async_context_manager(saver: Any) -> None:
    async def main() -> bool:
        async with saver as s:
            assert s is saver
            await s.aput(_config("t"), empty_checkpoint(), {"source": "loop", "step": 1}, {})
        return bool(saver.closed)

    assert asyncio.run(main())


def test_metadata_whose_source_or_step_is_not_langgraphs_reads_back_exactly(saver: Any) -> None:
    """Metadata reads back as written, whatever `source` holds (a dict, a list).

    The `source` column copies only a string: a dict used to reach SQLite's
    bind and fail as StoreError ("type 'dict' is not supported").
    """
    for n, md in enumerate(
        ({"source": {"a": 1}, "step": 1}, {"source": ["x"], "step": "x"}, {"step": 1.5})
    ):
        cp = empty_checkpoint()
        saver.put(_config(f"t{n}"), cp, md, {})
        got = saver.get_tuple(_config(f"t{n}"))
        assert got is not None and got.checkpoint["id"] == cp["id"]
        assert {k: got.metadata[k] for k in md} == md
        assert [e.data["source"] for e in saver.events_after(f"t{n}")] == [None]
