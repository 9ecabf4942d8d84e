"""The JSON text this library stores: compact, sorted, plain data, bounded depth.

Metadata, envelopes and event data are stored as JSON text. `dumps_json`
writes exactly the text `json.dumps(value, separators=(",", ":"),
sort_keys=True, allow_nan=False, ensure_ascii=False)` would, with encoders
built once (per call they were a measurable share of a put), and
`loads_json` reads it back, refusing NaN, Infinity and nesting deeper than
`MAX_JSON_DEPTH`. Neither ever raises anything but `SerializationError`.

A value `json_kind` calls `PLAIN` (exact dicts, lists, tuples, strings,
64-bit ints, bools and None; no float) is encoded by orjson, whose text is
then byte-for-byte `json.dumps`'s (a fifth of the cost); floats are not
(orjson writes `0.00001` where `json` writes `1e-05`, NaN as null), nor
is anything else. `loads_json` takes orjson's value only when orjson
writes it back as exactly the text read, and `json`'s otherwise.
"""

from __future__ import annotations

import json
import json.encoder
import math
from collections.abc import Iterable
from typing import Any

import orjson

from ..errors import SerializationError

__all__ = [
    "FINE",
    "MAX_INT",
    "MAX_JSON_DEPTH",
    "MIN_INT",
    "NOT_CANONICAL",
    "NOT_FINE",
    "PLAIN",
    "dumps_json",
    "json_kind",
    "loads_canonical",
    "loads_json",
]

_c_make_encoder: Any
try:
    import _json

    _c_make_encoder = _json.make_encoder
except (ImportError, AttributeError):  # pragma: no cover - CPython has it; others may not
    _c_make_encoder = None

# Built once: `json.dumps` with any non-default option builds a new encoder
# per call, a measurable share of a put. Keys are sorted so that equal
# objects have equal text (metadata filters compare nested objects as text).
_JSON = json.JSONEncoder(separators=(",", ":"), sort_keys=True, allow_nan=False, ensure_ascii=False)
# And its C encoder, also built once: `JSONEncoder.encode` builds one per
# call (a fifth of encoding an envelope). The same text as `_JSON.encode`
# gives, but without its circular-reference bookkeeping, which a shared
# encoder cannot keep per call: a cycle recurses until `RecursionError`,
# reported as too deep (arguments never get here with one: validation
# bounds their depth first).
_ENCODE = (
    None
    if _c_make_encoder is None
    else _c_make_encoder(
        None, _JSON.default, json.encoder.encode_basestring, None, ":", ",", True, False, False
    )
)


# How deeply JSON we store may nest. Python's json recurses per level (a deep
# enough text raises RecursionError, or overflows the C stack), and nothing we
# store (metadata, events, envelopes) needs more than a few levels.
MAX_JSON_DEPTH = 200
# SQLite's INTEGER is a signed 64-bit number; a bigger Python int overflows at bind time.
MIN_INT, MAX_INT = -(2**63), 2**63 - 1

# What `json_kind` says of a value: not known to be fine (the caller's full
# check decides), fine (JSON data with a float), or plain (no float).
NOT_FINE, FINE, PLAIN = 0, 1, 2

_orjson_dumps = orjson.dumps
_orjson_loads = orjson.loads
_SORT_KEYS = orjson.OPT_SORT_KEYS


