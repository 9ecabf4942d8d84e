"""How `lgfs` talks: arguments, the one emitter, the one error converter.

Invariant: every command prints through `Out`, so `--json` always gives one
JSON document and `--nl` one JSON object per line (flushed at once, for
streams); every failure leaves through `fail`, which prints one line (or one
JSON object with `code` and `message`) on stderr and returns the exit code
documented in `EXIT_CODES`. Values JSON cannot hold are converted by
`jsonable`, never dropped.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import os
import re
import sqlite3
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, NoReturn

from langgraph.checkpoint.serde.base import SerializerProtocol

from ..core.claims import claim_live
from ..errors import (
    CheckpointConflict,
    CheckpointNotFound,
    FencedSqliteError,
    InvalidArgument,
    ReplayUnavailable,
    SchemaTooOld,
    SerializationError,
    StaleClaim,
    StoreBusy,
    ThreadBusy,
    UndecodableRow,
    UnsupportedFormat,
)
from ..sqlite.saver import FencedSqliteSaver
from .text import Columns as Columns
from .text import View, span, table, when

__all__ = [
    "EXIT_BY_CLASS",
    "EXIT_CODES",
    "CliError",
    "ConfirmationRequired",
    "NotAFile",
    "NotFound",
    "UsageError",
    "Out",
    "Parser",
    "ProgressBar",
    "claim_doc",
    "check_existing",
    "claim_text",
    "compact",
    "confirm",
    "count",
    "duration",
    "exit_code",
    "fail",
    "find_thread",
    "metadata_pair",
    "is_number",
    "jsonable",
    "open_existing",
    "plural",
    "span",
    "when",
]

EXIT_CODES: tuple[tuple[int, str], ...] = (
    (0, "success"),
    (1, "a problem was found: doctor found one, or a row does not decode"),
    (2, "bad usage or a bad argument"),
    (3, "not found: missing file, unknown thread or checkpoint, events compacted away"),
    (
        4,
        "file refused: not a database, not ours (or not a SqliteSaver file), "
        "newer schema (or older, to a read command)",
    ),
    (5, "busy: the thread has a live claim, or the file stayed locked past busy_timeout"),
    (6, "data would be removed and --yes was not given; nothing was changed"),
    (7, "any other database or operating-system error, or an internal error"),
    (130, "interrupted (Ctrl-C), except `events --follow`, which ends with 0"),
)


class CliError(Exception):
    """Raise for a failure the CLI itself detects; its class picks the exit code.

    `CliError(code, message, **fields)` returns the subclass that stands for
    `code` (as `OSError(errno, ...)` returns `FileNotFoundError`): `usage` is
    a `UsageError`, `thread_not_found` a `NotFound`, and so on. A code no
    subclass claims stays a plain `CliError` (exit 7).
    """

    codes: ClassVar[tuple[str, ...]] = ()

    def __new__(cls, code: str, message: str, **fields: Any) -> CliError:
        """Pick the subclass whose `codes` hold `code` (when called on `CliError`)."""
        if cls is CliError:
            cls = next((sub for sub in _CLI_ERRORS if code in sub.codes), CliError)
        return super().__new__(cls)

    def __init__(self, code: str, message: str, **fields: Any) -> None:
        """Carry a stable `code`, a one-line message and JSON fields."""
        super().__init__(message)
        self.code, self.fields = code, fields

    def to_dict(self) -> dict[str, Any]:
        """Return code, message and fields, ready for JSON output."""
        return {"code": self.code, "message": str(self), **self.fields}


class UsageError(CliError):
    """Bad usage or a bad argument (exit 2)."""

    codes = ("usage",)


class NotFound(CliError):
    """A file, thread or checkpoint that is not there (exit 3)."""

    codes = ("file_not_found", "thread_not_found", "checkpoint_not_found")


class NotAFile(CliError):
    """A path that is not a regular file (exit 4)."""

    codes = ("not_a_file",)


class ConfirmationRequired(CliError):
    """Data would be removed and `--yes` was not given; nothing changed (exit 6)."""

    codes = ("confirmation_required",)


_CLI_ERRORS = (UsageError, NotFound, NotAFile, ConfirmationRequired)

# The one mapping from error classes to exit codes (see `EXIT_CODES`): the
# most specific class of an error's MRO that is listed wins, and an error of
# no listed class exits 7. Never decided from a message or a code string.
EXIT_BY_CLASS: dict[type[BaseException], int] = {
    UndecodableRow: 1,
    SerializationError: 1,
    UsageError: 2,
    InvalidArgument: 2,
    NotFound: 3,
    FileNotFoundError: 3,
    CheckpointNotFound: 3,
    ReplayUnavailable: 3,
    NotAFile: 4,
    UnsupportedFormat: 4,
    ThreadBusy: 5,
    StaleClaim: 5,
    StoreBusy: 5,
    CheckpointConflict: 5,
    ConfirmationRequired: 6,
}


def exit_code(exc: BaseException) -> int:
    """Return the exit code for `exc`, from its class (`EXIT_BY_CLASS`); 7 if none is listed."""
    return next((EXIT_BY_CLASS[c] for c in type(exc).__mro__ if c in EXIT_BY_CLASS), 7)


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors go through `fail` like any other."""

    def error(self, message: str) -> NoReturn:
        """Raise a `usage` `CliError` instead of printing and exiting."""
        raise CliError("usage", f"{message} (see: {self.prog} --help)")


