"""Copy a LangGraph `PostgresSaver` database into a fenced store (SQLite or PostgreSQL).

Invariant: the source is read in one read-only REPEATABLE READ transaction
(never written; one snapshot, whatever its writers do meanwhile), and every
value in it is decoded by the data-only serializer: the checkpoints are
rebuilt by LangGraph's own `PostgresSaver` code (its layout moves with its
versions: a blob per channel version, primitive values inline in the JSONB,
the pending sends of older checkpoints), given that serializer in place of
its own, so no stored value can run code; the writes are read from
`checkpoint_writes` directly, since `PostgresSaver`'s tuples drop their task
path and idx. Everything else (whole threads or none, parents first, reruns
that change nothing) is `importer._Importer`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row, tuple_row

from ..core.serde import DataOnlySerializer
from ..core.validation import check_name
from ..errors import SerializationError, StoreError, UnsupportedFormat
from ..postgres import sql
from ..postgres.connection import describe
from ..postgres.saver import without_password
from .importer import ImportReport, WriteRow, _Importer, import_serde

if TYPE_CHECKING:
    from ..core.fenced_store import FencedStore

__all__ = ["check_postgressaver", "import_postgressaver", "require_postgressaver"]

_NEEDS = (
    "import_postgressaver reads the source with LangGraph's PostgresSaver: "
    "pip install langgraph-checkpoint-postgres"
)


def import_postgressaver(
    source: str,
    dest_saver: FencedStore,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> ImportReport:
    """Copy every thread, checkpoint and pending write of a `PostgresSaver` database.

    The source is the database (and schema, by its `search_path`) LangGraph's
    `PostgresSaver` writes; `dest_saver` a `FencedSqliteSaver` or a set-up
    `FencedPostgresSaver`, which may be in the same database (its tables are
    `lgfs_*`). As `import_sqlitesaver`: each thread's checkpoints are put in
    checkpoint-id order (a parent before its children), each followed by its
    pending writes (with their task paths); afterwards both give the same
    `get_state_history` for every thread, and a thread waiting at an
    `interrupt` resumes from the fenced store. Import with the source's
    writers stopped (a thread written meanwhile is imported as it was when
    the import began); rerunning it is safe.

    Args:
        source: A libpq connection string (URL or key=value) of the source.
        dest_saver: The fenced store to write (unfenced writes: a thread with
            a live claim raises `ThreadBusy`).
        progress: Called as `progress(rows_done, rows_total)` after each
            checkpoint and its writes.

    Returns:
        What was copied, and which threads were skipped whole because a row
        did not decode as data (pickle, a type outside the dest saver's
        allow-list) or would not be stored; each names the thread, the
        checkpoint and the reason.

    Raises:
        InvalidArgument: `source` is not a string.
        ImportError: `langgraph-checkpoint-postgres` is not installed.
        UnsupportedFormat: the source has no `PostgresSaver` tables, or they
            are at another version than the installed package reads (the
            message says to run its `setup()`, or to upgrade it).
        StoreError: the source cannot be reached or read (the message never
            shows the password).
    """
    check_name(source, "source")
    PostgresSaver = require_postgressaver()
    conn, where = _connect(source)
    try:
        reader = PostgresSaver(conn, serde=import_serde(dest_saver))
        return _Importer(_PostgresSaverDatabase(conn, reader, where), dest_saver, progress).run()
    except psycopg.Error as exc:
        raise _unreadable(where, exc) from exc
    finally:
        conn.close()  # rolls the read-only transaction back


def check_postgressaver(source: str) -> None:
    """Check, reading only, that `source` is a LangGraph `PostgresSaver` database.

    Raises:
        InvalidArgument: `source` is not a string.
        ImportError: `langgraph-checkpoint-postgres` is not installed.
        UnsupportedFormat: it has no `PostgresSaver` tables, or at another version.
        StoreError: it cannot be reached or read.
    """
    check_name(source, "source")
    conn, where = _connect(source)
    try:
        _PostgresSaverDatabase(conn, None, where)
    except psycopg.Error as exc:
        raise _unreadable(where, exc) from exc
    finally:
        conn.close()


def _connect(source: str) -> tuple[psycopg.Connection[Any], str]:
    """Open `source` for one read-only REPEATABLE READ transaction; return it and its name."""
    try:
        # dict rows: PostgresSaver reads its rows by column name.
        conn = psycopg.connect(source, row_factory=dict_row)
    except psycopg.Error as exc:
        message = without_password(f"import: connect failed: {exc}", source)
        raise StoreError("import", "postgresql", message=message) from exc
    conn.read_only = True
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    return conn, describe(conn.info)


def _unreadable(where: str, exc: psycopg.Error) -> StoreError:
    return StoreError("import", where, message=f"import {where}: reading the source: {exc}")


def require_postgressaver() -> Any:
    """Return LangGraph's `PostgresSaver` class.

    Raises:
        ImportError: `langgraph-checkpoint-postgres` is not installed (the
            message says what to install).
    """
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
    except ImportError as exc:
        raise ImportError(_NEEDS, name=exc.name) from exc
    return PostgresSaver


def _postgressaver_migrations() -> list[str]:
    require_postgressaver()
    from langgraph.checkpoint.postgres.base import MIGRATIONS

    return list(MIGRATIONS)


class _PostgresSaverDatabase:
    """A `PostgresSaver` database as an `importer.Source` (one read-only transaction)."""

    def __init__(self, conn: psycopg.Connection[Any], reader: Any, where: str) -> None:
        self.conn, self.reader, self.name = conn, reader, where
        if not self._one(sql.POSTGRESSAVER_TABLES)[0]:
            raise UnsupportedFormat(
                "import",
                where,
                message=f"import {where}: not a LangGraph PostgresSaver database "
                "(no checkpoints, checkpoint_blobs, checkpoint_writes and checkpoint_migrations "
                "tables on its search_path)",
            )
        # PostgresSaver's code reads the layout of its own version only (its
        # get_tuple names `task_path`, which its migration 9 added): a
        # source at another version is refused, saying which way to move.
        stored = self._one(sql.POSTGRESSAVER_VERSION)[0]
        known = len(_postgressaver_migrations()) - 1
        if stored != known:
            older = stored is None or stored < known
            fix = (
                "run PostgresSaver.setup() on it first"
                if older
                else "upgrade langgraph-checkpoint-postgres first"
            )
            raise UnsupportedFormat(
                "import",
                where,
                message=f"import {where}: the PostgresSaver schema is at version {stored}, "
                f"{'older' if older else 'newer'} than the installed "
                f"langgraph-checkpoint-postgres reads ({known}): {fix}",
            )

    def _all(self, query: str, params: tuple[Any, ...] = ()) -> list[Any]:
        with self.conn.cursor(row_factory=tuple_row) as cur:
            return cur.execute(query, params).fetchall()

    def _one(self, query: str) -> Any:
        return self._all(query)[0]

    def counts(self) -> tuple[int, int]:
        n_checkpoints, n_writes = self._one(sql.POSTGRESSAVER_COUNTS)
        return int(n_checkpoints), int(n_writes)

    def threads(self) -> list[Any]:
        return [row[0] for row in self._all(sql.POSTGRESSAVER_THREADS)]

    def checkpoint_keys(self, thread: Any) -> list[tuple[str, str, str | None]]:
        return self._all(sql.POSTGRESSAVER_CHECKPOINT_KEYS, (thread,))

    def orphan_write_keys(self, thread: Any) -> list[tuple[str, str]]:
        return self._all(sql.POSTGRESSAVER_ORPHAN_WRITE_KEYS, (thread,))

    def checkpoint(
        self, thread: Any, ns: str, cid: str, serde: DataOnlySerializer
    ) -> tuple[Any, dict[str, Any]]:
        # `serde` is the one `reader` was made with (`import_serde`).
        config = {"configurable": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": cid}}
        try:
            found = self.reader.get_tuple(config)
        except (psycopg.Error, SerializationError):
            raise  # unreadable (StoreError), or not data (the thread is skipped)
        except Exception as exc:  # a malformed row, as PostgresSaver's code met it
            raise ValueError(
                f"PostgresSaver cannot rebuild it: {type(exc).__name__}: {exc}"
            ) from exc
        if found is None:
            raise ValueError("PostgresSaver does not read this checkpoint back")
        metadata = found.metadata
        if not isinstance(metadata, dict):
            raise ValueError("metadata is not a JSON object")
        return found.checkpoint, dict(metadata)

    def write_rows(self, thread: Any, ns: str, cid: str) -> list[WriteRow]:
        return self._all(sql.POSTGRESSAVER_WRITES_OF_CHECKPOINT, (thread, ns, cid))
