"""Users' own types: stored only when they provably read back equal, here and in a fresh process.

The user types live in `support/user_types.py` (module level, so a fresh process can
import them by `module.name`); classes defined inside functions are defined
here, as LangGraph's own tests and users write them. A writer learns the
classes of what it stores; a reader that did not write needs the allow-list.
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
from langgraph.graph import START, StateGraph
from pydantic import BaseModel
from support.configs import saver_config
from support.processes import TESTS_DIR, lgfs
from support.puts import put
from support.user_types import Color, Order, Outer, Point, Profile, Shouting, State, ask_builder

from langgraph_fenced_sqlite import (
    DataOnlySerializer,
    FencedSqliteSaver,
    InvalidArgument,
    SerializationError,
    UndecodableRow,
)
from langgraph_fenced_sqlite.core.serde import TaggedValue

CONFIG: Any = saver_config("t")
PROFILE = Profile(name="ada", color=Color.BLUE, orders=[Order("A-1", 2)])


def _values(saver: FencedSqliteSaver) -> dict[str, Any]:
    found = saver.get_tuple(CONFIG)
    assert found is not None
    return dict(found.checkpoint["channel_values"])


def _child(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter that can import `support.user_types` (nothing of ours
    but the tests' support layer)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": TESTS_DIR, **env},
    )


# --- allowing a package in one line ---------------------------------------------------------


def test_allowed_modules_allows_a_users_package_in_one_line(open_store: Any) -> None:
    """`allowed_modules=["pkg"]` stores and rebuilds every class of the package."""
    saver = open_store(allowed_modules=["support.user_types"])
    values = {"profile": PROFILE, "where": Point(1, 2), "color": Color.RED}
    put(saver, values=values)
    got = _values(saver)
    assert got == values
    assert type(got["profile"].orders[0]) is Order and got["where"] == (1, 2)


def test_a_module_prefix_matches_whole_module_names_only() -> None:
    """`support.user` allows `support.user.x`, never `support.user_types`: a prefix ends at
    a dot."""
    stored = DataOnlySerializer().dumps_typed(Color.RED)
    with pytest.raises(SerializationError, match="support.user_types.Color"):
        DataOnlySerializer(allowed_modules=["support.user"]).loads_typed(stored)
    reader = DataOnlySerializer(allowed_modules="support.user_types")  # one name is one package
    assert reader.loads_typed(stored) is Color.RED


def test_a_reader_by_module_gets_the_class_the_module_holds_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A module reloaded (a dev server's hot reload) rebuilds its values with the new class.

    Readers keep the classes of LangGraph's own types once found (every read
    of a chat looks one up); an app's types found by module and name are
    looked up on every read, so a stale class object is never handed back.
    """
    from support import user_types

    stored = DataOnlySerializer().dumps_typed(Point(1, 2))
    reader = DataOnlySerializer(allowed_modules=["support.user_types"])
    assert type(reader.loads_typed(stored)) is Point

    class Reloaded(Point):
        pass

    monkeypatch.setattr(user_types, "Point", Reloaded)
    again = reader.loads_typed(stored)
    assert type(again) is Reloaded and again == (1, 2)


@pytest.mark.parametrize("bad", [[""], ["my app"], [3], [".x"], 3], ids=repr)
def test_bad_allowed_modules_name_the_argument(bad: Any, db_path: str) -> None:
    with pytest.raises(InvalidArgument, match="allowed_modules"):
        FencedSqliteSaver(db_path, allowed_modules=bad)
    assert not os.path.exists(db_path)


# --- the write-time check proves the value rebuilds --------------------------------------------


