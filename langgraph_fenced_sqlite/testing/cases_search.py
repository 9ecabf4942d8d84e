"""Contract case 40: thread search (`search_threads`, `count_threads`), docs/semantics.md §12.

Invariant: every case reaches stores through `env`, so it checks the sync
and the async API alike, and each store alike; what a search returns is
compared with what `threads()` says of the same threads, so the two cannot
judge a thread differently.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidArgument
from ._helpers import raises as _raises
from ._helpers import step_checkpoint, token_config
from .harness import ContractEnv, contract_case


def _put(
    store: Any,
    thread_id: str,
    parent: str | None,
    metadata: dict[str, Any],
    *,
    step: int = 0,
    ns: str = "",
    token: int | None = None,
) -> str:
    """Put one checkpoint whose metadata is LangGraph's keys plus `metadata`."""
    cp = step_checkpoint(step, {"n": step})
    full = {"source": "loop", "step": step, "parents": {}, **metadata}
    store.put(token_config(thread_id, parent, token, ns), cp, full, {})
    return str(cp["id"])


def _ids(found: list[dict[str, Any]]) -> list[str]:
    return [t["thread_id"] for t in found]


def _fill(env: ContractEnv, store: Any) -> dict[str, list[str]]:
    """Five threads a second apart: a, b, c, d (user, topic...) and e (no checkpoint)."""
    chains: dict[str, list[str]] = {}
    for i, (thread_id, user) in enumerate([("a", "ann"), ("b", "bob"), ("c", "ann"), ("d", "ann")]):
        env.clock.advance(1)
        first = _put(store, thread_id, None, {"user": user, "topic": "billing"}, step=0)
        chains[thread_id] = [first]
        env.clock.advance(1)
        # The latest root checkpoint decides: `d` moved from billing to "sales",
        # and `c` has a nested value and a JSON null.
        latest: dict[str, Any] = {"user": user}
        latest["topic"] = "sales" if thread_id == "d" else "billing"
        if thread_id == "c":
            latest.update(tags={"lang": ["en", "fr"]}, note=None)
        chains[thread_id].append(_put(store, thread_id, first, latest, step=i + 1))
        # A subgraph's checkpoint with other metadata changes nothing.
        _put(store, thread_id, None, {"user": "someone-else"}, ns="sub:1")
    env.clock.advance(1)
    claim = store.claim("e", "worker", 60)  # a thread with no checkpoint, but an event
    store.append_events("e", claim.token, [{"kind": "note", "data": {}}])
    store.release("e", claim.token)
    return chains


@contract_case(40)
def case_search_matches_the_latest_root_checkpoints_metadata(env: ContractEnv) -> None:
    """Metadata is matched as `list(filter=)` matches it, on the latest root checkpoint only."""
    store = env.open()
    _fill(env, store)
    by_user = store.search_threads(metadata={"user": "ann"})
    assert _ids(by_user) == ["d", "c", "a"]  # newest activity first (the default)
    # Each item is the thread's summary as `threads()` gives it, status included.
    summaries = {t["thread_id"]: t for t in store.threads()}
    assert by_user == [summaries[t] for t in ("d", "c", "a")]
    assert _ids(store.search_threads(metadata={"topic": "billing"})) == ["c", "b", "a"]
    assert _ids(store.search_threads(metadata={"topic": "sales", "user": "ann"})) == ["d"]
    assert store.search_threads(metadata={"user": "someone-else"}) == []  # a subgraph's
    assert _ids(store.search_threads(metadata={"tags": {"lang": ["en", "fr"]}})) == ["c"]
    assert (
        store.search_threads(metadata={"tags": {"lang": ["en"]}}) == []
    )  # equality, not "contains"
    # LangGraph's per-step keys and None are matched too (not through the index).
    assert _ids(store.search_threads(metadata={"step": 3})) == ["c"]
    assert _ids(store.search_threads(metadata={"source": "loop", "user": "bob"})) == ["b"]
    by_id = {"sort_by": "thread_id", "order": "asc"}
    assert _ids(store.search_threads(metadata={"note": None}, **by_id)) == [
        "a",
        "b",
        "c",
        "d",
    ]  # a JSON null or a missing key, as `list(filter=)`; `e` has no checkpoint
    # The same filter finds the same checkpoints through `list`.
    for user in ("ann", "bob"):
        listed = {
            t.config["configurable"]["thread_id"]
            for t in store.list(None, filter={"user": user})
            if t.config["configurable"]["checkpoint_ns"] == ""
        }
        assert set(_ids(store.search_threads(metadata={"user": user}))) <= listed
    assert store.count_threads(metadata={"user": "ann"}) == 3
    assert store.count_threads(metadata={"topic": "billing", "user": "ann"}) == 2
    assert store.count_threads() == 5 == len(store.threads())
    assert _ids(store.search_threads(ids=["e", "a", "zz"], **by_id)) == ["a", "e"]
    assert store.count_threads(ids=["e", "a", "zz"], metadata={"user": "ann"}) == 1


