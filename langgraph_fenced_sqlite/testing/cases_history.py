"""Contract cases 26-28: retraction (with real graphs), retention and deletion.

Invariant: every case reaches stores through `env`, so it checks the sync
and the async API alike; waits are bounded (a broken promise fails the case,
it never hangs it), and real graphs, threads, tasks and processes stand in
for nothing.
"""

from __future__ import annotations

import functools
import operator
import uuid
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.base.id import uuid6
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from ..core.retention import PruneResult, RetentionPolicy
from ..errors import ReplayUnavailable, StaleClaim
from ._helpers import event_seqs as _seqs
from ._helpers import put_step as _put
from ._helpers import raises as _raises
from ._helpers import token_config as _conf
from .harness import AsyncFacade, ContractEnv, contract_case, raw

# --- helpers --------------------------------------------------------------------------


def _chain(
    store: Any, thread_id: str, n: int, *, token: int | None = None, ns: str = ""
) -> list[str]:
    ids: list[str] = []
    for step in range(n):
        ids.append(_put(store, thread_id, ids[-1] if ids else None, token=token, ns=ns, step=step))
    return ids


def _keys(store: Any, thread_id: str) -> dict[tuple[str, str], Any]:
    """Every checkpoint of a thread, all namespaces: key -> (parent, writes)."""
    out = {}
    for tup in store.list({"configurable": {"thread_id": thread_id}}):
        conf = tup.config["configurable"]
        parent = tup.parent_config["configurable"]["checkpoint_id"] if tup.parent_config else None
        out[(conf["checkpoint_ns"], conf["checkpoint_id"])] = (parent, tup.pending_writes)
    return out


# --- 26: retraction, with real graphs -------------------------------------------------


class _State(TypedDict):
    log: Annotated[list[str], operator.add]


def _graph(saver: Any) -> Any:
    """A root graph with a subgraph node, so runs write more than one namespace."""

    def inner(state: _State) -> dict[str, Any]:
        return {"log": [f"inner{len(state['log'])}"]}

    sub = StateGraph(_State)
    sub.add_node("inner", inner)
    sub.add_edge(START, "inner")
    sub.add_edge("inner", END)

    def first(state: _State) -> dict[str, Any]:
        return {"log": [f"first{len(state['log'])}"]}

    root = StateGraph(_State)
    root.add_node("first", first)
    root.add_node("sub", sub.compile())
    root.add_edge(START, "first")
    root.add_edge("first", "sub")
    root.add_edge("sub", END)
    return root.compile(checkpointer=saver)


def _invoke(
    env: ContractEnv, store: Any, graph: Any, text: str, config: Any, durability: str
) -> Any:
    inputs = {"log": [text]}
    if isinstance(store, AsyncFacade):
        return env.run_async(graph.ainvoke(inputs, config, durability=durability))
    return graph.invoke(inputs, config, durability=durability)


def _run_config(claim: Any, run_id: str | None) -> Any:
    return claim.config({"metadata": {"run_id": run_id}} if run_id else None)


def _check_retract_turn(env: ContractEnv, durability: str, use_run_ids: bool) -> None:
    store = env.open()
    graph = _graph(raw(store))
    thread_id = f"t-{durability}-{use_run_ids}"
    claim = store.claim(thread_id, "w", 600)
    runs = [str(uuid.uuid4()) if use_run_ids else None for _ in range(2)]
    _invoke(env, store, graph, "one", _run_config(claim, runs[0]), durability)
    before = _keys(store, thread_id)
    latest_before = store.get_tuple({"configurable": {"thread_id": thread_id}})
    values_before = graph.get_state({"configurable": {"thread_id": thread_id}}).values
    events_before = store.events_after(thread_id, 0, 1000)
    _invoke(env, store, graph, "two", _run_config(claim, runs[1]), durability)
    during = _keys(store, thread_id)
    assert len(during) > len(before), "the second turn stored no checkpoint"
    if durability != "exit":
        assert {ns for ns, _ in during} - {ns for ns, _ in before}, "no subgraph namespace"

    done = store.retract_turn(thread_id, claim.token)
    assert done.run_id == runs[1]
    turn = set(during) - set(before)
    assert set(done.checkpoints) == turn, (
        f"{durability}: retracted but not of the turn {set(done.checkpoints) - turn}, "
        f"of the turn but not retracted {turn - set(done.checkpoints)}"
    )
    assert _keys(store, thread_id) == before, f"{durability}: history not as before the turn"
    latest = store.get_tuple({"configurable": {"thread_id": thread_id}})
    assert latest.config == latest_before.config and latest.checkpoint == latest_before.checkpoint
    assert graph.get_state({"configurable": {"thread_id": thread_id}}).values == values_before
    events = store.events_after(thread_id, 0, 1000)
    assert events[: len(events_before)] == events_before, "retraction removed older events"
    assert events[-1].kind == "retracted" and events[-1].seq == done.seq
    assert events[-1].data["run_id"] == runs[1]
    assert sorted(map(tuple, events[-1].data["checkpoints"])) == sorted(done.checkpoints)
    # The thread goes on from the restored state.
    out = _invoke(env, store, graph, "three", _run_config(claim, None), durability)
    assert out["log"][: len(values_before["log"]) + 1] == [*values_before["log"], "three"]


