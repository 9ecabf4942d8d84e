"""Stored data integrity: checksums on every insert, checked on every read, and cells
of any shape giving package errors (docs/semantics.md §7; contract cases 34 and 35 hold the rest).

Damage is planted with plain sqlite3, as a failing disk or another tool would.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.files import inline_values, reseal

from langgraph_fenced_sqlite import FencedSqliteSaver, InvalidArgument, UndecodableRow
from langgraph_fenced_sqlite.core import envelopes, stored_json
from langgraph_fenced_sqlite.core.checksums import checksum
from langgraph_fenced_sqlite.core.stored_json import dumps_json, loads_json
from langgraph_fenced_sqlite.errors import SerializationError
from langgraph_fenced_sqlite.sqlite.schema import MIGRATIONS
from langgraph_fenced_sqlite.testing._helpers import plain_config, values_checkpoint

# stored_json.MAX_JSON_DEPTH, the documented bound (checked below).
MAX_JSON_DEPTH = 200

# What each table's checksum covers, in order (checksums.py).
_COVERED = {
    "checkpoints": ("envelope", "values_type", "values_blob", "metadata"),
    "writes": ("channel", "type", "blob"),
    "events": ("kind", "data"),
}


def _rows_with_checksums(path: str) -> dict[str, list[tuple[int | None, int]]]:
    """Return, per table, each row's (stored checksum, checksum of its cells)."""
    conn = sqlite3.connect(path)
    try:
        return {
            table: [
                (row[0], checksum(*row[1:]))
                for row in conn.execute(f"SELECT checksum, {', '.join(cells)} FROM {table}")
            ]
            for table, cells in _COVERED.items()
        }
    finally:
        conn.close()


def _plant(path: str, sql: str, params: tuple[Any, ...] = (), *, sealed: bool = False) -> None:
    conn = sqlite3.connect(path)
    try:
        assert conn.execute(sql, params).rowcount >= 1
        if sealed:
            reseal(conn)
        conn.commit()
    finally:
        conn.close()


def _fill(store: FencedSqliteSaver, thread_id: str = "t") -> dict[str, Any]:
    """Write one of everything that has a checksum; return the configs."""
    first = store.put(
        plain_config(thread_id),
        values_checkpoint({"a": "ü" * 10}),
        {"source": "input", "step": -1},
        {},
    )
    second = store.put(
        first, values_checkpoint({"a": "b", "n": [1, 2]}), {"source": "loop", "step": 0}, {}
    )
    store.put_writes(second, [("a", "x"), ("n", b"\x00\xff")], "task-1")
    # A special channel is last-writer-wins: its upsert must rewrite the checksum too.
    store.put_writes(second, [("__interrupt__", "first")], "task-2")
    store.put_writes(second, [("__interrupt__", "second, longer")], "task-2")
    claim = store.claim(thread_id, "alice", 60)
    store.append_events(thread_id, claim.token, [("mine", {"k": "v"})])
    store.release(thread_id, claim.token)
    return {"first": first, "second": second}


def _assert_all_sealed(path: str) -> None:
    for table, rows in _rows_with_checksums(path).items():
        assert rows, table
        for stored, computed in rows:
            assert stored == computed, (table, stored, computed)


def test_every_insert_stores_the_checksum_of_its_cells(open_store: Any, db_path: str) -> None:
    store = open_store()
    _fill(store)
    _assert_all_sealed(db_path)


def test_copy_thread_copies_checksums_so_the_copy_reads(open_store: Any, db_path: str) -> None:
    store = open_store()
    configs = _fill(store)
    store.copy_thread("t", "copy")
    _assert_all_sealed(db_path)
    original = store.get_tuple(configs["second"])
    copied = store.get_tuple(plain_config("copy"))
    assert original is not None and copied is not None
    assert copied.checkpoint == original.checkpoint
    assert copied.pending_writes == original.pending_writes


