"""LangGraph's checkpointer methods as both stores offer them, over a few primitives.

Invariant: each public method checks its arguments and encodes outside any
transaction (the same checks, encoders and errors on either store), then
calls one store primitive that runs one transaction; rows come back decoded,
checksums checked, by the shared `checkpoints.decode_tuple`, so both stores
store, refuse and rebuild the same values. `list`/`alist` fetch a page per
transaction and yield outside it (one `_Paging` drives both), so a caller may
use the saver inside the loop. The primitives live in each saver's module
(`saver.FencedSqliteSaver`, `postgres.saver.FencedPostgresSaver`).
"""

from __future__ import annotations

import builtins
import random
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from typing_extensions import Self

from ..clock import Clock
from ..errors import FencedSqliteError, SerializationError, bad_argument
from . import checkpoints as cps
from . import values
from .claims import token_from_config
from .delta_history import DeltaWalk
from .encryption import Encryption, encryption_of
from .lending import lend_late, lent_writes
from .serde import DataOnlySerializer, TypeKey, schema_classes, schema_types
from .steps import FollowPolicy
from .store import UsesStore
from .twins import async_twin
from .validation import (
    check_before,
    check_checkpoint,
    check_config,
    check_filter,
    check_keys_nested,
    check_limit,
    check_name,
    check_writes,
    conf_target,
    config_target,
)
from .values import StaleParent, ValueCache

__all__ = ["FencedSaverBase", "StoredWrite", "list_query", "store_options"]

_PAGE = 100

# `list` is a method of the saver, so annotations in its body name the builtin this way.
_list = builtins.list
# A page cursor (the last row's checkpoint_id, thread_id, checkpoint_ns), or a checkpoint's key.
_Cursor = tuple[str, str, str]


class StoredWrite(NamedTuple):
    """One pending write as stored, with what `CheckpointTuple.pending_writes` leaves out."""

    task_id: str
    """The task that wrote it."""
    task_path: str
    """The task's path ("" when LangGraph gave none)."""
    idx: int
    """Its index among the task's writes (negative for special channels)."""
    channel: str
    """The channel written."""
    value: Any
    """The decoded value."""


# The counter digits of a thread's first channel version (`get_next_version`).
_VERSION_WIDTH = 10


