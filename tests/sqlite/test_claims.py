"""Claims and fencing tokens beyond the contract cases (see testing/cases_claims.py).

The last section is an operator's hand on a claim (`force_release` and
`take_over(operator=...)`), on both stores (`either_store`): both fence off the
holder exactly as a takeover does (its next fenced write and renewal are
`StaleClaim`, its release and end of run change nothing) and log one event
naming the operator in the same commit. The real-process and `lgfs` versions
are in `tests/cli/test_cli_ops.py`.
"""

from __future__ import annotations

import math
import pickle
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from support.configs import config
from support.files import dump
from support.graphs import build_ops_graph
from support.puts import put

from langgraph_fenced_sqlite import (
    TOKEN_KEY,
    CheckpointConflict,
    Claim,
    FencedSqliteSaver,
    InvalidArgument,
    ManualClock,
    StaleClaim,
    ThreadBusy,
)
from langgraph_fenced_sqlite.testing.cases_claims import uuid6_at

# --- Claim.config ---------------------------------------------------------------------


def test_claim_config_carries_thread_and_token() -> None:
    """`Claim.config()` names the thread and the token, keeping what it extends."""
    claim = Claim("t", "me", 42, 100.0)
    assert claim.config() == {"configurable": {"thread_id": "t", TOKEN_KEY: 42}}
    base = {"recursion_limit": 7, "configurable": {"thread_id": "other", "user": "u"}}
    extended = claim.config(base, checkpoint_ns="", user="v")
    assert extended == {
        "recursion_limit": 7,
        "configurable": {"thread_id": "t", "user": "v", "checkpoint_ns": "", TOKEN_KEY: 42},
    }
    assert base == {"recursion_limit": 7, "configurable": {"thread_id": "other", "user": "u"}}


@pytest.mark.parametrize("bad", ["5", 5.0, True, [5]])
def test_a_token_that_is_not_an_int_is_a_type_error(store: FencedSqliteSaver, bad: Any) -> None:
    """A non-int token in a config is refused naming the key, before the file is touched."""
    store.claim("t", "me", 10)
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": "", TOKEN_KEY: bad}}
    with pytest.raises(TypeError, match=TOKEN_KEY):
        store.put(config, empty_checkpoint(), {"source": "input", "step": -1}, {})
    on_c = {"configurable": {**config["configurable"], "checkpoint_id": "c"}}
    with pytest.raises(TypeError, match=TOKEN_KEY):
        store.put_writes(on_c, [("x", 1)], "task")
    assert store.events_after("t", 0) == []


# --- ttl ----------------------------------------------------------------------------------


@pytest.mark.parametrize("ttl", [30, 30.0, timedelta(seconds=30)])
def test_ttl_is_seconds_or_a_timedelta(
    store: FencedSqliteSaver, clock: ManualClock, ttl: Any
) -> None:
    """claim, take_over and renew take ttl as seconds (int or float) or a timedelta."""
    assert store.claim("t", "a", ttl).expires_at == clock.now() + 30
    taken = store.take_over("t", "b", ttl)
    assert taken.expires_at == clock.now() + 30
    clock.advance(timedelta(seconds=2.5))
    assert store.renew("t", taken.token, ttl).expires_at == clock.now() + 30


