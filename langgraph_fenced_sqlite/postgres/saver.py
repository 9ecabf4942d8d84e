"""`FencedPostgresSaver`: the fenced checkpointer contract on PostgreSQL.

Invariant: each sync method validates its arguments with the SQLite saver's
validators, encodes outside any transaction with the shared encoders, then
runs one transaction from `txns.py`; each async twin is one line that runs
the sync method through one thread hop. Rows are decoded (checksums checked)
by the shared `checkpoints.decode_tuple`, so both stores store, refuse and
rebuild the same values. `list`/`alist` fetch a page per transaction and
yield outside it.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from datetime import timedelta
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from .. import checkpoints as cps
from ..claims import token_from_config
from ..clock import Clock, read_now, to_seconds
from ..errors import UnsupportedFormat, bad_argument
from ..saver import FencedSqliteSaver, list_query
from ..serde import DataOnlySerializer, TypeKey, schema_classes, schema_types
from ..validation import (
    check_checkpoint,
    check_name,
    check_writes,
    config_target,
)
from . import removals, sql, txns
from .api_claims import PgClaimsAPI
from .api_events import PgEventsAPI
from .api_retention import PgRetentionAPI
from .api_runs import PgRunsAPI
from .api_threads import PgReadAPI
from .connection import PgConnection
from .watch import PgWatchAPI

__all__ = ["DatabaseClock", "FencedPostgresSaver"]

_PAGE = 100
_OPTIONS = (
    "serde",
    "allowed_types",
    "allowed_modules",
    "clock",
    "require_claim",
    "notify",
    "poll_interval",
)
_list = builtins.list


class DatabaseClock:
    """The database server's clock, read with one query (the default clock of the store)."""

    def __init__(self, conn: PgConnection) -> None:
        """Read the time through `conn`."""
        self._conn = conn

    def now(self) -> float:
        """Return the server's wall-clock seconds since the epoch."""
        return float(
            self._conn.run("now", lambda cur: txns._one(cur, sql.GET_NOW, {"now": None}))[0]
        )

    def monotonic(self) -> float:
        """Return this host's monotonic time (waits are measured locally)."""
        import time

        return time.monotonic()


