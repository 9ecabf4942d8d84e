"""LangGraph's own checkpointer conformance suite, against each store's async and sync API.

`langgraph.checkpoint.conformance` drives a saver only through its async
methods and detects capabilities by whether those are overridden. A store's
own async methods cover the async API. For the sync API, `SyncPathMixin`
overrides every async method with a direct call of its sync twin (no thread
hop, no engine `arun`), so the conformance tests exercise the sync code paths.
`FencedPostgresSaver` runs on a real server (the session's `pg_server`). The
counts appear in pytest's terminal summary (`conformance_reports`, conftest.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.checkpoint.conformance.report import CapabilityReport, ProgressCallbacks

from langgraph_fenced_sqlite import FencedSqliteSaver
from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

EXPECTED_TESTS = 81


class SyncPathMixin:
    """Route every async method the conformance suite calls to its sync twin.

    Each override counts its call in `sync_calls` and calls the sync method
    directly, so what is tested is the sync code path.
    """

    sync_calls: Counter[str]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Open the saver; the engine's async hop is made to fail loudly."""
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self.sync_calls: Counter[str] = Counter()

        async def no_hop(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("SyncPathSaver took the async path (engine.arun)")

        self._engine.arun = no_hop  # type: ignore[method-assign]

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        """Call `put`."""
        self.sync_calls["put"] += 1
        return self.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        """Call `put_writes`."""
        self.sync_calls["put_writes"] += 1
        return self.put_writes(config, writes, task_id, task_path)

    async def aget_tuple(self, config: Any) -> Any:
        """Call `get_tuple`."""
        self.sync_calls["get_tuple"] += 1
        return self.get_tuple(config)

    async def alist(
        self,
        config: Any,
        *,
        filter: dict[str, Any] | None = None,
        before: Any = None,
        limit: int | None = None,
    ) -> AsyncIterator[Any]:
        """Iterate `list`."""
        self.sync_calls["list"] += 1
        for item in self.list(config, filter=filter, before=before, limit=limit):
            yield item

    async def adelete_thread(self, thread_id: str) -> None:
        """Call `delete_thread`."""
        self.sync_calls["delete_thread"] += 1
        return self.delete_thread(thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Call `delete_for_runs`."""
        self.sync_calls["delete_for_runs"] += 1
        return self.delete_for_runs(run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Call `copy_thread`."""
        self.sync_calls["copy_thread"] += 1
        return self.copy_thread(source_thread_id, target_thread_id)

    async def aprune(
        self, thread_ids: Sequence[str], *, strategy: Any = "keep_latest", dry_run: bool = False
    ) -> Any:
        """Call `prune`."""
        self.sync_calls["prune"] += 1
        return self.prune(thread_ids, strategy=strategy, dry_run=dry_run)


def _summary(report: CapabilityReport) -> tuple[int, int, list[str]]:
    results = report.results.values()
    failures = [f for r in results for f in r.failures]
    return (
        sum(r.tests_passed for r in results),
        sum(r.tests_failed for r in results),
        failures,
    )


async def run_conformance(
    name: str,
    api: str,
    open_saver: Callable[[str], Any],
    conformance_reports: dict[str, Any],
) -> None:
    """Run the whole suite on savers from `open_saver(api)`, and assert 81 of 81 passed.

    `open_saver(api)` returns a new saver; for "sync" it must be a
    `SyncPathMixin` saver. Each is closed after its capability's tests.
    """
    savers: list[Any] = []
    hops = Counter[str]()

    async def factory() -> AsyncIterator[Any]:
        saver = open_saver(api)
        if api == "async":
            real_arun = saver._engine.arun

            async def counting_arun(method: Any, *args: Any, **kwargs: Any) -> Any:
                hops[method.__name__] += 1
                return await real_arun(method, *args, **kwargs)

            saver._engine.arun = counting_arun
            real_arun_call = getattr(saver._engine, "arun_call", None)
            if real_arun_call is not None:
                # PostgreSQL's hot calls run on its own async connections,
                # not the hop: counted under the same names (the op's).
                async def counting_arun_call(op: str, *args: Any, **kwargs: Any) -> Any:
                    hops[op] += 1
                    return await real_arun_call(op, *args, **kwargs)

                saver._engine.arun_call = counting_arun_call
        savers.append(saver)
        try:
            yield saver
        finally:
            saver.close()

    registered = checkpointer_test(name=f"{name} ({api} API)")(factory)
    report = await validate(registered, progress=ProgressCallbacks.quiet())
    conformance_reports[api if name == "FencedSqliteSaver" else f"{name} {api}"] = report.to_dict()
    report.print_report()  # visible with -s; the counts are in the terminal summary

    passed, failed, failures = _summary(report)
    assert failures == [], "\n".join(failures)
    assert (passed, failed) == (EXPECTED_TESTS, 0)
    assert {cap for cap, r in report.results.items() if r.detected} == {
        c.value for c in ALL_CAPABILITIES
    }
    assert all(r.passed is True for r in report.results.values())
    assert len(report.results) == 8
    assert report.conformance_level() == "FULL"
    # Each capability suite ran on its own saver, through the API under test.
    assert len(savers) == 8
    if api == "sync":
        calls = sum((s.sync_calls for s in savers if isinstance(s, SyncPathMixin)), Counter())
        assert set(calls) == {c.value for c in ALL_CAPABILITIES}, calls
    else:
        assert {"put", "put_writes", "get_tuple", "delete_thread"} <= set(hops)
        assert {"_list_page", "list"} & set(hops)  # the hop's, or PostgreSQL's native page
        assert {"delete_for_runs", "copy_thread", "prune"} <= set(hops)


# --- the runs: SQLite, then PostgreSQL ---------------------------------------------------


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


# --- the same suite on stores that seal every value (docs/semantics.md §7b) ---------------


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
async def test_conformance_with_encryption(
    store: str, tmp_path: Any, request: pytest.FixtureRequest, conformance_reports: dict[str, Any]
) -> None:
    """With `encryption=`, LangGraph's suite still passes 81 of 81 tests (async API)."""
    from langgraph_fenced_sqlite import Encryption

    ring = Encryption(b"k" * 32)
    count = iter(range(100))
    conns: list[psycopg.Connection[Any]] = []

    def open_saver(api: str) -> Any:
        if store == "sqlite":
            return FencedSqliteSaver(str(tmp_path / f"sealed-{next(count)}.db"), encryption=ring)
        conn = psycopg.connect(request.getfixturevalue("pg_server").fresh_dsn(), autocommit=True)
        conns.append(conn)
        saver = FencedPostgresSaver(conn, encryption=ring)
        saver.setup()
        return saver

    name = "FencedSqliteSaver" if store == "sqlite" else "FencedPostgresSaver"
    try:
        await run_conformance(f"{name}, encrypted,", "async", open_saver, conformance_reports)
    finally:
        for conn in conns:
            conn.close()
