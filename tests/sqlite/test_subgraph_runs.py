"""`RetentionPolicy(max_subgraph_runs=N)`: past subgraph runs' namespaces become prunable.

Every run of a subgraph node writes a namespace of its own (`child:<task
id>`), which the file otherwise keeps forever. These tests run real graphs (a
subgraph, a nested one, a `Send` fan-out, an interrupt inside a subgraph, a
run paused inside a subgraph node in another process) and check that only
namespaces whose parent has moved on go, that what goes goes whole, and that
every thread still reads and resumes as before.
"""

from __future__ import annotations

import json
import operator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import START, StateGraph
from langgraph.types import Command, Send, interrupt
from support.configs import config
from support.files import dump
from support.processes import import_path, python, reap
from support.puts import put

from langgraph_fenced_sqlite import FencedSqliteSaver, InvalidArgument, RetentionPolicy


class Log(TypedDict, total=False):
    """The graphs' state: what ran, in order."""

    log: Annotated[list[str], operator.add]
    topic: str


def child_graph(ask: bool = False, nested: bool = False) -> Any:
    """work (an interrupt if `ask`) [-> inner subgraph if `nested`]."""
    sub = StateGraph(Log)
    sub.add_node("work", lambda s: {"log": [interrupt("ok?") if ask else "work"]})
    sub.add_edge(START, "work")
    if nested:
        inner = StateGraph(Log)
        inner.add_node("deep", lambda s: {"log": ["deep"]})
        inner.add_edge(START, "deep")
        sub.add_node("inner", inner.compile())
        sub.add_edge("work", "inner")
    return sub.compile()


def agent(saver: FencedSqliteSaver, ask: bool = False, nested: bool = False) -> Any:
    """prep -> child (a subgraph) -> END: every run writes a new `child:<id>` namespace."""
    g = StateGraph(Log)
    g.add_node("prep", lambda s: {"log": ["prep"]})
    g.add_node("child", child_graph(ask, nested))
    g.add_edge(START, "prep")
    g.add_edge("prep", "child")
    return g.compile(checkpointer=saver)


class FanLog(TypedDict, total=False):
    """The fan-out parent's state (the topic is each Send's own)."""

    log: Annotated[list[str], operator.add]


def fan_out(saver: FencedSqliteSaver) -> Any:
    """prep -> Send to `child` once per topic (a fan-out: one namespace per Send)."""
    g = StateGraph(FanLog)
    g.add_node("prep", lambda s: {"log": ["prep"]})
    g.add_node("child", child_graph())
    g.add_edge(START, "prep")
    g.add_conditional_edges("prep", lambda s: [Send("child", {"topic": t}) for t in "abc"])
    return g.compile(checkpointer=saver)


def namespaces(saver: FencedSqliteSaver, thread_id: str) -> list[str]:
    return saver.namespaces(thread_id)


def children(saver: FencedSqliteSaver, thread_id: str) -> list[str]:
    """The subgraph namespaces, oldest run first (by their first checkpoint's position)."""
    first: dict[str, int] = {}
    for ns in namespaces(saver, thread_id):
        if ns:
            records = saver.history_records(thread_id, checkpoint_ns=ns, limit=1000)
            first[ns] = min(r["position"] for r in records)
    return sorted(first, key=first.__getitem__)


def test_past_runs_go_whole_and_the_newest_n_stay(store: FencedSqliteSaver) -> None:
    graph = agent(store)
    for _ in range(4):
        for thread_id in ("t", "control"):  # the same turns; only "t" is pruned
            graph.invoke({"log": []}, config(thread_id))
    runs = children(store, "t")
    assert len(runs) == 4 and all(ns.startswith("child:") for ns in runs)
    state = graph.get_state(config("t"))
    root = store.history_records("t", limit=1000)
    policy = RetentionPolicy(max_subgraph_runs=1)
    (dry,) = store.prune(["t"], strategy=policy, dry_run=True)
    (done,) = store.prune(["t"], strategy=policy)
    assert done == dry
    assert {ns for ns, _ in done.checkpoints} == set(runs[:3])
    assert namespaces(store, "t") == ["", runs[3]]
    assert store.history_records("t", limit=1000) == root  # the root is untouched
    assert graph.get_state(config("t")).values == state.values
    # Their writes went with them.
    conn_rows = dump(store.path)["writes"]
    assert not [w for w in conn_rows if w[1] in runs[:3]]
    # The next run goes on as if nothing was pruned; then no past run is kept.
    out = graph.invoke({"log": []}, config("t"))
    assert out == graph.invoke({"log": []}, config("control"))
    store.prune(["t"], strategy=RetentionPolicy(max_subgraph_runs=0))
    assert namespaces(store, "t") == [""]
    assert graph.get_state(config("t")).values == out


