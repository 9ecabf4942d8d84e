"""How `lgfs` shows a thread's state as text: messages, values, diffs, statuses, events.

Invariant: rendering only. What a value means (a chat message, an internal
channel, a pending interrupt, a diff, a status) is decided by the library
(`state_view`, `status`); this module lays the answers out for a terminal of
`View.width` cells: messages as `role: text` lines, tool calls and tool
results on their own lines, other values as one line of JSON or an indented
block, each line cut to the width unless `--full`. JSON output never comes
through here, so `--json` keeps its shape.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from ..core.state_view import (
    ChannelChange,
    CheckpointDiff,
    Message,
    is_internal_channel,
    messages_of,
)
from ..core.status import Failure, ThreadStatus, Waiting, task_node
from .io import claim_text, compact, jsonable, plural
from .text import Cell, View, cells, cut, span, when

__all__ = [
    "claim_cell",
    "diff_text",
    "event_line",
    "message_lines",
    "show_text",
    "status_cell",
    "status_line",
    "status_text",
    "value_lines",
]

_MAX_LINES = 12  # lines of one value's block before "--full shows all"
_MAX_MESSAGES = 20  # newest messages shown of a long conversation
_MAX_ITEMS = 20  # appended items shown by diff
_ROLE_STYLE = {
    "human": ("bold", "cyan"),
    "user": ("bold", "cyan"),
    "ai": ("bold", "green"),
    "assistant": ("bold", "green"),
    "tool": ("bold", "magenta"),
    "system": ("bold", "yellow"),
}
_MARK_STYLE = {"+": "green", "-": "red", "~": "yellow"}
_STATE_STYLE = {
    "running": "green",
    "interrupted": "yellow",
    "failed": "red",
    "unknown": "red",
    "idle": "dim",
}


def _line(view: View, indent: int, prefix: str, text: str, *styles: str, mark: str = "") -> str:
    """`indent` spaces, `mark ` and `prefix` (painted), then `text` cut to the room left."""
    lead = f"{mark} " if mark else ""
    room = view.width - indent - cells(lead) - cells(prefix)
    body = text if view.full else cut(text, max(8, room))
    marked = view.paint(lead, _MARK_STYLE[mark]) if mark else ""
    return " " * indent + marked + view.paint(prefix, *styles) + body


def _one_line(text: str, view: View) -> str:
    return text if view.full else " ".join(text.split())


def _args(args: Any) -> str:
    if isinstance(args, dict):
        return ", ".join(f"{k}={compact(v)}" for k, v in args.items())
    return compact(args)


def message_lines(m: Message, view: View, indent: int, mark: str = "") -> list[str]:
    """Render one chat message: `role: text`, then one line per tool call.

    A tool result reads `tool NAME [CALL_ID]: text`; a tool call `ai -> NAME(ARGS)
    [CALL_ID]`. `mark` (`+`, `-`, `~`) prefixes each line, for diffs.
    """
    style = _ROLE_STYLE.get(m.role, ("bold",))
    text = _one_line(m.text, view)
    if m.role == "tool":
        head = "tool" + (f" {m.name}" if m.name else "")
        head += f" [{m.tool_call_id}]" if m.tool_call_id else ""
        head += f" ({m.status})" if m.status else ""
        return [_line(view, indent, f"{head}: ", text, *style, mark=mark)]
    if m.role == "remove":
        return [_line(view, indent, "remove: ", f"message {m.id}", *style, mark=mark)]
    role = m.role + (f" ({m.name})" if m.name else "")
    out = []
    if text or not m.tool_calls:
        out.append(_line(view, indent, f"{role}: ", text, *style, mark=mark))
    for call in m.tool_calls:
        where = f"  [{call.id}]" if call.id else ""
        call_text = f"{call.name}({_args(call.args)}){where}"
        out.append(_line(view, indent, f"{role} -> ", call_text, *style, mark=mark))
    return out


def value_lines(name: str, value: Any, view: View, indent: int = 2, mark: str = "") -> list[str]:
    """Render a channel (or key) and its value.

    Messages get a line each (the newest `_MAX_MESSAGES` unless `--full`);
    any other value is one line of JSON when it fits, else an indented JSON
    block (at most `_MAX_LINES` lines, each cut, unless `--full`).
    """
    messages = messages_of(value)
    if messages is not None:
        out = [_line(view, indent, f"{name}: ", plural(len(messages), "message"), mark=mark)]
        shown = messages if view.full else messages[-_MAX_MESSAGES:]
        if len(shown) < len(messages):
            more = plural(len(messages) - len(shown), "earlier message")
            out.append(" " * (indent + 2) + f"({more}; --full shows all)")
        for m in shown:
            out += message_lines(m, view, indent + 2)
        return out
    one = compact(value)
    prefix = f"{name}: "
    room = view.width - indent - cells(prefix) - (2 if mark else 0)
    if cells(one) <= room or not _is_block(value):
        return [_line(view, indent, prefix, one, mark=mark)]
    block = json.dumps(jsonable(value), indent=2, ensure_ascii=False).splitlines()
    out = [_line(view, indent, prefix.rstrip(), "", mark=mark)]
    limit = len(block) if view.full else _MAX_LINES
    for text in block[:limit]:
        out.append(_line(view, indent + 2, "", text))
    if len(block) > limit:
        more = plural(len(block) - limit, "more line")
        out.append(" " * (indent + 2) + f"(... {more}; --full shows all)")
    return out


def _is_block(value: Any) -> bool:
    data = jsonable(value)
    return isinstance(data, (dict, list)) and bool(data)


def _hidden_note(names: Sequence[str], what: str, indent: int, view: View) -> list[str]:
    if not names:
        return []
    return [view.paint(_note(f"({plural(len(names), what)} hidden: ", names, indent, view), "dim")]


def _note(head: str, names: Sequence[str], indent: int, view: View) -> str:
    """`head NAMES; --all-channels shows them)`, the names cut so that the hint stays whole."""
    tail = "; see --all-channels)"
    room = view.width - indent - cells(head) - cells(tail)
    listed = ", ".join(names)
    return " " * indent + head + (listed if view.full else cut(listed, max(8, room))) + tail


def waiting_lines(waiting: Sequence[Waiting], failures: Sequence[Failure], view: View) -> list[str]:
    """Render `waiting at NODE: payload` and `failed at NODE: error` lines."""
    out = []
    for w in waiting:
        out.append(_line(view, 0, f"waiting at {w.node}: ", compact(w.value), "bold", "yellow"))
    for f in failures:
        where = f" at {f.node}" if f.node else ""
        out.append(_line(view, 0, f"failed{where}: ", f.message, "bold", "red"))
    return out


def status_text(st: ThreadStatus) -> str:
    """Say a thread's status in a few words: `running (worker-2, expires in 5m0s)`."""
    if st.state == "running":
        gap = "" if st.expires_in is None else f", expires in {span(st.expires_in)}"
        return f"running ({st.holder}{gap})"
    if st.state == "interrupted":
        nodes = sorted({w.node for w in st.waiting})
        return "interrupted" + (f" at {', '.join(nodes)}" if nodes else "")
    if st.state == "failed" and st.failure is not None:
        where = f" at {st.failure.node}" if st.failure.node else ""
        return f"failed{where}: {st.failure.error}"
    return "DAMAGED" if st.state == "unknown" else st.state


