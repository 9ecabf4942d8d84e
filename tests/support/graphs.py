"""The shared graphs and the threads they write, for every test that runs one.

Two graphs come with a maker that writes threads in every status:

The ops graph (`build_ops_graph`): `step` -> `sub` (a subgraph) -> `ask` (an
`interrupt`), and `step` raises when the input says `boom`. `make_ops_file`
writes threads in every status through the real runner and LangGraph:

- `done`: ran, stopped at the interrupt, resumed and completed (idle);
- `waiting`: stopped at the interrupt (interrupted at `ask`);
- `broken`: its run raised (failed);
- `busy`: claimed live by `worker-9` for an hour (running);
- `old`: completed 40 days ago, by a store whose clock is 40 days behind (idle);
- `plain`: run by plain `graph.invoke`, no runner, no claim (idle).

`write_threads` writes the same kinds of threads into any store (SQLite or
PostgreSQL), and `same_ids` masks what differs between two stores given them.

The agent graph (`build_agent`): an `agent` node that asks for a tool call (an
`AIMessage` with `tool_calls`), a `ToolNode` answering it (a `ToolMessage`),
the agent's answer, a `Send` fan-out to one `worker` per city, a `research`
subgraph and a `review` node that calls `interrupt()`. `make_agent_file`
writes, through `FencedRunner` (fresh uuid run ids, fencing tokens, run events):

- `chat-1`: waiting at `review`;
- `chat-2`: one fanned-out `worker` (Lyon) waiting for approval;
- `chat-3`: waiting inside the `research` subgraph;
- `chat-4`: the agent's model call failed (`ValueError`);
- `chat-5`: resumed to its end, then claimed live by `worker-7`;
- `chat-6`: resumed to its end, idle;
- `UUID_THREAD`: like `chat-6`, under a uuid thread id.

The import source graph (`build_source_graph`): a fan-out with `Send`, a
subgraph that interrupts, a fork made by `update_state`; `write_source_threads`
writes its three threads through any saver (LangGraph's `SqliteSaver` and
`PostgresSaver` for the importers' tests), `assert_same_threads` compares two.

The log graphs over a `DeltaChannel` (`delta_graph`, `run_log`) for retention,
and the chains for one commit per step (`chain_graph`, `asks_graph`).

Child processes import these too (`sys.path.insert(0, TESTS_DIR)`, then
`from support.graphs import ...`), so everything here is at module level.
"""

from __future__ import annotations

import dataclasses
import operator
import re
import time
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.channels import DeltaChannel
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, Send, interrupt

from langgraph_fenced_sqlite import FencedRunner, FencedSqliteSaver, ManualClock

from .configs import config

DAY = 86400.0

# --- the ops graph -------------------------------------------------------------------------


class OpsState(TypedDict, total=False):
    """The ops graph's state."""

    items: Annotated[list[str], operator.add]
    count: int
    boom: bool


def _step(state: OpsState) -> dict[str, Any]:
    if state.get("boom"):
        raise ValueError("the model call failed")
    return {"items": [f"step{state.get('count', 0)}"], "count": 1}


def build_ops_graph(checkpointer: Any, **compile_kwargs: Any) -> Any:
    """Compile step -> sub(tag) -> ask (an interrupt) with `checkpointer` (and `compile_kwargs`)."""
    sub = StateGraph(OpsState)
    sub.add_node("tag", lambda s: {"items": ["sub"]})
    sub.add_edge(START, "tag")
    graph = StateGraph(OpsState)
    graph.add_node("step", _step)
    graph.add_node("sub", sub.compile())
    graph.add_node("ask", lambda s: {"items": [interrupt("approve?")]})
    graph.add_edge(START, "step")
    graph.add_edge("step", "sub")
    graph.add_edge("sub", "ask")
    return graph.compile(checkpointer=checkpointer, **compile_kwargs)


def make_ops_file(path: str) -> None:
    """Write the six threads described in the module docstring into `path`."""
    with FencedSqliteSaver(path, clock=ManualClock(time.time() - 40 * DAY)) as saver:
        runner = FencedRunner(build_ops_graph(saver), saver, holder="worker-old")
        runner.invoke({"count": 0}, config("old"))
        runner.invoke(Command(resume="ok"), config("old"))
    with FencedSqliteSaver(path) as saver:
        graph = build_ops_graph(saver)
        runner = FencedRunner(graph, saver, holder="worker-1")
        runner.invoke({"count": 0}, config("done"))
        runner.invoke(Command(resume="ok"), config("done"))
        runner.invoke({"count": 2}, config("waiting"))
        try:
            runner.invoke({"boom": True}, config("broken"))
        except ValueError:
            pass
        else:  # pragma: no cover - the node raises
            raise AssertionError("the broken run did not fail")
        graph.invoke({"count": 3}, config("plain"))
        graph.invoke(Command(resume="fine"), config("plain"))
        claim = saver.claim("busy", "worker-9", 3600)
        graph.invoke({"count": 4}, claim.config())


