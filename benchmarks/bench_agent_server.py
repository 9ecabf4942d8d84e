"""A run's time under LangGraph's Agent Server: our checkpointer against the server's default.

`langgraph dev` (langgraph-api with the in-memory runtime) takes its
checkpointer from `langgraph.json`. This starts the real server on a
throwaway project (`tests/support/agent_server.py`'s `Server`: 127.0.0.1, a
free port, its own process group), one contender after the other, each on a
fresh store:

- ours on SQLite: `"checkpointer": {"path":
  "langgraph_fenced_sqlite.agent_server.checkpointer"}` with `LGFS_PATH` a
  file in the scratch directory (WAL, `synchronous=FULL`), each run fenced
  by its id (the factory's default), and the same with
  `LGFS_FENCE_RUNS=false` ("unfenced": what that fencing costs a run);
- the default: no `checkpointer` in `langgraph.json`, so the server keeps
  checkpoints in its own in-memory saver (langgraph-runtime-inmem's
  `InMemorySaver`, pickled to `.langgraph_api/` in the background);
- ours on PostgreSQL: the same factory with `LGFS_PATH` a `postgresql://`
  URL, a fresh database on a server the script starts
  (`testing.postgres_server`, fsync off as in the other benchmarks);
  skipped, saying why, when none can be started.

Each is driven over HTTP by langgraph-sdk's sync client, one request at a
time, with two graphs served side by side: `chat` (one node that appends a
~1 KB `AIMessage` to `messages: Annotated[list, add_messages]`, for a ~1 KB
human message in) and `chain` (five nodes in a row, each adding to a
counter). Timed: `client.runs.wait`, after warm-up runs; for each graph, on
a new thread per run (the thread created outside the timed call) and as the
turns of one long thread. Every run's final state is checked. The runs use
the server's default durability ("async": checkpoints are written while the
graph goes on, and the run ends once they are).

Two tables, each with the median and p90 per contender and the ratios
ours / default:

- AGENT SERVER runs.wait: the call's wall time in the client, and how much
  of it the run spent queued. The in-memory runtime's queue looks for
  pending runs every 0.5 s and takes only those created before it began to
  wait (langgraph-runtime-inmem 0.36, `Runs.next`), so a client that sends
  one run after another waits about 0.5-1 s per run whatever the
  checkpointer: that poll, not the store, sets this table's figures.
- AGENT SERVER run on the server: the same runs as the server's worker
  logged them ("Background run succeeded": `run_started_at` to
  `run_ended_at`, to the microsecond; the graph, its checkpoints and the
  server's own bookkeeping), and `runs.wait` less the queue wait. Here the
  checkpointer's cost shows.

Nothing is a target ("info"): a ratio above 1 is what a durable store costs
a run against keeping checkpoints in memory, which a crash loses.

The servers run one after the other, not interleaved: starting one takes
seconds, and two at once would share the machine's cores. `--rounds R`
repeats the whole sequence R times (each round in a rotated order, each
contender on a fresh project and store), and a ratio is then the median of
the per-round ratios. Each server's start prints the load average, as load
that changes between contenders changes their ratio.

Options: `--runs N` (new-thread runs per graph, default 25), `--turns N`
(the long thread's turns per graph, default 50), `--warmup N` (default 5),
`--stores sqlite,unfenced,memory,postgres` (the contenders; all by
default), and
`_common`'s `--quick` (1 warm-up, 2 runs and 2 turns per graph: about 40 s),
`--rounds` (default 1), `--keep`, `--dir`. A full run takes about 8 minutes
(each run waits for the queue's poll). Prints "info" figures; asserts
nothing; exits 0.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
)

from _common import (
    Table,
    describe_build,
    fmt_time,
    median,
    parse_args,
    percentile,
    postgres_server,
    scratch_dir,
    text_value,
)
from support.agent_server import Server

MESSAGE_BYTES = 1024
CHAIN_NODES = 5
FACTORY = "langgraph_fenced_sqlite.agent_server.checkpointer"

# The served graphs. The chat's reply is its question reversed: ~1 KB out for ~1 KB in,
# with nothing in the node (no model, no randomness) to tell the contenders apart.
GRAPHS = f"""
import operator
from typing import Annotated, TypedDict

