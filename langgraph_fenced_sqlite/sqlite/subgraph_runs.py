"""Which subgraph namespaces of a SQLite thread belong to runs that are over.

Reads the facts `core/subgraph_runs.py` judges from, inside a transaction
the engine opened; decides nothing else.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any

from ..core.subgraph_runs import _Node, parents_of, past_namespaces_by
from . import schema

__all__ = ["parents", "past_namespaces"]


def parents(conn: sqlite3.Connection, thread_id: str, ns: str, cid: str) -> dict[str, Any]:
    """A checkpoint's metadata `parents` ({} if it is missing or unreadable)."""
    row = conn.execute(schema.CHECKPOINT_PARENTS, (thread_id, ns, cid)).fetchone()
    return parents_of(None if row is None else row[0])


def past_namespaces(
    conn: sqlite3.Connection, thread_id: str, nodes: Iterable[_Node], keep_runs: int
) -> set[str]:
    """Return the subgraph namespaces to remove: past runs beyond the `keep_runs` newest.

    A run is a past namespace whose enclosing namespace is not past itself;
    its nested namespaces go with it. Runs are ranked by their latest commit.

    Args:
        nodes: The thread's checkpoints (namespace, id, position), any order.
        keep_runs: How many past runs to keep (0: remove every past run).
    """
    return past_namespaces_by(lambda ns, cid: parents(conn, thread_id, ns, cid), nodes, keep_runs)