@contract_case(26)
def case_retract_turn_with_run_ids_restores_state(env: ContractEnv) -> None:
    """retract_turn removes the last run, all namespaces, with durability sync, async, exit."""
    for durability in ("sync", "async", "exit"):
        _check_retract_turn(env, durability, use_run_ids=True)


@contract_case(26)
def case_retract_turn_without_run_ids_uses_input_checkpoint(env: ContractEnv) -> None:
    """Without run ids, retract_turn removes everything from the newest input checkpoint."""
    for durability in ("sync", "async"):
        _check_retract_turn(env, durability, use_run_ids=False)


@contract_case(26)
def case_retract_turn_without_run_ids_takes_subgraphs_saved_first(env: ContractEnv) -> None:
    """Without run ids, a subgraph checkpoint saved before its turn's input goes with it."""
    # Under durability "async" a subgraph saves on its own loop and can commit
    # before the root's input checkpoint (tests/graphs/test_retract_graphs.py
    # shows LangGraph doing it); its metadata `parents[""]` names its turn.
    store = env.open()
    claim = store.claim("t", "w", 600)
    put = functools.partial(_put, store, "t", token=claim.token)
    one = put(None, source="input", step=-1)
    one = put(one, step=0)
    put(None, ns="sub:1", parents={"": one})  # turn one's, saved after its last root one
    put(None, ns="sub:9")  # names no root checkpoint: no turn's
    before = _keys(store, "t")
    two_input, two = str(uuid6(clock_seq=1)), str(uuid6(clock_seq=2))
    sub = put(None, ns="sub:2", parents={"": two})
    nested = put(None, ns="sub:2|inner:3", parents={"": two, "sub:2": sub})
    put(one, source="input", step=1, checkpoint_id=two_input)
    put(two_input, step=2, checkpoint_id=two)

    done = store.retract_turn("t", claim.token)
    turn = {("", two_input), ("", two), ("sub:2", sub), ("sub:2|inner:3", nested)}
    assert set(done.checkpoints) == turn
    assert _keys(store, "t") == before


@contract_case(26)
def case_retract_turn_by_run_id_removes_that_run_only(env: ContractEnv) -> None:
    """retract_turn(run_id=r) removes the checkpoints and writes of run r and nothing else."""
    store = env.open()
    graph = _graph(raw(store))
    claim = store.claim("t", "w", 600)
    runs = [str(uuid.uuid4()) for _ in range(3)]
    owner: dict[tuple[str, str], str] = {}
    for i, run in enumerate(runs):
        known = set(_keys(store, "t"))
        _invoke(env, store, graph, f"turn{i}", _run_config(claim, run), "sync")
        owner.update({k: run for k in _keys(store, "t") if k not in known})
    before = _keys(store, "t")
    done = store.retract_turn("t", claim.token, run_id=runs[1])
    assert done.run_id == runs[1]
    mine = {k for k, run in owner.items() if run == runs[1]}
    assert set(done.checkpoints) == mine and mine
    after = _keys(store, "t")
    assert set(after) == set(before) - mine
    for key, (parent, writes) in after.items():
        assert (parent, writes) == before[key], f"{key} changed"
    # Unknown run: nothing to remove, nothing changes, no event.
    seq_before = store.events_after("t", 0, 1000)[-1].seq
    nothing = store.retract_turn("t", claim.token, run_id="no-such-run")
    assert (nothing.checkpoints, nothing.writes, nothing.seq) == ([], 0, None)
    assert store.events_after("t", seq_before, 10) == []


