"""Checking a store: every check `lgfs doctor` reports, each judged here once.

Invariant: the pragmas checked are `schema.PRAGMAS`, the one place that sets
them, compared as the engine compares them (`schema.pragma_matches`); claim
liveness is `claims.claim_live`. A PostgreSQL store has no file, pragmas or
`integrity_check`: `diagnose_pg` checks what it does have, the schema
version and every stored row (`doctor_rows.scan_rows`: the readers' own
checksum and decoding, nothing re-derived). A damaged file is a finding, not a crash:
when SQLite itself says the file is corrupt (at open, while counting rows, or
during `integrity_check`) the diagnosis reports an integrity failure, telling
corruption apart from other database errors by the error's class and SQLite
result code, never by message text.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol

from ..core.claims import claim_live
from ..core.rekey import CLEAR
from ..errors import SchemaTooOld, StoreError
from ..sqlite import schema

__all__ = ["Check", "Diagnosis", "damaged", "diagnose", "diagnose_pg", "no_schema"]

# SQLite primary result codes that mean "the file's contents are damaged".
_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26
# How a pragma's expected value reads in a problem.
_VALUE_NAMES = {("synchronous", "2"): "2 (FULL)"}


@dataclass(frozen=True)
class Check:
    """One check of a file.

    Attributes:
        name: What was checked: a pragma's name (from `schema.PRAGMAS`),
            `integrity` or `claims`; on PostgreSQL `schema_version`, `rows`
            and `claims`.
        ok: Whether it passed.
        found: What the file has.
        expected: What it should have (None when there is no single value).
        problem: The sentence reported when it failed.
    """

    name: str
    ok: bool
    found: Any
    expected: Any = None
    problem: str | None = None


@dataclass(frozen=True)
class Diagnosis:
    """What `diagnose` found.

    Attributes:
        path: The file (the server, `postgresql://host:port/db`, for PostgreSQL).
        checks: Every check made, in order (pragmas, integrity, claims; on
            PostgreSQL schema version, rows, claims).
        stats: The store's `stats()` plus `claims`, `live_claims` and
            `orphan_writes` (writes whose checkpoint is not stored, older
            than their namespace's latest checkpoint: what `prune` removes;
            not a problem, space a prune gives back), and `wal_bytes` for a
            file (`rows_read` for PostgreSQL, which leaves orphans unread);
            only `integrity` for a file too damaged to open, only
            `schema_version` for a store of another schema version.
    """

    path: str
    checks: tuple[Check, ...]
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def problems(self) -> list[str]:
        """The failed checks' sentences."""
        return [c.problem or c.name for c in self.checks if not c.ok]

    @property
    def ok(self) -> bool:
        """Whether every check passed."""
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """Return the document `lgfs doctor --json` prints."""
        stats = {k: v for k, v in self.stats.items() if k != "pragmas"}
        return {"path": self.path, **stats, "problems": self.problems, "ok": self.ok}


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


def no_schema(exc: BaseException) -> bool:
    """Whether `exc` is a plain `StoreError` caused by PostgreSQL lacking our tables.

    Told by the psycopg error's class (`UndefinedTable`), never by its text.
    """
    if type(exc) is not StoreError:
        return False
    from psycopg import errors as pg_errors

    cause = exc.__cause__
    while cause is not None and not isinstance(cause, pg_errors.UndefinedTable):
        cause = cause.__cause__
    return cause is not None


def diagnose(path: str, *, serde: SerializerProtocol | None = None) -> Diagnosis:
    """Check the file at `path`: pragmas, integrity, claims; never create it.

    Args:
        path: An existing checkpoint file.
        serde: The serializer to open it with (the default if None).

    Raises:
        FileNotFoundError: there is no file at `path`.
        StoreError: the file could not be read for another reason than
            damage (busy, not ours, newer schema...).
    """
    from ..sqlite.saver import FencedSqliteSaver  # the saver imports this package's modules

    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, "no such file", path)
    wal = path + "-wal"
    try:
        try:
            # Read-only first: an older file is reported, never migrated.
            FencedSqliteSaver(path, serde=serde, readonly=True).close()
        except SchemaTooOld as old:
            check = _schema_check(old.version, old.current)
            return Diagnosis(path, (check,), {"schema_version": old.version})
        with FencedSqliteSaver(path, serde=serde) as saver:
            stats, claims, now = saver.stats(), saver.claims(), saver.clock.now()
            stats["orphan_writes"] = saver._count_orphan_writes()
            stats["wal_bytes"] = os.path.getsize(wal) if os.path.exists(wal) else 0
            sealing = _encryption_check(saver, stats)
    except StoreError as exc:
        if not damaged(exc):
            raise
        message = " ".join(str(exc).split())
        found = f"integrity_check found 1 problem(s): the file is damaged: {message}"
        check = Check("integrity", False, [message], ["ok"], found)
        return Diagnosis(path, (check,), {"integrity": [message]})
    problem: str | None
    claims_check = _claims_check(claims, now, stats)
    checks = []
    for name, value in schema.PRAGMAS:
        found = stats["pragmas"].get(name)
        expected = _VALUE_NAMES.get((name, value), value)
        ok = schema.pragma_matches(found, value)
        problem = None if ok else f"{name} is {found}, expected {expected}"
        checks.append(Check(name, ok, found, value, problem))
    integrity = stats["integrity"]
    ok = integrity == ["ok"]
    problem = None if ok else f"integrity_check found {len(integrity)} problem(s): {integrity[0]}"
    checks.append(Check("integrity", ok, integrity, ["ok"], problem))
    checks.append(claims_check)
    if sealing is not None:
        checks.append(sealing)
    return Diagnosis(path, tuple(checks), stats)


