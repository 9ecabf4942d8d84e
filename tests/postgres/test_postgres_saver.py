"""`FencedPostgresSaver` beyond conformance: claims, expiry by the store's clock, bad input,
lifecycle and error translation, on a real server (the session's `pg_server`)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool
from support.configs import saver_config
from support.postgres import (
    compressions,
    large_values,
    offers_lz4,
    put_inline,
    put_writes_inline,
)
from support.puts import put

from langgraph_fenced_sqlite import (
    InvalidArgument,
    ManualClock,
    RetentionPolicy,
    StaleClaim,
    StoreBusy,
    StoreClosed,
    StoreError,
    ThreadBusy,
    UnsupportedFormat,
    WrongThread,
)
from langgraph_fenced_sqlite.postgres import FencedPostgresSaver, sql, txns
from langgraph_fenced_sqlite.testing._helpers import values_checkpoint


def _count(dsn: str, table: str) -> int:
    with psycopg.connect(dsn) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])  # type: ignore[index]


def test_claim_is_exclusive_until_expiry_by_the_injected_clock(
    open_pg: Any, clock: ManualClock
) -> None:
    """A live claim refuses a second claim and unfenced writes; once expired, both are allowed."""
    saver = open_pg()
    first = saver.claim("t", "alice", 10)
    with pytest.raises(ThreadBusy) as busy:
        saver.claim("t", "bob", 10)
    assert busy.value.holder == "alice"
    with pytest.raises(ThreadBusy):
        put(saver, "t", source="update", step=1)
    clock.advance(10)  # now == expires_at: expired (`now < expires_at` is live)
    second = saver.claim("t", "bob", 10)
    assert second.token > first.token and second.expires_at == clock.now() + 10
    with pytest.raises(StaleClaim) as stale:
        put(saver, "t", token=first.token, source="update", step=1)
    assert (stale.value.current_token, stale.value.holder) == (second.token, "bob")


def test_expiry_follows_the_database_clock_not_the_hosts(open_pg: Any, pg_dsn: str) -> None:
    """With no clock given, expiry is the server's time plus ttl; the server decides liveness."""
    saver = open_pg(clock=None)
    with psycopg.connect(pg_dsn) as conn:
        before = conn.execute(sql.GET_NOW, {"now": None}).fetchone()[0]  # type: ignore[index]
    granted = saver.claim("t", "alice", 0.3)
    assert before + 0.3 <= granted.expires_at <= saver.clock.now() + 0.3
    with pytest.raises(ThreadBusy):
        saver.claim("t", "bob", 5)
    # Rewind the claim's expiry in the database: the server's clock now says expired.
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("UPDATE lgfs_threads SET expires_at = expires_at - 3600")
    assert saver.claim("t", "bob", 5).token > granted.token


def test_renew_release_and_current_claim(open_pg: Any, clock: ManualClock) -> None:
    """Renew extends from now; another token renews nothing; release frees; then it is stale."""
    saver = open_pg()
    granted = saver.claim("t", "alice", 10)
    clock.advance(5)
    renewed = saver.renew("t", granted.token, 10)
    assert renewed.expires_at == clock.now() + 10
    assert saver.current_claim("t") == renewed
    with pytest.raises(StaleClaim):
        saver.renew("t", granted.token + 1000, 10)
    assert saver.release("t", granted.token + 1000) is False
    assert saver.release("t", granted.token) is True
    assert saver.current_claim("t") is None
    with pytest.raises(StaleClaim) as stale:
        put(saver, "t", token=granted.token, source="update", step=1)
    # The thread has no claim now; the error still names the latest holder.
    assert (stale.value.current_token, stale.value.holder) == (None, "alice")
    put(saver, "t", source="update", step=1)  # unfenced: no live claim


