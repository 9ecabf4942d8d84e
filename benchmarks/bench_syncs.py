"""Benchmark: disk syncs and time per graph invocation, ours vs LangGraph's SQLite savers.

    python benchmarks/bench_syncs.py [--invokes 100] [--rounds 5] [--delays 0,2] [--quick]

Two graphs, each invoked with durability "sync": a chain of 5 nodes, and a
6-way fan-out (one node sends to six branches that run in one superstep,
then a join). Each runs through `invoke` on `FencedSqliteSaver` and on
`SqliteSaver`, and through `ainvoke` on `FencedSqliteSaver` and on
`AsyncSqliteSaver`, every SQLite saver in WAL mode with `synchronous=FULL`.

A third contender, `floor`, is the least time any saver that makes one
durable commit per superstep could take: LangGraph's `InMemorySaver`, plus
one raw `BEGIN IMMEDIATE; INSERT; COMMIT` of the serialized checkpoint per
`put` on its own WAL file (`synchronous=FULL`; through one `asyncio.to_thread`
hop for `aput`), its writes riding on that commit. It checks nothing and
keeps nothing readable: it is a yardstick, not a saver. `ours/floor` is what
our checks, log and fencing cost on top; a target that the floor itself
misses cannot be met by any saver on that disk.

A fourth, `contract`, is the same with the rows CONTRACT.md promises in
place of the raw blob: `_common.ContractRows`, our own schema and statements
(the fence read, each write's rows and event, the checkpoint's row and
event) in one commit per put, with no checks and no reads. A target that it
misses cannot be met by any saver that keeps the contract on that disk.

Every sync the process makes is counted by an LD_PRELOAD shim around
`fsync`/`fdatasync` (`fsync_shim.py`, compiled here with `cc`), which can
also make each sync slower by a fixed delay: `--delays 0,2` measures once
on this disk as it is and once as if every sync took 2 ms longer, the way a
real SSD or a cloud volume behaves. Each delay runs in its own child process
(LD_PRELOAD is read at start); within it the contenders run slice by slice,
interleaved, and a ratio compares contenders of the same child, side by side.
Nothing is asserted: the targets print PASS or MISS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import AsyncExitStack, ExitStack
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fsync_shim  # noqa: E402
from _common import ContractRows  # noqa: E402

from langgraph_fenced_sqlite import FencedSqliteSaver  # noqa: E402

CHAIN, FANOUT = 5, 6
GRAPHS = ("chain", "fanout")
APIS = ("invoke", "ainvoke")
KINDS = ("ours", "stock", "floor", "contract")
THREADS = 10


class State(TypedDict):
    """A counter, and the names of the nodes visited."""

    count: int
    trail: Annotated[list[str], operator.add]


def build(shape: str) -> StateGraph:
    """Return the `chain` or the `fanout` graph."""
    graph = StateGraph(State)
    if shape == "chain":
        names = [f"n{i}" for i in range(CHAIN)]
        for name in names:
            graph.add_node(name, lambda s, name=name: {"count": s["count"] + 1, "trail": [name]})
        graph.add_edge(START, names[0])
        for a, b in zip(names, names[1:], strict=False):
            graph.add_edge(a, b)
        graph.add_edge(names[-1], END)
        return graph
    graph.add_node("split", lambda s: {"trail": ["split"]})
    graph.add_node("branch", lambda s: {"trail": [f"b{s['count']}"]})
    graph.add_node("join", lambda s: {"count": len(s["trail"])})
    graph.add_edge(START, "split")
    graph.add_conditional_edges(
        "split", lambda s: [Send("branch", {"count": i, "trail": []}) for i in range(FANOUT)]
    )
    graph.add_edge("branch", "join")
    graph.add_edge("join", END)
    return graph


class FloorSaver(InMemorySaver):
    """The yardstick (module docstring): `InMemorySaver` plus one durable raw commit per put."""

    def __init__(self, path: str) -> None:
        """Keep checkpoints in memory; commit each put's checkpoint to `path` too."""
        super().__init__()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("CREATE TABLE IF NOT EXISTS c (k INTEGER PRIMARY KEY, v BLOB)")
        self._lock = threading.Lock()
        self.commits = 0

    def close(self) -> None:
        """Close the file."""
        self._db.close()

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        """Store in memory, then commit the serialized checkpoint durably."""
        stored = super().put(config, checkpoint, metadata, new_versions)
        blob = self.serde.dumps_typed(checkpoint)[1]
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("INSERT INTO c (v) VALUES (?)", (blob,))
            self._db.execute("COMMIT")
            self.commits += 1
        return stored

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        """`put` through one thread hop, as any async SQLite saver pays."""
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)


