"""Native async calls on PostgreSQL: `aput`, `aput_writes` and `aget_tuple` without a thread hop.

The hot async calls run on the caller's event loop, on the store's own async
connections (`postgres/native.py`), with the step merging of the sync path
(`Steps.await_put`). Pinned here against the real server: no hop once a
loop has its connection, one commit per step through `ainvoke`, the
session a native connection takes from the store's (schema, timeouts; and
never another role), a cancelled write that never runs later, a stale
step refused with each caller's own error, the connections of a closed
loop and of a closed store closed, backends the server ended replaced
before use, and concurrent tasks beyond `KEEP` served by the hop.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint
from psycopg.conninfo import make_conninfo
from support.configs import saver_config
from support.graphs import chain_graph
from support.waiting import put_writes_in_thread, until

from langgraph_fenced_sqlite import RetentionPolicy, StaleClaim, WrongProcess
from langgraph_fenced_sqlite.postgres import FencedPostgresSaver, txns
from langgraph_fenced_sqlite.postgres.native import NativeConns


def _root(saver: Any, token: int, thread_id: str = "t") -> Any:
    """Put a thread's first checkpoint (the input's), through the sync API."""
    root = empty_checkpoint()
    saver.put(saver_config(thread_id, token=token), root, {"source": "input", "step": -1}, {})
    return root


async def _aroot(saver: Any, token: int, thread_id: str = "t") -> Any:
    """`_root` through the async API."""
    root = empty_checkpoint()
    await saver.aput(
        saver_config(thread_id, token=token), root, {"source": "input", "step": -1}, {}
    )
    return root


def _hops(saver: Any) -> list[str]:
    """Record the name of every sync method `saver`'s async calls hand to the hop from now on."""
    names: list[str] = []
    real = saver._engine.arun

    async def counting(method: Any, *args: Any, **kwargs: Any) -> Any:
        names.append(method.__name__)
        return await real(method, *args, **kwargs)

    saver._engine.arun = counting
    return names


async def _step(saver: Any, token: int, parent: Any, thread_id: str = "t") -> Any:
    """One step as LangGraph's async loop sends it: a task's writes, then the child put."""
    cp = create_checkpoint(parent, None, 1)
    writes = asyncio.ensure_future(
        saver.aput_writes(
            saver_config(thread_id, token=token, checkpoint_id=parent["id"]), [("x", 1)], "task"
        )
    )
    await asyncio.sleep(0)  # the write is queued, waiting for its put
    put = saver.aput(
        saver_config(thread_id, token=token, checkpoint_id=parent["id"]),
        cp,
        {"source": "loop", "step": 1},
        {},
    )
    # Both awaited, whatever either raised. An error left unretrieved is
    # logged from whichever thread collects its task, and CPython 3.11's
    # traceback formatting calls `ast.parse`, whose recursion counter is
    # shared between threads: seen here, a later `ast.parse` on the main
    # thread (pytest rewriting an import) then failed with "SystemError: AST
    # constructor recursion depth mismatch".
    for outcome in await asyncio.gather(writes, put, return_exceptions=True):
        if isinstance(outcome, BaseException):
            raise outcome
    return cp


def test_the_hot_async_calls_take_no_hop_once_the_loop_has_its_connection(open_pg: Any) -> None:
    saver = open_pg()
    claim = saver.claim("t", "w", 60)
    hops = _hops(saver)

    async def run() -> Any:
        root = await _aroot(saver, claim.token)
        opened = list(hops)  # the first call read the store's session once (`_session`)
        child = await _step(saver, claim.token, root)
        got = await saver.aget_tuple(saver_config("t"))
        return opened, child, got

    opened, child, got = asyncio.run(run())
    assert opened == ["run"]
    assert hops == ["run"]  # nothing since: aput, aput_writes, aget_tuple all native
    assert got.checkpoint["id"] == child["id"]
    assert got.pending_writes == []  # the child has none; its parent has the step's
    parent = saver.get_tuple(
        saver_config("t", checkpoint_id=got.parent_config["configurable"]["checkpoint_id"])
    )
    assert [(w[1], w[2]) for w in parent.pending_writes] == [("x", 1)]


