"""The store's lifecycle and connection: open, pragmas, close, GC, fork, re-entry.

As aiosqlite's smoke tests do: close twice, close with queued calls, use after
close, the GC warning, fork. Plus the open path: WAL and synchronous=FULL on
every connection, `setup()` idempotent, `from_conn_string` as a context
manager. And the engine's edges (docs/semantics.md §8, issue "Trust at the
edges"): close() in a forked child, one deadline per call, a bounded WAL.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import os
import pathlib
import signal
import sqlite3
import threading
import time
import warnings
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from support.configs import saver_config
from support.files import schema_dump
from support.puts import new_checkpoint, put_value

from langgraph_fenced_sqlite import (
    FencedSqliteSaver,
    ManualClock,
    StoreBusy,
    StoreClosed,
    StoreError,
    UnsupportedFormat,
    WrongProcess,
    WrongThread,
)
from langgraph_fenced_sqlite.sqlite import schema as lgfs_schema

BOUND = 30.0
# The WAL size the store keeps to after a checkpoint (schema.JOURNAL_SIZE_LIMIT).
WAL_LIMIT = 8 * 1024 * 1024


def _put(saver: FencedSqliteSaver, thread_id: str = "t", step: int = 0) -> dict[str, Any]:
    """Put a checkpoint holding `step`; return the config `saver.put` returned."""
    cp = new_checkpoint({"step": step})
    return saver.put(saver_config(thread_id), cp, {"source": "loop", "step": step}, {})


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
    before = schema_dump(db_path)
    saver.setup()
    saver.setup()
    asyncio.run(saver.asetup())
    assert schema_dump(db_path) == before
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
        config = await saver.aput(saver_config(), cp, {"source": "loop", "step": 0}, {})
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
        assert saver.get_tuple(saver_config("child")) is None
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


# --- 3. close() in a forked child ---------------------------------------------------------


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_close_in_a_forked_child_returns_while_a_parent_thread_is_in_a_call(db_path: str) -> None:
    """A child forked while another thread was inside a store call closes promptly.

    The child inherits the store's lock held (by a thread that does not exist
    there); close() took it before checking the process, and hung forever.
    """
    saver = FencedSqliteSaver(db_path)
    entered, release = threading.Event(), threading.Event()

    def hold(conn: Any) -> None:
        entered.set()
        release.wait(BOUND)

    inside = threading.Thread(target=saver._engine.run, args=("hold", hold))
    inside.start()
    try:
        assert entered.wait(BOUND)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: the point
            pid = os.fork()
        if pid == 0:  # the child: report by exit code only, never return into pytest
            code = 10
            try:
                try:
                    saver.close()
                    code = 0
                except WrongProcess:
                    code = 0
                try:
                    put_value(saver, "child")
                    code = 4
                except (WrongProcess, StoreError):
                    pass
            except BaseException:  # noqa: BLE001
                code = 5
            finally:
                os._exit(code)
        status = None
        for _ in range(int(BOUND * 100)):  # a hang guard, not a timing assertion
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("close() in the forked child hung")
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    finally:
        release.set()
        inside.join(BOUND)
    # The parent's store is unharmed.
    config = put_value(saver, "parent")
    assert saver.get_tuple(config) is not None
    saver.close()


# --- one deadline per call ----------------------------------------------------------------


def test_a_read_queued_behind_a_long_call_gives_up_at_its_deadline(db_path: str) -> None:
    """Waiting for the store's own lock counts against busy_timeout too (reads included)."""
    store = FencedSqliteSaver(db_path, busy_timeout=0.3)
    config = put_value(store)
    gate, holding = threading.Event(), threading.Event()

    def hold(conn: Any) -> None:
        holding.set()
        gate.wait(BOUND)

    blocker = threading.Thread(target=store._engine.run, args=("hold", hold))
    blocker.start()
    try:
        assert holding.wait(BOUND)
        outcome: dict[str, Any] = {}

        def read() -> None:
            try:
                outcome["read"] = store.get_tuple(config)
            except StoreBusy as exc:
                outcome["read"] = exc

        reader = threading.Thread(target=read)
        reader.start()
        reader.join(BOUND)  # the holder never lets go by itself
        assert not reader.is_alive() and isinstance(outcome["read"], StoreBusy), outcome
        assert outcome["read"].op == "get_tuple"
        assert outcome["read"].waited_s >= 0.3
        # No other connection was involved: the message must not blame one.
        message = str(outcome["read"])
        assert message.startswith("get_tuple on "), message
        assert "this store's other calls in this process" in message, message
        assert "another connection" not in message, message
    finally:
        gate.set()
        blocker.join(BOUND)
    assert store.get_tuple(config) is not None
    store.close()


