"""Shared graphs and files for the operator tests: statuses, claims in hand, retention.

`build_graph` is a small agent: `step` -> `sub` (a subgraph) -> `ask` (an
`interrupt`), and `step` raises when the input says `boom`. `make_ops_file`
writes threads in every status through the real runner and LangGraph:

- `done`: ran, stopped at the interrupt, resumed and completed (idle);
- `waiting`: stopped at the interrupt (interrupted at `ask`);
- `broken`: its run raised (failed);
- `busy`: claimed live by `worker-9` for an hour (running);
- `old`: completed 40 days ago, by a store whose clock is 40 days behind (idle);
- `plain`: run by plain `graph.invoke`, no runner, no claim (idle).
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import START, StateGraph
from langgraph.types import Command, interrupt

from langgraph_fenced_sqlite import FencedRunner, FencedSqliteSaver, ManualClock
from langgraph_fenced_sqlite.core.checksums import checksum
from langgraph_fenced_sqlite.sqlite.schema import CHECKSUM_FUNCTION, MIGRATIONS

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
DAY = 86400.0


class State(TypedDict, total=False):
    """The agent's state."""

    items: Annotated[list[str], operator.add]
    count: int
    boom: bool


def _step(state: State) -> dict[str, Any]:
    if state.get("boom"):
        raise ValueError("the model call failed")
    return {"items": [f"step{state.get('count', 0)}"], "count": 1}


def build_graph(checkpointer: Any, **compile_kwargs: Any) -> Any:
    """Compile step -> sub(tag) -> ask (an interrupt) with `checkpointer` (and `compile_kwargs`)."""
    sub = StateGraph(State)
    sub.add_node("tag", lambda s: {"items": ["sub"]})
    sub.add_edge(START, "tag")
    graph = StateGraph(State)
    graph.add_node("step", _step)
    graph.add_node("sub", sub.compile())
    graph.add_node("ask", lambda s: {"items": [interrupt("approve?")]})
    graph.add_edge(START, "step")
    graph.add_edge("step", "sub")
    graph.add_edge("sub", "ask")
    return graph.compile(checkpointer=checkpointer, **compile_kwargs)


def config(thread_id: str) -> dict[str, Any]:
    """A plain config for `thread_id`."""
    return {"configurable": {"thread_id": thread_id}}


def make_ops_file(path: str) -> None:
    """Write the six threads described in the module docstring into `path`."""
    with FencedSqliteSaver(path, clock=ManualClock(time.time() - 40 * DAY)) as saver:
        runner = FencedRunner(build_graph(saver), saver, holder="worker-old")
        runner.invoke({"count": 0}, config("old"))
        runner.invoke(Command(resume="ok"), config("old"))
    with FencedSqliteSaver(path) as saver:
        graph = build_graph(saver)
        runner = FencedRunner(graph, saver, holder="worker-1")
        runner.invoke({"count": 0}, config("done"))
        runner.invoke(Command(resume="ok"), config("done"))
        runner.invoke({"count": 2}, config("waiting"))
        try:
            runner.invoke({"boom": True}, config("broken"))
        except ValueError:
            pass
        else:  # pragma: no cover - the node raises
            raise AssertionError("the broken run did not fail")
        graph.invoke({"count": 3}, config("plain"))
        graph.invoke(Command(resume="fine"), config("plain"))
        claim = saver.claim("busy", "worker-9", 3600)
        graph.invoke({"count": 4}, claim.config())


def file_fixtures(
    make: Callable[[str], None], master: str, copy: str, filename: str
) -> tuple[Any, Any]:
    """Return two fixtures: `master`, a file `make` writes once per module, and `copy`.

    `master` is for read-only use (under pytest-xdist it is made once per
    worker that runs the module, in that worker's own temporary directory);
    `copy` gives each test a private copy of it to change. Assign both in the
    test module, under the names given: `ops_master, ops = file_fixtures(...)`.
    """

    def made(tmp_path_factory: pytest.TempPathFactory) -> str:
        path = str(tmp_path_factory.mktemp(master) / filename)
        make(path)
        return path

    def copied(request: pytest.FixtureRequest, tmp_path: Any) -> str:
        path = str(tmp_path / filename)
        shutil.copyfile(request.getfixturevalue(master), path)
        return path

    made.__doc__ = f"The file `{make.__name__}` writes, made once (read-only use)."
    copied.__doc__ = f"A private copy of `{master}`, to change."
    return (
        pytest.fixture(scope="module", name=master)(made),
        pytest.fixture(name=copy)(copied),
    )


def until(predicate: Callable[[], Any]) -> None:
    """Wait until `predicate()` holds (another thread got somewhere): bounded, not timed."""
    for _ in range(3000):
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError("the other thread never got there")


@contextlib.contextmanager
def store_held(engine: Any) -> Iterator[None]:
    """Keep `engine` busy with a call of another thread until the block ends.

    Calls made meanwhile queue behind it, as behind a long commit.
    """
    gate, holding = threading.Event(), threading.Event()

    def hold(conn: Any) -> None:
        holding.set()
        gate.wait(30)

    blocker = threading.Thread(target=engine.run, args=("hold", hold))
    blocker.start()
    assert holding.wait(30)
    try:
        yield
    finally:
        gate.set()
        blocker.join(30)


