"""The deletion half of `FencedPostgresSaver`: its primitives behind `RemovalsBase`
(deletion, copies, prunes by strategy or `RetentionPolicy`, sweeps, retraction),
and an operator's `vacuum` and `repack`.

Invariant: each primitive gets arguments `RemovalsBase` has checked and runs
one transaction from `removals.py` that fences every thread it changes
before changing any; the first refusal changes nothing. A dry run is the
real prune, rolled back. Mixed into `FencedPostgresSaver`, which provides
`_engine`, `_now`, `_notify` and `require_claim`.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

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
from . import removals, sql, values
from .half import PgHalf
from .saver_inspect import read_snapshot

if TYPE_CHECKING:
    from ..core.values import ValueCache

__all__ = ["PgRetentionAPI"]

_list = builtins.list


class PgRetentionAPI(PgHalf, RemovalsBase):
    """LangGraph's deletion capabilities, fenced (see `RemovalsBase`), on PostgreSQL."""

    serde: Any
    _value_cache: ValueCache

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

    def _prune_plan(self, strategy: str | RetentionPolicy) -> str | RetentionPolicy:
        return strategy

    def _prune(
        self, thread_ids: _list[str], plan: str | RetentionPolicy, dry_run: bool, token: int | None
    ) -> _list[PruneResult]:
        now = self._now()
        if isinstance(plan, RetentionPolicy):
            # No claim needed, so one transaction per thread, as on SQLite.
            policy = plan

            def one(thread_id: str) -> PruneResult:
                done: PruneResult = self._rolled_back_if(
                    dry_run,
                    "prune",
                    lambda cur: removals.prune_policy(
                        cur, thread_id, policy, token, now=now, notify=self._notify
                    ),
                )
                return done

            return [one(t) for t in thread_ids]

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

    def _rolled_back_if(self, dry_run: bool, op: str, job: Callable[[Any], Any]) -> Any:
        """Run `job` in one transaction; with `dry_run`, roll it back and return its result."""

        def run(cur: Any) -> Any:
            done = job(cur)
            if dry_run:
                raise _DryRun([done])
            return done

        try:
            return self._engine.run(op, run)
        except _DryRun as rolled_back:
            return rolled_back.results[0]

    def _sweep_thread_ids(self) -> _list[str]:
        # A read (as on SQLite): `RemovalsBase.sweep` refused a read-only store already.
        rows = self._engine.run(
            "sweep", lambda cur: cur.execute(sql.SWEEP_THREAD_IDS).fetchall(), read_only=True
        )
        return [r[0] for r in rows]

    def _sweep_thread(
        self, thread_id: str, policy: RetentionPolicy, idle_for: float | None, dry_run: bool
    ) -> PruneResult | str | None:
        now = self._now()
        done: PruneResult | str | None = self._rolled_back_if(
            dry_run,
            "sweep",
            lambda cur: removals.sweep_thread(cur, thread_id, policy, now=now, idle_for=idle_for),
        )
        return done

    # --- thread expiry (`removals.py`) ----------------------------------------------------

    def _set_thread_ttl(self, thread_id: str, ttl: float | None, strategy: str | None) -> None:
        params = {"thread_id": thread_id, "ttl": ttl, "strategy": strategy}
        self._engine.run("set_thread_ttl", lambda cur: cur.execute(sql.SET_THREAD_TTL, params))

    def _thread_ttl(self, thread_id: str) -> tuple[Any, Any] | None:
        row = self._engine.run(
            "thread_ttl",
            lambda cur: cur.execute(sql.GET_THREAD_TTL, {"thread_id": thread_id}).fetchone(),
            read_only=True,
        )
        return None if row is None else (row[0], row[1])

    def _unseen_ttl_threads(self, with_default: bool, limit: int) -> _list[str]:
        query = sql.TTL_UNSEEN if with_default else sql.TTL_UNSEEN_OWN
        rows = self._engine.run(
            "expire", lambda cur: cur.execute(query, {"limit": limit}).fetchall(), read_only=True
        )
        return [r[0] for r in rows]

    def _see_threads(self, thread_ids: _list[str], default: ThreadTTL | None) -> int:
        now = self._now()
        done: int = self._engine.run(
            "expire", lambda cur: removals.see_threads(cur, thread_ids, default, now)
        )
        return done

    def _due_ttl_threads(self, default: ThreadTTL | None) -> tuple[_list[str], _list[str]]:
        def job(cur: Any) -> tuple[float, _list[Any]]:
            now = self._now()
            if now is None:
                now = float(cur.execute(sql.GET_NOW, {"now": None}).fetchone()[0])
            rows = cur.execute(sql.TTL_DUE_OWN, {"now": now}).fetchall()
            if default is not None:
                before = now - default.seconds
                rows += cur.execute(sql.TTL_DUE_DEFAULT, {"before": before}).fetchall()
            return now, rows

        now, rows = self._engine.run("expire", job, read_only=True)
        due = [t for t, token, until in rows if not claim_live(token, until, now)]
        return due, [t for t, token, until in rows if claim_live(token, until, now)]

    def _expire_thread(self, thread_id: str, default: ThreadTTL | None) -> Expired | str | None:
        now = self._now()
        done: Expired | str | None = self._engine.run(
            "expire",
            lambda cur: removals.expire_thread(
                cur, thread_id, default, now=now, notify=self._notify
            ),
        )
        if isinstance(done, Expired):
            self._value_cache.forget_thread(thread_id)
        return done

    def vacuum(self, *, force: bool = False) -> VacuumReport:
        """Run a plain `VACUUM (ANALYZE)` of the store's tables; report their size before and after.

        What it reclaims: dead rows (what `prune`, `delete_thread`,
        `compact_events` and every update leave) become space the tables
        reuse for new rows, and the planner's statistics are refreshed.
        Empty pages at a table's end go back to the operating system, but
        space in the middle stays with the table: the size falls only after
        a prune that emptied whole pages at the end, and the first vacuum of
        a table may even grow it a little (it creates the table's free-space
        and visibility maps). PostgreSQL's autovacuum does the same work by
        itself; this is for right after a large prune or sweep.

        What it does not do: `VACUUM FULL`, which would give all of the space
        back by rewriting each table under an ACCESS EXCLUSIVE lock, stopping
        every writer and reader of the store meanwhile. A plain VACUUM lets
        writers go on (to give back empty end pages it takes that lock only
        when free, and lets go of it as soon as someone waits), so `force` is
        accepted for the SQLite store's signature and changes nothing.

        Runs outside any transaction (VACUUM cannot run in one), on a
        connection of the pool or the store's connection in autocommit.

        Args:
            force: Accepted for `FencedSqliteSaver.vacuum`'s signature; a
                plain VACUUM needs no forcing.

        Returns:
            `path` (the server and database), and the tables' total size in
            bytes with their indexes and TOAST (`pg_total_relation_size`)
            before and after.

        Raises:
            InvalidArgument: `force` is not a bool.
            ReadOnlyStore: the store was opened with `readonly=True`.
            StoreBusy: a lock wait (another VACUUM, an ALTER) passed the
                connection's `lock_timeout`.
            StoreError: the connection is inside a transaction of yours, or
                the database failed.
        """
        check_bool(force, "force")
        tables = {"tables": _list(sql.TABLES)}

        def job(cur: Any) -> VacuumReport:
            before = int(cur.execute(sql.STORE_BYTES, tables).fetchone()[0])
            cur.execute(sql.VACUUM_TABLES)
            after = int(cur.execute(sql.STORE_BYTES, tables).fetchone()[0])
            return VacuumReport(self._engine.where, before, after)

        return self._engine.run_outside_transaction("vacuum", job)

    avacuum = async_twin(vacuum)

    def repack(self, *, dry_run: bool = False) -> RepackReport:
        """Move the values of checkpoints written before the value table into it.

        As `FencedSqliteSaver.repack`: a database set up before migration 11
        holds each checkpoint's values inline; those rows read as they always
        did, and new checkpoints use the value table (docs/semantics.md §7).
        This rewrites the old rows, one thread per transaction (the thread's
        row locked, as its writers lock it), so that they share what they
        have in common; PostgreSQL reuses the space the old values held once
        vacuumed (`vacuum`, or autovacuum). What every checkpoint reads back
        does not change. A row whose values do not decode (a type this saver
        does not allow), or a thread written meanwhile, is left as it is and
        reported.

        Args:
            dry_run: Plan and report, writing nothing.

        Raises:
            ReadOnlyStore: the store was opened with `readonly=True` (unless `dry_run`).
        """
        check_bool(dry_run, "dry_run")
        if self._engine.readonly and not dry_run:
            raise ReadOnlyStore("repack", self._engine.where)
        serde = getattr(self.serde, "refusing", lambda: self.serde)()
        threads = self._engine.run("repack", values.inline_threads, read_only=True)

        def read(thread_id: str) -> Any:
            return read_snapshot(
                self._engine,
                "repack",
                lambda cur: values.repack_read(cur, thread_id, encryption_of(self.serde)),
            )

        def write(thread_id: str, rewrites: _list[Rewrite]) -> None:
            self._engine.run("repack", lambda cur: values.repack_txn(cur, thread_id, rewrites))
            self._value_cache.forget_thread(thread_id)

        return repack_threads(serde, threads, read, write, dry_run=dry_run)

    arepack = async_twin(repack)

    def rekey(self, *, dry_run: bool = False) -> RekeyReport:
        """Seal every value cell under the current key: those in clear and under older keys.

        With `encryption=Encryption(new_key, old_keys=[old_key])` this moves
        every cell sealed under `old_key` to `new_key`, after which `old_key`
        may be dropped from the ring; opened with `accept_plaintext=True` it
        seals the cells of a file written before encryption was on. One thread
        per transaction (the thread's row locked, as its writers lock it);
        what every checkpoint reads back does not change. A cell that does
        not open (a key not in the ring, tampered with) or, in clear, does
        not decode, or a thread written meanwhile, is left as it is and
        reported (docs/semantics.md §7b).

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
            raise ReadOnlyStore("rekey", self._engine.where)
        threads = self._engine.run(
            "rekey",
            lambda cur: [r[0] for r in cur.execute(sql.THREADS_WITH_CELLS).fetchall()],
            read_only=True,
        )

        def read(thread_id: str) -> Any:
            return read_snapshot(
                self._engine, "rekey", lambda cur: values.rekey_read(cur, thread_id)
            )

        def write(thread_id: str, reseals: _list[Reseal]) -> None:
            self._engine.run("rekey", lambda cur: values.rekey_txn(cur, thread_id, reseals))
            self._value_cache.forget_thread(thread_id)

        return rekey_threads(serde, enc, threads, read, write, dry_run=dry_run)

    arekey = async_twin(rekey)

    def cell_keys(self) -> CellKeys:
        """Count the store's value cells in clear and under each key id (`lgfs doctor`)."""
        result: CellKeys = self._engine.run("cell_keys", values.cell_keys, read_only=True)
        return result

    acell_keys = async_twin(cell_keys)

    def _retract_turn(self, thread_id: str, token: int, run_id: str | None) -> Retraction:
        now = self._now()
        result: Retraction = self._engine.run(
            "retract_turn",
            lambda cur: removals.retract(
                cur, thread_id, token, run_id, now=now, notify=self._notify
            ),
        )
        return result


class _DryRun(Exception):
    """Raised inside a dry run's transaction so that it rolls back, carrying the report."""

    def __init__(self, results: _list[PruneResult]) -> None:
        super().__init__("dry run")
        self.results = results
