"""A realistic agent graph and a file of its threads, for the operator's view.

The graph: an `agent` node that asks for a tool call (an `AIMessage` with
`tool_calls`), a `ToolNode` answering it (a `ToolMessage`), the agent's
answer, a `Send` fan-out to one `worker` per city, a `research` subgraph and
a `review` node that calls `interrupt()`. `make_agent_file` writes, through
`FencedRunner` (fresh uuid run ids, fencing tokens, run events):

- `chat-1`: waiting at `review`;
- `chat-2`: one fanned-out `worker` (Lyon) waiting for approval;
- `chat-3`: waiting inside the `research` subgraph;
- `chat-4`: the agent's model call failed (`ValueError`);
- `chat-5`: resumed to its end, then claimed live by `worker-7`;
- `chat-6`: resumed to its end, idle;
- `UUID_THREAD`: like `chat-6`, under a uuid thread id.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, Send, interrupt

from langgraph_fenced_sqlite import FencedRunner, FencedSqliteSaver

QUESTION = "What is the weather in Paris? " + "Please be thorough and cite sources. " * 8
UUID_THREAD = "5b3c2f0e-8a41-4d6e-9f1b-2c7d8e9a0b1c"
CITIES = ("Paris", "Lyon", "Nice")


@tool
def get_weather(city: str) -> str:
    """Return the weather in a city."""
    return f"sunny in {city}, 21C"


class State(TypedDict, total=False):
    """The agent's state."""

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


def agent(state: State) -> dict[str, Any]:
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


def route(state: State) -> Any:
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


def review(state: State) -> dict[str, Any]:
    """Wait for a human to approve the report."""
    answer = interrupt({"question": "send the report?", "summary": state.get("summary")})
    return {"approved": answer == "yes"}


def build_agent(checkpointer: Any = None) -> Any:
    """Compile the agent graph with `checkpointer`."""
    research = StateGraph(Research, output_schema=ResearchOut)
    research.add_node("summarise", summarise)
    research.add_edge(START, "summarise")
    graph = StateGraph(State)
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


def config(thread_id: str) -> dict[str, Any]:
    """The config of one of the file's threads."""
    return {"configurable": {"thread_id": thread_id}}


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
