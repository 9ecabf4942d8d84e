"""`lgfs threads` with search filters: `--metadata`, `--status`, `--sort`, `--order`,
`--limit`, `--offset` and `--count`, on a file and on PostgreSQL (`--db postgresql://...`).

The CLI judges nothing: what it prints must be what `search_threads` and
`count_threads` return for the same filters, on either store; bad values
are usage errors (exit 2, one line, no traceback), before anything is read.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.postgres import as_url

from langgraph_fenced_sqlite import FencedSqliteSaver, ManualClock
from langgraph_fenced_sqlite.testing._helpers import step_checkpoint, token_config

USAGE = 2


def _fill(saver: Any, clock: ManualClock) -> None:
    """Six threads a second apart: users ann/bob, a numeric `n`, one claimed."""
    for i in range(6):
        clock.advance(1)
        metadata = {"source": "input", "step": -1, "parents": {}, "user": ["ann", "bob"][i % 2]}
        metadata.update(n=i, nick=str(i))
        saver.put(token_config(f"t{i}", None, None), step_checkpoint(0), metadata, {})
    saver.claim("t4", "worker", 3600)


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: Any, tmp_path: Any) -> Iterator[tuple[str, Any]]:
    """The same threads in a file or in PostgreSQL: (what `--db` takes, a saver on it)."""
    # Times just behind the real clock, which `lgfs` judges the claim by.
    clock = ManualClock(time.time() - 60)
    if request.param == "sqlite":
        path = str(tmp_path / "search.db")
        saver = FencedSqliteSaver(path, clock=clock)
        _fill(saver, clock)
        yield path, saver
        saver.close()
        return
    from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

    dsn = request.getfixturevalue("pg_dsn")
    with FencedPostgresSaver.from_conn_string(dsn, clock=clock) as saver:
        saver.setup()
        _fill(saver, clock)
        yield as_url(dsn), saver


def _ids(done: Any) -> list[str]:
    assert done.returncode == 0, done.stderr
    return [json.loads(line)["thread_id"] for line in done.stdout.splitlines()]


def test_the_filters_are_search_threads_on_either_store(cli: Any, store: tuple[str, Any]) -> None:
    db, saver = store
    got = _ids(cli("threads", "--db", db, "--metadata", "user=ann", "--nl"))
    assert got == [t["thread_id"] for t in saver.search_threads(metadata={"user": "ann"})]
    assert got == ["t4", "t2", "t0"]
    # KEY=VALUE is a string, KEY:=JSON any JSON value; all must match.
    assert _ids(cli("threads", "--db", db, "--metadata", "nick=3", "--nl")) == ["t3"]
    assert _ids(cli("threads", "--db", db, "--metadata", "n=3", "--nl")) == []
    assert _ids(cli("threads", "--db", db, "--metadata", "n:=3", "--nl")) == ["t3"]
    both = ["--metadata", "user=ann", "--metadata", "n:=2"]
    assert _ids(cli("threads", "--db", db, *both, "--nl")) == ["t2"]
    running = _ids(cli("threads", "--db", db, "--status", "running", "--nl"))
    assert running == ["t4"]
    idle_ann = ["--metadata", "user=ann", "--status", "idle"]
    assert _ids(cli("threads", "--db", db, *idle_ann, "--nl")) == ["t2", "t0"]
    page = ["--sort", "thread_id", "--order", "asc", "--limit", "2", "--offset", "1"]
    assert _ids(cli("threads", "--db", db, *page, "--nl")) == ["t1", "t2"]
    assert _ids(cli("threads", "--db", db, "--order", "asc", "--limit", "2", "--nl")) == [
        "t0",
        "t1",
    ]
    # --count: the number (every page), as a document under --json.
    counted = cli("threads", "--db", db, "--metadata", "user=ann", "--count")
    assert counted.returncode == 0 and counted.stdout == "3 threads\n"
    doc = cli("threads", "--db", db, "--metadata", "user=bob", "--count", "--json")
    assert json.loads(doc.stdout) == {"count": saver.count_threads(metadata={"user": "bob"})}
    assert json.loads(doc.stdout) == {"count": 3}
    text = cli("threads", "--db", db, "--metadata", "user=nobody")
    assert text.returncode == 0 and text.stdout == "(none)\n"


@pytest.mark.parametrize(
    "args, says",
    [
        (["--metadata", "user"], "--metadata: expected KEY=VALUE or KEY:=JSON"),
        (["--metadata", "=ann"], "--metadata: expected KEY=VALUE or KEY:=JSON"),
        (["--metadata", "n:=tru"], "--metadata: n: not a JSON value"),
        (["--sort", "created_at"], "--sort: invalid choice"),
        (["--order", "newest"], "--order: invalid choice"),
        (["--limit", "0"], "--limit: expected an integer from 1"),
        (["--offset", "-1"], "--offset: expected an integer from 0"),
        (["--status", "sleeping"], "--status: invalid choice"),
    ],
)
def test_a_bad_filter_is_a_usage_error(
    cli: Any, store: tuple[str, Any], args: list[str], says: str
) -> None:
    db, _ = store
    for mode in ([], ["--json"]):
        done = cli("threads", "--db", db, *args, *mode)
        assert done.returncode == USAGE and done.stdout == ""
        assert says in done.stderr and "Traceback" not in done.stderr
