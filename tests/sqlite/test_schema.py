"""Schema migrations: an older file opens, migrates in one transaction, and reads back the same.

Migration 3 -> 4 replaced the two run-id indexes (a page more in the commit of
every checkpoint and write of a run) with `thread_runs`, one row per (thread,
run), kept by triggers. Files of version 3 are built here from
`MIGRATIONS[:3]` with the cells the current code writes (their encoding did
not change with the migration), as a version-3 store left them.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointMetadata
from support.files import dump, make_v3_file, user_version

from langgraph_fenced_sqlite import (
    FencedSqliteSaver,
    RetentionPolicy,
    StoreError,
    UnsupportedFormat,
)
from langgraph_fenced_sqlite.sqlite.schema import MIGRATIONS, SCHEMA_VERSION
from langgraph_fenced_sqlite.testing._helpers import plain_config, values_checkpoint


def _run_config(thread_id: str, run_id: str, parent: str | None = None) -> RunnableConfig:
    config = plain_config(thread_id, checkpoint_id=parent)
    return {**config, "metadata": {"run_id": run_id}}


def _put_run(store: FencedSqliteSaver, thread_id: str, run_id: str, steps: int) -> list[str]:
    """Put `steps` checkpoints of one run on a thread's chain, each with one write."""
    latest = store.get_tuple(plain_config(thread_id))
    parent = None if latest is None else latest.config["configurable"]["checkpoint_id"]
    ids = []
    for step in range(steps):
        cp = values_checkpoint({"step": step, "run": run_id})
        meta: CheckpointMetadata = {"source": "loop", "step": step, "parents": {}}
        meta["run_id"] = run_id
        stored = store.put(_run_config(thread_id, run_id, parent), cp, meta, {})
        parent = stored["configurable"]["checkpoint_id"]
        store.put_writes(_run_config(thread_id, run_id, parent), [("x", step)], f"task-{step}")
        ids.append(parent)
    return ids


def _fill(store: FencedSqliteSaver) -> None:
    """Two threads, two runs (one in both), plain writes, a caller event and a claim."""
    _put_run(store, "a", "r1", 2)
    _put_run(store, "b", "r1", 1)
    _put_run(store, "b", "r2", 2)
    store.put_writes(plain_config("b", checkpoint_id="not-yet"), [("y", 1)], "task-plain")
    claim = store.claim("a", "me", 60)
    store.append_events("a", claim.token, [{"kind": "note", "data": {"n": 1}}])
    store.release("a", claim.token)


def _reads(store: FencedSqliteSaver) -> dict[str, Any]:
    """What a user reads back of each thread: its list, history and event log."""
    out: dict[str, Any] = {}
    for thread_id in ("a", "b"):
        out[thread_id] = (
            list(store.list(plain_config(thread_id))),
            store.history(thread_id, limit=100),
            store.events_after(thread_id, 0),
        )
    return out


@pytest.fixture
def v3_file(open_store: Any, tmp_path: Any) -> tuple[str, dict[str, Any]]:
    """A version-3 file and what a store read from its rows before migration."""
    source = str(tmp_path / "source.db")
    store = open_store(source)
    _fill(store)
    expected = _reads(store)
    store.close()
    target = str(tmp_path / "v3.db")
    make_v3_file(source, target)
    return target, expected


def _run_rows(path: str, run_id: str) -> int:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(
            conn.execute(
                "SELECT (SELECT count(*) FROM checkpoints WHERE run_id = ?1) "
                "+ (SELECT count(*) FROM writes WHERE run_id = ?1)",
                (run_id,),
            ).fetchone()[0]
        )
    finally:
        conn.close()


def test_a_schema_3_file_migrates_and_reads_back_the_same(
    v3_file: tuple[str, dict[str, Any]], open_store: Any
) -> None:
    path, expected = v3_file
    assert SCHEMA_VERSION == 8 and user_version(path) == 3
    migrated = open_store(path)
    assert user_version(path) == SCHEMA_VERSION
    assert _reads(migrated) == expected
    # Thread search's index (5 -> 6) holds each thread's latest root metadata.
    assert [t["thread_id"] for t in migrated.search_threads(metadata={"run_id": "r2"})] == ["b"]
    assert migrated.count_threads(metadata={"run_id": "r1"}) == 1  # a's latest is r1's
    # The runs' threads were backfilled: a run of both threads goes from both.
    assert _run_rows(path, "r1") == 6
    migrated.delete_for_runs(["r1"])
    assert _run_rows(path, "r1") == 0 and _run_rows(path, "r2") == 4
    assert [e.kind for e in migrated.events_after("a", 0)][-1] == "runs_deleted"
    assert [e.kind for e in migrated.events_after("b", 0)][-1] == "runs_deleted"
    # New rows of a run are found as well (the triggers came with the migration).
    _put_run(migrated, "a", "r3", 1)
    migrated.delete_for_runs(["r3"])
    assert _run_rows(path, "r3") == 0


def test_a_migration_that_fails_changes_nothing(v3_file: tuple[str, dict[str, Any]]) -> None:
    """A user's own table named like the new one stops the migration, cleanly."""
    path, expected = v3_file
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE thread_runs (mine TEXT)")  # extra tables are tolerated
    conn.commit()
    conn.close()
    before = dump(path)
    with pytest.raises(StoreError, match="thread_runs") as exc:
        FencedSqliteSaver(path)
    assert not isinstance(exc.value.__cause__, type(None))  # chained, not swallowed
    assert user_version(path) == 3 and dump(path) == before
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE thread_runs")
    conn.commit()
    conn.close()
    with FencedSqliteSaver(path) as store:
        assert _reads(store) == expected


