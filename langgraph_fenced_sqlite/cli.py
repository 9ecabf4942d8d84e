"""The operator's command line: `lgfs ...` or `python -m langgraph_fenced_sqlite ...`.

Invariant: a thin shell over the public API with no SQL of its own. Commands
open only files that exist (import's destination excepted), always close
them, print results through one emitter (`Out`) and failures through one
converter (`_fail`) that picks the documented exit code; no command removes
data without `--yes` (or a yes at a terminal prompt).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import __version__, importer
from .cli_allow import add_allow_options, allow_from_args, cli_serde
from .cli_doctor import cmd_doctor
from .cli_io import (
    EXIT_CODES,
    CliError,
    Out,
    Parser,
    ProgressBar,
    claim_doc,
    claim_text,
    compact,
    confirm,
    count,
    duration,
    fail,
    is_number,
    open_existing,
    plural,
    when,
)
from .errors import CheckpointNotFound
from .retention import RetentionPolicy
from .saver import FencedSqliteSaver

__all__ = ["EXIT_CODES", "build_parser", "main"]

_CLAIM_TTL = 60.0  # retract/delete hold their claim this long at most


# --- opening --------------------------------------------------------------------------------


def _open(path: str) -> FencedSqliteSaver:
    # Every command reads with the allow-list the command line gave.
    return open_existing(path, serde=cli_serde())


def _thread(saver: FencedSqliteSaver, thread_id: str) -> dict[str, Any]:
    for summary in saver.threads():
        if summary["thread_id"] == thread_id:
            return summary
    raise CliError(
        "thread_not_found", f"thread {thread_id!r} not found in {saver.path}", thread_id=thread_id
    )


def _holder() -> str:
    return f"lgfs:{socket.gethostname()}:{os.getpid()}"


# --- commands -------------------------------------------------------------------------------


def _cmd_threads(args: argparse.Namespace, out: Out) -> int:
    path = args.path or os.environ.get("LGFS_PATH")
    if not path:
        raise CliError("usage", "threads: give PATH or set LGFS_PATH")
    with _open(path) as saver:
        rows, now = saver.threads(), saver.clock.now()
    items = []
    for r in rows[: args.limit]:
        claim = None if r["claim"] is None else claim_doc(r["claim"], now)
        items.append({**r, "claim": claim})
    out.rows(
        items,
        [
            ("THREAD", lambda i: i["thread_id"]),
            ("CHECKPOINTS", lambda i: i["checkpoints"]),
            ("NAMESPACES", lambda i: len(i["namespaces"])),
            ("STEP", lambda i: "-" if i["latest_step"] is None else i["latest_step"]),
            ("LAST ACTIVITY", lambda i: when(i["last_activity"] or None)),
            ("EVENTS", lambda i: i["events"]),
            ("FLOOR", lambda i: i["floor"]),
            ("CLAIM", lambda i: claim_text(i["claim"])),
        ],
    )
    damaged = any(i["error"] or (i["claim"] or {}).get("error") for i in items)
    return 1 if damaged else 0


def _cmd_history(args: argparse.Namespace, out: Out) -> int:
    with _open(args.path) as saver:
        _thread(saver, args.thread)
        records = saver.history_records(
            args.thread, checkpoint_ns=args.ns, before=args.before, limit=args.limit
        )
    out.rows(
        records,
        [
            ("POS", lambda r: r["position"]),
            ("CHECKPOINT", lambda r: r["checkpoint_id"]),
            ("STEP", lambda r: r.get("step", "?")),
            ("SOURCE", lambda r: r.get("source") or "-"),
            ("RUN", lambda r: r.get("run_id") or "-"),
            ("TOKEN", lambda r: "-" if r["token"] is None else r["token"]),
            ("PARENT", lambda r: r["parent_checkpoint_id"] or "-"),
            ("TIME", lambda r: when(r["created_at"])),
        ],
    )
    if out.mode == "text" and len(records) == args.limit:
        print(f"(older: --before {records[-1]['checkpoint_id']})")
    return 0


def _inspect(saver: FencedSqliteSaver, args: argparse.Namespace, cid: str | None) -> dict:
    found = saver.inspect_checkpoint(args.thread, checkpoint_ns=args.ns, checkpoint_id=cid)
    if found is None:
        if cid is not None:
            raise CheckpointNotFound(args.thread, cid)
        raise CliError("checkpoint_not_found", f"thread {args.thread!r} has no checkpoint")
    return found


def _err_text(err: dict[str, Any]) -> str:
    return f"ERROR ({err['code']}): {err['message']}"


def _cmd_show(args: argparse.Namespace, out: Out) -> int:
    with _open(args.path) as saver:
        _thread(saver, args.thread)
        found = _inspect(saver, args, args.checkpoint)
    md, checkpoint = found["metadata"] or {}, found.pop("checkpoint")
    writes, error = found.pop("writes"), found.pop("error")
    doc = {**found, "step": md.get("step"), "source": md.get("source"), "run_id": md.get("run_id")}
    doc["values"] = None if checkpoint is None else checkpoint["channel_values"]
    doc.update(metadata=found["metadata"], writes=writes, error=error)
    bad = bool(error) or any(w["error"] for w in writes)

    def text() -> str:
        token = "unfenced" if doc["token"] is None else f"token {doc['token']}"
        lines = [
            f"thread      {doc['thread_id']}" + (f"  namespace {args.ns!r}" if args.ns else ""),
            f"checkpoint  {doc['checkpoint_id']}  (position {doc['position']}, "
            f"step {doc['step']}, {doc['source']})",
            f"parent      {doc['parent_checkpoint_id'] or '-'}",
            f"written     {when(doc['created_at'])}, {token}",
            "values:" if doc["error"] is None else "values: " + _err_text(doc["error"]),
        ]
        lines += [f"  {k}: {compact(v)}" for k, v in (doc["values"] or {}).items()]
        lines.append("metadata:    " + compact(md))
        lines.append(f"pending writes ({len(doc['writes'])}):")
        for w in doc["writes"]:
            value = _err_text(w["error"]) if w["error"] else compact(w["value"])
            lines.append(f"  {w['task_id']} [{w['idx']}] {w['channel']}: {value}")
        return "\n".join(lines)

    out.document(doc, text)
    return 1 if bad else 0


def _cmd_diff(args: argparse.Namespace, out: Out) -> int:
    with _open(args.path) as saver:
        _thread(saver, args.thread)
        new = _inspect(saver, args, args.to)
        from_id = args.from_ or new["parent_checkpoint_id"]
        old = _inspect(saver, args, from_id) if from_id else None
    errors = [x["error"] for x in (old, new) if x is not None and x["error"]]
    before = (old or {}).get("checkpoint") or {"channel_values": {}}
    after = new["checkpoint"] or {"channel_values": {}}
    a, b = before["channel_values"], after["channel_values"]
    changes = []
    for channel in sorted(set(a) | set(b)):
        if channel not in b:
            changes.append({"channel": channel, "change": "removed", "before": a[channel]})
        elif channel not in a:
            changes.append({"channel": channel, "change": "added", "after": b[channel]})
        elif a[channel] != b[channel]:
            changes.append(
                {"channel": channel, "change": "changed", "before": a[channel], "after": b[channel]}
            )
    doc = {
        "thread_id": args.thread,
        "checkpoint_ns": args.ns,
        "from": from_id,
        "to": new["checkpoint_id"],
        "changes": changes,
        "errors": errors,
    }

    def text() -> str:
        lines = [f"diff {from_id or '(empty)'} -> {new['checkpoint_id']}"]
        lines += [_err_text(e) for e in errors]
        for c in changes:
            mark = {"added": "+", "removed": "-", "changed": "~"}[c["change"]]
            parts = [compact(c[k]) for k in ("before", "after") if k in c]
            lines.append(f"{mark} {c['channel']}: {' -> '.join(parts)}")
        return "\n".join(lines if changes or errors else lines + ["(no changes)"])

    out.document(doc, text)
    return 1 if errors else 0


def _cmd_claims(args: argparse.Namespace, out: Out) -> int:
    with _open(args.path) as saver:
        claims, now = saver.claims(), saver.clock.now()
    items = [{"thread_id": c.thread_id, **claim_doc(c, now)} for c in claims]
    out.rows(
        items,
        [
            ("THREAD", lambda i: i["thread_id"]),
            ("HOLDER", lambda i: i["holder"]),
            ("TOKEN", lambda i: i["token"]),
            ("STATE", lambda i: "live" if i["live"] else "expired"),
            ("EXPIRES", lambda i: when(i["expires_at"])),
            ("", lambda i: claim_text(i).split(", ")[-1]),
        ],
    )
    return 1 if any(i.get("error") for i in items) else 0


def _event_text(e: Any) -> str:
    where = f" {e.checkpoint_id}" if e.checkpoint_id else ""
    where += f" ns={e.checkpoint_ns}" if e.checkpoint_ns else ""
    token = "" if e.token is None else f" token={e.token}"
    return f"{e.seq:>6}  {when(e.ts)}  {e.kind}{where}{token}  {compact(e.data)}"


def _cmd_events(args: argparse.Namespace, out: Out) -> int:
    if args.follow and out.mode == "json":
        raise CliError("usage", "events --follow streams: use --nl instead of --json")
    with _open(args.path) as saver:
        floor = _thread(saver, args.thread)["floor"]
        if args.after is not None:
            after = args.after
        else:  # a damaged floor cell: read from the start and let the store judge it
            after = floor - 1 if is_number(floor) else 0
        if not args.follow:
            found: list[Any] = []
            while args.limit is None or len(found) < args.limit:
                page = saver.events_after(args.thread, after, limit=100)
                found += page
                if len(page) < 100:
                    break
                after = page[-1].seq
            out.stream(found[: args.limit], _event_text)
            return 0
        signal.signal(signal.SIGTERM, _interrupt)
        with saver.watch(args.thread, after) as watch:
            try:
                out.stream(watch, _event_text)
            except KeyboardInterrupt:
                return 0  # the normal way to stop following
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _cmd_prune(args: argparse.Namespace, out: Out) -> int:
    if args.keep is None and args.max_age is None and args.max_events is None:
        raise CliError("usage", "prune: give --keep, --max-age or --max-events")
    policy = RetentionPolicy(args.keep, args.max_age, args.max_events)
    with _open(args.path) as saver:
        for thread_id in args.threads:
            _thread(saver, thread_id)
        results = saver.prune(args.threads, strategy=policy, dry_run=True)
        n_cp = sum(len(r.checkpoints) for r in results)
        n_ev = sum(r.events_removed for r in results)
        if not args.dry_run and (n_cp or n_ev):
            what = f"{plural(n_cp, 'checkpoint')} and {plural(n_ev, 'event')}"
            confirm(args, f"prune would remove {what}")
            results = saver.prune(args.threads, strategy=policy)
    verb = "would remove" if args.dry_run else "removed"
    docs = [{**dataclasses.asdict(r), "dry_run": args.dry_run} for r in results]
    out.document(
        docs,
        lambda: "\n".join(
            f"{r.thread_id}: {verb} {plural(len(r.checkpoints), 'checkpoint')}, "
            f"{plural(r.events_removed, 'event')} (floor {r.floor})"
            for r in results
        ),
    )
    return 0


def _cmd_compact(args: argparse.Namespace, out: Out) -> int:
    with _open(args.path) as saver:
        summary = _thread(saver, args.thread)
        floor = summary["floor"]
        n = max(0, min(args.before, summary["next_seq"]) - floor)
        if n:
            confirm(args, f"compact would remove {plural(n, 'event')} of thread {args.thread!r}")
            floor = saver.compact_events(args.thread, args.before)
    doc = {"thread_id": args.thread, "floor": floor, "events_removed": n}
    out.document(doc, lambda: f"{args.thread}: removed {plural(n, 'event')} (floor {floor})")
    return 0


def _cmd_retract(args: argparse.Namespace, out: Out) -> int:
    with _open(args.path) as saver:
        _thread(saver, args.thread)
        which = f"run {args.run_id!r}" if args.run_id else "the latest turn"
        confirm(args, f"retract would remove {which} of thread {args.thread!r}")
        claim = saver.claim(args.thread, _holder(), _CLAIM_TTL)
        try:
            done = saver.retract_turn(args.thread, claim.token, run_id=args.run_id)
        finally:
            saver.release(args.thread, claim.token)
    if done.seq is None:
        out.document(done, lambda: f"{args.thread}: nothing to retract")
    else:
        out.document(
            done,
            lambda: (
                f"{args.thread}: retracted run {done.run_id or '(no run id)'}: "
                f"{plural(len(done.checkpoints), 'checkpoint')}, "
                f"{plural(done.writes, 'write')} (event {done.seq})"
            ),
        )
    return 0


def _cmd_delete(args: argparse.Namespace, out: Out) -> int:
    with _open(args.path) as saver:
        summary = _thread(saver, args.thread)
        n_cp = plural(summary["checkpoints"], "checkpoint")
        n_ev = plural(summary["events"], "event")
        confirm(args, f"delete would remove thread {args.thread!r} ({n_cp}, {n_ev})")
        # Claim and delete in one transaction: refuses a thread with a live run.
        saver.delete_unclaimed_thread(args.thread, _holder(), _CLAIM_TTL)
    doc = {"thread_id": args.thread, "deleted": True, "checkpoints": summary["checkpoints"]}
    out.document(doc, lambda: f"deleted thread {args.thread} ({n_cp}, {n_ev})")
    return 0


def _cmd_runs(args: argparse.Namespace, out: Out) -> int:
    path = args.path or os.environ.get("LGFS_PATH")
    if not path:
        raise CliError("usage", "runs cancel: give PATH or set LGFS_PATH")
    with _open(path) as saver:
        _thread(saver, args.thread)
        claim = saver.cancel_run(args.thread, by=args.by or _holder())
    doc = {"thread_id": args.thread, "cancel_requested": claim is not None}
    if claim is not None:
        doc.update(holder=claim.holder, token=claim.token)
    out.document(
        doc,
        lambda: (
            f"{args.thread}: no run holds the thread; nothing to cancel"
            if claim is None
            else f"{args.thread}: asked the run of {claim.holder} (token {claim.token}) "
            "to stop; it stops within one renewal of its claim"
        ),
    )
    return 0


def _cmd_import(args: argparse.Namespace, out: Out) -> int:
    importer.check_source(args.src)  # before DEST is created
    bar = ProgressBar(sys.stderr) if args.progress or sys.stderr.isatty() else None
    with FencedSqliteSaver(args.dest, serde=cli_serde(unknown="refuse")) as saver:
        try:
            report = importer.import_sqlitesaver(args.src, saver, progress=bar)
        finally:
            if bar is not None:
                bar.finish()
    out.document(
        report.to_dict(),
        lambda: "\n".join(
            [
                f"imported {plural(report.threads, 'thread')}, "
                f"{plural(report.checkpoints, 'checkpoint')} and {plural(report.writes, 'write')} "
                f"from {report.source} into {report.dest}"
            ]
            + [
                f"skipped thread {s['thread_id']!r} (nothing of it imported): checkpoint "
                f"{s['checkpoint_id']}: {s['reason']}"
                for s in report.skipped
            ]
        ),
    )
    return 1 if report.skipped else 0


# --- the parser -----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Build the `lgfs` argument parser (its subcommands are the documented commands)."""
    epilog = "exit codes:\n" + "\n".join(f"  {code:>3}  {text}" for code, text in EXIT_CODES)
    parser = Parser(
        prog="lgfs",
        description="Inspect and maintain a langgraph-fenced-sqlite checkpoint file.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"lgfs {__version__}")
    doc = Parser(add_help=False)
    doc.add_argument("--json", action="store_true", help="print one JSON document")
    stream = Parser(add_help=False)
    group = stream.add_mutually_exclusive_group()
    group.add_argument("--json", action="store_true", help="print one JSON document")
    group.add_argument("--nl", action="store_true", help="print one JSON object per line")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    allow = add_allow_options(Parser(add_help=False))

    def command(name: str, fn: Callable, help: str, streams: bool = False) -> Parser:
        parents = [stream if streams else doc, allow]
        p = sub.add_parser(name, parents=parents, help=help, description=help)
        p.set_defaults(func=fn)
        return p

    def path_thread(p: argparse.ArgumentParser, ns: bool = True) -> None:
        p.add_argument("path", metavar="PATH", help="the checkpoint file")
        p.add_argument("thread", metavar="THREAD", help="the thread id")
        if ns:
            p.add_argument("--ns", default="", help='checkpoint namespace (default "", the root)')

    def yes(p: argparse.ArgumentParser) -> None:
        p.add_argument("-y", "--yes", action="store_true", help="remove data without asking")

    p = command("threads", _cmd_threads, "list threads, most recently active first", True)
    p.add_argument("path", metavar="PATH", nargs="?", help="the file (default: $LGFS_PATH)")
    p.add_argument("--limit", type=count(1), help="at most N threads")
    p = command("history", _cmd_history, "list a thread's checkpoints, newest first", True)
    path_thread(p)
    p.add_argument("--limit", type=count(1), default=20, help="page size (default 20)")
    p.add_argument("--before", metavar="ID", help="start below this checkpoint id")
    p = command("show", _cmd_show, "show a checkpoint's values, metadata and pending writes")
    path_thread(p)
    p.add_argument("--checkpoint", metavar="ID", help="checkpoint id (default: the latest)")
    p = command("diff", _cmd_diff, "show channel-level differences between two checkpoints")
    path_thread(p)
    p.add_argument("--from", dest="from_", metavar="ID", help="default: the parent of --to")
    p.add_argument("--to", metavar="ID", help="default: the latest checkpoint")
    p = command("claims", _cmd_claims, "list live and expired claims", True)
    p.add_argument("path", metavar="PATH", help="the checkpoint file")
    p = command("events", _cmd_events, "print a thread's event log", True)
    path_thread(p, ns=False)
    p.add_argument("--after", type=count(0), metavar="N", help="only events after seq N")
    p.add_argument("--limit", type=count(1), help="at most N events (without --follow)")
    p.add_argument("--follow", action="store_true", help="keep printing new events until Ctrl-C")
    p = command("prune", _cmd_prune, "remove old checkpoints and events of threads")
    p.add_argument("path", metavar="PATH", help="the checkpoint file")
    p.add_argument("threads", metavar="THREAD", nargs="+", help="thread ids")
    p.add_argument("--keep", type=count(0), metavar="N", help="keep the N newest checkpoints")
    p.add_argument("--max-age", type=duration, metavar="DURATION", help="e.g. 30s, 15m, 2h, 7d")
    p.add_argument("--max-events", type=count(0), metavar="N", help="keep the N newest events")
    p.add_argument("--dry-run", action="store_true", help="only report what would be removed")
    yes(p)
    p = command("compact", _cmd_compact, "remove a thread's events below seq SEQ")
    path_thread(p, ns=False)
    p.add_argument("--before", type=count(1), metavar="SEQ", required=True, help="new floor")
    yes(p)
    p = command("retract", _cmd_retract, "remove a thread's latest turn (or run --run-id)")
    path_thread(p, ns=False)
    p.add_argument("--run-id", metavar="ID", help="the run to remove (default: the latest)")
    yes(p)
    p = command("delete", _cmd_delete, "delete a thread (refused while a run holds it)")
    path_thread(p, ns=False)
    yes(p)
    p = command("runs", _cmd_runs, "steer a thread's run: `runs cancel` asks it to stop")
    p.add_argument("action", choices=["cancel"], help="cancel: ask the run to stop")
    p.add_argument("path", metavar="PATH", nargs="?", help="the file (default: $LGFS_PATH)")
    p.add_argument("thread", metavar="THREAD", help="the thread id")
    p.add_argument(
        "--by", metavar="NAME", help="who asks, for the event log (default: lgfs:HOST:PID)"
    )
    p = command("doctor", cmd_doctor, "check the file; exit 1 on a problem")
    p.add_argument("path", metavar="PATH", help="the checkpoint file")
    p = command("import-sqlitesaver", _cmd_import, "copy a LangGraph SqliteSaver file into DEST")
    p.add_argument("src", metavar="SRC", help="the SqliteSaver file (read-only)")
    p.add_argument("dest", metavar="DEST", help="the fenced file (created if missing)")
    p.add_argument("--progress", action="store_true", help="draw the progress bar even off a TTY")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run `lgfs` with `argv` (default: the process's arguments).

    Returns:
        The exit code (see `EXIT_CODES`).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv or "--nl" in argv
    try:
        args = build_parser().parse_args(argv)
        allow_from_args(args)
        return args.func(args, Out(args))
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    except KeyboardInterrupt:
        print("lgfs: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`lgfs events ... | head`): stop quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # noqa: BLE001 - the one converter; never a traceback
        return fail(exc, as_json)