def test_a_blob_that_decodes_to_a_non_dict_is_undecodable(open_store: Any, db_path: str) -> None:
    store = open_store()
    configs = _fill(store)
    cid = configs["second"]["configurable"]["checkpoint_id"]
    # 0x07 is the msgpack integer 7; ormsgpack ignores the bytes after it.
    _plant(
        db_path,
        "UPDATE checkpoints SET values_type = 'msgpack', values_blob = x'076a756e6b'",
        sealed=True,
    )
    with pytest.raises(UndecodableRow) as info:
        store.get_tuple(configs["second"])
    assert info.value.checkpoint_id == cid and "dict" in info.value.reason


def test_trailing_bytes_after_the_value_are_undecodable(open_store: Any, db_path: str) -> None:
    store = open_store()
    configs = _fill(store)
    _plant(db_path, "UPDATE checkpoints SET values_blob = CAST(values_blob || x'00c0' AS BLOB)")
    with pytest.raises(UndecodableRow, match="checksum"):
        store.get_tuple(configs["second"])
    with pytest.raises(UndecodableRow, match="checksum"):
        list(store.list(plain_config("t")))


def test_a_row_with_no_checksum_is_undecodable(open_store: Any, db_path: str) -> None:
    store = open_store()
    configs = _fill(store)
    for sql in (
        "UPDATE checkpoints SET checksum = NULL",
        "UPDATE writes SET checksum = NULL WHERE channel = 'a'",
    ):
        _plant(db_path, sql)
        with pytest.raises(UndecodableRow, match="no checksum"):
            store.get_tuple(configs["second"])
        _plant(db_path, "UPDATE checkpoints SET checksum = 0", sealed=True)
    _plant(db_path, "UPDATE events SET checksum = NULL WHERE seq = 1")
    with pytest.raises(UndecodableRow, match="seq 1"):
        store.events_after("t", 0)


def test_a_watch_meets_a_damaged_event_as_undecodable(open_store: Any, db_path: str) -> None:
    store = open_store()
    _fill(store)
    count = len(store.events_after("t", 0))
    _plant(db_path, "UPDATE events SET data = '{\"k\":\"w\"}' WHERE kind = 'mine'")
    # Bounded: a watch that read the damage as a value would wait forever after it.
    with store.watch("t", 0) as watch, pytest.raises(UndecodableRow, match="seq"):
        for _n, _event in zip(range(count), watch, strict=False):
            pass


def test_a_schema_1_file_migrates_with_valid_checksums(open_store: Any, tmp_path: Any) -> None:
    """Rows a version-1 store wrote read back equal after migration, then are checked."""
    source = str(tmp_path / "v2.db")
    v1 = str(tmp_path / "v1.db")
    store = open_store(source)
    configs = _fill(store)
    expected = store.get_tuple(configs["second"])
    expected_list = list(store.list(plain_config("t")))
    expected_events = store.events_after("t", 0)
    store.close()
    # The v1 schema, with the cells v1 code wrote: encoding has not changed
    # since, so copying the v1 columns of these rows is what v1 wrote.
    conn = sqlite3.connect(v1)
    for statement in MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute("PRAGMA application_id = 1279739475")
    conn.execute("PRAGMA user_version = 1")
    conn.execute("ATTACH DATABASE ? AS v2", (source,))
    for table in ("meta", "threads", "checkpoints", "writes", "events"):
        columns = [r[1] for r in conn.execute(f"PRAGMA main.table_info({table})")]
        names = ", ".join(columns)
        conn.execute(f"DELETE FROM main.{table}")
        conn.execute(f"INSERT INTO main.{table} ({names}) SELECT {names} FROM v2.{table}")
    inline_values(conn, source, checksums=False)
    conn.commit()
    conn.execute("DETACH DATABASE v2")
    conn.close()
    migrated = open_store(v1)
    assert migrated.get_tuple(configs["second"]) == expected
    assert list(migrated.list(plain_config("t"))) == expected_list
    assert migrated.events_after("t", 0) == expected_events
    _assert_all_sealed(v1)
    # The backfilled checksums are checked, as those of new rows are.
    _plant(v1, "UPDATE checkpoints SET metadata = replace(metadata, 'loop', 'lopp')")
    with pytest.raises(UndecodableRow, match="checksum"):
        migrated.get_tuple(configs["second"])


