"""`lgfs` for an operator: statuses, claims in hand, one way to name the file, sweeps, vacuum.

Run for real (`python -m langgraph_fenced_sqlite`) on the file `support.graphs.make_ops_file`
writes with real graphs (a subgraph, an interrupt, the runner): `done` (idle),
`waiting` (interrupted at `ask`), `broken` (failed), `busy` (claimed live by
`worker-9`), `old` (idle for 40 days) and `plain` (no runner). Variants of
one command run `main()` in this process; workers fenced off are real
processes.
"""

from __future__ import annotations

import getpass
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from queue import Queue
from typing import Any

import pytest
from langgraph.types import Command
from support.configs import config
from support.files import dump, file_fixtures
from support.graphs import build_ops_graph, make_ops_file
from support.processes import TESTS_DIR, WRITE_LOCKER, lgfs, parsed, python, reap

from langgraph_fenced_sqlite import FencedSqliteSaver

# The six-thread file (read-only use), and `ops`, a private copy to change.
ops_master, ops = file_fixtures(make_ops_file, "ops_master", "ops", "ops.db")


def one_line_error(done: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert done.returncode == code, (done.returncode, done.stderr)
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("lgfs: error: ") and "Traceback" not in done.stderr
    for word in words:
        assert word in done.stderr, (word, done.stderr)


# --- threads: STATUS and filters ---------------------------------------------------------------


def test_threads_shows_a_status_and_filters_by_it(ops_master: str, cli: Any) -> None:
    threads = parsed(lgfs("threads", "--db", ops_master, "--json"))
    status = {t["thread_id"]: t["status"] for t in threads}
    assert {t: s["state"] for t, s in status.items()} == {
        "done": "idle",
        "waiting": "interrupted",
        "broken": "failed",
        "busy": "running",
        "old": "idle",
        "plain": "idle",
    }
    assert status["waiting"]["node"] == "ask"
    assert status["busy"]["holder"] == "worker-9"
    assert status["broken"]["reason"] == "ValueError: the model call failed"
    text = lgfs("threads", ops_master)
    assert text.returncode == 0
    lines = {line.split()[0]: line for line in text.stdout.splitlines()[1:]}
    assert "running (worker-9, expires in " in lines["busy"]
    assert "interrupted at ask" in lines["waiting"]
    assert lines["broken"].split()[1] == "failed" and lines["done"].split()[1] == "idle"
    failed = parsed(cli("threads", ops_master, "--status", "failed", "--json"))
    assert [t["thread_id"] for t in failed] == ["broken"]
    two = parsed(
        cli("threads", ops_master, "--status", "running", "--status", "interrupted", "--json")
    )
    assert {t["thread_id"] for t in two} == {"busy", "waiting"}
    idle = parsed(lgfs("threads", ops_master, "--inactive-for", "30d", "--json"))
    assert [t["thread_id"] for t in idle] == ["old"]
    assert parsed(cli("threads", ops_master, "--inactive-for", "41d", "--json")) == []


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--inactive-for", "soon"], ["--inactive-for", "duration"]),
        (["--inactive-for", "-3d"], ["--inactive-for"]),
        (["--status", "sleeping"], ["--status", "idle", "failed"]),
    ],
)
def test_bad_thread_filters_name_the_option(
    ops_master: str, cli: Any, args: list[str], words: list[str]
) -> None:
    one_line_error(cli("threads", ops_master, *args), 2, *words)


# --- claims release / take-over --------------------------------------------------------------


def test_release_needs_yes_fences_the_holder_off_and_names_the_operator(ops: str, cli: Any) -> None:
    rows = dump(ops)
    refused = lgfs("claims", "release", "busy", "--db", ops)
    one_line_error(refused, 6, "--yes", "worker-9")
    assert dump(ops) == rows
    with FencedSqliteSaver(ops) as saver:
        held = saver.current_claim("busy")
    assert held is not None
    done = parsed(lgfs("claims", "release", ops, "busy", "--yes", "--operator", "alice", "--json"))
    assert done["released"]["holder"] == "worker-9" and done["operator"] == "alice"
    (event,) = parsed(cli("events", ops, "busy", "--kind", "claim_released_by_operator", "--json"))
    assert event["data"]["operator"] == "alice"
    assert event["data"]["previous_holder"] == "worker-9"
    assert event["data"]["previous_token"] == held.token and event["data"]["was_live"] is True
    assert "busy" not in {c["thread_id"] for c in parsed(cli("claims", ops, "--json"))}
    with FencedSqliteSaver(ops) as saver:
        assert saver.release("busy", held.token) is False  # the old holder changes nothing
        assert saver.thread_status("busy").state == "interrupted"
    again = cli("claims", "release", ops, "busy", "--yes")
    assert again.returncode == 0 and "no claim" in again.stdout
    one_line_error(cli("claims", "release", ops, "nobody", "--yes"), 3, "nobody")


