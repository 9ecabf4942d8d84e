"""Count what one durable write costs on disk: WAL frames and SQL statements.

Frames and statements do not depend on the machine's load, unlike timings:
every figure here is a count, measured side by side in one run for

* the floor: raw `sqlite3`, one row per `BEGIN IMMEDIATE ... COMMIT` into a
  table keyed `(thread_id, checkpoint_ns, checkpoint_id)`;
* LangGraph's `SqliteSaver`;
* `FencedSqliteSaver` (this tree), and, with `--against DIR`, the same saver
  from another source tree (e.g. `git archive` of an older commit), run in a
  child process with `DIR` first on `sys.path`.

A figure is the mean over `--ops` writes of one thread, after a warm-up, of
the WAL's growth in frames (automatic checkpoints off, the WAL truncated
first: every page a commit changes is one frame) and of the statements handed
to SQLite (trace callback; for ours, its connection's `execute` calls, since
the trace would count a trigger's run as a statement). Writes: `put` with a
256 B, 2 KB and 4 KB channel value, a `put` whose config carries a run id (as
the runner's and LangGraph's API server's do), and `put_writes` of one 4 KB
or 256 B write, with and without a run id.

Run `python benchmarks/bench_pages.py` (seconds); `--quick` for fewer writes.
The last table checks that a run id costs a write no page of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import Chain, Table, connect_floor, text_value, verdict  # noqa: E402

OPS = (
    "put 256B",
    "put 2KB",
    "put 4KB",
    "put 4KB +run_id",
    "put_writes 4KB",
    "put_writes 256B",
    "put_writes 4KB +run_id",
)
SIZES = {"put 256B": 256, "put 2KB": 2048, "put 4KB": 4096, "put 4KB +run_id": 4096}


class _Counting:
    """A connection proxy counting the statements Python hands SQLite (`execute` calls).

    SQLite's trace callback would count each trigger program run as one more
    statement (with the outer statement's text): not a call from Python.
    """

    def __init__(self, conn: Any, twin: _Counting | None = None) -> None:
        self._conn = conn
        self._twin = twin
        self.count = 0

    def _add(self, n: int) -> None:
        if self._twin is not None:
            self._twin._add(n)
        else:
            self.count += n

    def execute(self, sql: str, *args: Any) -> Any:
        self._add(1)
        return self._conn.execute(sql, *args)

    def executemany(self, sql: str, rows: Any) -> Any:
        rows = list(rows)
        self._add(len(rows))
        return self._conn.executemany(sql, rows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def measure(
    conn: sqlite3.Connection, path: str, op: Callable[[], object], n: int, owner: Any = None
) -> tuple[float, float]:
    """Return `(WAL frames, statements)` per `op()`, the mean over `n` calls after a warm-up.

    Args:
        owner: For our saver, its engine: statements are counted as the
            `execute` calls on its connection and on the cursor it keeps for
            writes (`_cursor`). Otherwise the trace callback counts.
    """
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    for _ in range(20):
        op()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    seen: list[str] = []
    counting = _Counting(conn)
    if owner is not None:
        kept = owner._cursor
        owner._conn = counting  # private, on purpose: diagnostic only
        owner._cursor = _Counting(kept, twin=counting)
    else:
        conn.set_trace_callback(seen.append)
    try:
        for _ in range(n):
            op()
    finally:
        if owner is not None:
            owner._conn, owner._cursor = conn, kept
        else:
            conn.set_trace_callback(None)
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    frames = (os.path.getsize(path + "-wal") - 32) / (page + 24)
    statements = counting.count if owner is not None else len(seen)
    if not statements:
        # A write runs at least its BEGIN and COMMIT: the count missed them
        # (the engine runs statements somewhere the proxies do not look).
        raise SystemExit("bench_pages: no statement was counted; see measure()'s `owner`")
    return frames / n, statements / n


def saver_ops(saver: Any, run_id: str) -> dict[str, Callable[[], object]]:
    """Return one write of each kind in `OPS` on `saver`, each on its own thread."""
    ops: dict[str, Callable[[], object]] = {}
    for name in OPS:
        size = SIZES.get(name, 4096 if "4KB" in name else 256)
        chain = Chain({"thread_id": name, "checkpoint_ns": ""}, text_value(size))
        extra = {"metadata": {"run_id": run_id}} if "run_id" in name else {}
        if name.startswith("put_writes"):
            chain.prepare(1)
            chain.advance(saver.put(*chain.next()))
            writes = [("state", {"text": text_value(size, seed=1)})]

            def write(chain: Chain = chain, writes: Any = writes, extra: Any = extra) -> object:
                config = {**chain.latest_config(), **extra}
                return saver.put_writes(config, writes, str(uuid.uuid4()))

            ops[name] = write
        else:

            def put(chain: Chain = chain, extra: dict[str, Any] = extra) -> object:
                chain.prepare(1)
                config, checkpoint, metadata, versions = chain.next()
                if extra:
                    config = {**config, **extra}
                    metadata = {**metadata, **extra["metadata"]}
                chain.advance(saver.put(config, checkpoint, metadata, versions))
                return None

            ops[name] = put
    return ops


def run_fenced(d: str, n: int) -> dict[str, list[float]]:
    """Measure `FencedSqliteSaver` (whichever one `sys.path` finds first)."""
    from langgraph_fenced_sqlite import FencedSqliteSaver

    path = os.path.join(d, "fenced.db")
    saver = FencedSqliteSaver(path)
    try:
        engine = saver._engine  # private, on purpose: the saver's own connection
        return {
            k: list(measure(engine._conn, path, op, n, owner=engine))
            for k, op in saver_ops(saver, "r1").items()
        }
    finally:
        saver.close()


def run_stock(d: str, n: int) -> dict[str, list[float]]:
    """Measure LangGraph's `SqliteSaver` (WAL, `synchronous=FULL`, as ours)."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = os.path.join(d, "stock.db")
    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    conn.execute("PRAGMA synchronous=FULL")
    try:
        return {k: list(measure(conn, path, op, n)) for k, op in saver_ops(saver, "r1").items()}
    finally:
        conn.close()


def run_floor(d: str, n: int) -> dict[str, list[float]]:
    """Measure the floor: one row (the put's payload) per durable transaction."""
    path = os.path.join(d, "floor.db")
    conn = connect_floor(path)
    out: dict[str, list[float]] = {}
    for name in OPS:
        size = SIZES.get(name, 4096 if "4KB" in name else 256)
        payload = text_value(size).encode()

        def op(payload: bytes = payload, name: str = name) -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT INTO rows VALUES (?, ?, ?, ?)", (name, "", str(uuid.uuid4()), payload)
            )
            conn.execute("COMMIT")

        out[name] = list(measure(conn, path, op, n))
    conn.close()
    return out


