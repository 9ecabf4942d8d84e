"""Claims, leases and runs as both stores offer them: one contract over a few primitives.

Invariant: every public method here checks its arguments (the same checks,
in the same order, with the same errors, on either store) before it calls
one store primitive, which runs one transaction; each async twin is one line
(`async_twin`). What differs between the stores (SQL, the clock that judges
expiry, NOTIFY) lives in each store's primitives: `sqlite.saver_claims.ClaimsAPI`
(SQLite) and `postgres.saver_claims.PgClaimsAPI` (PostgreSQL). Leases and
`FencedRunner` drive only the public methods, so they work on either store.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..clock import to_seconds
from ..errors import StaleClaim, bad_argument
from . import run_fence
from .claims import Claim, RunToken
from .lease import AsyncLease, Lease
from .run_fence import RunFences
from .runs import RUN_STRATEGIES
from .store import UsesStore
from .twins import async_twin
from .validation import check_bool, check_dict, check_int, check_json, check_name

if TYPE_CHECKING:
    from ..clock import Clock

__all__ = ["ClaimsBase"]


class ClaimsBase(UsesStore):
    """Claims and leases on threads, and runs under a claim (docs/semantics.md §2, §9).

    A mixin of both savers. A store implements the `_`-prefixed primitives
    below (each gets checked arguments and runs one transaction); everything
    public is written here once.
    """

    if TYPE_CHECKING:

        @property
        def clock(self) -> Clock:
            """The store's clock (each saver defines it)."""

        def _append_events(self, thread_id: str, token: int, new: list[Any]) -> list[int]:
            """Append events under `token` (the events half's primitive)."""

    # --- claims --------------------------------------------------------------------------

    def claim(self, thread_id: str, holder: str, ttl: float | timedelta) -> Claim:
        """Claim a thread with a new fencing token, if no live claim exists.

        Raises:
            ThreadBusy: a live claim exists (whoever holds it); nothing changes.
        """
        return self._checked_grant("claim", thread_id, holder, ttl, force=False)

    aclaim = async_twin(claim)

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
            return self._checked_grant("take_over", thread_id, holder, ttl, force=True)
        check_name(thread_id, "thread_id")
        check_name(holder, "holder")
        check_name(operator, "operator")
        return self._operator_take_over(thread_id, holder, operator, to_seconds(ttl, "ttl"))

    atake_over = async_twin(take_over)

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
        return self._force_release(thread_id, operator)

    aforce_release = async_twin(force_release)

    def _checked_grant(
        self, op: str, thread_id: str, holder: str, ttl: Any, *, force: bool
    ) -> Claim:
        check_name(thread_id, "thread_id")
        check_name(holder, "holder")
        return self._grant(op, thread_id, holder, to_seconds(ttl, "ttl"), force=force)

    def renew(self, thread_id: str, token: int, ttl: float | timedelta) -> Claim:
        """Extend the claim carrying `token` to now + `ttl` (the store's clock).

        Raises:
            StaleClaim: `token` is not the thread's current claim.
        """
        check_name(thread_id, "thread_id")
        check_int(token, "token")
        return self._renew(thread_id, token, to_seconds(ttl, "ttl"))

    arenew = async_twin(renew)

    def release(self, thread_id: str, token: int) -> bool:
        """End the claim carrying `token`; another token changes nothing.

        Returns:
            Whether a claim was released.
        """
        check_name(thread_id, "thread_id")
        check_int(token, "token")
        return self._release(thread_id, token)

    arelease = async_twin(release)

    def current_claim(self, thread_id: str) -> Claim | None:
        """Return the thread's claim (live or expired), or None."""
        check_name(thread_id, "thread_id")
        return self._current_claim(thread_id)

    acurrent_claim = async_twin(current_claim)

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
        return Lease(self, thread_id, holder, ttl, renew_every, take_over=take_over)

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
        return AsyncLease(self, thread_id, holder, ttl, renew_every, take_over=take_over)

    # --- a run's own claim, with no runner (`fence_runs`, core/run_fence.py) -------------

    # Set by each store's `__init__`; copies (`for_graph`) share `_run_fences`.
    fence_runs: bool = False
    _run_fences: RunFences

    def _run_token(self, thread_id: str, run_id: str | None) -> int | None:
        """The token a write with no token carries: under `fence_runs`, its run's own.

        A run's first write in this process claims the thread for it (one
        transaction, `_claim_run`); the others carry the token remembered.
        """
        if run_id is None or not self.fence_runs:
            return None
        fences = self._run_fences
        held = fences.get(thread_id, run_id)
        if held is None:
            with fences.claiming:
                held = fences.get(thread_id, run_id)
                if held is None:
                    held = fences.put(thread_id, run_id, self._claim_run(thread_id, run_id))
        return held

    async def _arun_token(self, thread_id: str, run_id: str | None) -> int | None:
        """Async twin of `_run_token` (a thread hop only for a run's first write)."""
        if run_id is None or not self.fence_runs:
            return None
        held = self._run_fences.get(thread_id, run_id)
        if held is None:
            return await self._engine.arun(self._run_token, thread_id, run_id)
        return held

    def _run_ended(
        self, key: tuple[str, str, str], token: int | None, run_id: str | None, writes: Any
    ) -> None:
        """Log the end (`run_interrupted`, `run_failed`) a run's own root writes mark, once.

        Its own commit, under the run's token: a run fenced off since logs nothing.
        """
        if not isinstance(token, RunToken) or key[1] != "" or run_id is None:
            return
        event = run_fence.end_event(run_id, writes)
        if event is None or not self._run_fences.ending(key[0], run_id):
            return
        try:
            self._append_events(key[0], int(token), [event])
        except StaleClaim:
            pass  # a later claim fenced the run off: its end is not this run's to log

    async def _arun_ended(
        self, key: tuple[str, str, str], token: int | None, run_id: str | None, writes: Any
    ) -> None:
        """Async twin of `_run_ended` (a thread hop only when a write ends the run)."""
        if isinstance(token, RunToken) and key[1] == "" and run_fence.end_event(run_id, writes):
            await self._engine.arun(self._run_ended, key, token, run_id, writes)

    # --- runs: a claim with lifecycle events ---------------------------------------------

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
        if strategy not in RUN_STRATEGIES:
            raise bad_argument("strategy", f"expected one of {RUN_STRATEGIES}")
        seconds = to_seconds(ttl, "ttl")
        _optional_name(tenant, "tenant")
        _optional_name(principal, "principal")
        return self._begin_run(
            thread_id,
            holder,
            seconds,
            run_id=run_id,
            strategy=strategy,
            tenant=tenant,
            principal=principal,
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
        return self._renew_run(thread_id, token, to_seconds(ttl, "ttl"))

    def cancel_run(self, thread_id: str, *, by: str, tenant: str | None = None) -> Claim | None:
        """Ask the run holding the thread, in any process or host, to stop; log `cancel_requested`.

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
        return self._cancel_run(thread_id, by, tenant)

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
        return self._end_run(
            thread_id,
            token,
            kind,
            payload,
            static_interrupt=static_interrupt,
            raise_stale=raise_stale,
        )

    def delete_unclaimed_thread(
        self,
        thread_id: str,
        holder: str,
        ttl: float | timedelta = 30.0,
        *,
        tenant: str | None = None,
    ) -> None:
        """Delete a thread unless someone holds a live claim on it, in any process or host.

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
        self._delete_unclaimed(thread_id, holder, seconds, tenant)

    # --- the store's primitives: checked arguments in, one transaction each --------------

    def _grant(self, op: str, thread_id: str, holder: str, ttl: float, *, force: bool) -> Claim:
        raise NotImplementedError

    def _operator_take_over(self, thread_id: str, holder: str, operator: str, ttl: float) -> Claim:
        raise NotImplementedError

    def _force_release(self, thread_id: str, operator: str) -> Claim | None:
        raise NotImplementedError

    def _renew(self, thread_id: str, token: int, ttl: float) -> Claim:
        raise NotImplementedError

    def _release(self, thread_id: str, token: int) -> bool:
        raise NotImplementedError

    def _current_claim(self, thread_id: str) -> Claim | None:
        raise NotImplementedError

    def _begin_run(self, thread_id: str, holder: str, ttl: float, **run: Any) -> Claim:
        """Run `begin_run`; `run` holds `run_id`, `strategy`, `tenant` and `principal`."""
        raise NotImplementedError

    def _claim_run(self, thread_id: str, run_id: str) -> int:
        """Return the token `run_id` holds on the thread, claiming it if needed (`run_fence`)."""
        raise NotImplementedError

    def _renew_run(self, thread_id: str, token: int, ttl: float) -> tuple[Claim, str | None]:
        raise NotImplementedError

    def _cancel_run(self, thread_id: str, by: str, tenant: str | None) -> Claim | None:
        raise NotImplementedError

    def _end_run(self, thread_id: str, token: int, kind: str, data: Any, **flags: bool) -> bool:
        """Run `end_run`; `flags` holds `static_interrupt` and `raise_stale`."""
        raise NotImplementedError

    def _delete_unclaimed(
        self, thread_id: str, holder: str, ttl: float, tenant: str | None
    ) -> None:
        raise NotImplementedError


def _optional_name(value: Any, name: str) -> str | None:
    return None if value is None else check_name(value, name)