def test_a_number_in_a_covered_cell_never_allocates_its_value(open_store: Any) -> None:
    # bytes(n) would allocate n bytes: a damaged cell holding 2**62 must not.
    assert checksum(2**62) != checksum(b"") and checksum(1.5) != checksum("1.5")
    assert checksum("abc") == checksum(b"abc")  # text goes in as its UTF-8


def test_a_huge_number_in_a_cell_is_undecodable(open_store: Any, db_path: str) -> None:
    store = open_store()
    configs = _fill(store)
    _plant(db_path, "UPDATE checkpoints SET values_blob = 4611686018427387904")
    with pytest.raises(UndecodableRow):
        store.get_tuple(configs["second"])


@pytest.mark.parametrize(
    "text",
    [b"{}", 5, None, 1.5, "NaN", '{"a": Infinity}', "{", "1" * 5000, "[" * 100_000],
)
def test_loads_json_raises_only_serialization_errors(text: Any) -> None:
    with pytest.raises(SerializationError):
        loads_json(text)


@pytest.mark.parametrize(
    "data",
    [
        b"{}",
        b'{"a":1}',
        b'{"b":1,"a":2}',
        b'{"a": 1}',
        b'{"a":1,"a":2}',
        b"1e400",
        b"-0",
        b"123456789012345678901234567890",
        b'"\\ud800"',
        b"\xff",
        b"NaN",
        b"[1.0]",
        b"",
        b"[" * 300 + b"]" * 300,
    ],
)
def test_loads_canonical_takes_only_what_loads_json_reads_the_same(data: bytes) -> None:
    """`list`'s JSON fast path: a value, only for text orjson writes back exactly
    (then the value `loads_json` reads), else NOT_CANONICAL; it never raises."""
    value = stored_json.loads_canonical(data)
    if value is stored_json.NOT_CANONICAL:
        return
    assert data == stored_json._orjson_dumps(value, option=stored_json._SORT_KEYS)
    assert value == loads_json(data.decode()) and type(value) is type(loads_json(data.decode()))


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(), kids, max_size=3),
        max_leaves=12,
    )
)
def test_loads_canonical_agrees_with_loads_json_on_what_we_store(value: Any) -> None:
    try:
        text = dumps_json(value, "x")
    except SerializationError:
        return
    found = stored_json.loads_canonical(text.encode())
    assert found is stored_json.NOT_CANONICAL or found == loads_json(text)


