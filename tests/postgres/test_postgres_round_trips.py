"""The PostgreSQL store's round trips: a fenced write or a read is one, whatever the connection.

Counted from libpq's own trace of the connection (a message the client sent,
then one the server sent, is one wait for the server), so the figures do not
depend on the machine's load. Each commit's latency on a network is its
round trips; LangGraph's `PostgresSaver` spends one per put, and a fenced put
that spends more cannot approach its speed. Before the batches, a fenced put
or put_writes took 5 (psycopg's `transaction()` syncs when entered and left
in pipeline mode) and a get_tuple 4; an `events_after` took 4 (BEGIN, bounds,
events, COMMIT) until it became one statement.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.base import create_checkpoint
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool
from support.configs import saver_config
from support.puts import put_next

from langgraph_fenced_sqlite import CheckpointConflict, StaleClaim, StoreBusy, ThreadBusy
from langgraph_fenced_sqlite.postgres import FencedPostgresSaver
from langgraph_fenced_sqlite.testing.postgres_server import round_trips


def test_a_fenced_put_put_writes_get_tuple_and_list_page_are_one_round_trip_each(
    open_pg: Any,
) -> None:
    saver = open_pg()
    conn = saver._engine._conn
    claim = saver.claim("t", "w", 60)
    first = put_next(saver, claim.token)
    box: dict[str, Any] = {}
    assert round_trips(conn, lambda: box.setdefault("cp", put_next(saver, claim.token, first))) == 1
    wconf = saver_config("t", token=claim.token, checkpoint_id=box["cp"]["id"])
    assert round_trips(conn, lambda: saver.put_writes(wconf, [("a", 1), ("b", 2)], "task")) == 1
    got: list[Any] = []
    assert round_trips(conn, lambda: got.append(saver.get_tuple(saver_config("t")))) == 1
    assert got[0].checkpoint["id"] == box["cp"]["id"]
    assert [(w[1], w[2]) for w in got[0].pending_writes] == [("a", 1), ("b", 2)]
    assert round_trips(conn, lambda: got.append(list(saver.list(saver_config("t"))))) == 1
    assert [t.checkpoint["id"] for t in got[1]] == [box["cp"]["id"], first["id"]]
    assert [(w[1], w[2]) for w in got[1][0].pending_writes] == [("a", 1), ("b", 2)]


def test_an_unfenced_put_and_put_writes_are_one_round_trip_each_and_gap_free(
    open_pg: Any,
) -> None:
    """A graph compiled with the saver and run without a claim writes unfenced: each write
    is one statement too (it took six: BEGIN, the row, the position, the row, the
    event, COMMIT), the thread's row made by the first, its seqs gap-free."""
    saver = open_pg()
    conn = saver._engine._conn
    box: dict[str, Any] = {}
    assert round_trips(conn, lambda: box.setdefault("first", put_next(saver, None))) == 1
    assert round_trips(conn, lambda: box.setdefault("cp", put_next(saver, None, box["first"]))) == 1
    wconf = saver_config("t", checkpoint_id=box["cp"]["id"])
    assert round_trips(conn, lambda: saver.put_writes(wconf, [("a", 1), ("b", 2)], "task")) == 1
    assert round_trips(conn, lambda: saver.put_writes(wconf, [("c", 3)], "other")) == 1
    assert round_trips(conn, lambda: saver.put_writes(wconf, [("c", 3)], "other")) == 1  # a retry
    put_next(
        saver, None, box["first"], checkpoint=box["cp"]
    )  # an identical retry: accepted, no seq spent
    got = saver.get_tuple(saver_config("t"))
    assert got is not None and got.checkpoint["id"] == box["cp"]["id"]
    # In `writes_sort_key` order: task "other" before task "task".
    assert [(w[1], w[2]) for w in got.pending_writes] == [("c", 3), ("a", 1), ("b", 2)]
    events = saver.events_after("t")
    assert [(e.seq, e.kind, e.token) for e in events] == [
        (1, "checkpoint", None),
        (2, "checkpoint", None),
        (3, "writes", None),
        (4, "writes", None),
    ]


