"""The event log: what each write records, seq allocation, validation, waits.

The contract cases (19-25) cover the promises through both APIs; these add
real-graph runs, many connections, argument checks and pinned edge cases.
"""

from __future__ import annotations

import json
import operator
import threading
import uuid
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph
from support.puts import put

from langgraph_fenced_sqlite import (
    Event,
    FencedSqliteSaver,
    ManualClock,
    ReplayUnavailable,
    SerializationError,
    StaleClaim,
)

BOUND = 20.0


class State(TypedDict):
    """The secret graph's state."""

    log: Annotated[list[str], operator.add]
    secret: str


def secret_graph(saver: FencedSqliteSaver, secret: str) -> Any:
    """Two nodes that write `secret` into state on every step."""

    def a(state: State) -> dict[str, Any]:
        return {"log": [secret + "-a"], "secret": secret}

    def b(state: State) -> dict[str, Any]:
        return {"log": [secret + "-b"]}

    g = StateGraph(State)
    g.add_node("a", a)
    g.add_node("b", b)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    return g.compile(checkpointer=saver)


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_a_real_run_records_one_event_per_write_and_no_values(
    store: FencedSqliteSaver, durability: str
) -> None:
    """A real run records one event per checkpoint, with run id and step, and never a value."""
    secret = "secret-" + uuid.uuid4().hex
    graph = secret_graph(store, secret)
    claim = store.claim("t", "w", 60)
    run_id = str(uuid.uuid4())
    graph.invoke(
        {"log": [secret], "secret": secret},
        claim.config({"metadata": {"run_id": run_id}}),
        durability=durability,
    )
    events = store.events_after("t", 0, 1000)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    stored = {
        tup.config["configurable"]["checkpoint_id"]
        for tup in store.list({"configurable": {"thread_id": "t"}})
    }
    checkpoint_events = [e for e in events if e.kind == "checkpoint"]
    # Exactly one event per stored checkpoint, carrying the run id and step.
    assert sorted(e.checkpoint_id for e in checkpoint_events) == sorted(stored)
    assert all(e.data["run_id"] == run_id for e in checkpoint_events)
    assert all(isinstance(e.data["step"], int) for e in checkpoint_events)
    assert {e.kind for e in events} <= {"checkpoint", "writes"}
    for event in events:
        assert event.token == claim.token
        assert secret not in json.dumps(event.to_dict())
    if durability != "exit":  # exit mode stores no pending writes for this graph
        writes = [e for e in events if e.kind == "writes"]
        assert writes and all("log" in e.data["channels"] for e in writes)


def test_writes_may_precede_their_checkpoint(store: FencedSqliteSaver) -> None:
    """Writes that arrive before their checkpoint's put are recorded first."""
    # LangGraph sends a task's writes before the put of their checkpoint.
    cid = str(uuid.uuid4())
    cfg = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": cid}}
    store.put_writes(cfg, [("x", 1)], "task")
    cp = empty_checkpoint()
    cp["id"] = cid
    store.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, cp, {"source": "loop"}, {})
    events = store.events_after("t", 0, 10)
    assert [(e.seq, e.kind, e.checkpoint_id) for e in events] == [
        (1, "writes", cid),
        (2, "checkpoint", cid),
    ]


def test_retries_append_no_event(store: FencedSqliteSaver) -> None:
    """An identical put or put_writes retry appends no event."""
    # A retried put (identical) and a retried put_writes (same task, idx) are
    # no-ops; recording them again would make consumers see phantom commits.
    cp = empty_checkpoint()
    cfg = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    md = {"source": "input", "step": -1}
    store.put(cfg, cp, md, {})
    store.put(cfg, cp, md, {})
    wcfg = {"configurable": {**cfg["configurable"], "checkpoint_id": cp["id"]}}
    store.put_writes(wcfg, [("x", 1), ("y", 2)], "task")
    store.put_writes(wcfg, [("x", 1), ("y", 2)], "task")
    store.put_writes(wcfg, [], "task")
    assert [e.kind for e in store.events_after("t", 0, 10)] == ["checkpoint", "writes"]


def test_threads_have_their_own_seqs(store: FencedSqliteSaver) -> None:
    """Each thread numbers its events from 1."""
    claims = {t: store.claim(t, "w", 60) for t in ("t", "u")}
    assert store.append_events("t", claims["t"].token, [("e", {})] * 3) == [1, 2, 3]
    assert store.append_events("u", claims["u"].token, [("e", {})]) == [1]
    assert store.append_events("t", claims["t"].token, [("e", {})]) == [4]


