"""Opening a file (`connection.py`): many processes at once, the SQLite version, the tables.

Many processes opening one new file set its schema up exactly once, and one
opens while another holds the write lock; an SQLite too old for the SQL, and a
file of ours whose tables or columns are gone, are refused untouched. Several
tests pin a promise of docs/semantics.md §8 that an earlier engine broke
(issue "Trust at the edges"); each failed on that engine.
"""

from __future__ import annotations

import json
import os
import pathlib
import sqlite3
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from support.files import read_bytes, schema_dump
from support.processes import run_together, start
from support.puts import put_value
from support.waiting import until

from langgraph_fenced_sqlite import (
    FencedSqliteSaver,
    UnsupportedFormat,
)
from langgraph_fenced_sqlite.sqlite import schema as lgfs_schema

# --- many openers --------------------------------------------------------------------

_OPENER = textwrap.dedent(
    """
    import json, os, sys, time
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph_fenced_sqlite import FencedSqliteSaver

    path, flag, index = sys.argv[1], sys.argv[2], sys.argv[3]
    deadline = time.monotonic() + 60
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.001)  # all children leave this loop within a millisecond
    with FencedSqliteSaver(path) as saver:
        cp = empty_checkpoint()
        saver.put({"configurable": {"thread_id": f"p{index}", "checkpoint_ns": ""}}, cp,
                  {"source": "input", "step": -1}, {})
        token = saver.claim(f"p{index}", "me", 10).token
        print(json.dumps({"ok": True, "token": token, "stats": saver.stats()}))
    """
)

_HOLD_LOCK_AND_OPEN = textwrap.dedent(
    """
    import json, sys
    from langgraph_fenced_sqlite import FencedSqliteSaver
    with FencedSqliteSaver(sys.argv[1], busy_timeout=0.5) as saver:
        print(json.dumps({"version": saver.stats()["schema_version"],
                          "found": saver.get_tuple({"configurable": {"thread_id": "t"}})
                          is not None}))
    """
)


@pytest.mark.slow
@pytest.mark.subprocess
def test_eight_processes_open_one_new_file(tmp_path: pathlib.Path) -> None:
    """8 processes opening one brand-new file at once all succeed; the schema is set up once."""
    path = str(tmp_path / "new.db")
    flag = str(tmp_path / "go")
    results = run_together(
        [[sys.executable, "-c", _OPENER, path, flag, str(i)] for i in range(8)], flag
    )
    reports = []
    for returncode, out, err in results:
        assert returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["token"] for r in reports) == list(range(1, 9))  # one counter, one row
    conn = sqlite3.connect(path)
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master ORDER BY name")]
        assert len(names) == len(set(names))
        assert {"meta", "threads", "checkpoints", "writes", "events"} <= set(names)
        assert conn.execute("SELECT key, value FROM meta").fetchall() == [("token_counter", 8)]
        assert conn.execute("PRAGMA user_version").fetchone()[0] == lgfs_schema.SCHEMA_VERSION
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0] == 8
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.subprocess
def test_other_process_opens_while_the_write_lock_is_held(db_path: str) -> None:
    """Another process opening a set-up file migrates nothing: it opens under a held write lock."""
    with FencedSqliteSaver(db_path) as saver:
        put_value(saver)
    before = schema_dump(db_path)
    blocker = sqlite3.connect(db_path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        done = subprocess.run(
            [sys.executable, "-c", _HOLD_LOCK_AND_OPEN, db_path],
            capture_output=True,
            text=True,
            timeout=60,
        )
        blocker.execute("ROLLBACK")
    finally:
        blocker.close()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"version": lgfs_schema.SCHEMA_VERSION, "found": True}
    assert schema_dump(db_path) == before


# --- 1. many processes opening one new file -----------------------------------------

_ROUNDS_CHILD = textwrap.dedent(
    """
    import os, sys, time
    from langgraph_fenced_sqlite import FencedSqliteSaver
    base, rounds, index = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    failures = []
    for r in range(rounds):
        flag = os.path.join(base, f"go{r}")
        deadline = time.monotonic() + 120
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.0005)
        try:
            with FencedSqliteSaver(os.path.join(base, f"db{r}.db")):
                pass
        except Exception as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
        open(os.path.join(base, f"done{r}-{index}"), "w").close()
    print(repr(failures))
    """
)


@pytest.mark.slow
@pytest.mark.subprocess
def test_many_processes_open_new_files_together(tmp_path: Any) -> None:
    """12 processes open each of 50 brand-new files at once: every open succeeds.

    The engine read `user_version` and the table count in two snapshots, so
    an open racing another's setup could read "version 0" then "tables": not
    ours (seen 1 in 240 opens). Many rounds make that race all but certain.
    """

    base, n, rounds = str(tmp_path), 12, 50
    procs = [
        start([sys.executable, "-c", _ROUNDS_CHILD, base, str(rounds), str(i)]) for i in range(n)
    ]
    try:
        for r in range(rounds):
            with open(os.path.join(base, f"go{r}"), "w"):
                pass
            until(
                lambda r=r: (
                    all(os.path.exists(os.path.join(base, f"done{r}-{i}")) for i in range(n))
                    or any(p.poll() is not None for p in procs)
                ),
                f"round {r} done",
            )
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    failures = []
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
        failures.extend(eval(out.strip().splitlines()[-1]))  # noqa: S307 - our own repr
    assert failures == []
    conn = sqlite3.connect(os.path.join(base, "db0.db"))
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == lgfs_schema.SCHEMA_VERSION
    finally:
        conn.close()


# --- 9. the SQLite version ---------------------------------------------------------------------


def test_an_old_sqlite_is_refused_naming_both_versions(
    db_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SQLite older than RETURNING (3.35.0) is refused at open, before the file is touched."""
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.31.1")
    with pytest.raises(UnsupportedFormat) as exc:
        FencedSqliteSaver(db_path)
    assert "3.31.1" in str(exc.value) and "3.35.0" in str(exc.value), str(exc.value)
    assert not os.path.exists(db_path)


# --- 10. the tables, when user_version matches -------------------------------------------------


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("ALTER TABLE events RENAME TO events_old", "'events'"),
        ("DROP TABLE writes", "'writes'"),
        ("ALTER TABLE threads DROP COLUMN run_id", "run_id"),
        ("ALTER TABLE checkpoints RENAME COLUMN envelope TO env", "envelope"),
    ],
)
def test_a_file_missing_a_table_or_column_is_refused_unchanged(
    db_path: str, damage: str, named: str
) -> None:
    """Our application_id and user_version, but a table or column gone: refused, unchanged."""
    with FencedSqliteSaver(db_path) as saver:
        put_value(saver)
    conn = sqlite3.connect(db_path)
    conn.execute(damage)
    conn.commit()
    conn.close()
    before = read_bytes(db_path)
    with pytest.raises(UnsupportedFormat) as exc:
        FencedSqliteSaver(db_path)
    assert named in str(exc.value) and "left unchanged" in str(exc.value), str(exc.value)
    assert read_bytes(db_path) == before


def test_extra_tables_and_columns_are_tolerated(db_path: str) -> None:
    """Only what the migrations build is required: a user's extra table or column is fine."""
    with FencedSqliteSaver(db_path) as saver:
        config = put_value(saver)
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE my_notes (x TEXT)")
    conn.execute("ALTER TABLE threads ADD COLUMN note TEXT")
    conn.commit()
    conn.close()
    with FencedSqliteSaver(db_path) as saver:
        assert saver.get_tuple(config) is not None
