"""The benchmarks' contract yardstick stores the rows our saver stores, and nothing less.

`bench_syncs.ContractFloor` (over `_common.ContractRows`) is the figure the
speed targets are judged against: a target it misses "cannot be met by any
saver that keeps the contract". That claim holds only while it writes what
the saver writes; these tests fail the day the saver stores a row more (or
the yardstick one less).
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from langgraph_fenced_sqlite import FencedSqliteSaver

BENCH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"
)


@pytest.fixture(scope="module")
def bench_syncs() -> Any:
    """Import `benchmarks/bench_syncs.py` (it imports `_common` from its own folder)."""
    sys.path.insert(0, BENCH)
    try:
        import bench_syncs

        return bench_syncs
    finally:
        sys.path.remove(BENCH)


def _stored(path: Path) -> dict[str, Any]:
    # What a reader of each file would find, ids aside (each run makes its
    # own). Sorted: a fan-out's writes arrive in no fixed order, so their
    # seqs differ from run to run even on one saver.
    conn = sqlite3.connect(path)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        # Each checkpoint's position is the seq of its own event (§3-§4).
        unmatched = conn.execute(
            "SELECT count(*) FROM checkpoints c WHERE NOT EXISTS (SELECT 1 FROM events e "
            "WHERE e.thread_id = c.thread_id AND e.seq = c.position AND e.kind = 'checkpoint' "
            "AND e.checkpoint_id = c.checkpoint_id)"
        ).fetchone()[0]
        # The yardstick stores each checkpoint's values inline (docs/semantics.md
        # promises values, not a layout); ours keeps them in `blobs` (schema 5),
        # compared by what a reader finds, not by row counts there.
        counted = [t for t in tables if t != "blobs"]
        return {
            "rows": {t: conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in counted},
            "events": sorted(conn.execute("SELECT thread_id, kind FROM events")),
            "checkpoints": sorted(conn.execute("SELECT thread_id, step FROM checkpoints")),
            "writes": sorted(conn.execute("SELECT thread_id, channel FROM writes")),
            "checkpoints without their event": unmatched,
        }
    finally:
        conn.close()


@pytest.mark.parametrize("shape", ["chain", "fanout"])
def test_the_contract_floor_stores_what_our_saver_stores(
    bench_syncs: Any, tmp_path: Path, shape: str
) -> None:
    """Graph runs on each: the same tables and rows, each checkpoint at its event's seq."""
    ours = FencedSqliteSaver(tmp_path / "ours.db")
    floor = bench_syncs.ContractFloor(str(tmp_path / "floor.db"))
    try:
        for saver in (ours, floor):
            app = bench_syncs.build(shape).compile(checkpointer=saver)
            for i in range(3):
                config = {"configurable": {"thread_id": f"t{i % 2}"}}
                app.invoke(dict(bench_syncs.INPUT), config, durability="sync")
    finally:
        ours.close()
        floor.close()
    stored = _stored(tmp_path / "ours.db")
    assert stored["rows"]["checkpoints"] > 0 and stored["rows"]["events"] > 0
    assert stored["checkpoints without their event"] == 0
    assert _stored(tmp_path / "floor.db") == stored
