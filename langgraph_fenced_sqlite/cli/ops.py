"""`lgfs` for an operator's hand on a file: which file, which status, which claim.

Invariant: as in `main.py`, nothing here judges: a claim is released or taken
over by `force_release` / `take_over(operator=...)`, and its liveness is
`claim_live`'s (through `claim_doc`). This module parses, asks for `--yes`,
calls and prints. The file a command works on is
named one way for every command (`resolve_file`): `--db PATH` (before or
after the command), else `$LGFS_PATH`, else a `PATH` first argument (the
older form, still accepted).
"""

from __future__ import annotations

import argparse
import getpass
import os
import socket

from .commands import arg, command, view, yes
from .io import CliError, Out, claim_doc, claim_text, confirm, duration, find_thread, span
from .stores import is_pg_url, open_store, redacted
from .text import Cell, Fit, stamp

__all__ = [
    "add_db_option",
    "cmd_claims",
    "operator_name",
    "parse_claims_words",
    "resolve_file",
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
        raise CliError(
            "usage",
            f"--db is given twice, differently: {redacted(outer)!r} and {redacted(local)!r}",
        )
    flag: str | None = local or outer
    return flag


def resolve_file(args: argparse.Namespace) -> None:
    """Set `args.path` to the file the command works on, and fix up its operands.

    The file is `--db PATH`, else a `PATH` first argument, else `$LGFS_PATH`.
    For `prune`, whose threads are many, a first argument is the file only
    without `--db`, and (when `$LGFS_PATH` is set) only if it names an
    existing file or a PostgreSQL URL; otherwise it is a thread.

    Raises:
        CliError: `usage`, when the file is named twice or not at all.
    """
    if not hasattr(args, "path"):
        return  # import-sqlitesaver and import-postgressaver name their own stores
    flag, env = _flag(args), os.environ.get(_ENV) or None
    given = args.path
    store = given is not None and (_is_file(given) or is_pg_url(given))
    if args.command == "prune" and given is not None and (flag or (env and not store)):
        args.threads, given = [given, *args.threads], None
    if given is not None and flag is not None and given != flag:
        raise CliError(
            "usage",
            f"{args.command}: the file is named twice: {redacted(given)!r} and "
            f"--db {redacted(flag)!r}",
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


_CLAIMS_USAGE = (
    "lgfs claims [PATH] [--db PATH] [--json | --nl] [--full]\n"
    "       lgfs claims release [PATH] THREAD --yes [--operator NAME]\n"
    "       lgfs claims take-over [PATH] THREAD --yes [--ttl DURATION] [--operator NAME]"
)


@command(
    "claims",
    "list claims; release or take over a thread's claim",
    arg(
        "words",
        nargs="*",
        metavar="[release | take-over] [PATH] [THREAD]",
        help="no action: list every claim, live or expired; `release THREAD` ends "
        "the thread's claim, whoever holds it; `take-over THREAD` gives it to you with "
        "a new token; either fences off the holder (its next write is refused) and "
        "logs an event naming you",
    ),
    arg("--operator", metavar="NAME", help="who you are, for the event (user@host)"),
    arg(
        "--ttl",
        type=duration,
        default=_TAKE_OVER_TTL,
        metavar="DURATION",
        help="how long a take-over holds the thread (default 5m)",
    ),
    yes("release or take over"),
    view,
    streams=True,
    usage=_CLAIMS_USAGE,
)
def cmd_claims(args: argparse.Namespace, out: Out) -> int:
    """List claims, or release / take over one thread's claim (`--yes` needed)."""
    if args.action == "list":
        return _list_claims(args, out)
    operator = operator_name(args)
    with open_store(args.path) as saver:
        find_thread(saver, args.thread)
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
    with open_store(args.path, readonly=True) as saver:  # only reads: never migrates
        claims, now = saver.claims(), saver.clock.now()
    items = [{"thread_id": c.thread_id, **claim_doc(c, now)} for c in claims]
    out.rows(
        items,
        [
            ("THREAD", lambda i: i["thread_id"], Fit(squeeze=12, middle=True)),
            ("HOLDER", lambda i: i["holder"], Fit(min=16)),
            ("TOKEN", lambda i: i["token"]),
            ("STATE", lambda i: "live" if i["live"] else "expired"),
            ("EXPIRES", lambda i: stamp(i["expires_at"], now)),
            ("", lambda i: Cell(claim_text(i).split(", ")[-1]), Fit(drop=1)),
        ],
    )
    return 1 if any(i.get("error") for i in items) else 0