def _review_graph(saver: Any) -> Any:
    def review(state: _State) -> dict[str, Any]:
        return {"log": [f"review:{interrupt('verdict?')}"]}

    g = StateGraph(_State)
    g.add_node("review", review)
    g.add_edge(START, "review")
    g.add_edge("review", END)
    return g.compile(checkpointer=saver)


@contract_case(26)
def case_retract_turn_removes_a_runs_writes_on_older_checkpoints(env: ContractEnv) -> None:
    """A resume's writes land on the interrupted run's checkpoint; retracting it removes them."""
    store = env.open()
    graph = _review_graph(raw(store))
    claim = store.claim("t", "w", 600)
    first = _run_config(claim, str(uuid.uuid4()))
    if isinstance(store, AsyncFacade):
        env.run_async(graph.ainvoke({"log": ["x"]}, first, durability="sync"))
    else:
        graph.invoke({"log": ["x"]}, first, durability="sync")
    waiting = _keys(store, "t")
    resume = str(uuid.uuid4())
    command: Command[Any] = Command(resume="no")
    config = _run_config(claim, resume)
    if isinstance(store, AsyncFacade):
        env.run_async(graph.ainvoke(command, config, durability="sync"))
    else:
        graph.invoke(command, config, durability="sync")
    assert store.retract_turn("t", claim.token).run_id == resume
    assert _keys(store, "t") == waiting, "the resume's writes outlived it"
    assert graph.get_state({"configurable": {"thread_id": "t"}}).next == ("review",)


@contract_case(26)
def case_retract_turn_with_stale_token_changes_nothing(env: ContractEnv) -> None:
    """A stale token is refused before anything else, and nothing changes."""
    store = env.open()
    graph = _graph(raw(store))
    old = store.claim("t", "w", 600)
    run = str(uuid.uuid4())
    _invoke(env, store, graph, "one", _run_config(old, run), "sync")
    store.take_over("t", "x", 600)
    before = _keys(store, "t")
    events = store.events_after("t", 0, 1000)
    for run_id in (None, run, "no-such-run"):
        exc = _raises(StaleClaim, store.retract_turn, "t", old.token, run_id=run_id)
        assert exc.token == old.token
    assert _keys(store, "t") == before
    assert store.events_after("t", 0, 1000) == events


# --- 27: retention --------------------------------------------------------------------


@contract_case(27)
def case_prune_by_count_keeps_newest_and_latest_per_namespace(env: ContractEnv) -> None:
    """max_checkpoints keeps the newest n and each namespace's latest; the floor moves up."""
    store = env.open()
    root: list[str] = []
    child: list[str] = []
    for step in range(6):  # root and child interleave: r0 c0 r1 c1 r2 r3 r4 r5
        root.append(_put(store, "t", root[-1] if root else None, step=step))
        store.put_writes(_conf("t", root[-1], None), [("w", step)], f"task{step}")
        if step < 2:
            child.append(_put(store, "t", child[-1] if child else None, ns="child:1", step=step))
    kept = {("", cid) for cid in root[-3:]} | {("child:1", child[-1])}
    before = _keys(store, "t")
    events_before = store.events_after("t", 0, 1000)
    # A generous max_events must not hold the floor below what removal reached.
    (result,) = store.prune(["t"], strategy=RetentionPolicy(max_checkpoints=3, max_events=1000))
    assert isinstance(result, PruneResult) and result.thread_id == "t"
    after = _keys(store, "t")
    assert set(after) == kept
    assert set(result.checkpoints) == set(before) - kept
    for key in kept:
        assert after[key] == before[key], "a kept checkpoint lost its writes"
    gone = _conf("t", root[0], None)
    assert store.get_tuple(gone) is None
    # Events go with their checkpoints: the floor is the first event of a kept one.
    first_kept = min(e.seq for e in events_before if (e.checkpoint_ns, e.checkpoint_id) in kept)
    assert result.floor == first_kept > 1
    assert result.events_removed == first_kept - 1
    assert _raises(ReplayUnavailable, store.events_after, "t", 0, 10).floor == first_kept
    remaining = store.events_after("t", first_kept - 1, 1000)
    assert remaining == [e for e in events_before if e.seq >= first_kept]
    # A second prune with the same policy removes nothing and keeps the floor.
    (again,) = store.prune(["t"], strategy=RetentionPolicy(max_checkpoints=3))
    assert (again.checkpoints, again.floor, again.events_removed) == ([], first_kept, 0)


