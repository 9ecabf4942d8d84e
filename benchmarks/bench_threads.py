"""Benchmark thread search on a store of many threads, both stores.

Issue 36's target: on a store of 100,000 threads of 10 checkpoints each,
`search_threads` by one metadata key with `limit=20` and `count_threads` of
the same filter each take a median of at most 5 ms, and at most 2x the same
query on a store of 1,000 threads.

* the stores: one thread (`tpl`) is written through the saver (10 root
  checkpoints, each with a pending write and its events), then copied row by
  row into every other thread with plain SQL (`sqlite3` `executemany`,
  psycopg `COPY`), each copy with its own id, its own metadata (`user`:
  100 threads per user, at every size, as a user's threads do not multiply
  with the store) and its own times (a thread's activity 1 ms after the
  one before), its checksums recomputed. The copies go through the same
  tables and the same triggers as a put (the index of latest metadata is
  built by them), in one transaction: faithful to what 100,000 runs leave,
  in a minute instead of hours;
* the figures: the median of `--rounds` calls of each query, each for
  another user (so no two calls in a row read the same rows), through the
  saver's public API, per store and size, with PASS/MISS against the
  target; and, for the index's cost on the write path, `put` on two
  identical SQLite files, one of which had the index's triggers dropped,
  interleaved round by round (`PUT PATH`).

Run `python benchmarks/bench_threads.py` (100,000 threads: a few minutes,
most of it building), `--threads N` for another size, `--stores sqlite`
(or `postgres`) for one store, `--quick` for a smoke run. Timings are
printed with PASS/MISS and never asserted.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

from _common import (
    Table,
    describe_build,
    fmt_time,
    interleave,
    median,
    paired_ratio,
    parse_args,
    postgres_server,
    scratch_dir,
    verdict,
)

from langgraph_fenced_sqlite import FencedSqliteSaver, ManualClock
from langgraph_fenced_sqlite.core.checksums import checkpoint_checksum
from langgraph_fenced_sqlite.testing._helpers import step_checkpoint, token_config

TARGET_S = 5e-3
TARGET_RATIO = 2.0
SMALL = 1_000
CHECKPOINTS = 10
PER_USER = 100
TEMPLATE = "tpl"
START = 1_700_000_000.0
# The tables a thread's rows are in (the SQLite store's, then PostgreSQL's).
SQLITE_TABLES = ("threads", "checkpoints", "writes", "events", "blobs", "thread_runs")
PG_TABLES = ("lgfs_threads", "lgfs_checkpoints", "lgfs_writes", "lgfs_events", "lgfs_blobs")


def thread_name(i: int) -> str:
    return f"thread-{i:07d}"


def user_of(i: int, per_user: int) -> str:
    return f"user-{i // per_user:05d}"


def write_template(saver: Any) -> None:
    """Write `tpl` through the saver: 10 root checkpoints, each with one write."""
    parent = None
    for step in range(CHECKPOINTS):
        metadata = {"source": "loop", "step": step, "parents": {}, "user": "tpl", "topic": "demo"}
        stored = saver.put(
            token_config(TEMPLATE, parent, None), step_checkpoint(step), metadata, {}
        )
        parent = stored["configurable"]["checkpoint_id"]
        saver.put_writes(stored, [("n", step)], f"task-{step}")


def copies(
    columns: list[str], rows: list[tuple[Any, ...]], n: int, per_user: int
) -> Iterator[tuple[Any, ...]]:
    """Yield the template's rows of one table for threads 0..n-1 (ids, metadata, times, sums)."""
    at = {name: i for i, name in enumerate(columns)}
    for i in range(n):
        user = user_of(i, per_user)
        shift = i * 1e-3
        for row in rows:
            out = list(row)
            out[at["thread_id"]] = thread_name(i)
            if "metadata" in at:
                md = str(row[at["metadata"]]).replace('"user":"tpl"', f'"user":"{user}"')
                out[at["metadata"]] = md
                blob = row[at["values_blob"]]
                out[at["checksum"]] = checkpoint_checksum(
                    row[at["envelope"]], row[at["values_type"]], bytes(blob), md
                )
            for clock in ("created_at", "ts"):
                if clock in at:
                    out[at[clock]] = row[at[clock]] + shift
            yield tuple(out)


# --- the stores --------------------------------------------------------------------------------


def build_sqlite(path: str, n: int, per_user: int) -> float:
    """Make `path` a file of `n` threads; return the seconds it took."""
    started = time.perf_counter()
    with FencedSqliteSaver(path, clock=ManualClock(START)) as saver:
        write_template(saver)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    for table in SQLITE_TABLES:
        cur = conn.execute(f"SELECT * FROM {table} WHERE thread_id = ?", (TEMPLATE,))
        columns = [d[0] for d in cur.description]
        rows = cur.fetchall()
        if rows:
            marks = ", ".join("?" for _ in columns)
            conn.executemany(
                f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})",
                copies(columns, rows, n, per_user),
            )
    for table in SQLITE_TABLES:
        conn.execute(f"DELETE FROM {table} WHERE thread_id = ?", (TEMPLATE,))
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()
    return time.perf_counter() - started