def test_a_fenced_input_put_whose_parent_is_not_the_latest_is_a_conflict(open_pg: Any) -> None:
    """Fenced input/loop puts are version-checked (docs/semantics.md §3), after the fence."""
    from langgraph_fenced_sqlite import CheckpointConflict

    saver = open_pg()
    granted = saver.claim("t", "alice", 10)
    first = put(saver, "t", token=granted.token, source="update", step=1)
    put(saver, "t", token=granted.token, parent=first, source="update", step=1)
    cp = empty_checkpoint()
    with pytest.raises(CheckpointConflict):
        saver.put(
            saver_config("t", token=granted.token, checkpoint_id=first),
            cp,
            {"source": "loop", "step": 2},
            {},
        )
    assert saver.get_tuple(saver_config("t", checkpoint_id=cp["id"])) is None


def test_require_claim_refuses_every_unfenced_write(open_pg: Any, pg_dsn: str) -> None:
    """`require_claim=True`: an unfenced put is ThreadBusy and stores nothing."""
    saver = open_pg(require_claim=True)
    with pytest.raises(ThreadBusy, match="requires a claim"):
        put(saver, "t", source="update", step=1)
    assert _count(pg_dsn, "lgfs_checkpoints") == 0
    put(saver, "t", token=saver.claim("t", "alice", 10).token, source="update", step=1)


def test_delete_thread_fences_off_its_holder(open_pg: Any) -> None:
    """After delete_thread the old holder's token is stale and the thread is empty."""
    saver = open_pg()
    granted = saver.claim("t", "alice", 10)
    put(saver, "t", token=granted.token, source="update", step=1)
    saver.delete_thread("t")
    assert saver.get_tuple(saver_config("t")) is None
    with pytest.raises(StaleClaim):
        put(saver, "t", token=granted.token, source="update", step=1)
    assert saver.claim("t", "bob", 10).token > granted.token


def test_a_lease_claims_renews_and_releases(open_pg: Any) -> None:
    """The package's `Lease` drives the PostgreSQL saver unchanged."""
    saver = open_pg(clock=None)
    with saver.lease("t", "alice", ttl=5) as lease:
        assert saver.current_claim("t") == lease.claim
        put(saver, "t", token=lease.claim.token, source="update", step=1)
    assert saver.current_claim("t") is None


async def test_async_twins_and_async_from_conn_string(pg_dsn: str) -> None:
    """`async with from_conn_string`: claims, puts and reads through the async API."""
    async with FencedPostgresSaver.from_conn_string(pg_dsn) as saver:
        await saver.asetup()
        granted = await saver.aclaim("t", "alice", 10)
        cp = empty_checkpoint()
        await saver.aput(
            saver_config("t", token=granted.token), cp, {"source": "update", "step": 1}, {}
        )
        got = await saver.aget_tuple(saver_config("t"))
        assert got is not None and got.checkpoint["id"] == cp["id"]
        assert [t.checkpoint["id"] async for t in saver.alist(saver_config("t"))] == [cp["id"]]
        assert await saver.arelease("t", granted.token) is True
    assert saver.closed


def test_a_pool_serves_concurrent_callers(pg_dsn: str) -> None:
    """With a pool, threads write distinct threads at once; all their checkpoints are stored."""
    with ConnectionPool(pg_dsn, min_size=1, max_size=4, open=True) as pool:
        saver = FencedPostgresSaver(pool)
        saver.setup()
        errors: list[BaseException] = []

        def work(i: int) -> None:
            try:
                token = saver.claim(f"t{i}", f"w{i}", 30).token
                parent = None
                for _ in range(10):
                    parent = put(
                        saver, f"t{i}", token=token, parent=parent, source="update", step=1
                    )
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        workers = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert errors == []
        assert _count(pg_dsn, "lgfs_checkpoints") == 40


