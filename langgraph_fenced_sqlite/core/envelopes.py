"""A checkpoint's envelope as stored: its JSON text, zstd-compressed against a fixed sample.

The envelope is everything of a checkpoint but its channel values
(`channel_versions`, `versions_seen`, `updated_channels`, `id`, `ts`, ...),
as the JSON text `stored_json.dumps_json` writes. Each checkpoint row holds
one, and in a long thread they were the largest cell of the checkpoint
rows: a chat's is about 400 bytes. On its own a few hundred bytes finds
little to refer back to, so it is compressed against `_SAMPLE`, a
representative envelope (a zstd raw-content dictionary), and stored as
`~z1:` and the frame in base64 (the column is TEXT on both stores): a
chat's then takes about 190 bytes, an agent loop's 260 instead of 590.

Invariant: `unpack(pack(text)) == text` for every text; a cell that is not
packed (a row from before, a text under `PACK_MIN`, or one compression
would not shrink) is its JSON text and reads as it always did. The sample is part of the
format: it never changes; another one would take another prefix. What a
row's checksum covers is the stored cell, so a damaged or forged cell is
refused before anything is decompressed, and decompression is bounded.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from ..errors import FencedSqliteError, UndecodableRow
from .compression import RecordCodec
from .stored_json import loads_json

__all__ = ["PACKED", "PACK_MIN", "channel_versions", "pack", "unpack", "unpack_bytes"]

# An envelope shorter than this is stored as its text: a graph of a channel
# or two, whose envelope packing shrinks by under 80 bytes, while it costs
# each put about 9 us (measured in a put's flow: a zstd context gone cold).
# A chat's (about 400 bytes) shrinks by half.
PACK_MIN = 320
# What a packed cell starts with (no JSON text does: an envelope is an object).
PACKED = "~z1:"
_PACKED_BYTES = PACKED.encode()
# The most a packed envelope may inflate to (an envelope of thousands of
# channels is tens of KB); a longer text is stored as it is.
_LIMIT = 16 * 1024 * 1024
# A representative envelope, as `dumps_json` writes one (sorted keys, compact),
# with LangGraph's own channel and node names and this library's version
# shape (`FencedSaverBase.get_next_version`). Never to be changed (see above).
_SAMPLE = (
    b'{"channel_versions":{"__input__":"0000000001.00000000",'
    b'"__interrupt__":"0000000001.00000000","__pregel_tasks":"0000000001.00000000",'
    b'"__start__":"0000000001.00000000","branch:to:agent":"0000000001.00000000",'
    b'"messages":"0000000001.00000000"},"format":1,'
    b'"id":"1f000000-0000-6000-8000-000000000000","ts":"2026-01-01T00:00:00.000000+00:00",'
    b'"updated_channels":["__start__","messages"],"v":4,"versions_seen":{"__input__":{},'
    b'"__interrupt__":{},"__start__":{"__start__":"0000000001.00000000"},'
    b'"agent":{"branch:to:agent":"0000000001.00000000"}}}'
)
_CODEC = RecordCodec(_SAMPLE, _LIMIT)


def pack(text: str) -> str:
    """Return the cell that stores envelope `text`: packed when that pays, else `text`."""
    data = text.encode()
    if not PACK_MIN <= len(data) <= _LIMIT:
        return text
    cell = PACKED + base64.b64encode(_CODEC.compress(data)).decode("ascii")
    if len(cell) >= len(text):
        return text
    _remember(_TEXTS, cell, text)
    return cell


def unpack(cell: Any) -> Any:
    """Return the JSON text a stored envelope cell holds (any other cell as it is).

    Raises:
        ValueError: a packed cell that is not one whole frame of this format.
    """
    if type(cell) is str and cell.startswith(PACKED):
        text = _TEXTS.get(cell)
        if text is None:
            text = _inflate(cell[len(PACKED) :].encode("ascii", "replace")).decode()
            _remember(_TEXTS, cell, text)
        return text
    return cell


def unpack_bytes(cell: bytes) -> bytes:
    """`unpack` of a cell read as its UTF-8 bytes; returns the JSON text's bytes."""
    if cell.startswith(_PACKED_BYTES):
        data = _DATA.get(cell)
        if data is None:
            data = _inflate(cell[len(_PACKED_BYTES) :])
            _remember(_DATA, cell, data)
        return data
    return cell


# The texts of the cells this process packed or unpacked last (a cell names
# its text: the same cell is the same text). A thread's latest checkpoint is
# read again and again (each invocation starts by reading it, a server's
# clients poll it); those reads then inflate nothing. Bounded: emptied when full.
_TEXTS: dict[str, str] = {}
_DATA: dict[bytes, bytes] = {}
_REMEMBERED = 4096


def _remember(memo: dict[Any, Any], cell: Any, text: Any) -> None:
    if len(memo) >= _REMEMBERED:
        memo.clear()
    memo[cell] = text


def _inflate(encoded: bytes) -> bytes:
    try:
        return _CODEC.inflate(base64.b64decode(encoded, validate=True))
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"packed checkpoint envelope: {exc}") from None


def channel_versions(thread_id: str, cid: str, cell: Any) -> dict[str, Any] | None:
    """The `channel_versions` of a stored envelope cell (None if it has none).

    What retention reads of every checkpoint of a thread, on both stores.

    Raises:
        UndecodableRow: the cell is not a packed or JSON envelope object, or
            its `channel_versions` is not an object.
    """
    try:
        env = loads_json(unpack(cell), "checkpoint envelope")
    except (FencedSqliteError, ValueError) as exc:
        raise UndecodableRow(thread_id, cid, str(exc)) from None
    if type(env) is not dict:
        raise UndecodableRow(thread_id, cid, "envelope is not a JSON object")
    versions = env.get("channel_versions")
    if not isinstance(versions, (dict, type(None))):
        raise UndecodableRow(thread_id, cid, "envelope's channel_versions is not an object")
    return versions
