"""LangGraph's conformance suite against `FencedPostgresSaver` on a real server, both APIs."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from _conformance import SyncPathMixin, run_conformance

from langgraph_fenced_sqlite.postgres import FencedPostgresSaver


class SyncPathPgSaver(SyncPathMixin, FencedPostgresSaver):
    """A `FencedPostgresSaver` whose async methods call their sync twins directly."""


@pytest.mark.parametrize("api", ["async", "sync"])
async def test_postgres_conformance_full(
    api: str, pg_server: Any, conformance_reports: dict[str, Any]
) -> None:
    """LangGraph's conformance suite passes 81 of 81 tests, all 8 capabilities, per API."""
    conns: list[psycopg.Connection[Any]] = []

    def open_saver(api: str) -> FencedPostgresSaver:
        conn = psycopg.connect(pg_server.fresh_dsn(), autocommit=True)
        conns.append(conn)
        cls = SyncPathPgSaver if api == "sync" else FencedPostgresSaver
        saver = cls(conn)
        saver.setup()
        return saver

    try:
        await run_conformance("FencedPostgresSaver", api, open_saver, conformance_reports)
    finally:
        for conn in conns:
            conn.close()
