"""The claims and runs half of `FencedPostgresSaver`: its primitives behind `ClaimsBase`.

Invariant: each primitive gets arguments `ClaimsBase` has checked and runs one
transaction from `txns.py` or `runs.py`, so a lease or a runner gets the same
claims, events and errors from either store. Expiry is judged by the store's
clock: the database server's, read in the statement, unless the saver was
given one (`_now`). A transaction that appends events sends one NOTIFY when
`_notify`. Mixed into `FencedPostgresSaver`, which provides `_engine`, `_now`,
`_notify` and `_latest_roots` (`end_run`'s hint of the latest root checkpoint).
"""

from __future__ import annotations

from typing import Any

from ..core.claims import Claim
from ..core.saver_claims import ClaimsBase
from . import runs, txns
from .half import PgHalf

__all__ = ["PgClaimsAPI"]


class PgClaimsAPI(PgHalf, ClaimsBase):
    """Claims, leases and runs on threads (see `ClaimsBase`), on PostgreSQL."""

    def _grant(self, op: str, thread_id: str, holder: str, ttl: float, *, force: bool) -> Claim:
        return self._engine.run(
            op, lambda cur: txns.grant(cur, thread_id, holder, ttl, now=self._now(), force=force)
        )

    def _operator_take_over(self, thread_id: str, holder: str, operator: str, ttl: float) -> Claim:
        return self._engine.run(
            "take_over",
            lambda cur: runs.operator_take_over(
                cur, thread_id, holder, operator, ttl, now=self._now(), notify=self._notify
            ),
        )

    def _force_release(self, thread_id: str, operator: str) -> Claim | None:
        return self._engine.run(
            "force_release",
            lambda cur: runs.force_release(
                cur, thread_id, operator, now=self._now(), notify=self._notify
            ),
        )

    def _renew(self, thread_id: str, token: int, ttl: float) -> Claim:
        return self._engine.run(
            "renew", lambda cur: txns.renew(cur, thread_id, token, ttl, now=self._now())
        )

    def _release(self, thread_id: str, token: int) -> bool:
        return self._engine.run("release", lambda cur: txns.release(cur, thread_id, token))

    def _current_claim(self, thread_id: str) -> Claim | None:
        return self._engine.run(
            "current_claim", lambda cur: txns.current_claim(cur, thread_id), read_only=True
        )

    def _begin_run(self, thread_id: str, holder: str, ttl: float, **run: Any) -> Claim:
        now = self._now()
        return self._engine.run(
            f"begin_run({run['strategy']})",
            lambda cur: runs.begin_run(
                cur, thread_id, holder, ttl, now=now, notify=self._notify, **run
            ),
            # One round trip for a run that does not take over and names no
            # tenant; refused (or none): the job decides, in 3 more.
            batch=runs.begin_run_batch(thread_id, holder, ttl, now=now, notify=self._notify, **run),
            # 3 round trips, not 6; a "rollback" retracts, reading rowcounts.
            pipelined=run["strategy"] != "rollback",
        )

    def _claim_run(self, thread_id: str, run_id: str) -> int:
        return self._engine.run(
            "claim_run",
            lambda cur: runs.claim_run(
                cur, thread_id, run_id, now=self._now(), notify=self._notify
            ),
        )

    def _renew_run(self, thread_id: str, token: int, ttl: float) -> tuple[Claim, str | None]:
        return self._engine.run(
            "renew_run", lambda cur: txns.renew_run(cur, thread_id, token, ttl, now=self._now())
        )

    def _cancel_run(self, thread_id: str, by: str, tenant: str | None) -> Claim | None:
        return self._engine.run(
            "cancel_run",
            lambda cur: runs.cancel_run(
                cur, thread_id, by, now=self._now(), notify=self._notify, tenant=tenant
            ),
        )

    def _end_run(self, thread_id: str, token: int, kind: str, data: Any, **flags: bool) -> bool:
        now, latest = self._now(), self._latest_roots.take(thread_id)
        batch = runs.end_run_batch(
            thread_id,
            token,
            kind,
            data,
            latest=latest,
            static_interrupt=flags["static_interrupt"],
            raise_stale=flags["raise_stale"],
            now=now,
            notify=self._notify,
        )
        return self._engine.run(
            f"end_run({kind})",
            lambda cur: runs.end_run(
                cur, thread_id, token, kind, data, now=now, notify=self._notify, **flags
            ),
            batch=batch,  # one round trip; refused (or none): the job decides, in 2 more
            pipelined=True,  # runs.end_run reads no rowcount: 2 round trips, not 6
        )

    def _delete_unclaimed(
        self, thread_id: str, holder: str, ttl: float, tenant: str | None
    ) -> None:
        self._engine.run(
            "delete_unclaimed_thread",
            lambda cur: runs.delete_unclaimed(
                cur, thread_id, holder, ttl, now=self._now(), tenant=tenant
            ),
        )
