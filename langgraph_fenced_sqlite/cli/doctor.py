"""`lgfs doctor`: print what `doctor.diagnose` found, exit 1 if anything failed.

Invariant: this module judges nothing. The checks (the pragmas of
`schema.PRAGMAS`, integrity, claims; on PostgreSQL the schema version,
every row, claims), their problems and what counts as damage are
`doctor.diagnose`'s and `doctor.diagnose_pg`'s; this prints the report as
text or as the JSON document of `Diagnosis.to_dict`.
"""

from __future__ import annotations

import argparse

from ..tools.doctor import Diagnosis, diagnose, diagnose_pg
from .allow import cli_serde
from .commands import command, path_only
from .io import Out, check_existing
from .stores import is_pg_url, open_pg

__all__ = ["cmd_doctor"]

_SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
# Labels that fit the report's 15-character column.
_LABELS = {"journal_size_limit": "wal size limit"}


@command("doctor", "check the file; exit 1 on a problem", path_only)
def cmd_doctor(args: argparse.Namespace, out: Out) -> int:
    """Run `lgfs doctor PATH`: pragmas, schema, counts (orphan writes too), claims, integrity.

    On a PostgreSQL URL: the schema version, every stored row read back
    (checksum and decoding), counts and claims (`doctor.diagnose_pg`).
    """
    if is_pg_url(args.path):
        # Opened writable, never set up, and not checked first as the other
        # commands' stores are: an older schema is what it reports, not refuses.
        with open_pg(args.path) as saver:
            report = diagnose_pg(saver)
        out.document(report.to_dict(), lambda: _pg_text(report))
        return 0 if report.ok else 1
    check_existing(args.path)
    report = diagnose(args.path, serde=cli_serde())
    out.document(report.to_dict(), lambda: _text(report))
    return 0 if report.ok else 1


def _text(report: Diagnosis) -> str:
    status = "ok" if report.ok else "PROBLEMS: " + "; ".join(report.problems)
    stats = report.stats
    if "threads" not in stats:  # too damaged to open, or an older schema (left unread)
        short: list[tuple[str, object]] = [("file", report.path)]
        if "schema_version" in stats:
            short.append(("schema version", stats["schema_version"]))
        short.append(("status", status))
        return "\n".join(f"{k:<15} {v}" for k, v in short)
    lines: list[tuple[str, object]] = [("file", report.path)]
    lines.append(("schema version", stats["schema_version"]))
    for check in report.checks:
        if check.name == "integrity":
            found = check.found
            lines.append(("integrity", "ok" if check.ok else f"FAILED ({len(found)} messages)"))
        elif check.name not in ("claims", "encryption"):
            value = check.found
            if check.name == "synchronous":
                value = _SYNCHRONOUS.get(value, value)
            mark = "" if check.ok else f"  (expected {check.expected})"
            lines.append((_LABELS.get(check.name, check.name.replace("_", " ")), f"{value}{mark}"))
    lines.append(("wal size", f"{stats['wal_bytes']} bytes"))
    lines += [(k, stats[k]) for k in ("threads", "checkpoints", "writes")]
    lines.append(_orphans(stats))
    lines.append(("events", stats["events"]))
    lines.append(("claims", f"{stats['claims']} ({stats['live_claims']} live)"))
    lines.append(("token counter", stats["token_counter"]))
    lines += _cells(report)
    lines.append(("status", status))
    return "\n".join(f"{k:<15} {v}" for k, v in lines)


def _cells(report: Diagnosis) -> list[tuple[str, object]]:
    # Value cells in clear and by key id (`doctor._encryption_check`).
    cells = report.stats.get("cells")
    if cells is None:
        return []
    shown = ", ".join(f"{n} {k}" for k, n in cells.items()) or "none"
    out: list[tuple[str, object]] = [("value cells", shown)]
    named = report.stats.get("named_in_clear")
    if named:
        out.append(("named in clear", f"{named} (values of <= 16 bytes written in clear)"))
    for check in report.checks:
        if check.name == "encryption":
            out.append(("encryption", "ok" if check.ok else "FAILED"))
    return out


def _orphans(stats: dict[str, object]) -> tuple[str, object]:
    n = stats["orphan_writes"]
    return ("orphan writes", f"{n} (prune removes them)" if n else n)


def _pg_text(report: Diagnosis) -> str:
    status = "ok" if report.ok else "PROBLEMS: " + "; ".join(report.problems)
    stats = report.stats
    lines: list[tuple[str, object]] = [("store", report.path)]
    if stats["schema_version"] is not None:
        lines.append(("schema version", stats["schema_version"]))
    for check in report.checks:
        if check.name == "rows":
            read = stats["rows_read"]
            what = ", ".join(f"{n} {k}" for k, n in read.items())
            found = "ok" if check.ok else f"FAILED ({len(check.found)} do not decode)"
            lines.append(("rows", f"{found}: read {what}"))
    if "threads" in stats:
        lines += [(k, stats[k]) for k in ("threads", "checkpoints", "writes")]
        if "orphan_writes" in stats:  # not read from a schema of another version
            lines.append(_orphans(stats))
        lines.append(("events", stats["events"]))
    if "claims" in stats:  # not read from a schema of another version
        lines.append(("claims", f"{stats['claims']} ({stats['live_claims']} live)"))
    if "token_counter" in stats:
        lines.append(("token counter", stats["token_counter"]))
    lines += _cells(report)
    lines.append(("status", status))
    return "\n".join(f"{k:<15} {v}" for k, v in lines)