def test_bad_arguments_are_invalid_argument_naming_them(open_pg: Any) -> None:
    """Wrong types and shapes are InvalidArgument naming the argument, before any SQL."""
    saver = open_pg()
    with pytest.raises(InvalidArgument, match="conn"):
        FencedPostgresSaver("host=nowhere")
    # An AsyncPostgresSaver user's async connection: told what to give instead.
    aconn = asyncio.run(psycopg.AsyncConnection.connect(saver._engine.listener_params()[0]))
    try:
        with pytest.raises(InvalidArgument, match="got AsyncConnection; for async code give"):
            FencedPostgresSaver(aconn)
    finally:
        aconn.pgconn.finish()
    with pytest.raises(InvalidArgument, match="busy_timeout"):
        FencedPostgresSaver.from_conn_string("host=nowhere", busy_timeout=1)
    with pytest.raises(InvalidArgument, match="ttl"):
        saver.claim("t", "alice", -1)
    with pytest.raises(InvalidArgument, match="thread_id"):
        saver.claim("", "alice", 1)
    with pytest.raises(InvalidArgument, match="token"):
        saver.renew("t", "1", 1)
    with pytest.raises(InvalidArgument, match="strategy"):
        saver.prune(["t"], strategy="everything")
    # As on SQLite: a dry run of "delete" is refused (it ran, rolled back, before).
    with pytest.raises(InvalidArgument, match="dry_run"):
        saver.prune(["t"], strategy="delete", dry_run=True)
    with pytest.raises(InvalidArgument, match="__fence_token__"):
        put(saver, "t", token="7", source="update", step=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="thread_id"):
        saver.retract_turn("", 1)
    with pytest.raises(InvalidArgument, match="token"):
        saver.retract_turn("t", "1")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="run_id"):
        saver.retract_turn("t", 1, run_id="")


def test_retract_turn_removes_the_same_turn_on_both_stores(open_pg: Any, tmp_path: Any) -> None:
    """One rule (`retention.plan_retraction`): both stores remove the same checkpoints."""
    from langgraph_fenced_sqlite import FencedSqliteSaver

    def turns(saver: Any) -> list[Any]:
        claim = saver.claim("t", "w", 60)
        first = put(saver, "t", token=claim.token, source="input", step=1)
        second = put(saver, "t", token=claim.token, parent=first, source="loop", step=1)
        third = put(saver, "t", token=claim.token, parent=second, source="input", step=1)
        put(saver, "t", token=claim.token, parent=third, source="loop", step=1)
        done = saver.retract_turn("t", claim.token)
        left = [c.config["configurable"]["checkpoint_id"] for c in saver.list(None)]
        again = saver.retract_turn("t", claim.token)
        none_left = saver.retract_turn("t", claim.token)
        kinds = [e.kind for e in saver.events_after("t", 0, 100)]
        return [
            (len(done.checkpoints), done.run_id, left == [second, first]),
            (len(again.checkpoints), none_left.checkpoints, none_left.seq),
            (kinds[-2:], done.seq is not None and again.seq == done.seq + 1),
        ]

    with FencedSqliteSaver(str(tmp_path / "t.db")) as lite:
        expected = turns(lite)
    assert expected == [(2, None, True), (2, [], None), (["retracted", "retracted"], True)]
    assert turns(open_pg()) == expected


def test_setup_is_versioned_and_refuses_a_newer_schema(open_pg: Any, pg_dsn: str) -> None:
    """setup() twice is a no-op; a database from a newer version is UnsupportedFormat."""
    saver = open_pg()
    saver.setup()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        versions = [r[0] for r in conn.execute("SELECT v FROM lgfs_migrations ORDER BY v")]
        assert versions == list(range(2, sql.SCHEMA_VERSION + 1))
        conn.execute("INSERT INTO lgfs_migrations VALUES (%s)", (sql.SCHEMA_VERSION + 1,))
    with pytest.raises(UnsupportedFormat, match="newer"):
        saver.setup()


