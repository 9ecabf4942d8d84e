"""Child-process commands for the contract suite's multi-process cases.

Run as `python -m langgraph_fenced_sqlite.testing.child COMMAND JSON_ARGS`;
each command prints one JSON document per line on stdout, so a parent can
follow it. Processes are real (`subprocess` with `sys.executable`), never
mocks, so locks, WAL and crashes behave as in production.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from ..errors import FencedSqliteError
from ..saver import FencedSqliteSaver

__all__ = ["COMMANDS", "spawn"]

COMMANDS: dict[str, Callable[[dict[str, Any]], None]] = {}


def command(fn: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """Register `fn` as a child command under its name."""
    COMMANDS[fn.__name__] = fn
    return fn


def emit(**fields: Any) -> None:
    """Print one JSON line and flush (the parent reads line by line)."""
    print(json.dumps(fields), flush=True)


@command
def claim(args: dict[str, Any]) -> None:
    """Claim `thread_id` as `holder` (after waiting for `start_at`, a file flag).

    Prints `{"ok": true, "token": ...}` or `{"ok": false, "code": ..., "holder": ...}`.
    """
    with FencedSqliteSaver(args["path"]) as saver:
        _wait_for_flag(args.get("start_flag"))
        try:
            granted = saver.claim(args["thread_id"], args["holder"], args.get("ttl", 60))
            emit(ok=True, token=granted.token, holder=granted.holder)
        except FencedSqliteError as exc:
            emit(ok=False, **exc.to_dict())


def _wait_for_flag(flag: str | None) -> None:
    """Spin until the file `flag` exists, so many children start together."""
    if not flag:
        return
    import os
    import time

    while not os.path.exists(flag):
        time.sleep(0.001)


def spawn(command_name: str, **args: Any) -> subprocess.Popen[str]:
    """Start `command_name` in a child process; read its JSON lines from stdout."""
    if command_name not in COMMANDS:
        raise ValueError(f"command_name: unknown child command {command_name!r}")
    return subprocess.Popen(
        [sys.executable, "-m", "langgraph_fenced_sqlite.testing.child", command_name,
         json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def main(argv: list[str]) -> None:
    """Run the command named in `argv[0]` with the JSON arguments in `argv[1]`."""
    COMMANDS[argv[0]](json.loads(argv[1]))


if __name__ == "__main__":
    main(sys.argv[1:])
