"""Contract cases 31-33: incarnations, fenced history removal, accepted writes take effect.

Invariant: every case reaches stores only through `env`, so it checks the
sync and the async API alike, and a refusal is checked against the whole
file (`dump`), not just what one reader shows.
"""

from __future__ import annotations

from typing import Any

from ..core.claims import TOKEN_KEY
from ..errors import ReplayUnavailable, StaleClaim, ThreadBusy
from ._helpers import dump
from ._helpers import event_seqs as _seqs
from ._helpers import raises as _raises
from ._helpers import step_checkpoint as _checkpoint
from .harness import ContractEnv, contract_case

_BOUND = 20.0


def _put_run(
    store: Any, thread_id: str, parent: str | None, run_id: str, *, token: int | None, step: int
) -> str:
    """Put a checkpoint of run `run_id` and one write for it; return its id."""
    conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
    if parent is not None:
        conf["checkpoint_id"] = parent
    if token is not None:
        conf[TOKEN_KEY] = token
    cp = _checkpoint(step, {"step": step})
    metadata = {"source": "loop", "step": step, "parents": {}, "run_id": run_id}
    store.put({"configurable": conf, "metadata": {"run_id": run_id}}, cp, metadata, {})
    conf["checkpoint_id"] = cp["id"]
    config = {"configurable": conf, "metadata": {"run_id": run_id}}
    store.put_writes(config, [("note", f"{run_id}:{step}")], f"task-{step}")
    return str(cp["id"])


def _latest(store: Any, thread_id: str) -> Any:
    return store.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})


# --- 31: incarnations ---------------------------------------------------------------------


@contract_case(31, needs=["sibling"])
def case_a_reader_of_a_deleted_thread_is_never_shown_a_gap(env: ContractEnv) -> None:
    """After delete_thread, a position of the old incarnation is refused, naming the new one."""
    store, reader = env.open(), env.open()
    claim = store.claim("t", "w", 600)
    store.append_events("t", claim.token, [("old", {"i": i}) for i in range(5)])
    last = reader.events_after("t", 0, 100)[-1]
    assert (last.seq, last.incarnation) == (5, 1), last
    store.delete_thread("t")
    fresh = store.claim("t", "w", 600)
    assert fresh.token > claim.token
    store.append_events("t", fresh.token, [("new", {"i": i}) for i in range(7)])
    # Resuming at seq 5 must not answer 6, 7 as if 1-5 had been seen.
    for position in (
        {"after_seq": 5},
        {"after_seq": last},
        {"after_seq": 5, "incarnation": 1},
        {"after_seq": 0, "incarnation": 1},
    ):
        error = _raises(ReplayUnavailable, reader.events_after, "t", limit=100, **position)
        assert (error.thread_id, error.incarnation) == ("t", 2), (position, error)
        error = _raises(ReplayUnavailable, reader.wait_events, "t", timeout=_BOUND, **position)
        assert error.incarnation == 2
    every = reader.events_after("t", 0, 100, incarnation=2)
    assert _seqs(every) == [1, 2, 3, 4, 5, 6, 7]
    assert {e.incarnation for e in every} == {2} and every[0].data == {"i": 0}
    assert _seqs(reader.events_after("t", every[4])) == [6, 7]
    assert _seqs(reader.wait_events("t", 6, incarnation=2, timeout=_BOUND)) == [7]
    # A reader that saw nothing yet (seq 0, no incarnation) reads from the start.
    assert reader.events_after("t", 0, 100) == every
    # Unknown threads, and deleting them, stay what they were.
    store.delete_thread("never-existed")
    assert reader.events_after("never-existed", 0, 10) == []
    assert "never-existed" not in [t["thread_id"] for t in store.threads()]


# --- 32: LangGraph's extended methods are fenced ----------------------------------------------