def test_large_values_are_stored_with_lz4_where_the_server_offers_it(pg_dsn: str) -> None:
    """Migration 9: payloads over the TOAST threshold are compressed with lz4 (faster than
    pglz both ways); values stored before it keep pglz and read back whole.

    Since migration 11 a checkpoint's values are in the value table and a
    write is compressed by the client (zstd); rows as a client before it
    stored them (values inline, writes as plain msgpack) are what the
    server compresses, and they still read back.
    """
    assert offers_lz4(pg_dsn)  # the suite's server (PostgreSQL 15, Debian's build) does
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for v in range(9):
            conn.execute(sql.MIGRATIONS[v], prepare=False)
        conn.execute("INSERT INTO lgfs_migrations (v) SELECT generate_series(2, 9)")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        saver = FencedPostgresSaver(conn)  # at version 9: before the migration
        before = values_checkpoint(large_values(30))
        put_inline(saver, saver_config("t"), before, {"source": "loop", "step": 1})
        put_writes_inline(
            saver, saver_config("t", checkpoint_id=before["id"]), [("messages", "x" * 9000)], "a"
        )
        saver.setup()
        assert saver.stats()["schema_version"] == sql.SCHEMA_VERSION
        after = values_checkpoint(large_values(31))
        put_inline(
            saver,
            saver_config("t", checkpoint_id=before["id"]),
            after,
            {"source": "loop", "step": 2},
        )
        put_writes_inline(
            saver, saver_config("t", checkpoint_id=after["id"]), [("messages", "y" * 9000)], "b"
        )
        assert compressions(pg_dsn) == (["pglz", "lz4"], ["pglz", "lz4"])
        for cp, value in ((before, "x" * 9000), (after, "y" * 9000)):
            got = saver.get_tuple(saver_config("t", checkpoint_id=cp["id"]))
            assert got is not None and got.checkpoint["channel_values"] == cp["channel_values"]
            assert got.pending_writes is not None
            assert [w[2] for w in got.pending_writes] == [value]