def build_postgres(dsn: str, n: int, per_user: int) -> float:
    """Make the schema of `dsn` a store of `n` threads; return the seconds it took."""
    import psycopg

    from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

    started = time.perf_counter()
    with FencedPostgresSaver.from_conn_string(dsn, clock=ManualClock(START)) as saver:
        saver.setup()
        write_template(saver)
    with psycopg.connect(dsn) as conn:
        for table in PG_TABLES:
            cur = conn.execute(f"SELECT * FROM {table} WHERE thread_id = %s", (TEMPLATE,))
            columns = [d.name for d in cur.description or []]
            rows = cur.fetchall()
            if not rows:
                continue
            with conn.cursor().copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                for row in copies(columns, rows, n, per_user):
                    copy.write_row(row)
        for table in PG_TABLES:
            conn.execute(f"DELETE FROM {table} WHERE thread_id = %s", (TEMPLATE,))
        conn.commit()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - started


# --- the figures -------------------------------------------------------------------------------


QUERIES: dict[str, Callable[[Any, str], Any]] = {
    "search": lambda saver, user: saver.search_threads(metadata={"user": user}, limit=20),
    "count": lambda saver, user: saver.count_threads(metadata={"user": user}),
    "by_id": lambda saver, user: saver.search_threads(
        metadata={"user": user}, sort_by="thread_id", limit=20
    ),
}


def measure(savers: dict[int, Any], per_user: int, rounds: int) -> dict[int, dict[str, float]]:
    """The median of each query per store size, the sizes interleaved call by call.

    Each round runs every query once on each store, in a rotated order, each
    call for another user (so no two calls in a row read the same rows).
    """
    users = {n: sorted({user_of(i, per_user) for i in range(n)}) for n in savers}
    for n, saver in savers.items():  # what each store holds, and warm statement caches
        page = saver.search_threads(metadata={"user": users[n][1]}, limit=20)
        assert len(page) == min(20, per_user) and page[0]["checkpoints"] == CHECKPOINTS, page[:1]
        assert saver.count_threads(metadata={"user": users[n][1]}) == per_user
        for query in QUERIES.values():
            for user in users[n][:5]:
                query(saver, user)
    samples: dict[int, dict[str, list[float]]] = {n: {k: [] for k in QUERIES} for n in savers}
    sizes = list(savers)
    for r in range(rounds):
        order = sizes[r % len(sizes) :] + sizes[: r % len(sizes)]
        for key, query in QUERIES.items():
            for n in order:
                user = users[n][(r * 7919) % len(users[n])]
                t0 = time.perf_counter()
                query(savers[n], user)
                samples[n][key].append(time.perf_counter() - t0)
    return {n: {k: median(v) for k, v in by_key.items()} for n, by_key in samples.items()}


FIGURES = (
    ("search", 'search_threads(metadata={"user": U}, limit=20)', True),
    ("count", 'count_threads(metadata={"user": U})', True),
    ("by_id", '  (info) the same, sort_by="thread_id" (paged in the index)', False),
)


def report(
    store: str,
    small_n: int,
    n: int,
    per_user: int,
    small: dict[str, float],
    big: dict[str, float],
    built: float,
) -> None:
    table = Table(
        f"{store}: {n:,} threads x {CHECKPOINTS} checkpoints ({per_user} threads per user; "
        f"built in {built:.0f} s), median of each query",
        ["query", f"{small_n:,} threads", f"{n:,} threads", "ratio", "target"],
    )
    for key, label, targeted in FIGURES:
        ratio = big[key] / small[key]
        target = (
            f"<= {fmt_time(TARGET_S)} {verdict(big[key], TARGET_S)}, "
            f"<= {TARGET_RATIO:.0f}x {verdict(ratio, TARGET_RATIO)}"
            if targeted
            else "info"
        )
        table.add(label, fmt_time(small[key]), fmt_time(big[key]), f"{ratio:.2f}x", target)
    table.print()


def run_sqlite(directory: str, n: int, small_n: int, per_user: int, rounds: int) -> None:
    built = {}
    paths = {}
    for size in (small_n, n):
        paths[size] = os.path.join(directory, f"threads-{size}.db")
        built[size] = build_sqlite(paths[size], size, per_user)
    savers = {size: FencedSqliteSaver(path, readonly=True) for size, path in paths.items()}
    try:
        figures = measure(savers, per_user, rounds)
    finally:
        for saver in savers.values():
            saver.close()
    report("SQLITE", small_n, n, per_user, figures[small_n], figures[n], built[n])


