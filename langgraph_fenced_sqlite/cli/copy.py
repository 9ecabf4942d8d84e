"""`lgfs copy-to DSN`: move a checkpoint file's threads into PostgreSQL.

Invariant: as in `main.py`, nothing here judges: what is copied, refused or
busy is `transfer.copy_threads`'s. This module checks the DSN, opens both
stores, calls and prints; errors go through the one converter (`fail`).
"""

from __future__ import annotations

import argparse

from .allow import cli_serde
from .commands import arg, command, defaults
from .io import CliError, Out, open_existing, plural

__all__ = ["cmd_copy_to"]

_SCHEMES = ("postgresql://", "postgres://")


@command(
    "copy-to",
    "copy the file's threads (whole, with history) into a PostgreSQL store",
    defaults(path=None),  # the file is --db PATH or $LGFS_PATH: DSN is the operand
    arg("dsn", metavar="DSN", help="the PostgreSQL database (postgresql://...)"),
    arg(
        "--thread",
        dest="threads",
        action="append",
        metavar="THREAD",
        help="copy only THREAD (repeatable; default: every thread)",
    ),
    arg(
        "--ignore-claims",
        action="store_true",
        help="copy threads with a live claim too (a worker may still be writing them)",
    ),
)
def cmd_copy_to(args: argparse.Namespace, out: Out) -> int:
    """`copy-to DSN [--thread T ...]`: copy the file's threads into PostgreSQL.

    Exit 1 when a thread was refused (the others are copied).
    """
    from ..tools.transfer import copy_threads

    dsn = args.dsn
    if not (dsn.startswith(_SCHEMES) or "=" in dsn):
        raise CliError(
            "usage",
            f"copy-to: DSN {dsn!r} is not a PostgreSQL connection string "
            "(postgresql://USER@HOST:PORT/DB, or libpq's key=value form)",
        )
    try:
        from ..postgres import FencedPostgresSaver
    except ImportError as exc:
        raise CliError(
            "usage",
            f"copy-to needs the [postgres] extra ({exc.name} is missing): "
            'pip install "langgraph-fenced-sqlite[postgres]"',
        ) from exc
    serde = cli_serde(unknown="refuse")
    # The source is only read: opened read-only, an older file is refused, not migrated.
    with open_existing(args.path, serde=serde, readonly=True) as source:
        with FencedPostgresSaver.from_conn_string(dsn, serde=serde) as target:
            target.setup()
            report = copy_threads(
                source, target, args.threads or None, ignore_claims=args.ignore_claims
            )
    out.document(
        report.to_dict(),
        lambda: "\n".join(
            [
                f"copied {plural(report.threads, 'thread')} from {report.source} into "
                f"{report.target}: {plural(report.checkpoints, 'checkpoint')} and "
                f"{plural(report.writes, 'write')} put"
                + (f" ({report.unchanged} already there whole)" if report.unchanged else "")
            ]
            + [f"refused thread {r['thread_id']!r}: {r['reason']}" for r in report.refused]
        ),
    )
    return 1 if report.refused else 0
