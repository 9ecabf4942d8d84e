"""A pytest plugin: a crashed xdist worker's fatal-error traceback in the summary.

A worker that dies of a fatal signal (a segfault in a C extension, say) has
faulthandler print its threads' stacks to stderr at that moment, in the
middle of the progress dots, and xdist then reports only "worker 'gwN'
crashed while running ...". A CI log kept only from its tail loses the one
line that says where it died. Here each worker writes its dumps to a file of
its own instead, and the controller prints whatever any worker left there in
a section of the terminal summary, at the end of the run.

Registered by tests/conftest.py; `test_a_crashed_worker_s_traceback_is_in_the_summary`
(tests/processes/test_crash_dumps.py) runs it on a worker that segfaults.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import tempfile
from typing import Any

import pytest

_KEY = "lgfs_crash_dir"
_dir_key = pytest.StashKey[str]()
_dumps: list[Any] = []  # this worker's dump file
# How many innermost frames the summary shows of the thread that crashed,
# and of each other thread.
_CURRENT_FRAMES, _OTHER_FRAMES = 12, 3


def pytest_configure(config: pytest.Config) -> None:
    """Controller: make the directory the workers write their dumps in."""
    if not hasattr(config, "workerinput"):
        config.stash[_dir_key] = tempfile.mkdtemp(prefix="lgfs-pytest-crashes-")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Controller (xdist): tell each worker, restarted ones too, where to write."""
    node.workerinput[_KEY] = node.config.stash[_dir_key]


def pytest_sessionstart(session: pytest.Session) -> None:
    """Worker: send faulthandler's fatal-error dumps to this worker's own file.

    After pytest's own faulthandler plugin has pointed it at stderr (in its
    `pytest_configure`): this replaces that target, which only one file can be.
    """
    workerinput = getattr(session.config, "workerinput", None)
    if workerinput is None or _KEY not in workerinput:
        return
    name = f"{workerinput.get('workerid', 'gw')}-{os.getpid()}.txt"
    # Open until the end: pytest's faulthandler plugin disables the handler
    # at unconfigure, and `pytest_unconfigure` below closes the file after it.
    dump = open(os.path.join(workerinput[_KEY], name), "w")  # noqa: SIM115
    _dumps.append(dump)
    faulthandler.enable(file=dump, all_threads=True)


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Controller: print each worker's dump, if any worker left one."""
    folder = terminalreporter.config.stash.get(_dir_key, None)
    if folder is None or not os.path.isdir(folder):
        return
    dumps = []
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), errors="replace") as f:
            text = f.read().strip()
        if text:
            dumps.append((name, text))
    if not dumps:
        return
    terminalreporter.section("fatal errors in test workers")
    for name, text in dumps:
        terminalreporter.write_line(f"{name.removesuffix('.txt')}:")
        for line in _brief(text):
            terminalreporter.write_line(line)


def _brief(text: str) -> list[str]:
    # The error, the crashing thread's innermost frames, then each other
    # thread's innermost few (faulthandler lists the crashing one last).
    blocks = [b.splitlines() for b in text.split("\n\n") if b.strip()]
    head = [b for b in blocks if not b[0].startswith(("Thread 0x", "Current thread"))]
    current = [b for b in blocks if b[0].startswith("Current thread")]
    others = [b for b in blocks if b[0].startswith("Thread 0x")]
    lines = [line for b in head for line in b if not line.startswith("Extension modules")]
    for block in current:
        lines += block[: 1 + _CURRENT_FRAMES]
    for block in others:
        lines += block[: 1 + _OTHER_FRAMES]
    return lines


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Worker: close its dump file; controller: remove the dumps' directory."""
    while _dumps:
        _dumps.pop().close()
    folder = config.stash.get(_dir_key, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