def test_an_ainvoke_commits_once_per_step_without_a_hop(open_pg: Any, generous: None) -> None:
    saver = open_pg(clock=None)
    graph = chain_graph(saver, trail=False)
    config = saver.claim("t", "w", 3600).config()

    async def run() -> list[Any]:
        await graph.ainvoke({"count": 0}, config, durability="sync")  # opens the connection
        hops = _hops(saver)
        before = saver.commit_stats()
        out = [await graph.ainvoke({"count": 0}, config, durability="sync") for _ in range(3)]
        return [out, hops, before]

    out, hops, before = asyncio.run(run())
    after = saver.commit_stats()
    assert out == [{"count": 5}] * 3
    # The input's put, then six steps (writes + put): 7 commits an invoke.
    assert after["commits"] - before["commits"] == 7 * 3
    assert after["joined"] - before["joined"] == 6 * 3
    # LangGraph's own reads of the thread's state (`aget_tuple`) and every
    # write went native: nothing took the hop.
    assert hops == []


def test_a_native_connection_takes_the_stores_schema_and_timeouts(
    open_pg: Any, pg_server: Any
) -> None:
    """A session set after connecting (`SET`, or a pool's `configure`) is not in the conninfo."""
    schema = f"t_{secrets.token_hex(8)}"
    conn = psycopg.connect(pg_server.dsn, autocommit=True)
    try:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"SET search_path TO {schema}")
        conn.execute("SET lock_timeout = '1234ms'")
        saver = FencedPostgresSaver(conn)
        saver.setup()
        claim = saver.claim("t", "w", 60)

        async def run() -> Any:
            await _aroot(saver, claim.token)
            got = await saver.aget_tuple(saver_config("t"))
            (_, native), *_ = saver._engine.natives._idle
            cur = await native.execute(
                "SELECT current_setting('search_path'), current_setting('lock_timeout')"
            )
            return got, await cur.fetchone()

        got, session = asyncio.run(run())
        assert got is not None
        assert session == (schema, "1234ms")
        # The row is in the store's schema, where its sync calls read.
        assert saver.get_tuple(saver_config("t")).checkpoint["id"] == got.checkpoint["id"]
        saver.close()
    finally:
        conn.close()


def test_a_store_under_another_role_never_goes_native(pg_server: Any) -> None:
    """`SET ROLE` (a pool's `configure` may) cannot be had by logging in: the hop, always."""
    schema, role = f"t_{secrets.token_hex(8)}", f"r_{secrets.token_hex(8)}"
    admin = psycopg.connect(pg_server.dsn, autocommit=True)
    conn = psycopg.connect(make_conninfo(pg_server.dsn), autocommit=True)
    try:
        admin.execute(f"CREATE ROLE {role}")
        admin.execute(f"CREATE SCHEMA {schema} AUTHORIZATION {role}")
        conn.execute(f"SET ROLE {role}")
        conn.execute(f"SET search_path TO {schema}")
        saver = FencedPostgresSaver(conn)
        saver.setup()
        claim = saver.claim("t", "w", 60)
        hops = _hops(saver)

        async def run() -> Any:
            await _aroot(saver, claim.token)
            return await saver.aget_tuple(saver_config("t"))

        assert asyncio.run(run()) is not None
        assert saver._engine.natives._off
        assert hops == ["run", "_alone", "run"]  # the session read, then both calls hopped
        saver.close()
    finally:
        conn.close()
        admin.execute(f"DROP SCHEMA {schema} CASCADE")
        admin.execute(f"DROP ROLE {role}")
        admin.close()