def test_without_the_option_every_run_is_kept(store: FencedSqliteSaver) -> None:
    graph = agent(store)
    for _ in range(3):
        graph.invoke({"log": []}, config("t"))
    store.prune(["t"], strategy=RetentionPolicy(max_checkpoints=0))
    assert len(children(store, "t")) == 3  # the latest of each namespace stays


def test_an_interrupted_subgraph_is_current_and_resumes_after_a_prune(
    store: FencedSqliteSaver,
) -> None:
    graph = agent(store, ask=True)
    for thread_id in ("t", "control"):  # the same turns; only "t" is pruned
        graph.invoke({"log": []}, config(thread_id))
        graph.invoke(Command(resume="yes"), config(thread_id))
        graph.invoke({"log": []}, config(thread_id))  # waits inside the subgraph again
    past, waiting = children(store, "t")
    before = graph.get_state(config("t"), subgraphs=True)
    assert before.tasks and before.tasks[0].interrupts
    (done,) = store.prune(["t"], strategy=RetentionPolicy(max_subgraph_runs=0))
    assert {ns for ns, _ in done.checkpoints} == {past}
    assert namespaces(store, "t") == ["", waiting]
    after = graph.get_state(config("t"), subgraphs=True)
    assert after.tasks[0].interrupts == before.tasks[0].interrupts
    assert after.tasks[0].state.values == before.tasks[0].state.values
    out = graph.invoke(Command(resume="again"), config("t"))
    assert out == graph.invoke(Command(resume="again"), config("control"))
    assert out["log"][-1] == "again"


def test_nested_subgraphs_go_with_their_run(store: FencedSqliteSaver) -> None:
    graph = agent(store, nested=True)
    graph.invoke({"log": []}, config("t"))
    graph.invoke({"log": []}, config("t"))
    nested = [ns for ns in namespaces(store, "t") if "|" in ns]
    assert len(nested) == 2
    newest = children(store, "t")[-1].split("|")[0]
    store.prune(["t"], strategy=RetentionPolicy(max_subgraph_runs=1))
    left = namespaces(store, "t")
    assert left == sorted(["", newest, *[ns for ns in nested if ns.startswith(newest + "|")]])
    assert len(left) == 3


def test_a_fan_out_is_one_namespace_per_send_and_all_go_when_past(
    store: FencedSqliteSaver,
) -> None:
    graph = fan_out(store)
    graph.invoke({"log": []}, config("t"))
    graph.invoke({"log": []}, config("t"))
    assert len(children(store, "t")) == 6
    state = graph.get_state(config("t")).values
    store.prune(["t"], strategy=RetentionPolicy(max_subgraph_runs=3))
    assert len(children(store, "t")) == 3  # the second run's three sends
    store.prune(["t"], strategy=RetentionPolicy(max_subgraph_runs=0))
    assert namespaces(store, "t") == [""]
    assert graph.get_state(config("t")).values == state


