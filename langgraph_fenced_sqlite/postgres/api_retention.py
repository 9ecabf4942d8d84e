"""The deletion half of `FencedPostgresSaver`: runs, copies, prunes and turns, fenced like writes.

Invariant: every method validates its arguments with the SQLite saver's
validators, then runs one transaction from `removals.py` that fences every
thread it changes before changing any; the first refusal changes nothing.
A dry run is the real prune, rolled back. Mixed into `FencedPostgresSaver`.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from ..errors import bad_argument
from ..retention import PruneResult, Retraction
from ..validation import check_bool, check_int, check_iterable, check_name
from . import removals
from .connection import PgConnection

__all__ = ["PgRetentionAPI"]

_list = builtins.list


class PgRetentionAPI:
    """LangGraph's deletion capabilities, fenced (see docs/semantics.md §6)."""

    _engine: PgConnection
    _notify: bool
    require_claim: bool

    def _now(self) -> float | None:
        raise NotImplementedError  # the saver's

    def delete_for_runs(self, run_ids: Sequence[str], *, token: int | None = None) -> None:
        """Remove every checkpoint and write made by the given runs, in one transaction.

        Fenced like a write on every thread holding a row of those runs; the
        first refusal changes nothing anywhere.

        Raises:
            ThreadBusy: unfenced, and a touched thread has a live claim (or
                the store requires claims).
            StaleClaim: `token` is not the current claim of a touched thread.
        """
        ids = [check_name(r, "run_ids[]") for r in check_iterable(run_ids, "run_ids")]
        if token is not None:
            check_int(token, "token")
        if not ids:
            return
        now = self._now()
        self._engine.run(
            "delete_for_runs",
            lambda cur: removals.delete_for_runs(
                cur, ids, token, now=now, require_claim=self.require_claim, notify=self._notify
            ),
        )

    async def adelete_for_runs(self, run_ids: Sequence[str], *, token: int | None = None) -> None:
        """Async twin of `delete_for_runs`."""
        return await self._engine.arun(self.delete_for_runs, run_ids, token=token)

    def copy_thread(
        self, source_thread_id: str, target_thread_id: str, *, token: int | None = None
    ) -> None:
        """Copy every checkpoint and write of one thread into another, fenced on the target.

        Copying again adds nothing.

        Raises:
            ThreadBusy: unfenced, and the target has a live claim.
            StaleClaim: `token` is not the target's current claim.
            CheckpointConflict: the target holds a different checkpoint under
                one of the source's ids; nothing is copied.
        """
        src = check_name(source_thread_id, "source_thread_id")
        dst = check_name(target_thread_id, "target_thread_id")
        if token is not None:
            check_int(token, "token")
        now = self._now()
        self._engine.run(
            "copy_thread",
            lambda cur: removals.copy_thread(
                cur, src, dst, token, now=now, require_claim=self.require_claim, notify=self._notify
            ),
        )

    async def acopy_thread(
        self, source_thread_id: str, target_thread_id: str, *, token: int | None = None
    ) -> None:
        """Async twin of `copy_thread`."""
        return await self._engine.arun(
            self.copy_thread, source_thread_id, target_thread_id, token=token
        )

    def prune(
        self,
        thread_ids: Sequence[str],
        *,
        strategy: str = "keep_latest",
        dry_run: bool = False,
        token: int | None = None,
    ) -> _list[PruneResult]:
        """Remove old history from each listed thread, fenced like a write, in one transaction.

        Args:
            thread_ids: The threads to prune.
            strategy: `"keep_latest"` (each namespace's latest checkpoint and
                its writes stay) or `"delete"` (everything goes).
            dry_run: Only report what would be removed (the real prune, rolled back).
            token: The caller's claim on the (one) thread, if any.

        Raises:
            ThreadBusy: without `token`, a listed thread has a live claim.
            StaleClaim: `token` is not the current claim of a listed thread.
        """
        ids = [check_name(t, "thread_ids[]") for t in check_iterable(thread_ids, "thread_ids")]
        check_bool(dry_run, "dry_run")
        if token is not None:
            check_int(token, "token")
        if strategy not in ("keep_latest", "delete"):
            raise bad_argument("strategy", f"expected 'keep_latest' or 'delete', got {strategy!r}")
        if not ids:
            return []
        now = self._now()

        def job(cur: Any) -> _list[PruneResult]:
            out = [
                removals.prune(
                    cur,
                    t,
                    strategy,
                    token,
                    now=now,
                    require_claim=self.require_claim,
                    notify=self._notify,
                )
                for t in ids
            ]
            if dry_run:
                raise _DryRun(out)
            return out

        try:
            return self._engine.run("prune", job)
        except _DryRun as done:
            return done.results

    async def aprune(
        self,
        thread_ids: Sequence[str],
        *,
        strategy: str = "keep_latest",
        dry_run: bool = False,
        token: int | None = None,
    ) -> _list[PruneResult]:
        """Async twin of `prune`."""
        return await self._engine.arun(
            self.prune, thread_ids, strategy=strategy, dry_run=dry_run, token=token
        )

    def retract_turn(self, thread_id: str, token: int, *, run_id: str | None = None) -> Retraction:
        """Remove one turn (a run's checkpoints and writes, all namespaces).

        Without `run_id`, the run that wrote the latest root checkpoint goes;
        where checkpoints carry no run id, everything from the newest root
        `input` checkpoint on. Appends a `retracted` event. The same rule as
        the SQLite store's (`retention.plan_retraction`).

        Raises:
            StaleClaim: `token` is not the thread's claim (nothing changes).
        """
        check_name(thread_id, "thread_id")
        check_int(token, "token")
        if run_id is not None:
            check_name(run_id, "run_id")
        now = self._now()
        return self._engine.run(
            "retract_turn",
            lambda cur: removals.retract(
                cur, thread_id, token, run_id, now=now, notify=self._notify
            ),
        )

    async def aretract_turn(
        self, thread_id: str, token: int, *, run_id: str | None = None
    ) -> Retraction:
        """Async twin of `retract_turn`."""
        return await self._engine.arun(self.retract_turn, thread_id, token, run_id=run_id)


class _DryRun(Exception):
    """Raised inside a dry run's transaction so that it rolls back, carrying the report."""

    def __init__(self, results: _list[PruneResult]) -> None:
        super().__init__("dry run")
        self.results = results