def fail(exc: BaseException, as_json: bool) -> int:
    """Print `exc` on stderr (one line, or one JSON object) and return its exit code.

    The one converter for every exception, expected or not: the exit code
    comes from the error's class (`exit_code`), never from its text, and no
    traceback is ever printed.
    """
    if isinstance(exc, (CliError, FencedSqliteError)):
        doc = exc.to_dict()
        if _no_schema(exc):
            doc["message"] += " (no langgraph-fenced-sqlite schema here: run setup() first)"
        elif isinstance(exc, SchemaTooOld):
            # The library's own message says how a program migrates (open it
            # writable, or setup()); here only `lgfs migrate` does.
            doc["message"] = (
                f"{exc.path}: schema version {exc.version} needs migrating to "
                f"{exc.current}, left unchanged ({_MIGRATE_HINT})"
            )
    elif isinstance(exc, FileNotFoundError):
        doc = {"code": "file_not_found", "message": f"{exc.filename}: no such file"}
    elif isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        doc = {"code": "os_error", "message": f"{where}{exc.strerror or exc}"}
    elif isinstance(exc, sqlite3.Error) or _is_psycopg_error(exc):
        doc = {"code": "database_error", "message": f"{type(exc).__name__}: {exc}"}
    else:
        # A bug (ours, or a row we did not foresee): say so, in one line.
        name = f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins.")
        doc = {"code": "internal_error", "message": f"internal error: {name}: {exc}"}
    if as_json:
        print(json.dumps(jsonable(doc), ensure_ascii=False), file=sys.stderr)
    else:
        print("lgfs: error: " + " ".join(str(doc["message"]).split()), file=sys.stderr)
    return exit_code(exc)


# Why a command refused an older store, and what to do: said once, here.
_MIGRATE_HINT = (
    "only `lgfs migrate` migrates: run it once every process that uses the store runs this version"
)


def _is_psycopg_error(exc: BaseException) -> bool:
    # By class; psycopg is imported only where a PostgreSQL store was opened.
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(exc, psycopg.Error)


def _no_schema(exc: BaseException) -> bool:
    if "psycopg" not in sys.modules:
        return False
    from ..tools.doctor import no_schema

    return no_schema(exc)


