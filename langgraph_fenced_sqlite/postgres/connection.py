"""The PostgreSQL store's connections: one transaction per call, errors translated.

Invariant: every call runs in one transaction of its own (`transaction()`),
committed when the job returns and rolled back when it raises, on a
connection used by nothing else meanwhile: a pool's connection for the
call's length, or the one given connection under a lock. No psycopg error
reaches the caller: a lock or statement timeout is `StoreBusy`, a write the
server refused as read-only `ReadOnlyStore`, anything else `StoreError`, each
naming the operation and the server (never the password). Async calls run
the same sync function through one thread hop (`arun`).

One commit per graph step (`Steps`): a fenced `put_writes` that names the
put expected to follow it (`awaits`) waits for it, bounded and adaptive by
the SQLite store's rules (`groupcommit.FollowPolicy`), and the put's thread
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

import functools
import os
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import psycopg
import psycopg.conninfo
from psycopg import errors as pg_errors
from psycopg.rows import tuple_row

from .. import groupcommit
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
from ..groupcommit import DONE, PENDING, RUNNING, FollowPolicy, Key, _for_job
from ..hop import ASYNC_WORKERS, Hop, HopClosed
from . import sql
from .listeners import IdleListeners

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
# How long past its arrival a write awaiting its put may wait at most, a
# commit in flight included (the policy's bound runs down only after it),
# as a multiple of the bound's most (`groupcommit.FOLLOW_MAX_S`).
_FOLLOW_DEADLINE = 4

# SQLSTATEs that mean "waited too long for a lock": the call changed nothing.
_BUSY = (pg_errors.LockNotAvailable, pg_errors.QueryCanceled)


def describe(info: Any) -> str:
    """Name a server as `host:port/dbname`, with no password or other options."""
    try:
        return f"postgresql://{info.host}:{info.port}/{info.dbname}"
    except Exception:  # a closed or broken connection
        return "postgresql"


class Step:
    """A fenced write waiting for its put (`Steps`); the fields `FollowPolicy` reads."""

    __slots__ = (
        "arrived",
        "awaits",
        "batch",
        "closes",
        "deadline",
        "error",
        "followed",
        "job",
        "op",
        "result",
        "state",
    )

    def __init__(
        self, op: str, job: Any, batch: Any, awaits: Key | None, closes: Key | None = None
    ) -> None:
        self.op, self.job, self.batch = op, job, batch
        self.awaits, self.closes = awaits, closes
        self.followed = False
        self.arrived = time.monotonic()
        self.deadline = self.arrived + _FOLLOW_DEADLINE * groupcommit.FOLLOW_MAX_S
        self.state = PENDING
        self.result: Any = None
        self.error: BaseException | None = None


class Steps(FollowPolicy):
    """The writes waiting for their step's put, and the policy of the wait."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._changed = threading.Condition(self._mutex)
        self._queue: list[Step] = []
        self._following()
        self._in_flight = 0  # fenced writes being committed now (a pool runs several)

    def wait_for_put(self, step: Step) -> bool:
        """Queue `step` and wait (bounded) for its put; True once a put took it.

        False: no put came (or no wait was due); `step` is out of the queue
        and its caller runs it alone. True: wait for `answered`.
        """
        with self._mutex:
            self._queue.append(step)
            try:
                self._follow(step)
            except BaseException:
                # Interrupted while queued: it must never run later. (Once a
                # put took it, it may still commit: the caller never hears.)
                if step.state == PENDING:
                    self._queue.remove(step)
                    step.state = DONE
                raise
            if step.state == PENDING:  # ran out, or no wait was due
                self._queue.remove(step)
                step.state = DONE
                return False
            return True

    def answered(self, step: Step) -> Any:
        """Wait until the put that took `step` answered it; return or raise its outcome."""
        with self._mutex:
            while step.state != DONE:
                self._changed.wait()
        if step.error is not None:
            raise step.error
        return step.result

    def take(self, closes: Key, joins: bool) -> list[Step]:
        """A put whose parent is `closes` arrived: return the writes it takes (`joins`).

        Not `joins` (a put that cannot share its batch): the writes awaiting
        it only stop waiting, and run alone.
        """
        put = Step("put", None, None, None, closes)
        with self._mutex:
            if not self._queue:
                return []
            # Those it takes wake once, when answered; the others now.
            self._closing(put, wake=not joins)
            if not joins:
                return []
            taken = [s for s in self._queue if s.awaits == closes and s.state == PENDING]
            for s in taken:
                s.state = RUNNING
                self._queue.remove(s)
            return taken

    def answer(self, steps: list[Step]) -> None:
        """Hand each of `steps` its outcome (set already) and wake its caller."""
        with self._mutex:
            for s in steps:
                s.state = DONE
            self._changed.notify_all()

    def committed(self) -> None:
        """A call that writes committed (`stats()["commits"]`)."""
        with self._mutex:
            self._stats["commits"] += 1

    def begin(self) -> float:
        """A fenced write starts committing; return when."""
        now = time.monotonic()
        with self._mutex:
            self._in_flight += 1
            if self._leading_since is None:
                self._leading_since = now
        return now

    def end(self, began: float, committed: bool) -> None:
        """The fenced write begun at `began` ended (`committed`: and its COMMIT counts)."""
        now = time.monotonic()
        with self._mutex:
            if committed:
                self._timed(now - began, counted=False)  # `run` counts each COMMIT
            self._in_flight -= 1
            if not self._in_flight:
                self._leading_since = None
                self._ended = now


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
            raise bad_argument(
                "conn",
                "expected a psycopg.Connection or a psycopg_pool.ConnectionPool, "
                f"got {type(conn).__name__}",
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
        `job` in a psycopg pipeline (`_pipelined`): its statements travel
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
                    finish = _send(conn, batch, read_only=read_only, refusable=job is not None)
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
                    result = _pipelined(conn, job)
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
        join = getattr(batch, "join", None)

        def send(execute: Execute) -> Callable[[], T]:
            # One statement when the put's batch can take the writes' into
            # its own (`txns._PutBatch.join`): psycopg's cost is per
            # statement, and a pipeline's entry and exit cost about two more.
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

        began = steps.begin()
        finish = None
        try:
            with self._guard(op, writes=True):
                with self._connection() as conn:
                    finish = _send(conn, send, read_only=False, refusable=True)
                    if finish is not None:
                        result = finish()
        except BaseException as exc:
            steps.end(began, False)
            if isinstance(exc, Exception):
                for s in taken:
                    s.error = _for_job(exc, s)  # type: ignore[arg-type]
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
            raise
        if finish is not None:
            steps.committed()
            steps.end(began, True)
            steps.answer(taken)
            return result
        steps.end(began, False)
        # Refused: rolled back whole. Each call alone, in the order they came,
        # decides its own outcome (an error, or its write committed).
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

    def listener_params(self) -> tuple[str, dict[str, Any]]:
        """Return `(conninfo, kwargs)` that open a new connection to the same server.

        `wait_events` listens on a connection of its own, never the store's
        or the pool's, so a waiter holds none of them while it waits.
        """
        if self._pool is not None:
            # psycopg_pool 3.3 also takes callables, for credentials that rotate.
            conninfo, kwargs = self._pool.conninfo, self._pool.kwargs
            conninfo = conninfo() if callable(conninfo) else conninfo
            kwargs = kwargs() if callable(kwargs) else kwargs
            return conninfo, dict(kwargs or {})
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
        if not self._owned:
            return
        if self._pool is not None:
            self._pool.close()
        elif self._conn is not None:
            with self._lock:  # after the call in progress
                self._conn.close()


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

    __slots__ = ("_op", "_started", "_store")

    def __init__(self, store: PgConnection, op: str) -> None:
        self._store, self._op = store, op
        self._started = time.monotonic()

    def __enter__(self) -> None:
        self._store._inside.active = True

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
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


# Each connection's cursor for a batch's first statement (`_cursor`).
_CURSORS: weakref.WeakKeyDictionary[psycopg.Connection[Any], psycopg.Cursor[Any]] = (
    weakref.WeakKeyDictionary()
)


def _cursor(conn: psycopg.Connection[Any]) -> psycopg.Cursor[Any]:
    """Return `conn`'s cursor for a batch's first statement, made once, not per call.

    Making a psycopg cursor costs about 5 us, paid by every call. One cursor
    serves every batch on the connection: a batch's reader reads it before
    the connection is let go (`PgConnection.run`), and a connection serves
    one call at a time, so no two batches hold it at once.
    """
    cur = _CURSORS.get(conn)
    if cur is None or cur.closed:
        cur = _CURSORS[conn] = conn.cursor(row_factory=tuple_row)
    return cur


def _send(
    conn: psycopg.Connection[Any], batch: Send[T], *, read_only: bool, refusable: bool
) -> Callable[[], T] | None:
    """Send `batch` in one round trip; return its reader, or None if the server refused it.

    A batch of one statement (a fenced put or put_writes, `events_after`) is
    sent as it is, in autocommit: its own transaction and snapshot, one
    round trip, and about 100 us of
    client CPU less than the same statement in a pipeline (psycopg's pipeline
    costs that much to enter, sync and leave). More statements travel in one
    pipeline, whose exit is the only sync (psycopg's `transaction()` and its
    implicit BEGIN each add one in pipeline mode). A connection not in
    autocommit is switched to it for the call and back, so psycopg adds no
    BEGIN of its own.
    """
    if conn.pgconn.transaction_status != _IDLE:
        # A caller's own connection, inside a transaction of the caller's:
        # the statements run one by one in a savepoint of it.
        def now(query: str, params: dict[str, Any]) -> psycopg.Cursor[Any]:
            cur = conn.cursor(row_factory=tuple_row)
            cur.execute(query, params)
            return cur

        try:
            with conn.transaction():
                return batch(now)
        except psycopg.Error as exc:
            if refusable and exc.sqlstate == sql.REFUSED:
                return None
            raise
    # The batch names its statements first; they are sent below.
    queued: list[tuple[psycopg.Cursor[Any], str, dict[str, Any]]] = []

    def execute(query: str, params: dict[str, Any]) -> psycopg.Cursor[Any]:
        cur = _cursor(conn) if not queued else conn.cursor(row_factory=tuple_row)
        queued.append((cur, query, params))
        return cur

    finish = batch(execute)
    toggled = not conn.autocommit
    if toggled:
        conn.autocommit = True
    try:
        if len(queued) == 1:  # one statement is one snapshot, and its own transaction
            cur, query, params = queued[0]
            cur.execute(query, params)
            return finish
        with conn.pipeline():
            if read_only:
                control = conn.cursor(row_factory=tuple_row)
                control.execute(sql.READ_SNAPSHOT)
                for cur, query, params in queued:
                    cur.execute(query, params)
                control.execute("COMMIT")
            else:
                # No BEGIN: in autocommit, PostgreSQL runs the statements up to
                # the pipeline's one Sync as one implicit transaction, committed
                # at the Sync if all succeeded, else rolled back whole (the
                # protocol's "Pipelining"). Two statements fewer to send.
                for cur, query, params in queued:
                    cur.execute(query, params)
    except BaseException as exc:
        refused = isinstance(exc, psycopg.Error) and exc.sqlstate == sql.REFUSED
        # A refusal of one write statement skips nothing: none follows it.
        # In a step's joint batch (several), it may skip the statements after.
        if not refused or conn.pgconn.transaction_status != _IDLE or len(queued) > 1:
            _recover(conn)
        if refusable and refused:
            return None
        raise
    finally:
        if toggled:
            conn.autocommit = False
    return finish


def _pipelined(conn: psycopg.Connection[Any], job: Callable[[psycopg.Cursor[Any]], T]) -> T:
    """Run `job` in one transaction inside a pipeline (explicit BEGIN and COMMIT, in autocommit).

    psycopg syncs only where `job` reads a result and at the pipeline's exit
    (its `transaction()` would add a sync on entry and exit). A refusal
    `job` raises (a `FencedSqliteError`) rolls back in the same round trip.
    """
    toggled = not conn.autocommit
    if toggled:
        conn.autocommit = True
    try:
        with conn.pipeline():
            cur = conn.cursor(row_factory=tuple_row)
            cur.execute("BEGIN")
            try:
                result = job(cur)
            except FencedSqliteError:
                cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")
        return result
    except FencedSqliteError:
        if conn.pgconn.transaction_status != _IDLE:
            _recover(conn)
        raise
    except BaseException:
        _recover(conn)
        raise
    finally:
        if toggled:
            conn.autocommit = False


def _recover(conn: psycopg.Connection[Any]) -> None:
    """After a failed batch: leave no transaction open, and psycopg no wrong prepared statement.

    psycopg records a statement as prepared when it sends its Parse; a
    pipeline aborted before the server ran that Parse (a lock timeout in
    `FENCE` skips the rest) leaves the record wrong, and the statement's next
    use fails ("prepared statement _pg3_N does not exist"). Rolling back a
    transaction is what makes psycopg forget them all (and DEALLOCATE ALL), so
    one is begun to be rolled back if none is open. A refusal needs none of
    this when it came from a batch's only statement: nothing was skipped.
    """
    try:
        if conn.pgconn.transaction_status == _IDLE:
            conn.execute("BEGIN")
        conn.rollback()
    except psycopg.Error:  # a broken connection: the first error is the one to report
        pass
