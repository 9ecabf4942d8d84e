"""The store's lifecycle and connection: open, pragmas, close, GC, fork, re-entry.

As aiosqlite's smoke tests do: close twice, close with queued calls, use after
close, the GC warning, fork. Plus the open path: WAL and synchronous=FULL on
every connection, `setup()` idempotent, `from_conn_string` as a context
manager, and schema setup happening once when many processes open one new file.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import pathlib
import sqlite3
import subprocess
import sys
import textwrap
import threading
import warnings
from typing import Any

import pytest
from conftest import run_together
from langgraph.checkpoint.base import empty_checkpoint

from langgraph_fenced_sqlite import (
    FencedSqliteSaver,
    ManualClock,
    StaleClaim,
    StoreClosed,
    StoreError,
    UnsupportedFormat,
    WrongProcess,
    WrongThread,
)
from langgraph_fenced_sqlite.sqlite import schema as lgfs_schema


def _config(thread_id: str = "t") -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


def _put(saver: FencedSqliteSaver, thread_id: str = "t", step: int = 0) -> dict[str, Any]:
    cp = empty_checkpoint()
    cp["channel_values"] = {"step": step}
    return saver.put(_config(thread_id), cp, {"source": "loop", "step": step}, {})


def _dump(path: str) -> list[Any]:
    conn = sqlite3.connect(path)
    try:
        rows: list[Any] = list(conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY 2"))
        rows.append(conn.execute("PRAGMA user_version").fetchone())
        rows.append(conn.execute("PRAGMA application_id").fetchone())
        rows.extend(conn.execute("SELECT * FROM meta ORDER BY key"))
        return rows
    finally:
        conn.close()


# --- opening --------------------------------------------------------------------------


def test_connection_pragmas(open_store: Any, db_path: str) -> None:
    """Every store's connection is in WAL mode with synchronous=FULL and its busy timeout."""
    for busy in (5.0, 0.25):
        saver = open_store(busy_timeout=busy)
        conn = saver._engine._conn
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == int(busy * 1000)
        assert conn.isolation_level is None  # we issue BEGIN IMMEDIATE ourselves


def test_setup_is_idempotent(open_store: Any, db_path: str) -> None:
    """`setup()` / `asetup()` any number of times change nothing and keep data."""
    saver = open_store()
    config = _put(saver)
    before = _dump(db_path)
    saver.setup()
    saver.setup()
    asyncio.run(saver.asetup())
    assert _dump(db_path) == before
    assert saver.get_tuple(config) is not None
    assert saver.stats()["schema_version"] == lgfs_schema.SCHEMA_VERSION


def test_path_like_is_accepted(tmp_path: pathlib.Path) -> None:
    """A `pathlib.Path` opens like its string."""
    with FencedSqliteSaver(tmp_path / "p.db") as saver:
        _put(saver)
        assert saver.path == str(tmp_path / "p.db")


def test_from_conn_string_sync_context_manager(db_path: str) -> None:
    """`with from_conn_string(path) as saver` opens, then closes on exit."""
    with FencedSqliteSaver.from_conn_string(db_path, busy_timeout=1.0) as saver:
        config = _put(saver)
        assert saver.get_tuple(config) is not None
    with pytest.raises(StoreClosed):
        saver.get_tuple(config)
    with FencedSqliteSaver.from_conn_string(db_path) as again:
        assert again.get_tuple(config) is not None


async def test_from_conn_string_async_context_manager(db_path: str) -> None:
    """`async with from_conn_string(path) as saver` opens, then closes on exit."""
    async with FencedSqliteSaver.from_conn_string(db_path) as saver:
        cp = empty_checkpoint()
        config = await saver.aput(_config(), cp, {"source": "loop", "step": 0}, {})
        assert (await saver.aget_tuple(config)).checkpoint["id"] == cp["id"]
    with pytest.raises(StoreClosed):
        await saver.aget_tuple(config)
    # Also closed when the body raises.
    with pytest.raises(RuntimeError):
        async with FencedSqliteSaver.from_conn_string(db_path) as failing:
            raise RuntimeError("body failed")
    with pytest.raises(StoreClosed):
        failing.stats()


