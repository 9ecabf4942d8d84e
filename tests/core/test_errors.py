"""The error hierarchy (docs/semantics.md §10): fields, codes, pickling, module, subclassing."""

from __future__ import annotations

import base64
import copy
import pickle
import subprocess
import sys
import textwrap
from typing import Any

import pytest

import langgraph_fenced_sqlite as lgfs
from langgraph_fenced_sqlite import (
    CheckpointConflict,
    CheckpointNotFound,
    ClaimError,
    FencedSqliteError,
    InvalidArgument,
    ReadOnlyStore,
    ReplayUnavailable,
    RunCancelled,
    RunTimedOut,
    SchemaTooOld,
    SerializationError,
    StaleClaim,
    StoreBusy,
    StoreClosed,
    StoreError,
    TenantMismatch,
    ThreadBusy,
    UndecodableRow,
    UnsupportedFormat,
    WrongProcess,
    WrongThread,
)
from langgraph_fenced_sqlite import errors as errors_module

# One instance of every class, with its fields as the caller sees them, and
# the `code` the CLI prints (stable: changing one breaks scripts).
EXAMPLES: list[tuple[FencedSqliteError, str, dict[str, Any]]] = [
    (FencedSqliteError(), "error", {}),
    (ClaimError(), "claim_error", {}),
    (
        InvalidArgument("ttl", message="ttl: must be positive"),
        "invalid_argument",
        {"argument": "ttl"},
    ),
    (
        ThreadBusy("t-ü", "alice", "cp-1"),
        "thread_busy",
        {"thread_id": "t-ü", "holder": "alice", "latest_checkpoint_id": "cp-1"},
    ),
    (
        ThreadBusy("t", None),
        "thread_busy",
        {"thread_id": "t", "holder": None, "latest_checkpoint_id": None},
    ),
    (
        StaleClaim("t", 3, 7),
        "stale_claim",
        {"thread_id": "t", "token": 3, "current_token": 7, "holder": None, "latest_token": None},
    ),
    (
        StaleClaim("t", 3, None),
        "stale_claim",
        {"thread_id": "t", "token": 3, "current_token": None, "holder": None, "latest_token": None},
    ),
    (
        StaleClaim("t", 3, None, "bob", 5),
        "stale_claim",
        {"thread_id": "t", "token": 3, "current_token": None, "holder": "bob", "latest_token": 5},
    ),
    (
        TenantMismatch("t", "acme", "globex"),
        "tenant_mismatch",
        {"thread_id": "t", "tenant": "acme", "thread_tenant": "globex"},
    ),
    (
        TenantMismatch("t", "acme", None),
        "tenant_mismatch",
        {"thread_id": "t", "tenant": "acme", "thread_tenant": None},
    ),
    (
        RunCancelled("t", "run-1", "ops"),
        "run_cancelled",
        {"thread_id": "t", "run_id": "run-1", "by": "ops"},
    ),
    (
        RunTimedOut("t", "run-1", 2.5),
        "run_timed_out",
        {"thread_id": "t", "run_id": "run-1", "timeout": 2.5},
    ),
    (
        CheckpointConflict("t", "sub:1", "cp-a", "cp-b"),
        "checkpoint_conflict",
        {"thread_id": "t", "checkpoint_ns": "sub:1", "expected": "cp-a", "actual": "cp-b"},
    ),
    (
        CheckpointNotFound("t", "cp-x"),
        "checkpoint_not_found",
        {"thread_id": "t", "checkpoint_id": "cp-x"},
    ),
    (
        ReplayUnavailable("t", 42, 3),
        "replay_unavailable",
        {"thread_id": "t", "floor": 42, "incarnation": 3},
    ),
    (SerializationError("app.Thing"), "serialization_error", {"type_name": "app.Thing"}),
    (
        UndecodableRow("t", "cp-1", "tag 'pickle' is refused"),
        "undecodable_row",
        {"thread_id": "t", "checkpoint_id": "cp-1", "reason": "tag 'pickle' is refused"},
    ),
    (StoreError("put", "/x.db"), "store_error", {"op": "put", "path": "/x.db"}),
    (
        StoreBusy("put", "/x.db", 5.25),
        "store_busy",
        {"op": "put", "path": "/x.db", "waited_s": 5.25},
    ),
    (StoreClosed("get_tuple", "/x.db"), "store_closed", {"op": "get_tuple", "path": "/x.db"}),
    (
        UnsupportedFormat("open", "/x.db", message="open /x.db: schema version 9 is newer"),
        "unsupported_format",
        {"op": "open", "path": "/x.db"},
    ),
    (
        SchemaTooOld("open", "/x.db", 3, 8),
        "schema_too_old",
        {"op": "open", "path": "/x.db", "version": 3, "current": 8},
    ),
    (ReadOnlyStore("put", "/x.db"), "read_only_store", {"op": "put", "path": "/x.db"}),
    (WrongThread("claim", "/x.db"), "wrong_thread", {"op": "claim", "path": "/x.db"}),
    (WrongProcess("put", "/x.db"), "wrong_process", {"op": "put", "path": "/x.db"}),
]

