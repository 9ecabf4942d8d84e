"""The contract suite's machinery: cases as plain functions, a registry, a runner.

Invariant: a case is a function `case(env)` that raises on a broken promise and
returns None otherwise. It reaches stores only through `env` (which opens
them on one file, with one manual clock, through the sync API or through the
async API behind a sync facade), so the same case checks every API, and
every store it opens is closed when the case ends, pass or fail. Which store
an env opens is its `store_factory`'s choice (default: `FencedSqliteSaver` on
`path`), so the same cases check every store.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..clock import ManualClock
from ..sqlite.saver import FencedSqliteSaver
from .storage import SqliteStorage, Storage

__all__ = [
    "CAPABILITIES",
    "CASES",
    "AsyncFacade",
    "Case",
    "ContractEnv",
    "ContractReport",
    "contract_case",
    "run_contract",
]

# What an environment can offer; a case that needs one it lacks is skipped
# by the runner (and reported as such, never as passed). "storage": the env
# can read and damage the store's value table below its API (`storage`).
CAPABILITIES = frozenset({"sibling", "reopen", "processes", "storage"})


@dataclass(frozen=True)
class Case:
    """One contract case: its number (by topic: docs/semantics.md §11), name, function."""

    number: int
    name: str
    fn: Callable[[ContractEnv], None]
    needs: frozenset[str]

    @property
    def id(self) -> str:
        """A stable id such as `08-claim_is_exclusive`."""
        return f"{self.number:02d}-{self.name}"


CASES: dict[str, Case] = {}


def contract_case(number: int, *, needs: Iterable[str] = ()) -> Callable[[Any], Any]:
    """Register a function as contract case `number` (docs/semantics.md §11).

    Args:
        number: The case number it (partly) checks; several functions may
            share a number.
        needs: Capabilities from `CAPABILITIES` the case requires.
    """
    wanted = frozenset(needs)
    unknown = wanted - CAPABILITIES
    if unknown:
        raise ValueError(f"needs: unknown capabilities {sorted(unknown)}")

    def register(fn: Callable[[ContractEnv], None]) -> Callable[[ContractEnv], None]:
        case = Case(number, fn.__name__.removeprefix("case_"), fn, wanted)
        if case.id in CASES:
            raise ValueError(f"contract case {case.id} registered twice")
        CASES[case.id] = case
        return fn

    return register


class _LoopThread:
    """One event loop on a daemon thread, shared by the async facades of an env."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


# Sync names whose async twin is not simply "a" + name.
_ASYNC_NAMES = {"wait_events": "await_events"}
# Async generators: collected into a list by the facade.
_ASYNC_ITERATORS = {"list": "alist"}


class AsyncFacade:
    """Expose a saver's async API under the sync names, for running cases.

    `facade.put(...)` runs `await saver.aput(...)` on the env's loop thread and
    returns its result; a method with no async twin is called as it is.
    """

    def __init__(self, saver: FencedSqliteSaver, loop: _LoopThread) -> None:
        self.saver = saver
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        saver = self.saver
        if name in _ASYNC_ITERATORS:
            agen = getattr(saver, _ASYNC_ITERATORS[name])

            async def collect(*args: Any, **kwargs: Any) -> list[Any]:
                return [item async for item in agen(*args, **kwargs)]

            return lambda *a, **k: iter(self._loop.run(collect(*a, **k)))
        twin = getattr(saver, _ASYNC_NAMES.get(name, "a" + name), None)
        if twin is not None and inspect.iscoroutinefunction(twin):
            return lambda *a, **k: self._loop.run(twin(*a, **k))
        return getattr(saver, name)