def test_what_cannot_be_judged_is_kept(store: FencedSqliteSaver) -> None:
    """No `parents`, or a parent checkpoint not stored (yet): the namespace stays."""
    a = put(store, ns="", metadata={"source": "input", "step": -1, "parents": {}}, random_id=True)
    # A subgraph's first checkpoint may commit before its parent's (LangGraph
    # puts asynchronously): its parent is not stored yet.
    put(
        store,
        ns="early:1",
        metadata={"source": "input", "step": -1, "parents": {"": "not-yet"}},
        random_id=True,
    )
    put(
        store, ns="old:1", metadata={"source": "input", "step": -1}, random_id=True
    )  # no parents at all
    put(
        store,
        ns="",
        parent=a,
        metadata={"source": "loop", "step": 0, "parents": {}},
        random_id=True,
    )
    (dry,) = store.prune(["t"], strategy=RetentionPolicy(max_subgraph_runs=0), dry_run=True)
    assert dry.checkpoints == []
    # A namespace written under the latest root checkpoint is current too.
    latest = store.history_records("t", limit=1)[0]["checkpoint_id"]
    put(
        store,
        ns="now:1",
        metadata={"source": "input", "step": -1, "parents": {"": latest}},
        random_id=True,
    )
    # ...and one under an older root checkpoint is past.
    put(
        store,
        ns="past:1",
        metadata={"source": "input", "step": -1, "parents": {"": a}},
        random_id=True,
    )
    (done,) = store.prune(["t"], strategy=RetentionPolicy(max_subgraph_runs=0))
    assert [ns for ns, _ in done.checkpoints] == ["past:1"]
    assert namespaces(store, "t") == ["", "early:1", "now:1", "old:1"]


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_a_bad_count_names_the_option(bad: Any) -> None:
    with pytest.raises(InvalidArgument) as info:
        RetentionPolicy(max_subgraph_runs=bad)
    assert "max_subgraph_runs" in str(info.value)


PAUSED = """
import json, os, sys, operator
sys.path[:0] = sys.argv[2].split(os.pathsep)
from test_subgraph_runs import Log
from langgraph.graph import START, StateGraph
from langgraph_fenced_sqlite import FencedSqliteSaver

def slow(state):
    print(json.dumps({"inside": True}), flush=True)
    sys.stdin.readline()  # the parent prunes meanwhile
    return {"log": ["slow"]}

with FencedSqliteSaver(sys.argv[1]) as saver:
    sub = StateGraph(Log)
    sub.add_node("first", lambda s: {"log": ["first"]})
    sub.add_node("slow", slow)
    sub.add_edge(START, "first")
    sub.add_edge("first", "slow")
    g = StateGraph(Log)
    g.add_node("prep", lambda s: {"log": ["prep"]})
    g.add_node("child", sub.compile())
    g.add_edge(START, "prep")
    g.add_edge("prep", "child")
    graph = g.compile(checkpointer=saver)
    claim = saver.claim("t", "worker", 120)
    # "sync": the subgraph's checkpoint after "first" is committed before
    # "slow" runs (by default LangGraph commits it in the background, and the
    # parent sometimes looked before it landed: no running namespace yet).
    out = graph.invoke({"log": []}, claim.config(), durability="sync")
    print(json.dumps({"done": out["log"]}), flush=True)
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_prune_from_another_process_never_takes_a_running_subgraph(
    store: FencedSqliteSaver,
) -> None:
    graph = agent(store)
    graph.invoke({"log": []}, config("t"))  # one past run, unclaimed
    past = children(store, "t")
    worker = python(PAUSED, store.path, import_path(__file__))
    try:
        assert worker.stdout is not None and worker.stdin is not None
        line = worker.stdout.readline()
        assert json.loads(line or "{}") == {"inside": True}, (
            worker.stderr.read() if not line else ""
        )
        running = [ns for ns in children(store, "t") if ns not in past]
        assert len(running) == 1
        (done,) = store.prune(["t"], strategy=RetentionPolicy(max_subgraph_runs=0))
        assert {ns for ns, _ in done.checkpoints} == set(past)
        assert running[0] in namespaces(store, "t")
        worker.stdin.write("go\n")
        worker.stdin.flush()
        out = json.loads(worker.stdout.readline())
        assert worker.wait(timeout=60) == 0
    finally:
        reap(worker)
    assert out["done"][-1] == "slow" and "first" in out["done"]