def test_json_nesting_is_bounded_on_read_and_on_write() -> None:
    assert getattr(stored_json, "MAX_JSON_DEPTH", None) == MAX_JSON_DEPTH
    ok: Any = []
    for _ in range(MAX_JSON_DEPTH - 1):
        ok = [ok]
    assert loads_json(dumps_json(ok, "x")) == ok
    deep = [ok]
    with pytest.raises(SerializationError, match=f"deeper than {MAX_JSON_DEPTH}") as info:
        dumps_json(deep, "metadata")
    assert "metadata" in str(info.value)
    with pytest.raises(SerializationError, match="deeper"):
        loads_json("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), "event data")
    very: Any = []
    for _ in range(100_000):
        very = [very]
    with pytest.raises(SerializationError, match="deeper"):
        dumps_json(very, "metadata")


def test_deep_metadata_is_refused_at_put_changing_nothing(open_store: Any, db_path: str) -> None:
    store = open_store()
    _fill(store)
    conn = sqlite3.connect(db_path)
    before = conn.execute("SELECT count(*) FROM checkpoints").fetchone()
    deep: Any = {}
    for _ in range(MAX_JSON_DEPTH + 5):
        deep = {"d": deep}
    # An argument: refused by the argument checks, naming it, before the file.
    with pytest.raises(InvalidArgument, match="metadata"):
        store.put(plain_config("u"), values_checkpoint(), {"source": "input", "deep": deep}, {})
    assert conn.execute("SELECT count(*) FROM checkpoints").fetchone() == before
    conn.close()


@pytest.mark.parametrize(
    ("sql", "named"),
    [
        ("UPDATE checkpoints SET envelope = CAST(envelope AS BLOB)", "envelope holds bytes"),
        ("UPDATE checkpoints SET values_type = CAST(values_type AS BLOB)", "values_type holds"),
        ("UPDATE checkpoints SET token = 'x'", "token holds str"),
        ("UPDATE checkpoints SET created_at = 'x'", "created_at holds str"),
    ],
    ids=["envelope-blob", "type-blob", "token-text", "created-text"],
)
def test_a_cell_of_the_wrong_type_behind_a_valid_checksum_is_named(
    open_store: Any, db_path: str, sql: str, named: str
) -> None:
    """A read checks each cell's type in one test, and names the cell that fails it
    (a blob holding the envelope's bytes has the text's checksum), on every read path."""
    store = open_store()
    configs = _fill(store)
    _plant(db_path, sql, sealed=True)
    with pytest.raises(UndecodableRow, match=named):
        store.get_tuple(configs["second"])
    with pytest.raises(UndecodableRow, match=named):
        list(store.list(plain_config("t")))


def test_a_cell_get_tuple_and_list_check_but_do_not_read_is_still_named(
    open_store: Any, db_path: str
) -> None:
    """`get_tuple` and `list` read only the cells they return or check; SQL checks the
    types of position, token and created_at, and a row that fails is read again in
    full so that the error names the cell, as before: latest, by id and listed."""
    store = open_store()
    configs = _fill(store)
    _plant(db_path, "UPDATE checkpoints SET position = 'x' || position", sealed=True)
    for config in (plain_config("t"), configs["second"], configs["first"]):
        with pytest.raises(UndecodableRow, match="position holds str"):
            store.get_tuple(config)
    with pytest.raises(UndecodableRow, match="position holds str"):
        list(store.list(plain_config("t"), limit=1))


# --- reads in one statement (checkpoints.split_tuple, narrow_reads.decode_page) ------


def test_list_reads_rows_json_wrote_as_get_tuple_does(open_store: Any) -> None:
    """`list` takes its one path only for orjson's canonical text; a row whose
    envelope or metadata `json` wrote (a float, non-ASCII, a big number in a
    value) reads through `decode_read`'s checks: the same tuples as get_tuple's,
    in a page that mixes both kinds, for a query naming the thread and not."""
    store = open_store()
    config = store.put(
        plain_config("t"), values_checkpoint({"a": 1}), {"source": "input", "step": -1}, {}
    )
    metadata: list[dict[str, Any]] = [
        {"source": "loop", "step": 0, "score": 1e-05},
        {"source": "loop", "step": 1, "note": "é ü ✓"},
        {"source": "loop", "step": 2},
        {"source": "loop", "step": 3, "big": 2**62, "neg": -0.0},
    ]
    for md in metadata:
        config = store.put(config, values_checkpoint({"a": 0.5, "b": "ß"}), md, {})
        store.put_writes(config, [("a", 1.5), ("b", "ü"), ("c", None)], "task")
    listed = list(store.list(plain_config("t")))
    assert len(listed) == 5
    for got in listed:
        assert got == store.get_tuple(got.config)
    assert list(store.list(None)) == listed
    assert [t.metadata.get("score") for t in listed][-2] == 1e-05


def test_list_refuses_text_that_is_not_utf8_by_its_checksum(open_store: Any, db_path: str) -> None:
    """`list` hashes the envelope's and metadata's stored bytes: bytes that are not
    UTF-8 fail the checksum, as the str get_tuple reads (leniently) does."""
    store = open_store()
    configs = _fill(store)
    for cell in ("envelope", "metadata"):
        _plant(db_path, f"UPDATE checkpoints SET {cell} = CAST({cell} || x'ff' AS TEXT)")
        with pytest.raises(UndecodableRow, match="checksum"):
            store.get_tuple(configs["second"])
        with pytest.raises(UndecodableRow, match="checksum"):
            list(store.list(plain_config("t")))
        with pytest.raises(UndecodableRow, match="checksum"):
            list(store.list(None))
        _plant(db_path, f"UPDATE checkpoints SET {cell} = substr({cell}, 1, length({cell}) - 1)")
        assert list(store.list(plain_config("t")))


def _user_values() -> dict[str, Any]:
    from support.user_types import Color, Order, Point

    return {"color": Color.BLUE, "where": Point(0, 1), "last": Order("B-2", 1)}


def test_list_rebuilds_user_types_as_get_tuple_does_and_names_refused_ones(
    open_store: Any, db_path: str
) -> None:
    """`list` reads the default serializer's msgpack through its own hook, with no
    method call per value: user types in values and writes come back as get_tuple
    gives them (also to a display reader, `unknown="tag"`), and a reader that does
    not allow them gets get_tuple's error, every time, then reads other threads."""
    from support.user_types import Color, Order, Point

    from langgraph_fenced_sqlite.core.serde import DataOnlySerializer, TaggedValue

    allowed = [Color, Order, Point]
    writer = open_store(allowed_types=allowed)
    config = writer.put(plain_config("t"), values_checkpoint(_user_values()), {"step": 0}, {})
    writer.put_writes(config, [("a", Point(2, 3)), ("b", "plain")], "task")
    writer.put(plain_config("u"), values_checkpoint({"a": 1}), {"step": 0}, {})
    (listed,) = list(writer.list(plain_config("t")))
    assert listed == writer.get_tuple(config)
    assert listed.checkpoint["channel_values"] == _user_values()
    assert [w[2] for w in listed.pending_writes] == [Point(2, 3), "plain"]
    display = open_store(serde=DataOnlySerializer(unknown="tag"))
    (shown,) = list(display.list(plain_config("t")))
    assert shown == display.get_tuple(config)
    assert isinstance(shown.checkpoint["channel_values"]["where"], TaggedValue)
    strict = open_store()
    for _ in range(2):
        with pytest.raises(UndecodableRow, match="not allowed") as by_id:
            strict.get_tuple(config)
        with pytest.raises(UndecodableRow) as by_list:
            list(strict.list(plain_config("t")))
        assert by_list.value.reason == by_id.value.reason
        assert [t.checkpoint["channel_values"] for t in strict.list(plain_config("u"))] == [
            {"a": 1}
        ]


def test_list_reads_through_a_users_serializer_as_get_tuple_does(open_store: Any) -> None:
    """A serializer of the user's is called as it is, for values and writes alike."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    store = open_store(serde=JsonPlusSerializer(pickle_fallback=False))
    config = store.put(plain_config("t"), values_checkpoint({"a": [1, 2]}), {"step": 0}, {})
    store.put_writes(config, [("a", {"x": 1}), ("b", None), ("c", b"\x00")], "task")
    (listed,) = list(store.list(plain_config("t")))
    assert listed == store.get_tuple(config)
    assert [w[2] for w in listed.pending_writes] == [{"x": 1}, None, b"\x00"]


@pytest.mark.parametrize(
    ("sql", "named"),
    [
        ("UPDATE writes SET blob = x'c1' WHERE channel = 'a'", "write 'task-1'"),
        ("UPDATE writes SET type = 'pickle' WHERE channel = 'a'", "pickle"),
        ("UPDATE writes SET channel = x'61' WHERE channel = 'a'", "wrong type"),
        ("UPDATE writes SET blob = 'text' WHERE channel = 'a'", "blob holds str"),
        ("UPDATE checkpoints SET metadata = '[]'", "not an object"),
        ("UPDATE checkpoints SET envelope = '{}'", "format"),
        ("UPDATE checkpoints SET values_type = 'msgpack', values_blob = x'c1'", "msgpack"),
        ("UPDATE checkpoints SET values_type = 'msgpack', values_blob = x'07'", "not a dict"),
        ("UPDATE writes SET blob = x'c7016300' WHERE channel = 'a'", "write 'task-1'"),
    ],
)
def test_list_names_a_forged_row_as_get_tuple_does(
    open_store: Any, db_path: str, sql: str, named: str
) -> None:
    """Behind a valid checksum, each write's and the checkpoint's cells are checked
    by `decode_read`'s and `decode_write`'s own code: the same error on both reads."""
    store = open_store()
    configs = _fill(store)
    _plant(db_path, sql, sealed=True)
    with pytest.raises(UndecodableRow, match=named) as by_id:
        store.get_tuple(configs["second"])
    with pytest.raises(UndecodableRow) as listed:
        list(store.list(plain_config("t")))
    assert listed.value.reason == by_id.value.reason
    assert listed.value.checkpoint_id == configs["second"]["configurable"]["checkpoint_id"]


def test_writes_of_a_checkpoint_not_stored_read_as_no_checkpoint(open_store: Any) -> None:
    """get_tuple's one statement returns write rows alone for an id that has writes
    but no checkpoint (LangGraph sends writes first): that is None, not an error."""
    store = open_store()
    store.put(plain_config("t"), values_checkpoint(), {"source": "input", "step": -1}, {})
    ghost = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "ghost"}}
    store.put_writes(ghost, [("chan", 1), ("other", 2)], "task")
    assert store.get_tuple(ghost) is None
    assert [t.checkpoint["id"] for t in store.list(plain_config("t"))] != ["ghost"]


def test_pending_writes_come_back_in_task_path_task_id_idx_order(open_store: Any) -> None:
    """The writes of get_tuple and list are sorted in Python (task_path, task_id,
    idx), as `ORDER BY task_path, task_id, idx` sorted them, for several tasks."""
    store = open_store()
    stored = store.put(plain_config("t"), values_checkpoint(), {"source": "loop", "step": 0}, {})
    tasks = [("b", "~1"), ("a", "~2"), ("c", "~1"), ("é", ""), ("d", "~10")]
    for task_id, path in tasks:
        store.put_writes(
            stored, [("x", f"{task_id}{path}-0"), ("y", f"{task_id}{path}-1")], task_id, path
        )
    expected = [f"{t}{p}-{i}" for p, t, i in sorted((p, t, i) for t, p in tasks for i in range(2))]
    got = store.get_tuple(stored)
    assert got is not None and [w[2] for w in got.pending_writes] == expected
    (listed,) = list(store.list(plain_config("t")))
    assert [w[2] for w in listed.pending_writes] == expected


def test_sort_writes_orders_mixed_cell_types_as_sqlite_does() -> None:
    """Damaged rows may hold NULL, numbers, text or blobs in a sort column; the
    Python sort then orders them as SQLite's ORDER BY does instead of failing."""
    from langgraph_fenced_sqlite.core.checkpoints import sort_writes

    paths: list[Any] = ["b", None, 3, b"\x00", "a", 1.5, b"a"]
    rows = [("task", "c", "t", b"", p, i, 0) for i, p in enumerate(paths)]
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE w (p, i)")
    conn.executemany("INSERT INTO w VALUES (?, ?)", [(p, i) for i, p in enumerate(paths)])
    expected = [i for (i,) in conn.execute("SELECT i FROM w ORDER BY p, i")]
    sort_writes(rows)
    assert [r[5] for r in rows] == expected


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(), kids, max_size=4),
    max_leaves=20,
)


