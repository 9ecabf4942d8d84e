"""How the PostgreSQL store sends a call's statements: one round trip, one transaction.

Invariant: a batch (`connection.Send`) names its statements through
`execute(query, params)`, then reads their results with the function it
returned, only once they committed. `send_batch` sends them on a psycopg
connection; `asend_batch`, its async twin, on one of the store's own async
connections (`native.NativeConns`). A statement that calls `lgfs_refuse`
rolls the whole batch back and the sender answers None: the caller's `job`
then decides. A connection left in doubt is recovered (`recover`) or, for
an async one, closed: it is never handed to the next call so.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import psycopg
from psycopg.rows import tuple_row

from ..errors import FencedSqliteError
from . import sql

if TYPE_CHECKING:
    from .connection import Send

__all__ = ["asend_batch", "run_pipelined", "recover", "send_batch"]

T = TypeVar("T")

_IDLE = psycopg.pq.TransactionStatus.IDLE


# Each connection's cursor for a batch's first statement (`_cursor`).
_CURSORS: weakref.WeakKeyDictionary[psycopg.Connection[Any], psycopg.Cursor[Any]] = (
    weakref.WeakKeyDictionary()
)


def _cursor(conn: psycopg.Connection[Any]) -> psycopg.Cursor[Any]:
    """Return `conn`'s cursor for a batch's first statement, made once, not per call.

    Making a psycopg cursor costs about 5 us, paid by every call. One cursor
    serves every batch on the connection: a batch's reader reads it before
    the connection is let go (`connection.PgConnection.run`), and a connection serves
    one call at a time, so no two batches hold it at once.
    """
    cur = _CURSORS.get(conn)
    if cur is None or cur.closed:
        cur = _CURSORS[conn] = conn.cursor(row_factory=tuple_row)
    return cur


def send_batch(
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
            recover(conn)
        if refusable and refused:
            return None
        raise
    finally:
        if toggled:
            conn.autocommit = False
    return finish


class _Rows:
    """What an async batch's `execute` returns: its statement's rows, once they arrived."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows: list[Any] = []

    def fetchone(self) -> Any:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[Any]:
        return self.rows


async def asend_batch(
    conn: psycopg.AsyncConnection[Any], batch: Send[T], *, read_only: bool, refusable: bool
) -> Callable[[], T] | None:
    """Async twin of `send_batch`, on a store's own connection (autocommit, in no transaction).

    The same statements in the same round trips; each `execute` returns a
    holder that the rows fill once they arrived, so the batch's reader runs
    as it does on a sync cursor. A connection this leaves in doubt (a
    failed pipeline, a call interrupted mid-flight) is closed, never reused.
    """
    queued: list[tuple[str, dict[str, Any], _Rows]] = []

    def execute(query: str, params: dict[str, Any]) -> psycopg.Cursor[Any]:
        rows = _Rows()
        queued.append((query, params, rows))
        return cast("psycopg.Cursor[Any]", rows)

    finish = batch(execute)
    try:
        if len(queued) == 1:  # one statement is one snapshot, and its own transaction
            query, params, rows = queued[0]
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute(query, params)
            rows.rows = await cur.fetchall() if cur.description is not None else []
            return finish
        cursors = []
        async with conn.pipeline():
            control = conn.cursor(row_factory=tuple_row)
            if read_only:
                await control.execute(sql.READ_SNAPSHOT)
            # As `send_batch`: up to the pipeline's one Sync, one implicit transaction.
            for query, params, _ in queued:
                cur = conn.cursor(row_factory=tuple_row)
                await cur.execute(query, params)
                cursors.append(cur)
            if read_only:
                await control.execute("COMMIT")
        for cur, (_, _, rows) in zip(cursors, queued, strict=True):
            rows.rows = await cur.fetchall() if cur.description is not None else []
    except BaseException as exc:
        refused = isinstance(exc, psycopg.Error) and exc.sqlstate == sql.REFUSED
        if not refused or len(queued) > 1 or conn.info.transaction_status != _IDLE:
            conn.pgconn.finish()  # in doubt (see `recover`): its owner drops it
        if refusable and refused:
            return None
        raise
    return finish


def run_pipelined(conn: psycopg.Connection[Any], job: Callable[[psycopg.Cursor[Any]], T]) -> T:
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
            recover(conn)
        raise
    except BaseException:
        recover(conn)
        raise
    finally:
        if toggled:
            conn.autocommit = False


def recover(conn: psycopg.Connection[Any]) -> None:
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