def test_an_unfenced_write_to_a_claimed_thread_decides_as_before(open_pg: Any, clock: Any) -> None:
    """The one statement refuses itself on any claim; the statements then decide: a live
    claim is ThreadBusy (nothing stored, no seq spent), an expired one lets it land."""
    saver = open_pg()
    claim = saver.claim("t", "worker", 30)
    first = put_next(saver, claim.token)
    with pytest.raises(ThreadBusy) as busy:
        put_next(saver, None, first)
    assert busy.value.holder == "worker"
    with pytest.raises(ThreadBusy):
        saver.put_writes(saver_config("t", checkpoint_id=first["id"]), [("a", 1)], "task")
    clock.advance(31)  # the claim expires, unreplaced
    second = put_next(saver, None, first)
    saver.put_writes(saver_config("t", checkpoint_id=second["id"]), [("a", 1)], "task")
    assert [(e.seq, e.kind, e.token) for e in saver.events_after("t")] == [
        (1, "checkpoint", claim.token),
        (2, "checkpoint", None),
        (3, "writes", None),
    ]
    strict = open_pg(require_claim=True)
    with pytest.raises(ThreadBusy):
        put_next(strict, None, thread_id="other")
    assert strict.get_tuple(saver_config("other")) is None


def test_events_after_is_one_round_trip_and_a_waiter_reads_in_one(open_pg: Any) -> None:
    """A waiter woken by a NOTIFY reads the log: one statement (the bounds and the events
    in one snapshot), where BEGIN, bounds, events and COMMIT took 4 round trips."""
    saver = open_pg()
    conn = saver._engine._conn
    claim = saver.claim("t", "w", 60)
    put_next(saver, claim.token)
    got: list[Any] = []
    assert round_trips(conn, lambda: got.append(saver.events_after("t"))) == 1
    assert round_trips(conn, lambda: got.append(saver.wait_events("t", 0, timeout=1))) == 1
    assert round_trips(conn, lambda: got.append(saver.events_after("t", 1))) == 1
    assert [[e.seq for e in page] for page in got] == [[1], [1], []]
    assert round_trips(conn, lambda: got.append(saver.events_after("unknown"))) == 1
    assert got[-1] == []


def test_a_run_begins_in_1_round_trip_and_ends_in_1(open_pg: Any) -> None:
    """A worker's turn (a run that does not take over, on a thread with no claim) begins
    in one statement (`lgfs_begin_run`: 6 round trips, then 3 in a pipeline): the grant
    under its new token and its `run_started` event, or ThreadBusy from a read that took
    no lock. `end_run` is one statement (6 round trips, then 2 in a pipeline): the fence
    and the release in one UPDATE, then the end event, made before it was sent from the
    latest root checkpoint this saver put (a hint the statement checks under the lock),
    so a FencedRunner invoke costs 2 round trips more than the plain one. On a loaded
    host each round trip is a wait for the scheduler, and workers taking turns on one
    thread wait on each other's: a run's begin is the hand-off's last leg."""
    saver = open_pg()
    conn = saver._engine._conn
    box: dict[str, Any] = {}

    def begin() -> None:
        box["run"] = saver.begin_run("t", "w", 60, run_id="r1", strategy="enqueue")

    assert round_trips(conn, begin) == 1
    assert saver.current_claim("t") == box["run"]
    (started,) = saver.events_after("t")
    assert (started.kind, started.token) == ("run_started", box["run"].token)
    assert started.data == {
        "run_id": "r1",
        "holder": "w",
        "strategy": "enqueue",
        "tenant": None,
        "principal": None,
    }
    token = box["run"].token
    cp = put_next(saver, token)
    done = "run_completed"
    assert round_trips(conn, lambda: saver.end_run("t", token, done, {"run_id": "r1"})) == 1
    assert saver.current_claim("t") is None
    events = saver.events_after("t")
    assert [e.kind for e in events] == ["run_started", "checkpoint", "run_completed"]
    assert events[-1].data == {"run_id": "r1", "checkpoint_id": cp["id"]}
    assert events[-1].token == token
    with pytest.raises(StaleClaim):  # the run no longer holds the thread
        saver.end_run("t", token, done, {"run_id": "r1"}, raise_stale=True)
    assert [e.kind for e in saver.events_after("t")][-1] == "run_completed"  # logged once


