"""`lgfs` for an operator's hand on a file: which file, claims, sweeps, vacuum.

Invariant: as in `cli.py`, nothing here judges: a claim is released or taken
over by `force_release` / `take_over(operator=...)`, a sweep is `sweep`, a
status is `thread_status`'s, and a vacuum's refusal is `vacuum`'s. This module
parses, asks for `--yes`, calls and prints. The file a command works on is
named one way for every command (`resolve_file`): `--db PATH` (before or
after the command), else `$LGFS_PATH`, else a `PATH` first argument (the
older form, still accepted).
"""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import os
import socket
from typing import Any

from .cli_allow import cli_serde
from .cli_io import (
    CliError,
    Out,
    claim_doc,
    claim_text,
    confirm,
    open_existing,
    plural,
    span,
    when,
)
from .retention import RetentionPolicy

__all__ = [
    "add_db_option",
    "claims_usage",
    "cmd_claims",
    "cmd_vacuum",
    "operator_name",
    "parse_claims_words",
    "resolve_file",
    "status_text",
    "sweep",
]

_ENV = "LGFS_PATH"
_TAKE_OVER_TTL = 300.0  # an operator's takeover holds the thread this long by default
CLAIM_ACTIONS = ("list", "release", "take-over")


def add_db_option(parser: argparse.ArgumentParser, dest: str = "db") -> None:
    """Add `--db PATH` (the file; default `$LGFS_PATH`) to `parser`."""
    parser.add_argument(
        "--db",
        dest=dest,
        metavar="PATH",
        help=f"the checkpoint file (default: ${_ENV})",
    )


def _flag(args: argparse.Namespace) -> str | None:
    local, outer = getattr(args, "db", None), getattr(args, "db_global", None)
    if local and outer and local != outer:
        raise CliError("usage", f"--db is given twice, differently: {outer!r} and {local!r}")
    flag: str | None = local or outer
    return flag


def resolve_file(args: argparse.Namespace) -> None:
    """Set `args.path` to the file the command works on, and fix up its operands.

    The file is `--db PATH`, else a `PATH` first argument, else `$LGFS_PATH`.
    For `prune`, whose threads are many, a first argument is the file only
    without `--db`, and (when `$LGFS_PATH` is set) only if it names an
    existing file; otherwise it is a thread.

    Raises:
        CliError: `usage`, when the file is named twice or not at all.
    """
    if not hasattr(args, "path"):
        return  # import-sqlitesaver names its own files
    flag, env = _flag(args), os.environ.get(_ENV) or None
    given = args.path
    if args.command == "prune" and given is not None and (flag or (env and not _is_file(given))):
        args.threads, given = [given, *args.threads], None
    if given is not None and flag is not None and given != flag:
        raise CliError(
            "usage",
            f"{args.command}: the file is named twice: {given!r} and --db {flag!r}",
        )
    path = given or flag or env
    if not path:
        raise CliError(
            "usage",
            f"{args.command}: which file? pass --db PATH or set {_ENV} "
            "(the file is a required argument)",
        )
    args.path = path


def _is_file(path: str) -> bool:
    return os.path.isfile(path)


def operator_name(args: argparse.Namespace) -> str:
    """Return who is acting: `--operator NAME`, else `user@host`."""
    if args.operator:
        return str(args.operator)
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name (a bare container)
        user = f"uid{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return f"{user}@{socket.gethostname()}"


def status_text(status: dict[str, Any], now: float) -> str:
    """Say a `ThreadStatus` (as a dict) in a few words: `running (worker-2, expires in 5m)`."""
    state = status["state"]
    if state == "running":
        left = status["expires_at"] - now if status["expires_at"] is not None else 0.0
        return f"running ({status['holder']}, expires in {span(left)})"
    if state == "interrupted" and status["node"]:
        return f"interrupted at {status['node']}"
    return str(state)


# --- claims ---------------------------------------------------------------------------------


def parse_claims_words(args: argparse.Namespace) -> None:
    """Split `claims`'s words into `action`, `path` and `thread`."""
    words = list(args.words)
    action = words.pop(0) if words and words[0] in CLAIM_ACTIONS else "list"
    want = 0 if action == "list" else 1
    if len(words) not in (want, want + 1):
        shape = "claims [PATH]" if action == "list" else f"claims {action} [PATH] THREAD"
        raise CliError("usage", f"expected: lgfs {shape} (see: lgfs claims --help)")
    args.action = action
    args.path = words[0] if len(words) == want + 1 else None
    args.thread = words[-1] if want else None


