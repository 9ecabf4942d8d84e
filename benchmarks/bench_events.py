"""Benchmark event delivery across processes, idle watchers, and pruning beside a live writer.

Three measurements, each against real processes on one file:

* latency: a child process appends events under a claim and records when
  each commit returned; the parent follows them with `saver.watch()` at the
  default `poll_interval` and records when each arrived (p50, p95, max);
* idle cost: a child holds one watcher (sync `watch`, then async `awatch`) on
  a thread nobody writes, and reports the statements its connection ran per
  second (trace callback) and the CPU seconds it used per second;
* pruning: 20,000 checkpoints pruned down to 10 with
  `RetentionPolicy(max_checkpoints=10)` while another process keeps putting
  on another thread of the same file; reports the prune's duration and the
  longest time that writer waited for one put, against `busy_timeout`.

Run `python benchmarks/bench_events.py` (about a minute), `--quick` for a
smoke run, `--profile` to add a cProfile of the prune. Timings are printed
with PASS/MISS and never asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import io
import json
import os
import pstats
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from _common import (
    Chain,
    Table,
    describe_build,
    fmt_time,
    median,
    parse_args,
    percentile,
    populate,
    scratch_dir,
    text_value,
    verdict,
)

from langgraph_fenced_sqlite import FencedSqliteSaver, RetentionPolicy, StoreBusy

BUSY_TIMEOUT = 5.0


@dataclass
class Settings:
    """Sizes of one run."""

    events: int
    idle_seconds: float
    history: int
    keep: int
    pause: float

    @classmethod
    def for_args(cls, quick: bool) -> Settings:
        """Return the default settings, or tiny ones with `quick`."""
        if quick:
            return cls(events=6, idle_seconds=0.2, history=200, keep=10, pause=0.1)
        return cls(events=150, idle_seconds=4.0, history=20_000, keep=10, pause=0.5)


# --- child processes ----------------------------------------------------------------------


def spawn(name: str, **args: Any) -> subprocess.Popen[str]:
    """Start this script as child `name` with JSON arguments."""
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--child", name, json.dumps(args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def expect_line(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """Read one JSON line a child printed (raising if it died first)."""
    line = proc.stdout.readline() if proc.stdout else ""
    if not line:
        proc.wait()
        raise RuntimeError(f"child exited with {proc.returncode} before answering")
    return json.loads(line)


def say(**fields: Any) -> None:
    """Print one JSON line to the parent."""
    print(json.dumps(fields), flush=True)


def child_appender(args: dict[str, Any]) -> None:
    """Append `n` events under a claim at random gaps; report when each commit returned."""
    rng = random.Random(args["seed"])
    with FencedSqliteSaver(args["path"], busy_timeout=BUSY_TIMEOUT) as saver:
        claim = saver.claim(args["thread_id"], "appender", 3600)
        say(ready=True)
        sys.stdin.readline()  # "go"
        commits = []
        for i in range(args["n"]):
            time.sleep(rng.uniform(args["gap_lo"], args["gap_hi"]))
            (seq,) = saver.append_events(args["thread_id"], claim.token, [("tick", {"i": i})])
            commits.append((seq, time.time()))
        saver.release(args["thread_id"], claim.token)
    say(commits=commits)


@contextlib.contextmanager
def poller_statements(poller: Any) -> Iterator[list[str]]:
    """Record every SQL statement a watch's poller runs inside the block.

    The poller opens its connection only while it waits, so the trace is
    handed to it rather than set on a connection.
    """
    seen: list[str] = []
    poller.trace = seen.append
    try:
        yield seen
    finally:
        poller.trace = None


def child_idle(args: dict[str, Any]) -> None:
    """Hold one idle watcher (sync, then async) and report its statements and CPU per second."""
    seconds = args["seconds"]
    with FencedSqliteSaver(args["path"], busy_timeout=BUSY_TIMEOUT) as saver:
        out: dict[str, Any] = {"poll_interval": saver.poll_interval}
        out["control"] = {"cpu": _cpu_over(seconds), "statements": 0, "distinct": []}

        watch = saver.watch(args["thread_id"])
        with poller_statements(watch._poller) as seen:  # the watcher's own connection
            reader = threading.Thread(target=lambda: list(watch), daemon=True)
            reader.start()
            time.sleep(0.2)
            start = len(seen)
            cpu = _cpu_over(seconds)
            out["watch"] = {
                "cpu": cpu,
                "statements": len(seen) - start,
                "distinct": sorted(set(seen[start:])),
            }
            watch.close()
            reader.join(10)

        async def run_async() -> dict[str, Any]:
            awatch = saver.awatch(args["thread_id"])
            with poller_statements(awatch._poller) as seen:

                async def consume() -> None:
                    async for _ in awatch:
                        pass

                task = asyncio.create_task(consume())
                await asyncio.sleep(0.2)
                start = len(seen)
                cpu0, wall0 = time.process_time(), time.monotonic()
                await asyncio.sleep(seconds)
                cpu = (time.process_time() - cpu0) / (time.monotonic() - wall0)
                result = {
                    "cpu": cpu,
                    "statements": len(seen) - start,
                    "distinct": sorted(set(seen[start:])),
                }
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                await awatch.aclose()
            return result

        out["awatch"] = asyncio.run(run_async())
        out["seconds"] = seconds
    say(**out)


def _cpu_over(seconds: float) -> float:
    cpu0, wall0 = time.process_time(), time.monotonic()
    time.sleep(seconds)
    return (time.process_time() - cpu0) / (time.monotonic() - wall0)


def child_writer(args: dict[str, Any]) -> None:
    """Put checkpoints on another thread until the stop file exists; report each put's span."""
    value = text_value(4096, seed=2)
    chain = Chain({"thread_id": args["thread_id"], "checkpoint_ns": ""}, value)
    puts = []
    with FencedSqliteSaver(args["path"], busy_timeout=BUSY_TIMEOUT) as saver:
        say(ready=True)
        while not os.path.exists(args["stop"]):
            chain.prepare(1)
            t0 = time.time()
            try:
                chain.advance(saver.put(*chain.next()))
                ok = True
            except StoreBusy:
                ok = False
            puts.append((t0, time.time(), ok))
            time.sleep(0.002)
    say(puts=puts)


