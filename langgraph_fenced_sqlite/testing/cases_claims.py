"""Contract cases 8-18: claims, tokens and fenced writes.

Cases about several writers come twice: with one store playing every part,
and with two stores on one file (`*_siblings`, the "sibling" capability), so
a promise cannot rest on state one connection keeps for itself.
"""

from __future__ import annotations

import math
import os
import random
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from langgraph.checkpoint.base import WRITES_IDX_MAP, Checkpoint, empty_checkpoint

from ..claims import TOKEN_KEY, Claim
from ..errors import CheckpointConflict, StaleClaim, ThreadBusy
from .harness import ContractEnv, contract_case, raw

# --- helpers -------------------------------------------------------------------------


def _checkpoint(checkpoint_id: str, value: Any = None) -> Checkpoint:
    cp = empty_checkpoint()
    cp["id"] = checkpoint_id
    cp["channel_values"] = {} if value is None else {"value": value}
    return cp


def _config(
    thread_id: str,
    *,
    claim: Claim | None = None,
    token: int | None = None,
    parent: str | None = None,
    ns: str = "",
) -> dict[str, Any]:
    """A put/put_writes config: fenced by `claim` (or a bare `token`), else unfenced."""
    conf: dict[str, Any] = {"checkpoint_ns": ns}
    if parent is not None:
        conf["checkpoint_id"] = parent
    if claim is not None:
        return claim.config(**conf)  # type: ignore[return-value]
    conf["thread_id"] = thread_id
    if token is not None:
        conf[TOKEN_KEY] = token
    return {"configurable": conf}


def _put(
    store: Any,
    thread_id: str,
    checkpoint_id: str,
    *,
    parent: str | None = None,
    source: str = "loop",
    step: int = 0,
    claim: Claim | None = None,
    token: int | None = None,
    ns: str = "",
) -> None:
    config = _config(thread_id, claim=claim, token=token, parent=parent, ns=ns)
    metadata = {"source": source, "step": step, "parents": {}}
    store.put(config, _checkpoint(checkpoint_id, checkpoint_id), metadata, {})