from langchain_core.messages import AIMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages


class ChatState(TypedDict):
    messages: Annotated[list, add_messages]


def reply(state: ChatState) -> dict:
    return {{"messages": [AIMessage(content=state["messages"][-1].content[::-1])]}}


chat_builder = StateGraph(ChatState)
chat_builder.add_node("reply", reply)
chat_builder.add_edge(START, "reply")
chat_builder.add_edge("reply", END)
chat = chat_builder.compile()


class ChainState(TypedDict):
    n: Annotated[int, operator.add]


def step(state: ChainState) -> dict:
    return {{"n": 1}}


chain_builder = StateGraph(ChainState)
previous = START
for i in range({CHAIN_NODES}):
    chain_builder.add_node(f"step{{i}}", step)
    chain_builder.add_edge(previous, f"step{{i}}")
    previous = f"step{{i}}"
chain_builder.add_edge(previous, END)
chain = chain_builder.compile()
"""

WORKLOADS = ("chat", "chain")


# --- the contenders ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Contender:
    """One server configuration: its column header and the store `LGFS_PATH` names (or none).

    Attributes:
        key: The short name `--stores` uses.
        header: The column's header.
        location: A function from the round's scratch directory to `LGFS_PATH`,
            or None for the server's default checkpointer.
        fence_runs: `LGFS_FENCE_RUNS` (ours: each run fenced by its id).
    """

    key: str
    header: str
    location: Callable[[Path], str] | None
    fence_runs: bool = True


def project(root: Path, location: str | None, fence_runs: bool = True) -> Path:
    """Write a deployment serving `chat` and `chain`; our factory on `location` unless None."""
    (root / "src").mkdir(parents=True, exist_ok=True)
    (root / "src" / "graphs.py").write_text(GRAPHS)
    config: dict[str, Any] = {
        "dependencies": ["."],
        "graphs": {name: f"./src/graphs.py:{name}" for name in WORKLOADS},
    }
    if location is not None:
        config["checkpointer"] = {"path": FACTORY}
        config["env"] = {"LGFS_PATH": location, "LGFS_FENCE_RUNS": str(fence_runs).lower()}
    (root / "langgraph.json").write_text(json.dumps(config, indent=2))
    return root


@contextmanager
def postgres_url() -> Iterator[tuple[str | None, str]]:
    """Yield a `postgresql://` URL on a throwaway server and "", or None and why none started."""
    with postgres_server() as (server, why):
        url = None if server is None else f"postgresql://lgfs@127.0.0.1:{server.port}/postgres"
        yield url, why


def fresh_database(url: str, name: str) -> str:
    """Create database `name` on `url`'s server and return its URL (a fresh store per round)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return url.rsplit("/", 1)[0] + "/" + name


# --- one server's measurements ----------------------------------------------------------------

ANSI = re.compile(r"\x1b\[[0-9;]*m")
FIELD = re.compile(r"(\w+)=(\S+)")


@dataclass
class Run:
    """One timed `runs.wait`: as the client saw it, and as the server's worker logged it.

    Attributes:
        run_id: The server's id of the run (`on_run_created`).
        client_s: `runs.wait`'s wall time in the client (request to parsed answer).
        exec_s: The worker's `run_started_at` to `run_ended_at` (the graph run,
            its checkpoints included): the server's own log, microseconds.
        queue_s: The worker's `run_created_at` to `run_started_at` (how long the
            run waited for the queue to pick it up).
    """

    run_id: str
    client_s: float
    exec_s: float = float("nan")
    queue_s: float = float("nan")


