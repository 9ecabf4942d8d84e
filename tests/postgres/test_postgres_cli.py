"""`lgfs --db postgresql://...`: every command on a PostgreSQL store, as on a file.

The same runs, written into both stores, give the same documents (ids and
times aside) and exit codes: the reads through the real `lgfs` in a
subprocess; the commands that change a store one after another on both,
through `main()` in this process (a subprocess per command would cost a
second each); `events --follow` in a real process woken by another's commit
and stopped by SIGINT. `doctor` checks what a PostgreSQL store has (schema
version, every row), `vacuum` is the store's plain VACUUM, and `copy-to` refuses a URL.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import psycopg.conninfo
import pytest
from support.graphs import same_ids, write_threads
from support.processes import lgfs, parsed, start

from langgraph_fenced_sqlite import FencedSqliteSaver, ManualClock, RetentionPolicy
from langgraph_fenced_sqlite.cli.stores import redacted
from langgraph_fenced_sqlite.postgres import FencedPostgresSaver, sql
from langgraph_fenced_sqlite.testing._helpers import plain_config, values_checkpoint

# The exit codes the tests expect (cli_io.EXIT_CODES documents them).
PROBLEM, USAGE, NOT_FOUND, REFUSED, BUSY, NO_YES, STORE_ERROR = 1, 2, 3, 4, 5, 6, 7


def as_url(dsn: str) -> str:
    """Write a libpq key=value DSN (the test server's) as the `postgresql://` URL users pass."""
    d = psycopg.conninfo.conninfo_to_dict(dsn)
    query = f"?options={quote(str(d['options']))}" if d.get("options") else ""
    return f"postgresql://{d['user']}@{d['host']}:{d['port']}/{d['dbname']}{query}"


@pytest.fixture(scope="module")
def stores(pg_server: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    """The same runs in a file and in PostgreSQL (both by the real clock): (path, url, dsn)."""
    path = str(tmp_path_factory.mktemp("cli") / "ops.db")
    dsn = pg_server.fresh_dsn()
    with FencedSqliteSaver(path) as sqlite:
        write_threads(sqlite, ManualClock())  # the clock only says how far to move: not used
    with FencedPostgresSaver.from_conn_string(dsn) as pg:
        pg.setup()
        write_threads(pg, ManualClock())
    return path, as_url(dsn), dsn


def _json(*args: str) -> Any:
    return parsed(lgfs(*args, "--json"))


def _threads(doc: Any) -> Any:
    return {
        t["thread_id"]: (
            t["status"]["state"],
            t["status"]["node"],
            t["status"]["reason"],
            t["checkpoints"],
            len(t["namespaces"]),
            t["latest_step"],
            t["events"],
            t["floor"],
            t["next_seq"],
            (t["claim"] or {}).get("holder"),
            (t["claim"] or {}).get("live"),
        )
        for t in doc
    }


def _history(doc: Any) -> Any:
    return [(r["step"], r["source"], r["token"], r["run_id"] is not None) for r in doc]


def _show(doc: Any) -> Any:
    writes = [(w["channel"], w["task_path"], w["error"]) for w in doc["writes"]]
    return same_ids([doc["values"], doc["step"], doc["source"], doc["error"], writes])


def _events(doc: Any) -> Any:
    # LangGraph may commit a step's writes and the next checkpoint in either
    # order, so only the seqs and what was logged, not its order, must agree.
    return [e["seq"] for e in doc], sorted((e["kind"], e["token"]) for e in doc)


READS = [
    (("threads",), _threads),
    (("threads", "--status", "failed"), _threads),
    (("history", "waiting"), _history),
    (("history", "waiting", "--limit", "2"), _history),
    (("history", "done", "--ns", "sub"), _history),
    (("show", "waiting"), _show),
    (("show", "done", "--ns", "sub"), _show),
    (("diff", "done"), lambda d: same_ids(d["changes"])),
    (("events", "broken"), _events),
    (("events", "waiting"), _events),
]


@pytest.mark.subprocess
@pytest.mark.parametrize(("args", "project"), READS, ids=[" ".join(a) for a, _ in READS])
def test_a_read_command_gives_the_files_document(
    stores: tuple[str, str, str], args: tuple[str, ...], project: Any
) -> None:
    """`--json` on PostgreSQL gives what it gives on a file holding the same runs."""
    path, url, _ = stores
    expected = project(_json(*args, "--db", path))
    got = project(_json(*args, "--db", url))
    assert got == expected
    assert got  # not two empty answers


@pytest.mark.subprocess
def test_events_filters_pick_from_the_stores_own_log(stores: tuple[str, str, str]) -> None:
    """`--after` and `--kind` pick from the log what a reader filtering it would.

    Checked against each store's own whole log, not across stores: where a
    step's writes and its checkpoint land, and so which seqs come after 10,
    depends on the order LangGraph's commits happen to take (the file's run
    once logged checkpoints at 11 and 13, PostgreSQL's only at 13).
    """
    path, url, _ = stores
    for db in (path, url):
        whole = _json("events", "waiting", "--db", db)
        picked = _json("events", "waiting", "--after", "10", "--kind", "checkpoint", "--db", db)
        assert picked == [e for e in whole if e["seq"] > 10 and e["kind"] == "checkpoint"], db
        assert picked  # the filter is not vacuous


@pytest.mark.subprocess
def test_the_text_views_read_postgresql(stores: tuple[str, str, str]) -> None:
    """The human-readable views print the threads, the waiting interrupt and the failure."""
    _, url, _ = stores
    said = {}
    for args in (("threads",), ("show", "waiting"), ("history", "broken"), ("events", "broken")):
        done = lgfs(*args, "--db", url)
        assert done.returncode == 0 and done.stderr == "", (args, done.stderr)
        said[args[0]] = done.stdout
    assert "interrupted at ask" in said["threads"] and "running (worker-9" in said["threads"]
    assert 'waiting at ask: "approve?"' in said["show"]
    assert "input" in said["history"] and "run_failed" in said["events"]
    by_env = lgfs("threads", "--json", env={"LGFS_PATH": url})  # the URL from $LGFS_PATH
    assert by_env.returncode == 0, by_env.stderr
    assert _threads(json.loads(by_env.stdout)) == _threads(_json("threads", "--db", url))


@pytest.mark.subprocess
def test_a_missing_thread_and_a_failed_connection_are_the_files_errors(
    stores: tuple[str, str, str], pg_server: Any
) -> None:
    """`thread_not_found` as on a file; an unreachable database is a store error.

    A database never set up is refused by a read command (which opens the
    store read-only) as a file that is not ours: exit 4, nothing created.
    """
    path, url, _ = stores
    on_file = lgfs("show", "nobody", "--db", path, "--json")
    on_pg = lgfs("show", "nobody", "--db", url, "--json")
    assert on_pg.returncode == on_file.returncode == NOT_FOUND
    assert json.loads(on_pg.stderr)["code"] == json.loads(on_file.stderr)["code"]
    unreachable = lgfs("threads", "--db", "postgresql://lgfs:hunter2@127.0.0.1:1/db")
    # libpq quotes a malformed URL whole in its error: the password must not show.
    malformed = lgfs("claims", "--db", "postgresql://lgfs:hunter2@[::1/db")
    bare = pg_server.fresh_dsn()
    empty = lgfs("threads", "--db", as_url(bare), "--json")  # no setup()
    for done in (unreachable, malformed, empty):
        assert "Traceback" not in done.stderr and done.stdout == ""
    for done in (unreachable, malformed):
        assert done.returncode == STORE_ERROR, done.stderr
        assert "connect failed" in done.stderr and "hunter2" not in done.stderr, done.stderr
    assert "postgresql://lgfs:***@[::1/db" in malformed.stderr
    assert empty.returncode == REFUSED, empty.stderr
    error = json.loads(empty.stderr)
    assert error["code"] == "unsupported_format" and "setup() has not run" in error["message"]
    with psycopg.connect(bare, autocommit=True) as conn:
        assert conn.execute(sql.HAS_MIGRATIONS_TABLE).fetchone() == (False,)


@pytest.fixture
def pair(pg_server: Any, tmp_path: Any) -> tuple[str, str, str]:
    """A file and a PostgreSQL store of one's own holding the same runs: (path, url, dsn)."""
    path, dsn = str(tmp_path / "ops.db"), pg_server.fresh_dsn()
    with FencedSqliteSaver(path) as sqlite:
        write_threads(sqlite, ManualClock())
    with FencedPostgresSaver.from_conn_string(dsn) as pg:
        pg.setup()
        write_threads(pg, ManualClock())
    return path, as_url(dsn), dsn


def _claims(doc: Any) -> Any:
    return [(c["thread_id"], c["holder"], c["token"], c["live"]) for c in doc]


def _taken(doc: Any) -> Any:
    claim, previous = doc["claim"], doc["previous"]
    return doc["operator"], claim["holder"], claim["token"], previous["holder"], previous["token"]


def _released(doc: Any) -> Any:
    return doc["operator"], doc["released"]["holder"], doc["released"]["token"]


class Floors:
    """`same_ids` of a prune's report, with each floor checked against this store's own past.

    Where a prune's floor lands is the kept checkpoint's commit position, and
    that depends on the order in which LangGraph's threads committed a step's
    checkpoint and its tasks' writes: they come from two threads, and under
    load either may commit first, in either store. So two stores given the
    same runs may put the floor one apart (seen: 10 and 11), and every later
    prune of that thread rises from floors one apart too. What must agree
    between the stores is the checkpoints, the writes, and, for a thread no
    prune here moved yet, the floor it rose from (`floor - events_removed`:
    events below a floor are gone, every seq above it is there). For a thread
    an earlier prune moved, each store must rise from exactly where its own
    last prune left the floor (a dry run moves nothing).
    """

    def __init__(self) -> None:
        """No prune seen yet."""
        self.left: dict[str, int] = {}

    def __call__(self, doc: Any, dry_run: bool = False) -> Any:
        """Return the projection of `doc` to compare between the stores."""
        if isinstance(doc, list):
            return [self(x, dry_run) for x in doc]
        if isinstance(doc, dict):
            dry_run = doc.get("dry_run", dry_run)
            if "floor" in doc and "events_removed" in doc:
                rest = {k: v for k, v in doc.items() if k not in ("floor", "events_removed")}
                rose_from: Any = doc["floor"] - doc["events_removed"]
                thread = doc["thread_id"]
                if thread in self.left:
                    assert rose_from == self.left[thread], (doc, self.left[thread])
                    rose_from = "where this store's last prune left it"
                if not dry_run:
                    self.left[thread] = doc["floor"]
                return {**same_ids(rest), "floor_before": rose_from}
            return {k: self(v, dry_run) for k, v in doc.items()}
        return same_ids(doc)


def _threads_pruned(doc: Any) -> Any:
    """`_threads` after a prune: a floor may differ by one (see `Floors`); the log it
    leaves may not, so each thread holds every seq from its floor up to its next seq."""
    for t in doc:
        assert t["events"] == t["next_seq"] - t["floor"], t
        t["floor"] = t["events"] = None
    return _threads(doc)


# Commands that change a store, in order, each with what must agree between
# the stores: the exit code, and the JSON document's projection (None: the
# error's code), or the text printed (`str`). Token numbers agree too: both
# stores were given the same claims in the same order.
def _pruned(doc: Any) -> Any:
    """Marks a prune's report: the loop compares it through each store's own `Floors`."""
    raise AssertionError("compared through Floors, never called")


CHANGES: list[tuple[tuple[str, ...], int, Callable[[Any], Any] | None]] = [
    (("claims", "--json"), 0, _claims),
    (("runs", "cancel", "busy", "--by", "ops", "--json"), 0, lambda d: d),
    (("claims", "release", "busy", "--json"), NO_YES, None),  # no --yes: nothing changes
    (("delete", "busy", "--yes", "--json"), BUSY, None),  # worker-9's claim is live
    (("claims", "take-over", "busy", "--yes", "--operator", "ops", "--json"), 0, _taken),
    (("retract", "busy", "--yes", "--json"), BUSY, None),  # now held by ops
    (("claims", "release", "busy", "--yes", "--operator", "ops", "--json"), 0, _released),
    (("compact", "done", "--before", "3", "--yes"), 0, str),
    (("compact", "nobody", "--before", "3", "--yes", "--json"), NOT_FOUND, None),
    (("prune", "waiting", "--keep", "1", "--yes", "--json"), 0, _pruned),
    (("prune", "--all", "--keep", "2", "--dry-run", "--json"), 0, _pruned),
    (("prune", "--all", "--keep", "2", "--json"), NO_YES, None),
    (("retract", "done", "--yes", "--json"), 0, same_ids),
    (("delete", "plain", "--yes"), 0, str),
    (("threads", "--json"), 0, _threads_pruned),
    (("events", "busy", "--json"), 0, _events),
    (("claims", "--json"), 0, _claims),
]


@pytest.mark.subprocess
def test_the_commands_that_change_a_store_change_postgresql_as_a_file(
    pair: tuple[str, str, str], cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """Claims, cancel, compact, prune, retract and delete: the same codes and documents."""
    path, url, _ = pair
    floors = {"file": Floors(), "pg": Floors()}  # each store's prunes, in turn
    for args, code, project in CHANGES:
        on_file, on_pg = cli(*args, "--db", path), cli(*args, "--db", url)
        assert on_file.returncode == code, (args, on_file.stderr)
        assert on_pg.returncode == code, (args, on_pg.stderr)
        if project is None:  # one error line, of the same code, and nothing printed
            assert on_pg.stdout == on_file.stdout == ""
            assert json.loads(on_pg.stderr)["code"] == json.loads(on_file.stderr)["code"]
        elif project is str:
            assert on_pg.stdout == on_file.stdout and on_pg.stderr == on_file.stderr == ""
        else:
            pg_project, file_project = (
                (floors["pg"], floors["file"]) if project is _pruned else (project, project)
            )
            got = pg_project(json.loads(on_pg.stdout))
            expected = file_project(json.loads(on_file.stdout))
            assert got == expected, args
            assert got or args[0] == "claims"  # the last `claims`: none left


def _damage(dsn: str) -> None:
    """Change one checkpoint, one write and one event of `waiting` behind the store's back."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in ("lgfs_checkpoints", "lgfs_writes", "lgfs_events"):
            conn.execute(
                f"UPDATE {table} SET checksum = checksum + 1 WHERE ctid = "  # noqa: S608
                f"(SELECT ctid FROM {table} WHERE thread_id = 'waiting' LIMIT 1)"
            )


@pytest.mark.subprocess
def test_doctor_reads_back_every_row_of_a_postgresql_store(
    stores: tuple[str, str, str],
    pg_server: Any,
    cli: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """Schema version and every row (checksum, decoding) checked; damage and no schema: exit 1.

    A PostgreSQL store has no file, pragmas or integrity_check: the doctor
    does not pretend to check them. It reads every row as the readers do, and
    one damaged row does not stop it.
    """
    _, url, dsn = stores
    with FencedPostgresSaver.from_conn_string(dsn) as pg:
        counts = {k: v for k, v in pg.stats().items() if k in ("checkpoints", "writes", "events")}
        claims = len(pg.claims())
    healthy = cli("doctor", "--db", url, "--json")
    assert healthy.returncode == 0, healthy.stderr
    doc = json.loads(healthy.stdout)
    assert doc["ok"] and doc["problems"] == [] and doc["rows_read"] == counts
    assert doc["claims"] == claims >= 1 and doc["live_claims"] >= 1  # worker-9's on `busy`
    assert "integrity" not in doc and "wal_bytes" not in doc

    copy = pg_server.fresh_dsn()  # damage a copy, not the module's store
    with FencedPostgresSaver.from_conn_string(dsn) as src:
        with FencedPostgresSaver.from_conn_string(copy) as dst:
            from langgraph_fenced_sqlite.tools.transfer import copy_threads

            dst.setup()
            copy_threads(src, dst, ["waiting", "done"])
    _damage(copy)
    damaged = cli("doctor", "--db", as_url(copy))
    assert damaged.returncode == PROBLEM and damaged.stderr == ""
    lines = dict(line.split(None, 1) for line in damaged.stdout.splitlines() if " " in line)
    assert lines["rows"].startswith("FAILED (3 do not decode)"), damaged.stdout
    assert "checksum" in lines["status"] and "(and 2 more)" in lines["status"]
    assert "wal" not in damaged.stdout and "integrity" not in damaged.stdout
    with psycopg.connect(copy, autocommit=True) as conn:  # as if made by an older version
        conn.execute("DELETE FROM lgfs_migrations WHERE v = (SELECT max(v) FROM lgfs_migrations)")
    older = cli("doctor", "--db", as_url(copy))
    assert older.returncode == PROBLEM and older.stderr == "", older.stderr
    assert "is older than" in older.stdout and "rows" not in older.stdout  # its rows unread

    empty = as_url(pg_server.fresh_dsn())
    bare = cli("doctor", "--db", empty, "--json")
    assert bare.returncode == PROBLEM, bare.stderr
    assert json.loads(bare.stdout)["problems"] == [
        "no langgraph-fenced-sqlite schema in this database: run setup() first"
    ]
    # A writing command checks the schema first, as a read does: refused, nothing created.
    written = cli("delete", "nobody", "--yes", "--db", empty, "--json")
    assert written.returncode == REFUSED, written.stderr
    error = json.loads(written.stderr)
    assert error["code"] == "unsupported_format" and "setup() has not run" in error["message"]
    assert cli("doctor", "--db", empty).returncode == PROBLEM  # still no schema


@pytest.mark.subprocess
def _late_writes_after_a_prune(saver: Any) -> tuple[str, str]:
    """Prune `plain` to its latest checkpoint, then write for a removed one, as a slow task would.

    Returns the removed checkpoint's id and the id of the next checkpoint,
    which is not put yet: until it is, the late writes are newer than the
    latest checkpoint and may belong to a step in flight (not orphans).
    """
    (pruned,) = saver.prune(["plain"], strategy=RetentionPolicy(max_checkpoints=1))
    gone = sorted(cid for ns, cid in pruned.checkpoints if ns == "")[0]
    saver.put_writes(plain_config("plain", checkpoint_id=gone), [("a", 1), ("b", 2)], "slow")
    latest = saver.get_tuple(plain_config("plain"))
    return gone, latest.config["configurable"]["checkpoint_id"]


@pytest.mark.subprocess
def test_doctor_counts_orphan_writes_on_postgresql_as_on_a_file(
    pair: tuple[str, str, str], cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """Writes whose checkpoint is gone, older than the latest: counted alike, not a problem.

    They are what the next prune of their thread removes (space, not
    damage), so the doctor reports how many there are and stays ok.
    """
    path, url, dsn = pair
    with FencedSqliteSaver(path) as sqlite, FencedPostgresSaver.from_conn_string(dsn) as pg:
        parents = {}
        for saver in (sqlite, pg):
            _, parents[saver] = _late_writes_after_a_prune(saver)
        for where in (path, url):  # in flight: not orphans yet
            assert json.loads(cli("doctor", "--db", where, "--json").stdout)["orphan_writes"] == 0
        for saver in (sqlite, pg):  # the next step commits: now they are
            config = plain_config("plain", checkpoint_id=parents[saver])
            meta = {"source": "loop", "step": 99, "parents": {}}
            saver.put(config, values_checkpoint({"n": 1}), meta, {})
        docs = {}
        for where in (path, url):
            done = cli("doctor", "--db", where, "--json")
            assert done.returncode == 0 and done.stderr == "", done.stderr
            docs[where] = json.loads(done.stdout)
            assert docs[where]["ok"] and docs[where]["problems"] == []
            text = cli("doctor", "--db", where)
            assert "orphan writes   2 (prune removes them)\n" in text.stdout, text.stdout
        assert docs[path]["orphan_writes"] == docs[url]["orphan_writes"] == 2
    for where in (path, url):  # orphans alone are worth a prune (it skipped them before)
        keep = ("plain", "--keep", "2", "--db", where)  # both checkpoints stay
        dry = cli("prune", *keep, "--dry-run")
        assert dry.stdout.startswith("plain: would remove 0 checkpoints, 0 events, 2 writes ("), (
            dry.stdout
        )
        asked = cli("prune", *keep)
        assert asked.returncode == NO_YES and "0 events and 2 writes" in asked.stderr
        (done,) = json.loads(cli("prune", *keep, "--yes", "--json").stdout)
        assert (done["checkpoints"], done["writes_removed"]) == ([], 2)
    for where in (path, url):
        assert json.loads(cli("doctor", "--db", where, "--json").stdout)["orphan_writes"] == 0


def _schema_version(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return int(conn.execute("SELECT max(v) FROM lgfs_migrations").fetchone()[0])


def _older_store(pg_server: Any) -> tuple[str, str]:
    """A store with threads, recorded one schema version back (as if the older version made it).

    Returns its DSN and its URL.
    """
    dsn = pg_server.fresh_dsn()
    with FencedPostgresSaver.from_conn_string(dsn) as pg:
        pg.setup()
        write_threads(pg, ManualClock())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM lgfs_migrations WHERE v = %s", (sql.SCHEMA_VERSION,))
    return dsn, as_url(dsn)


@pytest.mark.subprocess
def test_read_commands_refuse_an_older_schema_unchanged_and_migrate_upgrades_it(
    pg_server: Any, cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """As on a file: a read never migrates; it names `lgfs migrate`, which does.

    The database is left at its version, though this version's reads might
    happen to work on it: what an older schema lacks is not checked column by
    column, and processes of the older version would refuse it once migrated.
    """
    dsn, url = _older_store(pg_server)
    older = sql.SCHEMA_VERSION - 1
    reads = (["threads"], ["history", "done"], ["show", "done"], ["diff", "done"])
    for command in (*reads, ["events", "done"], ["claims"]):
        run = lgfs if command == ["threads"] else cli  # one for real, in a process of its own
        done = run(*command, "--db", url)
        assert done.returncode == REFUSED, (command, done.stderr)
        assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
        assert f"schema version {older} needs migrating to {sql.SCHEMA_VERSION}" in done.stderr
        assert "lgfs migrate" in done.stderr and "Traceback" not in done.stderr
        error = json.loads(cli(*command, "--db", url, "--json").stderr)
        assert error["code"] == "schema_too_old"
        assert (error["version"], error["current"]) == (older, sql.SCHEMA_VERSION)
        assert _schema_version(dsn) == older, command
    doctor = cli("doctor", "--db", url, "--json")
    assert doctor.returncode == PROBLEM and json.loads(doctor.stdout)["problems"] == [
        f"schema version {older} is older than {sql.SCHEMA_VERSION}: run `lgfs migrate`"
    ]
    assert _schema_version(dsn) == older

    migrated = lgfs("migrate", "--db", url)
    assert migrated.returncode == 0, migrated.stderr
    says = f"{redacted(url)}: migrated schema version {older} -> {sql.SCHEMA_VERSION}\n"
    assert migrated.stdout == says
    assert _schema_version(dsn) == sql.SCHEMA_VERSION
    threads = json.loads(cli("threads", "--db", url, "--json").stdout)
    assert {t["thread_id"] for t in threads} >= {"done", "waiting", "busy"}
    again = json.loads(cli("migrate", "--db", url, "--json").stdout)
    assert (again["migrated"], again["schema_version"]) == (False, sql.SCHEMA_VERSION)
    bare = as_url(pg_server.fresh_dsn())  # never set up: migrate creates nothing either
    refused = cli("migrate", "--db", bare)
    assert refused.returncode == REFUSED and "setup() has not run" in refused.stderr


def _rows(dsn: str) -> list[Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = ("lgfs_threads", "lgfs_checkpoints", "lgfs_writes", "lgfs_events")
        return [conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in tables]


@pytest.mark.subprocess
def test_commands_that_write_refuse_an_older_schema_unchanged(
    pg_server: Any, cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """As on a file: only `lgfs migrate` upgrades; a writing command refuses, changing nothing.

    Before, a writing command ran against the older schema as it found it
    (a PostgreSQL store is never set up by opening it).
    """
    dsn, url = _older_store(pg_server)
    older, rows = sql.SCHEMA_VERSION - 1, _rows(dsn)
    commands = (
        ["prune", "done", "--keep", "1", "--dry-run"],
        ["prune", "done", "--keep", "1", "--yes"],
        ["compact", "done", "--before", "2", "--yes"],
        ["retract", "done", "--yes"],
        ["delete", "done", "--yes"],
        ["claims", "release", "busy", "--yes"],
    )
    for command in commands:
        done = cli(*command, "--db", url)
        assert done.returncode == REFUSED, (command, done.stderr)
        assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
        says = f"schema version {older} needs migrating to {sql.SCHEMA_VERSION}, left unchanged"
        assert says in done.stderr and "lgfs migrate" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and "hunter2" not in done.stderr
        assert _schema_version(dsn) == older and _rows(dsn) == rows, command


def test_copy_to_refuses_a_postgresql_url_changing_nothing(
    stores: tuple[str, str, str], cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """`copy-to` needs a file as its source: it says so (a usage error); nothing changes."""
    _, url, dsn = stores
    with FencedPostgresSaver.from_conn_string(dsn) as pg:
        before = pg.stats()
        done = cli("copy-to", "postgresql://x@127.0.0.1:1/x", "--db", url)
        assert done.returncode == USAGE and "source is" in done.stderr, done.stderr
        assert pg.stats() == before


@pytest.mark.subprocess
def test_vacuum_runs_on_a_postgresql_store_and_prints_its_bytes(
    pair: tuple[str, str, str], cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """`lgfs vacuum --db postgresql://...` is the store's plain VACUUM: the file's document."""
    path, url, dsn = pair
    on_file, on_pg = (
        cli("vacuum", "--force", "--json", "--db", path),
        cli("vacuum", "--json", "--db", url),
    )
    assert on_file.returncode == on_pg.returncode == 0, on_pg.stderr
    file_doc, pg_doc = json.loads(on_file.stdout), json.loads(on_pg.stdout)
    assert set(pg_doc) == set(file_doc)
    assert pg_doc["bytes_before"] > 0 and pg_doc["bytes_after"] > 0
    assert pg_doc["bytes_reclaimed"] == pg_doc["bytes_before"] - pg_doc["bytes_after"]
    assert pg_doc["path"].startswith("postgresql://") and "@" not in pg_doc["path"]  # no user
    with FencedPostgresSaver.from_conn_string(dsn) as pg:
        assert pg.history("done")  # nothing a reader sees changed


_WRITER = """
import sys
from langgraph_fenced_sqlite.postgres import FencedPostgresSaver
with FencedPostgresSaver.from_conn_string(sys.argv[1]) as pg:
    claim = pg.claim("later", "writer", 60)
    pg.append_events("later", claim.token, [("note", {"from": "another process"})])
"""


@pytest.mark.subprocess
def test_events_follow_prints_another_process_commit_and_ends_with_0_on_sigint(
    stores: tuple[str, str, str],
) -> None:
    """`events --follow` on a thread not there yet wakes for another process's event; Ctrl-C: 0."""
    _, url, dsn = stores
    argv = ["events", "later", "--follow", "--db", url, "--nl"]
    with start([sys.executable, "-m", "langgraph_fenced_sqlite", *argv]) as follower:
        # If it never prints, kill it: the readline below then ends (no hung test).
        guard = threading.Timer(60, follower.kill)
        guard.start()
        try:
            writer = subprocess.run(
                [sys.executable, "-c", _WRITER, dsn], capture_output=True, text=True, timeout=60
            )
            assert writer.returncode == 0, writer.stderr
            assert follower.stdout is not None
            line = follower.stdout.readline()  # blocks until the follower prints
            assert line, follower.communicate()[1]
            event = json.loads(line)
            assert (event["kind"], event["data"], event["seq"]) == (
                "note",
                {"from": "another process"},
                1,
            )
            follower.send_signal(signal.SIGINT)
            _, err = follower.communicate(timeout=30)
        finally:
            guard.cancel()
            if follower.poll() is None:
                follower.kill()
    assert follower.returncode == 0, err
    assert err == ""


@pytest.mark.subprocess
def test_import_sqlitesaver_into_a_set_up_postgresql_store_as_into_a_file(
    pg_server: Any, tmp_path: Any, cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """DEST may be a PostgreSQL URL: the same report as into a file; never set up there."""
    from langgraph.checkpoint.sqlite import SqliteSaver
    from support.configs import config
    from support.graphs import build_ops_graph

    src = str(tmp_path / "langgraph.db")
    with SqliteSaver.from_conn_string(src) as saver:
        build_ops_graph(saver).invoke({"count": 0}, config("t1"))
    dsn, bare = pg_server.fresh_dsn(), as_url(pg_server.fresh_dsn())
    with FencedPostgresSaver.from_conn_string(dsn) as pg:
        pg.setup()
    into_file = cli("import-sqlitesaver", src, str(tmp_path / "fenced.db"), "--json")
    into_pg = cli("import-sqlitesaver", src, as_url(dsn), "--json")
    assert into_file.returncode == into_pg.returncode == 0, into_pg.stderr
    counts = ("threads", "checkpoints", "writes", "skipped")
    expected = {k: v for k, v in json.loads(into_file.stdout).items() if k in counts}
    assert {k: v for k, v in json.loads(into_pg.stdout).items() if k in counts} == expected
    assert expected["threads"] == 1 and expected["checkpoints"] > 0
    refused = cli("import-sqlitesaver", src, bare)  # no schema there: refused, not created
    assert refused.returncode == REFUSED and "setup() has not run" in refused.stderr
    assert cli("doctor", "--db", bare).returncode == PROBLEM  # still no schema
    backwards = cli("import-sqlitesaver", "postgresql://lgfs:hunter2@127.0.0.1:1/x", src)
    assert backwards.returncode == USAGE and "SRC is a LangGraph SqliteSaver file" in (
        backwards.stderr
    )
    assert "hunter2" not in backwards.stderr


@pytest.mark.subprocess
def test_prune_takes_a_url_first_argument_as_the_store_even_with_lgfs_path_set(
    stores: tuple[str, str, str],
    cli: Callable[..., subprocess.CompletedProcess[str]],
    monkeypatch: Any,
) -> None:
    """`prune URL THREAD` with `$LGFS_PATH` naming another store: the URL is the store.

    (For `prune`, a first argument that is not an existing file is a thread
    when `$LGFS_PATH` is set; a URL is never a file, so it was taken for one.)
    """
    path, url, _ = stores
    args = ("waiting", "--keep", "1", "--dry-run", "--json")
    expected = json.loads(cli("prune", *args, "--db", url).stdout)
    monkeypatch.setenv("LGFS_PATH", path)
    done = cli("prune", url, *args)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == expected and expected[0]["thread_id"] == "waiting"
