"""Retention: policies, dry runs, LangGraph's prune/delete_for_runs/copy_thread, DeltaChannel.

The contract cases (26-28) cover the core promises through both APIs; these
add validation, LangGraph's extended methods on real graphs, and the rule
that pruning never removes a checkpoint a kept one still needs.
"""

from __future__ import annotations

import operator
import sqlite3
import uuid
from datetime import timedelta
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph
from support.files import dump
from support.graphs import append_all, delta_graph, history_values, run_log
from support.puts import put_chain

from langgraph_fenced_sqlite import (
    CheckpointConflict,
    FencedSqliteSaver,
    ManualClock,
    PruneResult,
    ReplayUnavailable,
    RetentionPolicy,
    StaleClaim,
    ThreadBusy,
)

# --- helpers ---------------------------------------------------------------------------


class LogState(TypedDict):
    """The log graph's state."""

    log: Annotated[list[str], operator.add]


def log_graph(saver: FencedSqliteSaver) -> Any:
    """first -> sub(inner) -> END, so every run writes a subgraph namespace too."""

    def inner(state: LogState) -> dict[str, Any]:
        return {"log": ["inner"]}

    sub = StateGraph(LogState)
    sub.add_node("inner", inner)
    sub.add_edge(START, "inner")
    sub.add_edge("inner", END)

    def first(state: LogState) -> dict[str, Any]:
        return {"log": ["first"]}

    g = StateGraph(LogState)
    g.add_node("first", first)
    g.add_node("sub", sub.compile())
    g.add_edge(START, "first")
    g.add_edge("first", "sub")
    g.add_edge("sub", END)
    return g.compile(checkpointer=saver)


def snapshot(saver: FencedSqliteSaver, thread_id: str) -> dict[tuple[str, str], Any]:
    """Every checkpoint of a thread (all namespaces) with what a reader sees of it."""
    out = {}
    for tup in saver.list({"configurable": {"thread_id": thread_id}}):
        conf = tup.config["configurable"]
        parent = tup.parent_config["configurable"]["checkpoint_id"] if tup.parent_config else None
        out[(conf["checkpoint_ns"], conf["checkpoint_id"])] = (
            parent,
            tup.checkpoint,
            tup.metadata,
            tup.pending_writes,
        )
    return out


def floor_of(saver: FencedSqliteSaver, thread_id: str) -> int:
    for summary in saver.threads():
        if summary["thread_id"] == thread_id:
            return summary["floor"]
    return 1


# --- RetentionPolicy and prune arguments ---------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"max_checkpoints": -1}, ValueError, "max_checkpoints"),
        ({"max_checkpoints": 1.5}, ValueError, "max_checkpoints"),
        ({"max_checkpoints": "3"}, ValueError, "max_checkpoints"),
        ({"max_checkpoints": True}, ValueError, "max_checkpoints"),
        ({"max_events": -5}, ValueError, "max_events"),
        ({"max_events": False}, ValueError, "max_events"),
        ({"max_age": 0}, ValueError, "max_age"),
        ({"max_age": -1.0}, ValueError, "max_age"),
        ({"max_age": float("nan")}, ValueError, "max_age"),
        ({"max_age": timedelta(seconds=-1)}, ValueError, "max_age"),
        ({"max_age": "1h"}, TypeError, "max_age"),
    ],
)
def test_retention_policy_names_a_bad_value(
    kwargs: dict[str, Any], error: type[Exception], name: str
) -> None:
    """RetentionPolicy refuses a bad value, naming the field."""
    with pytest.raises(error, match=name):
        RetentionPolicy(**kwargs)


def test_retention_policy_accepts_good_values() -> None:
    """RetentionPolicy accepts zero counts, seconds and timedeltas."""
    policy = RetentionPolicy(max_checkpoints=0, max_age=timedelta(hours=1), max_events=0)
    assert policy.max_age_seconds == 3600.0
    assert RetentionPolicy().max_age_seconds is None
    assert RetentionPolicy(max_age=2).max_age_seconds == 2.0


@pytest.mark.parametrize(
    ("call", "error", "name"),
    [
        (lambda s: s.prune("t"), TypeError, "thread_ids"),
        (lambda s: s.prune([""]), ValueError, "thread_ids"),
        (lambda s: s.prune(["t"], strategy="newest"), ValueError, "strategy"),
        (lambda s: s.prune(["t"], strategy="delete", dry_run=True), ValueError, "dry_run"),
        (lambda s: s.delete_for_runs("r1"), TypeError, "run_ids"),
        (lambda s: s.copy_thread("", "u"), ValueError, "source_thread_id"),
        (lambda s: s.copy_thread("t", "u\x00"), ValueError, "target_thread_id"),
    ],
)
def test_retention_arguments_are_checked(
    store: FencedSqliteSaver, call: Any, error: type[Exception], name: str
) -> None:
    """prune, delete_for_runs and copy_thread name a bad argument."""
    with pytest.raises(error, match=name):
        call(store)


# --- prune ---------------------------------------------------------------------------------