def test_event_fields_and_clock(open_store: Any, clock: ManualClock) -> None:
    """An event carries its fields, JSON-ready, stamped by the store's clock."""
    store = open_store()
    claim = store.claim("t", "w", 60)
    clock.advance(12.5)
    store.append_events("t", claim.token, [{"kind": "note", "data": {"a": [1, "é"]}}])
    (event,) = store.events_after("t", 0, 10)
    assert isinstance(event, Event)
    assert event.ts == clock.now()  # the store's clock, not the wall clock
    assert event.to_dict() == {
        "thread_id": "t",
        "seq": 1,
        "kind": "note",
        "data": {"a": [1, "é"]},
        "checkpoint_ns": None,
        "checkpoint_id": None,
        "token": claim.token,
        "ts": clock.now(),
        "incarnation": 1,
    }
    assert json.loads(json.dumps(event.to_dict())) == event.to_dict()


def test_many_connections_share_one_gapless_sequence(open_store: Any) -> None:
    """Writers on four connections get one gapless sequence, each commit's seqs consecutive."""
    # Seqs come from the thread row inside BEGIN IMMEDIATE, so writers on
    # different connections cannot take the same seq or skip one.
    stores = [open_store() for _ in range(4)]
    token = stores[0].claim("t", "w", 600).token
    errors: list[BaseException] = []
    taken: list[list[int]] = []

    def run(saver: FencedSqliteSaver) -> None:
        try:
            for _ in range(30):
                taken.append(saver.append_events("t", token, [("e", {}), ("e", {}), ("e", {})]))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in stores]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors
    assert sorted(s for seqs in taken for s in seqs) == list(range(1, 361))
    assert all(seqs == [seqs[0], seqs[0] + 1, seqs[0] + 2] for seqs in taken)


@pytest.mark.parametrize(
    ("events", "error"),
    [
        ("kind", TypeError),
        ({"kind": "x"}, TypeError),
        ([("x",)], TypeError),
        ([42], TypeError),
        ([("", {})], ValueError),
        ([(None, {})], ValueError),
        ([("x" * 201, {})], ValueError),
        ([("x", [1, 2])], ValueError),
        ([("x", {"v": {1, 2}})], SerializationError),
        ([("x", {"v": b"bytes"})], SerializationError),
        ([("x", {"v": float("nan")})], SerializationError),
        ([("ok", {}), ("x", {"v": object()})], SerializationError),
    ],
)
def test_append_events_rejects_bad_events_before_writing(
    store: FencedSqliteSaver, events: Any, error: type[Exception]
) -> None:
    """Malformed caller events are refused, naming `events`, before any write."""
    claim = store.claim("t", "w", 60)
    with pytest.raises(error, match="events"):
        store.append_events("t", claim.token, events)
    assert store.events_after("t", 0, 10) == []
    assert store.append_events("t", claim.token, [("ok", {})]) == [1]


def test_append_events_is_always_fenced(store: FencedSqliteSaver) -> None:
    """append_events needs the current claim's token; an empty list spends no seq."""
    with pytest.raises(StaleClaim):  # no claim on the thread at all
        store.append_events("t", 1, [("e", {})])
    claim = store.claim("t", "w", 60)
    with pytest.raises(StaleClaim) as info:
        store.append_events("t", claim.token + 1, [("e", {})])
    assert (info.value.token, info.value.current_token) == (claim.token + 1, claim.token)
    assert store.append_events("t", claim.token, []) == []  # nothing to append, no seq
    assert store.append_events("t", claim.token, [("e", {})]) == [1]


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda s: s.events_after("", 0, 1), "thread_id"),
        (lambda s: s.events_after("t", -1, 1), "after_seq"),
        (lambda s: s.events_after("t", 0, 0), "limit"),
        (lambda s: s.events_after("t", "0", 1), "after_seq"),
        (lambda s: s.events_after("t", True, 1), "after_seq"),
        (lambda s: s.compact_events("t", 0), "before_seq"),
        (lambda s: s.compact_events("t\x00", 1), "thread_id"),
        (lambda s: s.append_events("t", "1", []), "token"),
        (lambda s: s.wait_events("t", 0, limit=0, timeout=1), "limit"),
        (lambda s: s.wait_events("t", 0, timeout=float("inf")), "timeout"),
    ],
)
def test_event_arguments_are_checked_and_named(
    store: FencedSqliteSaver, call: Any, name: str
) -> None:
    """Bad arguments to the event methods raise errors naming them."""
    with pytest.raises((TypeError, ValueError), match=name):
        call(store)


