"""`lgfs --db postgresql://...`: which commands read a PostgreSQL store, and opening one.

Invariant: a command reaches a PostgreSQL store only if it is in
`PG_COMMANDS` (read-only, and every call it makes is one
`FencedPostgresSaver` has); any other command given such a URL is refused
with a usage error before anything is opened. Opening never runs `setup()`:
nothing is created.
"""

from __future__ import annotations

import argparse
from typing import Any

from .cli_allow import cli_serde
from .cli_io import CliError

__all__ = ["PG_COMMANDS", "check_store", "is_pg_url", "open_pg"]

# The read-only commands whose every call `FencedPostgresSaver` has (`events`
# without `--follow`). Every other command refuses such a URL.
PG_COMMANDS = ("threads", "history", "show", "diff", "events")


def is_pg_url(path: str | None) -> bool:
    """Whether `--db` names a PostgreSQL database (a `postgresql://` or `postgres://` URL)."""
    return isinstance(path, str) and path.startswith(("postgresql://", "postgres://"))


def open_pg(url: str) -> Any:
    """Connect to a PostgreSQL store for reading, with the command line's allow-list.

    Raises:
        StoreError: the connection failed (the message names host and port,
            never the password).
    """
    import psycopg

    from .errors import StoreError
    from .postgres import FencedPostgresSaver

    try:
        conn = psycopg.connect(url, autocommit=True)
    except psycopg.Error as exc:
        message = f"connect failed: {' '.join(str(exc).split())}"
        raise StoreError("connect", "postgresql", message=message) from exc
    try:
        return FencedPostgresSaver(conn, serde=cli_serde(), _owned=True)
    except BaseException:
        conn.close()
        raise


def check_store(args: argparse.Namespace) -> None:
    """Refuse a PostgreSQL URL for a command (or option) that does not read one yet.

    Raises:
        CliError: `usage`, naming the commands that do.
    """
    if not is_pg_url(getattr(args, "path", None)):
        return
    what = args.command
    if args.command == "events" and args.follow:
        what = "events --follow"
    elif args.command in PG_COMMANDS:
        return
    raise CliError(
        "usage",
        f"{what}: not available on a PostgreSQL store yet; these are: {', '.join(PG_COMMANDS)}",
    )
