"""Bad argument shapes are `InvalidArgument` naming the argument, before the file is touched.

Each row of `SHAPES` is one way a caller can hand the saver (or the runner) an
argument of the wrong shape that used to escape as a raw `ValueError`,
`TypeError`, `AttributeError`, `UnicodeEncodeError` (raised inside the write
transaction, by SQLite's UTF-8 binding) or `OverflowError` (SQLite's INTEGER is
64 bits), or that was silently accepted (`list({"configurable": ""})` listed
every thread). Every row must raise `InvalidArgument` whose `argument` names
the argument, leave the file byte for byte unchanged, and raise the same on a
closed store (proof that the check ran before any engine job).
"""

from __future__ import annotations

import math
import sqlite3
from collections import ChainMap, deque
from collections.abc import Callable
from typing import Any

import pytest
from langgraph.graph import START, StateGraph
from support.files import dump, read_bytes
from support.puts import new_checkpoint
from typing_extensions import TypedDict

from langgraph_fenced_sqlite import FencedRunner, FencedSqliteSaver, InvalidArgument
from langgraph_fenced_sqlite.core.stored_json import MAX_JSON_DEPTH

S = "\ud800"  # a lone surrogate: a valid Python str that is not valid UTF-8
BIG = 2**63  # one more than SQLite's largest INTEGER


class _State(TypedDict, total=False):
    n: int


def _graph() -> Any:
    graph = StateGraph(_State)
    graph.add_node("inc", lambda s: {"n": s.get("n", 0) + 1})
    graph.add_edge(START, "inc")
    return graph.compile()


class World:
    """A store with one claimed thread `t` and two checkpoints, and a runner on it."""

    def __init__(self, store: FencedSqliteSaver) -> None:
        self.store = store
        self.claim = store.claim("t", "alice", 60)
        config = self.claim.config()
        for step in range(2):
            cp = new_checkpoint({"n": step})
            config = store.put(self.claim.config(config), cp, {"source": "loop", "step": step}, {})
        self.cp = self.claim.config(config)
        self.runner = FencedRunner(_graph(), store, holder="runner")


MD = {"source": "loop", "step": 2}


def _append(w: World, events: Any) -> Any:
    return w.store.append_events("t", w.claim.token, events)


def _end(w: World, kind: Any, data: Any = None, **kwargs: Any) -> Any:
    return w.store.end_run("t", w.claim.token, kind, data, **kwargs)


def _retract(w: World, run_id: Any) -> Any:
    return w.store.retract_turn("t", w.claim.token, run_id=run_id)


def _conf(**configurable: Any) -> Any:
    return {"configurable": configurable}


