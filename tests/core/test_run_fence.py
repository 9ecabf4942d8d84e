"""Runs fenced by their id (`fence_runs=True`), under real concurrency, on both stores.

Contract case 38 (`testing/cases_runs.py`) states the rules one run after
another; here runs really overlap, as a server bug, two replicas or a retried
job would make them: in threads of one process (both stores) and in two
processes (SQLite). What a user relies on is that the history never
interleaves: once a run has claimed the thread, nothing of an earlier run
lands, so the tokens of a thread's events never go down.
"""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from langgraph.graph import END, START, StateGraph
from support.processes import import_path, python, reap, wait_for_file
from typing_extensions import TypedDict

from langgraph_fenced_sqlite import FencedSqliteSaver, InvalidArgument, StaleClaim

RUNS = 6


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def graph(saver: Any, pause: Callable[[], None] = lambda: time.sleep(0.005)) -> Any:
    """Three steps, each pausing, so that runs started together overlap."""

    def step(name: str) -> Callable[[State], dict[str, Any]]:
        def run(state: State) -> dict[str, Any]:
            pause()
            return {"log": [name]}

        return run

    builder = StateGraph(State)
    for name in ("one", "two", "three"):
        builder.add_node(name, step(name))
    builder.add_edge(START, "one")
    builder.add_edge("one", "two")
    builder.add_edge("two", "three")
    builder.add_edge("three", END)
    return builder.compile(checkpointer=saver)


def config(run_id: str) -> Any:
    return {"configurable": {"thread_id": "t"}, "metadata": {"run_id": run_id}}


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A saver with `fence_runs=True` on a new file, or on a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        with FencedSqliteSaver(str(tmp_path / "runs.db"), fence_runs=True) as saver:
            yield saver
        return
    from psycopg_pool import ConnectionPool

    from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

    dsn = request.getfixturevalue("pg_dsn")
    with ConnectionPool(dsn, min_size=2, max_size=8, kwargs={"autocommit": True}) as pool:
        saver = FencedPostgresSaver(pool, fence_runs=True)
        saver.setup()
        yield saver
        saver.close()


def assert_never_interleaved(saver: Any) -> list[str]:
    """The thread's event tokens never go down; return the runs that claimed it, in order."""
    events = saver.events_after("t", 0, 100_000)
    tokens = [e.token for e in events if e.token is not None]
    assert tokens == sorted(tokens), "an earlier run wrote after a later one claimed the thread"
    return [e.data["run_id"] for e in events if e.kind == "run_started"]


def test_overlapping_runs_never_interleave_their_writes(store: Any) -> None:
    """Runs started together in threads: each completes or is fenced off, nothing interleaves."""
    app = graph(store)
    barrier = threading.Barrier(RUNS)
    outcomes: dict[str, str] = {}

    def run(run_id: str) -> None:
        barrier.wait(timeout=30)
        try:
            app.invoke({"log": [run_id]}, config(run_id))
            outcomes[run_id] = "completed"
        except StaleClaim:
            outcomes[run_id] = "fenced off"

    threads = [threading.Thread(target=run, args=(f"r{i}",)) for i in range(RUNS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(outcomes) == RUNS, outcomes
    claimed = assert_never_interleaved(store)
    assert sorted(claimed) == sorted(outcomes), "each run claimed the thread once"
    # The last run to claim was fenced off by nobody, and the state is whole.
    assert outcomes[claimed[-1]] == "completed", (claimed, outcomes)
    latest = store.get_tuple(config(claimed[-1]))
    assert latest.metadata["run_id"] == claimed[-1]


# A run of the graph above in a child process, with run id "early": its second
# step waits for `gate` once it has written `inside`. It prints how it ended.
CHILD = """
import sys, time
from pathlib import Path
sys.path[:0] = sys.argv[4].split(":")
from test_run_fence import config, graph
from langgraph_fenced_sqlite import FencedSqliteSaver, StaleClaim
path, inside, gate = sys.argv[1:4]
calls = []
def pause():
    calls.append(1)
    if len(calls) == 2:
        Path(inside).touch()
        while not Path(gate).exists():
            time.sleep(0.01)
with FencedSqliteSaver(path, fence_runs=True) as saver:
    try:
        graph(saver, pause).invoke({"log": ["early"]}, config("early"))
        print("completed", flush=True)
    except StaleClaim as exc:
        print("fenced off", exc.current_token, flush=True)
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_run_fenced_off_by_another_process_lands_nothing(tmp_path: Path) -> None:
    """A run paused in another process is fenced off by a later run; its next write fails."""
    path, inside, gate = str(tmp_path / "runs.db"), tmp_path / "inside", tmp_path / "gate"
    child = python(CHILD, path, str(inside), str(gate), import_path(__file__))
    try:
        wait_for_file(inside, child, "its run's second step")
        with FencedSqliteSaver(path, fence_runs=True) as saver:
            graph(saver).invoke({"log": ["late"]}, config("late"))
            gate.touch()
            out, err = child.communicate(timeout=60)
            assert child.returncode == 0, err
            late = saver.current_claim("t")
            assert late is not None
            assert out.split() == ["fenced", "off", str(late.token)], out + err
            assert assert_never_interleaved(saver) == ["early", "late"]
            # The early run's second step never landed: the state is the late run's.
            log = graph(saver).get_state(config("late")).values["log"]
            assert log.count("two") == 1 and log[-4:] == ["late", "one", "two", "three"], log
            assert saver.get_tuple(config("late")).metadata["run_id"] == "late"
    finally:
        reap(child)


def test_fence_runs_must_be_a_bool(tmp_path: Path, pg_dsn: str) -> None:
    """A wrong `fence_runs` is named, before the file is created or a connection used."""
    path = tmp_path / "no.db"
    with pytest.raises(InvalidArgument) as bad:
        FencedSqliteSaver(str(path), fence_runs="yes")  # type: ignore[arg-type]
    assert bad.value.argument == "fence_runs" and not path.exists()
    from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

    with pytest.raises(InvalidArgument) as bad:
        FencedPostgresSaver.from_conn_string(pg_dsn, fence_runs=1).__enter__()
    assert bad.value.argument == "fence_runs"
