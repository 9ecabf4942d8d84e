"""Real other processes: start them, let them go at once, wait for their marks, reap them.

Every multi-process test starts its children through here (`sys.executable`,
pipes, text): `start` for any command, `python` for a script given as text,
`lgfs` for the real command line, `pg_child` for the PostgreSQL workers of
`support/pg_child.py`. `run_together` releases several children at once by a
flag file; `wait_for_file` waits for a child's marker file; `reap` ends one.

A child that imports `support` puts `TESTS_DIR` on its `sys.path`, one that
imports its test module `import_path(__file__)` (the tests hand either over as
an argument).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TESTS_DIR = str(Path(__file__).resolve().parent.parent)
PG_CHILD = str(Path(__file__).with_name("pg_child.py"))


def start(
    argv: list[str], *, stdin: bool = False, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """Start `argv` with its stdout and stderr (and, if asked, stdin) piped, as text.

    `env` adds to this process's environment.
    """
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=None if env is None else {**os.environ, **env},
    )


# A child that holds the write lock of the file `sys.argv[1]`: it prints "locked" once it
# holds it and lets go when a line arrives on its stdin (`python(WRITE_LOCKER, path)`).
WRITE_LOCKER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
conn.close()
"""


def python(script: str, *args: str) -> subprocess.Popen[str]:
    """Start `python -c script args...` with all three pipes (a real other process)."""
    proc = start([sys.executable, "-c", script, *args], stdin=True)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    return proc


def import_path(test_file: str) -> str:
    """What a child puts on its `sys.path` (`os.pathsep`-separated) to import the test
    module `test_file` (its folder) and `support` (`TESTS_DIR`)."""
    return os.pathsep.join([os.path.dirname(os.path.abspath(test_file)), TESTS_DIR])


def pg_child(command: str, args: dict[str, Any]) -> list[str]:
    """The argv of a `support/pg_child.py` worker running `command` with `args`."""
    return [sys.executable, PG_CHILD, command, json.dumps(args)]


def lgfs(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real `lgfs` command in a subprocess (no terminal: nothing is asked)."""
    return subprocess.run(
        [sys.executable, "-m", "langgraph_fenced_sqlite", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def parsed(done: subprocess.CompletedProcess[str]) -> Any:
    """Require an `lgfs` run's success and parse the JSON document its `--json` printed."""
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return json.loads(done.stdout)


def run_together(argvs: list[list[str]], flag: str, timeout: float = 120) -> list[Any]:
    """Start one child per argv, let them go at once (by creating `flag`), wait for all.

    Each child waits for the file `flag` to exist before it starts its work,
    so they contend for real. Returns each child's `(returncode, stdout,
    stderr)`; children still running after `timeout` are killed.
    """
    procs = [start(argv) for argv in argvs]
    try:
        with open(flag, "w"):
            pass
        outputs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs, strict=True)]


def wait_for_file(path: Path, proc: subprocess.Popen[str], what: str) -> None:
    """Wait until `proc` creates `path` (`what` it means), failing if it exits first."""
    deadline = time.monotonic() + 60
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the child exited before {what}: {proc.communicate()}")
        assert time.monotonic() < deadline, f"the child never got to {what}"
        time.sleep(0.005)


def reap(proc: subprocess.Popen[str]) -> None:
    """Kill `proc` if it still runs, wait for it and close its pipes."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