# (id, call, the argument `InvalidArgument.argument` must start with)
Row = tuple[str, Callable[[World], Any], str]
SHAPES: list[Row] = [
    # 1-3: malformed `writes`
    ("writes-not-a-list", lambda w: w.store.put_writes(w.cp, 5, "task"), "writes"),
    ("writes-str", lambda w: w.store.put_writes(w.cp, "ab", "task"), "writes"),
    ("writes-item-not-pair", lambda w: w.store.put_writes(w.cp, [1, 2], "task"), "writes[0]"),
    (
        "writes-deque-channel-int",
        lambda w: w.store.put_writes(w.cp, deque([("c", 1), (1, 2)]), "task"),
        "writes[1][0]",
    ),
    ("writes-item-triple", lambda w: w.store.put_writes(w.cp, [("c", 1, 2)], "task"), "writes[0]"),
    ("writes-channel-int", lambda w: w.store.put_writes(w.cp, [(1, 2)], "task"), "writes[0][0]"),
    # 4-5: metadata None / not a dict
    ("metadata-none", lambda w: w.store.put(w.cp, new_checkpoint(), None, {}), "metadata"),
    (
        "metadata-list",
        lambda w: w.store.put(w.cp, new_checkpoint(), [("source", "loop")], {}),
        "metadata",
    ),
    # 6: non-dict parts of a config
    (
        "config-metadata-int",
        lambda w: w.store.put({**w.cp, "metadata": 5}, new_checkpoint(), MD, {}),
        'config["metadata"]',
    ),
    (
        "config-metadata-int-key",
        lambda w: w.store.put({**w.cp, "metadata": {1: "x"}}, new_checkpoint(), MD, {}),
        'config["metadata"]',
    ),
    # LangGraph's graphs pass a ChainMap; its quick walk must refuse what the full one does.
    (
        "config-metadata-chainmap-int-key",
        lambda w: w.store.put(
            {**w.cp, "metadata": ChainMap({"a": 1}, {1: "x"})}, new_checkpoint(), MD, {}
        ),
        'config["metadata"]',
    ),
    (
        "config-metadata-chainmap-surrogate",
        lambda w: w.store.put({**w.cp, "metadata": ChainMap({"a": S})}, new_checkpoint(), MD, {}),
        'config["metadata"]',
    ),
    (
        "config-metadata-chainmap-big-int",
        lambda w: w.store.put_writes({**w.cp, "metadata": ChainMap({}, {"n": BIG})}, [], "t"),
        'config["metadata"]',
    ),
    (
        "config-metadata-chainmap-deep",
        lambda w: w.store.get_tuple(
            {**w.cp, "metadata": ChainMap({"d": _deep(MAX_JSON_DEPTH + 50)})}
        ),
        'config["metadata"]',
    ),
    ("list-configurable-str", lambda w: list(w.store.list({"configurable": ""})), "config"),
    ("list-configurable-none", lambda w: list(w.store.list({"configurable": None})), "config"),
    ("list-config-str", lambda w: list(w.store.list("t")), "config"),  # type: ignore[arg-type]
    # 7: a `before` that is not a config
    ("list-before-str", lambda w: list(w.store.list(None, before="abc")), "before"),  # type: ignore[arg-type]
    (
        "list-before-configurable-str",
        lambda w: list(w.store.list(None, before={"configurable": "x"})),
        "before",
    ),
    # 8: non-JSON filter values and keys
    ("filter-object", lambda w: list(w.store.list(None, filter={"a": object()})), "filter"),
    ("filter-nan", lambda w: list(w.store.list(None, filter={"a": math.nan})), "filter"),
    ("filter-int-key", lambda w: list(w.store.list(None, filter={1: 1})), "filter"),
    # 9: integers SQLite cannot hold
    ("renew-token-big", lambda w: w.store.renew("t", BIG, 10), "token"),
    ("release-token-big", lambda w: w.store.release("t", BIG), "token"),
    ("append-token-big", lambda w: w.store.append_events("t", BIG, [("k", {})]), "token"),
    ("retract-token-big", lambda w: w.store.retract_turn("t", BIG), "token"),
    ("events-after-big", lambda w: w.store.events_after("t", BIG, 10), "after_seq"),
    ("events-limit-big", lambda w: w.store.events_after("t", 0, BIG), "limit"),
    ("history-limit-big", lambda w: w.store.history("t", limit=BIG), "limit"),
    ("history-records-limit-big", lambda w: w.store.history_records("t", limit=BIG), "limit"),
    ("wait-after-big", lambda w: w.store.wait_events("t", BIG, timeout=0.01), "after_seq"),
    ("compact-before-big", lambda w: w.store.compact_events("t", BIG), "before_seq"),
    ("list-limit-big", lambda w: list(w.store.list(None, limit=BIG)), "limit"),
    (
        "config-token-big",
        lambda w: w.store.put(
            {"configurable": {**w.cp["configurable"], "__fence_token__": BIG}},
            new_checkpoint(),
            MD,
            {},
        ),
        'config["configurable"]',
    ),
    (
        "metadata-step-big",
        lambda w: w.store.put(w.cp, new_checkpoint(), {**MD, "step": BIG}, {}),
        "metadata",
    ),
    (
        "event-data-big",
        lambda w: _append(w, [("k", {"v": BIG})]),
        "events",
    ),
    # 10: seconds as ints beyond a float
    ("ttl-int-huge", lambda w: w.store.claim("u", "bob", 10**400), "ttl"),
    ("renew-ttl-int-huge", lambda w: w.store.renew("t", w.claim.token, 10**400), "ttl"),
    ("timeout-int-huge", lambda w: w.store.wait_events("t", 0, timeout=10**400), "timeout"),
    # 11: lone surrogates in ids that reach SQLite
    ("claim-thread-surrogate", lambda w: w.store.claim(S, "bob", 10), "thread_id"),
    ("claim-holder-surrogate", lambda w: w.store.claim("u", S, 10), "holder"),
    (
        "get-tuple-thread-surrogate",
        lambda w: w.store.get_tuple(_conf(thread_id=S)),
        "config",
    ),
    (
        "list-ns-surrogate",
        lambda w: list(w.store.list(_conf(checkpoint_ns=S))),
        "config",
    ),
    (
        "put-checkpoint-id-surrogate",
        lambda w: w.store.put(w.cp, new_checkpoint(id=S), MD, {}),
        "checkpoint",
    ),
    ("put-writes-task-surrogate", lambda w: w.store.put_writes(w.cp, [("c", 1)], S), "task_id"),
    (
        "put-writes-channel-surrogate",
        lambda w: w.store.put_writes(w.cp, [(S, 1)], "task"),
        "writes[0][0]",
    ),
    ("history-before-surrogate", lambda w: w.store.history("t", before=S), "before"),
    ("events-after-thread-surrogate", lambda w: w.store.events_after(S), "thread_id"),
    ("delete-thread-surrogate", lambda w: w.store.delete_thread(S), "thread_id"),
    ("copy-thread-surrogate", lambda w: w.store.copy_thread("t", S), "target_thread_id"),
    ("delete-for-runs-surrogate", lambda w: w.store.delete_for_runs([S]), "run_ids"),
    ("prune-surrogate", lambda w: w.store.prune([S]), "thread_ids"),
    (
        "retract-run-surrogate",
        lambda w: _retract(w, S),
        "run_id",
    ),
    ("current-claim-surrogate", lambda w: w.store.current_claim(S), "thread_id"),
    ("inspect-surrogate", lambda w: w.store.inspect_checkpoint(S), "thread_id"),
    ("begin-run-surrogate", lambda w: w.store.begin_run("u", "h", 10, run_id=S), "run_id"),
    ("delete-unclaimed-surrogate", lambda w: w.store.delete_unclaimed_thread(S, "h"), "thread_id"),
    # 12: lone surrogates in kinds, metadata, event data, filter keys and values
    (
        "event-kind-surrogate",
        lambda w: _append(w, [(S, {})]),
        "events",
    ),
    (
        "event-data-surrogate",
        lambda w: _append(w, [("k", {"a": S})]),
        "events",
    ),
    (
        "event-data-key-surrogate",
        lambda w: _append(w, [("k", {S: 1})]),
        "events",
    ),
    ("end-run-kind-surrogate", lambda w: _end(w, S), "kind"),
    (
        "end-run-data-surrogate",
        lambda w: _end(w, "run_failed", {"a": S}),
        "data",
    ),
    (
        "metadata-value-surrogate",
        lambda w: w.store.put(w.cp, new_checkpoint(), {**MD, "x": S}, {}),
        "metadata",
    ),
    (
        "metadata-key-surrogate",
        lambda w: w.store.put(w.cp, new_checkpoint(), {**MD, S: 1}, {}),
        "metadata",
    ),
    (
        "metadata-run-id-surrogate",
        lambda w: w.store.put(w.cp, new_checkpoint(), {**MD, "run_id": S}, {}),
        "metadata",
    ),
    (
        "configurable-value-surrogate",
        lambda w: w.store.put(w.claim.config(w.cp, user=S), new_checkpoint(), MD, {}),
        'config["configurable"]',
    ),
    ("envelope-surrogate", lambda w: w.store.put(w.cp, new_checkpoint(ts=S), MD, {}), "checkpoint"),
    ("filter-value-surrogate", lambda w: list(w.store.list(None, filter={"a": S})), "filter"),
    ("filter-key-surrogate", lambda w: list(w.store.list(None, filter={S: 1})), "filter"),
    # 13: events that are not a list of events
    ("events-int", lambda w: _append(w, 5), "events"),
    ("events-none", lambda w: _append(w, None), "events"),
    (
        "event-data-int-key",
        lambda w: _append(w, [("k", {1: 1})]),
        "events",
    ),
    # 14: other shapes of other public methods
    ("end-run-data-list", lambda w: _end(w, "run_failed", [1]), "data"),
    (
        "end-run-static-str",
        lambda w: _end(w, "k", static_interrupt="x"),
        "static_interrupt",
    ),
    ("prune-dry-run-str", lambda w: w.store.prune(["t"], dry_run="yes"), "dry_run"),
    ("next-version-garbage", lambda w: w.store.get_next_version("abc", None), "current"),
    ("next-version-object", lambda w: w.store.get_next_version(object(), None), "current"),  # type: ignore[arg-type]
    (
        "deep-metadata",
        lambda w: w.store.put(w.cp, new_checkpoint(), {**MD, "d": _deep(MAX_JSON_DEPTH + 50)}, {}),
        "metadata",
    ),
    # 15-16: the runner's entry points
    (
        "runner-thread-surrogate",
        lambda w: w.runner.invoke({"n": 0}, {"configurable": {"thread_id": S}}),
        "config",
    ),
    (
        "runner-metadata-int",
        lambda w: w.runner.invoke({"n": 0}, {"configurable": {"thread_id": "r"}, "metadata": 5}),
        'config["metadata"]',
    ),
    ("runner-delete-surrogate", lambda w: w.runner.delete_thread(S), "thread_id"),
]


