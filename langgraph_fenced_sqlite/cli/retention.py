"""`lgfs prune`, `lgfs sweep` and `lgfs vacuum`: retention an operator can run.

Invariant: as in `main.py`, nothing here judges: which checkpoints go is
`prune`'s / `sweep`'s, which threads expire is `expire`'s, and whether a
vacuum may run is `vacuum`'s. A command that removes data first reports the
real operation's dry run, and does it only with `--yes` (or a yes at a
terminal); `lgfs sweep` applies TTLs that were set beforehand, as the
saver's own sweeper does, so it asks nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ..core.retention import TTL_STRATEGIES, Expiry, PruneResult, RetentionPolicy
from .commands import arg, command, path_only, yes
from .io import CliError, Out, confirm, count, duration, find_thread, plural
from .stores import open_store

__all__ = ["cmd_prune", "cmd_rekey", "cmd_repack", "cmd_sweep", "cmd_vacuum"]


@command(
    "prune",
    "remove old checkpoints and events of threads",
    path_only,
    arg("threads", metavar="THREAD", nargs="*", help="thread ids (or --all)"),
    arg("--all", action="store_true", help="sweep every thread, one at a time"),
    arg(
        "--inactive-for",
        type=duration,
        metavar="DURATION",
        help="with --all: only threads not written for DURATION, e.g. 30d",
    ),
    arg("--keep", type=count(0), metavar="N", help="keep the N newest checkpoints"),
    arg("--max-age", type=duration, metavar="DURATION", help="e.g. 30s, 15m, 2h, 7d"),
    arg("--max-events", type=count(0), metavar="N", help="keep the N newest events"),
    arg(
        "--keep-subgraph-runs",
        type=count(0),
        metavar="N",
        help="keep N past subgraph runs' namespaces, remove older ones",
    ),
    arg("--dry-run", action="store_true", help="only report what would be removed"),
    yes(),
)
def cmd_prune(args: argparse.Namespace, out: Out) -> int:
    """`prune THREAD...` by a policy, or `prune --all`: a sweep (`--yes` needed)."""
    given = (args.keep, args.max_age, args.max_events, args.keep_subgraph_runs)
    if args.all == bool(args.threads):
        raise CliError("usage", "prune: name THREADs, or pass --all (not both)")
    if args.inactive_for is not None and not args.all:
        raise CliError("usage", "prune: --inactive-for selects threads for --all only")
    if args.all and all(g is None for g in given):
        # A sweep with no option keeps what each thread needs to go on.
        policy = RetentionPolicy(max_checkpoints=0, max_subgraph_runs=0)
    elif all(g is None for g in given):
        raise CliError(
            "usage", "prune: give --keep, --max-age, --max-events or --keep-subgraph-runs"
        )
    else:
        policy = RetentionPolicy(*given)
    if args.all:
        return _sweep(args, out, policy)
    with open_store(args.path) as saver:
        for thread_id in args.threads:
            find_thread(saver, thread_id)
        results = saver.prune(args.threads, strategy=policy, dry_run=True)
        if not args.dry_run and any(_removes(r) for r in results):
            confirm(args, f"prune would remove {_what(results, ' and ')}")
            results = saver.prune(args.threads, strategy=policy)
    verb = "would remove" if args.dry_run else "removed"
    docs = [{**dataclasses.asdict(r), "dry_run": args.dry_run} for r in results]
    out.document(
        docs,
        lambda: "\n".join(f"{r.thread_id}: {verb} {_what([r])} (floor {r.floor})" for r in results),
    )
    return 0


def _removes(result: PruneResult) -> bool:
    # Orphan writes alone are worth a prune: `doctor` counts them for it to remove.
    return bool(result.checkpoints or result.events_removed or result.writes_removed)


def _what(results: Sequence[PruneResult], last: str = ", ") -> str:
    # "2 checkpoints, 3 events", and orphan writes only when there are some.
    n_wr = sum(r.writes_removed for r in results)
    parts = [
        plural(sum(len(r.checkpoints) for r in results), "checkpoint"),
        plural(sum(r.events_removed for r in results), "event"),
        *([plural(n_wr, "write")] if n_wr else []),
    ]
    return ", ".join(parts[:-1]) + last + parts[-1]


def _sweep(args: argparse.Namespace, out: Out, policy: RetentionPolicy) -> int:
    """`prune --all`: dry-run the sweep, ask, sweep thread by thread, report."""
    with open_store(args.path) as saver:
        plan = saver.sweep(policy, inactive_for=args.inactive_for, dry_run=True)
        done = plan
        touched = [r for r in plan.pruned if _removes(r)]
        if not args.dry_run and touched:
            where = plural(len(touched), "thread")
            confirm(args, f"prune --all would remove {_what(touched, ' and ')} from {where}")
            done = saver.sweep(policy, inactive_for=args.inactive_for)
    verb = "would remove" if args.dry_run else "removed"
    doc = {**dataclasses.asdict(done), "dry_run": args.dry_run}

    def text() -> str:
        lines = [
            f"{r.thread_id}: {verb} {_what([r])} (floor {r.floor})"
            for r in done.pruned
            if _removes(r)
        ]
        lines.append(
            ("" if lines else "nothing to remove; ")
            + f"swept {plural(len(done.pruned), 'thread')}"
            + (f"; left alone under a live claim: {', '.join(done.busy)}" if done.busy else "")
        )
        lines += [f"skipped (does not decode): {e['message']}" for e in done.errors]
        return "\n".join(lines)

    out.document(doc, text)
    return 1 if done.errors else 0


@command(
    "sweep",
    "expire threads idle past their TTL, once or --every DURATION",
    path_only,
    arg(
        "--default-ttl",
        type=duration,
        metavar="DURATION",
        help="the TTL of threads without their own, e.g. 30d (default: only those)",
    ),
    arg(
        "--strategy",
        choices=TTL_STRATEGIES,
        default="delete",
        help="what the default TTL does (default: delete)",
    ),
    arg("--every", type=duration, metavar="DURATION", help="sweep again every DURATION, e.g. 10m"),
    arg("--passes", type=count(1), metavar="N", help="with --every: stop after N passes"),
    streams=True,
)
def cmd_sweep(args: argparse.Namespace, out: Out) -> int:
    """`sweep`: expire due threads (one pass, or one every `--every` until interrupted)."""
    if args.passes is not None and args.every is None:
        raise CliError("usage", "sweep: --passes counts the passes of --every")
    expiry = Expiry(default_ttl=args.default_ttl, strategy=args.strategy)
    with open_store(args.path) as saver:
        if args.every is not None:
            signal.signal(signal.SIGTERM, _interrupt)
        try:
            out.stream(_passes(saver, expiry, args.every, args.passes), _pass_line)
        except KeyboardInterrupt:
            pass  # the normal way to stop a sweeper
    return 0


def _passes(
    saver: Any, expiry: Expiry, every: float | None, passes: int | None
) -> Iterator[dict[str, Any]]:
    """Yield each pass's report (`expire`), waiting `every` seconds between them."""
    done = 0
    while True:
        started = time.monotonic()
        report = saver.expire(expiry)
        done += 1
        yield {
            "pass": done,
            "expired": [dataclasses.asdict(e) for e in report.expired],
            "busy": report.busy,
            "errors": report.errors,
            "scheduled": report.scheduled,
        }
        if every is None or (passes is not None and done >= passes):
            return
        time.sleep(max(0.0, every - (time.monotonic() - started)))