def test_a_sync_write_and_a_native_put_share_one_commit_and_the_reverse(
    open_pg: Any, generous: None
) -> None:
    """A waiter of either kind is woken by a put of the other: a thread's, or a coroutine's."""
    saver = open_pg()
    claim = saver.claim("t", "w", 60)
    root = _root(saver, claim.token)
    before = saver.commit_stats()
    # A thread's write, taken by a native put.
    out: dict[str, Any] = {}
    thread = put_writes_in_thread(
        saver, saver_config("t", token=claim.token, checkpoint_id=root["id"]), out
    )
    until(lambda: saver._engine.steps._queue)
    child = create_checkpoint(root, None, 1)
    asyncio.run(
        saver.aput(
            saver_config("t", token=claim.token, checkpoint_id=root["id"]), child, {"step": 0}, {}
        )
    )
    thread.join()
    assert out["writes"] is None
    # A coroutine's write (on a loop in another thread), taken by a sync put.
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever)
    runner.start()
    try:
        config = saver_config("t", token=claim.token, checkpoint_id=child["id"])
        waiting = asyncio.run_coroutine_threadsafe(
            saver.aput_writes(config, [("y", 2)], "task-2"), loop
        )
        until(lambda: saver._engine.steps._queue)
        grandchild = create_checkpoint(child, None, 2)
        saver.put(config, grandchild, {"step": 1}, {})
        assert waiting.result(timeout=10) is None
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join()
        loop.close()
    after = saver.commit_stats()
    assert after["commits"] - before["commits"] == 2
    assert after["joined"] - before["joined"] == 2
    written = [
        saver.get_tuple(saver_config("t", checkpoint_id=c["id"])).pending_writes
        for c in (root, child)
    ]
    assert [[(w[1], w[2]) for w in ws] for ws in written] == [[("x", 1)], [("y", 2)]]


def test_a_write_cancelled_while_it_waits_for_its_put_never_runs(
    open_pg: Any, generous: None
) -> None:
    saver = open_pg()
    claim = saver.claim("t", "w", 60)

    async def run() -> Any:
        root = await _aroot(saver, claim.token)
        config = saver_config("t", token=claim.token, checkpoint_id=root["id"])
        waiting = asyncio.ensure_future(saver.aput_writes(config, [("x", 1)], "task"))
        await asyncio.sleep(0)
        assert len(saver._engine.steps._queue) == 1  # waiting (up to 5 s) for its put
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert saver._engine.steps._queue == []
        child = create_checkpoint(root, None, 1)
        await saver.aput(config, child, {"source": "loop", "step": 0}, {})
        return root

    root = asyncio.run(run())
    assert saver.get_tuple(saver_config("t", checkpoint_id=root["id"])).pending_writes == []
    assert saver.commit_stats()["joined"] == 0


def test_a_stale_step_gets_stale_claim_for_each_call_and_stores_nothing(
    open_pg: Any, generous: None
) -> None:
    saver = open_pg()
    old = saver.claim("t", "w", 60)
    root = _root(saver, old.token)
    saver.take_over("t", "w2", 60)

    async def run() -> list[Any]:
        config = saver_config("t", token=old.token, checkpoint_id=root["id"])
        child = create_checkpoint(root, None, 1)
        writes = asyncio.ensure_future(saver.aput_writes(config, [("x", 1)], "task"))
        await asyncio.sleep(0)
        put = asyncio.ensure_future(saver.aput(config, child, {"step": 0}, {}))
        return await asyncio.gather(writes, put, return_exceptions=True)

    results = asyncio.run(run())
    assert [type(r) for r in results] == [StaleClaim, StaleClaim]
    assert saver.get_tuple(saver_config("t")).checkpoint["id"] == root["id"]
    assert saver.get_tuple(saver_config("t", checkpoint_id=root["id"])).pending_writes == []


def test_a_closed_loops_connection_and_a_closed_stores_are_closed(open_pg: Any) -> None:
    saver = open_pg()
    natives = saver._engine.natives

    async def read() -> Any:
        await saver.aget_tuple(saver_config("t"))
        return natives._idle[-1][1]

    first = asyncio.run(read())
    assert not first.closed  # kept: its loop is closed, which the next take finds
    second = asyncio.run(read())
    assert first.closed and not second.closed
    assert [conn for _, conn in natives._idle] == [second]
    saver.close()
    assert second.closed and natives._idle == []