def test_concurrent_setup_from_many_connections(pg_dsn: str) -> None:
    """Hosts that all call setup() at once take turns: one schema, no error."""
    errors: list[BaseException] = []

    def setup() -> None:
        try:
            with FencedPostgresSaver.from_conn_string(pg_dsn) as saver:
                saver.setup()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    workers = [threading.Thread(target=setup) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []


def test_database_errors_are_store_errors_and_nothing_changes(pg_dsn: str) -> None:
    """Before setup() the tables are missing: StoreError naming the operation, psycopg as cause."""
    with FencedPostgresSaver.from_conn_string(pg_dsn) as saver:
        with pytest.raises(StoreError, match="claim failed on postgresql://") as caught:
            saver.claim("t", "alice", 1)
        assert isinstance(caught.value.__cause__, psycopg.Error)
        saver.setup()
        saver.claim("t", "alice", 1)  # the connection is usable after the failure


def test_a_lock_timeout_is_store_busy(pg_dsn: str, open_pg: Any) -> None:
    """A write blocked past the connection's lock_timeout is StoreBusy; nothing changes."""
    saver = open_pg()
    saver.claim("t", "alice", 10)
    with psycopg.connect(pg_dsn) as locker:
        locker.execute("SELECT 1 FROM lgfs_threads WHERE thread_id = 't' FOR UPDATE")
        options = conninfo_to_dict(pg_dsn)["options"]
        conn = psycopg.connect(pg_dsn, autocommit=True, options=f"{options} -c lock_timeout=100")
        try:
            other = FencedPostgresSaver(conn)
            with pytest.raises(StoreBusy) as busy:
                other.take_over("t", "bob", 10)
            assert busy.value.waited_s >= 0.1
        finally:
            conn.close()
    assert saver.current_claim("t").holder == "alice"


def test_closed_store_raises_store_closed_and_a_nested_call_wrong_thread(open_pg: Any) -> None:
    """Calls after close() raise StoreClosed; a call from inside a call raises WrongThread."""
    saver = open_pg()
    with pytest.raises(WrongThread):
        saver._engine.run("outer", lambda cur: saver.current_claim("t"))
    saver.close()
    saver.close()
    for call in (
        lambda: saver.claim("t", "a", 1),
        lambda: saver.get_tuple(saver_config("t")),
        lambda: list(saver.list(None)),
        lambda: asyncio.run(saver.aget_tuple(saver_config("t"))),
    ):
        with pytest.raises(StoreClosed):
            call()


def test_coexists_with_langgraphs_postgres_saver(pg_dsn: str) -> None:
    """Our tables are prefixed: LangGraph's PostgresSaver sets up in the same schema unharmed."""
    from langgraph.checkpoint.postgres import PostgresSaver

    with FencedPostgresSaver.from_conn_string(pg_dsn) as ours:
        ours.setup()
        mine = put(ours, "t", source="update", step=1)
        with PostgresSaver.from_conn_string(pg_dsn) as theirs:
            theirs.setup()
            cp = empty_checkpoint()
            theirs.put(saver_config("t"), cp, {"source": "update", "step": 1}, {})
            assert theirs.get_tuple(saver_config("t")).checkpoint["id"] == cp["id"]  # type: ignore[union-attr]
        assert ours.get_tuple(saver_config("t")).checkpoint["id"] == mine  # type: ignore[union-attr]


def test_append_events_is_always_fenced_even_with_nothing_to_append(open_pg: Any) -> None:
    """As on SQLite: a stale token fails with no events too; an empty list spends no seq.

    Before, an empty list returned [] without checking the token.
    """
    saver = open_pg()
    claim = saver.claim("t", "w", 60)
    with pytest.raises(StaleClaim):
        saver.append_events("t", claim.token + 1, [])
    with pytest.raises(StaleClaim):
        saver.append_events("u", 1, [])  # no claim on that thread at all
    assert saver.append_events("t", claim.token, []) == []
    assert saver.append_events("t", claim.token, [("e", {})]) == [1]


def test_fenced_put_writes_refuses_a_stale_token_and_special_channels_go_to_the_holder(
    open_pg: Any, pg_dsn: str
) -> None:
    """A superseded holder's writes are StaleClaim and store nothing; the new holder's
    special-channel write replaces the old one (last writer wins within the fence)."""
    saver = open_pg()
    old = saver.claim("t", "old", 10)
    cid = put(saver, "t", token=old.token, source="update", step=1)
    saver.put_writes(
        saver_config("t", token=old.token, checkpoint_id=cid), [("__error__", "old")], "task"
    )
    new = saver.take_over("t", "new", 10)
    with pytest.raises(StaleClaim):
        saver.put_writes(
            saver_config("t", token=old.token, checkpoint_id=cid), [("x", 1)], "task-2"
        )
    saver.put_writes(
        saver_config("t", token=new.token, checkpoint_id=cid), [("__error__", "new")], "task"
    )
    got = saver.get_tuple(saver_config("t", checkpoint_id=cid))
    assert got is not None and got.pending_writes == [("task", "__error__", "new")]
    with psycopg.connect(pg_dsn) as conn:
        tokens = conn.execute("SELECT token FROM lgfs_writes").fetchall()
    assert tokens == [(new.token,)]


def test_a_fenced_put_writes_too_big_for_one_statement_lands_whole_or_not_at_all(
    open_pg: Any, pg_dsn: str
) -> None:
    """More writes than one `lgfs_put_writes` statement takes (65535 parameters) take the
    statement-by-statement path: every write lands, in order, with one event; a stale
    token refuses the whole call and stores nothing."""
    saver = open_pg()
    old = saver.claim("t", "old", 10)
    cid = put(saver, "t", token=old.token, source="update", step=1)
    n = txns._MAX_BATCH_WRITES + 1
    writes = [(f"ch{i}", i) for i in range(n)]
    before = _count(pg_dsn, "lgfs_events")
    saver.put_writes(saver_config("t", token=old.token, checkpoint_id=cid), writes, "task")
    got = saver.get_tuple(saver_config("t", checkpoint_id=cid))
    assert got is not None and got.pending_writes == [("task", c, v) for c, v in writes]
    assert _count(pg_dsn, "lgfs_events") == before + 1
    new = saver.take_over("t", "new", 10)
    rows, events = _count(pg_dsn, "lgfs_writes"), _count(pg_dsn, "lgfs_events")
    with pytest.raises(StaleClaim):
        saver.put_writes(saver_config("t", token=old.token, checkpoint_id=cid), writes, "task-2")
    assert (_count(pg_dsn, "lgfs_writes"), _count(pg_dsn, "lgfs_events")) == (rows, events)
    saver.release("t", new.token)


def test_an_expired_unreplaced_holder_still_writes_and_so_does_an_unfenced_writer(
    open_pg: Any, clock: ManualClock
) -> None:
    """Expiry alone fences nobody (docs/semantics.md §2): the fence compares tokens only;
    once the claim has expired, an unfenced write is accepted too."""
    saver = open_pg()
    granted = saver.claim("t", "alice", 10)
    clock.advance(60)
    first = put(saver, "t", token=granted.token, source="update", step=1)
    second = put(saver, "t", parent=first, source="update", step=1)
    got = saver.get_tuple(saver_config("t"))
    assert got is not None and got.checkpoint["id"] == second


def test_wait_events_on_a_pool_listens_on_a_connection_of_its_own(pg_dsn: str) -> None:
    """A pooled saver's waiter holds no pool connection while it waits (max_size=1 here),
    and wakes for a commit made through that same pool."""
    with ConnectionPool(pg_dsn, min_size=1, max_size=1, open=True) as pool:
        saver = FencedPostgresSaver(pool, poll_interval=30)
        saver.setup()
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.extend(saver.wait_events("t", timeout=30)))
        waiter.start()
        time.sleep(0.3)
        started = time.monotonic()
        put(
            saver, "t", source="update", step=1
        )  # would block for the pool's only connection if the waiter held it
        waiter.join(timeout=30)
        assert [e.kind for e in got] == ["checkpoint"]
        assert time.monotonic() - started < 10  # woken by NOTIFY, not the 30 s poll


