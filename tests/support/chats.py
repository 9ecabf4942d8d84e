"""A long chat for the value table's tests (core/values.py): messages and notes that only grow.

`chat_graph` compiles a one-node graph whose state is `messages`
(`add_messages`) and `notes` (`operator.add`, a pydantic `Note` each turn);
`chat` runs turns of it, `history` reads a thread's whole history as
`get_state_history` gives it (values, next, step), for comparing savers.
The texts are seeded, so every saver given the same turns stores the same.
"""

from __future__ import annotations

import operator
import random
from typing import Annotated, Any

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from pydantic import BaseModel
from typing_extensions import TypedDict

_WORDS = [f"w{i}x{i * 7919 % 1000}" for i in range(3000)]


class Note(BaseModel):
    """A pydantic model in state, appended each turn (pass `allowed_types=[Note]`)."""

    turn: int
    tags: list[str]


class Chat(TypedDict):
    """The chat's state: two lists that grow every turn."""

    messages: Annotated[list, add_messages]
    notes: Annotated[list, operator.add]


def text(rng: random.Random, n: int = 60) -> str:
    """Return `n` words drawn by `rng`."""
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def chat_graph(saver: Any) -> Any:
    """Compile the chat graph with `saver`: START -> reply -> END."""

    def reply(state: Chat) -> dict[str, Any]:
        n = len(state["messages"])
        rng = random.Random(n)
        return {
            "messages": [AIMessage(text(rng), id=f"ai-{n}")],
            "notes": [Note(turn=n, tags=[text(rng, 2)])],
        }

    builder = StateGraph(Chat)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    return builder.compile(checkpointer=saver)


def chat(graph: Any, thread: str, turns: int, start: int = 0) -> None:
    """Run turns `start` .. `start + turns - 1` of thread `thread` (durability "sync")."""
    config = {"configurable": {"thread_id": thread}}
    for i in range(start, start + turns):
        message = HumanMessage(text(random.Random(-i)), id=f"h-{i}")
        graph.invoke({"messages": [message]}, config, durability="sync")


async def achat(graph: Any, thread: str, turns: int, start: int = 0) -> None:
    """`chat` through `ainvoke`."""
    config = {"configurable": {"thread_id": thread}}
    for i in range(start, start + turns):
        message = HumanMessage(text(random.Random(-i)), id=f"h-{i}")
        await graph.ainvoke({"messages": [message]}, config, durability="sync")


def history(graph: Any, thread: str) -> list[Any]:
    """Return every checkpoint of the thread, newest first, as `(values, next, step)`."""
    config = {"configurable": {"thread_id": thread}}
    return [(s.values, s.next, s.metadata["step"]) for s in graph.get_state_history(config)]
