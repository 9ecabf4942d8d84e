"""The reading half of `FencedSqliteSaver`: history pages and inspection.

Invariant: reads run in one read transaction each and decode outside the
store's lock; inspection never fails a whole call for one row that does not
decode (that row carries an `UndecodableRow` instead). Mixed into
`FencedSqliteSaver`, which provides `_engine` and `serde`.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import CheckpointTuple

from ..core.state_view import CheckpointDiff, diff_channels
from ..core.validation import check_int, check_name
from ..errors import CheckpointNotFound, UndecodableRow
from . import checkpoints as cps
from . import schema
from .claims import Claim, claim_row

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["InspectionAPI", "decode_values", "decode_writes"]

# `list` is a method of the saver this class is mixed into.
_list = builtins.list


class InspectionAPI:
    """History pages (docs/semantics.md §6) and what the CLI shows of a file: checkpoints, diffs."""

    _engine: Engine
    serde: Any

    def history(
        self,
        thread_id: str,
        *,
        checkpoint_ns: str = "",
        before: str | None = None,
        limit: int = 20,
    ) -> _list[CheckpointTuple]:
        """Return one page of a namespace's checkpoints, newest commit first.

        Pass the last id of a page as `before` to get the next page; paging
        so visits every checkpoint exactly once.

        Args:
            thread_id: The thread.
            checkpoint_ns: The namespace ("" is the root graph).
            before: A checkpoint id of this thread; the page starts below it.
            limit: Page size.

        Raises:
            CheckpointNotFound: `before` is not a checkpoint of this thread.
        """
        rows, writes = self._history_page("history", thread_id, checkpoint_ns, before, limit, True)
        return [cps.decode_tuple(self.serde, r, writes[(r[0], r[1], r[2])]) for r in rows]

    async def ahistory(
        self, thread_id: str, *, checkpoint_ns: str = "", before: str | None = None, limit: int = 20
    ) -> _list[CheckpointTuple]:
        """Async twin of `history`."""
        return await self._engine.arun(
            self.history, thread_id, checkpoint_ns=checkpoint_ns, before=before, limit=limit
        )

    def history_records(
        self, thread_id: str, *, checkpoint_ns: str = "", before: str | None = None, limit: int = 20
    ) -> _list[dict[str, Any]]:
        """Return one page of `history` as plain records, decoding no channel values.

        Each record has `checkpoint_ns`, `checkpoint_id`, `parent_checkpoint_id`,
        `position`, `token` (the fencing token that wrote it, None if unfenced),
        `created_at` (store clock), and from the metadata `step`, `source` and
        `run_id`; metadata that does not decode gives an `error` dict instead.

        Raises:
            CheckpointNotFound: `before` is not a checkpoint of this thread.
        """
        rows, _ = self._history_page(
            "history_records", thread_id, checkpoint_ns, before, limit, False
        )
        out = []
        for row in rows:
            _, ns, cid, parent, _, _, _, _, position, token, created_at, _ = row
            record: dict[str, Any] = {
                "checkpoint_ns": ns,
                "checkpoint_id": cid,
                "parent_checkpoint_id": parent,
                "position": position,
                "token": token,
                "created_at": created_at,
            }
            try:
                cps.check_row(row)
                md = cps.decode_metadata(row)
                record.update(step=md.get("step"), source=md.get("source"), run_id=md.get("run_id"))
            except UndecodableRow as exc:
                record["error"] = exc.to_dict()
            out.append(record)
        return out

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
            return rows, (cps.fetch_writes_for(conn, rows) if with_writes else {})

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
            lambda conn: cps.fetch_tuple(conn, thread_id, checkpoint_ns, checkpoint_id),
        )
        if found is None:
            return None
        return shown_checkpoint(self.serde, thread_id, *found)

    def diff_checkpoints(
        self,
        thread_id: str,
        *,
        checkpoint_ns: str = "",
        from_id: str | None = None,
        to_id: str | None = None,
    ) -> CheckpointDiff | None:
        """Compare two checkpoints of a namespace channel by channel (`diff_channels`).

        Args:
            thread_id: The thread.
            checkpoint_ns: The namespace ("" is the root graph).
            from_id: The older checkpoint; default: the parent of `to_id`
                (an empty state for a checkpoint without parent).
            to_id: The newer checkpoint; default: the namespace's latest.

        Returns:
            None if the namespace has no checkpoint (and `to_id` is None).
            A checkpoint that does not decode counts as an empty state, its
            error in `errors`.

        Raises:
            CheckpointNotFound: `from_id` or `to_id` is not stored.
        """
        check_name(thread_id, "thread_id")
        check_name(checkpoint_ns, "checkpoint_ns", allow_empty=True)
        for value, argument in ((from_id, "from_id"), (to_id, "to_id")):
            if value is not None:
                check_name(value, argument)
        new = self.inspect_checkpoint(thread_id, checkpoint_ns=checkpoint_ns, checkpoint_id=to_id)
        if new is None:
            if to_id is not None:
                raise CheckpointNotFound(thread_id, to_id)
            return None
        start = from_id or new["parent_checkpoint_id"]
        old = None
        if start is not None:
            old = self.inspect_checkpoint(
                thread_id, checkpoint_ns=checkpoint_ns, checkpoint_id=start
            )
            if old is None:
                raise CheckpointNotFound(thread_id, start)
        errors = tuple(x["error"] for x in (old, new) if x is not None and x["error"])
        before = ((old or {}).get("checkpoint") or {}).get("channel_values") or {}
        after = (new["checkpoint"] or {}).get("channel_values") or {}
        return CheckpointDiff(
            thread_id,
            checkpoint_ns,
            start,
            new["checkpoint_id"],
            tuple(diff_channels(before, after)),
            errors,
        )


def decode_writes(
    serde: Any, thread_id: str, cid: str, write_rows: Any, only: tuple[str, ...] | None = None
) -> _list[dict[str, Any]]:
    """Decode a checkpoint's writes one by one (a write that does not decode carries `error`).

    Args:
        serde: The store's serializer.
        thread_id: The thread.
        cid: The checkpoint the writes belong to.
        write_rows: The stored rows (`checkpoints.fetch_tuple`'s).
        only: Decode only writes to these channels (None: all).
    """
    out = []
    for w in write_rows:
        task_id, channel, _, _, task_path, idx, _ = w
        if only is not None and channel not in only:
            continue
        write: dict[str, Any] = {
            "task_id": task_id,
            "task_path": task_path,
            "idx": idx,
            "channel": channel,
            "value": None,
            "error": None,
        }
        try:
            write["value"] = cps.decode_write(serde, thread_id, cid, w)
        except UndecodableRow as exc:
            write["error"] = exc.to_dict()
        out.append(write)
    return out


def decode_values(serde: Any, row: Any) -> dict[str, Any] | None:
    """Return a checkpoint row's channel values, or None if it does not decode."""
    try:
        values: dict[str, Any] = cps.decode_tuple(serde, row, []).checkpoint["channel_values"]
    except UndecodableRow:
        return None
    return values


def shown_checkpoint(serde: Any, thread_id: str, row: Any, write_rows: Any) -> dict[str, Any]:
    """Decode a checkpoint row and its writes for display, each on its own
    (`inspect_checkpoint` of both stores, after their fetch): a part that
    does not decode is shown as its error, the rest still shown."""
    cid = row[2]
    out: dict[str, Any] = {
        "thread_id": thread_id,
        "checkpoint_ns": row[1],
        "checkpoint_id": cid,
        "parent_checkpoint_id": row[3],
        "position": row[8],
        "token": row[9],
        "created_at": row[10],
        "checkpoint": None,
        "metadata": None,
        "error": None,
        "writes": [],
    }
    try:
        decoded = cps.decode_tuple(serde, row, [])
        out["checkpoint"], out["metadata"] = decoded.checkpoint, decoded.metadata
    except UndecodableRow as exc:
        out["error"] = exc.to_dict()
        try:
            # Only from a row whose checksum holds: damaged metadata shown
            # as if it were stored would be a different value.
            cps.check_row(row)
            out["metadata"] = cps.decode_metadata(row)
        except UndecodableRow:
            pass
    out["writes"] = decode_writes(serde, thread_id, cid, write_rows)
    return out
