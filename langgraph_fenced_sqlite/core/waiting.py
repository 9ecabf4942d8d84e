"""Waiting for a thread's events, written once: a plan (a generator) and two drivers.

Invariant: both stores wait by one loop, `wait_plan`, which decides when to
read and how long to wait; a sync driver (`drive`) and an async one
(`adrive`) carry it out with the store's own read and wake-up (psycopg's
`generators.py` and `waiting.py`). A wait reads first, then waits; every
wake-up that may concern the thread (a notification naming it, a doorbell,
a safety poll) reads again; it ends with the first events read, or with []
once `timeout` passed. A driver's callback ends a wait early by raising
`Stopped` (the watch or the store was closed, a stop was asked for).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any

from .events import Event

__all__ = ["READ", "Plan", "Stopped", "adrive", "drive", "wait_plan"]

# What the wait plan asks its driver for: read the events, or wait this long
# for a wake-up (the driver sends back the notified thread ids, or None for a
# wake-up that names no thread: a timeout, a doorbell, a poll).
READ = "read"


# A wait's plan: yields `READ` or seconds, is sent events or notified thread ids.
Plan = Generator[str | float, Any, list[Event]]


class Stopped(Exception):
    """Raised by a driver's callback: the wait was stopped (closed, or asked to stop)."""


def wait_plan(thread_id: str, timeout: float, safety_poll: float) -> Plan:
    """The one wait loop, for a sync and an async driver (psycopg's generators pattern).

    Yields `READ` (send back the events read) or seconds to wait for a
    wake-up (send back the thread ids a notification named, or None for a
    wake-up that names none: a timeout, a doorbell ring, a poll interval,
    all of which read again). The driver is already listening (LISTEN, a
    doorbell) when the plan starts, so no commit falls between a read and
    the wait that follows it.

    Returns:
        The events, or [] when `timeout` passed without any.
    """
    deadline = time.monotonic() + timeout
    got: list[Event] = yield READ
    while not got:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return []
        payloads = yield min(remaining, safety_poll)
        # Another thread's notification needs no re-read; None (a timeout,
        # the safety poll, or a wake-up that names no thread) re-reads.
        if payloads is None or thread_id in payloads:
            got = yield READ
    return got


def drive(
    plan: Plan,
    read: Callable[[], list[Event]],
    notifies: Callable[[float], set[str] | None],
) -> list[Event]:
    """Run a `wait_plan` synchronously with `read` and a wait for a wake-up.

    Raises:
        Stopped: as the callbacks raise it (their caller answers []).
    """
    try:
        step = next(plan)
        while True:
            step = plan.send(read() if step == READ else notifies(float(step)))
    except StopIteration as done:
        return list(done.value)


async def adrive(
    plan: Plan,
    read: Callable[[], Awaitable[list[Event]]],
    notifies: Callable[[float], Awaitable[set[str] | None]],
) -> list[Event]:
    """Run `wait_plan` asynchronously: the async twin of `drive`."""
    try:
        step = next(plan)
        while True:
            step = plan.send(await read() if step == READ else await notifies(float(step)))
    except StopIteration as done:
        return list(done.value)
