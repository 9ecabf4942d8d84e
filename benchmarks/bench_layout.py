"""Count WAL frames per `put` for candidate layouts of the `checkpoints` table.

Why `checkpoints` stays a rowid table with two indexes (three B-trees per
insert) instead of a WITHOUT ROWID table with one index (two B-trees): this
script measures both, side by side, with the saver of this tree, and the
rowid table wins. A WITHOUT ROWID table is an index B-tree, and an index
B-tree has no `balance_quick`: a rowid table appending at its right edge
splits a full leaf by starting one new page, but an index B-tree
redistributes the cells of up to three sibling leaves, writing all of them
and their parent. A checkpoint's cell is large (the whole record up to ~1000
bytes, at least 489 of it when the record overflows, on a 4 KB page), so a
leaf holds 4-8 of them and such a split comes every few puts; the two small
index leaves the rowid table pays for instead cost less.

Layouts (each, except `now`, replaces migration 0's `checkpoints` table and
its position index; columns small-first, checksum included):

* `now`: the schema as it is (rowid table, autoindex on the id, an index on
  the position).
* `wr-position`: WITHOUT ROWID keyed `(thread_id, checkpoint_ns, position)`,
  plus a UNIQUE index on the id.
* `wr-id`: WITHOUT ROWID keyed by the id, plus the index on the position.
* `rowid-small-first`: as `now`, with the blobs last (no write difference
  expected: the same three B-trees). Reads gain little: `get_tuple` and
  `list` read every column, so the overflow page is read anyway
  (`bench_instructions.py --quick` on such a tree: 0.5-1.6% fewer
  instructions, within its noise), too little to rebuild every file for.

Each figure is the mean WAL growth per `put` (automatic checkpoints off),
after a warm-up, for one thread and for 16 threads written round-robin; the
`checkpoints B-trees` columns count the frames of the table and its indexes
(leaf and interior pages, overflow pages apart), mapped with `dbstat`.
Run `python benchmarks/bench_layout.py` (about a minute); `--quick` for
fewer puts (its figures are rough). The last table says PASS where the kept
layout costs no more frames than the WITHOUT ROWID one. Only counts: they do
not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import Chain, Table, text_value, verdict  # noqa: E402

_SMALL_FIRST = (
    "thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL, checkpoint_id TEXT NOT NULL, "
    "position INTEGER NOT NULL, parent_checkpoint_id TEXT, source TEXT, step INTEGER, "
    "run_id TEXT, token INTEGER, created_at REAL NOT NULL, checksum INTEGER, "
    "metadata TEXT NOT NULL, values_type TEXT NOT NULL, envelope TEXT NOT NULL, "
    "values_blob BLOB NOT NULL"
)
_BY_ID = "(thread_id, checkpoint_ns, checkpoint_id)"
_BY_POSITION = "(thread_id, checkpoint_ns, position)"
# Statements that replace migration 0's CREATE TABLE checkpoints and its
# position index (None: the schema as it is).
LAYOUTS: dict[str, tuple[str, ...] | None] = {
    "now": None,
    "wr-position": (
        f"CREATE TABLE checkpoints ({_SMALL_FIRST}, PRIMARY KEY {_BY_POSITION}) WITHOUT ROWID",
        f"CREATE UNIQUE INDEX checkpoints_by_id ON checkpoints {_BY_ID}",
    ),
    "wr-id": (
        f"CREATE TABLE checkpoints ({_SMALL_FIRST}, PRIMARY KEY {_BY_ID}) WITHOUT ROWID",
        f"CREATE INDEX checkpoints_by_position ON checkpoints {_BY_POSITION}",
    ),
    "rowid-small-first": (
        f"CREATE TABLE checkpoints ({_SMALL_FIRST}, PRIMARY KEY {_BY_ID})",
        f"CREATE INDEX checkpoints_by_position ON checkpoints {_BY_POSITION}",
    ),
}
# The table and its indexes (dbstat names).
_TREES = ("checkpoints", "sqlite_autoindex_checkpoints")
SCENARIOS = ("256B x1", "4KB x1", "256B x16", "4KB x16")


def use_layout(name: str) -> None:
    """Make the saver build layout `name` in new files (patches `schema.MIGRATIONS`)."""
    from langgraph_fenced_sqlite.sqlite import schema

    replacement = LAYOUTS[name]
    if replacement is None:
        return
    first = list(schema.MIGRATIONS[0])
    at = next(i for i, s in enumerate(first) if s.startswith("CREATE TABLE checkpoints"))
    first[at : at + 2] = replacement
    # The checksum column is in the new table already.
    second = tuple(
        "SELECT 1" if s.startswith("ALTER TABLE checkpoints") else s for s in schema.MIGRATIONS[1]
    )
    schema.MIGRATIONS = (tuple(first), second, *schema.MIGRATIONS[2:])


def measure_layout(d: str, n: int, warm: int) -> dict[str, list[float]]:
    """Return `[frames, checkpoints B-tree frames]` per put for each scenario."""
    from langgraph_fenced_sqlite import FencedSqliteSaver

    out: dict[str, list[float]] = {}
    for scenario in SCENARIOS:
        size_name, threads = scenario.split(" x")
        size = 256 if size_name == "256B" else 4096
        path = os.path.join(d, f"{size}-{threads}.db")
        saver = FencedSqliteSaver(path)
        try:
            chains = [
                Chain({"thread_id": f"t{i:02d}", "checkpoint_ns": ""}, text_value(size))
                for i in range(int(threads))
            ]
            out[scenario] = _frames_per_put(saver, path, chains, n, warm)
        finally:
            saver.close()
    return out


def _frames_per_put(saver: Any, path: str, chains: list[Chain], n: int, warm: int) -> list[float]:
    conn = saver._engine._conn  # private, on purpose: diagnostic only
    conn.execute("PRAGMA wal_autocheckpoint = 0")

    def put(i: int) -> None:
        chain = chains[i % len(chains)]
        chain.prepare(1)
        chain.advance(saver.put(*chain.next()))

    for i in range(warm * len(chains)):
        put(i)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    frames = trees = 0
    seen = 32  # the WAL header
    for i in range(n):
        put(i)
        wal = _read(path + "-wal")
        pages = [struct.unpack(">I", wal[o : o + 4])[0] for o in range(seen, len(wal), page + 24)]
        seen = len(wal)
        owner = {
            pageno: (name, kind)
            for name, pageno, kind in conn.execute("SELECT name, pageno, pagetype FROM dbstat")
        }
        frames += len(pages)
        mine = [owner.get(p, ("", "")) for p in pages]
        trees += sum(1 for name, kind in mine if name.startswith(_TREES) and kind != "overflow")
    return [frames / n, trees / n]


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def main(argv: list[str] | None = None) -> int:
    """Print frames per put for each layout, each measured in its own child process."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=200, help="puts measured per figure")
    parser.add_argument("--quick", action="store_true", help="20 puts per figure, less warm-up")
    parser.add_argument("--child", choices=list(LAYOUTS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    n = 20 if args.quick else args.ops
    warm = 5 if args.quick else 20  # puts per thread before measuring
    if args.child:
        use_layout(args.child)
        with tempfile.TemporaryDirectory(prefix="bench-layout-") as d:
            print(json.dumps(measure_layout(d, n, warm)))
        return 0
    results = {}
    for name in LAYOUTS:
        done = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child", name, "--ops", str(n)]
            + ["--quick"] * args.quick,
            capture_output=True,
            text=True,
            check=True,
        )
        results[name] = json.loads(done.stdout)
    print(f"{n} puts per figure; xN: N threads written round-robin")
    for index, what in ((0, "WAL FRAMES per put"), (1, "checkpoints B-TREES: frames per put")):
        table = Table(what, ["layout", *SCENARIOS])
        for name, figures in results.items():
            table.add(name, *(f"{figures[s][index]:.2f}" for s in SCENARIOS))
        table.print()
    # The kept layout must cost no more frames than the two-B-tree one.
    table = Table(
        "KEPT LAYOUT: frames per put, now minus wr-position", ["scenario", "difference", "result"]
    )
    for scenario in SCENARIOS:
        extra = results["now"][scenario][0] - results["wr-position"][scenario][0]
        table.add(scenario, f"{extra:+.2f}", verdict(extra, 0.0))
    table.print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