def test_a_busy_thread_refuses_a_run_in_1_round_trip_and_the_rest_decide_statement_by_statement(
    open_pg: Any, pg_dsn: str
) -> None:
    """ThreadBusy comes from the one statement's read (no lock taken, nothing written); an
    expired claim (a crashed holder's), a take-over and a tenant's run go statement by
    statement, which log `run_superseded` and judge the tenant as they always did."""
    saver = open_pg()
    conn = saver._engine._conn
    alice = saver.begin_run("t", "alice", 60, run_id="r1")
    cp = put_next(saver, alice.token)
    refused: list[ThreadBusy] = []

    def busy() -> None:
        with pytest.raises(ThreadBusy) as info:
            saver.begin_run("t", "bob", 60, run_id="r2", strategy="enqueue")
        refused.append(info.value)

    assert round_trips(conn, busy) == 1
    assert (refused[0].holder, refused[0].latest_checkpoint_id) == ("alice", cp["id"])
    assert saver.current_claim("t") == alice
    assert [e.kind for e in saver.events_after("t")] == ["run_started", "checkpoint"]
    with psycopg.connect(pg_dsn, autocommit=True) as other:  # alice's host died
        other.execute("UPDATE lgfs_threads SET expires_at = 0 WHERE thread_id = 't'")
    box: list[Any] = []
    begun = round_trips(conn, lambda: box.append(saver.begin_run("t", "bob", 60, run_id="r2")))
    assert begun == 4  # refused, then the 3 of the statements
    superseded, started = saver.events_after("t")[-2:]
    assert (superseded.kind, started.kind) == ("run_superseded", "run_started")
    assert superseded.data["run_id"] == "r1" and superseded.data["was_live"] is False
    assert started.token == box[0].token == saver.current_claim("t").token  # type: ignore[union-attr]

    def take_over() -> None:
        box.append(saver.begin_run("t", "carol", 60, run_id="r3", strategy="interrupt"))

    assert round_trips(conn, take_over) == 3  # a take-over: no batch
    assert saver.current_claim("t").holder == "carol"  # type: ignore[union-attr]

    def tenants() -> None:
        box.append(saver.begin_run("u", "dan", 60, run_id="r4", tenant="acme"))

    assert round_trips(conn, tenants) == 3  # a tenant's run: no batch
    assert saver.events_after("u")[-1].data["tenant"] == "acme"


def test_a_run_that_loses_the_race_for_the_lock_is_told_busy_in_the_same_round_trip(
    open_pg: Any, pg_dsn: str
) -> None:
    """Workers woken by one run's end all read the thread free, then queue for its lock:
    those that lose to the first grant are told ThreadBusy by the statement that waited
    (one round trip, nothing written), not refused to the statements (a second round
    trip, and an ERROR in the server's log each)."""
    saver = open_pg()
    conn = saver._engine._conn
    first = saver.begin_run("t", "w", 60, run_id="r0")
    saver.end_run("t", first.token, "run_failed", {})
    seqs = [e.seq for e in saver.events_after("t")]
    outcome: list[Any] = []
    with psycopg.connect(pg_dsn) as winner:  # a grant in flight: the row locked, uncommitted
        winner.execute(
            "UPDATE lgfs_threads SET holder = 'zed', token = nextval('lgfs_tokens'), "
            "expires_at = extract(epoch FROM clock_timestamp()) + 60 WHERE thread_id = 't'"
        )
        pid = conn.info.backend_pid

        def loser() -> None:
            def begin() -> None:
                try:
                    saver.begin_run("t", "w", 60, run_id="r1", strategy="enqueue")
                except ThreadBusy as exc:
                    outcome.append(exc)

            outcome.append(round_trips(conn, begin))

        thread = threading.Thread(target=loser)
        thread.start()
        with psycopg.connect(pg_dsn, autocommit=True) as look:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # until it waits for the row lock
                row = look.execute(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
                ).fetchone()
                if row is not None and row[0] == "Lock":
                    break
                time.sleep(0.005)
            else:
                raise AssertionError("begin_run never waited for the row lock")
        winner.commit()
        thread.join(30)
    busy, trips = outcome
    assert isinstance(busy, ThreadBusy) and busy.holder == "zed"
    assert trips == 1
    assert [e.seq for e in saver.events_after("t")] == seqs  # nothing written


