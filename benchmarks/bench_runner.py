"""Benchmark: FencedRunner vs the bare graph on our saver vs SqliteSaver vs InMemorySaver.

    python benchmarks/bench_runner.py [--invokes 200] [--rounds 10] [--quick]

One 5-node graph, invoked N times (20 threads, round robin) per configuration,
with durability "sync" and "exit", through `invoke` and `ainvoke`, each
configuration on its own file in a temporary directory. The invocations run in
slices, every configuration's slice in turn, so that noise on a shared machine
spreads over all of them. The table shows milliseconds per invocation (mean,
and best slice), the ratios of the means to langgraph's `SqliteSaver`
(`AsyncSqliteSaver` for `ainvoke`) and to the bare graph on our saver, and,
for our saver, commits per invocation (counted at the store's one write path),
so the runner's overhead reads as "+2": one claim and one release commit.
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack, ExitStack
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

from langgraph_fenced_sqlite import FencedRunner, FencedSqliteSaver

THREADS = 20
NODES = 5
KINDS = ("runner", "ours", "sqlite", "memory")
LABELS = {
    "runner": "FencedRunner + FencedSqliteSaver",
    "ours": "graph + FencedSqliteSaver",
    "sqlite": "graph + SqliteSaver",
    "memory": "graph + InMemorySaver",
}


class State(TypedDict):
    """A counter, and the names of the nodes visited."""

    count: int
    trail: Annotated[list[str], operator.add]


def build() -> StateGraph:
    """Return a chain of NODES nodes, each bumping a counter."""
    graph = StateGraph(State)
    names = [f"n{i}" for i in range(NODES)]
    for name in names:
        graph.add_node(name, lambda s, name=name: {"count": s["count"] + 1, "trail": [name]})
    graph.add_edge(START, names[0])
    for a, b in zip(names, names[1:], strict=False):
        graph.add_edge(a, b)
    graph.add_edge(names[-1], END)
    return graph


class Commits:
    """The store's durable COMMITs since the last `reset` (group commit merges writes)."""

    def __init__(self, saver: FencedSqliteSaver) -> None:
        """Count `saver`'s COMMITs from now on."""
        self.saver = saver
        self.start = saver.commit_stats()["commits"]

    def reset(self) -> None:
        """Start counting again from zero."""
        self.start = self.saver.commit_stats()["commits"]

    def count(self) -> int:
        """Return the COMMITs made since the last reset."""
        return self.saver.commit_stats()["commits"] - self.start


def count_commits(saver: FencedSqliteSaver) -> Commits:
    """Count the store's durable COMMITs (one fsync each)."""
    return Commits(saver)


class Target:
    """One configuration, opened once: its invoke callable and commit counter."""

    def __init__(self, kind: str, durability: str, call: Any, counter: Commits | None) -> None:
        """Keep the configuration's invoke callable and commit counter."""
        self.kind, self.durability, self.call, self.counter = kind, durability, call, counter
        self.done = 0
        self.slices: list[float] = []  # seconds per invocation, one per slice

    def config(self) -> dict[str, Any]:
        """Return the next invocation's config (threads in turn)."""
        thread = self.done % THREADS  # round robin: each thread gets turn after turn
        self.done += 1
        return {"configurable": {"thread_id": f"t{thread}"}}

    def warmed_up(self) -> Target:
        """Forget the warm-up invocation (first-call costs are not what we compare)."""
        self.done = 0
        if self.counter is not None:
            self.counter.reset()
        return self

    def commits(self) -> float | None:
        """Return commits per invocation (None for other savers)."""
        return None if self.counter is None else self.counter.count() / self.done


INPUT = {"count": 0, "trail": []}
WARMUP = {"configurable": {"thread_id": "warm-up"}}


def open_sync(stack: ExitStack, kind: str, durability: str, path: str) -> Target:
    """Open one sync configuration on `path` (closed by `stack`)."""
    counter = None
    if kind == "memory":
        graph = build().compile(checkpointer=InMemorySaver())
    elif kind == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        graph = build().compile(
            checkpointer=stack.enter_context(SqliteSaver.from_conn_string(path))
        )
    else:
        saver = stack.enter_context(FencedSqliteSaver(path))
        counter = count_commits(saver)
        graph = build().compile(checkpointer=saver)
        if kind == "runner":
            return Target(kind, durability, FencedRunner(graph, saver).invoke, counter)
    return Target(kind, durability, graph.invoke, counter)


async def open_async(stack: AsyncExitStack, kind: str, durability: str, path: str) -> Target:
    """Async twin of `open_sync`."""
    counter = None
    if kind == "memory":
        graph = build().compile(checkpointer=InMemorySaver())
    elif kind == "sqlite":
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        saver = await stack.enter_async_context(AsyncSqliteSaver.from_conn_string(path))
        graph = build().compile(checkpointer=saver)
    else:
        saver = await stack.enter_async_context(FencedSqliteSaver.from_conn_string(path))
        counter = count_commits(saver)
        graph = build().compile(checkpointer=saver)
        if kind == "runner":
            return Target(kind, durability, FencedRunner(graph, saver).ainvoke, counter)
    return Target(kind, durability, graph.ainvoke, counter)


