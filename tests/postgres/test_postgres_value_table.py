"""The value table on PostgreSQL (postgres/values.py): what only this store has to show.

A read of a checkpoint this process holds sends no value row, and reads
them again when what it holds changed meanwhile; a read never fails while
removals free value rows; copies carry them, between stores too; a
database set up before migration 11 migrates and goes on; a status that
decodes values reads them in its snapshot. The cases both stores share
are in test_postgres_values.py.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from support.chats import Note, chat, chat_graph, history
from support.configs import config, saver_config
from support.graphs import build_agent, same_ids
from support.postgres import exactly_what_is_needed, put_inline, rows, values_types

from langgraph_fenced_sqlite import FencedSqliteSaver
from langgraph_fenced_sqlite.core import values
from langgraph_fenced_sqlite.postgres import FencedPostgresSaver, sql
from langgraph_fenced_sqlite.postgres import saver as pg_saver
from langgraph_fenced_sqlite.testing.postgres_server import round_trips
from langgraph_fenced_sqlite.transfer import copy_threads


def test_a_held_checkpoint_is_read_in_one_round_trip_without_its_value_rows(
    open_pg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[int] = []
    real = pg_saver.resolved_from

    def counting(rows: Any, blobs: Any, **kw: Any) -> Any:
        sent.append(len(blobs))
        return real(rows, blobs, **kw)

    monkeypatch.setattr(pg_saver, "resolved_from", counting)
    saver = open_pg(allowed_types=[Note])
    chat(chat_graph(saver), "t", 3)
    conn = saver._engine._conn
    got: list[Any] = []
    sent.clear()
    assert round_trips(conn, lambda: got.append(saver.get_tuple(saver_config("t")))) == 1
    assert sent == [0]  # held here: no value row sent
    fresh = open_pg(allowed_types=[Note])
    sent.clear()
    assert (
        round_trips(fresh._engine._conn, lambda: got.append(fresh.get_tuple(saver_config("t"))))
        == 1
    )
    assert sent[0] > 0 and got[0] == got[1]
    sent.clear()
    assert round_trips(fresh._engine._conn, lambda: fresh.get_tuple(saver_config("t"))) == 1
    assert sent == [0]  # now held by the fresh saver too
    # The held entry is gone by the time the statement's rows are resolved
    # (another put of this process replaced it): read again, with the rows.
    monkeypatch.setattr(fresh._value_cache, "get", lambda *a: None)
    sent.clear()
    again = fresh.get_tuple(saver_config("t"))
    assert again == got[0] and sent[0] == 0 and sent[1] > 0


def test_a_read_never_fails_while_removals_free_value_rows(open_pg: Any) -> None:
    """A writer puts and prunes (freeing rows) while readers that hold nothing read."""
    writer = open_pg(allowed_types=[Note])
    graph = chat_graph(writer)
    chat(graph, "t", 2)
    stop = threading.Event()
    errors: list[BaseException] = []

    def read(reader: Any) -> None:
        try:
            while not stop.is_set():
                reader._value_cache = values.ValueCache()  # holds nothing: value rows read
                assert reader.get_tuple(saver_config("t")) is not None
                assert list(reader.list(saver_config("t"), limit=3))
                reader.history("t", limit=3)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    readers = [
        threading.Thread(target=read, args=(open_pg(allowed_types=[Note]),)) for _ in range(2)
    ]
    for r in readers:
        r.start()
    try:
        for i in range(2, 14):
            chat(graph, "t", 1, start=i)
            writer.prune(["t"], strategy="keep_latest")
            token = writer.claim("t", "me", 60).token
            writer.retract_turn("t", token)
            writer.release("t", token)
    finally:
        stop.set()
        for r in readers:
            r.join()
    assert not errors, errors[0]


def test_copy_thread_and_copy_to_carry_the_value_rows(
    open_pg: Any, pg_dsn: str, tmp_path: Any
) -> None:
    saver = open_pg(allowed_types=[Note])
    chat(chat_graph(saver), "t", 5)
    expected = history(chat_graph(saver), "t")
    saver.copy_thread("t", "copy")
    saver.delete_thread("t")  # the copy's rows are its own
    exactly_what_is_needed(pg_dsn, "copy")
    assert history(chat_graph(open_pg(allowed_types=[Note])), "copy") == expected
    path = str(tmp_path / "f.db")
    with FencedSqliteSaver(path, allowed_types=[Note]) as file:
        copy_threads(saver, file)
        assert history(chat_graph(file), "copy") == expected
        target = open_pg(allowed_types=[Note])
        target.delete_thread("copy")
        copy_threads(file, target)
    assert history(chat_graph(open_pg(allowed_types=[Note])), "copy") == expected
    exactly_what_is_needed(pg_dsn, "copy")


def test_a_database_set_up_before_the_value_table_migrates_and_goes_on(pg_dsn: str) -> None:
    """At version 11, rows hold values inline; setup() adds the table, the old rows read as
    before, the thread goes on in the new layout, and repack moves the old ones."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for v in range(11):
            conn.execute(sql.MIGRATIONS[v], prepare=False)
        conn.execute("INSERT INTO lgfs_migrations (v) SELECT generate_series(2, 11)")
    memory = chat_graph(InMemorySaver())
    chat(memory, "t", 3)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        saver = FencedPostgresSaver(conn, allowed_types=[Note])  # at version 11
        parent = None
        for tup in reversed(list(memory.checkpointer.list(config("t")))):
            conf = saver_config("t", checkpoint_id=parent)
            put_inline(saver, conf, tup.checkpoint, tup.metadata)
            parent = tup.checkpoint["id"]
        put_inline(saver, saver_config("u"), tup.checkpoint, {**tup.metadata, "user": "ann"})
        saver.setup()
        assert saver.stats()["schema_version"] == sql.SCHEMA_VERSION == 15
        # Migration 12 indexed the latest root metadata of what was there.
        tagged = "SELECT thread_id, value FROM lgfs_thread_tags WHERE key = 'user'"
        assert rows(pg_dsn, tagged) == [("u", "ann")]
        assert [t["thread_id"] for t in saver.search_threads(metadata={"user": "ann"})] == ["u"]
        assert history(chat_graph(saver), "t") == history(memory, "t")
        for graph in (memory, chat_graph(saver)):
            chat(graph, "t", 2, start=3)
        assert values_types(pg_dsn) == {"msgpack", values.REFS}
        assert history(chat_graph(saver), "t") == history(memory, "t")
        assert saver.repack().checkpoints == 10  # t's nine and u's one
        assert values_types(pg_dsn) == {values.REFS}
        assert history(chat_graph(saver), "t") == history(memory, "t")
        exactly_what_is_needed(pg_dsn)


