"""The calls a LangGraph app makes, ours against the stock saver, on both stores, in one run.

`bench_saver.py` and `bench_postgres.py` time the saver's own methods and a
plain chain; this times what an app built on a graph calls, on a graph with
what real apps have (the importers' source graph of `tests/support/graphs.py`:
a fan-out with `Send`, a subgraph that interrupts, messages), compiled with
each saver and run without a claim, as a user who only swaps the class runs it:

- `get_state`, `get_state(subgraphs=True)`, `get_state_history` (a thread
  waiting at the interrupt: 4 checkpoints, all of them);
- `update_state`, one after another on one thread (LangGraph writes, then
  puts, from the caller's thread);
- invoke up to the interrupt, then the resume (`Command(resume=...)`);
- `stream` of a whole run up to the interrupt.

Each row interleaves ours and the stock saver's (`_common.interleave`), each
call on fresh threads where it writes, and prints the ratio of medians
(ours / stock) with a target of <= 1.0x: an app should never get slower for
the swap. The hand-run sweep this grew from found three slow paths, since
fixed: unfenced writes on PostgreSQL took six round trips; an interrupt's
write waited for a put that never comes; `update_state`'s write waited for
its own caller's put.

SQLite runs in a scratch directory (WAL, synchronous=FULL for both), and
PostgreSQL on a server the script starts (fsync off, as `bench_postgres.py`).
`--fsync-ms D` runs the SQLite table only, in a child process whose every
fsync is D ms slower (`fsync_shim.py`, as `bench_syncs.py` does), as on a
real SSD or a cloud volume: the stock savers sync once per call, we once per
step. Prints PASS/MISS; asserts nothing.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
)

import fsync_shim
from _common import (
    Table,
    fmt_time,
    interleave,
    median,
    paired_ratio,
    parse_args,
    scratch_dir,
    verdict,
)
from support.configs import config as cfg
from support.graphs import build_source_graph

from langgraph_fenced_sqlite import FencedSqliteSaver
from langgraph_fenced_sqlite.postgres import FencedPostgresSaver
from langgraph_fenced_sqlite.testing.postgres_server import start_server

Call = Callable[[int], float]


class _App:
    """One saver's graph and the calls an app makes on it, each timing `n` of them."""

    def __init__(self, saver: Any, tag: str) -> None:
        from langchain_core.messages import HumanMessage

        self.graph = build_source_graph(saver)
        self.tag = tag
        self.fresh = itertools.count()
        self.start = {"messages": [HumanMessage(content="hi")]}
        # A thread waiting at the interrupt (4 checkpoints), for the reads.
        self.read = cfg(f"{tag}-read")
        self.graph.invoke(self.start, self.read)

    def _thread(self) -> dict[str, Any]:
        return cfg(f"{self.tag}-{next(self.fresh)}")

    def get_state(self, n: int) -> float:
        started = time.perf_counter()
        for _ in range(n):
            self.graph.get_state(self.read)
        return time.perf_counter() - started

    def get_state_subgraphs(self, n: int) -> float:
        started = time.perf_counter()
        for _ in range(n):
            self.graph.get_state(self.read, subgraphs=True)
        return time.perf_counter() - started

    def history(self, n: int) -> float:
        started = time.perf_counter()
        for _ in range(n):
            list(self.graph.get_state_history(self.read))
        return time.perf_counter() - started

    def update_state(self, n: int) -> float:
        config = self._thread()
        self.graph.invoke(self.start, config)
        started = time.perf_counter()
        for i in range(n):
            self.graph.update_state(config, {"items": [f"edit {i}"]})
        return time.perf_counter() - started

    def to_interrupt(self, n: int) -> float:
        threads = [self._thread() for _ in range(n)]
        started = time.perf_counter()
        for config in threads:
            self.graph.invoke(self.start, config)
        return time.perf_counter() - started

    def resume(self, n: int) -> float:
        from langgraph.types import Command

        threads = [self._thread() for _ in range(n)]
        for config in threads:
            self.graph.invoke(self.start, config)
        started = time.perf_counter()
        for config in threads:
            self.graph.invoke(Command(resume="yes"), config)
        return time.perf_counter() - started

    def stream(self, n: int) -> float:
        threads = [self._thread() for _ in range(n)]
        started = time.perf_counter()
        for config in threads:
            for _ in self.graph.stream(self.start, config):
                pass
        return time.perf_counter() - started