@pytest.mark.parametrize(
    ("ttl", "error"),
    [
        (0, ValueError),
        (-1, ValueError),
        (timedelta(0), ValueError),
        (timedelta(seconds=-1), ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (True, TypeError),
        ("30", TypeError),
        (None, TypeError),
    ],
)
def test_a_bad_ttl_is_refused_before_the_file_is_touched(
    store: FencedSqliteSaver, ttl: Any, error: type
) -> None:
    """A ttl that is not a positive finite duration names `ttl` and changes nothing."""
    held = store.claim("held", "me", 10)
    counter = store.stats()["token_counter"]
    calls = [
        lambda: store.claim("t", "me", ttl),
        lambda: store.take_over("held", "me", ttl),
        lambda: store.renew("held", held.token, ttl),
        lambda: store.lease("t", "me", ttl=ttl),
        lambda: store.alease("t", "me", ttl=ttl),
    ]
    for call in calls:
        with pytest.raises(error, match="ttl"):
            call()
    assert store.stats()["token_counter"] == counter
    assert store.current_claim("t") is None
    assert store.current_claim("held") == held


# --- errors -------------------------------------------------------------------------------


def test_stale_claim_is_a_stale_write_owner_error() -> None:
    """`StaleClaim` carries LangGraph's write-ownership marker; other errors do not."""
    assert StaleClaim.is_stale_write_owner_error is True
    exc = StaleClaim("t", 3, 5)
    assert exc.is_stale_write_owner_error is True
    assert getattr(ThreadBusy("t", "me"), "is_stale_write_owner_error", False) is False
    again = pickle.loads(pickle.dumps(exc))  # crosses processes with its fields
    assert type(again) is StaleClaim
    assert (again.thread_id, again.token, again.current_token, again.code) == (
        "t",
        3,
        5,
        "stale_claim",
    )
    assert again.is_stale_write_owner_error is True


def test_thread_busy_names_the_latest_root_checkpoint(
    store: FencedSqliteSaver, clock: ManualClock
) -> None:
    """ThreadBusy carries the latest root checkpoint by commit order, ignoring subgraphs."""
    me = store.claim("t", "me", 10)
    ahead = uuid6_at(1_700_000_000 * 10**9)
    behind = uuid6_at(1_690_000_000 * 10**9)
    put(store, new_id=ahead, claim=me, source="input")
    put(store, new_id=behind, claim=me, parent=ahead)  # smaller id, committed last
    put(store, new_id="sub-1", claim=me, ns="sub:1", source="input")
    for call in (
        lambda: store.claim("t", "you", 10),
        lambda: put(store, new_id="x", parent=behind),
    ):
        with pytest.raises(ThreadBusy) as info:
            call()
        assert (info.value.holder, info.value.latest_checkpoint_id) == ("me", behind)


# --- the token of each checkpoint ----------------------------------------------------------------


def test_each_checkpoint_records_the_token_that_wrote_it(open_store: Any) -> None:
    """The token that wrote a checkpoint is stored with it, readable, and never rewritten."""
    store, other = open_store(), open_store()
    put(store, new_id="c0", source="input")  # unfenced
    first = store.claim("t", "a", 10)
    put(store, new_id="c1", claim=first, parent="c0")
    second = other.take_over("t", "b", 10)
    put(other, new_id="c2", claim=second, parent="c1")
    records = other.history_records("t")
    assert [(r["checkpoint_id"], r["token"]) for r in records] == [
        ("c2", second.token),
        ("c1", first.token),
        ("c0", None),
    ]
    for cid, token in (("c0", None), ("c1", first.token), ("c2", second.token)):
        assert store.inspect_checkpoint("t", checkpoint_id=cid)["token"] == token


def test_list_is_ordered_by_id_while_latest_is_by_commit(store: FencedSqliteSaver) -> None:
    """Pin a surprise: after a clock-behind commit, `list` does not start with the latest.

    LangGraph's `list` orders by checkpoint id (its savers' ids are uuid6,
    made from each process's clock), so we keep that order for `list`; but the
    latest checkpoint, which `get_tuple` returns and fenced puts must extend,
    is the last committed (docs/semantics.md §4). With clock skew the two differ, and
    `history` is the call that pages in commit order.
    """
    me = store.claim("t", "me", 10)
    ahead = uuid6_at(1_700_000_000 * 10**9)
    behind = uuid6_at(1_690_000_000 * 10**9)
    put(store, new_id=ahead, claim=me, source="input")
    put(store, new_id=behind, claim=me, parent=ahead)
    listed = [t.config["configurable"]["checkpoint_id"] for t in store.list(me.config())]
    assert listed == [ahead, behind]
    assert store.get_tuple(me.config()).config["configurable"]["checkpoint_id"] == behind
    assert [t.config["configurable"]["checkpoint_id"] for t in store.history("t")] == [
        behind,
        ahead,
    ]


# --- claims seen from outside ------------------------------------------------------------


def test_current_claim_reports_an_expired_claim_until_replaced(
    store: FencedSqliteSaver, clock: ManualClock
) -> None:
    """`current_claim` shows the claim live or expired; `claims()` lists every current one."""
    assert store.current_claim("t") is None
    mine = store.claim("t", "me", 10)
    store.release("u", store.claim("u", "gone", 10).token)
    clock.advance(60)
    assert store.current_claim("t") == mine  # expired, still its holder's until replaced
    assert store.claims() == [mine]
    yours = store.claim("t", "you", 10)
    assert store.current_claim("t") == yours
    assert store.claims() == [yours]


@pytest.mark.parametrize("shared", [True, False], ids=["one-store", "own-stores"])
def test_takeover_cuts_off_concurrent_writers(open_store: Any, shared: bool) -> None:
    """Writers racing a takeover all end with StaleClaim; none lands after the new owner."""
    # Nine connections contend for one file's write lock, and SQLite's busy
    # handler is not fair: on a loaded machine one of them once waited past
    # the default 5 s (StoreBusy) before the takeover reached it. What races
    # here is the fence, so each store's deadline is one only a hang reaches.
    owner = open_store(busy_timeout=120)
    old = owner.claim("t", "old", 60)
    stores = [owner if shared else open_store(busy_timeout=120) for _ in range(8)]
    started = threading.Barrier(len(stores) + 1)
    landed = [0] * len(stores)
    outcomes: list[BaseException | None] = [None] * len(stores)

    def write(i: int) -> None:
        started.wait(timeout=60)
        try:
            for n in range(100_000):
                stores[i].append_events("t", old.token, [("w", {"writer": i, "n": n})])
                landed[i] += 1
        except BaseException as exc:  # noqa: BLE001 - asserted below
            outcomes[i] = exc

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    started.wait(timeout=60)
    deadline = time.monotonic() + 60
    while len(owner.events_after("t", 0, 50)) < 50:  # let the writers get going
        assert time.monotonic() < deadline and not any(outcomes), outcomes
    new = owner.take_over("t", "new", 60)
    marker = owner.append_events("t", new.token, [("marker", {})])[0]
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    for exc in outcomes:
        assert isinstance(exc, StaleClaim), repr(exc)
        assert (exc.token, exc.current_token) == (old.token, new.token)
    events = owner.events_after("t", 0, 1_000_000)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))  # no gap, no spent seq
    assert events[-1].seq == marker  # nothing stale landed after the new owner's write
    assert {e.token for e in events[:-1]} == {old.token}
    # Every append a writer saw succeed is there, once, in its order; no other.
    for i in range(len(stores)):
        mine = [e.data["n"] for e in events[:-1] if e.data["writer"] == i]
        assert mine == list(range(landed[i]))