class ContractFloor(InMemorySaver):
    """The contract yardstick (module docstring): `InMemorySaver` plus `ContractRows` per put.

    A task's writes wait for the put of the checkpoint that follows theirs
    and are stored in its commit, as ours ride on it; like every call the
    contract makes, `put_writes` returns only once its rows are durable. A
    write whose put does not take it within `WAIT_S` (the put came first, or
    none follows) commits on its own, and so does one that finds `MAX_WAITING`
    writes waiting already: as in `groupcommit`, writes waiting on LangGraph's
    small thread pool must leave a worker free for the put they wait for.
    """

    WAIT_S = 0.003
    MAX_WAITING = 4

    def __init__(self, path: str) -> None:
        """Keep checkpoints in memory; commit each put's contract rows to `path` too."""
        super().__init__()
        self.rows = ContractRows(path)
        # Keyed by (thread, namespace, checkpoint id): the writes waiting for
        # the put of that checkpoint's child, and the parents put already
        # (one entry per put: a benchmark's few thousand).
        self._pending: dict[tuple[Any, ...], list[Any]] = {}
        self._put_done: set[tuple[Any, ...]] = set()
        self._waiting = 0
        self._lock = threading.Lock()

    @property
    def commits(self) -> int:
        """Return how many commits were made."""
        return self.rows.commits

    def close(self) -> None:
        """Close the file."""
        self.rows.close()

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        """Store in memory, then return once the put that follows committed the writes' rows."""
        super().put_writes(config, writes, task_id, task_path)
        conf = config["configurable"]
        cells = [(channel, *self.serde.dumps_typed(value)) for channel, value in writes]
        if not cells:
            return
        key = (conf["thread_id"], conf.get("checkpoint_ns", ""), conf["checkpoint_id"])
        rows, done = (key[2], task_id, cells), threading.Event()
        with self._lock:
            queued = key not in self._put_done and self._waiting < self.MAX_WAITING
            if queued:
                self._pending.setdefault(key, []).append((rows, done))
                self._waiting += 1
        answered = queued and done.wait(self.WAIT_S)
        with self._lock:
            self._waiting -= queued
            if answered:
                return
            taken = queued and (rows, done) not in self._pending.get(key, [])
            if not taken:
                if queued:
                    self._pending[key].remove((rows, done))
                self.rows.commit(key[0], key[1], [rows], None, _run_id(config))
        if taken:  # a put took it just now: answered after its commit
            done.wait()

    async def aput_writes(
        self, config: Any, writes: Any, task_id: str, task_path: str = ""
    ) -> None:
        """`put_writes` through one thread hop (it waits for the put)."""
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        """Store in memory, then commit the contract's rows (its writes' first) durably."""
        stored = super().put(config, checkpoint, metadata, new_versions)
        conf = config["configurable"]
        key = (conf["thread_id"], conf.get("checkpoint_ns", ""), conf.get("checkpoint_id"))
        row = ContractRows.checkpoint_row(self.serde, checkpoint, metadata, key[2])
        with self._lock:
            writes = self._pending.pop(key, [])
            self.rows.commit(key[0], key[1], [w for w, _ in writes], row, _run_id(config))
            self._put_done.add(key)
        for _, done in writes:
            done.set()
        return stored

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        """`put` through one thread hop, as any async SQLite saver pays."""
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)