def test_saver_is_a_context_manager(db_path: str) -> None:
    """`with FencedSqliteSaver(path)` closes on exit, also when the body raises."""
    with pytest.raises(KeyError):
        with FencedSqliteSaver(db_path) as saver:
            raise KeyError("x")
    with pytest.raises(StoreClosed):
        saver.stats()


def test_empty_file_is_set_up_as_a_new_store(tmp_path: pathlib.Path) -> None:
    """A zero-byte file is adopted (SQLite reads it as an empty database), unlike a text file.

    Pinned because it is the one "not a database" file we do modify: a file
    made with `touch` is how some deployments pre-create the path.
    """
    path = tmp_path / "touched.db"
    path.touch()
    with FencedSqliteSaver(str(path)) as saver:
        _put(saver)
        assert saver.stats()["schema_version"] == lgfs_schema.SCHEMA_VERSION


def test_refused_open_leaves_no_store_to_close(tmp_path: pathlib.Path) -> None:
    """An open that fails warns nothing later: there is no half-open store to leak.

    Engine.__init__ used to mark itself open before connecting, so a refused
    file (missing directory, not a database) later warned "not closed" from
    `__del__`, a ResourceWarning this project's pytest config turns into an error.
    """
    not_a_db = tmp_path / "text.db"
    not_a_db.write_bytes(b"plain text, not sqlite\n" * 100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(StoreError):
            FencedSqliteSaver(str(tmp_path / "missing" / "x.db"))
        with pytest.raises(UnsupportedFormat):
            FencedSqliteSaver(str(not_a_db))
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []


# --- closing ----------------------------------------------------------------------------


def test_close_twice_and_use_after_close(db_path: str) -> None:
    """`close()` twice is fine; sync and async calls afterwards raise StoreClosed."""
    saver = FencedSqliteSaver(db_path)
    config = _put(saver)
    saver.close()
    saver.close()
    asyncio.run(saver.aclose())
    assert saver._engine.closed
    with pytest.raises(StoreClosed) as exc:
        saver.put(config, empty_checkpoint(), {"source": "loop", "step": 1}, {})
    assert exc.value.op == "put" and exc.value.path == db_path
    with pytest.raises(StoreClosed):
        asyncio.run(saver.aget_tuple(config))
    with pytest.raises(StoreClosed):
        list(saver.list(None))


class GateClock(ManualClock):
    """A manual clock whose `now()` can be made to block until released.

    Claims read the clock inside the store's critical section, so a blocked
    `now()` holds the store's lock for as long as the test wants.
    """

    def __init__(self) -> None:
        """Start open (not blocking)."""
        super().__init__()
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def now(self) -> float:
        """Block while armed, after signalling `entered`."""
        if self.armed and threading.current_thread().name == "holder":
            self.entered.set()
            assert self.release.wait(timeout=30), "test never released the clock"
        return super().now()


def test_close_with_queued_calls_never_hangs(db_path: str) -> None:
    """Calls queued behind a running one, when close() comes, finish or raise StoreClosed."""
    clock = GateClock()
    saver = FencedSqliteSaver(db_path, clock=clock)
    config = _put(saver)
    clock.armed = True
    outcomes: dict[str, Any] = {}

    def call(name: str, fn: Any) -> None:
        try:
            outcomes[name] = ("ok", fn())
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcomes[name] = ("error", exc)

    holder = threading.Thread(
        target=call, args=("holder", lambda: saver.claim("t2", "a", 10)), name="holder"
    )
    holder.start()
    assert clock.entered.wait(timeout=10)
    queued = [
        threading.Thread(target=call, args=(f"get-{i}", lambda: saver.get_tuple(config)))
        for i in range(4)
    ] + [
        threading.Thread(target=call, args=(f"put-{i}", lambda i=i: _put(saver, f"q{i}", i)))
        for i in range(4)
    ]

    async def async_calls() -> list[Any]:
        return await asyncio.gather(
            *(saver.aget_tuple(config) for _ in range(4)), return_exceptions=True
        )

    async_results: list[Any] = []
    runner = threading.Thread(target=lambda: async_results.extend(asyncio.run(async_calls())))
    for t in [*queued, runner]:
        t.start()
    closer = threading.Thread(target=call, args=("close", saver.close))
    closer.start()
    # Give the queued calls and close() time to reach the lock (a bounded pause,
    # not a timing assertion: any interleaving must end in "ok" or StoreClosed).
    closer.join(timeout=0.3)
    assert closer.is_alive(), "close() did not wait for the call in progress"
    clock.release.set()
    for t in [holder, *queued, runner, closer]:
        t.join(timeout=30)
        assert not t.is_alive(), f"{t.name} hung"
    assert outcomes["close"] == ("ok", None)
    assert outcomes["holder"][0] == "ok"  # the running call completed
    results = [outcomes[n] for n in outcomes if n not in ("close", "holder")]
    results += [("error", r) if isinstance(r, BaseException) else ("ok", r) for r in async_results]
    assert len(results) == 12
    for kind, value in results:
        assert kind == "ok" or isinstance(value, StoreClosed), value
    assert saver._engine.closed
    # What did land is durable and readable by the next store.
    with FencedSqliteSaver(db_path) as again:
        assert again.current_claim("t2") is not None


def test_gc_of_unclosed_saver_warns(db_path: str) -> None:
    """A saver garbage-collected without close() emits a ResourceWarning naming the file."""
    saver = FencedSqliteSaver(db_path)
    conn = saver._engine._conn
    with pytest.warns(ResourceWarning, match="not closed"):
        del saver
        gc.collect()
    conn.close()  # the connection outlives the warning; close it for this test's sake


def test_closed_saver_is_collected_silently(db_path: str) -> None:
    """A closed saver emits no warning when collected."""
    saver = FencedSqliteSaver(db_path)
    saver.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del saver
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []


# --- wrong process, wrong thread -----------------------------------------------------


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_forked_child_gets_wrong_process(db_path: str) -> None:
    """A store used in a forked child raises WrongProcess; the parent's store is unharmed."""
    saver = FencedSqliteSaver(db_path)
    try:
        config = _put(saver)
        pid = os.fork()
        if pid == 0:  # the child: report by exit code only, never return into pytest
            code = 10
            try:
                try:
                    saver.get_tuple(config)
                    code = 1
                except WrongProcess as exc:
                    code = 0 if "fork" in str(exc) and exc.path == db_path else 3
                try:
                    _put(saver, "child", 1)
                    code = 4
                except WrongProcess:
                    pass
                saver.close()  # must not close the parent's connection
            except BaseException:  # noqa: BLE001
                code = 5
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, os.WEXITSTATUS(status)
        # The parent goes on using its store.
        assert saver.get_tuple(config) is not None
        _put(saver, "parent", 2)
        assert saver.get_tuple(_config("child")) is None
    finally:
        saver.close()


def test_reentrant_call_from_clock_is_wrong_thread(db_path: str) -> None:
    """A clock that calls back into the store (inside its critical section) gets WrongThread."""
    box: dict[str, Any] = {}

    class CallbackClock(ManualClock):
        def now(self) -> float:
            callback = box.pop("callback", None)
            if callback is not None:
                callback()
            return super().now()

    saver = FencedSqliteSaver(db_path, clock=CallbackClock())
    try:
        config = _put(saver)
        for name, callback in [
            ("get_tuple", lambda: saver.get_tuple(config)),
            ("claim", lambda: saver.claim("other", "x", 5)),
            ("close", saver.close),
        ]:
            box["callback"] = callback
            result: dict[str, Any] = {}

            def attempt(result: dict[str, Any] = result) -> None:
                try:
                    saver.claim("t", "alice", 10)
                    result["outcome"] = "claimed"
                except BaseException as error:  # noqa: BLE001
                    result["outcome"] = error

            worker = threading.Thread(target=attempt)
            worker.start()
            worker.join(timeout=30)
            assert not worker.is_alive(), f"re-entrant {name} deadlocked"
            exc = result["outcome"]
            assert isinstance(exc, WrongThread), exc
            assert exc.op == name and db_path in str(exc), str(exc)
            # The outer call failed and changed nothing; the store is still usable.
            assert saver.current_claim("t") is None
            assert not saver._engine.closed
        granted = saver.claim("t", "alice", 10)
        assert saver.current_claim("t") == granted
    finally:
        saver.close()


def test_serializer_runs_outside_the_lock(db_path: str) -> None:
    """A serializer that calls the store while encoding/decoding works: serde runs unlocked.

    Encoding happens before the engine job and decoding after it, so a
    serializer may itself read the store (say, for a cache) without WrongThread.
    """
    from langgraph_fenced_sqlite import DataOnlySerializer

    holder: dict[str, FencedSqliteSaver] = {}
    seen: list[str] = []

    class Peeking(DataOnlySerializer):
        def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
            if "saver" in holder:
                seen.append(f"dump:{len(holder['saver'].events_after('t', 0, 100))}")
            return super().dumps_typed(obj)

        def loads_typed(self, data: tuple[str, bytes]) -> Any:
            if "saver" in holder:
                seen.append(f"load:{holder['saver'].stats()['checkpoints']}")
            return super().loads_typed(data)

    with FencedSqliteSaver(db_path, serde=Peeking()) as saver:
        holder["saver"] = saver
        config = _put(saver)
        saver.put_writes(config, [("c", 1)], "task")
        assert saver.get_tuple(config).pending_writes == [("task", "c", 1)]
        assert "dump:0" in seen and "load:1" in seen, seen


# --- many openers --------------------------------------------------------------------

_OPENER = textwrap.dedent(
    """
    import json, os, sys, time
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph_fenced_sqlite import FencedSqliteSaver

    path, flag, index = sys.argv[1], sys.argv[2], sys.argv[3]
    deadline = time.monotonic() + 60
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.001)  # all children leave this loop within a millisecond
    with FencedSqliteSaver(path) as saver:
        cp = empty_checkpoint()
        saver.put({"configurable": {"thread_id": f"p{index}", "checkpoint_ns": ""}}, cp,
                  {"source": "input", "step": -1}, {})
        token = saver.claim(f"p{index}", "me", 10).token
        print(json.dumps({"ok": True, "token": token, "stats": saver.stats()}))
    """
)

_HOLD_LOCK_AND_OPEN = textwrap.dedent(
    """
    import json, sys
    from langgraph_fenced_sqlite import FencedSqliteSaver
    with FencedSqliteSaver(sys.argv[1], busy_timeout=0.5) as saver:
        print(json.dumps({"version": saver.stats()["schema_version"],
                          "found": saver.get_tuple({"configurable": {"thread_id": "t"}})
                          is not None}))
    """
)


@pytest.mark.slow
@pytest.mark.subprocess
def test_eight_processes_open_one_new_file(tmp_path: pathlib.Path) -> None:
    """8 processes opening one brand-new file at once all succeed; the schema is set up once."""
    path = str(tmp_path / "new.db")
    flag = str(tmp_path / "go")
    results = run_together(
        [[sys.executable, "-c", _OPENER, path, flag, str(i)] for i in range(8)], flag
    )
    reports = []
    for returncode, out, err in results:
        assert returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["token"] for r in reports) == list(range(1, 9))  # one counter, one row
    conn = sqlite3.connect(path)
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master ORDER BY name")]
        assert len(names) == len(set(names))
        assert {"meta", "threads", "checkpoints", "writes", "events"} <= set(names)
        assert conn.execute("SELECT key, value FROM meta").fetchall() == [("token_counter", 8)]
        assert conn.execute("PRAGMA user_version").fetchone()[0] == lgfs_schema.SCHEMA_VERSION
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0] == 8
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.subprocess
def test_other_process_opens_while_the_write_lock_is_held(db_path: str) -> None:
    """Another process opening a set-up file migrates nothing: it opens under a held write lock."""
    with FencedSqliteSaver(db_path) as saver:
        _put(saver)
    before = _dump(db_path)
    blocker = sqlite3.connect(db_path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        done = subprocess.run(
            [sys.executable, "-c", _HOLD_LOCK_AND_OPEN, db_path],
            capture_output=True,
            text=True,
            timeout=60,
        )
        blocker.execute("ROLLBACK")
    finally:
        blocker.close()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"version": lgfs_schema.SCHEMA_VERSION, "found": True}
    assert _dump(db_path) == before


