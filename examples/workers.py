"""Workers: several processes serve requests for a few threads from one file.

    python examples/workers.py [path/to/file.db]

What it shows, in about five seconds:

- worker A serves "alice" then "bob"; while A holds "alice", a request with
  strategy "reject" gets `ThreadBusy` at once, and worker B's, with
  "enqueue", waits for A to finish and then runs;
- worker C is killed with SIGKILL in the middle of a run on "carol"; its claim
  outlives it until its ttl (1.5 s) expires, then worker D, waiting with
  "enqueue", takes the thread over and runs from C's last durable checkpoint;
- a watcher (threads of this process, one per conversation) prints every
  event of every thread as it commits, in order, from any process.
"""

from __future__ import annotations

import json
import operator
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from langgraph_fenced_sqlite import FencedRunner, FencedSqliteSaver, ThreadBusy

THREADS = ("alice", "bob", "carol")
TTL = 1.5
_print_lock = threading.Lock()

# What each worker process serves, in order (see `worker`).
A_REQUESTS = [
    {"thread": "alice", "text": "hi", "think": 2.5, "strategy": "reject"},
    {"thread": "bob", "text": "hello", "think": 0.1, "strategy": "reject"},
]
B_REQUESTS = [  # once A has started on alice: wait for it ("enqueue")
    {"thread": "alice", "text": "me too", "think": 0.1, "strategy": "enqueue", "after": True}
]
C_REQUESTS = [  # C is killed in `think`, after its first steps were committed
    {"thread": "carol", "text": "hey", "think": 60, "strategy": "reject", "durability": "sync"}
]
D_REQUESTS = [  # once C has started on carol: wait for it ("enqueue")
    {"thread": "carol", "text": "anyone?", "think": 0.1, "strategy": "enqueue", "after": True}
]


def say(text: str) -> None:
    """Print a whole line in one write (several threads and processes print).

    Not `print`: with PYTHONUNBUFFERED=1 (common in CI) it writes the text
    and its newline in two calls, and another process's line can land
    between them, on the same line.
    """
    with _print_lock:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


class State(TypedDict, total=False):
    """A conversation, and how long the next answer takes to think."""

    messages: Annotated[list[str], operator.add]
    think: float


def receive(state: State) -> dict[str, Any]:
    """Acknowledge the last message."""
    return {"messages": [f"got {state['messages'][-1]!r}"]}


def think(state: State) -> dict[str, Any]:
    """Take the time a model call would."""
    time.sleep(state["think"])  # the slow part: a model call, a tool...
    return {}


def reply(state: State) -> dict[str, Any]:
    """Reply, saying which process did."""
    return {"messages": [f"reply #{len(state['messages']) // 3 + 1} from pid {os.getpid()}"]}


def build() -> StateGraph[State]:
    """Return the uncompiled graph: receive -> think -> reply."""
    graph = StateGraph(State)
    for name, fn in (("receive", receive), ("think", think), ("reply", reply)):
        graph.add_node(name, fn)
    graph.add_edge(START, "receive")
    graph.add_edge("receive", "think")
    graph.add_edge("think", "reply")
    graph.add_edge("reply", END)
    return graph


# --- a worker process -----------------------------------------------------------------------


def worker(path: str, name: str, requests: list[dict[str, Any]]) -> None:
    """Serve `requests` in order: {thread, text, think, strategy[, after, durability]}.

    A request with `after` first waits until another worker has started on
    its thread (so that it finds the thread busy).
    """
    with FencedSqliteSaver(path) as saver:
        runner = FencedRunner(build().compile(checkpointer=saver), saver, holder=name, ttl=TTL)
        for req in requests:
            config: RunnableConfig = {"configurable": {"thread_id": req["thread"]}}
            inputs = {"messages": [req["text"]], "think": req["think"]}
            if req.get("after"):
                while not saver.events_after(req["thread"], 0, 1):
                    time.sleep(0.01)
            kwargs = {"durability": req.get("durability", "async"), "wait_timeout": 30}
            out = runner.invoke(inputs, config, strategy=req["strategy"], **kwargs)
            say(f"[{name}] {req['strategy']}: {req['thread']} -> {out['messages'][-1]!r}")


# --- the watcher --------------------------------------------------------------------------


