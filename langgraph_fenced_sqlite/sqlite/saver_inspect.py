"""The reading half of `FencedSqliteSaver`: history pages and inspection.

Invariant: reads run in one read transaction each and decode outside the
store's lock; inspection never fails a whole call for one row that does not
decode (that row carries an `UndecodableRow` instead). Mixed into
`FencedSqliteSaver`, which provides `_engine` and `serde`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.claims import Claim, claim_row
from ..core.encryption import encryption_of
from ..core.saver_inspect import (  # noqa: F401 (moved)
    InspectionBase,
    _list,
    decode_values,
    decode_writes,
    shown_checkpoint,
)
from ..core.validation import check_int, check_name
from ..errors import CheckpointNotFound
from . import schema
from .checkpoints import FULL_CELLS, fetch_tuple, fetch_writes_for, resolved

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["InspectionAPI", "decode_values", "decode_writes"]


class InspectionAPI(InspectionBase):
    """History pages (docs/semantics.md §6) and what the CLI shows of a file: checkpoints, diffs."""

    _engine: Engine
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
        check_name(thread_id, "thread_id")
        check_name(checkpoint_ns, "checkpoint_ns", allow_empty=True)
        if before is not None:
            check_name(before, "before")
        size = check_int(limit, "limit", minimum=1)

        def job(conn: Any) -> tuple[_list[Any], dict[Any, Any]]:
            start = 1 << 62
            if before is not None:
                row = conn.execute(
                    schema.GET_POSITION, (thread_id, checkpoint_ns, before)
                ).fetchone()
                if row is None:
                    raise CheckpointNotFound(thread_id, before)
                start = row[0]
            page = (thread_id, checkpoint_ns, start, size)
            rows = [tuple(r) for r in conn.execute(schema.HISTORY_PAGE, page)]
            rows = resolved(conn, rows, FULL_CELLS, strict=False, enc=encryption_of(self.serde))
            return rows, (fetch_writes_for(conn, rows) if with_writes else {})

        return self._engine.read(op, job)

    def claims(self) -> _list[Claim]:
        """Return every current claim, live or expired."""
        rows = self._engine.read("claims", lambda c: c.execute(schema.LIST_CLAIMS).fetchall())
        out = []
        for thread_id, *cells, _ in rows:
            holder, token, expires_at = claim_row(thread_id, *cells)
            out.append(Claim(thread_id, holder or "", token or 0, expires_at or 0.0))
        return out

    def _count_orphan_writes(self) -> int:
        """Count every thread's orphan writes (`lgfs doctor`): what prunes would remove."""
        return int(
            self._engine.read(
                "doctor", lambda c: c.execute(schema.COUNT_ALL_ORPHAN_WRITES).fetchone()[0]
            )
        )

    def stats(self) -> dict[str, Any]:
        """Report the file's pragmas, schema version, counts and integrity.

        `pragmas` maps each name of `schema.PRAGMAS` to the value this
        store's connection has; `journal_mode` and `synchronous` repeat two.
        """

        def job(conn: Any) -> dict[str, Any]:
            threads, checkpoints, writes, evs = conn.execute(schema.TABLE_COUNTS).fetchone()
            return {
                "journal_mode": conn.execute(schema.GET_JOURNAL_MODE).fetchone()[0],
                "synchronous": conn.execute(schema.GET_SYNCHRONOUS).fetchone()[0],
                "schema_version": conn.execute(schema.GET_USER_VERSION).fetchone()[0],
                # Every pragma the engine sets, as this connection has it.
                "pragmas": {
                    name: (conn.execute(schema.get_pragma(name)).fetchone() or (None,))[0]
                    for name, _ in schema.PRAGMAS
                },
                # None when the counter row is missing (a damaged file).
                "token_counter": (conn.execute(schema.GET_TOKEN_COUNTER).fetchone() or (None,))[0],
                "integrity": [r[0] for r in conn.execute(schema.INTEGRITY_CHECK)],
                "threads": threads,
                "checkpoints": checkpoints,
                "writes": writes,
                "events": evs,
            }

        return self._engine.run("stats", job)

    def inspect_checkpoint(
        self, thread_id: str, *, checkpoint_ns: str = "", checkpoint_id: str | None = None
    ) -> dict[str, Any] | None:
        """Read one checkpoint for display, decoding its row and each write on its own.

        Unlike `get_tuple`, a row that does not decode does not fail the call:
        its entry carries an `error` (an `UndecodableRow` as a dict) instead.

        Args:
            thread_id: The thread.
            checkpoint_ns: The namespace ("" is the root graph).
            checkpoint_id: The checkpoint; the latest (commit order) if None.

        Returns:
            None if there is no such checkpoint, else a dict with
            `checkpoint_ns`, `checkpoint_id`, `parent_checkpoint_id`,
            `position`, `token`, `created_at`, `checkpoint` (the decoded
            `Checkpoint`, or None), `metadata`, `error`, and `writes`: dicts
            with `task_id`, `task_path`, `idx`, `channel`, `value` and `error`.
        """
        check_name(thread_id, "thread_id")
        check_name(checkpoint_ns, "checkpoint_ns", allow_empty=True)
        if checkpoint_id is not None:
            check_name(checkpoint_id, "checkpoint_id")
        found = self._engine.read(
            "inspect_checkpoint",
            lambda conn: fetch_tuple(
                conn, thread_id, checkpoint_ns, checkpoint_id, enc=encryption_of(self.serde)
            ),
        )
        if found is None:
            return None
        return shown_checkpoint(self.serde, thread_id, *found)
