"""Opening SQLite connections, and the one translation of SQLite's errors.

Invariant: every connection the package opens comes from `connect` (the
checksum function registered, the SQLite version checked, a file that is not
a database refused untouched), and every `sqlite3` error leaves the package
through `translate`, as a `StoreError` subclass naming the operation and path.

Read-only locations (docs/semantics.md §8, `readonly=True`): SQLite reads a WAL file
through its `-shm` index, which it must be able to create or open. On a
read-only directory or mount where no `-shm` exists, `mode=ro` fails with
SQLITE_CANTOPEN; there the file is opened with `immutable=1`, which tells
SQLite that nothing can change it (true: nobody can write there) and skips
the WAL and its locks. A non-empty `-wal` left there (a store that was not
closed cleanly) holds commits an immutable reader would not see, so such a
file is refused rather than read stale.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from typing import Any

from ..core.checksums import checksum
from ..errors import FencedSqliteError, ReadOnlyStore, StoreBusy, StoreError, UnsupportedFormat
from . import schema

__all__ = ["connect", "is_busy", "primary_code", "translate"]

# SQLite's primary result codes (sqlite3.h); the sqlite3 module names them
# only from Python 3.11 on.
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY = 5, 6, 8
_SQLITE_CORRUPT, _SQLITE_CANTOPEN, _SQLITE_NOTADB = 11, 14, 26
_BUSY_CODES = {_SQLITE_BUSY, _SQLITE_LOCKED}
_NOTADB_CODES = {_SQLITE_NOTADB, _SQLITE_CORRUPT}
# Python 3.10 has no `sqlite_errorcode` on errors: there, and only there, the
# code is recognised from SQLite's fixed message for it (sqlite3ErrStr).
_CODE_OF_MESSAGE = {
    "database is locked": _SQLITE_BUSY,
    "database table is locked": _SQLITE_LOCKED,
    "attempt to write a readonly database": _SQLITE_READONLY,
    "database disk image is malformed": _SQLITE_CORRUPT,
    "unable to open database file": _SQLITE_CANTOPEN,
    "file is not a database": _SQLITE_NOTADB,
}


def primary_code(exc: sqlite3.Error) -> int | None:
    """Return SQLite's primary result code of `exc`, if known."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return _CODE_OF_MESSAGE.get(str(exc))
    return int(code) & 0xFF


def is_busy(exc: sqlite3.Error) -> bool:
    """Return whether `exc` means another connection holds a lock we need."""
    return primary_code(exc) in _BUSY_CODES


def translate(op: str, path: str, exc: sqlite3.Error, waited: float = 0.0) -> FencedSqliteError:
    """Return the package error for a `sqlite3` error met by `op` on `path`."""
    code = primary_code(exc)
    if code in _BUSY_CODES:
        return StoreBusy(op, path, waited)
    if code == _SQLITE_READONLY:
        return ReadOnlyStore(op, path, message=f"{op} on {path}: the store is read-only ({exc})")
    return StoreError(op, path, message=f"{op} on {path}: {exc}")


def _location_writable(path: str) -> bool:
    # os.access answers EROFS for read-only mounts even to root.
    parent = os.path.dirname(os.path.abspath(path)) or "."
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return False
    return os.access(parent, os.W_OK)


def check_sqlite_version(path: str, version: str | None = None) -> None:
    """Refuse an SQLite older than the SQL needs (`schema.MIN_SQLITE_VERSION`).

    Raises:
        UnsupportedFormat: naming the SQLite found and the one needed.
    """
    found = version if version is not None else sqlite3.sqlite_version
    try:
        parts = tuple(int(p) for p in found.split(".")[:3])
    except ValueError:
        parts = (0,)
    if parts < schema.MIN_SQLITE_VERSION:
        needed = ".".join(map(str, schema.MIN_SQLITE_VERSION))
        raise UnsupportedFormat(
            "open",
            path,
            message=(
                f"open {path}: this Python's SQLite is {found}, older than {needed}, which "
                "langgraph-fenced-sqlite needs (RETURNING, UPSERT, JSON functions); use a "
                "Python built with a newer SQLite (the file was not touched)"
            ),
        )


# Prepared statements each connection keeps (sqlite3's default is 128, an
# LRU). The package has over a hundred fixed statements, and some are built per
# call shape (`writes_of_checkpoints` per page size, `list` per filter): past
# 128, a put whose statements were evicted prepares them again, measured at
# 795k instead of 281k instructions (valgrind). Room for all of them.
CACHED_STATEMENTS = 512


def _open(path: str, busy_timeout: float, uri_flags: str | None) -> sqlite3.Connection:
    if uri_flags is None:
        return sqlite3.connect(
            path,
            isolation_level=None,
            check_same_thread=False,
            timeout=busy_timeout,
            cached_statements=CACHED_STATEMENTS,
        )
    uri = "file:" + os.path.abspath(path).replace("?", "%3f").replace("#", "%23")
    return sqlite3.connect(
        uri + "?" + uri_flags,
        uri=True,
        isolation_level=None,
        check_same_thread=False,
        timeout=busy_timeout,
        cached_statements=CACHED_STATEMENTS,
    )


