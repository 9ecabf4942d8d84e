"""Real LangGraph graphs end to end on the saver, compared with `InMemorySaver`.

One graph covers what LangGraph asks of a checkpointer: a `Send` fan-out, a
subgraph (whose checkpoints live in their own `sub:<task id>` namespace), an
`interrupt` inside that subgraph and its resume, time travel from an old
checkpoint, and `update_state` on an old checkpoint. Every scenario runs on
`FencedSqliteSaver` and on `InMemorySaver` side by side, through `invoke` or
`ainvoke`, with durability `sync`, `async` and `exit`, and the state histories
must match (values, next, step/source, parent structure, tasks; ids differ).
"""

from __future__ import annotations

import operator
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.types import Command, Interrupt, Send, StateSnapshot, interrupt

from langgraph_fenced_sqlite import StaleClaim, ThreadBusy

# --- the graph --------------------------------------------------------------------------


class State(TypedDict, total=False):
    """The parent graph's state."""

    items: Annotated[list[str], operator.add]
    topics: list[str]


class SubState(TypedDict, total=False):
    """The subgraph's state: shares `items`, adds its own `note`."""

    items: Annotated[list[str], operator.add]
    note: str


class WorkerInput(TypedDict):
    """What each `Send` carries."""

    topic: str


def _plan(state: State) -> State:
    return {"topics": ["x", "y", "z"], "items": ["plan"]}


def _fan_out(state: State) -> list[Send]:
    return [Send("worker", {"topic": t}) for t in state["topics"]]


def _worker(arg: WorkerInput) -> State:
    return {"items": [f"worker:{arg['topic']}"]}


def _sub_prepare(state: SubState) -> SubState:
    return {"items": ["sub:prepare"], "note": "prepared ü"}


def _sub_ask(state: SubState) -> SubState:
    answer = interrupt({"question": "approve?", "seen": len(state["items"])})
    return {"items": [f"sub:answer={answer}"]}


def build_graph(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    """Compile plan -> Send fan-out to workers -> subgraph (prepare -> ask/interrupt)."""
    sub = StateGraph(SubState)
    sub.add_node("prepare", _sub_prepare)
    sub.add_node("ask", _sub_ask)
    sub.add_edge(START, "prepare")
    sub.add_edge("prepare", "ask")
    parent = StateGraph(State)
    parent.add_node("plan", _plan)
    parent.add_node("worker", _worker)
    parent.add_node("sub", sub.compile())
    parent.add_edge(START, "plan")
    parent.add_conditional_edges("plan", _fan_out, ["worker"])
    parent.add_edge("worker", "sub")
    return parent.compile(checkpointer=checkpointer)


# --- driving sync or async --------------------------------------------------------------


class Driver:
    """Call a compiled graph through the sync (`invoke`) or async (`ainvoke`) API."""

    def __init__(self, graph: Any, mode: str, durability: str) -> None:
        """Drive `graph` with `mode` ("invoke" or "ainvoke") and `durability`."""
        self.graph, self.mode, self.durability = graph, mode, durability

    async def run(self, value: Any, config: dict[str, Any]) -> Any:
        """Invoke the graph once."""
        if self.mode == "invoke":
            return self.graph.invoke(value, config, durability=self.durability)
        return await self.graph.ainvoke(value, config, durability=self.durability)

    async def state(self, config: dict[str, Any], **kwargs: Any) -> StateSnapshot:
        """Return `get_state` / `aget_state`."""
        if self.mode == "invoke":
            return self.graph.get_state(config, **kwargs)
        return await self.graph.aget_state(config, **kwargs)

    async def history(self, config: dict[str, Any]) -> list[StateSnapshot]:
        """Return `get_state_history` / `aget_state_history` as a list."""
        if self.mode == "invoke":
            return list(self.graph.get_state_history(config))
        return [s async for s in self.graph.aget_state_history(config)]

    async def update(self, config: dict[str, Any], values: Any, as_node: str) -> Any:
        """Call `update_state` / `aupdate_state`."""
        if self.mode == "invoke":
            return self.graph.update_state(config, values, as_node=as_node)
        return await self.graph.aupdate_state(config, values, as_node=as_node)


def _norm(value: Any) -> Any:
    """Replace run-specific ids (interrupt ids) so two runs compare equal."""
    if isinstance(value, Interrupt):
        return ("Interrupt", _norm(value.value))
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_norm(v) for v in value]
    return value


