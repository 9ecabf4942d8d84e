"""No async method blocks the event loop on a lock or on I/O (docs/semantics.md §8, case 36).

Another connection holds the file's write lock while a sync write of the
store waits in busy, holding the store's lock. A ticker task must keep
ticking through the first async call of the store, `await_events` and
`awatch`: each used to take the store's lock on the loop thread and stall
it until the holder let go.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from support.configs import saver_config

from langgraph_fenced_sqlite import FencedSqliteSaver
from langgraph_fenced_sqlite.testing._helpers import longest_loop_stall

HOLD = 1.5  # how long the other connection holds the write lock
MAX_GAP = 0.2  # the loop may pause this long at most (the stall was HOLD)


async def _first_aput(store: FencedSqliteSaver) -> None:
    await store.aput(saver_config("async"), empty_checkpoint(), {"source": "update", "step": 0}, {})


async def _await_events(store: FencedSqliteSaver) -> None:
    await store.await_events("t", 0, timeout=0.3)


async def _awatch(store: FencedSqliteSaver) -> None:
    watch = store.awatch("t", 0)
    try:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(watch.__anext__(), 0.3)
    finally:
        await watch.aclose()


@pytest.mark.parametrize("call", [_first_aput, _await_events, _awatch], ids=lambda f: f.__name__)
async def test_the_loop_keeps_ticking_while_the_store_waits_for_the_lock(
    db_path: str, call: Any
) -> None:
    """The loop never pauses more than MAX_GAP while a sync write waits HOLD s in busy."""
    store = FencedSqliteSaver(db_path, busy_timeout=10.0)
    holder = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(HOLD, lambda: holder.execute("ROLLBACK"))
    sync_put = threading.Thread(
        target=store.put,
        args=(saver_config("sync"), empty_checkpoint(), {"source": "update", "step": 0}, {}),
    )
    try:
        sync_put.start()
        for _ in range(3000):  # until it holds the store's lock, waiting in busy
            if store._engine._lock.locked():
                break
            await asyncio.sleep(0.001)
        release.start()
        worst = await longest_loop_stall(lambda: call(store))
        assert 0 < worst < MAX_GAP, f"the loop stalled {worst:.2f}s"
    finally:
        release.join()
        sync_put.join(30)
        holder.close()
        store.close()
