"""Contract cases 19-25: the event log, waiting and subscribing.

Invariant: every case reaches stores through `env`, so it checks the sync
and the async API alike; waits are bounded (a broken promise fails the case,
it never hangs it), and real graphs, threads, tasks and processes stand in
for nothing.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..errors import CheckpointConflict, ReplayUnavailable, StaleClaim, ThreadBusy
from ._helpers import event_seqs as _seqs
from ._helpers import put_step as _put
from ._helpers import raises as _raises
from ._helpers import step_checkpoint as _checkpoint
from ._helpers import token_config as _conf
from .harness import AsyncFacade, ContractEnv, contract_case, raw

# Long enough that a wait that should have ended is a failure, not a slow pass.
_BOUND = 20.0


# --- helpers --------------------------------------------------------------------------


def _all_events(store: Any, thread_id: str, after: int = 0) -> list[Any]:
    out: list[Any] = []
    while True:
        page = store.events_after(thread_id, after, 100)
        out.extend(page)
        if len(page) < 100:
            return out
        after = page[-1].seq


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