def test_unfenced_special_write_replaces_a_released_owners_write(store: Any) -> None:
    """Once the claim is released nobody owns the thread: special writes are last-writer-wins."""
    cfg = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c1"}}
    granted = store.claim("t", "owner", 30)
    store.put_writes(granted.config(cfg), [("__resume__", "owner's answer")], "task")
    store.release("t", granted.token)
    store.put_writes(cfg, [("__resume__", "new answer")], "task")
    checkpoint = empty_checkpoint()
    checkpoint["id"] = "c1"
    store.put(
        {"configurable": {"thread_id": "t", "checkpoint_ns": ""}},
        checkpoint,
        {"source": "update", "step": 0},
        {},
    )
    assert store.get_tuple(cfg).pending_writes == [("task", "__resume__", "new answer")]


# --- special-channel writes after expiry (contract case 33) -------------------------------------


def _interrupt_write(store: FencedSqliteSaver, cid: str, value: str, claim: Claim | None) -> None:
    conf: dict[str, Any] = {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": cid}
    config = claim.config(**conf) if claim else {"configurable": conf}
    store.put_writes(config, [("__interrupt__", value)], "task-1")  # type: ignore[arg-type]


def _pending(store: FencedSqliteSaver) -> list[tuple[str, str, Any]]:
    tup = store.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})
    assert tup is not None
    return [tuple(w) for w in tup.pending_writes]  # type: ignore[misc]