def status_cell(st: ThreadStatus) -> Cell:
    """Return `lgfs threads`' STATUS cell: `status_text`, coloured by state (on a terminal)."""
    return Cell(status_text(st), style=(_STATE_STYLE.get(st.state, "bold"),))


def claim_cell(claim: dict[str, Any] | None) -> Cell:
    """Return `lgfs threads`' CLAIM cell (a `claim_doc`): `claim_text`, and a short form.

    The short form keeps who holds the claim and, for an expired (or damaged)
    one, that it is: a live claim's expiry is in the STATUS cell already.
    """
    if claim is None:
        return Cell("-")
    if claim["live"] is None or not claim["live"]:
        state = "DAMAGED" if claim["live"] is None else "expired"
        return Cell(claim_text(claim), f"{claim['holder']}, {state}")
    return Cell(claim_text(claim), f"{claim['holder']} token {claim['token']}")


def status_line(st: ThreadStatus, view: View) -> str:
    """Render `show`'s status line: the state, and who holds the claim until when."""
    text = st.state
    if st.failure is not None and st.failure.node is None:  # else `failed at NODE` says it
        text += f": {st.failure.message}"
    if st.holder is not None and st.expires_in is not None:
        live = st.state == "running"
        doc = {"holder": st.holder, "token": st.token, "live": live, "expires_in": st.expires_in}
        claim = claim_text(doc)
        text += f" (claim: {claim})"
    if st.run_id:
        text += f", run {st.run_id}"
    if st.error:
        text += f": {st.error.get('message')}"
    return "status      " + view.paint(text, _STATE_STYLE.get(st.state, "bold"))


