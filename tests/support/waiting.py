"""Waits on other threads, bounded by events and not by time, and what they wait for.

`until` waits for another thread to get somewhere; `store_held` keeps a
store's engine busy as a long commit would; `interrupt_when` sends a real
Ctrl-C; `put_writes_in_thread` starts a write that may wait for its step's
put; `follow_bound` sets how long such a write waits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any


def until(predicate: Callable[[], Any], what: str = "the other thread got there") -> None:
    """Wait until `predicate()` holds (`what` it means): bounded, not timed."""
    for _ in range(3000):
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


@contextlib.contextmanager
def store_held(engine: Any) -> Iterator[None]:
    """Keep `engine` busy with a call of another thread until the block ends.

    Calls made meanwhile queue behind it, as behind a long commit.
    """
    gate, holding = threading.Event(), threading.Event()

    def hold(conn: Any) -> None:
        holding.set()
        gate.wait(30)

    blocker = threading.Thread(target=engine.run, args=("hold", hold))
    blocker.start()
    assert holding.wait(30)
    try:
        yield
    finally:
        gate.set()
        blocker.join(30)


def interrupt_when(predicate: Callable[[], Any]) -> threading.Thread:
    """Start a thread that sends this process a real SIGINT (Ctrl-C) once `predicate()` holds.

    A signal, not a raised exception: it ends a blocked wait in the main thread.
    """

    def run() -> None:
        until(predicate)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def put_writes_in_thread(saver: Any, config: Any, out: dict[str, Any]) -> threading.Thread:
    """Start `saver.put_writes(config, [("x", 1)], "task-1")` in a thread; its outcome
    (None or the exception) lands in `out["writes"]`."""

    def run() -> None:
        try:
            out["writes"] = saver.put_writes(config, [("x", 1)], "task-1")
        except Exception as exc:  # noqa: BLE001 - recorded for the assertions
            out["writes"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def follow_bound(monkeypatch: Any, seconds: float) -> None:
    """Let a write awaiting its step's put wait exactly `seconds` (whatever the disk's speed)."""
    from langgraph_fenced_sqlite.core import steps

    monkeypatch.setattr(steps, "FOLLOW_MIN_S", seconds)
    monkeypatch.setattr(steps, "FOLLOW_MAX_S", seconds)
    monkeypatch.setattr(steps, "CHEAP_COMMIT_S", 0.0)
