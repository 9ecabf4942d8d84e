"""`FencedPostgresSaver.vacuum`: a plain VACUUM (ANALYZE) of the store's tables, never FULL.

What a user relies on: every table of the store is vacuumed (and only its
own, in its schema), the report's sizes are the tables' real sizes, the space
a deletion emptied at a table's end goes back, and a writer in the middle of
a transaction is not waited for (VACUUM FULL would wait for it, then lock
everyone out while it rewrites).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool
from support.configs import saver_config
from support.puts import new_checkpoint, put

from langgraph_fenced_sqlite import InvalidArgument, ReadOnlyStore, StoreError
from langgraph_fenced_sqlite.core.maintenance import VacuumReport
from langgraph_fenced_sqlite.postgres import FencedPostgresSaver, sql


def _put_blob(saver: Any, thread_id: str, value: Any) -> None:
    """Put a checkpoint whose one channel, `blob`, holds `value` (versioned: stored apart)."""
    blob = new_checkpoint({"blob": value}, channel_versions={"blob": 1})
    put(saver, thread_id, checkpoint=blob, source="update", new_versions={"blob": 1})


def _vacuums(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """How often each of the store's tables (in this search_path's schema) was vacuumed."""
    rows = conn.execute(
        "SELECT relname, vacuum_count FROM pg_stat_user_tables "
        "WHERE relid = ANY(SELECT to_regclass(t) FROM unnest(%s::text[]) AS t)",
        (list(sql.TABLES),),
    ).fetchall()
    return {name: int(n) for name, n in rows}


def _size(conn: psycopg.Connection[Any]) -> int:
    return int(conn.execute(sql.STORE_BYTES, {"tables": list(sql.TABLES)}).fetchone()[0])  # type: ignore[index]


def test_vacuum_vacuums_each_table_of_the_store_and_reports_their_sizes(
    pg_dsn: str, pg_server: Any
) -> None:
    """Each of the store's tables is vacuumed once per call (sync and async), none elsewhere.

    The first vacuum of a new store may report it larger than before: it
    creates each table's free-space and visibility maps (pinned: the report
    is the tables' real size, not a promise that it shrinks).
    """
    other = pg_server.fresh_dsn()  # another store in another schema: left alone
    with (
        FencedPostgresSaver.from_conn_string(pg_dsn) as saver,
        FencedPostgresSaver.from_conn_string(other) as neighbour,
        psycopg.connect(pg_dsn, autocommit=True) as conn,
        psycopg.connect(other, autocommit=True) as conn_other,
    ):
        saver.setup()
        neighbour.setup()
        _put_blob(saver, "t", "x")
        before = _size(conn)
        report = saver.vacuum()
        assert isinstance(report, VacuumReport) and report.path == saver.path
        assert (report.bytes_before, report.bytes_after) == (before, _size(conn))
        assert _vacuums(conn) == dict.fromkeys(sql.TABLES, 1)
        again = asyncio.run(saver.avacuum(force=True))  # `force` changes nothing here
        assert again.bytes_before == report.bytes_after
        assert _vacuums(conn) == dict.fromkeys(sql.TABLES, 2)
        assert _vacuums(conn_other) == dict.fromkeys(sql.TABLES, 0)
        assert saver.get_tuple(saver_config("t")).checkpoint["channel_values"] == {"blob": "x"}  # type: ignore[union-attr]


def test_vacuum_gives_back_the_pages_a_deletion_emptied(pg_dsn: str) -> None:
    """After delete_thread of a large thread, vacuum shrinks the store; the other thread stays."""
    with ConnectionPool(pg_dsn, min_size=1, max_size=2, open=True) as pool:
        saver = FencedPostgresSaver(pool)
        saver.setup()
        _put_blob(saver, "keep", "small")
        for _ in range(8):  # incompressible: about 2 MB in TOAST, at its end
            _put_blob(saver, "big", os.urandom(256 * 1024))
        saver.vacuum()  # the maps are made now, not counted against what follows
        with pool.connection() as conn:
            # Autovacuum may not take the freed pages first: this test's vacuum must.
            conn.execute(
                "ALTER TABLE lgfs_checkpoints SET "
                "(autovacuum_enabled = false, toast.autovacuum_enabled = false)"
            )
        saver.delete_thread("big")
        report = saver.vacuum()
        assert report.bytes_after < report.bytes_before - 1_500_000, report
        found = saver.get_tuple(saver_config("keep"))
        assert found is not None and found.checkpoint["channel_values"] == {"blob": "small"}


def test_vacuum_does_not_wait_for_a_writer_in_a_transaction(pg_dsn: str) -> None:
    """A writer holding the thread's row lock mid-transaction: vacuum runs by it, and it commits.

    Within a 200 ms lock_timeout: VACUUM FULL would wait for the writer's
    lock and fail with StoreBusy.
    """
    options = conninfo_to_dict(pg_dsn)["options"]
    with (
        FencedPostgresSaver.from_conn_string(pg_dsn) as writer,
        psycopg.connect(pg_dsn, options=f"{options} -c lock_timeout=200") as conn,
    ):
        writer.setup()
        claim = writer.claim("t", "alice", 60)
        _put_blob(writer, "u", "x")
        saver = FencedPostgresSaver(conn)  # not in autocommit: switched for the call
        with psycopg.connect(pg_dsn) as mid:  # a fenced write's first statements, uncommitted
            mid.execute("UPDATE lgfs_threads SET next_seq = next_seq WHERE thread_id = 't'")
            mid.execute("UPDATE lgfs_checkpoints SET metadata = metadata WHERE thread_id = 'u'")
            report = saver.vacuum()
            mid.commit()
        assert report.bytes_after > 0 and conn.autocommit is False
        assert writer.renew("t", claim.token, 60).token == claim.token


def test_vacuum_refuses_bad_arguments_read_only_stores_and_open_transactions(
    pg_dsn: str,
) -> None:
    """`force` must be a bool; a readonly store refuses; inside a caller's transaction: clear."""
    with FencedPostgresSaver.from_conn_string(pg_dsn) as saver:
        saver.setup()
        with pytest.raises(InvalidArgument) as bad:
            saver.vacuum(force="yes")  # type: ignore[arg-type]
        assert bad.value.argument == "force"
    with FencedPostgresSaver.from_conn_string(pg_dsn, readonly=True) as readonly:
        with pytest.raises(ReadOnlyStore) as refused:
            asyncio.run(readonly.avacuum())
        assert refused.value.op == "vacuum"
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("SELECT 1")  # the caller's transaction is open
        with pytest.raises(StoreError, match="must run outside one") as inside:
            FencedPostgresSaver(conn).vacuum()
        assert not isinstance(inside.value.__cause__, psycopg.Error)
        assert conn.execute("SELECT 2").fetchone() == (2,)  # the caller's transaction goes on
