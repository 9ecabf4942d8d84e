"""`import_sqlitesaver` and `lgfs import-sqlitesaver`, on files made by LangGraph's `SqliteSaver`.

The source file holds real graphs: a `Send` fan-out, a subgraph with an
`interrupt` (resumed on one thread, left pending on another), chat messages,
and a fork made by `update_state` on an old checkpoint.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sqlite3
from typing import Any

import pytest
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command
from support.configs import config
from support.files import dump, import_twice_changes_nothing, make_v3_file, read_bytes, user_version
from support.graphs import (
    SOURCE_THREADS,
    assert_same_threads,
    build_source_graph,
    tuples,
    write_source_threads,
)
from support.processes import TESTS_DIR, lgfs
from support.user_types import Boom, Receipt

from langgraph_fenced_sqlite import (
    FencedSqliteSaver,
    UnsupportedFormat,
    import_sqlitesaver,
)
from langgraph_fenced_sqlite.core.checksums import checksum


@pytest.fixture(scope="module")
def source_file(tmp_path_factory: Any) -> str:
    """A `SqliteSaver` file written by real graphs (copy it to change it)."""
    path = str(tmp_path_factory.mktemp("src") / "langgraph.db")
    with SqliteSaver.from_conn_string(path) as saver:
        write_source_threads(saver)
    return path


@pytest.fixture
def source(source_file: str, tmp_path: Any) -> str:
    """A private copy of the source file."""
    path = str(tmp_path / "source.db")
    shutil.copyfile(source_file, path)
    return path


def test_import_gives_the_same_history_for_every_thread(source: str, tmp_path: Any) -> None:
    dest = str(tmp_path / "fenced.db")
    with FencedSqliteSaver(dest) as fenced, SqliteSaver.from_conn_string(source) as original:
        report = import_sqlitesaver(source, fenced)
        assert (report.threads, report.source, report.dest) == (3, source, dest)
        ours = assert_same_threads(original, fenced)
        expected_tuples = tuples(original)
        assert tuples(fenced) == expected_tuples
        assert report.checkpoints == len(expected_tuples)
        assert report.writes == sum(len(t[4]) for t in expected_tuples)
        forked = list(ours.get_state_history(config("forked")))
        assert "update" in {s.metadata["source"] for s in forked}
        waiting = ours.get_state(config("waiting"))
        assert waiting.interrupts and waiting.interrupts[0].value["question"] == "ship it?"


def test_imported_rows_carry_the_checksum_of_their_cells(source: str, tmp_path: Any) -> None:
    dest = str(tmp_path / "fenced.db")
    with FencedSqliteSaver(dest) as fenced:
        import_sqlitesaver(source, fenced)
    conn = sqlite3.connect(dest)
    covered = {
        "checkpoints": "envelope, values_type, values_blob, metadata",
        "writes": "channel, type, blob",
        "events": "kind, data",
    }
    try:
        for table, cells in covered.items():
            rows = conn.execute(f"SELECT checksum, {cells} FROM {table}").fetchall()
            assert rows and all(row[0] == checksum(*row[1:]) for row in rows), table
    finally:
        conn.close()


def test_import_reads_the_source_only(source: str, tmp_path: Any) -> None:
    rows, raw = dump(source), read_bytes(source)
    with FencedSqliteSaver(str(tmp_path / "fenced.db")) as fenced:
        import_sqlitesaver(source, fenced)
    assert read_bytes(source) == raw and dump(source) == rows


def test_positions_follow_commit_order_parent_first(source: str, tmp_path: Any) -> None:
    with FencedSqliteSaver(str(tmp_path / "fenced.db")) as fenced:
        import_sqlitesaver(source, fenced)
        for summary in fenced.threads():
            for ns in summary["namespaces"]:
                records = fenced.history_records(summary["thread_id"], checkpoint_ns=ns, limit=1000)
                by_position = [r["checkpoint_id"] for r in reversed(records)]
                assert by_position == sorted(by_position)  # id order == commit order
                position = {r["checkpoint_id"]: r["position"] for r in records}
                for r in records:
                    if r["parent_checkpoint_id"]:
                        assert position[r["parent_checkpoint_id"]] < r["position"]
                assert all(r["token"] is None for r in records)  # unfenced puts


def test_rerunning_the_import_changes_nothing(source: str, tmp_path: Any) -> None:
    dest = str(tmp_path / "fenced.db")
    with FencedSqliteSaver(dest) as fenced:
        import_twice_changes_nothing(lambda: import_sqlitesaver(source, fenced), dest)


def test_an_imported_thread_resumes_like_the_original(source: str, tmp_path: Any) -> None:
    with FencedSqliteSaver(str(tmp_path / "fenced.db")) as fenced:
        import_sqlitesaver(source, fenced)
        ours = build_source_graph(fenced).invoke(Command(resume="ok"), config("waiting"))
    with SqliteSaver.from_conn_string(source) as original:
        theirs = build_source_graph(original).invoke(Command(resume="ok"), config("waiting"))
    assert ours["items"] == theirs["items"]  # the new message gets a fresh random id
    assert [m.content for m in ours["messages"]] == [m.content for m in theirs["messages"]]
    assert ours["messages"][-1].content == f"{len(ours['items'])} items"


@pytest.mark.parametrize("table", ["checkpoints", "writes"])
def test_a_row_that_does_not_decode_skips_its_thread_and_is_reported(
    source: str, tmp_path: Any, table: str
) -> None:
    marker = str(tmp_path / "code-ran")
    payload = pickle.dumps(Boom(marker))
    conn = sqlite3.connect(source)
    with conn:
        column = "checkpoint" if table == "checkpoints" else "value"
        thread_id, cid = conn.execute(
            f"SELECT thread_id, checkpoint_id FROM {table} WHERE thread_id = 'waiting' "
            "ORDER BY checkpoint_id LIMIT 1"
        ).fetchone()
        conn.execute(
            f"UPDATE {table} SET type = 'pickle', {column} = ? "
            "WHERE thread_id = ? AND checkpoint_id = ?",
            (payload, thread_id, cid),
        )
    conn.close()
    with FencedSqliteSaver(str(tmp_path / "fenced.db")) as fenced:
        report = import_sqlitesaver(source, fenced)
        assert [s["thread_id"] for s in report.skipped] == ["waiting"]
        assert report.skipped[0]["checkpoint_id"] == cid
        assert "pickle" in report.skipped[0]["reason"]
        assert report.threads == 2
        assert {t.config["configurable"]["thread_id"] for t in fenced.list(None)} == {
            "done",
            "forked",
        }
    assert not os.path.exists(marker)


def _last_write_holds(source: str, thread_id: str, value: Any) -> str:
    """Replace the newest write of `thread_id` with `value` as LangGraph stores it."""
    type_, blob = JsonPlusSerializer().dumps_typed(value)
    conn = sqlite3.connect(source)
    with conn:
        cid, task_id, idx = conn.execute(
            "SELECT checkpoint_id, task_id, idx FROM writes WHERE thread_id = ? "
            "ORDER BY checkpoint_id DESC, task_id DESC, idx DESC LIMIT 1",
            (thread_id,),
        ).fetchone()
        conn.execute(
            "UPDATE writes SET type = ?, value = ? WHERE thread_id = ? AND checkpoint_id = ? "
            "AND task_id = ? AND idx = ?",
            (type_, blob, thread_id, cid, task_id, idx),
        )
    conn.close()
    return str(cid)


def test_a_thread_is_imported_whole_or_not_at_all(source: str, tmp_path: Any) -> None:
    """A refused value in a thread's last row leaves nothing of that thread, reported."""
    cid = _last_write_holds(source, "done", Receipt("T-1", 3))
    dest = str(tmp_path / "fenced.db")
    with FencedSqliteSaver(dest) as fenced:
        report = import_sqlitesaver(source, fenced)
        assert report.skipped == (
            {"thread_id": "done", "checkpoint_id": cid, "reason": report.skipped[0]["reason"]},
        )
        assert f"{Receipt.__module__}.Receipt" in report.skipped[0]["reason"]
        assert "allowed_types" in report.skipped[0]["reason"]
        assert fenced.get_tuple(config("done")) is None
        assert fenced.events_after("done", 0, 10) == []
        assert fenced.get_tuple(config("waiting")) is not None
    # With the app's allow-list the same import takes the thread, value and all.
    with FencedSqliteSaver(dest, allowed_types=[Receipt]) as fenced:
        report = import_sqlitesaver(source, fenced)
        assert report.skipped == () and report.threads == 3
        values = [w[2] for t in fenced.list(config("done")) for w in t.pending_writes]
        assert Receipt("T-1", 3) in values


