"""Rebuild one stored data-class value from its class and its stored fields.

Invariant: `construct` calls only the class it is handed (the reader found it
in its registry, or imported it because its allow-list names it) and never
imports anything itself unless handed no class, for a name the caller has
already checked against the allow-list; every failure is a
`SerializationError` naming the type, never a different value.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Any

import ormsgpack
from langgraph.checkpoint.serde import jsonplus
from langgraph.checkpoint.serde._msgpack import SAFE_MSGPACK_TYPES

from ..errors import SerializationError
from . import messages

# LangGraph's encoding options, less OPT_REPLACE_SURROGATES: LangGraph stores a
# lone surrogate as "?", a different value than was written; we refuse it
# (ormsgpack raises), so a value accepted on write reads back equal.
PACK_OPTION = jsonplus._option & ~ormsgpack.OPT_REPLACE_SURROGATES

__all__ = ["construct", "encodes_to", "equal", "short"]


def construct(code: int, tup: Any, cls: type | None) -> Any:
    """Build the value of ext `code` whose payload is `tup` = (module, name, arg, ...).

    Args:
        code: The msgpack ext code (which constructor convention).
        tup: The decoded ext payload.
        cls: The class to call, from the reader's registry; `None` to import
            `module.name` (the caller has checked that its allow-list names it).

    Raises:
        SerializationError: the class is not found, or calling it fails.
    """
    module, name, arg = tup[0], tup[1], tup[2]
    try:
        target: Any = cls if cls is not None else _by_name(module, name)
        if target is None:
            raise SerializationError(
                f"{module}.{name}",
                message=(
                    f"cannot rebuild {module}.{name}: module {module} has no {name} (a class "
                    "defined inside a function or nested in another class cannot be found by "
                    "module and name): give the reader the class itself, e.g. "
                    f"FencedSqliteSaver(path, allowed_types=[{name}]), or "
                    "saver.for_graph(builder) for the graph that declares it"
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
        # pydantic v1 / v2: validate, as LangGraph does, falling back to construct
        # (a LangChain message whose fields validation keeps as they are: neither).
        if code == jsonplus.EXT_PYDANTIC_V2 and type(arg) is dict:
            message = messages.rebuilt(target, arg)
            if message is not None:
                return message
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


def _by_name(module: str, name: str) -> Any:
    # `module.name`, imported; None if the module has no such attribute.
    # LangGraph's own types (its messages, `Interrupt`, `Send`: every read
    # of a chat looks one up, and `import_module` with `getattr` cost about
    # 1 us a value) are kept once found. An app's types are looked up each
    # time, so a module the app reloads (a dev server's hot reload) gives
    # its new class, as it did before the module was reloaded.
    key = (module, name)
    found = _FOUND.get(key)
    if found is None:
        found = getattr(importlib.import_module(module), name, None)
        if found is not None and key in SAFE_MSGPACK_TYPES:
            _FOUND[key] = found
    return found


# `_by_name`'s LangGraph types found so far (a subset of SAFE_MSGPACK_TYPES).
_FOUND: dict[tuple[str, str], Any] = {}


@functools.lru_cache(maxsize=1024)
def _init_fields(target: type) -> frozenset[str]:
    # A dataclass's constructor fields (`dataclasses.fields` walks them all,
    # about 1.5 us, on every read of an `Interrupt`).
    return frozenset(f.name for f in dataclasses.fields(target) if f.init)


def _dataclass(target: type, fields: dict[str, Any]) -> Any:
    # LangGraph stores every field, `init=False` ones too, which the
    # constructor refuses: build from the init fields (running __post_init__
    # as the app did), then restore the others as they were stored.
    init = _init_fields(target)
    obj = target(**{k: v for k, v in fields.items() if k in init})
    for key, value in fields.items():
        if key not in init:
            object.__setattr__(obj, key, value)
    return obj


def encodes_to(value: Any, data: bytes) -> bool:
    """Tell whether `value` encodes to exactly `data` (LangGraph's msgpack encoding)."""
    try:
        again = ormsgpack.packb(value, default=jsonplus._msgpack_default, option=PACK_OPTION)
    except Exception:
        return False
    return again == data


def equal(a: Any, b: Any) -> bool:
    """Tell whether `a == b` is plainly true (arrays and odd `__eq__`s are not equal)."""
    try:
        result = a == b
        return result is True or (isinstance(result, bool) and result)
    except Exception:
        return False


def short(value: Any) -> str:
    """Return `repr(value)`, cut to 200 characters."""
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."