def _deep(n: int) -> Any:
    value: Any = 1
    for _ in range(n):
        value = [value]
    return value


def test_shapes_have_unique_ids() -> None:
    """Every row is reported on its own."""
    assert len({row[0] for row in SHAPES}) == len(SHAPES)


@pytest.mark.parametrize(("call", "argument"), [r[1:] for r in SHAPES], ids=[r[0] for r in SHAPES])
def test_bad_shape_is_invalid_argument_before_the_file_is_touched(
    open_store: Any, db_path: str, call: Callable[[World], Any], argument: str
) -> None:
    """The call raises InvalidArgument naming `argument`; the file is byte-for-byte unchanged."""
    world = World(open_store())
    before = (dump(db_path), read_bytes(db_path), read_bytes(db_path + "-wal"))
    watcher = sqlite3.connect(db_path)
    version = watcher.execute("PRAGMA data_version").fetchone()[0]
    try:
        with pytest.raises(InvalidArgument) as info:
            call(world)
        assert info.value.argument.startswith(argument), info.value.to_dict()
        assert str(info.value).startswith(info.value.argument)
        assert watcher.execute("PRAGMA data_version").fetchone()[0] == version
    finally:
        watcher.close()
    assert (dump(db_path), read_bytes(db_path), read_bytes(db_path + "-wal")) == before
    # Checked before any engine job: a closed store still names the argument.
    world.store.close()
    with pytest.raises(InvalidArgument) as info:
        call(world)
    assert info.value.argument.startswith(argument), info.value.to_dict()