def test_dry_run_changes_nothing_and_predicts_the_prune(store: FencedSqliteSaver) -> None:
    """A dry run changes nothing and reports exactly what the prune then does."""
    graph = log_graph(store)
    for i in range(3):
        run_log(graph, "t", f"turn{i}")
    claim = store.claim("t", "w", 60)
    store.append_events("t", claim.token, [("note", {})])
    policy = RetentionPolicy(max_checkpoints=4, max_events=10)
    before = snapshot(store, "t")
    events = store.events_after("t", 0, 1000)
    (dry,) = store.prune(["t"], strategy=policy, dry_run=True)
    assert dry.checkpoints, "the dry run found nothing to remove"
    assert snapshot(store, "t") == before
    assert store.events_after("t", 0, 1000) == events
    (done,) = store.prune(["t"], strategy=policy)
    assert done == dry
    assert set(snapshot(store, "t")) == set(before) - set(dry.checkpoints)


def test_keep_latest_keeps_each_namespace_latest_on_a_real_graph(store: FencedSqliteSaver) -> None:
    """keep_latest keeps each namespace's latest; state and other threads are unchanged."""
    graph = log_graph(store)
    for i in range(3):
        run_log(graph, "t", f"turn{i}")
    run_log(graph, "other", "x")
    other = snapshot(store, "other")
    before = snapshot(store, "t")
    state = graph.get_state({"configurable": {"thread_id": "t"}})
    latest: dict[str, tuple[str, str]] = {}
    for tup in reversed(list(store.list({"configurable": {"thread_id": "t"}}))):
        latest[tup.config["configurable"]["checkpoint_ns"]] = (
            tup.config["configurable"]["checkpoint_ns"],
            tup.config["configurable"]["checkpoint_id"],
        )
    (result,) = store.prune(["t"])
    after = snapshot(store, "t")
    assert set(after) == set(latest.values())
    assert set(result.checkpoints) == set(before) - set(after)
    for key in after:
        assert after[key] == before[key]
    assert graph.get_state({"configurable": {"thread_id": "t"}}).values == state.values
    assert snapshot(store, "other") == other
    out = run_log(graph, "t", "again")
    assert out["log"][: len(state.values["log"]) + 2] == [*state.values["log"], "again", "first"]


async def test_aprune_delete_strategy_removes_history_but_not_the_thread(
    store: FencedSqliteSaver,
) -> None:
    """strategy='delete' removes checkpoints, writes and events but keeps claim and seqs."""
    # LangGraph's "delete" strategy: every checkpoint, write and event goes,
    # but unlike delete_thread the claim and the seq counter stay, so a
    # subscriber is told (ReplayUnavailable) rather than silently rewound.
    graph = log_graph(store)
    run_log(graph, "t", "one")
    claim = store.claim("t", "w", 60)
    next_seq = store.events_after("t", 0, 1000)[-1].seq + 1
    # The claim holder passes its token (unfenced, it is refused: case 32).
    (result,) = await store.aprune(["t"], strategy="delete", token=claim.token)
    assert isinstance(result, PruneResult)
    assert snapshot(store, "t") == {}
    with pytest.raises(ReplayUnavailable) as info:
        store.events_after("t", 0, 10)
    assert info.value.floor == next_seq
    # What is left of the log says what went, at the next seq.
    (pruned,) = store.events_after("t", next_seq - 1, 10)
    assert (pruned.seq, pruned.kind, pruned.token) == (next_seq, "pruned", claim.token)
    assert store.current_claim("t") == claim
    assert store.append_events("t", claim.token, [("e", {})]) == [next_seq + 1]


def test_prune_several_threads_leaves_others_alone(store: FencedSqliteSaver) -> None:
    """Pruning some threads leaves the others alone."""
    for t in ("a", "b", "c"):
        put_chain(store, t, 4)
    untouched = snapshot(store, "c")
    results = store.prune(["a", "b"], strategy=RetentionPolicy(max_checkpoints=2))
    assert [r.thread_id for r in results] == ["a", "b"]
    assert all(len(r.checkpoints) == 2 for r in results)
    assert snapshot(store, "c") == untouched


def test_max_checkpoints_zero_is_keep_latest(open_store: Any, clock: ManualClock) -> None:
    """max_checkpoints=0 keeps only the latest."""
    store = open_store()
    ids = put_chain(store, "t", 4)
    (result,) = store.prune(["t"], strategy=RetentionPolicy(max_checkpoints=0))
    assert sorted(result.checkpoints) == sorted(("", c) for c in ids[:-1])
    assert set(snapshot(store, "t")) == {("", ids[-1])}


def test_prune_keeps_events_newer_than_everything_it_removed(store: FencedSqliteSaver) -> None:
    """Prune never drops events newer than every event of what it removed."""
    # The kept checkpoint's own events were compacted away, so no event
    # "concerns a kept checkpoint". Caller events appended since then are
    # newer than anything removed and must stay: events go with *their*
    # checkpoints, not with every checkpoint.
    ids = put_chain(store, "t", 3)
    claim = store.claim("t", "w", 60)
    store.compact_events("t", 4)
    seqs = store.append_events("t", claim.token, [("note", {"i": 1}), ("note", {"i": 2})])
    # "keep_latest" is fenced: the holder passes its token (and gets a `pruned` event).
    (dry,) = store.prune(["t"], dry_run=True, token=claim.token)
    (result,) = store.prune(["t"], token=claim.token)
    assert result == dry
    assert result.checkpoints == [("", ids[0]), ("", ids[1])]
    assert (result.floor, result.events_removed) == (4, 0)
    assert seqs == [4, 5]
    kept = [(e.seq, e.kind) for e in store.events_after("t", 3, 10)]
    assert kept == [(4, "note"), (5, "note"), (6, "pruned")]


