"""`FencedPostgresSaver`: the fenced checkpointer contract on PostgreSQL.

Invariant: the public methods are the SQLite store's, written once for both
(`core/saver.py`, `core/saver_claims.py`, `core/saver_events.py`, `core/saver_retention.py`):
they validate and encode outside any transaction, then call this store's
primitives, each one transaction from `txns.py`, `runs.py`, `events.py` or
`removals.py`; each async twin is one line that runs the sync method through
one thread hop. This module holds the opening, `setup`, `close` and the
primitives of `FencedSaverBase`; the other halves are mixed into the class.

A `readonly` store (for a hot-standby replica, or a dashboard that must not
write) is checked once when opened: the schema must be there, at this
version, as a read-only SQLite store's file must be; it never migrates.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from datetime import timedelta
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from ..clock import Clock, read_now, to_seconds
from ..core import checkpoints as cps
from ..core.encryption import Encryption, encryption_of
from ..core.fenced_store import FencedStore
from ..core.retention import Expiry, check_expiry
from ..core.run_fence import RunFences
from ..core.saver import next_cursor, page_args, store_options
from ..core.serde import TypeKey
from ..core.validation import check_bool, check_name, config_target
from ..core.values import Held, StaleParent, ValueCache
from ..errors import FencedSqliteError, SchemaTooOld, UnsupportedFormat, bad_argument
from . import sql, txns
from .connection import PgConnection
from .runs import LatestRoots
from .saver_claims import PgClaimsAPI
from .saver_events import PgEventsAPI
from .saver_retention import PgRetentionAPI
from .saver_threads import PgReadAPI
from .values import MustRead, resolved_from

__all__ = ["DatabaseClock", "FencedPostgresSaver"]

_OPTIONS = (
    "serde",
    "allowed_types",
    "allowed_modules",
    "clock",
    "require_claim",
    "fence_runs",
    "encryption",
    "notify",
    "poll_interval",
    "readonly",
    "expiry",
)
_list = builtins.list
_Key = tuple[str, str, str]  # (thread_id, checkpoint_ns, checkpoint_id)


class DatabaseClock:
    """The database server's clock, read with one query (the default clock of the store)."""

    def __init__(self, conn: PgConnection) -> None:
        """Read the time through `conn`."""
        self._conn = conn

    def now(self) -> float:
        """Return the server's wall-clock seconds since the epoch."""
        return float(
            self._conn.run(
                "now", lambda cur: txns._one(cur, sql.GET_NOW, {"now": None}), read_only=True
            )[0]
        )

    def monotonic(self) -> float:
        """Return this host's monotonic time (waits are measured locally)."""
        import time

        return time.monotonic()