def test_a_class_defined_inside_a_function_rebuilds_for_a_reader_that_holds_it() -> None:
    """A local class is stored and learned; a reader given the class object rebuilds it.

    LangGraph's own tests define their state classes inside the test function
    (test_pregel's `InnerObject`): the writer rebuilds them from the class it
    stored, with no import; a reader that only knows the name cannot.
    """

    @dataclasses.dataclass
    class Local:
        v: int

    class LocalModel(BaseModel):
        v: int
        inner: Local

    value = {"state": [LocalModel(v=1, inner=Local(2)), Local(3)]}
    writer = DataOnlySerializer()
    stored = writer.dumps_typed(value)
    back = writer.loads_typed(stored)
    assert back == value and type(back["state"][1]) is Local
    assert writer.registry.get((__name__, "LocalModel")) is LocalModel
    # Another reader: the class objects make it readable, the names alone do not.
    assert DataOnlySerializer([Local, LocalModel]).loads_typed(stored) == value
    with pytest.raises(SerializationError) as info:
        DataOnlySerializer().loads_typed(stored)
    assert info.value.type_name.startswith(f"{__name__}.Local")
    assert "allowed_types=" in str(info.value) and "for_graph" in str(info.value)
    with pytest.raises(SerializationError) as info:
        DataOnlySerializer(allowed_modules=[__name__]).loads_typed(stored)
    assert f"has no {info.value.type_name.rsplit('.', 1)[1]}" in str(info.value)
    assert "give the reader the class itself" in str(info.value)


def test_a_nested_class_rebuilds_from_the_class_object_only() -> None:
    """LangGraph names a class by `__name__`: `Outer.Inner` is stored as
    `support.user_types.Inner`."""
    stored = DataOnlySerializer().dumps_typed(Outer.Inner(1))
    with pytest.raises(SerializationError, match="support.user_types has no Inner"):
        DataOnlySerializer(allowed_modules=["support.user_types"]).loads_typed(stored)
    assert DataOnlySerializer([Outer.Inner]).loads_typed(stored) == Outer.Inner(1)


def test_a_dataclass_with_init_false_fields_reads_back_equal() -> None:
    """LangGraph stores `init=False` fields too; the reader restores them after `__init__`."""
    serde = DataOnlySerializer([Order])
    order = Order("A-1", 2)
    order.total = 99  # changed after __post_init__: the stored value wins
    back = serde.loads_typed(serde.dumps_typed(order))
    assert back == order and back.total == 99


def test_a_value_whose_constructor_changes_it_is_refused_when_written() -> None:
    """A validator that rewrites a field would hand back a different value on every read.

    Holding the class does not help, so it is refused (and not learned), allowed or not.
    """
    for serde in (DataOnlySerializer([Shouting]), DataOnlySerializer()):
        with pytest.raises(SerializationError) as info:
            serde.dumps_typed({"said": Shouting(text="hi")})
        assert info.value.type_name == "support.user_types.Shouting"
        assert "does not read back equal" in str(info.value)
    assert ("support.user_types", "Shouting") not in serde.registry


def test_numpy_arrays_round_trip_when_numpy_is_allowed() -> None:
    serde = DataOnlySerializer(allowed_modules=["numpy"])
    for array in (np.arange(6, dtype=np.int16).reshape(2, 3), np.asfortranarray(np.eye(3))):
        back = serde.loads_typed(serde.dumps_typed({"a": array}))["a"]
        assert back.dtype == array.dtype and np.array_equal(back, array)
    # Stored with no configuration (learned); a reader that did not store it needs numpy allowed.
    stored = DataOnlySerializer().dumps_typed(np.zeros(2))
    with pytest.raises(SerializationError, match="numpy.ndarray"):
        DataOnlySerializer().loads_typed(stored)


# --- errors name the type, the channel, the node and the fix ---------------------------------


def _paint_graph() -> StateGraph:
    builder = StateGraph(State)
    builder.add_node("paint", lambda s: {"color": Color.RED, "where": Point(0, 1)})
    builder.add_node("order", lambda s: {"last": Order("B-2", 1), "profile": PROFILE})
    builder.add_edge(START, "paint")
    builder.add_edge("paint", "order")
    return builder


def test_a_refused_write_names_type_channel_node_and_the_fix(open_store: Any) -> None:
    builder = StateGraph(State)
    builder.add_node("shout", lambda s: {"color": Color.RED, "last": Shouting(text="hi")})
    builder.add_edge(START, "shout")
    graph = builder.compile(checkpointer=open_store())
    with pytest.raises(SerializationError) as info:
        graph.invoke({}, {"configurable": {"thread_id": "t"}})
    message = str(info.value)
    assert info.value.type_name == "support.user_types.Shouting"
    assert "cannot store channel 'last' written by node 'shout' (task " in message
    assert "does not read back equal" in message and "make its constructor accept" in message
    # A value in the graph's input is located inside it.
    with pytest.raises(SerializationError) as info:
        graph.invoke({"where": Shouting(text="x")}, {"configurable": {"thread_id": "u"}})
    assert "channel '__start__'['where'] (the graph's input)" in str(info.value)


