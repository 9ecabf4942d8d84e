"""Conftest glue: FencedSqliteSaver as one more checkpointer in LangGraph's own tests.

`run_suite.py` copies this file into an extracted LangGraph sdist as
`tests/_lgfs_checkpointer.py` and appends one line to LangGraph's
`tests/conftest.py`::

    import tests._lgfs_checkpointer as _lgfs; _lgfs.install(globals())

`install` replaces LangGraph's `sync_checkpointer` / `async_checkpointer`
fixtures by ones with the same names whose parameters come from the
environment; every name LangGraph knows is passed on to LangGraph's own fixture
function, unchanged, and two names are ours:

- `fenced`: `with FencedSqliteSaver.from_conn_string(path) as saver`
- `fenced_aio`: `async with FencedSqliteSaver.from_conn_string(path) as saver`
- `fenced_pg` / `fenced_pg_aio`: the same with `FencedPostgresSaver` and its
  `setup()` / `asetup()`, on the server `LGFS_SUITE_PG_DSN` names (which
  `run_suite.py --store postgres` starts), each in a fresh schema

each on a fresh file (or schema), exactly as our README tells a user to open it. Our saver
keeps its own data-only serializer in strict mode too (LangGraph's conftest
would swap in `JsonPlusSerializer`, which would no longer test our saver).

Environment:
    LGFS_SUITE_SYNC: comma-separated sync checkpointer names (default `fenced`).
    LGFS_SUITE_ASYNC: comma-separated async checkpointer names (default `fenced_aio`).
    LGFS_SUITE_PG_DSN: the PostgreSQL server for `fenced_pg` / `fenced_pg_aio`.
    LGFS_SUITE_FENCE_RUNS: `1` opens every saver with `fence_runs=True`.
    LGFS_SUITE_ALL_TESTS: `1` keeps tests that use no checkpointer; by default
        they are deselected (they do not exercise a saver).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from langgraph_fenced_sqlite import FencedSqliteSaver

SYNC_NAME = "fenced"
ASYNC_NAME = "fenced_aio"
PG_SYNC_NAME = "fenced_pg"
PG_ASYNC_NAME = "fenced_pg_aio"
FIXTURES = ("sync_checkpointer", "async_checkpointer")


def _names(var: str, default: str) -> list[str]:
    names = [n.strip() for n in os.environ.get(var, default).split(",") if n.strip()]
    if not names:
        raise pytest.UsageError(f"{var} names no checkpointer")
    return names


def _unwrap(fixture: Any) -> Callable[..., Any]:
    """Return the plain function behind a `@pytest.fixture` object."""
    # pytest >= 8.4 wraps fixtures in FixtureFunctionDefinition; older ones
    # keep the function on `__pytest_wrapped__.obj`.
    getter = getattr(fixture, "_get_wrapped_function", None)
    if getter is not None:
        return getter()
    wrapped = getattr(fixture, "__pytest_wrapped__", None)
    if wrapped is not None:
        return wrapped.obj
    return fixture


def _fresh_pg_dsn() -> str:
    """A DSN whose connections use a new, empty schema of `LGFS_SUITE_PG_DSN`'s server."""
    import secrets

    import psycopg
    from psycopg.conninfo import make_conninfo

    server = os.environ.get("LGFS_SUITE_PG_DSN")
    if not server:
        raise pytest.UsageError("fenced_pg needs LGFS_SUITE_PG_DSN (run_suite.py --store postgres)")
    # Not uuid4: LangGraph's tests patch it (test_root_graph's ids count up
    # from zero), which made two tests' schemas the same name.
    name = f"t_{secrets.token_hex(8)}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    return make_conninfo(server, options=f"-c search_path={name}")


def _options() -> dict[str, Any]:
    """The savers' options: `fence_runs` under `LGFS_SUITE_FENCE_RUNS=1`."""
    return {"fence_runs": True} if os.environ.get("LGFS_SUITE_FENCE_RUNS") == "1" else {}


class _TempFile:
    """A fresh database path in its own directory, removed afterwards."""

    def __enter__(self) -> str:
        self._dir = tempfile.mkdtemp(prefix="lgfs-suite-")
        return os.path.join(self._dir, "checkpoints.db")

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)


def install(namespace: dict[str, Any]) -> None:
    """Replace the checkpointer fixtures in LangGraph's conftest `namespace`.

    Args:
        namespace: `globals()` of LangGraph's `tests/conftest.py`, after its
            own `sync_checkpointer` and `async_checkpointer` are defined.

    Raises:
        RuntimeError: The conftest no longer defines both fixtures (a new
            LangGraph layout: the harness must be updated, not silently run
            without our saver).
    """
    missing = [name for name in FIXTURES if name not in namespace]
    if missing:
        raise RuntimeError(f"LangGraph's conftest defines no {missing}; update the harness")
    theirs_sync = _unwrap(namespace["sync_checkpointer"])
    theirs_async = _unwrap(namespace["async_checkpointer"])

    @pytest.fixture(scope="function", params=_names("LGFS_SUITE_SYNC", SYNC_NAME))
    def sync_checkpointer(request: pytest.FixtureRequest) -> Iterator[Any]:
        if request.param == PG_SYNC_NAME:
            from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

            with FencedPostgresSaver.from_conn_string(_fresh_pg_dsn(), **_options()) as pg_saver:
                pg_saver.setup()
                yield pg_saver
            return
        if request.param != SYNC_NAME:
            yield from theirs_sync(request)
            return
        with _TempFile() as path, FencedSqliteSaver.from_conn_string(path, **_options()) as saver:
            yield saver

    @pytest.fixture(scope="function", params=_names("LGFS_SUITE_ASYNC", ASYNC_NAME))
    async def async_checkpointer(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
        if request.param == PG_ASYNC_NAME:
            from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

            async with FencedPostgresSaver.from_conn_string(
                _fresh_pg_dsn(), **_options()
            ) as pg_saver:
                await pg_saver.asetup()
                yield pg_saver
            return
        if request.param != ASYNC_NAME:
            async for checkpointer in theirs_async(request):
                yield checkpointer
            return
        with _TempFile() as path:
            async with FencedSqliteSaver.from_conn_string(path, **_options()) as saver:
                yield saver

    namespace["sync_checkpointer"] = sync_checkpointer
    namespace["async_checkpointer"] = async_checkpointer
    if "pytest_collection_modifyitems" in namespace:
        raise RuntimeError("LangGraph's conftest has its own collection hook; update the harness")
    namespace["pytest_collection_modifyitems"] = _keep_checkpointer_tests


def _keep_checkpointer_tests(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect tests that use no checkpointer fixture (unless LGFS_SUITE_ALL_TESTS=1)."""
    if os.environ.get("LGFS_SUITE_ALL_TESTS") == "1":
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        names = getattr(item, "fixturenames", ())
        (keep if any(name in names for name in FIXTURES) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
