"""Channel values stored once each, lists as what they gained (core/values.py), on PostgreSQL.

The SQLite store's tests/sqlite/test_values.py, against the suite's server:
the same chats read back as `InMemorySaver` holds them, each element is
stored about once, every removal frees what only removed checkpoints
named (and no more), damage is refused, older rows read as before and
`repack` moves them. What only this store has to show is in
test_postgres_value_table.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import struct
from typing import Any

import psycopg
import pytest
from langchain_core.messages import HumanMessage, RemoveMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver
from support.chats import Note, achat, chat, chat_graph, history, text
from support.configs import config, saver_config
from support.postgres import (
    as_url,
    blob_rows,
    dump_tables,
    exactly_what_is_needed,
    make_inline,
    refs_of,
    rows,
    values_types,
)
from support.processes import lgfs

from langgraph_fenced_sqlite import RetentionPolicy, UndecodableRow
from langgraph_fenced_sqlite.core import values
from langgraph_fenced_sqlite.core.checksums import blob_checksum, write_checksum
from langgraph_fenced_sqlite.core.serde import DataOnlySerializer
from langgraph_fenced_sqlite.tools.doctor import diagnose_pg
from langgraph_fenced_sqlite.tools.importer import import_sqlitesaver


def test_every_checkpoint_of_a_long_chat_reads_back_as_in_memory(open_pg: Any, pg_dsn: str) -> None:
    """Each checkpoint of the history equals InMemorySaver's, here, in a fresh saver, and async."""
    memory = chat_graph(InMemorySaver())
    chat(memory, "t", 40)
    expected = history(memory, "t")
    ours = chat_graph(open_pg(allowed_types=[Note]))
    chat(ours, "t", 40)
    assert history(ours, "t") == expected
    fresh = chat_graph(open_pg(allowed_types=[Note]))  # nothing held
    assert history(fresh, "t") == expected
    assert values_types(pg_dsn) == {values.REFS}
    assert any(base is not None for _, _, base, _, _ in blob_rows(pg_dsn))

    async def through_async() -> list[Any]:
        again = chat_graph(open_pg(allowed_types=[Note]))
        await achat(again, "a", 5)
        config = {"configurable": {"thread_id": "t"}}
        return [
            (s.values, s.next, s.metadata["step"]) async for s in again.aget_state_history(config)
        ]

    assert asyncio.run(through_async()) == expected
    memory_a = chat_graph(InMemorySaver())
    chat(memory_a, "a", 5)
    assert history(fresh, "a") == history(memory_a, "a")


def test_a_list_is_stored_as_what_it_gained_and_a_read_follows_a_bounded_chain(
    open_pg: Any, pg_dsn: str
) -> None:
    chat(chat_graph(open_pg(allowed_types=[Note])), "t", 150)  # 300 versions: past SPAN**2
    held = {(c, k): (base, ordinal, size) for c, k, base, ordinal, size in blob_rows(pg_dsn)}
    longest = 0
    for (channel, key), _ in held.items():
        hops, at = 0, key
        while at is not None:
            hops += 1
            at = held[(channel, at)][0]
        longest = max(longest, hops)
    assert longest <= (values.SPAN - 1) * values.LEVELS + 2  # + the prefix's hop
    assert [k for c, k in held if c == "branch:to:reply"] == ["=null.-1."]
    messages = {k: size for (c, k), (_, _, size) in held.items() if c == "messages"}
    final = max(struct.unpack(">III", base64.urlsafe_b64decode(k))[1] for k in messages)
    assert sum(messages.values()) <= 1.5 * final
    # Single extensions before the last merged row hold no bytes of their own:
    # prefixes of it, or borrow rows (the chat's messages, each named where
    # its input or its node's write holds it).
    merged = rows(
        pg_dsn,
        "SELECT max(ordinal) FROM lgfs_blobs WHERE channel = 'messages' AND ordinal %% %s = 0",
        values.SPAN,
    )[0][0]
    holding = rows(
        pg_dsn,
        "SELECT codec, count(*) FROM lgfs_blobs WHERE channel = 'messages' AND base IS NOT NULL "
        "AND ordinal %% %s <> 0 AND ordinal < %s GROUP BY codec ORDER BY codec",
        values.SPAN,
        merged,
    )
    assert merged >= values.SPAN and holding and all(c in ("borrow", "prefix") for c, _ in holding)