def open_existing(
    path: str, serde: SerializerProtocol | None = None, *, readonly: bool = False
) -> FencedSqliteSaver:
    """Open the store on `path`, which must be an existing file (never create one).

    Args:
        path: The database file.
        serde: The serializer to read with (the CLI's allow-list), if not the default.
        readonly: Open it read-only: nothing is written, an older file is not migrated.

    Raises:
        CliError: `file_not_found` or `not_a_file`.
        SchemaTooOld: `readonly`, and the file needs migrating (left unchanged).
    """
    check_existing(path)
    return FencedSqliteSaver(path, serde=serde, readonly=readonly)


def check_existing(path: str) -> None:
    """Refuse a `path` that is not an existing regular file.

    Raises:
        CliError: `file_not_found` (a `NotFound`) or `not_a_file` (a `NotAFile`).
    """
    if not os.path.exists(path):
        raise CliError("file_not_found", f"{path}: no such file", path=path)
    if not os.path.isfile(path):
        raise CliError("not_a_file", f"{path}: not a file", path=path)


def find_thread(saver: FencedSqliteSaver, thread_id: str) -> dict[str, Any]:
    """Return the thread's summary (`saver.thread_summary`: as `threads()` gives it).

    Raises:
        CliError: `thread_not_found`.
    """
    summary = saver.thread_summary(thread_id)
    if summary is not None:
        return summary
    raise CliError(
        "thread_not_found", f"thread {thread_id!r} not found in {saver.path}", thread_id=thread_id
    )


def confirm(args: argparse.Namespace, what: str) -> None:
    """Return if `--yes` was given or a terminal user says yes to `what`.

    Raises:
        CliError: `confirmation_required` (exit 6); nothing was changed.
    """
    if args.yes:
        return
    if not args.json and sys.stdin.isatty() and sys.stderr.isatty():
        sys.stderr.write(f"{what}. Continue? [y/N] ")
        sys.stderr.flush()
        if input().strip().lower() in ("y", "yes"):
            return
    raise CliError("confirmation_required", f"{what}; pass --yes to do it (nothing was changed)")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def plural(count: int, noun: str) -> str:
    """Return `1 checkpoint`, `2 checkpoints`."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def duration(text: str) -> float:
    """Parse `30s`, `15m`, `2h`, `7d`, `1w` (or plain seconds) into seconds."""
    match = _DURATION.match(text)
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"expected a duration like 30s, 15m, 2h or 7d: {text!r}")
    return float(match.group(1)) * _UNIT[match.group(2)]


def metadata_pair(text: str) -> tuple[str, Any]:
    """Parse `--metadata KEY=VALUE` (VALUE a string) or `KEY:=JSON` (any JSON value).

    A string is the default, so that `user=123` finds the user "123", not
    the number; `step:=3`, `done:=true`, `note:=null` give JSON values.
    """
    key, sep, value = text.partition("=")
    if not sep or not key or key == ":":
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE or KEY:=JSON: {text!r}")
    if not key.endswith(":"):
        return key, value
    try:
        return key[:-1], json.loads(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{key[:-1]}: not a JSON value: {value!r}") from None


# The store keeps integers in SQLite's signed 64 bits.
MAX_COUNT = 2**63 - 1


def count(minimum: int) -> Callable[[str], int]:
    """Return an argparse type that accepts integers from `minimum` to 2**63 - 1."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if not minimum <= value <= MAX_COUNT:
            raise argparse.ArgumentTypeError(
                f"expected an integer from {minimum} to 2**63 - 1: {text!r}"
            )
        return value

    return parse


# --- the one emitter ---------------------------------------------------------------------


