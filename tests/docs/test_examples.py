"""Every example under examples/ runs with one command and prints what it promises."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.subprocess


def run_example(name: str, tmp_path: Path, *args: str) -> str:
    """Run examples/<name> from a temp dir (TMPDIR too); return its stdout."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_quickstart_runs_with_no_arguments(tmp_path: Path) -> None:
    """The README's main demo: two turns persisted, then read back from the file."""
    out = run_example("quickstart.py", tmp_path)
    assert "read back from" in out and str(tmp_path) in out
    assert "state after 2 turns:" in out
    assert "bot: you said 'user: how are you?' (turn 2)" in out
    assert [line.split()[1] for line in out.splitlines() if "run_" in line] == [
        "run_started",
        "run_completed",
        "run_started",
        "run_completed",
    ]
    assert (tmp_path / "quickstart.db").exists()
    # Run again on the same file: it starts fresh and says the same.
    assert run_example("quickstart.py", tmp_path, str(tmp_path / "quickstart.db")).count(
        "(turn 2)"
    ) == out.count("(turn 2)")


def test_human_review_retracts_the_rejected_turn(tmp_path: Path) -> None:
    """A rejected turn is retracted; the next turn resumes from the previous one."""
    out = run_example("human_review.py", tmp_path, str(tmp_path / "review.db"))
    assert "retracted 3 checkpoints of turn-2; pending review: False" in out
    assert "draft back to 'HAIKU: logs write-ahead about'" in out
    assert "published ['HAIKU: logs write-ahead about', 'SONNET: tokens fencing about']" in out
    log = [line.split()[1:] for line in out.split("event log:")[1].splitlines() if line.strip()]
    assert ["retracted", "turn-2"] in log
    assert log.index(["run_interrupted", "turn-2"]) + 1 == log.index(["retracted", "turn-2"])


@pytest.mark.slow
def test_workers_reject_enqueue_sigkill_and_watch(tmp_path: Path) -> None:
    """Workers show reject/enqueue, a SIGKILLed worker taken over, every event in order."""
    out = run_example("workers.py", tmp_path, str(tmp_path / "workers.db"))
    assert "[main] reject: ThreadBusy (worker-A holds alice)" in out
    assert "[worker-B] enqueue: alice ->" in out
    assert "C killed with SIGKILL" in out
    assert "run_superseded" in out and "of worker-C (expired claim)" in out
    assert "[worker-D] enqueue: carol ->" in out
    seqs: dict[str, list[int]] = defaultdict(list)
    for thread, seq in re.findall(r"^    (\w+) +#(\d+) ", out, re.M):
        seqs[thread].append(int(seq))
    assert set(seqs) == {"alice", "bob", "carol"}
    for numbers in seqs.values():  # every event once, in order, no gap
        assert numbers == list(range(1, len(numbers) + 1))
    carol = next(line for line in out.splitlines() if line.startswith("  carol:"))
    assert "got 'hey'" in carol and "got 'anyone?'" in carol  # D went on from C's checkpoint


def test_workers_print_each_line_in_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """A line reaches stdout in one write, so lines of several processes never mix.

    With PYTHONUNBUFFERED=1 (as in CI) `print` writes the text and its newline
    in two calls; a watcher line once landed between a worker's two and lost
    its place at the start of a line (the event-order check above then saw a
    gap that the file did not have).
    """
    import importlib.util
    import io

    spec = importlib.util.spec_from_file_location(
        "workers_example", ROOT / "examples" / "workers.py"
    )
    assert spec is not None and spec.loader is not None
    workers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(workers)

    class Recorder(io.RawIOBase):
        def __init__(self) -> None:
            self.calls: list[bytes] = []

        def writable(self) -> bool:
            return True

        def write(self, b: Any) -> int:
            self.calls.append(bytes(b))
            return len(b)

    raw = Recorder()
    # What the interpreter builds for stdout under PYTHONUNBUFFERED=1.
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, write_through=True))
    workers.say("    alice #20  writes")
    assert raw.calls == [b"    alice #20  writes\n"]
