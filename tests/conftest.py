"""Fixtures and hooks only: every store a test opens is closed when it ends.

Helpers live in `tests/support/` and are imported by name (`from support.files
import dump`); no test imports from here.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from support.waiting import follow_bound

from langgraph_fenced_sqlite import FencedSqliteSaver, ManualClock


def pytest_configure(config: pytest.Config) -> None:
    """Register tests/support/crash_dumps.py: a crashed worker's traceback in the summary.

    And hear Ctrl-C: a suite started in the background by a shell without job
    control (`pytest &` in a script, as CI wrappers do) inherits SIGINT
    ignored, and so would every process it starts, where Python then raises
    no KeyboardInterrupt: the tests that interrupt a wait with a real SIGINT,
    and those that end `lgfs events --follow` with one, would fail. A handler
    (not an ignore) becomes the default again in a child at exec, so the
    children get Python's KeyboardInterrupt too. Runs in each xdist worker.
    """
    from support import crash_dumps

    config.pluginmanager.register(crash_dumps, "lgfs-crash-dumps")
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def generous(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write awaiting its step's put may wait up to 5 s (it ends when the put arrives).

    For the tests of one commit per step (test_steps.py, test_postgres_steps.py):
    what they assert must not depend on the machine's speed.
    """
    follow_bound(monkeypatch, 5.0)


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


@pytest.fixture(params=["sqlite", "postgres"])
def either_store(request: pytest.FixtureRequest, open_store: Any) -> Any:
    """A store of each kind: the test runs on a SQLite file (the reference) and on
    PostgreSQL (a fresh schema of the session's server)."""
    if request.param == "sqlite":
        return open_store()
    return request.getfixturevalue("open_pg")()


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """Run `lgfs`'s `main()` in this process (the real parser, commands, emitter and
    converter), as a `CompletedProcess`. `$LGFS_PATH` is unset unless the test sets
    it; `env` sets variables for one call."""
    from langgraph_fenced_sqlite.cli.main import main

    monkeypatch.delenv("LGFS_PATH", raising=False)

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        with pytest.MonkeyPatch.context() as patch:
            for key, value in (env or {}).items():
                patch.setenv(key, value)
            code = main(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out, err)

    return run


# --- conformance counts in the terminal summary (tests/conformance/test_conformance.py) ---
# Under pytest-xdist each test runs in a worker process and the summary is printed by
# the controller, so a report travels on the test's report (`user_properties`, which
# xdist sends back), not in a module global that only the worker would see.

CONFORMANCE_PROPERTY = "langgraph_conformance_report"


@pytest.fixture
def conformance_reports(request: pytest.FixtureRequest) -> Iterator[dict[str, dict[str, Any]]]:
    """Collect LangGraph conformance reports (by API) for the terminal summary."""
    reports: dict[str, dict[str, Any]] = {}
    yield reports
    for api, report in reports.items():
        # As JSON text: what xdist sends back must be plain data.
        request.node.user_properties.append((CONFORMANCE_PROPERTY, json.dumps([api, report])))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print LangGraph conformance counts: tests passed/failed and capabilities, per API."""
    found: dict[str, dict[str, Any]] = {}
    for reports in terminalreporter.stats.values():
        for rep in reports:
            for name, value in getattr(rep, "user_properties", ()):
                if name == CONFORMANCE_PROPERTY:
                    api, report = json.loads(value)
                    found[api] = report
    if not found:
        return
    terminalreporter.section("LangGraph checkpoint conformance")
    for api, report in sorted(found.items()):
        results = report["results"].values()
        passed = sum(r["tests_passed"] for r in results)
        failed = sum(r["tests_failed"] for r in results)
        detected = sum(1 for r in results if r["detected"])
        caps_ok = sum(1 for r in results if r["detected"] and r["passed"] is True)
        terminalreporter.write_line(
            f"{api} API: {passed} of {passed + failed} passed, {failed} failed; "
            f"capabilities {caps_ok} of {len(report['results'])} passed "
            f"({detected} detected); level {report['conformance_level']}"
        )


# --- PostgreSQL: one throwaway server per test session (per xdist worker) ---------------


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    """A real PostgreSQL server started for this session, stopped at its end.

    Each pytest-xdist worker is its own session, so each starts its own
    server (own temp dir, own free port): workers share nothing.
    """
    from langgraph_fenced_sqlite.testing.postgres_server import start_server

    server = start_server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_dsn(pg_server: Any) -> str:
    """A DSN on a fresh, empty schema of the session's server."""
    return str(pg_server.fresh_dsn())


@pytest.fixture
def open_pg(pg_dsn: str, clock: ManualClock) -> Iterator[Any]:
    """Open set-up `FencedPostgresSaver`s on `pg_dsn` (the test's clock unless
    `clock=None`, the database's); every saver and connection is closed at teardown."""
    import psycopg

    from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

    opened: list[Any] = []

    def opener(dsn: str | None = None, **kwargs: Any) -> FencedPostgresSaver:
        kwargs.setdefault("clock", clock)
        conn = psycopg.connect(dsn or pg_dsn, autocommit=True)
        opened.append(conn)
        saver = FencedPostgresSaver(conn, **kwargs)
        opened.append(saver)
        saver.setup()
        return saver

    yield opener
    for item in reversed(opened):
        item.close()
