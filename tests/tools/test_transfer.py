"""Moving threads between stores: `copy_threads` and `lgfs copy-to`, on a real server.

The source is `support.graphs.make_agent_file`'s file: tool-call messages, a `Send`
fan-out, a `research` subgraph namespace, threads waiting at an `interrupt`
with pending writes, a failed run, and `chat-5` claimed live by `worker-7`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest
from langgraph.types import Command
from support.configs import config
from support.graphs import build_agent, make_agent_file

from langgraph_fenced_sqlite import FencedSqliteSaver
from langgraph_fenced_sqlite.errors import InvalidArgument, ThreadBusy
from langgraph_fenced_sqlite.tools.transfer import copy_threads

BUSY = "chat-5"  # claimed live on the source by worker-7


@pytest.fixture(scope="module")
def agent_file(tmp_path_factory: Any) -> str:
    path = str(tmp_path_factory.mktemp("agent") / "agent.db")
    make_agent_file(path)
    return path


@pytest.fixture
def source(agent_file: str, tmp_path: Any) -> Any:
    path = str(tmp_path / "source.db")
    shutil.copyfile(agent_file, path)
    with FencedSqliteSaver(path) as saver:
        yield saver


def history(saver: Any, thread_id: str) -> list[Any]:
    """Everything `list` gives, in its order, without the store-specific config keys."""
    return [
        (t.config, t.checkpoint, t.metadata, t.parent_config, t.pending_writes)
        for t in saver.list({"configurable": {"thread_id": thread_id}})
    ]


def latest(saver: Any, thread_id: str, ns: str) -> str:
    conf = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}}
    return saver.get_tuple(conf).config["configurable"]["checkpoint_id"]


def assert_same_threads(a: Any, b: Any, thread_ids: list[str]) -> None:
    graph_a, graph_b = build_agent(a), build_agent(b)
    for thread_id in thread_ids:
        ours = history(a, thread_id)
        assert ours and history(b, thread_id) == ours, thread_id
        for ns in {h[0]["configurable"]["checkpoint_ns"] for h in ours}:
            assert latest(b, thread_id, ns) == latest(a, thread_id, ns), (thread_id, ns)
        state = graph_a.get_state(config(thread_id), subgraphs=True)
        assert graph_b.get_state(config(thread_id), subgraphs=True) == state


def all_threads(saver: FencedSqliteSaver) -> list[str]:
    return sorted(t["thread_id"] for t in saver.threads())


def test_sqlite_to_postgres_and_back_reads_back_equal(source: Any, open_pg: Any, tmp_path: Any):
    pg = open_pg(clock=None)
    threads = all_threads(source)
    report = copy_threads(source, pg, ignore_claims=True)
    assert (report.threads, report.refused, report.unchanged) == (len(threads), (), 0)
    assert report.checkpoints == sum(len(history(source, t)) for t in threads)
    namespaces = {h[0]["configurable"]["checkpoint_ns"] for h in history(source, "chat-3")}
    assert any(ns.startswith("research:") for ns in namespaces)  # the subgraph came along
    waiting = [w for w in history(source, "chat-2")[0][4] if w[1] == "__interrupt__"]
    assert waiting  # a fanned-out worker's interrupt is a pending write
    assert_same_threads(source, pg, threads)
    assert pg.current_claim(BUSY) is None  # claims are not carried
    with FencedSqliteSaver(str(tmp_path / "back.db")) as back:
        again = copy_threads(pg, back)
        assert (again.threads, again.checkpoints) == (report.threads, report.checkpoints)
        assert again.writes == report.writes
        assert_same_threads(source, back, threads)
    # The copy is a working thread: resume the interrupt on PostgreSQL.
    done = build_agent(pg).invoke(Command(resume="yes"), config("chat-1"))
    assert done["approved"] is True


def test_a_rerun_changes_nothing(source: Any, open_pg: Any) -> None:
    pg = open_pg(clock=None)
    first = copy_threads(source, pg, ["chat-1", "chat-3"])
    events = {t: pg.events_after(t, 0) for t in ("chat-1", "chat-3")}
    rows = {t: history(pg, t) for t in ("chat-1", "chat-3")}
    again = copy_threads(source, pg, ["chat-1", "chat-3"])
    assert (again.threads, again.unchanged, again.checkpoints, again.writes) == (2, 2, 0, 0)
    assert first.checkpoints > 0 and first.writes > 0
    assert {t: pg.events_after(t, 0) for t in events} == events  # nothing logged either
    assert {t: history(pg, t) for t in rows} == rows


def test_an_interrupted_copy_resumes(source: Any, open_pg: Any) -> None:
    pg = open_pg(clock=None)
    oldest_first = list(reversed(list(source.list(config("chat-6")))))
    for tup in oldest_first[:3]:  # as if the copy died after three checkpoints
        conf = {"configurable": {"thread_id": "chat-6", "checkpoint_ns": ""}}
        if tup.parent_config:
            conf["configurable"]["checkpoint_id"] = tup.parent_config["configurable"][
                "checkpoint_id"
            ]
        pg.put(conf, tup.checkpoint, tup.metadata, {})
    report = copy_threads(source, pg, ["chat-6"])
    assert (report.threads, report.refused) == (1, ())
    assert report.checkpoints == len(oldest_first) - 3
    assert_same_threads(source, pg, ["chat-6"])


def test_a_different_history_in_the_target_is_refused_not_merged(source: Any, open_pg: Any) -> None:
    pg = open_pg(clock=None)
    build_agent(pg).invoke({"messages": [("user", "another conversation")]}, config("chat-1"))
    theirs = history(pg, "chat-1")
    report = copy_threads(source, pg, ["chat-1", "chat-6"])
    assert report.threads == 1
    [refused] = report.refused
    assert refused["thread_id"] == "chat-1" and "different history" in refused["reason"]
    assert history(pg, "chat-1") == theirs  # untouched
    assert_same_threads(source, pg, ["chat-6"])


def test_a_live_claim_on_the_source_raises_before_anything_is_written(
    source: Any, open_pg: Any
) -> None:
    pg = open_pg(clock=None)
    with pytest.raises(ThreadBusy) as info:
        copy_threads(source, pg, ["chat-1", BUSY])
    assert info.value.thread_id == BUSY and info.value.holder == "worker-7"
    with pytest.raises(ThreadBusy):
        copy_threads(source, pg)  # every thread: the same
    assert list(pg.list(None)) == []
    report = copy_threads(source, pg, [BUSY], ignore_claims=True)
    assert report.threads == 1


def test_a_live_claim_on_the_target_refuses_that_thread(source: Any, open_pg: Any) -> None:
    pg = open_pg(clock=None)
    pg.claim("chat-1", "other-worker", 3600)
    report = copy_threads(source, pg, ["chat-1", "chat-6"])
    assert report.threads == 1
    assert report.refused == (
        {"thread_id": "chat-1", "reason": "the target has a live claim by 'other-worker'"},
    )
    assert list(pg.list(config("chat-1"))) == []


def test_an_unknown_thread_is_refused_by_name(source: Any, open_pg: Any) -> None:
    pg = open_pg(clock=None)
    report = copy_threads(source, pg, ["nope"])
    assert report.refused == ({"thread_id": "nope", "reason": "the source has no such thread"},)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"source": "file.db"}, "source"),
        ({"target": None}, "target"),
        ({"target": "SAME"}, "target"),
        ({"target": "SAME FILE"}, "target"),
        ({"thread_ids": "chat-1"}, "thread_ids"),
        ({"thread_ids": ["chat-1", ""]}, "thread_ids[]"),
        ({"ignore_claims": "yes"}, "ignore_claims"),
    ],
)
def test_bad_arguments_are_named_before_anything_is_written(
    source: Any, open_pg: Any, monkeypatch: Any, kwargs: dict[str, Any], argument: str
) -> None:
    pg = open_pg(clock=None)
    args = {"source": source, "target": pg, **kwargs}
    if args["target"] == "SAME":
        args["target"] = source
    elif args["target"] == "SAME FILE":  # another saver on the file, by a relative path
        monkeypatch.chdir(os.path.dirname(source.path))
        args["target"] = FencedSqliteSaver(os.path.basename(source.path))
    try:
        with pytest.raises(InvalidArgument) as info:
            copy_threads(**args)
    finally:
        if args["target"] not in (pg, source, None):
            args["target"].close()
    assert info.value.argument == argument
    assert str(info.value).startswith(argument)
    assert list(pg.list(None)) == []


def test_a_closed_store_is_refused(source: Any, open_pg: Any) -> None:
    pg = open_pg(clock=None)
    pg.close()
    with pytest.raises(InvalidArgument, match="target: the store is closed"):
        copy_threads(source, pg)


# --- the CLI ------------------------------------------------------------------------------


def lgfs(*args: str) -> subprocess.CompletedProcess[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "lgfs")
    env = {k: v for k, v in os.environ.items() if k != "LGFS_PATH"}
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.subprocess
def test_cli_copy_to_copies_and_reruns(source: Any, pg_dsn: str, open_pg: Any) -> None:
    path = source.path
    done = lgfs(
        "--db", path, "copy-to", pg_dsn, "--thread", "chat-1", "--thread", "chat-3", "--json"
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["threads"], report["unchanged"], report["refused"]) == (2, 0, [])
    assert_same_threads(source, open_pg(clock=None), ["chat-1", "chat-3"])
    again = lgfs("copy-to", pg_dsn, "--db", path, "--thread", "chat-1")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("copied 1 thread from ") and "0 checkpoints" in again.stdout


@pytest.mark.subprocess
def test_cli_copy_to_a_busy_thread_exits_5_in_one_line(source: Any, pg_dsn: str) -> None:
    busy = lgfs("--db", source.path, "copy-to", pg_dsn)
    assert busy.returncode == 5, busy.stderr
    assert "worker-7" in busy.stderr and "Traceback" not in busy.stderr
    assert busy.stderr.count("\n") == 1, busy.stderr


@pytest.mark.parametrize(
    ("dsn", "extra", "code", "needle"),
    [
        ("not-a-dsn", [], 2, "not a PostgreSQL connection string"),
        ("postgresql://nobody@127.0.0.1:1/none", [], 7, "connect failed"),
        (None, ["--thread", "nope"], 1, "refused thread 'nope'"),
        (None, ["--db", "missing.db"], 3, "no such file"),
    ],
)
def test_cli_copy_to_errors_are_one_line_and_coded(
    source: Any,
    pg_dsn: str,
    capsys: Any,
    monkeypatch: Any,
    tmp_path: Any,
    dsn: Any,
    extra: Any,
    code: int,
    needle: str,
) -> None:
    # In-process `main` (the subprocess tests above run the real command):
    # the same parser and error converter, without a second of start-up each.
    from langgraph_fenced_sqlite.cli.main import main

    monkeypatch.delenv("LGFS_PATH", raising=False)
    monkeypatch.chdir(tmp_path)
    db = [] if "--db" in extra else ["--db", source.path]
    assert main([*db, "copy-to", dsn or pg_dsn, *extra]) == code
    printed = capsys.readouterr()
    assert needle in (printed.out if code == 1 else printed.err)
    assert "Traceback" not in printed.err
    if code != 1:
        assert printed.err.count("\n") == 1, printed.err


def test_the_latest_by_commit_stays_latest_when_it_is_not_the_highest_id(
    tmp_path: Any, open_pg: Any
) -> None:
    # A worker whose clock ran behind commits a checkpoint with a lower id
    # after a higher one: "latest" is by commit (docs/semantics.md §4), so the
    # copy must commit it last too, not in id order.
    from langgraph.checkpoint.base import empty_checkpoint

    pg = open_pg(clock=None)
    with FencedSqliteSaver(str(tmp_path / "skew.db")) as src:
        root = {"configurable": {"thread_id": "skew", "checkpoint_ns": ""}}
        for cid in ("1f0-b", "1f0-a"):  # b, then a: a is latest
            cp = {**empty_checkpoint(), "id": cid}
            src.put(root, cp, {"source": "loop", "step": 0, "parents": {}}, {})
        assert latest(src, "skew", "") == "1f0-a"
        copy_threads(src, pg)
        assert latest(pg, "skew", "") == "1f0-a"
        assert history(pg, "skew") == history(src, "skew")


def test_a_source_thread_with_a_damaged_row_is_refused_whole(source: Any, open_pg: Any) -> None:
    import sqlite3

    path = source.path
    source.close()
    conn = sqlite3.connect(path)
    with conn:  # one checkpoint's values damaged behind the library's back
        conn.execute(
            "UPDATE checkpoints SET values_blob = CAST(values_blob || x'00c0' AS BLOB) "
            "WHERE thread_id = 'chat-1' AND checkpoint_ns = '' AND checkpoint_id = "
            "(SELECT min(checkpoint_id) FROM checkpoints WHERE thread_id = 'chat-1')"
        )
    conn.close()
    pg = open_pg(clock=None)
    with FencedSqliteSaver(path) as damaged:
        report = copy_threads(damaged, pg, ["chat-1", "chat-6"])
        [refused] = report.refused
        assert refused["thread_id"] == "chat-1" and "does not copy" in refused["reason"]
        assert "checksum mismatch" in refused["reason"]
        assert list(pg.list(config("chat-1"))) == []  # nothing of it, not half of it
        assert_same_threads(damaged, pg, ["chat-6"])


def test_a_target_that_requires_claims_is_refused_up_front(source: Any, open_pg: Any) -> None:
    pg = open_pg(clock=None, require_claim=True)
    with pytest.raises(InvalidArgument, match="^target: requires a claim"):
        copy_threads(source, pg)


class Opaque:
    """A plain class: pickle stores it, the data-only serializer has no encoding for it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque) and other.n == self.n


