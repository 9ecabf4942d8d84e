"""LangGraph's Agent Server (`langgraph dev`) on a fenced store, for the end-to-end tests.

`project` writes a deployment as a user would: a `langgraph.json` naming the
shipped factory (`langgraph_fenced_sqlite.agent_server.checkpointer`) and the
store in its `"env"`, and a graph file, `src/typed.py`, whose state holds the
deployment's own dataclass, pydantic model and enum. `Server` runs the real
`langgraph dev` on 127.0.0.1 in its own process group, logging to a file,
and always ends the whole group.

The graph's first node waits for a gate file when the run's configurable names
one (`gate`), so a test holds a run "running" for as long as it needs and no
longer: no sleep decides an outcome.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

GRAPH_ID = "typed"
# The module the server imports `src/typed.py` as (its own naming; see
# `langgraph_fenced_sqlite.agent_server.graph_modules`).
GRAPH_MODULE = "__src__typed"

GRAPH = """
import asyncio
import dataclasses
import enum
import os
from typing import TypedDict

from pydantic import BaseModel
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt


class Priority(enum.Enum):
    LOW = "low"
    HIGH = "high"


@dataclasses.dataclass
class Order:
    sku: str
    quantity: int
    priority: Priority


class Customer(BaseModel):
    name: str
    orders: list[Order] = []


class State(TypedDict, total=False):
    text: str
    customer: Customer
    approved: bool
    steps: int


async def prepare(state: State, config: RunnableConfig) -> State:
    gate = config["configurable"].get("gate")  # the run's, never the thread's
    deadline = asyncio.get_running_loop().time() + 60
    # The server's event loop refuses blocking calls (blockbuster): look from a thread.
    while gate and not await asyncio.to_thread(os.path.exists, gate):
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(gate)
        await asyncio.sleep(0.02)
    order = Order(sku=state.get("text", ""), quantity=2, priority=Priority.HIGH)
    orders = [*state["customer"].orders, order] if "customer" in state else [order]
    return {"customer": Customer(name="Ada", orders=orders), "steps": state.get("steps", 0) + 1}


def review(state: State) -> State:
    approved = True
    if state.get("text", "").startswith("ask"):
        approved = bool(interrupt({"question": "approve?"}))
    return {"approved": approved, "steps": state.get("steps", 0) + 1}


builder = StateGraph(State)
builder.add_node("prepare", prepare)
builder.add_node("review", review)
builder.add_edge(START, "prepare")
builder.add_edge("prepare", "review")
builder.add_edge("review", END)
graph = builder.compile()
"""


def project(root: Path, location: str) -> Path:
    """Write a deployment into `root` whose checkpointer is the shipped factory on `location`."""
    (root / "src").mkdir(parents=True, exist_ok=True)
    (root / "src" / "typed.py").write_text(GRAPH)
    config = {
        "dependencies": ["."],
        "graphs": {GRAPH_ID: "./src/typed.py:graph"},
        "checkpointer": {"path": "langgraph_fenced_sqlite.agent_server.checkpointer"},
        "env": {"LGFS_PATH": location},
    }
    (root / "langgraph.json").write_text(json.dumps(config, indent=2))
    return root


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """`langgraph dev` on a project, started by `start()` and ended, group and all, by `stop()`."""

    def __init__(self, root: Path, *, isolated_loops: bool = True) -> None:
        """Serve `root`; `isolated_loops` sets `BG_JOB_ISOLATED_LOOPS` (a loop per worker)."""
        self.root = root
        self.isolated_loops = isolated_loops
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.starts = 0

    @property
    def url(self) -> str:
        """The server's base URL."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        """The current run's stdout and stderr."""
        return self.root / f"server-{self.starts}.log"

    def log_text(self) -> str:
        """Return the current run's log (empty if none yet)."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def start(self, timeout: float = 90.0) -> None:
        """Start the server and wait until it answers `/ok` on its port.

        The server moves to another port, saying so, when its port is taken
        meanwhile: then it is stopped and started again on a fresh one.
        """
        for _ in range(3):
            self._spawn()
            if self._ready(timeout):
                return
            self.stop()
        raise AssertionError(f"langgraph dev did not start; log:\n{self.log_text()[-4000:]}")

    def _spawn(self) -> None:
        self.starts += 1
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("LGFS_")}
        env.update(
            BG_JOB_ISOLATED_LOOPS=str(self.isolated_loops).lower(),
            LANGGRAPH_CLI_NO_ANALYTICS="1",
            LANGGRAPH_NO_VERSION_CHECK="true",
            LANGSMITH_TRACING="false",
            LANGCHAIN_TRACING_V2="false",
            PYTHONUNBUFFERED="1",
        )
        argv = [
            sys.executable, "-m", "langgraph_cli", "dev",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--no-browser", "--no-reload", "--config", "langgraph.json",
            "--n-jobs-per-worker", "4",
        ]  # fmt: skip
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv,
                cwd=self.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() ends all of it
            )

    def _ready(self, timeout: float) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"langgraph dev exited with {self.proc.returncode}; log:\n"
                    + self.log_text()[-4000:]
                )
            if "already in use" in self.log_text():
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/ok", timeout=2) as response:
                    if response.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        return False

    def stop(self, timeout: float = 30.0) -> int | None:
        """End the server as an operator would (SIGTERM), then kill whatever of its group is left.

        Returns:
            Its exit status (None if it had to be killed).
        """
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        status: int | None = None
        try:
            if proc.poll() is None:
                _signal_group(proc.pid, signal.SIGTERM)
            try:
                status = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                status = None
        finally:
            _signal_group(proc.pid, signal.SIGKILL)  # stragglers of the group, always
            proc.wait()
        return status


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
