"""The claims half of `FencedPostgresSaver`: claim, take over, renew, release, lease.

Invariant: every method validates its arguments with the SQLite saver's
validators, then runs one transaction from `txns.py`; each async twin is one
line. Expiry is judged by the store's clock: the database server's, unless
the saver was given one. Mixed into `FencedPostgresSaver`, which provides
`_engine` and `_now`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from ..claims import Claim
from ..clock import to_seconds
from ..lease import AsyncLease, Lease
from ..validation import check_int, check_name
from . import runs, txns
from .connection import PgConnection

__all__ = ["PgClaimsAPI"]


class PgClaimsAPI:
    """Claims and leases on threads (see docs/semantics.md §2), on PostgreSQL."""

    _engine: PgConnection
    _notify: bool

    def _now(self) -> float | None:
        raise NotImplementedError  # the saver's

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

        The previous holder's next fenced write or renewal raises `StaleClaim`;
        its release changes nothing.

        Args:
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
        return self._engine.run(
            "take_over",
            lambda cur: runs.operator_take_over(
                cur, thread_id, holder, operator, seconds, now=self._now(), notify=self._notify
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

        No token is needed. The released holder is fenced off as by a
        takeover. Logs `claim_released_by_operator` (`operator`,
        `previous_holder`, `previous_token`, `previous_run_id`, `was_live`)
        in the same commit.

        Returns:
            The claim released, or None if the thread had no claim (nothing
            changes, nothing is logged).
        """
        check_name(thread_id, "thread_id")
        check_name(operator, "operator")
        return self._engine.run(
            "force_release",
            lambda cur: runs.force_release(
                cur, thread_id, operator, now=self._now(), notify=self._notify
            ),
        )

    async def aforce_release(self, thread_id: str, *, operator: str) -> Claim | None:
        """Async twin of `force_release`."""
        return await self._engine.arun(self.force_release, thread_id, operator=operator)

    def _grant(self, op: str, thread_id: str, holder: str, ttl: Any, *, force: bool) -> Claim:
        check_name(thread_id, "thread_id")
        check_name(holder, "holder")
        seconds = to_seconds(ttl, "ttl")
        return self._engine.run(
            op,
            lambda cur: txns.grant(cur, thread_id, holder, seconds, now=self._now(), force=force),
        )

    def renew(self, thread_id: str, token: int, ttl: float | timedelta) -> Claim:
        """Extend the claim carrying `token` to now + `ttl` (the store's clock).

        Raises:
            StaleClaim: `token` is not the thread's current claim.
        """
        check_name(thread_id, "thread_id")
        check_int(token, "token")
        seconds = to_seconds(ttl, "ttl")
        return self._engine.run(
            "renew", lambda cur: txns.renew(cur, thread_id, token, seconds, now=self._now())
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
        return self._engine.run("release", lambda cur: txns.release(cur, thread_id, token))

    async def arelease(self, thread_id: str, token: int) -> bool:
        """Async twin of `release`."""
        return await self._engine.arun(self.release, thread_id, token)

    def current_claim(self, thread_id: str) -> Claim | None:
        """Return the thread's claim (live or expired), or None."""
        check_name(thread_id, "thread_id")
        return self._engine.run("current_claim", lambda cur: txns.current_claim(cur, thread_id))

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
        return Lease(self, thread_id, holder, ttl, renew_every, take_over=take_over)  # type: ignore[arg-type]

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
        return AsyncLease(self, thread_id, holder, ttl, renew_every, take_over=take_over)  # type: ignore[arg-type]
