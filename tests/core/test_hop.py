"""`hop.Hop`: the worker threads every async call of either store runs on.

What async callers rely on: the call's result or error comes back to their
loop; a call cancelled while still queued never runs (one already running
finishes: it may commit); threads are made only when none is idle; close()
never waits and lets queued calls run; at interpreter exit a call in
progress finishes rather than being cut off (a real process).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from langgraph_fenced_sqlite import FencedSqliteSaver, StoreClosed
from langgraph_fenced_sqlite.core.hop import Hop, HopClosed, on_worker

BOUND = 10.0


def test_a_call_returns_its_result_or_raises_its_error_on_the_callers_loop() -> None:
    hop = Hop(4, "t")

    def boom() -> None:
        raise KeyError("k")

    async def main() -> tuple[Any, Any]:
        me = threading.get_ident()
        where = await hop.run(threading.get_ident)
        with pytest.raises(KeyError, match="k"):
            await hop.run(boom)
        return where, me

    where, me = asyncio.run(main())
    assert where != me  # it ran on a worker, not on the loop's thread
    hop.close()


def test_on_worker_tells_a_hop_worker_from_any_other_thread() -> None:
    """The group commit lets more async callers' writes wait on this (`MAX_WAITING_ASYNC`)."""
    hop = Hop(4, "t")
    elsewhere: list[bool] = []
    other = threading.Thread(target=lambda: elsewhere.append(on_worker()))
    other.start()
    other.join()

    async def main() -> bool:
        return await hop.run(on_worker)

    assert asyncio.run(main()) is True
    assert on_worker() is False and elsewhere == [False]
    hop.close()


def test_sequential_calls_reuse_one_thread_and_concurrent_ones_get_their_own() -> None:
    hop = Hop(3, "t")
    gate = threading.Event()

    async def main() -> tuple[set[int], set[int]]:
        one = {await hop.run(threading.get_ident) for _ in range(20)}

        def held() -> int:
            gate.wait(BOUND)
            return threading.get_ident()

        calls = [asyncio.ensure_future(hop.run(held)) for _ in range(5)]
        await asyncio.sleep(0.2)
        gate.set()
        return one, set(await asyncio.gather(*calls))

    one, many = asyncio.run(main())
    assert len(one) == 1
    assert len(many) == 3  # the limit: the other two queued, then ran on those
    assert len(hop._threads) == 3
    hop.close()


def test_a_call_cancelled_while_queued_never_runs_and_a_running_one_finishes() -> None:
    hop = Hop(1, "t")
    started, gate = threading.Event(), threading.Event()
    ran: list[str] = []

    def first() -> None:
        started.set()
        gate.wait(BOUND)
        ran.append("first")

    async def main() -> None:
        running = asyncio.ensure_future(hop.run(first))
        queued = asyncio.ensure_future(hop.run(lambda: ran.append("queued")))
        await asyncio.to_thread(started.wait, BOUND)
        running.cancel()
        queued.cancel()
        gate.set()
        for task in (running, queued):
            with pytest.raises(asyncio.CancelledError):
                await task
        assert await hop.run(lambda: "after") == "after"

    asyncio.run(main())
    assert ran == ["first"]
    hop.close()


def test_close_never_waits_lets_queued_calls_run_and_refuses_new_ones() -> None:
    hop = Hop(1, "t")
    gate = threading.Event()
    ran: list[int] = []

    async def main() -> None:
        calls = [
            asyncio.ensure_future(hop.run(lambda i=i: (gate.wait(BOUND), ran.append(i))))
            for i in range(3)
        ]
        await asyncio.sleep(0.1)
        began = time.monotonic()
        hop.close()
        assert time.monotonic() - began < 0.5  # did not wait for the held call
        with pytest.raises(HopClosed):
            await hop.run(lambda: None)
        gate.set()
        await asyncio.gather(*calls)

    asyncio.run(main())
    assert ran == [0, 1, 2]
    for thread in hop._threads:
        thread.join(BOUND)
        assert not thread.is_alive()


def test_an_outcome_for_a_closed_loop_is_dropped_and_the_worker_goes_on() -> None:
    hop = Hop(1, "t")
    gate, done = threading.Event(), threading.Event()

    def slow() -> int:
        gate.wait(BOUND)
        done.set()
        return 1

    loop = asyncio.new_event_loop()
    loop.run_until_complete(asyncio.sleep(0))
    task = loop.create_task(hop.run(slow))
    loop.run_until_complete(asyncio.sleep(0.05))
    task.cancel()
    loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
    loop.close()
    gate.set()
    assert done.wait(BOUND)
    assert asyncio.run(hop.run(lambda: 2)) == 2  # the same worker, still serving
    hop.close()


def test_a_hop_dropped_unclosed_lets_its_workers_exit() -> None:
    """A store dropped without close() must not leave its threads behind for good."""
    import gc

    hop = Hop(2, "t")
    asyncio.run(hop.run(lambda: None))
    threads = list(hop._threads)
    assert threads and all(t.is_alive() for t in threads)
    del hop
    gc.collect()
    for thread in threads:
        thread.join(BOUND)
        assert not thread.is_alive()


def test_an_async_call_after_close_is_store_closed(db_path: str) -> None:
    saver = FencedSqliteSaver(db_path)
    saver.close()
    with pytest.raises(StoreClosed):
        asyncio.run(saver.aget_tuple({"configurable": {"thread_id": "t"}}))


_EXIT_MID_CALL = """
import asyncio, sys, time
from langgraph_fenced_sqlite.core.hop import Hop

hop = Hop(2, "t")

def slow():
    time.sleep(0.5)
    with open(sys.argv[1], "w") as f:
        f.write("finished")

async def main():
    asyncio.ensure_future(hop.run(slow))
    await asyncio.sleep(0.1)  # the worker has it; the loop then ends, cancelling the await

asyncio.run(main())
"""


@pytest.mark.subprocess
def test_at_interpreter_exit_a_call_in_progress_finishes(tmp_path: Any) -> None:
    """Daemon workers would be frozen mid-call at exit: the hop joins them first."""
    marker = tmp_path / "marker"
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_MID_CALL, str(marker)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "finished"
