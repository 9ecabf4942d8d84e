"""Group commit: writes queued behind the one in progress share one durable COMMIT.

Invariant: every write has one deadline, `busy_timeout` after its call was
made (time queued behind the store's other calls included). A write's
function runs at most once, only inside a `BEGIN IMMEDIATE` transaction, and
never once its deadline passed: a write that gave up (`StoreBusy`) changed
nothing and never runs later. Every caller is answered only after the COMMIT
(or its failure). Only an `Exception` raised by a write's function belongs to
that write (rolled back to its savepoint, the others still commit); any other
`BaseException` (`KeyboardInterrupt`, `SystemExit`) fails the whole batch,
rolled back, every caller told, and is re-raised in the thread it was raised
in: the leader's.

A job is PENDING while queued, RUNNING once a leader took it into its batch
and DONE when answered; its state changes only under the queue's condition.

How long a write waits for its put is `core/steps.py`'s `FollowPolicy`.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.steps import (
    _ALPHA,
    DONE,
    PENDING,
    RUNNING,
    FollowPolicy,
    Key,
    _for_job,
    _get_ident,
    _monotonic,
)
from ..errors import StoreBusy, StoreClosed, StoreError, busy_in_process

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["FollowPolicy", "GroupCommit"]


class Job:
    """One queued write: its function, deadline, state and outcome."""

    __slots__ = (
        "arrived",
        "awaits",
        "closes",
        "deadline",
        "error",
        "fn",
        "followed",
        "op",
        "result",
        "rides",
        "started",
        "state",
    )

    def __init__(
        self,
        op: str,
        fn: Callable[[sqlite3.Connection], Any],
        started: float,
        busy: float,
        awaits: Key | None = None,
        closes: Key | None = None,
    ) -> None:
        self.op, self.fn = op, fn
        self.awaits, self.closes = awaits, closes
        self.followed = False  # the put it awaits was queued
        self.rides: Job | None = None  # that put, whose caller leads the batch holding this
        self.started = started
        self.arrived = time.monotonic()
        self.deadline = self.started + busy
        self.state = PENDING
        self.result: Any = None
        self.error: BaseException | None = None

    def busy(self, path: str, *, locked: bool = False) -> StoreBusy:
        """Return the `StoreBusy` this job gives up with.

        `locked`: its batch waited for the file's write lock (another
        connection's); else it waited for this store's other calls.
        """
        waited = time.monotonic() - self.started
        if locked:
            return StoreBusy(self.op, path, waited)
        return busy_in_process(self.op, path, waited)


class GroupCommit(FollowPolicy):
    """The write queue of one engine, and the leader's batch."""

    def __init__(self, engine: Engine) -> None:
        """Serve `engine`'s writes; its `_lock` is the connection's lock."""
        self._engine = engine
        # The condition's own lock, taken directly where no one waits or is
        # woken: `with` on a `Condition` is a Python-level call per entry
        # and exit, paid by every write.
        self._mutex = threading.Lock()
        self._changed = threading.Condition(self._mutex)
        self._queue: list[Job] = []
        self._following()

    def queued(self) -> int:
        """Return how many writes wait for a leader (tests and benchmarks)."""
        return len(self._queue)

    def write(
        self,
        op: str,
        fn: Callable[[sqlite3.Connection], Any],
        started: float,
        *,
        awaits: Key | None = None,
        closes: Key | None = None,
    ) -> Any:
        """Run `fn(conn)` as one write of the next batch; see the module docstring.

        Args:
            started: When the call was made (`time.monotonic()`).
            awaits: The put expected to follow this write (its parent's key):
                wait a little for it to join (see "Following writes").
            closes: This put's parent's key: ends the wait of writes awaiting it.

        Raises:
            StoreBusy: the write did not start within `busy_timeout` of `started`.
        """
        engine = self._engine
        skipped = False  # a following write that decided not to wait
        if not self._queue:
            if awaits is not None:
                with self._mutex:
                    skipped = self._skip(awaits[0])
            elif closes is not None and self._ran_out_by:
                with self._mutex:  # a put about to go alone: `_closing` will not see it
                    self._put_seen(closes)
            if (awaits is None or skipped) and engine._lock.acquire(False):
                # Alone: no write queued (none awaiting this put either), no
                # wait wanted, the connection free. Committed here with no
                # job, queue or condition; anything else (a write queued
                # meanwhile, a busy file) goes the whole way below.
                done, result = self._alone(op, fn, started)
                if done:
                    return result
        job = Job(op, fn, started, engine.busy_timeout, awaits, closes)
        with self._mutex:
            self._queue.append(job)
            if closes is not None:
                # The writes awaiting this put ride on it: this caller leads
                # the batch that holds them (`_await`) and they wake once,
                # answered (`_ride`), not now only to wait for the lock.
                for other in self._closing(job, wake=False):
                    other.rides = job
        try:
            if awaits is not None and not skipped:
                with self._mutex:
                    self._follow(job)
            self._await(job)
        except BaseException:
            # Interrupted (KeyboardInterrupt) before a leader took it: the
            # caller hears of it, so the write must never run later.
            with self._mutex:
                if job.state == PENDING:
                    self._queue.remove(job)
                    job.state = DONE
                    self._changed.notify_all()  # writes riding on it lead themselves
            raise
        if job.error is not None:
            raise job.error
        return job.result

    def _alone(
        self, op: str, fn: Callable[[sqlite3.Connection], Any], started: float
    ) -> tuple[bool, Any]:
        """Run one write as a batch of its own; the caller took the store's lock.

        The same steps as `lead` and `_commit` for a batch of one (deadline,
        BEGIN IMMEDIATE, the function, COMMIT, the doorbell), and the same
        outcomes: a failed write is rolled back and raises, an interrupt
        rolls back and propagates. Releases the lock.

        Every sync write of a store that is not contended runs this, so it
        reads the clock three times only (the deadline, and the COMMIT's
        start and end, which is also when the batch ended) and inlines
        `_timed` and `_restore_busy_wait`'s test.

        Returns:
            `(True, result)` once committed; `(False, None)` when nothing ran
            and the write must be queued instead (another write was queued
            before the lock was taken, or the file is busy: `_begin` retries).
        """
        engine = self._engine
        conn = engine._conn
        began_txn = False
        ended: float | None = None
        try:
            engine._owner = _get_ident()
            if self._queue:
                return False, None  # another write arrived first: it must share the batch
            if engine._closed:
                raise StoreClosed(op, engine.path)
            now = _monotonic()
            budget = started + engine.busy_timeout - now
            if budget <= 0:
                raise busy_in_process(op, engine.path, now - started)
            self._leading_since = now
            try:
                # `engine._limit_busy_wait(budget)`, its common no-op tested here.
                budget_ms = int(budget * 1000)
                if not budget_ms - 100 <= engine._busy_ms <= budget_ms:
                    engine._limit_busy_wait(budget)
                engine._cursor.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                if isinstance(exc, sqlite3.OperationalError) and engine._is_busy(exc):
                    return False, None
                raise engine._translate(op, exc, 0.0) from exc
            began_txn = True
            try:
                result = fn(conn)
            except sqlite3.Error as exc:
                raise engine._translate(op, exc, 0.0) from exc
            began = _monotonic()
            try:
                engine._cursor.execute("COMMIT")
            except sqlite3.Error as exc:
                raise engine._translate(op, exc, 0.0) from exc
            began_txn = False
            ended = _monotonic()
            with self._mutex:
                # `self._timed(ended - began)`, inlined.
                self._commit_s += _ALPHA * (ended - began - self._commit_s)
                self._stats["commits"] += 1
            ringer = engine._ringer
            if ringer is None:
                engine._after_commit()  # opens the bell, then rings it
            else:
                ringer.ring()
            return True, result
        finally:
            if began_txn:
                with contextlib.suppress(sqlite3.Error):
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
            if self._leading_since is not None:
                self._ended = _monotonic() if ended is None else ended
                self._leading_since = None
            if engine._busy_ms < engine._busy_floor_ms:
                engine._restore_busy_wait()  # its test, inlined: usually nothing to do
            engine._owner = None
            engine._lock.release()

    def _ride(self, job: Job) -> None:
        # Under `_changed`: wait while the put `job` rides on is still to
        # lead (or has led) the batch that holds `job`. It returns once `job`
        # is answered, or when it must lead itself: the put went without it
        # (gave up at its deadline, or was interrupted, while `job` was still
        # queued), or `job`'s own deadline passed (`_await` then decides).
        put = job.rides
        assert put is not None
        while job.state != DONE and (job.state == RUNNING or put.state != DONE):
            left = job.deadline - time.monotonic()
            if left <= 0:
                return
            self._changed.wait(left)

    def _await(self, job: Job) -> None:
        # Lead a batch holding `job`, or wait for the leader that took it.
        engine = self._engine
        lock = engine._lock
        if job.rides is not None and job.state != DONE:
            with self._mutex:
                self._ride(job)
        while job.state != DONE:
            remaining = job.deadline - time.monotonic()
            # Waiting for the store's own lock counts against the deadline too
            # (acquire(timeout=0) is a non-blocking try; -1 would mean forever).
            if lock.acquire(timeout=max(remaining, 0.0)):
                try:
                    engine._owner = threading.get_ident()
                    if job.state != DONE:
                        self.lead(job)
                finally:
                    engine._owner = None
                    lock.release()
                continue
            with self._mutex:
                if job.state == PENDING:
                    # Given up while still queued: out of the queue, so no
                    # leader can ever run it. Writes riding on it (a put)
                    # wake to lead themselves.
                    self._queue.remove(job)
                    job.error, job.state = job.busy(engine.path), DONE
                    self._changed.notify_all()
                while job.state == RUNNING:
                    # A leader has it: it answers (or hands it back) by the
                    # deadline, or the job has started and must finish.
                    self._changed.wait()

    def lead(self, own: Job) -> None:
        """Commit every queued write in one transaction (the caller holds the lock)."""
        with self._mutex:
            batch, self._queue = self._queue, []
            for job in batch:
                job.state = RUNNING
            self._leading_since = time.monotonic()
        try:
            self._commit(own, batch)
        except BaseException as exc:
            engine = self._engine
            with contextlib.suppress(sqlite3.Error):
                if engine._conn.in_transaction:
                    engine._conn.execute("ROLLBACK")
            if isinstance(exc, Exception):
                # A failure outside any one write (the connection itself):
                # nothing of the batch commits, and every caller hears so.
                error: BaseException = exc
                if isinstance(exc, sqlite3.Error):
                    error = engine._translate(own.op, exc, 0.0)
                self._finish(batch, functools.partial(_for_job, error))
                return
            # An interrupt belongs to the thread it was delivered to (this
            # one), never to the caller whose write happened to be running.
            kind = type(exc).__name__
            self._finish(
                batch,
                lambda j: StoreError(
                    j.op,
                    engine.path,
                    message=(
                        f"{j.op} on {engine.path}: the batch it was committed in was "
                        f"interrupted ({kind}); nothing was changed"
                    ),
                ),
            )
            raise
        finally:
            self._ended = time.monotonic()
            self._leading_since = None
            self._engine._restore_busy_wait()

    def _finish(self, batch: list[Job], error_of: Callable[[Job], BaseException]) -> None:
        with self._mutex:
            for job in batch:
                if job.state != DONE:
                    job.result, job.error, job.state = None, error_of(job), DONE
            self._changed.notify_all()

    def _give_up(self, jobs: list[Job], *, locked: bool = False) -> None:
        path = self._engine.path
        with self._mutex:
            for job in jobs:
                job.error, job.state = job.busy(path, locked=locked), DONE
            self._changed.notify_all()

    def _commit(self, own: Job, batch: list[Job]) -> None:
        engine = self._engine
        if engine._closed:
            self._finish(batch, lambda j: StoreClosed(j.op, engine.path))
            return
        live = self._begin(own, batch)
        if live is None:
            return
        conn = engine._conn
        solo = len(live) == 1
        ran = False
        for job in live:
            if time.monotonic() >= job.deadline:
                self._give_up([job])  # past its deadline: it never runs
                continue
            ran = True
            if not solo:
                conn.execute("SAVEPOINT write")
            try:
                job.result = job.fn(conn)
            except Exception as exc:  # noqa: BLE001 - handed to the job's caller
                conn.execute("ROLLBACK" if solo else "ROLLBACK TO write")
                if isinstance(exc, sqlite3.Error):
                    exc = engine._translate(job.op, exc, 0.0)
                job.error = exc
            if not solo:
                conn.execute("RELEASE write")
        if not ran or (solo and live[0].error is not None):
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._finish(live, lambda j: j.error or StoreError(j.op, engine.path))
            return
        try:
            began = time.monotonic()
            conn.execute("COMMIT")
            took = time.monotonic() - began
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            failed = engine._translate(live[0].op, exc, 0.0)
            self._finish(live, functools.partial(_for_job, failed))
            return
        with self._mutex:
            self._timed(took)
            for job in live:
                job.state = DONE
            self._changed.notify_all()
        engine._after_commit()

    def _begin(self, own: Job, batch: list[Job]) -> list[Job] | None:
        """Open the batch's transaction; return the jobs still live, or None.

        Retries while the file is busy: each job is failed at its own
        deadline, and when the leader's own job gives up the rest go back to
        the queue for the next caller to lead, so no caller is answered late.
        """
        engine = self._engine
        delay = 0.001
        locked = False  # the file answered busy: another connection holds its lock
        while True:
            now = time.monotonic()
            expired = [j for j in batch if j.state == RUNNING and j.deadline <= now]
            if expired:
                self._give_up(expired, locked=locked)
            live = [j for j in batch if j.state == RUNNING]
            if own.state == DONE:
                with self._mutex:
                    for job in live:
                        job.state = PENDING
                    self._queue[:0] = live
                    self._changed.notify_all()
                return None
            budget = min(j.deadline for j in live) - now
            # SQLite's busy handler must not wait past the earliest deadline.
            engine._limit_busy_wait(budget)
            try:
                engine._conn.execute("BEGIN IMMEDIATE")
                return live
            except sqlite3.OperationalError as exc:
                if not engine._is_busy(exc):
                    raise
                locked = True
                # Some busy answers skip the handler (e.g. while another
                # connection recovers the WAL): pause a little ourselves.
                time.sleep(min(delay, max(0.0, budget)))
                delay = min(delay * 2, 0.05)
