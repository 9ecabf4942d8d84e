"""The engine's edges: opening under contention, deadlines, interrupts, fork, WAL, versions.

Each test pins a promise of docs/semantics.md §8 that an earlier engine broke (issue
"Trust at the edges"); each failed on that engine.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import textwrap
import threading
import time
import warnings
from typing import Any

import pytest
from conftest import read_bytes
from langgraph.checkpoint.base import empty_checkpoint

from langgraph_fenced_sqlite import (
    FencedSqliteSaver,
    StoreBusy,
    StoreError,
    UnsupportedFormat,
    WrongProcess,
)
from langgraph_fenced_sqlite.sqlite import schema as lgfs_schema

BOUND = 30.0
# The WAL size the store keeps to after a checkpoint (schema.JOURNAL_SIZE_LIMIT).
WAL_LIMIT = 8 * 1024 * 1024


def _config(thread_id: str = "t") -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


def _put(saver: FencedSqliteSaver, thread_id: str = "t", value: Any = 0) -> dict[str, Any]:
    cp = empty_checkpoint()
    cp["channel_values"] = {"v": value}
    return saver.put(_config(thread_id), cp, {"source": "update", "step": 0}, {})


def _until(predicate: Any, what: str) -> None:
    for _ in range(3000):  # bounded, not timed
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


# --- 1. many processes opening one new file -----------------------------------------

_ROUNDS_CHILD = textwrap.dedent(
    """
    import os, sys, time
    from langgraph_fenced_sqlite import FencedSqliteSaver
    base, rounds, index = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    failures = []
    for r in range(rounds):
        flag = os.path.join(base, f"go{r}")
        deadline = time.monotonic() + 120
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.0005)
        try:
            with FencedSqliteSaver(os.path.join(base, f"db{r}.db")):
                pass
        except Exception as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
        open(os.path.join(base, f"done{r}-{index}"), "w").close()
    print(repr(failures))
    """
)


@pytest.mark.slow
@pytest.mark.subprocess
def test_many_processes_open_new_files_together(tmp_path: Any) -> None:
    """12 processes open each of 50 brand-new files at once: every open succeeds.

    The engine read `user_version` and the table count in two snapshots, so
    an open racing another's setup could read "version 0" then "tables": not
    ours (seen 1 in 240 opens). Many rounds make that race all but certain.
    """
    import subprocess

    base, n, rounds = str(tmp_path), 12, 50
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _ROUNDS_CHILD, base, str(rounds), str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    try:
        for r in range(rounds):
            with open(os.path.join(base, f"go{r}"), "w"):
                pass
            _until(
                lambda r=r: (
                    all(os.path.exists(os.path.join(base, f"done{r}-{i}")) for i in range(n))
                    or any(p.poll() is not None for p in procs)
                ),
                f"round {r} done",
            )
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    failures = []
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
        failures.extend(eval(out.strip().splitlines()[-1]))  # noqa: S307 - our own repr
    assert failures == []
    conn = sqlite3.connect(os.path.join(base, "db0.db"))
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == lgfs_schema.SCHEMA_VERSION
    finally:
        conn.close()


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
                    _put(saver, "child")
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
    config = _put(saver, "parent")
    assert saver.get_tuple(config) is not None
    saver.close()


# --- 4. an interrupt in the group-commit leader --------------------------------------------


def _queued(engine: Any) -> int:
    # The engine before groupcommit.py kept its queue as `_queue`.
    group = getattr(engine, "_group", None)
    return group.queued() if group is not None else len(engine._queue)


def _interrupt_round(engine: Any, rnd: int, names: list[str]) -> tuple[dict[str, Any], str]:
    """Queue `names` plus a "victim" write behind a held lock; return outcomes and the leader."""
    gate, holding = threading.Event(), threading.Event()

    def hold(conn: Any) -> None:
        holding.set()
        gate.wait(BOUND)

    blocker = threading.Thread(target=engine.run, args=("hold", hold))
    blocker.start()
    assert holding.wait(BOUND)
    outcomes: dict[str, Any] = {}
    idents: dict[int, str] = {}
    ran_by: list[int] = []

    def interrupting(conn: Any) -> None:
        ran_by.append(threading.get_ident())
        if idents[threading.get_ident()] != "victim":
            raise KeyboardInterrupt  # delivered to whichever thread runs this
        conn.execute(lgfs_schema.ENSURE_THREAD, (f"victim-{rnd}",))

    def ensure(name: str) -> Any:
        return lambda conn: conn.execute(lgfs_schema.ENSURE_THREAD, (f"{name}-{rnd}",))

    def write(name: str, fn: Any) -> None:
        idents[threading.get_ident()] = name
        try:
            outcomes[name] = ("ok", engine.write(name, fn))
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertions
            outcomes[name] = ("error", exc)

    threads = [threading.Thread(target=write, args=(n, ensure(n))) for n in names]
    threads.append(threading.Thread(target=write, args=("victim", interrupting)))
    for t in threads:
        t.start()
    _until(lambda: _queued(engine) == len(threads), "all writes queued")
    gate.set()
    blocker.join(BOUND)
    for t in threads:
        t.join(BOUND)
        assert not t.is_alive()
    return outcomes, idents[ran_by[0]]


def test_an_interrupt_in_the_leader_fails_the_batch_and_stays_in_the_leader(store: Any) -> None:
    """A KeyboardInterrupt raised while the leader runs another caller's write.

    It belongs to the leader's thread (re-raised there); the whole batch is
    rolled back and every other caller gets a StoreError. The engine used to
    hand it to the caller whose write was running and commit the rest, the
    leader returning normally. Which caller leads is up to the scheduler, so
    rounds repeat until other callers led a few times.
    """
    interrupted = 0
    names = [f"w{i}" for i in range(4)]
    for rnd in range(40):
        outcomes, leader = _interrupt_round(store._engine, rnd, names)
        ids = {t["thread_id"] for t in store.threads()}
        written = {f"{n}-{rnd}" for n in [*names, "victim"]}
        if leader == "victim":  # it ran in its own thread: no interrupt anywhere
            assert all(kind == "ok" for kind, _ in outcomes.values()), outcomes
            assert written <= ids
            continue
        interrupted += 1
        kind, error = outcomes[leader]
        assert kind == "error" and type(error) is KeyboardInterrupt, outcomes
        for name in [*names, "victim"]:
            if name != leader:
                kind, error = outcomes[name]
                assert kind == "error" and isinstance(error, StoreError), (name, outcomes)
                assert "interrupted" in str(error) and "nothing was changed" in str(error)
        assert not written & ids  # all rolled back
        claim = store.claim(f"after-{rnd}", "x", 30)  # the store goes on
        assert store.current_claim(f"after-{rnd}") == claim
        if interrupted >= 3:
            break
    assert interrupted >= 1, "no round had another caller lead"


# --- 5. one deadline per call ----------------------------------------------------------------


def test_a_write_queued_behind_a_waiting_batch_gives_up_at_its_own_deadline(db_path: str) -> None:
    """busy_timeout counts from when each call was made, not from when its batch began.

    A put queued just behind a put waiting for another connection's write
    lock used to wait for that one to give up (1 s) and then a full
    busy_timeout of its own: 1.9 s. It must give up 1 s after it was made,
    and never run later.
    """
    store = FencedSqliteSaver(db_path, busy_timeout=1.0)
    holder = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    results: dict[str, Any] = {}

    def attempt(name: str) -> None:
        started = time.monotonic()
        try:
            _put(store, name)
            results[name] = ("ok", time.monotonic() - started)
        except StoreBusy as exc:
            results[name] = (exc, time.monotonic() - started)

    try:
        first = threading.Thread(target=attempt, args=("first",))
        first.start()
        _until(store._engine._lock.locked, "the first put waits in busy")
        time.sleep(0.1)  # a pause to queue behind it, not an assertion
        second = threading.Thread(target=attempt, args=("second",))
        second.start()
        first.join(BOUND)
        second.join(BOUND)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    for name in ("first", "second"):
        error, elapsed = results[name]
        assert isinstance(error, StoreBusy), results
        assert error.waited_s <= elapsed
        assert 0.9 <= error.waited_s, results
    # The second gave up at its own deadline (1 s), not the old 1.9 s.
    assert results["second"][1] < 1.35, results
    # The first says what held it up: the file's lock, another connection's.
    assert "locked by another connection" in str(results["first"][0]), results
    _put(store, "later")  # a batch after the lock is free runs only this
    assert store.get_tuple(_config("first")) is None
    assert store.get_tuple(_config("second")) is None
    assert store.get_tuple(_config("later")) is not None
    store.close()


def test_a_read_queued_behind_a_long_call_gives_up_at_its_deadline(db_path: str) -> None:
    """Waiting for the store's own lock counts against busy_timeout too (reads included)."""
    store = FencedSqliteSaver(db_path, busy_timeout=0.3)
    config = _put(store)
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
    _put(store, "seed")
    reader = sqlite3.connect(db_path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM checkpoints").fetchone()  # holds its snapshot
    big = "x" * (512 * 1024)
    for i in range(2 * WAL_LIMIT // len(big) + 4):
        _put(store, f"big{i}", big)
    wal = db_path + "-wal"
    assert os.path.getsize(wal) > WAL_LIMIT  # it could not be reset
    reader.execute("COMMIT")
    reader.close()
    for i in range(3):  # the first checkpoints it all, the next restarts the WAL
        _put(store, f"small{i}")
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
        _put(store, f"c{i}", "v" * 3000)
        largest = max(largest, os.path.getsize(wal))
        with open(wal, "rb") as f:
            cycles.add(f.read(16)[12:16])  # the WAL header's checkpoint sequence
        i += 1
        assert i < 20 * lgfs_schema.WAL_AUTOCHECKPOINT, "the WAL never restarted"
    page = store._engine._conn.execute("PRAGMA page_size").fetchone()[0]
    assert largest <= WAL_LIMIT
    # It filled to WAL_AUTOCHECKPOINT frames (not SQLite's 1000) before restarting.
    assert largest >= 32 + lgfs_schema.WAL_AUTOCHECKPOINT * (page + 24)


# --- 9. the SQLite version ---------------------------------------------------------------------


def test_an_old_sqlite_is_refused_naming_both_versions(
    db_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SQLite older than RETURNING (3.35.0) is refused at open, before the file is touched."""
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.31.1")
    with pytest.raises(UnsupportedFormat) as exc:
        FencedSqliteSaver(db_path)
    assert "3.31.1" in str(exc.value) and "3.35.0" in str(exc.value), str(exc.value)
    assert not os.path.exists(db_path)


# --- 10. the tables, when user_version matches -------------------------------------------------


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("ALTER TABLE events RENAME TO events_old", "'events'"),
        ("DROP TABLE writes", "'writes'"),
        ("ALTER TABLE threads DROP COLUMN run_id", "run_id"),
        ("ALTER TABLE checkpoints RENAME COLUMN envelope TO env", "envelope"),
    ],
)
def test_a_file_missing_a_table_or_column_is_refused_unchanged(
    db_path: str, damage: str, named: str
) -> None:
    """Our application_id and user_version, but a table or column gone: refused, unchanged."""
    with FencedSqliteSaver(db_path) as saver:
        _put(saver)
    conn = sqlite3.connect(db_path)
    conn.execute(damage)
    conn.commit()
    conn.close()
    before = read_bytes(db_path)
    with pytest.raises(UnsupportedFormat) as exc:
        FencedSqliteSaver(db_path)
    assert named in str(exc.value) and "left unchanged" in str(exc.value), str(exc.value)
    assert read_bytes(db_path) == before


def test_extra_tables_and_columns_are_tolerated(db_path: str) -> None:
    """Only what the migrations build is required: a user's extra table or column is fine."""
    with FencedSqliteSaver(db_path) as saver:
        config = _put(saver)
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE my_notes (x TEXT)")
    conn.execute("ALTER TABLE threads ADD COLUMN note TEXT")
    conn.commit()
    conn.close()
    with FencedSqliteSaver(db_path) as saver:
        assert saver.get_tuple(config) is not None
