"""Shared fixtures: every store a test opens is closed when it ends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from langgraph_fenced_sqlite import FencedSqliteSaver, ManualClock


@pytest.fixture
def clock() -> ManualClock:
    """A manual clock for the store under test."""
    return ManualClock()


@pytest.fixture
def db_path(tmp_path: Any) -> str:
    """A fresh database path in the test's temporary directory."""
    return str(tmp_path / "test.db")


@pytest.fixture
def open_store(db_path: str, clock: ManualClock) -> Iterator[Any]:
    """Open stores on `db_path` (with the test's clock); all are closed at teardown."""
    stores: list[FencedSqliteSaver] = []

    def opener(path: str | None = None, **kwargs: Any) -> FencedSqliteSaver:
        kwargs.setdefault("clock", clock)
        store = FencedSqliteSaver(path or db_path, **kwargs)
        stores.append(store)
        return store

    yield opener
    for store in stores:
        store.close()


@pytest.fixture
def store(open_store: Any) -> FencedSqliteSaver:
    """One store on a fresh file."""
    return open_store()