@contract_case(32)
def case_history_removal_is_fenced_and_logged(env: ContractEnv) -> None:
    """delete_for_runs, prune('delete'), copy_thread refuse a live claim; a token acts."""
    store = env.open()
    src = _put_run(store, "src", None, "r0", token=None, step=0)
    claim = store.claim("t", "owner", 600)
    c1 = _put_run(store, "t", None, "r1", token=claim.token, step=0)
    c2 = _put_run(store, "t", c1, "r2", token=claim.token, step=1)
    before = dump(env.path)
    for call, args, kwargs in (
        (store.delete_for_runs, (["r2"],), {}),
        (store.prune, (["t"],), {"strategy": "delete"}),
        (store.copy_thread, ("src", "t"), {}),
    ):
        error = _raises(ThreadBusy, call, *args, **kwargs)
        assert (error.thread_id, error.holder) == ("t", "owner"), error
        assert dump(env.path) == before, f"{call.__name__} changed the file"
        stale = _raises(StaleClaim, call, *args, token=claim.token + 1000, **kwargs)
        assert stale.current_token == claim.token
        assert dump(env.path) == before
    # The owner's next write still lands on its latest checkpoint.
    c3 = _put_run(store, "t", c2, "r3", token=claim.token, step=2)

    store.delete_for_runs(["r3"], token=claim.token)
    assert _latest(store, "t").config["configurable"]["checkpoint_id"] == c2
    event = store.events_after("t", 0, 100)[-1]
    assert (event.kind, event.token) == ("runs_deleted", claim.token), event
    assert event.data["run_ids"] == ["r3"] and event.data["checkpoints"] == [["", c3]]
    assert event.data["writes"] == 1

    store.copy_thread("src", "t", token=claim.token)
    event = store.events_after("t", 0, 100)[-1]
    assert (event.kind, event.token, event.data["copied"]) == (
        "copied",
        claim.token,
        [["", src]],
    ), event
    store.copy_thread("src", "t", token=claim.token)  # again: nothing new, no event
    assert store.events_after("t", 0, 100)[-1] == event

    (result,) = store.prune(["t"], strategy="delete", token=claim.token)
    assert sorted(result.checkpoints) == sorted([("", c1), ("", c2), ("", src)])
    assert _latest(store, "t") is None
    (event,) = store.events_after("t", result.floor - 1, 100)
    assert (event.kind, event.token, event.data["strategy"]) == ("pruned", claim.token, "delete")
    assert sorted(map(tuple, event.data["checkpoints"])) == sorted(result.checkpoints)
    assert store.current_claim("t") == claim


# --- 33: an accepted write takes effect --------------------------------------------------------


@contract_case(33)
def case_an_accepted_special_write_after_expiry_is_what_readers_see(env: ContractEnv) -> None:
    """An unfenced __interrupt__ write accepted after the claim expired replaces the holder's."""
    store = env.open()
    claim = store.claim("t", "w", 10)
    cid = _put_run(store, "t", None, "r1", token=claim.token, step=0)
    conf = {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": cid}
    fenced = {"configurable": {**conf, TOKEN_KEY: claim.token}}
    store.put_writes(fenced, [("__interrupt__", "holder's")], "task-0")
    env.clock.advance(10)  # expired at exactly expires_at; nobody took over
    store.put_writes({"configurable": conf}, [("__interrupt__", "accepted")], "task-0")
    pending = [(t, c, v) for t, c, v in _latest(store, "t").pending_writes if c == "__interrupt__"]
    assert pending == [("task-0", "__interrupt__", "accepted")], pending
    # A stale writer still never displaces the current owner's write.
    successor = store.take_over("t", "w2", 600)
    owner = {"configurable": {**conf, TOKEN_KEY: successor.token}}
    store.put_writes(owner, [("__interrupt__", "successor's")], "task-0")
    _raises(StaleClaim, store.put_writes, fenced, [("__interrupt__", "stale")], "task-0")
    pending = [(t, c, v) for t, c, v in _latest(store, "t").pending_writes if c == "__interrupt__"]
    assert pending == [("task-0", "__interrupt__", "successor's")], pending
