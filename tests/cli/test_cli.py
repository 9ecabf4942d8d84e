"""`lgfs`, run for real (`python -m langgraph_fenced_sqlite`) on files made by real graphs.

One module-scoped file holds three threads written by a LangGraph graph with
a subgraph and an `interrupt`: `order-1` (two runs under a claim, since
released), `order-2` (stopped at its interrupt, claimed live by `worker-2`)
and `order-3` (only an expired claim). Tests that change data work on a copy.
"""

from __future__ import annotations

import json
import operator
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import START, StateGraph
from langgraph.types import Command, interrupt
from support.files import dump, file_fixtures, make_v3_file, read_bytes, reseal, user_version
from support.processes import import_path, lgfs, parsed

from langgraph_fenced_sqlite import FencedSqliteSaver, ManualClock
from langgraph_fenced_sqlite.cli.main import EXIT_CODES, build_parser

COMMANDS = (
    "threads history show diff claims events prune sweep compact retract delete runs doctor "
    "migrate repack rekey vacuum import-sqlitesaver import-postgressaver copy-to"
).split()


class State(TypedDict, total=False):
    """The graph's state."""

    items: Annotated[list[str], operator.add]
    count: int


def build_graph(checkpointer: Any) -> Any:
    """Compile step -> subgraph -> ask (an interrupt) with `checkpointer`."""
    sub = StateGraph(State)
    sub.add_node("tag", lambda s: {"items": ["sub"]})
    sub.add_edge(START, "tag")
    graph = StateGraph(State)
    graph.add_node("step", lambda s: {"items": [f"step{s.get('count', 0)}"], "count": 1})
    graph.add_node("sub", sub.compile())
    graph.add_node("ask", lambda s: {"items": [interrupt("approve?")]})
    graph.add_edge(START, "step")
    graph.add_edge("step", "sub")
    graph.add_edge("sub", "ask")
    return graph.compile(checkpointer=checkpointer)


def make_demo(path: str) -> None:
    """Write the three demo threads into `path`."""
    with FencedSqliteSaver(path) as saver:
        graph = build_graph(saver)
        claim = saver.claim("order-1", "worker-1", 60)
        graph.invoke({"count": 0}, claim.config({"metadata": {"run_id": "run-a"}}))
        graph.invoke(Command(resume="ok"), claim.config({"metadata": {"run_id": "run-b"}}))
        saver.release("order-1", claim.token)
        graph.invoke({"count": 5}, {"configurable": {"thread_id": "order-2"}})
        saver.claim("order-2", "worker-2", 3600)
    # A store whose clock is an hour behind grants a claim that is long expired.
    with FencedSqliteSaver(path, clock=ManualClock(time.time() - 3600)) as saver:
        saver.claim("order-3", "worker-3", 1)


# The demo file (read-only use), and `copy`, a private copy to change.
demo, copy = file_fixtures(make_demo, "demo", "copy", "copy.db")


def state_of(path: str, thread_id: str, checkpoint_id: str | None = None) -> Any:
    """Read a thread's state in-process through LangGraph."""
    conf: dict[str, Any] = {"thread_id": thread_id}
    if checkpoint_id:
        conf["checkpoint_id"] = checkpoint_id
    with FencedSqliteSaver(path) as saver:
        return build_graph(saver).get_state({"configurable": conf})


# --- reading --------------------------------------------------------------------------------


# Loaded by `langgraph.graph` / `langgraph.types` (langchain_core's tracers, langsmith's
# run trees): about 0.9 s of a command's start-up here, none of which a command needs.
GRAPH_RUNTIME = ("langgraph.graph", "langgraph.types", "langsmith.run_trees")


@pytest.mark.subprocess
@pytest.mark.parametrize("command", [["history", "order-1"], ["claims"], ["events", "order-1"]])
def test_a_command_starts_without_langgraphs_graph_runtime(demo: str, command: list[str]) -> None:
    """`lgfs` loads the store, not LangGraph's graph runtime: an operator's command starts fast.

    Pins the lazy `FencedRunner` in the package's `__init__` and the lazy
    `GraphDrained` in `lease.py`: either imported at module level loads all of them.
    (A command that decodes a stored `Interrupt`, as `threads` and `show` do
    for a thread waiting at one, loads `langgraph.types` for its class, rightly.)
    """
    probe = (
        "import sys\n"
        "from langgraph_fenced_sqlite.cli import main\n"
        f"code = main({[*command[:1], demo, *command[1:], '--json']!r})\n"
        f"loaded = [m for m in {GRAPH_RUNTIME!r} if m in sys.modules]\n"
        "print('LOADED', loaded, file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout)
    assert "LOADED []" in done.stderr, done.stderr


def test_help_names_every_command_and_the_exit_codes(cli: Any) -> None:
    done = lgfs("--help")
    assert done.returncode == 0
    for command in COMMANDS:
        assert f"    {command}" in done.stdout
    assert "exit codes:" in done.stdout and "130" in done.stdout
    choices = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices)
    assert sorted(choices.choices) == sorted(COMMANDS)
    for command in COMMANDS:
        sub = cli(command, "--help")
        assert sub.returncode == 0 and f"usage: lgfs {command}" in sub.stdout


