"""Long conversations: storage and per-turn cost as the history grows.

A chat app's thread only grows: every turn adds a message or two, and every
checkpoint LangGraph puts holds the whole history. A saver that stores each
checkpoint whole stores the history once per checkpoint (quadratic bytes over
a thread's life), and pays for serializing all of it on every put. This runs
long threads turn by turn and reports what they cost at the end:

- CHAT: a one-node graph, state `messages: Annotated[list, add_messages]`;
  each turn invokes with a ~1 KB `HumanMessage` and the node answers with a
  ~1 KB `AIMessage` (durability "sync"). FencedSqliteSaver, LangGraph's
  SqliteSaver and InMemorySaver each run their own thread of the same
  conversation, interleaved turn by turn in a rotating order
  (`_common.interleave`, one turn per contender per round). Reported: bytes
  on disk at the end (database plus WAL, after `wal_checkpoint(TRUNCATE)`);
  `invoke` over the last 10 turns (median of the per-turn ratios); then
  `get_state` and the first page of `get_state_history(limit=10)` on the
  finished threads (interleaved rounds). The same conversation runs again
  through `ainvoke`, ours against AsyncSqliteSaver (aiosqlite).
- AGENT LOOP: `agent -> tools -> agent -> tools -> agent` per turn (two tool
  calls, then a final answer), with messages, a second list channel
  (`steps`, one `Step` per node run, `operator.add`) and a pydantic field
  (`profile`, updated every turn); ours against SqliteSaver turn by turn.
  Reported: bytes, `invoke` over the last 10 turns, `get_state`, each put's
  wall time (a subclass times `put` with `perf_counter`, its durable commit
  included) over the first and the last 10 turns, and whether every
  checkpoint of the history reads back the same from both savers
  (`values`, `next`, metadata step and source; every message has an
  explicit id, so messages compare exactly).
- POSTGRESQL: the chat workload, FencedPostgresSaver against PostgresSaver,
  on a server the script starts (`testing.postgres_server`, fsync off as in
  `bench_postgres.py`, autovacuum off); bytes are `pg_total_relation_size`
  (heap, indexes and TOAST) summed over each saver's tables (ours: every
  `lgfs_%` table, the value table `lgfs_blobs` included; theirs:
  checkpoints, checkpoint_blobs, checkpoint_writes, checkpoint_migrations),
  dead row versions included. PostgresSaver runs the first `--stock-turns`
  turns (default 200) beside ours, interleaved: its tables grow with the
  square of the turns, gigabytes at 1000; ours then goes on alone to
  `--turns`, where its bytes are held to the target, and the last row splits
  them into heap, indexes and TOAST.

Text is words drawn at random (seeded) from a vocabulary of 30,000 random
lowercase words of 2-10 letters: it compresses about like prose (the header
prints zstd's ratio) and never repeats a phrase, so no saver gains from
repetition that real chats do not have. Every contender gets the same texts.

The byte target is 8 MB (10^6 bytes) for 1000 chat turns; other `--turns`
scale it linearly (`8 MB x turns/1000`, the row says so). A fresh file's
schema takes tens of KB of that, so a short run (`--quick`) can miss it on
the schema alone: the "file before the thread" row shows how much.

`--fsync-ms D` re-runs the script in a child whose every fsync is D ms
slower (`fsync_shim.py`, as `bench_calls.py` and `bench_syncs.py` do), as on
a real SSD or cloud volume: SQLite only (the benchmark's PostgreSQL does not
sync), and the chat `invoke` target becomes ours/SqliteSaver <= 0.5.

Options: `--turns N` (chat, default 1000), `--agent-turns N` (default 300),
`--stock-turns N` (PostgresSaver's share of the POSTGRESQL chat, default 200),
`--only chat|agent|postgres`, `--stores sqlite,postgres`, `--fsync-ms MS`,
and `_common`'s `--quick` (12 chat and 6 agent turns), `--rounds`, `--keep`,
`--dir`. Prints PASS/MISS; asserts nothing; exits 0. The full run takes
about 11 minutes on 2 cores and, at its peak, some 15 GB of scratch space:
the stock savers' files are quadratic (3.6 GB per SqliteSaver file at 1000
chat turns).
"""

from __future__ import annotations

import importlib
import itertools
import operator
import os
import random
import sqlite3
import string
import sys
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AsyncExitStack, ExitStack, contextmanager
from typing import Annotated, Any, TypedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fsync_shim
from _common import (
    AsyncRunner,
    Table,
    describe_build,
    fmt_time,
    interleave,
    median,
    paired_ratio,
    parse_args,
    postgres_server,
    scratch_dir,
    verdict,
)
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from pydantic import BaseModel

from langgraph_fenced_sqlite import FencedSqliteSaver

MB = 1_000_000
CHAT_BYTES_TARGET = 8 * MB  # at 1000 chat turns; scaled linearly for other lengths
CHAT_INVOKE_TARGET = 0.65  # ours / SqliteSaver (and AsyncSqliteSaver, PostgresSaver)
CHAT_INVOKE_TARGET_SLOW_FSYNC = 0.5  # ours / SqliteSaver with --fsync-ms
MEMORY_INVOKE_TARGET = 1.25  # ours / InMemorySaver
AGENT_BYTES_TARGET = 0.05  # ours / SqliteSaver
AGENT_INVOKE_TARGET = 0.8  # ours / SqliteSaver
READ_TARGET = 1.0  # get_state and the history's first page: no slower than the stock saver
PUT_GROWTH_TARGET = 2.0  # ours: bytes proven and compressed, last 10 turns / first 10
LAST = 10  # turns in the "last 10 turns" (and "first 10") windows
TOOL_CALLS = 2  # agent -> tools round trips per agent turn, before the final answer
MESSAGE_BYTES = 1024


