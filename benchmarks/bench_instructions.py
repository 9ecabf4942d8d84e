"""Count CPU instructions per call of FencedSqliteSaver and SqliteSaver, side by side (valgrind).

Instruction counts do not depend on the machine's load, so they compare two
savers (or two source trees) on a shared machine where timings are noise.
Each saver runs in its own child process under `valgrind --tool=callgrind`,
which collects only inside `functools.reduce` (the child calls each op from
one, and nothing the savers run calls it) and dumps a profile after each:
an op's count is `(count of 2n calls - count of n calls) / n`, so the fixed
cost of the measuring cancels. Files are bulk-loaded outside valgrind.

Only the calling thread is counted (callgrind's collection state is per
thread): the sync ops measured here run entirely on it. I/O wait is not an
instruction: these are the CPU figures (Python + SQLite), and the durable
commit's fsync is what `bench_saver.py` adds.

Run `python benchmarks/bench_instructions.py` (a few minutes: valgrind runs
Python about 50x slower), `--quick` for a smoke run, `--against DIR` to add
the saver of the source tree DIR (e.g. an older commit's `git archive`).
Prints a table with PASS/MISS for reads (no more instructions than
SqliteSaver's) and never asserts.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from typing import Any

from _common import Chain, Table, describe_build, parse_args, populate, text_value, verdict

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# (op, what it does); reads at both history sizes.
READS = ("get_tuple latest", "get_tuple old id", "list(limit=10)")
WRITES = ("put", "put_writes")


def build_files(d: str, impl: str, history: tuple[int, ...], value: str) -> dict[str, Any]:
    """Create `impl`'s files: one per history size, and one for writes."""
    conf = {"thread_id": "hist", "checkpoint_ns": ""}
    ids = {}
    for size in history:
        path = os.path.join(d, f"{impl}-r{size}.db")
        saver, close = open_saver(impl, path)
        try:
            _set_sync(saver, impl, "OFF")
            ids[size] = populate(saver, Chain(dict(conf), value), size)[1]
        finally:
            close()
    return {"old_ids": ids}


def open_saver(impl: str, path: str) -> tuple[Any, Any]:
    """Open `impl`'s saver on `path` (WAL, synchronous=FULL); return it and its closer."""
    if impl == "fenced":
        from langgraph_fenced_sqlite import FencedSqliteSaver

        saver = FencedSqliteSaver(path)
        return saver, saver.close
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(path, check_same_thread=False)
    lg = SqliteSaver(conn)
    lg.setup()
    conn.execute("PRAGMA synchronous=FULL")
    return lg, conn.close


def _set_sync(saver: Any, impl: str, mode: str) -> None:
    conn = saver._engine._conn if impl == "fenced" else saver.conn
    conn.execute(f"PRAGMA synchronous={mode}")


# --- the child, under valgrind -----------------------------------------------------------


def child(impl: str, d: str, history: list[int], n: int, info: dict[str, Any]) -> None:
    """Run each op 3 times (warm-up), then n and 2n times, each batch inside `reduce`.

    The cyclic GC is off in the batches (collected before each), for both savers.
    """
    import functools
    import gc

    value = text_value(4096)
    conf = {"thread_id": "hist", "checkpoint_ns": ""}
    latest = {"configurable": conf}
    ops: list[tuple[str, Any]] = []
    closers = []
    for size in history:
        saver, close = open_saver(impl, os.path.join(d, f"{impl}-r{size}.db"))
        closers.append(close)
        old = {"configurable": {**conf, "checkpoint_id": info["old_ids"][str(size)]}}
        ops += [
            (f"get_tuple latest @{size}", lambda s=saver: s.get_tuple(latest)),
            (f"get_tuple old id @{size}", lambda s=saver, c=old: s.get_tuple(c)),
            (f"list(limit=10) @{size}", lambda s=saver: list(s.list(latest, limit=10))),
        ]
    writer, close = open_saver(impl, os.path.join(d, f"{impl}-w-{os.getpid()}.db"))
    closers.append(close)
    put_chain = Chain({"thread_id": "put", "checkpoint_ns": ""}, value)
    put_chain.prepare(3 + 3 * n)
    writes_chain = Chain({"thread_id": "writes", "checkpoint_ns": ""}, value)
    writes_chain.prepare(1)
    writes_chain.advance(writer.put(*writes_chain.next()))
    writes_config = writes_chain.latest_config()
    tasks = iter([str(uuid.UUID(int=i)) for i in range(3 + 3 * n)])
    payload = [("state", {"text": value})]

    def put() -> None:
        put_chain.advance(writer.put(*put_chain.next()))

    ops += [
        ("put", put),
        ("put_writes", lambda: writer.put_writes(writes_config, payload, next(tasks))),
    ]
    names = []
    # No cyclic GC inside the measured batches (collected before each
    # instead): a full collection landing in one saver's n or 2n window
    # moved list(limit=10) @10 by 7% between runs of the same tree.
    gc.disable()
    for name, op in ops:
        for _ in range(3):
            op()
        for count in (n, 2 * n):
            gc.collect()

            def batch(_a: object, _b: object, op: Any = op, count: int = count) -> None:
                for _ in range(count):
                    op()

            functools.reduce(batch, [0, 0])
        names.append(name)
    for close in closers:
        close()
    print(json.dumps(names))


