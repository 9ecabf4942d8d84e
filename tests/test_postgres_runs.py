"""The run API on PostgreSQL where its transactions meet: an end queued behind a takeover,
and a schema from before runs (version 3) upgraded under a live claim.

The runner's behaviour on PostgreSQL (strategies, cancel, tenants, processes)
is tested by the store-parametrised tests/test_runner*.py.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

from langgraph_fenced_sqlite.postgres import FencedPostgresSaver, runs, sql


def _wait_for_lock_wait(watch: Any) -> None:
    deadline = time.monotonic() + 30
    while not watch.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database()"
    ).fetchone()[0]:
        assert time.monotonic() < deadline, "the call never waited for the lock"
        time.sleep(0.005)


def test_an_end_of_run_queued_behind_a_takeover_logs_and_releases_nothing(pg_dsn: str) -> None:
    """A superseded run's `end_run` that waited for the takeover's row lock changes nothing.

    Deterministic: the test holds the thread's row lock in a transaction
    that takes the thread over with `begin_run(strategy="interrupt")`; the
    old run's `end_run` queues behind it. Its first statement is the fence
    (an `UPDATE ... WHERE token = ...`, re-checked against the row the
    takeover left), so it returns False, and neither logs `run_completed`
    nor releases the new run's claim. A `SELECT` as the check would have
    seen the old token, then logged the end and released the new claim.
    """
    with FencedPostgresSaver.from_conn_string(pg_dsn) as saver:
        saver.setup()
        old = saver.begin_run("t", "old", 30, run_id="r-old")
        outcome: list[Any] = []
        ender = threading.Thread(
            target=lambda: outcome.append(saver.end_run("t", old.token, "run_completed"))
        )
        with psycopg.connect(pg_dsn) as lock_conn, psycopg.connect(pg_dsn) as watch:
            cur = lock_conn.cursor()
            cur.execute("SELECT 1 FROM lgfs_threads WHERE thread_id = 't' FOR UPDATE")
            ender.start()
            _wait_for_lock_wait(watch)
            new = runs.begin_run(
                cur, "t", "new", 30, run_id="r-new", strategy="interrupt", now=None, notify=False
            )
            lock_conn.commit()
            ender.join(timeout=30)
        assert outcome == [False]
        assert saver.current_claim("t") == new
        kinds = [(e.kind, e.data.get("run_id")) for e in saver.events_after("t", 0)]
        assert kinds == [
            ("run_started", "r-old"),
            ("run_superseded", "r-old"),
            ("run_started", "r-new"),
        ]


def test_an_end_of_run_names_a_checkpoint_committed_while_it_waited_for_the_lock(
    pg_dsn: str,
) -> None:
    """The one-statement `end_run` makes its event from the latest root checkpoint this saver
    put; one committed by another while the statement waited for the row lock is not in
    its snapshot, so it must not trust the snapshot: it refuses itself, and the event
    names the checkpoint committed last, as the statement-by-statement path reads it.

    Deterministic: the test holds the thread's row lock in a transaction, the end queues
    behind it, and that transaction puts a newer root checkpoint under the run's token.
    """
    from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint

    from langgraph_fenced_sqlite.checkpoints import encode_checkpoint
    from langgraph_fenced_sqlite.postgres import txns

    with FencedPostgresSaver.from_conn_string(pg_dsn) as saver:
        saver.setup()
        claim = saver.begin_run("t", "w", 30, run_id="r1")
        first = empty_checkpoint()
        meta: Any = {"source": "loop", "step": 1, "parents": {}}
        stored = saver.put(claim.config(), first, meta, {})
        later = create_checkpoint(first, None, 2)
        enc = encode_checkpoint(saver.serde, claim.config(stored), later, meta, "t", "")
        outcome: list[Any] = []
        ender = threading.Thread(
            target=lambda: outcome.append(saver.end_run("t", claim.token, "run_completed"))
        )
        with psycopg.connect(pg_dsn) as lock_conn, psycopg.connect(pg_dsn) as watch:
            cur = lock_conn.cursor()
            cur.execute("SELECT 1 FROM lgfs_threads WHERE thread_id = 't' FOR UPDATE")
            ender.start()
            _wait_for_lock_wait(watch)
            assert txns.put(cur, enc, claim.token, now=None, require_claim=False)
            lock_conn.commit()
            ender.join(timeout=30)
        assert outcome == [True]
        events = saver.events_after("t", 0)
        assert [e.kind for e in events] == [
            "run_started",
            "checkpoint",
            "checkpoint",
            "run_completed",
        ]
        assert events[-1].data["checkpoint_id"] == later["id"] != first["id"]
        assert saver.current_claim("t") is None


def test_a_version_3_schema_is_upgraded_under_a_live_claim(pg_dsn: str) -> None:
    """`setup()` on a schema made before runs keeps its claim; a run then supersedes it.

    The claim predates the thread row's `run_id`, so the run it supersedes is
    unknown (None), and "rollback" retracts nothing of it.
    """
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for v in range(3):
            conn.execute(sql.MIGRATIONS[v])
        # The stored version counts the migrations applied: 3 before runs.
        conn.execute("INSERT INTO lgfs_migrations (v) VALUES (2), (3)")
        conn.execute(
            "INSERT INTO lgfs_threads (thread_id, holder, token, expires_at, claimed_at, "
            "last_holder, last_token) VALUES ('t', 'old-host', 7, 1e12, 0, 'old-host', 7)"
        )
        conn.execute("SELECT setval('lgfs_tokens', 7)")
    with FencedPostgresSaver.from_conn_string(pg_dsn) as saver:
        saver.setup()
        assert saver.stats()["schema_version"] == sql.SCHEMA_VERSION == 7
        assert saver.current_claim("t").holder == "old-host"  # type: ignore[union-attr]
        claim = saver.begin_run("t", "new-host", 30, run_id="r1", strategy="rollback")
        assert claim.token == 8
        (superseded, started) = saver.events_after("t", 0)
        assert superseded.kind == "run_superseded" and started.kind == "run_started"
        assert superseded.data["run_id"] is None and superseded.data["was_live"] is True
        assert "retracted_checkpoints" not in superseded.data
        assert saver.end_run("t", claim.token, "run_completed")
        assert saver.current_claim("t") is None
