"""Benchmark FencedSqliteSaver's write and read paths against LangGraph's savers and a raw floor.

Every figure is a ratio measured side by side in one run (see `_common.interleave`):

* writes: `put` (4 KB state), `aput`, `put_writes`, a fenced `put` (claim token
  in the config), `claim` and `release`, against `SqliteSaver`,
  `AsyncSqliteSaver` and the floor: raw `sqlite3`, WAL, `synchronous=FULL`,
  one row per `BEGIN IMMEDIATE ... COMMIT`, on the same disk, every file
  pre-warmed past one WAL wrap; and `contract rows`: the rows CONTRACT.md
  promises for that call (the fence read, the row, its event) in raw SQL on
  our schema (`_common.ContractRows`), which no saver keeping the contract
  can beat on that disk;
* reads: `get_tuple` (latest and an old id), `aget_tuple` and `list(limit=10)`
  with 10 and 20,000 checkpoints of history, plus the number of SQL statements
  one `list` runs (trace callback on the saver's connection).

Run `python benchmarks/bench_saver.py` (about two minutes), `--quick` for a
smoke run, `--profile` to add cProfile and per-statement evidence. Timings are
printed with PASS/MISS against the project's targets and never asserted.
"""

from __future__ import annotations

import asyncio
import cProfile
import functools
import io
import itertools
import os
import pstats
import random
import sqlite3
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import aiosqlite
from _common import (
    AsyncRunner,
    Chain,
    ContractRows,
    Table,
    calibrate,
    connect_floor,
    count_statements,
    describe_build,
    fmt_time,
    interleave,
    median,
    paired_ratio,
    parse_args,
    percentile,
    populate,
    scratch_dir,
    task_ids,
    text_value,
    verdict,
    warm_past_wal_wrap,
)
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from langgraph_fenced_sqlite import FencedSqliteSaver
from langgraph_fenced_sqlite.core.hop import Hop

perf = time.perf_counter
INSERT_FLOOR = "INSERT INTO rows VALUES (?, ?, ?, ?)"


@dataclass
class Settings:
    """Sizes of one run.

    Rounds are many and short (a few ops per contender) so that a burst of
    disk or CPU contention lands on every contender alike.
    """

    rounds: int
    write_ops: int
    read_rounds: int
    read_budget: float
    history: int
    warm: bool
    profile_ops: int
    fence_pairs: int

    @classmethod
    def for_args(cls, quick: bool, rounds: int | None) -> Settings:
        """Return the default settings, or tiny ones with `quick`."""
        if quick:
            return cls(rounds or 2, 4, rounds or 2, 0.002, 200, False, 30, 10)
        return cls(rounds or 50, 10, rounds or 40, 0.02, 20_000, True, 500, 1500)


# --- savers ---------------------------------------------------------------------------


def open_sqlite_saver(path: str) -> tuple[SqliteSaver, sqlite3.Connection]:
    """Open LangGraph's SqliteSaver with the same durability as ours (WAL, FULL)."""
    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()  # sets journal_mode=WAL
    conn.execute("PRAGMA synchronous=FULL")
    return saver, conn


async def open_async_sqlite_saver(path: str) -> tuple[AsyncSqliteSaver, aiosqlite.Connection]:
    """Open LangGraph's AsyncSqliteSaver with WAL and `synchronous=FULL`."""
    conn = await aiosqlite.connect(path)
    saver = AsyncSqliteSaver(conn)
    await saver.setup()
    await conn.execute("PRAGMA synchronous=FULL")
    return saver, conn


def set_sync(conn: sqlite3.Connection, mode: str) -> None:
    """Set `synchronous` on a connection (bulk-loading history only)."""
    conn.execute(f"PRAGMA synchronous={mode}")


# --- write contenders ---------------------------------------------------------------------


def floor_writer(
    conn: sqlite3.Connection, thread_id: str, payload: bytes
) -> Callable[[int], float]:
    """Return a contender committing one row per `BEGIN IMMEDIATE ... COMMIT`."""
    counter = itertools.count()

    def run(n: int) -> float:
        ids = [f"{next(counter):020d}" for _ in range(n)]
        ex = conn.execute
        t0 = perf()
        for cid in ids:
            ex("BEGIN IMMEDIATE")
            ex(INSERT_FLOOR, (thread_id, "", cid, payload))
            ex("COMMIT")
        return perf() - t0

    return run


