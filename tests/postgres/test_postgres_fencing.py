"""Fencing on PostgreSQL under real concurrency: threads, and processes with their own connections.

What a platform team relies on: once `take_over` has returned, the superseded
worker's writes never land (however its transactions interleave with the
takeover), every write it was told succeeded is stored, and tokens only go up,
also when several hosts take a thread over at once.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint
from psycopg_pool import ConnectionPool
from support.processes import pg_child, run_together
from support.puts import put

from langgraph_fenced_sqlite import CheckpointConflict, StaleClaim
from langgraph_fenced_sqlite.core import checkpoints as cps
from langgraph_fenced_sqlite.postgres import FencedPostgresSaver, txns


def _rows(dsn: str, thread_id: str) -> list[tuple[str, int | None, int]]:
    """(checkpoint_id, token, position) of a thread's checkpoints, in commit order."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT checkpoint_id, token, position FROM lgfs_checkpoints "
            "WHERE thread_id = %s ORDER BY position",
            (thread_id,),
        ).fetchall()


def test_a_superseded_workers_writes_stop_at_the_takeover_threads(pg_dsn: str) -> None:
    """Old worker writing flat out on a pool; a takeover in another thread fences it at once.

    Every put the old worker started after `take_over` returned is refused;
    every put it was told succeeded is stored, all before the new holder's first.
    """
    with ConnectionPool(pg_dsn, min_size=2, max_size=4, open=True) as pool:
        saver = FencedPostgresSaver(pool)
        saver.setup()
        old = saver.claim("t", "old", 30)
        taken = threading.Event()
        acked: list[str] = []
        late_successes: list[str] = []
        refused: list[StaleClaim] = []

        def old_worker() -> None:
            while True:
                started_after = taken.is_set()
                try:
                    cid = put(saver, "t", token=old.token, step=len(acked), source="update")
                except StaleClaim as exc:
                    refused.append(exc)
                    return
                acked.append(cid)
                if started_after:
                    late_successes.append(cid)

        worker = threading.Thread(target=old_worker)
        worker.start()
        while len(acked) < 20:  # let it get going
            time.sleep(0.001)
        new = saver.take_over("t", "new", 30)
        taken.set()
        first_new = put(saver, "t", token=new.token, step=0, source="update")
        worker.join(timeout=30)
        assert not worker.is_alive()

    assert late_successes == []
    assert refused and refused[0].current_token == new.token and refused[0].holder == "new"
    rows = _rows(pg_dsn, "t")
    assert [r[0] for r in rows if r[1] == old.token] == acked  # none lost, none extra, in order
    assert [r[0] for r in rows if r[1] == new.token] == [first_new]
    assert rows[-1][0] == first_new  # every old write committed before the new holder's
    assert [r[2] for r in rows] == list(range(1, len(rows) + 1))  # positions gap-free


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_superseded_worker_process_writes_nothing_after_the_takeover(
    pg_dsn: str, tmp_path: Any
) -> None:
    """Old worker in its own process and connection; a takeover from the test's process."""
    with FencedPostgresSaver.from_conn_string(pg_dsn) as saver:
        saver.setup()
        old = saver.claim("t", "old", 30)
        flag = str(tmp_path / "go")
        args = {"dsn": pg_dsn, "thread": "t", "token": old.token, "flag": flag}
        results: list[Any] = []
        child = threading.Thread(
            target=lambda: results.extend(run_together([pg_child("fenced_writer", args)], flag))
        )
        child.start()
        while len(_rows(pg_dsn, "t")) < 20:
            time.sleep(0.005)
        new = saver.take_over("t", "new", 30)
        first_new = put(saver, "t", token=new.token, step=0, source="update")
        child.join(timeout=60)
    [(code, out, err)] = results
    assert code == 0, err
    report = json.loads(out)
    assert report["refused_by"] == new.token
    rows = _rows(pg_dsn, "t")
    assert [r[0] for r in rows if r[1] == old.token] == report["acked"]
    assert rows[-1][0] == first_new


@pytest.mark.slow
@pytest.mark.subprocess
def test_concurrent_take_overs_from_several_processes_only_raise_the_token(
    pg_dsn: str, tmp_path: Any
) -> None:
    """Two processes take the same threads over at once, again and again.

    The claim each thread ends with carries the greatest token ever granted
    on it (a token drawn before the row lock could commit after a greater
    one and lower it), each process saw its own tokens rise, no token was
    granted twice, and only the final token can still write.
    """
    threads = [f"t{i}" for i in range(2)]
    with FencedPostgresSaver.from_conn_string(pg_dsn) as saver:
        saver.setup()
        flag = str(tmp_path / "go")
        argvs = [
            pg_child(
                "take_overs",
                {"dsn": pg_dsn, "threads": threads, "rounds": 10, "me": f"p{i}", "flag": flag},
            )
            for i in range(2)
        ]
        results = run_together(argvs, flag)
        granted: dict[str, list[int]] = {t: [] for t in threads}
        for code, out, err in results:
            assert code == 0, err
            for thread_id, tokens in json.loads(out).items():
                assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
                granted[thread_id].extend(tokens)
        every = [t for tokens in granted.values() for t in tokens]
        assert len(set(every)) == len(every) == 2 * 10 * len(threads)
        for thread_id, tokens in granted.items():
            final = saver.current_claim(thread_id)
            assert final is not None and final.token == max(tokens)
            for stale in sorted(tokens)[-3:-1]:
                with pytest.raises(StaleClaim):
                    put(saver, thread_id, token=stale, step=0, source="update")
            put(saver, thread_id, token=final.token, step=0, source="update")


def _grant_while_queued(pg_dsn: str, work: Any, holder: str, what: str) -> Any:
    """Hold thread "t"'s row lock while `work` runs in a thread; once it waits for the
    lock, take the thread over (as `holder`) in the lock's transaction, commit, and
    return the claim granted (after `work` has ended)."""
    return _while_queued(
        pg_dsn, work, what, lambda cur: txns.grant(cur, "t", holder, 30, now=None, force=True)
    )


def _while_queued(pg_dsn: str, work: Any, what: str, then: Any) -> Any:
    """Hold thread "t"'s row lock while `work` runs in a thread; once it waits for the
    lock, run `then(cursor)` in the lock's transaction, commit, and return what it
    returned (after `work` has ended)."""
    with psycopg.connect(pg_dsn) as lock_conn, psycopg.connect(pg_dsn) as watch:
        cur = lock_conn.cursor()
        cur.execute("SELECT 1 FROM lgfs_threads WHERE thread_id = 't' FOR UPDATE")
        worker = threading.Thread(target=work)
        worker.start()
        deadline = time.monotonic() + 30
        while not watch.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()"
        ).fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline, f"the {what} never waited for the lock"
            time.sleep(0.005)
        done = then(cur)
        lock_conn.commit()
        worker.join(timeout=30)
    return done


def test_a_take_over_that_waited_for_the_row_lock_draws_its_token_after_it(pg_dsn: str) -> None:
    """A takeover blocked behind another one ends with the greater token.

    The race made deterministic: the test holds the thread's row lock, a
    worker's `take_over` queues behind it, and the test's transaction then
    grants a claim of its own and commits. Had the worker drawn its token
    before waiting for the lock (a `nextval` in `INSERT ... VALUES`), it would
    now overwrite the greater token with its smaller one, and the hijacker's
    fenced writes would still land.
    """
    with FencedPostgresSaver.from_conn_string(pg_dsn) as saver:
        saver.setup()
        first = saver.claim("t", "first", 30)
        worker_claims: list[Any] = []
        between = _grant_while_queued(
            pg_dsn,
            lambda: worker_claims.append(saver.take_over("t", "worker", 30)),
            "between",
            "worker",
        )
        [mine] = worker_claims
        assert first.token < between.token < mine.token
        assert saver.current_claim("t") == mine
        with pytest.raises(StaleClaim):
            put(saver, "t", token=between.token, step=0, source="update")


def test_a_write_that_waited_for_the_row_lock_behind_a_take_over_is_refused(pg_dsn: str) -> None:
    """A put queued behind a takeover's transaction is refused once the takeover commits.

    Deterministic: the test holds the thread's row lock, the old holder's put
    queues behind it, and the test's transaction takes the thread over and
    commits. The fence is the put's first statement, an `UPDATE ... WHERE
    token = ...` that PostgreSQL re-checks against the row the takeover
    left; a `SELECT` as the fence check would have passed before the
    takeover and let the stale write land after it.
    """
    with FencedPostgresSaver.from_conn_string(pg_dsn) as saver:
        saver.setup()
        old = saver.claim("t", "old", 30)
        put(saver, "t", token=old.token, step=0, source="update")
        outcome: list[Any] = []

        def stale_put() -> None:
            try:
                outcome.append(put(saver, "t", token=old.token, step=1, source="update"))
            except StaleClaim as exc:
                outcome.append(exc)

        new = _grant_while_queued(pg_dsn, stale_put, "new", "put")
        [refused] = outcome
        assert isinstance(refused, StaleClaim)
        seen = (refused.token, refused.current_token, refused.holder)
        assert seen == (old.token, new.token, "new")
        assert [r[1] for r in _rows(pg_dsn, "t")] == [old.token]


def test_a_put_that_waited_for_the_row_lock_checks_its_parent_against_what_committed_meanwhile(
    pg_dsn: str,
) -> None:
    """Two puts of one claim, both children of the latest: the one that waited for the
    row lock is refused (CheckpointConflict), so the thread never forks.

    Deterministic: the test holds the row lock, the worker's put (parent c0) queues
    behind it, and the test's transaction stores another child of c0 and commits.
    The fenced put is one statement (`lgfs_put`), and its version check must read
    after the lock: one data-modifying CTE would have read with the snapshot taken
    before it waited, not seen the other child, and stored a second one.
    """
    with FencedPostgresSaver.from_conn_string(pg_dsn) as saver:
        saver.setup()
        claim = saver.claim("t", "w", 30)
        c0 = empty_checkpoint()
        saver.put(_loop_config(claim.token), c0, {"source": "loop", "step": 0}, {})
        outcome: list[Any] = []

        def late_child() -> None:
            try:
                cp = create_checkpoint(c0, None, 1)
                config = _loop_config(claim.token, c0["id"])
                outcome.append(saver.put(config, cp, {"source": "loop", "step": 1}, {}))
            except CheckpointConflict as exc:
                outcome.append(exc)

        def other_child(cur: Any) -> str:
            cp = create_checkpoint(c0, None, 1)
            config = _loop_config(claim.token, c0["id"])
            meta = {"source": "loop", "step": 1}
            enc = cps.encode_checkpoint(saver.serde, config, cp, meta, "t", "")
            assert txns.put(cur, enc, claim.token, now=None, require_claim=False)
            return str(cp["id"])

        other = _while_queued(pg_dsn, late_child, "put", other_child)
        [refused] = outcome
        assert isinstance(refused, CheckpointConflict)
        assert (refused.expected, refused.actual) == (c0["id"], other)
        assert [r[0] for r in _rows(pg_dsn, "t")] == [c0["id"], other]


def _loop_config(token: int, parent: str | None = None) -> Any:
    conf: dict[str, Any] = {"thread_id": "t", "checkpoint_ns": "", "__fence_token__": token}
    if parent is not None:
        conf["checkpoint_id"] = parent
    return {"configurable": conf}