@pytest.mark.subprocess
def test_the_command_reports_a_skipped_thread_and_takes_the_allow_list(
    source: str, tmp_path: Any
) -> None:
    _last_write_holds(source, "done", Receipt("T-1", 3))
    dest = str(tmp_path / "fenced.db")
    skipped = lgfs("import-sqlitesaver", source, dest)
    assert skipped.returncode == 1, skipped.stderr
    assert "imported 2 threads" in skipped.stdout
    assert "skipped thread 'done' (nothing of it imported)" in skipped.stdout
    assert f"{Receipt.__module__}.Receipt" in skipped.stdout
    env = {"PYTHONPATH": TESTS_DIR}
    allowed = lgfs(
        "import-sqlitesaver", source, dest, "--allow-type", f"{Receipt.__module__}:Receipt", env=env
    )
    assert allowed.returncode == 0, allowed.stderr
    assert allowed.stdout.startswith("imported 3 threads")


@pytest.mark.subprocess
def test_the_command_refuses_an_older_dest_unchanged(source: str, tmp_path: Any) -> None:
    """An existing DEST at an older schema is refused as every command refuses it, not migrated."""
    made = str(tmp_path / "made.db")
    with FencedSqliteSaver(made) as fenced:
        import_sqlitesaver(source, fenced)
    dest = str(tmp_path / "v3.db")
    make_v3_file(made, dest)
    before = read_bytes(dest)
    done = lgfs("import-sqlitesaver", source, dest)
    assert done.returncode == 4 and done.stdout == "", done.stderr
    assert "schema version 3 needs migrating" in done.stderr and "lgfs migrate" in done.stderr
    assert read_bytes(dest) == before and user_version(dest) == 3


