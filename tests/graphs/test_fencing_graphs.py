"""Fenced runs of real LangGraph graphs: `claim.config()` in, `StaleClaim` out.

Graphs are compiled with the saver and run through LangGraph itself (sync and
async, every durability mode), so the token must survive LangGraph's own
config handling on its way to every `put` and `put_writes`.
"""

from __future__ import annotations

import asyncio
import operator
import threading
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from langgraph_fenced_sqlite import (
    TOKEN_KEY,
    CheckpointConflict,
    FencedSqliteSaver,
    StaleClaim,
    ThreadBusy,
)

DURABILITIES = ["sync", "async", "exit"]


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _graph(checkpointer: Any, *, pause: Any = None, apause: Any = None) -> Any:
    """Compile a -> sub (a two-node subgraph) -> c; `pause`/`apause` run inside `c`."""
    inner = StateGraph(State)
    inner.add_node("sub1", lambda s: {"log": ["sub1"]})
    inner.add_node("sub2", lambda s: {"log": ["sub2"]})
    inner.add_edge(START, "sub1")
    inner.add_edge("sub1", "sub2")
    inner.add_edge("sub2", END)

    outer = StateGraph(State)
    outer.add_node("a", lambda s: {"log": ["a"]})
    subgraph = inner.compile()

    # Called from a node, the subgraph inherits the checkpointer and the
    # config (token included) and checkpoints under namespace "sub:<task>".
    # It starts from an empty log: given the parent's state, operator.add
    # would count the parent's entries twice.
    def sub(state: State) -> dict[str, list[str]]:
        return {"log": subgraph.invoke({"log": []})["log"]}

    outer.add_node("sub", sub)
    if apause is not None:

        async def c(state: State) -> dict[str, list[str]]:
            await apause()
            return {"log": ["c"]}

    else:

        def c(state: State) -> dict[str, list[str]]:
            if pause is not None:
                pause()
            return {"log": ["c"]}

    outer.add_node("c", c)
    outer.add_edge(START, "a")
    outer.add_edge("a", "sub")
    outer.add_edge("sub", "c")
    outer.add_edge("c", END)
    return outer.compile(checkpointer=checkpointer)


RUN = ["a", "sub1", "sub2", "c"]


def _everything(store: FencedSqliteSaver, thread_id: str) -> tuple[Any, ...]:
    """All a thread holds, every namespace: checkpoints with writes, and events."""
    return (
        list(store.list({"configurable": {"thread_id": thread_id}})),
        store.events_after(thread_id, 0, 10_000),
    )


def _tokens(store: FencedSqliteSaver, thread_id: str) -> set[int | None]:
    """The token that wrote each stored checkpoint, all namespaces."""
    out = set()
    for t in store.list({"configurable": {"thread_id": thread_id}}):
        conf = t.config["configurable"]
        found = store.inspect_checkpoint(
            thread_id, checkpoint_ns=conf["checkpoint_ns"], checkpoint_id=conf["checkpoint_id"]
        )
        out.add(found["token"])
    return out


@pytest.mark.parametrize("durability", DURABILITIES)
def test_fenced_sync_runs_succeed(store: FencedSqliteSaver, durability: str) -> None:
    """`graph.invoke(inputs, claim.config())` runs and every checkpoint carries the token."""
    claim = store.claim("t", "me", 60)
    graph = _graph(store)
    assert graph.invoke({"log": []}, claim.config(), durability=durability)["log"] == RUN
    assert graph.invoke({"log": []}, claim.config(), durability=durability)["log"] == RUN * 2
    assert _tokens(store, "t") == {claim.token}
    namespaces = {t.config["configurable"]["checkpoint_ns"] for t in store.list(claim.config())}
    if durability != "exit":
        assert any(ns.startswith("sub:") for ns in namespaces)  # subgraph puts were fenced too
    assert graph.get_state(claim.config()).values["log"] == RUN * 2


@pytest.mark.parametrize("durability", DURABILITIES)
async def test_fenced_async_runs_succeed(store: FencedSqliteSaver, durability: str) -> None:
    """`await graph.ainvoke(inputs, claim.config())` runs and every checkpoint carries the token."""
    claim = await store.aclaim("t", "me", 60)
    graph = _graph(store)
    assert (await graph.ainvoke({"log": []}, claim.config(), durability=durability))["log"] == RUN
    out = await graph.ainvoke({"log": []}, claim.config(), durability=durability)
    assert out["log"] == RUN * 2
    assert _tokens(store, "t") == {claim.token}


def test_token_never_reaches_checkpoint_metadata(store: FencedSqliteSaver) -> None:
    """LangGraph copies scalar `configurable` entries into metadata, but not the token.

    Surprising but relied on: `get_checkpoint_metadata` copies every str/int
    `configurable` value not starting with "__" into each checkpoint's
    metadata. The token key starts with "__", so a token never leaks there
    (and an identical retried put is not made different by a new token).
    """
    assert TOKEN_KEY.startswith("__")
    claim = store.claim("t", "me", 60)
    _graph(store).invoke({"log": []}, claim.config(tenant="acme", shard=7))
    for t in store.list(claim.config()):
        assert TOKEN_KEY not in t.metadata
        assert (t.metadata["tenant"], t.metadata["shard"]) == ("acme", 7)