def show_text(
    doc: dict[str, Any],
    view: View,
    *,
    waiting: Sequence[Waiting],
    failures: Sequence[Failure],
    status: ThreadStatus | None,
) -> str:
    """Render `lgfs show`: where the checkpoint is, what waits, values, metadata, writes."""
    token = "unfenced" if doc["token"] is None else f"token {doc['token']}"
    ns = doc["checkpoint_ns"]
    lines = [
        f"thread      {doc['thread_id']}" + (f"  namespace {ns!r}" if ns else ""),
        f"checkpoint  {doc['checkpoint_id']}  (position {doc['position']}, "
        f"step {doc['step']}, {doc['source']})",
        f"parent      {doc['parent_checkpoint_id'] or '-'}",
        f"written     {when(doc['created_at'])}, {token}",
    ]
    if status is not None:
        lines.append(status_line(status, view))
    lines += waiting_lines(waiting, failures, view)
    if doc["error"] is not None:
        lines.append("values: " + view.paint(_err_text(doc["error"]), "red"))
    else:
        lines.append("values:")
    values = doc["values"] or {}
    hidden = [k for k in values if is_internal_channel(k) and not view.all_channels]
    for name, value in values.items():
        if name not in hidden:
            lines += value_lines(name, value, view)
    lines += _hidden_note(hidden, "internal channel", 2, view)
    lines.append(_line(view, 0, "metadata:    ", compact(doc["metadata"] or {})))
    writes = doc["writes"]
    sends = (doc["values"] or {}).get("__pregel_tasks")
    quiet = [w for w in writes if _quiet_write(w["channel"]) and not view.all_channels]
    lines.append(f"pending writes ({len(writes)}):")
    for w in writes:
        if any(w is q for q in quiet):
            continue
        node = _writer(w["task_path"], sends)
        who = f"{node} {w['task_id']} [{w['idx']}]" if view.full else node
        value = view.paint(_err_text(w["error"]), "red") if w["error"] else compact(w["value"])
        lines.append(_line(view, 2, f"{who} -> {w['channel']}: ", value))
    if quiet:
        names = sorted({w["channel"] for w in quiet})
        head = f"({plural(len(quiet), 'write')} hidden, to: "
        lines.append(view.paint(_note(head, names, 2, view), "dim"))
    return "\n".join(lines)


def _writer(task_path: Any, sends: Any = None) -> str:
    """Name who wrote a pending write: its node, `(send)` or `(command)`."""
    if not task_path:
        return "(command)"  # LangGraph's null task: a Command(resume=...) or update
    node = task_node(task_path, sends)
    return "(send)" if node == "?" and "__pregel_push" in str(task_path) else node


def _quiet_write(channel: str) -> bool:
    # Writes to LangGraph's `__...__` channels (interrupts, errors, resumes,
    # sends, input) say what happens; `branch:to:*` ones only route.
    return is_internal_channel(channel) and not channel.startswith("__")


def _err_text(err: dict[str, Any]) -> str:
    return f"ERROR ({err['code']}): {err['message']}"


def diff_text(diff: CheckpointDiff, view: View) -> str:
    """Render `lgfs diff`: per channel, what was appended, added, removed or changed."""
    lines = [f"from  {diff.from_id or '(an empty state)'}", f"to    {diff.to_id}"]
    lines += [view.paint(_err_text(e), "red") for e in diff.errors]
    shown = [c for c in diff.changes if view.all_channels or not c.internal]
    hidden = [c.channel for c in diff.changes if c not in shown]
    for change in shown:
        lines += _change_lines(change, view)
    if not diff.changes and not diff.errors:
        lines.append("(no changes)")
    elif hidden:
        head = f"({plural(len(hidden), 'internal channel')} changed: "
        lines.append(view.paint(_note(head, hidden, 0, view), "dim"))
    return "\n".join(lines)


