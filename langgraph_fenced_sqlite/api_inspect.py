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

from . import checkpoints as cps
from . import schema
from .claims import Claim, claim_row
from .errors import CheckpointNotFound, UndecodableRow
from .validation import check_int, check_name

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["InspectionAPI"]

# `list` is a method of the saver this class is mixed into.
_list = builtins.list


class InspectionAPI:
    """History pages (docs/semantics.md §6) and what the CLI shows of a file."""

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

    def threads(self) -> _list[dict[str, Any]]:
        """Summarise every thread: counts, namespaces, latest step, claim, events, floor.

        Each summary also has `error`: None, or (an `UndecodableRow` as a dict)
        when a cell of the thread's rows holds a value of the wrong type; the
        other threads are summarised as usual.
        """
        return self._engine.read("threads", _thread_summaries)

    def claims(self) -> _list[Claim]:
        """Return every current claim, live or expired."""
        rows = self._engine.read("claims", lambda c: c.execute(schema.LIST_CLAIMS).fetchall())
        out = []
        for thread_id, *cells, _ in rows:
            holder, token, expires_at = claim_row(thread_id, *cells)
            out.append(Claim(thread_id, holder or "", token or 0, expires_at or 0.0))
        return out

    def stats(self) -> dict[str, Any]:
        """Report the file's pragmas, schema version, counts and integrity."""

        def job(conn: Any) -> dict[str, Any]:
            threads, checkpoints, writes, evs = conn.execute(schema.TABLE_COUNTS).fetchone()
            return {
                "journal_mode": conn.execute(schema.GET_JOURNAL_MODE).fetchone()[0],
                "synchronous": conn.execute(schema.GET_SYNCHRONOUS).fetchone()[0],
                "schema_version": conn.execute(schema.GET_USER_VERSION).fetchone()[0],
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
        row, write_rows = found
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
            decoded = cps.decode_tuple(self.serde, row, [])
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
        for w in write_rows:
            task_id, channel, _, _, task_path, idx, _ = w
            write: dict[str, Any] = {
                "task_id": task_id,
                "task_path": task_path,
                "idx": idx,
                "channel": channel,
                "value": None,
                "error": None,
            }
            try:
                write["value"] = cps.decode_write(self.serde, thread_id, cid, w)
            except UndecodableRow as exc:
                write["error"] = exc.to_dict()
            out["writes"].append(write)
        return out


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _thread_summaries(conn: Any) -> list[dict[str, Any]]:
    out = []
    for row in conn.execute(schema.THREAD_SUMMARIES):
        (
            thread_id,
            holder,
            token,
            expires_at,
            floor,
            next_seq,
            count,
            namespaces,
            n_events,
            last_cp,
            step,
            last_ev,
        ) = row
        # A damaged cell (text in an integer column...) must not fail the whole
        # listing, nor be shown as if it were data: the summary carries an error.
        numbers = {"floor": floor, "next_seq": next_seq, "checkpoints": count, "events": n_events}
        numbers.update(last_checkpoint_at=last_cp, last_event_at=last_ev)
        optional = {"token": token, "expires_at": expires_at, "latest_step": step}
        bad = [k for k, v in numbers.items() if v is not None and not _number(v)]
        bad += [k for k, v in optional.items() if v is not None and not _number(v)]
        if not isinstance(thread_id, str) or not isinstance(namespaces, (str, type(None))):
            bad.append("thread_id" if not isinstance(thread_id, str) else "namespaces")
        error = None
        if bad:
            every = {**numbers, **optional, "thread_id": thread_id, "namespaces": namespaces}
            cells = ", ".join(f"{k}={every[k]!r}" for k in bad)
            reason = f"thread row holds cells of the wrong type: {cells}"
            error = UndecodableRow(str(thread_id), None, reason).to_dict()
        claim = None
        if token is not None:
            claim = {"holder": holder, "token": token, "expires_at": expires_at}
        out.append(
            {
                "thread_id": thread_id,
                "checkpoints": count,
                "namespaces": sorted(str(namespaces or "").split(",")) if count else [],
                "latest_step": step,
                "last_activity": max(
                    (x for x in (last_cp, last_ev, 0.0) if _number(x)), default=0.0
                ),
                "claim": claim,
                "events": n_events,
                "floor": floor,
                "next_seq": next_seq,
                "error": error,
            }
        )
    out.sort(key=lambda t: t["last_activity"], reverse=True)
    return out
