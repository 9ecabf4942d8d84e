"""Smoke-run each benchmark script with `--quick` so the scripts cannot rot.

Only that each exits 0 and prints its tables is checked: timings are the
scripts' business (they print PASS/MISS and never assert one).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

pytestmark = pytest.mark.subprocess

BENCH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"
)

EXPECTED = {
    "bench_saver.py": [
        "WRITES:",
        "READS:",
        "STATEMENTS per list()",
        "floor: raw sqlite3",
        "contract rows, raw sqlite3",
        "contract rows + our hop",
        "FencedSqliteSaver",
        "SqliteSaver",
        "AsyncSqliteSaver",
        "put_writes",
        "list(limit=10)",
        "result",
    ],
    # Where a put's time goes, statement by statement: the statements seen
    # through the engine's connection and its kept cursor (a put that runs
    # where the proxies do not look would print none of them).
    "bench_saver.py --profile": [
        "statement by statement",
        "BEGIN IMMEDIATE",
        "INSERT INTO checkpoints",
        "COMMIT",
        "cProfile",
    ],
    "bench_events.py": [
        "EVENT LATENCY:",
        "p95 commit -> receipt",
        "IDLE WATCHER:",
        "statements/s",
        "PRUNE:",
        "longest writer put during prune",
        "result",
    ],
    "bench_pages.py": [
        "WAL FRAMES per write",
        "STATEMENTS per write",
        "SqliteSaver",
        "put_writes 4KB +run_id",
        "RUN IDS:",
    ],
    "bench_layout.py": [
        "WAL FRAMES per put",
        "checkpoints B-TREES: frames per put",
        "wr-position",
        "4KB x16",
        "KEPT LAYOUT:",
    ],
    "bench_postgres.py": [
        "PUT: one checkpoint per call",
        "FencedPostgresSaver.put (fenced)",
        "PostgresSaver.put",
        "INVOKE: a 5-node chain",
        "result",
    ],
    "bench_calls.py": [
        "SQLite: ours / SqliteSaver",
        "PostgreSQL: ours / PostgresSaver",
        "update_state (one after another)",
        "stream up to the interrupt",
        "result",
    ],
    "bench_calls.py --fsync-ms 2": [
        "SQLite, every fsync +2 ms: ours / SqliteSaver",
        "update_state (one after another)",
        "result",
    ],
    # "POSTGRESQL" is a table's title, or the line saying why it was skipped.
    "bench_encryption.py": [
        "SQLITE: a 5-node chain invoke",
        "sealed (encryption=Encryption(key))",
        "POSTGRESQL",
        "result",
    ],
    "bench_growth.py": [
        "CHAT: 12 turns",
        "CHAT async: the same 12 turns through ainvoke",
        "AGENT LOOP: 6 turns",
        "bytes proven and compressed per turn",
        "history reads back equal",
        "POSTGRESQL CHAT",
        "result",
    ],
    "bench_growth.py --fsync-ms 2 --only chat": [
        "CHAT: 12 turns of ~1 KB each way, durability sync, every fsync +2 ms",
        "ours/InMemorySaver",
        "result",
    ],
    "bench_handoff.py": [
        "HAND-OFF: a run's end -> the other process's claim",
        "SQLite",
        "PostgreSQL",
        "events",
        "poll",
        "result",
    ],
    # "ours (PostgreSQL)" is a column, or the line saying why it was skipped.
    "bench_agent_server.py": [
        "AGENT SERVER runs.wait, as the client sees it",
        "AGENT SERVER run on the server",
        "ours (SQLite) / default",
        "ours, unfenced (SQLite) / default",
        "ours (PostgreSQL)",
        "chat, new thread per run",
        "5-node chain, one thread",
        "runs.wait less the queue wait",
        "result",
    ],
    # "POSTGRESQL:" is its table, or the line saying why it was skipped.
    "bench_threads.py": [
        "SQLITE: 1,000 threads x 10 checkpoints",
        'search_threads(metadata={"user": U}, limit=20)',
        'count_threads(metadata={"user": U})',
        "PUT PATH: SQLite put",
        "POSTGRESQL",
        "result",
    ],
    "bench_sweeper.py": [
        "SWEEPER: 200 due threads expired while 4 writers",
        "worst writer p99 ratio",
        "StoreBusy",
        "SQLite",
        "PostgreSQL",
        "result",
    ],
    "bench_syncs.py": [
        "ours syncs",
        "stock syncs",
        "contract/stock",
        "contract floor",
        "syncs per 5-node chain invoke",
        "syncs per 6-way fan-out invoke",
        "fsync +2 ms",
    ],
}

# Scripts that report figures with no target ("info"): nothing to PASS or MISS.
INFO_ONLY = {"bench_agent_server.py"}
# Scripts that need a module outside the core dependencies (the dev extra has them).
NEEDS = {"bench_agent_server.py": "langgraph_api"}  # langgraph-cli[inmem]


@pytest.fixture(scope="module")
def runs() -> Iterator[Callable[[str], subprocess.Popen[str]]]:
    """Start a script when its test asks for it; stop any left running at the end.

    Started on demand, not all at once: under pytest-xdist every worker that
    runs one of these tests makes this fixture, and one that started every
    script killed those whose tests ran elsewhere (or that `-k` left out).
    A killed `bench_postgres.py` never stops the server it started (its
    `atexit` does not run), so each such kill left a PostgreSQL running.
    A script still running at the end (it hung) gets SIGINT first, so its
    `atexit` cleanup runs, and SIGKILL only if that does not end it.
    """
    procs: dict[str, subprocess.Popen[str]] = {}

    def start(name: str) -> subprocess.Popen[str]:
        # `name` is a script, then any options it runs with besides `--quick`.
        script, *options = name.split()
        if name not in procs:
            procs[name] = subprocess.Popen(
                [sys.executable, os.path.join(BENCH, script), "--quick", *options],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=BENCH,
            )
        return procs[name]

    yield start
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_quick_run_prints_its_tables(
    runs: Callable[[str], subprocess.Popen[str]], script: str
) -> None:
    """Run `script --quick`: it exits 0 and prints every table with a result column."""
    needed = NEEDS.get(script.split()[0])
    if needed is not None and importlib.util.find_spec(needed) is None:
        pytest.skip(f"{script} needs {needed}")
    proc = runs(script)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, f"{script} failed:\n{out}\n{err}"
    missing = [text for text in EXPECTED[script] if text not in out]
    assert not missing, f"{script} did not print {missing}:\n{out}"
    if script.split()[0] in INFO_ONLY:
        assert "info" in out
    else:
        assert "PASS" in out or "MISS" in out
    # A PostgreSQL DSN handed to the SQLite store by mistake becomes a file
    # named after it in the script's directory (bench_handoff once measured
    # SQLite in its PostgreSQL row so).
    assert not [name for name in os.listdir(BENCH) if "dbname=" in name]