@pytest.mark.parametrize("durability", DURABILITIES)
def test_superseded_sync_run_fails_and_lands_nothing(open_store: Any, durability: str) -> None:
    """A run whose claim was taken over mid-run fails with StaleClaim and stores nothing more."""
    store, owner_store = open_store(), open_store()
    entered, wake = threading.Event(), threading.Event()

    def pause() -> None:
        entered.set()
        assert wake.wait(60)

    old = store.claim("t", "old", 60)
    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            _graph(store, pause=pause).invoke({"log": []}, old.config(), durability=durability)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            outcome["error"] = exc

    runner = threading.Thread(target=run)
    runner.start()
    try:
        assert entered.wait(60)
        new = owner_store.take_over("t", "new", 60)
        at_takeover = _everything(owner_store, "t")
    finally:
        wake.set()
        runner.join(60)
    error = outcome.get("error")
    assert isinstance(error, StaleClaim), repr(error)
    assert (error.thread_id, error.token, error.current_token) == ("t", old.token, new.token)
    assert error.is_stale_write_owner_error is True
    assert _everything(owner_store, "t") == at_takeover
    assert _tokens(owner_store, "t") <= {old.token}
    # The new owner carries on from whatever the old run made durable.
    resume = None if at_takeover[0] else {"log": []}
    state = _graph(owner_store).invoke(resume, new.config(), durability=durability)
    assert state["log"] == RUN


@pytest.mark.parametrize("durability", DURABILITIES)
async def test_superseded_async_run_fails_and_lands_nothing(
    open_store: Any, durability: str
) -> None:
    """An async run whose claim was taken over mid-run fails with StaleClaim, storing nothing."""
    store, owner_store = open_store(), open_store()
    entered, wake = asyncio.Event(), asyncio.Event()

    async def pause() -> None:
        entered.set()
        await wake.wait()

    old = await store.aclaim("t", "old", 60)
    graph = _graph(store, apause=pause)
    task = asyncio.create_task(graph.ainvoke({"log": []}, old.config(), durability=durability))
    await asyncio.wait_for(entered.wait(), 60)
    new = await owner_store.atake_over("t", "new", 60)
    at_takeover = await asyncio.to_thread(_everything, owner_store, "t")
    wake.set()
    with pytest.raises(StaleClaim) as info:
        await asyncio.wait_for(task, 60)
    assert (info.value.token, info.value.current_token) == (old.token, new.token)
    assert await asyncio.to_thread(_everything, owner_store, "t") == at_takeover
    resume = None if at_takeover[0] else {"log": []}
    state = await _graph(owner_store).ainvoke(resume, new.config(), durability=durability)
    assert state["log"] == RUN


def test_run_with_a_stale_claim_stores_nothing(store: FencedSqliteSaver) -> None:
    """Starting a run with a claim already taken over fails before anything is stored."""
    old = store.claim("t", "old", 60)
    store.take_over("t", "new", 60)
    with pytest.raises(StaleClaim):
        _graph(store).invoke({"log": []}, old.config())
    assert _everything(store, "t") == ([], [])


@pytest.mark.parametrize("api", ["sync", "async"])
def test_unfenced_invoke_on_a_claimed_thread_is_thread_busy(
    store: FencedSqliteSaver, api: str
) -> None:
    """An unfenced run on a thread with a live claim raises ThreadBusy and stores nothing."""
    claim = store.claim("t", "me", 60)
    graph = _graph(store)
    plain = {"configurable": {"thread_id": "t"}}
    with pytest.raises(ThreadBusy) as info:
        if api == "sync":
            graph.invoke({"log": []}, plain)
        else:
            asyncio.run(graph.ainvoke({"log": []}, plain))
    assert (info.value.thread_id, info.value.holder) == ("t", "me")
    assert _everything(store, "t") == ([], [])
    store.release("t", claim.token)
    assert graph.invoke({"log": []}, plain)["log"] == RUN  # unclaimed: plain LangGraph
    assert _tokens(store, "t") == {None}


def test_require_claim_store_refuses_unfenced_runs(open_store: Any) -> None:
    """With `require_claim=True`, a run without a claim is refused; with one it runs."""
    strict = open_store(require_claim=True)
    graph = _graph(strict)
    with pytest.raises(ThreadBusy):
        graph.invoke({"log": []}, {"configurable": {"thread_id": "t"}})
    claim = strict.claim("t", "me", 60)
    assert graph.invoke({"log": []}, claim.config())["log"] == RUN