def test_refuses_what_is_not_a_sqlitesaver_file(tmp_path: Any) -> None:
    with FencedSqliteSaver(str(tmp_path / "fenced.db")) as fenced:
        with pytest.raises(FileNotFoundError):
            import_sqlitesaver(str(tmp_path / "missing.db"), fenced)
        text = tmp_path / "notes.txt"
        text.write_text("not a database\n" * 100)
        with pytest.raises(UnsupportedFormat, match="not an SQLite database"):
            import_sqlitesaver(str(text), fenced)
        with pytest.raises(UnsupportedFormat, match="not a LangGraph SqliteSaver file"):
            import_sqlitesaver(fenced.path, fenced)
        assert fenced.threads() == []


def test_imports_old_files_without_task_path_and_with_text_metadata(
    source: str, tmp_path: Any
) -> None:
    conn = sqlite3.connect(source)
    with conn:
        conn.execute("UPDATE checkpoints SET metadata = CAST(metadata AS TEXT)")
        conn.execute("ALTER TABLE writes DROP COLUMN task_path")
    conn.close()
    dest = str(tmp_path / "fenced.db")
    with FencedSqliteSaver(dest) as fenced, SqliteSaver.from_conn_string(source) as original:
        import_sqlitesaver(source, fenced)
        for thread_id in SOURCE_THREADS:
            theirs = list(build_source_graph(original).get_state_history(config(thread_id)))
            assert list(build_source_graph(fenced).get_state_history(config(thread_id))) == theirs


def test_progress_counts_every_row_up_to_the_total(source: str, tmp_path: Any) -> None:
    calls: list[tuple[int, int]] = []
    with FencedSqliteSaver(str(tmp_path / "fenced.db")) as fenced:
        report = import_sqlitesaver(source, fenced, progress=lambda *a: calls.append(a))
    total = report.checkpoints + report.writes
    assert calls[0] == (0, total) and calls[-1] == (total, total)
    done = [d for d, _ in calls]
    assert done == sorted(done) and {t for _, t in calls} == {total}


@pytest.mark.subprocess
def test_the_command_imports_with_a_progress_bar_and_reruns_safely(
    source: str, tmp_path: Any
) -> None:
    dest = str(tmp_path / "new" / "fenced.db")
    os.mkdir(os.path.dirname(dest))
    done = lgfs("import-sqlitesaver", source, dest, "--progress", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["threads"] == 3 and report["checkpoints"] > 0 and report["writes"] > 0
    assert "importing [" in done.stderr and "100%" in done.stderr
    rows = dump(dest)
    again = lgfs("import-sqlitesaver", source, dest)
    assert again.returncode == 0 and again.stderr == ""  # no bar off a terminal
    assert again.stdout.startswith(f"imported 3 threads, {report['checkpoints']} checkpoints")
    assert dump(dest) == rows
    with SqliteSaver.from_conn_string(source) as original, FencedSqliteSaver(dest) as fenced:
        assert tuples(fenced) == tuples(original)


@pytest.mark.subprocess
def test_the_command_refuses_a_bad_source_without_creating_dest(tmp_path: Any) -> None:
    dest = str(tmp_path / "fenced.db")
    missing = lgfs("import-sqlitesaver", str(tmp_path / "nope.db"), dest)
    assert missing.returncode == 3 and "no such file" in missing.stderr
    ours = str(tmp_path / "ours.db")
    FencedSqliteSaver(ours).close()
    refused = lgfs("import-sqlitesaver", ours, dest, "--json")
    assert refused.returncode == 4
    assert json.loads(refused.stderr)["code"] == "unsupported_format"
    assert not os.path.exists(dest)