def test_take_over_needs_yes_and_holds_the_thread_for_the_operator(ops: str, cli: Any) -> None:
    rows = dump(ops)
    one_line_error(cli("claims", "take-over", ops, "busy"), 6, "--yes")
    assert dump(ops) == rows
    done = parsed(
        lgfs("claims", "take-over", "busy", "--db", ops, "--yes", "--ttl", "10m", "--json")
    )
    me = f"{getpass.getuser()}@{socket.gethostname()}"
    assert done["operator"] == me and done["claim"]["holder"] == me
    assert done["previous"]["holder"] == "worker-9"
    assert done["claim"]["token"] > done["previous"]["token"]
    (event,) = parsed(cli("events", ops, "busy", "--kind", "claim_taken_over", "--json"))
    assert event["token"] == done["claim"]["token"]
    assert event["data"]["operator"] == me and event["data"]["previous_holder"] == "worker-9"
    claims = {c["thread_id"]: c for c in parsed(cli("claims", ops, "--json"))}
    assert claims["busy"]["holder"] == me and claims["busy"]["live"] is True
    assert 590 < claims["busy"]["expires_in"] <= 600
    text = cli("claims", "release", ops, "busy", "--yes")
    assert text.returncode == 0 and f"released the claim of {me}" in text.stdout


@pytest.mark.parametrize(
    "args",
    [["release"], ["take-over", "a", "b", "c"], ["x", "y"]],
    ids=["no-thread", "too-many", "list-too-many"],
)
def test_claims_usage_errors(ops_master: str, cli: Any, args: list[str]) -> None:
    one_line_error(cli("claims", *args, "--db", ops_master), 2, "lgfs claims")


WORKER = """
import json, sys
sys.path.insert(0, sys.argv[2])
from support.configs import config
from support.graphs import OpsState
from langgraph.graph import START, StateGraph
from langgraph_fenced_sqlite import FencedRunner, FencedSqliteError, FencedSqliteSaver

def slow(state):
    print(json.dumps({"in_node": True}), flush=True)
    sys.stdin.readline()  # an operator acts meanwhile
    return {"items": ["after the operator"]}

g = StateGraph(OpsState)
g.add_node("slow", slow)
g.add_node("next", lambda s: {"items": ["next node"]})
g.add_edge(START, "slow")
g.add_edge("slow", "next")
with FencedSqliteSaver(sys.argv[1]) as saver:
    runner = FencedRunner(g.compile(checkpointer=saver), saver, holder="worker-7", ttl=600)
    try:
        runner.invoke({"count": 0}, config("job"))
    except FencedSqliteError as exc:
        print(json.dumps(exc.to_dict()), flush=True)
    else:
        print(json.dumps({"code": "completed"}), flush=True)
"""


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("action", ["release", "take-over"])
def test_a_worker_in_another_process_is_fenced_off_by_the_operator(
    tmp_path: Any, action: str
) -> None:
    path = str(tmp_path / "w.db")
    FencedSqliteSaver(path).close()
    worker = python(WORKER, path, TESTS_DIR)
    try:
        assert worker.stdin is not None and worker.stdout is not None
        line = worker.stdout.readline()
        assert json.loads(line or "{}") == {"in_node": True}, (
            worker.stderr.read() if not line else ""
        )
        with FencedSqliteSaver(path) as saver:
            token = saver.current_claim("job").token
        done = lgfs("claims", action, "job", "--db", path, "--yes", "--operator", "ops")
        assert done.returncode == 0, done.stderr
        worker.stdin.write("go\n")
        worker.stdin.flush()
        refused = json.loads(worker.stdout.readline())
        assert worker.wait(timeout=60) == 0
    finally:
        reap(worker)
    assert refused["code"] == "stale_claim" and refused["token"] == token
    with FencedSqliteSaver(path) as saver:
        events = saver.events_after("job", 0, limit=1000)
        status = saver.thread_status("job")
        tup = saver.get_tuple(config("job"))
    kind = "claim_released_by_operator" if action == "release" else "claim_taken_over"
    mark = next(i for i, e in enumerate(events) if e.kind == kind)
    assert events[mark].data["previous_holder"] == "worker-7"
    assert all(e.token != token for e in events[mark:]), "the fenced worker wrote after"
    assert tup is not None
    assert "after the operator" not in tup.checkpoint["channel_values"].get("items", [])
    assert status.state == ("idle" if action == "release" else "running")


