"""Thread expiry across real processes, on both stores: sweepers at once, a claim held
elsewhere, and `lgfs sweep --every` as a process of its own.

Every sweeper is a real process (`sys.executable`); each judges time by a
manual clock an hour ahead of the real one, so every thread written now is
due to them, and a claim taken now for two hours is live to them.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from typing import Any

import pytest
from support.postgres import as_url
from support.processes import lgfs, run_together, start

from langgraph_fenced_sqlite.testing._helpers import put_chain

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

# argv: store (a file path or a postgresql:// DSN), start flag, TTL strategy.
SWEEPER = """
import json, os, sys, time
from langgraph_fenced_sqlite import Expiry, ManualClock
target, flag, strategy = sys.argv[1:4]
clock = ManualClock(time.time() + 3600)
expiry = Expiry(default_ttl=60, strategy=strategy)
if target.startswith("postgresql://"):
    from langgraph_fenced_sqlite.postgres import FencedPostgresSaver
    opener = FencedPostgresSaver.from_conn_string(target, clock=clock, expiry=expiry)
else:
    from langgraph_fenced_sqlite import FencedSqliteSaver
    opener = FencedSqliteSaver.from_conn_string(target, clock=clock, expiry=expiry)
with opener as saver:
    while not os.path.exists(flag):
        time.sleep(0.001)
    report = saver.expire()
print(json.dumps({"expired": [e.thread_id for e in report.expired], "busy": report.busy,
                  "errors": report.errors}))
"""


def _open(target: str) -> Any:
    assert not target.startswith("user="), "a key=value DSN would name a file"
    if target.startswith("postgresql://"):
        from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

        saver = FencedPostgresSaver.from_conn_string(target).__enter__()
        saver.setup()
        return saver
    from langgraph_fenced_sqlite import FencedSqliteSaver

    return FencedSqliteSaver(target)


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: Any, tmp_path: Any) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "expiry.db")
    # A URL, as users pass one (and as `lgfs` tells a database from a file by).
    return as_url(str(request.getfixturevalue("pg_dsn")))


@pytest.mark.parametrize("strategy", ["delete", "keep_latest"])
def test_four_sweeper_processes_expire_each_thread_once(
    target: str, strategy: str, tmp_path: Any
) -> None:
    names = [f"t{i:03d}" for i in range(40)]
    store = _open(target)
    try:
        for name in names:
            put_chain(store, name, 3)
        claim = store.claim("held", "another-process", 7200)  # live to the sweepers too
        put_chain(store, "held", 2, config=claim.config())
        flag = str(tmp_path / "go")
        argvs = [[sys.executable, "-c", SWEEPER, target, flag, strategy] for _ in range(4)]
        outputs = run_together(argvs, flag)
        for code, _out, err in outputs:
            assert code == 0, err
        reports = [json.loads(out) for _code, out, _err in outputs]
        expired = sorted(t for r in reports for t in r["expired"])
        assert expired == names, reports  # each once, none twice, none missed
        assert all(r["errors"] == [] for r in reports)
        assert any("held" in r["busy"] for r in reports)
        assert len(store.history("held", limit=10)) == 2
        pg = target.startswith("postgresql://")
        assert (type(store).__name__ == "FencedPostgresSaver") == pg  # a database, not a file
        left = {t["thread_id"] for t in store.threads()}
        if strategy == "delete":
            assert left == {"held"}
        else:
            assert left == {*names, "held"}
            assert all(len(store.history(n, limit=10)) == 1 for n in names)
            events = store.events_after(names[0], _floor(store, names[0]) - 1)
            pruned = [e for e in events if e.kind == "pruned"]
            assert len(pruned) == 1, pruned  # one trim, logged once
    finally:
        store.close()


def _floor(store: Any, thread_id: str) -> int:
    from langgraph_fenced_sqlite import ReplayUnavailable

    try:
        store.events_after(thread_id, 0, limit=1)
    except ReplayUnavailable as exc:
        return int(exc.floor)
    return 1


def test_lgfs_sweep_every_runs_until_terminated(target: str) -> None:
    store = _open(target)
    try:
        put_chain(store, "old", 3)
        store.set_thread_ttl("old", 0.2)
    finally:
        store.close()
    time.sleep(0.3)
    proc = start(
        [
            sys.executable,
            "-m",
            "langgraph_fenced_sqlite",
            "sweep",
            target,
            "--every",
            "0.1s",
            "--nl",
        ]
    )
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert [e["thread_id"] for e in first["expired"]] == ["old"], first
        second = json.loads(proc.stdout.readline())
        assert second["expired"] == [] and second["pass"] == 2
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and err == "", err
    done = lgfs("sweep", target, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0]["expired"] == []