def test_prune_moves_the_floor_past_removed_events_only(store: FencedSqliteSaver) -> None:
    """The floor stops at the kept checkpoint's first event; later events stay."""
    # The usual case: the floor stops at the kept checkpoint's first event,
    # and a caller event after it stays.
    ids = put_chain(store, "t", 3)  # events 1..3
    claim = store.claim("t", "w", 60)
    store.append_events("t", claim.token, [("note", {})])  # 4
    store.compact_events("t", 3)  # the latest checkpoint's event (3) stays
    (result,) = store.prune(["t"], token=claim.token)  # "keep_latest" is fenced
    assert result.checkpoints == [("", ids[0]), ("", ids[1])]
    assert result.floor == 3  # the first event of the kept checkpoint
    kept = [(e.seq, e.kind) for e in store.events_after("t", 2, 10)]
    assert kept == [(3, "checkpoint"), (4, "note"), (5, "pruned")]


# --- delete_for_runs and copy_thread ----------------------------------------------------------


def test_delete_for_runs_removes_those_runs_everywhere(store: FencedSqliteSaver) -> None:
    """delete_for_runs removes the runs' checkpoints and writes in every thread, only those."""
    graph = log_graph(store)
    r1, r2 = str(uuid.uuid4()), str(uuid.uuid4())
    run_log(graph, "t", "one", r1)
    run_log(graph, "u", "one", r1)
    run_log(graph, "t", "two", r2)
    by_run = {
        t: {k: v for k, v in snapshot(store, t).items() if v[2].get("run_id") == r2}
        for t in ("t", "u")
    }
    store.delete_for_runs([r1])
    for t in ("t", "u"):
        after = snapshot(store, t)
        assert all(meta.get("run_id") != r1 for _, _, meta, _ in after.values())
        assert after == by_run[t]
    con = sqlite3.connect(store.path)
    try:
        assert con.execute("SELECT count(*) FROM writes WHERE run_id = ?", (r1,)).fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM writes WHERE run_id = ?", (r2,)).fetchone()[0] > 0
    finally:
        con.close()
    store.delete_for_runs([])
    store.delete_for_runs(["no-such-run"])
    assert snapshot(store, "t") == by_run["t"]


async def test_adelete_for_runs(store: FencedSqliteSaver) -> None:
    """adelete_for_runs removes a run's checkpoints."""
    graph = log_graph(store)
    r1 = str(uuid.uuid4())
    await graph.ainvoke(
        {"log": ["x"]}, {"configurable": {"thread_id": "t"}, "metadata": {"run_id": r1}}
    )
    await store.adelete_for_runs([r1])
    assert snapshot(store, "t") == {}


def test_copy_thread_copies_history_in_order_as_commits_of_the_target(
    store: FencedSqliteSaver,
) -> None:
    """copy_thread copies every checkpoint and write after the target's own, as its commits."""
    graph = log_graph(store)
    run_log(graph, "src", "one")
    run_log(graph, "src", "two")
    source = snapshot(store, "src")
    source_events = store.events_after("src", 0, 1000)
    run_log(graph, "dst", "mine")
    own = snapshot(store, "dst")
    own_events = store.events_after("dst", 0, 1000)

    store.copy_thread("src", "dst")
    assert snapshot(store, "src") == source and store.events_after("src", 0, 1000) == source_events
    target = snapshot(store, "dst")
    assert set(target) == set(source) | set(own)
    for key, value in source.items():
        assert target[key] == value
    # Positions: the copies come after the target's own history, in the
    # source's commit order, so the target's latest is the source's latest.
    history = [t.config["configurable"]["checkpoint_id"] for t in store.history("dst", limit=100)]
    src_history = [
        t.config["configurable"]["checkpoint_id"] for t in store.history("src", limit=100)
    ]
    own_root = [cid for ns, cid in own if ns == ""]
    assert history[: len(src_history)] == src_history
    assert sorted(history[len(src_history) :]) == sorted(own_root)
    values = graph.get_state({"configurable": {"thread_id": "src"}}).values
    assert graph.get_state({"configurable": {"thread_id": "dst"}}).values == values
    # Events: the target's own, then one `checkpoint` event per copied
    # checkpoint (each copy is a commit of the target, in the source's commit
    # order, naming the source), then one `copied` event summing it up.
    events = store.events_after("dst", 0, 1000)
    assert events[: len(own_events)] == own_events
    *copies, copied = events[len(own_events) :]
    src_commits = [
        (e.checkpoint_ns, e.checkpoint_id) for e in source_events if e.kind == "checkpoint"
    ]
    assert [(e.checkpoint_ns, e.checkpoint_id) for e in copies] == src_commits
    assert all(e.kind == "checkpoint" and e.data["copied_from"] == "src" for e in copies)
    n_writes = sum(len(w) for _, _, _, w in source.values())
    assert (copied.kind, copied.data) == (
        "copied",
        {
            "source_thread_id": "src",
            "checkpoints": len(src_commits),
            "copied": [list(k) for k in src_commits],
            "writes": n_writes,
        },
    )
    # The target goes on by itself.
    out = run_log(graph, "dst", "three")
    assert out["log"][: len(values["log"]) + 2] == [*values["log"], "three", "first"]
    assert snapshot(store, "src") == source