def cmd_claims(args: argparse.Namespace, out: Out) -> int:
    """List claims, or release / take over one thread's claim (`--yes` needed)."""
    if args.action == "list":
        return _list_claims(args, out)
    operator = operator_name(args)
    with open_existing(args.path, serde=cli_serde()) as saver:
        if not any(t["thread_id"] == args.thread for t in saver.threads()):
            raise CliError(
                "thread_not_found",
                f"thread {args.thread!r} not found in {saver.path}",
                thread_id=args.thread,
            )
        current, now = saver.current_claim(args.thread), saver.clock.now()
        held = "no claim" if current is None else claim_text(claim_doc(current, now))
        if args.action == "release":
            if current is None:
                doc = {"thread_id": args.thread, "released": None, "operator": operator}
                out.document(doc, lambda: f"{args.thread}: no claim to release")
                return 0
            confirm(args, f"release the claim on {args.thread!r} ({held})")
            released = saver.force_release(args.thread, operator=operator)
            doc = {"thread_id": args.thread, "released": released, "operator": operator}
            out.document(
                doc,
                lambda: (
                    f"{args.thread}: released the claim of "
                    f"{released.holder if released else '-'} "
                    f"(token {released.token if released else '-'}) as {operator}; "
                    "its holder's next write is refused"
                ),
            )
            return 0
        confirm(args, f"take over {args.thread!r} ({held}) as {operator}")
        claim = saver.take_over(args.thread, operator, args.ttl, operator=operator)
    doc = {
        "thread_id": args.thread,
        "claim": claim,
        "previous": current,
        "operator": operator,
    }
    out.document(
        doc,
        lambda: (
            f"{args.thread}: taken over by {operator} (token {claim.token}, "
            f"expires in {span(claim.expires_at - now)}); previous: {held}. "
            f"Release it with: lgfs claims release {args.thread} --yes"
        ),
    )
    return 0


def _list_claims(args: argparse.Namespace, out: Out) -> int:
    with open_existing(args.path, serde=cli_serde()) as saver:
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


# --- sweep and vacuum -----------------------------------------------------------------------


def sweep(args: argparse.Namespace, out: Out, policy: RetentionPolicy) -> int:
    """`prune --all`: dry-run the sweep, ask, sweep thread by thread, report."""
    with open_existing(args.path, serde=cli_serde()) as saver:
        plan = saver.sweep(policy, inactive_for=args.inactive_for, dry_run=True)
        n_cp = sum(len(r.checkpoints) for r in plan.pruned)
        n_ev = sum(r.events_removed for r in plan.pruned)
        done = plan
        if not args.dry_run and (n_cp or n_ev or any(r.writes_removed for r in plan.pruned)):
            what = f"{plural(n_cp, 'checkpoint')} and {plural(n_ev, 'event')}"
            touched = sum(1 for r in plan.pruned if r.checkpoints or r.events_removed)
            confirm(args, f"prune --all would remove {what} from {plural(touched, 'thread')}")
            done = saver.sweep(policy, inactive_for=args.inactive_for)
    verb = "would remove" if args.dry_run else "removed"
    doc = {**dataclasses.asdict(done), "dry_run": args.dry_run}

    def text() -> str:
        lines = [
            f"{r.thread_id}: {verb} {plural(len(r.checkpoints), 'checkpoint')}, "
            f"{plural(r.events_removed, 'event')} (floor {r.floor})"
            for r in done.pruned
            if r.checkpoints or r.events_removed or r.writes_removed
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


def cmd_vacuum(args: argparse.Namespace, out: Out) -> int:
    """`vacuum`: reclaim free space; refused while a writer is active unless `--force`."""
    with open_existing(args.path, serde=cli_serde()) as saver:
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


def claims_usage() -> str:
    """The `claims` command's usage lines."""
    return (
        "lgfs claims [PATH] [--db PATH] [--json | --nl]\n"
        "       lgfs claims release [PATH] THREAD --yes [--operator NAME]\n"
        "       lgfs claims take-over [PATH] THREAD --yes [--ttl DURATION] [--operator NAME]"
    )