def test_native_backends_the_server_ended_while_idle_are_replaced_before_use(
    open_pg: Any, pg_server: Any
) -> None:
    """As after a server restart: every kept connection of the loop is dead, and no call fails."""
    saver = open_pg()
    claim = saver.claim("t", "w", 60)

    async def run() -> Any:
        root = await _aroot(saver, claim.token)
        await asyncio.gather(*(saver.aget_tuple(saver_config("t")) for _ in range(4)))
        kept = [conn for _, conn in saver._engine.natives._idle]
        assert len(kept) == NativeConns.KEEP  # both opened by the concurrent reads
        pids = [conn.info.backend_pid for conn in kept]
        with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
            for pid in pids:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            gone = "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = ANY(%s)"
            until(lambda: admin.execute(gone, (pids,)).fetchone()[0])
        hops = _hops(saver)
        got = await saver.aget_tuple(saver_config("t"))
        child = await _step(saver, claim.token, root)
        return kept, hops, got, child

    kept, hops, got, child = asyncio.run(run())
    assert got is not None
    assert all(conn.closed for conn in kept)  # found ended, closed, never used
    assert hops == []  # a new native connection served both calls
    assert saver.get_tuple(saver_config("t")).checkpoint["id"] == child["id"]


def test_concurrent_tasks_beyond_keep_take_the_hop_and_all_land(open_pg: Any) -> None:
    saver = open_pg()
    threads = [f"t{i}" for i in range(8)]
    claims = {t: saver.claim(t, "w", 60) for t in threads}
    hops = _hops(saver)

    async def chain(thread_id: str) -> None:
        token = claims[thread_id].token
        parent = await _aroot(saver, token, thread_id)
        for _ in range(10):
            parent = await _step(saver, token, parent, thread_id)

    async def run() -> int:
        await asyncio.gather(*(chain(t) for t in threads))
        loop = asyncio.get_running_loop()
        return saver._engine.natives._open.get(loop, 0)

    open_on_loop = asyncio.run(run())
    assert open_on_loop <= NativeConns.KEEP
    assert "_alone" in hops or "_joint" in hops  # the hop served what the two could not
    for t in threads:
        assert len(list(saver.list(saver_config(t)))) == 11


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_cancelling_an_ainvoke_cancels_its_put_in_flight_with_durability_sync(
    open_pg: Any, durability: str
) -> None:
    """A LangGraph behaviour native writes must survive: a cancelled run cancels its put.

    With durability "sync" the run awaits the step's put itself, so a
    cancel (the runner's "interrupt", a cancelled request) lands in the put;
    with "async" LangGraph's executor awaits it apart and it runs on. A
    native write therefore runs as a task of its own (`_to_the_end`).
    """
    saver = open_pg()
    graph = chain_graph(saver, trail=False)
    config = saver.claim("t", "w", 3600).config()
    outcomes: list[str] = []
    real = saver.aput

    async def slow_aput(*args: Any, **kwargs: Any) -> Any:
        first = not outcomes
        try:
            if first:
                outcomes.append("started")
                await asyncio.sleep(0.3)
            out = await real(*args, **kwargs)
        except BaseException as exc:
            outcomes.append(type(exc).__name__)
            raise
        if first:
            outcomes.append("stored")
        return out

    saver.aput = slow_aput

    async def run() -> None:
        task = asyncio.ensure_future(graph.ainvoke({"count": 0}, config, durability=durability))
        await _until_async(lambda: outcomes)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert outcomes[:2] == ["started", "CancelledError" if durability == "sync" else "stored"]


