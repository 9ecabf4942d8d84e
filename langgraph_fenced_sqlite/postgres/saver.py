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
from ..claims import Claim, token_from_config
from ..clock import Clock, read_now, to_seconds
from ..errors import UnsupportedFormat, bad_argument
from ..lease import AsyncLease, Lease
from ..retention import PruneResult
from ..saver import FencedSqliteSaver, list_query
from ..serde import DataOnlySerializer, TypeKey
from ..validation import (
    check_bool,
    check_checkpoint,
    check_int,
    check_iterable,
    check_name,
    check_writes,
    config_target,
)
from . import sql, txns
from .connection import PgConnection

__all__ = ["DatabaseClock", "FencedPostgresSaver"]

_PAGE = 100
_OPTIONS = ("serde", "allowed_types", "allowed_modules", "clock", "require_claim")
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


class FencedPostgresSaver(BaseCheckpointSaver[str]):
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
        self.require_claim = require_claim
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

    # --- claims ---------------------------------------------------------------------

    def claim(self, thread_id: str, holder: str, ttl: float | timedelta) -> Claim:
        """Claim a thread with a new fencing token, if no live claim exists.

        Raises:
            ThreadBusy: a live claim exists (whoever holds it); nothing changes.
        """
        return self._grant("claim", thread_id, holder, ttl, force=False)

    async def aclaim(self, thread_id: str, holder: str, ttl: float | timedelta) -> Claim:
        """Async twin of `claim`."""
        return await self._engine.arun(self.claim, thread_id, holder, ttl)

    def take_over(self, thread_id: str, holder: str, ttl: float | timedelta) -> Claim:
        """Claim a thread even over a live claim, fencing off its holder.

        The previous holder's next fenced write or renewal raises `StaleClaim`;
        its release changes nothing.
        """
        return self._grant("take_over", thread_id, holder, ttl, force=True)

    async def atake_over(self, thread_id: str, holder: str, ttl: float | timedelta) -> Claim:
        """Async twin of `take_over`."""
        return await self._engine.arun(self.take_over, thread_id, holder, ttl)

    def _grant(self, op: str, thread_id: str, holder: str, ttl: Any, *, force: bool) -> Claim:
        check_name(thread_id, "thread_id")
        check_name(holder, "holder")
        seconds = to_seconds(ttl, "ttl")
        return self._engine.run(
            op,
            lambda cur: txns.grant(cur, thread_id, holder, seconds, now=self._now(), force=force),
        )

    def renew(self, thread_id: str, token: int, ttl: float | timedelta) -> Claim:
        """Extend the claim carrying `token` to now + `ttl` (the store's clock).

        Raises:
            StaleClaim: `token` is not the thread's current claim.
        """
        check_name(thread_id, "thread_id")
        check_int(token, "token")
        seconds = to_seconds(ttl, "ttl")
        return self._engine.run(
            "renew", lambda cur: txns.renew(cur, thread_id, token, seconds, now=self._now())
        )

    async def arenew(self, thread_id: str, token: int, ttl: float | timedelta) -> Claim:
        """Async twin of `renew`."""
        return await self._engine.arun(self.renew, thread_id, token, ttl)

    def release(self, thread_id: str, token: int) -> bool:
        """End the claim carrying `token`; another token changes nothing.

        Returns:
            Whether a claim was released.
        """
        check_name(thread_id, "thread_id")
        check_int(token, "token")
        return self._engine.run("release", lambda cur: txns.release(cur, thread_id, token))

    async def arelease(self, thread_id: str, token: int) -> bool:
        """Async twin of `release`."""
        return await self._engine.arun(self.release, thread_id, token)

    def current_claim(self, thread_id: str) -> Claim | None:
        """Return the thread's claim (live or expired), or None."""
        check_name(thread_id, "thread_id")
        return self._engine.run("current_claim", lambda cur: txns.current_claim(cur, thread_id))

    async def acurrent_claim(self, thread_id: str) -> Claim | None:
        """Async twin of `current_claim`."""
        return await self._engine.arun(self.current_claim, thread_id)

    def lease(
        self,
        thread_id: str,
        holder: str,
        ttl: float | timedelta = 30.0,
        renew_every: float | timedelta | None = None,
        *,
        take_over: bool = False,
    ) -> Lease:
        """Return a context manager that claims, renews in the background, and releases."""
        return Lease(self, thread_id, holder, ttl, renew_every, take_over=take_over)  # type: ignore[arg-type]

    def alease(
        self,
        thread_id: str,
        holder: str,
        ttl: float | timedelta = 30.0,
        renew_every: float | timedelta | None = None,
        *,
        take_over: bool = False,
    ) -> AsyncLease:
        """Async twin of `lease` (`async with saver.alease(...) as lease:`)."""
        return AsyncLease(self, thread_id, holder, ttl, renew_every, take_over=take_over)  # type: ignore[arg-type]

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
            "put", lambda cur: txns.put(cur, enc, token, now=now, require_claim=self.require_claim)
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
            ),
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
        self._engine.run("delete_thread", lambda cur: txns.delete_thread(cur, thread_id))

    async def adelete_thread(self, thread_id: str) -> None:
        """Async twin of `delete_thread`."""
        return await self._engine.arun(self.delete_thread, thread_id)

    def delete_for_runs(self, run_ids: Sequence[str], *, token: int | None = None) -> None:
        """Remove every checkpoint and write made by the given runs, in one transaction.

        Fenced like a write on every thread holding a row of those runs; the
        first refusal changes nothing anywhere.

        Raises:
            ThreadBusy: unfenced, and a touched thread has a live claim (or
                the store requires claims).
            StaleClaim: `token` is not the current claim of a touched thread.
        """
        ids = [check_name(r, "run_ids[]") for r in check_iterable(run_ids, "run_ids")]
        if token is not None:
            check_int(token, "token")
        if not ids:
            return
        now = self._now()
        self._engine.run(
            "delete_for_runs",
            lambda cur: txns.delete_for_runs(
                cur, ids, token, now=now, require_claim=self.require_claim
            ),
        )

    async def adelete_for_runs(self, run_ids: Sequence[str], *, token: int | None = None) -> None:
        """Async twin of `delete_for_runs`."""
        return await self._engine.arun(self.delete_for_runs, run_ids, token=token)

    def copy_thread(
        self, source_thread_id: str, target_thread_id: str, *, token: int | None = None
    ) -> None:
        """Copy every checkpoint and write of one thread into another, fenced on the target.

        Copying again adds nothing.

        Raises:
            ThreadBusy: unfenced, and the target has a live claim.
            StaleClaim: `token` is not the target's current claim.
            CheckpointConflict: the target holds a different checkpoint under
                one of the source's ids; nothing is copied.
        """
        src = check_name(source_thread_id, "source_thread_id")
        dst = check_name(target_thread_id, "target_thread_id")
        if token is not None:
            check_int(token, "token")
        now = self._now()
        self._engine.run(
            "copy_thread",
            lambda cur: txns.copy_thread(
                cur, src, dst, token, now=now, require_claim=self.require_claim
            ),
        )

    async def acopy_thread(
        self, source_thread_id: str, target_thread_id: str, *, token: int | None = None
    ) -> None:
        """Async twin of `copy_thread`."""
        return await self._engine.arun(
            self.copy_thread, source_thread_id, target_thread_id, token=token
        )

    def prune(  # type: ignore[override]
        self,
        thread_ids: Sequence[str],
        *,
        strategy: str = "keep_latest",
        dry_run: bool = False,
        token: int | None = None,
    ) -> _list[PruneResult]:
        """Remove old history from each listed thread, fenced like a write, in one transaction.

        Args:
            thread_ids: The threads to prune.
            strategy: `"keep_latest"` (each namespace's latest checkpoint and
                its writes stay) or `"delete"` (everything goes).
            dry_run: Only report what would be removed (the real prune, rolled back).
            token: The caller's claim on the (one) thread, if any.

        Raises:
            ThreadBusy: without `token`, a listed thread has a live claim.
            StaleClaim: `token` is not the current claim of a listed thread.
        """
        ids = [check_name(t, "thread_ids[]") for t in check_iterable(thread_ids, "thread_ids")]
        check_bool(dry_run, "dry_run")
        if token is not None:
            check_int(token, "token")
        if strategy not in ("keep_latest", "delete"):
            raise bad_argument("strategy", f"expected 'keep_latest' or 'delete', got {strategy!r}")
        if not ids:
            return []
        now = self._now()

        def job(cur: Any) -> _list[PruneResult]:
            out = [
                txns.prune(cur, t, strategy, token, now=now, require_claim=self.require_claim)
                for t in ids
            ]
            if dry_run:
                raise _DryRun(out)
            return out

        try:
            return self._engine.run("prune", job)
        except _DryRun as done:
            return done.results

    async def aprune(  # type: ignore[override]
        self,
        thread_ids: Sequence[str],
        *,
        strategy: str = "keep_latest",
        dry_run: bool = False,
        token: int | None = None,
    ) -> _list[PruneResult]:
        """Async twin of `prune`."""
        return await self._engine.arun(
            self.prune, thread_ids, strategy=strategy, dry_run=dry_run, token=token
        )

    get_next_version = FencedSqliteSaver.get_next_version


class _DryRun(Exception):
    """Raised inside a dry run's transaction so that it rolls back, carrying the report."""

    def __init__(self, results: _list[PruneResult]) -> None:
        super().__init__("dry run")
        self.results = results


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
