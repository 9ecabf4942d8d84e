"""`FencedSqliteSaver`: LangGraph's checkpointer over one fenced SQLite file.

Invariant: each sync method validates its arguments, encodes outside the
store's lock, then runs one engine job; each async twin is one line that runs
the sync method through one thread hop. `list`/`alist` fetch a page per job
and yield outside it, so a caller may use the saver inside the loop.

This module holds the LangGraph methods; claims, the event log,
history/inspection, thread summaries/statuses and deletion/retention/retraction
live in `api_claims.py`, `api_events.py`, `api_inspect.py`, `api_threads.py`
and `api_retention.py`, mixed into the one class.
"""

from __future__ import annotations

import builtins
import random
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

from . import checkpoints as cps
from . import schema
from .api_claims import ClaimsAPI
from .api_events import EventsAPI
from .api_inspect import InspectionAPI
from .api_retention import RetentionAPI
from .api_threads import ThreadsAPI
from .claims import token_from_config
from .clock import Clock, read_now, to_seconds
from .engine import Engine
from .errors import bad_argument
from .serde import DataOnlySerializer, TypeKey, schema_classes, schema_types
from .validation import (
    check_before,
    check_checkpoint,
    check_config,
    check_filter,
    check_limit,
    check_name,
    check_writes,
    checked_arguments,
    config_target,
)

__all__ = ["FencedSqliteSaver"]

_PAGE = 100

# `list` is a method of the saver, so annotations in its body name the builtin this way.
_list = builtins.list


