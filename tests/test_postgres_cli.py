"""`lgfs --db postgresql://...`: the read-only commands on a PostgreSQL store.

`threads`, `history`, `show`, `diff` and `events` (without `--follow`) read
a PostgreSQL store as they read a file: the same runs, written into both,
give the same documents (ids and times aside). Every other command refuses
the URL with a usage error and changes nothing. All through the real `lgfs`
in a subprocess.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import psycopg.conninfo
import pytest
from _ops import lgfs, same_ids, write_threads

from langgraph_fenced_sqlite import FencedSqliteSaver, ManualClock
from langgraph_fenced_sqlite.cli_pg import PG_COMMANDS
from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

# The exit codes the tests expect (cli_io.EXIT_CODES documents them).
USAGE, NOT_FOUND, STORE_ERROR = 2, 3, 7


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
    done = lgfs(*args, "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return json.loads(done.stdout)


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
    (("events", "waiting", "--after", "10", "--kind", "checkpoint"), _events),
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


def _held(pg: FencedPostgresSaver) -> Any:
    """What the store holds, without the times that pass (`expires_in`)."""
    threads = [
        (t["thread_id"], t["checkpoints"], t["events"], t["next_seq"], t["claim"])
        for t in pg.threads()
    ]
    return threads, pg.stats()


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "args",
    [
        ("delete", "done", "--yes"),
        ("retract", "done", "--yes"),
        ("prune", "done", "--keep", "1", "--yes"),
        ("claims",),
        ("runs", "cancel", "busy"),
        ("events", "done", "--follow"),
    ],
    ids=lambda a: " ".join(a),
)
def test_other_commands_refuse_a_postgresql_url_changing_nothing(
    stores: tuple[str, str, str], args: tuple[str, ...]
) -> None:
    """A command that does not read PostgreSQL yet says so (a usage error); nothing changes."""
    _, url, dsn = stores
    with FencedPostgresSaver.from_conn_string(dsn) as pg:
        before = _held(pg)
        done = lgfs(*args, "--db", url)
        assert done.returncode == USAGE, done.stderr
        assert "not available on a PostgreSQL store yet" in done.stderr
        assert all(c in done.stderr for c in PG_COMMANDS) and "Traceback" not in done.stderr
        assert _held(pg) == before


@pytest.mark.subprocess
def test_a_missing_thread_and_a_failed_connection_are_the_files_errors(
    stores: tuple[str, str, str], pg_server: Any
) -> None:
    """`thread_not_found` as on a file; an unreachable or empty database is a store error."""
    path, url, _ = stores
    on_file = lgfs("show", "nobody", "--db", path, "--json")
    on_pg = lgfs("show", "nobody", "--db", url, "--json")
    assert on_pg.returncode == on_file.returncode == NOT_FOUND
    assert json.loads(on_pg.stderr)["code"] == json.loads(on_file.stderr)["code"]
    unreachable = lgfs("threads", "--db", "postgresql://lgfs:hunter2@127.0.0.1:1/db")
    empty = lgfs("threads", "--db", as_url(pg_server.fresh_dsn()), "--json")  # no setup()
    for done in (unreachable, empty):
        assert done.returncode == STORE_ERROR, done.stderr
        assert "Traceback" not in done.stderr and done.stdout == ""
    assert "connect failed" in unreachable.stderr and "hunter2" not in unreachable.stderr
    assert json.loads(empty.stderr)["code"] == "store_error"