_IDS = [f"{type(e).__name__}-{i}" for i, (e, _, _) in enumerate(EXAMPLES)]


def test_every_public_error_class_has_an_example() -> None:
    """The examples cover every exported error class, and codes are unique per class."""
    exported = {getattr(lgfs, n) for n in errors_module.__all__}
    assert {type(e) for e, _, _ in EXAMPLES} == exported
    codes = {type(e): code for e, code, _ in EXAMPLES}
    assert len(set(codes.values())) == len(codes)


@pytest.mark.parametrize(("error", "code", "fields"), EXAMPLES, ids=_IDS)
def test_code_fields_and_module(
    error: FencedSqliteError, code: str, fields: dict[str, Any]
) -> None:
    """Each error has its stable code, its fields as attributes, and the package as module."""
    assert error.code == code == type(error).code
    for name, value in fields.items():
        assert getattr(error, name) == value
    assert type(error).__module__ == "langgraph_fenced_sqlite"
    assert error.to_dict() == {"code": code, "message": str(error), **fields}
    assert str(error)


@pytest.mark.parametrize(("error", "code", "fields"), EXAMPLES, ids=_IDS)
def test_pickle_and_copy_round_trip(
    error: FencedSqliteError, code: str, fields: dict[str, Any]
) -> None:
    """Pickling (every protocol) and copying keep the class, the fields and the message."""
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        clone = pickle.loads(pickle.dumps(error, protocol=protocol))
        assert type(clone) is type(error)
        assert str(clone) == str(error) and clone.args == error.args
        assert clone.to_dict() == error.to_dict()
    for clone in (copy.copy(error), copy.deepcopy(error)):
        assert type(clone) is type(error) and clone.to_dict() == error.to_dict()


def test_custom_message_survives_pickling() -> None:
    """A message given explicitly (not the default) crosses a pickle intact."""
    error = ThreadBusy("t", "alice", None, message="custom: claim it first")
    clone = pickle.loads(pickle.dumps(error))
    assert str(clone) == "custom: claim it first" and clone.holder == "alice"


def test_default_messages_name_their_fields() -> None:
    """Default messages carry what a log reader needs (thread, holder, tokens, op, path)."""
    assert "alice" in str(ThreadBusy("t1", "alice")) and "t1" in str(ThreadBusy("t1", "alice"))
    stale = str(StaleClaim("t1", 3, 7))
    assert "3" in stale and "7" in stale and "t1" in stale
    # Once the claim that took over has ended too, it is still named.
    ended = str(StaleClaim("t1", 3, None, "bob", 7))
    assert "bob" in ended and "7" in ended and "no claim now" in ended
    mismatch = str(TenantMismatch("t1", "acme", "globex"))
    assert "t1" in mismatch and "acme" in mismatch and "globex" in mismatch
    busy = str(StoreBusy("put", "/data/x.db", 0.2))
    assert "put" in busy and "/data/x.db" in busy and "nothing was changed" in busy
    closed = str(StoreClosed("list", "/data/x.db"))
    assert "list" in closed and "/data/x.db" in closed
    assert "app.Thing" in str(SerializationError("app.Thing"))
    row = str(UndecodableRow("t1", "cp-9", "why"))
    assert "t1" in row and "cp-9" in row and "why" in row


