"""Users' own types: stored only when they provably read back equal, here and in a fresh process.

The user types live in `_user_types.py` (module level, so a fresh process can
import them by `module.name`); the types that must be refused are defined
here, inside functions or nested, as users write them by accident.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
from _user_types import Color, Order, Outer, Point, Profile, Shouting, State
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import START, StateGraph
from pydantic import BaseModel

from langgraph_fenced_sqlite import (
    DataOnlySerializer,
    FencedSqliteSaver,
    InvalidArgument,
    SerializationError,
    UndecodableRow,
)
from langgraph_fenced_sqlite.serde import TaggedValue

TESTS = str(pathlib.Path(__file__).resolve().parent)
CONFIG: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
PROFILE = Profile(name="ada", color=Color.BLUE, orders=[Order("A-1", 2)])


def _put(saver: FencedSqliteSaver, values: dict[str, Any]) -> None:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = values
    saver.put(CONFIG, checkpoint, {"source": "loop", "step": 0}, {})


def _values(saver: FencedSqliteSaver) -> dict[str, Any]:
    found = saver.get_tuple(CONFIG)
    assert found is not None
    return dict(found.checkpoint["channel_values"])


def _child(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter that can import `_user_types` (and nothing of ours)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": TESTS, **env},
    )


# --- allowing a package in one line ---------------------------------------------------------


def test_allowed_modules_allows_a_users_package_in_one_line(open_store: Any) -> None:
    """`allowed_modules=["pkg"]` stores and rebuilds every class of the package."""
    saver = open_store(allowed_modules=["_user_types"])
    values = {"profile": PROFILE, "where": Point(1, 2), "color": Color.RED}
    _put(saver, values)
    got = _values(saver)
    assert got == values
    assert type(got["profile"].orders[0]) is Order and got["where"] == (1, 2)


def test_a_module_prefix_matches_whole_module_names_only() -> None:
    """`_user` allows `_user.x`, never `_user_types`: a prefix ends at a dot."""
    with pytest.raises(SerializationError, match="_user_types.Color"):
        DataOnlySerializer(allowed_modules=["_user"]).dumps_typed(Color.RED)
    serde = DataOnlySerializer(allowed_modules="_user_types")  # one name is one package
    assert serde.loads_typed(serde.dumps_typed(Color.RED)) is Color.RED


@pytest.mark.parametrize("bad", [[""], ["my app"], [3], [".x"], 3], ids=repr)
def test_bad_allowed_modules_name_the_argument(bad: Any, db_path: str) -> None:
    with pytest.raises(InvalidArgument, match="allowed_modules"):
        FencedSqliteSaver(db_path, allowed_modules=bad)
    assert not os.path.exists(db_path)


# --- the write-time check proves the value rebuilds --------------------------------------------


def test_a_class_defined_inside_a_function_is_refused_when_written() -> None:
    """Allowing a local class is not enough: no reader can find it, so the write is refused."""

    @dataclasses.dataclass
    class Local:
        v: int

    class LocalModel(BaseModel):
        v: int

    serde = DataOnlySerializer([Local, LocalModel])
    for value, name in ((Local(1), "Local"), (LocalModel(v=1), "LocalModel")):
        with pytest.raises(SerializationError) as info:
            serde.dumps_typed({"state": [value]})
        assert info.value.type_name == f"{__name__}.{name}"
        message = str(info.value)
        assert "channel 'state'" in message
        assert f"define {name} at module level in {__name__}" in message


def test_a_nested_class_is_refused_when_written() -> None:
    """LangGraph names a class by `__name__`, so `Outer.Inner` would be looked up as `Inner`."""
    with pytest.raises(SerializationError, match="_user_types has no Inner"):
        DataOnlySerializer(allowed_modules=["_user_types"]).dumps_typed(Outer.Inner(1))


def test_a_dataclass_with_init_false_fields_reads_back_equal() -> None:
    """LangGraph stores `init=False` fields too; the reader restores them after `__init__`."""
    serde = DataOnlySerializer([Order])
    order = Order("A-1", 2)
    order.total = 99  # changed after __post_init__: the stored value wins
    back = serde.loads_typed(serde.dumps_typed(order))
    assert back == order and back.total == 99


def test_a_value_whose_constructor_changes_it_is_refused_when_written() -> None:
    """A validator that rewrites a field would hand back a different value on every read."""
    serde = DataOnlySerializer([Shouting])
    with pytest.raises(SerializationError) as info:
        serde.dumps_typed({"said": Shouting(text="hi")})
    assert info.value.type_name == "_user_types.Shouting"
    assert "does not read back equal" in str(info.value)


def test_numpy_arrays_round_trip_when_numpy_is_allowed() -> None:
    serde = DataOnlySerializer(allowed_modules=["numpy"])
    for array in (np.arange(6, dtype=np.int16).reshape(2, 3), np.asfortranarray(np.eye(3))):
        back = serde.loads_typed(serde.dumps_typed({"a": array}))["a"]
        assert back.dtype == array.dtype and np.array_equal(back, array)
    with pytest.raises(SerializationError, match="numpy.ndarray"):
        DataOnlySerializer().dumps_typed(np.zeros(2))


# --- errors name the type, the channel, the node and the fix ---------------------------------


def _paint_graph() -> StateGraph:
    builder = StateGraph(State)
    builder.add_node("paint", lambda s: {"color": Color.RED, "where": Point(0, 1)})
    builder.add_node("order", lambda s: {"last": Order("B-2", 1), "profile": PROFILE})
    builder.add_edge(START, "paint")
    builder.add_edge("paint", "order")
    return builder


def test_a_refused_write_names_type_channel_node_and_the_fix(open_store: Any) -> None:
    graph = _paint_graph().compile(checkpointer=open_store())
    with pytest.raises(SerializationError) as info:
        graph.invoke({}, {"configurable": {"thread_id": "t"}})
    message = str(info.value)
    assert info.value.type_name == "_user_types.Color"
    assert "cannot store channel 'color' written by node 'paint' (task " in message
    assert "allowed_modules=['_user_types']" in message
    assert "saver.for_graph(builder)" in message
    # A value in the graph's input is located inside it.
    with pytest.raises(SerializationError) as info:
        graph.invoke({"where": Point(1, 1)}, {"configurable": {"thread_id": "u"}})
    assert "channel '__start__'['where'] (the graph's input)" in str(info.value)


def test_for_graph_allows_the_types_the_graphs_schemas_declare(open_store: Any) -> None:
    """In LangGraph's default mode, binding the graph is the one call that is needed."""
    builder = _paint_graph()
    saver = open_store()
    graph = builder.compile(checkpointer=saver.for_graph(builder))
    config: Any = {"configurable": {"thread_id": "t"}}
    graph.invoke({"color": Color.BLUE}, config)
    state = graph.get_state(config).values
    assert state == {
        "color": Color.RED,
        "where": Point(0, 1),
        "last": Order("B-2", 1),
        "profile": PROFILE,
    }
    # A compiled graph works as well, and the original saver is unchanged.
    assert saver.for_graph(graph).serde.allows("_user_types", "Order")
    assert not saver.serde.allows("_user_types", "Order")
    with pytest.raises(InvalidArgument, match="graph"):
        saver.for_graph(object())


