"""Copy whole threads between fenced stores: SQLite to PostgreSQL and back.

Invariant: the source is only read, and the target is written only through
its public `put` / `put_writes`, unfenced, one thread at a time, each
checkpoint after its parent and each namespace's latest (by commit) last, so
the target's `list` and `get_tuple` read back what the source's do. A thread
is checked whole before its first write: a live claim on the source raises
`ThreadBusy` (for every thread, before anything is written), and a target
thread whose history is not a prefix of the source's is refused and named
in the report, never merged. A rerun puts nothing: checkpoints and write
batches already in the target are skipped (an identical `put` is a no-op
anyway, and special-channel writes would log a new event).

Not carried: the event log (the target numbers its own events from the
copy's commits), claims and runs (the target thread is unclaimed), positions
beyond their order, and the run id of pending writes (the public read API
does not return it; `delete_for_runs` on the target still finds the copied
checkpoints by their metadata's `run_id`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from langgraph.checkpoint.base import CheckpointTuple

from ..clock import read_now
from ..core.fenced_store import FencedStore
from ..core.validation import check_bool, check_iterable, check_name
from ..errors import SerializationError, ThreadBusy, UndecodableRow, bad_argument
from ..sqlite.saver import FencedSqliteSaver
from .importer import _already_stored, _batches, _parents_first

__all__ = ["CopyReport", "copy_threads"]

# One write as read back: (task_id, task_path, idx, channel, value).
_Write = tuple[str, str, int, str, Any]
_Key = tuple[str, str]  # (checkpoint_ns, checkpoint_id)


@dataclass(frozen=True)
class CopyReport:
    """What `copy_threads` did.

    Attributes:
        source: Where the threads were read (`saver.path`).
        target: Where they were written.
        threads: Threads the target now holds whole (copied now or already).
        checkpoints: Checkpoints put by this call (none on a rerun).
        writes: Pending writes put by this call.
        unchanged: Of `threads`, those the target already held whole.
        refused: Threads not touched, each `{"thread_id", "reason"}`: the
            target holds a different history or a live claim, or a source
            row does not decode (or would not store in the target).
    """

    source: str
    target: str
    threads: int
    checkpoints: int
    writes: int
    unchanged: int
    refused: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Return the report as a JSON-ready dict."""
        return asdict(self)


def copy_threads(
    source: Any,
    target: Any,
    thread_ids: Iterable[str] | None = None,
    *,
    ignore_claims: bool = False,
) -> CopyReport:
    """Copy whole threads from one fenced store into another (SQLite or PostgreSQL).

    Every namespace, every checkpoint with its metadata and parent, and every
    pending write with its task id, task path and place (special channels
    such as `__interrupt__` too) is copied, so the target's `list()` gives
    the same checkpoints in the same order and its `get_tuple` the same
    latest. Copy while nobody writes the threads; rerunning it (after an
    interruption too) is safe and puts only what is missing.

    The event log is not carried (the target's starts with the copy's own
    commits), nor are claims, runs, or the run id of pending writes.

    Args:
        source: A `FencedSqliteSaver` or `FencedPostgresSaver`; only read.
        target: Another one (a different store); written unfenced.
        thread_ids: The threads to copy; None copies every thread of the
            source. A thread the source does not have is refused in the report.
        ignore_claims: Copy threads the source has a live claim on (by
            default that raises `ThreadBusy`: a worker is still writing it).

    Returns:
        The counts, and the threads refused with the reason.

    Raises:
        InvalidArgument: an argument is wrong (the message names it), or the
            target requires a claim for every write; nothing is written.
        ThreadBusy: a thread has a live claim on the source, and
            `ignore_claims` is False; nothing is written.
    """
    for name, saver in (("source", source), ("target", target)):
        if not isinstance(saver, FencedStore):
            raise bad_argument(
                name,
                f"expected a FencedSqliteSaver or FencedPostgresSaver, got {type(saver).__name__}",
            )
        if saver.closed:
            raise bad_argument(name, "the store is closed")
    if target.require_claim:
        raise bad_argument(
            "target", "requires a claim for every write; open it with require_claim=False to copy"
        )
    if source is target or _same_file(source, target):
        raise bad_argument("target", f"is the source store ({source.path}); copy between two")
    check_bool(ignore_claims, "ignore_claims")
    if thread_ids is None:
        ids = _thread_ids(source)
    else:
        given = [check_name(t, "thread_ids[]") for t in check_iterable(thread_ids, "thread_ids")]
        ids = list(dict.fromkeys(given))
    if not ignore_claims:
        now = read_now(source.clock)
        for thread_id in ids:
            claim = source.current_claim(thread_id)
            if claim is not None and claim.live(now):
                raise ThreadBusy(
                    thread_id,
                    claim.holder,
                    message=f"thread {thread_id!r} is claimed on the source by "
                    f"{claim.holder!r}, so a worker may still be writing it; nothing was copied "
                    "(ignore_claims=True, `lgfs copy-to --ignore-claims`, copies it all the same)",
                )
    copier = _Copier(source, target)
    for thread_id in ids:
        copier.thread(thread_id)
    return CopyReport(
        source.path,
        target.path,
        copier.threads,
        copier.checkpoints,
        copier.writes,
        copier.unchanged,
        tuple(copier.refused),
    )


def _same_file(a: Any, b: Any) -> bool:
    # Two PostgreSQL stores may share a server and database (in different
    # schemas), so only SQLite files are compared, by their real path.
    if not (isinstance(a, FencedSqliteSaver) and isinstance(b, FencedSqliteSaver)):
        return False
    return os.path.realpath(a.path) == os.path.realpath(b.path)