def test_threads_lists_counts_claims_and_latest_activity_first(demo: str, cli: Any) -> None:
    threads = parsed(lgfs("threads", demo, "--json"))
    by_id = {t["thread_id"]: t for t in threads}
    assert set(by_id) == {"order-1", "order-2", "order-3"}
    activity = [t["last_activity"] for t in threads]
    assert activity == sorted(activity, reverse=True)
    one, two, three = by_id["order-1"], by_id["order-2"], by_id["order-3"]
    assert one["claim"] is None and one["checkpoints"] > 0 and one["events"] > 0
    assert one["namespaces"][0] == "" and len(one["namespaces"]) == 2  # root + the subgraph's
    assert one["namespaces"][1].startswith("sub:") and one["latest_step"] >= 3
    assert two["claim"]["holder"] == "worker-2" and two["claim"]["live"] is True
    assert two["claim"]["expires_in"] > 3000
    assert three["claim"]["holder"] == "worker-3" and three["claim"]["live"] is False
    assert three["checkpoints"] == 0 and three["floor"] == 1
    limited = parsed(cli("threads", demo, "--limit", "1", "--json"))
    assert [t["thread_id"] for t in limited] == [threads[0]["thread_id"]]
    nl = cli("threads", demo, "--nl").stdout.splitlines()
    assert [json.loads(line)["thread_id"] for line in nl] == [t["thread_id"] for t in threads]
    # A terminal wide enough for every column (at 80, columns give way: below).
    text = lgfs("threads", env={"LGFS_PATH": demo, "COLUMNS": "200"})
    assert text.returncode == 0
    assert text.stdout.splitlines()[0].split()[:3] == ["THREAD", "STATUS", "CHECKPOINTS"]
    assert "worker-2 token" in text.stdout and "expires in" in text.stdout
    assert "expired" in text.stdout
    narrow = lgfs("threads", env={"LGFS_PATH": demo, "COLUMNS": "80"}).stdout.splitlines()
    assert narrow[0].split()[:2] == ["THREAD", "STATUS"] and max(map(len, narrow)) <= 80
    running = next(line for line in narrow if line.startswith("order-2 "))
    assert "running (worker-2, expires in" in running and "worker-2 token" in running


def test_history_shows_positions_tokens_runs_and_parents_newest_first(demo: str, cli: Any) -> None:
    records = parsed(lgfs("history", demo, "order-1", "--limit", "100", "--json"))
    with FencedSqliteSaver(demo) as saver:
        ids = [t.config["configurable"]["checkpoint_id"] for t in saver.history("order-1")]
    assert [r["checkpoint_id"] for r in records] == ids
    positions = [r["position"] for r in records]
    assert positions == sorted(positions, reverse=True)
    assert {r["run_id"] for r in records} == {"run-a", "run-b"}
    assert len({r["token"] for r in records}) == 1 and records[0]["token"] is not None
    for newer, older in zip(records, records[1:], strict=False):
        assert newer["parent_checkpoint_id"] == older["checkpoint_id"]
    assert records[-1]["parent_checkpoint_id"] is None and records[-1]["source"] == "input"
    # Paging with --before visits every checkpoint once.
    page1 = parsed(cli("history", demo, "order-1", "--limit", "3", "--json"))
    page2 = parsed(cli("history", demo, "order-1", "--limit", "100", "--before", ids[2], "--json"))
    assert [r["checkpoint_id"] for r in page1 + page2] == ids
    text = cli("history", demo, "order-1", "--limit", "3")
    assert text.stdout.split()[:3] == ["POS", "CHECKPOINT", "STEP"]
    assert f"(older: --before {ids[2]})" in text.stdout


def test_show_gives_values_metadata_and_pending_writes(demo: str, cli: Any) -> None:
    text = lgfs("show", demo, "order-2")
    shown = parsed(cli("show", demo, "order-2", "--json"))
    state = state_of(demo, "order-2")
    assert shown["checkpoint_id"] == state.config["configurable"]["checkpoint_id"]
    assert shown["values"]["items"] == state.values["items"]
    assert shown["values"]["items"][0] == "step5" and shown["values"]["count"] == 1
    assert shown["metadata"]["source"] == "loop" and shown["error"] is None
    interrupts = [w for w in shown["writes"] if w["channel"] == "__interrupt__"]
    assert interrupts[0]["value"][0]["value"] == "approve?"
    assert text.returncode == 0
    assert f"items: {json.dumps(state.values['items'])}" in text.stdout
    assert "__interrupt__" in text.stdout and shown["checkpoint_id"] in text.stdout
    parent_id = shown["parent_checkpoint_id"]
    old = parsed(cli("show", demo, "order-2", "--checkpoint", parent_id, "--json"))
    assert old["values"]["items"] == state_of(demo, "order-2", parent_id).values["items"]
    ns = parsed(cli("threads", demo, "--json"))
    sub_ns = next(t for t in ns if t["thread_id"] == "order-2")["namespaces"][1]
    in_sub = parsed(cli("show", demo, "order-2", "--ns", sub_ns, "--json"))
    assert in_sub["checkpoint_ns"] == sub_ns and in_sub["values"]["items"][-1] == "sub"


