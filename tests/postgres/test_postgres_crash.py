"""Crashes and partitions on PostgreSQL: a worker SIGKILLed mid-run, its connection killed
mid-transaction (`pg_terminate_backend`), the server stopped with `-m immediate`.

What must hold each time: no stale write lands, no acknowledged write is lost,
and a takeover resumes the thread.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool
from support.processes import pg_child, reap, start
from support.puts import put

from langgraph_fenced_sqlite import StaleClaim, StoreError
from langgraph_fenced_sqlite.postgres import FencedPostgresSaver


def _stored(dsn: str, thread_id: str) -> list[tuple[str, int | None]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT checkpoint_id, token FROM lgfs_checkpoints WHERE thread_id = %s "
            "ORDER BY position",
            (thread_id,),
        ).fetchall()


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_worker_killed_mid_run_loses_no_acknowledged_write_and_a_take_over_resumes(
    pg_dsn: str,
) -> None:
    """SIGKILL a worker process while it writes: every id it printed is stored, in order;
    a takeover continues the chain from the latest, and the dead worker's token is stale."""
    with FencedPostgresSaver.from_conn_string(pg_dsn) as saver:
        saver.setup()
        dead = saver.claim("t", "worker-1", 30)
        args = {"dsn": pg_dsn, "thread": "t", "token": dead.token}
        proc = start(pg_child("stream_writer", args))
        acked: list[str] = []
        try:
            assert proc.stdout is not None
            while len(acked) < 10:
                line = proc.stdout.readline()
                assert line, proc.stderr.read() if proc.stderr else "child ended"
                acked.append(line.strip())
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            acked += [line.strip() for line in proc.stdout.read().splitlines()]
        finally:
            reap(proc)
        stored = [cid for cid, _ in _stored(pg_dsn, "t")]
        # Acknowledged means committed; at most one commit the kill cut off before it printed.
        assert stored[: len(acked)] == acked and len(stored) - len(acked) in (0, 1)
        new = saver.take_over("t", "worker-2", 30)
        latest = saver.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})
        assert latest is not None and latest.config["configurable"]["checkpoint_id"] == stored[-1]
        put(
            saver, "t", token=new.token, parent=stored[-1], step=1
        )  # the version check passes: resumed
        with pytest.raises(StaleClaim):
            put(saver, "t", token=dead.token, parent=stored[-1], step=1)


def test_a_connection_killed_mid_transaction_lands_nothing_and_the_pool_goes_on(
    pg_dsn: str,
) -> None:
    """The server ends a worker's backend while its put waits inside its transaction:
    the put is a StoreError (not a psycopg error), nothing of it is stored, and the
    same saver's next put, on a fresh pool connection, lands."""
    with ConnectionPool(pg_dsn, min_size=1, max_size=2, open=True) as pool:
        saver = FencedPostgresSaver(pool)
        saver.setup()
        claim = saver.claim("t", "w", 30)
        first = put(saver, "t", token=claim.token, step=1)
        outcome: list[Any] = []

        def blocked_put() -> None:
            try:
                outcome.append(put(saver, "t", token=claim.token, parent=first, step=1))
            except Exception as exc:
                outcome.append(exc)

        with psycopg.connect(pg_dsn) as locker, psycopg.connect(pg_dsn, autocommit=True) as admin:
            locker.execute("SELECT 1 FROM lgfs_threads WHERE thread_id = 't' FOR UPDATE")
            worker = threading.Thread(target=blocked_put)
            worker.start()
            deadline = time.monotonic() + 30
            pid = None
            while pid is None:
                assert time.monotonic() < deadline, "the put never waited for the lock"
                row = admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                ).fetchone()
                pid = None if row is None else row[0]
                time.sleep(0.005)
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            worker.join(timeout=30)
        [error] = outcome
        assert isinstance(error, StoreError) and isinstance(error.__cause__, psycopg.Error)
        assert [cid for cid, _ in _stored(pg_dsn, "t")] == [first]
        second = put(saver, "t", token=claim.token, parent=first, step=1)
        assert [cid for cid, _ in _stored(pg_dsn, "t")] == [first, second]


@pytest.mark.slow
def test_an_immediate_server_restart_loses_no_acknowledged_write(
    pg_server: Any, pg_dsn: str
) -> None:
    """`pg_ctl stop -m immediate` (a crash: no checkpoint, no clean shutdown), then start:
    every acknowledged put is there, claims survive, and the pool's saver writes again
    (a call on a connection the restart broke is a StoreError, never a psycopg error)."""
    with ConnectionPool(pg_dsn, min_size=1, max_size=2, open=True) as pool:
        saver = FencedPostgresSaver(pool)
        saver.setup()
        claim = saver.claim("t", "w", 300)
        acked = [put(saver, "t", token=claim.token, step=1)]
        for _ in range(20):
            acked.append(put(saver, "t", token=claim.token, parent=acked[-1], step=1))
        pg_server.restart("immediate")
        errors: list[BaseException] = []
        for _ in range(5):
            try:
                acked.append(put(saver, "t", token=claim.token, parent=acked[-1], step=1))
                break
            except StoreError as exc:
                errors.append(exc)
        assert len(errors) < 5, errors
        assert all(isinstance(e.__cause__, psycopg.Error) for e in errors)
        assert [cid for cid, _ in _stored(pg_dsn, "t")] == acked
        assert saver.current_claim("t") == claim