_KILL_MIDWAY = textwrap.dedent(
    """
    import os, signal, sys
    from langgraph_fenced_sqlite import FencedSqliteSaver
    from langgraph_fenced_sqlite.sqlite import schema

    class KillAfter(tuple):
        # The engine runs a step's statements in order: die after `n` of them.
        def __iter__(self):
            for i, statement in enumerate(tuple.__iter__(self)):
                if i == int(sys.argv[2]):
                    os.kill(os.getpid(), signal.SIGKILL)
                yield statement
            os.kill(os.getpid(), signal.SIGKILL)  # all ran: before user_version and COMMIT

    schema.MIGRATIONS = (*schema.MIGRATIONS[:3], KillAfter(schema.MIGRATIONS[3]))
    FencedSqliteSaver(sys.argv[1])
    """
)


@pytest.mark.subprocess
@pytest.mark.parametrize("done", [2, len(MIGRATIONS[3])])
def test_a_migration_killed_midway_changes_nothing(
    v3_file: tuple[str, dict[str, Any]], done: int
) -> None:
    """kill -9 after some (or all) of the migration's statements, before COMMIT."""
    path, expected = v3_file
    before = dump(path)
    child = subprocess.run(
        [sys.executable, "-c", _KILL_MIDWAY, path, str(done)], capture_output=True, timeout=60
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert os.path.exists(path + "-wal")  # the child had the file open in WAL mode
    assert user_version(path) == 3 and dump(path) == before
    with FencedSqliteSaver(path) as store:
        assert _reads(store) == expected
        assert user_version(path) == SCHEMA_VERSION
        store.delete_for_runs(["r2"])
    assert _run_rows(path, "r2") == 0


def test_a_run_whose_rows_were_pruned_fences_nothing(open_store: Any, db_path: str) -> None:
    """`thread_runs` may name a run whose rows are gone: that thread is not touched."""
    store = open_store()
    _put_run(store, "a", "r1", 2)
    _put_run(store, "a", "r2", 2)
    store.prune(["a"], strategy=RetentionPolicy(max_checkpoints=1))
    assert _run_rows(db_path, "r1") == 0
    conn = sqlite3.connect(db_path)
    assert conn.execute("SELECT run_id FROM thread_runs ORDER BY 1").fetchall() == [
        ("r1",),
        ("r2",),
    ]
    conn.close()
    store.claim("a", "someone", 60)
    before = dump(db_path)
    store.delete_for_runs(["r1"])  # no ThreadBusy: "a" holds nothing of r1 any more
    assert dump(db_path) == before  # and no `runs_deleted` event there


def test_copied_and_replaced_rows_keep_their_run_findable(open_store: Any, db_path: str) -> None:
    """Every path that stores a row of a run records its thread: copies and replaced writes too."""
    store = open_store()
    ids = _put_run(store, "a", "r1", 1)
    store.copy_thread("a", "c")
    # A special-channel write (last writer wins) replaced by another run's.
    config = plain_config("a", checkpoint_id=ids[0])
    store.put_writes({**config, "metadata": {"run_id": "r1"}}, [("__error__", "x")], "t")
    store.put_writes({**config, "metadata": {"run_id": "r9"}}, [("__error__", "y")], "t")
    assert _run_rows(db_path, "r9") == 1
    store.delete_for_runs(["r9"])
    assert _run_rows(db_path, "r9") == 0 and _run_rows(db_path, "r1") == 4  # a and its copy
    store.delete_for_runs(["r1"])
    assert _run_rows(db_path, "r1") == 0
    assert store.get_tuple(plain_config("c")) is None


def test_delete_thread_forgets_its_runs(open_store: Any, db_path: str) -> None:
    store = open_store()
    _put_run(store, "a", "r1", 1)
    _put_run(store, "b", "r1", 1)
    store.delete_thread("a")
    conn = sqlite3.connect(db_path)
    assert conn.execute("SELECT thread_id, run_id FROM thread_runs").fetchall() == [("b", "r1")]
    conn.close()


@pytest.mark.parametrize(
    "trigger",
    ["checkpoints_thread_runs", "writes_thread_runs_update", "checkpoints_thread_tags_delete"],
)
def test_a_file_that_lost_a_trigger_is_refused_unchanged(db_path: str, trigger: str) -> None:
    """Without its triggers a file would let `delete_for_runs` miss a run's rows."""
    with FencedSqliteSaver(db_path) as store:
        _put_run(store, "a", "r1", 1)
    conn = sqlite3.connect(db_path)
    conn.execute(f"DROP TRIGGER {trigger}")
    conn.commit()
    conn.close()
    before = dump(db_path)
    with pytest.raises(UnsupportedFormat, match=trigger):
        FencedSqliteSaver(db_path)
    assert dump(db_path) == before


def test_a_special_write_replaced_by_its_own_run_commits(open_store: Any, db_path: str) -> None:
    """Found by the model test: the pair's trigger failed such a write with UNIQUE.

    Inside a trigger, SQLite applies the firing statement's conflict policy
    instead of the trigger statement's own: an upsert's DO UPDATE made the
    trigger's `INSERT OR IGNORE` of a pair already there abort the write.
    """
    store = open_store()
    ids = _put_run(store, "a", "r1", 1)
    config = {**plain_config("a", checkpoint_id=ids[0]), "metadata": {"run_id": "r1"}}
    store.put_writes(config, [("__interrupt__", 0), ("__interrupt__", 1)], "ta")
    store.put_writes(config, [("__interrupt__", 2)], "ta")
    tuple_ = store.get_tuple(plain_config("a", checkpoint_id=ids[0]))
    assert tuple_ is not None and ("ta", "__interrupt__", 2) in tuple_.pending_writes
    store.delete_for_runs(["r1"])
    assert _run_rows(db_path, "r1") == 0