def test_queued_writes_commit_together_and_a_failed_one_changes_nothing(store: Any) -> None:
    """Group commit: writes queued behind a busy connection share one commit; each is atomic."""
    stale = store.claim("t", "old", 30)
    current = store.take_over("t", "new", 30)
    seq_before = store.events_after("t")[-1].seq if store.events_after("t") else 0
    gate, holding = threading.Event(), threading.Event()

    def hold(conn: Any) -> None:  # keeps the connection busy while writes queue up
        holding.set()
        gate.wait(30)

    blocker = threading.Thread(target=store._engine.run, args=("hold", hold))
    blocker.start()
    assert holding.wait(30)
    outcomes: dict[str, Any] = {}

    def attempt(name: str, token: int, kind: str) -> None:
        try:
            outcomes[name] = store.append_events("t", token, [(kind, {"n": 1}), (kind, {"n": 2})])
        except Exception as exc:  # noqa: BLE001 - recorded for the assertions
            outcomes[name] = exc

    writers = [
        threading.Thread(target=attempt, args=("a", current.token, "a")),
        threading.Thread(target=attempt, args=("stale", stale.token, "stale")),
        threading.Thread(target=attempt, args=("b", current.token, "b")),
    ]
    for writer in writers:
        writer.start()
    for _ in range(3000):  # until all three wait in the queue (bounded, not timed)
        if store._engine._group.queued() == 3:
            break
        threading.Event().wait(0.01)
    assert store._engine._group.queued() == 3
    gate.set()
    blocker.join(30)
    for writer in writers:
        writer.join(30)
    assert isinstance(outcomes["stale"], StaleClaim)
    landed = sorted(outcomes["a"] + outcomes["b"])
    # The two good writes landed with consecutive seqs each, no gap, and the
    # refused one spent none.
    assert landed == list(range(seq_before + 1, seq_before + 5))
    assert outcomes["a"][1] == outcomes["a"][0] + 1 and outcomes["b"][1] == outcomes["b"][0] + 1
    kinds = [e.kind for e in store.events_after("t", seq_before)]
    assert sorted(kinds) == ["a", "a", "b", "b"]