def json_kind(item: Any, depth: int = 0, strict: bool = False) -> int:
    """Tell whether `item` is JSON data this library stores as it is, and whether it is plain.

    `PLAIN`: only exact dicts (string keys), lists, tuples, strings without
    a lone surrogate, ints within 64 bits, bools and None, at most
    `MAX_JSON_DEPTH - depth` levels deep. `FINE`: the same, with floats
    (finite ones when `strict`). `NOT_FINE`: anything else, including
    subclasses and other mappings, which a full check must judge.
    Leaves and empty containers are checked in the loop, so that a call is
    made per non-empty container only (every put walks its envelope and
    metadata); a dict's keys and values in one pass over its items. (The
    two loops are one test written twice: a helper call per item would
    cost more than the walk.)
    """
    kind = type(item)
    if kind is dict:
        if depth >= MAX_JSON_DEPTH:
            return NOT_FINE
        result = PLAIN
        for key, sub in item.items():
            if type(key) is not str or not (key.isascii() or _is_utf8(key)):
                return NOT_FINE
            sub_kind = type(sub)
            if sub_kind is str:
                if sub.isascii() or _is_utf8(sub):
                    continue
                return NOT_FINE
            if sub_kind is int:
                if MIN_INT <= sub <= MAX_INT:
                    continue
                return NOT_FINE
            if sub is None or sub_kind is bool:
                continue
            if not sub and (sub_kind is dict or sub_kind is list or sub_kind is tuple):
                if depth + 1 >= MAX_JSON_DEPTH:
                    return NOT_FINE
                continue
            found = json_kind(sub, depth + 1, strict)
            if found != PLAIN:
                if found == NOT_FINE:
                    return NOT_FINE
                result = FINE
        return result
    if kind is not list and kind is not tuple:
        return _leaf_kind(item, kind, strict)
    if depth >= MAX_JSON_DEPTH:
        return NOT_FINE
    result = PLAIN
    for sub in item:
        sub_kind = type(sub)
        if sub_kind is str:
            if sub.isascii() or _is_utf8(sub):
                continue
            return NOT_FINE
        if sub_kind is int:
            if MIN_INT <= sub <= MAX_INT:
                continue
            return NOT_FINE
        if sub is None or sub_kind is bool:
            continue
        found = json_kind(sub, depth + 1, strict)
        if found != PLAIN:
            if found == NOT_FINE:
                return NOT_FINE
            result = FINE
    return result


def _leaf_kind(item: Any, kind: type, strict: bool) -> int:
    # `json_kind` of a value that is not a dict, list or tuple.
    if kind is str:
        return PLAIN if item.isascii() or _is_utf8(item) else NOT_FINE
    if kind is int:
        return PLAIN if MIN_INT <= item <= MAX_INT else NOT_FINE
    if kind is float:
        return FINE if not strict or math.isfinite(item) else NOT_FINE
    if item is None or kind is bool:
        return PLAIN
    return NOT_FINE


def _is_utf8(text: str) -> bool:
    # A non-ASCII string SQLite can store: no lone surrogate.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def dumps_json(value: Any, what: str, *, kind: int | None = None) -> str:
    """Encode `value` as compact JSON, naming `what` if it holds a non-JSON value.

    Args:
        value: The data to encode.
        what: What it is, for the error message.
        kind: `json_kind(value)` when the caller already walked it (None:
            walk it here). Only a `PLAIN` value takes the orjson path.

    Raises:
        SerializationError: `value` is not plain JSON data, or nests deeper
            than `MAX_JSON_DEPTH`.
    """
    if kind is None:
        kind = json_kind(value)
    if kind == PLAIN:
        try:
            return _orjson_dumps(value, option=_SORT_KEYS).decode()
        except orjson.JSONEncodeError:  # pragma: no cover - a plain value always encodes
            pass  # the text below decides (value or error), as for any other value
    try:
        text = _JSON.encode(value) if _ENCODE is None else "".join(_ENCODE(value, 0))
    except RecursionError:
        raise _too_deep(what) from None
    except (TypeError, ValueError) as exc:
        raise SerializationError(
            what, message=f"{what} must be JSON data (str, number, bool, None, list, dict): {exc}"
        ) from exc
    if _may_be_deep(text) and _depth(value) > MAX_JSON_DEPTH:
        raise _too_deep(what)
    return text


def loads_json(text: Any, what: str = "JSON") -> Any:
    """Decode JSON written by `dumps_json`, refusing anything else.

    Args:
        text: The stored text (a damaged cell may hold any SQL value).
        what: What the text is, for the error message.

    Raises:
        SerializationError: `text` is not a `str`, not JSON, holds NaN or
            Infinity (which `dumps_json` never writes), or nests deeper than
            `MAX_JSON_DEPTH`. Nothing else is ever raised.
    """
    if type(text) is str:
        try:
            data = text.encode()
        except UnicodeEncodeError:  # a lone surrogate: never canonical
            return _loads_scanned(text, what)
        value = loads_canonical(data)
        if value is not NOT_CANONICAL:
            return value
        return _loads_scanned(text, what)
    if not isinstance(text, str):
        raise SerializationError(
            what, message=f"{what}: expected JSON text, got {type(text).__name__}"
        )
    return _loads_scanned(text, what)


