"""The only source of time for claims, retention and event timestamps.

Invariant: a store reads time through one `Clock`; expiry is judged by that
clock alone (`now < expires_at` is live), so tests can move time by hand and
nothing in the package calls `time.time()` for a decision.
"""

from __future__ import annotations

import math
import threading
import time
from datetime import timedelta
from typing import Protocol, runtime_checkable

from .errors import bad_argument

__all__ = ["Clock", "ManualClock", "SystemClock", "read_now", "to_seconds"]


@runtime_checkable
class Clock(Protocol):
    """Tell the wall time (for expiry and records) and a monotonic time (for waits)."""

    def now(self) -> float:
        """Return wall-clock seconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Return seconds from an arbitrary origin that never go back."""
        ...


class SystemClock:
    """Read the machine's clocks."""

    def now(self) -> float:
        """Return `time.time()`."""
        return time.time()

    def monotonic(self) -> float:
        """Return `time.monotonic()`."""
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to, for tests; safe across threads."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        """Start at `start` seconds since the epoch."""
        self._now = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        """Return the current manual time."""
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        """Return the current manual time (it never goes back)."""
        return self.now()

    def advance(self, seconds: float | timedelta) -> float:
        """Move time forward by `seconds` and return the new time."""
        step = to_seconds(seconds, "seconds", allow_zero=True)
        with self._lock:
            self._now += step
            return self._now

    def set(self, when: float) -> None:
        """Jump to `when`, which must not be in the past."""
        with self._lock:
            if when < self._now:
                raise bad_argument("when", "a ManualClock never goes back")
            self._now = float(when)


def to_seconds(value: object, name: str, *, allow_zero: bool = False) -> float:
    """Return `value` (seconds or a `timedelta`) as positive float seconds.

    Raises:
        TypeError: `value` is not a number or a timedelta (naming `name`).
        ValueError: `value` is not positive and finite (naming `name`).
    """
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an int beyond a float's range
            raise bad_argument(name, f"too large: {value!r}") from None
    else:
        raise bad_argument(name, f"expected seconds or a timedelta, got {type(value).__name__}")
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise bad_argument(name, f"must be finite, got {value!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise bad_argument(name, f"must be positive, got {value!r}")
    return seconds


def read_now(clock: Clock) -> float:
    """Return `clock.now()`: the one way the store reads its clock.

    A reading that is not a finite real number is refused: NaN compares false
    with everything, so `now < expires_at` would call every claim expired and
    grant a second live claim; +inf expires every claim at once, and -inf
    grants claims that never expire. Claims and runs read the clock inside
    their job, once the write lock is had (so a call that waited for the lock
    still judges expiry by a fresh reading); a bad reading raises there before
    any statement of the write runs, and the empty transaction is rolled back,
    so the file's bytes never change. Other writes read it just before they
    are submitted.

    Raises:
        InvalidArgument: (naming `clock`) the reading is not a finite int or
            float. It is the caller's injected clock that is wrong, not the
            database, so this is not a `StoreError`.
    """
    if type(clock) is SystemClock:
        # The default clock (every write reads it): `time.time()` is a finite
        # float, so its reading needs none of the checks below.
        return time.time()
    value = clock.now()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_argument("clock", f"now() must return seconds as a float, got {value!r}")
    try:
        seconds = float(value)
    except OverflowError:
        raise bad_argument("clock", f"now() returned {value!r}, beyond a float") from None
    if not math.isfinite(seconds):
        raise bad_argument("clock", f"now() must return a finite number, got {value!r}")
    return seconds
