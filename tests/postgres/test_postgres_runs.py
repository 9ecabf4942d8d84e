"""The run API on PostgreSQL where its transactions meet: an end queued behind a takeover,
a refused begin_run beside a holder's row lock, and a schema from before runs
(version 3) upgraded under a live claim.

The runner's behaviour on PostgreSQL (strategies, cancel, tenants, processes)
is tested by the store-parametrised tests/test_runner*.py.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from psycopg.conninfo import conninfo_to_dict

from langgraph_fenced_sqlite import TenantMismatch, ThreadBusy
from langgraph_fenced_sqlite.clock import ManualClock
from langgraph_fenced_sqlite.postgres import FencedPostgresSaver, runs, sql, txns


def _wait_for_lock_wait(watch: Any) -> None:
    deadline = time.monotonic() + 30
    while not watch.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database()"
    ).fetchone()[0]:
        assert time.monotonic() < deadline, "the call never waited for the lock"
        time.sleep(0.005)


@contextlib.contextmanager
def _end_run_behind_a_held_row(
    pg_dsn: str, saver: FencedPostgresSaver, token: int
) -> Iterator[tuple[Any, list[Any]]]:
    """Run `saver.end_run("t", token, "run_completed")` queued behind a held lock on t's row.

    Yields the cursor of the connection holding the row (`FOR UPDATE`) once
    the end waits for it, and the list the end's outcome lands in; on exit,
    commits that connection (the end then runs) and joins the end.
    """
    outcome: list[Any] = []
    ender = threading.Thread(
        target=lambda: outcome.append(saver.end_run("t", token, "run_completed"))
    )
    with psycopg.connect(pg_dsn) as lock_conn, psycopg.connect(pg_dsn) as watch:
        cur = lock_conn.cursor()
        cur.execute("SELECT 1 FROM lgfs_threads WHERE thread_id = 't' FOR UPDATE")
        ender.start()
        _wait_for_lock_wait(watch)
        yield cur, outcome
        lock_conn.commit()
        ender.join(timeout=30)


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
        with _end_run_behind_a_held_row(pg_dsn, saver, old.token) as (cur, outcome):
            new = runs.begin_run(
                cur, "t", "new", 30, run_id="r-new", strategy="interrupt", now=None, notify=False
            )
        assert outcome == [False]
        assert saver.current_claim("t") == new
        kinds = [(e.kind, e.data.get("run_id")) for e in saver.events_after("t", 0)]
        assert kinds == [
            ("run_started", "r-old"),
            ("run_superseded", "r-old"),
            ("run_started", "r-new"),
        ]


def _short_lock_timeout(pg_dsn: str) -> psycopg.Connection[Any]:
    """A connection that waits at most 100 ms for a lock."""
    options = conninfo_to_dict(pg_dsn)["options"]
    return psycopg.connect(pg_dsn, autocommit=True, options=f"{options} -c lock_timeout=100")


def _history(saver: FencedPostgresSaver) -> list[tuple[str, Any]]:
    return [(e.kind, e.data.get("run_id")) for e in saver.events_after("t", 0)]


def test_a_refused_begin_run_claim_or_delete_takes_no_row_lock(
    pg_dsn: str, open_pg: Any, clock: ManualClock
) -> None:
    """A begin_run, claim or delete_unclaimed_thread refused for a live claim takes no row lock.

    Deterministic: another connection holds the row lock (`SELECT ... FOR
    UPDATE`, as a holder's fenced write does) while competing begin_runs run
    on a connection whose lock_timeout is 100 ms. Each is refused at once, as
    it would be with no lock held: TenantMismatch for another tenant (before
    ThreadBusy), else ThreadBusy naming the holder and the latest checkpoint;
    a begin_run that locked the row first would fail with StoreBusy instead.
    Nothing changes.
    """
    saver = open_pg()
    claim = saver.begin_run("t", "alice", 30, run_id="r1", tenant="acme")
    cp = empty_checkpoint()
    saver.put(claim.config(checkpoint_ns=""), cp, {"source": "update", "step": 1}, {})
    before = _history(saver)
    with _short_lock_timeout(pg_dsn) as conn, psycopg.connect(pg_dsn) as locker:
        other = FencedPostgresSaver(conn, clock=clock)
        try:
            locker.execute("SELECT 1 FROM lgfs_threads WHERE thread_id = 't' FOR UPDATE")
            with pytest.raises(TenantMismatch) as mismatch:
                other.begin_run("t", "bob", 30, run_id="r2", tenant="globex")
            assert (mismatch.value.tenant, mismatch.value.thread_tenant) == ("globex", "acme")
            for tenant, strategy in ((None, "reject"), ("acme", "enqueue")):
                with pytest.raises(ThreadBusy) as busy:
                    other.begin_run("t", "bob", 30, run_id="r3", strategy=strategy, tenant=tenant)
                assert (busy.value.holder, busy.value.latest_checkpoint_id) == ("alice", cp["id"])
            with pytest.raises(TenantMismatch):
                other.delete_unclaimed_thread("t", "bob", tenant="globex")
            for refused in (
                lambda: other.claim("t", "bob", 30),
                lambda: other.delete_unclaimed_thread("t", "bob"),
                lambda: other.delete_unclaimed_thread("t", "bob", tenant="acme"),
            ):
                with pytest.raises(ThreadBusy) as busy:
                    refused()
                assert (busy.value.holder, busy.value.latest_checkpoint_id) == ("alice", cp["id"])
            locker.rollback()
        finally:
            other.close()
    assert saver.current_claim("t") == claim
    assert _history(saver) == before


def test_a_begin_run_that_read_an_expired_claim_decides_under_the_lock(
    pg_dsn: str, open_pg: Any, clock: ManualClock
) -> None:
    """A claim renewed while a begin_run waited for the row lock refuses it: the lock decides.

    Deterministic: the claim has expired when another connection locks the
    thread's row and renews the claim (uncommitted); the begin_run reads the
    expired claim, so it must take the lock to grant, waits for it, then sees
    the renewed claim and raises ThreadBusy. Granting from what it read
    would fence off a live holder that renewed in time.
    """
    saver = open_pg()
    claim = saver.begin_run("t", "alice", 10, run_id="r1")
    clock.advance(20)
    before = _history(saver)
    other = open_pg()
    outcome: list[Any] = []

    def compete() -> None:
        try:
            outcome.append(other.begin_run("t", "bob", 10, run_id="r2", strategy="enqueue"))
        except ThreadBusy as busy:
            outcome.append(busy)

    competitor = threading.Thread(target=compete)
    with psycopg.connect(pg_dsn) as renewer, psycopg.connect(pg_dsn) as watch:
        cur = renewer.cursor()
        renewed = txns.renew(cur, "t", claim.token, 30, now=clock.now())
        competitor.start()
        _wait_for_lock_wait(watch)
        renewer.commit()
        competitor.join(timeout=30)
    assert len(outcome) == 1 and isinstance(outcome[0], ThreadBusy)
    assert outcome[0].holder == "alice"
    assert saver.current_claim("t") == renewed
    assert _history(saver) == before


def test_a_claim_whose_expiry_the_server_reads_as_live_but_is_nan_is_judged_under_the_lock(
    pg_dsn: str, open_pg: Any
) -> None:
    """An expiry of NaN (a damaged cell) sorts above every time in PostgreSQL, not in `claim_live`.

    The read that takes no lock skips the lock on what the server compares as
    live; `claim_live` cannot judge it, so begin_run locks the row and decides
    as it always did for a damaged claim (not live: the run is granted).
    """
    saver = open_pg()
    old = saver.begin_run("t", "alice", 30, run_id="r1")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("UPDATE lgfs_threads SET expires_at = 'NaN' WHERE thread_id = 't'")
    new = saver.begin_run("t", "bob", 30, run_id="r2")
    assert new.token > old.token and saver.current_claim("t") == new
    assert [kind for kind, _ in _history(saver)] == ["run_started", "run_superseded", "run_started"]


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

    from langgraph_fenced_sqlite.core.checkpoints import encode_checkpoint
    from langgraph_fenced_sqlite.postgres import txns

    with FencedPostgresSaver.from_conn_string(pg_dsn) as saver:
        saver.setup()
        claim = saver.begin_run("t", "w", 30, run_id="r1")
        first = empty_checkpoint()
        meta: Any = {"source": "loop", "step": 1, "parents": {}}
        stored = saver.put(claim.config(), first, meta, {})
        later = create_checkpoint(first, None, 2)
        enc = encode_checkpoint(saver.serde, claim.config(stored), later, meta, "t", "")
        with _end_run_behind_a_held_row(pg_dsn, saver, claim.token) as (cur, outcome):
            assert txns.put(cur, enc, claim.token, now=None, require_claim=False)
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
        assert saver.stats()["schema_version"] == sql.SCHEMA_VERSION == 15
        assert saver.current_claim("t").holder == "old-host"  # type: ignore[union-attr]
        claim = saver.begin_run("t", "new-host", 30, run_id="r1", strategy="rollback")
        assert claim.token == 8
        (superseded, started) = saver.events_after("t", 0)
        assert superseded.kind == "run_superseded" and started.kind == "run_started"
        assert superseded.data["run_id"] is None and superseded.data["was_live"] is True
        assert "retracted_checkpoints" not in superseded.data
        assert saver.end_run("t", claim.token, "run_completed")
        assert saver.current_claim("t") is None
