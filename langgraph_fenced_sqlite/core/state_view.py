"""What a checkpoint's state means to a reader: channels, messages, and what changed.

Invariant: one place decides which channels are LangGraph's own
(`is_internal_channel`), what a chat message is (`as_message`: LangChain
messages, rebuilt or shown as tagged data) and how two checkpoints differ
channel by channel (`diff_channels`); the CLI and applications call these and
re-derive none of it. Pure functions over decoded values: no SQL, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage

__all__ = [
    "ChannelChange",
    "CheckpointDiff",
    "Message",
    "ToolCall",
    "as_message",
    "diff_channels",
    "is_internal_channel",
    "messages_of",
]

# LangGraph's bookkeeping channels: `__pregel_tasks`, `__start__`, `branch:to:NODE`,
# and (files from LangGraph < 0.3) `start:NODE`, `branch:NODE:...`, `join:...`.
_INTERNAL_PREFIXES = ("__", "branch:", "start:", "join:")
_ROLES = {
    "HumanMessage": "human",
    "AIMessage": "ai",
    "ToolMessage": "tool",
    "SystemMessage": "system",
    "FunctionMessage": "function",
    "ChatMessage": "chat",
    "RemoveMessage": "remove",
}
_CHUNK = "Chunk"  # AIMessageChunk is an "ai" message


def is_internal_channel(name: str) -> bool:
    """Whether channel `name` is LangGraph's bookkeeping rather than the graph's state."""
    return name.startswith(_INTERNAL_PREFIXES)


@dataclass(frozen=True)
class ToolCall:
    """A tool call an AI message asks for.

    Attributes:
        name: The tool.
        args: Its arguments.
        id: The call id the tool's result names.
    """

    name: str
    args: Any
    id: str | None


@dataclass(frozen=True)
class Message:
    """A chat message as a reader sees it, whatever class or form it was stored in.

    Attributes:
        role: `human`, `ai`, `tool`, `system`, `function`, `chat` (its own
            `role`), or `remove` (a `RemoveMessage`).
        text: The content as text (non-text blocks as `[image]`, `[file]`...).
        id: The message id (`add_messages` replaces a message by it).
        name: The message's `name`, if any (a tool message: the tool).
        tool_calls: The tool calls of an AI message.
        tool_call_id: The call a tool message answers.
        status: A tool message's status (`success`, `error`), if not success.
    """

    role: str
    text: str
    id: str | None = None
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    status: str | None = None


def _fields(value: Any) -> tuple[str, dict[str, Any]] | None:
    """Return (role, fields) of a LangChain message in any stored form, else None."""
    if isinstance(value, BaseMessage):
        kind = str(value.type).removesuffix(_CHUNK)
        return _ROLES.get(kind, kind), {k: getattr(value, k, None) for k in _MESSAGE_ATTRS}
    type_name = getattr(value, "type_name", None)  # a TaggedValue (a class not rebuilt)
    if isinstance(type_name, str):
        data = getattr(value, "data", None)
        name = type_name.rsplit(".", 1)[-1].removesuffix(_CHUNK)
        if type_name.startswith("langchain_core.messages.") and isinstance(data, dict):
            return _ROLES.get(name, name), data
        return None
    if isinstance(value, dict):  # stored as plain data: {"type": "human", "content": ...}
        role = value.get("type")
        if "content" in value and isinstance(role, str) and role in _ROLES.values():
            return role, value
    return None


_MESSAGE_ATTRS = ("content", "id", "name", "tool_calls", "tool_call_id", "status", "role")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict):
                kind = block.get("type")
                if kind == "text" and isinstance(block.get("text"), str):
                    parts.append(block["text"])
                elif kind not in ("tool_use", "tool_call"):  # shown as tool calls instead
                    parts.append(f"[{kind or 'block'}]")
            else:
                parts.append(f"[{type(block).__name__}]")
        return " ".join(p for p in parts if p)
    return "" if content is None else str(content)


def as_message(value: Any) -> Message | None:
    """Return `value` as a `Message` if it is a chat message (rebuilt or tagged), else None."""
    found = _fields(value)
    if found is None:
        return None
    role, data = found
    if role == "chat" and isinstance(data.get("role"), str):
        role = data["role"]
    calls = []
    for call in data.get("tool_calls") or ():
        if isinstance(call, dict):
            name = call.get("name")
            calls.append(ToolCall(str(name), call.get("args"), _str(call.get("id"))))
    status = data.get("status")
    return Message(
        role=role,
        text=_text(data.get("content")),
        id=_str(data.get("id")),
        name=_str(data.get("name")),
        tool_calls=tuple(calls),
        tool_call_id=_str(data.get("tool_call_id")),
        status=status if isinstance(status, str) and status != "success" else None,
    )


def messages_of(value: Any) -> list[Message] | None:
    """Return a channel value as messages if it is a non-empty list of messages, else None."""
    if not isinstance(value, (list, tuple)) or not value:
        return None
    out = []
    for item in value:
        message = as_message(item)
        if message is None:
            return None
        out.append(message)
    return out


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class ChannelChange:
    """How one channel differs between two checkpoints.

    `change` is `added`, `removed` or `changed`; `shape` says how a changed
    value changed: `messages` (a message list, compared by message id:
    `items_added`, `items_removed`, `items_changed`), `list` (items appended
    at the end: `items_added`), `dict` (`keys_added`, `keys_removed`,
    `keys_changed`: key -> (before, after)) or `value` (replaced whole).

    Attributes:
        channel: The channel.
        change: `added`, `removed` or `changed`.
        before: The old value (absent for `added`: see `has_before`).
        after: The new value (absent for `removed`).
        shape: See above.
        items_added: Appended list items, or new messages.
        items_removed: Messages gone (by id).
        items_changed: (before, after) of messages replaced under the same id.
        keys_added: Keys only the new dict has, with their values.
        keys_removed: Keys only the old dict has, with their values.
        keys_changed: key -> (before, after) for keys whose value changed.
    """

    channel: str
    change: str
    before: Any = None
    after: Any = None
    shape: str = "value"
    items_added: tuple[Any, ...] = ()
    items_removed: tuple[Any, ...] = ()
    items_changed: tuple[tuple[Any, Any], ...] = ()
    keys_added: dict[Any, Any] = field(default_factory=dict)
    keys_removed: dict[Any, Any] = field(default_factory=dict)
    keys_changed: dict[Any, tuple[Any, Any]] = field(default_factory=dict)

    @property
    def internal(self) -> bool:
        """Whether the channel is LangGraph's bookkeeping (`is_internal_channel`)."""
        return is_internal_channel(self.channel)

    def to_dict(self) -> dict[str, Any]:
        """Return `{"channel", "change", "before"?, "after"?}` (`lgfs diff --json`'s entries)."""
        out: dict[str, Any] = {"channel": self.channel, "change": self.change}
        if self.change != "added":
            out["before"] = self.before
        if self.change != "removed":
            out["after"] = self.after
        return out


