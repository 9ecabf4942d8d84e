"""The operator's command line: `lgfs ...` or `python -m langgraph_fenced_sqlite ...`.

Invariant: a thin shell over the public API with no SQL of its own. Commands
open only stores that exist, a file (import's destination excepted) or a
PostgreSQL database never set up by them (`stores.open_store`), always close
them, print results through one emitter (`Out`) and failures through one
converter (`_fail`) that picks the documented exit code; no command removes
data without `--yes` (or a yes at a terminal prompt). Each command's
arguments stand on it (`commands.command`); `build_parser` only assembles them.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .. import __version__
from ..core import status as st
from ..core.thread_search import ORDERS, SORT_BY
from ..errors import CheckpointNotFound
from ..sqlite.saver import FencedSqliteSaver
from ..tools import importer
from . import copy, doctor, ops, retention  # noqa: F401 (they register their commands)
from .allow import add_allow_options, allow_from_args, cli_serde
from .commands import (
    ORDER,
    REGISTRY,
    arg,
    command,
    path_only,
    path_thread,
    path_thread_ns,
    view,
    view_channels,
    yes,
)
from .io import (
    EXIT_CODES,
    CliError,
    Out,
    Parser,
    ProgressBar,
    claim_doc,
    confirm,
    count,
    duration,
    fail,
    find_thread,
    is_number,
    metadata_pair,
    plural,
)
from .ops import add_db_option, parse_claims_words, resolve_file
from .render import claim_cell, diff_text, event_line, show_text, status_cell
from .stores import check_store, is_pg_url, migrate, open_store, redacted
from .text import Fit, stamp

__all__ = ["EXIT_CODES", "build_parser", "main"]

_CLAIM_TTL = 60.0  # retract/delete hold their claim this long at most
# STATUS gives way last, and not below what says who runs a thread
# (`running (worker-2, expires in`): the claim's column repeats the rest.
# At 80 columns that leaves 16 cells for a thread id: a uuid's both ends.
_STATUS = Fit(squeeze=30)


# --- opening --------------------------------------------------------------------------------


def _open(path: str) -> FencedSqliteSaver:
    # Every command reads with the allow-list the command line gave, from a
    # file or a PostgreSQL URL (`stores.open_store`: the same calls on either).
    # An older store is refused as `_read` refuses it: only `lgfs migrate` migrates.
    store: FencedSqliteSaver = open_store(path)
    return store


def _read(path: str) -> FencedSqliteSaver:
    # A command that only reads writes nothing: an older store is refused
    # (`SchemaTooOld`, whose message says to run `lgfs migrate`), never migrated.
    store: FencedSqliteSaver = open_store(path, readonly=True)
    return store


# The one summary lookup (a missing thread is `thread_not_found`).
_thread = find_thread


def _holder() -> str:
    return f"lgfs:{socket.gethostname()}:{os.getpid()}"


# --- commands -------------------------------------------------------------------------------


def _ns(saver: FencedSqliteSaver, args: argparse.Namespace) -> None:
    # `--ns agent` for `agent:<uuid>`; none or several: the error lists them.
    args.ns = saver.resolve_namespace(args.thread, args.ns)


@command(
    "threads",
    "list or count threads: most recently active first, or as --sort says",
    path_only,
    arg(
        "--metadata",
        action="append",
        type=metadata_pair,
        metavar="KEY=VALUE",
        help="only threads whose latest checkpoint's metadata has KEY equal to the string "
        "VALUE (KEY:=JSON for a JSON value: a number, true, null...); repeatable, all must match",
    ),
    arg(
        "--status",
        action="append",
        choices=st.THREAD_STATES,
        metavar="STATE",
        help=f"only threads in STATE (repeatable): {', '.join(st.THREAD_STATES)}",
    ),
    arg(
        "--inactive-for",
        type=duration,
        metavar="DURATION",
        help="only threads not written for DURATION, e.g. 7d",
    ),
    arg(
        "--sort",
        choices=SORT_BY,
        default="updated_at",
        help="order by last activity (updated_at, the default) or thread id",
    ),
    arg("--order", choices=ORDERS, default="desc", help="desc (the default) or asc"),
    arg("--limit", type=count(1), help="at most N threads"),
    arg("--offset", type=count(0), default=0, help="skip the first N matching threads"),
    arg("--count", action="store_true", help="print how many threads match, not the threads"),
    view,
    streams=True,
)
def _cmd_threads(args: argparse.Namespace, out: Out) -> int:
    filters: dict[str, Any] = {
        "metadata": dict(args.metadata or []),
        "status": args.status,
        "inactive_for": args.inactive_for,
    }
    with _read(args.path) as saver:
        if args.count:
            found = saver.count_threads(**filters)
            out.document({"count": found}, lambda: plural(found, "thread"))
            return 0
        rows = saver.search_threads(
            **filters, sort_by=args.sort, order=args.order, limit=args.limit, offset=args.offset
        )
        now = saver.clock.now()
    items = []
    for r in rows:
        claim = None if r["claim"] is None else claim_doc(r["claim"], now)
        items.append({**r, "claim": claim})
    out.rows(
        items,
        [
            ("THREAD", lambda i: i["thread_id"], Fit(squeeze=16, middle=True)),
            ("STATUS", lambda i: status_cell(st.ThreadStatus.from_dict(i["status"])), _STATUS),
            ("CHECKPOINTS", lambda i: i["checkpoints"], Fit(drop=1)),
            ("NAMESPACES", lambda i: len(i["namespaces"]), Fit(drop=3)),
            ("STEP", lambda i: "-" if i["latest_step"] is None else i["latest_step"]),
            (
                "LAST ACTIVITY",
                lambda i: stamp(i["last_activity"] or None, now),
                Fit(short_header="ACTIVE"),
            ),
            ("EVENTS", lambda i: i["events"], Fit(drop=2)),
            ("FLOOR", lambda i: i["floor"], Fit(drop=4)),
            ("CLAIM", lambda i: claim_cell(i["claim"]), Fit(squeeze=16)),
        ],
    )
    damaged = any(i["error"] or (i["claim"] or {}).get("error") for i in items)
    return 1 if damaged else 0


@command(
    "history",
    "list a thread's checkpoints, newest first",
    path_thread_ns,
    arg("--limit", type=count(1), default=20, help="page size (default 20)"),
    arg("--before", metavar="ID", help="start below this checkpoint id"),
    view,
    streams=True,
)
def _cmd_history(args: argparse.Namespace, out: Out) -> int:
    with _read(args.path) as saver:
        _thread(saver, args.thread)
        _ns(saver, args)
        records = saver.history_records(
            args.thread, checkpoint_ns=args.ns, before=args.before, limit=args.limit
        )
        now = saver.clock.now()
    out.rows(
        records,
        [
            ("POS", lambda r: r["position"]),
            ("CHECKPOINT", lambda r: r["checkpoint_id"], Fit(squeeze=20, middle=True)),
            ("STEP", lambda r: r.get("step", "?")),
            ("SOURCE", lambda r: r.get("source") or "-", Fit(min=6)),
            ("RUN", lambda r: r.get("run_id") or "-", Fit(min=8)),
            ("TOKEN", lambda r: "-" if r["token"] is None else r["token"], Fit(drop=2)),
            ("PARENT", lambda r: r["parent_checkpoint_id"] or "-", Fit(drop=1, middle=True)),
            ("TIME", lambda r: stamp(r["created_at"], now), Fit(short_header="AGE")),
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


@command(
    "show",
    "show a checkpoint's values, metadata and pending writes",
    path_thread_ns,
    arg("--checkpoint", metavar="ID", help="checkpoint id (default: the latest)"),
    view_channels,
)
def _cmd_show(args: argparse.Namespace, out: Out) -> int:
    with _read(args.path) as saver:
        _thread(saver, args.thread)
        _ns(saver, args)
        found = _inspect(saver, args, args.checkpoint)
        latest = args.checkpoint is None and args.ns == ""
        status = saver.thread_status(args.thread) if latest and out.mode == "text" else None
    md, checkpoint = found["metadata"] or {}, found.pop("checkpoint")
    writes, error = found.pop("writes"), found.pop("error")
    doc = {**found, "step": md.get("step"), "source": md.get("source"), "run_id": md.get("run_id")}
    doc["values"] = None if checkpoint is None else checkpoint["channel_values"]
    doc.update(metadata=found["metadata"], writes=writes, error=error)
    bad = bool(error) or any(w["error"] for w in writes)

    def text() -> str:
        waiting = st.pending_interrupts(writes, doc["values"])
        failures = st.failed_tasks(writes, doc["values"])
        return show_text(doc, out.view, waiting=waiting, failures=failures, status=status)

    out.document(doc, text)
    return 1 if bad else 0


@command(
    "diff",
    "show channel-level differences between two checkpoints",
    path_thread_ns,
    arg("--from", dest="from_", metavar="ID", help="default: the parent of --to"),
    arg("--to", metavar="ID", help="default: the latest checkpoint"),
    view_channels,
)
def _cmd_diff(args: argparse.Namespace, out: Out) -> int:
    with _read(args.path) as saver:
        _thread(saver, args.thread)
        _ns(saver, args)
        diff = saver.diff_checkpoints(
            args.thread, checkpoint_ns=args.ns, from_id=args.from_, to_id=args.to
        )
    if diff is None:
        raise CliError("checkpoint_not_found", f"thread {args.thread!r} has no checkpoint")
    out.document(diff.to_dict(), lambda: diff_text(diff, out.view))
    return 1 if diff.errors else 0


@command(
    "events",
    "print a thread's event log",
    path_thread,
    arg("--after", type=count(0), metavar="N", help="only events after seq N"),
    arg("--limit", type=count(1), help="at most N events (without --follow)"),
    arg(
        "--follow",
        action="store_true",
        help="keep printing new events until Ctrl-C (waits for a thread not there yet)",
    ),
    arg("--kind", action="append", metavar="KIND", help="only events of KIND (repeatable)"),
    view,
    streams=True,
)
def _cmd_events(args: argparse.Namespace, out: Out) -> int:
    if args.follow and out.mode == "json":
        raise CliError("usage", "events --follow streams: use --nl instead of --json")
    kinds = set(args.kind or ())

    def wanted(event: Any) -> bool:
        return not kinds or event.kind in kinds

    with _read(args.path) as saver:
        # Following a thread that does not exist yet waits for its first event.
        summary = saver.thread_summary(args.thread) if args.follow else _thread(saver, args.thread)
        floor = 1 if summary is None else summary["floor"]
        if args.after is not None:
            after = args.after
        else:  # a damaged floor cell: read from the start and let the store judge it
            after = floor - 1 if is_number(floor) else 0
        if not args.follow:
            found: list[Any] = []
            while args.limit is None or len(found) < args.limit:
                page = saver.events_after(args.thread, after, limit=100)
                found += [e for e in page if wanted(e)]
                if len(page) < 100:
                    break
                after = page[-1].seq
            out.stream(found[: args.limit], lambda e: event_line(e, out.view))
            return 0
        signal.signal(signal.SIGTERM, _interrupt)
        with saver.watch(args.thread, after) as watch:
            try:
                out.stream((e for e in watch if wanted(e)), lambda e: event_line(e, out.view))
            except KeyboardInterrupt:
                return 0  # the normal way to stop following
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@command(
    "compact",
    "remove a thread's events below seq SEQ",
    path_thread,
    arg("--before", type=count(1), metavar="SEQ", required=True, help="new floor"),
    yes(),
)
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


@command(
    "retract",
    "remove a thread's latest turn (or run --run-id)",
    path_thread,
    arg("--run-id", metavar="ID", help="the run to remove (default: the latest)"),
    yes(),
)
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


@command("delete", "delete a thread (refused while a run holds it)", path_thread, yes())
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


@command(
    "runs",
    "steer a thread's run: `runs cancel` asks it to stop",
    arg("action", choices=["cancel"], help="cancel: ask the run to stop"),
    arg("path", metavar="PATH", nargs="?", help="the file (default: $LGFS_PATH)"),
    arg("thread", metavar="THREAD", help="the thread id"),
    arg("--by", metavar="NAME", help="who asks, for the event log (default: lgfs:HOST:PID)"),
)
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


@command("migrate", "upgrade an older store's schema (no other command does)", path_only)
def _cmd_migrate(args: argparse.Namespace, out: Out) -> int:
    before, version = migrate(args.path)
    doc = {"path": redacted(args.path), "migrated": before is not None, "from_version": before}
    doc["schema_version"] = version
    out.document(
        doc,
        lambda: (
            f"{doc['path']}: already at schema version {version}; nothing to do"
            if before is None
            else f"{doc['path']}: migrated schema version {before} -> {version}"
        ),
    )
    return 0


_IMPORT_PROGRESS = arg(
    "--progress", action="store_true", help="draw the progress bar even off a TTY"
)


@command(
    "import-sqlitesaver",
    "copy a LangGraph SqliteSaver file into DEST",
    arg("src", metavar="SRC", help="the SqliteSaver file (read-only)"),
    arg("dest", metavar="DEST", help="the fenced file (created if missing)"),
    _IMPORT_PROGRESS,
)
@command(
    "import-postgressaver",
    "copy a LangGraph PostgresSaver database into DEST",
    arg("src", metavar="SRC", help="the PostgresSaver database's URL (read-only)"),
    arg("dest", metavar="DEST", help="the fenced file (created if missing) or URL"),
    _IMPORT_PROGRESS,
)
def _cmd_import(args: argparse.Namespace, out: Out) -> int:
    """`import-sqlitesaver SRC DEST` and `import-postgressaver SRC DEST`."""
    if args.command == "import-postgressaver":
        run = _postgressaver_import(args.src)  # checks SRC before DEST is created
    else:
        importer.check_source(args.src)  # before DEST is created
        run = importer.import_sqlitesaver
    bar = ProgressBar(sys.stderr) if args.progress or sys.stderr.isatty() else None
    serde = cli_serde(unknown="refuse")
    # A file DEST is created if missing; an existing one, or a PostgreSQL
    # one (which must have been set up), is opened as every command opens a
    # store: at an older schema it is refused, not migrated.
    existing = is_pg_url(args.dest) or os.path.lexists(args.dest)
    dest = open_store(args.dest, serde) if existing else None
    with dest or FencedSqliteSaver(args.dest, serde=serde) as saver:
        try:
            report = run(args.src, saver, progress=bar)
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


def _postgressaver_import(src: str) -> Callable[..., importer.ImportReport]:
    """Check that `src` is a `PostgresSaver` database; return `postgres.import_postgressaver`.

    Raises:
        CliError: `usage`, naming what is not installed.
        UnsupportedFormat, StoreError: `src` is not such a database, or unreachable.
    """
    try:
        from ..postgres import import_postgressaver
        from ..tools.import_postgres import check_postgressaver, require_postgressaver
    except ImportError as exc:
        raise CliError(
            "usage",
            f"import-postgressaver needs the [postgres] extra ({exc.name} is missing): "
            'pip install "langgraph-fenced-sqlite[postgres]"',
        ) from exc
    try:
        require_postgressaver()
    except ImportError as exc:
        raise CliError("usage", f"{exc}") from exc
    check_postgressaver(src)
    return import_postgressaver


# --- the parser -----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Build the `lgfs` argument parser from the registered commands, in `commands.ORDER`."""
    epilog = "exit codes:\n" + "\n".join(f"  {code:>3}  {text}" for code, text in EXIT_CODES)
    parser = Parser(
        prog="lgfs",
        description="Inspect and maintain a langgraph-fenced-sqlite checkpoint file.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"lgfs {__version__}")
    add_db_option(parser, dest="db_global")
    doc = Parser(add_help=False)
    doc.add_argument("--json", action="store_true", help="print one JSON document")
    stream = Parser(add_help=False)
    group = stream.add_mutually_exclusive_group()
    group.add_argument("--json", action="store_true", help="print one JSON document")
    group.add_argument("--nl", action="store_true", help="print one JSON object per line")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    allow = add_allow_options(Parser(add_help=False))
    db = Parser(add_help=False)
    add_db_option(db)
    for name in ORDER:
        spec = REGISTRY[name]
        parents = [stream if spec.streams else doc, allow]
        if not name.startswith("import-"):  # they name their own two stores
            parents.append(db)
        p = sub.add_parser(name, parents=parents, help=spec.help, description=spec.help)
        if spec.usage is not None:
            p.usage = spec.usage
        p.set_defaults(func=spec.fn)
        for option in spec.options:
            option(p)
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
        if args.command == "claims":
            parse_claims_words(args)
        resolve_file(args)
        check_store(args)
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