def test_keep_latest_keeps_the_delta_chain_as_sqlite_does(open_pg: Any, tmp_path: Any) -> None:
    """prune(keep_latest) keeps what the latest DeltaChannel state needs; every state rebuilds.

    One rule for both stores (`retention.plan_prune`). PostgreSQL's first
    version removed all but the latest, and the latest then rebuilt wrong.
    """
    from support.graphs import delta_graph, history_values, run_log

    from langgraph_fenced_sqlite import FencedSqliteSaver

    def prune_after_three_turns(saver: Any) -> tuple[int, int]:
        graph = delta_graph(saver, snapshot_every=5)
        for i in range(3):
            run_log(graph, "t", f"u{i}", durability="sync")
        cfg = {"configurable": {"thread_id": "t"}}
        latest = saver.get_tuple(cfg)
        assert "log" not in latest.checkpoint["channel_values"], "latest must need its chain"
        before, values = history_values(graph, "t"), graph.get_state(cfg).values
        (result,) = saver.prune(["t"], strategy="keep_latest")
        assert result.checkpoints, "nothing was pruned: the test proves nothing"
        assert graph.get_state(cfg).values == values
        after = history_values(graph, "t")
        assert all(state == before[cid] for cid, state in after.items())
        return len(result.checkpoints), len(after)

    with FencedSqliteSaver(str(tmp_path / "t.db")) as lite:
        expected = prune_after_three_turns(lite)
    assert expected[1] > 1, "SQLite kept no chain: the test proves nothing"
    assert prune_after_three_turns(open_pg()) == expected