def test_copy_thread_into_a_claimed_or_overlapping_target_changes_nothing(
    store: FencedSqliteSaver,
) -> None:
    """copy_thread into a claimed target changes nothing; copying again is a no-op."""
    put_chain(store, "src", 2)
    claim = store.claim("dst", "w", 60)
    with pytest.raises(ThreadBusy):  # an unfenced write meets a live claim
        store.copy_thread("src", "dst")
    assert snapshot(store, "dst") == {}
    store.release("dst", claim.token)
    store.copy_thread("src", "dst")
    before, events = snapshot(store, "dst"), store.events_after("dst", 0, 100)
    # Copying the same ids again used to fail with "store_error: UNIQUE
    # constraint failed"; now the rows already there are left alone, and
    # with nothing new, nothing (not even an event) is appended.
    store.copy_thread("src", "dst")
    assert snapshot(store, "dst") == before
    assert store.events_after("dst", 0, 100) == events


def test_copy_thread_adds_only_what_the_target_lacks(store: FencedSqliteSaver) -> None:
    """Copying again after the source grew copies only its new checkpoints and writes."""
    graph = log_graph(store)
    run_log(graph, "src", "one")
    store.copy_thread("src", "dst")
    first = {e.seq for e in store.events_after("dst", 0, 1000)}
    run_log(graph, "src", "two")
    store.copy_thread("src", "dst")
    assert snapshot(store, "dst") == snapshot(store, "src")
    new = [e for e in store.events_after("dst", 0, 1000) if e.seq not in first]
    *copies, copied = new
    assert copied.kind == "copied" and copied.data["checkpoints"] == len(copies) > 0
    assert [list(k) for k in ((e.checkpoint_ns, e.checkpoint_id) for e in copies)] == (
        copied.data["copied"]
    )
    values = graph.get_state({"configurable": {"thread_id": "src"}}).values
    assert graph.get_state({"configurable": {"thread_id": "dst"}}).values == values


def test_copy_thread_onto_different_checkpoints_names_them_and_changes_nothing(
    store: FencedSqliteSaver,
) -> None:
    """A target holding different checkpoints under the source's ids is a CheckpointConflict."""
    checkpoint = empty_checkpoint()
    for thread, value in (("src", "a"), ("dst", "b")):
        cp = {**checkpoint, "channel_values": {"v": value}, "channel_versions": {"v": 1}}
        store.put(
            {"configurable": {"thread_id": thread, "checkpoint_ns": ""}},
            cp,  # type: ignore[arg-type]
            {"source": "input", "step": -1, "parents": {}},
            {},
        )
    before = dump(store.path)
    with pytest.raises(CheckpointConflict, match=checkpoint["id"]) as info:
        store.copy_thread("src", "dst")
    assert (info.value.thread_id, info.value.checkpoint_ns) == ("dst", "")
    assert dump(store.path) == before


async def test_acopy_thread(store: FencedSqliteSaver) -> None:
    """acopy_thread copies every checkpoint."""
    put_chain(store, "src", 2)
    await store.acopy_thread("src", "dst")
    assert set(snapshot(store, "dst")) == set(snapshot(store, "src"))


# --- DeltaChannel: pruning never removes what a kept checkpoint needs ----------------------------


def needed_chain(saver: FencedSqliteSaver, thread_id: str, cid: str) -> set[str]:
    """What LangGraph's ancestor walk reads to rebuild `log` at checkpoint `cid`.

    Mirrors `BaseCheckpointSaver.get_delta_channel_history`: from the parent
    up to and including the first ancestor whose `channel_values` holds the
    channel (its snapshot); nothing if `cid` holds a snapshot itself.
    """
    conf = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": cid}}
    tup = saver.get_tuple(conf)
    assert tup is not None
    if "log" in tup.checkpoint["channel_values"]:
        return set()
    out: set[str] = set()
    parent = tup.parent_config
    while parent is not None:
        tup = saver.get_tuple(parent)
        assert tup is not None, "the walk hit a missing ancestor"
        out.add(tup.config["configurable"]["checkpoint_id"])
        if "log" in tup.checkpoint["channel_values"]:
            break
        parent = tup.parent_config
    return out


