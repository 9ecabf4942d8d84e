"""The one exception hierarchy of `langgraph_fenced_sqlite`.

Invariant: every error a caller can branch on is a `FencedSqliteError` with a
stable `code`, the fields named in docs/semantics.md §10, a picklable shape (so it
crosses process boundaries intact) and the public package as `__module__`.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "CheckpointConflict",
    "CheckpointNotFound",
    "ClaimError",
    "FencedSqliteError",
    "InvalidArgument",
    "ReadOnlyStore",
    "ReplayUnavailable",
    "RunCancelled",
    "RunTimedOut",
    "SchemaTooOld",
    "SerializationError",
    "StaleClaim",
    "StoreBusy",
    "StoreClosed",
    "StoreError",
    "TenantMismatch",
    "ThreadBusy",
    "UndecodableRow",
    "UnsupportedFormat",
    "WrongProcess",
    "WrongThread",
]


class FencedSqliteError(Exception):
    """Base class of every error this package raises on purpose.

    Subclasses declare `_fields`: the constructor arguments, kept as
    attributes, that `__reduce__` uses to rebuild the error in another process.
    """

    code: ClassVar[str] = "error"
    _fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *args: Any, message: str | None = None) -> None:
        for name, value in zip(self._fields, args, strict=True):
            setattr(self, name, value)
        self._message = message if message is not None else self._default_message()
        super().__init__(self._message)

    def _default_message(self) -> str:
        return self.code

    def __reduce__(self) -> tuple[Any, ...]:
        args = tuple(getattr(self, name) for name in self._fields)
        return (_rebuild, (type(self), args, self._message))

    def to_dict(self) -> dict[str, Any]:
        """Return the code, message and fields, ready for JSON output."""
        out: dict[str, Any] = {"code": self.code, "message": self._message}
        for name in self._fields:
            out[name] = getattr(self, name)
        return out


def _rebuild(cls: type[FencedSqliteError], args: tuple[Any, ...], message: str) -> Any:
    return cls(*args, message=message)


class InvalidArgument(FencedSqliteError, ValueError, TypeError):
    """Raise when an argument is malformed; nothing was touched.

    Both a `ValueError` and a `TypeError`, so callers catching either (and
    LangGraph code expecting the builtin kinds) keep working.

    Attributes:
        argument: The name of the offending argument.
    """

    code = "invalid_argument"
    _fields: ClassVar[tuple[str, ...]] = ("argument",)
    argument: str

    def __init__(self, argument: str, *, message: str | None = None) -> None:
        super().__init__(argument, message=message)

    def _default_message(self) -> str:
        return f"{self.argument}: invalid"


def bad_argument(argument: str, problem: str) -> InvalidArgument:
    """Return the error for `argument`, its message starting with the name."""
    return InvalidArgument(argument, message=f"{argument}: {problem}")


class ClaimError(FencedSqliteError):
    """Base class of the errors about who may write a thread."""

    code = "claim_error"


class ThreadBusy(ClaimError):
    """Raise when a thread has a live claim held by someone else (or by you).

    Attributes:
        thread_id: The thread asked for.
        holder: The holder of the live claim (None when not known).
        latest_checkpoint_id: The thread's latest root checkpoint id, if any.
    """

    code = "thread_busy"
    _fields: ClassVar[tuple[str, ...]] = ("thread_id", "holder", "latest_checkpoint_id")
    thread_id: str
    holder: str | None
    latest_checkpoint_id: str | None

    def __init__(
        self,
        thread_id: str,
        holder: str | None,
        latest_checkpoint_id: str | None = None,
        *,
        message: str | None = None,
    ) -> None:
        super().__init__(thread_id, holder, latest_checkpoint_id, message=message)

    def _default_message(self) -> str:
        return f"thread {self.thread_id!r} is claimed by {self.holder!r}"


class StaleClaim(ClaimError):
    """Raise when a fenced call presents a token that is not the thread's claim.

    Attributes:
        thread_id: The thread written.
        token: The token presented.
        current_token: The token of the thread's current claim (None if none).
        holder: Who holds the latest claim granted on the thread: the current
            one, or, when `current_token` is None, the one that has ended
            since (None when not known).
        latest_token: The token of that latest claim (None when not known).
    """

    code = "stale_claim"
    _fields: ClassVar[tuple[str, ...]] = (
        "thread_id",
        "token",
        "current_token",
        "holder",
        "latest_token",
    )
    thread_id: str
    token: int | None
    current_token: int | None
    holder: str | None
    latest_token: int | None
    # The marker LangGraph's proposed write-ownership convention looks for.
    is_stale_write_owner_error: ClassVar[bool] = True

    def __init__(
        self,
        thread_id: str,
        token: int | None,
        current_token: int | None,
        holder: str | None = None,
        latest_token: int | None = None,
        *,
        message: str | None = None,
    ) -> None:
        super().__init__(thread_id, token, current_token, holder, latest_token, message=message)

    @property
    def situation(self) -> str:
        """Say, in words, what became of the thread's claim (who holds it now)."""
        if self.current_token is not None:
            who = "" if self.holder is None else f" by {self.holder!r}"
            return f"the thread is claimed{who} with token {self.current_token}"
        if self.latest_token is None or self.latest_token == self.token:
            return "the thread has no claim now"
        who = "" if self.holder is None else f" by {self.holder!r}"
        return (
            f"it was claimed since{who} with token {self.latest_token}, "
            "and that claim has ended (no claim now)"
        )

    def _default_message(self) -> str:
        return f"token {self.token} is stale for thread {self.thread_id!r}: {self.situation}"


