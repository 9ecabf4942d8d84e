"""LangGraph's own checkpointer conformance suite, against the async and the sync API.

The suite and its checks live in `tests/_conformance.py`, shared with the
PostgreSQL store's run (`tests/test_postgres_conformance.py`). The counts
appear in pytest's terminal summary.
"""

from __future__ import annotations

from typing import Any

import pytest
from _conformance import SyncPathMixin, run_conformance

from langgraph_fenced_sqlite import FencedSqliteSaver


class SyncPathSaver(SyncPathMixin, FencedSqliteSaver):
    """A `FencedSqliteSaver` whose async methods call their sync twins directly."""


@pytest.mark.parametrize("api", ["async", "sync"])
async def test_langgraph_conformance_full(
    api: str, tmp_path: Any, conformance_reports: dict[str, Any]
) -> None:
    """LangGraph's conformance suite passes 81 of 81 tests, all 8 capabilities, per API."""
    count = iter(range(100))

    def open_saver(api: str) -> FencedSqliteSaver:
        path = str(tmp_path / f"conformance-{next(count)}.db")
        return SyncPathSaver(path) if api == "sync" else FencedSqliteSaver(path)

    await run_conformance("FencedSqliteSaver", api, open_saver, conformance_reports)