# --- text -------------------------------------------------------------------------------


class Prose:
    """Seeded random "prose": words drawn from a fixed vocabulary of random words.

    Uniform draws from 30,000 words of 2-10 lowercase letters: a 1 KB text
    compresses about 1.6x (zstd), a long history 1.8-2.3x, and no phrase
    repeats, so a saver's compression sees about what it sees in real chats.
    """

    def __init__(self, seed: int, vocabulary: int = 30_000) -> None:
        """Build the vocabulary; texts drawn later come from the same seeded stream."""
        self.rng = random.Random(seed)
        letters = string.ascii_lowercase
        self.words = [
            "".join(self.rng.choices(letters, k=self.rng.randint(2, 10))) for _ in range(vocabulary)
        ]

    def text(self, size: int) -> str:
        """Return words joined by spaces, at least `size` characters long."""
        out: list[str] = []
        length = -1
        while length < size:
            word = self.rng.choice(self.words)
            out.append(word)
            length += len(word) + 1
        return " ".join(out)

    def between(self, low: int, high: int) -> str:
        """Return a text of `low` to `high` characters (its length drawn uniformly)."""
        return self.text(self.rng.randint(low, high))


def compression_note(texts: Sequence[str]) -> str:
    """Say how well one message and the whole history compress (zstd if present, else zlib)."""
    codec: Any = zlib
    name = "zlib"
    for module in ("compression.zstd", "backports.zstd"):  # Python 3.14, its backport
        try:
            codec, name = importlib.import_module(module), "zstd"
            break
        except ImportError:
            continue
    one = texts[0].encode()
    whole = " ".join(texts).encode()
    return (
        f"text compresses {len(one) / len(codec.compress(one)):.2f}x ({name}, one message), "
        f"{len(whole) / len(codec.compress(whole)):.2f}x (the whole conversation)"
    )


# --- the chat workload --------------------------------------------------------------------


class ChatState(TypedDict):
    """A chat's state: the messages, appended by `add_messages`."""

    messages: Annotated[list, add_messages]


class ChatScript:
    """What is said at every turn of the chat (the same for every contender)."""

    def __init__(self, turns: int, seed: int = 1) -> None:
        """Draw `turns` questions and answers of ~1 KB each."""
        prose = Prose(seed)
        self.asks = [prose.text(MESSAGE_BYTES) for _ in range(turns)]
        self.replies = [prose.text(MESSAGE_BYTES) for _ in range(turns)]

    def human(self, turn: int) -> HumanMessage:
        """Return turn `turn`'s question, with an id of its own."""
        return HumanMessage(content=self.asks[turn], id=f"human-{turn}")


def chat_builder(script: ChatScript) -> StateGraph:
    """Return the chat graph: START -> reply -> END, the reply read from `script`."""

    def reply(state: ChatState) -> dict[str, Any]:
        turn = len(state["messages"]) // 2  # this turn's question is the last message
        return {"messages": [AIMessage(content=script.replies[turn], id=f"ai-{turn}")]}

    builder = StateGraph(ChatState)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    return builder


class Conversation:
    """One contender's thread of a scripted conversation; a call runs its next turns.

    `self(n)` runs the next `n` turns (durability "sync") and returns their
    seconds, so it is an `_common.interleave` contender with `ops=1` per round.
    `aio`, when given, runs them through `ainvoke` on that loop instead.
    """

    def __init__(
        self,
        graph: Any,
        thread_id: str,
        make_input: Callable[[int], dict[str, Any]],
        aio: AsyncRunner | None = None,
    ) -> None:
        """Keep the graph and where the conversation is."""
        self.graph, self.aio, self.make_input = graph, aio, make_input
        self.config: dict[str, Any] = {"configurable": {"thread_id": thread_id}}
        self.turn = 0

    def __call__(self, n: int) -> float:
        """Run the next `n` turns; return the seconds they took (the inputs built outside)."""
        inputs = [self.make_input(self.turn + i) for i in range(n)]
        self.turn += n
        if self.aio is not None:
            return self.aio.run(self._arun(inputs))
        started = time.perf_counter()
        for value in inputs:
            self.graph.invoke(value, self.config, durability="sync")
        return time.perf_counter() - started

    async def _arun(self, inputs: list[dict[str, Any]]) -> float:
        started = time.perf_counter()
        for value in inputs:
            await self.graph.ainvoke(value, self.config, durability="sync")
        return time.perf_counter() - started


def warm(graph: Any, make_input: Callable[[int], dict[str, Any]], aio: AsyncRunner | None) -> None:
    """Run one turn on a thread of its own: imports, statements and caches warm before timing."""
    Conversation(graph, "warm-up", make_input, aio)(1)


def reads(graph: Any, config: dict[str, Any]) -> dict[str, Callable[[int], float]]:
    """Return the timed reads of a finished thread: `get_state` and the history's first page."""

    def get_state(n: int) -> float:
        started = time.perf_counter()
        for _ in range(n):
            graph.get_state(config)
        return time.perf_counter() - started

    def history(n: int) -> float:
        started = time.perf_counter()
        for _ in range(n):
            page = list(itertools.islice(graph.get_state_history(config, limit=10), 10))
            assert len(page) == 10, len(page)
        return time.perf_counter() - started

    return {"get_state": get_state, "get_state_history(limit=10)": history}


# --- SQLite files ----------------------------------------------------------------------------