@dataclass
class ContractEnv:
    """One case's world: a fresh file, a manual clock, and the API under test.

    Attributes:
        path: The database file (in a fresh temporary directory).
        clock: The manual clock every store of this env shares by default.
        api: `"sync"` or `"async"` (stores come behind an `AsyncFacade`).
        capabilities: What this env offers (see `CAPABILITIES`).
        store_factory: Opens a store on the env's storage from `open`'s
            keyword arguments (None: `FencedSqliteSaver(path, **kwargs)`).
            Every store it opens shares one storage; each is closed with
            the env.
        storage: Reads and damages the stores' value table below their API,
            for the cases that need "storage" (None: the SQLite file at
            `path`'s, when `store_factory` is None).
    """

    path: str
    clock: ManualClock
    api: str = "sync"
    capabilities: frozenset[str] = CAPABILITIES
    store_factory: Callable[..., Any] | None = None
    storage: Storage | None = None
    _stores: list[Any] = field(default_factory=list)
    _loop: _LoopThread | None = None

    def __post_init__(self) -> None:
        if self.storage is None and self.store_factory is None:
            self.storage = SqliteStorage(self.path)

    def open(self, **kwargs: Any) -> Any:
        """Open a store on this env's storage (the env's clock unless given).

        Returns:
            The saver (sync api) or an `AsyncFacade` over it (async api).
        """
        kwargs.setdefault("clock", self.clock)
        if self.store_factory is None:
            saver = FencedSqliteSaver(self.path, **kwargs)
        else:
            saver = self.store_factory(**kwargs)
        self._stores.append(saver)
        if self.api == "sync":
            return saver
        if self._loop is None:
            self._loop = _LoopThread()
        return AsyncFacade(saver, self._loop)

    def reopen(self, store: Any, **kwargs: Any) -> Any:
        """Close `store` and open a new one on the same file."""
        raw(store).close()
        return self.open(**kwargs)

    def run_async(self, coro: Any) -> Any:
        """Run a coroutine on this env's loop thread (async api) or a fresh loop."""
        if self._loop is not None:
            return self._loop.run(coro)
        return asyncio.run(coro)

    def close(self) -> None:
        """Close every store this env opened, and its loop."""
        for saver in self._stores:
            saver.close()
        self._stores.clear()
        if self._loop is not None:
            self._loop.stop()
            self._loop = None


def raw(store: Any) -> FencedSqliteSaver:
    """Return the saver behind a store handed out by `ContractEnv.open`."""
    return store.saver if isinstance(store, AsyncFacade) else store


def make_env(directory: str | None = None, *, api: str = "sync", **kwargs: Any) -> ContractEnv:
    """Make an env on a new file in `directory` (a new temporary one if None)."""
    if api not in ("sync", "async"):
        raise ValueError(f"api: expected 'sync' or 'async', got {api!r}")
    directory = directory or tempfile.mkdtemp(prefix="lgfs-contract-")
    return ContractEnv(os.path.join(directory, "contract.db"), ManualClock(), api, **kwargs)


@dataclass
class ContractReport:
    """What `run_contract` found: passed, failed (with tracebacks) and skipped ids."""

    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether no case failed."""
        return not self.failed


def select_cases(capabilities: Iterable[str] = CAPABILITIES) -> Iterator[tuple[Case, str | None]]:
    """Yield every registered case with the reason it must be skipped, or None."""
    _load_cases()
    have = frozenset(capabilities)
    for case_id in sorted(CASES):
        case = CASES[case_id]
        missing = case.needs - have
        yield case, (f"needs {sorted(missing)}" if missing else None)


def run_contract(
    env_factory: Callable[[], ContractEnv] = make_env,
    *,
    only: Iterable[str] | None = None,
) -> ContractReport:
    """Run every registered case, each in a fresh env from `env_factory`.

    Args:
        env_factory: Makes an env (choose the api and capabilities there).
        only: Case ids or numbers (as strings) to run; all if None.
    """
    report = ContractReport()
    wanted = None if only is None else {str(x) for x in only}
    probe = env_factory()
    capabilities = probe.capabilities
    probe.close()
    for case, skip in select_cases(capabilities):
        if wanted is not None and case.id not in wanted and str(case.number) not in wanted:
            continue
        if skip:
            report.skipped[case.id] = skip
            continue
        env = env_factory()
        try:
            case.fn(env)
            report.passed.append(case.id)
        except Exception:  # noqa: BLE001 - the report carries the traceback
            report.failed[case.id] = traceback.format_exc()
        finally:
            env.close()
    return report


def _load_cases() -> None:
    # Importing the case modules registers their cases.
    from . import (  # noqa: F401
        cases_claims,
        cases_edges_data,
        cases_edges_fence,
        cases_edges_input,
        cases_edges_store,
        cases_encryption,
        cases_events,
        cases_expiry,
        cases_fencing,
        cases_history,
        cases_input,
        cases_runs,
        cases_search,
        cases_store,
        cases_values,
    )
