"""Child-process commands for the contract suite's multi-process cases.

Run as `python -m langgraph_fenced_sqlite.testing.child COMMAND JSON_ARGS`;
each command prints one JSON document per line on stdout, so a parent can
follow it (`Child` reads those lines with a timeout). Processes are real
(`subprocess` with `sys.executable`), never mocks, so locks, WAL and crashes
behave as in production.
"""

from __future__ import annotations

import asyncio
import json
import operator
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Annotated, Any, Protocol, TypedDict

from ..clock import ManualClock
from ..core.claims import Claim
from ..errors import FencedSqliteError
from ..sqlite.saver import FencedSqliteSaver

__all__ = ["COMMANDS", "Child", "ChainState", "build_chain_graph", "spawn", "write_flag"]

COMMANDS: dict[str, Callable[[dict[str, Any]], None]] = {}

# How long a child waits for a start flag or a command before giving up, so a
# parent that died never leaves children spinning forever.
_CHILD_PATIENCE = 120.0


def command(fn: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """Register `fn` as a child command under its name."""
    COMMANDS[fn.__name__] = fn
    return fn


def emit(**fields: Any) -> None:
    """Print one JSON line and flush (the parent reads line by line).

    The line goes out in one write: under PYTHONUNBUFFERED, `print` writes
    the text and its newline separately, and forked siblings' lines would mix.
    """
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def _open(args: dict[str, Any]) -> tuple[FencedSqliteSaver, ManualClock | None]:
    """Open the saver named by `args`: a manual clock at `clock_at`, else the system's."""
    clock = None if args.get("clock_at") is None else ManualClock(float(args["clock_at"]))
    saver = FencedSqliteSaver(args["path"], clock=clock, busy_timeout=args.get("busy_timeout", 30))
    return saver, clock


@command
def claim(args: dict[str, Any]) -> None:
    """Claim `thread_id` as `holder` (after waiting for `start_flag`, a file flag).

    With `announce_ready`, prints `{"ready": true}` once the store is open and
    before waiting for the flag, so a parent can start all children at once.
    With `clock_at`, the store runs on a manual clock at that time.

    Prints `{"ok": true, "token": ...}` or `{"ok": false, "code": ..., "holder": ...}`.
    """
    saver, _clock = _open(args)
    with saver:
        if args.get("announce_ready"):
            emit(ready=True)
        _wait_for_flag(args.get("start_flag"))
        try:
            granted = saver.claim(args["thread_id"], args["holder"], args.get("ttl", 60))
            emit(ok=True, token=granted.token, holder=granted.holder)
        except FencedSqliteError as exc:
            emit(ok=False, **exc.to_dict())


@command
def claim_rounds(args: dict[str, Any]) -> None:
    """Claim `thread_id` once per round, each round started by its own flag file.

    Prints `{"ready": true, "pid": ..., "contender": holder}` once the store is
    open. Each flag file holds the store-clock time (seconds) at which that
    round's claim is made, so all children judge expiry at one instant. With
    `api="async"` the claim goes through `aclaim`. Prints one result per round:
    `{"round": i, "ok": true, "token": ..., "holder": ..., "expires_at": ...}`
    or `{"round": i, "ok": false, "code": ..., "holder": <the live holder>}`.
    """
    clock = ManualClock(0.0)
    thread_id, holder, ttl = args["thread_id"], args["holder"], args.get("ttl", 60)
    with FencedSqliteSaver(args["path"], clock=clock, busy_timeout=30) as saver:
        emit(ready=True, pid=os.getpid(), contender=holder)
        for i, flag in enumerate(args["rounds"]):
            clock.set(_read_flag(flag))
            try:
                if args.get("api") == "async":
                    granted = asyncio.run(saver.aclaim(thread_id, holder, ttl))
                else:
                    granted = saver.claim(thread_id, holder, ttl)
                emit(round=i, ok=True, **asdict(granted))
            except FencedSqliteError as exc:
                emit(round=i, ok=False, **exc.to_dict())


@command
def claim_rounds_forked(args: dict[str, Any]) -> None:
    """Fork `n` processes that each run `claim_rounds` as holder `{holder}{i}`.

    The expensive imports happen once, here; each forked process is a real
    process of its own (its own connection, locks and pid) and prints its own
    lines (short lines on a pipe are written atomically, so they never mix).
    Prints `{"exit_codes": [...]}` once all of them ended.
    """
    sys.stdout.flush()  # nothing buffered here may be printed twice
    pids = []
    for i in range(args["n"]):
        pid = os.fork()
        if pid == 0:  # the forked process: never return into this loop
            code = 1
            try:
                claim_rounds({**args, "holder": f"{args['holder']}{i}"})
                code = 0
            finally:
                sys.stdout.flush()
                os._exit(code)
        pids.append(pid)
    emit(exit_codes=[os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids])


# The claim operations `serve` runs; each is a `FencedSqliteSaver` method.
_SERVE_OPS = frozenset(
    {"claim", "take_over", "renew", "release", "current_claim", "delete_thread", "append_events"}
)


@command
def serve(args: dict[str, Any]) -> None:
    """Run claim operations read as JSON lines from stdin, one result line each.

    A command is `{"op": NAME, "args": [...]}` with NAME one of the claim
    operations, or `{"op": "clock_set", "args": [when]}` (manual clock only),
    or `{"op": "claim_many", "args": [prefix, n, holder, ttl]}` (claims the
    threads `prefix0..prefix{n-1}` one after another and returns their
    tokens), or `{"op": "exit"}`. Prints `{"ready": true}` once open, then for each
    command `{"ok": true, "result": ...}` (a claim as a dict) or
    `{"ok": false, "code": ..., ...}`.
    """
    saver, clock = _open(args)
    with saver:
        emit(ready=True)
        for line in sys.stdin:
            cmd = json.loads(line)
            op = cmd["op"]
            if op == "exit":
                return
            try:
                if op == "clock_set" and clock is not None:
                    clock.set(float(cmd["args"][0]))
                    result: Any = clock.now()
                elif op == "claim_many":
                    prefix, n, holder, ttl = cmd["args"]
                    result = [saver.claim(f"{prefix}{i}", holder, ttl).token for i in range(n)]
                elif op in _SERVE_OPS:
                    result = getattr(saver, op)(*cmd.get("args", []))
                else:
                    raise ValueError(f"op: unknown serve operation {op!r}")
            except FencedSqliteError as exc:
                emit(ok=False, **exc.to_dict())
                continue
            emit(ok=True, result=asdict(result) if isinstance(result, Claim) else result)


class ChainState(TypedDict):
    """The state of `build_chain_graph`'s graph: the names of the nodes that ran."""

    log: Annotated[list[str], operator.add]


class _ChainNode(Protocol):
    """A node of `build_chain_graph`; LangGraph's `add_node` wants the parameter named `state`."""

    def __call__(self, state: ChainState) -> dict[str, list[str]]: ...


def build_chain_graph(
    checkpointer: Any, steps: list[str], on_node: Callable[[str], None] | None = None
) -> Any:
    """Compile a graph that runs the nodes `steps` one after another.

    Each node calls `on_node(name)` (if given) and then appends its name to
    `log`, so a graph's history says exactly which steps were committed.
    """
    from langgraph.graph import END, START, StateGraph

    graph = StateGraph(ChainState)

    def make(name: str) -> _ChainNode:
        def node(state: ChainState) -> dict[str, list[str]]:
            if on_node is not None:
                on_node(name)
            return {"log": [name]}

        return node

    previous = START
    for name in steps:
        graph.add_node(name, make(name))
        graph.add_edge(previous, name)
        previous = name
    graph.add_edge(previous, END)
    return graph.compile(checkpointer=checkpointer)


@command
def run_graph(args: dict[str, Any]) -> None:
    """Claim a thread and run `build_chain_graph(steps)` on it under the claim.

    Prints `{"claimed": {claim}}`, then `{"blocked": name}` when the node
    `block_at` starts, and then sleeps inside that node (the parent kills the
    process there). A run that finishes prints `{"done": state}`.
    """
    saver, _clock = _open(args)
    with saver:
        granted = saver.claim(args["thread_id"], args["holder"], args["ttl"])
        emit(claimed=asdict(granted))

        def on_node(name: str) -> None:
            if name == args.get("block_at"):
                emit(blocked=name)
                time.sleep(_CHILD_PATIENCE)

        graph = build_chain_graph(saver, args["steps"], on_node)
        state = graph.invoke(
            {"log": []}, granted.config(), durability=args.get("durability", "sync")
        )
        emit(done=state)


def write_flag(path: str, content: str = "") -> None:
    """Create the flag file `path` atomically (children never see it half-written)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(content)
    os.replace(tmp, path)


def _wait_for_flag(flag: str | None) -> None:
    """Spin until the file `flag` exists, so many children start together."""
    if flag:
        _read_flag(flag)


def _read_flag(flag: str) -> float:
    """Wait for the file `flag` and return the number it holds (0.0 if empty)."""
    deadline = time.monotonic() + _CHILD_PATIENCE
    while not os.path.exists(flag):
        if time.monotonic() > deadline:
            raise TimeoutError(f"start flag {flag} never appeared")
        time.sleep(0.001)
    with open(flag) as f:
        text = f.read().strip()
    return float(text) if text else 0.0


def _popen(command_name: str, args: dict[str, Any], *, stdin: bool) -> subprocess.Popen[str]:
    if command_name not in COMMANDS:
        raise ValueError(f"command_name: unknown child command {command_name!r}")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "langgraph_fenced_sqlite.testing.child",
            command_name,
            json.dumps(args),
        ],
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Its own process group, so `Child.kill` also ends what it forked.
        start_new_session=True,
    )


def spawn(command_name: str, **args: Any) -> subprocess.Popen[str]:
    """Start `command_name` in a child process; read its JSON lines from stdout."""
    return _popen(command_name, args, stdin=False)


class Child:
    """One child process running a command, with its output read in the background.

    Use it as a context manager: leaving on an error kills the child and
    everything it forked; leaving reaps it and closes its pipes, so no
    process or pipe outlives a test.
    """

    def __init__(self, command_name: str, **args: Any) -> None:
        """Start `command_name` with the JSON-able keyword `args`."""
        self.command_name = command_name
        self.proc = _popen(command_name, args, stdin=command_name == "serve")
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self._lines.put)),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self._stderr.append)),
        ]
        for reader in self._readers:
            reader.daemon = True
            reader.start()

    @staticmethod
    def _pump(stream: Any, sink: Callable[[Any], None]) -> None:
        for line in stream:
            sink(line)
        sink(None)

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.proc.pid

    def next(self, timeout: float = 60.0) -> dict[str, Any]:
        """Return the child's next JSON line, waiting up to `timeout` seconds.

        Raises:
            TimeoutError: nothing came in time (the message carries stderr).
            EOFError: the child ended its output (the message carries stderr).
        """
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(
                f"child {self.command_name} printed nothing in {timeout}s; stderr: {self.stderr()}"
            ) from None
        if line is None:
            self._lines.put(None)
            raise EOFError(f"child {self.command_name} ended its output; stderr: {self.stderr()}")
        return json.loads(line)

    def request(self, op: str, *args: Any) -> None:
        """Send one `serve` command without waiting for its result (read it with `next`)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, "args": list(args)}) + "\n")
        self.proc.stdin.flush()

    def send(self, op: str, *args: Any) -> dict[str, Any]:
        """Send one `serve` command and return its result line."""
        self.request(op, *args)
        return self.next()

    def stderr(self) -> str:
        """Return what the child wrote to stderr so far."""
        return "".join(s for s in self._stderr if s is not None)

    def kill(self) -> None:
        """SIGKILL the child and what it forked (a crash: no cleanup), and reap it."""
        # Until the child is reaped its pid (= its group id) cannot be reused,
        # so the signal reaches only processes this Child started.
        if self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # every process of the group already ended
        self.proc.wait(timeout=60)

    def close(self, timeout: float = 60.0) -> int:
        """Wait up to `timeout` for the child to end (killing it after), close its pipes.

        Returns:
            The child's exit status.
        """
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        for reader in self._readers:
            reader.join(timeout=10)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.proc.stdout.close()
        self.proc.stderr.close()
        return self.proc.returncode

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self.kill()
        self.close()


def main(argv: list[str]) -> None:
    """Run the command named in `argv[0]` with the JSON arguments in `argv[1]`."""
    COMMANDS[argv[0]](json.loads(argv[1]))


if __name__ == "__main__":
    main(sys.argv[1:])