def test_show_reports_an_undecodable_row_as_an_error_for_that_row(copy: str, cli: Any) -> None:
    latest = parsed(cli("show", copy, "order-2", "--json"))
    conn = sqlite3.connect(copy)
    with conn:
        conn.execute(
            "UPDATE writes SET type = 'pickle' WHERE thread_id = 'order-2' AND channel = ?",
            ("__interrupt__",),
        )
        reseal(conn)
    conn.close()
    done = lgfs("show", copy, "order-2", "--json")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    shown = json.loads(done.stdout)
    assert shown["values"] == latest["values"] and shown["error"] is None
    bad = [w for w in shown["writes"] if w["error"]]
    assert [w["channel"] for w in bad] == ["__interrupt__"]
    assert bad[0]["error"]["code"] == "undecodable_row"
    assert bad[0]["error"]["thread_id"] == "order-2"
    assert bad[0]["error"]["checkpoint_id"] == latest["checkpoint_id"]
    conn = sqlite3.connect(copy)
    with conn:
        conn.execute("UPDATE checkpoints SET values_type = 'pickle' WHERE thread_id = 'order-2'")
        reseal(conn)
    conn.close()
    text = cli("show", copy, "order-2")
    assert text.returncode == 1
    assert "values: ERROR (undecodable_row)" in text.stdout
    assert latest["checkpoint_id"] in text.stdout and '"source": "loop"' in text.stdout


def test_diff_compares_the_latest_with_its_parent_channel_by_channel(demo: str, cli: Any) -> None:
    diff = parsed(lgfs("diff", demo, "order-1", "--json"))
    latest = state_of(demo, "order-1")
    parent_id = latest.parent_config["configurable"]["checkpoint_id"]
    parent = state_of(demo, "order-1", parent_id)
    assert diff["to"] == latest.config["configurable"]["checkpoint_id"]
    assert diff["from"] == parent_id and diff["errors"] == []
    items = next(c for c in diff["changes"] if c["channel"] == "items")
    assert items["change"] == "changed"
    assert (items["before"], items["after"]) == (parent.values["items"], latest.values["items"])
    history = parsed(cli("history", demo, "order-1", "--limit", "100", "--json"))
    first, last = history[-1]["checkpoint_id"], history[0]["checkpoint_id"]
    wide = parsed(cli("diff", demo, "order-1", "--from", first, "--to", last, "--json"))
    assert (wide["from"], wide["to"]) == (first, last)
    count = next(c for c in wide["changes"] if c["channel"] == "count")
    assert count == {"channel": "count", "change": "added", "after": 1}
    text = cli("diff", demo, "order-1")
    assert text.returncode == 0 and "~ items: " in text.stdout


def test_claims_lists_live_and_expired_claims(demo: str, cli: Any) -> None:
    text = lgfs("claims", demo)
    claims = {c["thread_id"]: c for c in parsed(cli("claims", demo, "--json"))}
    assert set(claims) == {"order-2", "order-3"}
    assert claims["order-2"]["live"] is True and claims["order-2"]["holder"] == "worker-2"
    assert claims["order-3"]["live"] is False and claims["order-3"]["expires_in"] < 0
    assert claims["order-3"]["token"] > claims["order-2"]["token"]
    assert text.returncode == 0
    rows = {line.split()[0]: line.split() for line in text.stdout.splitlines()[1:]}
    assert rows["order-2"][1:4] == ["worker-2", str(claims["order-2"]["token"]), "live"]
    assert rows["order-3"][1:4] == ["worker-3", str(claims["order-3"]["token"]), "expired"]


def test_events_prints_the_log_in_order(demo: str, cli: Any) -> None:
    nl = lgfs("events", demo, "order-1", "--nl")
    with FencedSqliteSaver(demo) as saver:
        expected = [e.to_dict() for e in saver.events_after("order-1", 0, limit=1000)]
    assert nl.returncode == 0
    assert [json.loads(line) for line in nl.stdout.splitlines()] == expected
    assert [e["seq"] for e in expected] == list(range(1, len(expected) + 1))
    assert parsed(cli("events", demo, "order-1", "--json")) == expected
    later = parsed(cli("events", demo, "order-1", "--after", "3", "--limit", "2", "--json"))
    assert [e["seq"] for e in later] == [4, 5]
    text = cli("events", demo, "order-1", "--limit", "1").stdout
    # The first event's kind, as the store has it: LangGraph sends an input
    # checkpoint and its first writes from two threads, so under load the
    # writes can commit first (seen in a full run at load 12).
    assert text.split()[0] == "1" and f" {expected[0]['kind']} " in text
    assert {"checkpoint", "writes"} <= {e["kind"] for e in expected[:3]}