def _thread_ids(saver: Any) -> list[str]:
    """Every thread with a checkpoint, in id order."""
    if isinstance(saver, FencedSqliteSaver):
        # A thread that was only ever claimed has nothing to copy.
        return sorted(t["thread_id"] for t in saver.threads() if t["checkpoints"])
    return sorted({t.config["configurable"]["thread_id"] for t in saver.list(None)})


def _writes(saver: Any, thread_id: str, ns: str, cid: str) -> list[_Write]:
    """One checkpoint's pending writes with the task path and idx `list` leaves out.

    Read through the stores' public `pending_writes` (the fetch `get_tuple`
    uses), decoded and checksum-checked by the shared `checkpoints.decode_write`.
    """
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}}
    return [tuple(w) for w in saver.pending_writes(config)]


def _history(saver: Any, thread_id: str) -> dict[_Key, CheckpointTuple]:
    found: dict[_Key, CheckpointTuple] = {}
    for tup in saver.list({"configurable": {"thread_id": thread_id}}):
        conf = tup.config["configurable"]
        found[(conf["checkpoint_ns"], conf["checkpoint_id"])] = tup
    return found


def _parent_id(tup: CheckpointTuple) -> str | None:
    return None if tup.parent_config is None else tup.parent_config["configurable"]["checkpoint_id"]


def _same(a: CheckpointTuple, b: CheckpointTuple) -> bool:
    return (a.checkpoint, a.metadata, _parent_id(a)) == (b.checkpoint, b.metadata, _parent_id(b))


class _Copier:
    def __init__(self, source: Any, target: Any) -> None:
        self.source, self.target = source, target
        self.threads = self.checkpoints = self.writes = self.unchanged = 0
        self.refused: list[dict[str, Any]] = []

    def refuse(self, thread_id: str, reason: str) -> None:
        self.refused.append({"thread_id": thread_id, "reason": reason})

    def thread(self, thread_id: str) -> None:
        try:
            # Read and prove the whole thread before its first put: a row that
            # fails halfway must not leave half a thread behind.
            src = _history(self.source, thread_id)
            src_writes = {k: _writes(self.source, thread_id, *k) for k in src}
            for key, tup in src.items():
                self.target.serde.dumps_typed(tup.checkpoint["channel_values"])
                for write in src_writes[key]:
                    self.target.serde.dumps_typed(write[4])
        except (UndecodableRow, SerializationError) as exc:
            return self.refuse(thread_id, f"the source thread does not copy: {exc}")
        if not src:
            return self.refuse(thread_id, "the source has no such thread")
        dst = _history(self.target, thread_id)
        claim = self.target.current_claim(thread_id)
        if claim is not None and claim.live(read_now(self.target.clock)):
            return self.refuse(thread_id, f"the target has a live claim by {claim.holder!r}")
        dst_writes = {k: _writes(self.target, thread_id, *k) for k in dst}
        for key, tup in dst.items():
            if key not in src or not _same(src[key], tup):
                what = "holds" if key not in src else "differs at"
                ns = f" (namespace {key[0]!r})" if key[0] else ""
                return self.refuse(
                    thread_id,
                    f"the target {what} checkpoint {key[1]!r}{ns}: a different history",
                )
            theirs = [_without_idx(w) for w in src_writes[key]]
            if any(_without_idx(w) not in theirs for w in dst_writes[key]):
                return self.refuse(
                    thread_id, f"the target has other pending writes on checkpoint {key[1]!r}"
                )
        before = (self.checkpoints, self.writes)
        for key in self._order(thread_id, src):
            if key not in dst:
                self._put(thread_id, src[key])
            self._put_writes(thread_id, key, src_writes[key], dst_writes.get(key, []))
        self.threads += 1
        if (self.checkpoints, self.writes) == before:
            self.unchanged += 1
        return None

    def _order(self, thread_id: str, src: dict[_Key, CheckpointTuple]) -> list[_Key]:
        """Parents first in id order, each namespace's latest (by commit) last."""
        keys = sorted((ns, cid, _parent_id(t)) for (ns, cid), t in src.items())
        keys.sort(key=lambda k: k[1])
        order = list(_parents_first(keys))
        for ns in sorted({ns for ns, _ in src}):
            latest = self.source.get_tuple(
                {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}}
            )
            key = (ns, latest.config["configurable"]["checkpoint_id"]) if latest else None
            if key in order and key != [k for k in order if k[0] == ns][-1]:
                order.remove(key)
                order.append(key)
        return order

    def _put(self, thread_id: str, tup: CheckpointTuple) -> None:
        ns = tup.config["configurable"]["checkpoint_ns"]
        conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
        parent = _parent_id(tup)
        if parent:
            conf["checkpoint_id"] = parent
        self.target.put({"configurable": conf}, tup.checkpoint, tup.metadata, {})
        self.checkpoints += 1

    def _put_writes(
        self, thread_id: str, key: _Key, writes: list[_Write], stored: list[_Write]
    ) -> None:
        ns, cid = key
        config = {
            "configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}
        }
        have = {(task_id, idx): (channel, value) for task_id, _, idx, channel, value in stored}
        groups: dict[tuple[str, str], list[tuple[int, str, Any]]] = {}
        for task_id, task_path, idx, channel, value in writes:
            groups.setdefault((task_id, task_path), []).append((idx, channel, value))
        for (task_id, task_path), group in groups.items():
            for batch in _batches(group):
                if _already_stored(batch, task_id, have):
                    continue
                self.target.put_writes(config, batch, task_id, task_path)
                self.writes += len(batch)


def _without_idx(write: _Write) -> tuple[str, str, str, Any]:
    # `_batches` may close gaps in a task's idx, so compare writes without it.
    return write[0], write[1], write[3], write[4]
