"""Child processes for the PostgreSQL tests: `python support/pg_child.py COMMAND JSON`.

Each child opens its own connection (as a worker on another host would),
waits for the start flag so that all contend at once, does its work and
prints one JSON document on stdout. Started by `support.processes.pg_child`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from langgraph.checkpoint.base import empty_checkpoint

from langgraph_fenced_sqlite import StaleClaim
from langgraph_fenced_sqlite.postgres import FencedPostgresSaver


def _wait_for(flag: str) -> None:
    deadline = time.monotonic() + 60
    while not os.path.exists(flag):
        if time.monotonic() > deadline:
            raise SystemExit("no start flag")
        time.sleep(0.001)


def take_overs(args: dict[str, Any]) -> None:
    """Take each thread over `rounds` times; print the tokens granted, per thread."""
    granted: dict[str, list[int]] = {t: [] for t in args["threads"]}
    with FencedPostgresSaver.from_conn_string(args["dsn"]) as saver:
        _wait_for(args["flag"])
        for _ in range(args["rounds"]):
            for thread_id in args["threads"]:
                granted[thread_id].append(saver.take_over(thread_id, args["me"], 30).token)
    print(json.dumps(granted))


def fenced_writer(args: dict[str, Any]) -> None:
    """Put checkpoints under one token until refused; print what was acknowledged."""
    acked: list[str] = []
    refused = None
    config = {"configurable": {"thread_id": args["thread"], "__fence_token__": args["token"]}}
    with FencedPostgresSaver.from_conn_string(args["dsn"]) as saver:
        _wait_for(args["flag"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            cp = empty_checkpoint()
            try:
                saver.put(config, cp, {"source": "update", "step": len(acked)}, {})
            except StaleClaim as exc:
                refused = exc.current_token
                break
            acked.append(cp["id"])
    print(json.dumps({"acked": acked, "refused_by": refused}))


def put_later(args: dict[str, Any]) -> None:
    """After the start flag and a delay, put one unfenced checkpoint; print when it committed."""
    with FencedPostgresSaver.from_conn_string(args["dsn"], notify=args["notify"]) as saver:
        _wait_for(args["flag"])
        time.sleep(args["delay"])
        config = {"configurable": {"thread_id": args["thread"]}}
        saver.put(config, empty_checkpoint(), {"source": "update", "step": 1}, {})
        print(json.dumps({"committed_at": time.time()}))


def stream_writer(args: dict[str, Any]) -> None:
    """Put a chain under one token forever, printing each acknowledged id at once (to be killed)."""
    config: dict[str, Any] = {"thread_id": args["thread"], "__fence_token__": args["token"]}
    with FencedPostgresSaver.from_conn_string(args["dsn"]) as saver:
        while True:
            cp = empty_checkpoint()
            saver.put({"configurable": dict(config)}, cp, {"source": "loop", "step": 1}, {})
            config["checkpoint_id"] = cp["id"]
            print(cp["id"], flush=True)


def append_events(args: dict[str, Any]) -> None:
    """Claim the thread, then append `n` events, one commit each; print their seqs."""
    with FencedPostgresSaver.from_conn_string(args["dsn"]) as saver:
        claim = saver.claim(args["thread"], "child", 60)
        _wait_for(args["flag"])
        seqs = [saver.append_events(args["thread"], claim.token, [("e", {"i": i})])[0]
                for i in range(args["n"])]  # fmt: skip
    print(json.dumps(seqs))


COMMANDS = {
    "append_events": append_events,
    "stream_writer": stream_writer,
    "take_overs": take_overs,
    "fenced_writer": fenced_writer,
    "put_later": put_later,
}


if __name__ == "__main__":
    COMMANDS[sys.argv[1]](json.loads(sys.argv[2]))
