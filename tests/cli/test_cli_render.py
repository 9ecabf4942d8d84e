"""What `lgfs` shows a person: messages, waiting interrupts, diffs, tables that fit, colour.

Run for real (`python -m langgraph_fenced_sqlite`) on a file made by a real
agent graph (`support/graphs.py`: tool calls and a `ToolMessage`, a `Send`
fan-out, a subgraph, `interrupt()`s, a failed node, a live claim). Widths are
checked with `COLUMNS=80` off a terminal, and on a real pseudo-terminal
(`pty`) of 80 columns for colour; `events --follow` runs in tmux.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
import time
from typing import Any

import pytest
from support.configs import config
from support.graphs import QUESTION, UUID_THREAD, build_agent, make_agent_file
from support.processes import TESTS_DIR

from langgraph_fenced_sqlite import FencedSqliteSaver

ANSI = re.compile(r"\x1b\[[0-9;]*m")
SHOW_KEYS = {
    "thread_id",
    "checkpoint_ns",
    "checkpoint_id",
    "parent_checkpoint_id",
    "position",
    "token",
    "created_at",
    "metadata",
    "step",
    "source",
    "run_id",
    "values",
    "writes",
    "error",
}


@pytest.fixture(scope="module")
def agent_db(tmp_path_factory: Any) -> str:
    """The agent file (read-only use)."""
    path = str(tmp_path_factory.mktemp("agent") / "agent.db")
    make_agent_file(path)
    return path


def lgfs(*args: str, columns: int | None = 80, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the real command off a terminal, `COLUMNS` set (unless None), colour asked for."""
    environ = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR")}
    environ.update({"TERM": "xterm-256color", **env})
    if columns is not None:
        environ["COLUMNS"] = str(columns)
    done = subprocess.run(
        [sys.executable, "-m", "langgraph_fenced_sqlite", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=environ,
        stdin=subprocess.DEVNULL,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def fits(text: str, width: int = 80) -> None:
    """Every line of `text` takes at most `width` columns."""
    wide = [line for line in text.splitlines() if len(line) > width]
    assert not wide, wide


def checkpoint_with(db: str, thread_id: str, n_messages: int) -> str:
    """The oldest checkpoint (found through LangGraph) whose state holds `n_messages`."""
    with FencedSqliteSaver(db) as saver:
        states = list(build_agent(saver).get_state_history(config(thread_id)))
    found = [s for s in states if len(s.values.get("messages", [])) == n_messages]
    return str(found[-1].config["configurable"]["checkpoint_id"])


# --- show -----------------------------------------------------------------------------------


def test_show_renders_messages_tool_calls_and_the_waiting_interrupt(agent_db: str) -> None:
    done = lgfs("show", agent_db, "chat-1")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    lines = out.splitlines()
    fits(out)
    assert "\x1b" not in out  # not a terminal: no colour
    assert 'waiting at review: {"question": "send the report?", "summary": "3 cities' in out
    assert "status      interrupted, run " in out
    assert "  messages: 4 messages" in lines
    human = next(line for line in lines if line.startswith("    human: "))
    assert human.startswith("    human: What is the weather in Paris? Please be thorough")
    assert human.endswith("\u2026") and len(human) == 80  # cut to the terminal, marked
    assert '    ai -> get_weather(city="Paris")  [call_1]' in lines
    assert "    tool get_weather [call_1]: sunny in Paris, 21C" in lines
    assert "    ai: It is sunny in Paris, 21C." in lines
    assert '  profile: {"user": "ana", "lang": "en", "tz": "CET"}' in lines
    values = out.split("values:", 1)[1].split("metadata:", 1)[0]
    assert "__pregel_tasks:" not in values and "branch:to:review:" not in values
    assert "internal channels hidden: " in values and "--all-channels" in values
    assert "  review -> __interrupt__: " in out  # the pending write, by node

    full = lgfs("show", agent_db, "chat-1", "--full", "--all-channels").stdout
    assert f"    human: {QUESTION}" in full.splitlines()  # the whole text, uncut
    assert "  __pregel_tasks: " in full and "  branch:to:review: " in full
    assert "hidden" not in full

    shown = json.loads(lgfs("show", agent_db, "chat-1", "--json").stdout)
    assert set(shown) == SHOW_KEYS  # --json keeps its shape
    assert "__pregel_tasks" in shown["values"]  # and hides nothing
    assert shown["values"]["messages"][0]["content"] == QUESTION


@pytest.mark.parametrize(
    ("thread_id", "line"),
    [
        ("chat-2", 'waiting at worker: {"approve city": "Lyon"}'),  # a Send-ed task
        ("chat-3", 'waiting at research: "summary ok?"'),  # inside the subgraph
        ("chat-4", "failed at agent: ValueError('model timed out')"),
    ],
)
def test_show_names_the_node_that_waits_or_failed(agent_db: str, thread_id: str, line: str) -> None:
    done = lgfs("show", agent_db, thread_id)
    assert done.returncode == 0, done.stderr
    assert line in done.stdout.splitlines()
    assert done.stdout.count("waiting at ") == (1 if "waiting" in line else 0)
    fits(done.stdout)


def test_show_says_who_runs_a_claimed_thread_and_nothing_waits_once_resumed(agent_db: str) -> None:
    with FencedSqliteSaver(agent_db) as saver:
        claim = saver.current_claim("chat-5")
    assert claim is not None
    # The one-hour claim was granted when the module's file was made, which under
    # pytest-xdist can be minutes before this test runs: hold the time shown to
    # what was left of it just before and just after the command ran.
    most = claim.expires_at - time.time()
    running = lgfs("show", agent_db, "chat-5").stdout
    least = claim.expires_at - time.time()
    status = next(line for line in running.splitlines() if line.startswith("status"))
    assert status.startswith("status      running (claim: worker-7 token ")
    shown = re.search(r", expires in (?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?\)$", status)
    assert shown is not None and shown.group(0) != ", expires in )", status
    h, m, s = (int(g or 0) for g in shown.groups())
    assert int(least) <= 3600 * h + 60 * m + s <= most, (status, least, most)
    assert "waiting at" not in running
    idle = lgfs("show", agent_db, "chat-6").stdout
    assert "status      idle" in idle and "waiting at" not in idle
    # An older checkpoint: no thread status line, its own interrupt if any.
    older = checkpoint_with(agent_db, "chat-1", 2)
    shown = lgfs("show", agent_db, "chat-1", "--checkpoint", older).stdout
    assert "status " not in shown and "waiting at" not in shown


def test_show_calls_a_run_whose_worker_died_failed(agent_db: str, tmp_path: Any) -> None:
    """`run_started` logged, no end, the claim expired: the worker is gone."""
    db = str(tmp_path / "died.db")
    shutil.copyfile(agent_db, db)
    with FencedSqliteSaver(db) as saver:
        claim = saver.begin_run("chat-6", "worker-9", 0.2, run_id="run-9")
        while saver.clock.now() < claim.expires_at:  # wait for the store's clock to pass it
            select.select([], [], [], 0.05)
    shown = lgfs("show", db, "chat-6").stdout.splitlines()
    status = next(line for line in shown if line.startswith("status"))
    assert status.startswith("status      failed: run 'run-9' of 'worker-9' stopped without ending")
    assert "expired" in status


# --- diff -----------------------------------------------------------------------------------


def test_diff_shows_appended_messages_changed_keys_and_scalars(agent_db: str) -> None:
    before, after = checkpoint_with(agent_db, "chat-1", 2), checkpoint_with(agent_db, "chat-1", 4)
    done = lgfs("diff", agent_db, "chat-1", "--from", before, "--to", after)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == [f"from  {before}", f"to    {after}"]
    assert lines[2:9] == [
        "~ messages: +2 messages",
        "    + tool get_weather [call_1]: sunny in Paris, 21C",
        "    + ai: It is sunny in Paris, 21C.",
        "~ profile: 1 added, 1 changed keys",
        '    ~ lang: "fr" -> "en"',
        '    + tz: "CET"',
        "~ turns: 1 -> 2",
    ]
    assert "What is the weather" not in done.stdout  # unchanged messages are not dumped
    assert lines[-1].startswith("(2 internal channels changed: ")
    fits(done.stdout)
    everything = lgfs("diff", agent_db, "chat-1", "--from", before, "--to", after, "--all-channels")
    shown = [line[2:].split(":")[0] for line in everything.stdout.splitlines() if line[:1] in "+-~"]
    assert "__pregel_tasks" in shown and "branch" in shown and "hidden" not in everything.stdout

    doc = json.loads(
        lgfs("diff", agent_db, "chat-1", "--from", before, "--to", after, "--json").stdout
    )
    assert set(doc) == {"thread_id", "checkpoint_ns", "from", "to", "changes", "errors"}
    by_channel = {c["channel"]: c for c in doc["changes"]}
    assert by_channel["turns"] == {"channel": "turns", "change": "changed", "before": 1, "after": 2}
    assert len(by_channel["messages"]["after"]) == 4  # the JSON still has both values whole


def test_diff_of_the_fan_out_lists_the_items_appended(agent_db: str) -> None:
    with FencedSqliteSaver(agent_db) as saver:
        states = list(build_agent(saver).get_state_history(config("chat-6")))
    fanned = next(s for s in reversed(states) if len(s.values.get("results", [])) == 3)
    done = lgfs("diff", agent_db, "chat-6", "--to", fanned.config["configurable"]["checkpoint_id"])
    assert done.returncode == 0, done.stderr
    assert "~ results: +3 items" in done.stdout or "+ results: " in done.stdout
    for city in ("Paris", "Lyon", "Nice"):
        assert f'"checked {city}"' in done.stdout
    fits(done.stdout)


# --- tables fit the terminal -------------------------------------------------------------------


def test_tables_fit_80_columns_and_keep_ids_whole(agent_db: str) -> None:
    with FencedSqliteSaver(agent_db) as saver:
        ids = [r["checkpoint_id"] for r in saver.history_records("chat-1", limit=100)]
        run_id = saver.history_records("chat-1", limit=1)[0]["run_id"]
    history = lgfs("history", agent_db, "chat-1").stdout
    fits(history)
    rows = history.splitlines()
    assert rows[0].split()[:3] == ["POS", "CHECKPOINT", "STEP"] and "PARENT" not in rows[0]
    assert [row.split()[1] for row in rows[1:]] == ids  # whole ids: they can be pasted
    assert run_id[:8] in history and run_id not in history  # a uuid run id, shortened
    wide = lgfs("history", agent_db, "chat-1", columns=200).stdout
    assert wide.splitlines()[0].split()[-2:] == ["PARENT", "TIME"] and run_id in wide
    full = lgfs("history", agent_db, "chat-1", "--full").stdout
    assert "PARENT" in full.splitlines()[0]  # --full: nothing fitted

    threads = lgfs("threads", agent_db).stdout
    fits(threads)
    assert threads.splitlines()[0].split()[0] == "THREAD"
    assert "worker-7 token" in threads
    assert any(line.startswith("chat-1 ") for line in threads.splitlines())
    assert UUID_THREAD[:8] in threads  # a 36-character thread id still fits, cut in the middle
    assert "LAST ACTIVITY" in lgfs("threads", agent_db, columns=200).stdout

    for args in (["claims", agent_db], ["events", agent_db, "chat-1"]):
        done = lgfs(*args)
        assert done.returncode == 0, done.stderr
        fits(done.stdout)
    events = lgfs("events", agent_db, "chat-1").stdout.splitlines()
    assert events[0].split()[0] == "1" and "run_started" in events[0]
    assert any("tools: messages" in line for line in events)
    with FencedSqliteSaver(agent_db) as saver:
        first = saver.events_after("chat-1", 0, limit=1)[0].to_dict()
    full_event = lgfs("events", agent_db, "chat-1", "--full", "--limit", "1").stdout
    assert first["data"]["run_id"] in full_event and len(full_event.rstrip()) > 80
    nl = lgfs("events", agent_db, "chat-1", "--nl", "--limit", "1").stdout
    assert json.loads(nl) == first  # --nl unchanged


# --- colour, only on a terminal -----------------------------------------------------------------


def on_a_terminal(*args: str, columns: int = 80, **env: str) -> str:
    """Run the real command on a pseudo-terminal `columns` wide; return what it drew."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    environ = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    environ.update({"TERM": "xterm-256color", **env})
    proc = subprocess.Popen(
        [sys.executable, "-m", "langgraph_fenced_sqlite", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=environ,
        close_fds=True,
    )
    os.close(slave)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 60)
            if not ready:
                break
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(master)
        assert proc.wait(timeout=60) == 0
    return b"".join(chunks).decode("utf-8").replace("\r\n", "\n")


def test_colour_only_on_a_terminal_and_never_with_no_color(agent_db: str) -> None:
    drawn = on_a_terminal("show", agent_db, "chat-1")
    assert "\x1b[" in drawn
    plain = ANSI.sub("", drawn)
    fits(plain)  # the terminal's own width, from the terminal (no COLUMNS)
    assert "waiting at review: " in plain and "    tool get_weather [call_1]: " in plain
    table = on_a_terminal("history", agent_db, "chat-1")
    assert table.startswith("\x1b[1mPOS")  # a bold header
    fits(ANSI.sub("", table))
    assert "\x1b" not in on_a_terminal("show", agent_db, "chat-1", NO_COLOR="1")
    assert "\x1b" not in on_a_terminal("history", agent_db, "chat-1", TERM="dumb")
    wide = ANSI.sub("", on_a_terminal("history", agent_db, "chat-1", columns=200))
    assert "PARENT" in wide.splitlines()[0]  # the terminal is wide: every column
    threads = on_a_terminal("threads", agent_db)
    assert "\x1b[31mfailed at agent: ValueError\x1b[0m" in threads  # STATUS, by state
    assert "\x1b[32mrunning (worker-7, " in threads and "\x1b[33minterrupted at " in threads
    fits(ANSI.sub("", threads))
    assert "\x1b" not in on_a_terminal("threads", agent_db, NO_COLOR="1")


# --- events --follow in a real terminal (tmux) ------------------------------------------------

WRITER = """
import sys
sys.path.insert(0, sys.argv[2])
from support.configs import config
from support.graphs import build_agent
from langgraph.types import Command
from langgraph_fenced_sqlite import FencedRunner, FencedSqliteSaver
with FencedSqliteSaver(sys.argv[1]) as saver:
    FencedRunner(build_agent(saver), saver, holder="worker-8").invoke(
        Command(resume="yes"), config("chat-1"))
"""


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (.ci/run installs it)")
def test_events_follow_in_a_terminal_prints_new_events_fitted_and_stops_on_ctrl_c(
    agent_db: str, tmp_path: Any
) -> None:
    db = str(tmp_path / "follow.db")
    shutil.copyfile(agent_db, db)
    with FencedSqliteSaver(db) as saver:
        last = saver.events_after("chat-1", 0, limit=1000)[-1].seq
    socket = f"lgfs-test-{os.getpid()}"
    tmux = ["tmux", "-L", socket, "-f", "/dev/null"]
    command = (
        f"{sys.executable} -m langgraph_fenced_sqlite events {db} chat-1 --follow "
        f"--after {last}; echo EXIT=$?; sleep 600"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR", "TMUX")}
    run = dict(env={**env, "TERM": "xterm-256color"}, check=True, timeout=60)
    subprocess.run([*tmux, "new-session", "-d", "-s", "t", "-x", "80", "-y", "50", command], **run)
    try:

        def screen(*flags: str) -> str:
            args = [*tmux, "capture-pane", "-p", "-J", "-t", "t", *flags]
            return subprocess.run(args, capture_output=True, text=True, **run).stdout

        writer = subprocess.run(
            [sys.executable, "-c", WRITER, db, TESTS_DIR],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert writer.returncode == 0, writer.stderr
        with FencedSqliteSaver(db) as saver:
            new = [e.seq for e in saver.events_after("chat-1", last, limit=1000)]
        assert new
        deadline = 600
        while deadline and f"{new[-1]:>6}  " not in screen():
            deadline -= 1
            select.select([], [], [], 0.1)
        drawn = screen()
        seqs = [int(line.split()[0]) for line in drawn.splitlines() if line.strip()[:1].isdigit()]
        assert seqs == new  # each new event once, in order
        assert "run_completed" in drawn and "writes" in drawn
        fits(drawn)
        assert "\x1b[" in screen("-e")  # drawn in colour on the terminal
        subprocess.run([*tmux, "send-keys", "-t", "t", "C-c"], **run)
        deadline = 600
        while deadline and "EXIT=" not in screen():
            deadline -= 1
            select.select([], [], [], 0.1)
        assert "EXIT=0" in screen() and "Traceback" not in screen()
    finally:
        subprocess.run([*tmux, "kill-server"], timeout=60, capture_output=True)