def test_an_accepted_unfenced_special_write_after_expiry_takes_effect(
    store: FencedSqliteSaver, clock: ManualClock
) -> None:
    """An unfenced __interrupt__ write accepted after the claim expired is what readers see."""
    claim = store.claim("t", "w", 10)
    cid = uuid6_at(1)
    put(store, new_id=cid, claim=claim, source="input")
    _interrupt_write(store, cid, "owner's", claim)
    clock.advance(10)  # expired, nobody took over: unfenced writes are accepted
    seqs = [e.seq for e in store.events_after("t", 0, 100)]
    _interrupt_write(store, cid, "after expiry", None)
    # It used to return normally and leave the expired holder's row in place.
    assert _pending(store) == [("task-1", "__interrupt__", "after expiry")]
    (event,) = store.events_after("t", seqs[-1], 100)
    assert (event.kind, event.token) == ("writes", None)
    # The holder of the expired claim is still current, so it may write again.
    _interrupt_write(store, cid, "owner again", claim)
    assert _pending(store) == [("task-1", "__interrupt__", "owner again")]
    # A stale writer never displaces the current owner's write.
    successor = store.take_over("t", "w2", 60)
    _interrupt_write(store, cid, "successor's", successor)
    with pytest.raises(StaleClaim):
        _interrupt_write(store, cid, "stale", claim)
    with pytest.raises(ThreadBusy):
        _interrupt_write(store, cid, "unfenced under a live claim", None)
    assert _pending(store) == [("task-1", "__interrupt__", "successor's")]


def test_a_fenced_put_of_a_stored_id_checks_the_version_before_the_identity(
    store: FencedSqliteSaver,
) -> None:
    """docs/semantics.md §3's order: a wrong parent is a version conflict even for a stored id.

    It used to be the identity conflict (expected=actual=the id), hiding that
    the put did not extend the latest (found by the model-based test).
    """
    from langgraph_fenced_sqlite.testing._helpers import values_checkpoint

    claim = store.claim("t", "w", 60)
    cp = values_checkpoint({"v": 1})
    store.put(claim.config(checkpoint_ns=""), cp, {"source": "loop", "step": 0}, {})
    with pytest.raises(CheckpointConflict) as info:
        store.put(claim.config(checkpoint_ns=""), cp, {"source": "loop", "step": 1}, {})
    assert (info.value.expected, info.value.actual) == (None, cp["id"])
    # With the right parent, a different checkpoint under a stored id is the identity conflict.
    parent = claim.config(checkpoint_ns="", checkpoint_id=cp["id"])
    with pytest.raises(CheckpointConflict) as info:
        store.put(parent, cp, {"source": "update", "step": 1}, {})
    assert (info.value.expected, info.value.actual) == (cp["id"], cp["id"])
    # An identical retry is still a no-op.
    store.put(claim.config(checkpoint_ns=""), cp, {"source": "loop", "step": 0}, {})


# --- the one-cell fence of the common write (claims.next_seq_if_fenced) ---------------


def _thread_states(store: FencedSqliteSaver, clock: ManualClock) -> Any:
    """Yield (label, token) for a thread in each claim state, the row as that state left it."""
    yield "unclaimed", None
    claim = store.claim("t", "alice", 10)
    yield "live, its token", claim.token
    yield "live, no token", None
    yield "live, an older token", claim.token - 1
    yield "live, a token beyond 64 bits", 2**70
    clock.advance(20)
    yield "expired, its token", claim.token
    yield "expired, no token", None
    store.release("t", claim.token)
    yield "released, its token", claim.token
    yield "released, no token", None