def open_stock(stack: ExitStack, path: str, cls: type | None = None, serde: Any = None) -> Any:
    """Open LangGraph's SqliteSaver (or subclass `cls`) on `path`: WAL, synchronous=FULL."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(path, check_same_thread=False)
    stack.callback(conn.close)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    saver = (cls or SqliteSaver)(conn, serde=serde)
    saver.setup()
    return saver


async def open_stock_async(stack: AsyncExitStack, path: str) -> Any:
    """Open LangGraph's AsyncSqliteSaver (aiosqlite) on `path`: WAL, synchronous=FULL."""
    import aiosqlite
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    conn = await aiosqlite.connect(path)
    stack.push_async_callback(conn.close)
    await conn.execute("PRAGMA journal_mode=WAL")
    await conn.execute("PRAGMA synchronous=FULL")
    saver = AsyncSqliteSaver(conn)
    await saver.setup()
    return saver


def sqlite_bytes(path: str) -> tuple[int, bool]:
    """Fold `path`'s WAL into the database (`wal_checkpoint(TRUNCATE)`), then size both.

    Through a connection of its own, which is never the file's last (the
    saver's stays open), so SQLite removes nothing on closing it.

    Returns:
        `(database + WAL bytes, whether the checkpoint was blocked by a reader)`.
    """
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    finally:
        conn.close()
    wal = path + "-wal"
    return os.path.getsize(path) + (os.path.getsize(wal) if os.path.exists(wal) else 0), bool(busy)


def fmt_bytes(count: float) -> str:
    """Format a byte count in decimal units (1 MB = 10^6 bytes)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if count >= size:
            return f"{count / size:.2f} {unit}"
    return f"{count:.0f} B"


def bytes_target(turns: int) -> tuple[float, str]:
    """The chat byte target for `turns` turns, and how to print it."""
    if turns == 1000:
        return CHAT_BYTES_TARGET, "<= 8 MB"
    limit = CHAT_BYTES_TARGET * turns / 1000
    return limit, f"<= 8 MB x {turns}/1000 = {fmt_bytes(limit)}"


# --- timed puts -------------------------------------------------------------------------------


class _TimedPuts:
    """Mixin: append each `put`'s wall time (perf_counter) to `self.put_times`.

    Wall time, its durable commit included: the put runs on LangGraph's
    executor thread, and ours may commit a batch on whichever caller leads it,
    so one thread's CPU clock would miss or double count work. The list is
    shared by the copies `with_allowlist`/`for_graph` make (`copy.copy`).
    """

    put_times: list[float]

    def put(self, *args: Any, **kwargs: Any) -> Any:
        """Time the saver's own `put`."""
        started = time.perf_counter()
        try:
            return super().put(*args, **kwargs)  # type: ignore[misc]
        finally:
            self.put_times.append(time.perf_counter() - started)


# FencedSqliteSaver's own `prune`/`aprune` differ from LangGraph's (see its class).
class TimedFencedSqliteSaver(_TimedPuts, FencedSqliteSaver):  # type: ignore[misc]
    """FencedSqliteSaver whose puts are timed (`_TimedPuts`)."""

    def __init__(self, path: str, **kwargs: Any) -> None:
        """Open `path` as FencedSqliteSaver does; start with no put timed."""
        super().__init__(path, **kwargs)
        self.put_times = []


def timed_sqlite_saver_class() -> type:
    """Return a SqliteSaver subclass whose puts are timed (`_TimedPuts`)."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    class TimedSqliteSaver(_TimedPuts, SqliteSaver):
        """SqliteSaver whose puts are timed."""

        def __init__(self, conn: sqlite3.Connection, **kwargs: Any) -> None:
            super().__init__(conn, **kwargs)
            self.put_times = []

    return TimedSqliteSaver


# --- tables -----------------------------------------------------------------------------------


def ratio_row(
    table: Table,
    label: str,
    ours: Sequence[float],
    cells: Sequence[str],
    theirs: Sequence[float],
    limit: float | None,
    against: str,
    *,
    note: str = "",
) -> float:
    """Add a row of per-turn (or per-round) times and their median paired ratio; return it."""
    ratio = paired_ratio(ours, theirs)
    if limit is None:
        target = note or "info"
    else:
        target = f"<= {limit}x {verdict(ratio, limit)}{note}"
    table.add(label, *cells, f"{ratio:.2f}x ours/{against}", target)
    return ratio


def invoke_rows(
    table: Table,
    samples: dict[str, list[float]],
    w: int,
    limit: float,
    against: str,
    *,
    call: str = "invoke",
) -> dict[str, list[float]]:
    """Add the first-`w`-turns row (info) and the last-`w` one (ours vs "stock", `limit`).

    One column per contender of `samples` (per-turn seconds), in its order.

    Returns:
        Each contender's last `w` turns.
    """
    first = [fmt_time(median(s[:w])) for s in samples.values()]
    table.add(f"{call}, median of the first {w} turns", *first, "", "info")
    last = {name: s[-w:] for name, s in samples.items()}
    ratio_row(
        table,
        f"{call}, last {w} turns (median of per-turn ratios)",
        last["ours"],
        [fmt_time(median(s)) for s in last.values()],
        last["stock"],
        limit,
        against,
    )
    return last


def disk_note(slower: float | None) -> str:
    """Return the title's note on the emulated disk ("" without `--fsync-ms`)."""
    return "" if slower is None else f", every fsync +{slower:g} ms"