def test_a_plain_saver_reads_back_what_it_stored_with_no_configuration(open_store: Any) -> None:
    """LangGraph's default mode, zero config, one process: the saver learns what it stores."""
    saver = open_store()
    graph = _paint_graph().compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": "t"}}
    graph.invoke({"color": Color.BLUE}, config)
    expected = {"color": Color.RED, "where": Point(0, 1), "last": Order("B-2", 1)}
    assert graph.get_state(config).values == {**expected, "profile": PROFILE}
    assert type(saver.get_tuple(config).checkpoint["channel_values"]["where"]) is Point


def test_for_graph_gives_a_reader_the_types_the_graphs_schemas_declare(
    open_store: Any, db_path: str
) -> None:
    """A reader that stored nothing (another store on the file) reads a bound graph's state."""
    builder = _paint_graph()
    config: Any = {"configurable": {"thread_id": "t"}}
    builder.compile(checkpointer=open_store()).invoke({"color": Color.BLUE}, config)
    reader = open_store()
    with pytest.raises(UndecodableRow, match="support.user_types"):
        builder.compile(checkpointer=reader).get_state(config)
    bound = reader.for_graph(builder)
    assert bound.serde.allows("support.user_types", "Order")
    assert bound.serde.registry.get(("support.user_types", "Profile")) is Profile
    state = builder.compile(checkpointer=bound).get_state(config).values
    assert state == {
        "color": Color.RED,
        "where": Point(0, 1),
        "last": Order("B-2", 1),
        "profile": PROFILE,
    }
    # A compiled graph works as well.
    assert reader.for_graph(builder.compile()).serde.allows("support.user_types", "Color")
    with pytest.raises(InvalidArgument, match="graph"):
        reader.for_graph(object())


def test_a_copy_made_by_with_allowlist_shares_what_the_saver_learned(open_store: Any) -> None:
    """Strict mode compiles with `saver.with_allowlist(...)`: both read what either stored."""

    class Note(BaseModel):
        text: str

    saver = open_store()
    clone = saver.with_allowlist([("some.module", "Other")])
    assert clone is not saver and clone.serde is not saver.serde
    put(clone, values={"note": Note(text="hi")})
    assert _values(saver) == {"note": Note(text="hi")}
    assert type(_values(clone)["note"]) is Note


@pytest.mark.slow
@pytest.mark.subprocess
def test_what_a_plain_saver_stores_needs_the_allow_list_in_a_fresh_process(
    open_store: Any, db_path: str
) -> None:
    """Written here with no configuration; a fresh reader refuses it, naming the fix, until allowed.

    The documented decision: an unallowed reader refuses (UndecodableRow naming
    the type and the fix) and builds nothing; `allowed_modules`, `for_graph` and
    `allowed_types` each make it read back equal.
    """
    graph = _paint_graph().compile(checkpointer=open_store())
    graph.invoke({"color": Color.BLUE}, {"configurable": {"thread_id": "t"}})
    child = _child(
        f"""
        import json
        from langgraph.graph import START, StateGraph
        from support.user_types import Color, Order, Point, Profile, State
        from langgraph_fenced_sqlite import FencedSqliteSaver, UndecodableRow
        builder = StateGraph(State)
        builder.add_node("paint", lambda s: s)
        builder.add_edge(START, "paint")
        config = {{"configurable": {{"thread_id": "t"}}}}
        expected = {{"color": Color.RED, "where": Point(0, 1), "last": Order("B-2", 1),
                    "profile": Profile(name="ada", color=Color.BLUE, orders=[Order("A-1", 2)])}}
        out = {{}}
        with FencedSqliteSaver({db_path!r}) as saver:
            try:
                builder.compile(checkpointer=saver).get_state(config)
                out["plain"] = "read"
            except UndecodableRow as exc:
                out["plain"] = str(exc)
        for name, kwargs in (
            ("modules", dict(allowed_modules=["support.user_types"])),
            ("types", dict(allowed_types=[Color, Order, Point, Profile])),
            ("for_graph", {{}}),
        ):
            with FencedSqliteSaver({db_path!r}, **kwargs) as saver:
                reader = saver.for_graph(builder) if name == "for_graph" else saver
                got = builder.compile(checkpointer=reader).get_state(config).values
                out[name] = got == expected
        print(json.dumps(out))
        """
    )
    assert child.returncode == 0, child.stderr
    out = json.loads(child.stdout.strip().splitlines()[-1])
    assert "support.user_types." in out["plain"] and "allowed_types=" in out["plain"]
    # The fix it names allows the type's top-level package (`support`).
    assert "for_graph" in out["plain"] and "allowed_modules=['support']" in out["plain"]
    assert out["modules"] is out["types"] is out["for_graph"] is True