class Out:
    """Print results as text (default), one JSON document (`--json`) or lines (`--nl`)."""

    def __init__(self, args: argparse.Namespace) -> None:
        """Pick the mode from the parsed `--json` / `--nl` flags, and how text is drawn."""
        self.mode = "nl" if getattr(args, "nl", False) else "json" if args.json else "text"
        self.view = View.for_args(args, sys.stdout)

    def _print(self, text: str) -> None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def document(self, doc: Any, text: Callable[[], str]) -> None:
        """Print `doc` as JSON, or `text()` in text mode."""
        if self.mode == "text":
            self._print(text())
        else:
            self._print(json.dumps(jsonable(doc), indent=2, ensure_ascii=False))

    def rows(self, items: list[dict[str, Any]], columns: Columns) -> None:
        """Print `items` as a table fitted to the terminal in text mode, else JSON list or lines."""
        if self.mode == "text":
            self._print(table(items, columns, self.view) if items else "(none)")
        else:
            self.stream(items, str)

    def stream(self, items: Iterable[Any], line: Callable[[Any], str]) -> None:
        """Print each item as it comes: `line(item)`, or one JSON object per line.

        In `--json` mode the items are collected into one list first.
        """
        if self.mode == "json":
            self.document(list(items), str)
            return
        for item in items:
            text = json.dumps(jsonable(item), ensure_ascii=False)
            self._print(text if self.mode == "nl" else line(item))


def jsonable(value: Any) -> Any:
    """Convert a decoded value to JSON data (models and dataclasses to dicts, bytes to base64)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return {"bytes_base64": base64.b64encode(bytes(value)).decode()}
    if hasattr(value, "model_dump"):
        return jsonable(value.model_dump())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    if hasattr(value, "to_dict"):
        return jsonable(value.to_dict())
    return repr(value)


def compact(value: Any) -> str:
    """Return `value` as one line of JSON."""
    return json.dumps(jsonable(value), ensure_ascii=False, separators=(", ", ": "))


def is_number(value: Any) -> bool:
    """Whether `value` is a real number (a damaged cell may hold text or bytes)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def claim_doc(claim: Any, now: float) -> dict[str, Any]:
    """Describe a claim (a `Claim` or a `threads()` claim dict) as of `now`."""
    if isinstance(claim, dict):
        holder, token, expires_at = claim["holder"], claim["token"], claim["expires_at"]
    else:
        holder, token, expires_at = claim.holder, claim.token, claim.expires_at
    if not (is_number(expires_at) and is_number(token)):
        # A damaged claim cell: show what is there, judge nothing, flag it.
        message = f"claim cells of the wrong type: token={token!r}, expires_at={expires_at!r}"
        error = {"code": "undecodable_row", "message": message}
        doc = {"holder": holder, "token": token, "expires_at": expires_at}
        return {**doc, "live": None, "expires_in": None, "error": error}
    return {
        "holder": holder,
        "token": token,
        "expires_at": expires_at,
        "live": claim_live(token, expires_at, now),
        "expires_in": round(expires_at - now, 3),
    }


def claim_text(claim: dict[str, Any] | None) -> str:
    """Say who holds a claim (a `claim_doc`) and when it expires."""
    if claim is None:
        return "-"
    if claim["live"] is None:
        return f"{claim['holder']} token {claim['token']!r}, DAMAGED"
    gap = span(claim["expires_in"])
    state = f"expires in {gap}" if claim["live"] else f"expired {gap} ago"
    return f"{claim['holder']} token {claim['token']}, {state}"


class ProgressBar:
    """Draw `importing [####....]  40%  400/1000 rows` on a terminal, at most 10 times a second."""

    def __init__(self, stream: Any, width: int = 30) -> None:
        """Draw on `stream` (stderr), `width` characters wide."""
        self.stream, self.width, self.last, self.drawn = stream, width, 0.0, False

    def __call__(self, done: int, total: int) -> None:
        """Redraw for `done` of `total` rows."""
        now = time.monotonic()
        if done < total and now - self.last < 0.1:
            return
        self.last, self.drawn = now, True
        frac = done / total if total else 1.0
        bar = "#" * int(self.width * frac)
        self.stream.write(f"\rimporting [{bar:.<{self.width}}] {frac:4.0%}  {done}/{total} rows")
        self.stream.flush()

    def finish(self) -> None:
        """End the bar's line."""
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