def run_child(
    impl: str, d: str, history: tuple[int, ...], n: int, info: dict[str, Any], tree: str | None
) -> dict[str, float]:
    """Run `child` under callgrind; return instructions per call of each op."""
    out_dir = tempfile.mkdtemp(prefix="cg-", dir=d)
    env = dict(os.environ, PYTHONHASHSEED="0")
    if tree is not None:
        env["PYTHONPATH"] = tree
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--collect-atstart=no",
        "--toggle-collect=functools_reduce",
        "--dump-after=functools_reduce",
        "--dump-instr=no",
        f"--callgrind-out-file={out_dir}/cg.out",
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        json.dumps([impl, d, list(history), n, info]),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=HERE)
    if proc.returncode != 0:
        raise SystemExit(f"child {impl} failed:\n{proc.stdout}\n{proc.stderr[-3000:]}")
    names = json.loads(proc.stdout.strip().splitlines()[-1])
    dumps = sorted(
        glob.glob(f"{out_dir}/cg.out.*"), key=lambda p: int(p.rsplit(".", 1)[1])
    )  # one per reduce call, in call order
    totals = [_total(p) for p in dumps]
    if len(totals) != 2 * len(names):
        raise SystemExit(f"expected {2 * len(names)} dumps, got {len(totals)}")
    shutil.rmtree(out_dir)
    return {name: (totals[2 * i + 1] - totals[2 * i]) / n for i, name in enumerate(names)}


def _total(path: str) -> int:
    with open(path) as f:
        for line in f:
            m = re.match(r"totals:\s+(\d+)", line)
            if m:
                return int(m.group(1))
    raise SystemExit(f"no totals in {path}")


def main(argv: list[str] | None = None) -> int:
    """Build the files, count each saver's instructions per op, print the table."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        impl, d, history, n, info = json.loads(argv[1])
        child(impl, d, history, n, info)
        return 0
    args = parse_args(
        __doc__.splitlines()[0],
        argv,
        lambda p: p.add_argument(
            "--against", default=None, help="also count the saver of this source tree"
        ),
    )
    if shutil.which("valgrind") is None:
        print("valgrind not found: install it to count instructions (result: MISS, not run)")
        return 0
    history = (10, 200) if args.quick else (10, 20_000)
    n = 3 if args.quick else 20
    value = text_value(4096)
    print(describe_build())
    print(f"history {history}, {n} and {2 * n} calls per op, per-op = difference / {n}")
    print()
    d = tempfile.mkdtemp(prefix="lgfs-bench-instr-", dir=args.dir)
    try:
        counts: dict[str, dict[str, float]] = {}
        for impl in ("fenced", "lg"):
            info = build_files(d, impl, history, value)
            info = {"old_ids": {str(k): v for k, v in info["old_ids"].items()}}
            counts[impl] = run_child(impl, d, history, n, info, None)
            if impl == "fenced" and args.against:
                counts["against"] = run_child(impl, d, history, n, info, args.against)
    finally:
        if not args.keep:
            shutil.rmtree(d, ignore_errors=True)
    columns = ["op", "FencedSqliteSaver", "SqliteSaver", "ours / theirs", "target", "result"]
    if args.against:
        columns[2:2] = [f"ours @ {args.against}", "now / then"]
    table = Table("INSTRUCTIONS per call (valgrind callgrind; load-independent)", columns)
    for name in counts["fenced"]:
        ours, theirs = counts["fenced"][name], counts["lg"][name]
        ratio = ours / theirs
        is_read = name.split(" @")[0] in READS
        row = [
            name,
            f"{ours / 1000:.0f}k",
            f"{theirs / 1000:.0f}k",
            f"{ratio:.2f}",
            "<= 1.00" if is_read else "info",
            verdict(ratio, 1.0) if is_read else "-",
        ]
        if args.against:
            then = counts["against"][name]
            row[2:2] = [f"{then / 1000:.0f}k", f"{ours / then:.2f}"]
        table.add(*row)
    table.print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
