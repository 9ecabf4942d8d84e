"""The suite's own crash reporting (`support/crash_dumps.py`), on a worker that really segfaults.

CI keeps the tail of a run's output; a worker that died of a fatal signal
was reported there only as "worker 'gw1' crashed while running ...", its
traceback lost mid-log (it happened once, in tests/core/test_serde.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from support.processes import TESTS_DIR


@pytest.mark.subprocess
def test_a_crashed_worker_s_traceback_is_in_the_summary(tmp_path: Any) -> None:
    """A worker killed by SIGSEGV: its error and the crashing test's frame are
    printed at the end of the run, before the short summary."""
    (tmp_path / "conftest.py").write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {TESTS_DIR!r})
            from support import crash_dumps

            def pytest_configure(config):
                config.pluginmanager.register(crash_dumps, "lgfs-crash-dumps")
            """
        )
    )
    (tmp_path / "test_dies.py").write_text(
        textwrap.dedent(
            """
            import faulthandler

            def test_fine():
                pass

            def test_dies_in_c():
                faulthandler._sigsegv()  # a real SIGSEGV, as a C extension's bug gives
            """
        )
    )
    temp = tmp_path / "temp"
    temp.mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "1", "-p", "no:cacheprovider", "-o", "addopts="],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TMPDIR": str(temp)},
    )
    assert run.returncode == 1, run.stdout + run.stderr
    out = run.stdout
    assert "crashed while running 'test_dies.py::test_dies_in_c'" in out, out
    # The traceback is printed at the end, in its own section, naming the test's line.
    section = out[out.index("fatal errors in test workers") :]
    assert "Fatal Python error: Segmentation fault" in section, out
    assert 'test_dies.py", line 8 in test_dies_in_c' in section, out
    assert section.index("test_dies_in_c") < section.index("short test summary info")
    # And it leaves no directory behind.
    assert not [n for n in os.listdir(temp) if n.startswith("lgfs-pytest-crashes-")]