@dataclass
class Samples:
    """One server's timed runs by figure (`chat new`, `chat long`, ...), and its start time."""

    runs: dict[str, list[Run]] = field(default_factory=dict)
    start_s: float = float("nan")

    def values(self, figure: str, what: str) -> list[float]:
        """Return `what` (`client`, `exec`, `queue`, `client - queue`) of `figure`'s runs."""
        runs = self.runs[figure]
        if what == "client - queue":
            return [r.client_s - r.queue_s for r in runs]
        return [getattr(r, f"{what}_s") for r in runs]


def make_input(workload: str, turn: int) -> dict[str, Any]:
    """Return the input of `workload`'s run number `turn` (~1 KB human message for the chat)."""
    if workload == "chat":
        return {"messages": [{"type": "human", "content": text_value(MESSAGE_BYTES, turn)}]}
    return {"n": 0}


def check(workload: str, result: Any, turn: int | None) -> None:
    """Fail loudly if a run did not do its work (a timing of a failed run means nothing)."""
    if not isinstance(result, dict):
        raise RuntimeError(f"{workload}: runs.wait returned {result!r}")
    if workload == "chat":
        expected = 2 * (turn + 1) if turn is not None else 2
        got = len(result.get("messages", []))
        if got != expected:
            raise RuntimeError(f"chat: {got} messages after the run, expected {expected}")
    elif result.get("n") != CHAIN_NODES * ((turn or 0) + 1):
        raise RuntimeError(f"chain: n = {result.get('n')!r} after the run")


def worker_times(log: str) -> dict[str, tuple[float, float]]:
    """Return run id -> (queue seconds, execution seconds) from the server's log.

    The worker logs "Background run succeeded" with `run_created_at`,
    `run_started_at` and `run_ended_at` (ISO times to the microsecond; its
    `run_exec_ms` is whole milliseconds), as `key=value` fields in color.
    """
    out: dict[str, tuple[float, float]] = {}
    for line in ANSI.sub("", log).splitlines():
        if "Background run succeeded" not in line:
            continue
        fields = dict(FIELD.findall(line))
        created, started, ended = (
            datetime.fromisoformat(fields[k])
            for k in ("run_created_at", "run_started_at", "run_ended_at")
        )
        out[fields["run_id"]] = (
            (started - created).total_seconds(),
            (ended - started).total_seconds(),
        )
    return out


def measure(server: Server, runs: int, turns: int, warmup: int) -> dict[str, list[Run]]:
    """Time `runs.wait` on `server`: warm-up, then new threads and one long thread per graph.

    Returns:
        Figure -> its runs (the worker's times filled in later, from the log).
    """
    from langgraph_sdk import get_sync_client

    timed: dict[str, list[Run]] = {}
    with get_sync_client(url=server.url, timeout=120) as client:

        def wait(workload: str, thread: str, value: dict[str, Any], turn: int | None) -> Run:
            created: list[str] = []
            started = time.perf_counter()
            result = client.runs.wait(
                thread, workload, input=value, on_run_created=lambda m: created.append(m["run_id"])
            )
            took = time.perf_counter() - started
            check(workload, result, turn)
            return Run(created[0], took)

        for workload in WORKLOADS:
            for i in range(warmup):
                wait(
                    workload,
                    client.threads.create()["thread_id"],
                    make_input(workload, -1 - i),
                    None,
                )
        for workload in WORKLOADS:
            new = []
            for i in range(runs):
                thread = client.threads.create()["thread_id"]  # outside the timed call
                new.append(wait(workload, thread, make_input(workload, i), None))
            timed[f"{workload} new"] = new
            thread = client.threads.create()["thread_id"]
            timed[f"{workload} long"] = [
                wait(workload, thread, make_input(workload, turn), turn) for turn in range(turns)
            ]
    return timed