def test_a_put_proves_only_what_the_step_added(
    open_pg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    proven: list[int] = []
    real = DataOnlySerializer.prove

    def counting(self: DataOnlySerializer, obj: Any, data: bytes) -> None:
        proven.append(len(data))
        real(self, obj, data)

    monkeypatch.setattr(DataOnlySerializer, "prove", counting)
    graph = chat_graph(open_pg(allowed_types=[Note]))
    chat(graph, "t", 5)
    early = sum(proven)
    chat(graph, "t", 60, start=5)
    proven.clear()
    chat(graph, "t", 5, start=65)
    assert sum(proven) < 2 * early


def test_a_rewritten_list_is_stored_whole_and_reads_back(open_pg: Any) -> None:
    """A RemoveMessage (update_state), then a fork from an old checkpoint: both read back."""
    saver = open_pg(allowed_types=[Note])
    memory = chat_graph(InMemorySaver())
    for graph in (memory, chat_graph(saver)):
        chat(graph, "t", 6)
        conf = {"configurable": {"thread_id": "t"}}
        graph.update_state(conf, {"messages": [RemoveMessage(id="h-2")]})
        old = list(graph.get_state_history(conf))[-4].config
        graph.update_state(old, {"messages": [HumanMessage("fork", id="f")]})
        chat(graph, "t", 2, start=100)
    assert history(chat_graph(saver), "t") == history(memory, "t")
    assert history(chat_graph(open_pg(allowed_types=[Note])), "t") == history(memory, "t")


def test_every_removal_frees_the_values_only_removed_checkpoints_named(
    open_pg: Any, pg_dsn: str
) -> None:
    """keep_latest, a policy, a sweep, a retraction, delete_for_runs, delete: none leaves a
    row no checkpoint needs, none removes one a kept checkpoint needs."""
    saver = open_pg(allowed_types=[Note])
    graph = chat_graph(saver)
    latest = lambda t: graph.get_state({"configurable": {"thread_id": t}}).values  # noqa: E731
    chat(graph, "t", 30)
    chat(graph, "u", 3)
    before = exactly_what_is_needed(pg_dsn)
    kept = latest("t")
    saver.prune(["t"], strategy=RetentionPolicy(max_checkpoints=40))
    mid = exactly_what_is_needed(pg_dsn)
    assert 0 < mid < before and latest("t") == kept
    saver.prune(["t"], strategy="keep_latest")
    after = exactly_what_is_needed(pg_dsn)
    assert 0 < after < mid and latest("t") == kept
    chat(graph, "t", 4, start=30)  # the chain goes on from what was kept
    saver.sweep(RetentionPolicy(max_checkpoints=3))
    exactly_what_is_needed(pg_dsn)
    for i in range(2):
        graph.invoke(
            {"messages": [HumanMessage(f"run {i}", id=f"r-{i}")]},
            config("t", run_id=f"run-{i}"),
            durability="sync",
        )
    kept = latest("t")
    token = saver.claim("t", "me", 60).token
    retracted = saver.retract_turn("t", token, run_id="run-1")
    assert retracted.checkpoints and latest("t") != kept
    saver.release("t", token)
    exactly_what_is_needed(pg_dsn)
    kept = latest("t")
    saver.delete_for_runs(["run-0"])
    exactly_what_is_needed(pg_dsn)
    assert latest("t")["messages"] != kept["messages"]
    chat(graph, "t", 2, start=40)
    fresh = chat_graph(open_pg(allowed_types=[Note]))
    assert history(fresh, "t") == history(graph, "t")
    saver.prune(["u"], strategy="delete")
    assert blob_rows(pg_dsn, "u") == []
    saver.delete_thread("t")
    assert blob_rows(pg_dsn) == []


def test_a_dry_run_frees_nothing(open_pg: Any, pg_dsn: str) -> None:
    saver = open_pg(allowed_types=[Note])
    chat(chat_graph(saver), "t", 5)
    before = dump_tables(pg_dsn)
    saver.prune(["t"], strategy="keep_latest", dry_run=True)
    saver.prune(["t"], strategy=RetentionPolicy(max_checkpoints=1), dry_run=True)
    assert dump_tables(pg_dsn) == before


def _seal_blobs(dsn: str) -> None:
    # A forger who knows the format: every value row gets a valid checksum again.
    with psycopg.connect(dsn, autocommit=True) as conn:
        for row in conn.execute(
            "SELECT thread_id, checkpoint_ns, channel, key, base, type, items, ordinal, codec, "
            "size, data FROM lgfs_blobs"
        ).fetchall():
            conn.execute(
                "UPDATE lgfs_blobs SET checksum = %s WHERE thread_id = %s AND checkpoint_ns = %s "
                "AND channel = %s AND key = %s",
                (blob_checksum(*row[2:]), *row[:4]),
            )


def test_a_damaged_or_forged_value_row_is_undecodable(open_pg: Any, pg_dsn: str) -> None:
    chat(chat_graph(open_pg(allowed_types=[Note])), "t", 3)
    for sealed in (False, True):
        rows(
            pg_dsn,
            "UPDATE lgfs_blobs SET data = data || '\\x00'::bytea "
            "WHERE channel = 'messages' RETURNING 1",
        )
        if sealed:  # a forged row with a valid checksum: its key still refuses it
            _seal_blobs(pg_dsn)
        saver = open_pg(allowed_types=[Note])
        with pytest.raises(UndecodableRow, match="messages"):
            saver.get_tuple(saver_config("t"))
        with pytest.raises(UndecodableRow, match="messages"):
            list(saver.list(saver_config("t")))
        with pytest.raises(UndecodableRow, match="messages"):
            asyncio.run(saver.aget_tuple(saver_config("t")))
        # A display read goes on past it, naming what is wrong.
        with pytest.raises(UndecodableRow, match="channel 'messages'"):
            saver.history("t")
        shown = saver.inspect_checkpoint("t")
        assert shown is not None and "channel 'messages'" in shown["error"]["message"]
        found = diagnose_pg(saver)
        assert not found.ok and any("channel 'messages'" in p for p in found.problems)


def test_a_missing_value_row_is_undecodable_and_a_damaged_refs_cell_frees_nothing(
    open_pg: Any, pg_dsn: str
) -> None:
    saver = open_pg(allowed_types=[Note])
    chat(chat_graph(saver), "t", 4)
    count = len(blob_rows(pg_dsn))
    cid, parent = rows(
        pg_dsn,
        "SELECT checkpoint_id, parent_checkpoint_id FROM lgfs_checkpoints "
        "ORDER BY position DESC LIMIT 1",
    )[0]
    # The latest's refs cell is not JSON now (its checksum no longer holds):
    # that checkpoint is damaged, and a collection cannot tell what it named.
    rows(
        pg_dsn,
        "UPDATE lgfs_checkpoints SET values_blob = '\\xff'::bytea WHERE checkpoint_id = %s "
        "RETURNING 1",
        cid,
    )
    saver.prune(["t"], strategy=RetentionPolicy(max_checkpoints=5))
    assert len(blob_rows(pg_dsn)) == count  # nothing freed while a refs cell is damaged
    with pytest.raises(UndecodableRow, match="checksum"):
        saver.get_tuple(saver_config("t"))
    assert saver.get_tuple(saver_config("t", checkpoint_id=parent)) is not None
    rows(pg_dsn, "DELETE FROM lgfs_blobs WHERE channel = 'notes' RETURNING 1")
    fresh = open_pg(allowed_types=[Note])
    with pytest.raises(UndecodableRow, match="channel 'notes'.*missing"):
        fresh.get_tuple(saver_config("t", checkpoint_id=parent))


def test_a_parent_replaced_since_it_was_read_is_not_named(open_pg: Any) -> None:
    """Another saver deletes the thread and writes it again: this one's next put stores whole."""
    for api in ("sync", "async"):
        a, b = open_pg(allowed_types=[Note]), open_pg(allowed_types=[Note])
        thread = f"t-{api}"
        chat(chat_graph(a), thread, 3)
        conf = chat_graph(a).get_state({"configurable": {"thread_id": thread}}).config
        tup = a.get_tuple(conf)
        b.delete_thread(thread)
        checkpoint = {**tup.checkpoint, "channel_values": {"messages": [], "notes": []}}
        b.put(saver_config(thread), checkpoint, tup.metadata, {})
        child = {**checkpoint, "id": f"1f000000-0000-6000-8000-00000000000{len(api)}"}
        child["channel_values"] = {**tup.checkpoint["channel_values"]}
        metadata = {"source": "update", "step": 99}
        if api == "sync":
            a.put(conf, child, metadata, {})
        else:
            asyncio.run(a.aput(conf, child, metadata, {}))
        got = b.get_tuple(saver_config(thread, checkpoint_id=child["id"]))
        assert got.checkpoint["channel_values"] == tup.checkpoint["channel_values"]
        assert chat_graph(b).get_state({"configurable": {"thread_id": thread}}).values


def test_a_large_write_is_stored_compressed_and_reads_back(open_pg: Any, pg_dsn: str) -> None:
    saver = open_pg()
    cp = {
        "v": 4,
        "id": "1f000000-0000-6000-8000-000000000002",
        "ts": "",
        "channel_values": {},
        "channel_versions": {},
        "versions_seen": {},
        "updated_channels": None,
    }
    conf = saver.put(saver_config("t"), cp, {}, {})
    long = text(random.Random(1), 400)
    saver.put_writes(conf, [("c", long), ("d", "short")], "task")
    assert dict(rows(pg_dsn, "SELECT channel, type FROM lgfs_writes")) == {
        "c": "zstd+msgpack",
        "d": "msgpack",
    }
    assert saver.get_tuple(conf).pending_writes == [("task", "c", long), ("task", "d", "short")]
    rows(
        pg_dsn, "UPDATE lgfs_writes SET blob = substr(blob, 1, 20) WHERE channel = 'c' RETURNING 1"
    )
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for ch, type_, blob in conn.execute("SELECT channel, type, blob FROM lgfs_writes"):
            conn.execute(
                "UPDATE lgfs_writes SET checksum = %s WHERE channel = %s",
                (write_checksum(ch, type_, bytes(blob)), ch),
            )
    with pytest.raises(UndecodableRow, match="zstd"):
        open_pg().get_tuple(conf)


def test_repack_moves_older_rows_into_the_value_table_and_reads_back_the_same(
    open_pg: Any, pg_dsn: str
) -> None:
    saver = open_pg(allowed_types=[Note])
    chat(chat_graph(saver), "t", 30)
    chat(chat_graph(saver), "u", 2)
    expected = {t: history(chat_graph(saver), t) for t in ("t", "u")}
    make_inline(pg_dsn)
    assert values_types(pg_dsn) == {"msgpack"}
    saver = open_pg(allowed_types=[Note])
    assert {t: history(chat_graph(saver), t) for t in ("t", "u")} == expected  # read as before
    before = dump_tables(pg_dsn)
    plan = saver.repack(dry_run=True)
    assert dump_tables(pg_dsn) == before  # a dry run writes nothing
    assert plan.threads == ["t", "u"] and plan.checkpoints == 96 and not plan.skipped
    assert plan.stored_bytes < plan.inline_bytes / 5
    done = saver.repack()
    assert (done.threads, done.checkpoints, done.stored_bytes) == (
        plan.threads,
        plan.checkpoints,
        plan.stored_bytes,
    )
    assert values_types(pg_dsn) == {values.REFS}
    assert {t: history(chat_graph(saver), t) for t in ("t", "u")} == expected
    exactly_what_is_needed(pg_dsn, "t")
    assert saver.repack().checkpoints == 0  # nothing left to move
    chat(chat_graph(saver), "t", 2, start=30)  # and the chain goes on
    fresh = open_pg(allowed_types=[Note])
    assert history(chat_graph(fresh), "u") == expected["u"]
    assert asyncio.run(fresh.arepack(dry_run=True)).checkpoints == 0


def test_repack_leaves_a_row_it_cannot_decode_and_says_so(open_pg: Any, pg_dsn: str) -> None:
    chat(chat_graph(open_pg(allowed_types=[Note])), "t", 2)
    make_inline(pg_dsn)
    url = as_url(pg_dsn)
    dry = lgfs("repack", "--db", url, "--dry-run", "--json")  # the CLI does not allow `Note`
    assert dry.returncode == 1, dry.stderr
    assert json.loads(dry.stdout)["dry_run"] is True and values_types(pg_dsn) == {"msgpack"}
    result = lgfs("repack", "--db", url, "--json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["checkpoints"] == 2  # the two input checkpoints hold no Note yet
    assert {s["reason"].split(";")[0] for s in report["skipped"]} == {
        f"type {Note.__module__}.Note is not allowed"
    }
    assert values_types(pg_dsn) == {"msgpack", values.REFS}
    saver = open_pg(allowed_types=[Note])
    assert len(history(chat_graph(saver), "t")) == 6
    assert saver.repack().checkpoints == 4
    assert values_types(pg_dsn) == {values.REFS}


def test_importing_a_stock_file_writes_the_value_table(
    tmp_path: Any, open_pg: Any, pg_dsn: str
) -> None:
    source = str(tmp_path / "stock.db")
    with SqliteSaver.from_conn_string(source) as stock:
        stock.serde = JsonPlusSerializer(allowed_msgpack_modules=[Note])
        graph = chat_graph(stock)
        chat(graph, "t", 20)
        expected = history(graph, "t")
    fenced = open_pg(allowed_types=[Note])
    import_sqlitesaver(source, fenced)
    assert history(chat_graph(fenced), "t") == expected
    assert values_types(pg_dsn) == {values.REFS}
    exactly_what_is_needed(pg_dsn)


def test_a_put_whose_parent_another_saver_wrote_stores_only_what_it_adds(
    open_pg: Any, pg_dsn: str
) -> None:
    """With nothing held for the parent, the put reads the parent's values first (sync, async)."""
    a = open_pg(allowed_types=[Note])
    chat(chat_graph(a), "t", 5)
    for i, api in enumerate(("sync", "async")):
        b = open_pg(allowed_types=[Note])
        latest = a.get_tuple(saver_config("t"))
        messages = [*latest.checkpoint["channel_values"]["messages"], HumanMessage("m", id=api)]
        child = {
            **latest.checkpoint,
            "id": f"1f000000-0000-6000-8000-00000000001{i}",
            "channel_values": {**latest.checkpoint["channel_values"], "messages": messages},
        }
        metadata = {"source": "update", "step": 99 + i}
        if api == "sync":
            conf = b.put(latest.config, child, metadata, {})
        else:

            def blocking(*_: Any) -> None:
                raise AssertionError("aput read its parent with a blocking call")

            b._learn_values = blocking
            conf = asyncio.run(b.aput(latest.config, child, metadata, {}))
        got = a.get_tuple(conf)
        assert got.checkpoint["channel_values"]["messages"] == messages
        key = refs_of(pg_dsn, child["id"])["messages"]
        ((base, size),) = rows(
            pg_dsn,
            "SELECT base, size FROM lgfs_blobs WHERE channel = 'messages' AND key = %s",
            key,
        )
        assert base is not None and size < 200  # the one new message, not the whole list


def _borrows(
    dsn: str, thread: str = "t", *, lent: bool = False
) -> list[tuple[str, dict[str, Any]]]:
    # Each borrow row's channel and cell: those naming another channel's row,
    # or (`lent`) those naming a pending write (`values.LENT`).
    cells = [
        (channel, json.loads(bytes(data)))
        for channel, data in rows(
            dsn,
            "SELECT channel, data FROM lgfs_blobs WHERE thread_id = %s AND codec = 'borrow'",
            thread,
        )
    ]
    return [(channel, cell) for channel, cell in cells if ("w" in cell) == lent]


def test_a_message_its_input_holds_is_stored_once_and_reads_back(open_pg: Any, pg_dsn: str) -> None:
    """Each human message the list gains names the bytes its input's `__start__` row holds.

    Read back equal from a fresh saver, and still after keep_latest removed
    the input checkpoints whose rows the kept one reads through.
    """
    memory = chat_graph(InMemorySaver())
    chat(memory, "t", 20)
    chat(chat_graph(open_pg(allowed_types=[Note])), "t", 20)
    borrows = _borrows(pg_dsn)
    # Turn 0's message starts the list (stored whole); turns 1-19 borrow theirs.
    assert len(borrows) == 19 and all(
        channel == "messages" and cell["c"] == "__start__" for channel, cell in borrows
    ), borrows
    # Replies name the reply node's pending write (`exactly_what_is_needed`
    # checks each such write is there, before and after every removal). Not
    # every one: under CPU load a write can commit after its step's put, which
    # then stores the bytes itself; contract case 28 pins the naming itself.
    assert _borrows(pg_dsn, lent=True)
    exactly_what_is_needed(pg_dsn)
    fresh = open_pg(allowed_types=[Note])  # nothing cached
    assert history(chat_graph(fresh), "t") == history(memory, "t")
    latest = chat_graph(fresh).get_state({"configurable": {"thread_id": "t"}}).values
    fresh.prune(["t"], strategy="keep_latest")
    exactly_what_is_needed(pg_dsn)
    graph = chat_graph(open_pg(allowed_types=[Note]))
    assert graph.get_state({"configurable": {"thread_id": "t"}}).values == latest
    chat(graph, "t", 50, start=20)  # past a merged row: borrow rows stay as they are
    fresh.prune(["t"], strategy="keep_latest")
    exactly_what_is_needed(pg_dsn)
    starts = rows(
        pg_dsn, "SELECT key FROM lgfs_blobs WHERE thread_id = 't' AND channel = '__start__'"
    )
    # Only the inputs the kept list still reads through are left.
    assert len(starts) == len(_borrows(pg_dsn)) < 50, (len(starts), len(_borrows(pg_dsn)))
