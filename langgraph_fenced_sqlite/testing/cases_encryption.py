"""Contract case 39: encryption at rest (docs/semantics.md §7b).

Each case writes through a store opened with `encryption=`, then reopens
the same storage with another keyring (none, a wrong key, a rotated ring),
or changes its cells below the API as someone who can write the file but
holds no key could (`env.storage`: a ciphertext bit flipped with its
checksum fixed, a value planted in clear), and checks what the store's own
calls make of it: the values read back exactly under the right ring, and
every other read is `UndecodableRow` naming the thread and checkpoint,
never a value.
"""

from __future__ import annotations

from typing import Any

import ormsgpack

from ..core.encryption import Encryption
from ..errors import UndecodableRow
from ._helpers import expect_error as _expect
from ._helpers import plain_config as _config
from ._helpers import values_checkpoint as _checkpoint
from .harness import ContractEnv, contract_case

KEY = b"k" * 32
NEW_KEY = b"n" * 32
SECRET = "the-launch-code-is-0000"


def _turns(store: Any, thread_id: str, n: int) -> list[str]:
    """Put `n` checkpoints as a chat makes them, each with a pending write; return their ids."""
    config = _config(thread_id)
    messages: list[str] = []
    ids = []
    for step in range(n):
        messages = [*messages, f"{SECRET} message {step}: " + "words " * 30]
        cp = _checkpoint({"messages": messages, "flag": step % 2 == 0, "note": f"{SECRET} {step}"})
        cp["channel_versions"] = {k: f"{step + 1:032}.0" for k in cp["channel_values"]}
        stored = store.put(config, cp, {"source": "loop", "step": step, "parents": {}}, {})
        config = {"configurable": {**config["configurable"], **stored["configurable"]}}
        store.put_writes(config, [("messages", f"{SECRET} pending {step}")], f"task-{step}")
        ids.append(cp["id"])
    return ids


def _read_all(store: Any, thread_id: str) -> tuple[Any, ...]:
    """Everything a thread reads back: latest values and writes, every checkpoint's values."""
    tup = store.get_tuple(_config(thread_id))
    assert tup is not None, thread_id
    listed = [t.checkpoint["channel_values"] for t in store.list(_config(thread_id))]
    return tup.checkpoint["channel_values"], tup.pending_writes, listed


def _refused(env: ContractEnv, call: Any, thread_id: str, ids: list[str], why: str) -> None:
    exc = _expect(call, UndecodableRow)
    assert exc.thread_id == thread_id and exc.checkpoint_id in ids, (exc.thread_id, exc)
    assert why in exc.reason, exc.reason


@contract_case(39, needs=("storage", "reopen"))
def case_sealed_values_read_back_and_hold_nothing_in_clear(env: ContractEnv) -> None:
    """Values, writes and list pages read back exactly (a copied thread's too); no stored
    cell holds a byte of them."""
    assert env.storage is not None
    store = env.open(encryption=Encryption(KEY))
    _turns(store, "t", 5)
    before = _read_all(store, "t")
    store = env.reopen(store, encryption=Encryption(KEY))  # nothing held in memory
    assert _read_all(store, "t") == before
    assert len(before[0]["messages"]) == 5 and before[1][0][2] == f"{SECRET} pending 4"
    cells = env.storage.cells("t")
    assert cells and not any(SECRET.encode() in c for c in cells)
    counted = store.cell_keys()
    key_id = Encryption(KEY).key_id
    assert counted.clear == 0 and set(counted.cells) == {key_id}, counted
    store.copy_thread("t", "copy")  # sealed cells are not bound to their thread
    assert _read_all(store, "copy")[0] == before[0]


@contract_case(39, needs=("storage", "reopen"))
def case_a_missing_or_wrong_key_is_refused_naming_the_checkpoint(env: ContractEnv) -> None:
    """Opened with no key or a wrong one: every read of a value is UndecodableRow."""
    store = env.open(encryption=Encryption(KEY))
    ids = _turns(store, "t", 3)
    for ring, why in ((None, "encrypted"), (Encryption(NEW_KEY), "not in the keyring")):
        store = env.reopen(store, encryption=ring)
        _refused(env, lambda s=store: s.get_tuple(_config("t")), "t", ids, why)
        _refused(env, lambda s=store: list(s.list(_config("t"))), "t", ids, why)
        _refused(env, lambda s=store: s.history("t"), "t", ids, why)