def test_delta_channel_is_what_langgraph_offers() -> None:
    """LangGraph offers DeltaChannel and the counters metadata retention reads."""
    # Pinned: langgraph 1.x ships DeltaChannel (beta) and records
    # `counters_since_delta_snapshot` in checkpoint metadata; retention.py's
    # keep-the-parent rule reads that field. If either goes, revisit it.
    from langgraph.checkpoint.base import CheckpointMetadata

    assert "counters_since_delta_snapshot" in CheckpointMetadata.__annotations__
    assert DeltaChannel(append_all, snapshot_frequency=3).snapshot_frequency == 3


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
@pytest.mark.parametrize("policy", ["keep_latest", "max_checkpoints"])
@pytest.mark.parametrize("unused", [False, True], ids=["", "unused-channel"])
def test_prune_keeps_the_delta_chain_a_kept_checkpoint_needs(
    store: FencedSqliteSaver, durability: str, policy: str, unused: bool
) -> None:
    """Prune keeps exactly what LangGraph's delta walk needs; every state rebuilds the same."""
    # `unused`: a DeltaChannel never written has no version, so LangGraph
    # never walks ancestors for it, yet its counters grow every superstep
    # (`(0, steps)`). Counting those counters kept the whole history forever.
    graph = delta_graph(store, snapshot_every=5, unused=unused)
    for i in range(3):
        run_log(graph, "t", f"u{i}", durability=durability)
    cfg = {"configurable": {"thread_id": "t"}}
    latest = store.get_tuple(cfg)
    assert latest is not None and "log" not in latest.checkpoint["channel_values"], (
        "the setup must leave the latest between snapshots"
    )
    assert latest.metadata.get("counters_since_delta_snapshot")
    before = history_values(graph, "t")
    values = graph.get_state(cfg).values
    assert values["log"][:3] == ["u0", "a", "b"] and len(values["log"]) == 9

    strategy = "keep_latest" if policy == "keep_latest" else RetentionPolicy(max_checkpoints=2)
    (result,) = store.prune(["t"], strategy=strategy)
    assert result.checkpoints, "nothing was pruned: the test proves nothing"
    kept = {cid for _, cid in snapshot(store, "t")}
    # Exactly the kept checkpoints plus what LangGraph's walk reads for them.
    expected: set[str] = set()
    newest = [t.config["configurable"]["checkpoint_id"] for t in store.history("t", limit=100)]
    roots = newest[:1] if policy == "keep_latest" else [c for c in before if c in kept][:2]
    for cid in roots:
        expected |= {cid} | needed_chain(store, "t", cid)
    assert kept == expected
    # Every kept checkpoint rebuilds the values it had before the prune.
    assert graph.get_state(cfg).values == values
    after = history_values(graph, "t")
    for cid, state in after.items():
        assert state == before[cid], f"checkpoint {cid} rebuilds differently after prune"
    out = run_log(graph, "t", "next", durability=durability)
    assert out["log"] == [*values["log"], "next", "a", "b"]


def test_dropping_the_delta_chain_would_lose_state(store: FencedSqliteSaver, tmp_path: Any) -> None:
    """Without the kept delta chain the latest state rebuilds wrong."""
    # The counter-proof that the rule above matters: delete the ancestors the
    # prune kept (as a naive keep_latest would) and the latest rebuilds wrong,
    # silently, exactly as LangGraph's prune docs warn.
    graph = delta_graph(store, snapshot_every=5)
    for i in range(3):
        run_log(graph, "t", f"u{i}")
    cfg = {"configurable": {"thread_id": "t"}}
    values = graph.get_state(cfg).values
    store.prune(["t"])
    latest = store.get_tuple(cfg)
    assert latest is not None
    chain = needed_chain(store, "t", latest.config["configurable"]["checkpoint_id"])
    assert chain, "the latest needs no ancestor: the test proves nothing"
    con = sqlite3.connect(store.path)
    try:
        with con:
            for cid in chain:
                con.execute("DELETE FROM checkpoints WHERE checkpoint_id = ?", (cid,))
                con.execute("DELETE FROM writes WHERE checkpoint_id = ?", (cid,))
    finally:
        con.close()
    assert graph.get_state(cfg).values != values


def test_a_snapshot_checkpoint_needs_no_ancestor(store: FencedSqliteSaver) -> None:
    """A latest checkpoint holding a snapshot keeps no ancestor."""
    # When the latest holds a snapshot (counters reset), keep_latest keeps
    # only it: the rule is not "keep everything once DeltaChannel is used".
    graph = delta_graph(store, snapshot_every=3)
    for i in range(3):
        run_log(graph, "t", f"u{i}")
    cfg = {"configurable": {"thread_id": "t"}}
    latest = store.get_tuple(cfg)
    assert latest is not None and "log" in latest.checkpoint["channel_values"]
    assert not latest.metadata.get("counters_since_delta_snapshot")
    values = graph.get_state(cfg).values
    store.prune(["t"])
    assert len(snapshot(store, "t")) == 1
    assert graph.get_state(cfg).values == values


def test_copy_thread_carries_the_delta_chain(store: FencedSqliteSaver) -> None:
    """A copied thread rebuilds its delta channel state."""
    graph = delta_graph(store, snapshot_every=5)
    for i in range(3):
        run_log(graph, "src", f"u{i}")
    values = graph.get_state({"configurable": {"thread_id": "src"}}).values
    store.copy_thread("src", "dst")
    assert graph.get_state({"configurable": {"thread_id": "dst"}}).values == values


def test_floor_after_prune_never_goes_down(store: FencedSqliteSaver) -> None:
    """Prune never lowers a floor raised by compaction."""
    put_chain(store, "t", 5)
    store.compact_events("t", 5)
    (result,) = store.prune(["t"], strategy=RetentionPolicy(max_checkpoints=4, max_events=50))
    assert result.floor == 5 == floor_of(store, "t")


