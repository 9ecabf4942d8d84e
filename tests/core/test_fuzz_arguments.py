"""Argument fuzz: every public saver method either works or is InvalidArgument, file unchanged.

For each method, hypothesis draws arguments from a mix of good values and
wrong shapes (wrong types, empty/huge/NUL/surrogate strings, ints beyond 64
bits, non-finite floats, nested junk). Each call must either succeed (and a
write must read back as given) or raise `InvalidArgument` whose `argument`
names the parameter; a refused call leaves the db and -wal files byte for
byte unchanged.

Bounded for CI (`LGFS_FUZZ_EXAMPLES`, default 40 examples per method, a few
seconds each). For a longer run: `LGFS_FUZZ_EXAMPLES=2000 python -m pytest
tests/core/test_fuzz_arguments.py`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.base import empty_checkpoint
from support.files import read_bytes

from langgraph_fenced_sqlite import FencedSqliteSaver, InvalidArgument, ManualClock

EXAMPLES = int(os.environ.get("LGFS_FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)

junk_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**63, -(2**63) - 1, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(["", "\ud800", "a\x00b", "x" * 2000, "ü", "w"]),
    st.binary(max_size=4),
)
junk = st.recursive(
    junk_scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.one_of(st.text(max_size=4), st.integers(), st.just("\udc00")), inner, max_size=3
        ),
    ),
    max_leaves=6,
)
# Never the world's own thread "t": examples share one store, and must not disturb its claim.
BAD_TEXT = st.sampled_from(["", "\ud800", "x\udfffy", "a\x00b", "x" * 2000])
BAD_INTS = st.sampled_from([2**63, -(2**63) - 1, 10**400, -1, True, 1.5, "3"])
name = st.one_of(st.sampled_from(["u", "v", "ü-thread"]), BAD_TEXT, junk.filter(lambda v: v != "t"))
count = st.one_of(st.integers(min_value=0, max_value=50), BAD_INTS, junk)


@pytest.fixture
def world(db_path: str) -> Any:
    store = FencedSqliteSaver(db_path, clock=ManualClock())
    claim = store.claim("t", "alice", 60)
    cp = empty_checkpoint()
    config = store.put(claim.config(), cp, {"source": "input", "step": -1}, {})
    yield store, claim, claim.config(config)
    store.close()


def _files(path: str) -> tuple[bytes, bytes]:
    return read_bytes(path), read_bytes(path + "-wal")


def _check(path: str, call: Callable[[], Any], params: tuple[str, ...]) -> Any:
    before = _files(path)
    try:
        return call()
    except InvalidArgument as exc:
        assert any(exc.argument.startswith(p) for p in params), (exc.argument, params)
        assert _files(path) == before
        return exc


@FUZZ
@given(thread_id=name, holder=name, ttl=junk)
def test_claim_take_over(world: Any, db_path: str, thread_id: Any, holder: Any, ttl: Any) -> None:
    store, _, _ = world
    for method in (store.claim, store.take_over):
        got = _check(
            db_path, lambda m=method: m(thread_id, holder, ttl), ("thread_id", "holder", "ttl")
        )
        if not isinstance(got, Exception):
            assert (got.thread_id, got.holder) == (thread_id, holder)
            store.release(thread_id, got.token)


@FUZZ
@given(token=junk, ttl=junk)
def test_renew_release(world: Any, db_path: str, token: Any, ttl: Any) -> None:
    store, claim, _ = world
    for call in (lambda: store.renew("t", token, ttl), lambda: store.release("u", token)):
        try:
            _check(db_path, call, ("token", "ttl"))
        except Exception as exc:  # a well-formed token that is not the claim's
            assert type(exc).__name__ == "StaleClaim", exc


@FUZZ
@given(data=junk, kind=name)
def test_append_events_and_read_back(world: Any, db_path: str, data: Any, kind: Any) -> None:
    store, claim, _ = world
    events = [(kind, data)] if not isinstance(data, list) else data
    got = None
    try:
        got = _check(db_path, lambda: store.append_events("t", claim.token, events), ("events",))
    except Exception as exc:
        assert type(exc).__name__ == "SerializationError", exc  # a value JSON cannot hold
        return
    if isinstance(got, list) and got:
        read = store.events_after("t", got[0] - 1, len(got))
        assert [(e.kind, e.data) for e in read] == [
            (k, dict(d))
            for k, d in (
                e if isinstance(e, tuple) else (e["kind"], e.get("data", {})) for e in events
            )
        ]


@FUZZ
@given(after=count, limit=count, before=count)
def test_events_after_and_compact(
    world: Any, db_path: str, after: Any, limit: Any, before: Any
) -> None:
    store, _, _ = world
    _check(db_path, lambda: store.events_after("t", after, limit), ("after_seq", "limit"))
    _check(db_path, lambda: store.compact_events("u", before), ("before_seq",))


@FUZZ
@given(metadata=junk, extra=junk)
def test_put_and_read_back(world: Any, db_path: str, metadata: Any, extra: Any) -> None:
    store, claim, config = world
    cp = empty_checkpoint()
    md = (
        {"source": "fork", "step": 1, "x": metadata} if not isinstance(metadata, dict) else metadata
    )
    try:
        got = _check(
            db_path,
            lambda: store.put({**config, "metadata": extra}, cp, md, {}),
            ("config", "metadata", "checkpoint"),
        )
    except Exception as exc:
        assert type(exc).__name__ == "SerializationError", exc
        return
    if not isinstance(got, Exception):
        tup = store.get_tuple(got)
        assert tup is not None and tup.checkpoint["id"] == cp["id"]
        for key, value in md.items():
            # Pinned surprise: LangGraph's get_serializable_checkpoint_metadata
            # strips NUL from top-level string values before any saver sees
            # them (for PostgreSQL); hypothesis found "\x00" once in CI.
            if isinstance(value, str):
                value = value.replace("\x00", "")
            assert tup.metadata[key] == _as_json(value)  # type: ignore[literal-required]


def _as_json(value: Any) -> Any:
    import json

    return json.loads(json.dumps(value))


@FUZZ
@given(writes=junk, task_id=name)
def test_put_writes(world: Any, db_path: str, writes: Any, task_id: Any) -> None:
    store, _, config = world
    try:
        _check(db_path, lambda: store.put_writes(config, writes, task_id), ("writes", "task_id"))
    except Exception as exc:
        assert type(exc).__name__ == "SerializationError", exc


@FUZZ
@given(config=junk, filter=junk, before=junk, limit=count)
def test_list_and_get_tuple(
    world: Any, db_path: str, config: Any, filter: Any, before: Any, limit: Any
) -> None:
    store, _, _ = world
    _check(
        db_path,
        lambda: list(store.list(config, filter=filter, before=before, limit=limit)),
        ("config", "filter", "before", "limit"),
    )
    _check(db_path, lambda: store.get_tuple(config), ("config",))
    _check(db_path, lambda: store.pending_writes(config), ("config",))


@FUZZ
@given(thread_id=name, ns=name, before=name, limit=count)
def test_history(
    world: Any, db_path: str, thread_id: Any, ns: Any, before: Any, limit: Any
) -> None:
    store, _, _ = world
    try:
        _check(
            db_path,
            lambda: store.history(thread_id, checkpoint_ns=ns, before=before, limit=limit),
            ("thread_id", "checkpoint_ns", "before", "limit"),
        )
    except Exception as exc:
        assert type(exc).__name__ == "CheckpointNotFound", exc


@FUZZ
@given(ids=junk, other=name, token=junk, run_id=junk)
def test_removing_methods(
    world: Any, db_path: str, ids: Any, other: Any, token: Any, run_id: Any
) -> None:
    store, claim, _ = world
    calls = [
        (lambda: store.prune(ids), ("thread_ids",)),
        (lambda: store.delete_for_runs(ids), ("run_ids",)),
        (lambda: store.copy_thread("u", other), ("source_thread_id", "target_thread_id")),
        (lambda: store.retract_turn("u", token, run_id=run_id), ("thread_id", "token", "run_id")),
        (lambda: store.delete_thread(other if other != "t" else "u"), ("thread_id",)),
    ]
    for call, params in calls:
        try:
            _check(db_path, call, params)
        except Exception as exc:
            assert type(exc).__name__ in ("StaleClaim", "ThreadBusy"), exc


@FUZZ
@given(thread_id=name, operator=name, value=junk, seconds=junk)
def test_operator_methods(
    world: Any, db_path: str, thread_id: Any, operator: Any, value: Any, seconds: Any
) -> None:
    """The operator's calls: release, take over, status, filters, sweep, namespaces, vacuum."""
    from langgraph_fenced_sqlite import RetentionPolicy, ThreadBusy

    store, _, _ = world
    calls = [
        (lambda: store.force_release(thread_id, operator=operator), ("thread_id", "operator")),
        (
            lambda: store.take_over(thread_id, "ops", 60, operator=operator),
            ("thread_id", "operator"),
        ),
        (lambda: store.thread_status(thread_id), ("thread_id",)),
        (lambda: store.threads(status=value), ("status",)),
        (lambda: store.threads(inactive_for=seconds), ("inactive_for",)),
        (lambda: store.sweep(RetentionPolicy(), inactive_for=seconds), ("inactive_for",)),
        (lambda: store.sweep(value), ("policy",)),
        (lambda: RetentionPolicy(max_subgraph_runs=value), ("max_subgraph_runs",)),
        (lambda: store.resolve_namespace("t", value), ("checkpoint_ns",)),
        (lambda: store.vacuum(force=value), ("force",)),
    ]
    for call, params in calls:
        try:
            got = _check(db_path, call, params)
        except ThreadBusy as exc:  # vacuum, refused: alice holds "t"
            assert exc.thread_id == "t"
            continue
        if hasattr(got, "token") and getattr(got, "holder", None) == "ops":
            store.force_release(got.thread_id, operator="fuzz")


@FUZZ
@given(thread_id=name, ns=name, from_id=name, to_id=name)
def test_status_summary_and_diff(
    world: Any, db_path: str, thread_id: Any, ns: Any, from_id: Any, to_id: Any
) -> None:
    store, _, _ = world
    _check(db_path, lambda: store.thread_status(thread_id), ("thread_id",))
    _check(db_path, lambda: store.thread_summary(thread_id), ("thread_id",))
    for frm, to in ((from_id, None), (None, to_id)):
        try:
            _check(
                db_path,
                lambda f=frm, t=to: store.diff_checkpoints(
                    thread_id, checkpoint_ns=ns, from_id=f, to_id=t
                ),
                ("thread_id", "checkpoint_ns", "from_id", "to_id"),
            )
        except Exception as exc:
            assert type(exc).__name__ == "CheckpointNotFound", exc
