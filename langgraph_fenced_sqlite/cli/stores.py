"""`lgfs --db postgresql://...`: opening either store, and what PostgreSQL refuses.

Invariant: every command opens its store through `open_store`, which gives
a `FencedSqliteSaver` for a file and a `FencedPostgresSaver` for a
`postgresql://` URL, so each command is written once over the calls both
savers have and means the same on either. The only commands that refuse a
URL are those that need what a PostgreSQL store does not have
(`refusal`): `copy-to`, whose source is a file; it is refused with a usage
error before anything is opened. Opening a PostgreSQL store never runs `setup()`:
nothing is created. No command but `lgfs migrate` (`migrate`) upgrades a store:
a command that only reads opens either store `readonly` (it writes nothing),
and one that writes first looks at the schema the same way, so an older
schema is refused with `SchemaTooOld` and a missing one with
`UnsupportedFormat`, the store left unchanged, by every command alike
(migrating is a write that workers of the older version would then refuse).
`doctor`, which reports an older schema rather than refusing it, opens a
PostgreSQL store with `open_pg`, unchecked.
Messages name the server as `postgresql://host:port/db`, never with the
password.
"""

from __future__ import annotations

import argparse
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol

from ..errors import SchemaTooOld
from ..sqlite.schema import SCHEMA_VERSION
from .allow import cli_serde
from .io import CliError, open_existing

__all__ = [
    "check_store",
    "is_pg_url",
    "migrate",
    "open_pg",
    "open_store",
    "redacted",
    "refusal",
]

_EXTRA = 'pip install "langgraph-fenced-sqlite[postgres]"'


def is_pg_url(path: str | None) -> bool:
    """Whether `--db` names a PostgreSQL database (a `postgresql://` or `postgres://` URL)."""
    return isinstance(path, str) and path.startswith(("postgresql://", "postgres://"))


def redacted(path: str) -> str:
    """Return `path` fit for a message: a URL's password (in it or in `?password=`) as `***`."""
    if not is_pg_url(path):
        return path
    from ..postgres.saver import without_password

    return without_password(path, path)


def open_store(
    path: str, serde: SerializerProtocol | None = None, *, readonly: bool = False
) -> Any:
    """Open the store `path` names: a PostgreSQL URL, or an existing checkpoint file.

    Never migrates: a writable open first checks the schema as a read-only
    one does, so a command that writes refuses an older store as a read does.

    Args:
        path: `--db`: a `postgresql://` URL or a file path.
        serde: The serializer (default: the command line's allow-list, values
            outside it shown as tagged data).
        readonly: For a command that only reads: the store is opened
            `readonly=True`, so nothing is written.

    Raises:
        CliError: `file_not_found` / `not_a_file` (a file), `usage` (no
            `[postgres]` extra installed).
        StoreError: the connection failed.
        UnsupportedFormat: the schema is not this version's (`SchemaTooOld`
            when older, left unchanged), or missing.
    """
    serde = cli_serde() if serde is None else serde
    if not readonly:
        _open(path, serde, readonly=True).close()  # refuses an older schema, unchanged
    return _open(path, serde, readonly=readonly)


def _open(path: str, serde: SerializerProtocol, *, readonly: bool) -> Any:
    if is_pg_url(path):
        return open_pg(path, serde, readonly=readonly)
    return open_existing(path, serde=serde, readonly=readonly)


def _pg_saver_class() -> Any:
    try:
        from ..postgres import FencedPostgresSaver
    except ImportError as exc:
        raise CliError(
            "usage",
            f"a PostgreSQL store needs the [postgres] extra ({exc.name} is missing): {_EXTRA}",
        ) from exc
    return FencedPostgresSaver


def open_pg(url: str, serde: SerializerProtocol | None = None, *, readonly: bool = False) -> Any:
    """Connect to a PostgreSQL store (never `setup()`), with the command line's allow-list.

    Raises:
        CliError: `usage`, the `[postgres]` extra is not installed.
        StoreError: the connection failed (the message names host and port,
            never the password).
        UnsupportedFormat: `readonly`, and the schema is not this version's.
    """
    serde = cli_serde() if serde is None else serde
    opener = _pg_saver_class().from_conn_string(url, serde=serde, readonly=readonly)
    return opener.__enter__()  # the saver owns the connection: closing it closes that


def migrate(path: str) -> tuple[int | None, int]:
    """Bring the store's schema up to this version, if it is older; a newer one is refused.

    A file migrates when opened writable (in one transaction); a PostgreSQL
    database by `setup()`, which never creates a schema here: a database
    without one is refused as read commands refuse it.

    Returns:
        The version it had (None if it was already this version's) and this version's.

    Raises:
        UnsupportedFormat: not ours, a newer schema, or (PostgreSQL) no schema.
    """
    serde = cli_serde()
    try:
        with _open(path, serde, readonly=True):
            pass
    except SchemaTooOld as old:
        with _open(path, serde, readonly=False) as saver:
            if is_pg_url(path):
                saver.setup()
        return old.version, old.current
    if is_pg_url(path):
        from ..postgres.sql import SCHEMA_VERSION as PG_VERSION

        return None, PG_VERSION
    return None, SCHEMA_VERSION


def refusal(command: str) -> str | None:
    """Say why `command` cannot run on a PostgreSQL store, or None if it can."""
    if command == "copy-to":
        return (
            "the source is a checkpoint file (--db PATH or $LGFS_PATH); the PostgreSQL "
            "store is the DSN operand"
        )
    return None


def check_store(args: argparse.Namespace) -> None:
    """Refuse a PostgreSQL URL where the command cannot use one, before anything is opened.

    `import-sqlitesaver`'s DEST may be a URL of a database set up beforehand
    (it is never created there); its SRC is a `SqliteSaver` file.
    `import-postgressaver`'s SRC is a URL; its DEST is as `import-sqlitesaver`'s.

    Raises:
        CliError: `usage`, saying why.
    """
    if args.command == "import-postgressaver" and not is_pg_url(args.src):
        raise CliError(
            "usage",
            f"import-postgressaver: SRC {args.src!r} is not a PostgreSQL URL "
            "(postgresql://USER@HOST:PORT/DB, the database LangGraph's PostgresSaver writes)",
        )
    if args.command == "import-sqlitesaver" and is_pg_url(args.src):
        raise CliError(
            "usage",
            f"import-sqlitesaver: SRC {redacted(args.src)!r} is a URL; SRC is a LangGraph "
            "SqliteSaver file (to copy a fenced store's threads, see: lgfs copy-to --help)",
        )
    if not is_pg_url(getattr(args, "path", None)):
        return
    reason = refusal(args.command)
    if reason is not None:
        raise CliError("usage", f"{args.command}: {reason}")
