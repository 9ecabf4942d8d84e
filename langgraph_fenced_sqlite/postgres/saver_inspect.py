"""The reading half of `FencedPostgresSaver`: history pages, inspection, the claims list.

Invariant: each read runs in one transaction that sees one snapshot
(`read_snapshot`: REPEATABLE READ, READ ONLY), as the SQLite store's read
transaction does, and decodes outside it with the shared decoders; so a
page and its writes, or a checkpoint and its writes, are of one moment even
while hosts commit. Where a method's logic does not touch the store, it is
`core/saver_inspect.py`'s, inherited (`STORE_NEUTRAL`: `history`,
`history_records`, `diff_checkpoints`...), so both stores page, validate and
report alike; only the reading (`_history_page`, `inspect_checkpoint`'s
fetch) is this store's.
Mixed into `FencedPostgresSaver`, which provides `_engine` and `serde`.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any, TypeVar

from ..core.claims import Claim, claim_row
from ..core.encryption import encryption_of
from ..core.saver_inspect import InspectionBase, shown_checkpoint
from ..core.validation import check_int, check_name
from ..errors import CheckpointNotFound
from . import sql, txns
from .connection import PgConnection
from .values import resolved

__all__ = ["STORE_NEUTRAL", "PgInspectionAPI", "read_snapshot"]

T = TypeVar("T")
Cursor = Any
# `list` is a method of the saver this class is mixed into.
_list = builtins.list
# Above every position a commit can take: the first page starts below it.
_TOP = 1 << 62


def read_snapshot(engine: PgConnection, op: str, job: Callable[[Cursor], T]) -> T:
    """Run `job(cursor)` in one read-only transaction whose statements share one snapshot."""

    def snapshot_job(cur: Cursor) -> T:
        cur.execute(sql.SNAPSHOT_IN_TRANSACTION)  # must be the transaction's first statement
        return job(cur)

    return engine.run(op, snapshot_job, read_only=True)


# Methods of `InspectionBase` (core/) this class inherits as they are: they validate, page
# and compare without touching the store, reading only through `_history_page`
# or `inspect_checkpoint` (ahistory hops with `_engine.arun`, which both stores
# have). Every other method is this class's own (`stats` is the saver's);
# tests/postgres/test_postgres_inspect.py checks that nothing else is inherited.
STORE_NEUTRAL = ("history", "ahistory", "history_records", "diff_checkpoints")


class PgInspectionAPI(InspectionBase):
    """History pages (docs/semantics.md §6), inspection and the claims list, on PostgreSQL."""

    _engine: PgConnection
    serde: Any

    def _history_page(
        self,
        op: str,
        thread_id: str,
        checkpoint_ns: str,
        before: str | None,
        limit: int,
        with_writes: bool,
    ) -> tuple[_list[Any], dict[Any, Any]]:
        """Read one page of `history` (and its writes) in one snapshot, as the SQLite saver's.

        Raises:
            CheckpointNotFound: `before` is not a checkpoint of this thread and namespace.
        """
        check_name(thread_id, "thread_id")
        check_name(checkpoint_ns, "checkpoint_ns", allow_empty=True)
        if before is not None:
            check_name(before, "before")
        size = check_int(limit, "limit", minimum=1)
        key = {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns}

        def job(cur: Cursor) -> tuple[_list[Any], dict[Any, Any]]:
            start = _TOP
            if before is not None:
                cur.execute(sql.GET_POSITION, {**key, "checkpoint_id": before})
                row = cur.fetchone()
                if row is None:
                    raise CheckpointNotFound(thread_id, before)
                start = int(row[0])
            cur.execute(sql.HISTORY_PAGE, {**key, "start": start, "limit": size})
            # A display read: a row whose value rows are missing or damaged
            # names why (`values.REFS_ERROR`), and does not stop the page.
            rows = resolved(
                cur, [tuple(r) for r in cur.fetchall()], strict=False, enc=encryption_of(self.serde)
            )
            return rows, (txns.fetch_writes_for(cur, rows) if with_writes else {})

        return read_snapshot(self._engine, op, job)

    def _count_orphan_writes(self) -> int:
        """Count every thread's orphan writes (`lgfs doctor`): what prunes would remove."""
        return int(
            self._engine.run(
                "doctor",
                lambda cur: txns._one(cur, sql.COUNT_ALL_ORPHAN_WRITES, {})[0],
                read_only=True,
            )
        )

    def claims(self) -> _list[Claim]:
        """Return every current claim, live or expired, by thread id."""
        rows = self._engine.run(
            "claims", lambda cur: cur.execute(sql.LIST_CLAIMS).fetchall(), read_only=True
        )
        out = []
        for thread_id, *cells, _ in rows:
            holder, token, expires_at = claim_row(thread_id, *cells)
            out.append(Claim(thread_id, holder or "", token or 0, expires_at or 0.0))
        return out

    def inspect_checkpoint(
        self, thread_id: str, *, checkpoint_ns: str = "", checkpoint_id: str | None = None
    ) -> dict[str, Any] | None:
        """Read one checkpoint for display, decoding its row and each write on its own.

        As `FencedSqliteSaver.inspect_checkpoint`: a row that does not decode
        does not fail the call; its entry carries an `error` (an
        `UndecodableRow` as a dict) instead.

        Args:
            thread_id: The thread.
            checkpoint_ns: The namespace ("" is the root graph).
            checkpoint_id: The checkpoint; the latest (commit order) if None.

        Returns:
            None if there is no such checkpoint, else a dict with
            `thread_id`, `checkpoint_ns`, `checkpoint_id`,
            `parent_checkpoint_id`, `position`, `token`, `created_at`,
            `checkpoint` (the decoded `Checkpoint`, or None), `metadata`,
            `error`, and `writes`: dicts with `task_id`, `task_path`, `idx`,
            `channel`, `value` and `error`.
        """
        check_name(thread_id, "thread_id")
        check_name(checkpoint_ns, "checkpoint_ns", allow_empty=True)
        if checkpoint_id is not None:
            check_name(checkpoint_id, "checkpoint_id")

        def job(cur: Cursor) -> tuple[Any, _list[Any]] | None:
            found = txns.fetch_tuple(cur, thread_id, checkpoint_ns, checkpoint_id)
            if found is None:
                return None
            enc = encryption_of(self.serde)
            return resolved(cur, [found[0]], strict=False, enc=enc)[0], found[1]

        found = read_snapshot(self._engine, "inspect_checkpoint", job)
        if found is None:
            return None
        return shown_checkpoint(self.serde, thread_id, *found)
