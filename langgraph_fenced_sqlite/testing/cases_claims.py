"""Contract cases 8-13: claims, takeover at expiry, token before version, renew, release.

Cases about several writers come twice: with one store playing every part,
and with two stores on one file (`*_siblings`, the "sibling" capability), so
a promise cannot rest on state one connection keeps for itself.
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ..errors import CheckpointConflict, StaleClaim, ThreadBusy
from ._helpers import claim_config as _config
from ._helpers import expect_raised as _expect
from ._helpers import latest_id as _latest_id
from ._helpers import named_checkpoint as _checkpoint
from ._helpers import put_named as _put
from ._helpers import snapshot as _snapshot
from ._helpers import store_pair as _pair
from ._helpers import token_of as _token_of
from .harness import ContractEnv, contract_case, raw

# --- helpers -------------------------------------------------------------------------


def _busy(store: Any, thread_id: str, holder: str, ttl: float = 10) -> ThreadBusy:
    return _expect(ThreadBusy, store.claim, thread_id, holder, ttl)


def uuid6_at(unix_ns: int) -> str:
    """Make a LangGraph-style (uuid6) checkpoint id for the time `unix_ns`.

    LangGraph's ids sort by the clock of the process that made them, so this
    is how a process whose clock is behind names its checkpoints.
    """
    ts = unix_ns // 100 + 0x01B21DD213814000
    high = (ts >> 12) & 0xFFFFFFFFFFFF
    low = (ts & 0x0FFF) | 0x6000
    clock_seq = random.getrandbits(14) | 0x8000
    return str(
        uuid.UUID(int=(high << 80) | (low << 64) | (clock_seq << 48) | random.getrandbits(48))
    )


# --- 8. claims are exclusive ------------------------------------------------------------


def _claim_is_exclusive(env: ContractEnv, a: Any, b: Any) -> None:
    clock = env.clock
    counter = raw(a).stats()["token_counter"]
    granted = a.claim("t", "alice", 10)
    assert (granted.thread_id, granted.holder) == ("t", "alice")
    assert granted.token > counter, (granted.token, counter)
    assert granted.expires_at == clock.now() + 10
    assert b.current_claim("t") == granted
    tick_before = math.nextafter(granted.expires_at, -math.inf)
    for when in (clock.now(), clock.now() + 5, tick_before):
        clock.set(when)
        for store, holder in ((b, "bob"), (a, "alice"), (b, "alice")):
            exc = _busy(store, "t", holder)
            assert (exc.thread_id, exc.holder) == ("t", "alice"), exc.to_dict()
    # Refused claims changed nothing and issued no token.
    assert b.current_claim("t") == granted
    assert raw(b).stats()["token_counter"] == granted.token
    # A thread needs no checkpoint to be claimed, and ttl may be a timedelta.
    other = b.claim("u", "carol", timedelta(seconds=7.5))
    assert other.expires_at == clock.now() + 7.5
    assert other.token > granted.token


@contract_case(8)
def case_claim_is_exclusive_until_expiry(env: ContractEnv) -> None:
    """A live claim refuses every other claim, the same holder's included, until expiry."""
    _claim_is_exclusive(env, *_pair(env, False))


@contract_case(8, needs=("sibling",))
def case_claim_is_exclusive_until_expiry_siblings(env: ContractEnv) -> None:
    """A live claim made through one store refuses claims through another."""
    _claim_is_exclusive(env, *_pair(env, True))


# --- 9. takeover at expiry fences the old holder ---------------------------------------------