@given(_JSON_VALUES, st.sampled_from(["", " ", "\n", "x", "]", "{", ",1"]))
def test_loads_json_fast_path_gives_the_decoders_value_or_error(value: Any, edge: str) -> None:
    """`loads_json` scans text straight away and falls back to the whole decoder for
    anything else: same value, or the same error, as `JSONDecoder.decode` gives."""
    import json

    text = dumps_json(value, "v")
    for candidate in (text, edge + text, text + edge):
        try:
            expected: Any = ("ok", json.loads(candidate))
        except ValueError:
            expected = ("error", None)
        try:
            got: Any = ("ok", loads_json(candidate, "v"))
        except SerializationError:
            got = ("error", None)
        assert got == expected, candidate


def _reference_text(value: Any) -> Any:
    """What the stored text must be: `json.dumps` with the documented options (or its error)."""
    import json

    try:
        return json.dumps(
            value, separators=(",", ":"), sort_keys=True, allow_nan=False, ensure_ascii=False
        )
    except (TypeError, ValueError, RecursionError):
        return "error"


class _Str(str):
    pass


_TEXT = st.text() | st.sampled_from(["\x00\x1f\x7f\u2028\ufeff", "😀", '\\"/'])
_ANY_TEXT = _TEXT | st.just("\ud800")
# JSON data with floats (orjson writes 1e-05 as 0.00001 and NaN as null:
# `json` must encode these) or without (orjson does).
_FLOATS_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats()
    | _TEXT,
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.lists(kids, max_size=3).map(tuple)
        | st.dictionaries(_TEXT, kids, max_size=4)
    ),
    max_leaves=15,
)
# And anything else: ints beyond 64 bits, lone surrogates, a str subclass.
_ANY_JSON = _FLOATS_JSON | st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats()
    | _ANY_TEXT
    | _ANY_TEXT.map(_Str),
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.lists(kids, max_size=3).map(tuple)
        | st.dictionaries(_ANY_TEXT, kids, max_size=4)
    ),
    max_leaves=25,
)