class TenantMismatch(ClaimError):
    """Raise when a runner opened for one tenant meets another tenant's thread.

    Nothing was touched: the thread was not claimed, run, cancelled or deleted.

    Attributes:
        thread_id: The thread asked for.
        tenant: The tenant the runner (or call) is for.
        thread_tenant: The tenant the thread belongs to (None: written without one).
    """

    code = "tenant_mismatch"
    _fields: ClassVar[tuple[str, ...]] = ("thread_id", "tenant", "thread_tenant")
    thread_id: str
    tenant: str
    thread_tenant: str | None

    def __init__(
        self,
        thread_id: str,
        tenant: str,
        thread_tenant: str | None,
        *,
        message: str | None = None,
    ) -> None:
        super().__init__(thread_id, tenant, thread_tenant, message=message)

    def _default_message(self) -> str:
        if self.thread_tenant is None:
            owner = f"was written without a tenant, so tenant {self.tenant!r} may not use it"
        else:
            owner = f"belongs to tenant {self.thread_tenant!r}, not to {self.tenant!r}"
        return f"thread {self.thread_id!r} {owner}; nothing was touched"


class RunCancelled(FencedSqliteError):
    """Raise when a run stopped because a cancel was asked for it (from any process).

    The run stopped at its next node boundary (sync) or at once (async); what
    it had made durable stays, and its claim was released (`run_cancelled`).

    Attributes:
        thread_id: The thread the run was on.
        run_id: The run that stopped.
        by: Who asked it to stop.
    """

    code = "run_cancelled"
    _fields: ClassVar[tuple[str, ...]] = ("thread_id", "run_id", "by")
    thread_id: str
    run_id: str
    by: str | None

    def __init__(
        self, thread_id: str, run_id: str, by: str | None, *, message: str | None = None
    ) -> None:
        super().__init__(thread_id, run_id, by, message=message)

    def _default_message(self) -> str:
        return f"run {self.run_id} on thread {self.thread_id!r} was cancelled by {self.by!r}"


class RunTimedOut(FencedSqliteError, TimeoutError):
    """Raise when a run outlived its `timeout=`; also a `TimeoutError`.

    The run stopped as a cancelled one does, and logged `run_timed_out`.

    Attributes:
        thread_id: The thread the run was on.
        run_id: The run that stopped.
        timeout: The deadline it was given, in seconds.
    """

    code = "run_timed_out"
    _fields: ClassVar[tuple[str, ...]] = ("thread_id", "run_id", "timeout")
    thread_id: str
    run_id: str
    timeout: float

    def __init__(
        self, thread_id: str, run_id: str, timeout: float, *, message: str | None = None
    ) -> None:
        super().__init__(thread_id, run_id, timeout, message=message)

    def _default_message(self) -> str:
        return (
            f"run {self.run_id} on thread {self.thread_id!r} did not finish "
            f"within its timeout of {self.timeout:g}s"
        )