CHILDREN = {"appender": child_appender, "idle": child_idle, "writer": child_writer}


# --- measurements -----------------------------------------------------------------------------


def bench_latency(d: str, s: Settings) -> None:
    """Measure commit-to-receipt latency of `watch()` for commits made by another process."""
    path = os.path.join(d, "events.db")
    thread_id = "ev"
    with FencedSqliteSaver(path, busy_timeout=BUSY_TIMEOUT) as saver:
        poll = saver.poll_interval
        child = spawn(
            "appender",
            path=path,
            thread_id=thread_id,
            n=s.events,
            seed=7,
            gap_lo=0.4 * poll,
            gap_hi=2.4 * poll,
        )
        expect_line(child)
        received: dict[int, float] = {}
        watch = saver.watch(thread_id)

        def collect() -> None:
            with watch:
                for event in watch:
                    received[event.seq] = time.time()
                    if len(received) >= s.events:
                        break

        collector = threading.Thread(target=collect, daemon=True)
        collector.start()
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        commits = expect_line(child)["commits"]
        child.wait()
        collector.join(4 * poll + 2.0)
        watch.close()
        collector.join(5.0)
    latencies = [received[seq] - t for seq, t in commits if seq in received]
    table = Table(
        f"EVENT LATENCY: child process commits {s.events} events (append_events under a "
        f"claim, random gaps), parent follows with watch() at poll_interval={poll * 1e3:.0f} ms",
        ["metric", "value", "target", "result"],
    )
    table.add(
        "events delivered",
        f"{len(latencies)}/{len(commits)}",
        "all",
        verdict(len(latencies), len(commits), at_least=True),
    )
    p50, p95 = percentile(latencies, 50), percentile(latencies, 95)
    p50_limit, p95_limit = poll / 2 + 0.005, poll + 0.010
    table.add(
        "p50 commit -> receipt",
        fmt_time(p50),
        f"<= poll/2 + 5 ms = {fmt_time(p50_limit)}",
        verdict(p50, p50_limit),
    )
    table.add(
        "p95 commit -> receipt",
        fmt_time(p95),
        f"<= poll + 10 ms = {fmt_time(p95_limit)}",
        verdict(p95, p95_limit),
    )
    table.add("max", fmt_time(max(latencies)), "info", "-")
    table.add("min", fmt_time(min(latencies)), "info", "-")
    table.add("mean", fmt_time(sum(latencies) / len(latencies)), "info", "-")
    table.print()
    print(
        "Targets are what polling predicts: a commit lands at a uniformly random point "
        "of the poll cycle, so latency ~ U(0, poll_interval)."
    )
    print()


def start_idle(d: str, s: Settings) -> subprocess.Popen[str]:
    """Start the idle-watcher child on a file of its own (it reports when done)."""
    path = os.path.join(d, "idle.db")
    FencedSqliteSaver(path).close()  # create the file before the child opens it
    return spawn("idle", path=path, thread_id="quiet", seconds=s.idle_seconds)


def bench_idle(child: subprocess.Popen[str]) -> None:
    """Report what one idle watcher costs: statements per second and CPU seconds per second."""
    out = expect_line(child)
    child.wait()
    poll = out["poll_interval"]
    expected = 1.0 / poll
    table = Table(
        f"IDLE WATCHER: one watcher on a thread nobody writes, {out['seconds']:.1f} s each, in a "
        f"child process (poll_interval={poll * 1e3:.0f} ms)",
        [
            "watcher",
            "statements/s",
            "expected",
            "target",
            "result",
            "CPU s/s",
            "statements seen",
        ],
    )
    for name, label in (
        ("control", "none (control)"),
        ("watch", "sync watch()"),
        ("awatch", "async awatch()"),
    ):
        r = out[name]
        qps = r["statements"] / out["seconds"]
        if name == "control":
            table.add(label, "0.0", "-", "-", "ref", f"{r['cpu']:.5f}", "-")
            continue
        table.add(
            label,
            f"{qps:.1f}",
            f"{expected:.1f} (1/poll)",
            f"<= {1.1 * expected:.1f}",
            verdict(qps, 1.1 * expected),
            f"{r['cpu']:.5f}",
            " | ".join(" ".join(sql.split())[:40] for sql in r["distinct"]),
        )
    table.print()
    print("CPU s/s = process CPU seconds per wall second of the child (1.0 = one core busy).")
    print()