def _expiry_takeover_fences(env: ContractEnv, a: Any, b: Any) -> None:
    alice = a.claim("t", "alice", 10)
    _put(a, "t", "c1", source="input", step=-1, claim=alice)
    a.put_writes(_config("t", claim=alice, parent="c1"), [("x", "alice-x")], "task-1")
    before = _snapshot(a, "t")
    env.clock.set(alice.expires_at)  # exactly expires_at: no longer live
    bob = b.claim("t", "bob", 10)
    assert bob.holder == "bob" and bob.token > alice.token
    assert bob.expires_at == alice.expires_at + 10
    stale = _config("t", claim=alice, parent="c1")
    attempts: list[tuple[Callable[..., Any], tuple[Any, ...]]] = [
        (a.put, (stale, _checkpoint("c2"), {"source": "loop", "step": 0, "parents": {}}, {})),
        (a.put_writes, (stale, [("x", "late")], "task-2")),
        (a.put_writes, (stale, [("__resume__", "late")], "task-1")),
        (a.append_events, ("t", alice.token, [("note", {"by": "alice"})])),
        (a.renew, ("t", alice.token, 10)),
    ]
    for fn, args in attempts:
        exc = _expect(StaleClaim, fn, *args)
        assert (exc.thread_id, exc.token, exc.current_token) == ("t", alice.token, bob.token)
        assert exc.is_stale_write_owner_error is True
    assert a.release("t", alice.token) is False  # a silent no-op, not an error
    assert b.current_claim("t") == bob
    # Nothing alice tried is stored, and no event seq was spent on it.
    checkpoints, events, _claim, _counter = before
    assert _snapshot(b, "t")[:2] == (checkpoints, events)
    assert _latest_id(b, "t") == "c1"
    assert b.get_tuple({"configurable": {"thread_id": "t", "checkpoint_id": "c2"}}) is None
    last_seq = events[-1].seq
    _put(b, "t", "c2", parent="c1", claim=bob)
    assert [e.seq for e in b.events_after("t", last_seq, 10)] == [last_seq + 1]


@contract_case(9)
def case_expiry_takeover_fences_old_holder(env: ContractEnv) -> None:
    """At exactly expires_at another holder takes over; the old holder is fenced off."""
    _expiry_takeover_fences(env, *_pair(env, False))


@contract_case(9, needs=("sibling",))
def case_expiry_takeover_fences_old_holder_siblings(env: ContractEnv) -> None:
    """A takeover through one store fences off a holder writing through another."""
    _expiry_takeover_fences(env, *_pair(env, True))


# --- 10. token before version ------------------------------------------------------------


def _token_before_version(env: ContractEnv, a: Any, b: Any) -> None:
    alice = a.claim("t", "alice", 10)
    _put(a, "t", "c1", source="input", step=-1, claim=alice)
    _put(a, "t", "c2", parent="c1", claim=alice)
    bob = b.take_over("t", "bob", 10)
    before = _snapshot(b, "t")
    # Wrong parents (none, an old one, one never stored) and a stored id:
    # each would be a CheckpointConflict for the owner; the stale writer
    # learns only that it is stale.
    for parent, cid, source in (
        (None, "c3", "input"),
        ("c1", "c3", "loop"),
        ("nowhere", "c3", "loop"),
        ("c1", "c2", "loop"),
    ):
        exc = _expect(StaleClaim, _put, a, "t", cid, parent=parent, source=source, claim=alice)
        assert (exc.token, exc.current_token) == (alice.token, bob.token)
    assert _snapshot(b, "t") == before
    # The same put by the owner is the version error.
    conflict = _expect(CheckpointConflict, _put, b, "t", "c3", parent="c1", claim=bob)
    assert (conflict.expected, conflict.actual) == ("c1", "c2")


@contract_case(10)
def case_token_checked_before_version(env: ContractEnv) -> None:
    """A stale writer whose parent is wrong gets StaleClaim, never CheckpointConflict."""
    _token_before_version(env, *_pair(env, False))


@contract_case(10, needs=("sibling",))
def case_token_checked_before_version_siblings(env: ContractEnv) -> None:
    """Token before version holds when the owner writes through another store."""
    _token_before_version(env, *_pair(env, True))


# --- 11. unknown tokens ------------------------------------------------------------------