# --- fencing of LangGraph's extended methods (contract case 32) ---------------------------------


def owner_run(graph: Any, claim: Any, text: str, run_id: str) -> Any:
    """Run the graph under `claim` (fenced writes), as run `run_id`."""
    return graph.invoke({"log": [text]}, claim.config({"metadata": {"run_id": run_id}}))


def test_history_removal_refuses_someone_elses_live_claim(store: FencedSqliteSaver) -> None:
    """delete_for_runs, prune('delete'), copy_thread under a live claim: ThreadBusy, no change."""
    graph = log_graph(store)
    run_log(graph, "src", "other")
    claim = store.claim("t", "owner", 60)
    r1 = str(uuid.uuid4())
    owner_run(graph, claim, "one", r1)
    before = dump(store.path)
    # These used to delete the owner's checkpoints (its next put then failed
    # with CheckpointConflict) and log nothing.
    for call in (
        lambda: store.delete_for_runs([r1]),
        lambda: store.prune(["t"], strategy="delete"),
        lambda: store.copy_thread("src", "t"),
    ):
        with pytest.raises(ThreadBusy) as info:
            call()
        assert (info.value.thread_id, info.value.holder) == ("t", "owner")
        assert dump(store.path) == before
    # The owner goes on undisturbed.
    out = owner_run(graph, claim, "two", str(uuid.uuid4()))
    assert out["log"][0] == "one" and "two" in out["log"]


def test_history_removal_with_the_owners_token_acts_and_logs(store: FencedSqliteSaver) -> None:
    """With the holder's token each method acts and logs an event naming what it did."""
    graph = log_graph(store)
    run_log(graph, "src", "other")
    claim = store.claim("t", "owner", 60)
    r1, r2 = str(uuid.uuid4()), str(uuid.uuid4())
    owner_run(graph, claim, "one", r1)
    owner_run(graph, claim, "two", r2)
    of_r2 = sorted(k for k, v in snapshot(store, "t").items() if v[2].get("run_id") == r2)
    n_writes = sum(len(snapshot(store, "t")[k][3]) for k in of_r2)

    store.delete_for_runs([r2], token=claim.token)
    assert all(v[2].get("run_id") == r1 for v in snapshot(store, "t").values())
    last = store.events_after("t", 0, 1000)[-1]
    assert (last.kind, last.token) == ("runs_deleted", claim.token)
    assert last.data["run_ids"] == [r2]
    assert sorted(tuple(k) for k in last.data["checkpoints"]) == of_r2
    assert last.data["writes"] >= n_writes
    # The owner's next run continues from r1's end.
    out = owner_run(graph, claim, "three", str(uuid.uuid4()))
    assert out["log"][0] == "one" and "three" in out["log"] and "two" not in out["log"]

    store.copy_thread("src", "t", token=claim.token)
    copied = store.events_after("t", 0, 1000)[-1]
    assert (copied.kind, copied.token, copied.data["source_thread_id"]) == (
        "copied",
        claim.token,
        "src",
    )
    assert sorted(tuple(k) for k in copied.data["copied"]) == sorted(snapshot(store, "src"))

    gone = sorted(snapshot(store, "t"))
    (result,) = store.prune(["t"], strategy="delete", token=claim.token)
    assert sorted(result.checkpoints) == gone and snapshot(store, "t") == {}
    (pruned,) = store.events_after("t", result.floor - 1, 10)
    assert (pruned.kind, pruned.token, pruned.data["strategy"]) == ("pruned", claim.token, "delete")
    assert sorted(tuple(k) for k in pruned.data["checkpoints"]) == gone
    assert store.current_claim("t") == claim


def test_a_token_that_is_not_the_claim_is_stale_and_changes_nothing(
    open_store: Any, clock: ManualClock
) -> None:
    """A stale token, or a token on another thread the call touches, is StaleClaim."""
    store = open_store()
    graph = log_graph(store)
    old = store.claim("t", "first", 10)
    clock.advance(10)
    current = store.take_over("t", "second", 60)
    r1 = str(uuid.uuid4())
    owner_run(graph, current, "one", r1)
    run_log(graph, "u", "one", r1)  # the same run id on an unclaimed thread
    before = dump(store.path)
    for call in (
        lambda: store.delete_for_runs([r1], token=old.token),
        # A token is one claim's: a call that touches another thread too
        # (here "u", which has no claim) is refused as a whole.
        lambda: store.delete_for_runs([r1], token=current.token),
        lambda: store.prune(["t"], strategy="delete", token=old.token),
        lambda: store.prune(["t", "u"], strategy="delete", token=current.token),
        lambda: store.prune(["u"], strategy="keep_latest", token=current.token),
        lambda: store.copy_thread("u", "t", token=old.token),
    ):
        with pytest.raises(StaleClaim):
            call()
        assert dump(store.path) == before
    # Unfenced, a thread under a live claim is refused even when listed with free ones.
    with pytest.raises(ThreadBusy):
        store.prune(["u", "t"], strategy="delete")
    assert dump(store.path) == before
    store.release("t", current.token)
    store.delete_for_runs([r1])
    for thread in ("t", "u"):
        assert snapshot(store, thread) == {}
        last = store.events_after(thread, 0, 1000)[-1]
        assert (last.kind, last.token, last.data["run_ids"]) == ("runs_deleted", None, [r1])