@pytest.mark.parametrize("require_claim", [False, True])
def test_the_one_cell_fence_agrees_with_check_fence(
    open_store: Any, clock: ManualClock, require_claim: bool
) -> None:
    """`next_seq_if_fenced` gives `check_fence`'s next seq exactly when it lets the write land."""
    from langgraph_fenced_sqlite.sqlite import claims

    store = open_store(require_claim=require_claim)
    conn = store._engine._conn
    # A thread never written has no row to read: the checks one by one make it.
    assert claims.next_seq_if_fenced(conn, "t", None, now=0.0, require_claim=False) is None
    conn.execute("INSERT INTO threads (thread_id) VALUES ('t')")
    for label, token in _thread_states(store, clock):
        now = clock.now()
        conn.execute("BEGIN IMMEDIATE")
        try:
            quick = claims.next_seq_if_fenced(
                conn, "t", token, now=now, require_claim=require_claim
            )
            try:
                row = claims.check_fence(conn, "t", token, now=now, require_claim=require_claim)
            except (StaleClaim, ThreadBusy):
                assert quick is None, label
            else:
                assert quick == row.next_seq, label
        finally:
            conn.execute("ROLLBACK")


_DAMAGE = [
    ("floor", "UPDATE threads SET floor = 'x'"),
    ("incarnation", "UPDATE threads SET incarnation = 'x'"),
    ("holder", "UPDATE threads SET holder = x'00'"),
    ("token", "UPDATE threads SET token = 'x'"),
    ("expires_at", "UPDATE threads SET expires_at = 'x'"),
    ("run_id", "UPDATE threads SET run_id = x'00'"),
    ("next seq", "UPDATE events SET seq = seq + 0.5 WHERE seq = (SELECT max(seq) FROM events)"),
]


@pytest.mark.parametrize(("cell", "damage"), _DAMAGE, ids=[c for c, _ in _DAMAGE])
@pytest.mark.parametrize("fenced", [False, True])
def test_a_damaged_thread_row_fails_every_write_naming_the_cell(
    store: FencedSqliteSaver, cell: str, damage: str, fenced: bool
) -> None:
    """A put or put_writes on a damaged thread row is `UndecodableRow` naming it, nothing changed.

    The common write reads one cell of the row, not the row: whatever that
    read skips, the checks one by one still name.
    """
    from langgraph_fenced_sqlite import UndecodableRow

    claim = store.claim("t", "alice", 60) if fenced else None
    put(store, new_id=uuid6_at(1), claim=claim)
    if not fenced:
        claim_of_nobody = store.claim("t", "bob", 60)
        store.release("t", claim_of_nobody.token)
    conn = store._engine._conn
    conn.execute(damage)
    before = list(conn.iterdump())
    config = claim.config(checkpoint_ns="") if claim else {"configurable": {"thread_id": "t"}}
    config["configurable"]["checkpoint_id"] = uuid6_at(1)
    with pytest.raises(UndecodableRow, match=cell):
        put(store, new_id=uuid6_at(2), claim=claim, parent=uuid6_at(1))
    with pytest.raises(UndecodableRow, match=cell):
        store.put_writes(config, [("chan", 1)], "task")
    assert list(conn.iterdump()) == before


# --- an operator's hand on a claim: force_release and take_over(operator=...) ---------------------


def _events(saver: FencedSqliteSaver, thread_id: str) -> list[Any]:
    return saver.events_after(thread_id, 0, limit=1000)


def _everything(either_store: Any, db_path: str) -> Any:
    """Every row of the SQLite file; on PostgreSQL, the thread's claim, events and counts."""
    if isinstance(either_store, FencedSqliteSaver):
        return dump(db_path)
    return either_store.current_claim("t"), _events(either_store, "t"), either_store.stats()


def test_force_release_fences_off_the_holder_and_logs_the_operator(
    either_store: FencedSqliteSaver,
) -> None:
    graph = build_ops_graph(either_store)
    claim = either_store.claim("t", "worker-1", 60)
    graph.invoke({"count": 0}, claim.config())
    before = len(_events(either_store, "t"))
    released = either_store.force_release("t", operator="alice@host")
    assert released == claim
    assert either_store.current_claim("t") is None
    (event,) = _events(either_store, "t")[before:]
    assert (event.kind, event.token) == ("claim_released_by_operator", None)
    assert event.data == {
        "operator": "alice@host",
        "previous_holder": "worker-1",
        "previous_token": claim.token,
        "previous_run_id": None,
        "was_live": True,
    }
    # The superseded holder: every fenced call refused, its release a no-op.
    with pytest.raises(StaleClaim):
        either_store.renew("t", claim.token, 60)
    with pytest.raises(StaleClaim):
        either_store.append_events("t", claim.token, [("note", {})])
    assert either_store.end_run("t", claim.token, "run_completed") is False
    assert either_store.release("t", claim.token) is False
    # The thread is free at once, with a greater token.
    assert either_store.claim("t", "worker-2", 60).token > claim.token