def _pass_line(doc: dict[str, Any]) -> str:
    gone = [f"{e['thread_id']} ({e['strategy']})" for e in doc["expired"]]
    line = f"pass {doc['pass']}: expired {plural(len(gone), 'thread')}"
    line += f": {', '.join(gone)}" if gone else ""
    if doc["busy"]:
        line += f"; left alone under a live claim: {', '.join(doc['busy'])}"
    return line + "".join(f"\nskipped (does not decode): {e['message']}" for e in doc["errors"])


def _left_alone(skipped: list[dict[str, Any]]) -> list[str]:
    """The lines of what a repack or rekey left as it was: a checkpoint, or a whole thread."""
    return [
        f"left as it is: {s['thread_id']}"
        + ("" if s["checkpoint_id"] is None else f"/{s['checkpoint_id']}")
        + f": {s['reason']}"
        for s in skipped
    ]


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@command(
    "repack",
    "move inline values of older checkpoints into the value table",
    path_only,
    arg("--dry-run", action="store_true", help="report what would be rewritten; write nothing"),
)
def cmd_repack(args: argparse.Namespace, out: Out) -> int:
    """`repack`: rewrite checkpoints stored before schema 5 so they share values."""
    with open_store(args.path) as saver:
        report = saver.repack(dry_run=args.dry_run)
    verb = "would move" if args.dry_run else "moved"

    def text() -> str:
        lines = [
            f"{verb} the values of {plural(report.checkpoints, 'checkpoint')} in "
            f"{plural(len(report.threads), 'thread')}: {report.inline_bytes} inline bytes "
            f"-> {report.stored_bytes} stored"
            + ("" if args.dry_run or not report.checkpoints else " (run vacuum to shrink the file)")
        ]
        return "\n".join(lines + _left_alone(report.skipped))

    out.document(dataclasses.asdict(report), text)
    return 1 if report.skipped else 0


@command(
    "rekey",
    "seal every stored value under the current key (see --key-file)",
    path_only,
    arg("--dry-run", action="store_true", help="report what would be resealed; write nothing"),
)
def cmd_rekey(args: argparse.Namespace, out: Out) -> int:
    """`rekey`: move every value cell under an older key (or in clear) to the current key."""
    with open_store(args.path) as saver:
        report = saver.rekey(dry_run=args.dry_run)
    verb = "would reseal" if args.dry_run else "resealed"

    def text() -> str:
        moved = ", ".join(f"{n} {k}" for k, n in sorted(report.cells.items())) or "none"
        lines = [
            f"{verb} {plural(sum(report.cells.values()), 'cell')} in "
            f"{plural(len(report.threads), 'thread')} under key {report.key_id} (were: {moved})"
        ]
        return "\n".join(lines + _left_alone(report.skipped))

    out.document(dataclasses.asdict(report), text)
    return 1 if report.skipped else 0


@command(
    "vacuum",
    "reclaim free space (refused while a writer is active)",
    path_only,
    arg("--force", action="store_true", help="vacuum despite live claims or a held write lock"),
)
def cmd_vacuum(args: argparse.Namespace, out: Out) -> int:
    """`vacuum`: reclaim free space; refused while a writer is active unless `--force`."""
    with open_store(args.path) as saver:
        report = saver.vacuum(force=args.force)
    freed = report.bytes_before - report.bytes_after
    out.document(
        {**dataclasses.asdict(report), "bytes_reclaimed": freed},
        lambda: (
            f"vacuumed {report.path}: {report.bytes_before} -> {report.bytes_after} bytes "
            f"({freed} reclaimed)"
        ),
    )
    return 0
