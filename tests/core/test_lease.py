"""Leases: claim on enter, renew in the background, release on exit whatever happens.

Renewal runs on real time (a thread or a task), so these tests use short real
intervals; expiry is judged by the store's clock, which is the system clock
where a test needs time to pass and a manual clock where it must not.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from langgraph_fenced_sqlite import (
    FencedSqliteSaver,
    ManualClock,
    StaleClaim,
    StoreBusy,
    SystemClock,
    ThreadBusy,
)

LOGGER = "langgraph_fenced_sqlite.lease"


def _wait_until(predicate: Callable[[], Any], timeout: float = 30.0) -> None:
    """Poll `predicate` until it is true; fail (not hang) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


async def _await_until(predicate: Callable[[], Any], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def _fenced_put(store: FencedSqliteSaver, config: Any) -> str:
    """Write one checkpoint extending the thread's latest with `config`'s token."""
    latest = store.get_tuple({"configurable": {"thread_id": config["configurable"]["thread_id"]}})
    conf = dict(config["configurable"])
    if latest is not None:
        conf["checkpoint_id"] = latest.config["configurable"]["checkpoint_id"]
    cp = empty_checkpoint()
    store.put({"configurable": conf}, cp, {"source": "loop", "step": 0, "parents": {}}, {})
    return cp["id"]


class _FailRenew(Exception):
    pass


# --- holding ---------------------------------------------------------------------------


def test_lease_keeps_the_claim_past_its_ttl(open_store: Any) -> None:
    """A lease renews in the background: after more than ttl it is still held."""
    store = open_store(clock=SystemClock())
    other = open_store(clock=SystemClock())
    with store.lease("t", "me", ttl=0.6, renew_every=0.1) as lease:
        first = lease.claim
        assert store.current_claim("t") == first
        _wait_until(lambda: time.time() > first.expires_at + 0.2)
        current = store.current_claim("t")
        assert current is not None and current.token == first.token
        assert current.expires_at > first.expires_at  # renewed, from a background thread
        assert lease.claim.expires_at > first.expires_at
        assert _busy_holder(other, "t") == "me"
        checkpoint_id = _fenced_put(store, lease.config())
        assert store.inspect_checkpoint("t", checkpoint_id=checkpoint_id)["token"] == first.token
        assert not lease.lost
    assert store.current_claim("t") is None  # released on exit
    assert other.claim("t", "next", 10).token > first.token


async def test_alease_keeps_the_claim_past_its_ttl(open_store: Any) -> None:
    """An async lease renews from a task: after more than ttl it is still held."""
    store = open_store(clock=SystemClock())
    async with store.alease("t", "me", ttl=timedelta(seconds=0.6), renew_every=0.1) as lease:
        first = lease.claim
        await _await_until(lambda: time.time() > first.expires_at + 0.2)
        current = await store.acurrent_claim("t")
        assert current is not None and current.token == first.token
        assert current.expires_at > first.expires_at
        with pytest.raises(ThreadBusy):
            await store.aclaim("t", "other", 10)
        checkpoint_id = await asyncio.to_thread(_fenced_put, store, lease.config())
        assert store.inspect_checkpoint("t", checkpoint_id=checkpoint_id)["token"] == first.token
    assert await store.acurrent_claim("t") is None


def _busy_holder(store: FencedSqliteSaver, thread_id: str) -> str | None:
    with pytest.raises(ThreadBusy) as info:
        store.claim(thread_id, "someone-else", 10)
    return info.value.holder


def test_lease_defaults_and_take_over(store: FencedSqliteSaver, clock: ManualClock) -> None:
    """`renew_every` defaults to ttl/3; `take_over=True` takes a live claim over."""
    held = store.claim("t", "stuck", 60)
    with pytest.raises(ThreadBusy):
        with store.lease("t", "me", ttl=30):
            pass
    assert store.current_claim("t") == held  # a refused lease changed nothing
    with store.lease("t", "me", ttl=timedelta(seconds=30), take_over=True) as lease:
        assert lease.renew_every == 10.0
        assert lease.token > held.token
        assert lease.claim.expires_at == clock.now() + 30
        with pytest.raises(StaleClaim):
            store.renew("t", held.token, 10)
    assert store.current_claim("t") is None


# --- releasing, whatever happens -------------------------------------------------------------


@pytest.mark.parametrize("error", [_FailRenew, KeyboardInterrupt])
def test_lease_releases_when_the_block_raises(store: FencedSqliteSaver, error: type) -> None:
    """An exception (KeyboardInterrupt included) inside the block still releases."""
    with pytest.raises(error):
        with store.lease("t", "me", ttl=30, renew_every=0.01) as lease:
            assert store.current_claim("t") == lease.claim
            raise error("inside the block")
    assert store.current_claim("t") is None
    store.claim("t", "next", 30)


async def test_alease_releases_when_the_block_raises(store: FencedSqliteSaver) -> None:
    """An exception inside an `async with` block still releases."""
    with pytest.raises(_FailRenew):
        async with store.alease("t", "me", ttl=30, renew_every=0.01):
            raise _FailRenew("inside the block")
    assert await store.acurrent_claim("t") is None


async def test_alease_releases_when_its_task_is_cancelled(store: FencedSqliteSaver) -> None:
    """Cancelling the task inside an `async with` block still releases the claim."""
    inside = asyncio.Event()

    async def hold() -> None:
        async with store.alease("t", "me", ttl=30, renew_every=0.01):
            inside.set()
            await asyncio.Event().wait()  # forever, until cancelled

    task = asyncio.create_task(hold())
    await asyncio.wait_for(inside.wait(), 30)
    assert (await store.acurrent_claim("t")).holder == "me"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 30)
    assert await store.acurrent_claim("t") is None
    await store.aclaim("t", "next", 30)


