"""Shared helpers of the benchmark scripts: scratch dirs, interleaved timing, tables.

Invariant: every figure a script reports comes from `interleave`, which times
all contenders of one table side by side, round after round (in a rotated
order), so disk noise and CPU frequency drift hit them alike. A ratio is the
median of per-round ratios, never a ratio of numbers from different runs.
Nothing here asserts a timing: scripts print PASS/MISS and exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import random
import shutil
import sqlite3
import statistics
import string
import struct
import tempfile
import time
import uuid
import zlib
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

from langgraph_fenced_sqlite import FencedSqliteSaver
from langgraph_fenced_sqlite.sqlite import schema

T = TypeVar("T")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# --- arguments and scratch space ------------------------------------------------------


def parse_args(
    description: str,
    argv: Sequence[str] | None = None,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """Parse the options every benchmark script shares.

    Args:
        description: The script's one-line summary (shown by `--help`).
        argv: Arguments to parse instead of `sys.argv[1:]`.
        extra: A function that adds script-specific options to the parser.

    Returns:
        The parsed namespace (`quick`, `rounds`, `keep`, `dir`, plus extras).
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="tiny run (seconds), for smoke tests")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument(
        "--dir", default=None, help="where to create the scratch directory (default: see README)"
    )
    if extra is not None:
        extra(parser)
    return parser.parse_args(argv)


@contextlib.contextmanager
def postgres_server() -> Iterator[tuple[Any, str]]:
    """Yield a started throwaway PostgreSQL server and "", or None and why none could start.

    The benchmarks that compare on PostgreSQL skip it, saying why, without one.
    """
    from langgraph_fenced_sqlite.testing.postgres_server import start_server

    try:
        server = start_server()
    except Exception as exc:  # no binaries, initdb failed, no port: say why, skip
        yield None, f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        return
    try:
        yield server, ""
    finally:
        server.stop()


def pick_base_dir(explicit: str | None = None) -> tuple[str, str]:
    """Choose where scratch files go: /tmp if it is on the repo's device, else beside the repo.

    Returns:
        `(directory, note)`, the note saying which device it is on.
    """
    repo_dev = os.stat(REPO).st_dev
    if explicit:
        same = os.stat(explicit).st_dev == repo_dev
        return explicit, f"{explicit} (same device as the repo: {'yes' if same else 'NO'})"
    tmp = tempfile.gettempdir()
    if os.stat(tmp).st_dev == repo_dev:
        return tmp, f"{tmp} (same device as {REPO})"
    parent = os.path.dirname(REPO)
    return parent, f"{parent} ({tmp} is on another device than {REPO})"


