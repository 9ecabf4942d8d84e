"""Data-only serialization: what is stored, what is refused, and that nothing runs on read.

`DataOnlySerializer` writes the bytes LangGraph's `JsonPlusSerializer` writes
(rows stay readable by LangGraph tooling) but never pickles, refuses at write
time any value it cannot rebuild, and on read rebuilds only an allow-list plus
the classes the application itself stored through it.
The hostile payloads used here are checked to be real: naive decoding (plain
`pickle`, LangGraph's permissive msgpack reader) runs them.
"""

from __future__ import annotations

import collections
import datetime
import decimal
import enum
import ipaddress
import json
import os
import pathlib
import pickle
import re
import subprocess
import sys
import textwrap
import uuid
import zoneinfo
from dataclasses import dataclass
from typing import Any, NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langchain_core.documents import Document
from langchain_core.messages import (
    AIMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.types import Interrupt, Send
from pydantic import BaseModel

from langgraph_fenced_sqlite import DataOnlySerializer, FencedSqliteSaver, SerializationError
from langgraph_fenced_sqlite.core.stored_json import dumps_json, loads_json
from langgraph_fenced_sqlite.testing.cases_input import hostile_payloads


@dataclass
class UserThing:
    """A user dataclass: not in the default allow-list."""

    name: str


class UserModel(BaseModel):
    """A user pydantic model: not in the default allow-list."""

    x: int


class UserColor(enum.Enum):
    """A user enum: not in the default allow-list."""

    RED = 1


class UserPair(NamedTuple):
    """A user named tuple."""

    a: int
    b: int


class Opaque:
    """A plain class LangGraph cannot serialize at all."""


SAFE_VALUES: list[Any] = [
    None,
    True,
    0,
    -(2**63),
    2**64 - 1,
    1.5,
    "ü🙂",
    b"\x00\xff",
    bytearray(b"ab"),
    [1, [2, {"k": None}]],
    {"nested": {"deeper": [1.0, "x"]}, 3: "int key"},
    datetime.datetime(2024, 2, 29, 1, 2, 3, 4, tzinfo=datetime.timezone.utc),
    datetime.datetime(2024, 1, 1),
    datetime.date(2024, 2, 29),
    datetime.time(23, 59, 1),
    datetime.timedelta(days=2, microseconds=3),
    datetime.timezone(datetime.timedelta(hours=-3)),
    uuid.UUID(int=12345),
    decimal.Decimal("-1.25E+3"),
    {1, 2},
    frozenset({"a"}),
    collections.deque([1, 2]),
    ipaddress.IPv4Address("10.0.0.1"),
    ipaddress.IPv4Network("10.0.0.0/8"),
    ipaddress.IPv4Interface("10.0.0.1/24"),
    ipaddress.IPv6Address("::1"),
    ipaddress.IPv6Network("fe80::/64"),
    ipaddress.IPv6Interface("fe80::1/64"),
    pathlib.PurePosixPath("/tmp/x") and pathlib.Path("/tmp/x"),
    zoneinfo.ZoneInfo("Europe/Paris"),
    re.compile(r"a+b", re.IGNORECASE),
    HumanMessage("hi ü", id="h1"),
    AIMessage("a", id="a1", tool_calls=[{"name": "f", "args": {"x": 1}, "id": "c1"}]),
    SystemMessage("sys"),
    ToolMessage("result", tool_call_id="c1"),
    RemoveMessage(id="h1"),
    Document("doc", metadata={"k": [1]}),
    Send("node", {"arg": [1]}),
    [Interrupt(value={"q": "?"}, id="i1")],
]


@pytest.mark.parametrize("value", SAFE_VALUES, ids=lambda v: type(v).__name__)
def test_safe_values_round_trip_with_langgraphs_bytes(value: Any) -> None:
    """Allowed values round-trip exactly, stored as the very bytes JsonPlusSerializer writes."""
    ours = DataOnlySerializer()
    theirs = JsonPlusSerializer()
    encoded = ours.dumps_typed(value)
    assert encoded == theirs.dumps_typed(value)
    assert ours.loads_typed(encoded) == value
    assert type(ours.loads_typed(encoded)) is type(value)


def test_tuples_and_exceptions_come_back_as_langgraph_brings_them_back() -> None:
    """Pin LangGraph's own lossy cases, which we keep: tuples become lists, errors their repr.

    An `__error__` write of a failed node is therefore a string on resume,
    with this saver exactly as with LangGraph's savers.
    """
    ours, theirs = DataOnlySerializer(), JsonPlusSerializer()
    for value, expected in [
        ((1, (2, 3)), [1, [2, 3]]),
        (ValueError("boom"), "ValueError('boom')"),
    ]:
        assert ours.loads_typed(ours.dumps_typed(value)) == expected
        assert theirs.loads_typed(theirs.dumps_typed(value)) == expected


@pytest.mark.parametrize(
    ("value", "type_name"),
    [
        (Opaque(), f"{__name__}.Opaque"),
        (lambda: 1, "builtins.function"),
        (len, "builtins.builtin_function_or_method"),
        ({"deep": [{"inside": Opaque()}]}, f"{__name__}.Opaque"),
    ],
    ids=["plain", "lambda", "builtin", "nested"],
)
def test_values_with_no_data_encoding_are_refused_at_write_naming_them(
    value: Any, type_name: str
) -> None:
    """A value no reader could rebuild is refused when written, naming its type."""
    with pytest.raises(SerializationError) as exc:
        DataOnlySerializer().dumps_typed(value)
    assert exc.value.type_name == type_name
    assert type_name in str(exc.value)


@pytest.mark.parametrize(
    ("value", "type_name"),
    [
        (UserThing("x"), f"{__name__}.UserThing"),
        (UserModel(x=1), f"{__name__}.UserModel"),
        (UserColor.RED, f"{__name__}.UserColor"),
        ({"deep": [{"inside": UserThing("y")}]}, f"{__name__}.UserThing"),
        (UserPair(1, 2), f"{__name__}.UserPair"),
    ],
    ids=["dataclass", "pydantic", "enum", "nested", "namedtuple"],
)
def test_user_types_are_learned_by_their_writer_and_refused_by_other_readers(
    value: Any, type_name: str
) -> None:
    """The writer rebuilds what it stored; a reader that stored nothing refuses it, naming it."""
    writer = DataOnlySerializer()
    stored = writer.dumps_typed(value)
    back = writer.loads_typed(stored)
    assert back == value and type(back) is type(value)
    with pytest.raises(SerializationError) as exc:
        DataOnlySerializer().loads_typed(stored)
    assert exc.value.type_name == type_name
    assert type_name in str(exc.value) and "allowed_types=" in str(exc.value)


def test_integers_beyond_64_bits_are_refused_not_altered() -> None:
    """msgpack has no integer above 64 bits: such a value is refused, never truncated."""
    for value in (2**64, -(2**63) - 1, {"deep": [2**70]}):
        with pytest.raises(SerializationError, match="64-bit"):
            DataOnlySerializer().dumps_typed(value)


def test_langgraph_strict_reader_silently_changes_what_we_refuse() -> None:
    """Why refusing matters: LangGraph's strict reader turns a user enum into its value.

    JsonPlusSerializer writes `UserColor.RED` happily and its strict reader
    hands back `1`: a different state, silently. Ours hands back the member
    or refuses (a reader that neither stored nor allows it), never `1`.
    """
    strict = JsonPlusSerializer(allowed_msgpack_modules=None)
    assert strict.loads_typed(strict.dumps_typed(UserColor.RED)) == 1
    stored = strict.dumps_typed(UserColor.RED)
    with pytest.raises(SerializationError):
        DataOnlySerializer().loads_typed(stored)
    ours = DataOnlySerializer()
    assert ours.loads_typed(ours.dumps_typed(UserColor.RED)) is UserColor.RED


@pytest.mark.parametrize(
    "allowed",
    [[UserThing], [(__name__, "UserThing")]],
    ids=["class", "tuple"],
)
def test_allowed_types_extend_the_allow_list(allowed: list[Any]) -> None:
    """`allowed_types` (classes or (module, name)) lets a reader rebuild what another stored."""
    value = {"things": [UserThing("a"), UserThing("b")]}
    stored = DataOnlySerializer().dumps_typed(value)
    reader = DataOnlySerializer(allowed)
    assert reader.loads_typed(stored) == value
    assert (__name__, "UserThing") in reader.allowed_types
    # Still nothing else.
    with pytest.raises(SerializationError):
        reader.loads_typed(DataOnlySerializer().dumps_typed(UserModel(x=1)))


def test_with_msgpack_allowlist_derives_a_new_serializer() -> None:
    """`with_msgpack_allowlist` adds names in a new serializer sharing the class registry.

    LangGraph's strict mode reads through the saver it was given and writes
    through the derived copy: what either stored, the other rebuilds.
    """
    base = DataOnlySerializer()
    wider = base.with_msgpack_allowlist([UserThing, (__name__, "UserModel")])
    assert wider is not base and isinstance(wider, DataOnlySerializer)
    assert wider.registry is base.registry
    assert (__name__, "UserModel") in wider.allowed_types - base.allowed_types
    stored = wider.dumps_typed(UserColor.RED)
    assert base.loads_typed(stored) is UserColor.RED
    assert wider.loads_typed(base.dumps_typed(UserPair(1, 2))) == UserPair(1, 2)
    assert base.with_msgpack_allowlist([("uuid", "UUID")]) is base
    assert DataOnlySerializer(unknown="tag").refusing().unknown == "refuse"


def test_bad_allowed_types_are_refused_naming_the_argument(db_path: str) -> None:
    """Malformed allow-list entries, or allowed_types with a custom serde, name the argument."""
    for bad in (["module.Name"], [("only-module",)], [("", "Name")], [42]):
        with pytest.raises(TypeError, match="allowed_types"):
            DataOnlySerializer(bad)
    with pytest.raises(ValueError, match="allowed_types"):
        FencedSqliteSaver(db_path, serde=JsonPlusSerializer(), allowed_types=[UserThing])
    assert not os.path.exists(db_path)


@pytest.mark.parametrize(
    "data",
    [
        ("pickle", pickle.dumps({"a": 1})),
        ("json", b'{"a": 1}'),
        ("", b""),
        ("msgpack-but-not", b"\x80"),
        ("msgpack", b"\xc1"),  # 0xc1 is never valid msgpack
        ("msgpack", b"\x92\x01"),  # truncated array
    ],
    ids=["pickle", "json", "empty-tag", "unknown-tag", "invalid", "truncated"],
)
def test_refused_tags_and_corrupt_payloads(data: tuple[str, bytes]) -> None:
    """Pickle, the legacy json tag, unknown tags and corrupt msgpack raise SerializationError."""
    with pytest.raises(SerializationError):
        DataOnlySerializer().loads_typed(data)


def test_hostile_payloads_are_real_and_refused(tmp_path: pathlib.Path) -> None:
    """The case-30 payloads do run under naive decoding; DataOnlySerializer runs none of them."""
    # Naive decoding runs them: each creates its marker directory.
    naive = JsonPlusSerializer(allowed_msgpack_modules=True)  # LangGraph's permissive reader
    for label in ("pickle", "os.mkdir", "builtins.eval"):
        marker = tmp_path / f"naive-{label}"
        tag, blob = hostile_payloads(str(marker))[label]
        if tag == "pickle":
            pickle.loads(blob)
        else:
            naive.loads_typed((tag, blob))
        assert marker.is_dir(), label
    # Ours refuses every one, and runs nothing.
    marker = tmp_path / "ours"
    serde = DataOnlySerializer()
    for label, data in hostile_payloads(str(marker)).items():
        with pytest.raises(SerializationError):
            serde.loads_typed(data)
        assert not marker.exists(), label


_STRICT_CHILD = textwrap.dedent(
    """
    import json, operator, os, sqlite3, sys, tempfile
    from dataclasses import dataclass, field
    from typing import Annotated
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.graph import START, StateGraph
    from langgraph_fenced_sqlite import (
        DataOnlySerializer, FencedSqliteSaver, SerializationError, UndecodableRow)
    from langgraph_fenced_sqlite.testing.cases_input import hostile_payloads

    @dataclass
    class Item:
        name: str

    @dataclass
    class State:
        items: Annotated[list[Item], operator.add] = field(default_factory=list)

    def graph_outcome(saver):
        builder = StateGraph(State)
        builder.add_node("n", lambda s: {"items": [Item("a")]})
        builder.add_edge(START, "n")
        graph = builder.compile(checkpointer=saver)
        try:
            graph.invoke({"items": []}, {"configurable": {"thread_id": "g"}})
            return "ok"
        except SerializationError as exc:
            return f"SerializationError:{exc.type_name}"

    out = {}
    work = tempfile.mkdtemp()
    marker = os.path.join(work, "ran")
    path = os.path.join(work, "x.db")
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    with FencedSqliteSaver(path) as saver:
        cp = empty_checkpoint(); cp["channel_values"] = {"i": Item("x")}
        try:
            first = saver.put(config, cp, {"source": "input"}, {})
            out["put_user_type"] = "stored"
        except SerializationError as exc:
            out["put_user_type"] = exc.type_name
        with FencedSqliteSaver(path) as fresh:
            try:
                fresh.get_tuple(first)
                out["fresh_reader"] = "read"
            except UndecodableRow as exc:
                out["fresh_reader"] = str(exc)
        refused = []
        for label, (tag, blob) in hostile_payloads(marker).items():
            stored = saver.put(config, empty_checkpoint(), {"source": "loop"}, {})
            db = sqlite3.connect(path)
            cid = stored["configurable"]["checkpoint_id"]
            db.execute("UPDATE checkpoints SET values_type=?, values_blob=? "
                       "WHERE checkpoint_id=?", (tag, blob, cid))
            db.commit(); db.close()
            try:
                saver.get_tuple(stored)
            except UndecodableRow:
                refused.append(label)
        out["hostile_refused"] = sorted(refused)
        out["marker"] = os.path.exists(marker)
        out["graph"] = graph_outcome(saver)
    with FencedSqliteSaver(path, allowed_types=[Item]) as saver:
        stored = saver.put(config, cp, {"source": "input"}, {})
        out["allowed_round_trip"] = saver.get_tuple(stored).checkpoint["channel_values"] == {
            "i": Item("x")}
        out["graph_allowed"] = graph_outcome(saver)
    print(json.dumps(out))
    """
)


@pytest.mark.slow
@pytest.mark.subprocess
def test_behaviour_is_independent_of_langgraph_strict_msgpack() -> None:
    """The saver refuses and allows the same things whatever LANGGRAPH_STRICT_MSGPACK says.

    A graph behaves the same too: with the variable true, `StateGraph.compile`
    calls `saver.with_allowlist(...)` with the schema's types; without it, the
    saver learns `Item` when it stores it. Either way a fresh store on the file
    (a reader that stored nothing) refuses `Item`, naming it.
    """
    procs = {}
    for setting in (None, "false", "true"):  # in parallel: each child imports LangGraph
        env = {k: v for k, v in os.environ.items() if k != "LANGGRAPH_STRICT_MSGPACK"}
        if setting is not None:
            env["LANGGRAPH_STRICT_MSGPACK"] = setting
        procs[setting] = subprocess.Popen(
            [sys.executable, "-c", _STRICT_CHILD],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    outcomes = {}
    try:
        for setting, proc in procs.items():
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            outcomes[setting] = json.loads(out.strip().splitlines()[-1])
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    labels = sorted(hostile_payloads("/nowhere"))
    for setting, out in outcomes.items():
        assert out["put_user_type"] == "stored", setting
        assert "__main__.Item" in out["fresh_reader"], setting
        assert out["hostile_refused"] == labels, setting
        assert out["marker"] is False, setting
        assert out["allowed_round_trip"] is True, setting
        assert out["graph_allowed"] == "ok", setting
        assert out["graph"] == "ok", setting


def test_a_lone_surrogate_in_a_value_is_refused_not_stored_as_a_question_mark(
    tmp_path: pathlib.Path,
) -> None:
    """LangGraph's encoder turns a lone surrogate into "?"; ours refuses it at write.

    It used to be stored, and read back as "x?y": a different value than was
    written (docs/semantics.md §7: a value accepted on write reads back equal).
    """
    from langgraph_fenced_sqlite.testing._helpers import plain_config, values_checkpoint

    assert JsonPlusSerializer().loads_typed(JsonPlusSerializer().dumps_typed("x\ud800y")) == "x?y"
    with pytest.raises(SerializationError, match="surrogate"):
        DataOnlySerializer().dumps_typed({"text": "x\ud800y"})
    with FencedSqliteSaver(str(tmp_path / "s.db")) as saver:
        with pytest.raises(SerializationError, match="'text'"):
            saver.put(plain_config("t"), values_checkpoint({"text": "x\ud800y"}), {}, {})
        cfg = plain_config("t", checkpoint_id="c1")
        with pytest.raises(SerializationError):
            saver.put_writes(cfg, [("text", ["ok", "x\udfffy"])], "task")
        assert saver.get_tuple(plain_config("t")) is None
        assert saver.events_after("t", 0) == []


# --- the read and JSON fast paths (issue "Speed lead": lighter commits) -----------------


def test_a_refused_read_leaves_no_error_behind_for_the_next_read() -> None:
    """Plain reads share one ext hook per serializer, its errors kept per thread:
    a refused value raises its own error, and the reads after it are unaffected."""
    writer = DataOnlySerializer()
    good = writer.dumps_typed({"x": UserThing("ok")})
    bad = writer.dumps_typed(UserThing("refused"))
    reader = DataOnlySerializer(allowed_types=[UserThing])
    plain = reader.dumps_typed({"plain": [1, 2]})
    refusing = DataOnlySerializer()
    for _ in range(3):
        with pytest.raises(SerializationError) as exc:
            refusing.loads_typed(bad)
        assert exc.value.type_name == f"{__name__}.UserThing"
        assert refusing.loads_typed(plain) == {"plain": [1, 2]}
        assert reader.loads_typed(good) == {"x": UserThing("ok")}


def test_shared_read_hooks_keep_each_threads_error_its_own() -> None:
    """Threads reading through one serializer at once: each refused read gets the
    error of its own value, and no good read ever raises (threads, no mocks)."""
    import threading

    writer = DataOnlySerializer()
    good = writer.dumps_typed({"x": UserThing("ok")})
    bad = writer.dumps_typed([UserModel(x=1)])
    serde = DataOnlySerializer(allowed_types=[UserThing])
    failures: list[BaseException] = []
    start = threading.Barrier(4)

    def read(stored: tuple[str, bytes], refused: bool) -> None:
        start.wait()
        for _ in range(300):
            try:
                serde.loads_typed(stored)
            except SerializationError as exc:
                if not refused or exc.type_name != f"{__name__}.UserModel":
                    failures.append(exc)
            else:
                if refused:
                    failures.append(AssertionError("a refused value was read"))

    threads = [threading.Thread(target=read, args=(s, s is bad)) for s in (good, bad, good, bad)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


_JSON_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(st.characters(exclude_categories=["Cs"])),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(st.characters(exclude_categories=["Cs"])), inner, max_size=4),
    ),
    max_leaves=20,
)