# --- 8. a bounded WAL ------------------------------------------------------------------------


def test_the_wal_shrinks_back_after_a_reader_held_it(open_store: Any, db_path: str) -> None:
    """After a burst of large commits under a held snapshot, the WAL goes back under the limit."""
    store = open_store()
    put_value(store, "seed")
    reader = sqlite3.connect(db_path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM checkpoints").fetchone()  # holds its snapshot
    # Values are compressed (core/values.py): random text, which zstd cannot
    # shrink below three quarters, so the commits do fill the WAL.
    big = base64.b64encode(os.urandom(384 * 1024)).decode()
    for i in range(2 * WAL_LIMIT // len(big) + 4):
        put_value(store, f"big{i}", big)
    wal = db_path + "-wal"
    assert os.path.getsize(wal) > WAL_LIMIT  # it could not be reset
    reader.execute("COMMIT")
    reader.close()
    for i in range(3):  # the first checkpoints it all, the next restarts the WAL
        put_value(store, f"small{i}")
    assert os.path.getsize(wal) <= WAL_LIMIT
    assert store._engine._conn.execute("PRAGMA journal_size_limit").fetchone()[0] == WAL_LIMIT
    assert lgfs_schema.JOURNAL_SIZE_LIMIT == WAL_LIMIT


def test_the_wal_stays_under_the_limit_between_checkpoints(open_store: Any, db_path: str) -> None:
    """Small commits with no reader in the way: the WAL never grows past the limit.

    The store checkpoints every `schema.WAL_AUTOCHECKPOINT` pages (more than
    SQLite's default, to halve the syncs checkpoints cost); that must stay
    inside `JOURNAL_SIZE_LIMIT`, or every restart of the WAL would truncate it.
    """
    store = open_store()
    wal, largest, cycles = db_path + "-wal", 0, set()
    i = 0
    while len(cycles) < 3:  # two restarts: filled, checkpointed, restarted, twice
        put_value(store, f"c{i}", "v" * 3000)
        largest = max(largest, os.path.getsize(wal))
        with open(wal, "rb") as f:
            cycles.add(f.read(16)[12:16])  # the WAL header's checkpoint sequence
        i += 1
        assert i < 20 * lgfs_schema.WAL_AUTOCHECKPOINT, "the WAL never restarted"
    page = store._engine._conn.execute("PRAGMA page_size").fetchone()[0]
    assert largest <= WAL_LIMIT
    # It filled to WAL_AUTOCHECKPOINT frames (not SQLite's 1000) before restarting.
    assert largest >= 32 + lgfs_schema.WAL_AUTOCHECKPOINT * (page + 24)


def test_several_savers_on_one_file_and_the_last_close_folds_the_wal(db_path: str) -> None:
    """Savers opened in one process on one file each work; closing the last folds the WAL.

    LangGraph's Agent Server can open one saver per event loop on the same
    file. Each has its own connection; while one is open the WAL stays (its
    frames may be what the others read), and when the last closes, SQLite
    checkpoints the WAL into the file and removes it: no `-wal` or `-shm` is
    left for the operator to find.
    """
    savers = [FencedSqliteSaver(db_path) for _ in range(4)]
    try:
        for i, saver in enumerate(savers):
            put_value(saver, f"t{i}", i)
        for saver in savers:  # each sees every other's commits
            assert {t.config["configurable"]["thread_id"] for t in saver.list(None)} == {
                f"t{i}" for i in range(4)
            }
        for saver in savers[:-1]:
            saver.close()
        assert os.path.exists(db_path + "-wal")  # the last saver's connection is open
        assert savers[-1].get_tuple(saver_config("t0")) is not None
    finally:
        for saver in savers:
            saver.close()
    assert not os.path.exists(db_path + "-wal") and not os.path.exists(db_path + "-shm")
    with FencedSqliteSaver(db_path, readonly=True) as reader:
        assert len(list(reader.list(None))) == 4