class FencedSaverBase(UsesStore, BaseCheckpointSaver[str]):
    """LangGraph's `BaseCheckpointSaver` methods, written once for both fenced stores.

    A store implements the `_`-prefixed primitives below and its own
    opening, `setup` and `close`; its other halves are mixins listed before
    this class.
    """

    require_claim: bool
    fence_runs: bool = False  # runs fenced by their id (`ClaimsBase._run_token`)

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return bool(self._engine.closed)

    @property
    def path(self) -> str:
        """Where the store is: its SQLite file, or its PostgreSQL server and database."""
        raise NotImplementedError

    @property
    def encryption(self) -> Encryption | None:
        """The keyring stored values are sealed with (`encryption=`); None: stored in clear."""
        return encryption_of(self.serde)

    @property
    def readonly(self) -> bool:
        """Whether the saver was opened with `readonly=True` (its writes raise `ReadOnlyStore`)."""
        return bool(self._engine.readonly)

    def close(self) -> None:
        """Close the store (each store defines it); twice is fine."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Async twin of `close` (each store defines it)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def for_graph(self, graph: Any) -> Self:
        """Return this saver allowing the types `graph`'s schemas declare.

        LangGraph hands a graph's schema types to its checkpointer only under
        `LANGGRAPH_STRICT_MSGPACK=true`; this does the same derivation in any
        mode: `builder.compile(checkpointer=saver.for_graph(builder))`. The
        schema classes are registered as objects, so they are rebuilt with no
        import (classes defined inside a function too). The result shares
        this saver's connection (closing either closes both) and its
        serializer's registry; `FencedRunner` uses it so that a worker that
        only resumes rebuilds the graph's state types.

        Args:
            graph: A `StateGraph` builder or its compiled graph.

        Raises:
            InvalidArgument: `graph` is neither.
        """
        extra: _list[Any] = [*schema_types(graph), *schema_classes(graph).values()]
        return self.with_allowlist(extra)  # type: ignore[return-value]

    # --- reads ---------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Fetch a checkpoint (the latest, by commit order, if no id is given).

        Returns:
            The tuple with pending writes in `writes_sort_key` order, or None.
        """
        thread_id, ns, cid = config_target(config)
        if self._value_table:
            self._value_cache.unnote(thread_id, ns)
        found = self._read_tuple(thread_id, ns, cid)
        if found is not None and self._value_table:
            # The objects LangGraph's next put of this thread carries.
            self._value_cache.note(thread_id, ns, found.checkpoint["id"], found.checkpoint)
        return found

    aget_tuple = async_twin(get_tuple)

    def pending_writes(self, config: RunnableConfig) -> _list[StoredWrite]:
        """Return a checkpoint's pending writes with their task path and index.

        The writes `get_tuple` returns, in the same order, with what
        LangGraph's `(task_id, channel, value)` leaves out: what a copy
        between stores (`copy_threads`) needs to store them again as they were.

        Args:
            config: The thread, namespace and checkpoint id (the latest, by
                commit order, if no id is given).

        Returns:
            The writes, or [] when there is no such checkpoint.

        Raises:
            UndecodableRow: a write is damaged or does not decode.
        """
        thread_id, ns, cid = config_target(config)
        found = self._fetch_tuple("pending_writes", thread_id, ns, cid)
        if found is None:
            return []
        row, writes = found
        return [
            StoredWrite(
                w[0],
                w[4] or "",
                w[5],
                w[1],
                cps.decode_write(self.serde, row[0], row[2], w, (row[5], row[6])),
            )
            for w in writes
        ]

    apending_writes = async_twin(pending_writes)

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
            Checkpoint tuples; no lock or transaction is held between them.
        """
        paging = _Paging(list_query(config, filter, before, limit))
        while (step := paging.step()) is not None:
            yield from paging.take(*self._list_page(*step))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async twin of `list`."""
        paging = _Paging(list_query(config, filter, before, limit))
        while (step := paging.step()) is not None:
            for item in paging.take(*await self._alist_page(*step)):
                yield item

    def _list_page(
        self, query: dict[str, Any], cursor: _Cursor | None, remaining: int | None
    ) -> tuple[_list[CheckpointTuple], _Cursor | None]:
        args, size = page_args(query, remaining)
        page = self._read_page(args, cursor, size)
        return page, next_cursor(page, size)

    async def _alist_page(
        self, query: dict[str, Any], cursor: _Cursor | None, remaining: int | None
    ) -> tuple[_list[CheckpointTuple], _Cursor | None]:
        """Async twin of `_list_page` (through the hop; a store may read natively)."""
        page: tuple[_list[CheckpointTuple], _Cursor | None] = await self._engine.arun(
            self._list_page, query, cursor, remaining
        )
        return page

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Walk the parent chain of `config`'s checkpoint for `DeltaChannel` (LangGraph beta).

        The base class's result, read a page of ancestors at a time instead of
        one `get_tuple` each (`delta_history.DeltaWalk`).

        Args:
            config: The checkpoint (the latest, by commit order, if no id is given).
            channels: The channels to walk for.

        Returns:
            Per channel: its on-path writes, oldest first, and the nearest
            ancestor's stored value as `seed`, if any.
        """
        walk = DeltaWalk(channels)
        if not walk.channels:
            return {}
        walk.begin(self.get_tuple(config))
        while (need := walk.need()) is not None:
            kind, args = need
            if kind == "page":
                walk.take_page(_list(self.list(args[0], before=args[1], limit=args[2])), args[2])
            else:
                walk.take_tuple(self.get_tuple(args))
        return walk.result()

    aget_delta_channel_history = async_twin(get_delta_channel_history)

    # --- writes --------------------------------------------------------------------------

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
        # The thread's writes waiting for their step's put to share its
        # commit wait on while this one encodes (`FollowPolicy.announce`).
        policy, thread_id = self._follow_policy(), _thread_of(config)
        if policy is not None and thread_id is not None:
            policy.announce(thread_id)
        putting = self._expect(config, checkpoint)
        try:
            enc, token, stored = self._encode_put(config, checkpoint, metadata)
            enc = self._lend_late(enc)
            self._putting(enc)
            if token is None and self.fence_runs:  # a run's own claim
                token = self._run_token(enc.thread_id, cps.run_id_of(config))
            while True:
                try:
                    enc = self._put(enc, token)
                    break
                except StaleParent:
                    enc, stored = self._encode_again(config, checkpoint, metadata, enc)
                    self._putting(enc)
        finally:
            if policy is not None and thread_id is not None:
                policy.withdraw(thread_id)
            if putting is not None:
                self._value_cache.putting(*putting, None)
        if enc.held is not None:
            self._value_cache.put(
                enc.thread_id, enc.checkpoint_ns, enc.checkpoint_id, enc.values_blob, enc.held
            )
        return stored

    aput = async_twin(put)

    def _expect(
        self, config: RunnableConfig, checkpoint: Checkpoint
    ) -> tuple[str, str, str] | None:
        """Note a put starting to encode (`ValueCache.expect`); return its key for `putting`.

        None: the store keeps no value table, or the arguments are not a
        put's (its encode raises).
        """
        if not self._value_table:
            return None
        configurable = config.get("configurable") if isinstance(config, dict) else None
        if not isinstance(configurable, dict) or not isinstance(checkpoint, dict):
            return None
        thread_id = configurable.get("thread_id")
        ns = configurable.get("checkpoint_ns", "")
        cid = checkpoint.get("id")
        if type(thread_id) is not str or type(ns) is not str or type(cid) is not str:
            return None
        self._value_cache.expect(thread_id, ns, cid)
        return thread_id, ns, cid

    def _putting(self, enc: cps.EncodedCheckpoint) -> None:
        """Show the values of a put being committed to its step's writes (`ValueCache.putting`)."""
        if enc.held is not None:
            self._value_cache.putting(enc.thread_id, enc.checkpoint_ns, enc.checkpoint_id, enc.held)

    def _follow_policy(self) -> FollowPolicy | None:
        """The store's `FollowPolicy`, whose writes wait for their step's put (None: none)."""
        return None

    # The store keeps channel values in its value table (core/values.py), or
    # inline in each checkpoint row (False).
    _value_table = False
    _value_cache: ValueCache
    # Whether a merged row leaves the borrow rows before it as they are
    # (`values.encode_values`' `keep_borrows`): a store whose rewritten rows
    # stay as dead versions until vacuumed says so.
    _keep_borrows = False

    def _learn_values(self, thread_id: str, ns: str, checkpoint_id: str) -> None:
        """Read a checkpoint's values into `_value_cache` (a store may skip decoding them)."""
        self._read_tuple(thread_id, ns, checkpoint_id)

    def _encode_values(
        self,
        thread_id: str,
        ns: str,
        parent_id: str | None,
        checkpoint: Checkpoint,
        whole: bool,
        lend: bool = True,
    ) -> values.Encoded:
        """Encode a put's channel values against its parent's (`values.encode_values`).

        The parent's values come from what this process last put or read of
        the namespace; if that was not the parent, the parent is read first.
        """
        cache = self._value_cache
        parent = None
        if parent_id and not whole:
            parent = cache.get(thread_id, ns, parent_id)
            if parent is None:
                try:
                    self._learn_values(thread_id, ns, parent_id)
                except FencedSqliteError:
                    pass  # unreadable: its values are not named, they are stored whole
                parent = cache.get(thread_id, ns, parent_id)
        channel_values = checkpoint.get("channel_values", {})
        try:
            return values.encode_values(
                self.serde,
                channel_values,
                checkpoint.get("channel_versions", {}),
                None if parent is None else parent[1],
                None if parent is None else parent[0],
                cache.lent(thread_id, ns, parent_id) if parent_id and parent and lend else (),
                keep_borrows=self._keep_borrows,
            )
        except SerializationError:
            # Refused: `dumps_typed` of the whole raises the same refusal,
            # located (channel, and key within a dict) as it always was.
            self.serde.dumps_typed(channel_values)
            raise

    def _lend_late(
        self, enc: cps.EncodedCheckpoint, stored: Callable[[values.Lent], bool] | None = None
    ) -> cps.EncodedCheckpoint:
        """Name the parent's writes that came while `enc` was encoding (`lending.lend_late`).

        `stored(write)`: whether it may name that write (stored by now); None: any.
        """
        if not enc.blobs or enc.held is None or enc.parent_id is None:
            return enc
        lent = self._value_cache.lent(enc.thread_id, enc.checkpoint_ns, enc.parent_id)
        if stored is not None:
            lent = tuple(w for w in lent if stored(w))
        late = lend_late(enc.blobs, enc.held, lent)
        return enc if late is None else enc._replace(blobs=late[0], held=late[1])

    def _encode_again(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        refused: cps.EncodedCheckpoint,
    ) -> tuple[cps.EncodedCheckpoint, RunnableConfig]:
        """Encode a put again after its store refused `refused` (`StaleParent`).

        It named a pending write not stored as this process holds it (one
        that lost to another's, or failed): encoded again naming no write.
        Else it named rows of a parent deleted or replaced since this process
        read it: stored whole, naming nothing of the parent's.
        """
        lent = bool(lent_writes(refused.blobs or ()))
        enc, _, stored = self._encode_put(config, checkpoint, metadata, whole=not lent, lend=False)
        return enc, stored

    def _encode_put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        *,
        whole: bool = False,
        lend: bool = True,
    ) -> tuple[cps.EncodedCheckpoint, int | None, RunnableConfig]:
        """Check and encode `put`'s arguments: the row, the token, the config `put` returns.

        `whole`: values name no row of the parent's (after `StaleParent`);
        `lend`: they may name the parent's pending writes this process holds.
        """
        thread_id, ns, _ = config_target(config)
        token = token_from_config(config)
        envelope, plain, plain_md = check_checkpoint(checkpoint, metadata)
        encoded = None
        if self._value_table:
            parent_id = config["configurable"].get("checkpoint_id")
            encoded = self._encode_values(thread_id, ns, parent_id, checkpoint, whole, lend)
        enc = cps.encode_checkpoint(
            self.serde,
            config,
            checkpoint,
            metadata,
            thread_id,
            ns,
            plain_envelope=plain,
            plain_metadata=plain_md,
            envelope=envelope,
            values=None if encoded is None else encoded.row,
        )
        stored: RunnableConfig = {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }
        return enc, token, stored

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes for the config's checkpoint (fenced like `put`).

        The checkpoint need not be stored yet (LangGraph sends writes first).
        Regular writes are first-writer-wins per `(task_id, idx)`; the special
        channels of `WRITES_IDX_MAP` are last-writer-wins within the fence.
        """
        args = self._encode_writes(config, writes, task_id, task_path)
        if args is None:
            return
        key, encoded, token, run_id = args
        if token is None:  # a run's own claim, under `fence_runs`
            token = self._run_token(key[0], run_id)
        self._put_writes(key, encoded, token, run_id)
        self._run_ended(key, token, run_id, writes)

    aput_writes = async_twin(put_writes)

    def _encode_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> tuple[_Cursor, _list[cps.EncodedWrite], int | None, str | None] | None:
        """Check and encode `put_writes`' arguments: `_put_writes`' (None: nothing to store)."""
        thread_id, ns, cid = config_target(config, need_id=True)
        assert cid is not None
        check_name(task_id, "task_id")
        check_name(task_path, "task_path", allow_empty=True)
        token = token_from_config(config)
        within = None
        lend: _list[tuple[str, int, bytes, int]] | None = None
        if self._value_table and encryption_of(self.serde) is None:
            # The checkpoint's values, when this process holds them (it put
            # or read it, or is putting it): a write they hold is stored as a
            # slice of them.
            within = self._value_cache.holding(thread_id, ns, cid)
            lend = []
        encoded = cps.encode_writes(
            self.serde,
            check_writes(writes),
            task_id,
            task_path,
            compress=self._value_table,
            within=within,
            lend=lend,
        )
        if not encoded:
            return None
        if lend:
            # Held before the write is stored: the step's put, which names
            # their bytes, often takes this write into its own commit. Its
            # transaction checks that each write it names is stored, as held.
            self._value_cache.lend(thread_id, ns, [values.Lent(cid, *w) for w in lend])
        return (thread_id, ns, cid), encoded, token, cps.run_id_of(config)

    def get_next_version(self, current: str | None, channel: None = None) -> str:
        """Return the next channel version: a zero-padded counter plus a random suffix.

        A thread's first version has a 10-digit counter and an 8-digit hex
        suffix (`0000000001.3f9a0c2e`); every later one keeps the width of
        the counter it follows, so versions written before (32 digits, a
        `random.random()` suffix) still order as LangGraph compares them,
        as strings. Short versions: each checkpoint's envelope holds several.
        """
        if current is None:
            current_v, width = 0, _VERSION_WIDTH
        elif isinstance(current, int) and not isinstance(current, bool):
            current_v, width = current, 32
        else:
            head = current.split(".")[0] if isinstance(current, str) else ""
            if not head.isdigit():
                raise bad_argument("current", f"expected a channel version, got {current!r}")
            current_v, width = int(head), len(head)
        return f"{current_v + 1:0{width}}.{random.getrandbits(32):08x}"

    # --- the store's primitives: checked, encoded arguments in, one transaction each ----

    def _read_tuple(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> CheckpointTuple | None:
        """Read and decode `get_tuple`'s checkpoint; a store may read it its own way."""
        found = self._fetch_tuple("get_tuple", thread_id, checkpoint_ns, checkpoint_id)
        return None if found is None else cps.decode_tuple(self.serde, *found)

    def _read_page(
        self, query: dict[str, Any], after_key: _Cursor | None, size: int
    ) -> _list[CheckpointTuple]:
        """Read and decode one page of `list`; a store may read it its own way."""
        rows, writes = self._fetch_page(query, after_key, size)
        return self._decode_page(rows, writes)

    def _decode_page(
        self, rows: _list[Any], writes: dict[Any, _list[Any]]
    ) -> _list[CheckpointTuple]:
        """Decode one page's rows with their writes (by checkpoint key)."""
        return [cps.decode_tuple(self.serde, r, writes[(r[0], r[1], r[2])]) for r in rows]

    def _fetch_tuple(
        self, op: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> tuple[Any, _list[Any]] | None:
        """Read one checkpoint row (the latest by commit if no id) and its write rows."""
        raise NotImplementedError

    def _fetch_page(
        self, query: dict[str, Any], after_key: _Cursor | None, size: int
    ) -> tuple[_list[Any], dict[Any, _list[Any]]]:
        """Read one page of `list`'s rows, and their write rows by checkpoint key."""
        raise NotImplementedError

    def _put(self, enc: cps.EncodedCheckpoint, token: int | None) -> cps.EncodedCheckpoint:
        """Store `enc` under `token`; return it as stored (its rows may name writes that
        joined its commit, `lending.lend_late`)."""
        raise NotImplementedError

    def _run_token(self, thread_id: str, run_id: str | None) -> int | None:
        """The token a write with no token carries: its run's own, under `fence_runs` (claims)."""
        raise NotImplementedError

    def _run_ended(
        self, key: _Cursor, token: int | None, run_id: str | None, writes: Sequence[Any]
    ) -> None:
        """Log the end a run's own writes mark, under `fence_runs` (claims)."""
        raise NotImplementedError

    def _put_writes(
        self, key: _Cursor, encoded: _list[cps.EncodedWrite], token: int | None, run_id: str | None
    ) -> None:
        """Store `encoded` for the checkpoint `key`: (thread_id, checkpoint_ns, checkpoint_id)."""
        raise NotImplementedError


def _thread_of(config: RunnableConfig) -> str | None:
    # A put's thread, for `FollowPolicy.announce` (None: a config `put`
    # refuses anyway, before it could be queued).
    conf = config.get("configurable") if isinstance(config, Mapping) else None
    thread_id = conf.get("thread_id") if isinstance(conf, Mapping) else None
    return thread_id if type(thread_id) is str else None


def page_args(query: dict[str, Any], remaining: int | None) -> tuple[dict[str, Any], int]:
    """One page's query (`list`'s, less its limit) and size, `remaining` still to list."""
    size = _PAGE if remaining is None else min(_PAGE, remaining)
    return {k: v for k, v in query.items() if k != "limit"}, size


def next_cursor(page: _list[CheckpointTuple], size: int) -> _Cursor | None:
    """Where the page after `page` (of at most `size`) starts; None: it was the last."""
    if len(page) < size:
        return None
    last = page[-1].config["configurable"]
    return last["checkpoint_id"], last["thread_id"], last["checkpoint_ns"]


class _Paging:
    """Where one `list` call is: the one paging loop its sync and async drivers share."""

    def __init__(self, query: dict[str, Any]) -> None:
        self.query = query
        self.cursor: _Cursor | None = None
        self.remaining: int | None = query["limit"]
        self.done = False

    def step(self) -> tuple[dict[str, Any], _Cursor | None, int | None] | None:
        """Return the arguments of the next page's fetch, or None when the listing is over."""
        if self.done or (self.remaining is not None and self.remaining <= 0):
            return None
        return self.query, self.cursor, self.remaining

    def take(self, page: _list[CheckpointTuple], cursor: _Cursor | None) -> _list[CheckpointTuple]:
        """Record a fetched page and where the next starts; return the page."""
        self.cursor = cursor
        self.done = cursor is None
        if self.remaining is not None:
            self.remaining -= len(page)
        return page


def store_options(
    serde: SerializerProtocol | None,
    allowed_types: Iterable[TypeKey | type],
    allowed_modules: Iterable[str] | str,
    clock: Clock | None,
    require_claim: bool,
    encryption: Encryption | None = None,
) -> SerializerProtocol:
    """Check the options both stores' `__init__` take; return the serializer to use.

    With `encryption`, the serializer seals and opens stored values with it
    (it must be the data-only default, or one derived from it).

    Raises:
        InvalidArgument: an option is wrong (the message names it).
    """
    if encryption is not None and not isinstance(encryption, Encryption):
        raise bad_argument(
            "encryption", f"expected an Encryption (e.g. Encryption.from_env()), got {encryption!r}"
        )
    if not isinstance(require_claim, bool):
        raise bad_argument("require_claim", "expected a bool")
    if clock is not None and not isinstance(clock, Clock):
        raise bad_argument("clock", "expected a Clock (with now() and monotonic())")
    if serde is None:
        serde = DataOnlySerializer(allowed_types, allowed_modules=allowed_modules)
    elif allowed_types or allowed_modules:
        which = "allowed_types" if allowed_types else "allowed_modules"
        raise bad_argument(which, "give it only with the default serializer")
    if encryption is None:
        return serde
    if not isinstance(serde, DataOnlySerializer):
        raise bad_argument("encryption", "give it only with the data-only serializer (the default)")
    return serde.with_encryption(encryption)


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
        check_keys_nested(config, "config")  # else read as every thread
        conf = check_config(config)
        if conf.get("thread_id") is not None:
            thread_id, _, cid = conf_target(conf)
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