def _encryption_check(saver: Any, stats: dict[str, Any]) -> Check | None:
    """Count the value cells by key id into `stats`; with a keyring, check that all are sealed.

    `stats["cells"]` maps `"clear"` and each key id to its number of cells,
    `stats["named_in_clear"]` counts value rows named by their own bytes.
    A store opened with `encryption` fails the check when a cell is in
    clear or under a key not in its ring (`lgfs rekey` moves them).
    """
    counted = saver.cell_keys()
    stats["cells"] = dict(sorted(counted.cells.items()))
    stats["named_in_clear"] = counted.named_in_clear
    enc = saver.encryption
    if enc is None:
        return None
    foreign = {k: n for k, n in counted.cells.items() if k != CLEAR and k not in enc.key_ids}
    old = {k: n for k, n in counted.cells.items() if k not in (CLEAR, enc.key_id)}
    problems = []
    if counted.clear:
        problems.append(f"{counted.clear} value cell(s) stored in clear")
    if foreign:
        problems.append(f"{sum(foreign.values())} under keys not in the ring {sorted(foreign)}")
    ok = not problems
    problem = None if ok else "; ".join(problems) + ": run `lgfs rekey`"
    found = {"key_id": enc.key_id, "older_keys": old, "clear": counted.clear}
    return Check("encryption", ok, found, {"clear": 0}, problem)


def _schema_check(found: int, current: int) -> Check:
    problem: str | None = None
    if found < current:
        problem = f"schema version {found} is older than {current}: run `lgfs migrate`"
    elif found > current:
        problem = f"schema version {found} is newer than this version knows ({current})"
    return Check("schema_version", problem is None, found, current, problem)


def _claims_check(claims: Any, now: float, stats: dict[str, Any]) -> Check:
    liveness = [claim_live(c.token, c.expires_at, now) for c in claims]
    stats["claims"] = len(claims)
    stats["live_claims"] = liveness.count(True)
    bad = [c.thread_id for c, live in zip(claims, liveness, strict=True) if live is None]
    problem = f"claims with cells of the wrong type: {bad}" if bad else None
    return Check("claims", not bad, bad, [], problem)


def diagnose_pg(saver: Any) -> Diagnosis:
    """Check a PostgreSQL store: its schema version, every stored row, its claims.

    Every checkpoint, pending write and event of every thread is read back
    as the store's readers read it (checksum first, then decoded with the
    saver's serializer), a page at a time, so this takes as long as reading
    the whole store. A database the schema was never set up in is a finding.

    Args:
        saver: An open `FencedPostgresSaver` (never set up by this call).

    Raises:
        StoreError: the database could not be read (busy, unreachable...).
    """
    from ..postgres.sql import SCHEMA_VERSION
    from .doctor_rows import scan_rows

    try:
        stats = saver.stats()
    except StoreError as exc:
        if not no_schema(exc):
            raise
        problem = "no langgraph-fenced-sqlite schema in this database: run setup() first"
        check = Check("schema_version", False, None, SCHEMA_VERSION, problem)
        return Diagnosis(saver.path, (check,), {"schema_version": None})
    checks = [_schema_check(stats["schema_version"], SCHEMA_VERSION)]
    if not checks[0].ok:  # another schema's rows are not this version's to read or judge
        return Diagnosis(saver.path, tuple(checks), stats)
    read, damage = scan_rows(saver)
    stats["rows_read"] = read
    stats["orphan_writes"] = saver._count_orphan_writes()
    rows_problem: str | None = None
    if damage:
        more = f" (and {len(damage) - 1} more)" if len(damage) > 1 else ""
        rows_problem = f"{len(damage)} stored row(s) do not decode: {damage[0]}{more}"
    checks.append(Check("rows", not damage, damage, [], rows_problem))
    checks.append(_claims_check(saver.claims(), saver.clock.now(), stats))
    sealing = _encryption_check(saver, stats)
    if sealing is not None:
        checks.append(sealing)
    return Diagnosis(saver.path, tuple(checks), stats)