def test_good_shapes_next_to_the_bad_ones_still_work(open_store: Any) -> None:
    """The checks refuse only what they must: JSON-ish values within range pass and read back."""
    world = World(open_store())
    store = world.store
    md = {**MD, "x": "ü", "nested": {"k": [1, 2**63 - 1, -(2**63), 1.5, None, True]}}
    config = store.put(world.cp, new_checkpoint({"n": 9}), md, {})
    store.put_writes(world.claim.config(config), [("c", 1), ["d", "ü"]], "task")
    got = store.get_tuple(config)
    assert got is not None and {k: got.metadata[k] for k in md} == md  # type: ignore[literal-required]
    assert sorted(w[1] for w in got.pending_writes or []) == ["c", "d"]
    assert [t.config for t in store.list(None, filter={"nested": md["nested"]})] == [got.config]
    assert [t.config for t in store.list({"configurable": {}}, limit=1)] == [got.config]
    seqs = store.append_events("t", world.claim.token, [("k", {"v": 2**63 - 1, "s": "ü"})])
    assert store.events_after("t", seqs[0] - 1)[0].data == {"v": 2**63 - 1, "s": "ü"}


def test_chainmap_config_metadata_is_checked_as_its_lookups_see_it(open_store: Any) -> None:
    """A ChainMap of dicts (LangGraph's config metadata) passes when every visible entry is fine.

    The first map holding a key wins, as in a lookup; the merged entries end
    up in the checkpoint's metadata as LangGraph's own savers store them.
    """
    world = World(open_store())
    store = world.store
    meta = ChainMap({"user": "ann", "n": 2}, {"user": "bob", "tag": "x", "k": 2**63 - 1})
    config = store.put({**world.cp, "metadata": meta}, new_checkpoint({"n": 9}), MD, {})
    got = store.get_tuple(config)
    assert got is not None
    assert {k: got.metadata.get(k) for k in ("user", "n", "tag", "k")} == {
        "user": "ann",
        "n": 2,
        "tag": "x",
        "k": 2**63 - 1,
    }
    # A ChainMap over a non-dict mapping is judged by the full walk, with the same answer.
    odd = ChainMap(ChainMap({"a": 1}))
    store.put_writes({**world.claim.config(config), "metadata": odd}, [("c", 1)], "task")


@pytest.mark.parametrize(
    "meta",
    [
        ChainMap({"run_id": "r1", "a": 1}, {"run_id": "r0", "b": "x\x00y"}),
        ChainMap({}, {"run_id": "r2"}),
        ChainMap(),
        ChainMap(ChainMap({"run_id": "r3"})),
        {"run_id": "r4", "c": 1.5},
        None,
    ],
    ids=["overlapping", "second-map", "empty", "nested", "dict", "none"],
)
def test_graph_config_metadata_reads_as_langgraph_reads_it(meta: Any) -> None:
    """A config's metadata, read in C where it can be, gives LangGraph's run id and metadata."""
    from langgraph.checkpoint.base import get_serializable_checkpoint_metadata

    from langgraph_fenced_sqlite.core import checkpoints as cps
    from langgraph_fenced_sqlite.core.serde import DataOnlySerializer
    from langgraph_fenced_sqlite.core.stored_json import dumps_json

    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "user": "u"}}
    if meta is not None:
        config["metadata"] = meta
    run_id = (config.get("metadata") or {}).get("run_id")
    assert cps.run_id_of(config) == (None if run_id is None else str(run_id))
    md = {"source": "loop", "step": 1, "parents": {}}
    enc = cps.encode_checkpoint(DataOnlySerializer(), config, new_checkpoint(), md, "t", "")
    expected = get_serializable_checkpoint_metadata(config, md)
    assert enc.metadata == dumps_json(expected, "metadata")
    assert list(expected) == list(
        get_serializable_checkpoint_metadata({**config, "metadata": dict(meta or {})}, md)
    )
