"""`Encryption`: keys, key ids, rings, sealed cells (core/encryption.py).

What a store does with it (both stores, both APIs) is contract case 39
(langgraph_fenced_sqlite/testing/cases_encryption.py); this pins the
keyring itself and the saver's refusal of bad options.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_fenced_sqlite import DataOnlySerializer, Encryption, FencedSqliteSaver
from langgraph_fenced_sqlite.core.encryption import CellRefused, key_id_of_cell
from langgraph_fenced_sqlite.errors import InvalidArgument, SerializationError

KEY = b"k" * 32
OTHER = b"o" * 32


def test_a_cell_opens_under_its_key_and_associated_data_only() -> None:
    ring = Encryption(KEY)
    cell = ring.seal(b"where", b"plain bytes")
    assert b"plain bytes" not in cell
    assert ring.open(b"where", cell) == b"plain bytes"
    assert key_id_of_cell(cell) == ring.key_id
    with pytest.raises(CellRefused, match="does not authenticate"):
        ring.open(b"elsewhere", cell)
    flipped = cell[:-1] + bytes([cell[-1] ^ 1])
    with pytest.raises(CellRefused, match="does not authenticate"):
        ring.open(b"where", flipped)
    with pytest.raises(CellRefused, match="not in the keyring"):
        Encryption(OTHER).open(b"where", cell)
    with pytest.raises(CellRefused, match="not a sealed cell"):
        ring.open(b"where", b"plain bytes")


def test_the_same_cell_seals_to_the_same_bytes_and_different_ones_do_not() -> None:
    """Synthetic nonces: a retried put is identical; two cells never share a nonce."""
    ring = Encryption(KEY)
    assert ring.seal(b"a", b"x" * 100) == ring.seal(b"a", b"x" * 100)
    nonces = {ring.seal(b"a", bytes([i]) * 10)[6:18] for i in range(200)}
    assert len(nonces) == 200
    assert ring.seal(b"a", b"x") != ring.seal(b"b", b"x")


def test_old_keys_read_and_new_cells_go_under_the_first() -> None:
    old = Encryption(OTHER)
    cell = old.seal(b"a", b"value")
    ring = Encryption(KEY, old_keys=[OTHER])
    assert ring.open(b"a", cell) == b"value"
    assert ring.key_ids == (ring.key_id, old.key_id)
    assert not ring.current(cell) and ring.current(ring.seal(b"a", b"value"))


def test_key_ids_are_stable_and_reveal_nothing_of_the_key() -> None:
    assert Encryption(KEY).key_id == Encryption(KEY.decode()).key_id
    assert Encryption(KEY).key_id != Encryption(OTHER).key_id
    assert len(Encryption(KEY).key_id) == 8 and "6b6b" not in Encryption(KEY).key_id


@pytest.mark.parametrize(
    "call",
    [
        lambda: Encryption(b"short"),
        lambda: Encryption(b"k" * 33),
        lambda: Encryption(123),  # type: ignore[arg-type]
        lambda: Encryption(KEY, old_keys=OTHER),  # type: ignore[arg-type]
        lambda: Encryption(KEY, old_keys=[b"x"]),
        lambda: Encryption(KEY, accept_plaintext=1),  # type: ignore[arg-type]
    ],
)
def test_bad_keys_are_invalid_argument(call: Any) -> None:
    with pytest.raises(InvalidArgument):
        call()


def test_from_env_reads_langgraphs_variable_and_older_keys() -> None:
    env = {"LANGGRAPH_AES_KEY": KEY.decode(), "LGFS_AES_OLD_KEYS": f"{OTHER.decode()},"}
    ring = Encryption.from_env(environ=env)
    assert ring.key_ids == (Encryption(KEY).key_id, Encryption(OTHER).key_id)
    with pytest.raises(InvalidArgument, match="LANGGRAPH_AES_KEY"):
        Encryption.from_env(environ={})
    with pytest.raises(InvalidArgument, match="LANGGRAPH_AES_KEY"):
        Encryption.from_env(environ={"LANGGRAPH_AES_KEY": "short"})
    with pytest.raises(InvalidArgument, match="LGFS_AES_OLD_KEYS"):
        Encryption.from_env(environ={**env, "LGFS_AES_OLD_KEYS": "short"})


def test_from_file_reads_the_current_key_first_raw_or_base64(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_bytes(KEY + b"\n\nbase64:" + base64.b64encode(OTHER) + b"\n")
    ring = Encryption.from_file(path, accept_plaintext=True)
    assert ring.key_ids == (Encryption(KEY).key_id, Encryption(OTHER).key_id)
    assert ring.accept_plaintext
    for content in (b"", b"short\n", b"base64:!!!\n"):
        path.write_bytes(content)
        with pytest.raises(InvalidArgument, match="key_file"):
            Encryption.from_file(path)
    with pytest.raises(InvalidArgument, match="key_file"):
        Encryption.from_file(tmp_path / "missing")


def test_the_serializer_refuses_clear_and_foreign_cells_unless_told(tmp_path: Path) -> None:
    serde = DataOnlySerializer().with_encryption(Encryption(KEY))
    sealed = Encryption(KEY).seal_typed("msgpack", DataOnlySerializer().dumps_typed([1, 2])[1])
    assert serde.loads_typed(sealed) == [1, 2]
    clear = DataOnlySerializer().dumps_typed([1, 2])
    with pytest.raises(SerializationError, match="in clear is refused"):
        serde.loads_typed(clear)
    migrating = DataOnlySerializer().with_encryption(Encryption(KEY, accept_plaintext=True))
    assert migrating.loads_typed(clear) == [1, 2]
    with pytest.raises(SerializationError, match="encrypted"):
        DataOnlySerializer().loads_typed(sealed)
    # Derived serializers (LangGraph's strict mode, `for_graph`) keep the ring.
    assert serde.with_msgpack_allowlist([("m", "T")]).encryption is serde.encryption
    assert serde.refusing().encryption is serde.encryption


def test_savers_refuse_bad_encryption_options(tmp_path: Path) -> None:
    path = str(tmp_path / "f.db")
    with pytest.raises(InvalidArgument, match="encryption"):
        FencedSqliteSaver(path, encryption=KEY)  # type: ignore[arg-type]

    with pytest.raises(InvalidArgument, match="encryption"):
        FencedSqliteSaver(path, serde=JsonPlusSerializer(), encryption=Encryption(KEY))
    assert not os.path.exists(path)  # refused before the file was touched
    with FencedSqliteSaver(path) as saver, pytest.raises(InvalidArgument, match="encryption"):
        saver.rekey()