_LOCAL_CLASS = """
import dataclasses, json, sys
from langgraph.checkpoint.base import empty_checkpoint
from langgraph_fenced_sqlite import FencedSqliteSaver, UndecodableRow

def make():
    @dataclasses.dataclass
    class Note:
        text: str
    return Note

NoteClass = make()  # not bound to the name Note: `__main__` has no Note
config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
path = sys.argv[2]
if sys.argv[1] == "write":
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"note": NoteClass("hi")}
    with FencedSqliteSaver(path) as saver:
        saver.put(config, checkpoint, {"source": "loop", "step": 0}, {})
    sys.exit(0)
out = {}
for name, kwargs in (("plain", {}), ("module", {"allowed_modules": ["__main__"]}),
                     ("class", {"allowed_types": [NoteClass]})):
    with FencedSqliteSaver(path, **kwargs) as saver:
        try:
            values = saver.get_tuple(config).checkpoint["channel_values"]
            out[name] = values == {"note": NoteClass("hi")}
        except UndecodableRow as exc:
            out[name] = str(exc)
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_local_class_stored_in_one_process_is_read_in_another_that_holds_the_class(
    db_path: str,
) -> None:
    """Process A stores a function-local class; process B reads it only given the class object."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", _LOCAL_CLASS, *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    wrote = run("write", db_path)
    assert wrote.returncode == 0, wrote.stderr
    read = run("read", db_path)
    assert read.returncode == 0, read.stderr
    out = json.loads(read.stdout.strip().splitlines()[-1])
    assert "__main__.Note is not allowed" in out["plain"] and "allowed_types=" in out["plain"]
    assert "has no Note" in out["module"] and "give the reader the class itself" in out["module"]
    assert out["class"] is True


