"""History and `list`: paging, LangGraph's list semantics, no lock across yields.

`list` must behave as LangGraph's savers do: `InMemorySaver` is the reference
for which checkpoints a query selects (namespaces, metadata `filter` with
non-string values, `before`, `limit`), and the stock `SqliteSaver` for the
order (checkpoint id descending). `history` pages by commit position.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

from langgraph_fenced_sqlite import CheckpointNotFound


def _conf(thread_id: str, ns: str | None = "", checkpoint_id: str | None = None) -> Any:
    conf: dict[str, Any] = {"thread_id": thread_id}
    if ns is not None:
        conf["checkpoint_ns"] = ns
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def _metadata(step: int) -> dict[str, Any]:
    return {
        "source": "input" if step == 0 else "loop",
        "step": step,
        "flag": step % 2 == 0,
        "score": step / 2,
        "tag": None if step % 3 == 0 else f"tag-{step % 3}",
        "nested": {"a": [1, step % 2], "b": {"c": "ü"}},
        "tags": ["x", "y"] if step < 3 else ["y"],
        "user": "zoë" if step % 2 else "ann",
    }


LAYOUT = [("t1", "", 6), ("t1", "sub:1", 3), ("t2", "", 4), ("t3", "sub:2", 2)]


def _fill(*savers: Any) -> list[str]:
    """Put the same checkpoints (interleaved across threads) into every saver."""
    ids = []
    parents: dict[tuple[str, str], str | None] = {}
    for step in range(max(n for _, _, n in LAYOUT)):
        for thread_id, ns, n in LAYOUT:
            if step >= n:
                continue
            cp = empty_checkpoint()
            cp["channel_values"] = {"step": step, "where": f"{thread_id}/{ns}"}
            # InMemorySaver stores only the values whose version is new.
            versions = {"step": f"{step + 1:032}.0", "where": f"{step + 1:032}.0"}
            cp["channel_versions"] = versions
            config = _conf(thread_id, ns, parents.get((thread_id, ns)))
            for saver in savers:
                saver.put(config, cp, _metadata(step), versions)
                saver.put_writes(_conf(thread_id, ns, cp["id"]), [("c", step)], "task")
            parents[(thread_id, ns)] = cp["id"]
            ids.append(cp["id"])
    return ids


def _ids(tuples: Any) -> list[str]:
    return [t.checkpoint["id"] for t in tuples]


QUERIES: list[tuple[Any, dict[str, Any]]] = [
    (None, {}),
    (_conf("t1", None), {}),
    (_conf("t1"), {}),
    (_conf("t1", "sub:1"), {}),
    (_conf("t3", None), {}),
    (_conf("nobody", None), {}),
    (_conf("t1", None), {"limit": 4}),
    (None, {"limit": 7}),
    (_conf("t1", None), {"filter": {"source": "loop"}}),
    (_conf("t1", None), {"filter": {"step": 2}}),
    (_conf("t1", None), {"filter": {"step": "2"}}),  # a string is not the int 2
    (_conf("t1", None), {"filter": {"step": 2, "source": "loop"}}),
    (None, {"filter": {"flag": True}}),
    (None, {"filter": {"flag": False}}),
    (None, {"filter": {"score": 1.5}}),
    (None, {"filter": {"tag": None}}),
    (None, {"filter": {"tag": "tag-1"}}),
    (None, {"filter": {"nested": {"a": [1, 1], "b": {"c": "ü"}}}}),
    (None, {"filter": {"nested": {"b": {"c": "ü"}, "a": [1, 0]}}}),  # key order differs
    (None, {"filter": {"tags": ["x", "y"]}}),
    (None, {"filter": {"tags": ["y", "x"]}}),  # list order matters
    (None, {"filter": {"user": "zoë"}}),
    (None, {"filter": {"not-there": "x"}}),
    (None, {"filter": {}}),
    (None, {"filter": {"flag": True}, "limit": 3}),
]


def test_list_selects_what_in_memory_saver_selects(open_store: Any) -> None:
    """Namespaces, filters with non-string values, before and limit select as InMemorySaver."""
    ours, memory = open_store(), InMemorySaver()
    ids = _fill(ours, memory)
    befores = [None, ids[len(ids) // 2], ids[-1], ids[0]]
    checked = 0
    for config, kwargs in QUERIES:
        for before_id in befores:
            before = None if before_id is None else _conf("t1", "", before_id)
            mine = list(ours.list(config, before=before, **kwargs))
            theirs = list(memory.list(config, before=before, **kwargs))
            if "limit" in kwargs:
                # InMemorySaver applies the limit in its own (thread, ns) order.
                assert len(mine) == min(kwargs["limit"], len(mine) + len(theirs))
                unlimited = {k: v for k, v in kwargs.items() if k != "limit"}
                everything = _ids(ours.list(config, before=before, **unlimited))
                assert _ids(mine) == everything[: kwargs["limit"]]
                continue
            assert sorted(_ids(mine)) == sorted(_ids(theirs)), (config, kwargs, before_id)
            by_id = {t.checkpoint["id"]: t for t in theirs}
            for t in mine:
                other = by_id[t.checkpoint["id"]]
                assert t.metadata == other.metadata
                assert t.checkpoint["channel_values"] == other.checkpoint["channel_values"]
                assert t.pending_writes == other.pending_writes
                assert t.config == other.config and t.parent_config == other.parent_config
            checked += len(mine)
    assert checked > 100  # the queries are not all empty


def test_list_orders_as_sqlite_saver(open_store: Any) -> None:
    """`list` yields newest checkpoint id first, across namespaces and threads, as SqliteSaver."""
    ours = open_store()
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    try:
        stock = SqliteSaver(conn)
        _fill(ours, stock)
        for config, kwargs in QUERIES:
            if "nested" in kwargs.get("filter", {}) or "tags" in kwargs.get("filter", {}):
                continue  # SqliteSaver cannot filter on objects or arrays
            mine = _ids(ours.list(config, **kwargs))
            theirs = _ids(stock.list(config, **kwargs))
            assert mine == theirs, (config, kwargs)
            assert mine == sorted(mine, reverse=True)
    finally:
        conn.close()


def test_list_pages_across_many_checkpoints(open_store: Any) -> None:
    """Listing more checkpoints than a page visits each once, in order, also with before/limit."""
    saver = open_store()
    config = _conf("t")
    ids = []
    for step in range(250):
        cp = empty_checkpoint()
        config = saver.put(config, cp, {"source": "loop", "step": step}, {})
        ids.append(cp["id"])
    newest_first = ids[::-1]
    assert _ids(saver.list(_conf("t"))) == newest_first
    assert _ids(saver.list(_conf("t"), limit=150)) == newest_first[:150]
    assert _ids(saver.list(_conf("t"), before=_conf("t", "", ids[200]))) == ids[:200][::-1]

    async def collect() -> list[str]:
        return [t.checkpoint["id"] async for t in saver.alist(_conf("t"), limit=201)]

    assert asyncio.run(collect()) == newest_first[:201]


def test_calls_inside_a_list_loop_do_not_deadlock(open_store: Any) -> None:
    """Inside `for t in saver.list(...)`, get_tuple and put work: no lock is held across yields."""
    saver = open_store()
    config = _conf("t")
    for step in range(205):  # more than two pages
        config = saver.put(config, empty_checkpoint(), {"source": "loop", "step": step}, {})
    visited: list[str] = []
    added: list[str] = []

    def loop() -> None:
        for t in saver.list(_conf("t")):
            visited.append(t.checkpoint["id"])
            assert saver.get_tuple(t.config) is not None
            if len(added) < 5:
                cp = empty_checkpoint()
                saver.put(_conf("t"), cp, {"source": "loop", "step": 999}, {})
                added.append(cp["id"])

    worker = threading.Thread(target=loop)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "list() held the store's lock across a yield"
    # Checkpoints added meanwhile have newer ids than the cursor: not visited, and
    # no original one is skipped or visited twice.
    assert len(visited) == len(set(visited)) == 205
    assert not set(added) & set(visited)

    async def nested() -> int:
        n = 0
        async for t in saver.alist(_conf("t"), limit=120):
            assert await saver.aget_tuple(t.config) is not None
            n += 1
        return n

    assert asyncio.run(nested()) == 120


def test_list_issues_a_bounded_number_of_statements(open_store: Any) -> None:
    """`list(limit=10)` costs the same few statements whatever the thread holds (no N+1)."""
    saver = open_store()
    statements: list[str] = []
    saver._engine._conn.set_trace_callback(statements.append)

    def count(thread_id: str, **kwargs: Any) -> int:
        statements.clear()
        n = len(list(saver.list(_conf(thread_id), **kwargs)))
        assert n == min(kwargs.get("limit") or 10**9, sizes[thread_id])
        return len(statements)

    sizes = {"small": 10, "big": 60}
    saver._engine._conn.set_trace_callback(None)
    for thread_id, n in sizes.items():
        config = _conf(thread_id)
        for step in range(n):
            config = saver.put(config, empty_checkpoint(), {"source": "loop", "step": step}, {})
            saver.put_writes(config, [("a", 1), ("b", 2)], f"task-{step}")
    saver._engine._conn.set_trace_callback(statements.append)
    small, big = count("small", limit=10), count("big", limit=10)
    assert small == big, (small, big)
    assert big <= 6, statements  # BEGIN, checkpoints, writes, COMMIT
    # Unlimited: a constant number per page of 100, not per checkpoint.
    assert count("big") == big
    saver._engine._conn.set_trace_callback(None)


def test_reads_find_their_rows_without_a_temporary_table(open_store: Any) -> None:
    """Pin the plans `get_tuple` and `list` were made cheaper with: the latest
    checkpoint is found in the position index alone (no primary-key seek), and a
    page's keys reach the checkpoints' and the writes' joins as co-routines, not
    materialized tables (a plain JOIN materializes them: about 15k CPU
    instructions a page)."""
    from langgraph_fenced_sqlite.sqlite import schema

    saver = open_store()
    saver.put(_conf("t"), empty_checkpoint(), {"source": "loop", "step": 0}, {})
    conn = saver._engine._conn

    def plan(sql: str, params: Any) -> list[str]:
        return [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]

    latest = plan(*schema.read_tuple("t", "", None))
    assert not any("autoindex" in step for step in latest), latest
    assert any("COVERING INDEX checkpoints_by_position" in step for step in latest), latest
    query = {
        "thread_id": "t",
        "checkpoint_ns": "",
        "checkpoint_id": None,
        "metadata_filter": None,
        "before_id": None,
    }
    page = plan(*schema.read_page(**query, after_key=None, limit=10))
    assert not any("MATERIALIZE" in step for step in page), page
    assert "CO-ROUTINE k" in page, page
    # The checkpoints' keys are rowids, joined by seek: a co-routine that
    # yielded the cells would copy each row's blob once more.
    assert "CO-ROUTINE p" in page, page
    assert any("SEARCH c USING INTEGER PRIMARY KEY" in step for step in page), page


_STOCK_DEADLOCK = textwrap.dedent(
    """
    import os, sqlite3, threading
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.sqlite import SqliteSaver
    saver = SqliteSaver(sqlite3.connect(":memory:", check_same_thread=False))
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    for step in range(3):
        saver.put(config, empty_checkpoint(), {"source": "loop", "step": step}, {})
    def loop():
        for t in saver.list(config):
            saver.get_tuple(t.config)
    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    worker.join(3)
    print("deadlocked" if worker.is_alive() else "completed", flush=True)
    os._exit(0)
    """
)


@pytest.mark.slow
@pytest.mark.subprocess
def test_stock_sqlite_saver_deadlocks_in_the_same_loop() -> None:
    """Pin why the rule exists: the stock SqliteSaver holds its lock across yields.

    If this starts printing "completed", LangGraph fixed it upstream and the
    comparison in the docs should change; ours must keep working regardless.
    """
    done = subprocess.run(
        [sys.executable, "-c", _STOCK_DEADLOCK], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "deadlocked"


# --- history ---------------------------------------------------------------------------


def test_history_is_commit_order_while_list_is_id_order(open_store: Any) -> None:
    """`history` and the latest follow commit order; `list` follows ids (LangGraph's `before`)."""
    saver = open_store()
    # Ids out of commit order, as a process whose clock is behind would write them.
    ids = ["00000000-0000-0000-0000-00000000000c", "00000000-0000-0000-0000-00000000000a"]
    ids.append("00000000-0000-0000-0000-00000000000b")
    config = _conf("t")
    for step, cid in enumerate(ids):
        cp = empty_checkpoint()
        cp["id"] = cid
        config = saver.put(config, cp, {"source": "loop", "step": step}, {})
    assert _ids(saver.history("t")) == ids[::-1]  # b, a, c: newest commit first
    assert saver.get_tuple(_conf("t")).checkpoint["id"] == ids[-1]
    assert _ids(saver.list(_conf("t"))) == sorted(ids, reverse=True)  # c, b, a
    assert _ids(saver.list(_conf("t"), before=_conf("t", "", ids[2]))) == [ids[1]]
    assert _ids(saver.history("t", before=ids[1])) == [ids[0]]


def test_history_namespaces_and_async_twin(open_store: Any) -> None:
    """`history` reads one namespace; `before` from another namespace is CheckpointNotFound."""
    saver = open_store()
    _fill(saver)
    root = saver.history("t1", limit=100)
    sub = saver.history("t1", checkpoint_ns="sub:1", limit=100)
    assert [t.checkpoint["channel_values"]["step"] for t in root] == [5, 4, 3, 2, 1, 0]
    assert [t.checkpoint["channel_values"]["step"] for t in sub] == [2, 1, 0]
    assert {t.config["configurable"]["checkpoint_ns"] for t in sub} == {"sub:1"}
    assert all(t.pending_writes == [("task", "c", t.metadata["step"])] for t in root)
    with pytest.raises(CheckpointNotFound) as exc:
        saver.history("t1", before=sub[0].checkpoint["id"])
    assert exc.value.thread_id == "t1"
    got = asyncio.run(saver.ahistory("t1", checkpoint_ns="sub:1", before=sub[0].checkpoint["id"]))
    assert _ids(got) == _ids(sub[1:])
    assert saver.history("t1", checkpoint_ns="nope") == []


def test_history_statements_are_bounded(open_store: Any) -> None:
    """A history page costs a constant number of statements (no per-checkpoint query)."""
    saver = open_store()
    config = _conf("t")
    for step in range(40):
        config = saver.put(config, empty_checkpoint(), {"source": "loop", "step": step}, {})
        saver.put_writes(config, [("a", step)], "task")
    statements: list[str] = []
    saver._engine._conn.set_trace_callback(statements.append)
    try:
        few = len(saver.history("t", limit=2)) and len(statements)
        statements.clear()
        many = len(saver.history("t", limit=30)) and len(statements)
    finally:
        saver._engine._conn.set_trace_callback(None)
    assert few == many and many <= 6, statements


def test_filter_on_an_object_holding_non_ascii_text(open_store: Any) -> None:
    """A metadata filter whose value is an object with non-ASCII text matches (regression).

    SQLite's json_extract hands an object back as its stored text, verbatim,
    so the filter literal must be encoded like stored metadata: "ü", not
    "\\u00fc" (schema._json_literal used ensure_ascii=True and matched nothing).
    """
    saver = open_store()
    config = saver.put(
        _conf("t"),
        empty_checkpoint(),
        {"source": "loop", "step": 0, "who": {"name": "Zoë", "tags": ["ü", "日本"]}},
        {},
    )
    found = list(saver.list(None, filter={"who": {"tags": ["ü", "日本"], "name": "Zoë"}}))
    assert [t.config["configurable"]["checkpoint_id"] for t in found] == [
        config["configurable"]["checkpoint_id"]
    ]
    assert list(saver.list(None, filter={"who": {"name": "Zoe", "tags": ["ü", "日本"]}})) == []