def serve_and_measure(
    root: Path, location: str | None, runs: int, turns: int, warmup: int, fence_runs: bool = True
) -> Samples:
    """Start `langgraph dev` on a fresh project, measure it, stop it (always), read its log."""
    deployment = project(root, location, fence_runs)
    server = Server(deployment, isolated_loops=False)  # the server's default
    started = time.perf_counter()
    try:
        server.start()
        start_s = time.perf_counter() - started
        timed = measure(server, runs, turns, warmup)
    except BaseException:
        print(f"  server log ({server.log}):\n{server.log_text()[-3000:]}", flush=True)
        raise
    finally:
        server.stop()
    logged = worker_times(server.log_text())
    for figure_runs in timed.values():
        for run in figure_runs:
            if run.run_id not in logged:
                raise RuntimeError(f"run {run.run_id} is not in the server's log {server.log}")
            run.queue_s, run.exec_s = logged[run.run_id]
    return Samples(timed, start_s)


# --- the tables -------------------------------------------------------------------------------

STATS: dict[str, Callable[[list[float]], float]] = {
    "median": median,
    "p90": lambda v: percentile(v, 90),
}


def describe(workload: str, kind: str, count: int) -> str:
    """Return a row's name: the graph and the thread it ran on."""
    what = "chat" if workload == "chat" else f"{CHAIN_NODES}-node chain"
    where = f"new thread per run, {count} runs" if kind == "new" else f"one thread, {count} turns"
    return f"{what}, {where}"


def table(
    title: str,
    results: dict[str, list[Samples]],
    contenders: list[Contender],
    rows: list[tuple[str, str, str]],
    runs: int,
    turns: int,
) -> Table:
    """Build a table: per contender a statistic of one measure, and ratios ours / default.

    Args:
        rows: `(label suffix, measure, statistic)` per row and figure; the
            measure as `Samples.values` takes it.
    """
    present = [c for c in contenders if c.key in results]
    ours = [c for c in present if c.location is not None]
    default = results.get("memory")
    columns = ["figure"] + [c.header for c in present]
    if default is not None:
        columns += [f"{c.header} / default" for c in ours]
    out = Table(title, [*columns, "target"])
    for workload in WORKLOADS:
        for kind, count in (("new", runs), ("long", turns)):
            figure = f"{workload} {kind}"
            for label, what, name in rows:
                stat = STATS[name]
                per_round = {
                    c.key: [stat(s.values(figure, what)) for s in results[c.key]] for c in present
                }
                cells = [f"{describe(workload, kind, count)}: {label}"]
                cells += [fmt_time(median(per_round[c.key])) for c in present]
                if default is not None:
                    # The median of the per-round ratios (one round: that round's ratio).
                    base = per_round["memory"]
                    for c in ours:
                        ratios = [o / d for o, d in zip(per_round[c.key], base, strict=True)]
                        cells.append(f"{median(ratios):.2f}x")
                out.add(*cells, "info")
    return out


def report(
    results: dict[str, list[Samples]],
    contenders: list[Contender],
    runs: int,
    turns: int,
    rounds: int,
    took: float,
) -> None:
    """Print the two AGENT SERVER tables: the client's `runs.wait`, and the run on the server."""
    how = (
        f"default durability (async), one request at a time; {rounds} "
        f"round{'s' * (rounds > 1)}, servers one after the other; {took:.0f} s"
    )
    client = table(
        f"AGENT SERVER runs.wait, as the client sees it ({how})",
        results,
        contenders,
        [
            ("runs.wait median", "client", "median"),
            ("runs.wait p90", "client", "p90"),
            ("of which queued, median", "queue", "median"),
        ],
        runs,
        turns,
    )
    present = [c for c in contenders if c.key in results]
    extra = len(client.columns) - 2 - len(present)
    client.add(
        "server start (langgraph dev until /ok)",
        *[fmt_time(median([s.start_s for s in results[c.key]])) for c in present],
        *[""] * extra,
        "info",
    )
    client.print()
    table(
        "AGENT SERVER run on the server (the worker's log: run_started_at to run_ended_at, "
        "checkpoints included)",
        results,
        contenders,
        [
            ("run median", "exec", "median"),
            ("run p90", "exec", "p90"),
            ("runs.wait less the queue wait, median", "client - queue", "median"),
        ],
        runs,
        turns,
    ).print()