def test_interrupt_and_resume_under_claims(store: FencedSqliteSaver) -> None:
    """Interrupt/resume (special writes) work fenced; a stale owner cannot resume."""
    builder = StateGraph(State)
    builder.add_node("ask", lambda s: {"log": [f"answer:{interrupt('question?')}"]})
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    graph = builder.compile(checkpointer=store)

    old = store.claim("t", "old", 60)
    paused = graph.invoke({"log": []}, old.config())
    assert [i.value for i in paused["__interrupt__"]] == ["question?"]
    new = store.take_over("t", "new", 60)
    before = _everything(store, "t")
    with pytest.raises(StaleClaim):
        graph.invoke(Command(resume="stale"), old.config())
    assert _everything(store, "t") == before
    assert graph.invoke(Command(resume="fresh"), new.config())["log"] == ["answer:fresh"]


def test_lease_config_runs_a_graph(store: FencedSqliteSaver) -> None:
    """`with saver.lease(...) as lease: graph.invoke(inputs, lease.config())` runs fenced."""
    with store.lease("t", "me", ttl=60) as lease:
        assert _graph(store).invoke({"log": []}, lease.config())["log"] == RUN
        token = lease.token
    assert _tokens(store, "t") == {token}
    assert store.current_claim("t") is None


@pytest.mark.parametrize("durability", DURABILITIES)
def test_time_travel_under_a_claim(store: FencedSqliteSaver, durability: str) -> None:
    """Replay and update_state from an old checkpoint work fenced; new input there does not.

    Surprising, and pinned: replaying (`invoke(None, old config)`) works
    because LangGraph first writes a checkpoint with source "fork" (except
    with durability "exit", which writes no fork and is refused). New input
    at an old checkpoint is an "input" put whose parent is not the latest, so
    the version check refuses it (docs/semantics.md §3); `update_state` there (source
    "update", a fork) and then invoking is the way to branch with new input.

    The refused run is not atomic, though: with durability "async" LangGraph
    keeps running while the refused put is in flight, and the subgraph's
    checkpoints land in their own, new namespace (where they are the first,
    so the version check passes) before the run fails. They carry the
    owner's valid token: fencing holds, only the root history is protected.
    """
    claim = store.claim("t", "me", 60)
    graph = _graph(store)
    graph.invoke({"log": []}, claim.config(), durability="sync")  # a history to travel in
    old = next(s for s in graph.get_state_history(claim.config()) if s.next == ("sub",))
    old_id = old.config["configurable"]["checkpoint_id"]
    at_old = claim.config(checkpoint_id=old_id)
    if durability == "exit":
        # With "exit" LangGraph writes no "fork" first: its one checkpoint is
        # a "loop" put off an old parent, which the version check refuses.
        tip = store.history("t", limit=1)[0].config
        with pytest.raises(CheckpointConflict):
            graph.invoke(None, at_old, durability=durability)
        assert store.history("t", limit=1)[0].config == tip
    else:
        assert graph.invoke(None, at_old, durability=durability)["log"] == RUN
        assert store.history("t", limit=1)[0].metadata["step"] > old.metadata["step"]
    root = [t.config for t in store.history("t", limit=1000)]
    latest = root[0]["configurable"]["checkpoint_id"]
    before = {t.config["configurable"]["checkpoint_id"] for t in store.list(claim.config())}
    with pytest.raises(CheckpointConflict) as info:
        graph.invoke({"log": ["new"]}, claim.config(checkpoint_id=old_id), durability=durability)
    assert (info.value.expected, info.value.actual) == (old_id, latest)
    assert [t.config for t in store.history("t", limit=1000)] == root
    landed = [
        t
        for t in store.list(claim.config())
        if t.config["configurable"]["checkpoint_id"] not in before
    ]
    if durability != "async":
        assert landed == []
    old_namespaces = {c["configurable"]["checkpoint_ns"] for c in root} | {
        t.config["configurable"]["checkpoint_ns"]
        for t in store.list(claim.config())
        if t.config["configurable"]["checkpoint_id"] in before
    }
    for t in landed:
        assert t.config["configurable"]["checkpoint_ns"] not in old_namespaces
    assert _tokens(store, "t") == {claim.token}
    branch = graph.update_state(claim.config(checkpoint_id=old_id), {"log": ["edit"]})
    resumed = graph.invoke(None, claim.config(**branch["configurable"]), durability=durability)
    assert resumed["log"] == ["a", "edit", "sub1", "sub2", "c"]


def test_update_state_is_fenced(store: FencedSqliteSaver) -> None:
    """`update_state` with a stale claim is StaleClaim; unfenced under a live claim, ThreadBusy."""
    old = store.claim("t", "old", 60)
    graph = _graph(store)
    graph.invoke({"log": []}, old.config())
    new = store.take_over("t", "new", 60)
    before = _everything(store, "t")
    with pytest.raises(StaleClaim):
        graph.update_state(old.config(), {"log": ["stale"]})
    with pytest.raises(ThreadBusy):
        graph.update_state({"configurable": {"thread_id": "t"}}, {"log": ["unfenced"]})
    assert _everything(store, "t") == before
    graph.update_state(new.config(), {"log": ["owner"]})
    assert graph.get_state(new.config()).values["log"] == [*RUN, "owner"]
