"""The claims half of `FencedSqliteSaver`: its primitives behind `ClaimsBase`.

Invariant: each primitive gets arguments `ClaimsBase` has checked and runs one
engine write from `claims.py` or `runs.py`. The store's clock is read inside
the job, after the write lock is had: a call that waited for the lock must
judge expiry by the time it decides. Mixed into `FencedSqliteSaver`, which
provides `_engine`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..clock import read_now
from ..core.claims import Claim
from ..core.saver_claims import ClaimsBase
from . import claims, runs

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["ClaimsAPI"]


class ClaimsAPI(ClaimsBase):
    """Claims, leases and runs on threads (see `ClaimsBase`), on one SQLite file."""

    _engine: Engine

    def _grant(self, op: str, thread_id: str, holder: str, ttl: float, *, force: bool) -> Claim:
        return self._engine.write(
            op,
            lambda c: claims.grant(
                c, thread_id, holder, ttl, now=read_now(self._engine.clock), force=force
            ),
        )

    def _operator_take_over(self, thread_id: str, holder: str, operator: str, ttl: float) -> Claim:
        return self._engine.write(
            "take_over",
            lambda c: runs.operator_take_over_txn(
                c, thread_id, holder, operator, ttl, now=read_now(self._engine.clock)
            ),
        )

    def _force_release(self, thread_id: str, operator: str) -> Claim | None:
        return self._engine.write(
            "force_release",
            lambda c: runs.force_release_txn(
                c, thread_id, operator, now=read_now(self._engine.clock)
            ),
        )

    def _renew(self, thread_id: str, token: int, ttl: float) -> Claim:
        return self._engine.write(
            "renew",
            lambda c: claims.renew(c, thread_id, token, ttl, now=read_now(self._engine.clock)),
        )

    def _release(self, thread_id: str, token: int) -> bool:
        return self._engine.write("release", lambda c: claims.release(c, thread_id, token))

    def _current_claim(self, thread_id: str) -> Claim | None:
        return self._engine.read("current_claim", lambda c: claims.current_claim(c, thread_id))

    def _begin_run(self, thread_id: str, holder: str, ttl: float, **run: Any) -> Claim:
        clock = self._engine.clock
        return self._engine.write(
            f"begin_run({run['strategy']})",
            lambda c: runs.begin_run_txn(c, thread_id, holder, ttl, now=read_now(clock), **run),
        )

    def _claim_run(self, thread_id: str, run_id: str) -> int:
        return self._engine.write(
            "claim_run",
            lambda c: runs.claim_run_txn(c, thread_id, run_id, now=read_now(self._engine.clock)),
        )

    def _renew_run(self, thread_id: str, token: int, ttl: float) -> tuple[Claim, str | None]:
        return self._engine.write(
            "renew_run",
            lambda c: claims.renew_run(c, thread_id, token, ttl, now=read_now(self._engine.clock)),
        )

    def _cancel_run(self, thread_id: str, by: str, tenant: str | None) -> Claim | None:
        return self._engine.write(
            "cancel_run",
            lambda c: runs.cancel_run_txn(
                c, thread_id, by, now=read_now(self._engine.clock), tenant=tenant
            ),
        )

    def _end_run(self, thread_id: str, token: int, kind: str, data: Any, **flags: bool) -> bool:
        clock = self._engine.clock
        return self._engine.write(
            f"end_run({kind})",
            lambda c: runs.end_run_txn(
                c, thread_id, token, kind, data, now=read_now(clock), **flags
            ),
        )

    def _delete_unclaimed(
        self, thread_id: str, holder: str, ttl: float, tenant: str | None
    ) -> None:
        self._engine.write(
            "delete_unclaimed_thread",
            lambda c: runs.delete_unclaimed_txn(
                c, thread_id, holder, ttl, now=read_now(self._engine.clock), tenant=tenant
            ),
        )
