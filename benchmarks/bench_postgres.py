"""FencedPostgresSaver against LangGraph's PostgresSaver, side by side on one throwaway server.

Starts its own PostgreSQL (`langgraph_fenced_sqlite.testing.postgres_server`,
fsync off: the figures are CPU and round trips, not disk) and times, in
interleaved rounds: a fenced `put` (ours, with a token) against their `put`,
and a 5-node graph invoke with each as the checkpointer (ours under a claim).
A fenced put is two round trips (BEGIN and its four statements in one
psycopg pipeline, then COMMIT); theirs is one (autocommit). Targets from
issue 13: put <= 1.2x, invoke <= 1.0x. Prints PASS/MISS; asserts nothing.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, TypedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import Table, fmt_time, interleave, median, paired_ratio, parse_args, verdict

from langgraph_fenced_sqlite.postgres import FencedPostgresSaver
from langgraph_fenced_sqlite.testing.postgres_server import start_server


def _checkpoint(parent: dict[str, Any] | None) -> dict[str, Any]:
    from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint

    base = empty_checkpoint() if parent is None else create_checkpoint(parent, None, 1)
    base["channel_values"] = {"messages": ["x" * 200], "count": 1}
    return base


def _put_chain(saver: Any, thread_id: str, token: int | None) -> Callable[[int], float]:
    """Return a contender: n puts of a growing chain on one thread (source "loop")."""
    state: dict[str, Any] = {"parent": None}

    def run(n: int) -> float:
        started = time.perf_counter()
        for _ in range(n):
            cp = _checkpoint(state["parent"])
            conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
            if state["parent"] is not None:
                conf["checkpoint_id"] = state["parent"]["id"]
            if token is not None:
                conf["__fence_token__"] = token
            saver.put({"configurable": conf}, cp, {"source": "loop", "step": 1}, {})
            state["parent"] = cp
        return time.perf_counter() - started

    return run


class _State(TypedDict):
    count: int


def _graph(checkpointer: Any) -> Any:
    from langgraph.graph import END, START, StateGraph

    builder = StateGraph(_State)
    names = [f"n{i}" for i in range(5)]
    for name in names:
        builder.add_node(name, lambda s: {"count": s["count"] + 1})
    builder.add_edge(START, names[0])
    for a, b in zip(names, names[1:], strict=False):
        builder.add_edge(a, b)
    builder.add_edge(names[-1], END)
    return builder.compile(checkpointer=checkpointer)


def _invokes(graph: Any, config: dict[str, Any]) -> Callable[[int], float]:
    def run(n: int) -> float:
        started = time.perf_counter()
        for _ in range(n):
            graph.invoke({"count": 0}, config)
        return time.perf_counter() - started

    return run


def main(argv: list[str] | None = None) -> int:
    """Run the tables; exit 0 whatever the figures (a MISS is a finding)."""
    args = parse_args("FencedPostgresSaver vs PostgresSaver", argv)
    from langgraph.checkpoint.postgres import PostgresSaver

    rounds = args.rounds or (3 if args.quick else 15)
    put_ops = 5 if args.quick else 100
    invoke_ops = 2 if args.quick else 20
    load = os.getloadavg()[0]
    server = start_server()
    try:
        dsn = server.fresh_dsn()
        print(f"PostgreSQL on 127.0.0.1:{server.port} (fsync off), load average {load:.2f}")
        print()
        with (
            FencedPostgresSaver.from_conn_string(dsn) as ours,
            FencedPostgresSaver.from_conn_string(dsn, notify=False) as quiet,
            PostgresSaver.from_conn_string(dsn) as theirs,
        ):
            ours.setup()
            theirs.setup()
            claim = ours.claim("put-ours", "bench", 3600)
            quiet_claim = quiet.claim("put-quiet", "bench", 3600)
            contenders = {
                "FencedPostgresSaver.put (fenced)": _put_chain(ours, "put-ours", claim.token),
                "  notify=False": _put_chain(quiet, "put-quiet", quiet_claim.token),
                "PostgresSaver.put": _put_chain(theirs, "put-theirs", None),
            }
            samples = interleave(contenders, rounds=rounds, ops=put_ops)
            base = samples["PostgresSaver.put"]
            table = Table("PUT: one checkpoint per call", ["saver", "per put", "ratio", "target"])
            for name, s in samples.items():
                ratio = paired_ratio(s, base)
                target = "" if name == "PostgresSaver.put" else f"<= 1.2x {verdict(ratio, 1.2)}"
                table.add(name, fmt_time(median(s)), f"{ratio:.2f}x", target)
            table.print()

            invoke_claim = ours.claim("invoke-ours", "bench", 3600)
            graphs = {
                "FencedPostgresSaver (claimed)": _invokes(_graph(ours), invoke_claim.config()),
                "PostgresSaver": _invokes(
                    _graph(theirs), {"configurable": {"thread_id": "invoke-theirs"}}
                ),
            }
            samples = interleave(graphs, rounds=rounds, ops=invoke_ops)
            base = samples["PostgresSaver"]
            table = Table(
                "INVOKE: a 5-node chain", ["checkpointer", "per invoke", "ratio", "target"]
            )
            for name, s in samples.items():
                ratio = paired_ratio(s, base)
                target = "" if name == "PostgresSaver" else f"<= 1.0x {verdict(ratio, 1.0)}"
                table.add(name, fmt_time(median(s)), f"{ratio:.2f}x", target)
            table.print()

        print("result: done (figures, not assertions)")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