# What `loads_canonical` returns for bytes it does not decode itself.
NOT_CANONICAL: Any = object()


def loads_canonical(data: bytes) -> Any:
    """Return the value of UTF-8 JSON `data` if orjson writes it back as exactly `data`.

    `loads_json`'s fast path, for a caller that holds the text's bytes
    (`list` reads them as such, and hashes them for the checksum): the value
    is then the one `loads_json`, and `json`, read from that text.

    Returns:
        The value, or `NOT_CANONICAL` for any other bytes (not JSON, not
        UTF-8, not written by `dumps_json`'s orjson path, or nested deeper
        than `MAX_JSON_DEPTH`): decode those with `loads_json`, which
        returns their value or raises. Nothing is ever raised here.
    """
    # orjson first (half the scanner's cost): its value is taken only when
    # orjson writes that value back as exactly this text. Then it is the
    # value `json` reads too: the text is canonical (sorted, compact, no
    # duplicate key, no escaped lone surrogate), and what orjson reads
    # differently from `json` (an integer beyond 64 bits becomes a float,
    # `-0` becomes 0) is written back differently.
    try:
        value = _orjson_loads(data)
        if _orjson_dumps(value, option=_SORT_KEYS) != data:
            return NOT_CANONICAL
    except (ValueError, TypeError):  # JSONDecodeError/JSONEncodeError are ValueErrors
        return NOT_CANONICAL
    # `_may_be_deep`, inlined (every read decodes two texts here); a text
    # nested too deep is `loads_json`'s to refuse.
    if (
        len(data) > 2 * MAX_JSON_DEPTH
        and data.count(b"[") + data.count(b"{") > MAX_JSON_DEPTH
        and _depth(value) > MAX_JSON_DEPTH
    ):
        return NOT_CANONICAL
    return value


def _loads_scanned(text: str, what: str) -> Any:
    # `loads_json` with Python's own decoder (the reference its fast path is tested against).
    if type(text) is str:
        # The C scanner straight away (what `decode` runs after two regex
        # matches for whitespace, a third of a small text's cost): text we
        # wrote has none, so it ends at the text's end. Anything else (any
        # error, whitespace, trailing data) goes the whole way below, which
        # gives exactly `decode`'s value or error.
        try:
            value, end = _SCAN(text, 0)
        except (StopIteration, ValueError, RecursionError):
            pass
        else:
            if end == len(text):
                if _may_be_deep(text) and _depth(value) > MAX_JSON_DEPTH:
                    raise _too_deep(what)
                return value
    elif not isinstance(text, str):
        raise SerializationError(
            what, message=f"{what}: expected JSON text, got {type(text).__name__}"
        )
    try:
        value = _JSON_DECODER.decode(text)
    except RecursionError:
        raise _too_deep(what) from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
        raise SerializationError(what, message=f"{what}: not valid JSON: {exc}") from None
    if _may_be_deep(text) and _depth(value) > MAX_JSON_DEPTH:
        raise _too_deep(what)
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON data")


# Built once, as `_JSON` is: `json.loads` with any option builds a decoder per
# call, which doubled the cost of a `get_tuple`.
_JSON_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)
# Its scanner: `(value, end)` of the JSON value at an index (C, when CPython has it).
_SCAN = _JSON_DECODER.scan_once  # type: ignore[attr-defined]  # set by __init__, untyped


def _too_deep(what: str) -> SerializationError:
    return SerializationError(
        what, message=f"{what}: JSON nests deeper than {MAX_JSON_DEPTH} levels"
    )


def _may_be_deep(text: str) -> bool:
    # Nesting n levels takes 2n brackets, so a short text cannot nest beyond
    # the limit (no count at all: two counts cost a sixth of decoding an
    # envelope); nor can one with fewer brackets than the limit: the common
    # case costs two C-speed counts, and only a bracket-heavy text is walked.
    return len(text) > 2 * MAX_JSON_DEPTH and text.count("[") + text.count("{") > MAX_JSON_DEPTH


def _depth(value: Any) -> int:
    # Iterative, so measuring a deep value cannot itself recurse too deep.
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[Any] = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > deepest:
            deepest = depth
            if deepest > MAX_JSON_DEPTH:
                return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest
