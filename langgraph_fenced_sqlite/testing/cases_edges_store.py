"""Contract cases 36-37: one deadline per call, a loop that never stalls, read-only stores.

Case 36 holds the file's write lock on a plain sqlite3 connection; case 37
opens a cleanly closed file with `readonly=True` in a directory whose write
permission was removed (a real read-only location for anyone but root; the
package's own tests also use a read-only mount).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from typing import Any

from ..errors import ReadOnlyStore, StoreBusy
from ._helpers import dump as _dump
from ._helpers import expect_error as _expect
from ._helpers import longest_loop_stall
from ._helpers import plain_config as _config
from ._helpers import put_chain as _put_chain
from ._helpers import values_checkpoint as _checkpoint
from .harness import ContractEnv, contract_case, raw

_BUSY = 0.5  # the stores' busy_timeout in case 36
_SLACK = 0.3  # how late a StoreBusy may come (scheduling), well under _BUSY


def _put(store: Any, thread_id: str) -> Any:
    return store.put(_config(thread_id), _checkpoint(), {"source": "update", "step": 0}, {})


@contract_case(36)
def case_a_queued_call_fails_by_its_own_deadline(env: ContractEnv) -> None:
    """A put queued behind a put waiting for the lock gives up busy_timeout after it was made."""
    store = env.open(busy_timeout=_BUSY)
    before = _dump(env.path)
    blocker = sqlite3.connect(env.path, isolation_level=None, timeout=0, check_same_thread=False)
    outcomes: dict[str, Any] = {}

    def attempt(name: str) -> None:
        started = time.monotonic()
        try:
            outcomes[name] = ("ok", _put(store, name), time.monotonic() - started)
        except StoreBusy as exc:
            outcomes[name] = ("busy", exc, time.monotonic() - started)

    try:
        blocker.execute("BEGIN IMMEDIATE")
        first = threading.Thread(target=attempt, args=("first",))
        first.start()
        time.sleep(0.1)  # the first now waits for the lock; queue behind it
        second = threading.Thread(target=attempt, args=("second",))
        second.start()
        first.join(30)
        second.join(30)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    for name in ("first", "second"):
        kind, exc, elapsed = outcomes[name]
        assert kind == "busy", outcomes
        assert exc.waited_s <= elapsed + 0.01, (exc.waited_s, elapsed)
        # Not later than its own deadline (waiting for the first one to give
        # up first would make it about 0.9 s).
        assert elapsed < _BUSY + _SLACK, (name, elapsed)
    assert _dump(env.path) == before  # neither changed anything, nor ran later
    _put(store, "after")
    assert store.get_tuple(_config("first")) is None
    assert store.get_tuple(_config("second")) is None


@contract_case(36)
def case_no_async_call_stalls_the_event_loop(env: ContractEnv) -> None:
    """While a sync write waits in busy, the loop keeps ticking through aput and await_events."""
    store = raw(env.open(busy_timeout=10.0))
    hold = 1.0
    blocker = sqlite3.connect(env.path, isolation_level=None, timeout=0, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")
    release = threading.Timer(hold, lambda: blocker.execute("ROLLBACK"))
    sync_put = threading.Thread(target=_put, args=(store, "sync"))
    try:
        sync_put.start()
        time.sleep(0.1)  # it now holds the store's lock, waiting for the file's
        release.start()

        async def work() -> None:
            await store.await_events("t", 0, timeout=0.2)
            await store.aput(_config("async"), _checkpoint(), {"source": "update", "step": 0}, {})

        worst = env.run_async(longest_loop_stall(work))
        assert worst < hold / 5, f"the event loop stalled {worst:.2f}s"
    finally:
        release.join()
        sync_put.join(30)
        blocker.close()
    assert store.get_tuple(_config("async")) is not None


@contract_case(37)
def case_readonly_store_reads_and_refuses_writes(env: ContractEnv) -> None:
    """`readonly=True` opens a cleanly closed file in a read-only directory; writes are refused."""
    writer = env.open()
    ids = _put_chain(writer, "t", 2)
    raw(writer).close()
    directory = os.path.dirname(env.path)
    files = sorted(os.listdir(directory))
    before = _dump(env.path)
    os.chmod(env.path, 0o444)
    os.chmod(directory, 0o555)
    try:
        store = env.open(readonly=True)
        found = store.get_tuple(_config("t"))
        assert found is not None and found.checkpoint["id"] == ids[-1]
        assert [e.seq for e in store.events_after("t", 0)] == [1, 2]
        for write in (
            lambda: _put(store, "u"),
            lambda: store.put_writes(_config("t", checkpoint_id=ids[-1]), [("c", 1)], "task"),
            lambda: store.claim("t", "alice", 10),
            lambda: store.delete_thread("t"),
        ):
            exc = _expect(write, ReadOnlyStore)
            assert "read-only" in str(exc) and env.path in str(exc), str(exc)
        raw(store).close()
    finally:
        os.chmod(directory, 0o755)
        os.chmod(env.path, 0o644)
    # Where the directory is really read-only no -wal or -shm can appear;
    # where it is not (root ignores modes) a reader may leave an empty -wal.
    wal = env.path + "-wal"
    assert not os.path.exists(wal) or os.path.getsize(wal) == 0
    name = os.path.basename(env.path)
    assert set(os.listdir(directory)) <= {*files, f"{name}-wal", f"{name}-shm"}
    assert _dump(env.path) == before
