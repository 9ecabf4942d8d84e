"""`lgfs doctor`: check a file and report every problem found, exit 1 if any.

Invariant: a damaged file is a finding, not a crash. When SQLite itself says
the file is corrupt (at open, while counting rows, or during
`integrity_check`), doctor reports that as the integrity failure and exits 1;
it tells corruption apart from other database errors by the error's class
and SQLite result code, never by message text.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
from typing import Any

from .cli_allow import cli_serde
from .cli_io import Out, open_existing
from .errors import StoreError

__all__ = ["cmd_doctor"]

# SQLite primary result codes that mean "the file's contents are damaged".
_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26


def damaged(exc: BaseException) -> bool:
    """Whether `exc` is a plain `StoreError` caused by SQLite finding the file corrupt."""
    if type(exc) is not StoreError:  # busy, closed, unsupported format...: not damage
        return False
    cause = exc.__cause__
    while cause is not None and not isinstance(cause, sqlite3.Error):
        cause = cause.__cause__
    if not isinstance(cause, sqlite3.DatabaseError):
        return False
    code = getattr(cause, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    # Python 3.10 has no result code: sqlite3 raises exactly DatabaseError for
    # CORRUPT/NOTADB (busy, I/O and the like are OperationalError).
    return type(cause) is sqlite3.DatabaseError


def _damaged_report(path: str, exc: StoreError) -> dict[str, Any]:
    message = " ".join(str(exc).split())
    return {
        "path": path,
        "integrity": [message],
        "problems": [f"integrity_check found 1 problem(s): the file is damaged: {message}"],
        "ok": False,
    }


def cmd_doctor(args: argparse.Namespace, out: Out) -> int:
    """Run `lgfs doctor PATH`: pragmas, schema, counts, claims, integrity."""
    wal = args.path + "-wal"
    try:
        with open_existing(args.path, serde=cli_serde()) as saver:
            stats, claims, now = saver.stats(), saver.claims(), saver.clock.now()
            stats["wal_bytes"] = os.path.getsize(wal) if os.path.exists(wal) else 0
    except StoreError as exc:
        if not damaged(exc):
            raise
        doc = _damaged_report(args.path, exc)
        text = f"{'file':<15} {args.path}\n{'status':<15} PROBLEMS: {doc['problems'][0]}"
        out.document(doc, lambda: text)
        return 1
    stats["claims"] = len(claims)
    stats["live_claims"] = sum(1 for c in claims if _live(c.expires_at, now))
    problems = []
    if str(stats["journal_mode"]).lower() != "wal":
        problems.append(f"journal_mode is {stats['journal_mode']}, expected wal")
    if stats["synchronous"] != 2:
        problems.append(f"synchronous is {stats['synchronous']}, expected 2 (FULL)")
    integrity = stats["integrity"]
    if integrity != ["ok"]:
        problems.append(f"integrity_check found {len(integrity)} problem(s): {integrity[0]}")
    damaged_claims = [c.thread_id for c in claims if _live(c.expires_at, now) is None]
    if damaged_claims:
        problems.append(f"claims with cells of the wrong type: {damaged_claims}")
    doc = {"path": args.path, **stats, "problems": problems, "ok": not problems}
    names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    lines = [
        ("file", args.path),
        ("schema version", stats["schema_version"]),
        ("journal mode", stats["journal_mode"]),
        ("synchronous", names.get(stats["synchronous"], stats["synchronous"])),
        ("integrity", "ok" if integrity == ["ok"] else f"FAILED ({len(integrity)} messages)"),
        ("wal size", f"{stats['wal_bytes']} bytes"),
        *((k, stats[k]) for k in ("threads", "checkpoints", "writes", "events")),
        ("claims", f"{stats['claims']} ({stats['live_claims']} live)"),
        ("token counter", stats["token_counter"]),
        ("status", "ok" if not problems else "PROBLEMS: " + "; ".join(problems)),
    ]
    out.document(doc, lambda: "\n".join(f"{k:<15} {v}" for k, v in lines))
    return 1 if problems else 0


def _live(expires_at: Any, now: float) -> bool | None:
    if isinstance(expires_at, bool) or not isinstance(expires_at, (int, float)):
        return None  # a damaged cell
    return now < expires_at
