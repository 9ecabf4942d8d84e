"""Child-process commands for the event-log tests: writers and watchers.

Run as `python -m langgraph_fenced_sqlite.testing.child_events COMMAND JSON_ARGS`.
Each command prints one JSON document per line on stdout and flushes it, so
a parent follows it line by line and knows exactly what the child delivered
before it was stopped or killed. Every command is bounded in time, so a
child never outlives a parent that died. Processes are real (`subprocess`
with `sys.executable`), never mocks.
"""

from __future__ import annotations

import json
import queue
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import ReplayUnavailable
from ..sqlite.saver import FencedSqliteSaver

__all__ = ["COMMANDS", "LineReader", "run_child", "spawn"]

COMMANDS: dict[str, Callable[[dict[str, Any]], None]] = {}

# Upper bound on any child's life (seconds), whatever the parent does.
_MAX_LIFE = 120.0


def command(fn: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """Register `fn` as a child command under its name."""
    COMMANDS[fn.__name__] = fn
    return fn


def emit(**fields: Any) -> None:
    """Print one JSON line and flush it (the parent reads line by line)."""
    print(json.dumps(fields), flush=True)


@command
def append(args: dict[str, Any]) -> None:
    """Commit `count` events, one per transaction, with `token` on `thread_id`.

    Each event is `(kind, {"i": i})` for i = 1..count. With `max_pause_ms`,
    sleeps a random 0..max_pause_ms between commits. Prints `{"seq": s}`
    after each commit when `each` is set, then `{"done": true, "seqs": [...]}`.
    """
    rng = random.Random(args.get("seed"))
    pause = args.get("max_pause_ms", 0) / 1000.0
    seqs: list[int] = []
    with FencedSqliteSaver(args["path"], busy_timeout=30) as saver:
        for i in range(1, args["count"] + 1):
            # Typed Any: in saver.py, `list[int]` names the method `list` for mypy.
            given: Any = saver.append_events(
                args["thread_id"], args["token"], [(args.get("kind", "e"), {"i": i})]
            )
            seq = given[0]
            seqs.append(seq)
            if args.get("each"):
                emit(seq=seq)
            if pause:
                time.sleep(rng.uniform(0, pause))
    emit(done=True, seqs=seqs)


@command
def watch(args: dict[str, Any]) -> None:
    """Watch `thread_id` from `after_seq`, printing each event as it arrives.

    Prints `{"ready": true}` once the watch is open, then
    `{"seq": ..., "kind": ..., "data": ...}` per event. Stops after `count`
    events if given (else runs until killed or `timeout`), then prints
    `{"stopped": true, "last_seq": n}`; on `timeout` (default 60 s) it prints
    `{"timeout": true, "last_seq": n}` instead, and on `ReplayUnavailable`
    `{"replay_unavailable": true, "incarnation": k, "floor": f, "last_seq": n}`.
    """
    count = args.get("count")
    with FencedSqliteSaver(args["path"], busy_timeout=30) as saver:
        subscription = saver.watch(args["thread_id"], args.get("after_seq", 0))
        timer = threading.Timer(min(args.get("timeout", 60.0), _MAX_LIFE), subscription.close)
        timer.daemon = True
        timer.start()
        delivered = 0
        with subscription:
            emit(ready=True)
            try:
                for event in subscription:
                    emit(seq=event.seq, kind=event.kind, data=event.data)
                    delivered += 1
                    if count is not None and delivered >= count:
                        timer.cancel()
                        emit(stopped=True, last_seq=subscription.last_seq)
                        return
            except ReplayUnavailable as exc:
                timer.cancel()
                emit(
                    replay_unavailable=True,
                    incarnation=exc.incarnation,
                    floor=exc.floor,
                    last_seq=subscription.last_seq,
                )
                return
        emit(timeout=True, last_seq=subscription.last_seq)


def spawn(command_name: str, **args: Any) -> subprocess.Popen[str]:
    """Start `command_name` in a child process; read its JSON lines from stdout.

    Raises:
        ValueError: `command_name` is not a registered command.
    """
    if command_name not in COMMANDS:
        raise ValueError(f"command_name: unknown child command {command_name!r}")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "langgraph_fenced_sqlite.testing.child_events",
            command_name,
            json.dumps(args),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class LineReader:
    """Read a child's JSON lines with a bound on each wait.

    A reader thread feeds a queue, so `next_line(timeout)` never blocks longer
    than asked even when the child stalls.
    """

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        """Start reading `proc.stdout` on a daemon thread."""
        self.proc = proc
        self._lines: queue.Queue[str | None] = queue.Queue()
        assert proc.stdout is not None
        stdout = proc.stdout

        def pump() -> None:
            for line in stdout:
                self._lines.put(line)
            self._lines.put(None)

        self._thread = threading.Thread(target=pump, daemon=True)
        self._thread.start()

    def next_line(self, timeout: float = 30.0) -> dict[str, Any]:
        """Return the next JSON line as a dict.

        Raises:
            AssertionError: no line within `timeout`, or the child ended
                (with its stderr in the message).
        """
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"child printed nothing for {timeout}s") from None
        if line is None:
            self.proc.wait(10)
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"child ended (rc={self.proc.returncode}): {err}")
        return json.loads(line)

    def lines_until(
        self, stop: Callable[[dict[str, Any]], bool], timeout: float = 30.0
    ) -> Iterator[dict[str, Any]]:
        """Yield lines up to and including the first for which `stop` is true."""
        while True:
            line = self.next_line(timeout)
            yield line
            if stop(line):
                return

    def finish(self, timeout: float = 30.0) -> int:
        """Wait for the child to exit (killing it past `timeout`); return its exit code."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"child did not exit within {timeout}s") from None
        finally:
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()


def run_child(command_name: str, *, timeout: float = 60.0, **args: Any) -> list[dict[str, Any]]:
    """Run a command to completion and return its JSON lines.

    Raises:
        AssertionError: the child failed or outlived `timeout` (it is killed).
    """
    proc = spawn(command_name, **args)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"child {command_name} ran over {timeout}s") from None
    if proc.returncode != 0:
        raise AssertionError(f"child {command_name} failed (rc={proc.returncode}): {err}")
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def main(argv: list[str]) -> None:
    """Run the command named in `argv[0]` with the JSON arguments in `argv[1]`."""
    COMMANDS[argv[0]](json.loads(argv[1]))


if __name__ == "__main__":
    main(sys.argv[1:])
