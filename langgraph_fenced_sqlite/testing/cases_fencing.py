"""Contract cases 14-18: token order, concurrent claims, unfenced writes, version checks.

Cases about several writers come twice: with one store playing every part,
and with two stores on one file (`*_siblings`, the "sibling" capability), so
a promise cannot rest on state one connection keeps for itself.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from langgraph.checkpoint.base import WRITES_IDX_MAP

from ..core.claims import Claim
from ..errors import CheckpointConflict, StaleClaim, ThreadBusy
from ._helpers import claim_config as _config
from ._helpers import expect_raised as _expect
from ._helpers import latest_id as _latest_id
from ._helpers import put_named as _put
from ._helpers import snapshot as _snapshot
from ._helpers import store_pair as _pair
from ._helpers import token_of as _token_of
from .cases_claims import uuid6_at
from .harness import ContractEnv, contract_case, raw

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