@given(_ANY_JSON)
def test_dumps_json_writes_exactly_the_json_modules_text(value: Any) -> None:
    """orjson encodes what `json_kind` calls plain, `json` the rest: the stored text is
    `json.dumps`'s either way, byte for byte (checksums and metadata filters compare it)."""
    expected = _reference_text(value)
    try:
        got = dumps_json(value, "v")
    except SerializationError:
        got = "error"
    assert got == expected
    if stored_json.json_kind(value) == stored_json.PLAIN:
        import orjson

        assert orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode() == expected


def test_json_kind_calls_only_exact_float_free_json_plain() -> None:
    plain, fine, no = stored_json.PLAIN, stored_json.FINE, stored_json.NOT_FINE
    assert stored_json.json_kind({"a": [1, "é", None, True, (2,)], "b": {}}) == plain
    assert stored_json.json_kind({"a": [1, {"x": 1.5}]}) == fine
    assert stored_json.json_kind({"a": 1.0, "b": _Str("s")}) == no
    assert stored_json.json_kind({"a": "\ud800"}) == no
    assert stored_json.json_kind([2**63]) == no
    assert stored_json.json_kind({1: "a"}) == no
    assert stored_json.json_kind(float("nan"), strict=True) == no


def test_an_envelope_with_float_versions_is_stored_as_json_writes_it(
    open_store: Any, db_path: str
) -> None:
    # LangGraph allows float channel versions; orjson would write 1e16 as "1e16".
    store = open_store()
    checkpoint = values_checkpoint({"a": 1})
    checkpoint["channel_versions"] = {"a": 1e16, "b": 0.5}
    store.put(plain_config("t"), checkpoint, {"source": "input", "step": -1, "score": 1e-05}, {})
    conn = sqlite3.connect(db_path)
    try:
        envelope, metadata = conn.execute("SELECT envelope, metadata FROM checkpoints").fetchone()
    finally:
        conn.close()
    assert '"a":1e+16' in envelopes.unpack(envelope) and '"score":1e-05' in metadata
    got = store.get_tuple(plain_config("t"))
    assert got is not None and got.checkpoint["channel_versions"] == {"a": 1e16, "b": 0.5}


