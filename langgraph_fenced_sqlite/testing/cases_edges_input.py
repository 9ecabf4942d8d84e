"""Contract cases 29 (new shapes) and 35 (argument half): wrong shapes are `InvalidArgument`.

Each call below hands a store an argument of the wrong shape: a non-dict
config, configurable, metadata or `before`; malformed `writes`; events that
are not a list; non-JSON filters; integers beyond SQLite's 64 bits; lone
surrogates (valid Python strings that are not UTF-8). Each must raise
`InvalidArgument` whose `argument` names the argument, change nothing in the
file, and be raised before the store is consulted (a closed store still
names the argument rather than raising `StoreClosed`).
"""

from __future__ import annotations

import math
import sqlite3
from typing import Any

from ..errors import InvalidArgument
from ._helpers import AnyCall as _Call
from ._helpers import dump as _dump
from ._helpers import expect_error as _expect
from ._helpers import plain_config as _config
from ._helpers import put_chain as _put_chain
from ._helpers import values_checkpoint as _checkpoint
from .harness import ContractEnv, contract_case, raw

_S = "\ud800"  # a lone surrogate
_BIG = 2**63  # one more than SQLite's largest INTEGER
_MD = {"source": "loop", "step": 1}


def _check_all(env: ContractEnv, store: Any, calls: list[tuple[str, _Call]]) -> None:
    """Each call raises InvalidArgument naming its argument; the file is unchanged."""
    before = _dump(env.path)
    watcher = sqlite3.connect(env.path)
    version = watcher.execute("PRAGMA data_version").fetchone()[0]
    try:
        for name, call in calls:
            exc = _expect(call, InvalidArgument)
            assert exc.argument.startswith(name), (name, exc.to_dict())
        assert watcher.execute("PRAGMA data_version").fetchone()[0] == version
    finally:
        watcher.close()
    assert _dump(env.path) == before
    raw(store).close()
    for name, call in calls:
        exc = _expect(call, InvalidArgument)
        assert exc.argument.startswith(name), ("closed store", name, exc.to_dict())


@contract_case(29)
def case_malformed_writes_events_configs_and_filters_are_rejected(env: ContractEnv) -> None:
    """Malformed writes/events, non-dict configs and `before`, non-JSON filters: InvalidArgument."""
    store = env.open()
    granted = store.claim("t", "alice", 10)
    cp_id = _put_chain(store, "t", 1, config=granted.config())[0]
    cp = granted.config(_config("t", checkpoint_id=cp_id))
    token = granted.token
    calls: list[tuple[str, _Call]] = [
        ("writes", lambda: store.put_writes(cp, 5, "task")),
        ("writes", lambda: store.put_writes(cp, "ab", "task")),
        ("writes[0]", lambda: store.put_writes(cp, [1], "task")),
        ("writes[0]", lambda: store.put_writes(cp, [("c", 1, 2)], "task")),
        ("writes[0]", lambda: store.put_writes(cp, [(7, 1)], "task")),
        ("events", lambda: store.append_events("t", token, 5)),
        ("events", lambda: store.append_events("t", token, None)),
        ("events", lambda: store.append_events("t", token, [("k", {1: "x"})])),
        ("metadata", lambda: store.put(cp, _checkpoint(), None, {})),
        ("metadata", lambda: store.put(cp, _checkpoint(), ["source"], {})),
        ("config", lambda: store.put({**cp, "metadata": 5}, _checkpoint(), _MD, {})),
        ("config", lambda: list(store.list({"configurable": ""}))),
        ("config", lambda: list(store.list({"configurable": None}))),
        ("config", lambda: list(store.list("t"))),
        ("config", lambda: store.get_tuple({"configurable": "t"})),
        ("before", lambda: list(store.list(None, before="abc"))),
        ("before", lambda: list(store.list(None, before={"configurable": "x"}))),
        # Read as "no before", these would return the first page again.
        ("before", lambda: list(store.list(None, before={}))),
        ("before", lambda: list(store.list(None, before={"configurable": {"thread_id": "t"}}))),
        ("before", lambda: list(store.list(None, before={"thread_id": "t", "checkpoint_ns": ""}))),
        ("before", lambda: list(store.list(None, before={"checkpoint_id": cp_id, "id": 1}))),
        ("before", lambda: list(store.list(None, before={"checkpoint_id": 5}))),
        ("before", lambda: list(store.list(None, before={"thread_id": 5, "checkpoint_id": cp_id}))),
        # Read without `configurable`, this would list every thread.
        ("config", lambda: list(store.list({"thread_id": "t"}))),
        ("filter", lambda: list(store.list(None, filter={"a": object()}))),
        ("filter", lambda: list(store.list(None, filter={"a": math.nan}))),
        ("filter", lambda: list(store.list(None, filter={1: 1}))),
        ("dry_run", lambda: store.prune(["t"], dry_run="yes")),
    ]
    _check_all(env, store, calls)


