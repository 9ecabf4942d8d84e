"""LangGraph's own checkpointer-parametrised tests, run against both our savers.

The harness is `tests/langgraph_suite/run_suite.py`; this test runs it in a
child process: FencedSqliteSaver in LangGraph's default mode and in strict
mode, FencedPostgresSaver (on a server the harness starts) in default mode,
one test each, and holds the
result to `tests/langgraph_suite/known_failures.txt` (empty: every test passes;
a timing test of LangGraph's that fails with every saver under load is rerun
alone, up to 3 times, as that file's `flaky` lines say).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "langgraph_suite" / "run_suite.py"


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("mode", "store"), [("default", "sqlite"), ("strict", "sqlite"), ("default", "postgres")]
)
def test_langgraph_suite_passes_in_full(mode: str, store: str, tmp_path: Path) -> None:
    """LangGraph's suite passes in full with our savers (SQLite in both modes, PostgreSQL).

    One test per run, so that pytest-xdist runs them (each a few minutes) side by side.
    Strict mode changes what LangGraph's serializer accepts, and both stores
    share our own serializer: SQLite's run covers it.
    """
    proc = subprocess.run(
        # --no-install: the [dev] extra must bring what LangGraph's tests import.
        [sys.executable, str(HARNESS), "--no-install", "--build-dir", str(tmp_path)]
        + ["--modes", mode, "--store", store],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    label = mode if store == "sqlite" else f"{mode}, {store}"
    line = next(x for x in report.splitlines() if x.startswith(f"langgraph suite ({label}): "))
    counts = line.split(": ", 1)[1].split()
    passed, failed = int(counts[0]), int(counts[2])
    # 386 sync + 262 async checkpointer tests in langgraph 1.2.24: a run that
    # selects far fewer has lost our fixture, not passed.
    assert passed >= 600, line
    assert failed == 0, report
