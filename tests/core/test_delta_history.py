"""`get_delta_channel_history` (LangGraph's `DeltaChannel`, beta) read a page at a time.

Our walk must return exactly what the base class's one-`get_tuple`-per-ancestor
walk returns, for every checkpoint of real threads (a long chat, a fork made by
`update_state`, ids out of commit order), on both stores, sync and async; and
it must read far fewer times (on PostgreSQL each read is a round trip).
"""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

import pytest
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.graph import START, StateGraph

from langgraph_fenced_sqlite import FencedSqliteSaver
from langgraph_fenced_sqlite.testing.postgres_server import round_trips


def _extend(state: Any, writes: Any) -> list[Any]:
    out = list(state or [])
    for w in writes:
        out.extend(w)
    return out


class Chat(TypedDict, total=False):
    messages: Annotated[list[str], DeltaChannel(_extend, snapshot_frequency=7)]
    turns: int


def _graph(saver: Any) -> Any:
    builder = StateGraph(Chat)
    builder.add_node("reply", lambda s: {"messages": [f"r{len(s['messages'])}"], "turns": 1})
    builder.add_edge(START, "reply")
    return builder.compile(checkpointer=saver)


@pytest.fixture(params=["sqlite", "postgres"])
def saver(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    if request.param == "sqlite":
        with FencedSqliteSaver(str(tmp_path / "delta.db")) as store:
            yield store
    else:
        yield request.getfixturevalue("open_pg")()


def _default(saver: Any, config: Any, channels: list[str]) -> Any:
    return BaseCheckpointSaver.get_delta_channel_history(saver, config=config, channels=channels)


CHANNELS = ["messages", "turns", "never-written"]


def _chat(saver: Any, thread_id: str, turns: int) -> Any:
    graph = _graph(saver)
    config = {"configurable": {"thread_id": thread_id}}
    for i in range(turns):
        graph.invoke({"messages": [f"q{i}"]}, config)
    return graph, config


async def test_every_checkpoint_of_a_chat_and_a_fork_walks_as_the_base_class_does(
    saver: Any,
) -> None:
    graph, config = _chat(saver, "chat", 12)
    history = list(saver.list(config))
    assert len(history) == 36
    # A fork: state edited at an early checkpoint, then run on from there.
    forked = graph.update_state(history[-5].config, {"messages": ["edited"]})
    graph.invoke({"messages": ["again"]}, forked)
    graph.invoke({"messages": ["more"]}, config)
    seeds = 0
    for found in saver.list(config):
        expected = _default(saver, found.config, CHANNELS)
        assert saver.get_delta_channel_history(config=found.config, channels=CHANNELS) == expected
        assert await saver.aget_delta_channel_history(config=found.config, channels=CHANNELS) == (
            expected
        )
        seeds += "seed" in expected["messages"]
    assert seeds > 5  # the snapshots (every 7 updates) were reached, not just the root
    latest = saver.get_delta_channel_history(config=config, channels=["messages"])
    assert latest == _default(saver, config, ["messages"]) and latest["messages"]["writes"]
    state = graph.get_state(config).values["messages"]
    assert state[-2:] == ["more", f"r{len(state) - 1}"] and "edited" in state
    assert saver.get_delta_channel_history(config=config, channels=[]) == {}
    missing = {"configurable": {"thread_id": "nobody", "checkpoint_ns": ""}}
    assert saver.get_delta_channel_history(config=missing, channels=["messages"]) == {
        "messages": {"writes": []}
    }


def test_a_parent_with_a_newer_id_than_its_child_is_still_found(saver: Any) -> None:
    """Ids follow the writer's clock, commits the store's: a parent may sort after its child."""
    ids = ["1f0-c", "1f0-a", "1f0-b"]  # parent first in the chain, ids out of order
    parent: str | None = None
    for i, cid in enumerate(ids):
        cp = empty_checkpoint()
        cp["id"] = cid
        cp["channel_values"] = {"turns": i} if i == 0 else {}
        conf: dict[str, Any] = {"thread_id": "skew", "checkpoint_ns": ""}
        if parent is not None:
            conf["checkpoint_id"] = parent
        saver.put({"configurable": conf}, cp, {"source": "update", "step": i}, {})
        saver.put_writes(
            {"configurable": {**conf, "checkpoint_id": cid}}, [("messages", [cid])], f"task-{i}"
        )
        parent = cid
    target = {"configurable": {"thread_id": "skew", "checkpoint_ns": "", "checkpoint_id": "1f0-b"}}
    expected = _default(saver, target, ["messages", "turns"])
    assert expected["turns"]["seed"] == 0  # reached "1f0-c", the root, past "1f0-a"
    assert [w[2] for w in expected["messages"]["writes"]] == [["1f0-c"], ["1f0-a"]]
    assert saver.get_delta_channel_history(config=target, channels=["messages", "turns"]) == (
        expected
    )


def test_on_postgresql_a_long_walk_takes_a_few_reads_not_one_per_ancestor(
    open_pg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    saver = open_pg()
    _chat(saver, "long", 40)  # 120 checkpoints; `messages` snapshots every 7 updates
    latest = saver.get_tuple({"configurable": {"thread_id": "long"}}).config
    reads: list[str] = []
    for name in ("get_tuple", "list"):
        method = getattr(saver, name)
        monkeypatch.setattr(
            saver, name, lambda *a, _m=method, _n=name, **k: reads.append(_n) or _m(*a, **k)
        )
    channels = ["turns", "never-written"]  # `never-written` has no seed: the whole chain
    conn = saver._engine._conn
    ours = round_trips(
        conn, lambda: saver.get_delta_channel_history(config=latest, channels=channels)
    )
    # The target, then pages of 8, 16, 32 and 64 (a fifth would start past the root).
    assert reads == ["get_tuple", "list", "list", "list", "list"]
    reads.clear()
    theirs = round_trips(conn, lambda: _default(saver, latest, channels))
    assert reads == ["get_tuple"] * 120 and theirs == 120
    # The target, then each page with its writes: one statement each.
    assert ours == 5, ours
