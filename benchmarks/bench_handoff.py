"""How soon a queued "enqueue" invocation in another process starts once a run ends.

    python benchmarks/bench_handoff.py [--quick] [--rounds N] [--no-postgres]

A user double-texts: their second message reaches a worker process while
another process still runs the first. `FencedRunner(strategy="enqueue")`
makes the second wait; the figure here is the hand-off, from the moment the
first run begins to end (`end_run`, which logs its end event and releases
the claim in one commit) to the moment the waiting process holds the claim.

Two worker processes share one thread, each running a 3-node graph whose
middle node sleeps `HOLD` seconds (an LLM call's stand-in), then pausing
`REST` seconds before its next invocation, so that each finds the other's run
in progress and waits for it. Two waiting modes run side by side, in
alternating rounds, on each store (SQLite, and PostgreSQL on a server the
script starts, fsync off):

- `events` (the runner as shipped): a refused head waits on the thread's
  event log (SQLite's doorbell, PostgreSQL's NOTIFY) and tries again when a
  run's end lands;
- `poll`: the same runner with the event wait disabled (its tail read made to
  fail, which is its fallback): jittered exponential backoff from 10 ms to
  500 ms, what every release that logs nothing still gets.

Printed: hand-off p50 / p95 / max per mode and store, the events/poll ratio
of the p50s, and a target (p50 <= 5 ms, the wake-up target of issue 13).
Figures, not assertions: the script exits 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, TypedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import Table, fmt_time, parse_args, percentile, verdict  # noqa: E402

HOLD, REST = 0.2, 0.05
TARGET_P50 = 5e-3


class _State(TypedDict):
    count: int


def _graph(saver: Any) -> Any:
    from langgraph.graph import END, START, StateGraph

    def step(state: _State) -> dict[str, int]:
        return {"count": state["count"] + 1}

    def call(state: _State) -> dict[str, int]:
        time.sleep(HOLD)
        return {"count": state["count"] + 1}

    g = StateGraph(_State)
    g.add_node("before", step)
    g.add_node("call", call)
    g.add_node("after", step)
    g.add_edge(START, "before")
    g.add_edge("before", "call")
    g.add_edge("call", "after")
    g.add_edge("after", END)
    return g.compile(checkpointer=saver)


def _open(db: str) -> Any:
    if db.startswith("pg:"):  # a DSN (fresh_dsn's are key=value, not URLs)
        from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

        return FencedPostgresSaver.from_conn_string(db[3:])
    from langgraph_fenced_sqlite import FencedSqliteSaver

    return FencedSqliteSaver(db)


def worker(db: str, mode: str, n: int) -> None:
    """`--worker DB MODE N`: N enqueue invocations; print the turns (grant, end) as JSON."""
    from langgraph_fenced_sqlite import FencedRunner

    turns: list[tuple[str, float]] = []
    with _open(db) as saver:
        begin_run, end_run = saver.begin_run, saver.end_run

        def begin(*args: Any, **kwargs: Any) -> Any:
            claim = begin_run(*args, **kwargs)
            turns.append(("grant", time.time()))
            return claim

        def end(*args: Any, **kwargs: Any) -> Any:
            turns.append(("end", time.time()))
            return end_run(*args, **kwargs)

        saver.begin_run, saver.end_run = begin, end
        runner = FencedRunner(_graph(saver), saver, ttl=60)
        if mode == "poll":  # the fallback: no tail, so no event wait
            runner._tail = lambda thread_id: None  # type: ignore[method-assign]
        config = {"configurable": {"thread_id": f"handoff-{mode}"}}
        print("ready", flush=True)
        sys.stdin.readline()
        for _ in range(n):
            runner.invoke({"count": 0}, config, strategy="enqueue", wait_timeout=60)
            time.sleep(REST)
    print(json.dumps(turns), flush=True)


def _handoffs(db: str, mode: str, n: int) -> list[float]:
    """Run two workers on one thread; return each release-to-grant gap between them."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", db, mode, str(n)]
    procs = [
        subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    merged = []
    for who, proc in enumerate(procs):
        out, _ = proc.communicate(timeout=600)
        merged += [(when, kind, who) for kind, when in json.loads(out.strip().splitlines()[-1])]
    gaps, ended = [], None
    for when, kind, who in sorted(merged):
        if kind == "end":
            ended = (when, who)
        elif ended is not None:
            if ended[1] != who:  # the other process took over: a hand-off
                gaps.append(when - ended[0])
            ended = None
    return gaps


def main(argv: list[str] | None = None) -> int:
    """Measure and print the hand-off table."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        worker(argv[1], argv[2], int(argv[3]))
        return 0
    args = parse_args(
        "enqueue hand-off across processes",
        argv,
        lambda p: p.add_argument("--no-postgres", action="store_true", help="SQLite only"),
    )
    rounds = args.rounds or (1 if args.quick else 4)
    n = 3 if args.quick else 10
    stores: list[tuple[str, Any]] = []
    tmp = tempfile.mkdtemp(prefix="lgfs-handoff-")
    stores.append(("SQLite", lambda mode: os.path.join(tmp, f"{mode}.db")))
    server = None
    if not args.no_postgres:
        from langgraph_fenced_sqlite.testing.postgres_server import start_server

        server = start_server()
        dsns: dict[str, str] = {}

        def pg_db(mode: str) -> str:
            # One fresh schema per mode, set up here (not by two workers at once).
            if mode not in dsns:
                dsns[mode] = "pg:" + server.fresh_dsn()
                with _open(dsns[mode]) as saver:
                    saver.setup()
            return dsns[mode]

        stores.append(("PostgreSQL", pg_db))
    print(f"load average {os.getloadavg()[0]:.2f}, cpus {os.cpu_count()}, hold {HOLD}s")
    try:
        table = Table(
            f"HAND-OFF: a run's end -> the other process's claim ({rounds} rounds x 2 x {n} "
            "invokes, modes alternating)",
            ["store", "mode", "hand-offs", "p50", "p95", "max", "p50 events/poll", "target"],
        )
        for store, db_of in stores:
            gaps: dict[str, list[float]] = {"events": [], "poll": []}
            for r in range(rounds):
                for mode in ("events", "poll") if r % 2 == 0 else ("poll", "events"):
                    gaps[mode] += _handoffs(db_of(mode), mode, n)
            p50 = {m: percentile(g, 50) for m, g in gaps.items()}
            for mode, got in gaps.items():
                ratio = f"{p50['events'] / p50['poll']:.3f}" if mode == "events" else "-"
                goal = f"p50 <= 5 ms {verdict(p50[mode], TARGET_P50)}" if mode == "events" else ""
                table.add(
                    store,
                    mode,
                    len(got),
                    fmt_time(p50[mode]),
                    fmt_time(percentile(got, 95)),
                    fmt_time(max(got)),
                    ratio,
                    goal,
                )
        table.print()
    finally:
        if server is not None:
            server.stop()
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    print("result: done (figures, not assertions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