def main(argv: list[str] | None = None) -> int:
    """Print frames and statements per write for each contender."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=200, help="writes measured per figure")
    parser.add_argument("--quick", action="store_true", help="50 writes per figure")
    parser.add_argument("--against", metavar="DIR", help="also measure the saver found in DIR")
    parser.add_argument("--fenced-json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    n = 50 if args.quick else args.ops
    with tempfile.TemporaryDirectory(prefix="bench-pages-") as d:
        if args.fenced_json:  # the child of --against
            print(json.dumps(run_fenced(d, n)))
            return 0
        columns: dict[str, dict[str, list[float]]] = {"floor": run_floor(d, n)}
        columns["SqliteSaver"] = run_stock(d, n)
        if args.against:
            env = {**os.environ, "PYTHONPATH": os.path.abspath(args.against)}
            done = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--fenced-json", "--ops", str(n)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            columns[f"ours @ {args.against}"] = json.loads(done.stdout)
        columns["ours"] = run_fenced(d, n)
    print(f"sqlite {sqlite3.sqlite_version}, {n} writes per figure, one thread each")
    for index, what in ((0, "WAL FRAMES per write"), (1, "STATEMENTS per write")):
        table = Table(what, ["write", *columns])
        for name in OPS:
            table.add(name, *(f"{col[name][index]:.2f}" for col in columns.values()))
        table.print()
    # Schema 4: a write's run id costs no page of its own (an index entry used
    # to be written per row, about one frame; the run's thread is now recorded
    # once per run). What is left is the longer rows' share of page splits.
    ours = columns["ours"]
    table = Table(
        "RUN IDS: extra WAL frames per write of a run (ours)", ["write", "extra", "result"]
    )
    for plain, run in (
        ("put 4KB", "put 4KB +run_id"),
        ("put_writes 4KB", "put_writes 4KB +run_id"),
    ):
        extra = ours[run][0] - ours[plain][0]
        table.add(run, f"{extra:+.2f}", verdict(extra, 0.75))
    table.print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
