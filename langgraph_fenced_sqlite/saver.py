"""`FencedSqliteSaver`: LangGraph's checkpointer over one fenced SQLite file.

Invariant: each sync method validates its arguments, encodes outside the
store's lock, then runs one engine job; each async twin is one line that runs
the sync method through one thread hop. `list`/`alist` fetch a page per job
and yield outside it, so a caller may use the saver inside the loop.
"""

from __future__ import annotations

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
from . import claims, events, retention, schema
from .claims import Claim, token_from_config
from .clock import Clock, to_seconds
from .engine import Engine
from .errors import CheckpointNotFound, SerializationError, UndecodableRow, bad_argument
from .events import Event, EventPoller
from .lease import AsyncLease, Lease
from .retention import PruneResult, RetentionPolicy, Retraction
from .serde import DataOnlySerializer, TypeKey, loads_json
from .validation import check_int, check_limit, check_name, config_target
from .watch import AsyncEventWatch, EventWatch

__all__ = ["FencedSqliteSaver"]

_PAGE = 100


class FencedSqliteSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer on one SQLite file with claims and fencing.

    Pass it to `graph.compile(checkpointer=...)`; sync and async graphs alike.
    One saver is one connection; it is safe from any number of threads and
    asyncio tasks, and any number of savers in any number of processes on one
    host may open the same file.
    """

    def __init__(
        self,
        path: str,
        *,
        busy_timeout: float | timedelta = 5.0,
        serde: SerializerProtocol | None = None,
        allowed_types: Iterable[TypeKey | type] = (),
        clock: Clock | None = None,
        require_claim: bool = False,
        poll_interval: float | timedelta = 0.05,
    ) -> None:
        """Open (creating if missing) the checkpoint file at `path`.

        Args:
            path: The SQLite file. Keep it on a local disk.
            busy_timeout: How long a write waits for the file's write lock
                before `StoreBusy`.
            serde: A serializer to use instead of the data-only default.
            allowed_types: Extra classes or `(module, name)` pairs the default
                serializer may store and rebuild.
            clock: The store's clock (claims, retention, event times).
            require_claim: Refuse every write that carries no token.
            poll_interval: How often `wait_events`/`watch` look for commits.

        Raises:
            StoreError: the file cannot be opened (missing directory...).
            UnsupportedFormat: not a database, not ours, or a newer schema.
        """
        path = check_name(str(path) if hasattr(path, "__fspath__") else path, "path")
        busy = to_seconds(busy_timeout, "busy_timeout")
        self._poll_interval = to_seconds(poll_interval, "poll_interval")
        if not isinstance(require_claim, bool):
            raise bad_argument("require_claim", "expected a bool")
        if serde is None:
            serde = DataOnlySerializer(allowed_types)
        elif allowed_types:
            raise bad_argument("allowed_types", "give it only with the default serializer")
        super().__init__(serde=serde)
        self.require_claim = require_claim
        self._engine = Engine(path, busy_timeout=busy, clock=clock)

    # --- opening and closing -------------------------------------------------------

    @classmethod
    def open(cls, path: str, **kwargs: Any) -> FencedSqliteSaver:
        """Open a saver on `path`; the keyword arguments are `__init__`'s."""
        return cls(path, **kwargs)

    @classmethod
    def from_conn_string(cls, conn_string: str, **kwargs: Any) -> _Opener:
        """Open a saver as a context manager, sync (`with`) or async (`async with`).

        Args:
            conn_string: The file path (LangGraph's name for it).
            **kwargs: `__init__`'s keyword arguments.
        """
        return _Opener(cls, conn_string, kwargs)

    @property
    def path(self) -> str:
        """The file this saver writes."""
        return self._engine.path

    @property
    def clock(self) -> Clock:
        """The store's clock."""
        return self._engine.clock

    @property
    def poll_interval(self) -> float:
        """Seconds between polls of `wait_events` and `watch`."""
        return self._poll_interval

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
        return await self._engine.arun(self.close)

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
        found = self._engine.read(
            "get_tuple", lambda conn: cps.fetch_tuple(conn, thread_id, ns, cid)
        )
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
        thread_id = ns = cid = None
        if config is not None:
            conf = config.get("configurable") or {}
            if conf.get("thread_id") is not None:
                thread_id, _, cid = config_target(config)
            if conf.get("checkpoint_ns") is not None:
                ns = check_name(
                    conf["checkpoint_ns"],
                    'config["configurable"]["checkpoint_ns"]',
                    allow_empty=True,
                )
        if filter is not None and not isinstance(filter, dict):
            raise bad_argument("filter", "expected a dict")
        before_id = None
        if before is not None:
            before_id = (before.get("configurable") or {}).get("checkpoint_id")
        return {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": cid,
            "metadata_filter": filter,
            "before_id": before_id,
            "limit": check_limit(limit),
        }

    def _list_page(
        self, query: dict[str, Any], cursor: tuple[str, str, str] | None, remaining: int | None
    ) -> tuple[list[CheckpointTuple], tuple[str, str, str] | None]:
        size = _PAGE if remaining is None else min(_PAGE, remaining)
        args = {k: v for k, v in query.items() if k != "limit"}
        sql, params = schema.list_checkpoints(**args, after_key=cursor, limit=size)

        def job(conn: Any) -> tuple[list[Any], dict[Any, Any]]:
            rows = [tuple(r) for r in conn.execute(sql, params).fetchall()]
            return rows, cps.fetch_writes_for(conn, rows)

        rows, writes = self._engine.read("list", job)
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

        Returns:
            The config of the stored checkpoint.

        Raises:
            StaleClaim: the config's token is not the thread's claim.
            ThreadBusy: no token, and the thread has a live claim (or the
                store requires claims).
            CheckpointConflict: see CONTRACT §3 (version and identity).
        """
        thread_id, ns, _ = config_target(config)
        token = token_from_config(config)
        if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("id"), str):
            raise bad_argument("checkpoint", 'expected a Checkpoint dict with a str "id"')
        check_name(checkpoint["id"], 'checkpoint["id"]')
        enc = cps.encode_checkpoint(self.serde, config, checkpoint, metadata, thread_id, ns)
        now = self.clock.now()
        self._engine.write(
            "put",
            lambda conn: cps.put_txn(conn, enc, token, now=now, require_claim=self.require_claim),
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
        encoded = cps.encode_writes(self.serde, writes, task_id, task_path)
        if not encoded:
            return
        run_id = cps.run_id_of(config)
        now = self.clock.now()
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
        """Remove a thread's checkpoints, writes, events, floor and claim.

        The id then names a new thread whose events start at 1. The store
        checks no claim (`FencedRunner.delete_thread` does).
        """
        check_name(thread_id, "thread_id")
        self._engine.write("delete_thread", lambda c: retention.delete_thread_txn(c, thread_id))

    async def adelete_thread(self, thread_id: str) -> None:
        """Async twin of `delete_thread`."""
        return await self._engine.arun(self.delete_thread, thread_id)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Remove every checkpoint and write made by the given runs."""
        ids = [check_name(r, "run_ids[]") for r in _as_list(run_ids, "run_ids")]
        if ids:
            self._engine.write("delete_for_runs", lambda c: retention.delete_for_runs_txn(c, ids))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async twin of `delete_for_runs`."""
        return await self._engine.arun(self.delete_for_runs, run_ids)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of one thread into another."""
        src = check_name(source_thread_id, "source_thread_id")
        dst = check_name(target_thread_id, "target_thread_id")
        now = self.clock.now()
        self._engine.write(
            "copy_thread",
            lambda c: retention.copy_thread_txn(
                c, src, dst, now=now, require_claim=self.require_claim
            ),
        )

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async twin of `copy_thread`."""
        return await self._engine.arun(self.copy_thread, source_thread_id, target_thread_id)

    def prune(
        self,
        thread_ids: Sequence[str],
        *,
        strategy: str | RetentionPolicy = "keep_latest",
        dry_run: bool = False,
    ) -> list[PruneResult]:
        """Remove old history from each thread, one transaction per thread.

        Args:
            thread_ids: The threads to prune.
            strategy: `"keep_latest"` (the latest checkpoint of each namespace
                and what it needs), `"delete"` (every checkpoint and event),
                or a `RetentionPolicy`.
            dry_run: Only report what would be removed.

        Returns:
            One `PruneResult` per thread.
        """
        ids = [check_name(t, "thread_ids[]") for t in _as_list(thread_ids, "thread_ids")]
        if isinstance(strategy, RetentionPolicy):
            policy, latest_only = strategy, False
        elif strategy == "keep_latest":
            policy, latest_only = RetentionPolicy(), True
        elif strategy == "delete":
            policy, latest_only = None, False
        else:
            raise bad_argument(
                "strategy",
                f"expected 'keep_latest', 'delete' or a RetentionPolicy, got {strategy!r}",
            )
        return [self._prune_one(t, policy, latest_only, dry_run) for t in ids]

    def _prune_one(
        self, thread_id: str, policy: RetentionPolicy | None, latest_only: bool, dry_run: bool
    ) -> PruneResult:
        if policy is None:
            if dry_run:
                raise bad_argument("dry_run", "not supported with strategy='delete'")
            self._engine.write(
                "prune", lambda c: retention.delete_all_checkpoints_txn(c, thread_id)
            )
            return PruneResult(thread_id)
        now = self.clock.now()
        return self._engine.write(
            "prune",
            lambda c: retention.prune_txn(
                c, thread_id, policy, now=now, keep_latest_only=latest_only, dry_run=dry_run
            ),
        )

    async def aprune(
        self,
        thread_ids: Sequence[str],
        *,
        strategy: str | RetentionPolicy = "keep_latest",
        dry_run: bool = False,
    ) -> list[PruneResult]:
        """Async twin of `prune`."""
        return await self._engine.arun(self.prune, thread_ids, strategy=strategy, dry_run=dry_run)

    def get_next_version(self, current: str | None, channel: None = None) -> str:
        """Return the next channel version: a zero-padded counter plus a random suffix."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    # --- history and retraction ------------------------------------------------------------

    def history(
        self,
        thread_id: str,
        *,
        checkpoint_ns: str = "",
        before: str | None = None,
        limit: int = 20,
    ) -> list[CheckpointTuple]:
        """Return one page of a namespace's checkpoints, newest commit first.

        Args:
            thread_id: The thread.
            checkpoint_ns: The namespace ("" is the root graph).
            before: A checkpoint id of this thread; the page starts below it.
            limit: Page size.

        Raises:
            CheckpointNotFound: `before` is not a checkpoint of this thread.
        """
        check_name(thread_id, "thread_id")
        check_name(checkpoint_ns, "checkpoint_ns", allow_empty=True)
        if before is not None:
            check_name(before, "before")
        size = check_int(limit, "limit", minimum=1)

        def job(conn: Any) -> tuple[list[Any], dict[Any, Any]]:
            start = 1 << 62
            if before is not None:
                row = conn.execute(
                    schema.GET_POSITION, (thread_id, checkpoint_ns, before)
                ).fetchone()
                if row is None:
                    raise CheckpointNotFound(thread_id, before)
                start = row[0]
            rows = [
                tuple(r)
                for r in conn.execute(schema.HISTORY_PAGE, (thread_id, checkpoint_ns, start, size))
            ]
            return rows, cps.fetch_writes_for(conn, rows)

        rows, writes = self._engine.read("history", job)
        return [cps.decode_tuple(self.serde, r, writes[(r[0], r[1], r[2])]) for r in rows]

    async def ahistory(
        self, thread_id: str, *, checkpoint_ns: str = "", before: str | None = None, limit: int = 20
    ) -> list[CheckpointTuple]:
        """Async twin of `history`."""
        return await self._engine.arun(
            self.history, thread_id, checkpoint_ns=checkpoint_ns, before=before, limit=limit
        )

    def retract_turn(self, thread_id: str, token: int, *, run_id: str | None = None) -> Retraction:
        """Remove one turn (a run's checkpoints and writes, all namespaces).

        Without `run_id`, the run that wrote the latest root checkpoint goes;
        where checkpoints carry no run id, everything from the newest root
        `input` checkpoint on. Appends a `retracted` event.

        Raises:
            StaleClaim: `token` is not the thread's claim (nothing changes).
        """
        check_name(thread_id, "thread_id")
        check_int(token, "token")
        if run_id is not None:
            check_name(run_id, "run_id")
        now = self.clock.now()
        return self._engine.write(
            "retract_turn", lambda c: retention.retract_txn(c, thread_id, token, run_id, now=now)
        )

    async def aretract_turn(
        self, thread_id: str, token: int, *, run_id: str | None = None
    ) -> Retraction:
        """Async twin of `retract_turn`."""
        return await self._engine.arun(self.retract_turn, thread_id, token, run_id=run_id)

    # --- claims -------------------------------------------------------------------------------

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
        """Claim a thread even over a live claim, fencing off its holder."""
        return self._grant("take_over", thread_id, holder, ttl, force=True)

    async def atake_over(self, thread_id: str, holder: str, ttl: float | timedelta) -> Claim:
        """Async twin of `take_over`."""
        return await self._engine.arun(self.take_over, thread_id, holder, ttl)

    def _grant(self, op: str, thread_id: str, holder: str, ttl: Any, *, force: bool) -> Claim:
        check_name(thread_id, "thread_id")
        check_name(holder, "holder")
        seconds = to_seconds(ttl, "ttl")
        return self._engine.write(
            op,
            lambda c: claims.grant(
                c, thread_id, holder, seconds, now=self.clock.now(), force=force
            ),
        )

    def renew(self, thread_id: str, token: int, ttl: float | timedelta) -> Claim:
        """Extend the claim carrying `token` to now + `ttl` (store clock).

        Raises:
            StaleClaim: `token` is not the thread's current claim.
        """
        check_name(thread_id, "thread_id")
        check_int(token, "token")
        seconds = to_seconds(ttl, "ttl")
        return self._engine.write(
            "renew", lambda c: claims.renew(c, thread_id, token, seconds, now=self.clock.now())
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
        return self._engine.write("release", lambda c: claims.release(c, thread_id, token))

    async def arelease(self, thread_id: str, token: int) -> bool:
        """Async twin of `release`."""
        return await self._engine.arun(self.release, thread_id, token)

    def current_claim(self, thread_id: str) -> Claim | None:
        """Return the thread's claim (live or expired), or None."""
        check_name(thread_id, "thread_id")
        return self._engine.read("current_claim", lambda c: claims.current_claim(c, thread_id))

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
        return Lease(self, thread_id, holder, ttl, renew_every, take_over=take_over)

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
        return AsyncLease(self, thread_id, holder, ttl, renew_every, take_over=take_over)

    # --- events -----------------------------------------------------------------------------

    def append_events(self, thread_id: str, token: int, events_: Iterable[Any]) -> list[int]:
        """Append caller events under the claim carrying `token`, in one commit.

        Args:
            events_: `(kind, data)` pairs or `{"kind": ..., "data": {...}}` dicts.

        Returns:
            Their seqs, consecutive.
        """
        check_name(thread_id, "thread_id")
        check_int(token, "token")
        new = events.normalize_caller_events(events_)
        now = self.clock.now()

        def job(conn: Any) -> list[int]:
            row = claims.check_fence(conn, thread_id, token, now=now, require_claim=True)
            return events.append(conn, thread_id, row, new, token=token, now=now) if new else []

        return self._engine.write("append_events", job)

    async def aappend_events(self, thread_id: str, token: int, events_: Iterable[Any]) -> list[int]:
        """Async twin of `append_events`."""
        return await self._engine.arun(self.append_events, thread_id, token, events_)

    def events_after(self, thread_id: str, after_seq: int = 0, limit: int = 100) -> list[Event]:
        """Return up to `limit` events with `seq > after_seq`, ascending.

        Raises:
            ReplayUnavailable: `after_seq + 1` is below the floor.
        """
        check_name(thread_id, "thread_id")
        check_int(after_seq, "after_seq")
        check_int(limit, "limit", minimum=1)
        return self._engine.read(
            "events_after", lambda c: events.read_after(c, thread_id, after_seq, limit)
        )

    async def aevents_after(
        self, thread_id: str, after_seq: int = 0, limit: int = 100
    ) -> list[Event]:
        """Async twin of `events_after`."""
        return await self._engine.arun(self.events_after, thread_id, after_seq, limit)

    def wait_events(
        self, thread_id: str, after_seq: int = 0, *, limit: int = 100, timeout: float = 30.0
    ) -> list[Event]:
        """Return events after `after_seq`, waiting up to `timeout` s for a commit.

        Reads on a connection of its own (never blocking this saver's writes),
        polling every `poll_interval` for commits from any process.
        """
        self._check_wait(thread_id, after_seq, limit, timeout)
        poller = self._poller()
        try:
            return poller.wait(thread_id, after_seq, limit=limit, timeout=float(timeout))
        finally:
            poller.close()

    async def await_events(
        self, thread_id: str, after_seq: int = 0, *, limit: int = 100, timeout: float = 30.0
    ) -> list[Event]:
        """Async twin of `wait_events`; cancelling the task ends the wait at once."""
        self._check_wait(thread_id, after_seq, limit, timeout)
        poller = self._poller()
        try:
            return await poller.await_(thread_id, after_seq, limit=limit, timeout=float(timeout))
        finally:
            poller.close()

    def _check_wait(self, thread_id: str, after_seq: int, limit: int, timeout: float) -> None:
        check_name(thread_id, "thread_id")
        check_int(after_seq, "after_seq")
        check_int(limit, "limit", minimum=1)
        to_seconds(timeout, "timeout")
        self._engine.run("wait_events", lambda c: None)  # closed/forked stores fail here

    def _poller(self) -> EventPoller:
        return EventPoller(self.path, self._engine.busy_timeout, self._poll_interval)

    def watch(self, thread_id: str, after_seq: int = 0, *, batch: int = 100) -> EventWatch:
        """Iterate over every event after `after_seq`, once each, in order, forever.

        Close the returned watch (`close()`, or use it as a context manager)
        to end it; a blocked iteration then returns promptly.
        """
        self._check_wait(thread_id, after_seq, batch, 1.0)
        return EventWatch(self._poller(), thread_id, after_seq, batch)

    def awatch(self, thread_id: str, after_seq: int = 0, *, batch: int = 100) -> AsyncEventWatch:
        """Async twin of `watch` (an async iterator; cancel or `aclose()` it)."""
        self._check_wait(thread_id, after_seq, batch, 1.0)
        return AsyncEventWatch(self._poller(), thread_id, after_seq, batch)

    def compact_events(self, thread_id: str, before_seq: int) -> int:
        """Raise the replay floor to `min(before_seq, next seq)`; never lower it.

        Returns:
            The floor afterwards.
        """
        check_name(thread_id, "thread_id")
        check_int(before_seq, "before_seq", minimum=1)
        return self._engine.write(
            "compact_events", lambda c: events.raise_floor(c, thread_id, before_seq)
        )

    async def acompact_events(self, thread_id: str, before_seq: int) -> int:
        """Async twin of `compact_events`."""
        return await self._engine.arun(self.compact_events, thread_id, before_seq)

    # --- inspection --------------------------------------------------------------------------

    def threads(self) -> list[dict[str, Any]]:
        """Summarise every thread: counts, namespaces, latest step, claim, events, floor."""
        return self._engine.read("threads", _thread_summaries)

    def claims(self) -> list[Claim]:
        """Return every current claim, live or expired."""
        rows = self._engine.read("claims", lambda c: c.execute(schema.LIST_CLAIMS).fetchall())
        return [Claim(t, h or "", tok, exp) for t, h, tok, exp, _ in rows]

    def stats(self) -> dict[str, Any]:
        """Report the file's pragmas, schema version, counts and integrity."""

        def job(conn: Any) -> dict[str, Any]:
            threads, checkpoints, writes, evs = conn.execute(schema.TABLE_COUNTS).fetchone()
            return {
                "journal_mode": conn.execute("PRAGMA journal_mode").fetchone()[0],
                "synchronous": conn.execute("PRAGMA synchronous").fetchone()[0],
                "schema_version": conn.execute(schema.GET_USER_VERSION).fetchone()[0],
                "token_counter": conn.execute(schema.GET_TOKEN_COUNTER).fetchone()[0],
                "integrity": [r[0] for r in conn.execute(schema.INTEGRITY_CHECK)],
                "threads": threads,
                "checkpoints": checkpoints,
                "writes": writes,
                "events": evs,
            }

        return self._engine.run("stats", job)

    def history_records(
        self, thread_id: str, *, checkpoint_ns: str = "", before: str | None = None, limit: int = 20
    ) -> list[dict[str, Any]]:
        """Return one page of `history` as plain records, decoding no channel values.

        Each record has `checkpoint_ns`, `checkpoint_id`, `parent_checkpoint_id`,
        `position`, `token` (the fencing token that wrote it, None if unfenced),
        `created_at` (store clock), and from the metadata `step`, `source` and
        `run_id`; metadata that does not decode gives an `error` dict instead.

        Raises:
            CheckpointNotFound: `before` is not a checkpoint of this thread.
        """
        check_name(thread_id, "thread_id")
        check_name(checkpoint_ns, "checkpoint_ns", allow_empty=True)
        if before is not None:
            check_name(before, "before")
        size = check_int(limit, "limit", minimum=1)

        def job(conn: Any) -> list[Any]:
            start = 1 << 62
            if before is not None:
                row = conn.execute(
                    schema.GET_POSITION, (thread_id, checkpoint_ns, before)
                ).fetchone()
                if row is None:
                    raise CheckpointNotFound(thread_id, before)
                start = row[0]
            return conn.execute(
                schema.HISTORY_PAGE, (thread_id, checkpoint_ns, start, size)
            ).fetchall()

        out = []
        for row in self._engine.read("history_records", job):
            _, ns, cid, parent, _, _, _, metadata, position, token, created_at = row
            record: dict[str, Any] = {
                "checkpoint_ns": ns,
                "checkpoint_id": cid,
                "parent_checkpoint_id": parent,
                "position": position,
                "token": token,
                "created_at": created_at,
            }
            try:
                md = loads_json(metadata)
                record.update(step=md.get("step"), source=md.get("source"), run_id=md.get("run_id"))
            except (ValueError, TypeError, AttributeError) as exc:
                record["error"] = UndecodableRow(thread_id, cid, f"metadata: {exc}").to_dict()
            out.append(record)
        return out

    def inspect_checkpoint(
        self, thread_id: str, *, checkpoint_ns: str = "", checkpoint_id: str | None = None
    ) -> dict[str, Any] | None:
        """Read one checkpoint for display, decoding its row and each write on its own.

        Unlike `get_tuple`, a row that does not decode does not fail the call:
        its entry carries an `error` (an `UndecodableRow` as a dict) instead.

        Args:
            thread_id: The thread.
            checkpoint_ns: The namespace ("" is the root graph).
            checkpoint_id: The checkpoint; the latest (commit order) if None.

        Returns:
            None if there is no such checkpoint, else a dict with
            `checkpoint_ns`, `checkpoint_id`, `parent_checkpoint_id`,
            `position`, `token`, `created_at`, `checkpoint` (the decoded
            `Checkpoint`, or None), `metadata`, `error`, and `writes`: dicts
            with `task_id`, `task_path`, `idx`, `channel`, `value` and `error`.
        """
        check_name(thread_id, "thread_id")
        check_name(checkpoint_ns, "checkpoint_ns", allow_empty=True)
        if checkpoint_id is not None:
            check_name(checkpoint_id, "checkpoint_id")
        found = self._engine.read(
            "inspect_checkpoint",
            lambda conn: cps.fetch_tuple(conn, thread_id, checkpoint_ns, checkpoint_id),
        )
        if found is None:
            return None
        row, write_rows = found
        cid = row[2]
        out: dict[str, Any] = {
            "thread_id": thread_id,
            "checkpoint_ns": row[1],
            "checkpoint_id": cid,
            "parent_checkpoint_id": row[3],
            "position": row[8],
            "token": row[9],
            "created_at": row[10],
            "checkpoint": None,
            "metadata": None,
            "error": None,
            "writes": [],
        }
        try:
            decoded = cps.decode_tuple(self.serde, row, [])
            out["checkpoint"], out["metadata"] = decoded.checkpoint, decoded.metadata
        except UndecodableRow as exc:
            out["error"] = exc.to_dict()
            try:
                out["metadata"] = loads_json(row[7])
            except (ValueError, TypeError):
                pass
        for task_id, channel, type_, blob, task_path, idx in write_rows:
            write: dict[str, Any] = {
                "task_id": task_id,
                "task_path": task_path,
                "idx": idx,
                "channel": channel,
                "value": None,
                "error": None,
            }
            try:
                write["value"] = self.serde.loads_typed((type_, blob))
            except (SerializationError, ValueError, TypeError) as exc:
                reason = f"write {task_id}/{idx} ({channel}): {exc}"
                write["error"] = UndecodableRow(thread_id, cid, reason).to_dict()
            out["writes"].append(write)
        return out


def _thread_summaries(conn: Any) -> list[dict[str, Any]]:
    out = []
    for (
        thread_id,
        holder,
        token,
        expires_at,
        floor,
        next_seq,
        count,
        namespaces,
        n_events,
        last_cp,
        step,
        last_ev,
    ) in conn.execute(schema.THREAD_SUMMARIES):
        out.append(
            {
                "thread_id": thread_id,
                "checkpoints": count,
                "namespaces": sorted((namespaces or "").split(",")) if count else [],
                "latest_step": step,
                "last_activity": max(x for x in (last_cp, last_ev, 0.0) if x is not None),
                "claim": None
                if token is None
                else {"holder": holder, "token": token, "expires_at": expires_at},
                "events": n_events,
                "floor": floor,
                "next_seq": next_seq,
            }
        )
    out.sort(key=lambda t: t["last_activity"], reverse=True)
    return out


def _as_list(value: Any, name: str) -> list[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise bad_argument(name, "expected a list of strings")
    return list(value)


class _Opener(AbstractContextManager, AbstractAsyncContextManager):  # type: ignore[type-arg]
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