@pytest.mark.slow
@pytest.mark.subprocess
def test_what_a_bound_graph_stores_reads_back_equal_in_a_fresh_process(
    open_store: Any, db_path: str
) -> None:
    """The promise is about any reader configured like the writer, not only this process."""
    builder = _paint_graph()
    saver = open_store()
    graph = builder.compile(checkpointer=saver.for_graph(builder))
    graph.invoke({"color": Color.BLUE}, {"configurable": {"thread_id": "t"}})
    child = _child(
        f"""
        import json
        from langgraph.graph import START, StateGraph
        from _user_types import Color, Order, Point, Profile, State
        from langgraph_fenced_sqlite import FencedSqliteSaver, UndecodableRow
        builder = StateGraph(State)
        builder.add_node("paint", lambda s: s)
        builder.add_edge(START, "paint")
        config = {{"configurable": {{"thread_id": "t"}}}}
        expected = {{"color": Color.RED, "where": Point(0, 1), "last": Order("B-2", 1),
                    "profile": Profile(name="ada", color=Color.BLUE, orders=[Order("A-1", 2)])}}
        out = {{}}
        with FencedSqliteSaver({db_path!r}) as saver:
            graph = builder.compile(checkpointer=saver.for_graph(builder))
            out["bound"] = graph.get_state(config).values == expected
            try:
                builder.compile(checkpointer=saver).get_state(config)
                out["unbound"] = "read"
            except UndecodableRow as exc:
                out["unbound"] = str(exc)
        print(json.dumps(out))
        """
    )
    assert child.returncode == 0, child.stderr
    out = json.loads(child.stdout.strip().splitlines()[-1])
    assert out["bound"] is True
    # The documented decision: an unbound reader refuses, naming the type, and builds nothing.
    assert "_user_types." in out["unbound"] and "for_graph" in out["unbound"]