def test_every_end_of_a_run_is_one_round_trip_and_logs_what_the_statements_did(
    open_pg: Any,
) -> None:
    """An interrupted completion (named `run_interrupted`, counting its interrupt writes) and
    a failure take one round trip, and log what the statement-by-statement path logs."""
    saver = open_pg()
    conn = saver._engine._conn
    claim = saver.begin_run("t", "w", 60, run_id="r1")
    cp = put_next(saver, claim.token)
    wconf = saver_config("t", token=claim.token, checkpoint_id=cp["id"])
    saver.put_writes(wconf, [("__interrupt__", "ask?"), ("x", 1)], "task-a")
    saver.put_writes(wconf, [("__interrupt__", "ask?")], "task-a")  # first writer wins: one
    saver.put_writes(wconf, [("__interrupt__", "and?")], "task-b")
    complete = {"run_id": "r1"}
    assert (
        round_trips(conn, lambda: saver.end_run("t", claim.token, "run_completed", complete)) == 1
    )
    last = saver.events_after("t")[-1]
    assert (last.kind, last.data) == (
        "run_interrupted",
        {"run_id": "r1", "checkpoint_id": cp["id"], "interrupts": 2},
    )
    claim = saver.begin_run("t", "w", 60, run_id="r2")
    failed = {"error": "boom"}
    assert round_trips(conn, lambda: saver.end_run("t", claim.token, "run_failed", failed)) == 1
    last = saver.events_after("t")[-1]
    assert (last.kind, last.data, last.token) == ("run_failed", {"error": "boom"}, claim.token)
    assert saver.current_claim("t") is None
    seqs = [e.seq for e in saver.events_after("t")]
    assert seqs == list(range(1, len(seqs) + 1))


def test_an_end_whose_hint_is_wrong_decides_statement_by_statement(
    open_pg: Any, pg_dsn: str
) -> None:
    """Another store put the latest checkpoint under the run's token (or nothing was put by
    this one): the one-statement end refuses itself, and the event names the real latest."""
    saver = open_pg()
    conn = saver._engine._conn
    claim = saver.begin_run("t", "w", 60, run_id="r1")
    mine = put_next(saver, claim.token)
    with FencedPostgresSaver.from_conn_string(pg_dsn) as other:
        theirs = put_next(other, claim.token, mine)
    complete = {"run_id": "r1"}
    ended = round_trips(conn, lambda: saver.end_run("t", claim.token, "run_completed", complete))
    assert ended == 3  # refused, then the 2 of the statements
    assert saver.events_after("t")[-1].data == {"run_id": "r1", "checkpoint_id": theirs["id"]}
    assert saver.current_claim("t") is None
    with FencedPostgresSaver.from_conn_string(pg_dsn) as fresh:  # no hint: no batch
        claim = fresh.begin_run("t", "w", 60, run_id="r2")
        ended = fresh.end_run("t", claim.token, "run_completed", {"run_id": "r2"})
        assert ended and fresh.events_after("t")[-1].data["checkpoint_id"] == theirs["id"]
    stale, box = saver.begin_run("t", "w", 60, run_id="r3"), []
    saver.take_over("t", "x", 60)
    # A superseded run's end is one round trip too: the fence matches nothing, so nothing
    # is written and nothing refused (3, and an ERROR in the server's log, before).
    ended = round_trips(conn, lambda: box.append(saver.end_run("t", stale.token, "run_failed", {})))
    assert (ended, box) == (1, [False])
    assert saver.events_after("t")[-1].kind == "run_started"
    with pytest.raises(StaleClaim):  # asked to raise: the refused batch, then the statements
        saver.end_run("t", stale.token, "run_failed", {}, raise_stale=True)
    assert saver.events_after("t")[-1].kind == "run_started"