WRITER = """
import json, os, sys
sys.path[:0] = sys.argv[2].split(os.pathsep)
from test_cli import build_graph
from langgraph_fenced_sqlite import FencedSqliteSaver
with FencedSqliteSaver(sys.argv[1]) as saver:
    with saver.lease("order-1", "other-process", 60) as lease:
        build_graph(saver).invoke({"count": 9}, lease.claim.config())
    print(json.dumps([e.seq for e in saver.events_after("order-1", 0, limit=1000)]))
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_events_follow_prints_commits_made_by_another_process(copy: str, cli: Any) -> None:
    last = parsed(cli("events", copy, "order-1", "--json"))[-1]["seq"]
    follow = subprocess.Popen(
        [sys.executable, "-m", "langgraph_fenced_sqlite", "events", copy, "order-1"]
        + ["--follow", "--nl", "--after", str(last)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in follow.stdout], daemon=True)
    reader.start()
    try:
        writer = subprocess.run(
            [sys.executable, "-c", WRITER, copy, import_path(__file__)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert writer.returncode == 0, writer.stderr
        new = [seq for seq in json.loads(writer.stdout) if seq > last]
        assert new, "the other process committed nothing"
        got = [json.loads(lines.get(timeout=60)) for _ in new]
        assert [e["seq"] for e in got] == new
        assert {e["kind"] for e in got} >= {"checkpoint", "writes"}
        follow.send_signal(signal.SIGINT)
        assert follow.wait(timeout=60) == 0
        assert follow.stderr.read() == ""
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
        follow.stdout.close()
        follow.stderr.close()


# --- changing -------------------------------------------------------------------------------


def history_all(path: str, thread_id: str) -> list[dict[str, Any]]:
    """Every checkpoint record of a thread, all namespaces."""
    with FencedSqliteSaver(path) as saver:
        namespaces = next(t for t in saver.threads() if t["thread_id"] == thread_id)["namespaces"]
        return [
            r
            for ns in namespaces
            for r in saver.history_records(thread_id, checkpoint_ns=ns, limit=1000)
        ]


def test_prune_dry_run_changes_nothing_and_predicts_the_prune(copy: str, cli: Any) -> None:
    rows, raw = dump(copy), read_bytes(copy)
    policy = ["--keep", "2", "--max-events", "5"]
    dry = parsed(lgfs("prune", copy, "order-1", *policy, "--dry-run", "--json"))
    assert dry[0]["dry_run"] is True and len(dry[0]["checkpoints"]) > 0
    assert dry[0]["events_removed"] > 0
    assert dump(copy) == rows and read_bytes(copy) == raw
    refused = lgfs("prune", copy, "order-1", *policy)
    assert refused.returncode == 6 and "--yes" in refused.stderr
    assert dump(copy) == rows
    done = parsed(lgfs("prune", copy, "order-1", *policy, "--yes", "--json"))
    assert [{**r, "dry_run": True} for r in done] == dry
    left = {(r["checkpoint_ns"], r["checkpoint_id"]) for r in history_all(copy, "order-1")}
    assert left and not left & {tuple(k) for k in dry[0]["checkpoints"]}
    events = parsed(cli("events", copy, "order-1", "--json"))
    assert events[0]["seq"] == dry[0]["floor"] and len(events) <= 5


def test_prune_max_age_keeps_recent_history(copy: str, cli: Any) -> None:
    rows = dump(copy)
    done = parsed(cli("prune", copy, "order-1", "order-2", "--max-age", "7d", "--json"))
    assert [r["checkpoints"] for r in done] == [[], []]
    assert dump(copy) == rows


def test_compact_raises_the_floor(copy: str, cli: Any) -> None:
    assert cli("compact", copy, "order-1", "--before", "5").returncode == 6
    done = parsed(lgfs("compact", copy, "order-1", "--before", "5", "--yes", "--json"))
    assert done == {"thread_id": "order-1", "floor": 5, "events_removed": 4}
    assert parsed(cli("events", copy, "order-1", "--json"))[0]["seq"] == 5
    gone = cli("events", copy, "order-1", "--after", "0", "--json")
    assert gone.returncode == 3
    assert json.loads(gone.stderr)["code"] == "replay_unavailable"


def test_retract_removes_the_latest_run_and_refuses_a_live_run(copy: str, cli: Any) -> None:
    rows = dump(copy)
    busy = lgfs("retract", copy, "order-2", "--yes")
    assert busy.returncode == 5 and "worker-2" in busy.stderr
    assert cli("retract", copy, "order-1").returncode == 6
    assert dump(copy) == rows
    history = parsed(cli("history", copy, "order-1", "--limit", "100", "--json"))
    run_a_latest = next(r for r in history if r["run_id"] == "run-a")
    done = parsed(lgfs("retract", copy, "order-1", "--yes", "--json"))
    assert done["run_id"] == "run-b" and done["checkpoints"] and done["seq"] is not None
    shown = parsed(cli("show", copy, "order-1", "--json"))
    assert shown["checkpoint_id"] == run_a_latest["checkpoint_id"]
    claims = parsed(cli("claims", copy, "--json"))
    assert "order-1" not in {c["thread_id"] for c in claims}  # its claim was released


def test_runs_cancel_records_the_request_for_the_holding_run(copy: str, cli: Any) -> None:
    """`lgfs runs cancel` records a cancel (naming --by) for the claim it finds, and only then."""
    asked = parsed(lgfs("runs", "cancel", copy, "order-2", "--by", "oncall", "--json"))
    assert asked == {
        "thread_id": "order-2",
        "cancel_requested": True,
        "holder": "worker-2",
        "token": asked["token"],
    }
    with FencedSqliteSaver(copy) as saver:
        last = saver.events_after("order-2", 0, 1000)[-1]
        assert (last.kind, last.data["by"], last.data["token"]) == (
            "cancel_requested",
            "oncall",
            asked["token"],
        )
        before = len(saver.events_after("order-1", 0, 1000))
    done = lgfs("runs", "cancel", "order-1", env={"LGFS_PATH": copy})
    assert done.returncode == 0 and "nothing to cancel" in done.stdout
    with FencedSqliteSaver(copy) as saver:
        assert len(saver.events_after("order-1", 0, 1000)) == before
    assert cli("runs", "cancel", copy, "nope").returncode == 3
    assert lgfs("runs", "cancel", "order-1", env={"LGFS_PATH": ""}).returncode == 2


def test_delete_removes_a_thread_and_refuses_a_live_run(copy: str, cli: Any) -> None:
    busy = cli("delete", copy, "order-2", "--yes")
    assert busy.returncode == 5 and "worker-2" in busy.stderr
    assert cli("delete", copy, "order-1").returncode == 6
    done = parsed(lgfs("delete", copy, "order-1", "--yes", "--json"))
    assert done["deleted"] is True
    assert "order-1" not in {t["thread_id"] for t in parsed(cli("threads", copy, "--json"))}
    assert cli("history", copy, "order-1").returncode == 3


# --- doctor and errors --------------------------------------------------------------------------


def test_doctor_reports_a_healthy_file(demo: str, cli: Any) -> None:
    report = parsed(lgfs("doctor", demo, "--json"))
    assert report["ok"] is True and report["problems"] == []
    assert report["journal_mode"] == "wal" and report["synchronous"] == 2
    assert report["integrity"] == ["ok"] and report["schema_version"] >= 1
    assert report["threads"] == 3 and report["claims"] == 2 and report["live_claims"] == 1
    assert isinstance(report["wal_bytes"], int)
    assert "status          ok" in cli("doctor", demo).stdout


def test_doctor_exits_non_zero_on_a_corrupt_index(copy: str) -> None:
    conn = sqlite3.connect(copy, isolation_level=None)
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute(
        "UPDATE sqlite_master SET sql = 'CREATE INDEX checkpoints_by_position ON "
        "checkpoints (thread_id, checkpoint_id, position)' WHERE name = 'checkpoints_by_position'"
    )
    conn.close()
    done = lgfs("doctor", copy, "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["ok"] is False and "integrity_check" in report["problems"][0]


def test_doctor_checks_the_pragmas_the_engine_sets(demo: str, cli: Any, monkeypatch: Any) -> None:
    """Doctor's pragma checks are `schema.PRAGMAS`: one more there is one more checked."""
    from langgraph_fenced_sqlite import diagnose
    from langgraph_fenced_sqlite.sqlite import schema

    checks = diagnose(demo).checks
    assert [c.name for c in checks] == [n for n, _ in schema.PRAGMAS] + ["integrity", "claims"]
    assert all(c.ok for c in checks)
    text = cli("doctor", demo).stdout
    assert "foreign keys    0" in text and "wal size limit  8388608" in text
    monkeypatch.setattr(schema, "PRAGMAS", (*schema.PRAGMAS, ("cache_size", "-1234")))
    report = parsed(cli("doctor", demo, "--json"))
    assert report["ok"] is True and "pragmas" not in report  # the JSON keeps its shape
    assert "cache size      -1234" in cli("doctor", demo).stdout


