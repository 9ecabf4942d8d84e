"""`state_view`: internal channels, chat messages in every stored form, per-channel diffs."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage, ToolMessage
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from langgraph_fenced_sqlite import FencedSqliteSaver, diff_channels
from langgraph_fenced_sqlite.core.serde import TaggedValue
from langgraph_fenced_sqlite.core.state_view import as_message, is_internal_channel, messages_of


@pytest.mark.parametrize(
    ("name", "internal"),
    [
        ("__pregel_tasks", True),
        ("__start__", True),
        ("branch:to:review", True),
        ("start:agent", True),
        ("join:a+b:c", True),
        ("messages", False),
        ("my_branch", False),
    ],
)
def test_internal_channels(name: str, internal: bool) -> None:
    assert is_internal_channel(name) is internal


def test_a_message_reads_the_same_rebuilt_tagged_or_as_plain_data() -> None:
    call = {"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1"}
    rebuilt = as_message(AIMessage("checking", tool_calls=[call], id="m1"))
    fields = {"content": "checking", "tool_calls": [call], "id": "m1", "type": "ai"}
    tagged = as_message(TaggedValue("langchain_core.messages.ai.AIMessage", fields, "not allowed"))
    plain = as_message(fields)
    assert rebuilt == tagged == plain
    assert (
        rebuilt is not None and rebuilt.role == "ai" and rebuilt.tool_calls[0].name == "get_weather"
    )
    tool = as_message(
        ToolMessage("boom", tool_call_id="call_1", name="get_weather", status="error")
    )
    assert tool is not None and (tool.role, tool.name, tool.status) == (
        "tool",
        "get_weather",
        "error",
    )
    blocks = as_message(HumanMessage([{"type": "text", "text": "look"}, {"type": "image_url"}]))
    assert blocks is not None and blocks.text == "look [image_url]"
    assert as_message({"type": "note", "content": "x"}) is None
    assert messages_of([HumanMessage("a"), "not a message"]) is None and messages_of([]) is None


class Chat(TypedDict):
    """A chat state."""

    messages: Annotated[list[Any], add_messages]


def test_message_diffs_follow_add_messages_by_id(tmp_path: Any) -> None:
    """Replaced and removed messages (by id, as `add_messages` does) are told apart."""
    graph = StateGraph(Chat)
    graph.add_node("edit", lambda s: {"messages": [RemoveMessage(id="a"), AIMessage("B2", id="b")]})
    graph.add_edge(START, "edit")
    with FencedSqliteSaver(str(tmp_path / "chat.db")) as saver:
        app = graph.compile(checkpointer=saver)
        first = [HumanMessage("A", id="a"), AIMessage("B", id="b")]
        app.invoke({"messages": first}, {"configurable": {"thread_id": "t"}})
        diff = saver.diff_checkpoints("t")
    assert diff is not None
    (change,) = [c for c in diff.changes if c.channel == "messages"]
    assert change.shape == "messages" and change.items_added == ()
    assert [m.id for m in change.items_removed] == ["a"]
    assert [(a.content, b.content) for a, b in change.items_changed] == [("B", "B2")]


def test_list_dict_and_value_changes() -> None:
    changes = {
        c.channel: c
        for c in diff_channels(
            {"log": [1, 2], "cfg": {"a": 1, "b": 2}, "n": 1, "order": [1, 2], "gone": 0},
            {"log": [1, 2, 3], "cfg": {"a": 9, "c": 3}, "n": 2, "order": [2, 1], "new": 0},
        )
    }
    assert changes["log"].shape == "list" and changes["log"].items_added == (3,)
    cfg = changes["cfg"]
    assert (cfg.keys_added, cfg.keys_removed, cfg.keys_changed) == (
        {"c": 3},
        {"b": 2},
        {"a": (1, 9)},
    )
    assert changes["n"].shape == "value" and changes["order"].shape == "value"
    assert changes["gone"].to_dict() == {"channel": "gone", "change": "removed", "before": 0}
    assert changes["new"].to_dict() == {"channel": "new", "change": "added", "after": 0}