def contract_writer(
    rows: ContractRows, chain: Chain, *, writes: bool = False, aio: AsyncRunner | None = None
) -> Callable[[int], float]:
    """Return a contender committing the contract's rows of a `put` (or a `put_writes`), raw.

    The yardstick `ContractRows` (a fence read, the row, its event, one
    commit, on our schema), cells encoded before the clock starts: what the
    SQL alone costs. `writes`: one 4 KB write of a new task per op, all on
    one checkpoint, as `writes_writer` does. `aio`: each put awaited through
    one thread hop, our saver's own (`hop.Hop`, the cheapest measured here),
    the one hop an async saver of a sync driver pays.
    """
    serde = JsonPlusSerializer()
    thread_id = chain.configurable["thread_id"]

    def encode() -> tuple[str, str | None, str, str, bytes, str, Any]:
        conf, checkpoint, metadata, _ = chain.next()
        chain.advance({"configurable": {"checkpoint_id": checkpoint["id"]}})
        parent = conf["configurable"].get("checkpoint_id")
        return ContractRows.checkpoint_row(serde, checkpoint, metadata, parent)

    cell = ("state", *serde.dumps_typed({"text": chain.value}))
    if writes:
        chain.prepare(1)
        rows.commit(thread_id, "", (), encode())  # the checkpoint the writes belong to

    def run(n: int) -> float:
        if writes:
            cid = chain.parent_id
            ops = [((cid, task, [cell]),) for task in task_ids(n)]
            t0 = perf()
            for op in ops:
                rows.commit(thread_id, "", op)
            return perf() - t0
        chain.prepare(n)
        puts = [encode() for _ in range(n)]
        if aio is not None:
            return aio.run(hopped(puts))
        t0 = perf()
        for row in puts:
            rows.commit(thread_id, "", (), row)
        return perf() - t0

    hop = Hop(1, "contract") if aio is not None else None  # its worker exits with the process

    async def hopped(puts: list[Any]) -> float:
        assert hop is not None
        t0 = perf()
        for row in puts:
            await hop.run(functools.partial(rows.commit, thread_id, "", (), row))
        return perf() - t0

    return run


def put_writer(saver: Any, chain: Chain) -> Callable[[int], float]:
    """Return a contender doing `n` chained sync `put`s."""

    def run(n: int) -> float:
        chain.prepare(n)
        put, nxt, adv = saver.put, chain.next, chain.advance
        t0 = perf()
        for _ in range(n):
            adv(put(*nxt()))
        return perf() - t0

    return run


def aput_writer(saver: Any, chain: Chain, aio: AsyncRunner) -> Callable[[int], float]:
    """Return a contender doing `n` chained `aput`s, awaited one after another."""

    async def go(n: int) -> float:
        aput, nxt, adv = saver.aput, chain.next, chain.advance
        t0 = perf()
        for _ in range(n):
            adv(await aput(*nxt()))
        return perf() - t0

    def run(n: int) -> float:
        chain.prepare(n)
        return aio.run(go(n))

    return run


def writes_writer(saver: Any, chain: Chain, value: Any) -> Callable[[int], float]:
    """Return a contender doing `n` `put_writes` (one 4 KB channel write, a new task each)."""
    writes = [("state", value)]

    def run(n: int) -> float:
        config = chain.latest_config()
        tasks = task_ids(n)
        put_writes = saver.put_writes
        t0 = perf()
        for task in tasks:
            put_writes(config, writes, task)
        return perf() - t0

    return run


def hop_runner(aio: AsyncRunner) -> Callable[[int], float]:
    """Return a contender awaiting `n` empty `asyncio.to_thread` hops.

    For scale: `aput`'s own hop (`hop.Hop`) costs less.
    """

    async def go(n: int) -> float:
        t0 = perf()
        for _ in range(n):
            await asyncio.to_thread(int)
        return perf() - t0

    return lambda n: aio.run(go(n))


def fence_pairs(
    saver: FencedSqliteSaver, unfenced: Chain, fenced: Chain, n: int
) -> list[tuple[float, float]]:
    """Time `n` (unfenced put, fenced put) pairs, alternating op by op in random order."""
    unfenced.prepare(n)
    fenced.prepare(n)
    order = random.Random(3)
    out = []
    for _ in range(n):
        times = {}
        for key in order.sample(["a", "b"], 2):
            chain = unfenced if key == "a" else fenced
            args = chain.next()
            t0 = perf()
            stored = saver.put(*args)
            times[key] = perf() - t0
            chain.advance(stored)
        out.append((times["a"], times["b"]))
    return out


def claim_cycle(saver: FencedSqliteSaver, thread_id: str, timed: str) -> Callable[[int], float]:
    """Return a contender doing `n` claim+release round trips, timing one half."""

    def run(n: int) -> float:
        total = 0.0
        for _ in range(n):
            t0 = perf()
            claim = saver.claim(thread_id, "bench", 3600)
            t1 = perf()
            saver.release(thread_id, claim.token)
            t2 = perf()
            total += (t1 - t0) if timed == "claim" else (t2 - t1)
        return total

    return run


