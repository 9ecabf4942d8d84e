"""Leases: a claim held for the length of a `with` block, renewed in the background.

Invariant: a lease releases its claim on exit whatever happened inside, and
only with its own token, so a lease that lost its claim can never release
its successor's. Renewal that finds the claim gone marks the lease `lost`;
any other renewal failure is logged and retried until the claim would expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig

from .claims import Claim
from .clock import to_seconds
from .errors import StaleClaim

if TYPE_CHECKING:
    from .saver import FencedSqliteSaver

__all__ = ["AsyncLease", "Lease"]

logger = logging.getLogger("langgraph_fenced_sqlite.lease")


class _LeaseBase:
    def __init__(
        self,
        saver: FencedSqliteSaver,
        thread_id: str,
        holder: str,
        ttl: float | timedelta,
        renew_every: float | timedelta | None,
        *,
        take_over: bool,
    ) -> None:
        self.saver = saver
        self.thread_id = thread_id
        self.holder = holder
        self.ttl = to_seconds(ttl, "ttl")
        self.renew_every = (
            self.ttl / 3 if renew_every is None else to_seconds(renew_every, "renew_every")
        )
        self._take_over = take_over
        self._claim: Claim | None = None
        self.lost = False
        """True once a renewal found the claim taken over, released or deleted."""

    @property
    def claim(self) -> Claim:
        """The claim held (the latest renewal of it)."""
        if self._claim is None:
            raise RuntimeError("the lease is not held: enter it first")
        return self._claim

    @property
    def token(self) -> int:
        """The fencing token of the claim."""
        return self.claim.token

    def config(self, config: RunnableConfig | None = None, **configurable: Any) -> RunnableConfig:
        """Return a config for the graph carrying the thread id and the token."""
        return self.claim.config(config, **configurable)

    def _renew_failed(self, exc: BaseException) -> bool:
        """Record a failed renewal; return True when renewing should stop."""
        if isinstance(exc, StaleClaim):
            self.lost = True
            logger.warning("lease on %r lost: %s", self.thread_id, exc)
            return True
        expires = self._claim.expires_at if self._claim else 0.0
        if self.saver.clock.now() >= expires:
            logger.error("lease on %r: renewal kept failing past expiry: %r", self.thread_id, exc)
            return True
        logger.warning("lease on %r: renewal failed, retrying: %r", self.thread_id, exc)
        return False


class Lease(_LeaseBase):
    """A claim held while a `with` block runs, renewed by a daemon thread.

    Use `saver.lease(thread_id, holder, ttl=30)`.
    """

    def __enter__(self) -> Lease:
        grant = self.saver.take_over if self._take_over else self.saver.claim
        self._claim = grant(self.thread_id, self.holder, self.ttl)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._renew_loop, name=f"lease-{self.thread_id}", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.saver.release(self.thread_id, self.claim.token)

    def _renew_loop(self) -> None:
        interval = self.renew_every
        while not self._stop.wait(interval):
            try:
                self._claim = self.saver.renew(self.thread_id, self.claim.token, self.ttl)
                interval = self.renew_every
            except Exception as exc:  # noqa: BLE001 - every failure is judged below
                if self._renew_failed(exc):
                    return
                interval = min(self.renew_every, 0.5)


class AsyncLease(_LeaseBase):
    """A claim held while an `async with` block runs, renewed by a task.

    Use `saver.alease(thread_id, holder, ttl=30)`.
    """

    async def __aenter__(self) -> AsyncLease:
        grant = self.saver.atake_over if self._take_over else self.saver.aclaim
        pending = asyncio.ensure_future(grant(self.thread_id, self.holder, self.ttl))
        try:
            self._claim = await asyncio.shield(pending)
        except asyncio.CancelledError:
            # The grant runs on a worker thread that cancellation cannot stop,
            # so it may still be granted: wait for it and give it back, or the
            # thread would stay claimed by nobody until the ttl runs out.
            with contextlib.suppress(Exception):  # not granted: nothing to give back
                granted = await pending
                await self.saver.arelease(self.thread_id, granted.token)
            raise
        self._task = asyncio.create_task(self._renew_loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        # Shielded: a cancelled block must still give its claim back.
        await asyncio.shield(self.saver.arelease(self.thread_id, self.claim.token))

    async def _renew_loop(self) -> None:
        interval = self.renew_every
        while True:
            await asyncio.sleep(interval)
            try:
                self._claim = await self.saver.arenew(self.thread_id, self.claim.token, self.ttl)
                interval = self.renew_every
            except Exception as exc:  # noqa: BLE001 - every failure is judged below
                if self._renew_failed(exc):
                    return
                interval = min(self.renew_every, 0.5)