async def test_async_twins_take_the_token(store: FencedSqliteSaver) -> None:
    """adelete_for_runs, aprune and acopy_thread accept the holder's token."""
    graph = log_graph(store)
    run_log(graph, "src", "other")
    claim = store.claim("t", "owner", 60)
    r1 = str(uuid.uuid4())
    owner_run(graph, claim, "one", r1)
    with pytest.raises(ThreadBusy):
        await store.adelete_for_runs([r1])
    await store.adelete_for_runs([r1], token=claim.token)
    await store.acopy_thread("src", "t", token=claim.token)
    (result,) = await store.aprune(["t"], strategy="delete", token=claim.token)
    (pruned,) = store.events_after("t", result.floor - 1, 10)
    assert pruned.kind == "pruned" and snapshot(store, "t") == {}


# --- orphan writes ------------------------------------------------------------------------------


def writes_of(store: FencedSqliteSaver, thread_id: str) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(store.path)
    try:
        return con.execute(
            "SELECT checkpoint_ns, checkpoint_id, task_id, idx FROM writes WHERE thread_id = ? "
            "ORDER BY 1, 2, 3, 4",
            (thread_id,),
        ).fetchall()
    finally:
        con.close()


def late_writes(store: FencedSqliteSaver, thread_id: str, checkpoint_id: str, size: int) -> None:
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    config["configurable"]["checkpoint_id"] = checkpoint_id
    store.put_writes(config, [("log", ["x" * size])], str(uuid.uuid4()))  # type: ignore[arg-type]


def test_prune_removes_writes_whose_checkpoint_is_gone(store: FencedSqliteSaver) -> None:
    """Late writes for a pruned checkpoint go at the first prune after a newer checkpoint."""
    graph = log_graph(store)
    run_log(graph, "t", "one")
    before = set(snapshot(store, "t"))
    store.prune(["t"])
    doomed = sorted(cid for ns, cid in before - set(snapshot(store, "t")) if ns == "")
    assert len(doomed) == 3
    # Slow tasks of old steps send their writes after the prune removed
    # their checkpoints: 2 MB no checkpoint will ever read.
    for cid in doomed:
        late_writes(store, "t", cid, 700_000)
    orphans = writes_of(store, "t")
    assert len(orphans) == 3
    # Not yet: they are newer than the latest checkpoint, as writes for the
    # next, not-yet-stored checkpoint of an in-flight step would be.
    (result,) = store.prune(["t"])
    assert result.writes_removed == 0 and writes_of(store, "t") == orphans
    run_log(graph, "t", "two")
    (dry,) = store.prune(["t"], dry_run=True)
    assert dry.writes_removed == 3
    (result,) = store.prune(["t"])
    assert result.writes_removed == 3
    assert not set(orphans) & set(writes_of(store, "t"))
    assert "two" in graph.get_state({"configurable": {"thread_id": "t"}}).values["log"]


def test_prune_keeps_writes_sent_before_their_checkpoint(store: FencedSqliteSaver) -> None:
    """Writes for a checkpoint not stored yet (LangGraph writes first) survive a prune."""
    put_chain(store, "t", 3)
    latest = store.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})
    assert latest is not None
    nxt = empty_checkpoint()
    late_writes(store, "t", nxt["id"], 10)
    store.prune(["t"], strategy=RetentionPolicy(max_checkpoints=1))
    store.put(latest.config, nxt, {"source": "loop", "step": 3}, {})
    tup = store.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})
    assert tup is not None and tup.checkpoint["id"] == nxt["id"]
    assert [w[1] for w in tup.pending_writes] == ["log"]


class Branches(TypedDict):
    """Two parallel branches' state."""

    log: Annotated[list[str], operator.add]


def test_prune_keeps_the_pending_writes_a_resume_needs(store: FencedSqliteSaver) -> None:
    """After a failed superstep and an interrupt, prune keeps what resuming needs."""
    from langgraph.types import Command, interrupt

    calls: dict[str, int] = {"a": 0}
    failing = {"b": True}

    def a(state: Branches) -> dict[str, Any]:
        calls["a"] += 1
        return {"log": ["a"]}

    def b(state: Branches) -> dict[str, Any]:
        if failing["b"]:
            raise RuntimeError("b fails")
        return {"log": ["b"]}

    def ask(state: Branches) -> dict[str, Any]:
        return {"log": [interrupt("why?")]}

    g = StateGraph(Branches)
    g.add_node("a", a)
    g.add_node("b", b)
    g.add_node("ask", ask)
    g.add_edge(START, "a")
    g.add_edge(START, "b")
    g.add_edge("a", "ask")
    g.add_edge("b", "ask")
    g.add_edge("ask", END)
    graph = g.compile(checkpointer=store)
    for durability in ("sync", "async"):
        config: Any = {"configurable": {"thread_id": f"t-{durability}"}}
        calls["a"], failing["b"] = 0, True
        with pytest.raises(RuntimeError):
            graph.invoke({"log": ["start"]}, config, durability=durability)
        store.prune([config["configurable"]["thread_id"]])
        failing["b"] = False
        graph.invoke(None, config, durability=durability)
        assert calls["a"] == 1  # a's pending write survived: it did not run again
        store.prune([config["configurable"]["thread_id"]])
        out = graph.invoke(Command(resume="because"), config, durability=durability)
        assert out["log"] == ["start", "a", "b", "because"]


