"""Contract cases 19-28: the event log, retraction, retention and deletion.

Invariant: every case reaches stores through `env`, so it checks the sync
and the async API alike; waits are bounded (a broken promise fails the case,
it never hangs it), and real graphs, threads, tasks and processes stand in
for nothing.
"""

from __future__ import annotations

import asyncio
import json
import operator
import threading
import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.base import Checkpoint, empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from ..claims import TOKEN_KEY
from ..errors import CheckpointConflict, ReplayUnavailable, StaleClaim, ThreadBusy
from ..retention import PruneResult, RetentionPolicy
from .harness import AsyncFacade, ContractEnv, contract_case, raw

# Long enough that a wait that should have ended is a failure, not a slow pass.
_BOUND = 20.0


# --- helpers --------------------------------------------------------------------------


def _checkpoint(step: int, values: dict[str, Any] | None = None) -> Checkpoint:
    cp = empty_checkpoint()
    cp["id"] = str(uuid6(clock_seq=step))
    cp["channel_values"] = dict(values or {})
    cp["channel_versions"] = {k: 1 for k in cp["channel_values"]}
    return cp


def _conf(thread_id: str, cid: str | None, token: int | None, ns: str = "") -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
    if cid is not None:
        conf["checkpoint_id"] = cid
    if token is not None:
        conf[TOKEN_KEY] = token
    return {"configurable": conf}


def _put(
    store: Any,
    thread_id: str,
    parent: str | None,
    *,
    token: int | None = None,
    ns: str = "",
    source: str = "loop",
    step: int = 0,
    values: dict[str, Any] | None = None,
) -> str:
    cp = _checkpoint(step, values)
    metadata = {"source": source, "step": step, "parents": {}}
    store.put(_conf(thread_id, parent, token, ns), cp, metadata, {})
    return cp["id"]


def _chain(
    store: Any, thread_id: str, n: int, *, token: int | None = None, ns: str = ""
) -> list[str]:
    ids: list[str] = []
    for step in range(n):
        ids.append(_put(store, thread_id, ids[-1] if ids else None, token=token, ns=ns, step=step))
    return ids