def test_a_native_write_cancelled_mid_statement_runs_to_its_end(
    open_pg: Any, pg_server: Any, pg_dsn: str
) -> None:
    """As a write handed to the hop: the await ends, the write lands, the connection stays."""
    saver = open_pg()
    claim = saver.claim("t", "w", 60)
    blocker = psycopg.connect(pg_dsn)  # holds the thread's row: the fence waits for it

    async def run() -> Any:
        await _aroot(saver, claim.token)
        (_, native), *_ = saver._engine.natives._idle
        blocker.execute("SELECT 1 FROM lgfs_threads WHERE thread_id = 't' FOR UPDATE")
        child = create_checkpoint(saver.get_tuple(saver_config("t")).checkpoint, None, 1)
        parent_id = child["id"]
        put = asyncio.ensure_future(
            saver.aput(saver_config("t", token=claim.token), child, {"step": 0}, {})
        )
        waiting = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s"
        with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
            await _until_async(
                lambda: admin.execute(waiting, (native.info.backend_pid,)).fetchone()[0]
            )
        put.cancel()
        with pytest.raises(asyncio.CancelledError):
            await put
        blocker.commit()  # the fence goes on; the put commits
        await _until_async(lambda: saver._engine.natives._idle)
        return native, parent_id

    native, child_id = asyncio.run(run())
    assert saver.get_tuple(saver_config("t")).checkpoint["id"] == child_id
    assert not native.closed  # given back clean, not cut off
    blocker.close()


async def _until_async(check: Any, timeout: float = 10.0) -> None:
    """Wait on the loop until `check()` is true."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.001)


def test_alist_pages_natively_and_lists_what_list_lists(open_pg: Any) -> None:
    """Two statements in one read-only snapshot (a pipeline), page after page."""
    saver = open_pg()
    claim = saver.claim("t", "w", 60)
    parent = _root(saver, claim.token)
    for step in range(230):  # past two pages (`base_saver._PAGE`)
        child = create_checkpoint(parent, None, step)
        saver.put(
            saver_config("t", token=claim.token, checkpoint_id=parent["id"]),
            child,
            {"step": step},
            {},
        )
        saver.put_writes(
            saver_config("t", token=claim.token, checkpoint_id=child["id"]), [("x", step)], "task"
        )
        parent = child
    hops: list[str] = []

    async def run() -> list[Any]:
        await saver.aget_tuple(saver_config("t"))  # opens the loop's connection
        hops.extend(_hops(saver))
        return [t async for t in saver.alist(saver_config("t"))]

    listed = asyncio.run(run())
    expected = list(saver.list(saver_config("t")))
    assert [t.config for t in listed] == [t.config for t in expected]
    assert [t.pending_writes for t in listed] == [t.pending_writes for t in expected]
    assert len(listed) == 231
    assert hops == []


def test_a_joint_batch_sent_as_a_pipeline_commits_once_natively(
    open_pg: Any, generous: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the put cannot take the writes into its one statement: their statements, one
    pipeline, one implicit transaction (as `send_batch`)."""
    monkeypatch.setattr(txns._PutBatch, "join", lambda self, writes: None)
    saver = open_pg()
    claim = saver.claim("t", "w", 60)
    root = _root(saver, claim.token)

    async def run() -> Any:
        await saver.aget_tuple(saver_config("t"))  # opens the loop's connection
        hops = _hops(saver)
        before = saver.commit_stats()
        child = await _step(saver, claim.token, root)
        return child, hops, before

    child, hops, before = asyncio.run(run())
    after = saver.commit_stats()
    assert hops == []
    assert after["commits"] - before["commits"] == 1
    assert after["joined"] - before["joined"] == 1
    assert saver.get_tuple(saver_config("t")).checkpoint["id"] == child["id"]
    stored = saver.get_tuple(saver_config("t", checkpoint_id=root["id"]))
    assert [(w[1], w[2]) for w in stored.pending_writes] == [("x", 1)]


