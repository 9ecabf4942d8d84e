"""Which subgraph namespaces of a thread belong to runs that are over: the rule.

Invariant: a namespace is judged *past* only when its enclosing namespace has
moved on: the checkpoint its latest checkpoint was written under (metadata
`parents`) is stored, and a newer checkpoint of the enclosing namespace was
committed after it. Anything this cannot tell (no `parents`, the parent
checkpoint not stored yet or any more, damaged metadata) is kept, so a
subgraph still running, or interrupted and waiting for its resume (its parent
has not moved on), is never judged past. Each store reads the facts; this
decides.

LangGraph names a subgraph's namespace `node:<task id>` (nested ones joined
by `|`), and each run of the node is a new task, so every past run leaves a
namespace behind that no later run reads again (time travel to an older
parent checkpoint excepted: that is what `max_subgraph_runs` gives up).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any, Protocol

__all__ = ["parents_of", "past_namespaces_by"]

# LangGraph's separator of nested namespaces (`langgraph.constants.NS_SEP`).
NS_SEP = "|"


class _Node(Protocol):
    @property
    def ns(self) -> str: ...
    @property
    def cid(self) -> str: ...
    @property
    def position(self) -> int: ...


def _parent_ns(ns: str) -> str:
    return ns.rsplit(NS_SEP, 1)[0] if NS_SEP in ns else ""


def parents_of(metadata_parents: Any) -> dict[str, Any]:
    """A checkpoint's metadata `parents` (JSON text, or already decoded); {} if unreadable."""
    parents = metadata_parents
    if isinstance(parents, str):
        try:
            parents = json.loads(parents)
        except ValueError:
            return {}
    return parents if isinstance(parents, dict) else {}


def past_namespaces_by(
    parents: Callable[[str, str], dict[str, Any]], nodes: Iterable[_Node], keep_runs: int
) -> set[str]:
    """`past_namespaces` for either store: `parents(ns, cid)` reads a checkpoint's
    metadata `parents` (`parents_of` of the stored value)."""
    latest: dict[str, _Node] = {}
    positions: dict[tuple[str, str], int] = {}
    for node in nodes:
        positions[(node.ns, node.cid)] = node.position
        if node.ns not in latest or node.position > latest[node.ns].position:
            latest[node.ns] = node
    own_past: set[str] = set()
    for ns, node in latest.items():
        if ns == "":
            continue
        outer = _parent_ns(ns)
        parent_id = parents(ns, node.cid).get(outer)
        if not isinstance(parent_id, str) or outer not in latest:
            continue
        parent_at = positions.get((outer, parent_id))
        # The parent checkpoint must be stored: a subgraph's first checkpoint
        # may commit before its parent's (LangGraph puts asynchronously).
        if parent_at is not None and latest[outer].position > parent_at:
            own_past.add(ns)

    def is_past(ns: str) -> bool:
        while ns:
            if ns in own_past:
                return True
            ns = _parent_ns(ns)
        return False

    past = {ns for ns in latest if ns and is_past(ns)}
    runs = [ns for ns in past if _parent_ns(ns) not in past]
    runs.sort(key=lambda ns: latest[ns].position, reverse=True)
    kept = set(runs[:keep_runs])
    return {ns for ns in past if not any(ns == r or ns.startswith(r + NS_SEP) for r in kept)}
