"""Benchmark event delivery across processes, idle watchers, and pruning beside a live writer.

Three measurements, each against real processes on one file:

* latency: a child process appends events under a claim and records when
  each commit returned; the parent follows them with default options, by
  `saver.watch()` and by `saver.awatch()` (a new child for each), and
  records when each arrived (p50, p95, max); a third pass follows with the
  doorbell unavailable, to show the polling fallback;
* idle cost: a child holds one watcher (sync `watch`, then async `awatch`) on
  a thread nobody writes, and reports the CPU it used per second and the
  statements its connection ran per second (trace callback);
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
from langgraph_fenced_sqlite.core.watch import _WAIT_SLICE as WAIT_SLICE
from langgraph_fenced_sqlite.sqlite import doorbell

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
        return cls(events=200, idle_seconds=10.0, history=20_000, keep=10, pause=0.5)


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
        sys.stdin.readline()  # "go": the parent's watcher is waiting
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
            listening = watch._poller.listening
            cpu = _cpu_over(seconds)
            out["watch"] = {
                "cpu": cpu,
                "statements": len(seen) - start,
                "distinct": sorted(set(seen[start:])),
                "bell": listening,
                "safety": watch._poller.safety_interval,
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
                listening = awatch._poller.listening
                cpu0, wall0 = time.process_time(), time.monotonic()
                await asyncio.sleep(seconds)
                cpu = (time.process_time() - cpu0) / (time.monotonic() - wall0)
                result = {
                    "cpu": cpu,
                    "statements": len(seen) - start,
                    "distinct": sorted(set(seen[start:])),
                    "bell": listening,
                    "safety": awatch._poller.safety_interval,
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


P50_TARGET, P95_TARGET = 0.001, 0.005  # cross-process event latency, default options
IDLE_CPU_TARGET = 0.001  # CPU seconds per second of one idle watcher


def follow(saver: FencedSqliteSaver, thread_id: str, n: int, mode: str) -> Any:
    """Start following `thread_id` in a thread of its own; return (received, thread, watch).

    `received` maps each seq to the wall time it arrived; `mode` is `watch`
    (sync) or `awatch` (async, on an event loop of its own in that thread).
    """
    received: dict[int, float] = {}
    if mode == "watch":
        watch: Any = saver.watch(thread_id)

        def collect() -> None:
            with watch:
                for event in watch:
                    received[event.seq] = time.time()
                    if len(received) >= n:
                        break

    else:
        watch = saver.awatch(thread_id)

        async def consume() -> None:
            async with watch:
                async for event in watch:
                    received[event.seq] = time.time()
                    if len(received) >= n:
                        break

        def collect() -> None:
            asyncio.run(consume())

    collector = threading.Thread(target=collect, daemon=True)
    collector.start()
    return received, collector, watch


def latency_run(d: str, s: Settings, mode: str, *, bell: bool = True) -> dict[str, Any]:
    """One child commits `s.events` events; the parent follows them by `mode`."""
    path = os.path.join(d, f"events-{mode}-{'bell' if bell else 'poll'}.db")
    thread_id = "ev"
    saved_libc = doorbell._LIBC
    if not bell:
        doorbell._LIBC = None  # as on a system without inotify: Listener.open() is None
    try:
        with FencedSqliteSaver(path, busy_timeout=BUSY_TIMEOUT) as saver:
            child = spawn(
                "appender",
                path=path,
                thread_id=thread_id,
                n=s.events,
                seed=7,
                gap_lo=0.005,
                gap_hi=0.060,
            )
            expect_line(child)
            received, collector, watch = follow(saver, thread_id, s.events, mode)
            time.sleep(0.2)  # the watcher is waiting (or polling) now
            listening = watch._poller.listening
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
            commits = expect_line(child)["commits"]
            child.wait()
            collector.join(2 * saver.poll_interval + 5.0)
            watch._poller.close()  # ends a watch still waiting (never expected)
            collector.join(5.0)
            poll = saver.poll_interval
    finally:
        doorbell._LIBC = saved_libc
    latencies = [received[seq] - t for seq, t in commits if seq in received]
    return {"latencies": latencies, "sent": len(commits), "bell": listening, "poll": poll}


def bench_latency(d: str, s: Settings) -> None:
    """Measure commit-to-receipt latency of `watch()`/`awatch()` for another process's commits."""
    runs = {
        "watch": latency_run(d, s, "watch"),
        "awatch": latency_run(d, s, "awatch"),
        "fallback": latency_run(d, s, "watch", bell=False),
    }
    poll = runs["watch"]["poll"]
    table = Table(
        f"EVENT LATENCY: a child process commits {s.events} events (append_events under a "
        f"claim, gaps 5-60 ms), the parent follows with default options "
        f"(poll_interval={poll * 1e3:.0f} ms)",
        ["metric", "sync watch()", "async awatch()", "target", "result", "watch(), no bell"],
    )

    def woke(r: dict[str, Any]) -> str:
        return "doorbell" if r["bell"] else "polling"

    table.add(
        "woken by",
        woke(runs["watch"]),
        woke(runs["awatch"]),
        "doorbell",
        "PASS" if runs["watch"]["bell"] and runs["awatch"]["bell"] else "MISS",
        woke(runs["fallback"]),
    )
    table.add(
        "events delivered",
        *(f"{len(runs[m]['latencies'])}/{runs[m]['sent']}" for m in ("watch", "awatch")),
        "all",
        "PASS"
        if all(len(runs[m]["latencies"]) == runs[m]["sent"] for m in ("watch", "awatch"))
        else "MISS",
        f"{len(runs['fallback']['latencies'])}/{runs['fallback']['sent']}",
    )

    def row(label: str, stat: Any, limit: float | None) -> None:
        values = [stat(runs[m]["latencies"]) for m in ("watch", "awatch", "fallback")]
        result = "-"
        target = "info"
        if limit is not None:
            target = f"<= {fmt_time(limit)}"
            result = "PASS" if all(v <= limit for v in values[:2]) else "MISS"
        table.add(
            label, fmt_time(values[0]), fmt_time(values[1]), target, result, fmt_time(values[2])
        )

    row("p50 commit -> receipt", lambda v: percentile(v, 50), P50_TARGET)
    row("p95 commit -> receipt", lambda v: percentile(v, 95), P95_TARGET)
    row("max", max, None)
    row("min", min, None)
    row("mean", lambda v: sum(v) / len(v), None)
    table.print()
    print(
        "Latency = the parent's receipt time minus the child's commit-return time (wall clock, "
        "same host; below 0 when the watcher had the event before the writer's call returned). "
        "With the doorbell the writer rings <db>-bell after COMMIT and the watcher wakes on "
        "inotify; the last column polls every poll_interval (latency ~ U(0, poll))."
    )
    print()


