"""LangChain's messages, encoded and rebuilt without pydantic's walk when it would change nothing.

A chat's state holds its messages by the thousand, and every put encodes
them all (elements are compared by their bytes) and every read of the state
rebuilds them all. LangGraph's msgpack encoding of a pydantic model is its
`model_dump()` in an ext; its decoding validates those fields again
(`cls(**fields)`). For `HumanMessage`, `SystemMessage`, `AIMessage` and
`ToolMessage` whose fields are plain data in the form validation and
`model_dump` keep as they are, both walks are skipped:

- `encoded(message)` packs the message's own attributes, which are then
  what `model_dump()` would return;
- `rebuilt(cls, fields)` makes the stored fields the message's attributes,
  as `model_construct` would, where validating them would change nothing.

Invariant: each gives exactly what LangGraph's own path gives (the same
bytes; an equal object with the same fields set, extras and private state),
or None, and the caller takes that path (tests/core/test_messages.py). A
class whose fields, validators or pydantic internals are not the ones
checked here (another langchain-core or pydantic) always takes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import ormsgpack
from langgraph.checkpoint.serde import jsonplus

__all__ = ["encoded", "rebuilt"]

# Scalars that `model_dump` returns as they are and msgpack packs as LangGraph does.
_SCALARS = frozenset({str, int, float, bool, bytes, type(None)})
# How deep `_plain` looks into the metadata dicts before giving up (and taking LangGraph's path).
_DEPTH = 8
_COUNTS = ("input_tokens", "output_tokens", "total_tokens")
_CALL = ("name", "args", "id", "type")
_BASE = ("content", "additional_kwargs", "response_metadata", "type", "name", "id")


def _plain(value: Any, depth: int = 0) -> bool:
    # Plain data all the way down: dicts keyed by str, lists, `_SCALARS`.
    t = type(value)
    if t in _SCALARS:
        return True
    if depth > _DEPTH:
        return False
    if t is dict:
        return all(type(k) is str and _plain(v, depth + 1) for k, v in value.items())
    if t is list:
        return all(_plain(v, depth + 1) for v in value)
    return False


def _base(fields: dict[str, Any], kind: str) -> bool:
    # BaseMessage's fields: content a str or a list of str and plain dicts; the
    # metadata plain dicts; `type` the class's own; `name` and `id` str or None.
    content = fields["content"]
    if type(content) is not str and not (
        type(content) is list
        and all(type(x) is str or (type(x) is dict and _plain(x)) for x in content)
    ):
        return False
    kind_, name, id_ = fields["type"], fields["name"], fields["id"]
    extra, meta = fields["additional_kwargs"], fields["response_metadata"]
    return (
        type(kind_) is str
        and kind_ == kind
        and (name is None or type(name) is str)
        and (id_ is None or type(id_) is str)
        and type(extra) is dict
        and (not extra or _plain(extra))
        and type(meta) is dict
        and (not meta or _plain(meta))
    )


def _ints_in_order(d: Any, keys: Sequence[str]) -> bool:
    # A dict of some of `keys`, in their order, each value an int: as a
    # TypedDict of optional ints validates and dumps to itself.
    if type(d) is not dict:
        return False
    return list(d) == [k for k in keys if k in d] and all(type(v) is int for v in d.values())


def _usage(usage: Any, details: dict[str, tuple[str, ...]]) -> bool:
    # `UsageMetadata`: the three counts, then either token details, in order.
    if usage is None:
        return True
    if type(usage) is not dict:
        return False
    keys = list(usage)
    rest = keys[3:]
    return (
        keys[:3] == list(_COUNTS)
        and all(type(usage[k]) is int for k in _COUNTS)
        and rest == [k for k in details if k in rest]
        and all(_ints_in_order(usage[k], details[k]) for k in rest)
    )


def _tool_call(tc: Any) -> bool:
    # A tool call as `tool_call()` makes it, its args plain data keyed by str.
    if type(tc) is not dict or tuple(tc) != _CALL:
        return False
    id_ = tc["id"]
    return (
        type(tc["name"]) is str
        and type(tc["args"]) is dict
        and _plain(tc["args"])
        and (id_ is None or type(id_) is str)
        and tc["type"] == "tool_call"
    )


class _Kind(NamedTuple):
    module: str
    name: str
    fields: tuple[str, ...]
    keys: frozenset[str]
    # Whether a message's fields (stored, or its attributes) are in the form
    # validation and `model_dump` keep as they are.
    as_is: Callable[[dict[str, Any]], bool]


# `_kinds()`, once found: read directly on every message (a call costs more than the lookup).
_KINDS: dict[type, _Kind] | None = None


def _kinds() -> dict[type, _Kind]:
    # The message classes taken here, each checked to be the class this
    # module was written against (found once; a race finds them twice, alike).
    global _KINDS
    if _KINDS is None:
        _KINDS = _find_kinds()
    return _KINDS


def _find_kinds() -> dict[type, _Kind]:
    try:
        from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
        from langchain_core.messages.ai import InputTokenDetails, OutputTokenDetails
        from pydantic import BaseModel
    except ImportError:  # pragma: no cover - LangGraph requires langchain-core
        return {}
    details = {
        "input_token_details": tuple(InputTokenDetails.__annotations__),
        "output_token_details": tuple(OutputTokenDetails.__annotations__),
    }

    def ai(fields: dict[str, Any]) -> bool:
        calls, usage = fields["tool_calls"], fields["usage_metadata"]
        return (
            _base(fields, "ai")
            and type(calls) is list
            and (
                all(_tool_call(tc) for tc in calls)
                if calls
                # No calls: validation would parse raw ones out of `additional_kwargs`.
                else not fields["additional_kwargs"].get("tool_calls")
            )
            and fields["invalid_tool_calls"] == []
            and type(fields["invalid_tool_calls"]) is list
            and (usage is None or _usage(usage, details))
        )

    def tool(fields: dict[str, Any]) -> bool:
        status = fields["status"]
        return (
            _base(fields, "tool")
            and type(fields["tool_call_id"]) is str
            and type(status) is str
            and status in ("success", "error")
            and _plain(fields["artifact"])
        )

    classes: dict[type, tuple[tuple[str, ...], tuple[str, ...], Callable[..., bool]]] = {
        HumanMessage: ((), _BASE, lambda fields: _base(fields, "human")),
        SystemMessage: ((), _BASE, lambda fields: _base(fields, "system")),
        AIMessage: (
            ("_backwards_compat_tool_calls",),
            (*_BASE, "tool_calls", "invalid_tool_calls", "usage_metadata"),
            ai,
        ),
        ToolMessage: (("coerce_args",), (*_BASE, "tool_call_id", "artifact", "status"), tool),
    }
    out: dict[type, _Kind] = {}
    for message, (validators, fields, check) in classes.items():
        cls: Any = message
        decorators = cls.__pydantic_decorators__
        if (
            tuple(decorators.model_validators) == validators
            and not decorators.field_validators
            and not decorators.validators
            and not decorators.root_validators
            and not decorators.field_serializers
            and not decorators.model_serializers
            and not decorators.computed_fields
            and tuple(cls.model_fields) == fields
            and cls.model_post_init is BaseModel.model_post_init
            and _builds_as_pydantic(cls)
        ):
            out[cls] = _Kind(cls.__module__, cls.__name__, fields, frozenset(fields), check)
    return out


def rebuilt(cls: Any, fields: dict[str, Any]) -> Any:
    """Return the message `cls(**fields)` would build, without validating; None: validate.

    Only when `fields` holds every field of `cls` and nothing else, each as
    validation keeps it. The decoded dict, fresh from msgpack, becomes the
    message's own.
    """
    kind = (_KINDS if _KINDS is not None else _kinds()).get(cls)
    if kind is None or fields.keys() != kind.keys or not kind.as_is(fields):
        return None
    return _as_is(cls, fields)


def encoded(message: Any) -> ormsgpack.Ext | None:
    """Return LangGraph's msgpack ext of `message` (`_msgpack_default`'s); None: not taken here.

    Only when the message's attributes are exactly its fields, in order, no
    extra, each as `model_dump` returns it: they are then what it returns.
    """
    kind = (_KINDS if _KINDS is not None else _kinds()).get(type(message))
    if kind is None or message.__pydantic_extra__:
        return None
    fields = message.__dict__
    if tuple(fields) != kind.fields or not kind.as_is(fields):
        return None
    return ormsgpack.Ext(
        jsonplus.EXT_PYDANTIC_V2,
        ormsgpack.packb(
            (kind.module, kind.name, fields, "model_validate_json"),
            default=jsonplus._msgpack_default,
            option=jsonplus._option,
        ),
    )


def _as_is(cls: Any, fields: dict[str, Any]) -> Any:
    # `cls.model_construct(**fields)` for `fields` holding every field of
    # `cls` and nothing else, without its walk over the class's fields.
    obj = cls.__new__(cls)
    _set(obj, "__dict__", fields)
    _set(obj, "__pydantic_fields_set__", set(fields))
    _set(obj, "__pydantic_extra__", {})
    _set(obj, "__pydantic_private__", None)
    return obj


_set = object.__setattr__


def _builds_as_pydantic(cls: Any) -> bool:
    # Whether `_as_is` builds what this pydantic's `model_construct` builds
    # for the class, and `model_dump` of it returns its attributes: no
    # private attributes, extras allowed (kept in `__pydantic_extra__`), and
    # the same of a sample.
    if cls.__private_attributes__ or cls.model_config.get("extra") != "allow":
        return False
    try:
        sample = cls.model_construct(content="x", tool_call_id="c").model_dump()
        sample = {k: v for k, v in sample.items() if k in cls.model_fields}
        ours, theirs = _as_is(cls, dict(sample)), cls.model_construct(**sample)
        slots: tuple[str, ...] = ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__")
        slots += ("__pydantic_private__",)
        return (
            all(getattr(ours, slot) == getattr(theirs, slot) for slot in slots)
            and list(ours.__dict__) == list(theirs.__dict__)
            and ours.model_dump() == sample
        )
    except Exception:  # pragma: no cover - a pydantic that builds objects otherwise
        return False
