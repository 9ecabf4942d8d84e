"""Claims and fencing across real processes, crashes and paused workers.

Every process here is real (`sys.executable`, see `testing/child.py`); a crash
is a SIGKILL, and a paused worker is a real thread blocked inside a node.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from langgraph_fenced_sqlite import (
    FencedSqliteSaver,
    ManualClock,
    StaleClaim,
    SystemClock,
    ThreadBusy,
)
from langgraph_fenced_sqlite.testing.child import Child, build_chain_graph, write_flag

STEPS = ["s1", "s2", "s3", "s4", "s5"]


def _history(store: FencedSqliteSaver, thread_id: str) -> list[dict[str, Any]]:
    """The root namespace's checkpoints as records (token included), newest first."""
    return store.history_records(thread_id, limit=1000)


def _tuples(store: FencedSqliteSaver, thread_id: str) -> dict[str, Any]:
    return {
        t.config["configurable"]["checkpoint_id"]: t
        for t in store.list({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
    }


def _assert_linear(records: list[dict[str, Any]]) -> None:
    """Every checkpoint is on the tip's parent chain and no two share a parent."""
    by_id = {r["checkpoint_id"]: r for r in records}
    chain, cid = [], records[0]["checkpoint_id"]
    while cid is not None:
        chain.append(cid)
        cid = by_id[cid]["parent_checkpoint_id"]
    assert chain == [r["checkpoint_id"] for r in records], "history forked or has orphans"
    parents = [r["parent_checkpoint_id"] for r in records]
    assert len(parents) == len(set(parents)), "two checkpoints share a parent"


@pytest.mark.slow
@pytest.mark.subprocess
def test_sixteen_processes_claim_at_once(db_path: str, tmp_path: Any) -> None:
    """Of 16 processes claiming one thread at once, one wins; the rest name it."""
    flag = str(tmp_path / "go")
    children = [
        Child(
            "claim",
            path=db_path,
            thread_id="t",
            holder=f"proc-{i}",
            ttl=60,
            start_flag=flag,
            announce_ready=True,
        )
        for i in range(16)
    ]
    try:
        for child in children:
            assert child.next(timeout=120) == {"ready": True}
        write_flag(flag)  # all 16 are spinning on the flag: they claim together
        results = [child.next(timeout=120) for child in children]
    finally:
        for child in children:
            child.close()
    winners = [r for r in results if r["ok"]]
    assert len(winners) == 1, results
    winner = winners[0]
    for r in results:
        if r is not winner:
            assert (r["code"], r["thread_id"], r["holder"]) == (
                "thread_busy",
                "t",
                winner["holder"],
            )
    with FencedSqliteSaver(db_path) as store:
        current = store.current_claim("t")
        assert current is not None
        assert (current.holder, current.token) == (winner["holder"], winner["token"])
        assert store.stats()["token_counter"] == winner["token"]  # losers issued no token


@pytest.mark.slow
@pytest.mark.subprocess
def test_killed_holder_is_taken_over_after_ttl_and_the_graph_resumes(db_path: str) -> None:
    """A SIGKILLed holder blocks others until its ttl passes; then its run resumes intact."""
    store = FencedSqliteSaver(db_path, clock=SystemClock())
    try:
        with Child(
            "run_graph",
            path=db_path,
            thread_id="t",
            holder="child",
            ttl=3.0,
            steps=STEPS,
            block_at="s4",
            durability="sync",
        ) as child:
            claimed = child.next(timeout=120)["claimed"]
            assert child.next(timeout=120) == {"blocked": "s4"}
            at_signal = _tuples(store, "t")
            child.kill()
        # Nothing landed after the child's last durable step: the tip is the
        # checkpoint s4 started from, with none of s4's writes.
        assert _tuples(store, "t") == at_signal
        committed = _history(store, "t")
        tip = at_signal[committed[0]["checkpoint_id"]]
        assert tip.checkpoint["channel_values"]["log"] == ["s1", "s2", "s3"]
        assert tip.pending_writes == []
        assert {r["token"] for r in committed} == {claimed["token"]}

        # ThreadBusy naming the dead holder while its claim is live by the
        # store's clock, and a claim granted once it is not.
        busy = 0
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "the dead holder's claim never expired"
            before = store.clock.now()
            try:
                mine = store.claim("t", "parent", 30)
            except ThreadBusy as exc:
                assert exc.holder == "child"
                assert before < claimed["expires_at"]
                busy += 1
                time.sleep(0.05)
                continue
            assert store.clock.now() >= claimed["expires_at"]
            break
        assert busy > 0, "the first claim came after the dead holder's ttl; raise the ttl"
        assert mine.token > claimed["token"]

        state = build_chain_graph(store, STEPS).invoke(None, mine.config(), durability="sync")
        assert state["log"] == STEPS  # s1-s3 from the child, s4-s5 resumed here, once each
        after = _tuples(store, "t")
        for cid, old in at_signal.items():
            new = after[cid]
            assert (new.config, new.checkpoint, new.metadata, new.parent_config) == (
                old.config,
                old.checkpoint,
                old.metadata,
                old.parent_config,
            )
            assert set(map(repr, old.pending_writes)) <= set(map(repr, new.pending_writes))
        records = _history(store, "t")
        _assert_linear(records)
        resumed = records[: len(records) - len(committed)]
        assert records[len(resumed) :] == committed
        assert resumed and {r["token"] for r in resumed} == {mine.token}
    finally:
        store.close()


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_paused_worker_wakes_to_stale_claim_and_history_does_not_fork(
    open_store: Any, durability: str
) -> None:
    """A worker paused inside a node after a takeover fails with StaleClaim; no fork."""
    worker_store, owner_store = open_store(), open_store()
    entered, wake = threading.Event(), threading.Event()

    def pause(name: str) -> None:
        if name == "s3":
            entered.set()
            assert wake.wait(60), "the worker was never woken"

    old = worker_store.claim("t", "worker", 30)
    outcome: dict[str, BaseException] = {}

    def work() -> None:
        try:
            build_chain_graph(worker_store, STEPS, pause).invoke(
                {"log": []}, old.config(), durability=durability
            )
        except BaseException as exc:  # noqa: BLE001 - asserted below
            outcome["error"] = exc

    worker = threading.Thread(target=work)
    worker.start()
    try:
        assert entered.wait(60), "the worker never reached s3"
        new = owner_store.take_over("t", "owner", 30)
        # From here on nothing with the old token can land: the takeover point.
        taken = _history(owner_store, "t")
        resume_input = None if taken else {"log": []}  # durability "exit": nothing stored
        state = build_chain_graph(owner_store, STEPS).invoke(
            resume_input, new.config(), durability=durability
        )
        assert state["log"] == STEPS
    finally:
        wake.set()
        worker.join(60)
    assert not worker.is_alive()
    error = outcome.get("error")
    assert isinstance(error, StaleClaim), repr(error)
    assert (error.token, error.current_token) == (old.token, new.token)

    records = _history(owner_store, "t")
    _assert_linear(records)
    assert records[len(records) - len(taken) :] == taken  # untouched by either run
    mine = records[: len(records) - len(taken)]
    assert mine and {r["token"] for r in mine} == {new.token}
    assert {r["token"] for r in taken} <= {old.token}
    tip = owner_store.get_tuple({"configurable": {"thread_id": "t"}})
    assert tip is not None and tip.checkpoint["channel_values"]["log"] == STEPS
    assert tip.config["configurable"]["checkpoint_id"] == mine[0]["checkpoint_id"]


@pytest.mark.slow
@pytest.mark.subprocess
def test_tokens_strictly_increase_across_processes(db_path: str) -> None:
    """Tokens issued by several processes on one file increase and never repeat."""
    start = 1_000_000.0
    clock = ManualClock(start)
    store = FencedSqliteSaver(db_path, clock=clock)
    try:
        with (
            Child("serve", path=db_path, clock_at=start) as x,
            Child("serve", path=db_path, clock_at=start) as y,
        ):
            assert x.next(timeout=120) == y.next(timeout=120) == {"ready": True}

            def ok(reply: dict[str, Any]) -> Any:
                assert reply["ok"], reply
                return reply["result"]

            first = ok(x.send("claim", "t", "x", 10))
            tokens = [first["token"]]
            assert ok(x.send("release", "t", first["token"])) is True
            second = ok(y.send("claim", "t", "y", 10))  # after a release
            tokens.append(second["token"])
            ok(x.send("clock_set", second["expires_at"]))
            tokens.append(ok(x.send("claim", "t", "x", 10))["token"])  # expiry takeover
            tokens.append(store.take_over("t", "parent", 10).token)  # take_over
            ok(y.send("delete_thread", "t"))
            stale = x.send("renew", "t", tokens[-1], 10)
            assert (stale["ok"], stale["code"], stale["current_token"]) == (
                False,
                "stale_claim",
                None,
            )
            tokens.append(ok(x.send("claim", "t", "x", 10))["token"])  # after delete_thread
            store.close()
            store = FencedSqliteSaver(db_path, clock=clock)  # after reopen
            tokens.append(store.take_over("t", "parent", 10).token)
            tokens.append(ok(y.send("take_over", "t", "y", 10))["token"])
            assert tokens == sorted(set(tokens)), tokens

            # Both children and this process claiming at once: no token twice,
            # each process's tokens increasing, all above what came before.
            x.request("claim_many", "x-", 50, "x", 10)
            y.request("claim_many", "y-", 50, "y", 10)
            mine = [store.claim(f"p-{i}", "parent", 10).token for i in range(50)]
            xs, ys = ok(x.next(timeout=120)), ok(y.next(timeout=120))
            for seq in (xs, ys, mine):
                assert seq == sorted(set(seq)) and seq[0] > tokens[-1], seq
            everything = xs + ys + mine
            assert len(set(everything)) == 150
            assert store.stats()["token_counter"] == max(everything)
            x.request("exit")
            y.request("exit")
        assert x.proc.returncode == y.proc.returncode == 0
    finally:
        store.close()