@given(_JSON_VALUES)
def test_dumps_json_writes_the_stdlib_text_and_loads_json_reads_it_back(value: Any) -> None:
    """Stored text is byte-identical to the stdlib's (an identical retry compares
    texts with rows written by earlier versions), and reads back equal."""
    text = dumps_json(value, "value")
    assert text == json.dumps(
        value, separators=(",", ":"), sort_keys=True, allow_nan=False, ensure_ascii=False
    )
    assert loads_json(text) == json.loads(text)
    assert repr(loads_json(text)) == repr(json.loads(text))  # 1 stays int, 1.0 float


def test_a_cycle_is_refused_as_a_serialization_error() -> None:
    """The shared C encoder keeps no circular-reference markers: a cycle is still
    a `SerializationError`, never a RecursionError or a crash."""
    cycle: dict[str, Any] = {}
    cycle["self"] = cycle
    with pytest.raises(SerializationError):
        dumps_json(cycle, "metadata")


@given(
    st.recursive(
        st.one_of(
            st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(), st.none()
        ),
        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(), inner)),
        max_leaves=12,
    )
)
def test_loads_json_reads_any_json_text_as_the_stdlib_does(value: Any) -> None:
    """Any JSON text (huge integers and lone surrogate escapes included) reads as
    with `json.loads` (NaN and Infinity, never written, are refused: tested above)."""
    text = json.dumps(value)
    assert repr(loads_json(text)) == repr(json.loads(text))
