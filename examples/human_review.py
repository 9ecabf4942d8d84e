"""Human review: a draft-review loop with `interrupt`; a rejected turn is retracted.

    python examples/human_review.py [path/to/file.db]

Each turn asks for a piece of writing: `draft` writes it, `review` stops the
graph with `interrupt()` until a reviewer answers. An approved draft is
published (the graph is resumed with `Command(resume=...)`). A rejected turn
is retracted with `retract_turn(..., run_id=...)` under a claim: its
checkpoints and writes go, so the thread is again exactly what it was after
the previous turn, and the next request resumes from there. The event log
keeps the record of what happened.
"""

from __future__ import annotations

import operator
import os
import sys
import tempfile
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from langgraph_fenced_sqlite import FencedRunner, FencedSqliteSaver

THREAD = "review-desk"


class State(TypedDict, total=False):
    """The request, its draft, and what was published so far."""

    request: str
    draft: str
    published: Annotated[list[str], operator.add]


def draft(state: State) -> dict[str, Any]:
    """Write a (very short) draft for the request."""
    words = state["request"].split()
    return {"draft": f"{words[0].upper()}: " + " ".join(reversed(words[1:]))}


def review(state: State) -> dict[str, Any]:
    """Stop for a reviewer's verdict; publish the draft if approved."""
    verdict = interrupt({"draft": state["draft"]})  # the graph stops here
    return {"published": [state["draft"]]} if verdict == "approve" else {}


def build() -> StateGraph[State]:
    """Return the uncompiled graph: draft -> review."""
    graph = StateGraph(State)
    graph.add_node("draft", draft)
    graph.add_node("review", review)
    graph.add_edge(START, "draft")
    graph.add_edge("draft", "review")
    graph.add_edge("review", END)
    return graph


def main(path: str) -> None:
    """Approve, reject (retract), then approve again; show the state after each step."""
    with FencedSqliteSaver(path) as saver:
        graph = build().compile(checkpointer=saver)
        runner = FencedRunner(graph, saver, holder="review-desk")
        runner.delete_thread(THREAD)

        def turn(n: int, request: str) -> str:
            """Ask for a piece of writing; return the turn's run id."""
            config: RunnableConfig = {
                "configurable": {"thread_id": THREAD},
                "metadata": {"run_id": f"turn-{n}"},
            }
            out = runner.invoke({"request": request}, config)
            (question,) = out["__interrupt__"]
            print(f"turn {n}: asked for {request!r}; waiting for review of {question.value}")
            return f"turn-{n}"

        def answer(n: int, verdict: str) -> None:
            """Resume the graph with the reviewer's verdict."""
            config: RunnableConfig = {
                "configurable": {"thread_id": THREAD},
                "metadata": {"run_id": f"review-{n}"},
            }
            runner.invoke(Command(resume=verdict), config)
            print(f"  reviewer: {verdict} -> published {published()}")

        def published() -> list[str]:
            """Return what the thread has published."""
            values = graph.get_state({"configurable": {"thread_id": THREAD}}).values
            return list(values["published"])

        def checkpoints() -> list[str]:
            """Return the thread's checkpoint ids, newest first."""
            return [t.config["configurable"]["checkpoint_id"] for t in saver.history(THREAD)]

        turn(1, "haiku about write-ahead logs")
        answer(1, "approve")
        after_turn_1 = checkpoints()

        run_id = turn(2, "limerick about lock contention")
        # Rejected: retract the whole turn under a claim (so no run races us).
        with saver.lease(THREAD, "reviewer", ttl=10) as lease:
            gone = saver.retract_turn(THREAD, lease.token, run_id=run_id)
        state = graph.get_state({"configurable": {"thread_id": THREAD}})
        print(
            f"  reviewer: reject -> retracted {len(gone.checkpoints)} checkpoints of {run_id}; "
            f"pending review: {bool(state.next)}; draft back to {state.values['draft']!r}"
        )
        assert checkpoints() == after_turn_1, "the thread is exactly as after turn 1"

        turn(3, "sonnet about fencing tokens")
        answer(3, "approve")
        assert published() == [
            "HAIKU: logs write-ahead about",
            "SONNET: tokens fencing about",
        ]

        print("\nevent log:")
        for event in saver.events_after(THREAD, 0, 1000):
            if event.kind.startswith("run_") or event.kind == "retracted":
                print(f"  #{event.seq:<3} {event.kind:<16} {event.data.get('run_id')}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.gettempdir(), "review.db"))
