"""What each half of `FencedPostgresSaver` (claims, events, removals) uses from the saver.

Invariant: the halves reach the database only through `_engine` (one
transaction per call), judge time by `_now()` (None: the database server's
clock, read in the statement) and send NOTIFY only when `_notify`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .connection import PgConnection

if TYPE_CHECKING:
    from .runs import LatestRoots

__all__ = ["PgHalf"]


class PgHalf:
    """The saver's attributes the PostgreSQL halves share (the saver sets them)."""

    _engine: PgConnection
    _notify: bool
    _poll_interval: float
    _latest_roots: LatestRoots
    require_claim: bool

    def _now(self) -> float | None:
        """The injected clock's time, or None: the database's clock (the saver's)."""
        raise NotImplementedError