class CheckpointConflict(FencedSqliteError):
    """Raise when a put does not extend the namespace's latest checkpoint.

    Also raised when a different checkpoint is put under an id already stored.

    Attributes:
        thread_id: The thread written.
        checkpoint_ns: The namespace written.
        expected: The parent the put named (or the id it tried to store).
        actual: The namespace's latest checkpoint id (or the stored id).
    """

    code = "checkpoint_conflict"
    _fields: ClassVar[tuple[str, ...]] = ("thread_id", "checkpoint_ns", "expected", "actual")
    thread_id: str
    checkpoint_ns: str
    expected: str | None
    actual: str | None

    def __init__(
        self,
        thread_id: str,
        checkpoint_ns: str,
        expected: str | None,
        actual: str | None,
        *,
        message: str | None = None,
    ) -> None:
        super().__init__(thread_id, checkpoint_ns, expected, actual, message=message)

    def _default_message(self) -> str:
        return (
            f"thread {self.thread_id!r} namespace {self.checkpoint_ns!r}: put "
            f"names {self.expected!r} but the latest is {self.actual!r}"
        )


class CheckpointNotFound(FencedSqliteError, LookupError):
    """Raise when a named checkpoint is not stored in the thread.

    Attributes:
        thread_id: The thread searched.
        checkpoint_id: The id that is not there.
    """

    code = "checkpoint_not_found"
    _fields: ClassVar[tuple[str, ...]] = ("thread_id", "checkpoint_id")
    thread_id: str
    checkpoint_id: str

    def __init__(self, thread_id: str, checkpoint_id: str, *, message: str | None = None) -> None:
        super().__init__(thread_id, checkpoint_id, message=message)

    def _default_message(self) -> str:
        return f"checkpoint {self.checkpoint_id!r} not found in thread {self.thread_id!r}"


class ReplayUnavailable(FencedSqliteError):
    """Raise when events below a thread's replay floor are asked for.

    Also raised for a position of another incarnation than the thread's
    (`delete_thread` re-created it and numbering restarted at 1).

    Attributes:
        thread_id: The thread read.
        floor: The lowest seq still stored; resume from `floor - 1` or later.
        incarnation: The thread's current incarnation: resume with it.
    """

    code = "replay_unavailable"
    _fields: ClassVar[tuple[str, ...]] = ("thread_id", "floor", "incarnation")
    thread_id: str
    floor: int
    incarnation: int

    def __init__(
        self, thread_id: str, floor: int, incarnation: int = 1, *, message: str | None = None
    ) -> None:
        super().__init__(thread_id, floor, incarnation, message=message)

    def _default_message(self) -> str:
        return f"events of thread {self.thread_id!r} before seq {self.floor} were compacted away"


class SerializationError(FencedSqliteError, ValueError):
    """Raise when a value cannot be stored or read as data.

    Attributes:
        type_name: The `module.qualname` of the refused type, or the tag.
    """

    code = "serialization_error"
    _fields: ClassVar[tuple[str, ...]] = ("type_name",)
    type_name: str

    def __init__(self, type_name: str, *, message: str | None = None) -> None:
        super().__init__(type_name, message=message)

    def _default_message(self) -> str:
        return (
            f"type {self.type_name} is not in the serializer's allow-list; "
            "pass it in allowed_types=[...] to store it"
        )


class UndecodableRow(FencedSqliteError):
    """Raise when a stored row does not decode; nothing is guessed.

    Attributes:
        thread_id: The thread of the row.
        checkpoint_id: The checkpoint of the row.
        reason: Why it did not decode (the refused type or tag).
    """

    code = "undecodable_row"
    _fields: ClassVar[tuple[str, ...]] = ("thread_id", "checkpoint_id", "reason")
    thread_id: str
    checkpoint_id: str | None
    reason: str

    def __init__(
        self,
        thread_id: str,
        checkpoint_id: str | None,
        reason: str,
        *,
        message: str | None = None,
    ) -> None:
        super().__init__(thread_id, checkpoint_id, reason, message=message)

    def _default_message(self) -> str:
        return (
            f"thread {self.thread_id!r} checkpoint {self.checkpoint_id!r} "
            f"does not decode: {self.reason}"
        )