def _shape(history: list[StateSnapshot]) -> list[tuple[Any, ...]]:
    """What a user sees of a history, with checkpoint ids replaced by positions."""
    index = {s.config["configurable"]["checkpoint_id"]: i for i, s in enumerate(history)}
    out = []
    for snap in history:
        parent = None
        if snap.parent_config is not None:
            parent = index.get(snap.parent_config["configurable"]["checkpoint_id"], "outside")
        tasks = [(t.name, repr(t.error), _norm(t.interrupts), _norm(t.result)) for t in snap.tasks]
        out.append(
            (
                _norm(snap.values),
                snap.next,
                snap.metadata["step"],
                snap.metadata["source"],
                parent,
                sorted(tasks, key=repr),
                _norm(snap.interrupts),
            )
        )
    return out


def _namespaces(saver: BaseCheckpointSaver[Any], thread_id: str) -> dict[str, list[Any]]:
    """Checkpoints per namespace of a thread, as (step, source, values) newest first."""
    out: dict[str, list[Any]] = {}
    for t in saver.list({"configurable": {"thread_id": thread_id}}):
        ns = t.config["configurable"]["checkpoint_ns"]
        out.setdefault(ns, []).append(
            (t.metadata["step"], t.metadata["source"], _norm(t.checkpoint["channel_values"]))
        )
    return out


def _ns_shapes(saver: BaseCheckpointSaver[Any], thread_id: str) -> list[Any]:
    # Subgraph namespaces embed task ids, which differ between two runs.
    by_ns = _namespaces(saver, thread_id)
    return sorted(((ns.split(":")[0], rows) for ns, rows in by_ns.items()), key=repr)


# --- the scenario -----------------------------------------------------------------------


