"""Many callers on one saver, and many processes on one file.

A store serialises its calls on one connection: any mix of threads and asyncio
tasks, sync and async methods, may call it at once. Several processes may
write one file at the default busy timeout without errors. Proven with real
threads, real tasks and real processes; every write must land, and every
thread's event seqs must be exactly 1..n.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
import threading
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from support.processes import run_together

from langgraph_fenced_sqlite import FencedSqliteSaver

WORKERS = 8
ROUNDS = 20


def _put_one(saver: Any, thread_id: str, step: int, who: str) -> dict[str, Any]:
    cp = empty_checkpoint()
    cp["channel_values"] = {"who": who, "step": step}
    return saver.put(
        {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}},
        cp,
        {"source": "loop", "step": step, "who": who},
        {},
    )


async def _aput_one(saver: Any, thread_id: str, step: int, who: str) -> dict[str, Any]:
    cp = empty_checkpoint()
    cp["channel_values"] = {"who": who, "step": step}
    return await saver.aput(
        {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}},
        cp,
        {"source": "loop", "step": step, "who": who},
        {},
    )


def _check_thread(
    saver: FencedSqliteSaver, thread_id: str, checkpoints: int, writes: int, commits: int
) -> None:
    """Check a thread's checkpoint and write counts, and that its seqs are 1..commits."""
    listed = list(saver.list({"configurable": {"thread_id": thread_id}}))
    assert len(listed) == checkpoints, (thread_id, len(listed))
    assert sum(len(t.pending_writes or []) for t in listed) == writes, thread_id
    seqs = [e.seq for e in saver.events_after(thread_id, 0, 100_000)]
    assert seqs == list(range(1, commits + 1)), (thread_id, seqs)


def _run_threads_and_tasks(sync_worker: Any, async_worker: Any, start: threading.Barrier) -> None:
    """Run WORKERS threads and WORKERS asyncio tasks at once, released by `start`."""

    async def all_tasks() -> None:
        await asyncio.to_thread(start.wait, 30)
        await asyncio.gather(*(async_worker(i) for i in range(WORKERS)))

    threads = [threading.Thread(target=sync_worker, args=(i,)) for i in range(WORKERS)]
    for t in threads:
        t.start()
    try:
        asyncio.run(asyncio.wait_for(all_tasks(), timeout=120))
    finally:
        for t in threads:
            t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"


def test_threads_and_tasks_mixing_sync_and_async_calls(store: FencedSqliteSaver) -> None:
    """8 threads and 8 asyncio tasks write own and shared threads at once; all lands, 1..n."""
    start = threading.Barrier(WORKERS + 1)
    errors: list[BaseException] = []

    def sync_worker(i: int) -> None:
        try:
            start.wait(timeout=30)
            for step in range(ROUNDS):
                own = _put_one(store, f"sync-{i}", step, f"sync-{i}")
                store.put_writes(own, [("c", step), ("d", "ü")], f"task-{step}")
                shared = _put_one(store, "shared", step, f"sync-{i}")
                store.put_writes(shared, [("c", i)], "task")
                # Reads interleave with other callers' writes.
                assert store.get_tuple(own) is not None
                assert next(iter(store.list(own, limit=1))) is not None
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    async def async_worker(i: int) -> None:
        for step in range(ROUNDS):
            own = await _aput_one(store, f"async-{i}", step, f"async-{i}")
            await store.aput_writes(own, [("c", step), ("d", "ü")], f"task-{step}")
            shared = await _aput_one(store, "shared", step, f"async-{i}")
            await store.aput_writes(shared, [("c", i)], "task")
            assert await store.aget_tuple(own) is not None
            assert [t async for t in store.alist(own, limit=1)]

    _run_threads_and_tasks(sync_worker, async_worker, start)
    assert errors == [], errors

    for kind in ("sync", "async"):
        for i in range(WORKERS):
            # ROUNDS puts and ROUNDS put_writes of 2 writes: one event per call.
            _check_thread(store, f"{kind}-{i}", ROUNDS, 2 * ROUNDS, 2 * ROUNDS)
    n = 2 * WORKERS * ROUNDS
    _check_thread(store, "shared", n, n, 2 * n)
    whos = {t.metadata["who"] for t in store.list({"configurable": {"thread_id": "shared"}})}
    assert whos == {f"{k}-{i}" for k in ("sync", "async") for i in range(WORKERS)}