def watch(saver: FencedSqliteSaver, thread_id: str, seen: dict[str, threading.Event]) -> Any:
    """Print every event of `thread_id` in order until the watch is closed."""
    stream = saver.watch(thread_id)

    def loop() -> None:
        with stream:
            for event in stream:
                say(f"    {thread_id:<5} #{event.seq:<3} {event.kind:<15} {describe(event)}")
                if thread_id == "carol" and event.kind == "checkpoint" and event.data["step"] == 1:
                    seen["carol_thinking"].set()  # `receive` is durable; `think` runs

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return stream, thread


def describe(event: Any) -> str:
    """Summarise an event in a few words."""
    data, token = event.data, f"token {event.token}"
    if event.kind == "checkpoint":
        return f"{token} step {data['step']}"
    if event.kind == "writes":
        return f"{token} {', '.join(data['channels'])}"
    if event.kind == "run_started":
        return f"{token} run {data['run_id'][:8]} by {data['holder']} ({data['strategy']})"
    if event.kind == "run_superseded":
        live = "live" if data["was_live"] else "expired"
        return f"{token} run {str(data['run_id'])[:8]} of {data['holder']} ({live} claim)"
    return f"{token} run {data.get('run_id', '')[:8]}"


def spawn(path: str, name: str, requests: list[dict[str, Any]]) -> subprocess.Popen[bytes]:
    """Start a worker process serving `requests`."""
    args = [sys.executable, __file__, "--worker", path, name, json.dumps(requests)]
    return subprocess.Popen(args)


def claimed_by(saver: FencedSqliteSaver, thread_id: str, holder: str) -> bool:
    """Return whether `holder` holds the thread's claim."""
    claim = saver.current_claim(thread_id)
    return claim is not None and claim.holder == holder


def wait_until(predicate: Any, what: str, timeout: float = 30) -> None:
    """Poll `predicate` until it holds; give up after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.01)


def main(path: str) -> None:
    """Run the whole scenario and print what happened."""
    # poll_interval: a snappy watcher even where no doorbell can be had (not Linux).
    with FencedSqliteSaver(path, poll_interval=0.01) as saver:
        cleaner = FencedRunner(build().compile(checkpointer=saver), saver, holder="main")
        for thread_id in THREADS:
            cleaner.delete_thread(thread_id)  # start fresh on every run
        seen = {"carol_thinking": threading.Event()}
        watches = [watch(saver, t, seen) for t in THREADS]

        say("A serves alice (slowly) then bob; B waits for alice; C serves carol; D waits for it")
        a = spawn(path, "worker-A", A_REQUESTS)
        b = spawn(path, "worker-B", B_REQUESTS)
        c = spawn(path, "worker-C", C_REQUESTS)
        d = spawn(path, "worker-D", D_REQUESTS)
        wait_until(lambda: claimed_by(saver, "alice", "worker-A"), "A to claim alice", 60)
        try:  # this process is a worker too: it asks for alice while A holds it
            cleaner.invoke(
                {"messages": ["hello?"], "think": 0.0}, {"configurable": {"thread_id": "alice"}}
            )
            say("[main] reject: ran at once (A had already finished)")
        except ThreadBusy as exc:
            say(f"[main] reject: ThreadBusy ({exc.holder} holds alice)")

        if not seen["carol_thinking"].wait(60):
            raise SystemExit("worker C never started")
        os.kill(c.pid, signal.SIGKILL)
        c.wait()
        say(f"C killed with SIGKILL mid-run; its claim on carol lives until its ttl ({TTL}s)")
        for proc in (a, b, d):
            if proc.wait(60) != 0:
                raise SystemExit(f"a worker failed with exit code {proc.returncode}")

        for thread_id in THREADS:  # let the watcher print everything committed
            last = saver.events_after(thread_id, 0, 10_000)[-1].seq
            stream = watches[THREADS.index(thread_id)][0]
            wait_until(lambda s=stream, n=last: s.last_seq >= n, f"the watcher of {thread_id}")
        for stream, thread in watches:
            stream.close()
            thread.join(10)

        graph = build().compile(checkpointer=saver)
        say("\nfinal conversations:")
        for thread_id in THREADS:
            values = graph.get_state({"configurable": {"thread_id": thread_id}}).values
            say(f"  {thread_id}: {values['messages']}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
    else:
        main(
            sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.gettempdir(), "workers.db")
        )
