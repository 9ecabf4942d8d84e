"""Envelopes stored packed (core/envelopes.py): lossless, smaller, refused when damaged."""

from __future__ import annotations

import base64
import json
import sqlite3
import threading
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from langgraph_fenced_sqlite import FencedSqliteSaver, UndecodableRow
from langgraph_fenced_sqlite.core import compression, envelopes
from langgraph_fenced_sqlite.testing._helpers import plant

# A chat's envelope as LangGraph's loop gives it, stored as `dumps_json` writes it.
CHAT = (
    '{"channel_versions":{"__start__":"0000002999.c1a62af3","branch:to:reply":'
    '"0000003000.28cb420f","messages":"0000003000.28cb420f"},"format":1,'
    '"id":"1f1f16a1-1b30-6f8f-8bb6-254d3af9e0f4","ts":"2026-12-06T11:42:09.097074+00:00",'
    '"updated_channels":["messages"],"v":4,"versions_seen":{"__input__":{},"__start__":'
    '{"__start__":"0000002998.7c5add90"},"reply":{"branch:to:reply":"0000002999.c1a62af3"}}}'
)


@pytest.mark.parametrize(
    "text",
    [
        CHAT,
        CHAT.replace("messages", "nachrichten \u00fc\u4e2d\U0001f600"),
        json.dumps({"channel_versions": {f"c{i}": f"{i:010}.00000000" for i in range(5000)}}),
        "{}",
        "",
    ],
    ids=["chat", "non-ascii", "5000-channels", "empty-object", "empty"],
)
def test_pack_is_lossless(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever `pack` stores, `unpack` gives back exactly (as str and as UTF-8 bytes),
    in this process and in one that did not pack it."""
    cell = envelopes.pack(text)
    assert envelopes.unpack(cell) == text
    assert envelopes.unpack_bytes(cell.encode()) == text.encode()
    monkeypatch.setattr(envelopes, "_TEXTS", {})
    monkeypatch.setattr(envelopes, "_DATA", {})
    assert envelopes.unpack(cell) == text
    assert envelopes.unpack_bytes(cell.encode()) == text.encode()


def test_a_chat_envelope_takes_under_half_its_json() -> None:
    """Against the sample, a chat's envelope packs to less than half its JSON text."""
    cell = envelopes.pack(CHAT)
    assert cell.startswith(envelopes.PACKED)
    assert len(cell) < len(CHAT) / 2, (len(cell), len(CHAT))


def test_a_short_text_is_stored_as_it_is() -> None:
    """A text under `PACK_MIN` is its own cell: packing it would save too little."""
    assert envelopes.pack("{}") == "{}"
    short = CHAT[: envelopes.PACK_MIN - 1]
    assert envelopes.pack(short) == short
    assert envelopes.pack(CHAT[: envelopes.PACK_MIN]).startswith(envelopes.PACKED)


def test_a_json_cell_and_any_other_value_unpack_as_they_are() -> None:
    """Rows from before packing (JSON text), and cells of the wrong type, pass through."""
    for cell in (CHAT, "[1, 2]", b"bytes", None, 5):
        assert envelopes.unpack(cell) is cell
    assert envelopes.unpack_bytes(CHAT.encode()) == CHAT.encode()


@pytest.mark.parametrize(
    "cell",
    [
        envelopes.PACKED + "!",
        envelopes.PACKED + "AAAA",
        envelopes.PACKED + base64.b64encode(b"\x28\xb5\x2f\xfd garbage").decode(),
        # A whole frame, then bytes after it.
        envelopes.pack(CHAT) + "AAAA",
    ],
    ids=["not-base64", "not-a-frame", "corrupt-frame", "trailing-bytes"],
)
def test_a_damaged_packed_cell_is_refused_naming_the_envelope(cell: str) -> None:
    """A packed cell that is not one whole frame raises ValueError naming the envelope."""
    with pytest.raises(ValueError, match="packed checkpoint envelope"):
        envelopes.unpack(cell)
    with pytest.raises(ValueError, match="packed checkpoint envelope"):
        envelopes.unpack_bytes(cell.encode())


def test_inflating_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A frame that states more than the limit is refused before it is inflated."""
    big = envelopes.pack("{" + " " * 10_000 + "}")
    assert big.startswith(envelopes.PACKED)
    monkeypatch.setattr(envelopes._CODEC, "_limit", 1_000)
    monkeypatch.setattr(envelopes, "_TEXTS", {})  # not what this process packed
    with pytest.raises(ValueError, match="too large"):
        envelopes.unpack(big)


def test_the_sample_is_the_format() -> None:
    """A cell packed today inflates with the sample as it ships: it must never change."""
    frame = compression.RecordCodec(envelopes._SAMPLE, 10**6).compress(CHAT.encode())
    assert envelopes.unpack(envelopes.PACKED + base64.b64encode(frame).decode()) == CHAT
    # Against another sample the same frame does not give the text back.
    other = compression.RecordCodec(b'{"another":"sample","of":"an envelope"}', 10**6)
    try:
        assert other.inflate(frame) != CHAT.encode()
    except ValueError:
        pass


def test_record_codec_contexts_are_per_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads packing and unpacking at once each get back exactly their own text."""
    monkeypatch.setattr(envelopes, "_remember", lambda memo, cell, text: None)  # inflate each
    texts = [CHAT.replace("messages", f"channel{i}") for i in range(8)]
    failures: list[str] = []

    def work(text: str) -> None:
        for _ in range(300):
            if envelopes.unpack(envelopes.pack(text)) != text:
                failures.append(text)

    threads = [threading.Thread(target=work, args=(t,)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def _stored_envelope(path: str) -> str:
    with sqlite3.connect(path) as conn:
        (cell,) = conn.execute("SELECT envelope FROM checkpoints").fetchone()
    return str(cell)


def _put(store: FencedSqliteSaver) -> tuple[Any, Any]:
    cp = empty_checkpoint()
    # Channels enough for an envelope over `PACK_MIN`, as a chat's is.
    cp["channel_values"] = {f"channel{i}": ["hi"] for i in range(6)}
    cp["channel_versions"] = {c: store.get_next_version(None) for c in cp["channel_values"]}
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    store.put(config, cp, {"source": "input", "step": -1, "parents": {}}, cp["channel_versions"])
    return config, cp


def test_a_put_stores_its_envelope_packed_and_reads_it_back(db_path: str) -> None:
    """A put stores the envelope packed; every read gives back the checkpoint as put."""
    with FencedSqliteSaver(db_path) as store:
        _, cp = _put(store)
    cell = _stored_envelope(db_path)
    assert cell.startswith(envelopes.PACKED)
    assert json.loads(envelopes.unpack(cell))["id"] == cp["id"]
    with FencedSqliteSaver(db_path) as fresh:
        got = fresh.get_tuple({"configurable": {"thread_id": "t"}})
        listed = list(fresh.list({"configurable": {"thread_id": "t"}}))
    assert got is not None and got.checkpoint == cp
    assert [t.checkpoint for t in listed] == [cp]


def test_a_retry_of_a_put_stored_before_packing_is_identical(db_path: str) -> None:
    """A retried put whose row holds the same envelope as JSON text (a file from
    before packing) is the identical retry it is, not a conflict."""
    with FencedSqliteSaver(db_path) as store:
        config, cp = _put(store)
        text = envelopes.unpack(_stored_envelope(db_path))
        plant(db_path, "UPDATE checkpoints SET envelope = ?", (text,), reseal=True)
        store.put(config, cp, {"source": "input", "step": -1, "parents": {}}, {})
        got = store.get_tuple({"configurable": {"thread_id": "t"}})
    assert got is not None and got.checkpoint == cp
    assert _stored_envelope(db_path) == text  # the retry changed nothing


def test_prune_reads_packed_envelopes_and_refuses_a_damaged_one(db_path: str) -> None:
    """Retention reads each envelope's versions; a damaged one is UndecodableRow naming it."""
    with FencedSqliteSaver(db_path) as store:
        _put(store)
        bad = envelopes.PACKED + "AAAA"  # resealed: only what the checksum covers is damaged
        plant(db_path, "UPDATE checkpoints SET envelope = ?", (bad,), reseal=True)
        with pytest.raises(UndecodableRow, match="packed checkpoint envelope"):
            store.prune(["t"], strategy="keep_latest")
        with pytest.raises(UndecodableRow, match="packed checkpoint envelope"):
            store.get_tuple({"configurable": {"thread_id": "t"}})