def test_compact_unknown_thread_creates_nothing(store: FencedSqliteSaver) -> None:
    """Compacting an unknown thread returns floor 1 and creates no thread."""
    assert store.compact_events("nope", 10) == 1
    assert store.threads() == []


async def test_async_twins_of_the_log(store: FencedSqliteSaver) -> None:
    """The async twins append, read, compact and wait like the sync ones."""
    claim = await store.aclaim("t", "w", 60)
    assert await store.aappend_events("t", claim.token, [("e", {}), ("e", {})]) == [1, 2]
    assert [e.seq for e in await store.aevents_after("t", 1, 10)] == [2]
    assert await store.acompact_events("t", 2) == 2
    assert [e.seq for e in await store.await_events("t", 1, timeout=BOUND)] == [2]


def test_a_deleted_thread_does_not_rewind_a_waiting_subscriber(store: FencedSqliteSaver) -> None:
    """A subscriber past seq n of a deleted thread is told, never shown seqs > n of the new one."""
    # After delete_thread the id's events restart at 1 in incarnation 2. A
    # subscriber that had reached seq 3 of incarnation 1 used to get seq 4 of
    # the new thread and silently skip its 1-3 (docs/semantics.md §5, case 31).
    claim = store.claim("t", "w", 60)
    store.append_events("t", claim.token, [("old", {})] * 3)
    last_old = store.events_after("t", 0, 10)[-1]
    assert (last_old.seq, last_old.incarnation) == (3, 1)
    store.delete_thread("t")
    fresh = store.claim("t", "w", 60)
    store.append_events("t", fresh.token, [("new", {"i": i}) for i in range(1, 5)])
    # A bare seq is a position in incarnation 1; the last Event, or the
    # incarnation spelled out, say the same. Each is refused, naming the new one.
    for call in (
        lambda: store.wait_events("t", 3, timeout=BOUND),
        lambda: store.wait_events("t", last_old, timeout=BOUND),
        lambda: store.events_after("t", 3, 10, incarnation=1),
        lambda: store.events_after("t", last_old),
    ):
        with pytest.raises(ReplayUnavailable) as info:
            call()
        assert (info.value.thread_id, info.value.incarnation, info.value.floor) == ("t", 2, 1)
    # Restarting from 0 in the incarnation the error names gives every event.
    new = store.events_after("t", 0, 10, incarnation=info.value.incarnation)
    assert [(e.seq, e.incarnation, e.data["i"]) for e in new] == [
        (1, 2, 1),
        (2, 2, 2),
        (3, 2, 3),
        (4, 2, 4),
    ]
    assert [e.seq for e in store.events_after("t", new[1])] == [3, 4]
    assert [e.seq for e in store.wait_events("t", new[2], timeout=BOUND)] == [4]


def test_a_deleted_thread_is_a_tombstone_not_a_thread(store: FencedSqliteSaver) -> None:
    """After delete_thread the id is not listed until it is used again; tokens keep rising."""
    claim = store.claim("t", "w", 60)
    store.append_events("t", claim.token, [("old", {})])
    store.delete_thread("t")
    store.delete_thread("never-there")  # an unknown thread: nothing happens
    assert [t["thread_id"] for t in store.threads()] == []
    assert store.events_after("t", 0, 10) == [] and store.current_claim("t") is None
    assert store.events_after("never-there", 0, 10) == []
    fresh = store.claim("t", "w", 60)
    assert fresh.token > claim.token
    store.append_events("t", fresh.token, [("new", {})])
    (summary,) = store.threads()
    assert (summary["thread_id"], summary["next_seq"], summary["floor"]) == ("t", 2, 1)
    (event,) = store.events_after("t", 0, 10)
    assert (event.seq, event.incarnation) == (1, 2)
    store.delete_thread("t")
    store.delete_thread("t")  # twice: still one incarnation further, not two
    again = store.claim("t", "w", 60)
    store.append_events("t", again.token, [("third", {})])
    assert store.events_after("t", 0, 10)[0].incarnation == 3


def test_compact_events_of_an_old_incarnation_changes_nothing(store: FencedSqliteSaver) -> None:
    """Compacting at a position of an earlier incarnation leaves the new one's events alone."""
    claim = store.claim("t", "w", 60)
    store.append_events("t", claim.token, [("old", {})] * 5)
    store.delete_thread("t")
    fresh = store.claim("t", "w", 60)
    store.append_events("t", fresh.token, [("new", {})] * 3)
    assert store.compact_events("t", 5, incarnation=1) == 1
    assert [e.seq for e in store.events_after("t", 0, 10)] == [1, 2, 3]
    assert store.compact_events("t", 3, incarnation=2) == 3
    with pytest.raises(ValueError, match="incarnation"):
        store.events_after("t", 0, incarnation=0)
    (first,) = store.events_after("t", 2, 1, incarnation=2)
    with pytest.raises(ValueError, match="incarnation"):
        store.events_after("t", first, incarnation=1)  # the event says 2
    with pytest.raises(ValueError, match="after_seq"):
        store.events_after("u", first)  # another thread's event


