"""Retracting a rejected turn of a human-in-the-loop graph, then going on.

A turn drafts, then `interrupt`s for review. A reviewer who rejects it has
the turn retracted: the thread is back at the previous turn's state (no
pending interrupt), and the next turn (interrupt, resume) works as usual.
"""

from __future__ import annotations

import asyncio
import operator
import time
import uuid
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from langgraph_fenced_sqlite import Claim, FencedSqliteSaver
from langgraph_fenced_sqlite.testing.cases_history import _graph as retraction_graph


class ReviewState(TypedDict):
    """The review graph's state."""

    log: Annotated[list[str], operator.add]


def review_graph(saver: FencedSqliteSaver) -> Any:
    """draft -> review (interrupt for a verdict) -> END."""

    def draft(state: ReviewState) -> dict[str, Any]:
        return {"log": [f"draft:{state['log'][-1]}"]}

    def review(state: ReviewState) -> dict[str, Any]:
        verdict = interrupt({"draft": state["log"][-1]})
        return {"log": [f"review:{verdict}"]}

    g = StateGraph(ReviewState)
    g.add_node("draft", draft)
    g.add_node("review", review)
    g.add_edge(START, "draft")
    g.add_edge("draft", "review")
    g.add_edge("review", END)
    return g.compile(checkpointer=saver)


class Turns:
    """Drive turns through a graph as the runner would: the claim's config, a run id."""

    def __init__(self, graph: Any, claim: Claim, durability: str, run_ids: bool) -> None:
        self.graph, self.claim, self.durability, self.run_ids = graph, claim, durability, run_ids
        self.runs: list[str | None] = []

    def config(self) -> Any:
        run_id = str(uuid.uuid4()) if self.run_ids else None
        self.runs.append(run_id)
        return self.claim.config({"metadata": {"run_id": run_id}} if run_id else None)

    async def send(self, payload: Any) -> Any:
        if self.durability == "async-api":
            return await self.graph.ainvoke(payload, self.config(), durability="sync")
        return self.graph.invoke(payload, self.config(), durability=self.durability)

    def state(self) -> Any:
        return self.graph.get_state({"configurable": {"thread_id": self.claim.thread_id}})


def history(saver: FencedSqliteSaver, thread_id: str) -> dict[Any, Any]:
    out = {}
    for tup in saver.list({"configurable": {"thread_id": thread_id}}):
        conf = tup.config["configurable"]
        out[(conf["checkpoint_ns"], conf["checkpoint_id"])] = tup.pending_writes
    return out


async def approved_turn(turns: Turns, text: str) -> Any:
    out = await turns.send({"log": [text]})
    assert [i.value for i in out["__interrupt__"]] == [{"draft": f"draft:{text}"}]
    return await turns.send(Command(resume="ok"))


@pytest.mark.parametrize("durability", ["sync", "async", "exit", "async-api"])
async def test_rejected_interrupted_turn_is_retracted(
    store: FencedSqliteSaver, durability: str
) -> None:
    """A turn waiting for review is retracted: the previous state is back; the next turn works."""
    # Exit mode writes no "input" checkpoint, so only run ids can find the turn.
    turns = Turns(review_graph(store), store.claim("t", "w", 600), durability, run_ids=True)
    await approved_turn(turns, "one")
    previous = turns.state()
    kept = history(store, "t")
    assert previous.next == () and previous.values["log"] == ["one", "draft:one", "review:ok"]

    out = await turns.send({"log": ["two"]})
    assert out["__interrupt__"], "turn two should wait for review"
    waiting = turns.state()
    assert waiting.next == ("review",) and waiting.interrupts

    retracted = store.retract_turn("t", turns.claim.token)  # the reviewer rejects it
    assert retracted.run_id == turns.runs[-1] and retracted.checkpoints
    now = turns.state()
    assert now.values == previous.values
    assert now.next == () and now.interrupts == ()
    assert now.config == previous.config
    assert history(store, "t") == kept

    final = await approved_turn(turns, "three")
    assert final["log"] == [*previous.values["log"], "three", "draft:three", "review:ok"]


@pytest.mark.parametrize("durability", ["sync", "async", "async-api"])
async def test_rejected_turn_without_run_ids_goes_back_to_its_input(
    store: FencedSqliteSaver, durability: str
) -> None:
    """Without run ids a rejected turn (resume included) goes back to its input."""
    # No run ids: the turn is everything from its "input" checkpoint on,
    # the resume included (a resume writes no input checkpoint of its own).
    turns = Turns(review_graph(store), store.claim("t", "w", 600), durability, run_ids=False)
    await approved_turn(turns, "one")
    previous = turns.state()
    kept = history(store, "t")

    await turns.send({"log": ["two"]})
    rejected = await turns.send(Command(resume="reject"))
    assert rejected["log"][-1] == "review:reject"

    store.retract_turn("t", turns.claim.token)
    now = turns.state()
    assert (now.values, now.next, now.config) == (previous.values, (), previous.config)
    assert history(store, "t") == kept
    final = await approved_turn(turns, "three")
    assert final["log"] == [*previous.values["log"], "three", "draft:three", "review:ok"]