def _run_id(config: Any) -> str | None:
    run_id = config.get("metadata", {}).get("run_id")
    return None if run_id is None else str(run_id)


class Commits:
    """Counts the COMMIT statements a sqlite3 connection runs (its trace callback)."""

    def __init__(self) -> None:
        """Start at none."""
        self.count = 0

    def __call__(self, statement: str) -> None:
        """Count `statement` if it is a COMMIT."""
        if statement.lstrip()[:6].upper() == "COMMIT":
            self.count += 1


class Target:
    """One contender: its invoke callable, its time per slice, syncs and COMMITs counted.

    Syncs minus COMMITs is what SQLite's WAL checkpoints sync (the WAL, then
    the database, then the WAL's new header): upkeep every WAL saver pays
    about once per 2000 pages (ours) or 1000 (SQLite's default).
    """

    def __init__(
        self, api: str, shape: str, kind: str, call: Callable[..., Any], commits: Callable[[], int]
    ) -> None:
        """Keep what is measured and where its figures go."""
        self.api, self.shape, self.kind, self.call = api, shape, kind, call
        self.commits_so_far = commits
        self.done = 0
        self.slices: list[float] = []
        self.syncs = 0
        self.commits = 0

    def config(self) -> dict[str, Any]:
        """Return the next invocation's config (threads in turn)."""
        self.done += 1
        return {"configurable": {"thread_id": f"t{self.done % THREADS}"}}


INPUT: dict[str, Any] = {"count": 0, "trail": []}
WARMUP = {"configurable": {"thread_id": "warm-up"}}


def open_sync(stack: ExitStack, shape: str, kind: str, path: str) -> Target:
    """Open one sync contender on `path` (closed by `stack`)."""
    if kind == "ours":
        saver: Any = stack.enter_context(FencedSqliteSaver(path))
        commits = lambda: saver.commit_stats()["commits"]  # noqa: E731
    elif kind in ("floor", "contract"):
        saver = FloorSaver(path) if kind == "floor" else ContractFloor(path)
        stack.callback(saver.close)
        commits = lambda: saver.commits  # noqa: E731
    else:
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(path, check_same_thread=False)
        stack.callback(conn.close)
        saver = SqliteSaver(conn)
        saver.setup()  # sets journal_mode=WAL
        conn.execute("PRAGMA synchronous=FULL")
        counter = Commits()
        conn.set_trace_callback(counter)
        commits = lambda: counter.count  # noqa: E731
    app = build(shape).compile(checkpointer=saver)
    return Target("invoke", shape, kind, app.invoke, commits)


async def open_async(stack: AsyncExitStack, shape: str, kind: str, path: str) -> Target:
    """Async twin of `open_sync`."""
    if kind == "ours":
        saver: Any = await stack.enter_async_context(FencedSqliteSaver.from_conn_string(path))
        commits = lambda: saver.commit_stats()["commits"]  # noqa: E731
    elif kind in ("floor", "contract"):
        saver = FloorSaver(path) if kind == "floor" else ContractFloor(path)
        stack.callback(saver.close)
        commits = lambda: saver.commits  # noqa: E731
    else:
        import aiosqlite
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        conn = await aiosqlite.connect(path)
        stack.push_async_callback(conn.close)
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
        await conn.execute("PRAGMA synchronous=FULL")
        counter = Commits()
        await conn.set_trace_callback(counter)
        commits = lambda: counter.count  # noqa: E731
    app = build(shape).compile(checkpointer=saver)
    return Target("ainvoke", shape, kind, app.ainvoke, commits)