@contract_case(35)
def case_wrong_shape_arguments_are_invalid_argument_and_change_nothing(env: ContractEnv) -> None:
    """Ints beyond 64 bits and lone surrogates anywhere they would reach SQLite: InvalidArgument."""
    store = env.open()
    granted = store.claim("t", "alice", 10)
    cp_id = _put_chain(store, "t", 1, config=granted.config())[0]
    cp = granted.config(_config("t", checkpoint_id=cp_id))
    token = granted.token
    big_token = {"configurable": {**cp["configurable"], "__fence_token__": _BIG}}
    calls: list[tuple[str, _Call]] = [
        # integers SQLite cannot hold
        ("token", lambda: store.renew("t", _BIG, 10)),
        ("token", lambda: store.release("t", _BIG)),
        ("token", lambda: store.append_events("t", _BIG, [("k", {})])),
        ("token", lambda: store.retract_turn("t", _BIG)),
        ("after_seq", lambda: store.events_after("t", _BIG, 10)),
        ("limit", lambda: store.events_after("t", 0, _BIG)),
        ("limit", lambda: store.history("t", limit=_BIG)),
        ("limit", lambda: list(store.list(None, limit=_BIG))),
        ("before_seq", lambda: store.compact_events("t", _BIG)),
        ("config", lambda: store.put(big_token, _checkpoint(), _MD, {})),
        ("metadata", lambda: store.put(cp, _checkpoint(), {**_MD, "step": _BIG}, {})),
        ("events", lambda: store.append_events("t", token, [("k", {"v": -_BIG - 1})])),
        ("ttl", lambda: store.claim("u", "bob", 10**400)),
        ("timeout", lambda: store.wait_events("t", 0, timeout=10**400)),
        # lone surrogates
        ("thread_id", lambda: store.claim(_S, "bob", 10)),
        ("holder", lambda: store.claim("u", _S, 10)),
        ("config", lambda: store.get_tuple(_config(_S))),
        ("config", lambda: store.put(_config("t", _S), _checkpoint(), _MD, {})),
        ("checkpoint", lambda: store.put(cp, {**_checkpoint(), "id": _S}, _MD, {})),
        ("task_id", lambda: store.put_writes(cp, [("c", 1)], _S)),
        ("writes[0]", lambda: store.put_writes(cp, [(_S, 1)], "task")),
        ("metadata", lambda: store.put(cp, _checkpoint(), {**_MD, "x": _S}, {})),
        ("metadata", lambda: store.put(cp, _checkpoint(), {**_MD, _S: 1}, {})),
        ("events", lambda: store.append_events("t", token, [(_S, {})])),
        ("events", lambda: store.append_events("t", token, [("k", {"a": _S})])),
        ("filter", lambda: list(store.list(None, filter={_S: 1}))),
        ("filter", lambda: list(store.list(None, filter={"a": _S}))),
        ("before", lambda: store.history("t", before=_S)),
        ("thread_id", lambda: store.delete_thread(_S)),
        ("target_thread_id", lambda: store.copy_thread("t", _S)),
        ("run_ids", lambda: store.delete_for_runs([_S])),
    ]
    _check_all(env, store, calls)
