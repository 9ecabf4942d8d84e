"""The one connection of a store, and the transactions run on it.

Invariant: a store's calls are serialised on one connection by one lock, each
write is one `BEGIN IMMEDIATE` transaction that commits only when its function
returned and rolls back on any exception, and every database failure leaves as
a `StoreError` naming the operation and the path. A call made while the lock
is held by the calling thread fails with `WrongThread` instead of deadlocking;
a call from a process other than the opener fails with `WrongProcess`.

Shape (STYLE.md, "Connection and threads"): a lock around a connection opened
with `check_same_thread=False`. Sync callers run on their own thread (no hop);
async callers pay exactly one `asyncio.to_thread` hop for the same function.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from . import schema
from .checksums import checksum
from .clock import Clock, SystemClock
from .errors import (
    FencedSqliteError,
    StoreBusy,
    StoreClosed,
    StoreError,
    UnsupportedFormat,
    WrongProcess,
    WrongThread,
)

__all__ = ["Engine"]

T = TypeVar("T")

# SQLite's primary result codes (sqlite3.h); the sqlite3 module names them
# only from Python 3.11 on.
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CORRUPT, _SQLITE_NOTADB = 5, 6, 11, 26
_BUSY_CODES = {_SQLITE_BUSY, _SQLITE_LOCKED}
_NOTADB_CODES = {_SQLITE_NOTADB, _SQLITE_CORRUPT}
# Python 3.10 has no `sqlite_errorcode` on errors: there, and only there, the
# code is recognised from SQLite's fixed message for it (sqlite3ErrStr).
_CODE_OF_MESSAGE = {
    "database is locked": _SQLITE_BUSY,
    "database table is locked": _SQLITE_LOCKED,
    "database disk image is malformed": _SQLITE_CORRUPT,
    "file is not a database": _SQLITE_NOTADB,
}


def _primary_code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return _CODE_OF_MESSAGE.get(str(exc))
    return int(code) & 0xFF


def _lenient_text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def connect(path: str, busy_timeout: float, *, readonly: bool = False) -> sqlite3.Connection:
    """Open a connection with the package's pragmas applied.

    Raises:
        StoreError: the file cannot be opened (missing directory, permissions).
        UnsupportedFormat: the file is not an SQLite database.
    """
    if not readonly:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise StoreError(
                "open", path, message=f"open {path}: directory {parent} does not exist"
            )
    try:
        if readonly:
            uri = "file:" + os.path.abspath(path).replace("?", "%3f").replace("#", "%23")
            conn = sqlite3.connect(
                uri + "?mode=ro",
                uri=True,
                isolation_level=None,
                check_same_thread=False,
                timeout=busy_timeout,
            )
        else:
            conn = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=busy_timeout
            )
    except sqlite3.Error as exc:
        raise StoreError("open", path, message=f"open {path}: {exc}") from exc
    conn.create_function(schema.CHECKSUM_FUNCTION, -1, checksum, deterministic=True)
    # A damaged TEXT cell may hold bytes that are not UTF-8: the default
    # decoder raises for the whole query; this keeps them (as lone surrogates,
    # never equal to what was written), so the row's checksum refuses it.
    conn.text_factory = _lenient_text
    try:
        # A read first: a file that is not a database fails here, untouched.
        conn.execute(schema.GET_USER_VERSION).fetchone()
    except sqlite3.DatabaseError as exc:
        conn.close()
        if _primary_code(exc) in _NOTADB_CODES:
            raise UnsupportedFormat(
                "open", path, message=f"open {path}: not an SQLite database ({exc}); left unchanged"
            ) from exc
        raise StoreError("open", path, message=f"open {path}: {exc}") from exc
    return conn


class _Write:
    """One queued write: its function, and its outcome once committed."""

    __slots__ = ("done", "error", "fn", "op", "result")

    def __init__(self, op: str, fn: Callable[[sqlite3.Connection], Any]) -> None:
        self.op, self.fn = op, fn
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False

    def fail(self, error: BaseException) -> None:
        self.result, self.error, self.done = None, error, True


def _retarget(exc: FencedSqliteError, op: str) -> FencedSqliteError:
    """Return the same failure for another write of the batch (each raises its own)."""
    if isinstance(exc, StoreBusy):
        return StoreBusy(op, exc.path, exc.waited_s)
    if isinstance(exc, StoreError):
        return type(exc)(op, exc.path, message=str(exc))
    return exc


class Engine:
    """Own one SQLite connection and run every call of a store on it."""

    def __init__(self, path: str, *, busy_timeout: float = 5.0, clock: Clock | None = None) -> None:
        """Open `path` (created if missing), apply pragmas and set the schema up.

        Raises:
            StoreError: the file cannot be opened or set up.
            UnsupportedFormat: not a database, not ours, or a newer schema.
        """
        self.path = path
        self.busy_timeout = busy_timeout
        self.clock: Clock = clock or SystemClock()
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._owner: int | None = None
        # Writes waiting for the connection (see `write`: group commit).
        self._queue_lock = threading.Lock()
        self._queue: list[_Write] = []
        # Async calls run here: one worker thread per store (its calls are
        # serialised anyway), made on first use, so that they stay on one warm
        # thread and skip `to_thread`'s context copy (about 10% of an aput).
        self._executor: ThreadPoolExecutor | None = None
        # Closed until the connection exists: an open that fails has nothing to
        # close, and must not warn "not closed" from __del__ later.
        self._closed = True
        self._conn = connect(path, busy_timeout)
        self._closed = False
        try:
            self._validate()
            self._apply_pragmas()
            self._setup()
        except BaseException:
            self._conn.close()
            self._closed = True
            raise

    # --- lifecycle ---------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._closed

    def close(self) -> None:
        """Wait for the call in progress, then close; a second call does nothing."""
        if self._closed:
            return
        if self._owner == threading.get_ident():
            raise WrongThread("close", self.path)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if os.getpid() == self._pid:
                self._conn.close()
            if self._executor is not None:
                # Not waiting: close() may itself be running on that thread
                # (aclose); jobs still queued there find the store closed.
                self._executor.shutdown(wait=False)

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            warnings.warn(f"store on {self.path} was not closed", ResourceWarning, stacklevel=2)

    # --- running calls -----------------------------------------------------------

    def run(self, op: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn(conn)` alone on the connection, with no transaction of its own."""
        self._check(op)
        with self._lock:
            self._owner = threading.get_ident()
            try:
                if self._closed:
                    raise StoreClosed(op, self.path)
                return fn(self._conn)
            except sqlite3.Error as exc:
                raise self._translate(op, exc, 0.0) from exc
            finally:
                self._owner = None

    def read(self, op: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn(conn)` in one read transaction (one consistent snapshot)."""

        def job(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN")
            try:
                result = fn(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result

        return self.run(op, job)

    def write(self, op: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn(conn)` as one write, committed durably before this returns.

        Group commit: writes that queue up while another is in progress are
        committed together by whichever caller gets the connection next, in
        one `BEGIN IMMEDIATE ... COMMIT` (one fsync), each inside a
        `SAVEPOINT` of its own. A write whose `fn` raises is rolled back to
        its savepoint, so it changes nothing and the others still commit;
        every caller is answered only after the `COMMIT` (or its failure).

        Raises:
            StoreBusy: the write lock was not had within `busy_timeout`.
        """
        self._check(op)
        job = _Write(op, fn)
        with self._queue_lock:
            self._queue.append(job)
        with self._lock:
            self._owner = threading.get_ident()
            try:
                if not job.done:
                    self._commit_queued()
            finally:
                self._owner = None
        if job.error is not None:
            raise job.error
        return job.result

    def _commit_queued(self) -> None:
        with self._queue_lock:
            batch, self._queue = self._queue, []
        if not batch:
            return
        try:
            self._commit_batch(batch)
        except BaseException as exc:
            # A failure outside any one write (the connection itself, an
            # interrupt): nothing of the batch commits, and every caller of it
            # hears so instead of waiting for a batch that never ran.
            with contextlib.suppress(sqlite3.Error):
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
            error: BaseException = exc
            if isinstance(exc, sqlite3.Error):
                error = self._translate(batch[0].op, exc, 0.0)
            for job in batch:
                if not job.done:
                    job.fail(_retarget(error, job.op) if isinstance(error, StoreError) else error)

    def _commit_batch(self, batch: list[_Write]) -> None:
        conn = self._conn
        try:
            if self._closed:
                raise StoreClosed(batch[0].op, self.path)
            self._begin_immediate(batch[0].op, conn)
        except FencedSqliteError as exc:
            for job in batch:
                job.fail(exc if job is batch[0] else _retarget(exc, job.op))
            return
        solo = len(batch) == 1
        for job in batch:
            if not solo:
                conn.execute("SAVEPOINT write")
            try:
                job.result = job.fn(conn)
            except BaseException as exc:  # noqa: BLE001 - handed to the job's caller
                conn.execute("ROLLBACK" if solo else "ROLLBACK TO write")
                if isinstance(exc, sqlite3.Error):
                    exc = self._translate(job.op, exc, 0.0)
                job.error = exc
            if not solo:
                conn.execute("RELEASE write")
        if solo and batch[0].error is not None:
            batch[0].done = True
            return
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            for job in batch:
                job.fail(self._translate(job.op, exc, 0.0))
            return
        for job in batch:
            job.done = True

    async def arun(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a sync store method on the store's worker thread: the one hop async calls pay.

        A cancelled await does not stop a job already handed over: it may
        still commit (see the README's caveats).
        """
        if self._closed or os.getpid() != self._pid:
            # Nothing to hand over: the method checks its arguments, then
            # fails (StoreClosed, WrongProcess) before touching the file.
            return method(*args, **kwargs)
        if self._executor is None:
            with self._lock:
                if self._executor is None and not self._closed:
                    self._executor = ThreadPoolExecutor(1, thread_name_prefix="lgfs-store")
        try:
            future = asyncio.get_running_loop().run_in_executor(
                self._executor, functools.partial(method, *args, **kwargs)
            )
        except RuntimeError:  # the executor was shut down by a close() just now
            return method(*args, **kwargs)
        return await future

    # --- internals ---------------------------------------------------------------------

    def _check(self, op: str) -> None:
        if self._closed:
            raise StoreClosed(op, self.path)
        if os.getpid() != self._pid:
            raise WrongProcess(op, self.path)
        if self._owner == threading.get_ident():
            raise WrongThread(op, self.path)

    def _begin_immediate(self, op: str, conn: sqlite3.Connection) -> None:
        # The busy handler waits up to busy_timeout; some busy answers skip the
        # handler (e.g. while another connection recovers the WAL), so retry
        # those ourselves until the same deadline.
        started = time.monotonic()
        delay = 0.001
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                waited = time.monotonic() - started
                if _primary_code(exc) not in _BUSY_CODES:
                    raise self._translate(op, exc, waited) from exc
                if waited >= self.busy_timeout:
                    raise StoreBusy(op, self.path, waited) from exc
                time.sleep(min(delay, max(0.0, self.busy_timeout - waited)))
                delay = min(delay * 2, 0.05)

    def _translate(self, op: str, exc: sqlite3.Error, waited: float) -> FencedSqliteError:
        if _primary_code(exc) in _BUSY_CODES:
            return StoreBusy(op, self.path, waited)
        return StoreError(op, self.path, message=f"{op} on {self.path}: {exc}")

    def _apply_pragmas(self) -> None:
        conn = self._conn
        for name, value in schema.PRAGMAS:
            current = conn.execute(schema.get_pragma(name)).fetchone()
            if current is not None and str(current[0]).lower() == value:
                continue
            statement = schema.set_pragma(name, value)

            def set_pragma(s: str = statement) -> Any:
                return conn.execute(s).fetchone()

            self._retry_busy("open", set_pragma)
        conn.execute(schema.set_pragma("busy_timeout", int(self.busy_timeout * 1000)))

    def _retry_busy(self, op: str, fn: Callable[[], T]) -> T:
        started = time.monotonic()
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                waited = time.monotonic() - started
                if _primary_code(exc) not in _BUSY_CODES:
                    raise self._translate(op, exc, waited) from exc
                if waited >= self.busy_timeout:
                    raise StoreBusy(op, self.path, waited) from exc
                time.sleep(0.005)

    def _validate(self) -> None:
        # Read-only checks before any pragma or write, so a file we refuse is
        # left byte for byte as it was.
        conn = self._conn
        version = conn.execute(schema.GET_USER_VERSION).fetchone()[0]
        if version > schema.SCHEMA_VERSION:
            raise UnsupportedFormat(
                "open",
                self.path,
                message=(
                    f"open {self.path}: schema version {version} is newer than this "
                    f"library's {schema.SCHEMA_VERSION}; upgrade langgraph-fenced-sqlite "
                    "(the file was left unchanged)"
                ),
            )
        if version > 0:
            self._check_ours(conn)
        elif conn.execute(schema.COUNT_SCHEMA_OBJECTS).fetchone()[0] or conn.execute(
            schema.GET_APPLICATION_ID
        ).fetchone()[0] not in (0, schema.APPLICATION_ID):
            # Tables, or another application's id on an empty file: not ours.
            raise UnsupportedFormat(
                "open",
                self.path,
                message=(
                    f"open {self.path}: an SQLite database that is not a "
                    "langgraph-fenced-sqlite file (left unchanged)"
                ),
            )

    def _setup(self) -> None:
        conn = self._conn
        if conn.execute(schema.GET_USER_VERSION).fetchone()[0] == schema.SCHEMA_VERSION:
            return  # the common case: nothing to migrate, no write lock taken
        self._begin_immediate("setup", conn)
        try:
            # Re-read inside the write lock: another process may have set it up.
            # Tables and user_version change in one transaction, so the
            # version read here says exactly which migrations are left.
            version = conn.execute(schema.GET_USER_VERSION).fetchone()[0]
            for step in schema.MIGRATIONS[version:]:
                for statement in step:
                    conn.execute(statement)
            if version < schema.SCHEMA_VERSION:
                conn.execute(schema.SET_APPLICATION_ID)
                conn.execute(schema.set_user_version(schema.SCHEMA_VERSION))
        except BaseException as exc:
            conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise self._translate("setup", exc, 0.0) from exc
            raise
        conn.execute("COMMIT")

    def _check_ours(self, conn: sqlite3.Connection) -> None:
        app_id = conn.execute(schema.GET_APPLICATION_ID).fetchone()[0]
        if app_id != schema.APPLICATION_ID:
            raise UnsupportedFormat(
                "open",
                self.path,
                message=f"open {self.path}: not a langgraph-fenced-sqlite file (left unchanged)",
            )