@contract_case(27)
def case_prune_by_age_uses_store_clock_and_keeps_latest(env: ContractEnv) -> None:
    """max_age counts on the store's clock and never removes a namespace's latest."""
    store = env.open()
    ids: list[str] = []
    for step in range(3):
        ids.append(_put(store, "t", ids[-1] if ids else None, step=step))
        env.clock.advance(100)
    # now = start + 300: ids[0] is 300 s old, ids[1] 200 s, ids[2] 100 s.
    (result,) = store.prune(["t"], strategy=RetentionPolicy(max_age=250))
    assert result.checkpoints == [("", ids[0])]
    assert set(_keys(store, "t")) == {("", ids[1]), ("", ids[2])}
    env.clock.advance(10_000)  # everything is old now, but the latest stays
    (result,) = store.prune(["t"], strategy=RetentionPolicy(max_age=1))
    assert result.checkpoints == [("", ids[1])]
    assert set(_keys(store, "t")) == {("", ids[2])}


@contract_case(27)
def case_prune_by_event_count_never_lowers_floor(env: ContractEnv) -> None:
    """max_events raises the floor to keep the newest n events, never lowering it."""
    store = env.open()
    claim = store.claim("t", "w", 60)
    for i in range(10):
        store.append_events("t", claim.token, [("e", {"i": i})])
    (result,) = store.prune(["t"], strategy=RetentionPolicy(max_events=4))
    assert (result.floor, result.events_removed, result.checkpoints) == (7, 6, [])
    assert _seqs(store.events_after("t", 6, 100)) == [7, 8, 9, 10]
    assert store.compact_events("t", 9) == 9
    (result,) = store.prune(["t"], strategy=RetentionPolicy(max_events=100))
    assert (result.floor, result.events_removed) == (9, 0)
    assert _raises(ReplayUnavailable, store.events_after, "t", 7, 10).floor == 9
    assert store.append_events("t", claim.token, [("e", {})]) == [11]


@contract_case(27)
def case_prune_unknown_thread_is_no_error(env: ContractEnv) -> None:
    """Pruning a thread that does not exist reports nothing removed and creates nothing."""
    store = env.open()
    for strategy in ("keep_latest", RetentionPolicy(max_checkpoints=1, max_events=1)):
        (result,) = store.prune(["nope"], strategy=strategy)
        assert (result.thread_id, result.checkpoints, result.floor) == ("nope", [], 1)
    store.prune(["nope"], strategy="delete")
    assert store.prune([], strategy="keep_latest") == []
    assert store.events_after("nope", 0, 10) == []
    assert [t["thread_id"] for t in store.threads()] == []


# --- 28: deletion ---------------------------------------------------------------------


@contract_case(28)
def case_delete_thread_removes_that_thread_only(env: ContractEnv) -> None:
    """delete_thread removes one thread's history, events, floor and claim; tokens go on up."""
    store = env.open()
    claims = {t: store.claim(t, "w", 600) for t in ("t", "u")}
    for t in ("t", "u"):
        ids = _chain(store, t, 3, token=claims[t].token)
        store.put_writes(_conf(t, ids[-1], claims[t].token), [("x", 1)], "task")
        store.append_events(t, claims[t].token, [("e", {}), ("e", {})])
    store.compact_events("t", 3)
    other = (_keys(store, "u"), store.events_after("u", 0, 100), store.current_claim("u"))

    store.delete_thread("t")
    assert _keys(store, "t") == {}
    assert store.get_tuple({"configurable": {"thread_id": "t"}}) is None
    assert store.events_after("t", 0, 10) == []  # no floor left to be below
    assert store.current_claim("t") is None
    assert (_keys(store, "u"), store.events_after("u", 0, 100), store.current_claim("u")) == other
    old = claims["t"].token
    _raises(StaleClaim, _put, store, "t", None, token=old, source="input", step=-1)
    _raises(StaleClaim, store.append_events, "t", old, [("e", {})])
    fresh = store.claim("t", "w2", 600)
    assert fresh.token > max(c.token for c in claims.values())
    assert store.append_events("t", fresh.token, [("e", {})]) == [1]
    _put(store, "t", None, token=fresh.token, source="input", step=-1)
    assert _seqs(store.events_after("t", 0, 10)) == [1, 2]
    store.delete_thread("never-existed")  # no error