def test_the_released_holders_next_graph_write_is_stale(either_store: FencedSqliteSaver) -> None:
    graph = build_ops_graph(either_store)
    claim = either_store.claim("t", "worker-1", 60)
    graph.invoke({"count": 0}, claim.config())
    either_store.force_release("t", operator="alice@host")
    with pytest.raises(StaleClaim):
        graph.invoke({"count": 5}, claim.config())


def test_force_release_of_an_unclaimed_thread_changes_nothing(
    either_store: FencedSqliteSaver, db_path: str
) -> None:
    build_ops_graph(either_store).invoke({"count": 0}, config("t"))
    rows = _everything(either_store, db_path)
    assert either_store.force_release("t", operator="alice@host") is None
    assert either_store.force_release("nobody", operator="alice@host") is None
    assert _everything(either_store, db_path) == rows  # on PostgreSQL: no row for "nobody" either


def test_an_expired_claim_is_released_and_said_so(either_store: Any, clock: Any) -> None:
    claim = either_store.claim("t", "worker-1", 5)
    clock.advance(10)
    either_store.force_release("t", operator="bob")
    (event,) = _events(either_store, "t")
    assert event.data["was_live"] is False and event.data["previous_token"] == claim.token


def test_an_operator_take_over_logs_and_holds_the_thread(either_store: FencedSqliteSaver) -> None:
    graph = build_ops_graph(either_store)
    old = either_store.claim("t", "worker-1", 60)
    graph.invoke({"count": 0}, old.config())
    before = len(_events(either_store, "t"))
    new = either_store.take_over("t", "alice@host", 120, operator="alice@host")
    assert new.token > old.token and new.holder == "alice@host"
    (event,) = _events(either_store, "t")[before:]
    assert (event.kind, event.token) == ("claim_taken_over", new.token)
    assert event.data == {
        "operator": "alice@host",
        "previous_holder": "worker-1",
        "previous_token": old.token,
        "previous_run_id": None,
        "was_live": True,
        "holder": "alice@host",
        "expires_at": new.expires_at,
    }
    with pytest.raises(StaleClaim):
        graph.invoke({"count": 1}, old.config())
    with pytest.raises(ThreadBusy):
        either_store.claim("t", "worker-2", 60)


def test_a_plain_take_over_still_logs_nothing(either_store: FencedSqliteSaver) -> None:
    either_store.claim("t", "worker-1", 60)
    either_store.take_over("t", "worker-2", 60)
    assert _events(either_store, "t") == []


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda s: s.force_release("t", operator=""), "operator"),
        (lambda s: s.force_release("t", operator=3), "operator"),
        (lambda s: s.force_release("", operator="x"), "thread_id"),
        (lambda s: s.take_over("t", "h", 60, operator=""), "operator"),
        (lambda s: s.take_over("t", "h", -1, operator="x"), "ttl"),
    ],
)
def test_bad_arguments_name_themselves_and_touch_nothing(
    either_store: FencedSqliteSaver, db_path: str, call: Any, name: str
) -> None:
    either_store.claim("t", "worker-1", 60)
    rows = _everything(either_store, db_path)
    with pytest.raises((InvalidArgument, TypeError, ValueError)) as info:
        call(either_store)
    assert name in str(info.value)
    assert _everything(either_store, db_path) == rows


async def test_async_twins(either_store: FencedSqliteSaver) -> None:
    first = await either_store.aclaim("t", "worker-1", 60)
    taken = await either_store.atake_over("t", "ops", 60, operator="ops")
    assert taken.token > first.token
    released = await either_store.aforce_release("t", operator="ops")
    assert released == taken
    kinds = [e.kind for e in _events(either_store, "t")]
    assert kinds == ["claim_taken_over", "claim_released_by_operator"]