@dataclass(frozen=True)
class CheckpointDiff:
    """What changed from one checkpoint of a namespace to another.

    Attributes:
        thread_id: The thread.
        checkpoint_ns: The namespace.
        from_id: The older checkpoint (None: compared with an empty state).
        to_id: The newer checkpoint.
        changes: One entry per channel that differs, by channel name.
        errors: `UndecodableRow` dicts of checkpoints that did not decode
            (their values count as empty).
    """

    thread_id: str
    checkpoint_ns: str
    from_id: str | None
    to_id: str
    changes: tuple[ChannelChange, ...]
    errors: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Return the document `lgfs diff --json` prints."""
        return {
            "thread_id": self.thread_id,
            "checkpoint_ns": self.checkpoint_ns,
            "from": self.from_id,
            "to": self.to_id,
            "changes": [c.to_dict() for c in self.changes],
            "errors": list(self.errors),
        }


def diff_channels(before: dict[str, Any], after: dict[str, Any]) -> list[ChannelChange]:
    """Compare two checkpoints' channel values, channel by channel (sorted by name)."""
    out = []
    for channel in sorted(set(before) | set(after)):
        if channel not in after:
            out.append(ChannelChange(channel, "removed", before=before[channel]))
        elif channel not in before:
            out.append(ChannelChange(channel, "added", after=after[channel]))
        elif not _same(before[channel], after[channel]):
            out.append(_changed(channel, before[channel], after[channel]))
    return out


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - a value whose __eq__ fails is not known equal
        return False


def _changed(channel: str, a: Any, b: Any) -> ChannelChange:
    base = {"channel": channel, "change": "changed", "before": a, "after": b}
    old, new = messages_of(a), messages_of(b)
    if old is not None and new is not None:
        change = _message_change(base, a, b, old, new)
        if change is not None:
            return change
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(b) > len(a) and all(_same(x, y) for x, y in zip(a, b, strict=False)):
            return ChannelChange(**base, shape="list", items_added=tuple(b[len(a) :]))
    if isinstance(a, dict) and isinstance(b, dict):
        return ChannelChange(
            **base,
            shape="dict",
            keys_added={k: b[k] for k in b if k not in a},
            keys_removed={k: a[k] for k in a if k not in b},
            keys_changed={k: (a[k], b[k]) for k in a if k in b and not _same(a[k], b[k])},
        )
    return ChannelChange(**base)


def _message_change(
    base: dict[str, Any], a: Sequence[Any], b: Sequence[Any], old: list[Message], new: list[Message]
) -> ChannelChange | None:
    ids_a, ids_b = [m.id for m in old], [m.id for m in new]
    if None in ids_a or None in ids_b or len(set(ids_a)) < len(ids_a):
        # Messages without ids: only an append can be told apart.
        if len(b) > len(a) and all(_same(x, y) for x, y in zip(a, b, strict=False)):
            return ChannelChange(**base, shape="messages", items_added=tuple(b[len(a) :]))
        return None
    by_id = dict(zip(ids_a, a, strict=True))
    kept = set(ids_b)
    return ChannelChange(
        **base,
        shape="messages",
        items_added=tuple(v for i, v in zip(ids_b, b, strict=True) if i not in by_id),
        items_removed=tuple(v for i, v in zip(ids_a, a, strict=True) if i not in kept),
        items_changed=tuple(
            (by_id[i], v)
            for i, v in zip(ids_b, b, strict=True)
            if i in by_id and not _same(by_id[i], v)
        ),
    )
