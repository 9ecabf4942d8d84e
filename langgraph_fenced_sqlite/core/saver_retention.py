"""Deletion, copying, pruning and expiry as both stores offer them, over a few primitives.

Invariant: every public method here checks its arguments (the same checks and
errors on either store) before the store is touched, then calls one store
primitive that runs its transaction(s), in which every fence check comes
before any change, so a refused call changes nothing. LangGraph's extended
methods (`delete_for_runs`, `copy_thread`, `prune`) are fenced like writes on
every thread they touch. The primitives live in `sqlite.saver_retention.RetentionAPI`
(SQLite) and `postgres.saver_retention.PgRetentionAPI` (PostgreSQL).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from ..clock import to_seconds
from ..errors import ReadOnlyStore, UndecodableRow, bad_argument
from .maintenance import SweepResult
from .retention import (
    TTL_STRATEGIES,
    Expired,
    Expiry,
    ExpiryReport,
    PruneResult,
    RetentionPolicy,
    Retraction,
    ThreadTTL,
    check_expiry,
    check_strategy,
)
from .saver_threads import inactive_for_seconds
from .store import UsesStore
from .sweeper import Sweeper
from .twins import async_twin
from .validation import check_bool, check_int, check_iterable, check_name

__all__ = ["RemovalsBase"]

# `list` is not shadowed here, but the signatures match the saver's.
_list = builtins.list
# Threads whose activity one short transaction remembers (a handful of key
# lookups and updates: well under one thread's removal).
_SEE_BATCH = 32


class RemovalsBase(UsesStore):
    """Deletion, copying and pruning of threads (docs/semantics.md §6), a mixin of both savers.

    A store implements the `_`-prefixed primitives below; everything public
    is written here once.
    """

    def delete_thread(self, thread_id: str) -> None:
        """Remove a thread's checkpoints, writes, events, floor and claim.

        The id then names a new thread, in the next incarnation, whose events
        start at 1; a reader still at a position of the old incarnation gets
        `ReplayUnavailable` (docs/semantics.md §5). Tokens issued afterwards are still
        greater than every earlier one: the claim's holder is fenced off (its
        next fenced write raises `StaleClaim`). An unknown thread: nothing
        happens. The store checks no claim (`FencedRunner.delete_thread` does).
        """
        check_name(thread_id, "thread_id")
        self._delete_thread(thread_id)

    adelete_thread = async_twin(delete_thread)

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
        if ids:
            self._delete_for_runs(ids, token)

    adelete_for_runs = async_twin(delete_for_runs)

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
        self._copy_thread(src, dst, token)

    acopy_thread = async_twin(copy_thread)

    # Returns a report where LangGraph's returns None (see the savers' class lines).
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
        `checkpoints` and the number of `writes`). A `RetentionPolicy`
        keeps the latest checkpoint of each
        namespace, so no owner's next write depends on what it removes: it
        needs no claim (a given `token` is checked all the same) and runs one
        transaction per thread, so a long list never holds the write lock
        longer than one thread's prune. Every strategy but `"delete"` also
        removes orphan writes (see `PruneResult.writes_removed`).

        Args:
            thread_ids: The threads to prune.
            strategy: `"keep_latest"` (the latest checkpoint of each namespace
                and what it needs), `"delete"` (every checkpoint and event),
                or a `RetentionPolicy`.
            dry_run: Only report what would be removed (not with `"delete"`).
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
        if not isinstance(strategy, RetentionPolicy) and strategy not in ("keep_latest", "delete"):
            raise bad_argument(
                "strategy",
                f"expected 'keep_latest', 'delete' or a RetentionPolicy, got {strategy!r}",
            )
        if strategy == "delete" and dry_run:
            raise bad_argument("dry_run", "not supported with strategy='delete'")
        plan = self._prune_plan(strategy)
        if not ids:
            return []
        return self._prune(ids, plan, dry_run, token)

    aprune = async_twin(prune)

    # --- an operator's sweep, and retraction ---------------------------------------------

    def sweep(
        self,
        policy: RetentionPolicy,
        *,
        inactive_for: float | timedelta | None = None,
        dry_run: bool = False,
        on_thread: Callable[[PruneResult], None] | None = None,
    ) -> SweepResult:
        """Prune every thread of the store by `policy`, one transaction per thread.

        A sweep never holds a thread longer than its one prune: writers of
        other threads (any process, any host) commit between two threads'
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
                transaction ended (outside the store's lock).

        Returns:
            The threads swept, those left alone under a live claim, and those
            whose rows do not decode.

        Raises:
            ReadOnlyStore: the store was opened with `readonly=True` (also
                for a dry run, and when there is nothing to sweep).
        """
        if not isinstance(policy, RetentionPolicy):
            raise bad_argument("policy", f"expected a RetentionPolicy, got {policy!r}")
        idle_for = inactive_for_seconds(inactive_for)
        check_bool(dry_run, "dry_run")
        if on_thread is not None and not callable(on_thread):
            raise bad_argument("on_thread", "expected a callable or None")
        if self._engine.readonly:
            # Here, not only in each thread's write: the listing comes first,
            # and a store with nothing to sweep would answer as if it could.
            raise ReadOnlyStore("sweep", self._engine.path)
        result = SweepResult()
        for thread_id in self._sweep_thread_ids():
            try:
                done = self._sweep_thread(thread_id, policy, idle_for, dry_run)
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

    asweep = async_twin(
        sweep, "Async twin of `sweep` (`on_thread` runs on the store's worker thread)."
    )

    def retract_turn(self, thread_id: str, token: int, *, run_id: str | None = None) -> Retraction:
        """Remove one turn (a run's checkpoints and writes, all namespaces).

        Without `run_id`, the run that wrote the latest root checkpoint goes;
        where checkpoints carry no run id, everything from the newest root
        `input` checkpoint on (`retention.plan_retraction`, both stores'
        rule). Appends a `retracted` event.

        Raises:
            StaleClaim: `token` is not the thread's claim (nothing changes).
        """
        check_name(thread_id, "thread_id")
        check_int(token, "token")
        if run_id is not None:
            check_name(run_id, "run_id")
        return self._retract_turn(thread_id, token, run_id)

    aretract_turn = async_twin(retract_turn)

    # --- thread expiry ---------------------------------------------------------------------

    _expiry: Expiry | None = None
    _sweeper: Sweeper | None = None

    def _start_expiry(self, expiry: Expiry | None) -> None:
        """Keep the saver's (checked: `check_expiry`) `expiry` option; start its sweeper."""
        self._expiry = expiry
        if expiry is not None and expiry.sweep_every is not None:
            self._sweeper = Sweeper(self, to_seconds(expiry.sweep_every, "sweep_every"))

    @property
    def expiry(self) -> Expiry | None:
        """The saver's `expiry` option (None: no default TTL, no sweeper)."""
        return self._expiry

    def _stop_sweeper(self) -> None:
        """Stop the sweeper (if any) and wait for it: it ends between two threads' transactions."""
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.stop()

    def set_thread_ttl(
        self, thread_id: str, ttl: float | timedelta | None, *, strategy: str = "delete"
    ) -> None:
        """Give a thread its own time to live, or clear it (`ttl=None`).

        Once the thread has been idle `ttl` (no checkpoint, no event, by the
        store's clock), a sweep expires it by `strategy` (see `expire`),
        unless a live claim holds it. Stored in the file: every store and
        process sees it; it overrides the store-wide default
        (`Expiry.default_ttl`), and `delete_thread` removes it with the
        thread. Needs no claim and logs no event; a thread not written yet
        may be given one (a run sets it as it starts).

        Args:
            thread_id: The thread.
            ttl: Seconds or a timedelta; None clears it (the default applies).
            strategy: `"delete"` or `"keep_latest"` (ignored when clearing).

        Raises:
            ReadOnlyStore: the store was opened with `readonly=True`.
        """
        check_name(thread_id, "thread_id")
        seconds = None if ttl is None else to_seconds(ttl, "ttl")
        check_strategy(strategy)
        self._set_thread_ttl(thread_id, seconds, None if seconds is None else strategy)

    aset_thread_ttl = async_twin(set_thread_ttl)

    def thread_ttl(self, thread_id: str) -> ThreadTTL | None:
        """Return the thread's own TTL (as `set_thread_ttl` set it), or None if it has none."""
        check_name(thread_id, "thread_id")
        cells = self._thread_ttl(thread_id)
        if cells is None or not isinstance(cells[0], (int, float)):
            return None
        if cells[1] not in TTL_STRATEGIES:
            return None
        return ThreadTTL(float(cells[0]), cells[1])

    athread_ttl = async_twin(thread_ttl)

    def expire(self, expiry: Expiry | None = None) -> ExpiryReport:
        """Expire every thread idle longer than its TTL, one transaction per thread.

        A thread's TTL is its own (`set_thread_ttl`) or the store's default
        (the `expiry` option's `default_ttl`); `"delete"` removes the thread
        as `delete_thread` does (its log goes with it: a reader learns it
        from `ReplayUnavailable`), `"keep_latest"` trims it to the latest
        checkpoint of each namespace and logs a `pruned` event (its data has
        `strategy`, `checkpoints`, `writes`, `ttl`, `last_activity`). Due
        threads are found through an index; each is judged again inside its
        own transaction, so a thread written or claimed meanwhile, or expired
        by another process's sweep, is left alone: a thread under a live
        claim is never touched, and several processes expiring at once
        remove each thread once. No transaction holds the write lock longer
        than one thread's removal (on SQLite, the lock is then left free as
        long again, for other writers). When nothing is due (and no thread
        is new), nothing is written. The sweeper (`Expiry.sweep_every`, or `lgfs
        sweep --every`) calls this.

        Args:
            expiry: The default TTL and callback to apply (its `sweep_every`
                is ignored); None: the saver's `expiry` option.

        Returns:
            What was expired, what was left under a live claim, and what does
            not decode; `Expiry.on_expire` is called with each expired thread.

        Raises:
            ReadOnlyStore: the store was opened with `readonly=True`.
        """
        expiry = check_expiry(expiry, False)
        return self._expire_pass(lambda: False, expiry)

    aexpire = async_twin(
        expire, "Async twin of `expire` (`on_expire` runs on the store's worker thread)."
    )

    def _expire_pass(
        self, stopped: Callable[[], bool], expiry: Expiry | None = None
    ) -> ExpiryReport:
        """One `expire` pass, ending early (between two transactions) once `stopped()`."""
        if self._engine.readonly:
            raise ReadOnlyStore("expire", self._engine.path)
        option = self._expiry if expiry is None else expiry
        default = None if option is None else option.default
        report = ExpiryReport()
        scheduled = 0
        while not stopped():
            unseen = self._unseen_ttl_threads(default is not None, _SEE_BATCH)
            seen = self._see_threads(unseen, default) if unseen else 0
            scheduled += seen
            if not seen:
                break
        due, busy = self._due_ttl_threads(default)
        report.busy.extend(busy)
        for thread_id in due:
            if stopped():
                break
            try:
                done = self._expire_thread(thread_id, default)
            except UndecodableRow as exc:
                report.errors.append(exc.to_dict())
                continue
            if done == "busy":
                report.busy.append(thread_id)
            elif done == "scheduled":
                scheduled += 1
            elif isinstance(done, Expired):
                report.expired.append(done)
                if option is not None and option.on_expire is not None:
                    option.on_expire(done)
        return ExpiryReport(report.expired, report.busy, report.errors, scheduled)

    # --- the store's primitives: checked arguments in ------------------------------------

    def _delete_thread(self, thread_id: str) -> None:
        raise NotImplementedError

    def _delete_for_runs(self, run_ids: _list[str], token: int | None) -> None:
        raise NotImplementedError

    def _copy_thread(self, source: str, target: str, token: int | None) -> None:
        raise NotImplementedError

    def _prune_plan(self, strategy: str | RetentionPolicy) -> Any:
        """Return what `_prune` runs for `strategy` (checked already)."""
        raise NotImplementedError

    def _prune(
        self, thread_ids: _list[str], plan: Any, dry_run: bool, token: int | None
    ) -> _list[PruneResult]:
        raise NotImplementedError

    def _sweep_thread_ids(self) -> _list[str]:
        """Every thread a sweep visits (not bare tombstones), in id order."""
        raise NotImplementedError

    def _sweep_thread(
        self, thread_id: str, policy: RetentionPolicy, idle_for: float | None, dry_run: bool
    ) -> PruneResult | str | None:
        """One thread's sweep in its own transaction: its result, "busy", or None (skipped)."""
        raise NotImplementedError

    def _retract_turn(self, thread_id: str, token: int, run_id: str | None) -> Retraction:
        raise NotImplementedError

    def _set_thread_ttl(self, thread_id: str, ttl: float | None, strategy: str | None) -> None:
        raise NotImplementedError

    def _thread_ttl(self, thread_id: str) -> tuple[Any, Any] | None:
        """The thread's `(ttl, strategy)` cells, or None for an unknown thread."""
        raise NotImplementedError

    def _unseen_ttl_threads(self, with_default: bool, limit: int) -> _list[str]:
        """Up to `limit` threads no sweep has seen (all with a default, else those with a TTL)."""
        raise NotImplementedError

    def _see_threads(self, thread_ids: _list[str], default: ThreadTTL | None) -> int:
        """Remember those threads' activity in one short transaction; return how many."""
        raise NotImplementedError

    def _due_ttl_threads(self, default: ThreadTTL | None) -> tuple[_list[str], _list[str]]:
        """Due-looking threads through the indexes: `(unclaimed, under a live claim)`."""
        raise NotImplementedError

    def _expire_thread(self, thread_id: str, default: ThreadTTL | None) -> Expired | str | None:
        """One thread's expiry in its own transaction (`judge_expiry` inside it)."""
        raise NotImplementedError