@contextlib.contextmanager
def scratch_dir(prefix: str, *, base: str | None = None, keep: bool = False) -> Iterator[str]:
    """Yield a fresh directory for database files, removed afterwards unless `keep`."""
    where, note = pick_base_dir(base)
    path = tempfile.mkdtemp(prefix=prefix, dir=where)
    print(f"scratch files: {path}  [{note}]")
    try:
        yield path
    finally:
        if keep:
            print(f"kept {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)


def describe_build() -> str:
    """Return what is under test: Python, SQLite, load, and the repo commit (and if modified)."""
    import platform
    import subprocess

    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "langgraph_fenced_sqlite"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.strip()
        commit = f"{head}{' + uncommitted package changes' if dirty else ''}" if head else "?"
    except OSError:
        commit = "?"
    return (
        f"python {platform.python_version()}, sqlite {sqlite3.sqlite_version}, "
        f"cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}, commit {commit}"
    )


# --- timing -------------------------------------------------------------------------------

Contender = Callable[[int], float]
"""Runs `n` operations and returns the seconds they took (setup excluded)."""


def interleave(
    contenders: Mapping[str, Contender],
    *,
    rounds: int,
    ops: int | Mapping[str, int],
    seed: int = 1,
    collect: bool = False,
) -> dict[str, list[float]]:
    """Time every contender once per round, in a rotated order, for `rounds` rounds.

    Args:
        contenders: Name to a function running `n` operations, returning seconds.
        rounds: How many rounds.
        ops: Operations per contender per round (one number or one per name).
        seed: Seeds the shuffle of the first round's order.
        collect: Run a full garbage collection (untimed) before each
            contender's turn. Contenders share one process and one collector:
            without it, a full collection that one contender's garbage made
            due lands on whichever runs next (on large states, tens of ms).

    Returns:
        Name to the per-operation seconds of each round, in round order.
    """
    names = list(contenders)
    random.Random(seed).shuffle(names)
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            n = ops if isinstance(ops, int) else ops[name]
            if collect:
                gc.collect()
            samples[name].append(contenders[name](n) / n)
    return samples


def calibrate(
    contenders: Mapping[str, Contender], *, budget: float, lo: int, hi: int
) -> dict[str, int]:
    """Choose per-contender op counts so one batch takes about `budget` seconds."""
    out = {}
    for name, fn in contenders.items():
        per_op = fn(5) / 5
        out[name] = max(lo, min(hi, int(budget / max(per_op, 1e-7))))
    return out


def median(values: Sequence[float]) -> float:
    """Return the median of `values`."""
    return statistics.median(values)


def paired_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """Return the median over rounds of `num[i] / den[i]` (same-round ratios)."""
    return statistics.median(a / b for a, b in zip(num, den, strict=True))


def percentile(values: Sequence[float], q: float) -> float:
    """Return the `q`-th percentile (0-100) of `values`, interpolating linearly."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def fmt_time(seconds: float) -> str:
    """Format a duration with a unit that keeps three significant figures."""
    if seconds != seconds:  # NaN
        return "n/a"
    if abs(seconds) >= 1.0:
        return f"{seconds:.3f} s"
    if abs(seconds) >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"


def verdict(value: float, limit: float, *, at_least: bool = False) -> str:
    """Return "PASS" when `value <= limit` (or `>=` with `at_least`), else "MISS"."""
    ok = value >= limit if at_least else value <= limit
    return "PASS" if ok else "MISS"


class AsyncRunner:
    """One event loop kept for a whole script, so async contenders share it."""

    def __init__(self) -> None:
        """Create the loop."""
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` to completion on the loop."""
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        """Close the loop (after shutting down its default executor)."""
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()


# --- SQLite helpers -------------------------------------------------------------------------


def wal_header(db_path: str) -> tuple[int, int, int] | None:
    """Return `(checkpoint_seq, salt1, salt2)` of `db_path`'s WAL, or None if it has none.

    SQLite rewrites the header (new salts, next checkpoint sequence) each time
    a writer restarts the WAL from its beginning after a checkpoint, so a
    changed header means the WAL wrapped.
    """
    try:
        with open(db_path + "-wal", "rb") as fh:
            raw = fh.read(32)
    except FileNotFoundError:
        return None
    if len(raw) < 32:
        return None
    return struct.unpack(">III", raw[12:24])


def warm_past_wal_wrap(op: Callable[[], object], db_path: str, *, max_ops: int = 50_000) -> int:
    """Call `op()` (one commit each) until the WAL of `db_path` has wrapped once.

    The default `wal_autocheckpoint` (1000 pages) checkpoints once the WAL
    passes 1000 pages; the next writer then restarts the WAL at its start.
    Timing after that point measures the steady state: a WAL file already
    grown to full size, pages already allocated in the database file.

    Returns:
        How many operations it took.
    """
    first = wal_header(db_path)
    for n in range(1, max_ops + 1):
        op()
        current = wal_header(db_path)
        if first is None:
            first = current
        elif current != first:
            return n
    raise RuntimeError(f"{db_path}: WAL did not wrap after {max_ops} commits")


@contextlib.contextmanager
def count_statements(conn: sqlite3.Connection) -> Iterator[list[str]]:
    """Record every SQL statement `conn` runs inside the block (trace callback)."""
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    try:
        yield seen
    finally:
        # The block may have closed the connection (a watch closes its own).
        with contextlib.suppress(sqlite3.ProgrammingError):
            conn.set_trace_callback(None)


def connect_floor(path: str) -> sqlite3.Connection:
    """Open the floor's raw connection: WAL, `synchronous=FULL`, autocommit mode."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS rows (thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL, "
        "checkpoint_id TEXT NOT NULL, payload BLOB, "
        "PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id))"
    )
    return conn


class ContractRows:
    """The contract's rows of one commit in raw `sqlite3`: a yardstick, never a saver.

    What storing what CONTRACT.md promises costs in SQL alone, on a file with
    `FencedSqliteSaver`'s own schema (tables, indexes, triggers): per commit,
    `BEGIN IMMEDIATE`, the fence read that gives the commit its position
    (`schema.NEXT_SEQ_IF_UNCLAIMED`, the saver's common path), each pending
    write's rows and its `writes` event, the checkpoint's row and its
    `checkpoint` event (§3: a position per commit; §4: an event per write, in
    its transaction), `COMMIT`; the saver's statements, cells encoded by the
    caller. Nothing else: no argument checks, no data-only walk, no savepoints
    and no second fence read in a batch, checksums by `zlib.crc32`, and
    nothing it stores is read back. A target this misses cannot be met by any
    saver that keeps the contract on that disk.
    """

    def __init__(self, path: str) -> None:
        """Create `path` with the saver's schema, then reopen it raw with the saver's pragmas."""
        FencedSqliteSaver(path).close()
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        for name, value in schema.PRAGMAS:  # WAL, synchronous=FULL, ...
            self.conn.execute(schema.set_pragma(name, value)).fetchall()
        self.conn.execute(schema.set_pragma("wal_autocheckpoint", schema.WAL_AUTOCHECKPOINT))
        self.commits = 0

    def close(self) -> None:
        """Close the file."""
        self.conn.close()

    @staticmethod
    def checkpoint_row(
        serde: Any, checkpoint: Mapping[str, Any], metadata: Mapping[str, Any], parent_id: Any
    ) -> tuple[str, str | None, str, str, bytes, str, Any]:
        """Encode a put's checkpoint as `commit` takes it (JSON texts, values by `serde`)."""
        envelope = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        values_type, blob = serde.dumps_typed(checkpoint["channel_values"])
        return (
            checkpoint["id"],
            parent_id,
            orjson.dumps(envelope, option=orjson.OPT_SORT_KEYS).decode(),
            values_type,
            blob,
            orjson.dumps(metadata, option=orjson.OPT_SORT_KEYS, default=str).decode(),
            metadata.get("step"),
        )

    def commit(
        self,
        thread_id: str,
        ns: str,
        writes: Sequence[tuple[str, str, Sequence[tuple[str, str, bytes]]]] = (),
        checkpoint: tuple[str, str | None, str, str, bytes, str, Any] | None = None,
        run_id: str | None = None,
    ) -> None:
        """Store, in one durable commit, `writes` and then `checkpoint`.

        Args:
            writes: `(checkpoint_id, task_id, [(channel, type, blob), ...])` per task.
            checkpoint: `(id, parent_id, envelope, values_type, values_blob,
                metadata, step)`, or None for writes only.
        """
        ex = self.conn.execute
        now = time.time()
        ex("BEGIN IMMEDIATE")
        row = ex(schema.NEXT_SEQ_IF_UNCLAIMED, (thread_id, now)).fetchone()
        if row is None:  # the thread's first commit
            ex(schema.ENSURE_THREAD, (thread_id,))
            row = ex(schema.NEXT_SEQ_IF_UNCLAIMED, (thread_id, now)).fetchone()
        position = row[0]
        for checkpoint_id, task_id, cells in writes:
            for idx, (channel, type_, blob) in enumerate(cells):
                ex(
                    schema.INSERT_WRITE_FIRST_WINS,
                    (
                        thread_id,
                        ns,
                        checkpoint_id,
                        task_id,
                        idx,
                        "",
                        channel,
                        type_,
                        blob,
                        position,
                        run_id,
                        None,
                        zlib.crc32(blob),
                    ),
                )
            text = f'{{"channels":["{cells[0][0]}"],"task_id":"{task_id}","task_path":""}}'
            ex(
                schema.INSERT_EVENT,
                (
                    thread_id,
                    position,
                    "writes",
                    ns,
                    checkpoint_id,
                    text,
                    None,
                    now,
                    zlib.crc32(text.encode()),
                ),
            )
            position += 1
        if checkpoint is not None:
            cid, parent, envelope, values_type, blob, metadata, step = checkpoint
            ex(
                schema.INSERT_CHECKPOINT,
                (
                    thread_id,
                    ns,
                    cid,
                    position,
                    parent,
                    envelope,
                    values_type,
                    blob,
                    metadata,
                    "loop",
                    step,
                    run_id,
                    None,
                    now,
                    zlib.crc32(blob),
                ),
            )
            text = f'{{"parent_checkpoint_id":"{parent}","source":"loop","step":{step}}}'
            ex(
                schema.INSERT_EVENT,
                (
                    thread_id,
                    position,
                    "checkpoint",
                    ns,
                    cid,
                    text,
                    None,
                    now,
                    zlib.crc32(text.encode()),
                ),
            )
        ex("COMMIT")
        self.commits += 1


# --- LangGraph-realistic checkpoints ---------------------------------------------------------


def text_value(size: int, seed: int = 0) -> str:
    """Return `size` characters of pseudo-random text (a channel value)."""
    rng = random.Random(seed)
    return "".join(rng.choices(string.ascii_letters + string.digits + " ", k=size))


def version(n: int) -> str:
    """Return a channel version string shaped like the savers' `get_next_version`."""
    return f"{n:032}.{0.5:016}"


@dataclass
class Chain:
    """A thread's chain of LangGraph-realistic puts, each naming the previous as parent.

    Build the next `n` puts with `prepare(n)` (outside the timed region), then
    call `config()` and `advance(returned_config)` around each timed put.

    Attributes:
        configurable: The fixed `configurable` keys (thread, namespace, token).
        value: The channel value stored in every checkpoint (~4 KB of text).
        parent_id: The id of the last stored checkpoint (the next parent).
        step: The step of the next checkpoint.
    """

    configurable: dict[str, Any]
    value: str
    parent_id: str | None = None
    step: int = 0
    _queue: list[tuple[Any, Any, Any]] = field(default_factory=list)

    def prepare(self, n: int) -> None:
        """Build the next `n` (checkpoint, metadata, new_versions) triples."""
        self._queue = []
        for i in range(n):
            step = self.step + i
            ver = version(step + 1)
            checkpoint = generate_checkpoint(
                channel_values={"state": {"text": self.value, "step": step}},
                channel_versions={"__start__": version(1), "state": ver},
                versions_seen={"agent": {"state": version(step)}, "__input__": {}},
            )
            metadata = {"source": "loop", "step": step, "parents": {}}
            self._queue.append((checkpoint, metadata, {"state": ver}))
        self._queue.reverse()

    def next(self) -> tuple[dict[str, Any], Any, Any, Any]:
        """Return `(config, checkpoint, metadata, new_versions)` of the next put."""
        conf = dict(self.configurable)
        if self.parent_id is not None:
            conf["checkpoint_id"] = self.parent_id
        checkpoint, metadata, new_versions = self._queue.pop()
        return {"configurable": conf}, checkpoint, metadata, new_versions

    def advance(self, stored: Mapping[str, Any]) -> None:
        """Record the config a put returned: its checkpoint is the next parent."""
        self.parent_id = stored["configurable"]["checkpoint_id"]
        self.step += 1

    def latest_config(self) -> dict[str, Any]:
        """Return a config naming the last stored checkpoint (for `put_writes`)."""
        conf = dict(self.configurable)
        conf["checkpoint_id"] = self.parent_id
        return {"configurable": conf}


def task_ids(n: int) -> list[str]:
    """Return `n` fresh task ids."""
    return [str(uuid.uuid4()) for _ in range(n)]


def populate(
    saver: Any, chain: Chain, count: int, *, writes: bool = True, batch: int = 500
) -> list[str]:
    """Store `count` checkpoints on `chain`'s thread, each followed by one task write.

    Returns:
        The stored checkpoint ids, oldest first.
    """
    ids: list[str] = []
    done = 0
    while done < count:
        n = min(batch, count - done)
        chain.prepare(n)
        for _ in range(n):
            stored = saver.put(*chain.next())
            chain.advance(stored)
            ids.append(chain.parent_id or "")
            if writes:
                saver.put_writes(
                    chain.latest_config(), [("state", {"delta": chain.step})], str(uuid.uuid4())
                )
        done += n
    return ids


# --- tables -----------------------------------------------------------------------------


@dataclass
class Table:
    """A plain-text table printed with aligned columns.

    Attributes:
        title: Printed above the table.
        columns: Column headers.
        rows: Cell strings, one list per row.
    """

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        """Append one row (cells are converted with `str`)."""
        self.rows.append([str(c) for c in cells])

    def render(self) -> str:
        """Return the table as text."""
        widths = [len(c) for c in self.columns]
        for row in self.rows:
            widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
        line = "  ".join("-" * w for w in widths)
        out = [
            self.title,
            line,
            "  ".join(c.ljust(w) for c, w in zip(self.columns, widths, strict=True)),
        ]
        out.append(line)
        out += [
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in self.rows
        ]
        out.append(line)
        return "\n".join(out)

    def print(self) -> None:
        """Print the table followed by a blank line."""
        print(self.render(), flush=True)
        print(flush=True)
