"""An operator's maintenance, decided once: what a sweep and a vacuum report, who is idle.

Invariant: a thread is inactive by one rule (`is_inactive`), for sweeps on
either store.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .retention import PruneResult

__all__ = ["SweepResult", "VacuumReport", "file_bytes"]


@dataclass(frozen=True)
class SweepResult:
    """What `sweep` did (or, with `dry_run`, would do).

    Attributes:
        pruned: One `PruneResult` per thread swept (those that removed
            nothing included), in thread id order.
        busy: Threads left alone because a live claim holds them.
        errors: Threads left alone because a row of theirs does not decode
            (each an `UndecodableRow` as a dict); the sweep goes on past them.
    """

    pruned: list[PruneResult] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class VacuumReport:
    """What `vacuum` reclaimed.

    Attributes:
        path: The database file (on PostgreSQL: the server and database).
        bytes_before: The file's size with its WAL, before (on PostgreSQL:
            the store's tables with their indexes and TOAST).
        bytes_after: The same, after (the WAL truncated unless a reader held
            it; on PostgreSQL, smaller only where whole pages at a table's
            end were emptied, see `FencedPostgresSaver.vacuum`).
    """

    path: str
    bytes_before: int
    bytes_after: int


@dataclass
class RepackReport:
    """What `repack` rewrote (or, with `dry_run`, would rewrite).

    Attributes:
        threads: The threads that held checkpoints with values inline.
        checkpoints: The checkpoints whose values moved to the value table.
        inline_bytes: The bytes those checkpoints' inline values held.
        stored_bytes: The bytes of the value rows written for them (what
            they share with their parents is not counted twice).
        skipped: One entry per checkpoint left inline: `thread_id`,
            `checkpoint_id` and `reason` (does not decode, changed meanwhile).
        dry_run: Whether nothing was written.
    """

    threads: list[str] = field(default_factory=list)
    checkpoints: int = 0
    inline_bytes: int = 0
    stored_bytes: int = 0
    skipped: list[dict[str, Any]] = field(default_factory=list)
    dry_run: bool = False


def file_bytes(path: str) -> int:
    """Return the size of `path` plus its WAL (0 for what does not exist)."""
    total = 0
    for name in (path, path + "-wal"):
        try:
            total += os.path.getsize(name)
        except OSError:
            pass
    return total
