"""Encryption at rest: a 5-node invoke with `encryption=` against the same without it, in one run.

Issue 36's target: a 5-node graph invoke on a store that seals every value
cell (AES-256-GCM, `Encryption`) costs at most 1.15x the same invoke on the
same store without it, SQLite and PostgreSQL, measured side by side
(`_common.interleave`: rounds in a rotated order, a ratio is the median of
same-round ratios).

The graph is a chain of 5 nodes; each appends a message of about 1 KB of
random words to a list channel (`operator.add`) and sets a small status
channel. Each invoke starts a new thread with a 1 KB input message, so
every round does the same work: 7 checkpoints and their writes, each
compressed then sealed (the value rows' new bytes, the pending writes), and
the reads LangGraph makes. Both contenders of a store share a process, a
connection kind and (SQLite) a disk: only the sealing differs. PostgreSQL
runs on a throwaway server with fsync off (`testing.postgres_server`), so
its figures are CPU and round trips.

Prints PASS/MISS; asserts nothing.
"""

from __future__ import annotations

import operator
import os
import random
import sys
import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from _common import (
    Table,
    describe_build,
    fmt_time,
    interleave,
    median,
    paired_ratio,
    parse_args,
    percentile,
    postgres_server,
    scratch_dir,
    verdict,
)
from langgraph.graph import START, StateGraph

from langgraph_fenced_sqlite import Encryption, FencedSqliteSaver

TARGET = 1.15
NODES = 5
MESSAGE_BYTES = 1024
KEY = os.urandom(32)
_WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima".split()


class State(TypedDict, total=False):
    """The chain's state: a growing list of messages and a status."""

    messages: Annotated[list[str], operator.add]
    status: str


def _message(rng: random.Random) -> str:
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < MESSAGE_BYTES:
        words.append(rng.choice(_WORDS))
    return " ".join(words)


def _chain(checkpointer: Any) -> Any:
    rng = random.Random(7)
    builder = StateGraph(State)
    previous = START
    for i in range(NODES):
        name = f"node{i}"

        def node(state: State, i: int = i) -> State:
            return {"messages": [_message(rng)], "status": f"step {i} of {NODES}"}

        builder.add_node(name, node)
        builder.add_edge(previous, name)
        previous = name
    return builder.compile(checkpointer=checkpointer)


def _contender(saver: Any) -> Callable[[int], float]:
    graph = _chain(saver)
    rng = random.Random(3)

    def run(n: int) -> float:
        inputs = [_message(rng) for _ in range(n)]
        start = time.perf_counter()
        for text in inputs:
            config = {"configurable": {"thread_id": uuid.uuid4().hex}}
            out = graph.invoke({"messages": [text]}, config)
        elapsed = time.perf_counter() - start
        assert len(out["messages"]) == NODES + 1, out  # the last invoke read back whole
        return elapsed

    return run


def _table(title: str, runs: dict[str, Callable[[int], float]], rounds: int, ops: int) -> str:
    for run in runs.values():
        run(2)  # warm: imports, caches, prepared statements
    samples = interleave(runs, rounds=rounds, ops=ops, collect=True)
    ratios = [a / b for a, b in zip(samples["sealed"], samples["clear"], strict=True)]
    ratio = paired_ratio(samples["sealed"], samples["clear"])
    table = Table(title, ["contender", "per invoke", "p25-p75 ratio", "target", "result"])
    table.add("clear (no encryption)", fmt_time(median(samples["clear"])), "", "", "")
    table.add(
        "sealed (encryption=Encryption(key))",
        fmt_time(median(samples["sealed"])),
        f"{percentile(ratios, 25):.2f}-{percentile(ratios, 75):.2f}",
        f"<= {TARGET}x",
        f"{ratio:.2f}x {verdict(ratio, TARGET)}",
    )
    table.print()
    return verdict(ratio, TARGET)


def sqlite_table(directory: str, rounds: int, ops: int) -> str:
    """Time the chain on two files, one sealed, one not; print the table."""
    with (
        FencedSqliteSaver(os.path.join(directory, "clear.db")) as clear,
        FencedSqliteSaver(
            os.path.join(directory, "sealed.db"), encryption=Encryption(KEY)
        ) as sealed,
    ):
        runs = {"clear": _contender(clear), "sealed": _contender(sealed)}
        return _table(f"SQLITE: a {NODES}-node chain invoke, new thread each", runs, rounds, ops)


def postgres_table(rounds: int, ops: int) -> str | None:
    """Time the chain on two databases, one sealed, one not; print the table (None: skipped)."""
    from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

    with postgres_server() as (server, why):
        if server is None:
            print(f"POSTGRESQL: skipped (no PostgreSQL server could be started: {why})")
            print()
            return None
        with (
            FencedPostgresSaver.from_conn_string(server.fresh_dsn()) as clear,
            FencedPostgresSaver.from_conn_string(
                server.fresh_dsn(), encryption=Encryption(KEY)
            ) as sealed,
        ):
            clear.setup()
            sealed.setup()
            runs = {"clear": _contender(clear), "sealed": _contender(sealed)}
            title = f"POSTGRESQL: a {NODES}-node chain invoke, new thread each (fsync off)"
            return _table(title, runs, rounds, ops)


def main(argv: list[str] | None = None) -> int:
    """Print both stores' tables; exit 0 whatever the figures."""
    args = parse_args("Encryption at rest: invoke cost, sealed vs clear", argv)
    rounds = args.rounds or (3 if args.quick else 30)
    ops = 1 if args.quick else 10
    print(describe_build())
    print(f"{rounds} interleaved rounds x {ops} invokes; messages ~{MESSAGE_BYTES} B")
    print()
    results = []
    with scratch_dir("bench-encryption-", base=args.dir, keep=args.keep) as directory:
        print()
        results.append(sqlite_table(directory, rounds, ops))
    pg = postgres_table(rounds, ops)
    if pg is not None:
        results.append(pg)
    print(f"result: {'PASS' if all(r == 'PASS' for r in results) else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