def _floor_facts(saver: Any, result: Any, before: list[Any], old_floor: int) -> bool:
    """Check a prune's floor against the store's own log; return whether it moved.

    The floor's number depends on the order LangGraph's writes committed in,
    which differs from run to run and store to store (a step's writes and
    its put race even with durability "sync"), so tests compare this, not it:
    no event of a checkpoint still stored went below the floor, and
    `events_removed` counts what did.
    """
    kept = {
        (t.config["configurable"]["checkpoint_ns"], t.config["configurable"]["checkpoint_id"])
        for t in saver.list({"configurable": {"thread_id": result.thread_id}})
    }
    lost = [e.seq for e in before if (e.checkpoint_ns, e.checkpoint_id) in kept]
    assert all(seq >= result.floor for seq in lost), "a kept checkpoint's events went"
    assert result.events_removed == result.floor - old_floor
    return bool(result.floor > old_floor)


def test_prune_results_floor_and_log_are_the_same_on_both_stores(
    open_pg: Any, tmp_path: Any
) -> None:
    """keep_latest and delete: the same counts, orphan writes and `pruned` events; the
    floor moves as the store's own log says (`_floor_facts`)."""
    from support.graphs import delta_graph, run_log

    from langgraph_fenced_sqlite import FencedSqliteSaver

    def scenario(saver: Any) -> list[Any]:
        graph = delta_graph(saver, snapshot_every=5)
        for i in range(3):
            run_log(graph, "t", f"u{i}", durability="sync")
        out: list[Any] = []
        floor = 1
        for strategy in ("keep_latest", "keep_latest", "delete"):
            before = saver.events_after("t", floor - 1, 1000)
            (result,) = saver.prune(["t"], strategy=strategy)
            log = saver.events_after("t", result.floor - 1, 1000)
            moved = _floor_facts(saver, result, before, floor) if strategy != "delete" else None
            if strategy == "delete":  # past every event: only the `pruned` event is left
                assert [e.kind for e in log] == ["pruned"] and log[0].seq == result.floor
            out.append(
                (
                    len(result.checkpoints),
                    moved,
                    result.writes_removed,
                    [(e.kind, e.data.get("writes")) for e in log if e.kind == "pruned"],
                )
            )
            floor = result.floor
            run_log(graph, "t", "more", durability="sync")
        return out

    with FencedSqliteSaver(str(tmp_path / "t.db")) as lite:
        expected = scenario(lite)
    assert expected[0][0] and expected[0][1], "keep_latest moved nothing: proves nothing"
    assert scenario(open_pg()) == expected


@pytest.mark.parametrize(
    "policy",
    [
        RetentionPolicy(max_checkpoints=2),
        RetentionPolicy(max_events=3),
        RetentionPolicy(max_subgraph_runs=0),
        RetentionPolicy(max_subgraph_runs=1, max_checkpoints=1),
    ],
    ids=["count", "events", "no-past-subgraph-runs", "one-run-one-checkpoint"],
)
def test_a_retention_policy_prunes_as_on_sqlite(
    open_pg: Any, tmp_path: Any, policy: RetentionPolicy
) -> None:
    """prune(strategy=RetentionPolicy(...)): the same removals, floor and orphans on both
    stores, with subgraph runs; no event logged; every kept state rebuilds; dry runs change
    nothing."""
    from langgraph_fenced_sqlite import FencedSqliteSaver
    from langgraph_fenced_sqlite.testing.cases_history import _graph

    def scenario(saver: Any) -> list[Any]:
        graph = _graph(saver)
        cfg = {"configurable": {"thread_id": "t"}}
        for i in range(3):
            graph.invoke({"log": [f"u{i}"]}, cfg, durability="sync")
        values = graph.get_state(cfg).values
        log_before = saver.events_after("t", 0, 1000)
        seqs = [e.seq for e in log_before]
        (dry,) = saver.prune(["t"], strategy=policy, dry_run=True)
        assert [e.seq for e in saver.events_after("t", 0, 1000)] == seqs, "a dry run changed"
        (done,) = saver.prune(["t"], strategy=policy)
        assert done == dry, "the dry run reported something else"
        kept = list(saver.list({"configurable": {"thread_id": "t"}}))
        assert graph.get_state(cfg).values == values
        left = saver.events_after("t", done.floor - 1, 1000)
        assert all(e.kind != "pruned" for e in left), "a policy's prune logged an event"
        namespaces = sorted({t.config["configurable"]["checkpoint_ns"].split(":")[0] for t in kept})
        # With max_events the floor is next seq - max_events, whatever the order.
        floor = done.floor if policy.max_events is not None else None
        if policy.max_events is None:
            _floor_facts(saver, done, log_before, 1)
        return [len(done.checkpoints), floor, done.writes_removed, len(kept), namespaces]

    with FencedSqliteSaver(str(tmp_path / "t.db")) as lite:
        expected = scenario(lite)
    assert expected[0] or expected[1], "nothing was pruned: the test proves nothing"
    assert scenario(open_pg()) == expected


