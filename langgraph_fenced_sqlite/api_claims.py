"""The claims half of `FencedSqliteSaver`: claim, take over, renew, release, lease.

Invariant: every method validates its arguments first, then runs one engine
transaction from `claims.py`; each async twin is one line. Mixed into
`FencedSqliteSaver`, which provides `_engine`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from . import claims, runs
from .claims import Claim
from .clock import read_now, to_seconds
from .errors import bad_argument
from .lease import AsyncLease, Lease
from .validation import check_bool, check_dict, check_int, check_json, check_name

if TYPE_CHECKING:
    from .engine import Engine
    from .saver import FencedSqliteSaver

__all__ = ["ClaimsAPI"]


class ClaimsAPI:
    """Claims and leases on threads (see docs/semantics.md §2)."""

    _engine: Engine

    def claim(self, thread_id: str, holder: str, ttl: float | timedelta) -> Claim:
        """Claim a thread with a new fencing token, if no live claim exists.

        Raises:
            ThreadBusy: a live claim exists (whoever holds it); nothing changes.
        """
        return self._grant("claim", thread_id, holder, ttl, force=False)

    async def aclaim(self, thread_id: str, holder: str, ttl: float | timedelta) -> Claim:
        """Async twin of `claim`."""
        return await self._engine.arun(self.claim, thread_id, holder, ttl)

    def take_over(
        self,
        thread_id: str,
        holder: str,
        ttl: float | timedelta,
        *,
        operator: str | None = None,
    ) -> Claim:
        """Claim a thread even over a live claim, fencing off its holder.

        The previous holder's next fenced write, renewal or end of run is
        refused (`StaleClaim`, or a no-op for release).

        Args:
            thread_id: The thread.
            holder: The new holder.
            ttl: How long the new claim is live.
            operator: Who is doing this by hand (e.g. `alice@host`); when
                given, a `claim_taken_over` event naming the operator, the
                previous holder and token is logged in the same commit.
        """
        if operator is None:
            return self._grant("take_over", thread_id, holder, ttl, force=True)
        check_name(thread_id, "thread_id")
        check_name(holder, "holder")
        check_name(operator, "operator")
        seconds = to_seconds(ttl, "ttl")
        return self._engine.write(
            "take_over",
            lambda c: runs.operator_take_over_txn(
                c, thread_id, holder, operator, seconds, now=read_now(self._engine.clock)
            ),
        )

    async def atake_over(
        self,
        thread_id: str,
        holder: str,
        ttl: float | timedelta,
        *,
        operator: str | None = None,
    ) -> Claim:
        """Async twin of `take_over`."""
        return await self._engine.arun(self.take_over, thread_id, holder, ttl, operator=operator)

    def force_release(self, thread_id: str, *, operator: str) -> Claim | None:
        """End the thread's claim, whoever holds it, live or expired (an operator's release).

        Unlike `release`, no token is needed. The released holder is fenced
        off exactly as by a takeover: its next fenced write or renewal raises
        `StaleClaim`, and its own release or end of run changes nothing. Logs
        a `claim_released_by_operator` event (`operator`, `previous_holder`,
        `previous_token`, `previous_run_id`, `was_live`) in the same commit.

        Args:
            thread_id: The thread.
            operator: Who is doing this (e.g. `alice@host`), for the event.

        Returns:
            The claim released, or None if the thread had no claim (nothing
            changes, nothing is logged).
        """
        check_name(thread_id, "thread_id")
        check_name(operator, "operator")
        return self._engine.write(
            "force_release",
            lambda c: runs.force_release_txn(
                c, thread_id, operator, now=read_now(self._engine.clock)
            ),
        )

    async def aforce_release(self, thread_id: str, *, operator: str) -> Claim | None:
        """Async twin of `force_release`."""
        return await self._engine.arun(self.force_release, thread_id, operator=operator)

    def _grant(self, op: str, thread_id: str, holder: str, ttl: Any, *, force: bool) -> Claim:
        check_name(thread_id, "thread_id")
        check_name(holder, "holder")
        seconds = to_seconds(ttl, "ttl")
        # The clock is read inside the job, after the write lock is had: a call
        # that waited for the lock must judge expiry by the time it decides.
        return self._engine.write(
            op,
            lambda c: claims.grant(
                c, thread_id, holder, seconds, now=read_now(self._engine.clock), force=force
            ),
        )

    def renew(self, thread_id: str, token: int, ttl: float | timedelta) -> Claim:
        """Extend the claim carrying `token` to now + `ttl` (store clock).

        Raises:
            StaleClaim: `token` is not the thread's current claim.
        """
        check_name(thread_id, "thread_id")
        check_int(token, "token")
        seconds = to_seconds(ttl, "ttl")
        return self._engine.write(
            "renew",
            lambda c: claims.renew(c, thread_id, token, seconds, now=read_now(self._engine.clock)),
        )

    async def arenew(self, thread_id: str, token: int, ttl: float | timedelta) -> Claim:
        """Async twin of `renew`."""
        return await self._engine.arun(self.renew, thread_id, token, ttl)

    def release(self, thread_id: str, token: int) -> bool:
        """End the claim carrying `token`; another token changes nothing.

        Returns:
            Whether a claim was released.
        """
        check_name(thread_id, "thread_id")
        check_int(token, "token")
        return self._engine.write("release", lambda c: claims.release(c, thread_id, token))

    async def arelease(self, thread_id: str, token: int) -> bool:
        """Async twin of `release`."""
        return await self._engine.arun(self.release, thread_id, token)

    def current_claim(self, thread_id: str) -> Claim | None:
        """Return the thread's claim (live or expired), or None."""
        check_name(thread_id, "thread_id")
        return self._engine.read("current_claim", lambda c: claims.current_claim(c, thread_id))

    async def acurrent_claim(self, thread_id: str) -> Claim | None:
        """Async twin of `current_claim`."""
        return await self._engine.arun(self.current_claim, thread_id)

    def lease(
        self,
        thread_id: str,
        holder: str,
        ttl: float | timedelta = 30.0,
        renew_every: float | timedelta | None = None,
        *,
        take_over: bool = False,
    ) -> Lease:
        """Return a context manager that claims, renews in the background, and releases."""
        return Lease(self._as_saver(), thread_id, holder, ttl, renew_every, take_over=take_over)

    def alease(
        self,
        thread_id: str,
        holder: str,
        ttl: float | timedelta = 30.0,
        renew_every: float | timedelta | None = None,
        *,
        take_over: bool = False,
    ) -> AsyncLease:
        """Async twin of `lease` (`async with saver.alease(...) as lease:`)."""
        return AsyncLease(
            self._as_saver(), thread_id, holder, ttl, renew_every, take_over=take_over
        )

    def _as_saver(self) -> FencedSqliteSaver:
        return self  # type: ignore[return-value]  # only ever mixed into the saver

    # --- runs: a claim with lifecycle events ------------------------------------------------

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

        With `strategy` "interrupt" or "rollback" a live claim is taken over
        (and logged as `run_superseded`); "rollback" also retracts the
        superseded run's checkpoints and writes, by its run id.

        Args:
            tenant: The tenant the run is for: another tenant's thread is
                refused, and a thread that holds nothing yet becomes this
                tenant's. None: any thread.
            principal: Who the run acts for, named in its events.

        Raises:
            TenantMismatch: the thread is another tenant's; nothing changes.
            ThreadBusy: the thread is busy and the strategy does not take
                over; nothing changes.
        """
        check_name(thread_id, "thread_id")
        check_name(holder, "holder")
        check_name(run_id, "run_id")
        if strategy not in runs.RUN_STRATEGIES:
            raise bad_argument("strategy", f"expected one of {runs.RUN_STRATEGIES}")
        seconds = to_seconds(ttl, "ttl")
        _optional_name(tenant, "tenant")
        _optional_name(principal, "principal")
        return self._engine.write(
            f"begin_run({strategy})",
            lambda c: runs.begin_run_txn(
                c,
                thread_id,
                holder,
                seconds,
                run_id=run_id,
                strategy=strategy,
                now=read_now(self._engine.clock),
                tenant=tenant,
                principal=principal,
            ),
        )

    def renew_run(
        self, thread_id: str, token: int, ttl: float | timedelta
    ) -> tuple[Claim, str | None]:
        """Renew a run's claim as `renew` does, and say whether its run should stop.

        Returns:
            The renewed claim, and who asked its run to stop (`cancel_run`),
            or None when nobody did.

        Raises:
            StaleClaim: `token` is not the thread's current claim.
        """
        check_name(thread_id, "thread_id")
        check_int(token, "token")
        seconds = to_seconds(ttl, "ttl")
        return self._engine.write(
            "renew_run",
            lambda c: claims.renew_run(
                c, thread_id, token, seconds, now=read_now(self._engine.clock)
            ),
        )

    def cancel_run(self, thread_id: str, *, by: str, tenant: str | None = None) -> Claim | None:
        """Ask the run holding the thread, in any process, to stop; log `cancel_requested`.

        The request is durable and goes with the claim it is for: the run's
        next renewal sees it (a `FencedRunner` run then stops and logs
        `run_cancelled`); a later run of the thread never does.

        Args:
            by: Who asks (named in the events).
            tenant: Refuse another tenant's thread (None: any thread).

        Returns:
            The claim asked to stop, or None when nothing holds the thread.

        Raises:
            TenantMismatch: the thread is another tenant's; nothing changes.
        """
        check_name(thread_id, "thread_id")
        check_name(by, "by")
        _optional_name(tenant, "tenant")
        return self._engine.write(
            "cancel_run",
            lambda c: runs.cancel_run_txn(
                c, thread_id, by, now=read_now(self._engine.clock), tenant=tenant
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
        """Log a run's end event and release its claim, in one commit.

        Args:
            kind: `run_completed` (logged as `run_interrupted` when the graph
                stopped at an interrupt), `run_failed`, `run_cancelled`,
                `run_timed_out`, ...
            data: The event's data.
            static_interrupt: The graph stopped at an `interrupt_before/after`.
            raise_stale: Raise `StaleClaim` (naming who holds the thread)
                instead of returning False.

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
        return self._engine.write(
            f"end_run({kind})",
            lambda c: runs.end_run_txn(
                c,
                thread_id,
                token,
                kind,
                payload,
                now=read_now(self._engine.clock),
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
        """Delete a thread unless someone holds a live claim on it, in any process.

        Args:
            tenant: Refuse another tenant's thread (None: any thread).

        Raises:
            TenantMismatch: the thread is another tenant's; nothing is deleted.
            ThreadBusy: the thread has a live claim; nothing is deleted.
        """
        check_name(thread_id, "thread_id")
        check_name(holder, "holder")
        seconds = to_seconds(ttl, "ttl")
        _optional_name(tenant, "tenant")
        self._engine.write(
            "delete_unclaimed_thread",
            lambda c: runs.delete_unclaimed_txn(
                c, thread_id, holder, seconds, now=read_now(self._engine.clock), tenant=tenant
            ),
        )


def _optional_name(value: Any, name: str) -> str | None:
    return None if value is None else check_name(value, name)
