"""The history-removing half of `FencedSqliteSaver`: deletion, retention, copying, retraction.

Invariant: each method validates its arguments before the file is touched,
then runs one engine transaction (`retention.py`), in which every fence
check comes before any change, so a refused call changes nothing. LangGraph's
extended methods (`delete_for_runs`, `copy_thread`, `prune`) are fenced like
writes on every thread they touch. Mixed into `FencedSqliteSaver`, which
provides `_engine` and `require_claim`.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from . import maintenance, retention
from .api_threads import inactive_for_seconds
from .clock import read_now
from .errors import ReadOnlyStore, UndecodableRow, bad_argument
from .maintenance import SweepResult, VacuumReport
from .retention import PruneResult, RetentionPolicy, Retraction
from .validation import check_bool, check_int, check_iterable, check_name

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["RetentionAPI"]

# `list` is not shadowed here, but the signatures match the saver's.
_list = builtins.list


class RetentionAPI:
    """Deletion, retention, copying and retraction (docs/semantics.md §6)."""

    _engine: Engine
    require_claim: bool

    def delete_thread(self, thread_id: str) -> None:
        """Remove a thread's checkpoints, writes, events, floor and claim.

        The id then names a new thread, in the next incarnation, whose events
        start at 1; a reader still at a position of the old incarnation gets
        `ReplayUnavailable` (docs/semantics.md §5). Tokens issued afterwards are still
        greater than every earlier one. An unknown thread: nothing happens.
        The store checks no claim (`FencedRunner.delete_thread` does).
        """
        check_name(thread_id, "thread_id")
        self._engine.write("delete_thread", lambda c: retention.delete_thread_txn(c, thread_id))

    async def adelete_thread(self, thread_id: str) -> None:
        """Async twin of `delete_thread`."""
        return await self._engine.arun(self.delete_thread, thread_id)

    def delete_for_runs(self, run_ids: Sequence[str], *, token: int | None = None) -> None:
        """Remove every checkpoint and write made by the given runs, in one transaction.

        Fenced like a write on every thread that holds a row of those runs:
        without `token`, a thread under a live claim refuses it; with
        `token`, each such thread's current claim must carry it. A token
        belongs to one claim of one thread, so a fenced call may only touch
        that thread: runs that also wrote elsewhere are `StaleClaim` (delete
        them there with that thread's token, or unfenced once it is free).
        The first refusal changes nothing anywhere. Each affected thread gets
        one `runs_deleted` event (its `data` names the run ids, the removed
        `(namespace, checkpoint_id)` pairs and the number of writes).

        Args:
            run_ids: The runs (their metadata `run_id`).
            token: The caller's claim on the thread the runs wrote, if any.

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
        now = read_now(self._engine.clock)
        self._engine.write(
            "delete_for_runs",
            lambda c: retention.delete_for_runs_txn(
                c, ids, token, now=now, require_claim=self.require_claim
            ),
        )

    async def adelete_for_runs(self, run_ids: Sequence[str], *, token: int | None = None) -> None:
        """Async twin of `delete_for_runs`."""
        return await self._engine.arun(self.delete_for_runs, run_ids, token=token)

    def copy_thread(
        self, source_thread_id: str, target_thread_id: str, *, token: int | None = None
    ) -> None:
        """Copy every checkpoint and write of one thread into another, in one transaction.

        Fenced on the target like a write: without `token`, a live claim on
        it refuses the copy; with `token`, the target's current claim must
        carry it. Appends a `checkpoint` event per copied checkpoint and a
        `copied` event naming them. Copying again is a no-op: checkpoints
        the target holds identically, and writes it already has, stay as
        they are (nothing new, no event).

        Args:
            source_thread_id: The thread read.
            target_thread_id: The thread written.
            token: The caller's claim on the target, if any.

        Raises:
            ThreadBusy: unfenced, and the target has a live claim (or the
                store requires claims).
            StaleClaim: `token` is not the target's current claim.
            CheckpointConflict: the target holds a different checkpoint
                under one of the source's ids (the message names them all);
                nothing is copied.
        """
        src = check_name(source_thread_id, "source_thread_id")
        dst = check_name(target_thread_id, "target_thread_id")
        if token is not None:
            check_int(token, "token")
        now = read_now(self._engine.clock)
        self._engine.write(
            "copy_thread",
            lambda c: retention.copy_thread_txn(
                c, src, dst, token, now=now, require_claim=self.require_claim
            ),
        )

    async def acopy_thread(
        self, source_thread_id: str, target_thread_id: str, *, token: int | None = None
    ) -> None:
        """Async twin of `copy_thread`."""
        return await self._engine.arun(
            self.copy_thread, source_thread_id, target_thread_id, token=token
        )

    # Returns a report where LangGraph's returns None (see the saver's class line).
    def prune(
        self,
        thread_ids: Sequence[str],
        *,
        strategy: str | RetentionPolicy = "keep_latest",
        dry_run: bool = False,
        token: int | None = None,
    ) -> _list[PruneResult]:
        """Remove old history from each listed thread.

        LangGraph's strategies remove history, so they are fenced like a
        write on every listed thread (docs/semantics.md §6): without `token`, a thread
        under someone's live claim refuses it; with `token`, every listed
        thread's current claim must carry it (a token is one thread's, so
        list only that thread). They run as one transaction, so the first
        refusal changes nothing on any thread, and append one `pruned` event
        per thread they removed anything from (`strategy`, the removed
        `checkpoints` and the number of `writes`). A `RetentionPolicy` keeps
        the latest checkpoint of each namespace, so no owner's next write
        depends on what it removes: it needs no claim (a given `token` is
        checked all the same) and runs one transaction per thread, so a long
        list never holds the write lock longer than one thread's prune.
        Every strategy but `"delete"` also removes orphan writes (see
        `PruneResult.writes_removed`).

        Args:
            thread_ids: The threads to prune.
            strategy: `"keep_latest"` (the latest checkpoint of each namespace
                and what it needs), `"delete"` (every checkpoint and event),
                or a `RetentionPolicy`.
            dry_run: Only report what would be removed.
            token: The caller's claim on the (one) thread, if any.

        Returns:
            One `PruneResult` per thread.

        Raises:
            ThreadBusy: `"delete"` without `token` on a thread under a live
                claim (or on a store that requires claims).
            StaleClaim: `token` is not the current claim of a listed thread.
        """
        ids = [check_name(t, "thread_ids[]") for t in check_iterable(thread_ids, "thread_ids")]
        check_bool(dry_run, "dry_run")
        if token is not None:
            check_int(token, "token")
        if isinstance(strategy, RetentionPolicy):
            policy, latest_only = strategy, False
        elif strategy == "keep_latest":
            policy, latest_only = RetentionPolicy(), True
        elif strategy == "delete":
            policy, latest_only = None, False
            if dry_run:
                raise bad_argument("dry_run", "not supported with strategy='delete'")
        else:
            raise bad_argument(
                "strategy",
                f"expected 'keep_latest', 'delete' or a RetentionPolicy, got {strategy!r}",
            )
        if not ids:
            return []
        now = read_now(self._engine.clock)
        if not isinstance(strategy, RetentionPolicy):
            # LangGraph's strategies are fenced: every listed thread's fence
            # holds, or nothing changes on any of them.
            return self._engine.write(
                "prune",
                lambda c: [
                    self._prune_one(c, t, policy, latest_only, dry_run, token, now) for t in ids
                ],
            )
        # A retention policy needs no claim, so each thread is its own
        # transaction: a long list never holds the write lock longer than one
        # thread's prune (writers of other threads go on meanwhile).
        out: _list[PruneResult] = []
        for thread_id in ids:

            def job(conn: Any, thread_id: str = thread_id) -> PruneResult:
                return self._prune_one(conn, thread_id, policy, latest_only, dry_run, token, now)

            out.append(self._engine.write("prune", job))
        return out

    def _prune_one(
        self,
        conn: Any,
        thread_id: str,
        policy: RetentionPolicy | None,
        latest_only: bool,
        dry_run: bool,
        token: int | None,
        now: float,
    ) -> PruneResult:
        if policy is None:
            return retention.delete_all_checkpoints_txn(
                conn, thread_id, token, now=now, require_claim=self.require_claim
            )
        if latest_only:
            # LangGraph's "keep_latest" is fenced and logged like "delete".
            return retention.keep_latest_txn(
                conn, thread_id, token, now=now, require_claim=self.require_claim, dry_run=dry_run
            )
        if token is not None:
            retention.fence_existing(conn, thread_id, token, now=now, require_claim=False)
        return retention.prune_txn(conn, thread_id, policy, now=now, dry_run=dry_run)

    async def aprune(
        self,
        thread_ids: Sequence[str],
        *,
        strategy: str | RetentionPolicy = "keep_latest",
        dry_run: bool = False,
        token: int | None = None,
    ) -> _list[PruneResult]:
        """Async twin of `prune`."""
        return await self._engine.arun(
            self.prune, thread_ids, strategy=strategy, dry_run=dry_run, token=token
        )

    # --- an operator's sweep and vacuum ---------------------------------------------------

    def sweep(
        self,
        policy: RetentionPolicy,
        *,
        inactive_for: float | timedelta | None = None,
        dry_run: bool = False,
        on_thread: Callable[[PruneResult], None] | None = None,
    ) -> SweepResult:
        """Prune every thread of the file by `policy`, one transaction per thread.

        A sweep never holds the write lock longer than one thread's prune:
        writers of other threads (any process) commit between two threads'
        prunes. Each thread's transaction decides for itself whether it still
        qualifies, so a thread claimed or written meanwhile is left alone.
        Like `prune` with a policy, it needs no claim and logs no event.

        Args:
            policy: What to keep (see `RetentionPolicy`; `max_subgraph_runs`
                removes past subgraph runs' namespaces).
            inactive_for: Only threads not written (no checkpoint, no event)
                for at least this long, by the store's clock; None: every thread.
            dry_run: Only report what would be removed.
            on_thread: Called with each thread's result after its
                transaction committed (outside the store's lock).

        Returns:
            The threads swept, those left alone under a live claim, and those
            whose rows do not decode.
        """
        if not isinstance(policy, RetentionPolicy):
            raise bad_argument("policy", f"expected a RetentionPolicy, got {policy!r}")
        idle_for = inactive_for_seconds(inactive_for)
        check_bool(dry_run, "dry_run")
        if on_thread is not None and not callable(on_thread):
            raise bad_argument("on_thread", "expected a callable or None")
        result = SweepResult()
        for thread_id in self._engine.read("sweep", maintenance.thread_ids):

            def job(conn: Any, thread_id: str = thread_id) -> PruneResult | str | None:
                return maintenance.sweep_thread_txn(
                    conn,
                    thread_id,
                    policy,
                    now=read_now(self._engine.clock),
                    idle_for=idle_for,
                    dry_run=dry_run,
                )

            try:
                done = self._engine.write("sweep", job)
            except UndecodableRow as exc:
                result.errors.append(exc.to_dict())
                continue
            if done == "busy":
                result.busy.append(thread_id)
            elif isinstance(done, PruneResult):
                result.pruned.append(done)
                if on_thread is not None:
                    on_thread(done)
        return result

    async def asweep(
        self,
        policy: RetentionPolicy,
        *,
        inactive_for: float | timedelta | None = None,
        dry_run: bool = False,
        on_thread: Callable[[PruneResult], None] | None = None,
    ) -> SweepResult:
        """Async twin of `sweep` (`on_thread` runs on the store's worker thread)."""
        return await self._engine.arun(
            self.sweep, policy, inactive_for=inactive_for, dry_run=dry_run, on_thread=on_thread
        )

    def vacuum(self, *, force: bool = False) -> VacuumReport:
        """Reclaim the file's free pages (SQLite's `VACUUM`), then truncate the WAL.

        VACUUM rewrites the whole file and holds the write lock meanwhile, so
        by default it refuses while a writer is active: a live claim on any
        thread, or another connection holding the write lock. Readers may go
        on; one holding an old snapshot keeps the WAL from being truncated.

        Args:
            force: Vacuum despite live claims (their holders' writes wait for
                it, up to their busy timeout), waiting for the write lock up
                to this store's `busy_timeout`.

        Returns:
            The file's size (with its WAL) before and after.

        Raises:
            ThreadBusy: a live claim exists (unless `force`); nothing changed.
            StoreBusy: another connection holds the write lock (unless
                `force`), or held it past `busy_timeout`; nothing changed.
            ReadOnlyStore: the store was opened with `readonly=True`.
        """
        check_bool(force, "force")
        if self._engine.readonly:
            raise ReadOnlyStore("vacuum", self._engine.path)
        return self._engine.run(
            "vacuum",
            lambda c: maintenance.vacuum_job(
                c, self._engine.path, now=read_now(self._engine.clock), force=force
            ),
        )

    async def avacuum(self, *, force: bool = False) -> VacuumReport:
        """Async twin of `vacuum`."""
        return await self._engine.arun(self.vacuum, force=force)

    # --- retraction -------------------------------------------------------------------------

    def retract_turn(self, thread_id: str, token: int, *, run_id: str | None = None) -> Retraction:
        """Remove one turn (a run's checkpoints and writes, all namespaces).

        Without `run_id`, the run that wrote the latest root checkpoint goes;
        where checkpoints carry no run id, everything from the newest root
        `input` checkpoint on. Appends a `retracted` event.

        Raises:
            StaleClaim: `token` is not the thread's claim (nothing changes).
        """
        check_name(thread_id, "thread_id")
        check_int(token, "token")
        if run_id is not None:
            check_name(run_id, "run_id")
        now = read_now(self._engine.clock)
        return self._engine.write(
            "retract_turn", lambda c: retention.retract_txn(c, thread_id, token, run_id, now=now)
        )

    async def aretract_turn(
        self, thread_id: str, token: int, *, run_id: str | None = None
    ) -> Retraction:
        """Async twin of `retract_turn`."""
        return await self._engine.arun(self.retract_turn, thread_id, token, run_id=run_id)
