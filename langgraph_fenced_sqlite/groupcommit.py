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
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import StoreBusy, StoreClosed, StoreError

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["GroupCommit"]

PENDING, RUNNING, DONE = "pending", "running", "done"


class Job:
    """One queued write: its function, deadline, state and outcome."""

    __slots__ = ("deadline", "error", "fn", "op", "result", "started", "state")

    def __init__(
        self, op: str, fn: Callable[[sqlite3.Connection], Any], started: float, busy: float
    ) -> None:
        self.op, self.fn = op, fn
        self.started = started
        self.deadline = self.started + busy
        self.state = PENDING
        self.result: Any = None
        self.error: BaseException | None = None

    def busy(self, path: str) -> StoreBusy:
        """Return the `StoreBusy` this job gives up with."""
        return StoreBusy(self.op, path, time.monotonic() - self.started)


def _for_job(exc: BaseException, job: Job) -> BaseException:
    """Return the same failure for each write of the batch (each raises its own)."""
    if isinstance(exc, StoreBusy):
        return StoreBusy(job.op, exc.path, exc.waited_s)
    if isinstance(exc, StoreError):
        return type(exc)(job.op, exc.path, message=str(exc))
    return exc


class GroupCommit:
    """The write queue of one engine, and the leader's batch."""

    def __init__(self, engine: Engine) -> None:
        """Serve `engine`'s writes; its `_lock` is the connection's lock."""
        self._engine = engine
        self._changed = threading.Condition(threading.Lock())
        self._queue: list[Job] = []

    def queued(self) -> int:
        """Return how many writes wait for a leader (tests and benchmarks)."""
        return len(self._queue)

    def write(self, op: str, fn: Callable[[sqlite3.Connection], Any], started: float) -> Any:
        """Run `fn(conn)` as one write of the next batch; see the module docstring.

        Args:
            started: When the call was made (`time.monotonic()`).

        Raises:
            StoreBusy: the write did not start within `busy_timeout` of `started`.
        """
        engine = self._engine
        job = Job(op, fn, started, engine.busy_timeout)
        with self._changed:
            self._queue.append(job)
        lock = engine._lock
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
            with self._changed:
                if job.state == PENDING:
                    # Given up while still queued: out of the queue, so no
                    # leader can ever run it.
                    self._queue.remove(job)
                    job.error, job.state = job.busy(engine.path), DONE
                while job.state == RUNNING:
                    # A leader has it: it answers (or hands it back) by the
                    # deadline, or the job has started and must finish.
                    self._changed.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def lead(self, own: Job) -> None:
        """Commit every queued write in one transaction (the caller holds the lock)."""
        with self._changed:
            batch, self._queue = self._queue, []
            for job in batch:
                job.state = RUNNING
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
            self._engine._restore_busy_wait()

    def _finish(self, batch: list[Job], error_of: Callable[[Job], BaseException]) -> None:
        with self._changed:
            for job in batch:
                if job.state != DONE:
                    job.result, job.error, job.state = None, error_of(job), DONE
            self._changed.notify_all()

    def _give_up(self, jobs: list[Job]) -> None:
        path = self._engine.path
        with self._changed:
            for job in jobs:
                job.error, job.state = job.busy(path), DONE
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
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            failed = engine._translate(live[0].op, exc, 0.0)
            self._finish(live, functools.partial(_for_job, failed))
            return
        with self._changed:
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
        while True:
            now = time.monotonic()
            expired = [j for j in batch if j.state == RUNNING and j.deadline <= now]
            if expired:
                self._give_up(expired)
            live = [j for j in batch if j.state == RUNNING]
            if own.state == DONE:
                with self._changed:
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
                # Some busy answers skip the handler (e.g. while another
                # connection recovers the WAL): pause a little ourselves.
                time.sleep(min(delay, max(0.0, budget)))
                delay = min(delay * 2, 0.05)