@contract_case(11)
def case_unknown_token_is_stale(env: ContractEnv) -> None:
    """A token never issued, or a token on a thread it does not claim, is StaleClaim."""
    store = env.open()
    granted = store.claim("t", "alice", 10)
    never_issued = raw(store).stats()["token_counter"] + 1000
    for thread_id, token, current in (
        ("t", never_issued, granted.token),
        ("unclaimed", granted.token, None),
        ("unclaimed", never_issued, None),
    ):
        before = _snapshot(store, thread_id)
        config = _config(thread_id, token=token)
        attempts: list[tuple[Callable[..., Any], tuple[Any, ...]]] = [
            (store.put, (config, _checkpoint("c1"), {"source": "input", "step": -1}, {})),
            (store.put_writes, (_config(thread_id, token=token, parent="c1"), [("x", 1)], "t1")),
            (store.append_events, (thread_id, token, [("note", {})])),
            (store.renew, (thread_id, token, 10)),
        ]
        for fn, args in attempts:
            exc = _expect(StaleClaim, fn, *args)
            assert (exc.thread_id, exc.token, exc.current_token) == (thread_id, token, current)
        assert store.release(thread_id, token) is False
        assert _snapshot(store, thread_id) == before
    # A released claim's token is stale too.
    store.release("t", granted.token)
    exc = _expect(StaleClaim, store.renew, "t", granted.token, 10)
    assert exc.current_token is None


# --- 12. an expired claim nobody replaced still works ---------------------------------------


@contract_case(12)
def case_expired_unreplaced_holder_still_writes(env: ContractEnv) -> None:
    """The holder of an expired claim nobody replaced still writes, renews and releases."""
    store = env.open()
    alice = store.claim("t", "alice", 10)
    env.clock.set(alice.expires_at + 100)
    _put(store, "t", "c1", source="input", step=-1, claim=alice)
    store.put_writes(_config("t", claim=alice, parent="c1"), [("x", 1)], "task")
    assert store.append_events("t", alice.token, [("note", {})])
    assert _latest_id(store, "t") == "c1"
    assert _token_of(store, "t", "c1") == alice.token
    renewed = store.renew("t", alice.token, 10)
    assert (renewed.token, renewed.holder) == (alice.token, "alice")
    assert renewed.expires_at == env.clock.now() + 10
    assert _busy(store, "t", "bob").holder == "alice"  # live again after renewal
    env.clock.set(renewed.expires_at + 1)
    assert store.release("t", alice.token) is True
    assert store.current_claim("t") is None


# --- 13. renew and release ------------------------------------------------------------


def _renew_and_release(env: ContractEnv, a: Any, b: Any) -> None:
    clock = env.clock
    alice = a.claim("t", "alice", 10)
    clock.advance(4)
    renewed = a.renew("t", alice.token, 10)
    assert renewed.expires_at == clock.now() + 10 == alice.expires_at + 4
    assert b.current_claim("t") == renewed
    # Renewing may shorten: it is "now + ttl", not "expires_at + ttl".
    short = a.renew("t", alice.token, timedelta(seconds=1))
    assert short.expires_at == clock.now() + 1
    clock.set(math.nextafter(short.expires_at, -math.inf))
    assert _busy(b, "t", "bob").holder == "alice"
    assert a.release("t", alice.token) is True
    assert b.current_claim("t") is None
    bob = b.claim("t", "bob", 10)  # at once: no clock move needed
    before = _snapshot(b, "t")
    assert a.release("t", alice.token) is False  # second release
    assert b.release("t", alice.token) is False  # old token, through any store
    assert _snapshot(a, "t") == before
    assert b.current_claim("t") == bob


@contract_case(13)
def case_renew_extends_from_now_and_release_frees(env: ContractEnv) -> None:
    """Renew extends from now (store clock); release frees at once; a stale release is a no-op."""
    _renew_and_release(env, *_pair(env, False))


@contract_case(13, needs=("sibling",))
def case_renew_extends_from_now_and_release_frees_siblings(env: ContractEnv) -> None:
    """Renew and release through one store are seen at once through another."""
    _renew_and_release(env, *_pair(env, True))