@pytest.mark.parametrize("sealed", [False, True], ids=["clear", "encrypted"])
def test_a_status_names_the_node_of_a_waiting_send_task_from_its_values(
    open_store: Any, open_pg: Any, sealed: bool
) -> None:
    """The one status that decodes values (a `Send` task's interrupt): as the SQLite store's,
    with values in clear or sealed (the status reads them with the store's key)."""
    from langgraph_fenced_sqlite import Encryption

    options = {"encryption": Encryption(b"k" * 32)} if sealed else {}
    got = []
    for saver in (open_store(**options), open_pg(**options)):
        graph = build_agent(saver)
        graph.invoke(
            {"messages": [HumanMessage("weather?")], "mode": "approve-cities"}, config("chat-2")
        )
        chat(chat_graph(saver), "other", 1)  # a thread whose values no status decodes
        status = saver.thread_status("chat-2")
        assert status is not None and status.state == "interrupted"
        statuses = {t["thread_id"]: t["status"] for t in saver.threads()}
        got.append(same_ids((status.to_dict(), statuses)))
    assert got[0] == got[1]
    assert [w["node"] for w in got[1][0]["waiting"]] == ["worker"]


def test_inline_rows_in_clear_are_sealed_by_rekey_then_repacked_sealed(
    open_pg: Any, pg_dsn: str
) -> None:
    """As on a file: read while migrating, sealed inline by rekey, repacked sealed."""
    from langgraph_fenced_sqlite import Encryption, UndecodableRow

    key = b"k" * 32
    memory = chat_graph(InMemorySaver())
    chat(memory, "t", 3)
    expected = history(memory, "t")
    plain = open_pg(allowed_types=[Note])
    parent = None
    for tup in reversed(list(memory.checkpointer.list(config("t")))):
        put_inline(plain, saver_config("t", checkpoint_id=parent), tup.checkpoint, tup.metadata)
        parent = tup.checkpoint["id"]
    assert values_types(pg_dsn) == {"msgpack"}
    sealed = open_pg(allowed_types=[Note], encryption=Encryption(key))
    with pytest.raises(UndecodableRow, match="in clear is refused"):
        history(chat_graph(sealed), "t")
    migrating = open_pg(allowed_types=[Note], encryption=Encryption(key, accept_plaintext=True))
    assert history(chat_graph(migrating), "t") == expected
    report = migrating.rekey()
    assert report.threads == ["t"] and not report.skipped, report
    assert all(t.endswith("+aes") for t in values_types(pg_dsn))
    assert history(chat_graph(sealed), "t") == expected
    assert sealed.repack().checkpoints == len(expected)
    assert values_types(pg_dsn) == {values.REFS}
    assert history(chat_graph(open_pg(allowed_types=[Note], encryption=Encryption(key))), "t") == (
        expected
    )
    assert sealed.cell_keys().clear == 0