# `prune`/`aprune` (RetentionAPI) return a report where LangGraph's return None.
class FencedSqliteSaver(  # type: ignore[misc]
    ClaimsAPI, EventsAPI, InspectionAPI, ThreadsAPI, RetentionAPI, BaseCheckpointSaver[str]
):
    """A LangGraph checkpointer on one SQLite file with claims and fencing.

    Pass it to `graph.compile(checkpointer=...)`; sync and async graphs alike.
    One saver is one connection; it is safe from any number of threads and
    asyncio tasks, and any number of savers in any number of processes on one
    host may open the same file.
    """

    @checked_arguments
    def __init__(
        self,
        path: str,
        *,
        busy_timeout: float | timedelta = 5.0,
        serde: SerializerProtocol | None = None,
        allowed_types: Iterable[TypeKey | type] = (),
        allowed_modules: Iterable[str] | str = (),
        clock: Clock | None = None,
        require_claim: bool = False,
        poll_interval: float | timedelta = 0.05,
        readonly: bool = False,
    ) -> None:
        """Open (creating if missing) the checkpoint file at `path`.

        Args:
            path: The SQLite file. Keep it on a local disk.
            busy_timeout: How long a call may wait, in all, for the store's
                other calls and the file's write lock, counted from when it
                was made; past it the call fails with `StoreBusy`, having
                changed nothing.
            serde: A serializer to use instead of the data-only default.
            allowed_types: Extra classes or `(module, name)` pairs the default
                serializer may store and rebuild.
            allowed_modules: Packages (module prefixes) whose classes the
                default serializer may store and rebuild, e.g. `["myapp"]`.
            clock: The store's clock (claims, retention, event times).
            require_claim: Refuse every write that carries no token.
            poll_interval: How often `wait_events`/`watch` look for commits
                where the file has no doorbell (not Linux, no inotify, a
                read-only directory). Where it has one they wake on its
                ring and look anyway every `max(poll_interval, 1 s)`, for
                commits that ring no bell (plain sqlite3, older versions).
            readonly: Open an existing, cleanly closed file for reading only,
                also on a read-only file, directory or mount; every write
                then raises `ReadOnlyStore`. The file is never modified.

        Raises:
            StoreError: the file cannot be opened (missing directory...).
            ReadOnlyStore: a writable open of a read-only location (pass
                `readonly=True` to read it).
            UnsupportedFormat: not a database, not ours, or a newer schema.
        """
        path = check_name(str(path) if hasattr(path, "__fspath__") else path, "path")
        busy = to_seconds(busy_timeout, "busy_timeout")
        self._poll_interval = to_seconds(poll_interval, "poll_interval")
        if not isinstance(require_claim, bool):
            raise bad_argument("require_claim", "expected a bool")
        if not isinstance(readonly, bool):
            raise bad_argument("readonly", "expected a bool")
        if clock is not None and not isinstance(clock, Clock):
            raise bad_argument("clock", "expected a Clock (with now() and monotonic())")
        if serde is None:
            serde = DataOnlySerializer(allowed_types, allowed_modules=allowed_modules)
        elif allowed_types or allowed_modules:
            which = "allowed_types" if allowed_types else "allowed_modules"
            raise bad_argument(which, "give it only with the default serializer")
        super().__init__(serde=serde)
        self.require_claim = require_claim
        self._engine = Engine(path, busy_timeout=busy, clock=clock, readonly=readonly)

    def for_graph(self, graph: Any) -> FencedSqliteSaver:
        """Return this saver allowing the types `graph`'s schemas declare.

        LangGraph hands a graph's schema types to its checkpointer only under
        `LANGGRAPH_STRICT_MSGPACK=true`; this does the same derivation in any
        mode: `builder.compile(checkpointer=saver.for_graph(builder))`. The
        schema classes are registered as objects, so they are rebuilt with no
        import (classes defined inside a function too). The result shares
        this saver's connection (closing either closes both) and its
        serializer's registry.

        Args:
            graph: A `StateGraph` builder or its compiled graph.

        Raises:
            InvalidArgument: `graph` is neither.
        """
        extra: list[Any] = [*schema_types(graph), *schema_classes(graph).values()]
        return self.with_allowlist(extra)  # type: ignore[return-value]

    # --- opening and closing -------------------------------------------------------

    @classmethod
    def open(cls, path: str, **kwargs: Any) -> FencedSqliteSaver:
        """Open a saver on `path`; the keyword arguments are `__init__`'s."""
        return cls(path, **kwargs)

    @classmethod
    @checked_arguments
    def from_conn_string(
        cls,
        conn_string: str,
        *,
        busy_timeout: float | timedelta = 5.0,
        serde: SerializerProtocol | None = None,
        allowed_types: Iterable[TypeKey | type] = (),
        allowed_modules: Iterable[str] | str = (),
        clock: Clock | None = None,
        require_claim: bool = False,
        poll_interval: float | timedelta = 0.05,
        readonly: bool = False,
    ) -> _Opener:
        """Open a saver as a context manager, sync (`with`) or async (`async with`).

        The keywords are `__init__`'s, spelled out so that a misspelt one is a
        type error, and an `InvalidArgument` naming it at run time.

        Args:
            conn_string: The file path (LangGraph's name for it).
            busy_timeout: See `__init__`, as for every keyword below.
            serde: A serializer to use instead of the data-only default.
            allowed_types: Extra classes or `(module, name)` pairs to rebuild.
            allowed_modules: Packages whose classes may be rebuilt.
            clock: The store's clock.
            require_claim: Refuse every write that carries no token.
            poll_interval: How often `wait_events`/`watch` look for commits.
            readonly: Open an existing file for reading only.

        Raises:
            InvalidArgument: an argument that `__init__` does not take.
        """
        options = {
            "busy_timeout": busy_timeout,
            "serde": serde,
            "allowed_types": allowed_types,
            "allowed_modules": allowed_modules,
            "clock": clock,
            "require_claim": require_claim,
            "poll_interval": poll_interval,
            "readonly": readonly,
        }
        return _Opener(cls, conn_string, options)

    @property
    def path(self) -> str:
        """The file this saver writes."""
        return self._engine.path

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._engine.closed

    @property
    def readonly(self) -> bool:
        """Whether the saver was opened with `readonly=True` (its writes raise)."""
        return self._engine.readonly

    @property
    def clock(self) -> Clock:
        """The store's clock."""
        return self._engine.clock

    @property
    def poll_interval(self) -> float:
        """Seconds between polls of `wait_events` and `watch` where the file has no doorbell."""
        return self._poll_interval

    def commit_stats(self) -> dict[str, int]:
        """Return this store's group-commit counters since it was opened.

        `commits` counts durable COMMITs (one fsync each); `waited` counts
        writes that waited for the put expected to follow them (LangGraph's
        writes, then the step's put), `joined` those whose put came and shared
        their commit, `ran_out` those whose wait ended without it, and
        `skipped` those that did not wait (back-off, a cheap disk, or enough
        writes waiting already). See "Group commit" in the README.
        """
        return self._engine._group.stats()

    def setup(self) -> None:
        """Set the schema up; done at open, so this only checks the store is open."""
        self._engine.run("setup", lambda conn: None)

    async def asetup(self) -> None:
        """Async twin of `setup`."""
        return await self._engine.arun(self.setup)

    def close(self) -> None:
        """Close the connection after the call in progress; twice is fine."""
        self._engine.close()

    async def aclose(self) -> None:
        """Async twin of `close`."""
        if not self._engine.closed:
            await self._engine.arun(self.close)

    def __enter__(self) -> FencedSqliteSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> FencedSqliteSaver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- BaseCheckpointSaver ------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Fetch a checkpoint (the latest, by commit order, if no id is given).

        Returns:
            The tuple with pending writes in `writes_sort_key` order, or None.
        """
        thread_id, ns, cid = config_target(config)
        rows = self._engine.query("get_tuple", *schema.get_tuple(thread_id, ns, cid))
        return cps.decode_found(self.serde, rows)

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
        """List checkpoints newest id first, as LangGraph's savers do.

        Args:
            config: Narrows to a thread (and namespace, and id) when given.
            filter: Metadata keys and values that must all match.
            before: Only checkpoints whose id is less than this one's.
            limit: At most this many.

        Yields:
            Checkpoint tuples; no lock is held between them.
        """
        query = self._list_query(config, filter, before, limit)
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
        query = self._list_query(config, filter, before, limit)
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

    def _list_query(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> dict[str, Any]:
        return list_query(config, filter, before, limit)

    def _list_page(
        self, query: dict[str, Any], cursor: tuple[str, str, str] | None, remaining: int | None
    ) -> tuple[_list[CheckpointTuple], tuple[str, str, str] | None]:
        size = _PAGE if remaining is None else min(_PAGE, remaining)
        args = {k: v for k, v in query.items() if k != "limit"}
        sql, params = schema.list_page(**args, after_key=cursor, limit=size)
        page, last = cps.decode_page(self.serde, self._engine.query("list", sql, params))
        if last is None or len(page) < size:
            return page, None
        return page, (last[2], last[0], last[1])

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint, fenced by the config's token if it has one.

        Returns:
            The config of the stored checkpoint.

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
        now = read_now(self.clock)
        self._engine.write(
            "put",
            lambda conn: cps.put_txn(conn, enc, token, now=now, require_claim=self.require_claim),
            closes=None if enc.parent_id is None else (thread_id, ns, enc.parent_id),
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
        """Store a task's pending writes for the config's checkpoint.

        The checkpoint need not be stored yet (LangGraph sends writes first).
        Regular writes are first-writer-wins per `(task_id, idx)`; the special
        channels of `WRITES_IDX_MAP` are last-writer-wins within the fence.
        """
        thread_id, ns, cid = config_target(config, need_id=True)
        assert cid is not None
        check_name(task_id, "task_id")
        check_name(task_path, "task_path", allow_empty=True)
        token = token_from_config(config)
        writes = check_writes(writes)
        encoded = cps.encode_writes(self.serde, writes, task_id, task_path)
        if not encoded:
            return
        run_id = cps.run_id_of(config)
        now = read_now(self.clock)
        self._engine.write(
            "put_writes",
            lambda conn: cps.put_writes_txn(
                conn,
                thread_id,
                ns,
                cid,
                encoded,
                token,
                run_id=run_id,
                now=now,
                require_claim=self.require_claim,
            ),
            # LangGraph's loop sends a step's writes, then the step's put
            # (whose parent is this checkpoint): wait for it, one commit.
            awaits=(thread_id, ns, cid),
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

    def get_next_version(self, current: str | None, channel: None = None) -> str:
        """Return the next channel version: a zero-padded counter plus a random suffix."""
        if current is None:
            current_v = 0
        elif isinstance(current, int) and not isinstance(current, bool):
            current_v = current
        else:
            head = current.split(".")[0] if isinstance(current, str) else ""
            if not head.isdigit():
                raise bad_argument("current", f"expected a channel version, got {current!r}")
            current_v = int(head)
        return f"{current_v + 1:032}.{random.random():016}"


def list_query(
    config: RunnableConfig | None,
    filter: dict[str, Any] | None,
    before: RunnableConfig | None,
    limit: int | None,
) -> dict[str, Any]:
    """Check `list`'s arguments; return them as the query builders' keywords (and `limit`).

    Both stores' `list` call this, so they accept and refuse the same arguments.
    """
    thread_id = ns = cid = None
    if config is not None:
        conf = check_config(config)
        if conf.get("thread_id") is not None:
            thread_id, _, cid = config_target(config)
        if conf.get("checkpoint_ns") is not None:
            ns = check_name(
                conf["checkpoint_ns"],
                'config["configurable"]["checkpoint_ns"]',
                allow_empty=True,
            )
    return {
        "thread_id": thread_id,
        "checkpoint_ns": ns,
        "checkpoint_id": cid,
        "metadata_filter": check_filter(filter),
        "before_id": check_before(before),
        "limit": check_limit(limit),
    }


class _Opener(
    AbstractContextManager["FencedSqliteSaver"], AbstractAsyncContextManager["FencedSqliteSaver"]
):
    """What `from_conn_string` returns: usable with `with` and `async with`."""

    def __init__(self, cls: type[FencedSqliteSaver], path: str, kwargs: dict[str, Any]) -> None:
        self._cls, self._path, self._kwargs = cls, path, kwargs
        self._saver: FencedSqliteSaver | None = None

    def __enter__(self) -> FencedSqliteSaver:
        self._saver = self._cls(self._path, **self._kwargs)
        return self._saver

    def __exit__(self, *exc: object) -> None:
        if self._saver is not None:
            self._saver.close()

    async def __aenter__(self) -> FencedSqliteSaver:
        import asyncio

        self._saver = await asyncio.to_thread(self._cls, self._path, **self._kwargs)
        return self._saver

    async def __aexit__(self, *exc: object) -> None:
        if self._saver is not None:
            await self._saver.aclose()