def bench_writes(d: str, s: Settings, aio: AsyncRunner, stack: ExitStack) -> dict[str, Any]:
    """Time the write contenders side by side and print their table.

    Returns:
        The channel value and floor payload, for the read benchmarks.
    """
    value = text_value(4096)
    sample = Chain({"thread_id": "x", "checkpoint_ns": ""}, value)
    sample.prepare(1)
    payload = os.urandom(len(JsonPlusSerializer().dumps_typed(sample.next()[1])[1]))

    floor_conn = connect_floor(os.path.join(d, "floor-w.db"))
    stack.callback(floor_conn.close)
    fenced = FencedSqliteSaver(os.path.join(d, "fenced-w.db"))
    stack.callback(fenced.close)
    contract = ContractRows(os.path.join(d, "contract-w.db"))
    stack.callback(contract.close)
    lg, lg_conn = open_sqlite_saver(os.path.join(d, "lg-w.db"))
    stack.callback(lg_conn.close)
    lga, lga_conn = aio.run(open_async_sqlite_saver(os.path.join(d, "lga-w.db")))
    stack.callback(lambda: aio.run(lga_conn.close()))

    def chain(thread_id: str, **extra: Any) -> Chain:
        return Chain({"thread_id": thread_id, "checkpoint_ns": "", **extra}, value)

    claim = fenced.claim("put-token", "bench", 3600)
    token_conf = claim.config()["configurable"]
    chains = {
        "fenced": chain("put"),
        "contract": chain("put"),
        "contract-aput": chain("aput"),
        "contract-writes": chain("writes"),
        "fenced-token": Chain({**token_conf, "checkpoint_ns": ""}, value),
        "fenced-aput": chain("aput"),
        "fenced-writes": chain("writes"),
        "lg": chain("put"),
        "lg-writes": chain("writes"),
        "lga": chain("aput"),
    }
    for key, saver in (("fenced-writes", fenced), ("lg-writes", lg)):
        put_writer(saver, chains[key])(1)  # the checkpoint the writes belong to

    notes = []
    if s.warm:
        warm_floor = floor_writer(floor_conn, "warm", payload)
        warm_contract = contract_writer(contract, chain("warm"), writes=False)
        warm_ops = {
            "floor": warm_past_wal_wrap(lambda: warm_floor(1), os.path.join(d, "floor-w.db")),
            "contract": warm_past_wal_wrap(
                lambda: warm_contract(1), os.path.join(d, "contract-w.db")
            ),
        }
        for name, saver, path in (
            ("FencedSqliteSaver", fenced, "fenced-w.db"),
            ("SqliteSaver", lg, "lg-w.db"),
        ):
            warm = put_writer(saver, chain("warm"))
            warm_ops[name] = warm_past_wal_wrap(lambda w=warm: w(1), os.path.join(d, path))
        warm_async = aput_writer(lga, chain("warm"), aio)
        warm_ops["AsyncSqliteSaver"] = warm_past_wal_wrap(
            lambda: warm_async(1), os.path.join(d, "lga-w.db")
        )
        notes.append(
            "pre-warm: commits until each file's WAL wrapped once: "
            + ", ".join(f"{k} {v}" for k, v in warm_ops.items())
        )
    else:
        notes.append("pre-warm skipped (--quick)")

    contenders = {
        "floor": floor_writer(floor_conn, "bench", payload),
        "contract.put": contract_writer(contract, chains["contract"], writes=False),
        "contract.put_writes": contract_writer(contract, chains["contract-writes"], writes=True),
        "contract.aput": contract_writer(contract, chains["contract-aput"], aio=aio),
        "fenced.put": put_writer(fenced, chains["fenced"]),
        "fenced.put+token": put_writer(fenced, chains["fenced-token"]),
        "fenced.aput": aput_writer(fenced, chains["fenced-aput"], aio),
        "fenced.put_writes": writes_writer(fenced, chains["fenced-writes"], {"text": value}),
        "fenced.claim": claim_cycle(fenced, "claims", "claim"),
        "fenced.release": claim_cycle(fenced, "claims", "release"),
        "lg.put": put_writer(lg, chains["lg"]),
        "lg.put_writes": writes_writer(lg, chains["lg-writes"], {"text": value}),
        "lga.aput": aput_writer(lga, chains["lga"], aio),
        "hop": hop_runner(aio),
    }
    samples = interleave(contenders, rounds=s.rounds, ops=s.write_ops)
    if s.warm:
        notes.append(f"{s.rounds * s.write_ops} ops per contender in total")

    def vs_floor(name: str) -> float:
        return paired_ratio(samples[name], samples["floor"])

    table = Table(
        f"WRITES: median per-op over {s.rounds} interleaved rounds x {s.write_ops} ops "
        f"(ratios = median of same-round ratios)",
        ["op", "contender", "per-op", "ratio", "ratio of", "p25-p75", "target", "result"],
    )
    fl = median(samples["floor"])
    table.add("commit", "floor: raw sqlite3", fmt_time(fl), "1.00", "-", "-", "-", "ref")
    rows = [
        ("put", "FencedSqliteSaver", "fenced.put", 1.2),
        ("put", "SqliteSaver", "lg.put", None),
        ("put", "contract rows, raw sqlite3", "contract.put", None),
        ("put_writes", "FencedSqliteSaver", "fenced.put_writes", 1.2),
        ("put_writes", "SqliteSaver", "lg.put_writes", None),
        ("put_writes", "contract rows, raw sqlite3", "contract.put_writes", None),
        ("aput", "FencedSqliteSaver", "fenced.aput", 2.0),
        ("aput", "AsyncSqliteSaver", "lga.aput", None),
        ("aput", "contract rows + our hop", "contract.aput", None),
        ("(hop)", "asyncio.to_thread, no I/O", "hop", None),
        ("claim", "FencedSqliteSaver", "fenced.claim", 2.0),
        ("release", "FencedSqliteSaver", "fenced.release", 2.0),
    ]
    for op, who, key, limit in rows:
        r = vs_floor(key)
        target = f"<= {limit:.2f}" if limit else "info"
        result = verdict(r, limit) if limit else "-"
        table.add(
            op,
            who,
            fmt_time(median(samples[key])),
            f"{r:.2f}",
            "x floor",
            spread(samples[key], samples["floor"]),
            target,
            result,
        )
    speedup = paired_ratio(samples["lga.aput"], samples["fenced.aput"])
    table.add(
        "aput",
        "AsyncSqliteSaver / Fenced",
        "-",
        f"{speedup:.2f}",
        "speedup",
        spread(samples["lga.aput"], samples["fenced.aput"]),
        ">= 1.30",
        verdict(speedup, 1.3, at_least=True),
    )
    yardstick = paired_ratio(samples["lga.aput"], samples["contract.aput"])
    table.add(
        "aput",
        "AsyncSqliteSaver / contract",
        "-",
        f"{yardstick:.2f}",
        "speedup",
        spread(samples["lga.aput"], samples["contract.aput"]),
        "info",
        "-",
    )
    # The fence adds one indexed read to a commit (a few us), far below the
    # noise of batches of fsyncs, so it gets its own op-by-op alternation.
    pairs = fence_pairs(fenced, chains["fenced"], chains["fenced-token"], s.fence_pairs)
    ratios = [b / a for a, b in pairs]
    fence = median(ratios)
    table.add(
        "put (fenced)",
        "FencedSqliteSaver+token",
        fmt_time(median([b for _, b in pairs])),
        f"{fence:.3f}",
        "x unfenced put",
        f"{percentile(ratios, 25):.2f}-{percentile(ratios, 75):.2f}",
        "<= 1.05",
        verdict(fence, 1.05),
    )
    notes.append(
        f"put (fenced): median of {len(pairs)} per-op ratios, fenced and unfenced puts "
        f"alternating one by one in random order; ratio of total times "
        f"{sum(b for _, b in pairs) / sum(a for a, _ in pairs):.3f}"
    )
    table.print()
    for note in notes:
        print(note)
    print()
    return {"value": value, "payload": payload}