# --- the same threads in either store (the tests in tests/postgres/ compare the stores) -----

# Checkpoint, task and run ids, and LangGraph's interrupt ids (32 hex digits, not all digits).
_UUID = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|\b(?=[0-9]*[a-f])[0-9a-f]{32}\b"
)
# A channel version: a counter, then a random suffix (`get_next_version`).
# A thread's own are 10 digits and 8 hex; those continuing an older thread, 32 digits.
_VERSION = re.compile(r"\b(\d{10}|\d{32})\.(?:[0-9a-f]{8}\b|[0-9.]+)")


def same_ids(value: Any) -> Any:
    """Replace every id and random version suffix in `value` (nested, dataclasses too).

    Two stores given the same runs differ in these only: LangGraph and the
    runner draw them at random. Dataclasses (`Interrupt`, `CheckpointDiff`...)
    become their type's name and fields.
    """
    if isinstance(value, str):
        return _UUID.sub("<id>", _VERSION.sub(r"\1.<random>", value))
    if isinstance(value, dict):
        return {same_ids(k): same_ids(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [same_ids(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {"type": type(value).__name__, **same_ids(fields)}
    return value


def write_threads(saver: Any, clock: ManualClock) -> None:
    """Write threads in every status through the runner (as `make_ops_file` does into a file).

    `old` 40 days ago (its events below seq 4 compacted); then `done`
    (resumed to the end), `waiting` (at the
    interrupt), `broken` (its node raised), `plain` (no runner), `busy`
    (claimed live for an hour), `released` (claimed and released, nothing
    written) and `deleted` (written, then deleted: not a thread any more).
    Every run is durable per step ("sync"), so commits come in one order and
    their positions are the same in any store.
    """
    graph = build_ops_graph(saver)
    runner = FencedRunner(graph, saver, holder="worker-1")
    runner.invoke({"count": 0}, config("old"), durability="sync")
    runner.invoke(Command(resume="ok"), config("old"), durability="sync")
    saver.compact_events("old", 4)  # its floor: 4
    clock.advance(40 * DAY)
    runner.invoke({"count": 0}, config("done"), durability="sync")
    runner.invoke(Command(resume="ok"), config("done"), durability="sync")
    clock.advance(5)
    runner.invoke({"count": 2}, config("waiting"), durability="sync")
    clock.advance(5)
    with pytest.raises(ValueError):
        runner.invoke({"boom": True}, config("broken"), durability="sync")
    graph.invoke({"count": 3}, config("plain"), durability="sync")
    graph.invoke(Command(resume="fine"), config("plain"), durability="sync")
    clock.advance(5)
    claim = saver.claim("busy", "worker-9", 3600)
    graph.invoke({"count": 4}, claim.config(), durability="sync")
    saver.release("released", saver.claim("released", "worker-2", 60).token)
    runner.invoke({"count": 5}, config("deleted"), durability="sync")
    saver.delete_thread("deleted")
    clock.advance(5)


# --- the agent graph -----------------------------------------------------------------------

QUESTION = "What is the weather in Paris? " + "Please be thorough and cite sources. " * 8
UUID_THREAD = "5b3c2f0e-8a41-4d6e-9f1b-2c7d8e9a0b1c"
CITIES = ("Paris", "Lyon", "Nice")


@tool
def get_weather(city: str) -> str:
    """Return the weather in a city."""
    return f"sunny in {city}, 21C"


class AgentState(TypedDict, total=False):
    """The agent graph's state."""

    messages: Annotated[list[Any], add_messages]
    results: Annotated[list[str], operator.add]
    profile: dict[str, Any]
    turns: int
    summary: str
    approved: bool
    mode: str


class Research(TypedDict, total=False):
    """The research subgraph's state."""

    results: list[str]
    summary: str
    mode: str


class ResearchOut(TypedDict, total=False):
    """What the research subgraph returns to its parent."""

    summary: str


def agent(state: AgentState) -> dict[str, Any]:
    """Ask for the weather, then answer (a model stand-in)."""
    if state.get("mode") == "fail":
        raise ValueError("model timed out")
    if not any(isinstance(m, ToolMessage) for m in state["messages"]):
        call = {"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1"}
        return {
            "messages": [AIMessage("", tool_calls=[call])],
            "profile": {"user": "ana", "lang": "fr"},
            "turns": 1,
        }
    return {
        "messages": [AIMessage("It is sunny in Paris, 21C.")],
        "profile": {"user": "ana", "lang": "en", "tz": "CET"},
        "turns": 2,
    }


def route(state: AgentState) -> Any:
    """Call the tool, or fan out to one worker per city."""
    if state["messages"][-1].tool_calls:
        return "tools"
    return [Send("worker", {"city": c, "mode": state.get("mode", "")}) for c in CITIES]


def worker(state: dict[str, Any]) -> dict[str, Any]:
    """Check one city (Lyon needs approval in mode `approve-cities`)."""
    if state.get("mode") == "approve-cities" and state["city"] == "Lyon":
        interrupt({"approve city": state["city"]})
    return {"results": [f"checked {state['city']}"]}


def summarise(state: Research) -> dict[str, Any]:
    """Summarise the results (asks first in mode `ask-inside`)."""
    if state.get("mode") == "ask-inside":
        interrupt("summary ok?")
    return {"summary": f"{len(state.get('results') or [])} cities checked"}


def review(state: AgentState) -> dict[str, Any]:
    """Wait for a human to approve the report."""
    answer = interrupt({"question": "send the report?", "summary": state.get("summary")})
    return {"approved": answer == "yes"}


def build_agent(checkpointer: Any = None) -> Any:
    """Compile the agent graph with `checkpointer`."""
    research = StateGraph(Research, output_schema=ResearchOut)
    research.add_node("summarise", summarise)
    research.add_edge(START, "summarise")
    graph = StateGraph(AgentState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([get_weather]))
    graph.add_node("worker", worker)
    graph.add_node("research", research.compile())
    graph.add_node("review", review)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", "worker"])
    graph.add_edge("tools", "agent")
    graph.add_edge("worker", "research")
    graph.add_edge("research", "review")
    return graph.compile(checkpointer=checkpointer)


def make_agent_file(path: str) -> None:
    """Write the threads listed in the module docstring into `path`."""
    with FencedSqliteSaver(path) as saver:
        runner = FencedRunner(build_agent(saver), saver, holder="worker-1")
        start = {"messages": [HumanMessage(QUESTION)]}
        runner.invoke(start, config("chat-1"))
        runner.invoke({**start, "mode": "approve-cities"}, config("chat-2"))
        runner.invoke({**start, "mode": "ask-inside"}, config("chat-3"))
        try:
            runner.invoke({**start, "mode": "fail"}, config("chat-4"))
        except ValueError:
            pass
        for thread_id in ("chat-5", "chat-6", UUID_THREAD):
            runner.invoke(start, config(thread_id))
            runner.invoke(Command(resume="yes"), config(thread_id))
        saver.claim("chat-5", "worker-7", 3600)


# --- the import source graph (LangGraph's own savers write it; the importers read it) ------

SOURCE_THREADS = ("done", "waiting", "forked")


class SourceState(TypedDict, total=False):
    """The parent graph's state."""

    items: Annotated[list[str], operator.add]
    messages: Annotated[list[AnyMessage], add_messages]


class Review(TypedDict, total=False):
    """The subgraph's state."""

    items: Annotated[list[str], operator.add]
    verdict: str


def _review(state: Review) -> Review:
    return {"verdict": interrupt({"question": "ship it?", "items": len(state["items"])})}


def build_source_graph(checkpointer: Any) -> Any:
    """Compile plan -> fan-out to workers -> review (a subgraph that interrupts) -> reply."""
    review = StateGraph(Review)
    review.add_node("ask", _review)
    review.add_edge(START, "ask")
    graph = StateGraph(SourceState)
    graph.add_node("plan", lambda s: {"items": ["plan"]})
    graph.add_node("worker", lambda arg: {"items": [f"work:{arg['topic']}"]})
    graph.add_node("review", review.compile())
    graph.add_node("reply", lambda s: {"messages": [AIMessage(content=f"{len(s['items'])} items")]})
    graph.add_edge(START, "plan")
    graph.add_conditional_edges(
        "plan", lambda s: [Send("worker", {"topic": t}) for t in ("x", "y")], ["worker"]
    )
    graph.add_edge("worker", "review")
    graph.add_edge("review", "reply")
    return graph.compile(checkpointer=checkpointer)


def write_source_threads(saver: Any) -> None:
    """Write the three threads (`SOURCE_THREADS`) through `saver`."""
    graph = build_source_graph(saver)
    start = {"messages": [HumanMessage(content="hi")]}
    graph.invoke(start, config("done"))
    graph.invoke(Command(resume="yes"), config("done"))
    graph.invoke(start, config("waiting"))
    graph.invoke(start, config("forked"))
    graph.invoke(Command(resume="no"), config("forked"))
    old = list(graph.get_state_history(config("forked")))[3]
    forked = graph.update_state(old.config, {"items": ["edited"]})
    graph.invoke(None, forked)
    graph.invoke(Command(resume="again"), config("forked"))


def tuples(saver: Any) -> list[Any]:
    """Every checkpoint tuple a saver lists, all threads and namespaces."""
    return [
        (t.config, t.checkpoint, t.metadata, t.parent_config, t.pending_writes)
        for t in saver.list(None)
    ]


def assert_same_threads(original: Any, fenced: Any) -> Any:
    """Assert every thread's history and state (subgraphs too) are the same; return our graph."""
    theirs, ours = build_source_graph(original), build_source_graph(fenced)
    for thread_id in SOURCE_THREADS:
        expected = list(theirs.get_state_history(config(thread_id)))
        assert len(expected) >= 4
        assert list(ours.get_state_history(config(thread_id))) == expected
        assert ours.get_state(config(thread_id), subgraphs=True) == theirs.get_state(
            config(thread_id), subgraphs=True
        )
    return ours


# --- the log graphs (retention: DeltaChannel) ---------------------------------------------


def run_log(graph: Any, thread_id: str, text: str, run_id: str | None = None, **kw: Any) -> Any:
    """Invoke a graph over a `log` channel with `text` (under `run_id`, if given)."""
    return graph.invoke({"log": [text]}, config(thread_id, run_id=run_id), **kw)


def append_all(state: Sequence[str], writes: Sequence[Sequence[str]]) -> list[str]:
    """DeltaChannel reducer: batching-invariant list concatenation."""
    out = list(state)
    for w in writes:
        out.extend(w)
    return out


def delta_graph(saver: Any, snapshot_every: int, *, unused: bool = False) -> Any:
    """a -> b -> END over a DeltaChannel list, snapshotting every `snapshot_every` updates.

    With `unused`, the state also has a DeltaChannel no node ever writes.
    """
    fields: dict[str, Any] = {
        "log": Annotated[list[str], DeltaChannel(append_all, snapshot_frequency=snapshot_every)],
        "n": int,
    }
    if unused:
        fields["unused"] = Annotated[list[str], DeltaChannel(append_all, snapshot_frequency=3)]
    # Functional form: the class form's annotations are strings here (future
    # import) and could not see `snapshot_every`.
    delta_state = TypedDict("DeltaState", fields)  # type: ignore[misc]

    def a(state: Any) -> dict[str, Any]:
        return {"log": ["a"], "n": state.get("n", 0) + 1}

    def b(state: Any) -> dict[str, Any]:
        return {"log": ["b"]}

    g = StateGraph(delta_state)
    g.add_node("a", a)
    g.add_node("b", b)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    return g.compile(checkpointer=saver)


def history_values(graph: Any, thread_id: str) -> dict[str, Any]:
    """checkpoint id -> reconstructed values, for every checkpoint of the thread."""
    return {
        s.config["configurable"]["checkpoint_id"]: s.values
        for s in graph.get_state_history({"configurable": {"thread_id": thread_id}})
    }


# --- the chains (one commit per step) -------------------------------------------------------


class CountState(TypedDict):
    """A counter."""

    count: int


class TrailState(TypedDict):
    """A counter and the nodes visited."""

    count: int
    trail: Annotated[list[str], operator.add]


def chain_graph(saver: Any, nodes: int = 5, *, trail: bool = True) -> Any:
    """n0 -> n1 -> ... -> END, each node adding 1 to `count` (and its name to `trail`,
    unless `trail=False`: then the state is the count alone)."""
    graph = StateGraph(TrailState if trail else CountState)
    previous = START
    for i in range(nodes):
        name = f"n{i}"
        if trail:
            graph.add_node(name, lambda s, name=name: {"count": s["count"] + 1, "trail": [name]})
        else:
            graph.add_node(name, lambda s: {"count": s["count"] + 1})
        graph.add_edge(previous, name)
        previous = name
    graph.add_edge(previous, END)
    return graph.compile(checkpointer=saver)


def asks_graph(saver: Any) -> Any:
    """`first` -> `ask`, which interrupts (or, resumed with "boom", raises)."""

    def ask(state: Any) -> Any:
        answer = interrupt("go on?")
        if answer == "boom":
            raise RuntimeError("boom")
        return {"trail": [answer]}

    graph = StateGraph(TrailState)
    graph.add_node("first", lambda s: {"trail": ["first"]})
    graph.add_node("ask", ask)
    graph.add_edge(START, "first")
    graph.add_edge("first", "ask")
    graph.add_edge("ask", END)
    return graph.compile(checkpointer=saver)
