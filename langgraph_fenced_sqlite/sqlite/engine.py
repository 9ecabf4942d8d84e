"""The one connection of a store, and the transactions run on it.

Invariant: a store's calls are serialised on one connection by one lock, each
write is one `BEGIN IMMEDIATE` transaction that commits only when its function
returned and rolls back on any exception, and every database failure leaves as
a `StoreError` naming the operation and the path. Every call has one
deadline, `busy_timeout` after it was made, for the store's lock and the
file's write lock together (`StoreBusy` past it, nothing changed). A call made
while the lock is held by the calling thread fails with `WrongThread` instead
of deadlocking; a call from a process other than the opener fails with
`WrongProcess` (and `close()` there returns at once, touching nothing).

Shape (STYLE.md, "Connection and threads"): a lock around a connection opened
with `check_same_thread=False`. Sync callers run on their own thread (no hop);
async callers pay exactly one hop to a worker thread of the store's pool, and nothing
an async method does on the event loop waits for a lock or for I/O.

After every commit of writes the engine rings the file's doorbell
(`doorbell.py`), so that watchers in any process wake at once.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ..clock import Clock, SystemClock
from ..core.checksums import checksum
from ..core.hop import ASYNC_WORKERS, Hop
from ..core.hop import HopClosed as _HopClosed
from ..errors import (
    FencedSqliteError,
    ReadOnlyStore,
    SchemaTooOld,
    StoreBusy,
    StoreClosed,
    UnsupportedFormat,
    WrongProcess,
    WrongThread,
    busy_in_process,
)
from . import schema
from .connection import connect, is_busy, is_undecodable_text, lenient_text, translate
from .doorbell import Ringer
from .groupcommit import GroupCommit

__all__ = ["Engine", "connect"]

T = TypeVar("T")

_get_ident = threading.get_ident
_monotonic = time.monotonic


class _CallStart(threading.local):
    """When the async call running on this thread was made (None: a sync call)."""

    # A class attribute: every thread reads None until it sets its own. A
    # `getattr(local, "started", None)` that misses costs a raised and caught
    # AttributeError, a sixth of a write's engine overhead.
    started: float | None = None


class _Closable(Protocol):
    def close(self) -> None: ...


class Engine:
    """Own one SQLite connection and run every call of a store on it."""

    def __init__(
        self,
        path: str,
        *,
        busy_timeout: float = 5.0,
        clock: Clock | None = None,
        readonly: bool = False,
    ) -> None:
        """Open `path` (created if missing, unless `readonly`), apply pragmas, set up.

        Raises:
            StoreError: the file cannot be opened or set up.
            ReadOnlyStore: a writable open of a read-only location.
            UnsupportedFormat: not a database, not ours, a newer schema, an old SQLite.
        """
        self.path = path
        self.busy_timeout = busy_timeout
        self.readonly = readonly
        self.clock: Clock = clock or SystemClock()
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._group = GroupCommit(self)
        # Async calls run here (`hop.Hop`): the store's own threads, made on
        # first use. Several, not one: an async write waiting for the put
        # that follows it (group commit) must not hold up that put, nor may a
        # read queue behind unrelated writes. Threads are only made when
        # every existing one is busy. Its own lock: handing a call over never
        # waits for the store's lock, which a sync call may hold for a whole
        # busy_timeout (the event loop would).
        self._hop = Hop(ASYNC_WORKERS, "lgfs-store")
        # When the async call running on this worker thread was made: its
        # deadline counts the time it queued in the pool behind other calls.
        self._call = _CallStart()
        # Watches' pollers, closed with the store (not left to the GC).
        self._pollers: weakref.WeakSet[Any] = weakref.WeakSet()
        # The doorbell, opened by the first commit: a store that only reads,
        # or refuses its file, creates no `<db>-bell`.
        self._ringer: Ringer | None = None
        # Closed until the connection exists: an open that fails has nothing to
        # close, and must not warn "not closed" from __del__ later.
        self._closed = True
        self._conn = connect(path, busy_timeout, readonly=readonly)
        # The uncontended write's BEGIN IMMEDIATE and COMMIT run on this one
        # cursor (`GroupCommit._alone`): `conn.execute` makes a cursor per
        # statement, 1.2k instructions each.
        self._cursor = self._conn.cursor()
        self._closed = False
        self._busy_ms = int(busy_timeout * 1000)
        # Below this, `_restore_busy_wait` has work to do (every write tests it).
        self._busy_floor_ms = self._busy_ms - 100
        try:
            self._validate()
            if not readonly:
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
        if os.getpid() != self._pid:
            # A forked child: the lock may have been copied while a parent
            # thread held it (it would never be released here), and the
            # connection and pollers are the parent's. Touch none of them.
            self._closed = True
            return
        if self._owner == threading.get_ident():
            raise WrongThread("close", self.path)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._conn.close()
            if self._ringer is not None:
                self._ringer.close()
        # Not waiting: close() may itself be running on a worker (aclose);
        # calls still queued there find the store closed.
        self._hop.close()
        for poller in list(self._pollers):
            poller.close()

    def register(self, poller: _Closable) -> None:
        """Close `poller` with the store (watches and waits read on their own connection)."""
        self._pollers.add(poller)

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            warnings.warn(f"store on {self.path} was not closed", ResourceWarning, stacklevel=2)

    # --- running calls -----------------------------------------------------------

    def check(self, op: str) -> None:
        """Fail now if a call `op` could not run: closed, forked, or re-entrant.

        Takes no lock, so an async method may call it on the event loop.
        """
        if self._closed:
            raise StoreClosed(op, self.path)
        if os.getpid() != self._pid:
            raise WrongProcess(op, self.path)
        if self._owner == threading.get_ident():
            raise WrongThread(op, self.path)

    def run(self, op: str, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(conn, *args)` alone on the connection, with no transaction of its own.

        Raises:
            StoreBusy: the store's other calls kept it past `busy_timeout`.
        """
        # `check(op)`, inlined: every call of the store runs this.
        if self._closed:
            raise StoreClosed(op, self.path)
        if os.getpid() != self._pid:
            raise WrongProcess(op, self.path)
        me = _get_ident()
        if self._owner == me:
            raise WrongThread(op, self.path)
        lock = self._lock
        # A free lock is taken at once, whatever the deadline (as a wait of
        # zero would); only a wait needs the deadline worked out.
        if not lock.acquire(False):
            started = self._call_started()
            remaining = started + self.busy_timeout - time.monotonic()
            # acquire(timeout=0) is a non-blocking try; -1 would mean forever.
            if not lock.acquire(timeout=max(remaining, 0.0)):
                raise busy_in_process(op, self.path, time.monotonic() - started)
        try:
            self._owner = me
            if self._closed:
                raise StoreClosed(op, self.path)
            return fn(self._conn, *args)
        except sqlite3.Error as exc:
            raise self._translate(op, exc, 0.0) from exc
        finally:
            self._owner = None
            lock.release()

    def read(self, op: str, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(conn, *args)` in one read transaction (one consistent snapshot)."""
        return self.run(op, self._read_job, fn, *args)

    def _read_job(self, conn: sqlite3.Connection, fn: Callable[..., T], *args: Any) -> T:
        # Text cells decode in C (a read's many cells, about 10% of a
        # get_tuple through the lenient Python decoder). A cell that is
        # not UTF-8 (damage) fails the whole query: read again leniently,
        # so the damaged row is reported as such, by its checksum.
        # (A method taking arguments, not closures made per call: every
        # read runs this, and the closures' cells cost more than the work.)
        conn.text_factory = str
        try:
            return _snapshot(conn, fn, args)
        except sqlite3.OperationalError as exc:
            if not is_undecodable_text(exc):
                raise
        finally:
            conn.text_factory = lenient_text
        return _snapshot(conn, fn, args)

    def query(self, op: str, sql: str, params: Any) -> list[Any]:
        """Return every row of one SELECT, run with no transaction of its own.

        One statement reads one snapshot (SQLite holds its read transaction
        from the first step to the last row), so a read that is a single
        statement needs no BEGIN and COMMIT: two statements fewer per read.
        All rows are fetched before this returns, so no snapshot outlives it.

        Raises:
            StoreBusy: the store's other calls kept it past `busy_timeout`.
        """
        return self.run(op, _query_job, sql, params)

    def write(
        self,
        op: str,
        fn: Callable[[sqlite3.Connection], T],
        *,
        awaits: tuple[str, str, str] | None = None,
        closes: tuple[str, str, str] | None = None,
    ) -> T:
        """Run `fn(conn)` as one write, committed durably before this returns.

        Group commit (see `groupcommit.py`): writes that queue up while another
        is in progress are committed together by whichever caller gets the
        connection next, in one `BEGIN IMMEDIATE ... COMMIT` (one fsync), each
        inside a `SAVEPOINT` of its own. A write whose `fn` raises is rolled
        back to its savepoint, so it changes nothing and the others still
        commit; every caller is answered only after the `COMMIT`.

        `awaits` names the put expected to follow this write, `closes` the
        parent a put stores a child of: a write awaiting a put waits briefly
        for it, so that LangGraph's step (its writes, then its put) costs one
        commit ("Following writes" in `groupcommit.py`).

        Raises:
            StoreBusy: the write had not started `busy_timeout` after this call.
            ReadOnlyStore: the store was opened with `readonly=True`.
        """
        # `check(op)` and `_call_started()`, inlined: every write runs this.
        if self._closed:
            raise StoreClosed(op, self.path)
        if os.getpid() != self._pid:
            raise WrongProcess(op, self.path)
        if self._owner == _get_ident():
            raise WrongThread(op, self.path)
        if self.readonly:
            raise ReadOnlyStore(op, self.path)
        started = self._call.started
        if started is None:
            started = _monotonic()
        result: T = self._group.write(op, fn, started, awaits=awaits, closes=closes)
        return result

    async def arun(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a sync store method on a worker thread of the store: the one hop async calls pay.

        A cancelled await does not stop a job already handed over: it may
        still commit (see docs/caveats.md).
        """
        if self._closed or os.getpid() != self._pid:
            # Nothing to hand over: the method checks its arguments, then
            # fails (StoreClosed, WrongProcess) before touching the file.
            return method(*args, **kwargs)
        call = functools.partial(self._timed_call, time.monotonic(), method, args, kwargs)
        try:
            return await self._hop.run(call)
        except _HopClosed:  # closed by a close() just now: nothing ran
            return method(*args, **kwargs)

    def _timed_call(self, started: float, method: Callable[..., T], args: Any, kwargs: Any) -> T:
        self._call.started = started
        try:
            return method(*args, **kwargs)
        finally:
            self._call.started = None

    def _call_started(self) -> float:
        started = self._call.started
        return time.monotonic() if started is None else started

    # --- after a commit (used by the group commit) --------------------------------------

    def _after_commit(self) -> None:
        """Ring the doorbell: writes just committed (called with the store's lock held).

        Never fails: a bell that cannot be opened or rung is mute, and
        watchers still see the commit by their safety poll, only later.
        """
        ringer = self._ringer
        if ringer is None:
            ringer = self._ringer = Ringer(self.path)
        ringer.ring()

    # --- busy waiting (used by the group commit) -------------------------------------

    def _is_busy(self, exc: sqlite3.Error) -> bool:
        return is_busy(exc)

    def _limit_busy_wait(self, seconds: float) -> None:
        # SQLite's busy handler (PRAGMA busy_timeout) must not wait past the
        # batch's earliest deadline. Set in 100 ms steps, and only when the
        # current value is over the budget or far under it, so an uncontended
        # write runs no extra statement.
        budget_ms = max(int(seconds * 1000), 0)
        if budget_ms - 100 <= self._busy_ms <= budget_ms:
            return
        self._busy_ms = budget_ms // 100 * 100
        self._conn.execute(schema.set_pragma("busy_timeout", self._busy_ms))

    def _restore_busy_wait(self) -> None:
        full = int(self.busy_timeout * 1000)
        if self._busy_ms < self._busy_floor_ms and not self._closed:
            self._busy_ms = full // 100 * 100
            self._conn.execute(schema.set_pragma("busy_timeout", self._busy_ms))

    # --- internals ---------------------------------------------------------------------

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
                if not is_busy(exc):
                    raise self._translate(op, exc, waited) from exc
                if waited >= self.busy_timeout:
                    raise StoreBusy(op, self.path, waited) from exc
                time.sleep(min(delay, max(0.0, self.busy_timeout - waited)))
                delay = min(delay * 2, 0.05)

    def _translate(self, op: str, exc: sqlite3.Error, waited: float) -> FencedSqliteError:
        return translate(op, self.path, exc, waited)

    def _apply_pragmas(self) -> None:
        conn = self._conn
        for name, value in schema.PRAGMAS:
            current = conn.execute(schema.get_pragma(name)).fetchone()
            if current is not None and schema.pragma_matches(current[0], value):
                continue
            statement = schema.set_pragma(name, value)

            def set_pragma(s: str = statement) -> Any:
                return conn.execute(s).fetchone()

            self._retry_busy("open", set_pragma)
        conn.execute(schema.set_pragma("busy_timeout", self._busy_ms))
        conn.execute(schema.set_pragma("wal_autocheckpoint", schema.WAL_AUTOCHECKPOINT))

    def _retry_busy(self, op: str, fn: Callable[[], T]) -> T:
        started = time.monotonic()
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                waited = time.monotonic() - started
                if not is_busy(exc):
                    raise self._translate(op, exc, waited) from exc
                if waited >= self.busy_timeout:
                    raise StoreBusy(op, self.path, waited) from exc
                time.sleep(0.005)

    def _validate(self) -> None:
        # Read-only checks before any pragma or write, so a file we refuse is
        # left byte for byte as it was. One read transaction: user_version and
        # the tables are read from one snapshot. Read apart, another process
        # setting the file up could commit in between (version 0, yet tables:
        # "not ours"), seen 1 in 240 opens of a new file by 12 processes.
        conn = self._conn
        try:
            conn.execute("BEGIN")
            try:
                self._validate_snapshot(conn)
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise self._translate("open", exc, 0.0) from exc

    def _validate_snapshot(self, conn: sqlite3.Connection) -> int:
        version = int(conn.execute(schema.GET_USER_VERSION).fetchone()[0])
        if version > schema.SCHEMA_VERSION:
            raise self._refuse(
                f"schema version {version} is newer than this library's "
                f"{schema.SCHEMA_VERSION}; upgrade langgraph-fenced-sqlite"
            )
        if version > 0:
            self._check_ours(conn)
            self._check_shape(conn, version)
        elif conn.execute(schema.COUNT_SCHEMA_OBJECTS).fetchone()[0] or conn.execute(
            schema.GET_APPLICATION_ID
        ).fetchone()[0] not in (0, schema.APPLICATION_ID):
            # Tables, or another application's id on an empty file: not ours.
            raise self._refuse("an SQLite database that is not a langgraph-fenced-sqlite file")
        if self.readonly and version != schema.SCHEMA_VERSION:
            current = schema.SCHEMA_VERSION
            message = (
                f"open {self.path}: schema version {version} needs migrating to {current}, "
                "which a read-only store cannot do; open it once writable (left unchanged)"
            )
            raise SchemaTooOld("open", self.path, version, current, message=message)
        return version

    def _refuse(self, why: str) -> UnsupportedFormat:
        message = f"open {self.path}: {why} (left unchanged)"
        return UnsupportedFormat("open", self.path, message=message)

    def _setup(self) -> None:
        conn = self._conn
        if conn.execute(schema.GET_USER_VERSION).fetchone()[0] == schema.SCHEMA_VERSION:
            return  # the common case: nothing to migrate, no write lock taken
        self._begin_immediate("setup", conn)
        try:
            # Re-read and re-check inside the write lock: another process may
            # have set it up (or something else written it) since _validate.
            # Tables and user_version change in one transaction, so the
            # version read here says exactly which migrations are left.
            version = self._validate_snapshot(conn)
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
        self._after_commit()

    def _check_ours(self, conn: sqlite3.Connection) -> None:
        app_id = conn.execute(schema.GET_APPLICATION_ID).fetchone()[0]
        if app_id != schema.APPLICATION_ID:
            raise self._refuse("not a langgraph-fenced-sqlite file")

    def _check_shape(self, conn: sqlite3.Connection, version: int) -> None:
        # Extra tables, columns and indexes are tolerated; a missing one is not.
        tables = {row[0] for row in conn.execute(schema.LIST_TABLES)}
        for table, columns in _expected_shape(version).items():
            if table not in tables:
                raise self._refuse(
                    f"schema version {version} but table {table!r} is missing; "
                    "the file is damaged or was altered"
                )
            found = {row[0] for row in conn.execute(schema.TABLE_COLUMNS, (table,))}
            missing = sorted(set(columns) - found)
            if missing:
                raise self._refuse(
                    f"schema version {version} but table {table!r} lacks column(s) "
                    f"{', '.join(missing)}; the file is damaged or was altered"
                )
        # Triggers keep `thread_runs` complete: without one, `delete_for_runs`
        # would silently leave a run's rows behind.
        triggers = {row[0] for row in conn.execute(schema.LIST_TRIGGERS)}
        lost = sorted(set(_expected_triggers(version)) - triggers)
        if lost:
            raise self._refuse(
                f"schema version {version} but trigger(s) {', '.join(lost)} are missing; "
                "the file is damaged or was altered"
            )


def _query_job(conn: sqlite3.Connection, sql: str, params: Any) -> list[Any]:
    # As `_read_job`: text cells decode in C, and a cell that is not UTF-8
    # (damage) fails the whole query, so it runs again leniently and the
    # damaged row is reported by its checksum.
    conn.text_factory = str
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.OperationalError as exc:
        if not is_undecodable_text(exc):
            raise
    finally:
        conn.text_factory = lenient_text
    return conn.execute(sql, params).fetchall()


def _snapshot(conn: sqlite3.Connection, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    """Run `fn(conn, *args)` inside `BEGIN ... COMMIT`, rolled back on any exception."""
    conn.execute("BEGIN")
    try:
        result = fn(conn, *args)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


@functools.cache
def _expected_shape(version: int) -> dict[str, tuple[str, ...]]:
    """Return the tables and columns `MIGRATIONS[:version]` build, from an in-memory run."""
    conn = _built(version)
    try:
        tables = [row[0] for row in conn.execute(schema.LIST_TABLES)]
        return {
            t: tuple(row[0] for row in conn.execute(schema.TABLE_COLUMNS, (t,))) for t in tables
        }
    finally:
        conn.close()


@functools.cache
def _expected_triggers(version: int) -> tuple[str, ...]:
    """Return the names of the triggers `MIGRATIONS[:version]` build."""
    conn = _built(version)
    try:
        return tuple(row[0] for row in conn.execute(schema.LIST_TRIGGERS))
    finally:
        conn.close()


def _built(version: int) -> sqlite3.Connection:
    # An in-memory database that `MIGRATIONS[:version]` built.
    conn = sqlite3.connect(":memory:")
    conn.create_function(schema.CHECKSUM_FUNCTION, -1, checksum, deterministic=True)
    for step in schema.MIGRATIONS[:version]:
        for statement in step:
            conn.execute(statement)
    return conn
