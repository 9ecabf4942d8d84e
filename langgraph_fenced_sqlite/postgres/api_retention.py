"""The deletion half of `FencedPostgresSaver`: its primitives behind `RemovalsBase`.

Invariant: each primitive gets arguments `RemovalsBase` has checked and runs
one transaction from `removals.py` that fences every thread it changes
before changing any; the first refusal changes nothing. A dry run is the
real prune, rolled back. Mixed into `FencedPostgresSaver`, which provides
`_engine`, `_now`, `_notify` and `require_claim`.
"""

from __future__ import annotations

import builtins
from typing import Any

from ..base_retention import RemovalsBase
from ..errors import bad_argument
from ..retention import PruneResult
from . import removals
from .half import PgHalf

__all__ = ["PgRetentionAPI"]

_list = builtins.list


class PgRetentionAPI(RemovalsBase, PgHalf):
    """LangGraph's deletion capabilities, fenced (see `RemovalsBase`), on PostgreSQL."""

    def _delete_thread(self, thread_id: str) -> None:
        self._engine.run("delete_thread", lambda cur: removals.delete_thread(cur, thread_id))

    def _delete_for_runs(self, run_ids: _list[str], token: int | None) -> None:
        now = self._now()
        self._engine.run(
            "delete_for_runs",
            lambda cur: removals.delete_for_runs(
                cur, run_ids, token, now=now, require_claim=self.require_claim, notify=self._notify
            ),
        )

    def _copy_thread(self, source: str, target: str, token: int | None) -> None:
        now = self._now()
        self._engine.run(
            "copy_thread",
            lambda cur: removals.copy_thread(
                cur,
                source,
                target,
                token,
                now=now,
                require_claim=self.require_claim,
                notify=self._notify,
            ),
        )

    def _prune_plan(self, strategy: Any, dry_run: bool) -> str:
        # No `RetentionPolicy` here (yet): only LangGraph's two strategies.
        if strategy not in ("keep_latest", "delete"):
            raise bad_argument("strategy", f"expected 'keep_latest' or 'delete', got {strategy!r}")
        return str(strategy)

    def _prune(
        self, thread_ids: _list[str], plan: str, dry_run: bool, token: int | None
    ) -> _list[PruneResult]:
        now = self._now()

        def job(cur: Any) -> _list[PruneResult]:
            out = [
                removals.prune(
                    cur,
                    t,
                    plan,
                    token,
                    now=now,
                    require_claim=self.require_claim,
                    notify=self._notify,
                )
                for t in thread_ids
            ]
            if dry_run:
                raise _DryRun(out)
            return out

        try:
            return self._engine.run("prune", job)
        except _DryRun as done:
            return done.results


class _DryRun(Exception):
    """Raised inside a dry run's transaction so that it rolls back, carrying the report."""

    def __init__(self, results: _list[PruneResult]) -> None:
        super().__init__("dry run")
        self.results = results