def test_threads_and_a_threads_summary_and_status_are_one_round_trip_however_many(
    open_pg: Any,
) -> None:
    """`threads()` reads summaries, the time and every status's facts in one snapshot: one
    pipeline of four statements (it took 13 round trips for one thread, 8 more for each
    other: every thread's row, latest checkpoint, writes and run event, one by one).
    `thread_summary` (every `lgfs` command on a thread) and `thread_status` took 13 and 12."""
    saver = open_pg()
    conn = saver._engine._conn
    got: list[Any] = []
    assert round_trips(conn, lambda: got.append(saver.threads())) == 1
    assert got[-1] == []
    for n in range(3):
        claim = saver.begin_run(f"t{n}", "w", 60, run_id=f"r{n}")
        cp = put_next(saver, claim.token, thread_id=f"t{n}")
        wconf = saver_config(f"t{n}", token=claim.token, checkpoint_id=cp["id"])
        saver.put_writes(wconf, [("__interrupt__", "ask?")], "task")
        if n:
            saver.end_run(f"t{n}", claim.token, "run_completed", {"run_id": f"r{n}"})
    assert round_trips(conn, lambda: got.append(saver.threads())) == 1
    states = {t["thread_id"]: t["status"]["state"] for t in got[-1]}
    assert states == {"t0": "running", "t1": "interrupted", "t2": "interrupted"}
    assert round_trips(conn, lambda: got.append(saver.thread_summary("t1"))) == 1
    assert got[-1]["status"]["state"] == "interrupted" and got[-1]["checkpoints"] == 1
    assert round_trips(conn, lambda: got.append(saver.thread_status("t1"))) == 1
    assert got[-1].run_id == "r1" and len(got[-1].waiting) == 1
    assert round_trips(conn, lambda: got.append(saver.thread_status("nobody"))) == 1
    assert got[-1] is None and saver.thread_summary("nobody") is None


def test_refused_batches_decide_as_before_and_leave_the_seqs_gap_free(open_pg: Any) -> None:
    """Each way the one-round-trip put can refuse itself ends as the statement-by-statement
    path decides: the right error, or an identical retry accepted, and no seq spent."""
    saver = open_pg()
    old = saver.claim("t", "old", 60)
    first = put_next(saver, old.token)
    new = saver.take_over("t", "new", 60)
    with pytest.raises(StaleClaim) as stale:
        put_next(saver, old.token, first)
    assert (stale.value.current_token, stale.value.holder) == (new.token, "new")
    put_next(
        saver, new.token, checkpoint=first
    )  # an identical retry, under the new claim: accepted
    second = put_next(saver, new.token, first)
    with pytest.raises(CheckpointConflict) as behind:
        put_next(saver, new.token, first)  # its parent is no longer the latest
    assert (behind.value.expected, behind.value.actual) == (first["id"], second["id"])
    with pytest.raises(CheckpointConflict, match="a different checkpoint is already stored"):
        put_next(saver, new.token, second, checkpoint={**second, "channel_values": {"x": 1}})
    wconf = saver_config("t", token=new.token, checkpoint_id=second["id"])
    saver.put_writes(wconf, [("a", 1)], "task")
    saver.put_writes(wconf, [("a", 1)], "task")  # first writer wins: changes nothing
    third = put_next(saver, new.token, second)
    events = saver.events_after("t")
    assert [(e.seq, e.kind) for e in events] == [
        (1, "checkpoint"),
        (2, "checkpoint"),
        (3, "writes"),
        (4, "checkpoint"),
    ]
    assert events[-1].checkpoint_id == third["id"]