def test_metadata_from_the_config_is_stored_as_json_writes_it(
    open_store: Any, db_path: str
) -> None:
    # Plain metadata is not walked a second time once LangGraph adds the
    # config's keys (checkpoints._metadata_kind): a float among those keys
    # must still take the json module's path (orjson writes 1e-05 as
    # "0.00001"), the other values giving the same text either way.
    store = open_store()
    config = plain_config("t")
    config["configurable"].update(flag=True, big=2**63 - 1, score=1e-05)
    store.put(config, values_checkpoint({"a": 1}), {"source": "input", "step": -1}, {})
    conn = sqlite3.connect(db_path)
    try:
        (metadata,) = conn.execute("SELECT metadata FROM checkpoints").fetchone()
    finally:
        conn.close()
    expected = {"source": "input", "step": -1, "flag": True, "big": 2**63 - 1, "score": 1e-05}
    assert metadata == dumps_json(expected, "metadata", kind=stored_json.NOT_FINE)
    assert '"score":1e-05' in metadata
    got = store.get_tuple(plain_config("t"))
    assert got is not None and got.metadata == expected


def test_identity_adapters_bind_the_same_values_and_keep_the_applications() -> None:
    """The package registers adapters for bytes and None (a faster bind, see
    connection.py); they change nothing bound, and never replace an application's."""
    from langgraph_fenced_sqlite.sqlite.connection import install_identity_adapters

    key = (type(None), sqlite3.PrepareProtocol)
    saved = dict(sqlite3.adapters)
    try:
        sqlite3.adapters.pop(key, None)
        sqlite3.adapters.pop((bytes, sqlite3.PrepareProtocol), None)
        sqlite3.register_adapter(type(None), lambda _none: "app's own")
        install_identity_adapters()
        conn = sqlite3.connect(":memory:")
        try:
            blob = b"\x00\xff"
            row = conn.execute("SELECT typeof(?), ?, ?", (blob, blob, None)).fetchone()
        finally:
            conn.close()
        assert row == ("blob", b"\x00\xff", "app's own")
        assert sqlite3.adapters[(bytes, sqlite3.PrepareProtocol)] is bytes
    finally:
        sqlite3.adapters.clear()
        sqlite3.adapters.update(saved)


