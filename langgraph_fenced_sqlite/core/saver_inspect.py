"""What both stores show of their history: pages, records, diffs, decoded checkpoints.

Invariant: these methods validate, page and compare without touching the
store, reading only through `_history_page` and `inspect_checkpoint` (each
store's, one read transaction or snapshot each); inspection never fails a
whole call for one row that does not decode (that row carries an
`UndecodableRow` instead).
"""

from __future__ import annotations

import builtins
from typing import Any

from langgraph.checkpoint.base import CheckpointTuple

from ..errors import CheckpointNotFound, UndecodableRow
from . import checkpoints as cps
from .state_view import CheckpointDiff, diff_channels
from .store import UsesStore
from .validation import check_name

__all__ = ["InspectionBase", "decode_values", "decode_writes", "shown_checkpoint"]


class InspectionBase(UsesStore):
    """History pages (docs/semantics.md §6) and checkpoint diffs, over a store's page reads."""

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
        """Read one page of `history` and its writes (the store's)."""
        raise NotImplementedError

    def inspect_checkpoint(
        self, thread_id: str, *, checkpoint_ns: str = "", checkpoint_id: str | None = None
    ) -> dict[str, Any] | None:
        """Read one checkpoint for display, decoding its row and each write on its own.

        Each store's own (one snapshot)."""
        raise NotImplementedError

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


# `list` is a method of the saver this class is mixed into.
_list = builtins.list


def decode_writes(
    serde: Any,
    thread_id: str,
    cid: str,
    write_rows: Any,
    only: tuple[str, ...] | None = None,
    values: tuple[Any, Any] | None = None,
) -> _list[dict[str, Any]]:
    """Decode a checkpoint's writes one by one (a write that does not decode carries `error`).

    Args:
        serde: The store's serializer.
        thread_id: The thread.
        cid: The checkpoint the writes belong to.
        write_rows: The stored rows (`checkpoints.fetch_tuple`'s).
        only: Decode only writes to these channels (None: all).
        values: The checkpoint row's `(values_type, values_blob)`, its
            values inline (`value_reads.resolve_rows`): what a write stored as a
            slice of them is read from.
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
            write["value"] = cps.decode_write(serde, thread_id, cid, w, values)
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
    out["writes"] = decode_writes(serde, thread_id, cid, write_rows, values=(row[5], row[6]))
    return out