def test_a_pool_connection_without_autocommit_is_handed_back_as_it_was(pg_dsn: str) -> None:
    """The batch switches a connection to autocommit for its one round trip, and back,
    also when the batch refused itself; the pool then finds it idle, as it lent it."""
    with ConnectionPool(pg_dsn, min_size=1, max_size=1, open=True) as pool:
        saver = FencedPostgresSaver(pool)
        saver.setup()
        claim = saver.claim("t", "w", 60)
        first = put_next(saver, claim.token)
        put_next(saver, claim.token, checkpoint=first)  # refused, then accepted as a retry
        with pytest.raises(StaleClaim):
            put_next(saver, claim.token + 1, first)
        with pool.connection() as conn:
            assert conn.autocommit is False
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert saver.get_tuple(saver_config("t")).checkpoint["id"] == first["id"]  # type: ignore[union-attr]


def test_a_callers_connection_in_a_transaction_of_its_own_gets_a_savepoint(pg_dsn: str) -> None:
    """On a connection the caller left inside a transaction, the batch's statements run in a
    savepoint of it (as every call did before batches): the caller's rollback undoes them."""
    with psycopg.connect(pg_dsn) as conn:
        saver = FencedPostgresSaver(conn)
        saver.setup()
        claim = saver.claim("t", "w", 60)
        conn.execute("SELECT 1")  # the caller's transaction, still open
        put_next(saver, claim.token)
        assert saver.get_tuple(saver_config("t")) is not None
        conn.rollback()
        assert saver.get_tuple(saver_config("t")) is None


def test_a_batch_cut_short_by_a_lock_timeout_leaves_the_connection_usable(pg_dsn: str) -> None:
    """A lock timeout in `FENCE` makes the server skip the batch's later statements. psycopg
    records a statement as prepared when it sends its Parse (its 5th use), so a skipped
    Parse left it believing in a statement the server never made, and the next put failed
    with StoreError ("prepared statement _pg3_2 does not exist"). Whichever use the timeout
    hits, later calls on the connection work."""
    options = conninfo_to_dict(pg_dsn)["options"]
    for before in range(8):
        thread_id = f"t{before}"
        conn = psycopg.connect(pg_dsn, autocommit=True, options=f"{options} -c lock_timeout=50")
        with conn:
            saver = FencedPostgresSaver(conn)
            saver.setup()
            claim = saver.claim(thread_id, "w", 60)
            parent = None
            for _ in range(before):
                parent = put_next(saver, claim.token, parent, thread_id=thread_id)
            with psycopg.connect(pg_dsn) as locker:
                locker.execute(
                    "SELECT 1 FROM lgfs_threads WHERE thread_id = %s FOR UPDATE", (thread_id,)
                )
                with pytest.raises(StoreBusy):
                    put_next(saver, claim.token, parent, thread_id=thread_id)
            for _ in range(3):
                parent = put_next(saver, claim.token, parent, thread_id=thread_id)
                wconf = saver_config(thread_id, token=claim.token, checkpoint_id=parent["id"])
                saver.put_writes(wconf, [("a", 1)], "task")
            assert [e.seq for e in saver.events_after(thread_id)] == list(range(1, before + 7))


def test_put_writes_naming_one_special_channel_twice_is_last_writer_wins(open_pg: Any) -> None:
    """One INSERT cannot update a row twice, so a call writing one special (task, idx) twice
    is not sent as the one-statement batch: it goes statement by statement, the last
    write wins (as on SQLite), and a repeat of the call, which rewrites the row twice,
    is one more `writes` event."""
    saver = open_pg()
    claim = saver.claim("t", "w", 60)
    cp = put_next(saver, claim.token)
    wconf = saver_config("t", token=claim.token, checkpoint_id=cp["id"])
    writes = [("__error__", "a"), ("__error__", "b"), ("x", 1)]
    saver.put_writes(wconf, writes, "task")
    saver.put_writes(wconf, writes, "task")
    got = saver.get_tuple(saver_config("t"))
    assert got.pending_writes == [("task", "__error__", "b"), ("task", "x", 1)]
    assert [(e.seq, e.kind) for e in saver.events_after("t")] == [
        (1, "checkpoint"),
        (2, "writes"),
        (3, "writes"),
    ]


