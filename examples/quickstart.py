"""Quickstart: a small graph persisting to one SQLite file, then read back.

Run it with no arguments (the file goes to the temp directory), or give a path:

    python examples/quickstart.py [path/to/file.db]

It runs two turns of a tiny chat graph through a `FencedRunner` (one claim per
invocation), closes the store, then opens the file again, as a restarted
process would, and reads the state, the history and the event log back.
"""

from __future__ import annotations

import operator
import os
import sys
import tempfile
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from langgraph_fenced_sqlite import FencedRunner, FencedSqliteSaver


class State(TypedDict):
    """The conversation: every message, and how many turns so far."""

    messages: Annotated[list[str], operator.add]
    turns: int


def listen(state: State) -> dict[str, Any]:
    """Count the turn."""
    return {"turns": state.get("turns", 0) + 1}


def answer(state: State) -> dict[str, Any]:
    """Answer the last message."""
    question = state["messages"][-1]
    return {"messages": [f"bot: you said {question!r} (turn {state['turns']})"]}


def build() -> StateGraph[State]:
    """Return the uncompiled graph: listen -> answer."""
    graph = StateGraph(State)
    graph.add_node("listen", listen)
    graph.add_node("answer", answer)
    graph.add_edge(START, "listen")
    graph.add_edge("listen", "answer")
    graph.add_edge("answer", END)
    return graph


def main(path: str) -> None:
    """Run two turns on thread "demo", then read everything back from the file."""
    config: RunnableConfig = {"configurable": {"thread_id": "demo"}}

    with FencedSqliteSaver(path) as saver:
        runner = FencedRunner(build().compile(checkpointer=saver), saver, holder="quickstart")
        runner.delete_thread("demo")  # start fresh on every run of the example
        for text in ("hello", "how are you?"):
            out = runner.invoke({"messages": [f"user: {text}"]}, config)
            print(out["messages"][-1])

    # A new store on the same file: what a restarted process would see.
    with FencedSqliteSaver(path) as saver:
        graph = build().compile(checkpointer=saver)
        state = graph.get_state(config)
        print(f"\nread back from {path}:")
        print(f"  state after {state.values['turns']} turns:")
        for message in state.values["messages"]:
            print(f"    {message}")
        history = saver.history("demo", limit=100)
        print(f"  {len(history)} checkpoints, newest first:")
        for tup in history[:3]:
            md = tup.metadata
            print(f"    step {md['step']:>2}  source {md['source']:<5}  run {md['run_id'][:8]}")
        print("  event log (runner lifecycle):")
        for event in saver.events_after("demo", 0, 1000):
            if event.kind.startswith("run_"):
                print(f"    #{event.seq:<3} {event.kind:<14} run {event.data['run_id'][:8]}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.gettempdir(), "quickstart.db"))