def test_concurrent_prunes_never_take_an_in_flight_steps_writes(store: FencedSqliteSaver) -> None:
    """Prunes racing real async-durability runs keep every write a resume needs."""
    import threading

    calls = {"a": 0}
    failing = {"b": True}

    def a(state: Branches) -> dict[str, Any]:
        calls["a"] += 1
        return {"log": ["a"]}

    def b(state: Branches) -> dict[str, Any]:
        if failing["b"]:
            raise RuntimeError("b fails")
        return {"log": ["b"]}

    g = StateGraph(Branches)
    g.add_node("a", a)
    g.add_node("b", b)
    g.add_edge(START, "a")
    g.add_edge(START, "b")
    g.add_edge("a", END)
    g.add_edge("b", END)
    graph = g.compile(checkpointer=store)
    stop = threading.Event()
    errors: list[BaseException] = []

    def pruner() -> None:
        while not stop.is_set():
            try:
                store.prune([f"t{i}" for i in range(10)])
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return

    th = threading.Thread(target=pruner)
    th.start()
    try:
        for i in range(10):
            config: Any = {"configurable": {"thread_id": f"t{i}"}}
            calls["a"], failing["b"] = 0, True
            with pytest.raises(RuntimeError):
                graph.invoke({"log": [str(i)]}, config, durability="async")
            failing["b"] = False
            out = graph.invoke(None, config, durability="async")
            assert calls["a"] == 1, f"run {i}: a ran again, its pending write was pruned"
            assert sorted(out["log"]) == sorted([str(i), "a", "b"])
    finally:
        stop.set()
        th.join(60)
    assert not errors


def test_prune_delete_of_a_thread_with_only_events_drops_them(store: FencedSqliteSaver) -> None:
    """strategy='delete' on a thread with events but no checkpoints still empties its log."""
    claim = store.claim("t", "w", 60)
    store.append_events("t", claim.token, [("note", {})] * 3)
    (result,) = store.prune(["t"], strategy="delete", token=claim.token)
    assert (result.checkpoints, result.floor, result.events_removed) == ([], 4, 3)
    (pruned,) = store.events_after("t", 3, 10)
    assert (pruned.seq, pruned.kind, pruned.data) == (
        4,
        "pruned",
        {"strategy": "delete", "checkpoints": [], "writes": 0},
    )


def test_keep_latest_is_fenced_and_logged_like_delete(store: FencedSqliteSaver) -> None:
    """LangGraph's prune(strategy="keep_latest") refuses someone else's live claim and logs.

    It used to remove history under another worker's live claim, unfenced
    and with no event (found by the model-based test, tests/conformance/test_model.py).
    """
    graph = log_graph(store)
    claim = store.claim("t", "owner", 60)
    owner_run(graph, claim, "one", str(uuid.uuid4()))
    owner_run(graph, claim, "two", str(uuid.uuid4()))
    before = dump(store.path)
    with pytest.raises(ThreadBusy) as info:
        store.prune(["t"], strategy="keep_latest")
    assert (info.value.thread_id, info.value.holder) == ("t", "owner")
    assert dump(store.path) == before
    latest = store.get_tuple({"configurable": {"thread_id": "t"}})
    assert latest is not None
    (result,) = store.prune(["t"], strategy="keep_latest", token=claim.token)
    assert result.checkpoints and ("", latest.config["configurable"]["checkpoint_id"]) not in [
        tuple(k) for k in result.checkpoints
    ]
    last = store.events_after("t", result.floor - 1, 1000)[-1]
    assert (last.kind, last.token, last.data["strategy"]) == ("pruned", claim.token, "keep_latest")
    assert sorted(tuple(k) for k in last.data["checkpoints"]) == sorted(result.checkpoints)
    # The owner goes on from the checkpoint it had.
    out = owner_run(graph, claim, "three", str(uuid.uuid4()))
    said = [x for x in out["log"] if x not in ("first", "inner")]
    assert said[-1] == "three" and {"one", "two"} <= set(said)


def test_a_retention_policy_needs_no_claim(store: FencedSqliteSaver) -> None:
    """A RetentionPolicy keeps each namespace's latest: no claim needed, as before."""
    graph = log_graph(store)
    claim = store.claim("t", "owner", 60)
    for text in ("one", "two", "three"):
        owner_run(graph, claim, text, str(uuid.uuid4()))
    (result,) = store.prune(["t"], strategy=RetentionPolicy(max_checkpoints=1))
    assert result.checkpoints
    out = owner_run(graph, claim, "four", str(uuid.uuid4()))
    said = [x for x in out["log"] if x not in ("first", "inner")]
    assert said[-1] == "four" and {"one", "two", "three"} <= set(said)