def slices(invokes: int, rounds: int) -> list[int]:
    """Split `invokes` into `rounds` slices as evenly as possible."""
    return [invokes // rounds + (1 if i < invokes % rounds else 0) for i in range(rounds)]


def measure_sync(invokes: int, rounds: int, tmp: str) -> list[Target]:
    """Open every sync configuration, then run them slice by slice, interleaved."""
    with ExitStack() as stack:
        targets = [
            open_sync(stack, kind, durability, os.path.join(tmp, f"sync-{durability}-{kind}.db"))
            for durability in ("sync", "exit")
            for kind in KINDS
        ]
        for t in targets:
            t.call(dict(INPUT), WARMUP, durability=t.durability)
            t.warmed_up()
        for size in slices(invokes, rounds):
            for t in targets:
                started = time.perf_counter()
                for _ in range(size):
                    t.call(dict(INPUT), t.config(), durability=t.durability)
                t.slices.append((time.perf_counter() - started) / size)
    return targets


async def measure_async(invokes: int, rounds: int, tmp: str) -> list[Target]:
    """Async twin of `measure_sync` (one event loop for every configuration)."""
    async with AsyncExitStack() as stack:
        targets = [
            await open_async(
                stack, kind, durability, os.path.join(tmp, f"async-{durability}-{kind}.db")
            )
            for durability in ("sync", "exit")
            for kind in KINDS
        ]
        for t in targets:
            await t.call(dict(INPUT), WARMUP, durability=t.durability)
            t.warmed_up()
        for size in slices(invokes, rounds):
            for t in targets:
                started = time.perf_counter()
                for _ in range(size):
                    await t.call(dict(INPUT), t.config(), durability=t.durability)
                t.slices.append((time.perf_counter() - started) / size)
    return targets


def report(results: dict[str, list[Target]], invokes: int, rounds: int) -> None:
    """Print the table: mean over all invocations, best slice, ratios side by side."""
    print(
        f"{invokes} invocations of a {NODES}-node graph per configuration ({THREADS} threads, "
        f"round robin), in {rounds} interleaved slice(s); Python {sys.version.split()[0]}, "
        f"SQLite {sqlite3.sqlite_version}; every SQLite saver in WAL mode, synchronous=FULL\n"
    )
    header = (
        f"{'api':<8} {'durability':<10} {'configuration':<34} {'ms/invoke':>9} "
        f"{'best':>7} {'vs SqliteSaver':>14} {'vs bare ours':>12} {'commits/invoke':>14}"
    )
    print(header)
    print("-" * len(header))
    for api, targets in results.items():
        for durability in ("sync", "exit"):
            row = {t.kind: t for t in targets if t.durability == durability}
            mean = {k: statistics.fmean(t.slices) for k, t in row.items()}
            for kind in KINDS:
                t = row[kind]
                label = LABELS[kind]
                if api == "ainvoke" and kind == "sqlite":
                    label = "graph + AsyncSqliteSaver"
                commits = t.commits()
                print(
                    f"{api:<8} {durability:<10} {label:<34} {mean[kind] * 1e3:>9.3f} "
                    f"{min(t.slices) * 1e3:>7.3f} {mean[kind] / mean['sqlite']:>13.2f}x "
                    f"{mean[kind] / mean['ours']:>11.2f}x "
                    f"{'' if commits is None else f'{commits:.2f}':>14}"
                )
            print()
    print("targets (never asserted: timings are this machine's):")
    for api, targets in results.items():
        for durability in ("sync", "exit"):
            row = {t.kind: t for t in targets if t.durability == durability}
            ours, theirs = (statistics.fmean(row[k].slices) for k in ("ours", "sqlite"))
            extra = (row["runner"].commits() or 0.0) - (row["ours"].commits() or 0.0)
            print(
                f"  {api:<8} {durability:<5} our saver <= SqliteSaver per invoke: "
                f"{'PASS' if ours <= theirs else 'MISS'} ({ours / theirs:.2f}x); "
                f"runner adds <= 2 commits: {'PASS' if extra <= 2 else 'MISS'} (+{extra:.2f})"
            )


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, measure, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--invokes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=10, help="interleaved slices")
    parser.add_argument("--quick", action="store_true", help="a tiny run (10 invokes, 2 slices)")
    args = parser.parse_args(argv)
    invokes, rounds = (10, 2) if args.quick else (args.invokes, args.rounds)
    with tempfile.TemporaryDirectory(prefix="bench-runner-") as tmp:
        results = {
            "invoke": measure_sync(invokes, rounds, tmp),
            "ainvoke": asyncio.run(measure_async(invokes, rounds, tmp)),
        }
    report(results, invokes, rounds)


if __name__ == "__main__":
    main()
