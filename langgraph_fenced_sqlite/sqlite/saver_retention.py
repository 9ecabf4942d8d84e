"""The history-removing half of `FencedSqliteSaver`: deletion, retention, copying, retraction.

Invariant: each method validates its arguments before the file is touched
(`delete_thread`, `delete_for_runs`, `copy_thread` and `prune` in
`RemovalsBase`, shared with the PostgreSQL store), then runs engine
transactions from `retention.py`, in which every fence check comes before
any change, so a refused call changes nothing. A retention policy, sweeps,
vacuum and retraction are this store's alone. Mixed into
`FencedSqliteSaver`, which provides `_engine` and `require_claim`.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..clock import read_now
from ..core.claims import claim_live
from ..core.encryption import encryption_of
from ..core.maintenance import RepackReport, VacuumReport
from ..core.rekey import CellKeys, RekeyReport, Reseal, rekey_options, rekey_threads
from ..core.repack import Rewrite, repack_threads
from ..core.retention import Expired, PruneResult, RetentionPolicy, Retraction, ThreadTTL
from ..core.saver_retention import RemovalsBase
from ..core.twins import async_twin
from ..core.validation import check_bool
from ..errors import ReadOnlyStore
from . import maintenance, retention, schema

if TYPE_CHECKING:
    from ..core.values import ValueCache
    from .engine import Engine

__all__ = ["RetentionAPI"]

# `list` is not shadowed here, but the signatures match the saver's.
_list = builtins.list
# The least time an expiry pass leaves the write lock free between two of its transactions.
_MIN_GAP = 0.002


class RetentionAPI(RemovalsBase):
    """Deletion, retention, copying and retraction (docs/semantics.md §6), on one SQLite file."""

    _engine: Engine
    require_claim: bool
    serde: Any
    _value_cache: ValueCache

    def _delete_thread(self, thread_id: str) -> None:
        self._engine.write("delete_thread", lambda c: retention.delete_thread_txn(c, thread_id))

    def _delete_for_runs(self, run_ids: _list[str], token: int | None) -> None:
        now = read_now(self._engine.clock)
        self._engine.write(
            "delete_for_runs",
            lambda c: retention.delete_for_runs_txn(
                c, run_ids, token, now=now, require_claim=self.require_claim
            ),
        )

    def _copy_thread(self, source: str, target: str, token: int | None) -> None:
        now = read_now(self._engine.clock)
        self._engine.write(
            "copy_thread",
            lambda c: retention.copy_thread_txn(
                c, source, target, token, now=now, require_claim=self.require_claim
            ),
        )

    def _prune_plan(
        self, strategy: str | RetentionPolicy
    ) -> tuple[RetentionPolicy | None, bool, bool]:
        """Return `(policy, latest_only, per_thread)` for `strategy`."""
        if isinstance(strategy, RetentionPolicy):
            return strategy, False, True
        if strategy == "keep_latest":
            return RetentionPolicy(), True, False
        return None, False, False  # "delete"

    def _prune(
        self,
        thread_ids: _list[str],
        plan: tuple[RetentionPolicy | None, bool, bool],
        dry_run: bool,
        token: int | None,
    ) -> _list[PruneResult]:
        policy, latest_only, per_thread = plan
        now = read_now(self._engine.clock)
        if not per_thread:
            # LangGraph's strategies are fenced: every listed thread's fence
            # holds, or nothing changes on any of them.
            return self._engine.write(
                "prune",
                lambda c: [
                    self._prune_one(c, t, policy, latest_only, dry_run, token, now)
                    for t in thread_ids
                ],
            )
        # A retention policy needs no claim, so each thread is its own
        # transaction: a long list never holds the write lock longer than one
        # thread's prune (writers of other threads go on meanwhile).
        out: _list[PruneResult] = []
        for thread_id in thread_ids:

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

    # --- an operator's sweep and vacuum ---------------------------------------------------

    def _sweep_thread_ids(self) -> _list[str]:
        return self._engine.read("sweep", maintenance.thread_ids)

    def _sweep_thread(
        self, thread_id: str, policy: RetentionPolicy, idle_for: float | None, dry_run: bool
    ) -> PruneResult | str | None:
        def job(conn: Any) -> PruneResult | str | None:
            return maintenance.sweep_thread_txn(
                conn,
                thread_id,
                policy,
                now=read_now(self._engine.clock),
                idle_for=idle_for,
                dry_run=dry_run,
            )

        return self._engine.write("sweep", job)

    # --- thread expiry (`maintenance.py`) ------------------------------------------------

    def _set_thread_ttl(self, thread_id: str, ttl: float | None, strategy: str | None) -> None:
        self._engine.write(
            "set_thread_ttl", lambda c: maintenance.set_thread_ttl_txn(c, thread_id, ttl, strategy)
        )

    def _thread_ttl(self, thread_id: str) -> tuple[Any, Any] | None:
        return self._engine.read("thread_ttl", maintenance.thread_ttl, thread_id)

    def _unseen_ttl_threads(self, with_default: bool, limit: int) -> _list[str]:
        return self._engine.read("expire", maintenance.unseen_ttl_threads, with_default, limit)

    def _see_threads(self, thread_ids: _list[str], default: ThreadTTL | None) -> int:
        now = read_now(self._engine.clock)
        return self._leaving_the_lock_free(
            lambda c: maintenance.see_threads_txn(c, thread_ids, default, now)
        )

    def _due_ttl_threads(self, default: ThreadTTL | None) -> tuple[_list[str], _list[str]]:
        now = read_now(self._engine.clock)
        seconds = None if default is None else default.seconds
        rows = self._engine.read("expire", maintenance.due_ttl_threads, now, seconds)
        due = [t for t, token, until in rows if not claim_live(token, until, now)]
        return due, [t for t, token, until in rows if claim_live(token, until, now)]

    def _expire_thread(self, thread_id: str, default: ThreadTTL | None) -> Expired | str | None:
        def job(conn: Any) -> Expired | str | None:
            now = read_now(self._engine.clock)
            return maintenance.expire_thread_txn(conn, thread_id, default, now)

        done: Expired | str | None = self._leaving_the_lock_free(job)
        if isinstance(done, Expired):
            self._value_cache.forget_thread(thread_id)
        return done

    def _leaving_the_lock_free(self, job: Callable[[Any], Any]) -> Any:
        """Run an expiry transaction, then leave the file's write lock free as long as it held it.

        One write lock serves the whole file, and SQLite's busy handler polls
        it with sleeps of up to 100 ms: a pass that took it back to back kept
        every other writer out for seconds (benchmarks/bench_sweeper.py: puts
        waited past busy_timeout). Free at least as long as it was held (from
        the moment it was had to the end of the commit) and 2 ms, it is had by
        a waiting writer's next poll; a pass waiting for busy writers waits
        no longer on their account.
        """
        had: _list[float] = []

        def timed(conn: Any) -> Any:
            had.append(time.monotonic())
            return job(conn)

        done = self._engine.write("expire", timed)
        if had:
            time.sleep(max(_MIN_GAP, time.monotonic() - had[0]))
        return done

    def repack(self, *, dry_run: bool = False) -> RepackReport:
        """Move the values of checkpoints written before the value table into it.

        Files written before schema 5 hold each checkpoint's values inline;
        they read as they always did, and new checkpoints use the value
        table (docs/semantics.md §7). This rewrites the old rows, one
        thread per transaction, so that they share what they have in common
        (then `vacuum` returns the freed pages to the file system). What
        every checkpoint reads back does not change. A row whose values do
        not decode (a type this saver does not allow), or a thread written
        meanwhile, is left as it is and reported.

        Args:
            dry_run: Plan and report, writing nothing.

        Raises:
            ReadOnlyStore: the store was opened with `readonly=True` (unless `dry_run`).
        """
        check_bool(dry_run, "dry_run")
        if self._engine.readonly and not dry_run:
            raise ReadOnlyStore("repack", self._engine.path)
        serde = getattr(self.serde, "refusing", lambda: self.serde)()
        threads = self._engine.read(
            "repack",
            lambda c: [r[0] for r in c.execute(schema.THREADS_WITH_INLINE_VALUES)],
        )

        def read(thread_id: str) -> Any:
            return self._engine.read(
                "repack", maintenance.repack_read, thread_id, encryption_of(self.serde)
            )

        def write(thread_id: str, rewrites: _list[Rewrite]) -> None:
            self._engine.write("repack", _repack_job(thread_id, rewrites))
            self._value_cache.forget_thread(thread_id)

        return repack_threads(serde, threads, read, write, dry_run=dry_run)

    arepack = async_twin(repack)

    def rekey(self, *, dry_run: bool = False) -> RekeyReport:
        """Seal every value cell under the current key: those in clear and under older keys.

        With `encryption=Encryption(new_key, old_keys=[old_key])` this moves
        every cell sealed under `old_key` to `new_key`, after which `old_key`
        may be dropped from the ring; opened with `accept_plaintext=True` it
        seals the cells of a file written before encryption was on. One thread
        per transaction; what every checkpoint reads back does not
        change. A cell that does not open (a key not in the ring, tampered
        with) or, in clear, does not decode, or a thread written meanwhile,
        is left as it is and reported (docs/semantics.md §7b).

        Args:
            dry_run: Plan and report, writing nothing.

        Returns:
            What was resealed, by what it was under.

        Raises:
            InvalidArgument: the store was opened without `encryption`.
            ReadOnlyStore: the store was opened with `readonly=True` (unless `dry_run`).
        """
        serde, enc = rekey_options(self.serde, dry_run)
        if self._engine.readonly and not dry_run:
            raise ReadOnlyStore("rekey", self._engine.path)
        threads = self._engine.read(
            "rekey", lambda c: [r[0] for r in c.execute(schema.THREADS_WITH_CELLS)]
        )

        def read(thread_id: str) -> Any:
            return self._engine.read("rekey", maintenance.rekey_read, thread_id)

        def write(thread_id: str, reseals: _list[Reseal]) -> None:
            self._engine.write("rekey", _rekey_job(thread_id, reseals))
            self._value_cache.forget_thread(thread_id)

        return rekey_threads(serde, enc, threads, read, write, dry_run=dry_run)

    arekey = async_twin(rekey)

    def cell_keys(self) -> CellKeys:
        """Count the file's value cells in clear and under each key id (`lgfs doctor`)."""
        return self._engine.read("cell_keys", maintenance.cell_keys)

    acell_keys = async_twin(cell_keys)

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

    avacuum = async_twin(vacuum)

    # --- retraction -------------------------------------------------------------------------

    def _retract_turn(self, thread_id: str, token: int, run_id: str | None) -> Retraction:
        now = read_now(self._engine.clock)
        return self._engine.write(
            "retract_turn", lambda c: retention.retract_txn(c, thread_id, token, run_id, now=now)
        )


def _rekey_job(thread_id: str, reseals: _list[Reseal]) -> Callable[[Any], None]:
    # One thread's reseals as an engine write (bound here, as `_repack_job`).
    return lambda conn: maintenance.rekey_txn(conn, thread_id, reseals)


def _repack_job(thread_id: str, rewrites: _list[Rewrite]) -> Callable[[Any], None]:
    # One thread's rewrites as an engine write (bound here: a lambda in the loop would not be).
    return lambda conn: maintenance.repack_txn(conn, thread_id, rewrites)
