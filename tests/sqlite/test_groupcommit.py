"""Group commit (`groupcommit.py`): writes queued behind the one in progress share one COMMIT.

A failed write changes nothing while the rest of its batch commits; a batch
whose transaction breaks fails every write and the store goes on; an
interrupt in the leader fails its batch and stays in the leader; each queued
write gives up at its own deadline (docs/semantics.md §8, issue "Trust at the
edges").
"""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any

from support.configs import saver_config
from support.puts import put_value
from support.waiting import until

from langgraph_fenced_sqlite import (
    FencedSqliteSaver,
    StaleClaim,
    StoreBusy,
    StoreError,
)
from langgraph_fenced_sqlite.sqlite import schema as lgfs_schema

BOUND = 30.0


# --- one COMMIT for the queue -------------------------------------------------------------


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
    until(lambda: _queued(engine) == len(threads), "all writes queued")
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
            put_value(store, name)
            results[name] = ("ok", time.monotonic() - started)
        except StoreBusy as exc:
            results[name] = (exc, time.monotonic() - started)

    try:
        first = threading.Thread(target=attempt, args=("first",))
        first.start()
        until(store._engine._lock.locked, "the first put waits in busy")
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
    put_value(store, "later")  # a batch after the lock is free runs only this
    assert store.get_tuple(saver_config("first")) is None
    assert store.get_tuple(saver_config("second")) is None
    assert store.get_tuple(saver_config("later")) is not None
    store.close()
