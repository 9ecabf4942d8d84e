"""Data-only serialization: objects <-> (type tag, bytes), no SQL.

Invariant: decoding never imports or calls anything outside the allow-list:
LangGraph's `SAFE_MSGPACK_TYPES`, plus the classes, `(module, name)` pairs and
module prefixes the user gives, plus the types of a graph's schemas when the
saver is bound to it (`schema_types`). Pickle, the legacy `json` tag and
unknown tags are refused on both sides, whatever `LANGGRAPH_STRICT_MSGPACK`
says.

A write is accepted only once its value is proven to rebuild: the bytes are
decoded here, with the reader's own code and allow-list, into a value that
encodes to the same bytes (or compares equal). A class defined inside a
function, a nested class (a reader finds classes by `module.name`) or a value
whose constructor changes it is refused when written, naming its type, so a
reader with the same allow-list reads back every stored value, in this
process or a fresh one.

A reader meeting a stored value whose type it does not allow refuses it
(`SerializationError`, which the saver reports as `UndecodableRow`): restored
state that silently differs from what was written is worse than an error, and
the error names the type and the fix. Only a display reader (`unknown="tag"`,
the CLI's) returns such a value as a `TaggedValue` (type name and fields),
built from plain data: no import, no constructor.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
from collections.abc import Callable, Iterable
from typing import Any

import ormsgpack
from langgraph.checkpoint.serde import _msgpack as lg_msgpack
from langgraph.checkpoint.serde import jsonplus
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from .errors import SerializationError, bad_argument
from .user_types import TaggedValue, schema_types, write_context

__all__ = [
    "DataOnlySerializer",
    "TaggedValue",
    "TypeKey",
    "dumps_json",
    "loads_json",
    "schema_types",
    "write_context",
]

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
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")
_SAFE = lg_msgpack.SAFE_MSGPACK_TYPES
_FIX = (
    "allow it, e.g. FencedSqliteSaver(path, allowed_types=[{name}]) or "
    "allowed_modules=[{package!r}], or bind the graph that declares it: "
    "builder.compile(checkpointer=saver.for_graph(builder))"
)


def _normalize(
    types: Iterable[TypeKey | type], argument: str = "allowed_types"
) -> frozenset[TypeKey]:
    if isinstance(types, (str, type)) or not isinstance(types, Iterable):
        raise bad_argument(
            argument, f"expected a list of classes or (module, name) tuples, got {types!r}"
        )
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
                argument,
                f"each entry must be a class or a (module, name) tuple, got {item!r}",
            )
    return frozenset(out)


def _normalize_modules(modules: Iterable[str] | str) -> tuple[str, ...]:
    if isinstance(modules, str):
        modules = (modules,)  # allowed_modules="myapp" means the one package
    if not isinstance(modules, Iterable):
        raise bad_argument("allowed_modules", f"expected a list of module names, got {modules!r}")
    out: set[str] = set()
    for module in modules:
        if not (isinstance(module, str) and _MODULE.match(module)):
            raise bad_argument(
                "allowed_modules", f"each entry must be a dotted module name, got {module!r}"
            )
        out.add(module)
    return tuple(sorted(out))


class DataOnlySerializer(JsonPlusSerializer):
    """LangGraph's msgpack serializer, restricted to an allow-list of types.

    It writes exactly what `JsonPlusSerializer` writes (so rows stay readable
    by LangGraph tooling) but never pickles, stores a value only once it has
    rebuilt it, and its reader rebuilds only allowed types; anything else
    raises `SerializationError`.
    """

    def __init__(
        self,
        allowed_types: Iterable[TypeKey | type] = (),
        *,
        allowed_modules: Iterable[str] | str = (),
        unknown: str = "refuse",
    ) -> None:
        """Allow LangGraph's safe types plus `allowed_types` and `allowed_modules`.

        Args:
            allowed_types: Extra classes, or `(module, name)` tuples, that
                stored values may contain.
            allowed_modules: Module names whose classes (theirs and their
                submodules') stored values may contain, e.g. `["myapp"]`.
                Reading a row that names `myapp.x.Y` imports `myapp.x`.
            unknown: What the reader does with a stored value whose type it
                does not allow or cannot rebuild: `"refuse"` (raise
                `SerializationError`) or `"tag"` (return a `TaggedValue`;
                for displaying a file, never for resuming from it).

        Raises:
            InvalidArgument: a malformed entry or `unknown` value.
        """
        extra = _normalize(allowed_types)
        modules = _normalize_modules(allowed_modules)
        if unknown not in ("refuse", "tag"):
            raise bad_argument("unknown", f'expected "refuse" or "tag", got {unknown!r}')
        super().__init__(pickle_fallback=False, allowed_msgpack_modules=tuple(extra) or None)
        self._extra = extra
        self._modules = modules
        self._unknown = unknown
        self._allowed = _SAFE | extra

    @property
    def allowed_types(self) -> frozenset[TypeKey]:
        """The `(module, name)` pairs this serializer may rebuild (prefixes aside)."""
        return self._allowed

    @property
    def allowed_modules(self) -> tuple[str, ...]:
        """The module prefixes whose classes this serializer may rebuild."""
        return self._modules

    @property
    def unknown(self) -> str:
        """What the reader does with a value it may not rebuild: `"refuse"` or `"tag"`."""
        return self._unknown

    def refusing(self) -> DataOnlySerializer:
        """Return this serializer with `unknown="refuse"` (for a reader that writes back)."""
        if self._unknown == "refuse":
            return self
        return DataOnlySerializer(self._extra, allowed_modules=self._modules)

    def allows(self, module: str, name: str) -> bool:
        """Tell whether a stored `module.name` value may be rebuilt."""
        if (module, name) in self._allowed:
            return True
        return any(module == m or module.startswith(m + ".") for m in self._modules)

    def with_msgpack_allowlist(
        self, extra_allowlist: Iterable[TypeKey | type]
    ) -> DataOnlySerializer:
        """Return a serializer that also allows `extra_allowlist`."""
        extra = _normalize(extra_allowlist, "extra_allowlist")
        if extra <= self._allowed:
            return self
        return DataOnlySerializer(
            self._extra | extra, allowed_modules=self._modules, unknown=self._unknown
        )

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        """Encode `obj` once it is proven to read back equal.

        Raises:
            SerializationError: `obj` holds a type outside the allow-list, or
                one a reader cannot rebuild into an equal value; for a dict
                (a checkpoint's channel values) the message names the key.
        """
        try:
            return self._dumps(obj)
        except SerializationError as exc:
            path = self._locate(obj)
            if not path:
                raise
            raise write_context(exc, channel=path[0], keys=path[1:]) from None

    def _locate(self, obj: Any, depth: int = 0) -> list[str]:
        # Which key of a channel-values dict (and of a dict inside it, such as
        # the graph's input under `__start__`) holds the refused value.
        if not isinstance(obj, dict) or depth > 3:
            return []
        for key, value in obj.items():
            try:
                self._dumps(value)
            except SerializationError:
                return [str(key), *self._locate(value, depth + 1)]
        return []

    def _dumps(self, obj: Any) -> tuple[str, bytes]:
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
                            "dataclass / pydantic model / enum / NamedTuple the saver allows"
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
            self._prove(obj, data)
        return "msgpack", data

    def _prove(self, obj: Any, data: bytes) -> None:
        # Walk first with a hook that checks but builds nothing: LangGraph's
        # own safe types need no proof, and building them on every put costs.
        user_types: list[str] = []
        self._unpack(data, build=False, seen=user_types, tag=False)
        if not user_types:
            return
        # The reader's own decode, here and now: a class defined inside a
        # function, a nested class, dataclass fields the constructor does not
        # take, a validator that rewrites a field... fail now, not on resume.
        rebuilt = self._unpack(data, build=True, tag=False)
        if _encodes_to(rebuilt, data) or _equal(rebuilt, obj):
            return
        name = user_types[0]
        raise SerializationError(
            name,
            message=(
                f"a value of type {name} does not read back equal (decoding "
                f"{sorted(set(user_types))} gives {_short(rebuilt)}); store plain data, "
                "or make its constructor accept "
                "what its fields hold"
            ),
        )

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        """Decode a `(tag, bytes)` pair written by `dumps_typed`.

        Raises:
            SerializationError: the tag is not ours (pickle, json, unknown),
                the payload is corrupt, or (unless `unknown="tag"`) it names a
                type outside the allow-list or one that does not rebuild.
        """
        tag, payload = data
        if tag == "null":
            return None
        if tag == "bytes":
            return bytes(payload)
        if tag == "bytearray":
            return bytearray(payload)
        if tag == "msgpack":
            return self._unpack(payload, build=True, tag=self._unknown == "tag")
        raise SerializationError(
            str(tag), message=f"serializer tag {tag!r} is refused (only {sorted(_TAGS)})"
        )

    def _unpack(
        self, payload: bytes, *, build: bool, tag: bool, seen: list[str] | None = None
    ) -> Any:
        # ormsgpack turns any exception raised by an ext hook into a bare
        # `ValueError("ext_hook failed")` with no cause, so the hook records
        # its error here and we re-raise that one.
        errors: list[SerializationError] = []
        hook = self._make_hook(build=build, tag=tag, errors=errors, seen=seen)
        try:
            return ormsgpack.unpackb(payload, ext_hook=hook, option=_OPTION)
        except (ValueError, TypeError) as exc:
            if errors:
                raise errors[0] from None
            raise SerializationError("msgpack", message=f"corrupt msgpack: {exc}") from exc

    def _make_hook(
        self,
        *,
        build: bool,
        tag: bool,
        errors: list[SerializationError],
        seen: list[str] | None,
    ) -> Callable[[int, bytes], Any]:
        def hook(code: int, data: bytes) -> Any:
            try:
                return check_or_build(code, data)
            except SerializationError as exc:
                errors.append(exc)
                raise

        def refuse(name: str, payload: Any, exc: SerializationError) -> Any:
            # A display reader shows what it may not build as data; the
            # payload was decoded by this very hook, so it is data already.
            if tag:
                return TaggedValue(name, payload, str(exc))
            raise exc

        def check_or_build(code: int, data: bytes) -> Any:
            if code == jsonplus.EXT_DELTA_SNAPSHOT:
                inner = ormsgpack.unpackb(data, ext_hook=hook, option=_OPTION)
                return _DeltaSnapshot(inner) if build else None
            if code == jsonplus.EXT_NUMPY_ARRAY:
                if seen is not None:
                    seen.append("numpy.ndarray")
                dtype, shape, order, buf = ormsgpack.unpackb(data, option=_OPTION)
                if not self.allows("numpy", "ndarray"):
                    exc = SerializationError(
                        "numpy.ndarray",
                        message="type numpy.ndarray is not allowed; "
                        + _FIX.format(name="numpy.ndarray", package="numpy"),
                    )
                    return refuse("numpy.ndarray", {"dtype": dtype, "shape": shape}, exc)
                if not build:
                    return None
                import numpy as np  # allowed explicitly by the user

                return np.frombuffer(buf, dtype=np.dtype(dtype)).reshape(shape, order=order)
            if code not in _CONSTRUCTORS and code != jsonplus.EXT_METHOD_SINGLE_ARG:
                raise SerializationError(f"ext:{code}", message=f"unknown msgpack ext {code}")
            tup = ormsgpack.unpackb(data, ext_hook=hook, option=_OPTION)
            if not (isinstance(tup, (list, tuple)) and len(tup) >= 3):
                raise SerializationError(f"ext:{code}", message="malformed msgpack ext")
            module, name = tup[0], tup[1]
            if not (isinstance(module, str) and isinstance(name, str)):
                raise SerializationError(f"ext:{code}", message="malformed msgpack ext")
            dotted = f"{module}.{name}"
            if code == jsonplus.EXT_METHOD_SINGLE_ARG:
                method = tup[3] if len(tup) > 3 else None
                if (module, name, method) not in lg_msgpack.SAFE_MSGPACK_METHODS:
                    return refuse(dotted, tup[2], SerializationError(f"{dotted}.{method}"))
            elif not self.allows(module, name):
                exc = SerializationError(
                    dotted,
                    message=f"type {dotted} is not allowed; "
                    + _FIX.format(name=dotted, package=module.partition(".")[0]),
                )
                return refuse(dotted, tup[2], exc)
            elif seen is not None and (module, name) not in _SAFE:
                seen.append(dotted)
            if not build:
                return None
            try:
                return _construct(code, tup)
            except SerializationError as exc:
                return refuse(dotted, tup[2], exc)

        return hook


def _construct(code: int, tup: Any) -> Any:
    module, name, arg = tup[0], tup[1], tup[2]
    try:
        target = getattr(importlib.import_module(module), name, None)
        if target is None:
            raise SerializationError(
                f"{module}.{name}",
                message=(
                    f"cannot rebuild {module}.{name}: module {module} has no {name}. A reader "
                    "finds a class by module and name, so a class defined inside a function "
                    f"or nested in another class cannot be stored: define {name} at module "
                    f"level in {module}"
                ),
            )
        if code == jsonplus.EXT_METHOD_SINGLE_ARG:
            return getattr(target, tup[3])(arg)
        if code == jsonplus.EXT_CONSTRUCTOR_SINGLE_ARG:
            return target(arg)
        if code == jsonplus.EXT_CONSTRUCTOR_POS_ARGS:
            if module == "langgraph.types" and name == "Send":
                return jsonplus._send_from_args(arg)
            return target(*arg)
        if code == jsonplus.EXT_CONSTRUCTOR_KW_ARGS:
            if isinstance(target, type) and dataclasses.is_dataclass(target):
                return _dataclass(target, arg)
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


def _dataclass(target: type, fields: dict[str, Any]) -> Any:
    # LangGraph stores every field, `init=False` ones too, which the
    # constructor refuses: build from the init fields (running __post_init__
    # as the app did), then restore the others as they were stored.
    init = {f.name for f in dataclasses.fields(target) if f.init}
    obj = target(**{k: v for k, v in fields.items() if k in init})
    for key, value in fields.items():
        if key not in init:
            object.__setattr__(obj, key, value)
    return obj


def _encodes_to(value: Any, data: bytes) -> bool:
    try:
        again = ormsgpack.packb(value, default=jsonplus._msgpack_default, option=jsonplus._option)
    except Exception:
        return False
    return again == data


def _equal(a: Any, b: Any) -> bool:
    # Arrays and odd __eq__ implementations raise or return non-bools: not equal.
    try:
        result = a == b
        return result is True or (isinstance(result, bool) and result)
    except Exception:
        return False


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _qualname(value: Any) -> str:
    cls = type(value)
    return f"{cls.__module__}.{cls.__qualname__}"


# Built once: `json.dumps` with any non-default option builds a new encoder
# per call, a measurable share of a put. Keys are sorted so that equal
# objects have equal text (metadata filters compare nested objects as text).
_JSON = json.JSONEncoder(separators=(",", ":"), sort_keys=True, allow_nan=False, ensure_ascii=False)


def dumps_json(value: Any, what: str) -> str:
    """Encode `value` as compact JSON, naming `what` if it holds a non-JSON value.

    Raises:
        SerializationError: `value` is not plain JSON data.
    """
    try:
        return _JSON.encode(value)
    except (TypeError, ValueError) as exc:
        raise SerializationError(
            what, message=f"{what} must be JSON data (str, number, bool, None, list, dict): {exc}"
        ) from exc


def loads_json(text: str) -> Any:
    """Decode JSON written by `dumps_json`."""
    return json.loads(text)
