"""Contract cases 3, 28 and 34, values stored once (docs/semantics.md §7): what goes, what breaks.

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


def _inputs(store: Any, thread_id: str, n: int) -> tuple[list[str], list[str]]:
    """Put `n` turns as LangGraph's input step makes them; return the checkpoint ids and inputs.

    The input checkpoint's `__start__` channel holds the turn's input, and
    the `__start__` task writes that input to its checkpoint.
    """
    config = _config(thread_id)
    messages: list[str] = []
    ids, asks = [], []
    for step in range(n):
        ask = f"question {step}: " + "words of the question " * 20
        cp = _checkpoint({"messages": messages, "__start__": {"messages": [ask]}})
        cp["channel_versions"] = {"messages": f"{step + 1:032}.0", "__start__": f"{step + 1:032}.0"}
        stored = store.put(config, cp, {"source": "input", "step": step, "parents": {}}, {})
        config = {"configurable": {**config["configurable"], **stored["configurable"]}}
        store.put_writes(
            config, [("messages", [ask])], f"start-{step}", "~__pregel_pull, __start__"
        )
        messages = [*messages, ask]
        ids.append(cp["id"])
        asks.append(ask)
    return ids, asks


@contract_case(3, needs=("storage", "reopen"))
def case_a_write_its_checkpoint_holds_is_stored_once_and_reads_back(env: ContractEnv) -> None:
    """The `__start__` task's write of the input is stored as a slice of it; it reads back equal."""
    assert env.storage is not None
    store = env.open()
    ids, asks = _inputs(store, "t", 4)
    types = env.storage.write_types("t")
    assert types.count("lgfs-slice") == 4, types
    store = env.reopen(store)  # holds none of the values it put
    for cid, ask in zip(ids, asks, strict=True):
        tup = store.get_tuple(_config("t", checkpoint_id=cid))
        assert tup is not None and tup.pending_writes == [
            (f"start-{ids.index(cid)}", "messages", [ask])
        ]
    listed = {t.checkpoint["id"]: t.pending_writes for t in store.list(_config("t"))}
    expected = [[(f"start-{i}", "messages", [a])] for i, a in enumerate(asks)]
    assert listed == dict(zip(ids, expected, strict=True))
    store.copy_thread("t", "u")  # the copies' writes name the copies' values
    store.delete_thread("t")
    assert [t.pending_writes for t in store.list(_config("u"))] == expected[::-1]


@contract_case(34, needs=("storage", "reopen"))
def case_a_forged_slice_write_is_undecodable(env: ContractEnv) -> None:
    """A slice write pointed at other bytes of its checkpoint (checksum fixed) is refused."""
    assert env.storage is not None
    store = env.open()
    ids, _ = _inputs(store, "t", 2)
    assert env.storage.shift_slices("t") == 2
    store = env.reopen(store)
    exc = _expect(lambda: store.get_tuple(_config("t")), UndecodableRow)
    assert exc.checkpoint_id == ids[-1] and "slice" in exc.reason, exc.reason
    _expect(lambda: list(store.list(_config("t"))), UndecodableRow)


def _ask(step: int) -> str:
    # A question of ~500 bytes of varied words (text a compressor cannot
    # shrink to a few bytes, as a repeated phrase would be).
    words = (f"w{(step * 7919 + i * 104729) % 9973}" for i in range(90))
    return f"question {step}: " + " ".join(words)


def _asked(store: Any, thread_id: str, n: int) -> list[str]:
    """Put `n` turns as LangGraph's input step and the step after it make them.

    Each turn's input checkpoint holds the question in its `__start__`
    channel; the next checkpoint's `messages` gained it. Returns the
    questions.
    """
    config = _config(thread_id)
    messages: list[str] = []
    asks = []
    for step in range(n):
        ask = _ask(step)
        cp = _checkpoint({"messages": messages, "__start__": {"messages": [ask]}})
        cp["channel_versions"] = {"messages": f"{2 * step:032}.0", "__start__": f"{step:032}.1"}
        stored = store.put(config, cp, {"source": "input", "step": 2 * step, "parents": {}}, {})
        config = {"configurable": {**config["configurable"], **stored["configurable"]}}
        messages = [*messages, ask]
        cp = _checkpoint({"messages": messages})
        cp["channel_versions"] = {"messages": f"{2 * step + 1:032}.0"}
        stored = store.put(config, cp, {"source": "loop", "step": 2 * step + 1, "parents": {}}, {})
        config = {"configurable": {**config["configurable"], **stored["configurable"]}}
        asks.append(ask)
    return asks