# --- events --kind, --follow on a thread not there yet ------------------------------------------


def test_events_kind_filters_and_limit_counts_what_matches(ops_master: str, cli: Any) -> None:
    every = parsed(cli("events", ops_master, "done", "--json"))
    kinds = {"run_started", "run_completed"}
    got = parsed(
        lgfs(
            "events",
            ops_master,
            "done",
            "--kind",
            "run_started",
            "--kind",
            "run_completed",
            "--json",
        )
    )
    assert got == [e for e in every if e["kind"] in kinds] and len(got) == 3
    first = parsed(
        cli("events", ops_master, "done", "--kind", "run_started", "--limit", "1", "--json")
    )
    assert first == [next(e for e in every if e["kind"] == "run_started")]
    assert parsed(cli("events", ops_master, "done", "--kind", "nothing-such", "--json")) == []
    one_line_error(cli("events", ops_master, "not-yet"), 3, "not-yet")


@pytest.mark.slow
@pytest.mark.subprocess
def test_follow_waits_for_a_thread_that_does_not_exist_yet(ops: str) -> None:
    follow = subprocess.Popen(
        [sys.executable, "-m", "langgraph_fenced_sqlite", "events", "fresh", "--follow", "--nl"]
        + ["--kind", "run_started", "--kind", "run_interrupted"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "LGFS_PATH": ops},
    )
    lines: Queue[str] = Queue()
    assert follow.stdout is not None and follow.stderr is not None
    reader = threading.Thread(target=lambda: [lines.put(x) for x in follow.stdout], daemon=True)
    reader.start()
    try:
        with FencedSqliteSaver(ops) as saver:
            from langgraph_fenced_sqlite import FencedRunner

            FencedRunner(build_ops_graph(saver), saver).invoke({"count": 1}, config("fresh"))
            expected = [
                e.to_dict()
                for e in saver.events_after("fresh", 0, limit=1000)
                if e.kind in ("run_started", "run_interrupted")
            ]
        got = [json.loads(lines.get(timeout=60)) for _ in expected]
        assert got == expected and [e["kind"] for e in got] == ["run_started", "run_interrupted"]
        follow.send_signal(signal.SIGINT)
        assert follow.wait(timeout=60) == 0
        assert follow.stderr.read() == ""
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
        follow.stdout.close()
        follow.stderr.close()


# --- one way to name the file ------------------------------------------------------------------

SAME_OUTPUT = [
    ["history", "{}", "done", "--limit", "3", "--json"],
    ["show", "{}", "waiting", "--json"],
    ["diff", "{}", "done", "--json"],
    ["events", "{}", "done", "--limit", "4", "--json"],
    ["prune", "{}", "done", "--keep", "1", "--dry-run", "--json"],
    ["compact", "{}", "done", "--before", "3"],
]


@pytest.mark.parametrize("args", SAME_OUTPUT, ids=[a[0] for a in SAME_OUTPUT])
def test_every_command_takes_db_lgfs_path_or_path(
    ops_master: str, cli: Any, args: list[str]
) -> None:
    old = cli(*[a.format(ops_master) for a in args])
    rest = [a for a in args if a != "{}"]
    flag = cli(*rest, "--db", ops_master)
    outer = cli("--db", ops_master, *rest)
    env = cli(*rest, env={"LGFS_PATH": ops_master})
    assert old.returncode in (0, 6)  # compact asks for --yes: the same refusal every way
    for other in (flag, outer, env):
        assert (other.returncode, other.stdout, other.stderr) == (
            old.returncode,
            old.stdout,
            old.stderr,
        )


