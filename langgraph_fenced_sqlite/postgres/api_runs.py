"""The runs half of `FencedPostgresSaver`: what `FencedRunner` drives.

Invariant: each method takes the SQLite saver's arguments, validates them
the same way, then runs one transaction from `runs.py`, so a runner gets the
same claims, events and errors from either store. Mixed into
`FencedPostgresSaver`, which provides `_engine`, `_now` and `_notify`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from .. import runs as sqlite_runs
from ..claims import Claim
from ..clock import to_seconds
from ..errors import bad_argument
from ..validation import check_bool, check_dict, check_int, check_json, check_name
from . import runs, txns
from .connection import PgConnection

__all__ = ["PgRunsAPI"]


class PgRunsAPI:
    """Runs on threads: a claim with lifecycle events (see `FencedRunner`), on PostgreSQL."""

    _engine: PgConnection
    _notify: bool

    def _now(self) -> float | None:
        raise NotImplementedError  # the saver's

    def begin_run(
        self,
        thread_id: str,
        holder: str,
        ttl: float | timedelta,
        *,
        run_id: str,
        strategy: str = "reject",
        tenant: str | None = None,
        principal: str | None = None,
    ) -> Claim:
        """Claim a thread for a run and log `run_started`, in one commit.

        As `FencedSqliteSaver.begin_run`: "interrupt" and "rollback" take a
        live claim over (`run_superseded`); "rollback" also retracts the
        superseded run's checkpoints and writes, by the run id its claim
        recorded.

        Raises:
            TenantMismatch: the thread is another tenant's; nothing changes.
            ThreadBusy: the thread is busy and the strategy does not take
                over; nothing changes.
        """
        check_name(thread_id, "thread_id")
        check_name(holder, "holder")
        check_name(run_id, "run_id")
        if strategy not in sqlite_runs.RUN_STRATEGIES:
            raise bad_argument("strategy", f"expected one of {sqlite_runs.RUN_STRATEGIES}")
        seconds = to_seconds(ttl, "ttl")
        _optional_name(tenant, "tenant")
        _optional_name(principal, "principal")
        return self._engine.run(
            f"begin_run({strategy})",
            lambda cur: runs.begin_run(
                cur,
                thread_id,
                holder,
                seconds,
                run_id=run_id,
                strategy=strategy,
                now=self._now(),
                notify=self._notify,
                tenant=tenant,
                principal=principal,
            ),
        )

    def renew_run(
        self, thread_id: str, token: int, ttl: float | timedelta
    ) -> tuple[Claim, str | None]:
        """Renew a run's claim as `renew` does, and say who asked its run to stop (or None).

        Raises:
            StaleClaim: `token` is not the thread's current claim.
        """
        check_name(thread_id, "thread_id")
        check_int(token, "token")
        seconds = to_seconds(ttl, "ttl")
        return self._engine.run(
            "renew_run",
            lambda cur: txns.renew_run(cur, thread_id, token, seconds, now=self._now()),
        )

    def cancel_run(self, thread_id: str, *, by: str, tenant: str | None = None) -> Claim | None:
        """Ask the run holding the thread, on any host, to stop; log `cancel_requested`.

        The request goes with the claim it is for: the run's next renewal sees
        it; a later run of the thread never does.

        Returns:
            The claim asked to stop, or None when nothing holds the thread.

        Raises:
            TenantMismatch: the thread is another tenant's; nothing changes.
        """
        check_name(thread_id, "thread_id")
        check_name(by, "by")
        _optional_name(tenant, "tenant")
        return self._engine.run(
            "cancel_run",
            lambda cur: runs.cancel_run(
                cur, thread_id, by, now=self._now(), notify=self._notify, tenant=tenant
            ),
        )

    def end_run(
        self,
        thread_id: str,
        token: int,
        kind: str,
        data: dict[str, Any] | None = None,
        *,
        static_interrupt: bool = False,
        raise_stale: bool = False,
    ) -> bool:
        """Log a run's end event and release its claim, in one commit (as the SQLite store's).

        Returns:
            False if the claim is no longer this run's (nothing changes).

        Raises:
            StaleClaim: with `raise_stale`, the claim is no longer this run's.
        """
        check_name(thread_id, "thread_id")
        check_int(token, "token")
        check_name(kind, "kind")
        payload = dict(check_json(check_dict(data, "data", optional=True), "data"))
        check_bool(static_interrupt, "static_interrupt")
        check_bool(raise_stale, "raise_stale")
        return self._engine.run(
            f"end_run({kind})",
            lambda cur: runs.end_run(
                cur,
                thread_id,
                token,
                kind,
                payload,
                now=self._now(),
                notify=self._notify,
                static_interrupt=static_interrupt,
                raise_stale=raise_stale,
            ),
        )

    def delete_unclaimed_thread(
        self,
        thread_id: str,
        holder: str,
        ttl: float | timedelta = 30.0,
        *,
        tenant: str | None = None,
    ) -> None:
        """Delete a thread unless someone holds a live claim on it, on any host.

        Raises:
            TenantMismatch: the thread is another tenant's; nothing is deleted.
            ThreadBusy: the thread has a live claim; nothing is deleted.
        """
        check_name(thread_id, "thread_id")
        check_name(holder, "holder")
        seconds = to_seconds(ttl, "ttl")
        _optional_name(tenant, "tenant")
        self._engine.run(
            "delete_unclaimed_thread",
            lambda cur: runs.delete_unclaimed(
                cur, thread_id, holder, seconds, now=self._now(), tenant=tenant
            ),
        )


def _optional_name(value: Any, name: str) -> str | None:
    return None if value is None else check_name(value, name)
