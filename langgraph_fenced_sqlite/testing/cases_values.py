"""Contract cases 28 and 34 for values stored once (docs/semantics.md §7): what goes, what breaks.

Each case writes through the store's API, then reads or damages its value
rows below it (`env.storage`, capability "storage") and checks what the
store's own calls make of that: a removal leaves no value row only removed
checkpoints needed and takes none a kept one needs; a damaged value row
reads as `UndecodableRow` naming its channel, never as another value.
"""

from __future__ import annotations

from typing import Any

from ..errors import UndecodableRow
from ._helpers import expect_error as _expect
from ._helpers import plain_config as _config
from ._helpers import values_checkpoint as _checkpoint
from .harness import ContractEnv, contract_case


def _turns(store: Any, thread_id: str, n: int) -> list[str]:
    """Put `n` checkpoints as a chat makes them: a list growing by one message, a value
    replaced every step; return their ids."""
    config = _config(thread_id)
    messages: list[str] = []
    ids = []
    for step in range(n):
        messages = [*messages, f"message {step}: " + "words of the turn " * 20]
        cp = _checkpoint({"messages": messages, "status": f"at step {step} " * 30})
        cp["channel_versions"] = {"messages": f"{step + 1:032}.0", "status": f"{step + 1:032}.0"}
        stored = store.put(config, cp, {"source": "loop", "step": step, "parents": {}}, {})
        config = {"configurable": {**config["configurable"], **stored["configurable"]}}
        ids.append(cp["id"])
    return ids


def _values(store: Any, thread_id: str) -> dict[str, Any]:
    tup = store.get_tuple(_config(thread_id))
    assert tup is not None, thread_id
    values: dict[str, Any] = tup.checkpoint["channel_values"]
    return values


@contract_case(28, needs=("storage",))
def case_removals_free_the_value_rows_only_removed_checkpoints_named(env: ContractEnv) -> None:
    """keep_latest frees what only the removed checkpoints named; delete_thread frees all."""
    assert env.storage is not None
    store = env.open()
    _turns(store, "t", 8)
    _turns(store, "u", 3)
    before = env.storage.value_rows("t")
    others = sorted(env.storage.value_rows("u"))
    latest = _values(store, "t")
    assert before, "the store holds no value row of thread t"
    store.prune(["t"], strategy="keep_latest")
    after = env.storage.value_rows("t")
    assert 0 < len(after) < len(before), (len(before), len(after))
    assert sum(r[2] for r in after) < sum(r[2] for r in before)
    assert _values(store, "t") == latest
    store.delete_thread("t")
    assert env.storage.value_rows("t") == []
    assert sorted(env.storage.value_rows("u")) == others
    assert len(_values(store, "u")["messages"]) == 3


@contract_case(34, needs=("storage", "reopen"))
def case_a_damaged_value_row_is_undecodable_naming_its_channel(env: ContractEnv) -> None:
    """A flipped bit in a value row: get_tuple, list and history refuse it; inspection names it."""
    assert env.storage is not None
    store = env.open()
    ids = _turns(store, "t", 3)
    assert env.storage.damage_values("t", "messages") > 0
    store = env.reopen(store)  # holds none of the values it put
    exc = _expect(lambda: store.get_tuple(_config("t")), UndecodableRow)
    assert exc.checkpoint_id == ids[-1] and "'messages'" in exc.reason, exc.reason
    _expect(lambda: list(store.list(_config("t"))), UndecodableRow)
    _expect(lambda: store.history("t"), UndecodableRow)
    shown = store.inspect_checkpoint("t")
    assert shown is not None and shown["checkpoint"] is None
    assert "channel 'messages'" in shown["error"]["message"], shown["error"]
