"""`FencedSqliteSaver`: LangGraph's checkpointer over one fenced SQLite file.

Invariant: each public method validates its arguments, encodes outside the
store's lock, then runs one engine job; each async twin is one line that runs
the sync method through one thread hop. What both stores share (LangGraph's
methods, claims and runs, the event log, deletion) is written once in
`core/saver.py`, `core/saver_claims.py`, `core/saver_events.py` and `core/saver_retention.py`;
this module holds the opening and closing and the primitives those call
(each one engine job). The SQLite halves (`saver_claims.py`, `saver_events.py`,
`saver_inspect.py`, `saver_threads.py`, `saver_retention.py`) are mixed into the
one class.
"""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from datetime import timedelta
from typing import Any, cast

from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol

from ..clock import Clock, read_now, to_seconds
from ..core import narrow_reads
from ..core.checkpoints import step_role
from ..core.encryption import Encryption, encryption_of
from ..core.fenced_store import FencedStore
from ..core.retention import Expiry, check_expiry
from ..core.run_fence import RunFences
from ..core.saver import store_options
from ..core.serde import TypeKey
from ..core.validation import check_bool, check_name, checked_arguments
from ..core.values import ValueCache
from ..errors import UndecodableRow, bad_argument
from . import checkpoints as cps
from . import schema
from .engine import Engine
from .groupcommit import GroupCommit
from .saver_claims import ClaimsAPI
from .saver_events import EventsAPI
from .saver_inspect import InspectionAPI
from .saver_retention import RetentionAPI
from .saver_threads import ThreadsAPI

__all__ = ["FencedSqliteSaver"]


# `list` is a method of the saver, so annotations in its body name the builtin this way.
_list = builtins.list
_Key = tuple[str, str, str]  # (thread_id, checkpoint_ns, checkpoint_id)