def window(turns: int) -> int:
    """How many turns the first/last windows hold: 10, or half a shorter run."""
    return max(1, min(LAST, turns // 2))


def read_rows(
    table: Table,
    contenders: dict[str, dict[str, Callable[[int], float]]],
    against: str,
    *,
    rounds: int,
    ops: int,
) -> None:
    """Time each read of every contender in interleaved rounds; add a row per read.

    `contenders` maps "ours", "stock" (named `against` in the ratio) and any
    others to their reads (`reads`); each gets a column, in that order.
    """
    for read in next(iter(contenders.values())):
        runs = {name: calls[read] for name, calls in contenders.items()}
        for run in runs.values():
            run(1)  # warm
        samples = interleave(runs, rounds=rounds, ops=ops, collect=True)
        cells = [fmt_time(median(samples[name])) for name in contenders]
        ratio_row(
            table,
            f"{read}, at the end ({rounds} rounds x {ops})",
            samples["ours"],
            cells,
            samples["stock"],
            READ_TARGET,
            against,
        )


# --- CHAT on SQLite ---------------------------------------------------------------------------


def chat_sqlite(directory: str, turns: int, rounds: int, ops: int, slower: float | None) -> None:
    """Print the CHAT table (invoke: ours, SqliteSaver, InMemorySaver)."""
    from langgraph.checkpoint.memory import InMemorySaver

    script = ChatScript(turns)
    builder = chat_builder(script)

    def make_input(turn: int) -> dict[str, Any]:
        return {"messages": [script.human(turn)]}

    paths = {"ours": os.path.join(directory, "chat-ours.db")}
    paths["stock"] = os.path.join(directory, "chat-stock.db")
    with ExitStack() as stack:
        savers = {
            "ours": stack.enter_context(FencedSqliteSaver(paths["ours"])),
            "stock": open_stock(stack, paths["stock"]),
            "memory": InMemorySaver(),
        }
        graphs = {name: builder.compile(checkpointer=s) for name, s in savers.items()}
        for graph in graphs.values():
            warm(graph, make_input, None)
        before = {name: sqlite_bytes(path)[0] for name, path in paths.items()}
        talks = {name: Conversation(g, "chat", make_input) for name, g in graphs.items()}
        started = time.perf_counter()
        samples = interleave(talks, rounds=turns, ops=1, collect=True)
        took = time.perf_counter() - started
        after = {name: sqlite_bytes(path) for name, path in paths.items()}
        w = window(turns)
        table = Table(
            f"CHAT: {turns} turns of ~1 KB each way, durability sync{disk_note(slower)} "
            f"(turns interleaved in rotating order; {took:.0f} s)",
            ["figure", "FencedSqliteSaver", "SqliteSaver", "InMemorySaver", "ratio", "target"],
        )
        limit, shown = bytes_target(turns)
        busy = " (WAL checkpoint blocked by a reader)" if after["ours"][1] else ""
        table.add(
            "file before the thread (schema + a 1-turn warm-up thread)",
            fmt_bytes(before["ours"]),
            fmt_bytes(before["stock"]),
            "-",
            "",
            "info",
        )
        table.add(
            f"bytes on disk after {turns} turns (db + WAL, wal_checkpoint(TRUNCATE))",
            fmt_bytes(after["ours"][0]),
            fmt_bytes(after["stock"][0]),
            "-",
            f"{after['ours'][0] / after['stock'][0]:.4f}x ours/SqliteSaver",
            f"ours {shown} {verdict(after['ours'][0], limit)}{busy}",
        )
        limit = CHAT_INVOKE_TARGET if slower is None else CHAT_INVOKE_TARGET_SLOW_FSYNC
        last = invoke_rows(table, samples, w, limit, "SqliteSaver")
        # With slower syncs the InMemorySaver target does not apply: it never syncs.
        ratio_row(
            table,
            f"invoke, last {w} turns, vs InMemorySaver",
            last["ours"],
            ["", "", ""],
            last["memory"],
            MEMORY_INVOKE_TARGET if slower is None else None,
            "InMemorySaver",
            note=""
            if slower is None
            else f"info (<= {MEMORY_INVOKE_TARGET}x is for the "
            "disk as it is: InMemorySaver never syncs)",
        )
        read_rows(
            table,
            {name: reads(g, talks[name].config) for name, g in graphs.items()},
            "SqliteSaver",
            rounds=rounds,
            ops=ops,
        )
        table.print()
        print(f"  {compression_note(script.asks)}")
        print()


def chat_sqlite_async(
    directory: str, turns: int, rounds: int, ops: int, slower: float | None
) -> None:
    """Print the CHAT async table (ainvoke: ours vs AsyncSqliteSaver)."""
    script = ChatScript(turns)
    builder = chat_builder(script)

    def make_input(turn: int) -> dict[str, Any]:
        return {"messages": [script.human(turn)]}

    paths = {
        "ours": os.path.join(directory, "achat-ours.db"),
        "stock": os.path.join(directory, "achat-stock.db"),
    }
    aio = AsyncRunner()
    stack = AsyncExitStack()
    try:
        ours = FencedSqliteSaver(paths["ours"])
        stack.push_async_callback(ours.aclose)
        savers = {"ours": ours, "stock": aio.run(open_stock_async(stack, paths["stock"]))}
        graphs = {name: builder.compile(checkpointer=s) for name, s in savers.items()}
        for graph in graphs.values():
            warm(graph, make_input, aio)
        talks = {name: Conversation(g, "chat", make_input, aio) for name, g in graphs.items()}
        started = time.perf_counter()
        samples = interleave(talks, rounds=turns, ops=1, collect=True)
        took = time.perf_counter() - started
        after = {name: sqlite_bytes(path)[0] for name, path in paths.items()}
        w = window(turns)
        table = Table(
            f"CHAT async: the same {turns} turns through ainvoke{disk_note(slower)} ({took:.0f} s)",
            ["figure", "FencedSqliteSaver", "AsyncSqliteSaver", "ratio", "target"],
        )
        table.add(
            f"bytes on disk after {turns} turns",
            fmt_bytes(after["ours"]),
            fmt_bytes(after["stock"]),
            f"{after['ours'] / after['stock']:.4f}x ours/AsyncSqliteSaver",
            "info",
        )
        invoke_rows(table, samples, w, CHAT_INVOKE_TARGET, "AsyncSqliteSaver", call="ainvoke")
        table.print()
    finally:
        aio.run(stack.aclose())
        aio.close()


# --- AGENT LOOP on SQLite ---------------------------------------------------------------------


class Profile(BaseModel):
    """What the agent knows about its user, rewritten every turn."""

    user: str
    turns: int
    topics: list[str]
    satisfaction: float


class Step(BaseModel):
    """One node run, appended to the `steps` channel."""

    node: str
    turn: int
    call: int


class AgentState(TypedDict, total=False):
    """An agent loop's state: messages, a log of node runs, a pydantic profile, the turn."""

    messages: Annotated[list, add_messages]
    steps: Annotated[list[Step], operator.add]
    profile: Profile
    turn: int


STEPS_PER_TURN = 2 * TOOL_CALLS + 1  # agent, tools, agent, tools, ..., agent (final)


class AgentScript:
    """What is said at every turn of the agent loop (the same for every contender)."""

    def __init__(self, turns: int, seed: int = 2) -> None:
        """Draw each turn's question, tool-call texts, tool results and answer."""
        prose = Prose(seed)
        self.asks = [prose.between(200, 600) for _ in range(turns)]
        self.thoughts = [[prose.between(300, 800) for _ in range(TOOL_CALLS)] for _ in range(turns)]
        self.queries = [[prose.between(10, 40) for _ in range(TOOL_CALLS)] for _ in range(turns)]
        self.results = [
            [prose.text(MESSAGE_BYTES) for _ in range(TOOL_CALLS)] for _ in range(turns)
        ]
        self.answers = [prose.between(300, 800) for _ in range(turns)]
        self.topics = [prose.text(8) for _ in range(turns)]

    def input(self, turn: int) -> dict[str, Any]:
        """Return turn `turn`'s input: the user's message and the turn number."""
        return {
            "messages": [HumanMessage(content=self.asks[turn], id=f"human-{turn}")],
            "turn": turn,
        }


def agent_builder(script: AgentScript) -> StateGraph:
    """Return the agent loop: agent -> tools -> agent ... -> END, texts read from `script`."""

    def agent(state: AgentState) -> dict[str, Any]:
        turn = state["turn"]
        call = (len(state.get("steps", [])) - turn * STEPS_PER_TURN) // 2
        step = [Step(node="agent", turn=turn, call=call)]
        if call < TOOL_CALLS:
            message = AIMessage(
                content=script.thoughts[turn][call],
                id=f"agent-{turn}-{call}",
                tool_calls=[
                    {
                        "name": "lookup",
                        "args": {"query": script.queries[turn][call], "page": call},
                        "id": f"call-{turn}-{call}",
                    }
                ],
            )
            return {"messages": [message], "steps": step}
        old = state.get("profile")
        topics = [] if old is None else old.topics
        profile = Profile(
            user="ada",
            turns=turn + 1,
            topics=[*topics[-7:], script.topics[turn]],
            satisfaction=round(0.5 + 0.5 * ((turn * 37) % 100) / 100, 2),
        )
        answer = AIMessage(content=script.answers[turn], id=f"answer-{turn}")
        return {"messages": [answer], "steps": step, "profile": profile}

    def tools(state: AgentState) -> dict[str, Any]:
        turn = state["turn"]
        call = (len(state["steps"]) - turn * STEPS_PER_TURN) // 2
        result = ToolMessage(
            content=script.results[turn][call],
            tool_call_id=f"call-{turn}-{call}",
            name="lookup",
            id=f"tool-{turn}-{call}",
        )
        return {"messages": [result], "steps": [Step(node="tools", turn=turn, call=call)]}

    def route(state: AgentState) -> str:
        return "tools" if state["messages"][-1].tool_calls else END

    builder = StateGraph(AgentState)
    builder.add_node("agent", agent)
    builder.add_node("tools", tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder


def compare_histories(ours: Any, theirs: Any, config: dict[str, Any]) -> tuple[int, str]:
    """Walk both graphs' full `get_state_history` in step; return (checkpoints, first difference).

    Compares each pair's `values`, `next`, and metadata `step` and `source`
    (checkpoint ids differ between savers). Streams both histories: no more
    than one snapshot of each is held at a time.
    """
    count = 0
    pairs = itertools.zip_longest(ours.get_state_history(config), theirs.get_state_history(config))
    for a, b in pairs:
        if a is None or b is None:
            side = "ours" if a is None else "SqliteSaver's"
            return count, f"{side} history ends after {count} checkpoints"
        count += 1
        meta_a, meta_b = a.metadata or {}, b.metadata or {}
        where = f"checkpoint {count} (step {meta_b.get('step')})"
        if a.values != b.values:
            keys = sorted(set(a.values) | set(b.values))
            differ = [k for k in keys if a.values.get(k) != b.values.get(k)]
            return count, f"{where}: values differ in {differ}"
        if a.next != b.next:
            return count, f"{where}: next {a.next} != {b.next}"
        for key in ("step", "source"):
            if meta_a.get(key) != meta_b.get(key):
                return count, f"{where}: metadata {key} {meta_a.get(key)!r} != {meta_b.get(key)!r}"
    return count, ""


class NewBytes:
    """Counts the bytes our puts prove (data-only) and compress into value rows.

    That is a put's work beyond encoding its values, which every saver does
    for the whole state (LangGraph's too; whether an element is unchanged is
    decided from its encoded bytes): the issue asks that it grow with what a
    step changed, not with the state. Installed around our graph only.
    """

    def __init__(self) -> None:
        """Start at zero."""
        self.total = 0

    @contextmanager
    def counting(self) -> Iterator[None]:
        """Count while inside (patches `DataOnlySerializer.prove` and `values.compress`)."""
        from langgraph_fenced_sqlite.core import values
        from langgraph_fenced_sqlite.core.serde import DataOnlySerializer

        prove, compress = DataOnlySerializer.prove, values.compress

        def counted_prove(serde: Any, obj: Any, data: bytes) -> None:
            self.total += len(data)
            prove(serde, obj, data)

        def counted_compress(data: bytes) -> tuple[str, bytes]:
            self.total += len(data)
            return compress(data)

        DataOnlySerializer.prove = counted_prove  # type: ignore[method-assign]
        values.compress = counted_compress  # type: ignore[assignment]
        try:
            yield
        finally:
            DataOnlySerializer.prove = prove  # type: ignore[method-assign]
            values.compress = compress


class AgentRun(Conversation):
    """A `Conversation` that also records each turn's mean put time (`_TimedPuts`)."""

    def __init__(
        self, graph: Any, saver: _TimedPuts, script: AgentScript, new: NewBytes | None = None
    ) -> None:
        """Run `script`'s turns on thread "agent" of `graph`, whose saver is `saver`."""
        super().__init__(graph, "agent", script.input)
        self.saver = saver
        self.puts: list[float] = []  # per turn: the mean wall time of its puts
        self.new, self.new_bytes = new, list[int]()  # per turn: `NewBytes` counted

    def __call__(self, n: int) -> float:
        """Run the next `n` turns; record the mean put time of each batch."""
        mark = len(self.saver.put_times)
        if self.new is None:
            took = super().__call__(n)
        else:
            before = self.new.total
            with self.new.counting():
                took = super().__call__(n)
            self.new_bytes.append(self.new.total - before)
        times = self.saver.put_times[mark:]
        self.puts.append(sum(times) / max(len(times), 1))
        return took


def agent_sqlite(directory: str, turns: int, rounds: int, ops: int, slower: float | None) -> None:
    """Print the AGENT LOOP table: ours vs SqliteSaver, turn by turn."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    script = AgentScript(turns)
    builder = agent_builder(script)
    paths = {
        "ours": os.path.join(directory, "agent-ours.db"),
        "stock": os.path.join(directory, "agent-stock.db"),
    }
    with ExitStack() as stack:
        # Ours: the graph's schema types (Profile, Step) allowed, as
        # docs/your-own-types.md says; theirs: the same classes in its
        # serializer's msgpack allow-list (else its reads log a warning).
        ours = stack.enter_context(TimedFencedSqliteSaver(paths["ours"]))
        allowed = [(cls.__module__, cls.__name__) for cls in (Profile, Step)]
        serde = JsonPlusSerializer(allowed_msgpack_modules=allowed)
        stock = open_stock(stack, paths["stock"], timed_sqlite_saver_class(), serde)
        savers = {"ours": ours.for_graph(builder), "stock": stock}
        graphs = {name: builder.compile(checkpointer=s) for name, s in savers.items()}
        for graph in graphs.values():
            warm(graph, script.input, None)
        del ours.put_times[:], stock.put_times[:]
        runs = {
            name: AgentRun(g, savers[name], script, NewBytes() if name == "ours" else None)
            for name, g in graphs.items()
        }
        started = time.perf_counter()
        samples = interleave(runs, rounds=turns, ops=1, collect=True)
        took = time.perf_counter() - started
        size = {name: sqlite_bytes(path)[0] for name, path in paths.items()}
        w = window(turns)
        table = Table(
            f"AGENT LOOP: {turns} turns of human -> (agent -> tools) x {TOOL_CALLS} -> agent"
            f", durability sync{disk_note(slower)} (interleaved turn by turn; {took:.0f} s)",
            ["figure", "FencedSqliteSaver", "SqliteSaver", "ratio", "target"],
        )
        ratio = size["ours"] / size["stock"]
        table.add(
            f"bytes on disk after {turns} turns (db + WAL, wal_checkpoint(TRUNCATE))",
            fmt_bytes(size["ours"]),
            fmt_bytes(size["stock"]),
            f"{ratio:.4f}x ours/SqliteSaver",
            f"<= {AGENT_BYTES_TARGET:.0%} {verdict(ratio, AGENT_BYTES_TARGET)}",
        )
        invoke_rows(table, samples, w, AGENT_INVOKE_TARGET, "SqliteSaver")
        read_rows(
            table,
            {
                name: {"get_state": reads(g, runs[name].config)["get_state"]}
                for name, g in graphs.items()
            },
            "SqliteSaver",
            rounds=rounds,
            ops=ops,
        )
        puts = {name: run.puts for name, run in runs.items()}
        growth = {name: median(p[-w:]) / median(p[:w]) for name, p in puts.items()}
        table.add(
            f"put wall time, median of turns 1-{w} (mean per put in a turn)",
            fmt_time(median(puts["ours"][:w])),
            fmt_time(median(puts["stock"][:w])),
            "",
            "info",
        )
        table.add(
            f"put wall time, median of the last {w} turns",
            fmt_time(median(puts["ours"][-w:])),
            fmt_time(median(puts["stock"][-w:])),
            f"{paired_ratio(puts['ours'][-w:], puts['stock'][-w:]):.2f}x ours/SqliteSaver",
            "info",
        )
        table.add(
            "put wall time growth: last / first (encoding the whole state included)",
            f"{growth['ours']:.2f}x",
            f"{growth['stock']:.2f}x",
            "",
            "info",
        )
        new = runs["ours"].new_bytes
        new_growth = median(new[-w:]) / median(new[:w])
        table.add(
            "bytes proven and compressed per turn: last / first (grow with the change)",
            f"{new_growth:.2f}x ({fmt_bytes(median(new[-w:]))} a turn)",
            "",
            "",
            f"ours <= {PUT_GROWTH_TARGET}x {verdict(new_growth, PUT_GROWTH_TARGET)}",
        )
        count, problem = compare_histories(graphs["ours"], graphs["stock"], runs["ours"].config)
        table.add(
            "history reads back equal (values, next, metadata step/source)",
            f"{count} checkpoints",
            "",
            "",
            f"equal {'PASS' if not problem else 'MISS: ' + problem}",
        )
        table.print()


# --- CHAT on PostgreSQL -----------------------------------------------------------------------

OUR_TABLES = (
    "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = current_schema() AND c.relkind = 'r' AND c.relname LIKE 'lgfs\\_%'"
)
THEIR_TABLES = (
    "SELECT coalesce(sum(pg_total_relation_size(to_regclass(t))), 0) FROM unnest("
    "ARRAY['checkpoints', 'checkpoint_blobs', 'checkpoint_writes', 'checkpoint_migrations']"
    ") AS t WHERE to_regclass(t) IS NOT NULL"
)


def pg_bytes(dsn: str, query: str) -> int:
    """Run one of the size queries (`OUR_TABLES`, `THEIR_TABLES`) in `dsn`'s schema."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


# Our tables' bytes as `pg_total_relation_size` counts them: the table's own
# forks (main, free-space and visibility maps), its indexes, its TOAST table
# (with the TOAST index).
OUR_BREAKDOWN = (
    "SELECT coalesce(sum(pg_table_size(c.oid)), 0), coalesce(sum(pg_indexes_size(c.oid)), 0), "
    "coalesce(sum(CASE WHEN c.reltoastrelid <> 0 THEN pg_total_relation_size(c.reltoastrelid) "
    "ELSE 0 END), 0) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = current_schema() AND c.relkind = 'r' AND c.relname LIKE 'lgfs\\_%'"
)


def pg_breakdown(dsn: str) -> tuple[int, int, int]:
    """Our tables' bytes as heap (every fork of the tables), indexes and TOAST (with its index)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(OUR_BREAKDOWN).fetchone()
    assert row is not None
    table, indexes, toast = (int(v) for v in row)
    return table - toast, indexes, toast


def pg_compacted(dsn: str) -> int:
    """Rewrite our tables without their dead row versions (`VACUUM FULL`); return their bytes."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = current_schema() AND c.relkind = 'r' "
                "AND c.relname LIKE 'lgfs\\_%'"
            ).fetchall()
        ]
        conn.execute(f"VACUUM FULL {', '.join(names)}")
    return pg_bytes(dsn, OUR_TABLES)


def chat_postgres(server: Any, turns: int, stock_turns: int, rounds: int, ops: int) -> None:
    """Print the POSTGRESQL chat table: FencedPostgresSaver vs PostgresSaver.

    Both run the first `stock_turns` turns side by side (PostgresSaver's
    bytes grow with the square of the turns: its tables hold gigabytes at
    1000, which takes a long time to write); ours then goes on alone to
    `turns`, where its bytes are held to the target.
    """
    from langgraph.checkpoint.postgres import PostgresSaver

    from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

    script = ChatScript(turns)
    builder = chat_builder(script)
    together = min(turns, stock_turns)

    def make_input(turn: int) -> dict[str, Any]:
        return {"messages": [script.human(turn)]}

    dsns = {"ours": server.fresh_dsn(), "stock": server.fresh_dsn()}
    with (
        FencedPostgresSaver.from_conn_string(dsns["ours"]) as ours,
        PostgresSaver.from_conn_string(dsns["stock"]) as theirs,
    ):
        ours.setup()
        theirs.setup()
        graphs = {
            "ours": builder.compile(checkpointer=ours),
            "stock": builder.compile(checkpointer=theirs),
        }
        for graph in graphs.values():
            warm(graph, make_input, None)
        talks = {name: Conversation(g, "chat", make_input) for name, g in graphs.items()}
        started = time.perf_counter()
        samples = interleave(talks, rounds=together, ops=1, collect=True)
        took = time.perf_counter() - started
        size = {"ours": pg_bytes(dsns["ours"], OUR_TABLES)}
        size["stock"] = pg_bytes(dsns["stock"], THEIR_TABLES)
        w = window(together)
        alone = "" if turns == together else f"; then ours alone to turn {turns}"
        table = Table(
            f"POSTGRESQL CHAT: {turns} turns of ~1 KB each way, durability sync "
            f"(server fsync off; interleaved turn by turn for {together}{alone}; {took:.0f} s "
            "together)",
            ["figure", "FencedPostgresSaver", "PostgresSaver", "ratio", "target"],
        )
        limit, shown = bytes_target(together)
        table.add(
            f"bytes after {together} turns (pg_total_relation_size of the saver's tables)",
            fmt_bytes(size["ours"]),
            fmt_bytes(size["stock"]),
            f"{size['ours'] / size['stock']:.4f}x ours/PostgresSaver",
            f"ours {shown} {verdict(size['ours'], limit)}",
        )
        invoke_rows(table, samples, w, CHAT_INVOKE_TARGET, "PostgresSaver")
        read_rows(
            table,
            {name: reads(g, talks[name].config) for name, g in graphs.items()},
            "PostgresSaver",
            rounds=rounds,
            ops=ops,
        )
        if turns > together:
            started = time.perf_counter()
            rest = interleave({"ours": talks["ours"]}, rounds=turns - together, ops=1)["ours"]
            took = time.perf_counter() - started
            final = pg_bytes(dsns["ours"], OUR_TABLES)
            limit, shown = bytes_target(turns)
            table.add(
                f"bytes after {turns} turns (ours alone, turns {together + 1}-{turns} in "
                f"{took:.0f} s)",
                fmt_bytes(final),
                "",
                "",
                f"ours {shown} {verdict(final, limit)}",
            )
            w = window(turns)
            table.add(
                f"invoke, median of the last {w} turns (ours alone)",
                fmt_time(median(rest[-w:])),
                "",
                "",
                "info",
            )
        heap, indexes, toast = pg_breakdown(dsns["ours"])
        table.add(
            f"ours after {turns} turns: heap / indexes / TOAST",
            f"{fmt_bytes(heap)} / {fmt_bytes(indexes)} / {fmt_bytes(toast)}",
            "",
            "",
            "info",
        )
        # What the live rows take, rewritten compactly: the dead versions the
        # run left (each single extension rewritten as a prefix leaves one)
        # are space a vacuumed store reuses, which autovacuum, off here, does.
        live = pg_compacted(dsns["ours"])
        table.add(
            f"ours after {turns} turns, live rows only (VACUUM FULL)",
            fmt_bytes(live),
            "",
            "",
            f"info ({verdict(live, limit)} against {shown})",
        )
        table.print()


# --- the run ----------------------------------------------------------------------------------


def _options(parser: Any) -> None:
    parser.add_argument("--turns", type=int, default=None, help="chat turns (default 1000)")
    parser.add_argument(
        "--agent-turns", type=int, default=None, help="agent-loop turns (default 300)"
    )
    parser.add_argument(
        "--only", choices=("chat", "agent", "postgres"), default=None, help="one workload only"
    )
    parser.add_argument(
        "--stock-turns",
        type=int,
        default=None,
        help="POSTGRESQL CHAT: turns PostgresSaver runs beside ours (default 200; ours goes "
        "on alone to --turns)",
    )
    parser.add_argument(
        "--stores",
        default="sqlite,postgres",
        help="comma-separated: sqlite (CHAT, AGENT LOOP), postgres (POSTGRESQL CHAT)",
    )
    fsync_shim.add_option(parser)


def main(argv: list[str] | None = None) -> int:
    """Print the tables of the chosen workloads; exit 0 whatever the figures."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args("Long conversations: storage and per-turn cost", argv, _options)
    slower = args.fsync_ms
    done = fsync_shim.rerun_slower(__file__, argv, slower)
    if done is not None:
        return done
    turns = args.turns or (12 if args.quick else 1000)
    agent_turns = args.agent_turns or (6 if args.quick else 300)
    rounds = args.rounds or (3 if args.quick else 10)
    ops = 1 if args.quick else 3
    stores = {s.strip() for s in args.stores.split(",") if s.strip()}
    wanted = {
        name
        for name, store in (("chat", "sqlite"), ("agent", "sqlite"), ("postgres", "postgres"))
        if store in stores and args.only in (None, name)
    }
    print(describe_build())
    runs = [f"{name} {n} turns" for name, n in (("chat", turns), ("agent loop", agent_turns))]
    runs = [runs[0]] * bool(wanted & {"chat", "postgres"}) + [runs[1]] * ("agent" in wanted)
    print(
        f"{', '.join(runs) or 'nothing to run (--only/--stores)'}; reads {rounds} rounds x {ops}; "
        f"messages ~{MESSAGE_BYTES} B of random words"
        + ("" if slower is None else f"; every fsync +{slower:g} ms (SQLite)")
    )
    print()
    if wanted & {"chat", "agent"}:
        with scratch_dir("bench-growth-", base=args.dir, keep=args.keep) as directory:
            print()
            if "chat" in wanted:
                chat_sqlite(directory, turns, rounds, ops, slower)
                chat_sqlite_async(directory, turns, rounds, ops, slower)
            if "agent" in wanted:
                agent_sqlite(directory, agent_turns, rounds, ops, slower)
    if "postgres" in wanted:
        if slower is not None:  # the benchmark's PostgreSQL never syncs (fsync off)
            print("POSTGRESQL CHAT: skipped (--fsync-ms slows SQLite's syncs only)")
            print()
        else:
            with postgres_server() as (server, why):
                if server is None:
                    print(
                        f"POSTGRESQL CHAT: skipped (no PostgreSQL server could be started: {why})"
                    )
                    print()
                else:
                    stock_turns = args.stock_turns or (turns if args.quick else 200)
                    chat_postgres(server, turns, stock_turns, rounds, ops)
    load = os.getloadavg()
    print(f"load average at the end {load[0]:.2f}")
    print("result: done (figures, not assertions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