def _outcome(read: Any, text: Any) -> Any:
    try:
        return ("ok", repr(read(text, "v")))  # repr: 1 is not 1.0, -0.0 is not 0.0
    except SerializationError:
        return ("error", None)


_TRICKY_TEXTS = st.sampled_from(
    [
        "18446744073709551616",  # orjson: a float
        "[-9223372036854775809]",
        '{"a":123456789012345678901234567890}',
        "-0",  # orjson: 0
        "[-0.0,0.00001,1e+16,1e16]",
        '{"a":1,"a":2}',
        '{"b":1,"a":2}',
        '"\\ud800"',
        '"\\u00e9\\n"',
        "[" * 250 + "]" * 250,
        "1" * 5000,
        "1E400",
        "NaN",
        "",
    ]
)


@given(
    _ANY_JSON.map(lambda v: _reference_text(v))
    | _FLOATS_JSON.map(lambda v: __import__("orjson").dumps(v).decode())
    | _TRICKY_TEXTS
    | st.text(max_size=30)
)
def test_loads_json_orjson_path_gives_the_decoders_value_or_error(text: str) -> None:
    """`loads_json` takes orjson's value only when orjson writes it back as the very
    text; whatever the text, the value (types included) or the error is that of
    `json`'s decoder alone (`_loads_scanned`)."""
    assert _outcome(loads_json, text) == _outcome(stored_json._loads_scanned, text)