def test_doctor_reports_a_pragma_that_differs(demo: str, cli: Any, monkeypatch: Any) -> None:
    real = FencedSqliteSaver.stats

    def stats(self: Any) -> dict[str, Any]:  # a connection left at synchronous=NORMAL
        found = real(self)
        found["pragmas"]["synchronous"] = found["synchronous"] = 1
        return found

    monkeypatch.setattr(FencedSqliteSaver, "stats", stats)
    done = cli("doctor", demo, "--json")
    assert done.returncode == 1
    assert json.loads(done.stdout)["problems"] == ["synchronous is 1, expected 2 (FULL)"]
    assert "synchronous     NORMAL  (expected 2)" in cli("doctor", demo).stdout


def test_exit_codes_come_from_error_classes_not_codes_or_messages() -> None:
    from langgraph_fenced_sqlite import errors
    from langgraph_fenced_sqlite.cli.io import (
        EXIT_BY_CLASS,
        CliError,
        NotFound,
        UsageError,
        exit_code,
        fail,
    )

    class LockedForLong(errors.StoreBusy):
        code = "locked_for_long"  # a code no table lists: its class still says busy

    assert exit_code(LockedForLong("op", "f.db", 9.0)) == 5
    assert fail(LockedForLong("op", "f.db", 9.0), as_json=True) == 5
    misleading = errors.InvalidArgument("x", message="thread 'x' not found; store busy")
    assert exit_code(misleading) == 2
    assert isinstance(CliError("usage", "bad"), UsageError)
    assert exit_code(CliError("usage", "bad")) == 2
    assert isinstance(CliError("thread_not_found", "gone"), NotFound)
    assert exit_code(CliError("something_new", "?")) == 7
    assert exit_code(FileNotFoundError(2, "no such file", "f")) == 3
    assert exit_code(errors.ReadOnlyStore("op", "f")) == 7 and exit_code(ZeroDivisionError()) == 7
    documented = {code for code, _ in EXIT_CODES}
    assert set(EXIT_BY_CLASS.values()) <= documented
    for name in errors.__all__:  # every library error has its documented code
        assert exit_code(getattr(errors, name).__new__(getattr(errors, name))) in documented


