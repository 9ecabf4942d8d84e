"""Configs: the `{"configurable": ...}` dicts every test hands a saver or a graph.

`config` is what a caller hands a graph (a thread id, maybe a run id);
`saver_config` is what a test hands the saver's own methods (`put`,
`put_writes`, `get_tuple`...): a namespace always, a checkpoint id (the
parent of a put) and a fencing token when given.
"""

from __future__ import annotations

from typing import Any

from langgraph_fenced_sqlite.core.claims import TOKEN_KEY


def config(thread_id: str = "t", *, run_id: str | None = None) -> dict[str, Any]:
    """A graph's config for `thread_id`, with `run_id` in its metadata when given."""
    conf: dict[str, Any] = {"configurable": {"thread_id": thread_id}}
    if run_id:
        conf["metadata"] = {"run_id": run_id}
    return conf


def saver_config(
    thread_id: str = "t",
    *,
    ns: str = "",
    checkpoint_id: str | None = None,
    token: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A config for the saver's methods: `thread_id` and `ns`, then `extra`, then the
    checkpoint id and the fencing token (`__fence_token__`) when given."""
    conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns, **extra}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    if token is not None:
        conf[TOKEN_KEY] = token
    return {"configurable": conf}