# `prune`/`aprune` (PgRetentionAPI) return a report where LangGraph's return None.
class FencedPostgresSaver(  # type: ignore[misc]
    PgClaimsAPI,
    PgEventsAPI,
    PgRetentionAPI,
    PgReadAPI,
    FencedStore,
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
        fence_runs: bool = False,
        encryption: Encryption | None = None,
        notify: bool = True,
        poll_interval: float | timedelta = 1.0,
        readonly: bool = False,
        expiry: Expiry | None = None,
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
            fence_runs: Fence runs by their run id, with no runner: a run's
                first write (LangGraph's `config["metadata"]["run_id"]`)
                claims the thread with a new token, which fences off every
                earlier run (docs/semantics.md, "Runs fenced by their id").
            encryption: Seal every stored value with AES-256-GCM under this
                keyring (`Encryption(key)`, `Encryption.from_env()`), and
                refuse values stored in clear or under a key it does not
                hold (docs/semantics.md §7b). Needs the default serializer.
            notify: Each commit that appends events sends one NOTIFY, which
                wakes `wait_events` on every host at once. NOTIFY serialises
                committing transactions database-wide; with many writers,
                pass False and waiters find commits by their safety poll.
            poll_interval: How often `wait_events` re-reads the table even
                without a notification (the safety poll), in seconds. A hot
                standby cannot `LISTEN`: there waits find commits by this poll.
            readonly: Only read (a hot-standby replica, say): every write
                raises `ReadOnlyStore` before anything is sent, every
                transaction is READ ONLY in the server, and `setup()` only
                checks the schema. Checks the schema now, as a read-only
                SQLite store checks its file.
            expiry: Thread expiry: a default TTL for threads without their
                own (`set_thread_ttl`), and, with `sweep_every`, a sweeper
                thread that runs `expire()` until `close()` (see `Expiry`).
                Give a pool (or a connection of its own) to a store that
                sweeps: on one connection a pass takes turns with its calls.

        Raises:
            InvalidArgument: `conn` is not a connection or pool, or another
                argument is wrong (the message names it).
            UnsupportedFormat: `readonly`, and the schema is missing (`setup()`
                never ran), older than this version (`SchemaTooOld`: it needs
                migrating) or newer.
            StoreError: `readonly`, and the schema could not be read.
        """
        expiry = check_expiry(expiry, readonly)
        serde = store_options(
            serde, allowed_types, allowed_modules, clock, require_claim, encryption
        )
        super().__init__(serde=serde)
        if not isinstance(notify, bool):
            raise bad_argument("notify", "expected a bool")
        if not isinstance(readonly, bool):
            raise bad_argument("readonly", "expected a bool")
        self._poll_interval = to_seconds(poll_interval, "poll_interval")
        self.require_claim = require_claim
        self.fence_runs = check_bool(fence_runs, "fence_runs")
        self._run_fences = RunFences()
        self._notify = notify
        self._engine = PgConnection(conn, owned=_owned, readonly=readonly)
        self._clock = clock
        # What this saver's fenced writes made each thread's latest root
        # checkpoint: the hint that lets `end_run` take one round trip.
        self._latest_roots = LatestRoots()
        # The values of what this process last put or read of each namespace:
        # a put encodes against them, a read of that checkpoint needs no value row.
        self._value_cache = ValueCache()
        if readonly:
            self._check_schema("open")
        self._start_expiry(expiry)

    # Channel values live in the value table, `lgfs_blobs` (migration 11).
    _value_table = True
    # A rewritten row is a dead version until vacuumed: borrow rows stay as they are.
    _keep_borrows = True

    @classmethod
    def from_conn_string(cls, conn_string: str, **kwargs: Any) -> _Opener:
        """Connect to `conn_string` (a libpq DSN or URL) as a context manager, sync or async.

        The connection is opened with `autocommit=True` and closed on exit;
        the keyword arguments are `__init__`'s. With `readonly=True` its
        session also sets `default_transaction_read_only`.

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
    def path(self) -> str:
        """The server and database this saver writes (`postgresql://host:port/db`)."""
        return self._engine.where

    def _now(self) -> float | None:
        """The injected clock's time, or None: the database's clock, read in the statement."""
        return None if self._clock is None else read_now(self._clock)

    def setup(self) -> None:
        """Create or upgrade the schema; safe to call from many hosts at once.

        On a `readonly` store, only check that the schema is there at this
        version (as the SQLite store's `setup()`, which then has nothing to
        do): nothing is created or migrated.

        Raises:
            UnsupportedFormat: the database holds a newer schema than this
                version knows; or, `readonly`, a missing or older one.
        """
        if self.readonly:
            self._check_schema("setup")
            return

        def job(cur: Any) -> None:
            cur.execute(sql.MIGRATION_LOCK)
            # A migration is several commands, which the server refuses to
            # prepare: never prepared, even on a connection made with
            # `prepare_threshold=0` (as LangGraph's docs make PostgresSaver's).
            cur.execute(sql.MIGRATIONS[0], prepare=False)
            version = txns._one(cur, sql.GET_VERSION, {})[0]
            if version > sql.SCHEMA_VERSION:
                raise self._unusable_schema("setup", version)
            for v in range(max(version, 1), sql.SCHEMA_VERSION):
                cur.execute(sql.MIGRATIONS[v], prepare=False)
                cur.execute(sql.SET_VERSION, (v + 1,))

        self._engine.run("setup", job)

    def _check_schema(self, op: str) -> None:
        """Refuse, for a read-only store, a schema that is not there at this version.

        Raises:
            UnsupportedFormat: missing, older (a migration is a write) or newer.
        """

        def job(cur: Any) -> int | None:
            if not txns._one(cur, sql.HAS_MIGRATIONS_TABLE, {})[0]:
                return None
            return int(txns._one(cur, sql.GET_VERSION, {})[0])

        version = self._engine.run(op, job, read_only=True)
        if version != sql.SCHEMA_VERSION:
            raise self._unusable_schema(op, version)

    def _unusable_schema(self, op: str, version: int | None) -> UnsupportedFormat:
        where, current = self.path, sql.SCHEMA_VERSION
        if version is not None and version > current:
            why = (
                f"schema version {version} is newer than this version of the library "
                f"knows ({current})"
            )
        elif version is None:
            # As a read-only SQLite store refuses a file that was never set up.
            why = (
                "no langgraph-fenced-sqlite tables on this connection's search_path "
                "(setup() has not run here), and a read-only store creates none; "
                "run setup() once from a writable store"
            )
        else:
            message = (
                f"{op} on {where}: schema version {version} needs migrating to {current}, "
                "which a read-only store cannot do; run setup() once from a writable store"
            )
            return SchemaTooOld(op, where, version, current, message=message)
        return UnsupportedFormat(op, where, message=f"{op} on {where}: {why}")

    def commit_stats(self) -> dict[str, int]:
        """Return this store's group-commit counters since it was opened.

        As `FencedSqliteSaver.commit_stats`: `commits` counts the COMMITs of
        this store's writes (claims and runs too; a step's writes and put
        sharing one count once);
        `waited`, `joined`, `ran_out` and `skipped` count the writes that
        waited for the put expected to follow them, and how that ended.
        """
        return self._engine.steps.stats()

    def stats(self) -> dict[str, Any]:
        """Report the schema version, the last token issued and the row counts.

        The keys `FencedSqliteSaver.stats` shares with this store:
        `schema_version`, `token_counter` (0 before the first claim),
        `threads`, `checkpoints`, `writes`, `events`.
        """
        row = self._engine.run("stats", lambda cur: txns._one(cur, sql.STATS, {}), read_only=True)
        keys = ("schema_version", "token_counter", "threads", "checkpoints", "writes", "events")
        return {k: int(v) for k, v in zip(keys, row, strict=True)}

    async def asetup(self) -> None:
        """Async twin of `setup`."""
        return await self._engine.arun(self.setup)

    def close(self) -> None:
        """Stop the sweeper; stop using the connection (closed if `from_conn_string`
        opened it). Twice is fine."""
        self._stop_sweeper()
        self._engine.close()

    async def aclose(self) -> None:
        """Async twin of `close`."""
        return await self._engine.arun(self.close)

    # --- the hot async calls: natively, with no thread hop (`PgConnection.arun_call`) -----

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async twin of `get_tuple`."""
        # On the store's own async connection, no thread hop (`arun_call`).
        thread_id, ns, cid = config_target(config)
        found = await self._afetch_tuple("get_tuple", thread_id, ns, cid)
        if found is None:
            return None
        tup = cps.decode_tuple(self.serde, *found)
        # The objects LangGraph's next put of this thread carries (as `get_tuple`).
        self._value_cache.note(thread_id, ns, tup.checkpoint["id"], tup.checkpoint)
        return tup

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Async twin of `put`."""
        # On the store's own async connection, no thread hop (`arun_call`);
        # `put`'s steps, the parent's values read here first if they are
        # not held (`_encode_values` would read them with a blocking call).
        thread_id, ns, _ = config_target(config)
        parent_id = config["configurable"].get("checkpoint_id")
        whole = False
        if parent_id and self._value_cache.get(thread_id, ns, parent_id) is None:
            try:
                await self._afetch_tuple("put", thread_id, ns, parent_id)
            except FencedSqliteError:
                pass  # unreadable: its values are not named, they are stored whole
            whole = self._value_cache.get(thread_id, ns, parent_id) is None
        putting = self._expect(config, checkpoint)
        try:
            enc, token, stored = self._encode_put(config, checkpoint, metadata, whole=whole)
            enc = self._lend_late(enc)
            self._putting(enc)
            if token is None and self.fence_runs:  # a run's own claim
                token = await self._arun_token(thread_id, cps.run_id_of(config))
            while True:
                try:
                    enc = await self._aput(enc, token)
                    break
                except StaleParent:
                    enc, stored = self._encode_again(config, checkpoint, metadata, enc)
                    self._putting(enc)
        finally:
            if putting is not None:
                self._value_cache.putting(*putting, None)
        if enc.held is not None:
            self._value_cache.put(
                enc.thread_id, enc.checkpoint_ns, enc.checkpoint_id, enc.values_blob, enc.held
            )
        return stored

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Async twin of `put_writes`."""
        # On the store's own async connection, no thread hop (`arun_call`).
        args = self._encode_writes(config, writes, task_id, task_path)
        if args is None:
            return
        key, encoded, token, run_id = args
        if token is None:  # a run's own claim, under `fence_runs`
            token = await self._arun_token(key[0], run_id)
        await self._aput_writes(key, encoded, token, run_id)
        await self._arun_ended(key, token, run_id, writes)

    # --- the primitives of `FencedSaverBase` ------------------------------------------
    # Each async twin sends the same call (`_*_call`) through `arun_call`.

    # A read's value rows come in its one statement, with its checkpoint rows
    # (`sql.TUPLE_BY_ID`, `sql.page_with_writes`), resolved by `value_reads.resolve_rows`;
    # `get_tuple`'s leaves them out for the checkpoint this process holds.

    def _fetch_tuple(
        self, op: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> tuple[Any, _list[Any]] | None:
        # One round trip: the checkpoint, its writes and values in one snapshot.
        known = self._known(thread_id, checkpoint_ns, checkpoint_id)
        try:
            return self._resolve_tuple(
                self._engine.run(
                    op, **self._fetch_call(thread_id, checkpoint_ns, checkpoint_id, known)
                ),
                known,
            )
        except MustRead:
            found = self._engine.run(
                op, **self._fetch_call(thread_id, checkpoint_ns, checkpoint_id, None)
            )
            return self._resolve_tuple(found, None)

    async def _afetch_tuple(
        self, op: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> tuple[Any, _list[Any]] | None:
        """Async twin of `_fetch_tuple`, on the store's own async connection."""
        known = self._known(thread_id, checkpoint_ns, checkpoint_id)
        call = self._fetch_call(thread_id, checkpoint_ns, checkpoint_id, known)
        try:
            return self._resolve_tuple(await self._engine.arun_call(op, None, **call), known)
        except MustRead:
            call = self._fetch_call(thread_id, checkpoint_ns, checkpoint_id, None)
            return self._resolve_tuple(await self._engine.arun_call(op, None, **call), None)

    def _fetch_call(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str | None,
        known: tuple[str, bytes] | None,
    ) -> dict[str, Any]:
        batch = txns.fetch_tuple_batch(thread_id, checkpoint_ns, checkpoint_id, known)
        return {"batch": batch, "read_only": True}

    def _known(
        self, thread_id: str, ns: str, checkpoint_id: str | None
    ) -> tuple[str, bytes] | None:
        """The checkpoint this process holds the values of, of those a read may return."""
        if checkpoint_id is None:
            return self._value_cache.latest(thread_id, ns)
        held = self._value_cache.get(thread_id, ns, checkpoint_id)
        return None if held is None else (checkpoint_id, held[0])

    def _resolve_tuple(
        self, found: Any, known: tuple[str, bytes] | None
    ) -> tuple[Any, _list[Any]] | None:
        """`fetch_tuple_batch`'s result with its values inline (`value_reads.resolve_rows`).

        Raises:
            MustRead: it left the value rows of a checkpoint out that this
                process no longer holds: read again, with them.
            UndecodableRow: a value row is missing or damaged.
        """
        if found is None:
            return None
        row, writes, blobs = found
        rows = resolved_from(
            [row],
            blobs,
            strict=True,
            skipped=lambda r: known is not None and r[2] == known[0] and r[6] == known[1],
            keep=self._keep_values,
            cached=self._value_cache.get,
            enc=encryption_of(self.serde),
        )
        return rows[0], writes

    def _learn_values(self, thread_id: str, ns: str, checkpoint_id: str) -> None:
        # The parent's value rows, resolved into the cache; nothing decoded.
        self._fetch_tuple("put", thread_id, ns, checkpoint_id)

    def _keep_values(
        self, thread_id: str, ns: str, cid: str, refs: bytes, held: dict[str, Held]
    ) -> None:
        # What a read rebuilt, for the next put's encoding (`values.ValueCache`).
        if getattr(self.serde, "unknown", "refuse") == "refuse":
            self._value_cache.put(thread_id, ns, cid, refs, held)

    def _fetch_page(
        self, query: dict[str, Any], after_key: tuple[str, str, str] | None, size: int
    ) -> tuple[_list[Any], dict[Any, _list[Any]]]:
        rows, writes, blobs = self._engine.run("list", **self._page_call(query, after_key, size))
        return resolved_from(rows, blobs, strict=True, enc=encryption_of(self.serde)), writes

    async def _alist_page(
        self, query: dict[str, Any], cursor: tuple[str, str, str] | None, remaining: int | None
    ) -> tuple[_list[CheckpointTuple], tuple[str, str, str] | None]:
        # `_list_page` on the store's own async connection, no thread hop.
        args, size = page_args(query, remaining)
        rows, writes, blobs = await self._engine.arun_call(
            "list", None, **self._page_call(args, cursor, size)
        )
        page = self._decode_page(
            resolved_from(rows, blobs, strict=True, enc=encryption_of(self.serde)), writes
        )
        return page, next_cursor(page, size)

    def _page_call(
        self, query: dict[str, Any], after_key: tuple[str, str, str] | None, size: int
    ) -> dict[str, Any]:
        statement, params = sql.list_checkpoints(**query, after_key=after_key, limit=size)
        return {"batch": txns.list_page_batch(statement, params), "read_only": True}

    def _put(self, enc: cps.EncodedCheckpoint, token: int | None) -> cps.EncodedCheckpoint:
        stored = [enc]
        self._engine.run("put", **self._put_call(enc, token, stored))
        self._put_done(enc, token)
        return stored[-1]

    async def _aput(self, enc: cps.EncodedCheckpoint, token: int | None) -> cps.EncodedCheckpoint:
        stored = [enc]
        await self._engine.arun_call("put", **self._put_call(enc, token, stored))
        self._put_done(enc, token)
        return stored[-1]

    def _put_call(
        self,
        enc: cps.EncodedCheckpoint,
        token: int | None,
        stored: list[cps.EncodedCheckpoint] | None = None,
    ) -> dict[str, Any]:
        now = self._now()

        def late(
            committed: txns.OnCommit, joined: frozenset[tuple[str, str, int]]
        ) -> Sequence[Any] | None:
            # The put takes its step's writes (`joined`) into its statement:
            # name those that came while it encoded (`lend_late`); the cache
            # learns the values it stored once that commits (`stored`, which
            # `_put` returns).
            again = self._lend_late(enc, lambda w: (w.checkpoint_id, w.task_id, w.idx) in joined)
            if again is enc or stored is None:
                return None
            committed(lambda: stored.append(again))
            return again.blobs

        return {
            "job": lambda cur: txns.put(
                cur, enc, token, now=now, require_claim=self.require_claim, notify=self._notify
            ),
            "batch": txns.put_batch(
                enc,
                token,
                now=now,
                require_claim=self.require_claim,
                notify=self._notify,
                late=late if self._value_table else None,
            ),
            # Takes the writes awaiting it (its parent's) into its transaction.
            "closes": None
            if enc.parent_id is None
            else (enc.thread_id, enc.checkpoint_ns, enc.parent_id),
        }

    def _put_done(self, enc: cps.EncodedCheckpoint, token: int | None) -> None:
        if token is not None:  # a run's put (see `_latest_roots`)
            self._latest_roots.put(enc.thread_id, enc.checkpoint_ns, enc.checkpoint_id)

    def _put_writes(
        self, key: _Key, encoded: _list[cps.EncodedWrite], token: int | None, run_id: str | None
    ) -> None:
        call = self._put_writes_call(key, encoded, token, run_id)
        self._engine.run("put_writes", **call)
        if token is not None:
            self._latest_roots.put_writes(key, encoded)

    async def _aput_writes(
        self, key: _Key, encoded: _list[cps.EncodedWrite], token: int | None, run_id: str | None
    ) -> None:
        call = self._put_writes_call(key, encoded, token, run_id)
        await self._engine.arun_call("put_writes", **call)
        if token is not None:
            self._latest_roots.put_writes(key, encoded)

    def _put_writes_call(
        self, key: _Key, encoded: _list[cps.EncodedWrite], token: int | None, run_id: str | None
    ) -> dict[str, Any]:
        # The batch and its fallback take the same arguments.
        opts: dict[str, Any] = {
            "run_id": run_id,
            "now": self._now(),
            "require_claim": self.require_claim,
            "notify": self._notify,
        }
        batch = txns.put_writes_batch(*key, encoded, token, **opts)
        awaits, closes = cps.step_role(key, encoded)
        return {
            "job": lambda cur: txns.put_writes(cur, *key, encoded, token, **opts),
            "batch": batch,
            # LangGraph's loop sends a step's writes, then the step's put
            # (whose parent is this checkpoint): wait for it, one commit; an
            # error or interrupt takes the put's place (`cps.step_role`).
            "awaits": None if batch is None else awaits,
            "closes": closes,
        }


def without_password(message: str, dsn: str) -> str:
    """Return `message` with the password of `dsn` (URL or key=value) replaced by `***`.

    libpq quotes a malformed URL whole in its error ("...in URI: \"postgresql://
    user:secret@[::1/db\""), so a connect error must not be shown as it is.
    """
    from urllib.parse import unquote

    import psycopg.conninfo

    secrets = set()
    try:
        secrets.add(str(psycopg.conninfo.conninfo_to_dict(dsn).get("password") or ""))
    except psycopg.Error:  # malformed: look for it by hand below
        pass
    scheme, sep, rest = dsn.partition("://")
    if sep and scheme in ("postgresql", "postgres"):
        # By hand, not urlsplit: a malformed URL (the case at hand) makes it raise.
        authority, _, query = rest.partition("?")
        userinfo = authority.split("/", 1)[0].rpartition("@")[0]
        if ":" in userinfo:
            raw = userinfo.split(":", 1)[1]
            secrets |= {raw, unquote(raw)}
        for part in query.split("&"):
            key, _, value = part.partition("=")
            if key == "password":
                secrets |= {value, unquote(value)}
    for secret in sorted(secrets - {""}, key=len, reverse=True):
        message = message.replace(secret, "***")
    return message


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
            message = without_password(f"connect failed: {exc}", self._dsn)
            raise StoreError("connect", "postgresql", message=message) from exc
        try:
            if self._kwargs.get("readonly") is True:
                # The whole session read-only: no statement of it can write,
                # and the store's transactions need no SET TRANSACTION each.
                conn.execute(sql.READ_ONLY_SESSION)
            self._saver = self._cls(conn, _owned=True, **self._kwargs)
        except psycopg.Error as exc:
            conn.close()
            raise StoreError("connect", "postgresql", message=f"connect failed: {exc}") from exc
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