@pytest.mark.slow
@pytest.mark.subprocess
def test_allowed_modules_values_read_back_equal_in_a_fresh_process(
    open_store: Any, db_path: str
) -> None:
    saver = open_store(allowed_modules=["_user_types", "numpy"])
    _put(saver, {"profile": PROFILE, "grid": np.arange(4).reshape(2, 2), "p": Point(3, 4)})
    child = _child(
        f"""
        import json, numpy as np
        from _user_types import Color, Order, Point, Profile
        from langgraph_fenced_sqlite import FencedSqliteSaver
        config = {{"configurable": {{"thread_id": "t", "checkpoint_ns": ""}}}}
        with FencedSqliteSaver({db_path!r}, allowed_modules=["_user_types", "numpy"]) as saver:
            v = saver.get_tuple(config).checkpoint["channel_values"]
        ok = (v["profile"] == Profile(name="ada", color=Color.BLUE, orders=[Order("A-1", 2)])
              and v["p"] == Point(3, 4) and np.array_equal(v["grid"], np.arange(4).reshape(2, 2)))
        print(json.dumps(ok))
        """
    )
    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout.strip().splitlines()[-1]) is True


# --- a display reader shows what it may not rebuild as data ---------------------------------


def test_a_display_reader_tags_what_it_does_not_allow_and_imports_nothing(
    tmp_path: pathlib.Path,
) -> None:
    """`unknown="tag"` returns type name and fields; the module the row names is never imported."""
    marker = tmp_path / "imported"
    (tmp_path / "lgfs_planted_mod.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nclass Thing:\n    pass\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        import ormsgpack
        from langgraph.checkpoint.serde import jsonplus

        planted = ormsgpack.packb(
            {"k": ormsgpack.Ext(2, ormsgpack.packb(("lgfs_planted_mod", "Thing", {"a": [1]})))}
        )
        tagged = DataOnlySerializer(unknown="tag").loads_typed(("msgpack", planted))
        assert tagged == {"k": TaggedValue("lgfs_planted_mod.Thing", {"a": [1]}, "")}
        assert tagged["k"].to_dict()["rebuilt"] is False
        with pytest.raises(SerializationError, match="lgfs_planted_mod.Thing"):
            DataOnlySerializer().loads_typed(("msgpack", planted))
        assert not marker.exists() and "lgfs_planted_mod" not in sys.modules
        # Tagged data is for display: it is never stored back.
        with pytest.raises(SerializationError):
            DataOnlySerializer().dumps_typed(tagged)
        assert jsonplus  # imported for its ext codes' meaning
    finally:
        sys.path.remove(str(tmp_path))


def test_unknown_must_be_refuse_or_tag() -> None:
    with pytest.raises(InvalidArgument, match="unknown"):
        DataOnlySerializer(unknown="guess")


@pytest.mark.subprocess
def test_lgfs_shows_user_types_as_tagged_data_or_rebuilt_with_the_allow_list(
    open_store: Any, db_path: str
) -> None:
    saver = open_store(allowed_types=[Order])
    _put(saver, {"last": Order("A-1", 2), "n": 1})
    saver.close()

    def lgfs(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "langgraph_fenced_sqlite", *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": TESTS, **env},
            stdin=subprocess.DEVNULL,
        )

    shown = lgfs("show", db_path, "t", "--json")
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["error"] is None and doc["values"]["n"] == 1
    assert doc["values"]["last"]["type"] == "_user_types.Order"
    assert doc["values"]["last"]["data"] == {"sku": "A-1", "qty": 2, "total": 20}
    assert doc["values"]["last"]["rebuilt"] is False
    for extra, env in (
        (["--allow-type", "_user_types:Order"], {}),
        (["--allow-module", "_user_types"], {}),
        ([], {"LGFS_ALLOW": "numpy, _user_types:Order"}),
    ):
        rebuilt = lgfs("show", db_path, "t", "--json", *extra, **env)
        assert rebuilt.returncode == 0, rebuilt.stderr
        assert json.loads(rebuilt.stdout)["values"]["last"] == {
            "sku": "A-1",
            "qty": 2,
            "total": 20,
        }
    text = lgfs("show", db_path, "t")
    assert text.returncode == 0 and "_user_types.Order" in text.stdout
    bad = lgfs("show", db_path, "t", "--allow-type", "nocolon")
    assert bad.returncode == 2 and "MODULE:NAME" in bad.stderr


def test_an_unbound_reader_refuses_a_stored_user_type_naming_it(db_path: str) -> None:
    """The reader's decision: refuse, naming thread, checkpoint, type and the fix."""
    with FencedSqliteSaver(db_path, allowed_types=[Order]) as writer:
        _put(writer, {"last": Order("A-1", 2)})
    with FencedSqliteSaver(db_path) as reader:
        with pytest.raises(UndecodableRow) as info:
            reader.get_tuple(CONFIG)
    assert info.value.thread_id == "t"
    assert "_user_types.Order" in str(info.value) and "allowed_types" in str(info.value)


# --- what LangGraph's own suite exercises: pydantic states, response_schema resumes ----------


def _ask_graph() -> StateGraph:
    from _user_types import Decision, Ticket
    from langgraph.types import interrupt

    def ask(state: Ticket) -> dict[str, Any]:
        return {"answer": interrupt({"question": "ship?"}, response_schema=Decision)}

    builder = StateGraph(Ticket)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    return builder


def test_a_pydantic_state_round_trips_through_for_graph(open_store: Any) -> None:
    from langgraph.types import Command

    builder = _ask_graph()
    graph = builder.compile(checkpointer=open_store().for_graph(builder))
    config: Any = {"configurable": {"thread_id": "t"}}
    graph.invoke({"profile": PROFILE}, config)
    assert graph.get_state(config).values["profile"] == PROFILE
    # Surprise pinned: LangGraph validates the resume value into `Decision`, a
    # type no schema names (its strict-mode list leaves it out too), so the
    # schema binding alone refuses it, naming the fix...
    with pytest.raises(SerializationError, match="_user_types.Decision") as info:
        graph.invoke(Command(resume={"approved": True}), config)
    assert "node 'ask'" in str(info.value) and "allowed_modules" in str(info.value)


def test_a_response_schema_resume_value_round_trips_with_allowed_modules(open_store: Any) -> None:
    from _user_types import Decision
    from langgraph.types import Command

    builder = _ask_graph()
    saver = open_store(allowed_modules=["_user_types"])  # ...and the one-line package allow works
    graph = builder.compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": "t"}}
    graph.invoke({"profile": PROFILE}, config)
    graph.invoke(Command(resume={"approved": True, "note": "ok"}), config)
    assert graph.get_state(config).values["answer"] == Decision(approved=True, note="ok")