async def run_scenario(
    drivers: dict[str, Driver], configs: dict[str, Callable[[dict[str, Any]], dict[str, Any]]]
) -> dict[str, Any]:
    """Run the same scenario through each driver, checking each step agrees.

    Args:
        drivers: "fenced" and "memory" drivers over one graph each.
        configs: Per driver, a function turning a thread config into the
            config to run with (the identity, or adding a claim's token).

    Returns:
        Per driver, the thread config used.
    """
    thread = {"configurable": {"thread_id": "thread-1"}}

    async def each(step: Callable[[str, Driver], Awaitable[Any]]) -> list[Any]:
        results = [await step(name, d) for name, d in drivers.items()]
        first = _norm(results[0])
        for other in results[1:]:
            assert _norm(other) == first
        return results

    # 1. Run to the interrupt inside the subgraph.
    first = await each(lambda n, d: d.run({"items": []}, configs[n](thread)))
    assert first[0]["items"] == ["plan", "worker:x", "worker:y", "worker:z"]
    assert first[0]["__interrupt__"][0].value == {"question": "approve?", "seen": 5}

    # The interrupted subgraph's state is read back from its own namespace.
    async def sub_state(name: str, d: Driver) -> Any:
        snap = await d.state(thread, subgraphs=True)
        assert snap.next == ("sub",)
        (task,) = snap.tasks
        assert isinstance(task.state, StateSnapshot), task.state
        ns = task.state.config["configurable"]["checkpoint_ns"]
        assert ns.startswith("sub:"), ns
        return task.state.values, task.state.next, [i.value for i in task.state.interrupts]

    sub = await each(sub_state)
    assert sub[0] == (
        {
            "items": ["plan", "worker:x", "worker:y", "worker:z", "sub:prepare"],
            "note": "prepared ü",
        },
        ("ask",),
        [{"question": "approve?", "seen": 5}],
    )

    # 2. Resume.
    done = await each(lambda n, d: d.run(Command(resume="yes"), configs[n](thread)))
    assert done[0]["items"][-1] == "sub:answer=yes"

    # 3. Time travel: run again from the checkpoint before the subgraph.
    async def old_checkpoint(name: str, d: Driver) -> dict[str, Any]:
        history = await d.history(thread)
        before_sub = [s for s in history if s.next == ("sub",)]
        return before_sub[-1].config

    olds = {n: await old_checkpoint(n, d) for n, d in drivers.items()}
    replay = await each(lambda n, d: d.run(None, configs[n](olds[n])))
    assert "__interrupt__" in replay[0]
    await each(lambda n, d: d.run(Command(resume="again"), configs[n](thread)))

    # 4. update_state on that old checkpoint (a fork), then continue from it.
    forks = {
        n: await d.update(configs[n](olds[n]), {"items": ["patched"]}, "worker")
        for n, d in drivers.items()
    }
    await each(lambda n, d: d.run(None, configs[n](forks[n])))
    final = await each(lambda n, d: d.run(Command(resume="after-fork"), configs[n](thread)))
    assert "patched" in final[0]["items"] and final[0]["items"][-1] == "sub:answer=after-fork"

    # 5. Histories and namespaces agree with InMemorySaver's.
    shapes = await each(lambda n, d: _wrap(_shape, d.history(thread)))
    assert len(shapes[0]) >= 4
    assert {row[3] for row in shapes[0]} >= {"loop", "fork", "update"}
    ns_shapes = [_ns_shapes(d.graph.checkpointer, "thread-1") for d in drivers.values()]
    assert all(s == ns_shapes[0] for s in ns_shapes), ns_shapes
    return {n: thread for n in drivers}


async def _wrap(fn: Callable[[Any], Any], coro: Awaitable[Any]) -> Any:
    return fn(await coro)


