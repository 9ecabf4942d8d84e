"""Contract case 41: thread expiry (docs/semantics.md §6, "Thread expiry").

Each case opens its stores with an `Expiry` option on the env's manual
clock, so "idle for its TTL" is a clock advance, never a sleep; only the
sweeper case waits (for its thread to run by itself), with a deadline.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..core.retention import Expired, Expiry, ThreadTTL
from ..errors import InvalidArgument
from ._helpers import expect_error as _expect
from ._helpers import put_chain as _put_chain
from .harness import ContractEnv, contract_case, raw


def _threads(store: Any) -> set[str]:
    return {t["thread_id"] for t in store.threads()}


@contract_case(41)
def case_a_threads_ttl_is_stored_in_the_file_and_read_back(env: ContractEnv) -> None:
    """A TTL set is read back by every store on the file; None clears it; bad input is refused."""
    store = env.open()
    other = env.open()
    assert store.thread_ttl("t") is None
    store.set_thread_ttl("t", 3600, strategy="keep_latest")
    assert other.thread_ttl("t") == ThreadTTL(3600.0, "keep_latest")
    other.set_thread_ttl("t", 60)
    assert store.thread_ttl("t") == ThreadTTL(60.0, "delete")
    store.set_thread_ttl("t", None)
    assert other.thread_ttl("t") is None
    for call, name in (
        (lambda: store.set_thread_ttl("t", 0), "ttl"),
        (lambda: store.set_thread_ttl("t", 60, strategy="rollback"), "strategy"),
        (lambda: store.set_thread_ttl("", 60), "thread_id"),
    ):
        error = _expect(call, InvalidArgument)
        assert name in str(error), (name, error)
    assert store.thread_ttl("t") is None
    _expect(lambda: env.open(expiry=Expiry(default_ttl=-1)), InvalidArgument)


@contract_case(41)
def case_an_idle_thread_expires_by_its_strategy(env: ContractEnv) -> None:
    """Past its TTL, "delete" removes a thread, "keep_latest" trims it and logs `pruned`."""
    seen: list[Expired] = []
    expiry = Expiry(default_ttl=100, strategy="keep_latest", on_expire=seen.append)
    store = env.open(expiry=expiry)
    for thread_id in ("kept", "gone", "young"):
        _put_chain(store, thread_id, 3)
    store.set_thread_ttl("gone", 50, strategy="delete")
    assert store.expire().expired == []  # nothing is due yet
    env.clock.advance(60)
    _put_chain(store, "young", 1)
    done = store.expire()
    assert [e.thread_id for e in done.expired] == ["gone"], done
    assert "gone" not in _threads(store) and store.history("gone", limit=10) == []
    env.clock.advance(60)
    done = store.expire()
    assert [e.thread_id for e in done.expired] == ["kept"], done
    kept = done.expired[0]
    assert (kept.strategy, kept.ttl, len(kept.checkpoints)) == ("keep_latest", 100.0, 2)
    assert len(store.history("kept", limit=10)) == 1
    event = store.events_after("kept", kept.seq - 1)[0]
    assert event.kind == "pruned" and event.data["ttl"] == 100.0, event
    assert len(store.history("young", limit=10)) == 4  # written 60 s ago
    assert [e.thread_id for e in seen] == ["gone", "kept"]
    env.clock.advance(1000)
    again = store.expire()  # "kept" holds only its latest now; "young" goes
    assert [e.thread_id for e in again.expired] == ["young"], again
    assert store.expire().expired == []


@contract_case(41)
def case_a_thread_written_or_claimed_is_not_expired(env: ContractEnv) -> None:
    """A write moves a thread's due time; a live claim keeps it until the claim ends."""
    store = env.open(expiry=Expiry(default_ttl=100))
    _put_chain(store, "written", 2)
    _put_chain(store, "claimed", 2)
    assert store.expire().expired == []
    env.clock.advance(90)
    _put_chain(store, "written", 1)
    claim = store.claim("claimed", "worker", 1000)
    env.clock.advance(20)
    done = store.expire()
    assert done.expired == [] and done.busy == ["claimed"], done
    assert len(store.history("claimed", limit=10)) == 2
    store.release("claimed", claim.token)
    done = store.expire()
    assert [e.thread_id for e in done.expired] == ["claimed"], done
    env.clock.advance(100)
    assert [e.thread_id for e in store.expire().expired] == ["written"]


@contract_case(41, needs=["sibling"])
def case_stores_expiring_at_once_remove_each_thread_once(env: ContractEnv) -> None:
    """Two stores expiring the same due threads at once: each is removed once, no error."""
    stores = [env.open(expiry=Expiry(default_ttl=10)) for _ in range(2)]
    names = [f"t{i:02d}" for i in range(12)]
    for name in names:
        _put_chain(stores[0], name, 2)
    env.clock.advance(20)
    results: list[Any] = [None, None]
    start = threading.Barrier(2)

    def sweep(i: int) -> None:
        start.wait()
        try:
            results[i] = stores[i].expire()
        except Exception as exc:  # noqa: BLE001 - reported below
            results[i] = exc

    workers = [threading.Thread(target=sweep, args=(i,)) for i in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert not any(isinstance(r, Exception) for r in results), results
    expired = [e.thread_id for r in results for e in r.expired]
    assert sorted(expired) == names, expired  # each once, none twice
    assert not _threads(stores[0]) & set(names)


@contract_case(41)
def case_nothing_due_commits_nothing(env: ContractEnv) -> None:
    """A pass with nothing due (every thread seen, none idle long enough) commits no write."""
    store = env.open(expiry=Expiry(default_ttl=100))
    for name in ("a", "b", "c"):
        _put_chain(store, name, 2)
    store.set_thread_ttl("c", 500)
    store.expire()  # the first pass sees each thread once
    before = raw(store).commit_stats()["commits"]
    for _ in range(3):
        env.clock.advance(10)
        done = store.expire()
        assert done.expired == [] and done.scheduled == 0, done
    assert raw(store).commit_stats()["commits"] == before


@contract_case(41)
def case_the_sweeper_runs_by_itself_and_stops_on_close(env: ContractEnv) -> None:
    """With `sweep_every`, the saver expires due threads on its own and close() stops it."""
    seen: list[Expired] = []
    store = env.open(expiry=Expiry(default_ttl=30, sweep_every=0.02, on_expire=seen.append))
    _put_chain(store, "t", 2)
    sweeper = raw(store)._sweeper
    assert sweeper is not None and sweeper.alive
    env.clock.advance(60)
    deadline = time.monotonic() + 20
    while not seen and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [e.thread_id for e in seen] == ["t"], seen
    raw(store).close()
    assert not sweeper.alive
    assert not [t for t in threading.enumerate() if t is getattr(sweeper, "_thread", None)]
