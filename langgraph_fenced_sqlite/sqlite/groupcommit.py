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

Following writes (one sync per superstep). LangGraph sends a step's
`put_writes` (one per task, from background threads) and then, a few hundred
microseconds later, the step's `put`, whose parent is the checkpoint those
writes belong to. A write that says which put would follow it (`awaits`)
waits, before leading, for that put (`closes`) to join its queue, so the step
costs one commit, not one per call. The wait is bounded and adapts:

- none at all when a commit is cheap (the measured COMMIT time, an EWMA, is
  under `CHEAP_COMMIT_S`: nothing to save);
- at most `FOLLOW_FACTOR` times the gap the awaited puts usually took to
  arrive (an EWMA of the gaps seen), within `FOLLOW_MIN_S`..`FOLLOW_MAX_S`,
  and never past the write's own deadline;
- while a batch is committing, the bound does not run down: the write
  could not lead before that commit ends anyway, and the put awaited may be
  queued behind it (LangGraph sends a thread's puts one after another, and a
  step's first writes often arrive while the previous put commits); the
  bound counts from the end of the last commit, or the write's arrival if
  later;
- it ends the moment the put is queued, or another caller leads the batch;
  a write whose put was queued rides on it: the put's caller leads the
  batch that holds the write, which sleeps on until answered (one wake-up,
  not a second wait for the store's lock), unless the put leaves the queue
  unled (its deadline, an interrupt) and the write leads its own;
- a sync caller seen twice putting the very step its own write had just
  waited for in vain (LangGraph's `update_state` writes for the checkpoint it
  builds on, then puts the new one, from the caller's thread) is judged to
  put what it writes: its next `SEQUENTIAL_SKIPS` awaited writes lead at
  once, then one waits again; a wait of it that is joined clears the
  judgement. Async callers and hop workers are never judged (a loop thread
  or a worker serves many callers);
- a write of an error or an interrupt awaits nothing: no put follows it
  (the run raises, or stops until resumed), so it takes the put's place and
  the writes awaiting that put join its commit (`checkpoints.step_role`);
- per thread, a wait that ran out (no put followed: a caller that writes
  and then puts from the same thread, a slow sibling task, or a write to a
  `DeltaChannel`, whose put LangGraph sends only after the write returned)
  backs off: after a second one in a row, that thread's next 2, 4, 8, ...
  up to `MAX_BACKOFF` awaited writes lead at once, so a caller whose put
  never follows pays one bound in hundreds; a wait that was joined halves
  the back-off. The first is forgiven: a put that came late once (a busy
  machine) costs that step one commit, not the next step's as well;
- at most `MAX_WAITING` writes wait at once, so writes queued on a bounded
  executor cannot occupy every worker its put needs: LangGraph's sync loop
  sends a step's writes and its put to one thread pool (by default
  `min(32, cpus + 4)` workers, 6 on 2 cores), and a put that finds every
  worker waiting for it would only start once their bound ran out. Async
  callers' writes wait on the store's own hop workers instead (`hop.Hop`,
  made as calls need them, up to `hop.ASYNC_WORKERS`), where the put gets
  a worker of its own: while such writes wait, up to `MAX_WAITING_ASYNC`
  may, so an async fan-out of up to that many tasks still commits once.

Waiting holds no lock: the store's other calls run meanwhile, and the put's
own thread leads the joint batch. Nothing about durability changes: every
caller is still answered only after the COMMIT that holds its write.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.hop import ASYNC_WORKERS, on_worker
from ..errors import StoreBusy, StoreClosed, StoreError, busy_in_process

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["FollowPolicy", "GroupCommit"]

PENDING, RUNNING, DONE = "pending", "running", "done"

# A commit this cheap (seconds; tmpfs, or a disk cache that acknowledges at
# once) saves nothing worth waiting for.
CHEAP_COMMIT_S = 50e-6
# Bounds of a following write's wait, as a multiple of the usual gap.
FOLLOW_FACTOR = 4.0
FOLLOW_MIN_S = 500e-6
FOLLOW_MAX_S = 3e-3
# Before any gap was seen: what LangGraph's loop takes on a quiet machine.
INITIAL_GAP_S = 300e-6
# Before any commit was timed: assume a real disk (one sync worth saving).
INITIAL_COMMIT_S = 1e-3
MAX_BACKOFF = 256
# A caller seen twice writing a step and then putting it itself (`_put_seen`):
# this many of its next awaited writes lead at once, then one waits again.
SEQUENTIAL_SKIPS = 256
MAX_WAITING = 4
# Half the hop's workers: the other half stay free for the puts and the other calls.
MAX_WAITING_ASYNC = ASYNC_WORKERS // 2
# Weight of each new sample in the EWMAs.
_ALPHA = 0.2
# At most this many threads' back-off counters are remembered.
_MAX_REMEMBERED = 4096

_get_ident = threading.get_ident
_monotonic = time.monotonic

# A write's `awaits` / a put's `closes`: (thread_id, checkpoint_ns, checkpoint_id).
Key = tuple[str, str, str]


def _caller(asynchronous: bool) -> int | None:
    """The sync caller running this (its OS thread), or None: an async caller or a hop worker."""
    return None if asynchronous or on_worker() else _get_ident()


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


def _for_job(exc: BaseException, job: Job) -> BaseException:
    """Return the same failure for each write of the batch (each raises its own)."""
    if isinstance(exc, StoreBusy):  # the same cause, named for this write's call
        message = str(exc).replace(f"{exc.op} on ", f"{job.op} on ", 1)
        return StoreBusy(job.op, exc.path, exc.waited_s, message=message)
    if isinstance(exc, StoreError):
        return type(exc)(job.op, exc.path, message=str(exc))
    return exc


class FollowPolicy:
    """When a write awaiting its put waits, and for how long (module docstring).

    Written once for both stores: the SQLite `GroupCommit` and the
    PostgreSQL store's steps (`postgres/steps.py`) mix it in.
    The mixer gives `_mutex`, its condition `_changed` (which guards all of
    this state) and `_queue`, a list of jobs with `awaits`, `closes`,
    `arrived`, `deadline`, `followed` and `state` (PENDING until a leader
    takes one), and keeps `_leading_since`/`_ended` (when the batch being
    committed was taken, when the last ended) and `_commit_s` (an EWMA of
    its commits' time, `_timed`).
    """

    _mutex: threading.Lock
    _changed: threading.Condition
    _queue: list[Any]

    def _following(self) -> None:
        # Following writes (module docstring); all guarded by `_changed`.
        self._commit_s = INITIAL_COMMIT_S
        self._gap_s = INITIAL_GAP_S
        self._waiting = 0
        # When the batch being committed now was taken (None: none is), and
        # when the last one ended.
        self._leading_since: float | None = None
        self._ended = 0.0
        # thread_id -> [awaited writes still to lead at once, next back-off]
        self._backoff: dict[str, list[int]] = {}
        # A sync caller (OS thread) that writes and then puts the same step
        # itself (LangGraph's `update_state`) can never be joined: its wait
        # always runs out. The key a caller's wait ran out on, by the key;
        # and per caller [writes still to lead at once, times seen putting
        # what it wrote]. Async callers and hop workers are not judged: one
        # loop thread or worker serves many callers.
        self._ran_out_by: dict[Key, int] = {}
        self._sequential: dict[int, list[int]] = {}
        # Counters for tests and benchmarks (see `stats`).
        self._stats = dict.fromkeys(("commits", "waited", "joined", "ran_out", "skipped"), 0)

    def stats(self) -> dict[str, int]:
        """Return counters: COMMITs made, and following writes that `waited`
        (then were `joined` by their put, or `ran_out`) or `skipped` waiting."""
        with self._mutex:
            return dict(self._stats)

    def _timed(self, took: float, *, counted: bool = True) -> None:
        # Under `_changed`: a commit took `took` seconds (`counted`: count it here).
        self._commit_s += _ALPHA * (took - self._commit_s)
        if counted:
            self._stats["commits"] += 1

    def _closing(self, put: Any, *, wake: bool = True) -> list[Any]:
        # Under `_changed`: a put arrived; mark the queued writes that await
        # it as followed and return them; wake them (not `wake`: the caller
        # answers them, which wakes them once).
        self._put_seen(put.closes)
        followed = []
        for job in self._queue:
            if job.awaits == put.closes and not job.followed:
                job.followed = True
                gap = put.arrived - job.arrived
                self._gap_s += _ALPHA * (gap - self._gap_s)
                followed.append(job)
        if followed and wake:
            self._changed.notify_all()
        return followed

    def _put_seen(self, closes: Key) -> None:
        # Under `_changed`: a put of `closes` arrived (queued or alone).
        caller = _caller(False)
        if caller is not None and self._ran_out_by.pop(closes, None) == caller:
            # This caller's own write to this step ran out, and now it puts
            # the step itself. The second time, it is judged sequential. Its
            # wait said nothing of how late this thread's puts come: the
            # back-off it set is dropped, or the caller's next invoke would
            # commit its first steps' writes alone.
            self._backoff.pop(closes[0], None)
            if len(self._sequential) >= _MAX_REMEMBERED:
                self._sequential.clear()
            seen = self._sequential.setdefault(caller, [0, 0])
            seen[1] += 1
            if seen[1] >= 2:
                seen[0] = SEQUENTIAL_SKIPS

    def _bound(self) -> float:
        # Under `_changed`: how long a following write may wait now.
        if self._commit_s < CHEAP_COMMIT_S:
            return 0.0
        return min(FOLLOW_MAX_S, max(FOLLOW_MIN_S, FOLLOW_FACTOR * self._gap_s))

    def _skip(self, thread_id: str, *, asynchronous: bool = False) -> bool:
        # Under `_changed`: whether a write awaiting a put of `thread_id`
        # leads at once (counted as skipped): backing off, a cheap disk, or
        # enough writes waiting already. False changes nothing.
        # `asynchronous`: the write waits as a coroutine, holding no thread.
        caller = _caller(asynchronous)
        sequential = None if caller is None else self._sequential.get(caller)
        if sequential is not None and sequential[0] > 0:
            sequential[0] -= 1
            self._stats["skipped"] += 1
            return True
        backoff = self._backoff.get(thread_id)
        if backoff is not None and backoff[0] > 0:
            backoff[0] -= 1
            self._stats["skipped"] += 1
            return True
        limit = MAX_WAITING_ASYNC if asynchronous or on_worker() else MAX_WAITING
        if self._bound() <= 0 or self._waiting >= limit:
            self._stats["skipped"] += 1
            return True
        return False

    def _follow(self, job: Any) -> None:
        # Under `_changed`: wait (bounded, see the module docstring) for the
        # put `job` awaits to be queued, or for a leader to take `job`.
        started = self._follow_start(job)
        if started is None:
            return
        bound, backoff = started
        try:
            while (left := self._follow_left(job, bound)) > 0:
                self._changed.wait(left)
        finally:
            self._waiting -= 1
        self._follow_done(job, backoff)

    # `_follow` in three parts, each under `_changed`, which the asyncio twin
    # (`postgres/steps.py`, `Steps.await_put`) shares: whether to wait
    # and how long a bound; how long is left; how it ended.

    def _follow_start(
        self, job: Any, *, asynchronous: bool = False
    ) -> tuple[float, list[int] | None] | None:
        # None: lead at once. Else the bound and the thread's back-off, and
        # `job` counts as waiting (`_waiting`) until the caller lowers it.
        assert job.awaits is not None
        thread_id = job.awaits[0]
        if self._skip(thread_id, asynchronous=asynchronous):
            return None
        backoff = self._backoff.get(thread_id)
        self._stats["waited"] += 1
        self._waiting += 1
        return self._bound(), backoff

    def _follow_left(self, job: Any, bound: float) -> float:
        # Seconds the wait may still go on (<= 0: it is over).
        if job.state != PENDING or job.followed:
            return 0.0
        now = time.monotonic()
        if self._leading_since is not None:
            # A batch is committing: waiting costs nothing until it ends
            # (this write could not lead before), and the put awaited may be
            # queued behind it. Look again later.
            until = now + bound
        else:
            until = max(job.arrived, self._ended) + bound
        return min(until, job.deadline) - now

    def _follow_done(
        self, job: Any, backoff: list[int] | None, *, asynchronous: bool = False
    ) -> None:
        # The wait ended: joined (the put came) or ran out; update the back-off.
        thread_id = job.awaits[0]
        caller = _caller(asynchronous)
        if job.followed:
            self._stats["joined"] += 1
            if caller is not None:  # another thread put: this caller does not put its own
                self._sequential.pop(caller, None)
            if backoff is not None:
                # Halved, not forgotten: a graph whose steps alternate (a
                # `DeltaChannel` write makes LangGraph wait for the write
                # before it puts, so that step's wait always runs out) keeps
                # most of its back-off instead of paying a bound every step.
                backoff[1] //= 2
                # Writes of one step wait together and share this entry:
                # only the first to find it spent removes it.
                if not backoff[1] and self._backoff.get(thread_id) is backoff:
                    del self._backoff[thread_id]
        elif job.state == PENDING:
            # Ran out: no put followed. Back off on this thread.
            self._stats["ran_out"] += 1
            if caller is not None:
                if len(self._ran_out_by) >= _MAX_REMEMBERED:
                    self._ran_out_by.clear()
                self._ran_out_by[job.awaits] = caller
            if len(self._backoff) >= _MAX_REMEMBERED:
                self._backoff.clear()
            if backoff is None:
                self._backoff[thread_id] = [0, 1]  # remembered, none skipped yet
            else:
                step = min(backoff[1] * 2, MAX_BACKOFF)
                self._backoff[thread_id] = [step, step]


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
