"""LangChain messages encoded and rebuilt without pydantic's walk (`core/messages.py`).

A put of a long chat encodes thousands of messages and a read rebuilds
them; `messages.encoded` skips `model_dump` and `messages.rebuilt` skips
validation where either would change nothing. These tests hold them to
that: for every shape of message a graph stores, the bytes are LangGraph's
own encoding's, and the object a read returns equals the one LangGraph's own
decoding gives, with the same fields set, extras and private state; and
where `model_dump` or validation would change a field, they take LangGraph's
path.
"""

from __future__ import annotations

import random
from typing import Any

import ormsgpack
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages.tool import tool_call
from langgraph.checkpoint.serde import jsonplus
from pydantic import BaseModel, model_validator

from langgraph_fenced_sqlite.core import messages, rebuild
from langgraph_fenced_sqlite.core.serde import DataOnlySerializer


def _text(rng: random.Random) -> str:
    return " ".join(
        rng.choice(["tea", "ünï", "42", "", "a\nb", "🙂"]) for _ in range(rng.randint(0, 6))
    )


def _plain(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.randint(0, 6 if depth < 2 else 3)
    if pick == 0:
        return _text(rng)
    if pick == 1:
        return rng.randint(-(2**40), 2**40)
    if pick == 2:
        return rng.choice([None, True, False, 1.5])
    if pick == 3:
        return b"\x00\xff"
    if pick == 4:
        return [_plain(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {_text(rng) + str(i): _plain(rng, depth + 1) for i in range(rng.randint(0, 3))}


def _content(rng: random.Random) -> Any:
    if rng.random() < 0.6:
        return _text(rng)
    return [
        _text(rng) if rng.random() < 0.5 else {"type": "text", "text": _text(rng)}
        for _ in range(rng.randint(0, 3))
    ]


def _common(rng: random.Random) -> dict[str, Any]:
    out: dict[str, Any] = {"content": _content(rng)}
    if rng.random() < 0.7:
        out["id"] = f"m-{rng.randint(0, 10**9)}"
    if rng.random() < 0.3:
        out["name"] = _text(rng)
    if rng.random() < 0.3:
        out["additional_kwargs"] = {"k": _plain(rng)}
    if rng.random() < 0.3:
        out["response_metadata"] = {"model": _text(rng), "n": _plain(rng)}
    return out


def _usage(rng: random.Random) -> dict[str, Any]:
    usage: dict[str, Any] = {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}
    if rng.random() < 0.5:
        usage["input_token_details"] = {"audio": 1, "cache_read": rng.randint(0, 9)}
    if rng.random() < 0.5:
        usage["output_token_details"] = {"reasoning": rng.randint(0, 9)}
    return usage


def _message(rng: random.Random) -> Any:
    kind = rng.randint(0, 3)
    if kind == 0:
        return HumanMessage(**_common(rng))
    if kind == 1:
        return SystemMessage(**_common(rng))
    if kind == 2:
        calls = [
            tool_call(name=_text(rng) or "f", args={"q": _plain(rng)}, id=rng.choice([None, "c1"]))
            for _ in range(rng.randint(0, 2))
        ]
        usage = _usage(rng) if rng.random() < 0.6 else None
        return AIMessage(**_common(rng), tool_calls=calls, usage_metadata=usage)
    return ToolMessage(
        **_common(rng),
        tool_call_id=f"c{rng.randint(0, 9)}",
        status=rng.choice(["success", "error"]),
        artifact=_plain(rng),
    )


def _packed(value: Any) -> bytes:
    return ormsgpack.packb(value, default=jsonplus._msgpack_default, option=rebuild.PACK_OPTION)


def _langgraph_reads(cls: type, fields: dict[str, Any]) -> Any:
    # What LangGraph's own decoding builds of these stored fields: validate,
    # else construct (its msgpack ext hook, allowing the class).
    payload = ormsgpack.packb(
        (cls.__module__, cls.__name__, fields, "model_validate_json"), option=rebuild.PACK_OPTION
    )
    hook = jsonplus._create_msgpack_ext_hook({(cls.__module__, cls.__name__)})
    return hook(jsonplus.EXT_PYDANTIC_V2, payload)


def _assert_as_validated(read: Any, fields: dict[str, Any], cls: type) -> None:
    theirs = _langgraph_reads(cls, fields)
    assert type(read) is type(theirs) is cls
    assert read == theirs
    assert read.model_fields_set == theirs.model_fields_set
    assert read.__pydantic_extra__ == theirs.__pydantic_extra__
    assert read.__pydantic_private__ == theirs.__pydantic_private__
    assert list(vars(read)) == list(vars(theirs))
    assert repr(read) == repr(theirs)
    assert _packed(read) == _packed(theirs)


def test_messages_a_graph_stores_read_back_as_validating_gives_them() -> None:
    serde = DataOnlySerializer()
    rng = random.Random(7)
    kinds = messages._kinds()
    assert set(kinds) == {AIMessage, HumanMessage, SystemMessage, ToolMessage}
    for _ in range(400):
        message = _message(rng)
        fields = message.model_dump()
        # Made by their constructors, every one is taken as it is, both ways...
        assert messages.encoded(message) is not None, fields
        assert messages.rebuilt(type(message), dict(fields)) is not None, fields
        # ...encodes to LangGraph's bytes...
        stored = serde.dumps_typed(message)
        assert stored == ("msgpack", _packed(message))
        # ...and reads back equal to what was put, as LangGraph's decoding rebuilds it.
        read = serde.loads_typed(stored)
        assert read == message
        _assert_as_validated(read, fields, type(message))


def _raw_tool_calls() -> dict[str, Any]:
    raw = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]
    return AIMessage(content="", additional_kwargs={"tool_calls": raw}).model_dump() | {
        "tool_calls": []
    }


# Stored fields that validation would change (or refuse): each is validated.
_CHANGED = {
    "raw tool calls, none parsed": (AIMessage, _raw_tool_calls),
    "a tool call with no type": (
        AIMessage,
        lambda: (
            AIMessage(content="x").model_dump()
            | {"tool_calls": [{"name": "f", "args": {}, "id": "c"}]}
        ),
    ),
    "an invalid tool call": (
        AIMessage,
        lambda: AIMessage(
            content="x",
            invalid_tool_calls=[{"name": "f", "args": "{", "id": "c", "error": "bad"}],
        ).model_dump(),
    ),
    "usage counts out of order": (
        AIMessage,
        lambda: (
            AIMessage(content="x").model_dump()
            | {"usage_metadata": {"total_tokens": 7, "input_tokens": 3, "output_tokens": 4}}
        ),
    ),
    "a usage count that is a bool": (
        AIMessage,
        lambda: (
            AIMessage(content="x").model_dump()
            | {"usage_metadata": {"input_tokens": True, "output_tokens": 4, "total_tokens": 7}}
        ),
    ),
    "a field the class does not declare": (
        HumanMessage,
        lambda: HumanMessage(content="x", lang="en").model_dump(),
    ),
    "a field missing": (
        HumanMessage,
        lambda: {k: v for k, v in HumanMessage(content="x").model_dump().items() if k != "name"},
    ),
    "another message's type": (
        SystemMessage,
        lambda: SystemMessage(content="x").model_dump() | {"type": "human"},
    ),
    "a tuple of content": (
        HumanMessage,
        lambda: HumanMessage(content="x").model_dump() | {"content": ("a",)},
    ),
    "a tool call id that is an int": (
        ToolMessage,
        lambda: ToolMessage(content="x", tool_call_id="1").model_dump() | {"tool_call_id": 1},
    ),
}


@pytest.mark.parametrize("case", sorted(_CHANGED))
def test_fields_validation_would_change_are_validated(case: str) -> None:
    cls, make = _CHANGED[case]
    fields = make()
    assert messages.rebuilt(cls, dict(fields)) is None
    read = rebuild.construct(jsonplus.EXT_PYDANTIC_V2, (cls.__module__, cls.__name__, fields), cls)
    _assert_as_validated(read, fields, cls)


def test_the_check_matters_validation_parses_raw_tool_calls() -> None:
    # Why the raw-tool-calls case is refused: there validation (LangGraph's
    # decoding) gives another value than the stored fields.
    fields = _raw_tool_calls()
    assert AIMessage(**fields).tool_calls == [
        {"name": "f", "args": {"a": 1}, "id": "c1", "type": "tool_call"}
    ]
    assert AIMessage.model_construct(**fields).tool_calls == []
    read = DataOnlySerializer().loads_typed(
        ("msgpack", _packed(AIMessage.model_construct(**fields)))
    )
    assert read.tool_calls == [{"name": "f", "args": {"a": 1}, "id": "c1", "type": "tool_call"}]


class _Shouting(AIMessage):
    """An app's subclass with a validator of its own."""

    @model_validator(mode="before")
    @classmethod
    def _shout(cls, values: dict[str, Any]) -> Any:
        if isinstance(values.get("content"), str):
            values["content"] = values["content"].upper()
        return values


def test_a_subclass_is_validated_with_its_own_validators() -> None:
    assert _Shouting not in messages._kinds()
    assert messages.encoded(_Shouting(content="quiet")) is None
    fields = AIMessage(content="quiet").model_dump() | {"type": "ai"}
    read = rebuild.construct(jsonplus.EXT_PYDANTIC_V2, (__name__, "_Shouting", fields), _Shouting)
    assert read.content == "QUIET"


class _Point(BaseModel):
    x: int


# Messages whose attributes `model_dump` would not return as they are: each is
# encoded by LangGraph's path, to LangGraph's bytes.
_DUMPED_OTHERWISE = {
    "a model in the metadata": lambda: AIMessage(content="x", response_metadata={"p": _Point(x=1)}),
    "a tuple in the metadata": lambda: HumanMessage(content="x", additional_kwargs={"t": (1, 2)}),
    "a set in an artifact": lambda: ToolMessage(content="x", tool_call_id="c", artifact={1, 2}),
    "an extra field": lambda: HumanMessage(content="x", lang="en"),
    "usage assigned out of order": lambda: _assigned(
        AIMessage(content="x"),
        usage_metadata={"total_tokens": 7, "input_tokens": 3, "output_tokens": 4},
    ),
    "a tool call assigned without its type": lambda: _assigned(
        AIMessage(content="x"), tool_calls=[{"name": "f", "args": {}, "id": "c"}]
    ),
    "content assigned as a tuple": lambda: _assigned(HumanMessage(content="x"), content=("a",)),
}


def _assigned(message: Any, **fields: Any) -> Any:
    for name, value in fields.items():
        setattr(message, name, value)
    return message


@pytest.mark.parametrize("case", sorted(_DUMPED_OTHERWISE))
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # the tuple's
def test_attributes_model_dump_would_change_take_langgraphs_encoding(case: str) -> None:
    message = _DUMPED_OTHERWISE[case]()
    assert messages.encoded(message) is None
    # Encoded as LangGraph encodes it (whether it then reads back equal is
    # the proof's to say, as for any value).
    assert DataOnlySerializer().pack(message)[:2] == ("msgpack", _packed(message))