def test_the_listing_commands_take_it_too(ops_master: str, cli: Any) -> None:
    for command in ("threads", "claims", "doctor"):
        old = parsed(cli(command, ops_master, "--json"))
        env = parsed(lgfs(command, "--json", env={"LGFS_PATH": ops_master}))
        flag = parsed(cli(command, "--db", ops_master, "--json"))
        if command == "doctor":
            assert old == env == flag
        else:
            ids = [[x["thread_id"] for x in doc] for doc in (old, env, flag)]
            assert ids[0] == ids[1] == ids[2] and ids[0]


def test_prune_takes_its_threads_after_db_or_lgfs_path(ops_master: str, cli: Any) -> None:
    args = ["--keep", "1", "--dry-run", "--json"]
    expected = parsed(cli("prune", ops_master, "done", "old", *args))
    assert [r["thread_id"] for r in expected] == ["done", "old"]
    assert parsed(cli("prune", "--db", ops_master, "done", "old", *args)) == expected
    assert parsed(cli("prune", "done", "old", *args, env={"LGFS_PATH": ops_master})) == expected
    # With $LGFS_PATH set, a first argument naming an existing file is still the file.
    elsewhere = parsed(cli("prune", ops_master, "done", "old", *args, env={"LGFS_PATH": "x.db"}))
    assert elsewhere == expected


def test_naming_the_file_twice_or_not_at_all_is_a_usage_error(
    ops_master: str, cli: Any, tmp_path: Any
) -> None:
    other = str(tmp_path / "other.db")
    one_line_error(cli("history", ops_master, "done", "--db", other), 2, "named twice")
    one_line_error(cli("--db", other, "threads", "--db", ops_master), 2, "--db", "twice")
    one_line_error(cli("history", "done"), 2, "--db", "LGFS_PATH")
    one_line_error(cli("vacuum"), 2, "--db", "LGFS_PATH")
    # The same file twice is no conflict.
    assert cli("threads", ops_master, "--db", ops_master).returncode == 0


# --- --ns prefixes -----------------------------------------------------------------------------


def test_ns_takes_a_unique_prefix_and_lists_what_exists(ops: str, cli: Any) -> None:
    with FencedSqliteSaver(ops) as saver:
        graph = build_ops_graph(saver)
        for _ in range(2):  # two subgraph runs: two `sub:` namespaces
            graph.invoke({"count": 0}, config("twice"))
            graph.invoke(Command(resume="ok"), config("twice"))
        (sub,) = [ns for ns in saver.namespaces("done") if ns]
        runs = [ns for ns in saver.namespaces("twice") if ns]
    full = parsed(cli("history", ops, "done", "--ns", sub, "--json"))
    assert full and parsed(lgfs("history", ops, "done", "--ns", "sub", "--json")) == full
    shown = parsed(cli("show", ops, "done", "--ns", "sub", "--json"))
    assert shown["checkpoint_ns"] == sub
    missing = cli("history", ops, "done", "--ns", "agent")
    one_line_error(missing, 2, "no namespace starts with 'agent'", repr(sub), "''")
    several = cli("show", ops, "twice", "--ns", "sub")
    one_line_error(several, 2, "several namespaces", *[repr(ns) for ns in runs])
    unique = runs[0][: len("sub:") + 8]
    assert parsed(cli("diff", ops, "twice", "--ns", unique, "--json"))["checkpoint_ns"] == runs[0]
    assert parsed(cli("history", ops, "done", "--ns", "", "--json"))[0]["checkpoint_ns"] == ""
    with FencedSqliteSaver(ops) as saver:
        saver.claim("empty", "w", 60)  # a thread with no checkpoint yet
    assert parsed(cli("history", ops, "empty", "--json")) == []


# --- prune --all, --keep-subgraph-runs ------------------------------------------------------------