def start_idle(d: str, s: Settings) -> subprocess.Popen[str]:
    """Start the idle-watcher child on a file of its own (it reports when done)."""
    path = os.path.join(d, "idle.db")
    FencedSqliteSaver(path).close()  # create the file before the child opens it
    return spawn("idle", path=path, thread_id="quiet", seconds=s.idle_seconds)


def bench_idle(child: subprocess.Popen[str]) -> None:
    """Report what one idle watcher costs: CPU seconds per second, statements per second."""
    out = expect_line(child)
    child.wait()
    poll = out["poll_interval"]
    table = Table(
        f"IDLE WATCHER: one watcher on a thread nobody writes, {out['seconds']:.1f} s each, in a "
        f"child process, default options (poll_interval={poll * 1e3:.0f} ms)",
        [
            "watcher",
            "woken by",
            "CPU per s",
            "target",
            "result",
            "statements/s",
            "expected",
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
        cpu = fmt_time(r["cpu"])
        if name == "control":
            table.add(label, "-", cpu, "-", "ref", "0.0", "-", "-")
            continue
        # One data_version read per look; a new wait (each watch slice)
        # reads the log once more (BEGIN, bounds, COMMIT).
        every = r["safety"] if r["bell"] else poll
        table.add(
            label,
            "doorbell" if r["bell"] else "polling",
            cpu,
            f"<= {fmt_time(IDLE_CPU_TARGET)}",
            verdict(r["cpu"], IDLE_CPU_TARGET),
            f"{qps:.1f}",
            f"~{1.0 / every + 4 / WAIT_SLICE:.1f} (1/{every:g} s + slices)",
            " | ".join(" ".join(sql.split())[:40] for sql in r["distinct"]),
        )
    table.print()
    print(
        "CPU per s = CPU time the child process used per wall second. With the doorbell an idle "
        "watcher sleeps on inotify and looks only for its safety poll."
    )
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