def run_postgres(
    n: int, small_n: int, per_user: int, rounds: int, put_rounds: int, ops: int
) -> None:
    from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

    with postgres_server() as (server, why):
        if server is None:
            print(f"POSTGRESQL: skipped ({why})\n")
            return
        built = {}
        dsns = {}
        for size in (small_n, n):
            dsns[size] = server.fresh_dsn()
            built[size] = build_postgres(dsns[size], size, per_user)
        with ExitStack() as stack:
            savers = {
                size: stack.enter_context(FencedPostgresSaver.from_conn_string(dsn))
                for size, dsn in dsns.items()
            }
            figures = measure(savers, per_user, rounds)
        report("POSTGRESQL", small_n, n, per_user, figures[small_n], figures[n], built[n])
        with ExitStack() as stack:
            pair = {}
            for name in ("indexed", "no index"):
                dsn = server.fresh_dsn()
                saver = stack.enter_context(FencedPostgresSaver.from_conn_string(dsn))
                saver.setup()
                if name == "no index":
                    with psycopg_connect(dsn) as conn:
                        conn.execute(
                            "ALTER TABLE lgfs_checkpoints DISABLE TRIGGER lgfs_checkpoints_tags"
                        )
                pair[name] = saver
            put_path("POSTGRESQL", pair, put_rounds, ops, "trigger disabled")


def psycopg_connect(dsn: str) -> Any:
    import psycopg

    return psycopg.connect(dsn, autocommit=True)


def sqlite_put_pair(directory: str) -> dict[str, Any]:
    """Two fresh files; the second's index triggers dropped (behind its open saver)."""
    savers = {}
    for name in ("indexed", "no index"):
        path = os.path.join(directory, f"put-{name.replace(' ', '-')}.db")
        savers[name] = FencedSqliteSaver(path)
        if name == "no index":  # the saver checks its triggers at open only
            conn = sqlite3.connect(path)
            conn.execute("DROP TRIGGER checkpoints_thread_tags")
            conn.execute("DROP TRIGGER checkpoints_thread_tags_delete")
            conn.commit()
            conn.close()
    return savers


def put_path(store: str, savers: dict[str, Any], rounds: int, ops: int, off: str) -> None:
    """`put` with the index's triggers against the same store without them, interleaved."""
    latest: dict[str, Any] = {name: None for name in savers}
    step = {name: 0 for name in savers}

    def contender(name: str) -> Callable[[int], float]:
        saver = savers[name]

        def run(k: int) -> float:
            t0 = time.perf_counter()
            for _ in range(k):
                step[name] += 1
                md = {"source": "loop", "step": step[name], "parents": {}, "user": "ann"}
                cp = step_checkpoint(step[name], {"n": step[name]})
                stored = saver.put(token_config("t", latest[name], None), cp, md, {})
                latest[name] = stored["configurable"]["checkpoint_id"]
            return time.perf_counter() - t0

        return run

    samples = interleave({name: contender(name) for name in savers}, rounds=rounds, ops=ops)
    ratio = paired_ratio(samples["indexed"], samples["no index"])
    table = Table(
        f"PUT PATH: {store} put (metadata user unchanged, step changing), the index's "
        f"triggers against none, {rounds} interleaved rounds of {ops}",
        ["contender", "median per put", "ratio", "note"],
    )
    table.add("indexed", fmt_time(median(samples["indexed"])), f"{ratio:.3f}x", "info")
    table.add(f"no index ({off})", fmt_time(median(samples["no index"])), "1.000x", "")
    table.print()


def main() -> None:
    args = parse_args(
        __doc__.splitlines()[0],
        extra=lambda p: (
            p.add_argument("--threads", type=int, default=100_000, help="threads in the big store"),
            p.add_argument("--stores", default="sqlite,postgres", help="sqlite, postgres or both"),
        ),
    )
    n, small_n, per_user = args.threads, SMALL, PER_USER
    rounds = args.rounds or 200
    if args.quick:
        n, small_n, per_user, rounds = 1_000, 100, 10, 10
    stores = set(args.stores.split(","))
    print(describe_build())
    print(f"thread search: {n:,} threads against {small_n:,}, {rounds} calls per figure\n")
    with scratch_dir("bench-threads", base=args.dir, keep=args.keep) as directory:
        put_rounds, ops = (10, 20) if args.quick else (40, 100)
        if "sqlite" in stores:
            run_sqlite(directory, n, small_n, per_user, rounds)
            pair = sqlite_put_pair(directory)
            try:
                put_path("SQLite", pair, put_rounds, ops, "triggers dropped")
            finally:
                for saver in pair.values():
                    saver.close()
        if "postgres" in stores:
            run_postgres(n, small_n, per_user, rounds, put_rounds, ops)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    print("result: done (figures, not assertions)")


if __name__ == "__main__":
    sys.exit(main())