def _missing(tmp_path: Any, demo: str) -> str:
    return str(tmp_path / "missing.db")


def _not_a_database(tmp_path: Any, demo: str) -> str:
    path = tmp_path / "notes.db"
    path.write_text("hello\n" * 100)
    return str(path)


def _sqlitesaver_file(tmp_path: Any, demo: str) -> str:
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = str(tmp_path / "lg.db")
    with SqliteSaver.from_conn_string(path) as saver:
        saver.setup()
    return path


def _newer_schema(tmp_path: Any, demo: str) -> str:
    path = str(tmp_path / "newer.db")
    FencedSqliteSaver(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 999")
    conn.close()
    return path


def _demo(tmp_path: Any, demo: str) -> str:
    return demo


@pytest.mark.parametrize(
    ("make", "args", "code", "exit_code", "words", "subprocess"),
    [
        (_missing, ["history", "{}", "t"], "file_not_found", 3, "no such file", True),
        (_not_a_database, ["threads", "{}"], "unsupported_format", 4, "not an SQLite", False),
        (_sqlitesaver_file, ["doctor", "{}"], "unsupported_format", 4, "not a langgraph", True),
        (_newer_schema, ["claims", "{}"], "unsupported_format", 4, "is newer than", True),
        (_demo, ["show", "{}", "nobody"], "thread_not_found", 3, "nobody", False),
        (
            _demo,
            ["show", "{}", "order-1", "--checkpoint", "x"],
            "checkpoint_not_found",
            3,
            "'x'",
            0,
        ),
        (_demo, ["prune", "{}", "order-1"], "usage", 2, "--keep", False),
        (_demo, ["prune", "{}", "order-1", "--max-age", "soon"], "usage", 2, "duration", True),
        (_demo, ["history"], "usage", 2, "required", False),
    ],
)
def test_errors_are_one_line_with_a_documented_exit_code(
    tmp_path: Any,
    demo: str,
    cli: Any,
    make: Any,
    args: list[str],
    code: str,
    exit_code: int,
    words: str,
    subprocess: bool,
) -> None:
    path = make(tmp_path, demo)
    argv = [a.format(path) for a in args]
    before = read_bytes(path) if os.path.exists(path) else None
    done = lgfs(*argv) if subprocess else cli(*argv)
    assert done.returncode == exit_code
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith("lgfs: error: ") and words in done.stderr
    as_json = cli(*argv, "--json")
    assert as_json.returncode == exit_code and as_json.stdout == ""
    error = json.loads(as_json.stderr)
    assert error["code"] == code and words in error["message"]
    assert os.path.exists(path) == (make is not _missing)  # a missing file is not created
    assert before is None or read_bytes(path) == before  # a refused file is left unchanged


# The commands that only read: on an older file each must leave it as it is.
READ_COMMANDS = (
    ["threads"],
    ["history", "order-1"],
    ["show", "order-1"],
    ["diff", "order-1"],
    ["events", "order-1"],
    ["claims"],
)


def test_read_commands_refuse_an_older_file_unchanged_and_migrate_upgrades_it(
    demo: str, tmp_path: Any, cli: Any
) -> None:
    """A read never migrates: one line naming `lgfs migrate`, exit 4, the file byte for byte.

    Migrating is a write, and workers still on the older version would then
    refuse the file as newer than they know: an operator reading at 3 a.m.
    must not do that by accident. `lgfs doctor` reports the older schema as
    a problem (exit 1), and only `lgfs migrate` upgrades the file.
    """
    from langgraph_fenced_sqlite.sqlite.schema import SCHEMA_VERSION

    path = str(tmp_path / "v3.db")
    make_v3_file(demo, path)
    before = read_bytes(path)
    for command in READ_COMMANDS:
        run = lgfs if command == ["threads"] else cli  # one for real, in a process of its own
        done = run(*command, "--db", path)
        assert done.returncode == 4, (command, done.stderr)
        assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
        assert f"schema version 3 needs migrating to {SCHEMA_VERSION}" in done.stderr
        assert "lgfs migrate" in done.stderr and "Traceback" not in done.stderr
        error = json.loads(cli(*command, "--db", path, "--json").stderr)
        assert error["code"] == "schema_too_old"
        assert (error["version"], error["current"]) == (3, SCHEMA_VERSION)
        assert read_bytes(path) == before and user_version(path) == 3, command
    doctor = cli("doctor", path, "--json")
    assert doctor.returncode == 1 and doctor.stderr == ""
    assert json.loads(doctor.stdout)["problems"] == [
        f"schema version 3 is older than {SCHEMA_VERSION}: run `lgfs migrate`"
    ]
    text = cli("doctor", path)
    assert text.returncode == 1 and "schema version  3" in text.stdout, text.stdout
    assert read_bytes(path) == before and user_version(path) == 3

    migrated = lgfs("migrate", "--db", path)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout == f"{path}: migrated schema version 3 -> {SCHEMA_VERSION}\n"
    assert user_version(path) == SCHEMA_VERSION
    threads = parsed(cli("threads", path, "--json"))
    assert sorted(t["thread_id"] for t in threads) == ["order-1", "order-2", "order-3"]
    again = parsed(cli("migrate", path, "--json"))
    assert again == {
        "path": path,
        "migrated": False,
        "from_version": None,
        "schema_version": SCHEMA_VERSION,
    }
    assert cli("doctor", path).returncode == 0


WRITE_COMMANDS = (
    ["prune", "order-1", "--keep", "1", "--dry-run"],
    ["prune", "order-1", "--keep", "1", "--yes"],
    ["prune", "--all", "--keep", "1", "--dry-run"],
    ["compact", "order-1", "--before", "2", "--yes"],
    ["retract", "order-1", "--yes"],
    ["delete", "order-1", "--yes"],
    ["runs", "cancel", "order-1"],
    ["claims", "release", "order-1", "--yes"],
    ["claims", "take-over", "order-1", "--yes"],
    ["vacuum"],
)


def test_commands_that_write_refuse_an_older_file_unchanged_as_reads_do(
    demo: str, tmp_path: Any, cli: Any
) -> None:
    """Only `lgfs migrate` migrates: `prune --dry-run` and every writing command refuse too.

    Before, a command that writes (a dry run included) opened the file
    writable, which migrated it on the way: the workers still on the older
    version would then refuse it, from one operator's `prune --dry-run`.
    """
    from langgraph_fenced_sqlite.sqlite.schema import SCHEMA_VERSION

    path = str(tmp_path / "v3.db")
    make_v3_file(demo, path)
    before = read_bytes(path)
    for command in WRITE_COMMANDS:
        where = [path] if command[0] in ("runs", "claims") else ["--db", path]
        at = 2 if command[0] in ("runs", "claims") else 1
        args = [*command[:at], *where, *command[at:]]
        run = lgfs if command[0] == "vacuum" else cli  # one for real, in a process of its own
        done = run(*args)
        assert done.returncode == 4, (command, done.stderr)
        assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
        assert f"schema version 3 needs migrating to {SCHEMA_VERSION}, left unchanged" in (
            done.stderr
        )
        assert "lgfs migrate" in done.stderr and "read-only" not in done.stderr, done.stderr
        assert json.loads(cli(*args, "--json").stderr)["code"] == "schema_too_old"
        assert read_bytes(path) == before and user_version(path) == 3, command
    assert lgfs("migrate", "--db", path).returncode == 0
    assert cli("prune", "--db", path, "order-1", "--keep", "1", "--dry-run").returncode == 0


def test_migrate_refuses_a_newer_file_and_one_not_ours_unchanged(
    tmp_path: Any, demo: str, cli: Any
) -> None:
    """`lgfs migrate` upgrades only an older file of ours: the others exit 4, left as they were."""
    for make, words in ((_newer_schema, "is newer than"), (_not_a_database, "not an SQLite")):
        path = make(tmp_path, demo)
        before = read_bytes(path)
        done = cli("migrate", path)
        assert done.returncode == 4 and words in done.stderr, done.stderr
        assert read_bytes(path) == before


# --- the edges: huge numbers, damaged rows, corrupt files, unexpected errors ------------------


@pytest.mark.parametrize(
    "args",
    [
        ["history", "{}", "order-1", "--limit", str(2**63)],
        ["events", "{}", "order-1", "--after", str(2**63)],
        ["events", "{}", "order-1", "--limit", str(2**64)],
        ["prune", "{}", "order-1", "--keep", str(2**63), "--dry-run"],
    ],
    ids=["history-limit", "events-after", "events-limit", "prune-keep"],
)
def test_integers_beyond_64_bits_are_a_usage_error(demo: str, args: list[str]) -> None:
    """A count SQLite cannot hold is bad usage (exit 2), one line, never a traceback."""
    argv = [a.format(demo) for a in args]
    done = lgfs(*argv)
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and done.stderr.startswith("lgfs: error: ")
    assert len(done.stderr.splitlines()) == 1 and "2**63" in done.stderr
    as_json = lgfs(*argv, "--json")
    assert as_json.returncode == 2 and json.loads(as_json.stderr)["code"] == "usage"


DAMAGE = {
    "metadata-not-json": "UPDATE checkpoints SET metadata = '{bad' WHERE thread_id = 'order-1'",
    "envelope-not-object": "UPDATE checkpoints SET envelope = '[1,2]' WHERE thread_id = 'order-1'",
    "blob-garbage": "UPDATE checkpoints SET values_blob = x'c1deadbeef' WHERE thread_id='order-1'",
    "text-in-integer-columns": (
        "UPDATE checkpoints SET position = 'abc', created_at = 'x', token = 'zz', step = 's' "
        "WHERE thread_id = 'order-1'"
    ),
    "claim-cells-text": (
        "UPDATE threads SET expires_at = 'soon', token = 'tok' WHERE thread_id = 'order-2'"
    ),
    "floor-text": "UPDATE threads SET floor = 'f' WHERE thread_id = 'order-1'",
    "event-data-not-json": "UPDATE events SET data = 'nope' WHERE thread_id = 'order-1'",
    "event-text-in-real-column": "UPDATE events SET ts = 'x', token = 'y'",
    "write-blob-garbage": "UPDATE writes SET blob = x'c1c1c1' WHERE thread_id = 'order-1'",
}
READERS = {
    "show": ["show", "{}", "order-1"],
    "diff": ["diff", "{}", "order-1"],
    "history": ["history", "{}", "order-1"],
    "events": ["events", "{}", "order-1"],
    "threads": ["threads", "{}"],
    "claims": ["claims", "{}"],
    "doctor": ["doctor", "{}"],
}


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_rows_never_print_a_traceback_and_json_stays_json(
    copy: str, cli: Any, damage: str
) -> None:
    """Every reading command on a planted damaged row: no traceback; `--json` gives JSON.

    A damaged row is a problem found (exit 0 when it is not the row shown, or
    1 with the row's error in the document), never an internal error (7).
    """
    conn = sqlite3.connect(copy)
    assert conn.execute(DAMAGE[damage]).rowcount >= 1
    conn.commit()
    conn.close()
    for name, args in READERS.items():
        argv = [a.format(copy) for a in args]
        # The real command for the --json runs of the commands that decode
        # rows; the same main() in this process otherwise (a subprocess costs
        # seconds on a loaded machine, and 126 of them would be minutes).
        for mode in ([], ["--json"]):
            real = mode and name in ("show", "threads", "events")
            done = lgfs(*argv, *mode) if real else cli(*argv, *mode)
            where = (damage, name, mode, done.returncode, done.stderr[-600:])
            assert "Traceback" not in done.stderr, where
            assert done.returncode in (0, 1), where
            if mode:
                if done.stdout:
                    json.loads(done.stdout)
                else:
                    assert json.loads(done.stderr)["code"] == "undecodable_row", where
            elif done.returncode:
                assert done.stdout or done.stderr.startswith("lgfs: error: "), where


def test_doctor_reports_a_file_with_damaged_pages_as_an_integrity_failure(copy: str) -> None:
    """Bytes overwritten in the middle of the file's pages: doctor exits 1 and says so."""
    conn = sqlite3.connect(copy)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    size = os.path.getsize(copy)
    page = 4096
    with open(copy, "r+b") as f:
        for n in range(1, size // page):  # page 0 holds the header and the schema
            f.seek(n * page)
            f.write(b"\xff" * 12)  # every b-tree page header
    for mode in ([], ["--json"]):
        done = lgfs("doctor", copy, *mode)
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr
        if mode:
            report = json.loads(done.stdout)
            assert report["ok"] is False and "integrity_check" in report["problems"][0]
            assert "malformed" in report["problems"][0]
        else:
            assert "PROBLEMS" in done.stdout


def test_an_unexpected_error_is_one_line_with_exit_7(demo: str, cli: Any, monkeypatch: Any) -> None:
    """A bug anywhere below a command is converted like any error: no traceback, exit 7."""

    def broken(self: Any, **filters: Any) -> Any:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(FencedSqliteSaver, "search_threads", broken)
    done = cli("threads", demo)
    assert done.returncode == 7 and done.stdout == ""
    assert done.stderr == "lgfs: error: internal error: ZeroDivisionError: boom\n"
    as_json = cli("threads", demo, "--json")
    assert as_json.returncode == 7 and as_json.stdout == ""
    assert json.loads(as_json.stderr) == {
        "code": "internal_error",
        "message": "internal error: ZeroDivisionError: boom",
    }
