"""Data-only serialization: objects <-> (type tag, bytes), no SQL.

Invariant: decoding never imports or calls anything outside the allow-list
(LangGraph's `SAFE_MSGPACK_TYPES` plus what the user adds explicitly). Pickle,
the legacy `json` tag and unknown tags are refused on both sides, a refused type
raises `SerializationError` naming it (never a silently different value), and
this holds whatever `LANGGRAPH_STRICT_MSGPACK` says.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterable
from typing import Any

import ormsgpack
from langgraph.checkpoint.serde import _msgpack as lg_msgpack
from langgraph.checkpoint.serde import jsonplus
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from .errors import SerializationError, bad_argument

__all__ = ["DataOnlySerializer", "TypeKey", "dumps_json", "loads_json"]

TypeKey = tuple[str, ...]

_OPTION = ormsgpack.OPT_NON_STR_KEYS
# The tags we write and read; everything else (pickle, json, ...) is refused.
_TAGS = frozenset({"null", "bytes", "bytearray", "msgpack"})
_CONSTRUCTORS = {
    jsonplus.EXT_CONSTRUCTOR_SINGLE_ARG,
    jsonplus.EXT_CONSTRUCTOR_POS_ARGS,
    jsonplus.EXT_CONSTRUCTOR_KW_ARGS,
    jsonplus.EXT_PYDANTIC_V1,
    jsonplus.EXT_PYDANTIC_V2,
}


def _normalize(types: Iterable[TypeKey | type]) -> frozenset[TypeKey]:
    out: set[TypeKey] = set()
    for item in types:
        if isinstance(item, type):
            out.add((item.__module__, item.__name__))
        elif (
            isinstance(item, tuple)
            and len(item) >= 2
            and all(isinstance(part, str) and part for part in item)
        ):
            out.add(tuple(item))
        else:
            raise bad_argument(
                "allowed_types",
                f"each entry must be a class or a (module, name) tuple, got {item!r}",
            )
    return frozenset(out)


class DataOnlySerializer(JsonPlusSerializer):
    """LangGraph's msgpack serializer, restricted to an allow-list of types.

    It writes exactly what `JsonPlusSerializer` writes (so rows stay readable
    by LangGraph tooling) but never pickles, and its reader rebuilds only
    allowed types; anything else raises `SerializationError`.
    """

    def __init__(self, allowed_types: Iterable[TypeKey | type] = ()) -> None:
        """Allow LangGraph's safe types plus `allowed_types`.

        Args:
            allowed_types: Extra classes, or `(module, name)` tuples, that
                stored values may contain.
        """
        extra = _normalize(allowed_types)
        super().__init__(pickle_fallback=False, allowed_msgpack_modules=tuple(extra) or None)
        self._extra = extra
        self._allowed = lg_msgpack.SAFE_MSGPACK_TYPES | extra

    @property
    def allowed_types(self) -> frozenset[TypeKey]:
        """The `(module, name)` pairs this serializer may rebuild."""
        return self._allowed

    def with_msgpack_allowlist(
        self, extra_allowlist: Iterable[TypeKey | type]
    ) -> DataOnlySerializer:
        """Return a serializer that also allows `extra_allowlist`."""
        extra = _normalize(extra_allowlist)
        if extra <= self._allowed:
            return self
        return DataOnlySerializer(self._extra | extra)

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        """Encode `obj`, refusing any type the reader would not rebuild.

        Raises:
            SerializationError: `obj` holds a type outside the allow-list.
        """
        if obj is None:
            return "null", b""
        if isinstance(obj, bytes):
            return "bytes", obj
        if isinstance(obj, bytearray):
            return "bytearray", bytes(obj)
        used_ext = False
        refused: list[SerializationError] = []

        def default(value: Any) -> Any:
            nonlocal used_ext
            used_ext = True
            try:
                return jsonplus._msgpack_default(value)
            except TypeError as exc:
                # ormsgpack replaces what `default` raises with its own error.
                name = _qualname(value)
                refused.append(
                    SerializationError(
                        name,
                        message=(
                            f"type {name} has no data encoding; store plain data, or a "
                            "dataclass / pydantic model named in allowed_types=[...]"
                        ),
                    )
                )
                raise refused[-1] from exc

        try:
            data = ormsgpack.packb(obj, default=default, option=jsonplus._option)
        except (ormsgpack.MsgpackEncodeError, TypeError, ValueError) as exc:
            if refused:
                raise refused[0] from None
            raise SerializationError(_qualname(obj), message=f"cannot encode: {exc}") from exc
        if used_ext:
            # Walk the encoded form with a hook that checks but builds nothing,
            # so a value the reader would refuse is refused now, not on resume.
            self._unpack(data, build=False)
        return "msgpack", data

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        """Decode a `(tag, bytes)` pair written by `dumps_typed`.

        Raises:
            SerializationError: the tag is not ours (pickle, json, unknown) or
                the payload names a type outside the allow-list.
        """
        tag, payload = data
        if tag == "null":
            return None
        if tag == "bytes":
            return bytes(payload)
        if tag == "bytearray":
            return bytearray(payload)
        if tag == "msgpack":
            return self._unpack(payload, build=True)
        raise SerializationError(
            str(tag), message=f"serializer tag {tag!r} is refused (only {sorted(_TAGS)})"
        )

    def _unpack(self, payload: bytes, *, build: bool) -> Any:
        # ormsgpack turns any exception raised by an ext hook into a bare
        # `ValueError("ext_hook failed")` with no cause, so the hook records
        # its error here and we re-raise that one.
        errors: list[SerializationError] = []
        try:
            return ormsgpack.unpackb(
                payload, ext_hook=self._make_hook(build=build, errors=errors), option=_OPTION
            )
        except (ValueError, TypeError) as exc:
            if errors:
                raise errors[0] from None
            raise SerializationError("msgpack", message=f"corrupt msgpack: {exc}") from exc

    def _make_hook(
        self, *, build: bool, errors: list[SerializationError]
    ) -> Callable[[int, bytes], Any]:
        allowed = self._allowed

        def hook(code: int, data: bytes) -> Any:
            try:
                return check_or_build(code, data)
            except SerializationError as exc:
                errors.append(exc)
                raise

        def check_or_build(code: int, data: bytes) -> Any:
            if code == jsonplus.EXT_DELTA_SNAPSHOT:
                inner = ormsgpack.unpackb(data, ext_hook=hook, option=_OPTION)
                return _DeltaSnapshot(inner) if build else None
            if code == jsonplus.EXT_NUMPY_ARRAY:
                key: TypeKey = ("numpy", "ndarray")
                if key not in allowed:
                    raise SerializationError("numpy.ndarray")
                if not build:
                    return None
                import numpy as np  # allowed explicitly by the user

                dtype, shape, order, buf = ormsgpack.unpackb(data, option=_OPTION)
                return np.frombuffer(buf, dtype=np.dtype(dtype)).reshape(shape, order=order)
            if code not in _CONSTRUCTORS and code != jsonplus.EXT_METHOD_SINGLE_ARG:
                raise SerializationError(f"ext:{code}", message=f"unknown msgpack ext {code}")
            tup = ormsgpack.unpackb(data, ext_hook=hook, option=_OPTION)
            if not (isinstance(tup, (list, tuple)) and len(tup) >= 3):
                raise SerializationError(f"ext:{code}", message="malformed msgpack ext")
            module, name = tup[0], tup[1]
            if not (isinstance(module, str) and isinstance(name, str)):
                raise SerializationError(f"ext:{code}", message="malformed msgpack ext")
            if code == jsonplus.EXT_METHOD_SINGLE_ARG:
                method = tup[3] if len(tup) > 3 else None
                if (module, name, method) not in lg_msgpack.SAFE_MSGPACK_METHODS:
                    raise SerializationError(f"{module}.{name}.{method}")
            elif (module, name) not in allowed:
                raise SerializationError(f"{module}.{name}")
            if not build:
                return None
            return _construct(code, tup)

        return hook


def _construct(code: int, tup: Any) -> Any:
    module, name, arg = tup[0], tup[1], tup[2]
    try:
        target = getattr(importlib.import_module(module), name)
        if code == jsonplus.EXT_METHOD_SINGLE_ARG:
            return getattr(target, tup[3])(arg)
        if code == jsonplus.EXT_CONSTRUCTOR_SINGLE_ARG:
            return target(arg)
        if code == jsonplus.EXT_CONSTRUCTOR_POS_ARGS:
            if module == "langgraph.types" and name == "Send":
                return jsonplus._send_from_args(arg)
            return target(*arg)
        if code == jsonplus.EXT_CONSTRUCTOR_KW_ARGS:
            return target(**arg)
        # pydantic v1 / v2: validate, as LangGraph does, falling back to construct.
        try:
            return target(**arg)
        except Exception:
            constructor = getattr(target, "model_construct", None) or target.construct
            return constructor(**arg)
    except SerializationError:
        raise
    except Exception as exc:
        # LangGraph would hand back the raw payload here; a different value in
        # restored state is worse than an error, so we refuse.
        raise SerializationError(
            f"{module}.{name}", message=f"cannot rebuild {module}.{name}: {exc!r}"
        ) from exc


def _qualname(value: Any) -> str:
    cls = type(value)
    return f"{cls.__module__}.{cls.__qualname__}"


# Built once: `json.dumps` with any non-default option builds a new encoder
# per call, a measurable share of a put. Keys are sorted so that equal
# objects have equal text (metadata filters compare nested objects as text).
_JSON = json.JSONEncoder(separators=(",", ":"), sort_keys=True, allow_nan=False, ensure_ascii=False)


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
        text = _JSON.encode(value)
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
    if not isinstance(text, str):
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


def _too_deep(what: str) -> SerializationError:
    return SerializationError(
        what, message=f"{what}: JSON nests deeper than {MAX_JSON_DEPTH} levels"
    )


def _may_be_deep(text: str) -> bool:
    # Fewer brackets than the limit cannot nest beyond it: the common case
    # costs two C-speed counts, and only a bracket-heavy text is walked.
    return text.count("[") + text.count("{") > MAX_JSON_DEPTH


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