def _identity(config: dict[str, Any]) -> dict[str, Any]:
    return config


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
async def test_graph_matches_in_memory_saver(mode: str, durability: str, open_store: Any) -> None:
    """Interrupt/resume, subgraph, Send, time travel and update_state match InMemorySaver."""
    saver = open_store()
    memory = InMemorySaver()
    drivers = {
        "fenced": Driver(build_graph(saver), mode, durability),
        "memory": Driver(build_graph(memory), mode, durability),
    }
    await run_scenario(drivers, {"fenced": _identity, "memory": _identity})
    # The subgraph really wrote to a non-root namespace, and get_tuple reads it.
    namespaces = _namespaces(saver, "thread-1")
    sub_ns = [ns for ns in namespaces if ns]
    assert sub_ns and all(ns.startswith("sub:") for ns in sub_ns), list(namespaces)
    for ns in sub_ns:
        got = saver.get_tuple({"configurable": {"thread_id": "thread-1", "checkpoint_ns": ns}})
        assert got is not None and got.config["configurable"]["checkpoint_ns"] == ns
        listed = list(
            saver.list({"configurable": {"thread_id": "thread-1", "checkpoint_ns": ns}}, limit=1)
        )
        assert listed[0].checkpoint["channel_values"]["note"] == "prepared ü"
    # Root-only listing sees no subgraph checkpoint.
    root = list(saver.list({"configurable": {"thread_id": "thread-1", "checkpoint_ns": ""}}))
    assert {t.config["configurable"]["checkpoint_ns"] for t in root} == {""}


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
async def test_fenced_run_with_subgraph_send_and_time_travel(
    mode: str, durability: str, open_store: Any, clock: Any
) -> None:
    """Under a claim (`claim.config()`), the whole scenario runs and matches InMemorySaver."""
    saver = open_store(require_claim=True)
    claim = saver.claim("thread-1", "runner", 60)
    memory = InMemorySaver()
    drivers = {
        "fenced": Driver(build_graph(saver), mode, durability),
        "memory": Driver(build_graph(memory), mode, durability),
    }
    await run_scenario(drivers, {"fenced": claim.config, "memory": _identity})
    # Every checkpoint (subgraph namespaces included) was written under the token.
    events = saver.events_after("thread-1", 0, 10_000)
    assert events and {e.token for e in events} == {claim.token}
    assert any(e.checkpoint_ns for e in events if e.kind == "checkpoint")
    seqs = [e.seq for e in events]
    assert seqs == list(range(1, len(seqs) + 1))


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
async def test_unfenced_or_stale_run_is_refused_and_stores_nothing(
    durability: str, open_store: Any
) -> None:
    """During a claim, a run without the token is ThreadBusy; after a takeover, StaleClaim."""
    saver = open_store()
    graph = build_graph(saver)
    claim = saver.claim("thread-1", "runner", 60)
    thread = {"configurable": {"thread_id": "thread-1"}}
    with pytest.raises(ThreadBusy) as busy:
        await graph.ainvoke({"items": []}, thread, durability=durability)
    assert busy.value.holder == "runner"
    assert saver.get_tuple(thread) is None
    assert saver.events_after("thread-1", 0, 100) == []

    await graph.ainvoke({"items": []}, claim.config(), durability=durability)
    stored = saver.events_after("thread-1", 0, 10_000)
    saver.take_over("thread-1", "successor", 60)
    with pytest.raises(StaleClaim) as stale:
        graph.invoke(Command(resume="late"), claim.config(), durability=durability)
    assert stale.value.token == claim.token
    assert saver.events_after("thread-1", 0, 10_000) == stored


def _plain_subgraph_graph(checkpointer: BaseCheckpointSaver[Any], sub_checkpointer: Any) -> Any:
    sub = StateGraph(SubState)
    sub.add_node("prepare", _sub_prepare)
    sub.add_edge(START, "prepare")
    parent = StateGraph(State)
    parent.add_node("plan", _plan)
    parent.add_node("sub", sub.compile(checkpointer=sub_checkpointer))
    parent.add_edge(START, "plan")
    parent.add_edge("plan", "sub")
    return parent.compile(checkpointer=checkpointer)


@pytest.mark.parametrize(
    ("durability", "sub_checkpointer", "expected"),
    [
        ("sync", None, {"", "sub:<task>"}),
        ("async", None, {"", "sub:<task>"}),
        ("exit", None, {""}),
        ("sync", True, {"", "sub"}),
        ("exit", True, {"", "sub"}),
    ],
)
def test_which_subgraphs_get_a_namespace(
    durability: str, sub_checkpointer: Any, expected: set[str], open_store: Any
) -> None:
    """Pin LangGraph: a subgraph node's own namespace depends on durability and its compile flag.

    A plain subgraph node writes `sub:<task id>` checkpoints with durability
    `sync`/`async`, but none with `exit` unless it is interrupted (the run
    only saves at the end, and a finished subgraph has nothing to resume).
    Compiled with `checkpointer=True` it keeps one `sub` history per thread.
    Both savers agree.
    """
    found = []
    for saver in (open_store(), InMemorySaver()):
        graph = _plain_subgraph_graph(saver, sub_checkpointer)
        config = {"configurable": {"thread_id": "t"}}
        result = graph.invoke({"items": []}, config, durability=durability)
        assert result["items"][-1] == "sub:prepare"
        namespaces = {t.config["configurable"]["checkpoint_ns"] for t in saver.list(config)}
        found.append({ns.split(":")[0] + (":<task>" if ":" in ns else "") for ns in namespaces})
    assert found[0] == found[1] == expected
