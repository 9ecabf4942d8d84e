"""The PostgreSQL store's connections: one transaction per call, errors translated.

Invariant: every call runs in one transaction of its own (`transaction()`),
committed when the job returns and rolled back when it raises, on a
connection used by nothing else meanwhile: a pool's connection for the
call's length, or the one given connection under a lock. No psycopg error
reaches the caller: a lock or statement timeout is `StoreBusy`, a write the
server refused as read-only `ReadOnlyStore`, anything else `StoreError`, each
naming the operation and the server (never the password). Async calls run
the same sync function through one thread hop (`arun`), except the hot ones
of a graph's steps (`arun_call`: put, put_writes, get_tuple), which send the
same batches on the store's own async connections (`native.NativeConns`),
with the same transactions, errors and step merging.

One commit per graph step (`Steps`): a fenced `put_writes` that names the
put expected to follow it (`awaits`) waits for it, bounded and adaptive by
the SQLite store's rules (`core/steps.py`'s `FollowPolicy`), and the put's thread
(`closes`) sends the writes' calls and its own in one statement (or, for
batches that cannot be joined so, their statements in one pipeline): one
implicit transaction, one round trip. Refused (a statement calls
`lgfs_refuse`), it is rolled back whole and each call runs alone as it
would have, so each caller gets the error it would have got; every caller
is answered only after the COMMIT that holds its write, or its failure.

A `readonly` store is refused twice (docs/semantics.md §8): every call that
is not marked `read_only` raises `ReadOnlyStore` before a connection is
taken, and every transaction it does run is READ ONLY in the server (the
session's `default_transaction_read_only`, or `SET TRANSACTION READ ONLY`),
so a write on a path marked wrongly fails in the database all the same.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
from collections.abc import Callable, Coroutine
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import psycopg
import psycopg.conninfo
from psycopg import errors as pg_errors
from psycopg.rows import tuple_row

from ..core.hop import ASYNC_WORKERS, Hop, HopClosed
from ..core.steps import DONE, Key, _for_job
from ..errors import (
    FencedSqliteError,
    ReadOnlyStore,
    StoreBusy,
    StoreClosed,
    StoreError,
    WrongProcess,
    WrongThread,
    bad_argument,
)
from . import sql
from .listeners import IdleListeners
from .native import NativeConns
from .send import asend_batch, run_pipelined, send_batch
from .steps import Step, Steps

try:  # psycopg-pool is part of the [postgres] extra, but a plain connection needs none
    from psycopg_pool import ConnectionPool
except ImportError:  # pragma: no cover - the extra installs it
    ConnectionPool = None  # type: ignore[assignment,misc]

T = TypeVar("T")
# A batch: queues its statements through `execute(query, params)` (which
# returns the cursor that will hold the result) and returns the function that
# reads those results after COMMIT.
Execute = Callable[[str, dict[str, Any]], psycopg.Cursor[Any]]
Send = Callable[[Execute], Callable[[], T]]

_IDLE = psycopg.pq.TransactionStatus.IDLE
# SQLSTATEs that mean "waited too long for a lock": the call changed nothing.
_BUSY = (pg_errors.LockNotAvailable, pg_errors.QueryCanceled)


def describe(info: Any) -> str:
    """Name a server as `host:port/dbname`, with no password or other options."""
    try:
        return f"postgresql://{info.host}:{info.port}/{info.dbname}"
    except Exception:  # a closed or broken connection
        return "postgresql"


class PgConnection:
    """Run jobs in transactions on a psycopg connection or a psycopg_pool pool."""

    def __init__(self, conn: Any, *, owned: bool = False, readonly: bool = False) -> None:
        """Wrap `conn`: a `psycopg.Connection` or a `psycopg_pool.ConnectionPool`.

        Args:
            conn: The connection (serialised by a lock: one call at a time)
                or the pool (one connection per call in flight).
            owned: Close `conn` on `close()` (it was opened by the saver).
            readonly: Refuse every call not marked `read_only`, and run the
                others in READ ONLY transactions.

        Raises:
            InvalidArgument: `conn` is neither.
        """
        if isinstance(conn, psycopg.Connection):
            self._pool = None
            self._conn: psycopg.Connection[Any] | None = conn
            where = describe(conn.info)
        elif ConnectionPool is not None and isinstance(conn, ConnectionPool):
            self._pool, self._conn = conn, None
            where = f"pool {conn.name!r}"
        else:
            kind = type(conn).__name__
            hint = ""
            if kind.startswith("Async"):  # coming from AsyncPostgresSaver
                hint = (
                    "; for async code give a sync one (or the DSN to "
                    "FencedPostgresSaver.from_conn_string): the saver's async methods "
                    "run on async connections of its own"
                )
            raise bad_argument(
                "conn",
                f"expected a psycopg.Connection or a psycopg_pool.ConnectionPool, got {kind}{hint}",
            )
        self.where = where
        self.readonly = readonly
        self._owned = owned
        self._lock = threading.Lock()
        self._inside = threading.local()
        self._closed = False
        self._pid = os.getpid()
        # Async calls run here (`hop.Hop`, as the SQLite engine's do); with a
        # pool, as many at once as threads, each on a connection of its own.
        self._hop = Hop(ASYNC_WORKERS, "lgfs-pg")
        self.steps = Steps()
        self._held = None if self._conn is None else _Held(self._lock, self._conn)
        self.listeners = IdleListeners()  # `watch.PgEventPoller`'s, between waits
        # Async calls' own connections (`arun_call`); a read-only store's take the hop.
        self.natives = None if readonly else NativeConns(self.listener_params, self._session)

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._closed

    @property
    def path(self) -> str:
        """`where`, under the name the SQLite engine's has (errors carry it as `path`)."""
        return self.where

    def _check(self, op: str) -> None:
        if self._closed:
            raise StoreClosed(op, self.where)
        if os.getpid() != self._pid:
            raise WrongProcess(op, self.where)
        if getattr(self._inside, "active", False):
            raise WrongThread(op, self.where)

    def _connection(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        # Every call takes one: plain objects, not generator-based context
        # managers (which cost a few us each per call).
        if self._pool is not None:
            return self._pool.connection()
        assert self._held is not None
        return self._held

    def run(
        self,
        op: str,
        job: Callable[[psycopg.Cursor[Any]], T] | None = None,
        *,
        batch: Send[T] | None = None,
        read_only: bool = False,
        pipelined: bool = False,
        awaits: Key | None = None,
        closes: Key | None = None,
    ) -> T:
        """Run `job(cursor)` in one transaction; commit if it returns, roll back if it raises.

        With `batch`, first try the call in one round trip: the statements
        `batch(execute)` queues (`execute(query, params)` returns the cursor
        that will hold the result) travel together in a psycopg pipeline as
        one transaction, and the function `batch` returned reads the results
        once they committed. A batch statement that calls `lgfs_refuse`
        rolls the whole batch back; `job` then runs as above and decides
        (which error, or an identical retry). `read_only` batches run in one
        repeatable-read snapshot and are never refused. `pipelined` runs
        `job` in a psycopg pipeline (`send.run_pipelined`): its statements travel
        together up to each result it reads, so a job that reads one result
        before it writes the rest takes two or three round trips, not one
        per statement. Only for jobs that read no `rowcount` (in a pipeline
        it is not known until the next sync).

        `read_only` marks a call that writes nothing: the only calls a
        `readonly` store runs (each in a READ ONLY transaction); any other
        call raises `ReadOnlyStore` there before a connection is taken.

        `awaits` (a fenced put_writes' key) waits a little for the put whose
        parent it is, to share its transaction; `closes` (that put's parent's
        key) takes the writes awaiting it into its batch (module docstring).

        Raises:
            StoreClosed, WrongProcess, WrongThread: the store cannot be used here.
            ReadOnlyStore: a call that may write, on a `readonly` store; or a
                write the server refused as read-only (a hot standby).
            StoreBusy: a lock or statement timeout ended the wait; nothing changed.
            StoreError: the database failed (the psycopg error is the cause).
        """
        if awaits is not None or closes is not None:
            return self._step(op, job, batch, awaits, closes)
        if batch is not None:
            with self._guard(op, writes=not read_only):
                with self._connection() as conn:
                    finish = send_batch(conn, batch, read_only=read_only, refusable=job is not None)
                    if finish is not None:
                        done = finish()
            if finish is not None:
                if not read_only:
                    self.steps.committed()
                return done
        assert job is not None, "a refused batch needs its job"
        with self._guard(op, writes=not read_only):
            with self._connection() as conn:
                outermost = conn.pgconn.transaction_status == _IDLE
                if pipelined and outermost and not self.readonly:
                    result = run_pipelined(conn, job)
                else:
                    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
                        if self.readonly and outermost and not _session_read_only(conn):
                            # Not in a caller's own transaction: that one is theirs.
                            cur.execute(sql.READ_ONLY_TRANSACTION)
                        result = job(cur)
        if not read_only:
            self.steps.committed()
        return result

    def _step(
        self,
        op: str,
        job: Callable[[psycopg.Cursor[Any]], T] | None,
        batch: Send[T] | None,
        awaits: Key | None,
        closes: Key | None,
    ) -> T:
        """`run` for a fenced write of a step: waited for, joined, or alone."""
        steps = self.steps
        usable = not (self._closed or self.readonly or getattr(self._inside, "active", False))
        if awaits is not None and batch is not None and usable:
            step = Step(op, job, batch, awaits)
            if steps.wait_for_put(step):
                result: T = steps.answered(step)
                return result
        elif closes is not None:
            taken = steps.take(closes, joins=batch is not None and usable)
            if taken:
                assert batch is not None
                return self._joint(op, job, batch, taken)
        return self._alone(op, job, batch)

    def _alone(
        self, op: str, job: Callable[[psycopg.Cursor[Any]], T] | None, batch: Send[T] | None
    ) -> T:
        """Run a fenced write alone (`run`), its time and COMMIT counted by `steps`."""
        began = self.steps.begin()
        committed = False
        try:
            result = self.run(op, job, batch=batch)
            committed = True
            return result
        finally:
            self.steps.end(began, committed)

    async def arun_call(
        self,
        op: str,
        job: Callable[[psycopg.Cursor[Any]], T] | None,
        *,
        batch: Send[T] | None,
        read_only: bool = False,
        awaits: Key | None = None,
        closes: Key | None = None,
    ) -> T:
        """Async twin of `run` for a call with a `batch`: no thread hop where it can.

        On the caller's event loop, on one of the store's own async
        connections (`native.NativeConns`): a step's write waits for its
        put as a coroutine, and the put sends the writes it takes with its
        own, as `run` does. Through the hop (`arun(run, ...)`), as every
        other async call: no batch, a `readonly` store, the given
        connection inside a transaction of the caller's, or no native
        connection free on this loop. A refused batch's `job` runs through
        the hop. Raises what `run` raises.

        Cancelled while it waits for its put, a write never runs (as
        `wait_for_put`). Once sent, a write runs to its end as one handed
        to the hop does (`_to_the_end`): LangGraph cancels a step's put in
        flight when a run with durability "sync" is cancelled. A read
        cancelled mid-statement stops there (its connection is closed).
        """
        if batch is None or not self._native_ok():
            return await self.arun(
                self.run, op, job, batch=batch, read_only=read_only, awaits=awaits, closes=closes
            )
        steps = self.steps
        if awaits is not None:
            step = Step(op, job, batch, awaits)
            if await steps.await_put(step):
                result: T = await steps.aanswered(step)
                return result
        elif closes is not None:
            taken = steps.take(closes, joins=True)
            if taken:
                return await _to_the_end(self._ajoint(op, job, batch, taken))
        if read_only:
            return await self._aalone(op, job, batch, read_only=True)
        return await _to_the_end(self._aalone(op, job, batch, read_only=False))

    def _native_ok(self) -> bool:
        """Whether an async call may run on a native connection now (`arun_call`)."""
        if self.natives is None or self._closed or os.getpid() != self._pid:
            return False
        # A given connection inside a transaction (the caller's own, or
        # another thread's call in flight): the hop, as before.
        return self._conn is None or self._conn.pgconn.transaction_status == _IDLE

    async def _aalone(
        self,
        op: str,
        job: Callable[[psycopg.Cursor[Any]], T] | None,
        batch: Send[T],
        *,
        read_only: bool,
    ) -> T:
        """Async twin of `_alone` (and of `run`'s batch, `read_only`), on a native connection."""
        assert self.natives is not None
        loop = asyncio.get_running_loop()
        guard = self._aguard(op, writes=not read_only)  # refuses before a connection is taken
        conn = await self.natives.take(loop)
        if conn is None:  # none free on this loop: the hop
            if read_only:
                return await self.arun(self.run, op, job, batch=batch, read_only=True)
            return await self.arun(self._alone, op, job, batch)
        steps = self.steps
        began = 0.0 if read_only else steps.begin()
        finish = None
        try:
            with guard:
                try:
                    finish = await asend_batch(
                        conn, batch, read_only=read_only, refusable=job is not None
                    )
                finally:
                    self.natives.give(loop, conn)
                if finish is not None:
                    result = finish()
        finally:
            if not read_only:
                steps.end(began, finish is not None)
        if finish is not None:
            if not read_only:
                steps.committed()
            return result
        # Refused: rolled back; the job decides (an error, or an identical retry).
        return await self.arun(self._alone, op, job, None)

    def _joint(
        self,
        op: str,
        job: Callable[[psycopg.Cursor[Any]], T] | None,
        batch: Send[T],
        taken: list[Step],
    ) -> T:
        """Send `taken`'s writes and this put in one transaction; alone if refused.

        Each write's caller is answered here: with its result once the joint
        COMMIT returned, with its own outcome run alone if the batch was
        refused, or with this batch's failure (named for its call) if the
        batch failed otherwise: rolled back, nothing of it committed.
        """
        steps = self.steps
        send = _joint_send(batch, taken)
        began = steps.begin()
        finish = None
        try:
            with self._guard(op, writes=True):
                with self._connection() as conn:
                    finish = send_batch(conn, send, read_only=False, refusable=True)
                    if finish is not None:
                        result = finish()
        except BaseException as exc:
            self._joint_failed(began, exc, taken)
            raise
        if finish is not None:
            self._joint_committed(began, taken)
            return result
        steps.end(began, False)
        return self._joint_refused(op, job, batch, taken)

    async def _ajoint(
        self,
        op: str,
        job: Callable[[psycopg.Cursor[Any]], T] | None,
        batch: Send[T],
        taken: list[Step],
    ) -> T:
        """Async twin of `_joint`, on a native connection (the hop's `_joint` if none is free)."""
        assert self.natives is not None
        loop = asyncio.get_running_loop()
        steps = self.steps
        try:
            guard = self._aguard(op, writes=True)  # refuses before a connection is taken
            conn = await self.natives.take(loop)
        except BaseException as exc:
            # The writes it took are answered whatever happens (as `_joint`).
            self._joint_failed(steps.begin(), exc, taken)
            raise
        if conn is None:
            return await self.arun(self._joint, op, job, batch, taken)
        send = _joint_send(batch, taken)
        began = steps.begin()
        finish = None
        try:
            with guard:
                try:
                    finish = await asend_batch(conn, send, read_only=False, refusable=True)
                finally:
                    self.natives.give(loop, conn)
                if finish is not None:
                    result = finish()
        except BaseException as exc:
            self._joint_failed(began, exc, taken)
            raise
        if finish is not None:
            self._joint_committed(began, taken)
            return result
        steps.end(began, False)
        return await self.arun(self._joint_refused, op, job, batch, taken)

    def _joint_committed(self, began: float, taken: list[Step]) -> None:
        """The joint batch committed: count it and answer the writes it took (results set)."""
        steps = self.steps
        steps.committed()
        steps.end(began, True)
        steps.answer(taken)

    def _joint_failed(self, began: float, exc: BaseException, taken: list[Step]) -> None:
        """The joint batch failed with `exc` (rolled back): answer each write with it."""
        steps = self.steps
        steps.end(began, False)
        if isinstance(exc, Exception):
            for s in taken:
                s.error = _for_job(exc, s)
        else:
            kind = type(exc).__name__
            for s in taken:
                s.error = StoreError(
                    s.op,
                    self.where,
                    message=(
                        f"{s.op} on {self.where}: the transaction it was sent in was "
                        f"interrupted ({kind}); it may or may not have committed"
                    ),
                )
        steps.answer(taken)

    def _joint_refused(
        self,
        op: str,
        job: Callable[[psycopg.Cursor[Any]], T] | None,
        batch: Send[T],
        taken: list[Step],
    ) -> T:
        """The joint batch was refused (rolled back whole): each call alone, in arrival order.

        Each decides its own outcome (an error, or its write committed); the
        put's own is returned.
        """
        steps = self.steps
        try:
            for s in taken:
                try:
                    s.result = self._alone(s.op, s.job, s.batch)
                except Exception as exc:  # noqa: BLE001 - handed to its caller
                    s.error = exc
                steps.answer([s])
        finally:
            left = [s for s in taken if s.state != DONE]
            for s in left:
                s.error = StoreError(
                    s.op, self.where, message=f"{s.op} on {self.where}: interrupted; nothing ran"
                )
            steps.answer(left)
        return self._alone(op, job, batch)

    def run_outside_transaction(self, op: str, job: Callable[[psycopg.Cursor[Any]], T]) -> T:
        """Run `job(cursor)` in autocommit, outside any transaction (what VACUUM needs).

        A call that may write: refused on a `readonly` store. A connection
        not in autocommit is switched to it for the call and back.

        Raises:
            StoreError: the connection is inside a transaction of the caller's.
            (and as `run`)
        """
        with self._guard(op, writes=True):
            with self._connection() as conn:
                if conn.pgconn.transaction_status != _IDLE:
                    raise StoreError(
                        op,
                        self.where,
                        message=(
                            f"{op} on {self.where}: the connection is inside a transaction, "
                            f"and {op} must run outside one; commit or roll it back first"
                        ),
                    )
                toggled = not conn.autocommit
                if toggled:
                    conn.autocommit = True
                try:
                    with conn.cursor(row_factory=tuple_row) as cur:
                        return job(cur)
                finally:
                    if toggled:
                        conn.autocommit = False

    def _guard(self, op: str, *, writes: bool) -> _Guard:
        """Check the store may be used (and may write, if `writes`); translate what it raises."""
        self._check(op)
        if writes and self.readonly:
            raise ReadOnlyStore(op, self.where)
        return _Guard(self, op)

    def _aguard(self, op: str, *, writes: bool) -> _Guard:
        """`_guard` for a native async call: the same checks and translation, no thread mark."""
        self._check(op)
        if writes and self.readonly:
            raise ReadOnlyStore(op, self.where)
        return _Guard(self, op, mark=False)

    def _translate(self, op: str, exc: BaseException, started: float) -> BaseException | None:
        """Return the store's error for `exc`, raised inside `_guard(op)` (None: raise `exc`)."""
        if isinstance(exc, FencedSqliteError):
            return None
        if isinstance(exc, _BUSY):
            return StoreBusy(op, self.where, time.monotonic() - started)
        if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
            message = f"{op} on {self.where}: the store is read-only ({exc}); nothing was changed"
            return ReadOnlyStore(op, self.where, message=message)
        if isinstance(exc, psycopg.Error):
            message = f"{op} failed on {self.where}: {exc}".rstrip()
            return StoreError(op, self.where, message=message)
        if isinstance(exc, Exception) and type(exc).__module__.startswith("psycopg_pool"):
            # A pool timeout, a closed pool: the store failed, not the caller.
            return StoreError(op, self.where, message=f"{op} on {self.where}: {exc}")
        return None

    async def arun(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a sync store method on a worker thread: the one hop async calls pay.

        A cancelled await does not stop a call already handed over: it may
        still commit.
        """
        if self._closed or os.getpid() != self._pid:
            return method(*args, **kwargs)  # it fails (StoreClosed...) before any I/O
        try:
            return await self._hop.run(functools.partial(method, *args, **kwargs))
        except HopClosed:  # closed by a close() just now: nothing ran
            return method(*args, **kwargs)

    async def _session(self) -> tuple[Any, ...]:
        """Read `sql.SESSION` on the store's connection (a native one must match it)."""
        row: tuple[Any, ...] = await self.arun(
            self.run, "open", lambda cur: cur.execute(sql.SESSION).fetchone(), read_only=True
        )
        return row

    def listener_params(self) -> tuple[str, dict[str, Any]]:
        """Return `(conninfo, kwargs)` that open a new connection to the same server.

        The caller passes `autocommit`; rows come as tuples (psycopg's default).

        `wait_events` listens on a connection of its own, never the store's
        or the pool's, so a waiter holds none of them while it waits.
        """
        if self._pool is not None:
            # psycopg_pool 3.3 also takes callables, for credentials that rotate.
            conninfo, kwargs = self._pool.conninfo, self._pool.kwargs
            conninfo = conninfo() if callable(conninfo) else conninfo
            kwargs = kwargs() if callable(kwargs) else kwargs
            # The caller sets these (autocommit, tuples), whatever the
            # pool's own connections use: LangGraph's docs make
            # PostgresSaver's pool with `autocommit` and `dict_row`.
            return conninfo, {
                k: v for k, v in (kwargs or {}).items() if k not in ("autocommit", "row_factory")
            }
        assert self._conn is not None
        # libpq's own view of the connection's options (password included:
        # the new connection must authenticate as this one did).
        params = {
            o.keyword.decode(): o.val.decode()
            for o in self._conn.pgconn.info
            if o.val is not None and o.keyword not in (b"replication",)
        }
        return psycopg.conninfo.make_conninfo(**params), {}

    def close(self) -> None:
        """Stop accepting calls; close the connection or pool if the saver opened it."""
        if self._closed:
            return
        self._closed = True
        self._hop.close()  # never waits: close() may be running on a worker (aclose)
        self.listeners.close()
        if self.natives is not None:
            self.natives.close()
        if not self._owned:
            return
        if self._pool is not None:
            self._pool.close()
        elif self._conn is not None:
            with self._lock:  # after the call in progress
                self._conn.close()


async def _to_the_end(call: Coroutine[Any, Any, T]) -> T:
    """Await a native write as a task of its own, which a cancelled caller does not stop.

    As a write handed to the hop runs to its end: a cancel neither cuts its
    statement off mid-flight (its connection would be in doubt, its outcome
    unknown) nor leaves the writes a put took unanswered. The caller's
    await ends at once; the write may still commit. Costs a task per write
    (measured: 0.03-0.05x of a 5-node `ainvoke`).
    """
    task = asyncio.ensure_future(call)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_retrieve)
        raise


def _retrieve(task: asyncio.Future[Any]) -> None:
    # Nobody awaits it now: its error was the cancelled caller's, not one for asyncio to log.
    if not task.cancelled():
        task.exception()


def _joint_send(batch: Send[T], taken: list[Step]) -> Send[T]:
    """Return the batch that sends `taken`'s writes and then the put's `batch`, in one transaction.

    Its reader sets each write's `result` and returns the put's.
    """
    join = getattr(batch, "join", None)

    def send(execute: Execute) -> Callable[[], T]:
        # One statement when the put's batch can take the writes' into its
        # own (`txns._PutBatch.join`): psycopg's cost is per statement, and
        # a pipeline's entry and exit cost about two more.
        joined = None if join is None else join([s.batch for s in taken])
        if joined is not None:
            read_all = joined(execute)

            def finish_joined() -> T:
                own_result, results = read_all()
                for s, result in zip(taken, results, strict=True):
                    s.result = result
                return own_result

            return finish_joined
        readers = [s.batch(execute) for s in taken]
        own = batch(execute)

        def finish() -> T:
            for s, read in zip(taken, readers, strict=True):
                s.result = read()
            return own()

        return finish

    return send


class _Held:
    """The one given connection, held under the store's lock (`PgConnection._connection`)."""

    __slots__ = ("_conn", "_lock")

    def __init__(self, lock: threading.Lock, conn: psycopg.Connection[Any]) -> None:
        self._lock, self._conn = lock, conn

    def __enter__(self) -> psycopg.Connection[Any]:
        self._lock.acquire()
        return self._conn

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class _Guard:
    """`PgConnection._guard`'s context: marks the thread inside, translates what escapes."""

    __slots__ = ("_mark", "_op", "_started", "_store")

    def __init__(self, store: PgConnection, op: str, *, mark: bool = True) -> None:
        # `mark`: the thread is inside a call until it ends. Not for a
        # coroutine (`_aguard`): the loop's thread runs others meanwhile.
        self._store, self._op, self._mark = store, op, mark
        self._started = time.monotonic()

    def __enter__(self) -> None:
        if self._mark:
            self._store._inside.active = True

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if self._mark:
            self._store._inside.active = False
        if exc is not None:
            error = self._store._translate(self._op, exc, self._started)
            if error is not None:
                raise error from exc


def _session_read_only(conn: psycopg.Connection[Any]) -> bool:
    """Whether every transaction of `conn`'s session is read-only already (no round trip).

    PostgreSQL 14 and later report both settings to the client; on an older
    server this answers False, and the transaction is made read-only itself.
    """
    return "on" in (
        conn.info.parameter_status("default_transaction_read_only"),
        conn.info.parameter_status("in_hot_standby"),
    )