# --- losing the claim ----------------------------------------------------------------------


def test_lease_notices_a_takeover(open_store: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A renewal that finds the claim taken over sets `lost`; exit leaves the new claim."""
    caplog.set_level(logging.WARNING, LOGGER)
    store, other = open_store(), open_store()
    with store.lease("t", "me", ttl=30, renew_every=0.01) as lease:
        thief = other.take_over("t", "thief", 30)
        _wait_until(lambda: lease.lost)
        with pytest.raises(StaleClaim) as info:
            _fenced_put(store, lease.config())
        assert (info.value.token, info.value.current_token) == (lease.token, thief.token)
    assert other.current_claim("t") == thief  # the lost lease did not release it
    assert any("lost" in r.getMessage() for r in caplog.records if r.name == LOGGER)


async def test_alease_notices_a_takeover(open_store: Any) -> None:
    """An async lease whose claim was taken over becomes `lost`."""
    store, other = open_store(), open_store()
    async with store.alease("t", "me", ttl=30, renew_every=0.01) as lease:
        thief = await other.atake_over("t", "thief", 30)
        await _await_until(lambda: lease.lost)
    assert await other.acurrent_claim("t") == thief


# --- renewal failures other than a takeover ------------------------------------------------------


def _hold_write_lock(db_path: str) -> sqlite3.Connection:
    """Take the file's write lock from a plain sqlite3 connection (another writer)."""
    blocker = sqlite3.connect(db_path, isolation_level=None, timeout=5)
    blocker.execute("BEGIN IMMEDIATE")
    return blocker


def _renewal_failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == LOGGER and r.levelno == logging.WARNING and "StoreBusy" in r.getMessage()
    ]