# `prune`/`aprune` (RetentionAPI) return a report where LangGraph's return None.
class FencedSqliteSaver(  # type: ignore[misc]
    ClaimsAPI, EventsAPI, InspectionAPI, ThreadsAPI, RetentionAPI, FencedStore
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
        fence_runs: bool = False,
        encryption: Encryption | None = None,
        poll_interval: float | timedelta = 0.05,
        readonly: bool = False,
        expiry: Expiry | None = None,
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
            fence_runs: Fence runs by their run id, with no runner: a run's
                first write (LangGraph's `config["metadata"]["run_id"]`)
                claims the thread with a new token, which fences off every
                earlier run (docs/semantics.md, "Runs fenced by their id").
            encryption: Seal every stored value with AES-256-GCM under this
                keyring (`Encryption(key)`, `Encryption.from_env()`), and
                refuse values stored in clear or under a key it does not
                hold (docs/semantics.md §7b). Needs the default serializer.
            poll_interval: How often `wait_events`/`watch` look for commits
                where the file has no doorbell (not Linux, no inotify, a
                read-only directory). Where it has one they wake on its
                ring and look anyway every `max(poll_interval, 1 s)`, for
                commits that ring no bell (plain sqlite3, older versions).
            readonly: Open an existing, cleanly closed file for reading only,
                also on a read-only file, directory or mount; every write
                then raises `ReadOnlyStore`. The file is never modified.
            expiry: Thread expiry: a default TTL for threads without their
                own (`set_thread_ttl`), and, with `sweep_every`, a sweeper
                thread that runs `expire()` until `close()` (see `Expiry`).

        Raises:
            StoreError: the file cannot be opened (missing directory...).
            ReadOnlyStore: a writable open of a read-only location (pass
                `readonly=True` to read it).
            UnsupportedFormat: not a database, not ours, or a newer schema;
                `readonly`, an older one (`SchemaTooOld`: it needs migrating).
        """
        path = check_name(str(path) if hasattr(path, "__fspath__") else path, "path")
        busy = to_seconds(busy_timeout, "busy_timeout")
        self._poll_interval = to_seconds(poll_interval, "poll_interval")
        if not isinstance(readonly, bool):
            raise bad_argument("readonly", "expected a bool")
        expiry = check_expiry(expiry, readonly)
        serde = store_options(
            serde, allowed_types, allowed_modules, clock, require_claim, encryption
        )
        super().__init__(serde=serde)
        self.require_claim = require_claim
        self.fence_runs = check_bool(fence_runs, "fence_runs")
        self._run_fences = RunFences()
        self._engine = Engine(path, busy_timeout=busy, clock=clock, readonly=readonly)
        self._value_cache = ValueCache()
        self._start_expiry(expiry)

    _value_table = True

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
        fence_runs: bool = False,
        encryption: Encryption | None = None,
        poll_interval: float | timedelta = 0.05,
        readonly: bool = False,
        expiry: Expiry | None = None,
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
            fence_runs: Fence runs by their run id, with no runner: a run's
                first write (LangGraph's `config["metadata"]["run_id"]`)
                claims the thread with a new token, which fences off every
                earlier run (docs/semantics.md, "Runs fenced by their id").
            encryption: The keyring values are sealed with.
            poll_interval: How often `wait_events`/`watch` look for commits.
            readonly: Open an existing file for reading only.
            expiry: Thread expiry and its sweeper (see `Expiry`).

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
            "fence_runs": fence_runs,
            "encryption": encryption,
            "poll_interval": poll_interval,
            "readonly": readonly,
            "expiry": expiry,
        }
        return _Opener(cls, conn_string, options)

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
        """Seconds between polls of `wait_events` and `watch` where the file has no doorbell."""
        return self._poll_interval

    def commit_stats(self) -> dict[str, int]:
        """Return this store's group-commit counters since it was opened.

        `commits` counts durable COMMITs (one fsync each); `waited` counts
        writes that waited for the put expected to follow them (LangGraph's
        writes, then the step's put), `joined` those whose put came and shared
        their commit, `ran_out` those whose wait ended without it, and
        `skipped` those that did not wait (back-off, a cheap disk, or enough
        writes waiting already). See docs/one-commit-per-step.md.
        """
        return self._engine._group.stats()

    def setup(self) -> None:
        """Set the schema up; done at open, so this only checks the store is open."""
        self._engine.run("setup", lambda conn: None)

    async def asetup(self) -> None:
        """Async twin of `setup`."""
        return await self._engine.arun(self.setup)

    def close(self) -> None:
        """Stop the sweeper, close the connection after the call in progress; twice is fine."""
        self._stop_sweeper()
        self._engine.close()

    async def aclose(self) -> None:
        """Async twin of `close`."""
        if not self._engine.closed:
            await self._engine.arun(self.close)

    # --- the primitives of `FencedSaverBase` ------------------------------------------

    def _fetch_tuple(
        self, op: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> tuple[Any, _list[Any]] | None:
        return self._engine.read(
            op,
            cps.fetch_tuple,
            thread_id,
            checkpoint_ns,
            checkpoint_id,
            True,
            self._keep_values,
            encryption_of(self.serde),
        )

    # `get_tuple` and `list` read only the cells they return or check (a
    # sixth of a read's CPU went to converting cells it never used); a row
    # whose position, token or created_at holds the wrong type is read again
    # in full, so that `decode_tuple` names the cell as it always did. Value
    # rows are read in the same transaction (`cps.read_resolved`).

    def _read_tuple(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> CheckpointTuple | None:
        sql, params = schema.read_tuple(thread_id, checkpoint_ns, checkpoint_id)
        # One statement, no BEGIN/COMMIT, when no value row must be read (a
        # checkpoint this process holds, or one with its values inline);
        # else the statement again with the value rows, in one snapshot.
        rows = cps.resolved_from_cache(
            self._engine.query("get_tuple", sql, params),
            cps.NARROW_CELLS,
            thread_id,
            checkpoint_ns,
            self._value_cache.get,
            encryption_of(self.serde),
        )
        if rows is None:
            rows = self._engine.read(
                "get_tuple",
                cps.read_resolved,
                sql,
                params,
                cps.NARROW_CELLS,
                thread_id,
                checkpoint_ns,
                self._keep_values,
                self._value_cache.get,
                encryption_of(self.serde),
            )
        found = narrow_reads.split_read(rows)
        if found is None:
            return None
        row, writes = found
        if row[7] != 0:
            return super()._read_tuple(thread_id, checkpoint_ns, row[0])
        return narrow_reads.decode_read(self.serde, thread_id, checkpoint_ns, row, writes)

    def _read_page(
        self, query: dict[str, Any], after_key: tuple[str, str, str] | None, size: int
    ) -> _list[CheckpointTuple]:
        sql, params = schema.read_page(**query, after_key=after_key, limit=size)
        # Rows carry their thread and namespace unless the query named both (`read_page`).
        at = 0 if query["thread_id"] is not None and query["checkpoint_ns"] is not None else 2
        cells = cps.NARROW_CELLS if at == 0 else cps.PAGE_CELLS
        rows = self._engine.read(
            "list",
            cps.read_resolved,
            sql,
            params,
            cells,
            query["thread_id"],
            query["checkpoint_ns"],
            None,
            None,
            encryption_of(self.serde),
        )
        return narrow_reads.decode_page(
            self.serde, query["thread_id"], query["checkpoint_ns"], rows, at, self._reread
        )

    def _learn_values(self, thread_id: str, ns: str, checkpoint_id: str) -> None:
        # The parent's value rows, resolved into the cache; nothing decoded.
        sql, params = schema.read_tuple(thread_id, ns, checkpoint_id)
        self._engine.read(
            "put",
            cps.read_resolved,
            sql,
            params,
            cps.NARROW_CELLS,
            thread_id,
            ns,
            self._keep_values,
            None,
            encryption_of(self.serde),
        )

    def _keep_values(
        self, thread_id: str, ns: str, cid: str, refs: bytes, held: dict[str, Any]
    ) -> None:
        # What a read rebuilt, for the next put's encoding (`values.ValueCache`).
        if getattr(self.serde, "unknown", "refuse") == "refuse":
            self._value_cache.put(thread_id, ns, cid, refs, held)

    def _reread(self, thread_id: str, ns: str, checkpoint_id: str) -> CheckpointTuple:
        # A page's row whose cells hold the wrong SQL types, read in full so
        # that `decode_tuple` names the cell.
        again = super()._read_tuple(thread_id, ns, checkpoint_id)
        if again is None:
            raise UndecodableRow(thread_id, checkpoint_id, "the row changed while it was read")
        return again

    # A put's and a put_writes' statements run on the engine's kept cursor
    # (`_cursor`, used only under the store's lock, inside the transaction
    # the engine opened), not `conn.execute`, which makes a cursor per
    # statement: 1.7k instructions each, three a write. The txn functions
    # only call `execute` and read its result, which a cursor does alike.

    def _follow_policy(self) -> GroupCommit:
        return self._engine._group

    def _put(self, enc: cps.EncodedCheckpoint, token: int | None) -> cps.EncodedCheckpoint:
        engine = self._engine
        now = read_now(engine.clock)  # `self.clock`, without the property's call
        cursor = cast(sqlite3.Connection, engine._cursor)
        stored = [enc]

        def put(conn: sqlite3.Connection) -> None:
            # The step's writes that joined this commit ran before it: the put
            # names those of them that came while it encoded (`lend_late`).
            key = (enc.thread_id, enc.checkpoint_ns)
            final = self._lend_late(
                enc,
                lambda w: (
                    cursor.execute(
                        schema.HOLDS_WRITE, (*key, w.checkpoint_id, w.task_id, w.idx, w.checksum)
                    ).fetchone()
                    is not None
                ),
            )
            cps.put_txn(cursor, final, token, now=now, require_claim=self.require_claim)
            stored[0] = final

        engine.write(
            "put",
            put,
            closes=None
            if enc.parent_id is None
            else (enc.thread_id, enc.checkpoint_ns, enc.parent_id),
        )
        return stored[0]

    def _put_writes(
        self, key: _Key, encoded: _list[cps.EncodedWrite], token: int | None, run_id: str | None
    ) -> None:
        engine = self._engine
        now = read_now(engine.clock)  # `self.clock`, without the property's call
        cursor = cast(sqlite3.Connection, engine._cursor)
        # LangGraph's loop sends a step's writes, then the step's put (whose
        # parent is this checkpoint): wait for it, one commit; an error or
        # interrupt takes the put's place (`cps.step_role`).
        awaits, closes = step_role(key, encoded)
        engine.write(
            "put_writes",
            lambda conn: cps.put_writes_txn(
                cursor,
                *key,
                encoded,
                token,
                run_id=run_id,
                now=now,
                require_claim=self.require_claim,
            ),
            awaits=awaits,
            closes=closes,
        )


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