# --- the run ----------------------------------------------------------------------------------


def _options(parser: Any) -> None:
    parser.add_argument("--runs", type=int, default=None, help="new-thread runs per graph (25)")
    parser.add_argument("--turns", type=int, default=None, help="long-thread turns per graph (50)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up runs per graph (5)")
    parser.add_argument(
        "--stores",
        default="sqlite,unfenced,memory,postgres",
        help="comma-separated contenders: sqlite (ours), unfenced (ours, LGFS_FENCE_RUNS=false), "
        "memory (the server's default), postgres (ours)",
    )


def main(argv: list[str] | None = None) -> int:
    """Print the AGENT SERVER tables; exit 0 whatever the figures."""
    args = parse_args("A run's time under LangGraph's Agent Server", argv, _options)
    runs = args.runs or (2 if args.quick else 25)
    turns = args.turns or (2 if args.quick else 50)
    warmup = args.warmup or (1 if args.quick else 5)
    rounds = args.rounds or 1
    wanted = {s.strip() for s in args.stores.split(",") if s.strip()}
    print(describe_build())
    if importlib.util.find_spec("langgraph_api") is None:
        print("AGENT SERVER: skipped (langgraph-cli[inmem] is not installed; the dev extra has it)")
        return 0
    print(
        f"runs.wait: {warmup} warm-up, {runs} new-thread runs and {turns} long-thread turns per "
        f"graph and server; {rounds} round{'s' * (rounds > 1)}; chat messages ~{MESSAGE_BYTES} B"
    )
    print()
    skipped: dict[str, str] = {}
    results: dict[str, list[Samples]] = {}
    postgres = postgres_url() if "postgres" in wanted else _nothing()
    with (
        scratch_dir("bench-agent-server-", base=args.dir, keep=args.keep) as directory,
        postgres as (pg_url, why),
    ):
        print()
        contenders = [
            Contender("sqlite", "ours (SQLite)", lambda d: str(d / "checkpoints.db")),
            Contender(
                "unfenced",
                "ours, unfenced (SQLite)",
                lambda d: str(d / "checkpoints.db"),
                fence_runs=False,
            ),
            Contender("memory", "default (in-memory)", None),
        ]
        if "postgres" in wanted:
            if pg_url is None:
                skipped["ours (PostgreSQL)"] = f"no PostgreSQL server could be started: {why}"
            else:
                contenders.append(
                    Contender(
                        "postgres",
                        "ours (PostgreSQL)",
                        lambda d: fresh_database(pg_url, f"bench_{d.name.replace('-', '_')}"),
                    )
                )
        contenders = [c for c in contenders if c.key in wanted]
        started = time.perf_counter()
        for r in range(rounds):
            shift = r % len(contenders)
            for c in contenders[shift:] + contenders[:shift]:
                root = Path(directory) / f"{c.key}-{r}"
                root.mkdir()
                location = c.location(root) if c.location is not None else None
                print(
                    f"round {r + 1}: {c.header} (load average {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
                samples = serve_and_measure(
                    root / "project", location, runs, turns, warmup, c.fence_runs
                )
                results.setdefault(c.key, []).append(samples)
        took = time.perf_counter() - started
        print()
        report(results, contenders, runs, turns, rounds, took)
        for header, reason in skipped.items():
            print(f"{header}: skipped ({reason})")
            print()
    load = os.getloadavg()
    print(f"load average at the end {load[0]:.2f}")
    print("result: done (figures, not assertions)")
    return 0


@contextmanager
def _nothing() -> Iterator[tuple[None, str]]:
    yield None, "not asked for"


if __name__ == "__main__":
    sys.exit(main())