def test_lease_retries_a_failed_renewal_and_logs_it(
    open_store: Any, db_path: str, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A renewal refused by a locked file is logged and retried; renewal resumes after."""
    caplog.set_level(logging.WARNING, LOGGER)
    store = open_store(busy_timeout=0.05)
    with store.lease("t", "me", ttl=30, renew_every=0.01) as lease:
        blocker = _hold_write_lock(db_path)
        try:
            _wait_until(lambda: len(_renewal_failures(caplog)) >= 2)  # failed, then retried
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        # The store clock did not move, so the claim never neared expiry; move
        # it now, so only a renewal made after the lock went can match.
        clock.advance(5)
        _wait_until(lambda: store.current_claim("t").expires_at == clock.now() + 30)
        assert not lease.lost
        _fenced_put(store, lease.config())
    assert store.current_claim("t") is None


async def test_alease_retries_a_failed_renewal_and_logs_it(
    open_store: Any, db_path: str, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """An async lease logs and retries a renewal refused by a locked file."""
    caplog.set_level(logging.WARNING, LOGGER)
    # An async call's deadline counts its hop to the store's worker thread
    # (groupcommit.py), and the first one also starts that thread: on a
    # loaded machine the lease's own claim once spent 0.25 s getting there
    # and met StoreBusy before the test began. 1 s still fails a renewal
    # behind the held lock quickly.
    store = open_store(busy_timeout=1.0)
    async with store.alease("t", "me", ttl=30, renew_every=0.01) as lease:
        blocker = _hold_write_lock(db_path)
        try:
            await _await_until(lambda: len(_renewal_failures(caplog)) >= 2)
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        clock.advance(5)
        await _await_until(lambda: lease.claim.expires_at == clock.now() + 30)
        assert not lease.lost
    assert await store.acurrent_claim("t") is None


def test_lease_stops_retrying_once_the_claim_expired(
    open_store: Any, db_path: str, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Renewal failing until past expiry is logged as an error and renewal stops."""
    caplog.set_level(logging.WARNING, LOGGER)
    store = open_store(busy_timeout=0.05)
    with store.lease("t", "me", ttl=30, renew_every=0.01) as lease:
        blocker = _hold_write_lock(db_path)
        try:
            _wait_until(lambda: _renewal_failures(caplog))
            clock.set(lease.claim.expires_at)
            _wait_until(
                lambda: any(r.levelno == logging.ERROR for r in caplog.records if r.name == LOGGER)
            )
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert not lease.lost  # expired, but nobody replaced it: still its holder's
        expired = store.current_claim("t")
        assert expired is not None and expired.token == lease.token
        _fenced_put(store, lease.config())  # an expired, unreplaced claim still writes
    assert store.current_claim("t") is None  # and its release still works


def test_store_busy_is_what_a_locked_renewal_meets(
    open_store: Any, db_path: str, clock: ManualClock
) -> None:
    """Pin the failure the retry tests provoke: renew under a foreign write lock is StoreBusy."""
    store = open_store(busy_timeout=0.05)
    granted = store.claim("t", "me", 30)
    blocker = _hold_write_lock(db_path)
    try:
        with pytest.raises(StoreBusy):
            store.renew("t", granted.token, 30)
        assert store.current_claim("t") == granted  # reads go on meanwhile
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert store.renew("t", granted.token, 30).expires_at == clock.now() + 30


async def test_alease_cancelled_while_claiming_leaves_no_claim(
    open_store: Any, db_path: str
) -> None:
    """A task cancelled while its lease's claim waits for the file holds no claim after.

    The claim runs on a worker thread that cancellation cannot stop: it may be
    granted after the task was cancelled, and must then be given back, not
    left to block the thread until its ttl.
    """
    store = open_store(busy_timeout=30)
    blocker = _hold_write_lock(db_path)
    entered = asyncio.Event()

    async def hold() -> None:
        async with store.alease("t", "me", ttl=60):
            entered.set()

    task = asyncio.create_task(hold())
    try:
        await asyncio.sleep(0.2)  # the claim is now waiting for the write lock
        task.cancel()
        await asyncio.sleep(0.2)
    finally:
        blocker.execute("ROLLBACK")  # the grant goes through now
        blocker.close()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 30)
    assert not entered.is_set()
    assert store.current_claim("t") is None  # granted after the cancel, and given back
    assert (await store.aclaim("t", "next", 60)).holder == "next"
