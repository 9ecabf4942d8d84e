"""Each store's SQL module names each statement once.

Both stores keep all their SQL in one module (`sqlite/schema.py`, `postgres/sql.py`),
and a second assignment of a name silently replaces the first for every
caller (ruff does not flag it): two branches once each added a
`READ_SNAPSHOT`, and the later one turned every one-round-trip read into two.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "langgraph_fenced_sqlite"


@pytest.mark.parametrize(
    "module", ["sqlite/schema.py", "postgres/sql.py", "postgres/sql_functions.py"]
)
def test_every_statement_name_is_assigned_once(module: str) -> None:
    """No module-level name of a store's SQL module is assigned twice."""
    tree = ast.parse((PACKAGE / module).read_text())
    names = Counter(
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    )
    assert [name for name, n in names.items() if n > 1] == []