@contract_case(28, needs=("storage", "reopen"))
def case_a_message_its_input_holds_is_stored_once_and_outlives_the_input(
    env: ContractEnv,
) -> None:
    """A list's new message that its input checkpoint holds is stored once, and kept as needed.

    The step after an input step gains the message the input checkpoint's
    `__start__` channel holds: its row names those bytes instead of holding
    them again (semantics §7a). Removing the input checkpoints keeps the rows
    a kept checkpoint reads through; once nothing reads through them, they go.
    """
    assert env.storage is not None
    store = env.open()
    asks = _asked(store, "t", 5)
    rows = env.storage.value_rows("t")
    starts = sum(size for channel, _, size in rows if channel == "__start__")
    messages = sum(size for channel, _, size in rows if channel == "messages")
    # The questions' bytes are stored once, in the inputs: the list's rows
    # hold the first (stored whole) and four references, not five copies.
    assert 2 * messages < starts, (starts, messages)
    store.prune(["t"], strategy="keep_latest")
    # The latest list reads the last four questions through their inputs'
    # rows: those four stay (the first question is in the list's own row).
    kept = [key for channel, key, _ in env.storage.value_rows("t") if channel == "__start__"]
    assert len(kept) == 4, kept
    store = env.reopen(store)  # holds none of the values it put
    assert _values(store, "t")["messages"] == asks
    # A list that is no extension (its first message edited) is stored whole:
    # the latest checkpoint then reads through no input, so pruning to it
    # frees every input's row.
    edited = ["edited", *asks[1:]]
    cp = _checkpoint({"messages": edited})
    cp["channel_versions"] = {"messages": f"{99:032}.0"}
    tup = store.get_tuple(_config("t"))
    assert tup is not None
    store.put(tup.config, cp, {"source": "update", "step": 99, "parents": {}}, {})
    store.prune(["t"], strategy="keep_latest")
    assert not any(channel == "__start__" for channel, _, _ in env.storage.value_rows("t"))
    store = env.reopen(store)
    assert _values(store, "t")["messages"] == edited


def _replied(store: Any, thread_id: str, n: int, *, runs: bool = False) -> tuple[list[str], Any]:
    """Put `n` steps as a chat's reply node makes them; return the replies and the last config.

    Each step's checkpoint gets the node's pending write (its reply, in a
    list, as `add_messages` is written to), and the next checkpoint's list
    gains that reply. With `runs`, step k's put and write are run `run-k`'s.
    """
    config = _config(thread_id)
    messages: list[str] = []
    for step in range(n):
        if runs:
            config = {**config, "metadata": {"run_id": f"run-{step}"}}
        cp = _checkpoint({"messages": messages})
        cp["channel_versions"] = {"messages": f"{step + 1:032}.0"}
        stored = store.put(config, cp, {"source": "loop", "step": step, "parents": {}}, {})
        config = {"configurable": {**config["configurable"], **stored["configurable"]}}
        reply = "reply " + _ask(step + 500)
        store.put_writes(config, [("messages", [reply])], f"task-{step}", "~reply")
        messages = [*messages, reply]
    return messages, config