def _change_lines(c: ChannelChange, view: View) -> list[str]:
    if c.change == "added":
        return value_lines(c.channel, c.after, view, 0, "+")
    if c.change == "removed":
        return value_lines(c.channel, c.before, view, 0, "-")
    head = f"{c.channel}: "
    if c.shape == "messages":
        counts = [f"+{len(c.items_added)}"] if c.items_added else []
        counts += [f"-{len(c.items_removed)}"] if c.items_removed else []
        counts += [f"~{len(c.items_changed)}"] if c.items_changed else []
        out = [_line(view, 0, head, f"{' '.join(counts) or 'reordered'} messages", mark="~")]
        for mark, items in (("-", c.items_removed), ("~", [b for _, b in c.items_changed])):
            for item in items:
                out += _marked_message(item, mark, view)
        for item in c.items_added:
            out += _marked_message(item, "+", view)
        return out
    if c.shape == "list":
        out = [_line(view, 0, head, f"+{plural(len(c.items_added), 'item')}", mark="~")]
        items = c.items_added if view.full else c.items_added[:_MAX_ITEMS]
        out += [_line(view, 4, "", compact(v), mark="+") for v in items]
        if len(items) < len(c.items_added):
            out.append(f"    (... {len(c.items_added) - len(items)} more; --full shows all)")
        return out
    if c.shape == "dict":
        counts = [f"{len(c.keys_added)} added"] if c.keys_added else []
        counts += [f"{len(c.keys_removed)} removed"] if c.keys_removed else []
        counts += [f"{len(c.keys_changed)} changed"] if c.keys_changed else []
        out = [_line(view, 0, head, ", ".join(counts) + (" keys" if counts else ""), mark="~")]
        for key, (old, new) in c.keys_changed.items():
            out += _replaced(f"{key}: ", old, new, view, 4)
        out += [_line(view, 4, f"{k}: ", compact(v), mark="+") for k, v in c.keys_added.items()]
        out += [_line(view, 4, f"{k}: ", compact(v), mark="-") for k, v in c.keys_removed.items()]
        return out
    return _replaced(head, c.before, c.after, view, 0)


def _marked_message(item: Any, mark: str, view: View) -> list[str]:
    messages = messages_of([item])
    if messages is None:
        return [_line(view, 4, "", compact(item), mark=mark)]
    return message_lines(messages[0], view, 4, mark)


def _replaced(head: str, old: Any, new: Any, view: View, indent: int) -> list[str]:
    """`~ head old -> new` on one line when it fits, else `- old` and `+ new` below it."""
    both = f"{compact(old)} -> {compact(new)}"
    if view.full or cells(head) + cells(both) + indent + 2 <= view.width:
        return [_line(view, indent, head, both, mark="~")]
    return [
        _line(view, indent, head.rstrip(), "", mark="~"),
        _line(view, indent + 4, "", compact(old), mark="-"),
        _line(view, indent + 4, "", compact(new), mark="+"),
    ]


# --- events -----------------------------------------------------------------------------------


def _clock(ts: Any, now: float) -> str:
    """`HH:MM:SS` for a time of today (UTC), `MM-DD HH:MM` for another day."""
    try:
        at = datetime.fromtimestamp(ts, tz=timezone.utc)
        today = datetime.fromtimestamp(now, tz=timezone.utc).date()
    except (TypeError, ValueError, OverflowError, OSError):
        return f"?{ts!r}"
    return at.strftime("%H:%M:%S" if at.date() == today else "%m-%d %H:%M")


def _event_summary(e: Any) -> str:
    data = e.data if isinstance(e.data, dict) else {}
    if e.kind == "checkpoint" and "step" in data:
        run = f" run {data['run_id']}" if data.get("run_id") else ""
        return f"step {data['step']} {data.get('source')}{run}"
    if e.kind == "writes" and isinstance(data.get("channels"), list):
        channels = [str(c) for c in data["channels"] if not _quiet_write(str(c))]
        return f"{_writer(data.get('task_path'))}: {', '.join(channels) or '-'}"
    return compact(e.data)


def event_line(e: Any, view: View) -> str:
    """Render one event: seq, time, kind, checkpoint, namespace, token and data.

    With `--full` (or a terminal wide enough) the whole line; else a short
    time, the checkpoint id cut in the middle and the data summarised, cut
    to the width.
    """
    where = f" {e.checkpoint_id}" if e.checkpoint_id else ""
    where += f" ns={e.checkpoint_ns}" if e.checkpoint_ns else ""
    token = "" if e.token is None else f" token={e.token}"
    full = f"{e.seq:>6}  {when(e.ts)}  {e.kind}{where}{token}  {compact(e.data)}"
    if view.full or cells(full) <= view.width:
        return full
    where = f" {cut(e.checkpoint_id, 13, middle=True)}" if e.checkpoint_id else ""
    if e.checkpoint_ns:  # a subgraph's namespace, by its node: `sub:<task id>` -> `sub:…`
        node, _, task = e.checkpoint_ns.partition(":")
        where += f" {node}:{cut(task, 1)}" if task else f" {node}"
    token = "" if e.token is None else f" t={e.token}"
    head = f"{e.seq:>6}  {_clock(e.ts, time.time())}  "
    line = f"{e.kind}{where}{token}  {_event_summary(e)}"
    return view.paint(head, "dim") + cut(line, max(8, view.width - cells(head)))