CALLS = {
    "get_state": "get_state",
    "get_state(subgraphs=True)": "get_state_subgraphs",
    "get_state_history (4 checkpoints)": "history",
    "update_state (one after another)": "update_state",
    "invoke up to the interrupt": "to_interrupt",
    "resume (Command)": "resume",
    "stream up to the interrupt": "stream",
}


@contextmanager
def _sqlite_pair(directory: str) -> Iterator[tuple[Any, Any]]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(os.path.join(directory, "stock.db"), check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    try:
        with FencedSqliteSaver(os.path.join(directory, "fenced.db")) as ours:
            yield ours, SqliteSaver(conn)
    finally:
        conn.close()


@contextmanager
def _postgres_pair(server: Any) -> Iterator[tuple[Any, Any]]:
    from langgraph.checkpoint.postgres import PostgresSaver

    with (
        FencedPostgresSaver.from_conn_string(server.fresh_dsn()) as ours,
        PostgresSaver.from_conn_string(server.fresh_dsn()) as theirs,
    ):
        ours.setup()
        theirs.setup()
        yield ours, theirs


def _table(store: str, ours: _App, theirs: _App, stock: str, rounds: int, ops: int) -> None:
    table = Table(
        f"{store}: ours / {stock}, per call ({rounds} interleaved rounds of {ops} calls)",
        ["call", "FencedSaver", stock, "ratio", "target"],
    )
    for label, method in CALLS.items():
        contenders: dict[str, Call] = {
            "ours": getattr(ours, method),
            "theirs": getattr(theirs, method),
        }
        for run in contenders.values():
            run(1)  # warm: prepared statements, the back-off's first judgement
        samples = interleave(contenders, rounds=rounds, ops=ops)
        ratio = paired_ratio(samples["ours"], samples["theirs"])
        table.add(
            label,
            fmt_time(median(samples["ours"])),
            fmt_time(median(samples["theirs"])),
            f"{ratio:.2f}x",
            f"<= 1.0x {verdict(ratio, 1.0)}",
        )
    table.print()


def main(argv: list[str] | None = None) -> int:
    """Print one table per store; exit 0 whatever the figures."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(
        "A LangGraph app's calls, ours vs the stock savers", argv, fsync_shim.add_option
    )
    slower = args.fsync_ms
    done = fsync_shim.rerun_slower(__file__, argv, slower)
    if done is not None:
        return done
    rounds = args.rounds or (2 if args.quick else 15)
    ops = 2 if args.quick else 6
    load = os.getloadavg()
    print(f"load average {load[0]:.2f}, cpus {os.cpu_count()}")
    print()
    disk = "" if slower is None else f", every fsync +{slower:g} ms"
    with scratch_dir("bench-calls-", base=args.dir, keep=args.keep) as directory:
        with _sqlite_pair(directory) as (ours, theirs):
            _table(f"SQLite{disk}", _App(ours, "o"), _App(theirs, "t"), "SqliteSaver", rounds, ops)
    if slower is not None:  # the benchmark's PostgreSQL never syncs (fsync off)
        print("result: done (figures, not assertions)")
        return 0
    server = start_server()
    try:
        with _postgres_pair(server) as (ours, theirs):
            _table("PostgreSQL", _App(ours, "o"), _App(theirs, "t"), "PostgresSaver", rounds, ops)
    finally:
        server.stop()
    load = os.getloadavg()
    print(f"load average at the end {load[0]:.2f}")
    print("result: done (figures, not assertions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
