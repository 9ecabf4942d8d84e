"""`import_postgressaver`: a LangGraph `PostgresSaver` database into a fenced store.

The source is written by real graphs through LangGraph's own `PostgresSaver`
(`test_importer`'s graph: a fan-out with `Send`, a subgraph that interrupts,
a fork made by `update_state`) on the session's real server, and imported
into both stores: a fenced file and a `FencedPostgresSaver` in the same
schema as the source (its tables are `lgfs_*`).
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.types import Command
from support.configs import config
from support.graphs import (
    assert_same_threads,
    build_source_graph,
    tuples,
    write_source_threads,
)
from support.processes import TESTS_DIR, lgfs
from support.user_types import Boom, Receipt

from langgraph_fenced_sqlite import (
    FencedSqliteSaver,
    InvalidArgument,
    StoreError,
    UnsupportedFormat,
)
from langgraph_fenced_sqlite.postgres import FencedPostgresSaver, import_postgressaver

_SOURCE_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes", "checkpoint_migrations")


@pytest.fixture
def source(pg_dsn: str) -> str:
    """A fresh schema holding a `PostgresSaver` database written by real graphs."""
    with PostgresSaver.from_conn_string(pg_dsn) as saver:
        saver.setup()
        write_source_threads(saver)
    return pg_dsn


@pytest.fixture(params=["sqlite", "postgres"])
def dest(request: pytest.FixtureRequest, tmp_path: Any, source: str) -> Any:
    """Open the fenced store to import into: a file, or the source's own schema."""

    def opener(**kwargs: Any) -> Any:
        if request.param == "sqlite":
            return FencedSqliteSaver(str(tmp_path / "fenced.db"), **kwargs)
        saver = FencedPostgresSaver.from_conn_string(source, **kwargs)
        opened = saver.__enter__()
        opened.setup()
        return opened

    return opener


def _rows(dsn: str) -> dict[str, list[Any]]:
    """Every row of the source's tables, in a stable order."""
    with psycopg.connect(dsn) as conn:
        return {
            t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr)
            for t in _SOURCE_TABLES
        }


def _by_key(saver: Any) -> list[Any]:
    # Both list every checkpoint; only the order across threads differs.
    return sorted(tuples(saver), key=lambda t: repr(t[0]))


def test_import_gives_the_same_history_and_state_for_every_thread(source: str, dest: Any) -> None:
    with dest() as fenced, PostgresSaver.from_conn_string(source) as original:
        report = import_postgressaver(source, fenced)
        assert (report.threads, report.skipped, report.dest) == (3, (), fenced.path)
        assert report.source.startswith("postgresql://127.0.0.1:")
        ours = assert_same_threads(original, fenced)
        expected_tuples = _by_key(original)
        assert _by_key(fenced) == expected_tuples
        assert report.checkpoints == len(expected_tuples)
        assert report.writes == sum(len(t[4]) for t in expected_tuples)
        # The fan-out's writes keep their task paths (PostgresSaver's tuples drop them).
        paths = {w["task_path"] for t in fenced.list(None) for w in _writes(fenced, t.config)}
        assert any(path.startswith("~__pregel_push") for path in paths), paths
        waiting = ours.get_state(config("waiting"))
        assert waiting.interrupts and waiting.interrupts[0].value["question"] == "ship it?"


def _writes(saver: Any, config: Any) -> list[dict[str, Any]]:
    conf = config["configurable"]
    found = saver.inspect_checkpoint(
        conf["thread_id"], checkpoint_ns=conf["checkpoint_ns"], checkpoint_id=conf["checkpoint_id"]
    )
    return list(found["writes"]) if found else []


def test_an_imported_thread_resumes_like_the_original(source: str, dest: Any) -> None:
    with dest() as fenced:
        import_postgressaver(source, fenced)
        ours = build_source_graph(fenced).invoke(Command(resume="ok"), config("waiting"))
    with PostgresSaver.from_conn_string(source) as original:
        theirs = build_source_graph(original).invoke(Command(resume="ok"), config("waiting"))
    assert ours["items"] == theirs["items"]
    assert [m.content for m in ours["messages"]] == [m.content for m in theirs["messages"]]