def _raises(exc_type: type[BaseException], fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    try:
        fn(*args, **kw)
    except exc_type as exc:
        return exc
    raise AssertionError(f"{getattr(fn, '__name__', fn)} did not raise {exc_type.__name__}")


def _seqs(events: list[Any]) -> list[int]:
    return [e.seq for e in events]


def _all_events(store: Any, thread_id: str, after: int = 0) -> list[Any]:
    out: list[Any] = []
    while True:
        page = store.events_after(thread_id, after, 100)
        out.extend(page)
        if len(page) < 100:
            return out
        after = page[-1].seq


def _keys(store: Any, thread_id: str) -> dict[tuple[str, str], Any]:
    """Every checkpoint of a thread, all namespaces: key -> (parent, writes)."""
    out = {}
    for tup in store.list({"configurable": {"thread_id": thread_id}}):
        conf = tup.config["configurable"]
        parent = tup.parent_config["configurable"]["checkpoint_id"] if tup.parent_config else None
        out[(conf["checkpoint_ns"], conf["checkpoint_id"])] = (parent, tup.pending_writes)
    return out


class _Call:
    """Run a blocking call on a thread so the case can bound how long it may take."""

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.started = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None

        def run() -> None:
            self.started.set()
            try:
                self._result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - re-raised by result()
                self._error = exc

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def result(self, within: float = _BOUND) -> Any:
        self._thread.join(within)
        if self._thread.is_alive():
            raise AssertionError(f"call still blocked after {within}s")
        if self._error is not None:
            raise self._error
        return self._result


def _take(env: ContractEnv, store: Any, thread_id: str, after: int, n: int) -> list[Any]:
    """Subscribe from `after`, take `n` events and close the subscription.

    The sync API uses `watch` (closed from this thread if it stalls); the async
    API uses `awatch` under `asyncio.wait_for`.
    """
    saver = raw(store)
    if isinstance(store, AsyncFacade):

        async def consume() -> list[Any]:
            got: list[Any] = []
            async with saver.awatch(thread_id, after) as watch:
                async for event in watch:
                    got.append(event)
                    if len(got) == n:
                        break
                assert watch.last_seq == (got[-1].seq if got else after)
            return got

        async def bounded() -> list[Any]:
            return await asyncio.wait_for(consume(), _BOUND)

        return env.run_async(bounded())

    watch = saver.watch(thread_id, after)
    got: list[Any] = []

    def consume_sync() -> None:
        for event in watch:
            got.append(event)
            if len(got) == n:
                return

    call = _Call(consume_sync)
    try:
        call.result()
    except AssertionError:
        watch.close()
        raise AssertionError(f"watch delivered {_seqs(got)}, expected {n} events") from None
    finally:
        with watch:
            pass
    assert watch.last_seq == (got[-1].seq if got else after)
    return got


# --- 19-22: the log -------------------------------------------------------------------


@contract_case(19)
def case_each_write_appends_one_event_without_values(env: ContractEnv) -> None:
    """Each put and put_writes appends one event describing it, never channel values."""
    store = env.open()
    secret = "secret-" + uuid.uuid4().hex
    claim = store.claim("t", "w", 60)
    tok = claim.token
    c1 = _put(store, "t", None, token=tok, source="input", step=-1, values={"msg": secret})
    assert _seqs(store.events_after("t", 0, 100)) == [1]
    store.put_writes(
        _conf("t", c1, tok), [("msg", secret), ("notes", {"k": [secret]})], "task-1", "~path"
    )
    assert _seqs(store.events_after("t", 0, 100)) == [1, 2]
    c2 = _put(store, "t", c1, token=tok, step=0, values={"msg": secret})
    s1 = _put(store, "t", None, token=tok, ns="child:1", step=1, values={"x": secret})
    seqs = store.append_events("t", tok, [("note", {"text": "hi"}), {"kind": "tag", "data": {}}])
    assert seqs == [5, 6], seqs
    # An unfenced put on an unclaimed thread is an event too, with no token.
    c3 = _put(store, "u", None, source="input", step=-1, values={"msg": secret})

    events = store.events_after("t", 0, 100)
    assert _seqs(events) == [1, 2, 3, 4, 5, 6]
    assert [e.kind for e in events] == ["checkpoint", "writes", "checkpoint", "checkpoint"] + [
        "note",
        "tag",
    ]
    first, writes, second, child = events[:4]
    assert (first.checkpoint_ns, first.checkpoint_id) == ("", c1)
    assert (first.data["step"], first.data["source"]) == (-1, "input")
    assert (second.checkpoint_id, second.data["step"], second.data["source"]) == (c2, 0, "loop")
    assert second.data["parent_checkpoint_id"] == c1
    assert (child.checkpoint_ns, child.checkpoint_id) == ("child:1", s1)
    assert (writes.checkpoint_ns, writes.checkpoint_id) == ("", c1)
    assert writes.data["task_id"] == "task-1"
    assert writes.data["channels"] == ["msg", "notes"]
    assert events[4].data == {"text": "hi"} and events[5].data == {}
    assert all(e.token == tok for e in events) and all(e.thread_id == "t" for e in events)
    (other,) = store.events_after("u", 0, 100)
    assert (other.seq, other.kind, other.checkpoint_id, other.token) == (1, "checkpoint", c3, None)
    for event in [*events, other]:
        assert secret not in json.dumps(event.to_dict()), f"event {event.seq} leaks a value"


@contract_case(19)
def case_failed_writes_spend_no_seq(env: ContractEnv) -> None:
    """A refused put, put_writes or append_events appends nothing and spends no seq."""
    store = env.open()
    old = store.claim("t", "a", 10)
    c1 = _put(store, "t", None, token=old.token, source="input", step=-1)
    env.clock.advance(10)
    new = store.claim("t", "b", 10)
    _raises(StaleClaim, _put, store, "t", c1, token=old.token, step=0)
    _raises(StaleClaim, store.put_writes, _conf("t", c1, old.token), [("x", 1)], "task")
    _raises(StaleClaim, store.append_events, "t", old.token, [("note", {})])
    # Version: a fenced loop put whose parent is not the latest.
    _raises(CheckpointConflict, _put, store, "t", None, token=new.token, step=0)
    # Identity: a different checkpoint under a stored id.
    cp = _checkpoint(0, {"other": 1})
    cp["id"] = c1
    md = {"source": "update", "step": 0, "parents": {}}
    _raises(CheckpointConflict, store.put, _conf("t", None, new.token), cp, md, {})
    # Fence without a token: the live claim refuses it.
    _raises(ThreadBusy, _put, store, "t", c1, step=0)
    assert _seqs(store.events_after("t", 0, 100)) == [1]
    c2 = _put(store, "t", c1, token=new.token, step=0)
    store.put_writes(_conf("t", c2, new.token), [("x", 1)], "task")
    assert store.append_events("t", new.token, [("note", {})]) == [4]
    assert _seqs(store.events_after("t", 0, 100)) == [1, 2, 3, 4]


@contract_case(20)
def case_concurrent_commits_get_contiguous_seqs(env: ContractEnv) -> None:
    """8 threads x 25 commits of 2 events: seqs exactly 1..400, each commit's pair consecutive."""
    store = env.open()
    claim = store.claim("t", "w", 600)
    results: list[list[tuple[int, list[int]]]] = [[] for _ in range(8)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        try:
            barrier.wait(_BOUND)
            for j in range(25):
                pair = [("c", {"w": i, "j": j, "part": p}) for p in (0, 1)]
                results[i].append((j, store.append_events("t", claim.token, pair)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not any(th.is_alive() for th in threads), "a committer hung"
    assert not errors, errors
    everything = sorted(s for per in results for _, seqs in per for s in seqs)
    assert everything == list(range(1, 401))
    events = _all_events(store, "t")
    assert _seqs(events) == list(range(1, 401))
    for i, per in enumerate(results):
        assert len(per) == 25
        assert [seqs[0] for _, seqs in per] == sorted(seqs[0] for _, seqs in per)
        for j, (a, b) in per:
            assert b == a + 1, (a, b)
            assert events[a - 1].data == {"w": i, "j": j, "part": 0}
            assert events[b - 1].data == {"w": i, "j": j, "part": 1}


@contract_case(21)
def case_events_after_unknown_thread_is_empty(env: ContractEnv) -> None:
    """`events_after` on a thread never written returns []."""
    store = env.open()
    assert store.events_after("never-written", 0, 10) == []


@contract_case(21)
def case_events_after_pages_ascending(env: ContractEnv) -> None:
    """`events_after` pages ascending: after 0 limit 2 -> [1,2], after 4 -> [5]."""
    store = env.open()
    claim = store.claim("t", "w", 60)
    for i in range(5):
        store.append_events("t", claim.token, [("e", {"i": i + 1})])
    assert _seqs(store.events_after("t", 0, 2)) == [1, 2]
    assert _seqs(store.events_after("t", 2, 2)) == [3, 4]
    page = store.events_after("t", 4, 2)
    assert _seqs(page) == [5] and page[0].data == {"i": 5}
    assert store.events_after("t", 5, 2) == []
    assert store.events_after("t", 99, 2) == []


@contract_case(22)
def case_compact_events_raises_floor_only(env: ContractEnv) -> None:
    """compact_events(t, 4) makes seqs below 4 unavailable; it never lowers the floor."""
    store = env.open()
    claim = store.claim("t", "w", 60)
    for i in range(5):
        store.append_events("t", claim.token, [("e", {"i": i + 1})])
    assert store.compact_events("t", 4) == 4
    for after in (0, 2):
        exc = _raises(ReplayUnavailable, store.events_after, "t", after, 10)
        assert (exc.thread_id, exc.floor) == ("t", 4), exc.to_dict()
    assert _seqs(store.events_after("t", 3, 10)) == [4, 5]
    assert store.compact_events("t", 2) == 4
    assert _seqs(store.events_after("t", 3, 10)) == [4, 5]
    assert _raises(ReplayUnavailable, store.events_after, "t", 2, 10).floor == 4
    assert store.append_events("t", claim.token, [("e", {"i": 6})]) == [6]
    # The floor stops at the next seq: compacting "everything" keeps seqs going.
    assert store.compact_events("t", 1000) == 7
    assert store.events_after("t", 6, 10) == []
    assert store.append_events("t", claim.token, [("e", {"i": 7})]) == [7]
    assert _seqs(store.events_after("t", 6, 10)) == [7]


# --- 23-25: waiting and subscribing ---------------------------------------------------


@contract_case(23)
def case_wait_events_returns_at_once_or_empty_after_timeout(env: ContractEnv) -> None:
    """wait_events returns existing events without waiting, and [] when none land."""
    store = env.open()
    claim = store.claim("t", "w", 60)
    store.append_events("t", claim.token, [("e", {}), ("e", {})])
    # A wait that would last an hour must come back at once: events are there.
    got = _Call(store.wait_events, "t", 0, timeout=3600).result()
    assert _seqs(got) == [1, 2]
    assert _seqs(_Call(store.wait_events, "t", 1, limit=1, timeout=3600).result()) == [2]
    assert _Call(store.wait_events, "t", 2, timeout=0.2).result() == []
    assert _Call(store.wait_events, "unknown", 0, timeout=0.2).result() == []


@contract_case(23, needs=("sibling",))
def case_wait_events_wakes_for_sibling_commit(env: ContractEnv) -> None:
    """A wait returns a commit made meanwhile through a sibling store on the file."""
    store = env.open()
    sibling = env.open()
    claim = store.claim("t", "w", 60)
    store.append_events("t", claim.token, [("e", {})])
    waiter = _Call(store.wait_events, "t", 1, timeout=3600)
    waiter.started.wait(_BOUND)
    time.sleep(0.2)  # let it reach its poll loop: the commit must wake it
    seqs = sibling.append_events("t", claim.token, [("late", {"n": 1})])
    got = waiter.result()
    assert _seqs(got) == seqs == [2] and got[0].kind == "late"
    # A new thread (no row yet when the wait starts) wakes the same way.
    waiter = _Call(store.wait_events, "fresh", 0, timeout=3600)
    waiter.started.wait(_BOUND)
    time.sleep(0.2)
    _put(sibling, "fresh", None, source="input", step=-1)
    assert _seqs(waiter.result()) == [1]


@contract_case(23, needs=("processes",))
def case_wait_events_wakes_for_other_process_commit(env: ContractEnv) -> None:
    """A wait returns a commit made meanwhile by another process."""
    from .child_events import run_child

    store = env.open()
    claim = store.claim("t", "w", 60)
    waiter = _Call(store.wait_events, "t", 0, timeout=3600)
    waiter.started.wait(_BOUND)
    lines = run_child(
        "append", path=env.path, thread_id="t", token=claim.token, count=1, kind="remote"
    )
    assert lines[-1]["seqs"] == [1], lines
    got = waiter.result()
    assert _seqs(got) == [1] and got[0].kind == "remote"


@contract_case(24)
def case_cancelled_wait_and_closed_watch_end_promptly(env: ContractEnv) -> None:
    """Cancelling an await_events task or closing a sync watch ends it; the store works on."""
    store = env.open()
    saver = raw(store)
    claim = store.claim("t", "w", 60)
    store.append_events("t", claim.token, [("e", {})])

    async def cancel_wait() -> None:
        task = asyncio.ensure_future(saver.await_events("t", 1, timeout=3600))
        await asyncio.sleep(0.2)
        assert not task.done(), "await_events returned with nothing to return"
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=_BOUND)
        assert done, "a cancelled await_events kept waiting"
        assert task.cancelled()

    env.run_async(cancel_wait())

    watch = saver.watch("t", 1)
    seen: list[Any] = []
    consumer = _Call(lambda: seen.extend(watch))
    consumer.started.wait(_BOUND)
    time.sleep(0.2)
    watch.close()
    consumer.result()  # ended, within the bound
    assert seen == []

    assert store.append_events("t", claim.token, [("after", {})]) == [2]
    assert _seqs(store.events_after("t", 1, 10)) == [2]
    cid = _put(store, "t", None, token=claim.token, source="input", step=-1)
    assert store.get_tuple(_conf("t", None, None)).config["configurable"]["checkpoint_id"] == cid
    assert _seqs(_Call(store.wait_events, "t", 1, timeout=3600).result()) == [2, 3]


@contract_case(25, needs=("reopen",))
def case_resubscribe_after_restart_sees_exactly_the_rest(env: ContractEnv) -> None:
    """A subscriber that stops at seq n and resumes after a restart sees exactly the rest."""
    store = env.open()
    claim = store.claim("t", "w", 600)
    for i in range(1, 6):
        store.append_events("t", claim.token, [("e", {"i": i})])
    first = _take(env, store, "t", 0, 3)
    assert _seqs(first) == [1, 2, 3]
    n = first[-1].seq
    for i in range(6, 8):  # committed before the restart...
        store.append_events("t", claim.token, [("e", {"i": i})])
    store = env.reopen(store)
    for i in range(8, 10):  # ...and after it
        store.append_events("t", claim.token, [("e", {"i": i})])
    rest = _take(env, store, "t", n, 6)
    assert _seqs(rest) == [4, 5, 6, 7, 8, 9]
    assert [e.data["i"] for e in rest] == [4, 5, 6, 7, 8, 9]
    assert _Call(store.wait_events, "t", 9, timeout=0.2).result() == []


# --- 26: retraction, with real graphs -------------------------------------------------


class _State(TypedDict):
    log: Annotated[list[str], operator.add]


def _graph(saver: Any) -> Any:
    """A root graph with a subgraph node, so runs write more than one namespace."""

    def inner(state: _State) -> dict[str, Any]:
        return {"log": [f"inner{len(state['log'])}"]}

    sub = StateGraph(_State)
    sub.add_node("inner", inner)
    sub.add_edge(START, "inner")
    sub.add_edge("inner", END)

    def first(state: _State) -> dict[str, Any]:
        return {"log": [f"first{len(state['log'])}"]}

    root = StateGraph(_State)
    root.add_node("first", first)
    root.add_node("sub", sub.compile())
    root.add_edge(START, "first")
    root.add_edge("first", "sub")
    root.add_edge("sub", END)
    return root.compile(checkpointer=saver)


def _invoke(
    env: ContractEnv, store: Any, graph: Any, text: str, config: Any, durability: str
) -> Any:
    inputs = {"log": [text]}
    if isinstance(store, AsyncFacade):
        return env.run_async(graph.ainvoke(inputs, config, durability=durability))
    return graph.invoke(inputs, config, durability=durability)


def _run_config(claim: Any, run_id: str | None) -> Any:
    return claim.config({"metadata": {"run_id": run_id}} if run_id else None)


def _check_retract_turn(env: ContractEnv, durability: str, use_run_ids: bool) -> None:
    store = env.open()
    graph = _graph(raw(store))
    thread_id = f"t-{durability}-{use_run_ids}"
    claim = store.claim(thread_id, "w", 600)
    runs = [str(uuid.uuid4()) if use_run_ids else None for _ in range(2)]
    _invoke(env, store, graph, "one", _run_config(claim, runs[0]), durability)
    before = _keys(store, thread_id)
    latest_before = store.get_tuple({"configurable": {"thread_id": thread_id}})
    values_before = graph.get_state({"configurable": {"thread_id": thread_id}}).values
    events_before = store.events_after(thread_id, 0, 1000)
    _invoke(env, store, graph, "two", _run_config(claim, runs[1]), durability)
    during = _keys(store, thread_id)
    assert len(during) > len(before), "the second turn stored no checkpoint"
    if durability != "exit":
        assert {ns for ns, _ in during} - {ns for ns, _ in before}, "no subgraph namespace"

    done = store.retract_turn(thread_id, claim.token)
    assert done.run_id == runs[1]
    assert set(done.checkpoints) == set(during) - set(before)
    assert _keys(store, thread_id) == before, f"{durability}: history not as before the turn"
    latest = store.get_tuple({"configurable": {"thread_id": thread_id}})
    assert latest.config == latest_before.config and latest.checkpoint == latest_before.checkpoint
    assert graph.get_state({"configurable": {"thread_id": thread_id}}).values == values_before
    events = store.events_after(thread_id, 0, 1000)
    assert events[: len(events_before)] == events_before, "retraction removed older events"
    assert events[-1].kind == "retracted" and events[-1].seq == done.seq
    assert events[-1].data["run_id"] == runs[1]
    assert sorted(map(tuple, events[-1].data["checkpoints"])) == sorted(done.checkpoints)
    # The thread goes on from the restored state.
    out = _invoke(env, store, graph, "three", _run_config(claim, None), durability)
    assert out["log"][: len(values_before["log"]) + 1] == [*values_before["log"], "three"]


@contract_case(26)
def case_retract_turn_with_run_ids_restores_state(env: ContractEnv) -> None:
    """retract_turn removes the last run, all namespaces, with durability sync, async, exit."""
    for durability in ("sync", "async", "exit"):
        _check_retract_turn(env, durability, use_run_ids=True)


@contract_case(26)
def case_retract_turn_without_run_ids_uses_input_checkpoint(env: ContractEnv) -> None:
    """Without run ids, retract_turn removes everything from the newest input checkpoint."""
    for durability in ("sync", "async"):
        _check_retract_turn(env, durability, use_run_ids=False)


@contract_case(26)
def case_retract_turn_by_run_id_removes_that_run_only(env: ContractEnv) -> None:
    """retract_turn(run_id=r) removes the checkpoints and writes of run r and nothing else."""
    store = env.open()
    graph = _graph(raw(store))
    claim = store.claim("t", "w", 600)
    runs = [str(uuid.uuid4()) for _ in range(3)]
    owner: dict[tuple[str, str], str] = {}
    for i, run in enumerate(runs):
        known = set(_keys(store, "t"))
        _invoke(env, store, graph, f"turn{i}", _run_config(claim, run), "sync")
        owner.update({k: run for k in _keys(store, "t") if k not in known})
    before = _keys(store, "t")
    done = store.retract_turn("t", claim.token, run_id=runs[1])
    assert done.run_id == runs[1]
    mine = {k for k, run in owner.items() if run == runs[1]}
    assert set(done.checkpoints) == mine and mine
    after = _keys(store, "t")
    assert set(after) == set(before) - mine
    for key, (parent, writes) in after.items():
        assert (parent, writes) == before[key], f"{key} changed"
    # Unknown run: nothing to remove, nothing changes, no event.
    seq_before = store.events_after("t", 0, 1000)[-1].seq
    nothing = store.retract_turn("t", claim.token, run_id="no-such-run")
    assert (nothing.checkpoints, nothing.writes, nothing.seq) == ([], 0, None)
    assert store.events_after("t", seq_before, 10) == []


def _review_graph(saver: Any) -> Any:
    def review(state: _State) -> dict[str, Any]:
        return {"log": [f"review:{interrupt('verdict?')}"]}

    g = StateGraph(_State)
    g.add_node("review", review)
    g.add_edge(START, "review")
    g.add_edge("review", END)
    return g.compile(checkpointer=saver)


@contract_case(26)
def case_retract_turn_removes_a_runs_writes_on_older_checkpoints(env: ContractEnv) -> None:
    """A resume's writes land on the interrupted run's checkpoint; retracting it removes them."""
    store = env.open()
    graph = _review_graph(raw(store))
    claim = store.claim("t", "w", 600)
    first = _run_config(claim, str(uuid.uuid4()))
    if isinstance(store, AsyncFacade):
        env.run_async(graph.ainvoke({"log": ["x"]}, first, durability="sync"))
    else:
        graph.invoke({"log": ["x"]}, first, durability="sync")
    waiting = _keys(store, "t")
    resume = str(uuid.uuid4())
    command: Command[Any] = Command(resume="no")
    config = _run_config(claim, resume)
    if isinstance(store, AsyncFacade):
        env.run_async(graph.ainvoke(command, config, durability="sync"))
    else:
        graph.invoke(command, config, durability="sync")
    assert store.retract_turn("t", claim.token).run_id == resume
    assert _keys(store, "t") == waiting, "the resume's writes outlived it"
    assert graph.get_state({"configurable": {"thread_id": "t"}}).next == ("review",)


@contract_case(26)
def case_retract_turn_with_stale_token_changes_nothing(env: ContractEnv) -> None:
    """A stale token is refused before anything else, and nothing changes."""
    store = env.open()
    graph = _graph(raw(store))
    old = store.claim("t", "w", 600)
    run = str(uuid.uuid4())
    _invoke(env, store, graph, "one", _run_config(old, run), "sync")
    store.take_over("t", "x", 600)
    before = _keys(store, "t")
    events = store.events_after("t", 0, 1000)
    for run_id in (None, run, "no-such-run"):
        exc = _raises(StaleClaim, store.retract_turn, "t", old.token, run_id=run_id)
        assert exc.token == old.token
    assert _keys(store, "t") == before
    assert store.events_after("t", 0, 1000) == events


# --- 27: retention --------------------------------------------------------------------


@contract_case(27)
def case_prune_by_count_keeps_newest_and_latest_per_namespace(env: ContractEnv) -> None:
    """max_checkpoints keeps the newest n and each namespace's latest; the floor moves up."""
    store = env.open()
    root: list[str] = []
    child: list[str] = []
    for step in range(6):  # root and child interleave: r0 c0 r1 c1 r2 r3 r4 r5
        root.append(_put(store, "t", root[-1] if root else None, step=step))
        store.put_writes(_conf("t", root[-1], None), [("w", step)], f"task{step}")
        if step < 2:
            child.append(_put(store, "t", child[-1] if child else None, ns="child:1", step=step))
    kept = {("", cid) for cid in root[-3:]} | {("child:1", child[-1])}
    before = _keys(store, "t")
    events_before = store.events_after("t", 0, 1000)
    # A generous max_events must not hold the floor below what removal reached.
    (result,) = store.prune(["t"], strategy=RetentionPolicy(max_checkpoints=3, max_events=1000))
    assert isinstance(result, PruneResult) and result.thread_id == "t"
    after = _keys(store, "t")
    assert set(after) == kept
    assert set(result.checkpoints) == set(before) - kept
    for key in kept:
        assert after[key] == before[key], "a kept checkpoint lost its writes"
    gone = _conf("t", root[0], None)
    assert store.get_tuple(gone) is None
    # Events go with their checkpoints: the floor is the first event of a kept one.
    first_kept = min(e.seq for e in events_before if (e.checkpoint_ns, e.checkpoint_id) in kept)
    assert result.floor == first_kept > 1
    assert result.events_removed == first_kept - 1
    assert _raises(ReplayUnavailable, store.events_after, "t", 0, 10).floor == first_kept
    remaining = store.events_after("t", first_kept - 1, 1000)
    assert remaining == [e for e in events_before if e.seq >= first_kept]
    # A second prune with the same policy removes nothing and keeps the floor.
    (again,) = store.prune(["t"], strategy=RetentionPolicy(max_checkpoints=3))
    assert (again.checkpoints, again.floor, again.events_removed) == ([], first_kept, 0)


@contract_case(27)
def case_prune_by_age_uses_store_clock_and_keeps_latest(env: ContractEnv) -> None:
    """max_age counts on the store's clock and never removes a namespace's latest."""
    store = env.open()
    ids: list[str] = []
    for step in range(3):
        ids.append(_put(store, "t", ids[-1] if ids else None, step=step))
        env.clock.advance(100)
    # now = start + 300: ids[0] is 300 s old, ids[1] 200 s, ids[2] 100 s.
    (result,) = store.prune(["t"], strategy=RetentionPolicy(max_age=250))
    assert result.checkpoints == [("", ids[0])]
    assert set(_keys(store, "t")) == {("", ids[1]), ("", ids[2])}
    env.clock.advance(10_000)  # everything is old now, but the latest stays
    (result,) = store.prune(["t"], strategy=RetentionPolicy(max_age=1))
    assert result.checkpoints == [("", ids[1])]
    assert set(_keys(store, "t")) == {("", ids[2])}


@contract_case(27)
def case_prune_by_event_count_never_lowers_floor(env: ContractEnv) -> None:
    """max_events raises the floor to keep the newest n events, never lowering it."""
    store = env.open()
    claim = store.claim("t", "w", 60)
    for i in range(10):
        store.append_events("t", claim.token, [("e", {"i": i})])
    (result,) = store.prune(["t"], strategy=RetentionPolicy(max_events=4))
    assert (result.floor, result.events_removed, result.checkpoints) == (7, 6, [])
    assert _seqs(store.events_after("t", 6, 100)) == [7, 8, 9, 10]
    assert store.compact_events("t", 9) == 9
    (result,) = store.prune(["t"], strategy=RetentionPolicy(max_events=100))
    assert (result.floor, result.events_removed) == (9, 0)
    assert _raises(ReplayUnavailable, store.events_after, "t", 7, 10).floor == 9
    assert store.append_events("t", claim.token, [("e", {})]) == [11]


@contract_case(27)
def case_prune_unknown_thread_is_no_error(env: ContractEnv) -> None:
    """Pruning a thread that does not exist reports nothing removed and creates nothing."""
    store = env.open()
    for strategy in ("keep_latest", RetentionPolicy(max_checkpoints=1, max_events=1)):
        (result,) = store.prune(["nope"], strategy=strategy)
        assert (result.thread_id, result.checkpoints, result.floor) == ("nope", [], 1)
    store.prune(["nope"], strategy="delete")
    assert store.prune([], strategy="keep_latest") == []
    assert store.events_after("nope", 0, 10) == []
    assert [t["thread_id"] for t in store.threads()] == []


# --- 28: deletion ---------------------------------------------------------------------


@contract_case(28)
def case_delete_thread_removes_that_thread_only(env: ContractEnv) -> None:
    """delete_thread removes one thread's history, events, floor and claim; tokens go on up."""
    store = env.open()
    claims = {t: store.claim(t, "w", 600) for t in ("t", "u")}
    for t in ("t", "u"):
        ids = _chain(store, t, 3, token=claims[t].token)
        store.put_writes(_conf(t, ids[-1], claims[t].token), [("x", 1)], "task")
        store.append_events(t, claims[t].token, [("e", {}), ("e", {})])
    store.compact_events("t", 3)
    other = (_keys(store, "u"), store.events_after("u", 0, 100), store.current_claim("u"))

    store.delete_thread("t")
    assert _keys(store, "t") == {}
    assert store.get_tuple({"configurable": {"thread_id": "t"}}) is None
    assert store.events_after("t", 0, 10) == []  # no floor left to be below
    assert store.current_claim("t") is None
    assert (_keys(store, "u"), store.events_after("u", 0, 100), store.current_claim("u")) == other
    old = claims["t"].token
    _raises(StaleClaim, _put, store, "t", None, token=old, source="input", step=-1)
    _raises(StaleClaim, store.append_events, "t", old, [("e", {})])
    fresh = store.claim("t", "w2", 600)
    assert fresh.token > max(c.token for c in claims.values())
    assert store.append_events("t", fresh.token, [("e", {})]) == [1]
    _put(store, "t", None, token=fresh.token, source="input", step=-1)
    assert _seqs(store.events_after("t", 0, 10)) == [1, 2]
    store.delete_thread("never-existed")  # no error