class FencedPostgresSaver(  # type: ignore[misc]
    PgClaimsAPI,
    PgRunsAPI,
    PgEventsAPI,
    PgWatchAPI,
    PgRetentionAPI,
    PgReadAPI,
    BaseCheckpointSaver[str],
):
    """A LangGraph checkpointer on PostgreSQL with per-thread claims and fencing tokens.

    The same contract as `FencedSqliteSaver` (docs/semantics.md) for workers
    on any number of hosts sharing one database: a claim's expiry is judged by
    the database's clock, so hosts' clocks need not agree. Safe from any
    number of threads and asyncio tasks; with a pool, calls run concurrently.
    """

    def __init__(
        self,
        conn: Any,
        *,
        serde: SerializerProtocol | None = None,
        allowed_types: Iterable[TypeKey | type] = (),
        allowed_modules: Iterable[str] | str = (),
        clock: Clock | None = None,
        require_claim: bool = False,
        notify: bool = True,
        poll_interval: float | timedelta = 1.0,
        _owned: bool = False,
    ) -> None:
        """Use `conn`, a `psycopg.Connection` or a `psycopg_pool.ConnectionPool`.

        Call `setup()` once (any number of hosts may; they take turns) before
        the first write. A given connection is used one call at a time; give
        a pool for concurrent calls.

        Args:
            conn: The connection or pool (the saver does not close it).
            serde: A serializer to use instead of the data-only default.
            allowed_types: Extra classes or `(module, name)` pairs the default
                serializer may store and rebuild.
            allowed_modules: Packages whose classes may be rebuilt.
            clock: A clock to use instead of the database server's (tests).
            require_claim: Refuse every write that carries no token.
            notify: Each commit that appends events sends one NOTIFY, which
                wakes `wait_events` on every host at once. NOTIFY serialises
                committing transactions database-wide; with many writers,
                pass False and waiters find commits by their safety poll.
            poll_interval: How often `wait_events` re-reads the table even
                without a notification (the safety poll), in seconds.

        Raises:
            InvalidArgument: `conn` is not a connection or pool, or another
                argument is wrong (the message names it).
        """
        if not isinstance(require_claim, bool):
            raise bad_argument("require_claim", "expected a bool")
        if clock is not None and not isinstance(clock, Clock):
            raise bad_argument("clock", "expected a Clock (with now() and monotonic())")
        if serde is None:
            serde = DataOnlySerializer(allowed_types, allowed_modules=allowed_modules)
        elif allowed_types or allowed_modules:
            which = "allowed_types" if allowed_types else "allowed_modules"
            raise bad_argument(which, "give it only with the default serializer")
        super().__init__(serde=serde)
        if not isinstance(notify, bool):
            raise bad_argument("notify", "expected a bool")
        self._poll_interval = to_seconds(poll_interval, "poll_interval")
        self.require_claim = require_claim
        self._notify = notify
        self._engine = PgConnection(conn, owned=_owned)
        self._clock = clock

    @classmethod
    def from_conn_string(cls, conn_string: str, **kwargs: Any) -> _Opener:
        """Connect to `conn_string` (a libpq DSN or URL) as a context manager, sync or async.

        The connection is opened with `autocommit=True` and closed on exit;
        the keyword arguments are `__init__`'s.

        Raises:
            InvalidArgument: `conn_string` is not a string.
        """
        check_name(conn_string, "conn_string")
        for name in kwargs:
            if name not in _OPTIONS:
                raise bad_argument(
                    name, f"not an option of {cls.__name__}; expected one of {_OPTIONS}"
                )
        return _Opener(cls, conn_string, kwargs)

    @property
    def clock(self) -> Clock:
        """The store's clock: the database server's unless one was given."""
        return self._clock if self._clock is not None else DatabaseClock(self._engine)

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._engine.closed

    @property
    def path(self) -> str:
        """The server and database this saver writes (`postgresql://host:port/db`)."""
        return self._engine.where

    def _now(self) -> float | None:
        """The injected clock's time, or None: the database's clock, read in the statement."""
        return None if self._clock is None else read_now(self._clock)

    def setup(self) -> None:
        """Create or upgrade the schema; safe to call from many hosts at once.

        Raises:
            UnsupportedFormat: the database holds a newer schema than this version knows.
        """

        def job(cur: Any) -> None:
            cur.execute(sql.MIGRATION_LOCK)
            cur.execute(sql.MIGRATIONS[0])
            version = txns._one(cur, sql.GET_VERSION, {})[0]
            if version > sql.SCHEMA_VERSION:
                raise UnsupportedFormat(
                    "setup",
                    self.path,
                    message=(
                        f"setup on {self.path}: schema version {version} is newer than "
                        f"this version of the library knows ({sql.SCHEMA_VERSION})"
                    ),
                )
            for v in range(max(version, 1), sql.SCHEMA_VERSION):
                cur.execute(sql.MIGRATIONS[v])
                cur.execute(sql.SET_VERSION, (v + 1,))

        self._engine.run("setup", job)

    def stats(self) -> dict[str, Any]:
        """Report the schema version, the last token issued and the row counts.

        The keys `FencedSqliteSaver.stats` shares with this store:
        `schema_version`, `token_counter` (0 before the first claim),
        `threads`, `checkpoints`, `writes`, `events`.
        """
        row = self._engine.run("stats", lambda cur: txns._one(cur, sql.STATS, {}))
        keys = ("schema_version", "token_counter", "threads", "checkpoints", "writes", "events")
        return {k: int(v) for k, v in zip(keys, row, strict=True)}

    async def asetup(self) -> None:
        """Async twin of `setup`."""
        return await self._engine.arun(self.setup)

    def close(self) -> None:
        """Stop using the connection; close it if `from_conn_string` opened it. Twice is fine."""
        self._engine.close()

    async def aclose(self) -> None:
        """Async twin of `close`."""
        return await self._engine.arun(self.close)

    def __enter__(self) -> FencedPostgresSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- BaseCheckpointSaver ----------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Fetch a checkpoint (the latest, by commit order, if no id is given)."""
        thread_id, ns, cid = config_target(config)
        found = self._engine.run("get_tuple", lambda cur: txns.fetch_tuple(cur, thread_id, ns, cid))
        return None if found is None else cps.decode_tuple(self.serde, *found)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async twin of `get_tuple`."""
        return await self._engine.arun(self.get_tuple, config)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """List checkpoints newest id first; no transaction is held between items."""
        query = list_query(config, filter, before, limit)
        cursor: tuple[str, str, str] | None = None
        remaining = query["limit"]
        while remaining is None or remaining > 0:
            page, cursor = self._list_page(query, cursor, remaining)
            yield from page
            if cursor is None:
                return
            if remaining is not None:
                remaining -= len(page)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async twin of `list`."""
        query = list_query(config, filter, before, limit)
        cursor: tuple[str, str, str] | None = None
        remaining = query["limit"]
        while remaining is None or remaining > 0:
            page, cursor = await self._engine.arun(self._list_page, query, cursor, remaining)
            for item in page:
                yield item
            if cursor is None:
                return
            if remaining is not None:
                remaining -= len(page)

    def _list_page(
        self, query: dict[str, Any], cursor: tuple[str, str, str] | None, remaining: int | None
    ) -> tuple[_list[CheckpointTuple], tuple[str, str, str] | None]:
        size = _PAGE if remaining is None else min(_PAGE, remaining)
        args = {k: v for k, v in query.items() if k != "limit"}
        statement, params = sql.list_checkpoints(**args, after_key=cursor, limit=size)

        def job(cur: Any) -> tuple[_list[Any], dict[Any, Any]]:
            cur.execute(statement, params)
            rows = [tuple(r) for r in cur.fetchall()]
            return rows, txns.fetch_writes_for(cur, rows)

        rows, writes = self._engine.run("list", job)
        page = [cps.decode_tuple(self.serde, r, writes[(r[0], r[1], r[2])]) for r in rows]
        next_cursor = (rows[-1][2], rows[-1][0], rows[-1][1]) if len(rows) == size else None
        return page, next_cursor

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint, fenced by the config's token if it has one.

        Raises:
            StaleClaim: the config's token is not the thread's claim.
            ThreadBusy: no token, and the thread has a live claim (or the
                store requires claims).
            CheckpointConflict: see docs/semantics.md §3 (version and identity).
        """
        thread_id, ns, _ = config_target(config)
        token = token_from_config(config)
        check_checkpoint(checkpoint, metadata)
        enc = cps.encode_checkpoint(self.serde, config, checkpoint, metadata, thread_id, ns)
        now = self._now()
        self._engine.run(
            "put",
            lambda cur: txns.put(
                cur, enc, token, now=now, require_claim=self.require_claim, notify=self._notify
            ),
            pipeline=token is not None,
        )
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Async twin of `put`."""
        return await self._engine.arun(self.put, config, checkpoint, metadata, new_versions)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes for the config's checkpoint (fenced like `put`)."""
        thread_id, ns, cid = config_target(config, need_id=True)
        assert cid is not None
        check_name(task_id, "task_id")
        check_name(task_path, "task_path", allow_empty=True)
        token = token_from_config(config)
        encoded = cps.encode_writes(self.serde, check_writes(writes), task_id, task_path)
        if not encoded:
            return
        run_id = cps.run_id_of(config)
        now = self._now()
        self._engine.run(
            "put_writes",
            lambda cur: txns.put_writes(
                cur,
                thread_id,
                ns,
                cid,
                encoded,
                token,
                run_id=run_id,
                now=now,
                require_claim=self.require_claim,
                notify=self._notify,
            ),
            pipeline=token is not None,
        )

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Async twin of `put_writes`."""
        return await self._engine.arun(self.put_writes, config, writes, task_id, task_path)

    def delete_thread(self, thread_id: str) -> None:
        """Remove a thread's checkpoints and writes, and end its claim.

        The store checks no claim; the claim's holder is fenced off (its next
        fenced write raises `StaleClaim`). An unknown thread: nothing happens.
        """
        check_name(thread_id, "thread_id")
        self._engine.run("delete_thread", lambda cur: removals.delete_thread(cur, thread_id))

    async def adelete_thread(self, thread_id: str) -> None:
        """Async twin of `delete_thread`."""
        return await self._engine.arun(self.delete_thread, thread_id)

    get_next_version = FencedSqliteSaver.get_next_version

    def for_graph(self, graph: Any) -> FencedPostgresSaver:
        """Return this saver allowing the types `graph`'s schemas declare.

        As `FencedSqliteSaver.for_graph`: the result shares this saver's
        connection; `FencedRunner` uses it so a worker that only resumes
        rebuilds the graph's state types.

        Raises:
            InvalidArgument: `graph` is neither a `StateGraph` nor a compiled graph.
        """
        extra: _list[Any] = [*schema_types(graph), *schema_classes(graph).values()]
        return self.with_allowlist(extra)  # type: ignore[return-value]


class _Opener(
    AbstractContextManager["FencedPostgresSaver"],
    AbstractAsyncContextManager["FencedPostgresSaver"],
):
    """What `from_conn_string` returns: usable with `with` and `async with`."""

    def __init__(self, cls: type[FencedPostgresSaver], dsn: str, kwargs: dict[str, Any]) -> None:
        self._cls, self._dsn, self._kwargs = cls, dsn, kwargs
        self._saver: FencedPostgresSaver | None = None

    def __enter__(self) -> FencedPostgresSaver:
        import psycopg

        from ..errors import StoreError

        try:
            conn = psycopg.connect(self._dsn, autocommit=True)
        except psycopg.Error as exc:
            raise StoreError("connect", "postgresql", message=f"connect failed: {exc}") from exc
        try:
            self._saver = self._cls(conn, _owned=True, **self._kwargs)
        except BaseException:
            conn.close()
            raise
        return self._saver

    def __exit__(self, *exc: object) -> None:
        if self._saver is not None:
            self._saver.close()

    async def __aenter__(self) -> FencedPostgresSaver:
        import asyncio

        return await asyncio.to_thread(self.__enter__)

    async def __aexit__(self, *exc: object) -> None:
        if self._saver is not None:
            await self._saver.aclose()