def test_import_reads_the_source_only_and_a_rerun_changes_nothing(
    source: str, tmp_path: Any
) -> None:
    from support.files import import_twice_changes_nothing

    before = _rows(source)
    path = str(tmp_path / "fenced.db")
    with FencedSqliteSaver(path) as fenced:
        import_twice_changes_nothing(lambda: import_postgressaver(source, fenced), path)
    assert _rows(source) == before


def _set_newest_write(dsn: str, thread_id: str, type_: str, blob: bytes) -> str:
    """Replace the newest write of `thread_id` (as a writer could); return its checkpoint id."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT checkpoint_id, task_id, idx FROM checkpoint_writes WHERE thread_id = %s "
            "ORDER BY checkpoint_id DESC, task_id DESC, idx DESC LIMIT 1",
            (thread_id,),
        ).fetchone()
        assert row is not None
        conn.execute(
            "UPDATE checkpoint_writes SET type = %s, blob = %s WHERE thread_id = %s "
            "AND checkpoint_id = %s AND task_id = %s AND idx = %s",
            (type_, blob, thread_id, *row),
        )
    return str(row[0])


def test_a_pickled_value_skips_its_thread_and_never_runs(
    source: str, dest: Any, tmp_path: Any
) -> None:
    marker = str(tmp_path / "code-ran")
    payload = pickle.dumps(Boom(marker))
    cid = _set_newest_write(source, "waiting", "pickle", payload)
    with psycopg.connect(source, autocommit=True) as conn:  # a checkpoint's blob too
        conn.execute(
            "UPDATE checkpoint_blobs SET type = 'pickle', blob = %s WHERE thread_id = 'done' "
            "AND channel = 'items'",
            (payload,),
        )
    with dest() as fenced:
        report = import_postgressaver(source, fenced)
        assert sorted(s["thread_id"] for s in report.skipped) == ["done", "waiting"]
        waiting = next(s for s in report.skipped if s["thread_id"] == "waiting")
        assert waiting["checkpoint_id"] == cid and "pickle" in waiting["reason"]
        assert report.threads == 1
        assert {t.config["configurable"]["thread_id"] for t in fenced.list(None)} == {"forked"}
        assert fenced.events_after("done", 0, 10) == []
    assert not os.path.exists(marker)


def test_a_users_type_needs_the_dest_savers_allow_list(source: str, dest: Any) -> None:
    type_, blob = JsonPlusSerializer().dumps_typed(Receipt("T-1", 3))
    cid = _set_newest_write(source, "done", type_, blob)
    with dest() as fenced:
        report = import_postgressaver(source, fenced)
        assert [(s["thread_id"], s["checkpoint_id"]) for s in report.skipped] == [("done", cid)]
        assert f"{Receipt.__module__}.Receipt" in report.skipped[0]["reason"]
        assert "allowed_types" in report.skipped[0]["reason"]
        assert fenced.get_tuple(config("done")) is None
    with dest(allowed_types=[Receipt]) as fenced:
        report = import_postgressaver(source, fenced)
        assert report.skipped == () and report.threads == 3
        values = [w[2] for t in fenced.list(config("done")) for w in t.pending_writes]
        assert Receipt("T-1", 3) in values


def test_what_is_not_a_postgressaver_database_is_refused(pg_server: Any, tmp_path: Any) -> None:
    with FencedSqliteSaver(str(tmp_path / "fenced.db")) as fenced:
        with pytest.raises(UnsupportedFormat, match="not a LangGraph PostgresSaver database"):
            import_postgressaver(pg_server.fresh_dsn(), fenced)
        with pytest.raises(InvalidArgument, match="source"):
            import_postgressaver(b"postgresql://x", fenced)  # type: ignore[arg-type]
        wrong = (
            f"postgresql://lgfs:hunter2@127.0.0.1:{pg_server.port}/postgres?"
            "options=-c%20search_path%3Dno_such_schema"
        )
        with pytest.raises(UnsupportedFormat):
            import_postgressaver(wrong, fenced)
        closed = "postgresql://lgfs:hunter2@127.0.0.1:1/postgres?connect_timeout=2"
        with pytest.raises(StoreError) as failed:
            import_postgressaver(closed, fenced)
        assert "hunter2" not in str(failed.value) and "connect failed" in str(failed.value)
        assert fenced.threads() == []


def _url(dsn: str) -> str:
    """`dsn` (key=value, with its schema in `options`) as the URL the command takes."""
    from urllib.parse import quote

    from psycopg.conninfo import conninfo_to_dict

    d = conninfo_to_dict(dsn)
    return (
        f"postgresql://{d['user']}@{d['host']}:{d['port']}/{d['dbname']}"
        f"?options={quote(str(d['options']))}"
    )


@pytest.mark.subprocess
def test_the_command_imports_reports_skips_and_takes_the_allow_list(
    source: str, tmp_path: Any
) -> None:
    import json

    dest = str(tmp_path / "fenced.db")
    done = lgfs("import-postgressaver", _url(source), dest, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["threads"], report["skipped"]) == (3, [])
    assert report["source"].startswith("postgresql://127.0.0.1:")
    with FencedSqliteSaver(dest) as fenced, PostgresSaver.from_conn_string(source) as original:
        assert _by_key(fenced) == _by_key(original)
    type_, blob = JsonPlusSerializer().dumps_typed(Receipt("T-1", 3))
    _set_newest_write(source, "done", type_, blob)
    other = str(tmp_path / "other.db")
    skipped = lgfs("import-postgressaver", _url(source), other)
    assert skipped.returncode == 1, skipped.stderr
    assert "imported 2 threads" in skipped.stdout
    assert "skipped thread 'done' (nothing of it imported)" in skipped.stdout
    env = {"PYTHONPATH": TESTS_DIR}
    allowed = lgfs(
        "import-postgressaver",
        _url(source),
        other,
        "--allow-type",
        f"{Receipt.__module__}:Receipt",
        env=env,
    )
    assert allowed.returncode == 0, allowed.stderr
    assert allowed.stdout.startswith("imported 3 threads")


@pytest.mark.subprocess
def test_the_command_refuses_a_bad_source_before_dest_is_made(
    pg_server: Any, tmp_path: Any
) -> None:
    dest = str(tmp_path / "fenced.db")
    not_url = lgfs("import-postgressaver", "app.db", dest)
    assert not_url.returncode == 2 and "is not a PostgreSQL URL" in not_url.stderr
    empty = lgfs("import-postgressaver", _url(pg_server.fresh_dsn()), dest)
    assert empty.returncode == 4 and "not a LangGraph PostgresSaver database" in empty.stderr
    secret = "postgresql://lgfs:hunter2@127.0.0.1:1/postgres?connect_timeout=2"
    down = lgfs("import-postgressaver", secret, dest)
    assert down.returncode != 0 and "hunter2" not in down.stderr + down.stdout
    assert "Traceback" not in down.stderr and "connect failed" in down.stderr
    assert not os.path.exists(dest)


def test_a_source_at_another_postgressaver_version_is_refused_saying_what_to_do(
    source: str, tmp_path: Any
) -> None:
    """PostgresSaver's code reads its own version's layout only: older means its setup()
    first (its get_tuple would fail on a missing column), newer means upgrade the package."""
    with psycopg.connect(source, autocommit=True) as conn:
        (latest,) = conn.execute("SELECT max(v) FROM checkpoint_migrations").fetchone()  # type: ignore[misc]
        conn.execute("DELETE FROM checkpoint_migrations WHERE v = %s", (latest,))
    with FencedSqliteSaver(str(tmp_path / "fenced.db")) as fenced:
        with pytest.raises(UnsupportedFormat, match=r"older .* run PostgresSaver.setup\(\)"):
            import_postgressaver(source, fenced)
        with psycopg.connect(source, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO checkpoint_migrations VALUES (%s), (%s)", (latest, latest + 1)
            )
        with pytest.raises(
            UnsupportedFormat, match="newer .* upgrade langgraph-checkpoint-postgres"
        ):
            import_postgressaver(source, fenced)
        assert fenced.threads() == []
