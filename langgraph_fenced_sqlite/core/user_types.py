"""Where users' own types come from, how a refusal says where, how a reader shows one.

Invariant: a `TypeRegistry` only ever holds class objects the application's
own code handed over (given in `allowed_types`, declared by a graph's schemas,
or found inside a value it stored through the serializer), never anything a
stored row names; `schema_types` only reads a graph's declared types, and
`instance_classes` only reads a value being written. A `TaggedValue` is built
from plain decoded data, so showing a stored value of a type the reader does
not allow imports and calls nothing.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
import typing
from collections import deque
from typing import Any

from ..errors import SerializationError, bad_argument

__all__ = [
    "ALLOW_ENV",
    "TaggedValue",
    "TypeRegistry",
    "instance_classes",
    "parse_allow",
    "schema_classes",
    "schema_types",
    "write_context",
]

TypeKey = tuple[str, ...]

# The variable holding an allow-list as text (`parse_allow`), for `lgfs` and the
# Agent Server's factory alike: "myapp, other.mod:Thing".
ALLOW_ENV = "LGFS_ALLOW"


class TaggedValue:
    """A stored value a display reader did not rebuild, shown as its data.

    Attributes:
        type_name: The `module.name` the row names.
        data: Its fields (or argument) as plain data, nested values decoded alike.
        reason: Why it was not rebuilt (not allowed, not importable...).
    """

    __slots__ = ("data", "reason", "type_name")

    def __init__(self, type_name: str, data: Any, reason: str) -> None:
        """Hold `data` stored as a `type_name` value (see the class attributes)."""
        self.type_name, self.data, self.reason = type_name, data, reason

    def to_dict(self) -> dict[str, Any]:
        """Return the value as JSON-ready data: `{"type", "data", "rebuilt", "reason"}`."""
        return {"type": self.type_name, "data": self.data, "rebuilt": False, "reason": self.reason}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TaggedValue) and (self.type_name, self.data) == (
            other.type_name,
            other.data,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TaggedValue({self.type_name!r}, {self.data!r})"


class TypeRegistry:
    """The class objects a serializer (and every one derived from it) rebuilds without import.

    Keyed by `(module, name)`, as rows name classes. Entries come only from the
    application: classes given as allow-list entries, a bound graph's schema
    classes, and the classes of values this process stored. A later class
    under the same key replaces the earlier one (a module reloaded, a test
    defining its local class again): the latest one the application used wins.
    """

    __slots__ = ("_classes", "_lock")

    def __init__(self) -> None:
        """Start empty."""
        self._classes: dict[TypeKey, type] = {}
        self._lock = threading.Lock()

    def add(self, classes: typing.Iterable[type]) -> None:
        """Register `classes` under their `(__module__, __name__)`."""
        with self._lock:
            for cls in classes:
                self._classes[(cls.__module__, cls.__name__)] = cls

    def get(self, key: TypeKey) -> type | None:
        """Return the class registered for `key`, if any."""
        return self._classes.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._classes

    def __len__(self) -> int:
        return len(self._classes)


def parse_allow(text: str, argument: str) -> tuple[list[TypeKey], list[str]]:
    """Split an allow-list written as text into classes and packages.

    The one syntax of `$LGFS_ALLOW`, which `lgfs` and the Agent Server's
    factory both read: comma-separated entries, each a package (`myapp`, an
    `allowed_modules` entry) or a class (`other.mod:Thing`, an
    `allowed_types` entry). Module names are checked where they are used
    (`DataOnlySerializer`).

    Args:
        text: The entries, e.g. `"myapp, other.mod:Thing"`; blanks are skipped.
        argument: What an error names (the variable or option read).

    Returns:
        `(types, modules)`: the `(module, name)` pairs and the package names.

    Raises:
        InvalidArgument: an entry with a colon is not `MODULE:NAME`.
    """
    types: list[TypeKey] = []
    modules: list[str] = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        if ":" not in entry:
            modules.append(entry)
            continue
        module, _, name = entry.partition(":")
        if not (module and name) or ":" in name:
            raise bad_argument(argument, f"{entry!r}: expected MODULE:NAME or a package name")
        types.append((module, name))
    return types, modules


_LEAVES = (str, bytes, bytearray, int, float, bool, complex, type(None))


def instance_classes(value: Any, limit: int = 100_000) -> dict[TypeKey, type]:
    """Return the classes of the objects inside `value`, keyed by `(module, name)`.

    Walks what LangGraph's encoder walks (containers, dataclass and pydantic
    fields, slots, enum values), so every user class the encoding of `value`
    names is found with its class object, local and nested classes included.

    Args:
        value: A value about to be stored.
        limit: How many objects to visit at most (a huge value is cut short;
            a class not found is then only rebuilt if allowed by name).
    """
    found: dict[TypeKey, type] = {}
    visited: set[int] = set()
    stack = [value]
    while stack and len(visited) < limit:
        obj = stack.pop()
        cls = type(obj)
        if cls in _LEAVES or id(obj) in visited or isinstance(obj, type):
            continue
        visited.add(id(obj))
        if cls.__module__ != "builtins":
            found.setdefault((cls.__module__, cls.__name__), cls)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset, deque)):
            stack.extend(obj)
        elif isinstance(obj, enum.Enum):
            stack.append(obj.value)
        else:
            stack.extend(_attributes(obj))
    return found


def _attributes(obj: Any) -> list[Any]:
    # Instance dict (pydantic models, plain dataclasses, Send...) and slots.
    out: list[Any] = []
    try:
        attrs = vars(obj)
    except TypeError:
        attrs = {}
    out.extend(attrs.values())
    extra = getattr(obj, "__pydantic_extra__", None)
    if isinstance(extra, dict):
        out.extend(extra.values())
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            try:
                out.append(getattr(obj, slot))
            except Exception:  # an unset slot, a property that raises: nothing to find
                continue
    return out


def schema_classes(graph: Any) -> dict[TypeKey, type]:
    """Return the classes a graph's schemas declare, keyed by `(module, name)`.

    The class objects behind `schema_types`, so a reader bound to the graph
    rebuilds them without importing anything (local classes included).

    Raises:
        InvalidArgument: `graph` is neither a `StateGraph` nor its compiled graph.
    """
    builder, schemas = _schemas(graph)
    found: dict[TypeKey, type] = {}
    seen: set[int] = set()
    for typ in schemas + [getattr(c, "ValueType", None) for c in builder.channels.values()]:
        _walk(typ, found, seen)
    return found


def schema_types(graph: Any) -> set[TypeKey]:
    """Derive the `(module, name)` pairs a graph's schemas declare, as LangGraph's strict mode does.

    Args:
        graph: A `StateGraph` builder or the graph its `compile()` returned.

    Returns:
        The types of the state, input, output and context schemas, of each
        node's and branch's input schema and of every channel, found through
        unions, containers, `Annotated`, TypedDicts, models and dataclasses.

    Raises:
        InvalidArgument: `graph` is neither.
    """
    from langgraph._internal import _serde as lg_serde

    builder, schemas = _schemas(graph)
    # The same derivation `StateGraph.compile` runs under LANGGRAPH_STRICT_MSGPACK,
    # plus what it skips: NamedTuples, and whatever sits inside them.
    found = lg_serde.build_serde_allowlist(schemas=schemas, channels=builder.channels)
    return found | set(schema_classes(graph))


def _schemas(graph: Any) -> tuple[Any, list[Any]]:
    from langgraph.graph.state import StateGraph

    builder = graph if isinstance(graph, StateGraph) else getattr(graph, "builder", None)
    if not isinstance(builder, StateGraph):
        raise bad_argument("graph", f"expected a StateGraph or its compiled graph, got {graph!r}")
    schemas: list[Any] = [builder.state_schema, builder.input_schema, builder.output_schema]
    if builder.context_schema is not None:
        schemas.append(builder.context_schema)
    schemas.extend(node.input_schema for node in builder.nodes.values())
    for branches in builder.branches.values():
        schemas.extend(b.input_schema for b in branches.values() if b.input_schema is not None)
    return builder, schemas


def _walk(typ: Any, found: dict[TypeKey, type], seen: set[int]) -> None:
    if typ is None or id(typ) in seen or len(seen) > 10_000:
        return
    seen.add(id(typ))
    if isinstance(typ, type):
        if (issubclass(typ, tuple) and hasattr(typ, "_fields")) or (
            issubclass(typ, enum.Enum)
            or dataclasses.is_dataclass(typ)
            or hasattr(typ, "model_fields")
        ):
            found.setdefault((typ.__module__, typ.__name__), typ)
        if typ.__module__ != "builtins":
            try:
                hints = typing.get_type_hints(typ, include_extras=True)
            except Exception:  # unresolvable forward references: LangGraph skips them too
                hints = {}
            for hint in hints.values():
                _walk(hint, found, seen)
    for arg in typing.get_args(typ):
        _walk(arg, found, seen)


def write_context(
    exc: SerializationError,
    *,
    channel: str,
    keys: list[str] | None = None,
    task_id: str = "",
    task_path: str = "",
) -> SerializationError:
    """Return `exc` restated with the channel and the node or task that wrote the value.

    Args:
        exc: The refusal from `dumps_typed` (perhaps already located by it).
        channel: The channel (state key) the value was written to.
        keys: Keys inside the channel's value leading to the refused value.
        task_id: The task that wrote it (`put_writes`), if known.
        task_path: The task's path; a pulled node's path ends with its name.
    """
    # A refusal `dumps_typed` already located keeps its reason and its keys.
    reason = getattr(exc, "_reason", str(exc))
    inner = [*getattr(exc, "_keys", ()), *(keys or ())]
    if getattr(exc, "_channel", None) is not None:
        inner = [exc._channel, *inner]  # type: ignore[attr-defined]
    where = f"channel {channel!r}" + "".join(f"[{key!r}]" for key in inner)
    if channel == "__start__":
        where += " (the graph's input)"
    if task_id:
        parts = task_path.split(", ")
        node = parts[1] if len(parts) == 2 and parts[0] == "~__pregel_pull" else None
        where += (
            f" written by node {node!r} (task {task_id})"
            if node
            else f" (task {task_id}, path {task_path!r})"
        )
    out = SerializationError(exc.type_name, message=f"cannot store {where}: {reason}")
    if not task_id:
        out._reason, out._channel, out._keys = reason, channel, inner  # type: ignore[attr-defined]
    return out