@contract_case(28, needs=("storage", "reopen"))
def case_a_reply_its_write_holds_is_stored_once_and_outlives_the_write(
    env: ContractEnv,
) -> None:
    """A list's new message that the parent's pending write holds is stored once, and kept.

    The step after a node's write gains what the node wrote: the new row names
    the write's bytes instead of holding them again (semantics §7a). A removal
    that takes the write first makes the row whole; every checkpoint reads
    back what was put, before and after, from a store that holds none of it.
    """
    assert env.storage is not None
    store = env.open()
    replies, config = _replied(store, "t", 6)
    cp = _checkpoint({"messages": replies})
    cp["channel_versions"] = {"messages": f"{7:032}.0"}
    store.put(config, cp, {"source": "loop", "step": 6, "parents": {}}, {})
    lent = [c for c in env.storage.borrow_cells("t") if "w" in c]
    # The first list is stored whole; each later one names its reply's write.
    assert len(lent) == 5, env.storage.borrow_cells("t")
    store = env.reopen(store)  # holds none of the values it put
    lists = [t.checkpoint["channel_values"]["messages"] for t in store.list(_config("t"))]
    assert lists == [replies[:k] for k in range(6, -1, -1)], lists
    store.prune(["t"], strategy="keep_latest")
    # The writes went with their checkpoints; the kept list's rows that named
    # them now hold the bytes themselves.
    assert not [c for c in env.storage.borrow_cells("t") if "w" in c]
    store = env.reopen(store)
    assert _values(store, "t")["messages"] == replies


@contract_case(28, needs=("storage", "reopen"))
def case_a_row_naming_a_replaced_write_is_undecodable_and_never_named_again(
    env: ContractEnv,
) -> None:
    """A write a row names, replaced below the API (checksum fixed), makes the row unreadable.

    Reads refuse it as `UndecodableRow` naming the channel, never another
    value; a put whose values would name that write (this process holds it
    as it wrote it) is refused by the store and stored naming no write.
    """
    assert env.storage is not None
    store = env.open()
    replies, config = _replied(store, "t", 3)
    cp = _checkpoint({"messages": replies})
    cp["channel_versions"] = {"messages": f"{4:032}.0"}
    stored = store.put(config, cp, {"source": "loop", "step": 3, "parents": {}}, {})
    assert [c for c in env.storage.borrow_cells("t") if "w" in c]
    config = {"configurable": {**config["configurable"], **stored["configurable"]}}
    store.put_writes(config, [("messages", ["reply " + _ask(900)])], "task-3", "~reply")
    assert env.storage.plant_clear_writes("t", b"\x91\xa5other") == 4
    lent = len([c for c in env.storage.borrow_cells("t") if "w" in c])
    cp = _checkpoint({"messages": [*replies, "reply " + _ask(900)]})
    cp["channel_versions"] = {"messages": f"{5:032}.0"}
    store.put(config, cp, {"source": "loop", "step": 4, "parents": {}}, {})
    # The put named no write: the store refused the one naming the replaced write.
    assert len([c for c in env.storage.borrow_cells("t") if "w" in c]) == lent
    store = env.reopen(store)
    err = _expect(lambda: _values(store, "t"), UndecodableRow)
    assert "'messages'" in str(err), err


@contract_case(28, needs=("storage", "reopen"))
def case_a_run_deleted_from_the_middle_leaves_later_lists_whole(env: ContractEnv) -> None:
    """delete_for_runs takes a run's checkpoint and write; a later list that named it reads back.

    The next checkpoint's list named the removed write's bytes (its reply):
    the removal makes that row whole first, so every checkpoint left reads
    back what was put, from a store that holds none of it.
    """
    assert env.storage is not None
    store = env.open()
    replies, _ = _replied(store, "t", 6, runs=True)
    named = [c["w"][0] for c in env.storage.borrow_cells("t") if "w" in c]
    assert len(named) == 4, env.storage.borrow_cells("t")
    store.delete_for_runs(["run-2"])
    # The write of run-2 went: no row names it any more.
    assert len([c for c in env.storage.borrow_cells("t") if "w" in c]) == 3
    store = env.reopen(store)
    lists = [t.checkpoint["channel_values"]["messages"] for t in store.list(_config("t"))]
    assert lists == [replies[:k] for k in (5, 4, 3, 1, 0)], lists