def test_prune_all_sweeps_idle_threads_after_a_yes(ops: str, cli: Any) -> None:
    rows = dump(ops)
    refused = lgfs("prune", "--all", "--inactive-for", "30d", "--db", ops)
    one_line_error(refused, 6, "--yes", "1 thread")
    assert dump(ops) == rows
    dry = parsed(cli("prune", "--all", "--inactive-for", "30d", "--db", ops, "--dry-run", "--json"))
    assert dump(ops) == rows
    assert [r["thread_id"] for r in dry["pruned"]] == ["old"] and dry["dry_run"] is True
    done = parsed(lgfs("prune", "--all", "--inactive-for", "30d", "--db", ops, "--yes", "--json"))
    assert done["pruned"] == dry["pruned"] and done["busy"] == [] and done["errors"] == []
    threads = {t["thread_id"]: t for t in parsed(cli("threads", ops, "--json"))}
    assert threads["old"]["namespaces"] == [""] and threads["old"]["checkpoints"] == 1
    assert threads["done"]["checkpoints"] > 1  # active within 30 days: untouched
    # Every thread, with a policy: the live claim is left alone, and said so.
    text = lgfs("prune", "--all", "--keep", "2", "--keep-subgraph-runs", "0", "--db", ops, "--yes")
    assert text.returncode == 0, text.stderr
    assert "left alone under a live claim: busy" in text.stdout
    assert "done: removed" in text.stdout
    with FencedSqliteSaver(ops) as saver:
        assert saver.namespaces("done") == [""]
        assert len(saver.namespaces("busy")) == 2
        out = build_ops_graph(saver).invoke(Command(resume="later"), config("waiting"))
    assert out["items"][-1] == "later"


def test_keep_subgraph_runs_on_named_threads(ops: str, cli: Any) -> None:
    done = parsed(cli("prune", ops, "done", "--keep-subgraph-runs", "0", "--yes", "--json"))
    assert done[0]["checkpoints"] and all(ns.startswith("sub:") for ns, _ in done[0]["checkpoints"])
    with FencedSqliteSaver(ops) as saver:
        assert saver.namespaces("done") == [""]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--all", "done"], ["--all"]),
        (["done", "--inactive-for", "1d", "--keep", "1"], ["--inactive-for", "--all"]),
        (["--all", "--inactive-for", "soon"], ["--inactive-for"]),
        (["--all", "--keep-subgraph-runs", "-1"], ["--keep-subgraph-runs"]),
        ([], ["--all"]),
    ],
)
def test_prune_usage_errors_name_the_option(
    ops_master: str, cli: Any, args: list[str], words: list[str]
) -> None:
    rows = dump(ops_master)
    one_line_error(cli("prune", "--db", ops_master, *args), 2, *words)
    assert dump(ops_master) == rows


# --- vacuum ------------------------------------------------------------------------------------


def _free_pages(path: str) -> None:
    with FencedSqliteSaver(path) as saver:
        graph = build_ops_graph(saver)
        for i in range(10):
            graph.invoke({"count": 0, "items": ["x" * 20000]}, config(f"big-{i}"))
            saver.delete_thread(f"big-{i}")


@pytest.mark.slow
@pytest.mark.subprocess
def test_vacuum_refuses_a_live_writer_unless_forced_and_prints_bytes(ops: str, cli: Any) -> None:
    _free_pages(ops)
    rows = dump(ops)
    one_line_error(lgfs("vacuum", "--db", ops), 5, "live claim", "'busy'", "--force")
    assert dump(ops) == rows
    with FencedSqliteSaver(ops) as saver:
        saver.force_release("busy", operator="test")
    locker = python(WRITE_LOCKER, ops)
    try:
        assert locker.stdout is not None and locker.stdin is not None
        assert locker.stdout.readline() == "locked\n"
        # A write lock held by another process: refused at once, with no claim left.
        one_line_error(cli("vacuum", ops), 5, "write lock")
        locker.stdin.write("done\n")
        locker.stdin.flush()
        assert locker.wait(timeout=60) == 0
    finally:
        reap(locker)
    report = parsed(lgfs("vacuum", ops, "--json"))
    assert report["bytes_after"] < report["bytes_before"]
    assert report["bytes_reclaimed"] == report["bytes_before"] - report["bytes_after"]
    assert dump(ops)["checkpoints"] == rows["checkpoints"]
    text = cli("vacuum", "--db", ops, "--force")
    assert text.returncode == 0 and text.stdout.startswith(f"vacuumed {ops}: ")
    assert " bytes (" in text.stdout and "reclaimed)" in text.stdout
