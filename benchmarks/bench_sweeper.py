"""The sweeper expiring many due threads while writers invoke graphs, on SQLite and PostgreSQL.

    python benchmarks/bench_sweeper.py [--quick] [--threads N] [--no-postgres]

A store holds `N` threads (10,000; 200 with `--quick`) of two checkpoints
each, last written two days ago, and the saver option
`Expiry(default_ttl=1 day, sweep_every=...)`: every one of them is due. Four
writer processes (each its own store on the file or database, as four
workers would be) invoke a 3-node graph on threads of their own, with
`durability="sync"`, and time every `put` (a commit). The run has three
phases of the same writers:

- `before`: the writers alone, for 20 seconds (1 with `--quick`);
- `sweeping`: a saver opened with the expiry option in this process; its
  sweeper thread (the saver's own, started by the option) expires the `N`
  due threads, one transaction per thread, while the writers go on; the
  phase ends when the last due thread is expired;
- `after`: the writers alone again.

Printed per store: how long the sweep took (threads/s), each phase's put
p50/p99 (all writers), and the worst writer's p99 during the sweep over its
own p99 with no sweeper (`before` and `after` pooled: machine drift hits
both sides alike), with the targets of issue 36: no writer sees `StoreBusy`
(PASS/MISS), and that ratio <= 2 (PASS/MISS). Figures, not assertions: the
script exits 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, TypedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import Table, fmt_time, parse_args, percentile, verdict  # noqa: E402

WRITERS = 4
TARGET_RATIO = 2.0
PHASES = ("before", "sweeping", "after")
DAY = 86400.0


class _State(TypedDict):
    count: int


def _graph(saver: Any) -> Any:
    from langgraph.graph import END, START, StateGraph

    def step(state: _State) -> dict[str, int]:
        return {"count": state["count"] + 1}

    g = StateGraph(_State)
    for name in ("a", "b", "c"):
        g.add_node(name, step)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    return g.compile(checkpointer=saver)


def _open(db: str, **kwargs: Any) -> Any:
    if db.startswith("pg:"):  # a DSN (fresh_dsn's are key=value, not URLs)
        from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

        return FencedPostgresSaver.from_conn_string(db[3:], **kwargs)
    from langgraph_fenced_sqlite import FencedSqliteSaver

    return FencedSqliteSaver.from_conn_string(db, **kwargs)


def writer(db: str, flags: str, me: int) -> None:
    """`--writer DB FLAGS ME`: say "ready", invoke through each phase (start/stop flag
    files); print the put latencies and `StoreBusy` count of each phase as JSON."""
    from langgraph_fenced_sqlite import StoreBusy

    out: dict[str, Any] = {}
    with _open(db) as saver:
        put = saver.put
        latencies: list[float] = []

        def timed_put(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return put(*args, **kwargs)
            finally:
                latencies.append(time.perf_counter() - started)

        saver.put = timed_put  # before compiling: LangGraph may use a copy of the saver
        graph = _graph(saver)
        graph.invoke({"count": 0}, {"configurable": {"thread_id": f"w{me}-warm"}})
        print("ready", flush=True)
        n = 0
        for phase in PHASES:
            while not os.path.exists(os.path.join(flags, f"start-{phase}")):
                time.sleep(0.002)
            latencies.clear()
            busy = 0
            stop = os.path.join(flags, f"stop-{phase}")
            while not os.path.exists(stop):
                config = {"configurable": {"thread_id": f"w{me}-{n % 25}"}}
                n += 1
                try:
                    graph.invoke({"count": 0}, config, durability="sync")
                except StoreBusy:
                    busy += 1
            out[phase] = {"puts": list(latencies), "busy": busy}
    print(json.dumps(out), flush=True)


def _populate(db: str, n: int) -> None:
    """Write `n` threads of two checkpoints each, two days ago by the store's clock."""
    from langgraph_fenced_sqlite import ManualClock
    from langgraph_fenced_sqlite.testing._helpers import put_chain

    clock = ManualClock(time.time() - 2 * DAY)
    with _open(db, clock=clock) as saver:
        if db.startswith("pg:"):
            saver.setup()
        for i in range(n):
            put_chain(saver, f"old-{i:06d}", 2)