def bench_prune(d: str, s: Settings, *, profile: bool) -> None:
    """Prune `s.history` checkpoints to `s.keep` while another process keeps writing."""
    path = os.path.join(d, "prune.db")
    value = text_value(4096)
    with FencedSqliteSaver(path, busy_timeout=BUSY_TIMEOUT) as saver:
        loaded = time.perf_counter()
        saver._engine._conn.execute("PRAGMA synchronous=OFF")  # bulk load only
        threads = ["big", "big-profiled"] if profile else ["big"]
        for thread_id in threads:
            populate(saver, Chain({"thread_id": thread_id, "checkpoint_ns": ""}, value), s.history)
        saver._engine._conn.execute("PRAGMA synchronous=FULL")
        loaded = time.perf_counter() - loaded
        print(f"loaded {s.history} checkpoints (+1 write each) per thread in {loaded:.1f} s")

        stop = os.path.join(d, "stop-writer")
        writer = spawn("writer", path=path, thread_id="other", stop=stop)
        expect_line(writer)
        time.sleep(s.pause)  # the writer's baseline
        t0 = time.time()
        (result,) = saver.prune(["big"], strategy=RetentionPolicy(max_checkpoints=s.keep))
        t1 = time.time()
        time.sleep(s.pause)
        open(stop, "w").close()
        puts = expect_line(writer)["puts"]
        writer.wait()
        remaining = len(saver.history("big", limit=s.history))

        if profile:
            prof = cProfile.Profile()
            prof.enable()
            saver.prune(["big-profiled"], strategy=RetentionPolicy(max_checkpoints=s.keep))
            prof.disable()
    duration = t1 - t0
    during = [(a, b, ok) for a, b, ok in puts if b > t0 and a < t1]
    outside = [b - a for a, b, ok in puts if b <= t0 or a >= t1]
    longest = max((b - a for a, b, _ in during), default=0.0)
    busy = sum(1 for *_, ok in puts if not ok)
    table = Table(
        f"PRUNE: {s.history} -> {s.keep} checkpoints in one call, while a writer process puts "
        f"on another thread of the file (busy_timeout={BUSY_TIMEOUT:.0f} s)",
        ["metric", "value", "target", "result"],
    )
    table.add("prune duration", fmt_time(duration), "info", "-")
    table.add("checkpoints removed", len(result.checkpoints), "info", "-")
    table.add(
        "checkpoints remaining",
        remaining,
        f"== {s.keep}",
        "PASS" if remaining == s.keep else "MISS",
    )
    table.add(
        "longest writer put during prune",
        fmt_time(longest),
        f"<= busy_timeout ({BUSY_TIMEOUT:.0f} s)",
        verdict(longest, BUSY_TIMEOUT),
    )
    table.add(
        "longest put / prune duration",
        f"{longest / duration:.2f}" if duration else "n/a",
        "info (~1: prune holds the write lock throughout)",
        "-",
    )
    table.add("writer puts overlapping the prune", len(during), "info", "-")
    table.add("writer puts refused with StoreBusy", busy, "0", "PASS" if busy == 0 else "MISS")
    table.add(
        "writer put p50 outside the prune",
        fmt_time(median(outside)) if outside else "n/a",
        "info",
        "-",
    )
    table.print()
    if profile:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
        print(f"PROFILE: cProfile of prune {s.history} -> {s.keep} (no concurrent writer)")
        print("\n".join(out.getvalue().splitlines()[4:]))


def main(argv: list[str] | None = None) -> int:
    """Run the event benchmarks and print their tables (or act as a child process)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        CHILDREN[argv[1]](json.loads(argv[2]))
        return 0
    args = parse_args(
        __doc__.splitlines()[0],
        argv,
        lambda p: p.add_argument("--profile", action="store_true", help="profile the prune"),
    )
    s = Settings.for_args(args.quick)
    started = time.perf_counter()
    with scratch_dir("lgfs-bench-events-", base=args.dir, keep=args.keep) as d:
        print(describe_build())
        print()
        # The idle child measures only its own process (CPU time, statements on
        # its own connection and file), so it runs beside the latency test.
        idle = start_idle(d, s)
        try:
            bench_latency(d, s)
            bench_idle(idle)
        finally:
            if idle.poll() is None:
                idle.kill()
                idle.wait()
        bench_prune(d, s, profile=args.profile)
    print(f"total {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