class StoreError(FencedSqliteError):
    """Raise when the database itself fails; the message names operation and path.

    Attributes:
        op: The operation that failed.
        path: The database file.
    """

    code = "store_error"
    _fields: ClassVar[tuple[str, ...]] = ("op", "path")
    op: str
    path: str

    def __init__(self, op: str, path: str, *, message: str | None = None) -> None:
        super().__init__(op, path, message=message)

    def _default_message(self) -> str:
        return f"{self.op} failed on {self.path}"


class StoreBusy(StoreError):
    """Raise when the file's write lock was not had within `busy_timeout`.

    Attributes:
        op: The operation that waited.
        path: The database file.
        waited_s: How long it waited, in seconds.
    """

    code = "store_busy"
    _fields: ClassVar[tuple[str, ...]] = ("op", "path", "waited_s")
    waited_s: float

    def __init__(self, op: str, path: str, waited_s: float, *, message: str | None = None) -> None:
        FencedSqliteError.__init__(self, op, path, waited_s, message=message)

    def _default_message(self) -> str:
        return (
            f"{self.op} on {self.path}: database locked by another connection "
            f"for {self.waited_s:.2f}s (busy_timeout); nothing was changed"
        )


def busy_in_process(op: str, path: str, waited_s: float) -> StoreBusy:
    """Return the `StoreBusy` of a call this store's own other calls kept past `busy_timeout`.

    Not the file's lock: the call never got its turn in this process (the
    store's lock, or the queue of the group commit). An async call's wait
    counts from when it was made, its hop to the store's thread included.
    """
    return StoreBusy(
        op,
        path,
        waited_s,
        message=(
            f"{op} on {path}: still waiting for this store's other calls in this process "
            f"after {waited_s:.2f}s (busy_timeout, counted from the call); nothing was changed"
        ),
    )


class StoreClosed(StoreError):
    """Raise when a store is used after `close()`."""

    code = "store_closed"

    def _default_message(self) -> str:
        return f"{self.op} on {self.path}: the store is closed"


class WrongThread(StoreError):
    """Raise when a store is called from inside its own critical section."""

    code = "wrong_thread"

    def _default_message(self) -> str:
        return (
            f"{self.op} on {self.path}: called from inside another call of the "
            "same store (it would deadlock)"
        )


class WrongProcess(StoreError):
    """Raise when a store opened in one process is used in another (after fork)."""

    code = "wrong_process"

    def _default_message(self) -> str:
        return (
            f"{self.op} on {self.path}: this store was opened in another process; "
            "open a new store after fork"
        )


class UnsupportedFormat(StoreError):
    """Raise when a file is not ours, or was written by a newer schema."""

    code = "unsupported_format"


class SchemaTooOld(UnsupportedFormat):
    """Raise when a read-only store meets an older schema, which only a writable store migrates.

    A read-only store never migrates (a migration is a write, and processes
    still running an older version of the library would then refuse the
    store as newer than they know). The store was left unchanged.

    Attributes:
        op: The operation that found it (`open`, `setup`).
        path: The database file (`postgresql://host:port/db` for PostgreSQL).
        version: The schema version the store holds (0: never set up).
        current: The schema version this version of the library reads.
    """

    code = "schema_too_old"
    _fields: ClassVar[tuple[str, ...]] = ("op", "path", "version", "current")
    version: int
    current: int

    def __init__(
        self, op: str, path: str, version: int, current: int, *, message: str | None = None
    ) -> None:
        FencedSqliteError.__init__(self, op, path, version, current, message=message)

    def _default_message(self) -> str:
        return (
            f"{self.op} on {self.path}: schema version {self.version} needs migrating to "
            f"{self.current}, which a read-only store cannot do (left unchanged)"
        )


class ReadOnlyStore(StoreError):
    """Raise when a write reaches a store that cannot write.

    Either the store was opened with `readonly=True`, or a writable open met a
    read-only file, directory or mount (open it with `readonly=True` to read it).
    """

    code = "read_only_store"

    def _default_message(self) -> str:
        return f"{self.op} on {self.path}: the store is read-only; nothing was changed"


# Every error reads as part of the public package.
for _name in __all__:
    globals()[_name].__module__ = "langgraph_fenced_sqlite"