def test_sweep_prunes_idle_unclaimed_threads_as_on_sqlite(
    open_pg: Any, clock: ManualClock, tmp_path: Any
) -> None:
    """sweep(): idle threads pruned by the policy, claimed ones left alone (busy), recent
    ones and tombstones skipped; a dry run reports the same and changes nothing."""
    from langgraph_fenced_sqlite import FencedSqliteSaver
    from langgraph_fenced_sqlite.testing.cases_history import _graph

    def scenario(saver: Any, clock: ManualClock) -> list[Any]:
        graph = _graph(saver)
        for thread_id in ("idle", "claimed", "gone"):
            for i in range(2):
                config = {"configurable": {"thread_id": thread_id}}
                graph.invoke({"log": [f"u{i}"]}, config, durability="sync")
        saver.delete_thread("gone")
        clock.advance(100)
        graph.invoke({"log": ["new"]}, {"configurable": {"thread_id": "recent"}}, durability="sync")
        saver.claim("claimed", "w", 600)
        policy = RetentionPolicy(max_checkpoints=1)
        before = len(list(saver.list(None)))
        dry = saver.sweep(policy, inactive_for=50, dry_run=True)
        assert len(list(saver.list(None))) == before, "a dry run removed something"
        seen: list[Any] = []
        done = saver.sweep(policy, inactive_for=50, on_thread=seen.append)
        assert dry == done and seen == done.pruned
        everything = saver.sweep(policy)  # no activity filter: "recent" too
        with pytest.raises(InvalidArgument, match="policy"):
            saver.sweep("keep_latest")
        return [
            [(r.thread_id, len(r.checkpoints), r.floor > 1) for r in done.pruned],
            done.busy,
            done.errors,
            [r.thread_id for r in everything.pruned],
            everything.busy,
        ]

    sqlite_clock = ManualClock(clock.now())
    with FencedSqliteSaver(str(tmp_path / "t.db"), clock=sqlite_clock) as lite:
        expected = scenario(lite, sqlite_clock)
    assert expected[0] and expected[0][0][0] == "idle" and expected[0][0][1] > 0
    assert expected[1] == ["claimed"] and expected[3] == ["idle", "recent"]
    assert scenario(open_pg(), clock) == expected


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://lgfs:hunter2@[::1/db",  # libpq quotes the malformed URL whole
        "postgresql://lgfs:hun ter2@127.0.0.1:1/db",  # and the part with the space
        "postgresql://lgfs@[::1/db?password=hunter2",
    ],
)
def test_a_connect_error_never_shows_the_password(dsn: str) -> None:
    """`from_conn_string`'s connect error names what failed, with the password as `***`."""
    with pytest.raises(StoreError, match="connect failed") as caught:
        with FencedPostgresSaver.from_conn_string(dsn):
            pass
    assert "hunter2" not in str(caught.value) and "hun ter2" not in str(caught.value)
    assert "***" in str(caught.value)