def _run(db: str, n: int, hold: float) -> dict[str, Any]:
    """Run the three phases on `db`; return latencies per writer and phase, and the sweep."""
    from langgraph_fenced_sqlite import Expiry

    _populate(db, n)
    flags = tempfile.mkdtemp(prefix="lgfs-sweeper-flags-")
    cmd = [sys.executable, os.path.abspath(__file__), "--writer", db, flags]
    procs = [
        subprocess.Popen([*cmd, str(i)], stdout=subprocess.PIPE, text=True) for i in range(WRITERS)
    ]

    def flag(name: str) -> None:
        with open(os.path.join(flags, name), "w"):
            pass

    sweep: dict[str, Any] = {}
    try:
        for p in procs:  # each has imported, opened its store and invoked once
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        flag("start-before")
        time.sleep(hold)
        flag("stop-before")
        done = threading.Event()
        expired: list[Any] = []

        def on_expire(e: Any) -> None:
            expired.append(e)
            if len(expired) >= n:
                done.set()

        flag("start-sweeping")
        started = time.perf_counter()
        expiry = Expiry(default_ttl=DAY, sweep_every=0.5, on_expire=on_expire)
        with _open(db, expiry=expiry):
            done.wait(3600)
            sweep["seconds"] = time.perf_counter() - started
        sweep["expired"] = len(expired)
        time.sleep(0.2)  # the writers' last puts under the sweep land in this phase
        flag("stop-sweeping")
        flag("start-after")
        time.sleep(hold)
        flag("stop-after")
        reports = [
            json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in procs
        ]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return {"writers": reports, "sweep": sweep}


def main(argv: list[str] | None = None) -> int:
    """Measure and print the sweeper table."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--writer"]:
        writer(argv[1], argv[2], int(argv[3]))
        return 0

    def extra(p: Any) -> None:
        p.add_argument("--threads", type=int, default=None, help="due threads (default 10000)")
        p.add_argument("--no-postgres", action="store_true", help="SQLite only")

    args = parse_args("the sweeper under 4 writers", argv, extra)
    n = args.threads or (200 if args.quick else 10_000)
    hold = 1.0 if args.quick else 20.0
    tmp = tempfile.mkdtemp(prefix="lgfs-sweeper-")
    stores: list[tuple[str, Any]] = [("SQLite", lambda: os.path.join(tmp, "sweeper.db"))]
    server = None
    if not args.no_postgres:
        from langgraph_fenced_sqlite.testing.postgres_server import start_server

        server = start_server()
        stores.append(("PostgreSQL", lambda: "pg:" + server.fresh_dsn()))
    print(f"load average {os.getloadavg()[0]:.2f}, cpus {os.cpu_count()}, {n} due threads")
    try:
        table = Table(
            f"SWEEPER: {n} due threads expired while {WRITERS} writers invoke a 3-node graph "
            "(durability sync); put latency per phase",
            [
                "store",
                "sweep",
                "threads/s",
                "p50 before",
                "p99 before",
                "p50 sweeping",
                "p99 sweeping",
                "p99 after",
                "worst writer p99 ratio",
                "StoreBusy",
                "result",
            ],
        )
        for store, db_of in stores:
            got = _run(db_of(), n, hold)
            writers, sweep = got["writers"], got["sweep"]
            pooled = {ph: [x for w in writers for x in w[ph]["puts"]] for ph in PHASES}
            ratios = []
            for w in writers:
                alone = w["before"]["puts"] + w["after"]["puts"]
                ratios.append(percentile(w["sweeping"]["puts"], 99) / percentile(alone, 99))
            worst = max(ratios)
            busy = sum(w[ph]["busy"] for w in writers for ph in PHASES)
            seconds = sweep.get("seconds", float("nan"))
            ok = sweep.get("expired") == n
            table.add(
                store,
                f"{seconds:.2f}s" + ("" if ok else f" ({sweep.get('expired')}/{n} expired)"),
                f"{n / seconds:.0f}",
                fmt_time(percentile(pooled["before"], 50)),
                fmt_time(percentile(pooled["before"], 99)),
                fmt_time(percentile(pooled["sweeping"], 50)),
                fmt_time(percentile(pooled["sweeping"], 99)),
                fmt_time(percentile(pooled["after"], 99)),
                f"{worst:.2f}",
                busy,
                f"busy=0 {verdict(busy, 0)}; ratio<=2 {verdict(worst, TARGET_RATIO)}"
                + ("" if ok else " (sweep incomplete: MISS)"),
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
