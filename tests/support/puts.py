"""Checkpoints put straight through a saver's `put`, without a graph.

`new_checkpoint` builds one (LangGraph's `empty_checkpoint`, with channel
values and any other field given); `put` stores one and returns its id;
`put_chain` stores a chain; `put_next` puts the next checkpoint of a chain as
LangGraph makes it (`create_checkpoint`) and returns it. Every argument a test
relies on is a parameter: the metadata's `source` decides whether a fenced put
checks its parent (`input`/`loop` do, docs/semantics.md §3), so each caller
says which it means.
"""

from __future__ import annotations

import uuid
from typing import Any

from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint

from langgraph_fenced_sqlite import Claim

from .configs import saver_config


def new_checkpoint(values: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """A fresh checkpoint (new id) holding `values` as its channel values, then `fields`."""
    cp: dict[str, Any] = dict(empty_checkpoint())
    if values is not None:
        cp["channel_values"] = dict(values)
    cp.update(fields)
    return cp


def put(
    saver: Any,
    thread_id: str = "t",
    *,
    parent: str | None = None,
    token: int | None = None,
    claim: Claim | None = None,
    ns: str = "",
    checkpoint: dict[str, Any] | None = None,
    new_id: str | None = None,
    values: dict[str, Any] | None = None,
    source: str = "loop",
    step: int = 0,
    metadata: dict[str, Any] | None = None,
    new_versions: dict[str, Any] | None = None,
    random_id: bool = False,
    **configurable: Any,
) -> str:
    """Put `checkpoint` (else a new one holding `values`) on `thread_id`; return its id.

    `parent` is the config's checkpoint id, `token` its fencing token (or
    `claim` fences it: the config is `claim.config(...)`), and `configurable`
    any other key of the config; the metadata is `source` and `step`, then
    `metadata`. A new checkpoint's id is `new_id`, else with `random_id` a
    uuid4 (random, so not in the order of the puts), else LangGraph's uuid6.
    """
    if checkpoint is None:
        checkpoint = new_checkpoint(values)
        if new_id is not None:
            checkpoint["id"] = new_id
        elif random_id:
            checkpoint["id"] = str(uuid.uuid4())
    if claim is not None:
        assert token is None and thread_id == claim.thread_id, "a claim fences its own thread"
        extra = {} if parent is None else {"checkpoint_id": parent}
        conf: Any = claim.config(checkpoint_ns=ns, **extra, **configurable)
    else:
        conf = saver_config(thread_id, ns=ns, checkpoint_id=parent, token=token, **configurable)
    meta = {"source": source, "step": step, **(metadata or {})}
    saver.put(conf, checkpoint, meta, new_versions or {})
    return str(checkpoint["id"])


def put_chain(
    saver: Any, thread_id: str, n: int, *, start: int = 0, parent: str | None = None
) -> list[str]:
    """Put `n` unfenced `loop` checkpoints, each the parent of the next, the first after
    `parent` (steps `start`, `start + 1`...); return their (random, uuid4) ids."""
    ids: list[str] = []
    for step in range(start, start + n):
        parent = put(saver, thread_id, parent=parent, step=step, random_id=True)
        ids.append(parent)
    return ids


def put_next(
    saver: Any,
    token: int | None,
    parent: dict[str, Any] | None = None,
    checkpoint: dict[str, Any] | None = None,
    thread_id: str = "t",
) -> Any:
    """Put `checkpoint`, else the child of checkpoint `parent` as LangGraph makes it
    (`create_checkpoint`), else a first one, under `token` (a `loop` step 1); return it."""
    cp = checkpoint or (
        empty_checkpoint() if parent is None else create_checkpoint(parent, None, 1)
    )
    extra = {} if parent is None else {"checkpoint_id": parent["id"]}
    config = saver_config(thread_id, token=token, **extra)
    saver.put(config, cp, {"source": "loop", "step": 1}, {})
    return cp


def put_value(saver: Any, thread_id: str = "t", value: Any = 0) -> Any:
    """Put an unfenced `update` checkpoint whose channel `v` holds `value`; return the
    config `saver.put` returned (the engine's tests hand it on to the next call)."""
    cp = new_checkpoint({"v": value})
    return saver.put(saver_config(thread_id), cp, {"source": "update", "step": 0}, {})