@pytest.mark.parametrize("durability", ["sync", "exit"])
async def test_retracting_a_rejected_resume_reopens_the_review(
    store: FencedSqliteSaver, durability: str
) -> None:
    """Retracting a rejecting resume reopens the same interrupt."""
    # With run ids, the resume is its own run: retracting it alone puts the
    # thread back at the same interrupt (the resume's writes on the
    # interrupted checkpoint go too), so the reviewer can answer again.
    turns = Turns(review_graph(store), store.claim("t", "w", 600), durability, run_ids=True)
    await approved_turn(turns, "one")
    previous = turns.state()
    await turns.send({"log": ["two"]})
    waiting = turns.state()
    waiting_history = history(store, "t")
    await turns.send(Command(resume="reject"))

    undone = store.retract_turn("t", turns.claim.token)
    assert undone.run_id == turns.runs[-1]
    again = turns.state()
    assert again.values == waiting.values and again.next == ("review",)
    assert [i.value for i in again.interrupts] == [i.value for i in waiting.interrupts]
    assert history(store, "t") == waiting_history

    out = await turns.send(Command(resume="ok"))
    assert out["log"] == [*waiting.values["log"], "review:ok"]
    # And the whole turn can still go: retract the approving resume, then the turn.
    store.retract_turn("t", turns.claim.token)
    store.retract_turn("t", turns.claim.token, run_id=turns.runs[-3])
    assert turns.state().values == previous.values
    assert turns.state().next == ()


async def test_async_retract_of_an_interrupted_turn(store: FencedSqliteSaver) -> None:
    """aretract_turn undoes an interrupted turn through the async API."""
    turns = Turns(review_graph(store), await store.aclaim("t", "w", 600), "async-api", True)
    await approved_turn(turns, "one")
    previous = await turns.graph.aget_state({"configurable": {"thread_id": "t"}})
    await turns.send({"log": ["two"]})
    await store.aretract_turn("t", turns.claim.token)
    now = await turns.graph.aget_state({"configurable": {"thread_id": "t"}})
    assert (now.values, now.next, now.interrupts) == (previous.values, (), ())
    final = await approved_turn(turns, "three")
    assert final["log"][-1] == "review:ok"


def _slow_root_inputs(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the root graph's input checkpoint the slowest put, as a stalled disk would."""
    put, aput = store.put, store.aput

    def slow(config: Any, metadata: Any) -> bool:
        root = config["configurable"].get("checkpoint_ns", "") == ""
        return root and metadata.get("source") == "input"

    def slow_put(config: Any, checkpoint: Any, metadata: Any, versions: Any) -> Any:
        if slow(config, metadata):
            time.sleep(0.2)
        return put(config, checkpoint, metadata, versions)

    async def slow_aput(config: Any, checkpoint: Any, metadata: Any, versions: Any) -> Any:
        if slow(config, metadata):
            await asyncio.sleep(0.2)
        return await aput(config, checkpoint, metadata, versions)

    monkeypatch.setattr(store, "put", slow_put)
    monkeypatch.setattr(store, "aput", slow_aput)


@pytest.mark.parametrize("api", ["sync", "async"])
async def test_a_subgraph_saved_before_its_turns_input_goes_with_the_turn(
    either_store: Any, monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    """Without run ids, a turn's subgraph checkpoints go with it even when saved first."""
    store = either_store
    graph = retraction_graph(store)  # contract case 26's: first -> a subgraph
    claim = store.claim("t", "w", 600)

    async def turn(text: str) -> Any:
        if api == "async":
            return await graph.ainvoke({"log": [text]}, claim.config(), durability="async")
        return graph.invoke({"log": [text]}, claim.config(), durability="async")

    await turn("one")
    kept = history(store, "t")
    previous = graph.get_state({"configurable": {"thread_id": "t"}})
    seen = store.events_after("t", 0, 1000)[-1].seq
    _slow_root_inputs(store, monkeypatch)
    await turn("two")
    # The LangGraph behaviour this pins: under durability "async" each graph
    # saves on its own loop, so the subgraph's checkpoints committed before
    # the root's input checkpoint (events are in commit order).
    saved = [e for e in store.events_after("t", seen, 1000) if e.kind == "checkpoint"]
    assert saved[0].checkpoint_ns != "", "the subgraph did not commit first"
    monkeypatch.undo()

    done = store.retract_turn("t", claim.token)
    assert {tuple(k) for k in done.checkpoints} == {
        (e.checkpoint_ns, e.checkpoint_id) for e in saved
    }
    assert history(store, "t") == kept
    now = graph.get_state({"configurable": {"thread_id": "t"}})
    assert (now.values, now.config) == (previous.values, previous.config)