def interrupt_when(predicate: Callable[[], Any]) -> threading.Thread:
    """Start a thread that sends this process a real SIGINT (Ctrl-C) once `predicate()` holds.

    A signal, not a raised exception: it ends a blocked wait in the main thread.
    """

    def run() -> None:
        until(predicate)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def put_writes_in_thread(saver: Any, config: Any, out: dict[str, Any]) -> threading.Thread:
    """Start `saver.put_writes(config, [("x", 1)], "task-1")` in a thread; its outcome
    (None or the exception) lands in `out["writes"]`."""

    def run() -> None:
        try:
            out["writes"] = saver.put_writes(config, [("x", 1)], "task-1")
        except Exception as exc:  # noqa: BLE001 - recorded for the assertions
            out["writes"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def lgfs(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real `lgfs` command in a subprocess (no terminal: nothing is asked)."""
    return subprocess.run(
        [sys.executable, "-m", "langgraph_fenced_sqlite", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def python(script: str, *args: str) -> subprocess.Popen[str]:
    """Start `python -c script args...` with pipes (a real other process)."""
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# --- the same threads in either store (tests/test_postgres_*.py compare the stores) ---------

# Checkpoint, task and run ids, and LangGraph's interrupt ids (32 hex digits, not all digits).
_UUID = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|\b(?=[0-9]*[a-f])[0-9a-f]{32}\b"
)
# A channel version: a counter, then a random suffix (`get_next_version`).
_VERSION = re.compile(r"\b(\d{32})\.[0-9.]+")


def same_ids(value: Any) -> Any:
    """Replace every id and random version suffix in `value` (nested, dataclasses too).

    Two stores given the same runs differ in these only: LangGraph and the
    runner draw them at random. Dataclasses (`Interrupt`, `CheckpointDiff`...)
    become their type's name and fields.
    """
    if isinstance(value, str):
        return _UUID.sub("<id>", _VERSION.sub(r"\1.<random>", value))
    if isinstance(value, dict):
        return {same_ids(k): same_ids(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [same_ids(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {"type": type(value).__name__, **same_ids(fields)}
    return value


def write_threads(saver: Any, clock: ManualClock) -> None:
    """Write threads in every status through the runner (as `make_ops_file` does into a file).

    `old` 40 days ago (its events below seq 4 compacted); then `done`
    (resumed to the end), `waiting` (at the
    interrupt), `broken` (its node raised), `plain` (no runner), `busy`
    (claimed live for an hour), `released` (claimed and released, nothing
    written) and `deleted` (written, then deleted: not a thread any more).
    Every run is durable per step ("sync"), so commits come in one order and
    their positions are the same in any store.
    """
    graph = build_graph(saver)
    runner = FencedRunner(graph, saver, holder="worker-1")
    runner.invoke({"count": 0}, config("old"), durability="sync")
    runner.invoke(Command(resume="ok"), config("old"), durability="sync")
    saver.compact_events("old", 4)  # its floor: 4
    clock.advance(40 * DAY)
    runner.invoke({"count": 0}, config("done"), durability="sync")
    runner.invoke(Command(resume="ok"), config("done"), durability="sync")
    clock.advance(5)
    runner.invoke({"count": 2}, config("waiting"), durability="sync")
    clock.advance(5)
    with pytest.raises(ValueError):
        runner.invoke({"boom": True}, config("broken"), durability="sync")
    graph.invoke({"count": 3}, config("plain"), durability="sync")
    graph.invoke(Command(resume="fine"), config("plain"), durability="sync")
    clock.advance(5)
    claim = saver.claim("busy", "worker-9", 3600)
    graph.invoke({"count": 4}, claim.config(), durability="sync")
    saver.release("released", saver.claim("released", "worker-2", 60).token)
    runner.invoke({"count": 5}, config("deleted"), durability="sync")
    saver.delete_thread("deleted")
    clock.advance(5)


# The tables of a version-3 file (before `thread_runs`), for `make_v3_file`.
_V3_TABLES = ("meta", "threads", "checkpoints", "writes", "events")


def make_v3_file(source: str, target: str) -> None:
    """Write `target` as a version-3 file holding `source`'s rows (WAL, as a store leaves it).

    Built from `MIGRATIONS[:3]` with the cells the current code writes (their
    encoding did not change since), as a version-3 store left them: an older
    file, for the tests of what migrates it and what must not.
    """
    conn = sqlite3.connect(target, isolation_level=None)
    conn.create_function(CHECKSUM_FUNCTION, -1, checksum, deterministic=True)
    conn.execute("PRAGMA journal_mode=wal")
    conn.execute("BEGIN")
    for step in MIGRATIONS[:3]:
        for statement in step:
            conn.execute(statement)
    conn.execute("PRAGMA application_id = 1279739475")
    conn.execute("PRAGMA user_version = 3")
    conn.execute("ATTACH DATABASE ? AS src", (source,))
    for table in _V3_TABLES:
        names = ", ".join(r[1] for r in conn.execute(f"PRAGMA main.table_info({table})"))
        conn.execute(f"DELETE FROM main.{table}")
        conn.execute(f"INSERT INTO main.{table} ({names}) SELECT {names} FROM src.{table}")
    conn.execute("COMMIT")
    conn.execute("DETACH DATABASE src")
    conn.close()


def user_version(path: str) -> int:
    """Return a file's `PRAGMA user_version` (its schema version), read-only."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


def follow_bound(monkeypatch: Any, seconds: float) -> None:
    """Let a write awaiting its step's put wait exactly `seconds` (whatever the disk's speed)."""
    from langgraph_fenced_sqlite.core import steps

    monkeypatch.setattr(steps, "FOLLOW_MIN_S", seconds)
    monkeypatch.setattr(steps, "FOLLOW_MAX_S", seconds)
    monkeypatch.setattr(steps, "CHEAP_COMMIT_S", 0.0)
