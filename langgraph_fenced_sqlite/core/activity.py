"""A thread's activity: when it was last written, and whether it has been idle long enough.

Invariant: the one definition of activity, for `threads(inactive_for=...)`,
`search_threads`, `sweep(inactive_for=...)` and thread expiry alike: a
thread's newest checkpoint or event, by the store's clock. Pure functions,
imported by the modules that judge it (no import back).
"""

from __future__ import annotations

from typing import Any

__all__ = ["is_inactive", "last_activity"]


def last_activity(last_checkpoint_at: Any, last_event_at: Any) -> float:
    """Return when a thread was last written: its newest checkpoint or event (0.0 if never).

    A damaged (non-numeric) cell counts as never.
    """
    return max((x for x in (last_checkpoint_at, last_event_at, 0.0) if _number(x)), default=0.0)


def is_inactive(activity: float, now: float, idle_for: float) -> bool:
    """Whether a thread last written at `activity` has been idle `idle_for` seconds at `now`."""
    return activity <= now - idle_for


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