def _expect(errors: type[BaseException], fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call `fn(*args, **kwargs)`; return the error of type `errors` it raised, else fail."""
    try:
        result = fn(*args, **kwargs)
    except errors as exc:
        return exc
    raise AssertionError(f"expected {errors.__name__}, got {result!r}")


def _busy(store: Any, thread_id: str, holder: str, ttl: float = 10) -> ThreadBusy:
    return _expect(ThreadBusy, store.claim, thread_id, holder, ttl)


def _snapshot(store: Any, thread_id: str) -> tuple[Any, ...]:
    """Everything a thread holds: checkpoints (with writes), events, claim, counter."""
    return (
        list(store.list({"configurable": {"thread_id": thread_id}})),
        store.events_after(thread_id, 0, 10_000),
        store.current_claim(thread_id),
        raw(store).stats()["token_counter"],
    )


def _latest_id(store: Any, thread_id: str, ns: str = "") -> str | None:
    found = store.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}})
    return None if found is None else found.config["configurable"]["checkpoint_id"]


def _token_of(store: Any, thread_id: str, checkpoint_id: str, ns: str = "") -> int | None:
    found = raw(store).inspect_checkpoint(thread_id, checkpoint_ns=ns, checkpoint_id=checkpoint_id)
    assert found is not None, f"{checkpoint_id} is not stored"
    return found["token"]


def _pair(env: ContractEnv, siblings: bool) -> tuple[Any, Any]:
    first = env.open()
    return first, (env.open() if siblings else first)


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


# --- 14. tokens strictly increase -----------------------------------------------------------


def _tokens_increase(env: ContractEnv, siblings: bool) -> None:
    a, b = _pair(env, siblings)
    tokens = [a.claim("t", "w1", 10).token]
    a.release("t", tokens[-1])
    tokens.append(b.claim("t", "w2", 10).token)  # after release
    env.clock.advance(10)
    tokens.append(a.claim("t", "w3", 10).token)  # expiry takeover
    tokens.append(b.take_over("t", "w4", 10).token)  # take_over of a live claim
    tokens.append(a.claim("u", "w5", 10).token)  # another thread: one counter per file
    a.delete_thread("t")
    exc = _expect(StaleClaim, b.renew, "t", tokens[3], 10)
    assert exc.current_token is None
    tokens.append(b.claim("t", "w6", 10).token)  # after delete_thread
    a = env.reopen(a)
    b = a if not siblings else env.reopen(b)
    tokens.append(a.take_over("t", "w7", 10).token)  # after reopen
    tokens.append(b.claim("v", "w8", 10).token)
    assert tokens == sorted(set(tokens)), tokens  # strictly increasing
    assert raw(a).stats()["token_counter"] == tokens[-1]


@contract_case(14, needs=("reopen",))
def case_tokens_strictly_increase(env: ContractEnv) -> None:
    """Tokens increase across release, expiry, take_over, delete_thread and reopen."""
    _tokens_increase(env, siblings=False)


@contract_case(14, needs=("sibling", "reopen"))
def case_tokens_strictly_increase_siblings(env: ContractEnv) -> None:
    """Tokens issued through two stores on one file all increase, across reopen."""
    _tokens_increase(env, siblings=True)


# --- 15. concurrent claims -------------------------------------------------------------

_CONTENDERS = 16


def _race(stores: list[Any], thread_id: str, holders: list[str]) -> list[Claim | ThreadBusy]:
    """Let each store claim `thread_id` at once, from its own thread."""
    barrier = threading.Barrier(len(holders))
    results: list[Any] = [None] * len(holders)

    def contend(i: int) -> None:
        try:
            barrier.wait(timeout=60)
            results[i] = stores[i].claim(thread_id, holders[i], 10)
        except BaseException as exc:  # noqa: BLE001 - judged by the caller
            results[i] = exc

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(len(holders))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a contender hung"
    return results


def _one_winner(results: list[Any], store: Any, thread_id: str) -> Claim:
    winners = [r for r in results if isinstance(r, Claim)]
    assert len(winners) == 1, results
    winner = winners[0]
    for r in results:
        if r is not winner:
            assert isinstance(r, ThreadBusy), repr(r)
            assert r.holder == winner.holder, (r.holder, winner.holder)
    assert store.current_claim(thread_id) == winner
    return winner


def _concurrent_claims(env: ContractEnv, stores: list[Any]) -> None:
    holders = [f"w{i}" for i in range(_CONTENDERS)]
    counter = raw(stores[0]).stats()["token_counter"]
    first = _one_winner(_race(stores, "t", holders), stores[0], "t")
    assert raw(stores[0]).stats()["token_counter"] == counter + 1  # losers issued none
    env.clock.set(first.expires_at)
    second = _one_winner(_race(stores, "t", holders), stores[0], "t")
    assert second.token > first.token
    assert raw(stores[0]).stats()["token_counter"] == counter + 2


@contract_case(15)
def case_concurrent_claims_one_store(env: ContractEnv) -> None:
    """16 threads claiming through one store: exactly one wins, fresh or after expiry."""
    store = env.open()
    _concurrent_claims(env, [store] * _CONTENDERS)


@contract_case(15, needs=("sibling",))
def case_concurrent_claims_own_stores(env: ContractEnv) -> None:
    """16 threads, each with its own store on the file: exactly one claim wins."""
    _concurrent_claims(env, [env.open() for _ in range(_CONTENDERS)])


@contract_case(15, needs=("processes",))
def case_concurrent_claims_processes(env: ContractEnv) -> None:
    """16 processes claiming at once: exactly one wins, fresh and after expiry."""
    from .child import Child, write_flag

    store = env.open()
    flags = [os.path.join(os.path.dirname(env.path), f"claim-round{i}.flag") for i in range(2)]
    # One interpreter imports the package, then forks the 16 contenders (each
    # a process with its own connection), so 16 imports don't cost seconds.
    # They claim through the API under test.
    with Child(
        "claim_rounds_forked",
        path=env.path,
        thread_id="t",
        holder="p",
        n=_CONTENDERS,
        ttl=10,
        rounds=flags,
        api=env.api,
    ) as forker:
        ready = [forker.next(timeout=120) for _ in range(_CONTENDERS)]
        assert all(line["ready"] for line in ready), ready
        assert len({line["pid"] for line in ready} - {forker.pid}) == _CONTENDERS
        winners: list[Claim] = []
        for i, flag in enumerate(flags):
            # Round 0 on a new thread; round 1 exactly at the winner's expiry.
            when = env.clock.now() if i == 0 else winners[-1].expires_at
            env.clock.set(when)
            write_flag(flag, repr(when))
            results: list[Claim | ThreadBusy] = []
            for _ in range(_CONTENDERS):
                line = forker.next(timeout=120)
                assert line["round"] == i, line
                if line["ok"]:
                    results.append(Claim("t", line["holder"], line["token"], line["expires_at"]))
                else:
                    assert line["code"] == "thread_busy", line
                    results.append(ThreadBusy("t", line["holder"], line["latest_checkpoint_id"]))
            winners.append(_one_winner(results, store, "t"))
        assert winners[1].token > winners[0].token
        assert forker.next(timeout=120) == {"exit_codes": [0] * _CONTENDERS}


# --- 16. unfenced writes -------------------------------------------------------------------


def _unfenced_writes(env: ContractEnv, owner: Any, other: Any) -> None:
    _put(other, "t", "c1", source="input", step=-1)  # no claim: accepted (plain LangGraph)
    alice = owner.claim("t", "alice", 10)
    before = _snapshot(owner, "t")
    exc = _expect(ThreadBusy, _put, other, "t", "c2", parent="c1")
    assert (exc.thread_id, exc.holder, exc.latest_checkpoint_id) == ("t", "alice", "c1")
    exc = _expect(ThreadBusy, other.put_writes, _config("t", parent="c1"), [("x", 1)], "task")
    assert exc.holder == "alice"
    assert _snapshot(other, "t") == before
    env.clock.set(alice.expires_at)  # expired: no live claim, accepted again
    _put(other, "t", "c2", parent="c1")
    owner.renew("t", alice.token, 10)
    _expect(ThreadBusy, _put, other, "t", "c3", parent="c2")
    owner.release("t", alice.token)  # released: accepted
    _put(other, "t", "c3", parent="c2")
    assert _latest_id(owner, "t") == "c3"
    assert _token_of(owner, "t", "c3") is None


@contract_case(16)
def case_unfenced_put_refused_only_under_live_claim(env: ContractEnv) -> None:
    """An unfenced put is refused with ThreadBusy under a live claim, accepted with none."""
    _unfenced_writes(env, *_pair(env, False))


@contract_case(16, needs=("sibling",))
def case_unfenced_put_refused_only_under_live_claim_siblings(env: ContractEnv) -> None:
    """A claim made through one store refuses unfenced puts through another."""
    _unfenced_writes(env, *_pair(env, True))


@contract_case(16)
def case_require_claim_refuses_every_unfenced_write(env: ContractEnv) -> None:
    """A store opened with require_claim=True refuses every unfenced write, claim or not."""
    strict = env.open(require_claim=True)
    for thread_id in ("never-claimed", "expired", "released"):
        exc = _expect(ThreadBusy, _put, strict, thread_id, "c1", source="input")
        assert exc.thread_id == thread_id
        assert "require_claim" in str(exc)
    expired = strict.claim("expired", "alice", 10)
    strict.release("released", strict.claim("released", "bob", 10).token)
    env.clock.set(expired.expires_at + 1)
    for thread_id in ("never-claimed", "expired", "released"):
        _expect(ThreadBusy, _put, strict, thread_id, "c1", source="input")
        _expect(ThreadBusy, strict.put_writes, _config(thread_id, parent="c1"), [("x", 1)], "k")
        assert strict.get_tuple({"configurable": {"thread_id": thread_id}}) is None
    _put(strict, "expired", "c1", source="input", claim=expired)  # fenced: accepted
    assert _token_of(strict, "expired", "c1") == expired.token


# --- 17. version check ----------------------------------------------------------------------


@contract_case(17)
def case_version_check_for_input_and_loop(env: ContractEnv) -> None:
    """Fenced input/loop puts must extend the latest; fork/update may name any stored parent."""
    store = env.open()
    me = store.claim("t", "me", 10)
    _put(store, "t", "c1", source="input", step=-1, claim=me)
    _put(store, "t", "c2", parent="c1", claim=me)
    before = _snapshot(store, "t")
    for parent, source in (("c1", "loop"), (None, "input"), (None, "loop"), ("c1", "input")):
        exc = _expect(
            CheckpointConflict, _put, store, "t", "c3", parent=parent, source=source, claim=me
        )
        assert (exc.thread_id, exc.checkpoint_ns, exc.expected, exc.actual) == (
            "t",
            "",
            parent,
            "c2",
        ), exc.to_dict()
    assert _snapshot(store, "t") == before  # nothing stored, no seq spent
    _put(store, "t", "f1", parent="c1", source="fork", claim=me)  # from an old checkpoint
    _put(store, "t", "u1", parent="c2", source="update", claim=me)
    assert _latest_id(store, "t") == "u1"
    exc = _expect(CheckpointConflict, _put, store, "t", "c3", parent="c2", claim=me)
    assert exc.actual == "u1"
    _put(store, "t", "c3", parent="u1", claim=me)
    # Namespaces are checked apart: a subgraph's first checkpoint has no parent.
    _put(store, "t", "s1", ns="sub:1", source="input", claim=me)
    _put(store, "t", "s2", ns="sub:1", parent="s1", claim=me)
    exc = _expect(CheckpointConflict, _put, store, "t", "s3", ns="sub:1", parent="s1", claim=me)
    assert (exc.checkpoint_ns, exc.actual) == ("sub:1", "s2")
    assert _latest_id(store, "t") == "c3"


@contract_case(17)
def case_latest_is_by_commit_position(env: ContractEnv) -> None:
    """The latest checkpoint is the last committed, even when its id sorts lower."""
    store = env.open()
    me = store.claim("t", "me", 10)
    now_ns = 1_700_000_000 * 10**9
    ahead = uuid6_at(now_ns)
    behind = uuid6_at(now_ns - 3600 * 10**9)  # a process whose clock is an hour behind
    assert behind < ahead
    _put(store, "t", ahead, source="input", step=-1, claim=me)
    _put(store, "t", behind, parent=ahead, step=0, claim=me)  # committed last
    assert _latest_id(store, "t") == behind
    assert [t.config["configurable"]["checkpoint_id"] for t in store.history("t")] == [
        behind,
        ahead,
    ]
    exc = _expect(CheckpointConflict, _put, store, "t", "c3", parent=ahead, claim=me)
    assert (exc.expected, exc.actual) == (ahead, behind)
    _put(store, "t", "c3", parent=behind, step=1, claim=me)
    assert _latest_id(store, "t") == "c3"


# --- 18. special writes and stale owners --------------------------------------------------


def _stale_cannot_displace(env: ContractEnv, a: Any, b: Any) -> None:
    def writes_of(checkpoint_id: str) -> dict[tuple[str, str], Any]:
        found = b.get_tuple({"configurable": {"thread_id": "t", "checkpoint_id": checkpoint_id}})
        assert found is not None
        return {(task, channel): value for task, channel, value in found.pending_writes}

    special = sorted(WRITES_IDX_MAP)
    assert {"__resume__", "__error__", "__interrupt__", "__scheduled__"} <= set(special)
    alice = a.claim("t", "alice", 10)
    _put(a, "t", "c1", source="input", step=-1, claim=alice)
    on_c1 = _config("t", claim=alice, parent="c1")
    a.put_writes(on_c1, [("x", "alice")], "task")
    for channel in special:
        a.put_writes(on_c1, [(channel, "alice")], f"task-{channel}")
    bob = b.take_over("t", "bob", 10)
    bob_c1 = _config("t", claim=bob, parent="c1")
    b.put_writes(bob_c1, [("x", "bob")], "task")  # regular: the first write stays
    for channel in special:
        b.put_writes(bob_c1, [(channel, "bob-1")], f"task-{channel}")  # special: replaced
    expected = {("task", "x"): "alice"}
    expected.update({(f"task-{c}", c): "bob-1" for c in special})
    assert writes_of("c1") == expected
    # Bob's writes may land before his checkpoint (LangGraph sends them first).
    bob_c2 = _config("t", claim=bob, parent="c2")
    for channel in special:
        b.put_writes(bob_c2, [(channel, "bob-1")], f"task-{channel}")
    before = _snapshot(b, "t")
    for config in (on_c1, _config("t", claim=alice, parent="c2")):
        for channel in [*special, "x", "y"]:
            exc = _expect(
                StaleClaim, a.put_writes, config, [(channel, "alice-2")], f"task-{channel}"
            )
            assert (exc.token, exc.current_token) == (alice.token, bob.token)
        _expect(StaleClaim, a.put_writes, config, [("x", "alice-2")], "task")
    assert _snapshot(b, "t") == before
    _put(b, "t", "c2", parent="c1", claim=bob)
    assert writes_of("c2") == {(f"task-{c}", c): "bob-1" for c in special}
    # The current owner's special writes stay last-writer-wins.
    for channel in special:
        b.put_writes(bob_c1, [(channel, "bob-2")], f"task-{channel}")
    expected.update({(f"task-{c}", c): "bob-2" for c in special})
    assert writes_of("c1") == expected


@contract_case(18)
def case_stale_owner_never_displaces_current_writes(env: ContractEnv) -> None:
    """A stale owner cannot displace the current owner's writes, special channels included."""
    _stale_cannot_displace(env, *_pair(env, False))


@contract_case(18, needs=("sibling",))
def case_stale_owner_never_displaces_current_writes_siblings(env: ContractEnv) -> None:
    """A stale owner on one store cannot displace writes made through another."""
    _stale_cannot_displace(env, *_pair(env, True))