def test_a_batch_that_breaks_its_transaction_fails_every_write_and_the_store_goes_on(
    store: Any,
) -> None:
    """A failure outside any one write (here: a write that ends the transaction itself).

    Every write of that batch is answered with an error, none commits, and
    the next write works: nobody waits for a batch that never ran.
    """
    gate, holding = threading.Event(), threading.Event()

    def hold(conn: Any) -> None:
        holding.set()
        gate.wait(30)

    blocker = threading.Thread(target=store._engine.run, args=("hold", hold))
    blocker.start()
    assert holding.wait(30)
    outcomes: dict[str, Any] = {}

    def write(name: str, fn: Any) -> None:
        try:
            outcomes[name] = store._engine.write(name, fn)
        except Exception as exc:  # noqa: BLE001 - recorded for the assertions
            outcomes[name] = exc

    def rogue(conn: Any) -> None:
        conn.execute("ROLLBACK")  # ends the shared transaction under the batch

    threads = [
        threading.Thread(target=write, args=("rogue", rogue)),
        threading.Thread(
            target=write,
            args=("good", lambda conn: conn.execute(lgfs_schema.ENSURE_THREAD, ("t2",))),
        ),
    ]
    for thread in threads:
        thread.start()
    for _ in range(3000):  # until both wait in the queue (bounded, not timed)
        if store._engine._group.queued() == 2:
            break
        threading.Event().wait(0.01)
    gate.set()
    blocker.join(30)
    for thread in threads:
        thread.join(30)
    assert isinstance(outcomes["rogue"], StoreError)
    assert isinstance(outcomes["good"], StoreError)
    assert [t["thread_id"] for t in store.threads()] == []  # nothing committed
    claim = store.claim("t", "after", 30)  # the store goes on
    assert store.current_claim("t") == claim