@contract_case(39, needs=("storage", "reopen"))
def case_rotated_keys_read_and_rekey_moves_every_cell(env: ContractEnv) -> None:
    """An old key in the ring reads old cells; rekey seals them all under the new one."""
    store = env.open(encryption=Encryption(KEY))
    _turns(store, "t", 3)
    before = _read_all(store, "t")
    ring = Encryption(NEW_KEY, old_keys=[KEY])
    store = env.reopen(store, encryption=ring)
    assert _read_all(store, "t") == before
    _turns(store, "u", 2)  # new cells go under the new key
    old_id, new_id = Encryption(KEY).key_id, ring.key_id
    counted = store.cell_keys()
    assert set(counted.cells) == {old_id, new_id} and counted.clear == 0, counted
    dry = store.rekey(dry_run=True)
    assert dry.threads == ["t"] and dry.cells == {old_id: counted.cells[old_id]}, dry
    assert store.cell_keys().cells == counted.cells  # a dry run writes nothing
    done = store.rekey()
    assert done.threads == ["t"] and not done.skipped, done
    assert set(store.cell_keys().cells) == {new_id}
    assert store.rekey().threads == []  # nothing left to move
    store = env.reopen(store, encryption=Encryption(NEW_KEY))
    assert _read_all(store, "t") == before
    assert len(_read_all(store, "u")[0]["messages"]) == 2


@contract_case(39, needs=("storage", "reopen"))
def case_values_in_clear_are_refused_unless_migrating(env: ContractEnv) -> None:
    """A planted clear cell is refused; accept_plaintext reads it, and rekey then seals it."""
    assert env.storage is not None
    store = env.open(encryption=Encryption(KEY))
    ids = _turns(store, "t", 2)
    store = env.reopen(store)  # a store with no key writes in clear: a planted thread
    planted = _turns(store, "p", 2)
    plain = _read_all(store, "p")
    store = env.reopen(store, encryption=Encryption(KEY))
    _refused(env, lambda: store.get_tuple(_config("p")), "p", planted, "in clear is refused")
    assert env.storage.plant_clear_writes("t", ormsgpack.packb("planted")) == 2
    _refused(env, lambda: store.get_tuple(_config("t")), "t", ids, "in clear is refused")
    assert store.cell_keys().clear > 0
    # Sealing what is in clear vouches for it: only a store migrating does.
    refused = store.rekey()
    assert refused.threads == [] and refused.skipped, refused
    store = env.reopen(store, encryption=Encryption(KEY, accept_plaintext=True))
    assert _read_all(store, "p") == plain
    assert store.get_tuple(_config("t")).pending_writes[0][2] == "planted"
    done = store.rekey()
    assert sorted(done.threads) == ["p", "t"] and not done.skipped, done
    store = env.reopen(store, encryption=Encryption(KEY))
    assert store.cell_keys().clear == 0
    assert _read_all(store, "p") == plain


@contract_case(39, needs=("storage", "reopen"))
def case_tampered_ciphertext_is_refused_naming_its_channel(env: ContractEnv) -> None:
    """A bit flipped in a sealed value row, its checksum fixed: UndecodableRow, never a value."""
    assert env.storage is not None
    store = env.open(encryption=Encryption(KEY))
    ids = _turns(store, "t", 3)
    assert env.storage.forge_values("t", "messages") > 0
    store = env.reopen(store, encryption=Encryption(KEY))
    exc = _expect(lambda: store.get_tuple(_config("t")), UndecodableRow)
    assert exc.checkpoint_id == ids[-1] and "'messages'" in exc.reason, exc.reason
    assert "does not authenticate" in exc.reason, exc.reason
    _expect(lambda: list(store.list(_config("t"))), UndecodableRow)
    # Moving to a new key: a cell that does not open is reported, never resealed.
    store = env.reopen(store, encryption=Encryption(NEW_KEY, old_keys=[KEY]))
    report = store.rekey()
    assert any("does not authenticate" in s["reason"] for s in report.skipped), report
    _expect(lambda: store.get_tuple(_config("t")), UndecodableRow)