def slices(invokes: int, rounds: int) -> list[int]:
    """Split `invokes` into `rounds` slices as evenly as possible."""
    return [invokes // rounds + (1 if i < invokes % rounds else 0) for i in range(rounds)]


def _syncs() -> int:
    count = fsync_shim.sync_count()
    if count is None:
        raise SystemExit("bench_syncs: the fsync shim is not loaded in this process")
    return count


def measure_sync(invokes: int, rounds: int, tmp: str) -> list[Target]:
    """Run every sync contender slice by slice, interleaved; count syncs per slice."""
    with ExitStack() as stack:
        targets = [
            open_sync(stack, shape, kind, os.path.join(tmp, f"invoke-{shape}-{kind}.db"))
            for shape in GRAPHS
            for kind in KINDS
        ]
        for t in targets:
            t.call(dict(INPUT), WARMUP, durability="sync")
            t.done = 0
        for size in slices(invokes, rounds):
            for t in targets:
                before, committed = _syncs(), t.commits_so_far()
                started = time.perf_counter()
                for _ in range(size):
                    t.call(dict(INPUT), t.config(), durability="sync")
                t.slices.append((time.perf_counter() - started) / size)
                t.syncs += _syncs() - before
                t.commits += t.commits_so_far() - committed
    return targets


async def measure_async(invokes: int, rounds: int, tmp: str) -> list[Target]:
    """Async twin of `measure_sync` (one event loop for every contender)."""
    async with AsyncExitStack() as stack:
        targets = [
            await open_async(stack, shape, kind, os.path.join(tmp, f"ainvoke-{shape}-{kind}.db"))
            for shape in GRAPHS
            for kind in KINDS
        ]
        for t in targets:
            await t.call(dict(INPUT), WARMUP, durability="sync")
            t.done = 0
        for size in slices(invokes, rounds):
            for t in targets:
                before, committed = _syncs(), t.commits_so_far()
                started = time.perf_counter()
                for _ in range(size):
                    await t.call(dict(INPUT), t.config(), durability="sync")
                t.slices.append((time.perf_counter() - started) / size)
                t.syncs += _syncs() - before
                t.commits += t.commits_so_far() - committed
    return targets


def child(invokes: int, rounds: int) -> None:
    """Measure every contender in this (shim-loaded) process; print JSON figures."""
    with tempfile.TemporaryDirectory(prefix="bench-syncs-") as tmp:
        targets = measure_sync(invokes, rounds, tmp) + asyncio.run(
            measure_async(invokes, rounds, tmp)
        )
    out = {
        f"{t.api}/{t.shape}/{t.kind}": {
            "ms": statistics.fmean(t.slices) * 1e3,
            # Per-slice ratios need the slices of both contenders: kept whole.
            "slices": t.slices,
            "syncs": t.syncs / max(t.done, 1),
            "commits": t.commits / max(t.done, 1),
        }
        for t in targets
    }
    print(json.dumps(out))


def _ratio(ours: dict[str, Any], stock: dict[str, Any]) -> float:
    # The median of per-slice ratios: each slice of ours ran right next to
    # the same slice of the stock saver.
    return statistics.median(a / b for a, b in zip(ours["slices"], stock["slices"], strict=True))


def report(results: dict[float, dict[str, Any]], invokes: int, rounds: int) -> None:
    """Print one table per delay, then the targets with PASS/MISS."""
    print(
        f"{invokes} invocations per contender, durability 'sync', {rounds} interleaved slices; "
        f"Python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}; WAL, "
        "synchronous=FULL everywhere; syncs counted by an fsync/fdatasync shim\n"
    )
    stock_name = {"invoke": "SqliteSaver", "ainvoke": "AsyncSqliteSaver"}
    header = (
        f"{'fsync +ms':>9} {'api':<8} {'graph':<7} {'ours ms':>8} {'stock ms':>9} "
        f"{'floor ms':>9} {'ours/stock':>10} {'floor/stock':>11} {'contract/stock':>14} "
        f"{'ours/floor':>10} "
        f"{'ours syncs':>10} {'commits':>7} {'stock syncs':>11} {'commits':>7}"
    )
    print(header)
    print("-" * len(header))
    for delay, figures in results.items():
        for api in APIS:
            for shape in GRAPHS:
                ours, stock = figures[f"{api}/{shape}/ours"], figures[f"{api}/{shape}/stock"]
                floor = figures[f"{api}/{shape}/floor"]
                contract = figures[f"{api}/{shape}/contract"]
                print(
                    f"{delay:>9g} {api:<8} {shape:<7} {ours['ms']:>8.3f} {stock['ms']:>9.3f} "
                    f"{floor['ms']:>9.3f} {_ratio(ours, stock):>9.2f}x "
                    f"{_ratio(floor, stock):>10.2f}x {_ratio(contract, stock):>13.2f}x "
                    f"{_ratio(ours, floor):>9.2f}x "
                    f"{ours['syncs']:>10.2f} {ours['commits']:>7.2f} "
                    f"{stock['syncs']:>11.2f} {stock['commits']:>7.2f}"
                )
        print()
    print("targets (never asserted; stock = SqliteSaver for invoke, AsyncSqliteSaver for ainvoke):")
    base = results[min(results)]
    for api in APIS:
        syncs, commits = (base[f"{api}/chain/ours"][k] for k in ("syncs", "commits"))
        mark = "PASS" if syncs <= 7 else "MISS"
        print(
            f"  {api:<8} syncs per 5-node chain invoke <= 7: {mark} ({syncs:.2f}: "
            f"{commits:.2f} commits, {syncs - commits:.2f} WAL-checkpoint syncs)"
        )
        ours, stock = base[f"{api}/fanout/ours"]["syncs"], base[f"{api}/fanout/stock"]["syncs"]
        mark = "PASS" if ours <= stock * 2 / 3 else "MISS"
        print(
            f"  {api:<8} syncs per 6-way fan-out invoke <= 2/3 of {stock_name[api]}: {mark} "
            f"({ours:.2f} vs {stock:.2f}, {ours / stock:.2f}x)"
        )
    goals = {("invoke", 0.0): 0.9, ("invoke", 2.0): 0.65, ("ainvoke", 2.0): 0.5}
    for (api, delay), goal in goals.items():
        if delay not in results:
            continue
        figures = results[delay]
        ratio = _ratio(figures[f"{api}/chain/ours"], figures[f"{api}/chain/stock"])
        floor = _ratio(figures[f"{api}/chain/floor"], figures[f"{api}/chain/stock"])
        contract = _ratio(figures[f"{api}/chain/contract"], figures[f"{api}/chain/stock"])
        mark = "PASS" if ratio <= goal else "MISS"
        below = (
            "; the floor misses it too"
            if floor > goal
            else "; the contract floor misses it too"
            if contract > goal
            else ""
        )
        print(
            f"  {api:<8} 5-node chain, fsync +{delay:g} ms: <= {goal}x {stock_name[api]}: "
            f"{mark} ({ratio:.2f}x; floor {floor:.2f}x, contract floor {contract:.2f}x{below})"
        )


def main(argv: list[str] | None = None) -> None:
    """Build the shim, measure each delay in a child process, print the report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--invokes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved slices")
    parser.add_argument("--delays", default="0,2", help="extra ms per sync, comma-separated")
    parser.add_argument("--quick", action="store_true", help="a tiny run (seconds)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    invokes, rounds = (6, 2) if args.quick else (args.invokes, args.rounds)
    if args.child:
        child(invokes, rounds)
        return
    if not fsync_shim.available():
        raise SystemExit("bench_syncs: needs Linux and a C compiler (cc) for the fsync shim")
    delays = [float(d) for d in args.delays.split(",") if d.strip()]
    results: dict[float, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-syncs-shim-") as shim_dir:
        lib = fsync_shim.build_shim(shim_dir)
        for delay in delays:
            done = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--child"]
                + ["--invokes", str(invokes), "--rounds", str(rounds)],
                env=fsync_shim.shim_env(lib, delay),
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                sys.stderr.write(done.stderr)
                raise SystemExit(f"bench_syncs: the child for delay {delay} ms failed")
            results[delay] = json.loads(done.stdout.strip().splitlines()[-1])
    report(results, invokes, rounds)


if __name__ == "__main__":
    main()