def test_a_value_the_target_cannot_store_refuses_the_thread_before_any_put(
    tmp_path: Any, open_pg: Any
) -> None:
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    pg = open_pg(clock=None)
    with FencedSqliteSaver(
        str(tmp_path / "pickled.db"), serde=JsonPlusSerializer(pickle_fallback=True)
    ) as src:
        root = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        md = {"source": "loop", "step": 0, "parents": {}}
        first = src.put(root, {**empty_checkpoint(), "id": "1f0-a"}, md, {})
        later = {**empty_checkpoint(), "id": "1f0-b", "channel_values": {"x": Opaque(1)}}
        src.put(first, later, {**md, "step": 1}, {})
        report = copy_threads(src, pg)
    [refused] = report.refused
    assert refused["thread_id"] == "t" and "does not copy" in refused["reason"]
    assert list(pg.list(None)) == []  # not even the first, storable checkpoint


def test_every_thread_means_every_thread_with_a_checkpoint(tmp_path: Any, open_pg: Any) -> None:
    # `threads()` also lists a thread that was only ever claimed; copying
    # "every thread" must not refuse it as missing (nor stop on its claim).
    from langgraph.checkpoint.base import empty_checkpoint

    pg = open_pg(clock=None)
    with FencedSqliteSaver(str(tmp_path / "claimed.db")) as src:
        src.claim("only-claimed", "w", 3600)
        root = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        src.put(root, empty_checkpoint(), {"source": "input", "step": -1, "parents": {}}, {})
        report = copy_threads(src, pg)
        assert (report.threads, report.refused) == (1, ())
        back = copy_threads(pg, src)  # and back: PostgreSQL's threads are those with checkpoints
        assert (back.threads, back.unchanged, back.refused) == (1, 1, ())


def test_two_schemas_of_one_database_are_two_stores(
    source: Any, open_pg: Any, pg_server: Any
) -> None:
    # Both report the same `path` (server and database), yet they are two stores.
    first, second = open_pg(clock=None), open_pg(pg_server.fresh_dsn(), clock=None)
    assert first.path == second.path
    copy_threads(source, first, ["chat-3"])
    report = copy_threads(first, second)
    assert (report.threads, report.refused) == (1, ())
    assert_same_threads(source, second, ["chat-3"])
