"""One commit per graph step: when a write waits for the put that follows it.

Written once for both stores (`FollowPolicy`): the SQLite store's group
commit (`sqlite/groupcommit.py`) and the PostgreSQL store's steps
(`postgres/steps.py`) mix it in.

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

import threading
import time
from typing import Any, Protocol

from ..errors import StoreBusy, StoreError
from .hop import ASYNC_WORKERS, on_worker

__all__ = ["FollowPolicy", "Key"]

# A queued write's states; one changes only under its queue's condition.
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


class Named(Protocol):
    """A queued call, as `_for_job` names it: its operation."""

    op: str


def _caller(asynchronous: bool) -> int | None:
    """The sync caller running this (its OS thread), or None: an async caller or a hop worker."""
    return None if asynchronous or on_worker() else _get_ident()


def _for_job(exc: BaseException, job: Named) -> BaseException:
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
        # Puts underway (called, not yet committed) by thread: a write
        # awaiting a put of the thread waits on meanwhile (`announce`).
        self._announced: dict[str, int] = {}
        # Counters for tests and benchmarks (see `stats`).
        self._stats = dict.fromkeys(("commits", "waited", "joined", "ran_out", "skipped"), 0)

    def stats(self) -> dict[str, int]:
        """Return counters: COMMITs made, and following writes that `waited`
        (then were `joined` by their put, or `ran_out`) or `skipped` waiting."""
        with self._mutex:
            return dict(self._stats)

    def announce(self, thread_id: str) -> None:
        """A put of `thread_id` was called: writes awaiting a put of the thread wait on.

        A put encodes its values before it is queued, which on a long
        history takes longer than any bound a write waits, and LangGraph
        calls a step's put only once the previous step's put returned. While
        a put of the thread is underway, the put a write awaits is that one
        or comes right after it, so the write waits on and shares its
        commit. Each call is paired with `withdraw` once the put returned or
        failed; the write's own bound then applies again.
        """
        with self._mutex:
            self._announced[thread_id] = self._announced.get(thread_id, 0) + 1

    def withdraw(self, thread_id: str) -> None:
        """End an `announce`: writes still waiting go back to their own bound."""
        with self._mutex:
            left = self._announced.pop(thread_id, 0) - 1
            if left > 0:
                self._announced[thread_id] = left
            if self._waiting:
                self._changed.notify_all()

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
        if job.awaits[0] in self._announced:
            # A put of its thread is underway: it is the one awaited or goes
            # before it (`announce`); `withdraw` wakes this to look again.
            return job.deadline - now
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
