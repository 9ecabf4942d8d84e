"""The JSON text this library stores: compact, sorted, plain data, bounded depth.

Metadata, envelopes and event data are stored as JSON text. `dumps_json`
writes exactly the text `json.dumps(value, separators=(",", ":"),
sort_keys=True, allow_nan=False, ensure_ascii=False)` would, with encoders
built once (per call they were a measurable share of a put), and
`loads_json` reads it back, refusing NaN, Infinity and nesting deeper than
`MAX_JSON_DEPTH`. Neither ever raises anything but `SerializationError`.
"""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Iterable
from typing import Any

from .errors import SerializationError

__all__ = ["MAX_JSON_DEPTH", "dumps_json", "loads_json"]

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


def dumps_json(value: Any, what: str) -> str:
    """Encode `value` as compact JSON, naming `what` if it holds a non-JSON value.

    Raises:
        SerializationError: `value` is not plain JSON data, or nests deeper
            than `MAX_JSON_DEPTH`.
    """
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
_SCAN: Any = _JSON_DECODER.scan_once  # type: ignore[attr-defined]


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