def test_a_call_of_one_write_keeps_each_channels_rule_in_its_one_statement(open_pg: Any) -> None:
    """A call of one write is its own function (`lgfs_put_write`, scalars, no arrays) with
    `lgfs_put_writes`' rules: a regular write is first-writer-wins and a special one
    last-writer-wins but never over a greater token's; an identical retry changes
    nothing and spends no seq; each is one round trip."""
    saver = open_pg()
    old = saver.claim("t", "w", 60)
    cp = put_next(saver, old.token)
    for token, value in ((old.token, "a"), (old.token, "a")):
        wconf = saver_config("t", token=token, checkpoint_id=cp["id"])
        assert (
            round_trips(
                saver._engine._conn, lambda c=wconf, v=value: saver.put_writes(c, [("x", v)], "t1")
            )
            == 1
        )
    saver.put_writes(saver_config("t", token=old.token, checkpoint_id=cp["id"]), [("x", "b")], "t1")
    saver.put_writes(
        saver_config("t", token=old.token, checkpoint_id=cp["id"]), [("__error__", "e1")], "t2"
    )
    new = saver.take_over("t", "w2", 60)
    saver.put_writes(
        saver_config("t", token=new.token, checkpoint_id=cp["id"]), [("__error__", "e2")], "t2"
    )
    # The old claim's write is refused (stale), and would not displace e2 anyway.
    with pytest.raises(StaleClaim):
        saver.put_writes(
            saver_config("t", token=old.token, checkpoint_id=cp["id"]), [("__error__", "e3")], "t2"
        )
    saver.put_writes(
        saver_config("t", token=new.token, checkpoint_id=cp["id"]), [("__error__", "e2")], "t2"
    )
    got = saver.get_tuple(saver_config("t", checkpoint_id=cp["id"]))
    assert got.pending_writes == [("t1", "x", "a"), ("t2", "__error__", "e2")]
    # put, the first x (the retry and "b" change nothing), e1, then e2 over it.
    assert [(e.seq, e.kind) for e in saver.events_after("t")] == [
        (1, "checkpoint"),
        (2, "writes"),
        (3, "writes"),
        (4, "writes"),
    ]
    with psycopg.connect(saver._engine.listener_params()[0], autocommit=True) as conn:
        assert conn.execute(
            "SELECT to_regprocedure('lgfs_put_write(text, text, text, text, "
            "bigint, float8, text, bigint, text, int, text, text, text, bytea, "
            "bigint, boolean, boolean)') IS NOT NULL"
        ).fetchone() == (True,)


@pytest.mark.parametrize("between", [0, 15, 16, 40])
def test_a_puts_version_check_finds_a_parent_committed_any_number_of_positions_back(
    open_pg: Any, between: int
) -> None:
    """`lgfs_put` looks for the latest checkpoint among the 16 positions before its own
    first, then further back: a parent that is the latest is accepted in one round trip
    (no refusal, no statement-by-statement retry) wherever it is, and one that is not is
    refused, however far back the latest is."""
    saver = open_pg()
    claim = saver.claim("t", "w", 60)
    first = put_next(saver, claim.token)
    for i in range(between):  # each commit takes a position
        saver.append_events("t", claim.token, [("note", {"i": i})])
    second = create_checkpoint(first, None, 1)
    trips = round_trips(
        saver._engine._conn, lambda: put_next(saver, claim.token, first, checkpoint=second)
    )
    assert trips == 1
    for i in range(between):
        saver.append_events("t", claim.token, [("note", {"i": i})])
    with pytest.raises(CheckpointConflict):
        put_next(saver, claim.token, first)  # the latest is `second`
    assert (
        saver.get_tuple(saver_config("t")).config["configurable"]["checkpoint_id"] == second["id"]
    )
