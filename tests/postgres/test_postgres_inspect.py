"""The PostgreSQL store's history and inspection: `history`, `ahistory`, `history_records`,
`inspect_checkpoint`, `diff_checkpoints`, `claims`.

The reference is the SQLite saver: the same runs (support/graphs.py
`write_threads`) read back the same from both stores, page by page. Then
what a database shared by hosts adds: a page and its writes come from one
snapshot while another connection commits. Bad arguments and damaged rows
give the SQLite saver's errors.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from support.graphs import same_ids, write_threads

from langgraph_fenced_sqlite import (
    CheckpointNotFound,
    InvalidArgument,
    ManualClock,
    UndecodableRow,
)


def _tuple(t: Any) -> dict[str, Any]:
    """A `CheckpointTuple` as plain data (LangGraph's wall-clock `ts` left out)."""
    checkpoint = {k: v for k, v in t.checkpoint.items() if k != "ts"}
    return {
        "config": t.config,
        "checkpoint": checkpoint,
        "metadata": t.metadata,
        "parent_config": t.parent_config,
        "pending_writes": t.pending_writes,
    }


def _shown(found: dict[str, Any] | None) -> Any:
    if found is None or found["checkpoint"] is None:
        return found
    return {**found, "checkpoint": {k: v for k, v in found["checkpoint"].items() if k != "ts"}}


def _positions_checked(
    thread_id: str, found: list[Any], committed_at: dict[str, int], floor: int
) -> None:
    """Check each entry's `position` is its commit's (its `checkpoint` event's seq), then drop it.

    LangGraph may commit a step's writes and the next checkpoint in either
    order, so the same runs need not give the same positions in two stores.
    A checkpoint whose event was compacted away was committed below the floor.
    """
    for entry in found:
        if entry is not None:
            position = committed_at.get(entry["checkpoint_id"], "below the floor")
            if position == "below the floor":
                assert entry["position"] < floor, (thread_id, entry)
            else:
                assert entry["position"] == position, (thread_id, entry)
            entry["position"] = "checked"


def everything_shown(saver: Any) -> dict[str, Any]:
    """Every history and inspection read of `saver` over its threads, ids made alike."""
    out: dict[str, Any] = {"claims": [c.__dict__ for c in saver.claims()]}
    for summary in saver.threads():
        thread_id = summary["thread_id"]
        committed_at = {
            e.checkpoint_id: e.seq
            for e in saver.events_after(thread_id, summary["floor"] - 1, 1000)
            if e.kind == "checkpoint"
        }
        for ns in saver.namespaces(thread_id):
            pages, before = [], None
            while True:
                page = saver.history(thread_id, checkpoint_ns=ns, before=before, limit=3)
                if not page:
                    break
                pages.append([_tuple(t) for t in page])
                before = page[-1].checkpoint["id"]
            records = saver.history_records(thread_id, checkpoint_ns=ns, limit=100)
            ids = [r["checkpoint_id"] for r in records]
            shown = [
                _shown(saver.inspect_checkpoint(thread_id, checkpoint_ns=ns, checkpoint_id=i))
                for i in ids
            ]
            latest = _shown(saver.inspect_checkpoint(thread_id, checkpoint_ns=ns))
            assert [r["position"] for r in records] == sorted(
                (r["position"] for r in records), reverse=True
            )
            found = [*records, *shown, latest]
            _positions_checked(thread_id, found, committed_at, summary["floor"])
            out[f"{thread_id}/{ns}"] = {
                "pages": pages,
                "records": records,
                "shown": shown,
                "latest": latest,
                "diffs": [
                    saver.diff_checkpoints(thread_id, checkpoint_ns=ns, to_id=i) for i in ids
                ],
                "diff latest to oldest": saver.diff_checkpoints(
                    thread_id, checkpoint_ns=ns, from_id=ids[-1]
                ),
            }
    out["none"] = (
        saver.history("nobody"),
        saver.history_records("nobody"),
        saver.inspect_checkpoint("nobody"),
        saver.diff_checkpoints("nobody"),
    )
    return same_ids(out)


def test_history_and_inspection_are_the_sqlite_savers_on_the_same_runs(
    open_store: Any, open_pg: Any
) -> None:
    """Pages, records, inspected checkpoints and writes, diffs, claims: equal, key by key."""
    reads = []
    for opener in (open_store, open_pg):
        clock = ManualClock()
        saver = opener(clock=clock)
        write_threads(saver, clock)
        reads.append(everything_shown(saver))
    expected, got = reads
    assert len(got) == len(expected) > 10
    for key in expected:
        assert got[key] == expected[key], key
    assert [c["holder"] for c in got["claims"]] == ["worker-9"]
    waiting = got["waiting/"]
    assert waiting["records"][0]["source"] == "loop" and waiting["records"][0]["token"]
    interrupt = [w for w in waiting["latest"]["writes"] if w["channel"] == "__interrupt__"]
    assert len(interrupt) == 1 and interrupt[0]["error"] is None


def test_ahistory_is_history(open_pg: Any) -> None:
    """The async twin gives the sync call's page, and its errors."""
    saver = open_pg()
    ids = _chain(saver, "t", 5)

    async def pages() -> Any:
        return await saver.ahistory("t", before=ids[3], limit=2)

    assert asyncio.run(pages()) == saver.history("t", before=ids[3], limit=2)
    assert [t.checkpoint["id"] for t in asyncio.run(pages())] == [ids[2], ids[1]]

    async def missing() -> Any:
        return await saver.ahistory("t", before="not-there")

    with pytest.raises(CheckpointNotFound):
        asyncio.run(missing())


def _chain(saver: Any, thread_id: str, n: int, ns: str = "", start: int = 0) -> list[str]:
    """Put `n` unfenced checkpoints `c00000`... in a chain; return their ids (oldest first)."""
    ids: list[str] = []
    for step in range(start, start + n):
        cp = empty_checkpoint()
        cp["id"] = f"c{step:05d}"
        cp["channel_values"] = {"step": step}
        conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
        if ids:
            conf["checkpoint_id"] = ids[-1]
        saver.put({"configurable": conf}, cp, {"source": "loop", "step": step}, {})
        ids.append(cp["id"])
    return ids


def test_history_pages_one_namespace_and_refuses_a_before_of_another(either_store: Any) -> None:
    """`before` must be a checkpoint of that thread and namespace; each namespace pages alone."""
    root = _chain(either_store, "t", 4)
    sub = _chain(either_store, "t", 3, ns="sub:1", start=10)
    _chain(either_store, "other", 2, start=20)
    got = either_store.history("t", checkpoint_ns="sub:1", limit=2)
    assert [t.checkpoint["id"] for t in got] == [sub[2], sub[1]]
    assert [r["checkpoint_id"] for r in either_store.history_records("t", before=root[2])] == root[
        1::-1
    ]
    for before, ns in ((sub[1], ""), (root[1], "sub:1"), ("c00020", ""), ("nope", "")):
        with pytest.raises(CheckpointNotFound) as caught:
            either_store.history("t", checkpoint_ns=ns, before=before)
        assert (caught.value.thread_id, caught.value.checkpoint_id) == ("t", before)
        with pytest.raises(CheckpointNotFound):
            either_store.history_records("t", checkpoint_ns=ns, before=before)
    records = either_store.history_records("t", limit=1)
    assert records == [
        {
            "checkpoint_ns": "",
            "checkpoint_id": root[3],
            "parent_checkpoint_id": root[2],
            "position": 4,
            "token": None,
            "created_at": 1_000_000.0,
            "step": 3,
            "source": "loop",
            "run_id": None,
        }
    ]


def test_diff_checkpoints_and_inspect_refuse_or_answer_as_the_sqlite_saver(
    either_store: Any,
) -> None:
    """Missing ids are `CheckpointNotFound`; an empty thread is None; a diff names what changed."""
    ids = _chain(either_store, "t", 3)
    diff = either_store.diff_checkpoints("t")
    assert (diff.from_id, diff.to_id) == (ids[1], ids[2])
    assert [(c.channel, c.before, c.after) for c in diff.changes] == [("step", 1, 2)]
    first = either_store.diff_checkpoints("t", to_id=ids[0])
    assert first.from_id is None and [c.after for c in first.changes] == [0]
    for kwargs in ({"to_id": "nope"}, {"from_id": "nope"}):
        with pytest.raises(CheckpointNotFound) as caught:
            either_store.diff_checkpoints("t", **kwargs)
        assert caught.value.checkpoint_id == "nope"
    assert either_store.diff_checkpoints("t", checkpoint_ns="sub") is None
    assert either_store.inspect_checkpoint("t", checkpoint_id="nope") is None
    assert either_store.inspect_checkpoint("t", checkpoint_ns="sub") is None
    assert either_store.inspect_checkpoint("t")["checkpoint_id"] == ids[2]  # type: ignore[index]


def test_claims_lists_every_claim_live_or_expired(either_store: Any, clock: ManualClock) -> None:
    """`claims()` lists each current claim, expired ones too, by thread id; released ones go."""
    b = either_store.claim("b", "w2", 10)
    a = either_store.claim("a", "w1", 1000)
    either_store.release("c", either_store.claim("c", "w3", 10).token)
    clock.advance(100)  # b's claim has expired; nobody replaced it
    assert either_store.claims() == [a, b]


_S = "s" * 100_000
_BAD_CALLS = [
    ("history", "thread_id", lambda s: s.history("")),
    ("history", "checkpoint_ns", lambda s: s.history("t", checkpoint_ns="a\x00")),
    ("history", "before", lambda s: s.history("t", before="")),
    ("history", "before", lambda s: s.history("t", before=_S)),
    ("history", "limit", lambda s: s.history("t", limit=0)),
    ("history", "limit", lambda s: s.history("t", limit="2")),
    ("history", "limit", lambda s: s.history("t", limit=2**70)),
    ("ahistory", "thread_id", lambda s: asyncio.run(s.ahistory(3))),
    ("history_records", "thread_id", lambda s: s.history_records(None)),
    ("history_records", "limit", lambda s: s.history_records("t", limit=-1)),
    ("inspect", "thread_id", lambda s: s.inspect_checkpoint("")),
    ("inspect", "checkpoint_ns", lambda s: s.inspect_checkpoint("t", checkpoint_ns=5)),
    ("inspect", "checkpoint_id", lambda s: s.inspect_checkpoint("t", checkpoint_id="")),
    ("diff", "thread_id", lambda s: s.diff_checkpoints("t\x00")),
    ("diff", "from_id", lambda s: s.diff_checkpoints("t", from_id=7)),
    ("diff", "to_id", lambda s: s.diff_checkpoints("t", to_id="")),
]


@pytest.mark.parametrize(
    ("method", "argument", "call"),
    _BAD_CALLS,
    ids=[f"{m}-{a}-{i}" for i, (m, a, _) in enumerate(_BAD_CALLS)],
)
def test_bad_arguments_are_refused_naming_them_before_the_store_is_used(
    either_store: Any, method: str, argument: str, call: Any
) -> None:
    """Each bad argument is `InvalidArgument` naming it, even on a closed store (nothing ran)."""
    either_store.close()
    with pytest.raises(InvalidArgument) as caught:
        call(either_store)
    assert caught.value.argument == argument, (method, caught.value)
    assert str(caught.value).startswith(f"{argument}:"), str(caught.value)


def _damage(either_store: Any, request: Any, table: str, column: str, where: str) -> None:
    """Flip one bit of a stored cell, in place, through the store's own database client."""
    if hasattr(either_store, "_engine") and type(either_store).__name__ == "FencedPostgresSaver":
        with psycopg.connect(request.getfixturevalue("pg_dsn"), autocommit=True) as conn:
            (data,) = conn.execute(f"SELECT {column} FROM lgfs_{table} WHERE {where}").fetchone()
            flipped = bytes([data[0] ^ 4]) + bytes(data[1:])
            conn.execute(f"UPDATE lgfs_{table} SET {column} = %s WHERE {where}", (flipped,))
        return
    conn = sqlite3.connect(request.getfixturevalue("db_path"))
    try:
        (data,) = conn.execute(f"SELECT {column} FROM {table} WHERE {where}").fetchone()
        flipped = bytes([data[0] ^ 4]) + bytes(data[1:])
        conn.execute(f"UPDATE {table} SET {column} = ? WHERE {where}", (flipped,))
        conn.commit()
    finally:
        conn.close()


def test_a_damaged_checkpoint_is_undecodable_in_history_and_shown_with_its_error(
    either_store: Any, request: Any
) -> None:
    """One flipped bit in a checkpoint's values: `history` raises naming it, the views show it."""
    ids = _chain(either_store, "t", 3)
    _damage(either_store, request, "checkpoints", "values_blob", f"checkpoint_id = '{ids[1]}'")
    with pytest.raises(UndecodableRow) as caught:
        either_store.history("t")
    assert (caught.value.thread_id, caught.value.checkpoint_id) == ("t", ids[1])
    assert [t.checkpoint["id"] for t in either_store.history("t", before=ids[1])] == [ids[0]]
    records = either_store.history_records("t")
    assert ["error" in r for r in records] == [False, True, False]  # only a damaged one has it
    assert records[1]["error"]["code"] == "undecodable_row" and "step" not in records[1]
    shown = either_store.inspect_checkpoint("t", checkpoint_id=ids[1])
    assert shown["error"]["code"] == "undecodable_row"
    assert shown["checkpoint"] is None and shown["metadata"] is None
    diff = either_store.diff_checkpoints("t", to_id=ids[2])
    assert [e["checkpoint_id"] for e in diff.errors] == [ids[1]]


def test_a_damaged_write_is_shown_with_its_error_and_the_others_decode(
    either_store: Any, request: Any
) -> None:
    """One flipped bit in a pending write: `inspect_checkpoint` shows that one's error only."""
    (cid,) = _chain(either_store, "t", 1)
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": cid}}
    either_store.put_writes(config, [("chan", {"v": "éé" * 20}), ("other", b"raw")], "task")
    _damage(either_store, request, "writes", "blob", "channel = 'chan'")
    shown = either_store.inspect_checkpoint("t")
    by_channel = {w["channel"]: w for w in shown["writes"]}
    assert by_channel["chan"]["value"] is None
    assert by_channel["chan"]["error"]["code"] == "undecodable_row"
    assert (by_channel["other"]["value"], by_channel["other"]["error"]) == (b"raw", None)
    assert shown["error"] is None and shown["checkpoint"]["id"] == cid
    with pytest.raises(UndecodableRow):
        either_store.history("t")


def test_a_history_page_and_its_writes_are_of_one_snapshot(open_pg: Any) -> None:
    """While another connection commits, a page never shows a write made after the page.

    The writer puts c(k), then writes to c(k-1): in any one moment the
    latest checkpoint has no write yet. The page and its writes are two
    statements; under READ COMMITTED a commit between them would give the
    page's latest the write made after it stopped being the latest.
    """
    reader, writer = open_pg(), open_pg()
    stop = threading.Event()
    _chain(writer, "t", 1)
    steps: list[int] = []

    def write() -> None:
        step = 1
        while not stop.is_set():
            cp = empty_checkpoint()
            cp["id"] = f"c{step:05d}"
            older = {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": f"c{step - 1:05d}"}
            writer.put({"configurable": older}, cp, {"source": "loop", "step": step}, {})
            writer.put_writes({"configurable": older}, [("late", step)], "late")
            step += 1
        steps.append(step)

    thread = threading.Thread(target=write)
    thread.start()
    try:
        for _ in range(1500):
            page = reader.history("t", limit=2)
            assert page[0].pending_writes == [], [t.checkpoint["id"] for t in page]
    finally:
        stop.set()
        thread.join()
    assert steps[0] > 20  # the writer did commit meanwhile


def test_postgres_builds_on_the_shared_read_mixins_never_on_sqlite() -> None:
    """The PostgreSQL saver inherits only the store-neutral methods of `core/`'s read mixins.

    `InspectionBase`/`ThreadsBase` (core/) hold the methods that never touch
    the store; each store implements the rest. A method added there later
    that reads a store would otherwise be inherited as it is, and fail on
    PostgreSQL with an AttributeError instead of being missing; and nothing
    of `sqlite/` may be in the PostgreSQL saver's bases.
    """
    from langgraph_fenced_sqlite.core.saver_inspect import InspectionBase
    from langgraph_fenced_sqlite.core.saver_threads import ThreadsBase
    from langgraph_fenced_sqlite.postgres import FencedPostgresSaver
    from langgraph_fenced_sqlite.postgres import saver_inspect as pg_inspect
    from langgraph_fenced_sqlite.postgres import saver_threads as pg_threads

    for shared, neutral in (
        (InspectionBase, pg_inspect.STORE_NEUTRAL),
        (ThreadsBase, pg_threads.STORE_NEUTRAL),
    ):
        methods = [n for n, v in vars(shared).items() if not n.startswith("__") and callable(v)]
        assert set(neutral) <= set(methods), shared
        for name in methods:
            inherited = getattr(FencedPostgresSaver, name) is getattr(shared, name)
            assert inherited == (name in neutral), (shared.__name__, name)
    sqlite_bases = [
        c
        for c in FencedPostgresSaver.__mro__
        if c.__module__.startswith("langgraph_fenced_sqlite.sqlite")
    ]
    assert sqlite_bases == []