def concurrent_writer(
    saver: Any, chains: list[Chain], counter: list[int] | None = None
) -> Callable[[int], float]:
    """Return a contender where `len(chains)` threads each do `n` chained puts at once.

    The time returned is the wall time of the whole burst, so per-op figures
    are wall time per put (throughput), which group commit improves.
    """

    def run(n: int) -> float:
        for chain in chains:
            chain.prepare(n)
        start = threading.Barrier(len(chains) + 1)

        def work(chain: Chain) -> None:
            start.wait()
            for _ in range(n):
                chain.advance(saver.put(*chain.next()))

        threads = [threading.Thread(target=work, args=(c,)) for c in chains]
        for thread in threads:
            thread.start()
        start.wait()
        t0 = perf()
        for thread in threads:
            thread.join()
        return (perf() - t0) / len(chains)  # so that dividing by n gives wall time per put

    return run


def bench_concurrent(d: str, s: Settings, stack: ExitStack, value: str) -> None:
    """Time 4 threads putting at once on one saver: group commit against SqliteSaver's lock."""
    fenced = FencedSqliteSaver(os.path.join(d, "fenced-c.db"))
    stack.callback(fenced.close)
    lg, lg_conn = open_sqlite_saver(os.path.join(d, "lg-c.db"))
    stack.callback(lg_conn.close)

    def chains(prefix: str, k: int) -> list[Chain]:
        return [Chain({"thread_id": f"{prefix}{i}", "checkpoint_ns": ""}, value) for i in range(k)]

    # Each file's WAL full-size first, as for the WRITES table. Unwarmed, ours
    # (more WAL frames per put, so its WAL wraps later) was timed on a growing
    # file for more of the rounds: x1 352 us -> 260 us once warmed (theirs 209 -> 197 us).
    if s.warm:
        for saver, path in ((fenced, "fenced-c.db"), (lg, "lg-c.db")):
            warm = put_writer(saver, chains("warm", 1)[0])
            warm_past_wal_wrap(lambda w=warm: w(1), os.path.join(d, path))

    # Count the engine's commits by wrapping its batch step (a trace callback
    # would expand every 4 KB blob into SQL text and distort the timing).
    commits: list[int] = []
    group = fenced._engine._group
    batch_step = group.lead

    def counted(own: Any) -> None:
        commits.append(group.queued())
        batch_step(own)

    group.lead = counted  # type: ignore[method-assign]
    contenders = {
        "fenced x1": concurrent_writer(fenced, chains("one", 1)),
        "fenced x4": concurrent_writer(fenced, chains("four", 4)),
        "lg x1": concurrent_writer(lg, chains("one", 1)),
        "lg x4": concurrent_writer(lg, chains("four", 4)),
    }
    ops = max(2, s.write_ops // 2)
    samples = interleave(contenders, rounds=max(2, s.rounds // 2), ops=ops)
    group.lead = batch_step  # type: ignore[method-assign]
    # Each sample is already wall time per put: the burst's wall time over
    # all the puts of all its threads.
    table = Table(
        "CONCURRENT PUTS: 4 threads x one saver, wall time per put (group commit vs a lock)",
        ["contender", "threads", "per put (wall)", "vs same saver x1", "vs SqliteSaver x4"],
    )
    other = median(samples["lg x4"])
    for name, label, k in (
        ("fenced x1", "FencedSqliteSaver", 1),
        ("fenced x4", "FencedSqliteSaver", 4),
        ("lg x1", "SqliteSaver", 1),
        ("lg x4", "SqliteSaver", 4),
    ):
        per_put = median(samples[name])
        base = median(samples[name.replace("x4", "x1")])
        table.add(
            label, str(k), fmt_time(per_put), f"{per_put / base:.2f}", f"{per_put / other:.2f}"
        )
    table.print()
    total_puts = sum(len(samples[n]) * ops * k for n, k in (("fenced x1", 1), ("fenced x4", 4)))
    print(
        f"FencedSqliteSaver puts per COMMIT over both runs: {total_puts / max(1, len(commits)):.2f}"
    )
    print()


def spread(num: list[float], den: list[float]) -> str:
    """Return the 25th-75th percentile range of the per-round ratios `num/den`."""
    ratios = [a / b for a, b in zip(num, den, strict=True)]
    return f"{percentile(ratios, 25):.2f}-{percentile(ratios, 75):.2f}"


# --- reads --------------------------------------------------------------------------------


def loop(op: Callable[[], object]) -> Callable[[int], float]:
    """Return a contender calling `op()` `n` times."""

    def run(n: int) -> float:
        t0 = perf()
        for _ in range(n):
            op()
        return perf() - t0

    return run


def aloop(op: Callable[[], Any], aio: AsyncRunner) -> Callable[[int], float]:
    """Return a contender awaiting `op()` `n` times on the shared loop."""

    async def go(n: int) -> float:
        t0 = perf()
        for _ in range(n):
            await op()
        return perf() - t0

    return lambda n: aio.run(go(n))


def bench_reads(
    d: str, s: Settings, aio: AsyncRunner, stack: ExitStack, value: str, payload: bytes
) -> None:
    """Time reads at 10 and `s.history` checkpoints; count `list`'s statements."""
    sizes = (10, s.history)
    conf = {"thread_id": "hist", "checkpoint_ns": ""}
    latest = {"configurable": conf}
    contenders: dict[str, Callable[[int], float]] = {}
    savers: dict[tuple[str, int], Any] = {}
    load_started = perf()
    for size in sizes:
        fenced = FencedSqliteSaver(os.path.join(d, f"fenced-r{size}.db"))
        stack.callback(fenced.close)
        set_sync(fenced._engine._conn, "OFF")  # bulk load only; restored below
        f_ids = populate(fenced, Chain(dict(conf), value), size)
        set_sync(fenced._engine._conn, "FULL")
        lg, lg_conn = open_sqlite_saver(os.path.join(d, f"lg-r{size}.db"))
        stack.callback(lg_conn.close)
        set_sync(lg_conn, "OFF")
        l_ids = populate(lg, Chain(dict(conf), value), size)
        set_sync(lg_conn, "FULL")
        lga, lga_conn = aio.run(open_async_sqlite_saver(os.path.join(d, f"lg-r{size}.db")))
        stack.callback(lambda c=lga_conn: aio.run(c.close()))
        floor = connect_floor(os.path.join(d, f"floor-r{size}.db"))
        stack.callback(floor.close)
        floor.execute("BEGIN")
        floor.executemany(INSERT_FLOOR, (("hist", "", f"{i:020d}", payload) for i in range(size)))
        floor.execute("COMMIT")
        savers[("fenced", size)], savers[("lg", size)] = fenced, lg
        savers[("lg_conn", size)] = lg_conn

        def old(ids: list[str]) -> dict[str, Any]:
            return {"configurable": {**conf, "checkpoint_id": ids[1]}}

        f_old, l_old, fl_old = old(f_ids), old(l_ids), f"{1:020d}"
        contenders.update(
            {
                f"fenced.latest@{size}": loop(lambda f=fenced: f.get_tuple(latest)),
                f"fenced.old@{size}": loop(lambda f=fenced, c=f_old: f.get_tuple(c)),
                f"fenced.list@{size}": loop(lambda f=fenced: list(f.list(latest, limit=10))),
                f"fenced.alatest@{size}": aloop(lambda f=fenced: f.aget_tuple(latest), aio),
                f"lg.latest@{size}": loop(lambda g=lg: g.get_tuple(latest)),
                f"lg.old@{size}": loop(lambda g=lg, c=l_old: g.get_tuple(c)),
                f"lg.list@{size}": loop(lambda g=lg: list(g.list(latest, limit=10))),
                f"lga.alatest@{size}": aloop(lambda g=lga: g.aget_tuple(latest), aio),
                f"floor.latest@{size}": loop(
                    lambda c=floor: c.execute(
                        "SELECT * FROM rows WHERE thread_id = ? AND checkpoint_ns = ? "
                        "ORDER BY checkpoint_id DESC LIMIT 1",
                        ("hist", ""),
                    ).fetchone()
                ),
                f"floor.old@{size}": loop(
                    lambda c=floor, k=fl_old: c.execute(
                        "SELECT * FROM rows WHERE thread_id = ? AND checkpoint_ns = ? "
                        "AND checkpoint_id = ?",
                        ("hist", "", k),
                    ).fetchone()
                ),
                f"floor.list@{size}": loop(
                    lambda c=floor: c.execute(
                        "SELECT * FROM rows WHERE thread_id = ? AND checkpoint_ns = ? "
                        "ORDER BY checkpoint_id DESC LIMIT 10",
                        ("hist", ""),
                    ).fetchall()
                ),
            }
        )
    print(
        f"history loaded in {perf() - load_started:.1f} s "
        f"(synchronous=OFF while loading; FULL again for timing)"
    )
    ops = calibrate(contenders, budget=s.read_budget, lo=3, hi=1000)
    samples = interleave(contenders, rounds=s.read_rounds, ops=ops)
    small, big = sizes
    table = Table(
        f"READS: median per-op over {s.read_rounds} interleaved rounds; history = one thread with "
        f"N checkpoints, each with one pending write",
        [
            "op",
            "contender",
            f"@{small}",
            f"@{big}",
            f"{big}/{small}",
            "target",
            "result",
            f"x floor @{big}",
        ],
    )
    ops_names = [
        ("get_tuple latest", "latest"),
        ("get_tuple old id", "old"),
        ("list(limit=10)", "list"),
        ("aget_tuple latest", "alatest"),
    ]
    who = {
        "fenced": "FencedSqliteSaver",
        "lg": "SqliteSaver",
        "lga": "AsyncSqliteSaver",
        "floor": "floor: raw sqlite3",
    }
    for label, op in ops_names:
        for impl in ("fenced", "lg", "lga", "floor"):
            a, b = f"{impl}.{op}@{small}", f"{impl}.{op}@{big}"
            if a not in samples:
                continue
            flat = paired_ratio(samples[b], samples[a])
            floor_key = f"floor.{op.removeprefix('a')}@{big}"
            xf = paired_ratio(samples[b], samples[floor_key])
            target = "<= 1.20" if impl == "fenced" else "info"
            result = verdict(flat, 1.2) if impl == "fenced" else "-"
            table.add(
                label,
                who[impl],
                fmt_time(median(samples[a])),
                fmt_time(median(samples[b])),
                f"{flat:.2f}",
                target,
                result,
                "ref" if impl == "floor" else f"{xf:.1f}",
            )
    table.print()
    # Issue "Speed lead": reads no slower than the stock saver's.
    versus = Table(
        "READS vs the stock saver: ours / theirs, same history, same rounds",
        ["op", "ours / SqliteSaver", "ours / AsyncSqliteSaver", "target", "result"],
    )
    for label, op in ops_names:
        for size in sizes:
            ours = samples.get(f"fenced.{op}@{size}")
            lg = samples.get(f"lg.{op}@{size}")
            lga = samples.get(f"lga.{op}@{size}")
            sync_r = paired_ratio(ours, lg) if ours and lg else None
            async_r = paired_ratio(ours, lga) if ours and lga else None
            judged = sync_r if sync_r is not None else async_r
            versus.add(
                f"{label} @{size}",
                "-" if sync_r is None else f"{sync_r:.2f}",
                "-" if async_r is None else f"{async_r:.2f}",
                "<= 1.00",
                "-" if judged is None else verdict(judged, 1.0),
            )
    versus.print()
    count_list_statements(savers, big)


def count_list_statements(savers: dict[tuple[str, int], Any], size: int) -> None:
    """Count the statements one `list(limit=k)` runs on each saver's connection."""
    latest = {"configurable": {"thread_id": "hist", "checkpoint_ns": ""}}
    fenced, lg = savers[("fenced", size)], savers[("lg", size)]
    conns = {"FencedSqliteSaver": (fenced, fenced._engine._conn), "SqliteSaver": (lg, lg.conn)}
    table = Table(
        f"STATEMENTS per list() at {size} checkpoints (trace callback on the saver's connection)",
        [
            "contender",
            "limit=1",
            "limit=10",
            "statements run by list(limit=10)",
            "target",
            "result",
        ],
    )
    for name, (saver, conn) in conns.items():
        counts, seen10 = {}, []
        for limit in (1, 10):
            with count_statements(conn) as seen:
                got = list(saver.list(latest, limit=limit))
            assert len(got) == limit, (name, len(got))
            counts[limit] = len(seen)
            if limit == 10:
                seen10 = seen
        shape = summarize_statements(seen10)
        if name == "FencedSqliteSaver":
            target, result = "same for 1 and 10", verdict(counts[10], counts[1])
        else:
            target, result = "info", "-"
        table.add(name, counts[1], counts[10], shape, target, result)
    table.print()


def summarize_statements(statements: list[str]) -> str:
    """Return e.g. `BEGIN; SELECT checkpoints; SELECT writes x10; COMMIT`."""
    parts: list[list[Any]] = []
    for sql in statements:
        words = sql.split()
        head = words[0].upper() if words else "?"
        if head == "SELECT" and "FROM" in [w.upper() for w in words]:
            upper = [w.upper() for w in words]
            head = f"SELECT {words[upper.index('FROM') + 1]}"
        if parts and parts[-1][0] == head:
            parts[-1][1] += 1
        else:
            parts.append([head, 1])
    return "; ".join(h if n == 1 else f"{h} x{n}" for h, n in parts)


# --- profile ------------------------------------------------------------------------------


class _TimedConn:
    """A connection (or cursor) proxy that adds up the time spent in each kind of statement.

    `twin` shares its totals: the engine runs its writes on a kept cursor
    (`engine._cursor`) and its other statements on the connection, so both
    are swapped for proxies adding into one table (`_timed`).
    """

    def __init__(self, conn: Any, twin: _TimedConn | None = None) -> None:
        self._conn = conn
        self.time: dict[str, float] = twin.time if twin else defaultdict(float)
        self.count: dict[str, int] = twin.count if twin else defaultdict(int)

    def execute(self, sql: str, *args: Any) -> Any:
        t0 = perf()
        try:
            return self._conn.execute(sql, *args)
        finally:
            key = " ".join(sql.split())[:60]
            self.time[key] += perf() - t0
            self.count[key] += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


@contextmanager
def _timed(engine: Any) -> Iterator[_TimedConn]:
    """Time every statement `engine` runs inside the block: its connection and kept cursor."""
    conn, cursor = engine._conn, engine._cursor
    timed = _TimedConn(conn)
    engine._conn, engine._cursor = timed, _TimedConn(cursor, twin=timed)  # diagnostic only
    try:
        yield timed
    finally:
        engine._conn, engine._cursor = conn, cursor


def wal_frames_per_commit(
    conn: sqlite3.Connection, db_path: str, op: Callable[[], object], commits: int = 20
) -> str:
    """Return how many WAL frames (pages) one `op()` commit appends, averaged over `commits`."""
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for _ in range(commits):
        op()
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    return f"{(os.path.getsize(db_path + '-wal') - 32) / (page + 24) / commits:.1f}"


def profile(d: str, s: Settings, value: str, payload: bytes, aio: AsyncRunner) -> None:
    """Print where FencedSqliteSaver's write time goes, with LangGraph's saver and the floor."""
    # 1. Durable (FULL) vs no-fsync (OFF) twins of each contender, interleaved:
    #    OFF is the CPU cost (Python + SQLite), FULL - OFF the durability I/O.
    contenders: dict[str, Callable[[int], float]] = {}
    conns: dict[str, tuple[sqlite3.Connection, str, Callable[[int], float]]] = {}
    for mode in ("FULL", "OFF"):
        fpath = os.path.join(d, f"prof-floor-{mode}.db")
        floor_conn = connect_floor(fpath)
        set_sync(floor_conn, mode)
        fenced = FencedSqliteSaver(os.path.join(d, f"prof-fenced-{mode}.db"))
        set_sync(fenced._engine._conn, mode)
        lg, lg_conn = open_sqlite_saver(os.path.join(d, f"prof-lg-{mode}.db"))
        set_sync(lg_conn, mode)
        fenced_writes = Chain({"thread_id": "w", "checkpoint_ns": ""}, value)
        lg_writes = Chain({"thread_id": "w", "checkpoint_ns": ""}, value)
        put_writer(fenced, fenced_writes)(1)
        put_writer(lg, lg_writes)(1)
        runs = {
            "floor": floor_writer(floor_conn, "prof", payload),
            "fenced.put": put_writer(fenced, Chain({"thread_id": "p", "checkpoint_ns": ""}, value)),
            "fenced.put+token": put_writer(
                fenced,
                Chain(
                    {**fenced.claim("pt", "bench", 3600).config()["configurable"]}
                    | {"checkpoint_ns": ""},
                    value,
                ),
            ),
            "lg.put": put_writer(lg, Chain({"thread_id": "p", "checkpoint_ns": ""}, value)),
            "fenced.put_writes": writes_writer(fenced, fenced_writes, {"text": value}),
            "lg.put_writes": writes_writer(lg, lg_writes, {"text": value}),
        }
        if s.warm:
            for name, path in (("floor", fpath), ("fenced.put", fenced.path)):
                warm_past_wal_wrap(lambda r=runs[name]: r(1), path)
            warm_past_wal_wrap(lambda r=runs["lg.put"]: r(1), os.path.join(d, f"prof-lg-{mode}.db"))
        for name, run in runs.items():
            contenders[f"{name}/{mode}"] = run
        conns[f"floor/{mode}"] = (floor_conn, fpath, runs["floor"])
        conns[f"fenced.put/{mode}"] = (fenced._engine._conn, fenced.path, runs["fenced.put"])
        conns[f"lg.put/{mode}"] = (
            lg_conn,
            os.path.join(d, f"prof-lg-{mode}.db"),
            runs["lg.put"],
        )
        conns[f"fenced.put_writes/{mode}"] = (
            fenced._engine._conn,
            fenced.path,
            runs["fenced.put_writes"],
        )
        conns[f"lg.put_writes/{mode}"] = (
            lg_conn,
            os.path.join(d, f"prof-lg-{mode}.db"),
            runs["lg.put_writes"],
        )
        conns[f"_fenced/{mode}"] = (fenced._engine._conn, "", lambda n, f=fenced: f.close())
        conns[f"_lg/{mode}"] = (lg_conn, "", lambda n, c=lg_conn: c.close())
    rounds = max(2, s.rounds // 2)
    samples = interleave(contenders, rounds=rounds, ops=s.write_ops)
    table = Table(
        f"PROFILE: durable (synchronous=FULL) vs no-fsync (OFF) twins, {rounds} interleaved "
        "rounds; OFF = CPU (Python + SQLite), FULL - OFF = durability I/O",
        ["contender", "FULL", "OFF (CPU)", "FULL - OFF (I/O)", "x floor FULL", "WAL frames/commit"],
    )
    for name in (
        "floor",
        "fenced.put",
        "fenced.put+token",
        "lg.put",
        "fenced.put_writes",
        "lg.put_writes",
    ):
        full, off = median(samples[f"{name}/FULL"]), median(samples[f"{name}/OFF"])
        frames = "-"
        if f"{name}/FULL" in conns:
            conn, path, run = conns[f"{name}/FULL"]
            frames = wal_frames_per_commit(conn, path, lambda r=run: r(1))
        table.add(
            name,
            fmt_time(full),
            fmt_time(off),
            fmt_time(full - off),
            f"{paired_ratio(samples[f'{name}/FULL'], samples['floor/FULL']):.2f}",
            frames,
        )
    table.print()

    # 2. Which statements of one put cost what (no fsync, so pure CPU), and the rest.
    fenced_conn, fenced_path, _ = conns["fenced.put/OFF"]
    fenced_off = FencedSqliteSaver(fenced_path)
    set_sync(fenced_off._engine._conn, "OFF")
    chain = Chain({"thread_id": "stmt", "checkpoint_ns": ""}, value)
    put = put_writer(fenced_off, chain)
    put(5)
    with _timed(fenced_off._engine) as timed:
        total = put(s.profile_ops)
    table = Table(
        "PROFILE: one FencedSqliteSaver.put, statement by statement (synchronous=OFF)",
        ["part", "per put", "calls/put"],
    )
    in_sql = sum(timed.time.values())
    for key, spent in sorted(timed.time.items(), key=lambda kv: -kv[1]):
        table.add(key, fmt_time(spent / s.profile_ops), timed.count[key] // s.profile_ops)
    table.add("(all SQL statements)", fmt_time(in_sql / s.profile_ops), "")
    table.add("(Python outside SQLite)", fmt_time((total - in_sql) / s.profile_ops), "")
    table.print()

    # 3. cProfile of the same puts, durable.
    fenced_full = FencedSqliteSaver(conns["fenced.put/FULL"][1])
    chain = Chain({"thread_id": "cprof", "checkpoint_ns": ""}, value)
    chain.prepare(s.profile_ops)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(s.profile_ops):
        chain.advance(fenced_full.put(*chain.next()))
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(14)
    print(f"PROFILE: cProfile of {s.profile_ops} FencedSqliteSaver.put, FULL (by tottime)")
    print("\n".join(out.getvalue().splitlines()[4:]))

    fenced_off.close()
    fenced_full.close()
    for key in [k for k in conns if k.startswith("_")]:
        conns[key][2](0)
    for key in ("floor/FULL", "floor/OFF"):
        conns[key][0].close()


def profile_list(d: str, s: Settings) -> None:
    """Show where `list(limit=10)` spends its time at full history, and a faster query."""
    from langgraph_fenced_sqlite.sqlite import schema

    path = os.path.join(d, f"fenced-r{s.history}.db")
    fenced = FencedSqliteSaver(path)
    config = {"configurable": {"thread_id": "hist", "checkpoint_ns": ""}}
    n = 20
    with _timed(fenced._engine) as timed:
        for _ in range(n):
            page = list(fenced.list(config, limit=10))
    table = Table(
        f"PROFILE: time per statement inside one FencedSqliteSaver.list(limit=10) "
        f"at {s.history} checkpoints",
        ["statement", "per list", "calls"],
    )
    for key, total in sorted(timed.time.items(), key=lambda kv: -kv[1]):
        table.add(key, fmt_time(total / n), timed.count[key])
    table.print()

    keys = [
        (c.config["configurable"]["thread_id"], "", c.config["configurable"]["checkpoint_id"])
        for c in page
    ]
    current_sql, params = schema.writes_of_checkpoints(keys)
    values = ", ".join("(?, ?, ?)" for _ in keys)
    join_sql = (
        "SELECT w.thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.channel, w.type, "
        f"w.blob, w.task_path, w.idx FROM (VALUES {values}) AS k JOIN writes AS w "
        "ON w.thread_id = k.column1 AND w.checkpoint_ns = k.column2 "
        "AND w.checkpoint_id = k.column3 ORDER BY w.task_path, w.task_id, w.idx"
    )
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    table = Table(
        "PROFILE: the page's writes query, current vs suggested (same rows, raw sqlite3)",
        ["query", "per run", "rows", "EXPLAIN QUERY PLAN"],
    )
    results = []
    for label, sql in (
        ("current: (t, ns, id) IN (VALUES ...)", current_sql),
        ("suggested: (VALUES ...) AS k JOIN writes", join_sql),
    ):
        plan = "; ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params))
        t0 = perf()
        for _ in range(n):
            rows = conn.execute(sql, params).fetchall()
        results.append(rows)
        table.add(label, fmt_time((perf() - t0) / n), len(rows), plan)
    table.print()
    print(f"same rows in the same order: {results[0] == results[1]}")
    print()
    conn.close()
    fenced.close()


def main(argv: list[str] | None = None) -> int:
    """Run the saver benchmarks and print their tables."""
    args = parse_args(
        __doc__.splitlines()[0],
        argv,
        lambda p: p.add_argument("--profile", action="store_true", help="add profiler evidence"),
    )
    s = Settings.for_args(args.quick, args.rounds)
    started = perf()
    with scratch_dir("lgfs-bench-saver-", base=args.dir, keep=args.keep) as d:
        print(describe_build())
        print(f"rounds {s.rounds} (writes), {s.read_rounds} (reads), history {s.history}")
        print()
        # Closed last to first, even on an error (aiosqlite's worker thread
        # would otherwise keep the interpreter from exiting).
        with ExitStack() as stack:
            aio = AsyncRunner()
            stack.callback(aio.close)
            w = bench_writes(d, s, aio, stack)
            bench_concurrent(d, s, stack, w["value"])
            bench_reads(d, s, aio, stack, w["value"], w["payload"])
            if args.profile:
                profile(d, s, w["value"], w["payload"], aio)
        if args.profile:
            profile_list(d, s)
    print(f"total {perf() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