def test_fenced_writes_from_threads_and_tasks_share_one_token(store: FencedSqliteSaver) -> None:
    """Fenced put_writes and append_events from threads and tasks at once: seqs contiguous."""
    parent = _put_one(store, "fenced", 0, "setup")  # seq 1, unfenced
    claim = store.claim("fenced", "runner", 600)
    parent = claim.config(parent)
    start = threading.Barrier(WORKERS + 1)
    errors: list[BaseException] = []

    def sync_worker(i: int) -> None:
        try:
            start.wait(timeout=30)
            for step in range(ROUNDS):
                seqs = store.append_events("fenced", claim.token, [("a", {}), ("b", {})])
                assert seqs[1] == seqs[0] + 1
                store.put_writes(parent, [("c", step)], f"sync-{i}-{step}")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    async def async_worker(i: int) -> None:
        for step in range(ROUNDS):
            seqs = await store.aappend_events("fenced", claim.token, [("a", {}), ("b", {})])
            assert seqs[1] == seqs[0] + 1
            await store.aput_writes(parent, [("c", step)], f"async-{i}-{step}")

    _run_threads_and_tasks(sync_worker, async_worker, start)
    assert errors == [], errors
    events = store.events_after("fenced", 0, 100_000)
    steps = 2 * WORKERS * ROUNDS  # each: one append of 2 events, one put_writes (1 event)
    assert [e.seq for e in events] == list(range(1, 2 + 3 * steps))
    assert {e.token for e in events[1:]} == {claim.token}
    got = store.get_tuple(parent)
    assert got is not None and len(got.pending_writes or []) == steps


_CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph_fenced_sqlite import FencedSqliteSaver

    path, flag, index, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    with FencedSqliteSaver(path) as saver:  # the default busy_timeout
        deadline = time.monotonic() + 60
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.001)
        config = {"configurable": {"thread_id": f"proc-{index}", "checkpoint_ns": ""}}
        for step in range(rounds):
            cp = empty_checkpoint()
            cp["channel_values"] = {"pid": os.getpid(), "step": step}
            config = saver.put(config, cp, {"source": "loop", "step": step}, {})
            saver.put_writes(config, [("c", step)], "task")
            claim = saver.claim(f"claim-{index}-{step}", f"proc-{index}", 60)
            saver.release(claim.thread_id, claim.token)
    print(json.dumps({"ok": True, "index": index}))
    """
)


@pytest.mark.slow
@pytest.mark.subprocess
def test_four_processes_write_one_file(tmp_path: Any) -> None:
    """4 real processes write different threads of one file at once, with no busy error."""
    path = str(tmp_path / "shared.db")
    flag = str(tmp_path / "go")
    rounds = 40
    FencedSqliteSaver(path).close()  # set the schema up once, like a deployment would
    results = run_together(
        [[sys.executable, "-c", _CHILD, path, flag, str(i), str(rounds)] for i in range(4)], flag
    )
    for returncode, out, err in results:
        assert returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1])["ok"] is True, (out, err)
    with FencedSqliteSaver(path) as saver:
        for i in range(4):
            _check_thread(saver, f"proc-{i}", rounds, rounds, 2 * rounds)
        stats = saver.stats()
        assert stats["checkpoints"] == 4 * rounds
        assert stats["writes"] == 4 * rounds
        assert stats["integrity"] == ["ok"]
        # Every claim got its own token: 4 * rounds claims, one counter.
        assert stats["token_counter"] == 4 * rounds


def _view(found: Any) -> tuple[Any, ...]:
    """What a reader relies on of a tuple: its id and its writes' values."""
    return (found.config["configurable"]["checkpoint_id"], [w[2] for w in found.pending_writes])


@pytest.mark.parametrize("read", ["get_tuple", "list"])
def test_a_read_sees_a_checkpoint_and_its_writes_from_one_snapshot(
    open_store: Any, read: str
) -> None:
    """Another connection commits in the middle of a read: the read shows the state
    before it or after it, never the checkpoint of one with the writes of the other.

    `get_tuple` and `list` are one SELECT each (no BEGIN/COMMIT around two
    statements): SQLite's progress handler runs the other store's commit
    while that statement is stepping. Two statements outside a transaction
    would return the first checkpoint with a write committed after it.
    """
    reader, writer = open_store(), open_store()
    root = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    first = _put_one(writer, "t", 1, "a")
    writer.put_writes(first, [("chan", "w1")], "task-1")
    before = _view(reader.get_tuple(root))
    fired: list[bool] = []

    def commit_meanwhile() -> int:
        if not fired:
            fired.append(True)
            # The first checkpoint gets another write, and a newer one is stored.
            writer.put_writes(first, [("chan", "w1b")], "task-2")
            second = _put_one(writer, "t", 2, "b")
            writer.put_writes(second, [("chan", "w2")], "task-3")
        return 0

    conn = reader._engine._conn
    conn.set_progress_handler(commit_meanwhile, 1)
    try:
        if read == "get_tuple":
            seen = _view(reader.get_tuple(root))
        else:
            seen = _view(list(reader.list(root, limit=1))[0])
    finally:
        conn.set_progress_handler(None, 1)
    assert fired, "the other commit did not run during the read"
    after = _view(reader.get_tuple(root))
    assert after != before and after[1] == ["w2"]
    assert seen in (before, after), (seen, before, after)