def _first_read(conn: sqlite3.Connection, path: str) -> None:
    try:
        # A read first: a file that is not a database fails here, untouched.
        conn.execute(schema.GET_USER_VERSION).fetchone()
    except sqlite3.DatabaseError as exc:
        conn.close()
        if primary_code(exc) in _NOTADB_CODES:
            raise UnsupportedFormat(
                "open", path, message=f"open {path}: not an SQLite database ({exc}); left unchanged"
            ) from exc
        raise


def _read_only_location(path: str, exc: BaseException) -> ReadOnlyStore:
    return ReadOnlyStore(
        "open",
        path,
        message=(
            f"open {path}: the location is read-only ({exc}); open it with readonly=True "
            "to read it (a read-only store cannot write)"
        ),
    )


# Binding a `bytes` or `None` parameter costs the sqlite3 module two failed
# attribute lookups (`__adapt__`, `__conform__`), each building an
# AttributeError message, unless an adapter is registered for the type:
# about 2,500 CPU instructions per parameter, a few per write (the values
# blob, a NULL token or run id), 2-3% of a put. These adapters return the
# value itself, so nothing bound changes; `setdefault` keeps an adapter the
# application registered. The registry is the process's (the sqlite3 module
# has no per-connection one): other connections bind the same values, faster.
_NONE_TO_NONE: dict[Any, Any] = {}
_IDENTITY_ADAPTERS: dict[type[Any], Callable[[Any], Any]] = {
    bytes: bytes,
    type(None): _NONE_TO_NONE.get,  # a C callable returning None for None
}


def install_identity_adapters() -> None:
    """Register identity adapters for `bytes` and `None` (see above) unless some exist."""
    for kind, adapter in _IDENTITY_ADAPTERS.items():
        sqlite3.adapters.setdefault((kind, sqlite3.PrepareProtocol), adapter)


def connect(path: str, busy_timeout: float, *, readonly: bool = False) -> sqlite3.Connection:
    """Open a connection to `path` (not yet with the package's pragmas).

    Args:
        readonly: Open for reading only, also on a read-only location (see
            the module docstring for when `immutable=1` is used).

    Raises:
        StoreError: the file cannot be opened (missing directory, permissions).
        ReadOnlyStore: a writable open of a read-only location.
        UnsupportedFormat: the file is not an SQLite database, or SQLite is too old.
    """
    check_sqlite_version(path)
    install_identity_adapters()
    if not readonly:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise StoreError(
                "open", path, message=f"open {path}: directory {parent} does not exist"
            )
    elif not os.path.exists(path):
        raise StoreError(
            "open", path, message=f"open {path}: no such file (a read-only store creates none)"
        )
    try:
        try:
            conn = _open(path, busy_timeout, "mode=ro" if readonly else None)
            _first_read(conn, path)
        except sqlite3.OperationalError as exc:
            if primary_code(exc) != _SQLITE_CANTOPEN or _location_writable(path):
                raise
            if not readonly:
                raise _read_only_location(path, exc) from exc
            wal = path + "-wal"
            if os.path.exists(wal) and os.path.getsize(wal) > 0:
                raise StoreError(
                    "open",
                    path,
                    message=(
                        f"open {path}: its -wal file holds commits not yet checkpointed and "
                        "the location is read-only, so they cannot be read; open it once "
                        "where it is writable (left unchanged)"
                    ),
                ) from exc
            conn = _open(path, busy_timeout, "mode=ro&immutable=1")
            _first_read(conn, path)
    except sqlite3.Error as exc:
        raise StoreError("open", path, message=f"open {path}: {exc}") from exc
    try:
        conn.execute(schema.PROBE_JSON).fetchone()
    except sqlite3.Error as exc:
        conn.close()
        raise UnsupportedFormat(
            "open",
            path,
            message=(
                f"open {path}: this Python's SQLite {sqlite3.sqlite_version} has no JSON "
                "functions, which langgraph-fenced-sqlite needs (the file was not touched)"
            ),
        ) from exc
    conn.create_function(schema.CHECKSUM_FUNCTION, -1, checksum, deterministic=True)
    # A damaged TEXT cell may hold bytes that are not UTF-8: the default
    # decoder raises for the whole query; this keeps them (as lone surrogates,
    # never equal to what was written), so the row's checksum refuses it.
    conn.text_factory = lenient_text
    return conn


def lenient_text(data: bytes) -> str:
    """Decode a TEXT cell, keeping bytes that are not UTF-8 as lone surrogates."""
    return data.decode("utf-8", "surrogateescape")


def is_undecodable_text(exc: sqlite3.Error) -> bool:
    """Whether `exc` is the default decoder refusing a TEXT cell that is not UTF-8."""
    return isinstance(exc, sqlite3.OperationalError) and "decode to UTF-8" in str(exc)
