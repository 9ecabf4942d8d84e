"""Database files: read a file's whole state, make older or shared files, reseal rows.

`dump` is the one fingerprint of a file (every row of every table) that tests
compare before and after a call; `read_bytes` the file's bytes. `file_fixtures`
makes a module's shared file and a private copy per test; `make_v3_file`
writes an older (version 3) file. `reseal` gives planted rows valid checksums.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable
from typing import Any

import pytest

from langgraph_fenced_sqlite.core.checksums import checkpoint_checksum, checksum, write_checksum
from langgraph_fenced_sqlite.core.slices import SLICE, open_slice
from langgraph_fenced_sqlite.sqlite import schema
from langgraph_fenced_sqlite.sqlite.checkpoints import FULL_CELLS, resolved
from langgraph_fenced_sqlite.sqlite.schema import _CHECKPOINT_COLUMNS, CHECKSUM_FUNCTION, MIGRATIONS


def dump(path: str) -> dict[str, list[Any]]:
    """Read every row of every table of a database file, read-only."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in tables}
    finally:
        conn.close()


def schema_dump(path: str) -> list[Any]:
    """A file's schema: every object's SQL, `user_version`, `application_id`, the `meta` rows."""
    conn = sqlite3.connect(path)
    try:
        rows: list[Any] = list(conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY 2"))
        rows.append(conn.execute("PRAGMA user_version").fetchone())
        rows.append(conn.execute("PRAGMA application_id").fetchone())
        rows.extend(conn.execute("SELECT * FROM meta ORDER BY key"))
        return rows
    finally:
        conn.close()


def read_bytes(path: str) -> bytes:
    """Return a file's bytes."""
    with open(path, "rb") as f:
        return f.read()


def user_version(path: str) -> int:
    """Return a file's `PRAGMA user_version` (its schema version), read-only."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


def import_twice_changes_nothing(run_import: Any, dest: str) -> None:
    """Run an importer into the store of file `dest` twice: the rerun reports the same
    and leaves every row as the first left it (events and counters included)."""
    first = run_import()
    rows = dump(dest)
    assert run_import() == first
    assert dump(dest) == rows


def reseal(conn: Any) -> None:
    """Give every row of a plain sqlite3 connection's file a valid checksum again.

    For tests that plant a hostile row on purpose and test what lies behind
    the checksum (a forger who knows the format recomputes it).
    """
    conn.create_function(schema.CHECKSUM_FUNCTION, -1, checksum, deterministic=True)
    for statement in schema.BACKFILL_CHECKSUMS:
        conn.execute(statement)
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'blobs'").fetchone():
        # `checksums.blob_checksum`'s cells, in its order.
        conn.execute(
            f"UPDATE blobs SET checksum = {schema.CHECKSUM_FUNCTION}(channel, key, base, type, "
            "count, ordinal, codec, size, data)"
        )


def file_fixtures(
    make: Callable[[str], None], master: str, copy: str, filename: str
) -> tuple[Any, Any]:
    """Return two fixtures: `master`, a file `make` writes once per module, and `copy`.

    `master` is for read-only use (under pytest-xdist it is made once per
    worker that runs the module, in that worker's own temporary directory);
    `copy` gives each test a private copy of it to change. Assign both in the
    test module, under the names given: `ops_master, ops = file_fixtures(...)`.
    """

    def made(tmp_path_factory: pytest.TempPathFactory) -> str:
        path = str(tmp_path_factory.mktemp(master) / filename)
        make(path)
        return path

    def copied(request: pytest.FixtureRequest, tmp_path: Any) -> str:
        path = str(tmp_path / filename)
        shutil.copyfile(request.getfixturevalue(master), path)
        return path

    made.__doc__ = f"The file `{make.__name__}` writes, made once (read-only use)."
    copied.__doc__ = f"A private copy of `{master}`, to change."
    return (
        pytest.fixture(scope="module", name=master)(made),
        pytest.fixture(name=copy)(copied),
    )


# The tables of a version-3 file (before `thread_runs`), for `make_v3_file`.
_V3_TABLES = ("meta", "threads", "checkpoints", "writes", "events")


def inline_values(conn: sqlite3.Connection, source: str, *, checksums: bool = True) -> None:
    """Give `conn`'s checkpoints (copied from `source`) their values inline, as before schema 5.

    Files before the value table held every checkpoint's values in its row;
    the current code writes `{channel: key}` there instead. `checksums`:
    the target's rows have a checksum column (schema 2 on), resealed.
    """
    src = sqlite3.connect(source)
    try:
        rows = src.execute(f"SELECT {_CHECKPOINT_COLUMNS} FROM checkpoints").fetchall()
        for r in resolved(src, rows, FULL_CELLS):
            sets = "values_type = ?, values_blob = ?" + (", checksum = ?" if checksums else "")
            # A rebuilt row's checksum cell says it was checked (`REBUILT`): sealed here.
            seal = checkpoint_checksum(r[4], r[5], r[6], r[7])
            cells = (r[5], r[6], seal) if checksums else (r[5], r[6])
            conn.execute(
                f"UPDATE main.checkpoints SET {sets} "
                "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
                (*cells, r[0], r[1], r[2]),
            )
            # Its writes stored as slices of its values, whole: those files held no slice.
            for task_id, idx, channel, cell in src.execute(
                "SELECT task_id, idx, channel, blob FROM writes WHERE thread_id = ? "
                "AND checkpoint_ns = ? AND checkpoint_id = ? AND type = ?",
                (r[0], r[1], r[2], SLICE),
            ).fetchall():
                data = open_slice(r[5], r[6], cell)
                sets = "type = 'msgpack', blob = ?" + (", checksum = ?" if checksums else "")
                cells = (data, write_checksum(channel, "msgpack", data)) if checksums else (data,)
                conn.execute(
                    f"UPDATE main.writes SET {sets} WHERE thread_id = ? AND checkpoint_ns = ? "
                    "AND checkpoint_id = ? AND task_id = ? AND idx = ?",
                    (*cells, r[0], r[1], r[2], task_id, idx),
                )
    finally:
        src.close()


def make_v3_file(source: str, target: str) -> None:
    """Write `target` as a version-3 file holding `source`'s rows (WAL, as a store leaves it).

    Built from `MIGRATIONS[:3]` with the cells the current code writes (their
    encoding did not change since), as a version-3 store left them: an older
    file, for the tests of what migrates it and what must not.
    """
    conn = sqlite3.connect(target, isolation_level=None)
    conn.create_function(CHECKSUM_FUNCTION, -1, checksum, deterministic=True)
    conn.execute("PRAGMA journal_mode=wal")
    conn.execute("BEGIN")
    for step in MIGRATIONS[:3]:
        for statement in step:
            conn.execute(statement)
    conn.execute("PRAGMA application_id = 1279739475")
    conn.execute("PRAGMA user_version = 3")
    conn.execute("ATTACH DATABASE ? AS src", (source,))
    for table in _V3_TABLES:
        names = ", ".join(r[1] for r in conn.execute(f"PRAGMA main.table_info({table})"))
        conn.execute(f"DELETE FROM main.{table}")
        conn.execute(f"INSERT INTO main.{table} ({names}) SELECT {names} FROM src.{table}")
    inline_values(conn, source)
    conn.execute("COMMIT")
    conn.execute("DETACH DATABASE src")
    conn.close()