def test_a_refused_pipeline_gets_each_callers_error_and_replaces_its_connection(
    open_pg: Any, generous: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(txns._PutBatch, "join", lambda self, writes: None)
    saver = open_pg()
    old = saver.claim("t", "w", 60)
    root = _root(saver, old.token)
    saver.take_over("t", "w2", 60)

    async def run() -> Any:
        await saver.aget_tuple(saver_config("t"))  # opens the loop's connection
        (_, native), *_ = saver._engine.natives._idle
        results = await asyncio.gather(_step(saver, old.token, root), return_exceptions=True)
        return native, results

    native, results = asyncio.run(run())
    assert [type(r) for r in results] == [StaleClaim]
    # A pipeline refused in a later statement leaves psycopg's record of its
    # prepared statements in doubt (`send.recover`): never used again.
    assert native.closed
    assert saver.get_tuple(saver_config("t")).checkpoint["id"] == root["id"]
    assert saver.get_tuple(saver_config("t", checkpoint_id=root["id"])).pending_writes == []


@pytest.mark.parametrize("given", ["pool", "connection"])
def test_a_saver_on_a_pool_made_as_langgraph_documents_works_sync_and_native(
    pg_dsn: str, given: str
) -> None:
    """LangGraph's docs make PostgresSaver's pool or connection with `autocommit`,
    `prepare_threshold=0` (every statement prepared: `setup()` once failed on its
    multi-command migrations) and `dict_row` (native connections take tuples)."""
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    from langgraph_fenced_sqlite import FencedRunner

    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    if given == "pool":
        opened: Any = ConnectionPool(pg_dsn, min_size=1, max_size=4, kwargs=kwargs)
    else:
        opened = psycopg.connect(pg_dsn, **kwargs)
    with opened:
        saver = FencedPostgresSaver(opened)
        saver.setup()
        graph = chain_graph(saver, trail=False)
        runner = FencedRunner(graph, saver, ttl=60)
        config = {"configurable": {"thread_id": "t"}}
        assert runner.invoke({"count": 0}, config) == {"count": 5}

        async def run() -> Any:
            out = await runner.ainvoke({"count": 0}, config)
            hops = _hops(saver)
            history = [t async for t in saver.alist(config)]
            latest = await saver.aget_tuple(config)
            return out, hops, history, latest

        out, hops, history, latest = asyncio.run(run())
        assert out == {"count": 5}
        assert hops == []  # the loop's connection was open: all native
        assert len(history) == 14 == len(list(saver.list(config)))
        assert latest.config == history[0].config
        # The operator's calls on the same connections.
        assert [e.kind for e in saver.events_after("t", 0, limit=3)][:1] == ["run_started"]
        assert saver.wait_events("t", 10**6, timeout=0.1) == []
        assert saver.stats()["checkpoints"] == 14
        (pruned,) = saver.prune(["t"], strategy=RetentionPolicy(max_checkpoints=2))
        assert len(list(saver.list(config))) == 2
        saver.close()


def test_a_forked_child_gets_wrong_process_and_leaves_the_parents_connections(
    open_pg: Any,
) -> None:
    saver = open_pg()

    async def read() -> Any:
        return await saver.aget_tuple(saver_config("t"))

    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(read()) is None  # the parent's loop has its connection
        (_, native), *_ = saver._engine.natives._idle
        pid = os.fork()
        if pid == 0:  # the child: never touches the parent's sockets
            code = 1
            try:
                asyncio.run(read())
            except WrongProcess:
                code = 0
            except BaseException:  # noqa: BLE001 - reported by the exit code
                code = 2
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The same connection serves the parent's next call: the child closed nothing.
        assert loop.run_until_complete(read()) is None
        assert [conn for _, conn in saver._engine.natives._idle] == [native]
        assert not native.closed
    finally:
        loop.close()


def test_an_ended_connection_is_found_without_poll_too(
    open_pg: Any, pg_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows has no `select.poll`: `select.select` finds the server's last words instead."""
    from langgraph_fenced_sqlite.postgres import native as native_module

    saver = open_pg()
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(saver.aget_tuple(saver_config("t")))
        (_, conn), *_ = saver._engine.natives._idle
        monkeypatch.delattr(native_module.select, "poll")
        assert not native_module._ended(conn)
        pid = conn.info.backend_pid
        with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        until(lambda: native_module._ended(conn))
    finally:
        loop.close()