@pytest.mark.slow
@pytest.mark.subprocess
def test_allowed_modules_values_read_back_equal_in_a_fresh_process(
    open_store: Any, db_path: str
) -> None:
    saver = open_store(allowed_modules=["support.user_types", "numpy"])
    put(saver, values={"profile": PROFILE, "grid": np.arange(4).reshape(2, 2), "p": Point(3, 4)})
    child = _child(
        f"""
        import json, numpy as np
        from support.user_types import Color, Order, Point, Profile
        from langgraph_fenced_sqlite import FencedSqliteSaver
        config = {{"configurable": {{"thread_id": "t", "checkpoint_ns": ""}}}}
        allowed = ["support.user_types", "numpy"]
        with FencedSqliteSaver({db_path!r}, allowed_modules=allowed) as saver:
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
    put(saver, values={"last": Order("A-1", 2), "n": 1})
    saver.close()

    def show(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """`lgfs show` in a process that can import `support.user_types`."""
        return lgfs("show", *args, env={"PYTHONPATH": TESTS_DIR, **env})

    shown = show(db_path, "t", "--json")
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["error"] is None and doc["values"]["n"] == 1
    assert doc["values"]["last"]["type"] == "support.user_types.Order"
    assert doc["values"]["last"]["data"] == {"sku": "A-1", "qty": 2, "total": 20}
    assert doc["values"]["last"]["rebuilt"] is False
    for extra, env in (
        (["--allow-type", "support.user_types:Order"], {}),
        (["--allow-module", "support.user_types"], {}),
        ([], {"LGFS_ALLOW": "numpy, support.user_types:Order"}),
    ):
        rebuilt = show(db_path, "t", "--json", *extra, **env)
        assert rebuilt.returncode == 0, rebuilt.stderr
        assert json.loads(rebuilt.stdout)["values"]["last"] == {
            "sku": "A-1",
            "qty": 2,
            "total": 20,
        }
    text = show(db_path, "t")
    assert text.returncode == 0 and "support.user_types.Order" in text.stdout
    bad = show(db_path, "t", "--allow-type", "nocolon")
    assert bad.returncode == 2 and "MODULE:NAME" in bad.stderr


def test_an_unbound_reader_refuses_a_stored_user_type_naming_it(db_path: str) -> None:
    """The reader's decision: refuse, naming thread, checkpoint, type and the fix."""
    with FencedSqliteSaver(db_path, allowed_types=[Order]) as writer:
        put(writer, values={"last": Order("A-1", 2)})
    with FencedSqliteSaver(db_path) as reader:
        with pytest.raises(UndecodableRow) as info:
            reader.get_tuple(CONFIG)
    assert info.value.thread_id == "t"
    assert "support.user_types.Order" in str(info.value) and "allowed_types" in str(info.value)


# --- what LangGraph's own suite exercises: pydantic states, response_schema resumes ----------


def test_pydantic_state_and_response_schema_resume_need_no_configuration(
    open_store: Any,
) -> None:
    """LangGraph's default mode: a pydantic state and a `response_schema` resume value, zero config.

    The resume value is validated into `Decision`, a type no schema names (and
    LangGraph's strict-mode list leaves out): it is learned when written.
    """
    from langgraph.types import Command
    from support.user_types import Decision

    saver = open_store()
    graph = ask_builder().compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": "t"}}
    graph.invoke({"profile": PROFILE}, config)
    assert graph.get_state(config).values["profile"] == PROFILE
    graph.invoke(Command(resume={"approved": True, "note": "ok"}), config)
    state = graph.get_state(config).values
    assert state["answer"] == Decision(approved=True, note="ok") and state["profile"] == PROFILE


def test_a_response_schema_resume_value_round_trips_with_allowed_modules(
    open_store: Any,
) -> None:
    """A reader that did not write the resume value reads it with the one-line package allow."""
    from langgraph.types import Command
    from support.user_types import Decision

    config: Any = {"configurable": {"thread_id": "t"}}
    writer = ask_builder().compile(checkpointer=open_store())
    writer.invoke({"profile": PROFILE}, config)
    writer.invoke(Command(resume={"approved": True, "note": "ok"}), config)
    reader = ask_builder().compile(checkpointer=open_store(allowed_modules=["support.user_types"]))
    assert reader.get_state(config).values["answer"] == Decision(approved=True, note="ok")


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_runner_that_only_resumes_in_a_fresh_process_needs_no_configuration(
    open_store: Any, db_path: str
) -> None:
    """`FencedRunner` binds its graph: a worker whose first act is reading the state rebuilds it."""
    from langgraph_fenced_sqlite import FencedRunner

    config: Any = {"configurable": {"thread_id": "t"}}
    FencedRunner(ask_builder().compile(), open_store()).invoke({"profile": PROFILE}, config)
    child = _child(
        f"""
        import json
        from langgraph.types import Command
        from support.user_types import Color, Decision, Order, Profile, ask_builder
        from langgraph_fenced_sqlite import FencedRunner, FencedSqliteSaver
        config = {{"configurable": {{"thread_id": "t"}}}}
        with FencedSqliteSaver({db_path!r}) as saver:
            runner = FencedRunner(ask_builder().compile(), saver)
            runner.invoke(Command(resume={{"approved": True}}), config)
            values = runner.graph.get_state(config).values
        profile = Profile(name="ada", color=Color.BLUE, orders=[Order("A-1", 2)])
        answer = values["answer"] == Decision(approved=True)
        print(json.dumps(values["profile"] == profile and answer))
        """
    )
    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout.strip().splitlines()[-1]) is True