@contract_case(40)
def case_search_orders_and_pages_every_thread_once(env: ContractEnv) -> None:
    """`sort_by`/`order` order the matches, ties by thread id; pages cover each once."""
    store = env.open()
    _fill(env, store)
    assert _ids(store.search_threads(sort_by="thread_id", order="asc", limit=100)) == [
        "a",
        "b",
        "c",
        "d",
        "e",
    ]
    assert _ids(store.search_threads(sort_by="thread_id", order="desc", limit=2)) == ["e", "d"]
    newest = _ids(store.search_threads(limit=100))
    assert newest == ["e", "d", "c", "b", "a"]
    assert _ids(store.search_threads(order="asc", limit=100)) == newest[::-1]
    for sort_by in ("thread_id", "updated_at"):
        for order in ("asc", "desc"):
            whole = _ids(store.search_threads(sort_by=sort_by, order=order, limit=100))
            paged: list[str] = []
            for offset in range(0, 6, 2):
                page = store.search_threads(sort_by=sort_by, order=order, limit=2, offset=offset)
                paged += _ids(page)
            assert paged == whole, (sort_by, order)
    assert store.search_threads(offset=5) == []
    # Threads equally recent are in thread id order, whichever the order.
    env.clock.advance(10)
    for thread_id in ("y", "x", "z"):
        _put(store, thread_id, None, {"user": "tie"})
    assert _ids(store.search_threads(metadata={"user": "tie"})) == ["x", "y", "z"]
    assert _ids(store.search_threads(metadata={"user": "tie"}, order="asc")) == ["x", "y", "z"]
    assert _ids(store.search_threads(limit=None)) == _ids(store.search_threads(limit=100))


@contract_case(40)
def case_search_filters_by_status_and_activity_as_threads_does(env: ContractEnv) -> None:
    """`status` and `inactive_for` are `threads()`' rules, combined with metadata and paging."""
    store = env.open()
    _fill(env, store)
    claim = store.claim("c", "worker", 600)  # running
    assert _ids(store.search_threads(status="running")) == ["c"]
    assert store.count_threads(status="idle", metadata={"user": "ann"}) == 2
    assert _ids(store.search_threads(status=["idle"], metadata={"user": "ann"}, limit=1)) == ["d"]
    assert _ids(store.search_threads(status="idle", metadata={"user": "ann"}, offset=1)) == ["a"]
    for status in ("idle", "running", ["idle", "running"]):
        expected = [t["thread_id"] for t in store.threads(status=status)]
        assert _ids(store.search_threads(status=status, limit=100)) == expected
        assert store.count_threads(status=status) == len(expected)
    store.release("c", claim.token)
    env.clock.advance(100)
    _put(store, "b", store.search_threads(ids=["b"])[0]["status"]["checkpoint_id"], {"user": "bob"})
    for seconds in (50, 103, 105):
        expected = [t["thread_id"] for t in store.threads(inactive_for=seconds)]
        found = store.search_threads(inactive_for=seconds, limit=100)
        assert _ids(found) == expected, seconds
        assert store.count_threads(inactive_for=seconds) == len(expected)
    assert _ids(store.search_threads(inactive_for=50, metadata={"user": "bob"})) == []
    assert store.count_threads(inactive_for=50, metadata={"user": "ann"}) == 3


@contract_case(40)
def case_search_follows_retraction_deletion_and_pruning(env: ContractEnv) -> None:
    """The index follows the latest root checkpoint through every path that removes one."""
    store = env.open()
    chains = _fill(env, store)
    claim = store.claim("d", "worker", 60)
    turn = {"user": "dan", "source": "input"}  # a new turn: what `retract_turn` removes
    latest = _put(store, "d", chains["d"][-1], turn, step=9, token=claim.token)
    assert _ids(store.search_threads(metadata={"user": "dan"})) == ["d"]
    store.retract_turn("d", claim.token)  # back to the checkpoint before
    assert store.get_tuple(token_config("d", None, None))
    assert latest not in {t.config["configurable"]["checkpoint_id"] for t in store.list(None)}
    assert store.search_threads(metadata={"user": "dan"}) == []
    assert _ids(store.search_threads(metadata={"topic": "sales"})) == ["d"]
    store.release("d", claim.token)
    store.prune(["a"], strategy="keep_latest")
    by_id = {"sort_by": "thread_id", "order": "asc"}
    assert _ids(store.search_threads(metadata={"user": "ann"}, **by_id)) == [
        "a",
        "c",
        "d",
    ]
    store.delete_thread("a")
    assert store.count_threads(metadata={"user": "ann"}) == 2
    assert "a" not in _ids(store.search_threads(limit=100))
    _put(store, "a", None, {"user": "bob"})  # the id's next incarnation
    assert _ids(store.search_threads(metadata={"user": "bob"}, **by_id)) == ["a", "b"]


@contract_case(40)
def case_search_refuses_bad_arguments_naming_them(env: ContractEnv) -> None:
    """Each malformed argument is `InvalidArgument` naming it, before anything is read."""
    store = env.open()
    _fill(env, store)
    bad: list[tuple[str, dict[str, Any]]] = [
        ("metadata", {"metadata": ["user"]}),
        ("metadata", {"metadata": {1: "x"}}),
        ("metadata", {"metadata": {"user": object()}}),
        ("status", {"status": "sleeping"}),
        ("ids", {"ids": "a"}),
        ("ids", {"ids": [1]}),
        ("inactive_for", {"inactive_for": -1}),
        ("inactive_for", {"inactive_for": "7d"}),
        ("sort_by", {"sort_by": "created_at"}),
        ("order", {"order": "newest"}),
        ("limit", {"limit": 0}),
        ("limit", {"limit": True}),
        ("limit", {"limit": "20"}),
        ("offset", {"offset": -1}),
    ]
    for argument, kwargs in bad:
        exc = _raises(InvalidArgument, store.search_threads, **kwargs)
        assert exc.argument == argument, (argument, kwargs, exc)
        if argument not in ("sort_by", "order", "limit", "offset"):
            exc = _raises(InvalidArgument, store.count_threads, **kwargs)
            assert exc.argument == argument, (argument, kwargs, exc)
    _raises(TypeError, store.count_threads, limit=10)  # a count has no page