def test_hierarchy() -> None:
    """Subclassing as docs/semantics.md §10 lays it out, with the stdlib bases callers catch."""
    for cls in (ThreadBusy, StaleClaim, TenantMismatch):
        assert issubclass(cls, ClaimError)
    assert issubclass(RunTimedOut, TimeoutError) and not issubclass(RunCancelled, ClaimError)
    for cls in (StoreBusy, StoreClosed, UnsupportedFormat, WrongThread, WrongProcess):
        assert issubclass(cls, StoreError)
    assert issubclass(SchemaTooOld, UnsupportedFormat)
    for cls in (
        ClaimError,
        CheckpointConflict,
        CheckpointNotFound,
        ReplayUnavailable,
        SerializationError,
        UndecodableRow,
        StoreError,
    ):
        assert issubclass(cls, FencedSqliteError)
    assert issubclass(FencedSqliteError, Exception)
    assert issubclass(CheckpointNotFound, LookupError)
    assert issubclass(SerializationError, ValueError)
    assert not issubclass(StaleClaim, StoreError) and not issubclass(StoreError, ClaimError)


def test_stale_claim_carries_the_write_ownership_marker() -> None:
    """`StaleClaim.is_stale_write_owner_error` is True (class and instance); others lack it."""
    assert StaleClaim.is_stale_write_owner_error is True
    assert StaleClaim("t", 1, 2).is_stale_write_owner_error is True
    assert pickle.loads(pickle.dumps(StaleClaim("t", 1, 2))).is_stale_write_owner_error is True
    for error, _, _ in EXAMPLES:
        if not isinstance(error, StaleClaim):
            assert getattr(error, "is_stale_write_owner_error", False) is False


def test_raised_errors_round_trip(open_store: Any) -> None:
    """Errors the store really raises (with chained causes) pickle with their fields."""
    store = open_store()
    claim = store.claim("t", "alice", 10)
    with pytest.raises(ThreadBusy) as busy:
        store.claim("t", "bob", 10)
    with pytest.raises(StaleClaim) as stale:
        store.renew("t", claim.token + 100, 10)
    with pytest.raises(CheckpointNotFound) as missing:
        store.history("t", before="nope")
    store.close()
    with pytest.raises(StoreClosed) as closed:
        store.stats()
    for info in (busy, stale, missing, closed):
        clone = pickle.loads(pickle.dumps(info.value))
        assert type(clone) is type(info.value) and clone.to_dict() == info.value.to_dict()
    assert busy.value.holder == "alice"
    assert (stale.value.token, stale.value.current_token) == (claim.token + 100, claim.token)


_UNPICKLE = textwrap.dedent(
    """
    import base64, json, pickle, sys
    errors = pickle.loads(base64.b64decode(sys.stdin.read()))
    print(json.dumps([[type(e).__module__, type(e).__name__, e.to_dict()] for e in errors]))
    """
)


@pytest.mark.slow
@pytest.mark.subprocess
def test_errors_cross_a_process_boundary() -> None:
    """Pickled errors load in a fresh interpreter as the same classes with the same fields."""
    import json

    errors = [e for e, _, _ in EXAMPLES]
    done = subprocess.run(
        [sys.executable, "-c", _UNPICKLE],
        input=base64.b64encode(pickle.dumps(errors)).decode(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got == [
        ["langgraph_fenced_sqlite", type(e).__name__, json.loads(json.dumps(e.to_dict()))]
        for e in errors
    ]


def test_invalid_argument_is_both_value_error_and_type_error() -> None:
    """Bad input is a ValueError (docs/semantics.md §10) that also reads as a TypeError."""
    with pytest.raises(ValueError) as as_value:
        lgfs.FencedSqliteSaver("unused.db", busy_timeout="soon")  # type: ignore[arg-type]
    assert isinstance(as_value.value, TypeError)
    assert isinstance(as_value.value, InvalidArgument)
    assert as_value.value.argument == "busy_timeout"
    assert str(as_value.value).startswith("busy_timeout:")