def test_token_key_in_config_fences_puts(store: FencedSqliteSaver) -> None:
    """A put whose config carries TOKEN_KEY is recorded with that token."""
    claim = store.claim("t", "w", 60)
    cid = put(store, "t", token=claim.token, random_id=True)
    (event,) = store.events_after("t", 0, 10)
    assert (event.checkpoint_id, event.token) == (cid, claim.token)


@pytest.mark.parametrize(
    ("source", "run_id", "channel"),
    [("loop", "r1", "chan"), ("bücle", "rün", "kanäl"), (1.5, "r", "c"), (None, None, "c")],
)
def test_put_and_write_events_store_the_text_dumps_json_gives(
    store: FencedSqliteSaver, source: Any, run_id: Any, channel: str
) -> None:
    """An event's stored text is `dumps_json`'s of its data, plain ASCII or not (the fast
    judgement of `PLAIN` that put and put_writes make agrees with `json_kind`)."""
    from langgraph_fenced_sqlite.core.stored_json import dumps_json

    config: dict[str, Any] = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    if run_id is not None:
        config["metadata"] = {"run_id": run_id}
    cp = empty_checkpoint()
    stored = store.put(config, cp, {"source": source, "step": 3, "parents": {}}, {})
    store.put_writes(stored, [(channel, 1), ("other", 2)], "task-ü")
    rows = store._engine._conn.execute("SELECT data FROM events ORDER BY seq").fetchall()
    # The event records the `source` column, which copies only a string (a
    # float stays in the metadata alone).
    recorded = source if isinstance(source, str) else None
    data = {"step": 3, "source": recorded, "parent_checkpoint_id": None}
    if run_id is not None:
        data["run_id"] = run_id
    writes = {"task_id": "task-ü", "task_path": "", "channels": [channel, "other"]}
    assert [r[0] for r in rows] == [dumps_json(data, "d"), dumps_json(writes, "d")]


# --- the event data every put and put_writes writes without encoding a dict ----------

_TEXTS = [
    None,
    "",
    "loop",
    "1ef00000-0000-6000-8000-000000000000",
    'a "quoted" id',
    "back\\slash",
    "tab\there",
    "new\nline",
    "del\x7f",
    "nul\x00",
    "caf\u00e9",
    "\U0001f600",
    "~ !#[]{}",
]


class _Str(str):
    def __format__(self, spec: str) -> str:
        return "formatted"


def test_checkpoint_event_text_is_the_dumps_json_of_its_dict() -> None:
    """The text written without a dict is exactly what `dumps_json` writes of it."""
    from enum import IntEnum

    from langgraph_fenced_sqlite.core.events import checkpoint_event_text
    from langgraph_fenced_sqlite.core.stored_json import dumps_json

    class Step(IntEnum):
        ONE = 1

    steps = [None, 0, -1, 7, 2**63 - 1, -(2**63), Step.ONE]
    for step in steps:
        for text in [*_TEXTS, _Str("sub")]:
            for source, parent, run_id in (
                (text, "p", None),
                ("loop", text, "r"),
                ("s", None, text),
            ):
                data: dict[str, Any] = {
                    "step": step,
                    "source": source,
                    "parent_checkpoint_id": parent,
                }
                if run_id is not None:
                    data["run_id"] = run_id
                assert checkpoint_event_text(step, source, parent, run_id) == dumps_json(
                    data, "event data"
                ), (step, source, parent, run_id)


def test_writes_event_text_is_the_dumps_json_of_its_dict() -> None:
    """As for puts: the task id, path and channel names, escaped or not."""
    from langgraph_fenced_sqlite.core.events import writes_event_text
    from langgraph_fenced_sqlite.core.stored_json import dumps_json

    names = [t for t in _TEXTS if t] + [_Str("sub")]
    for text in names:
        for task_id, path, channels in (
            (text, "", ["state"]),
            ("t", text, ["a", "b"]),
            ("t", "~p", [text]),
            ("t", "", ["a", text, "__pregel_tasks"]),
        ):
            data = {"task_id": task_id, "task_path": path, "channels": channels}
            assert writes_event_text(task_id, path, channels) == dumps_json(data, "event data"), (
                task_id,
                path,
                channels,
            )
