"""The reading half of `FencedSqliteSaver`: history pages and inspection.

Invariant: reads run in one read transaction each and decode outside the
store's lock; inspection never fails a whole call for one row that does not
decode (that row carries an `UndecodableRow` instead). Mixed into
`FencedSqliteSaver`, which provides `_engine` and `serde`.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import CheckpointTuple

from . import checkpoints as cps
from . import claims, schema
from .claims import Claim, claim_row
from .clock import read_now, to_seconds
from .errors import CheckpointNotFound, UndecodableRow, bad_argument
from .validation import check_int, check_iterable, check_name

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["THREAD_STATES", "InspectionAPI", "ThreadStatus"]

# `list` is a method of the saver this class is mixed into.
_list = builtins.list

# What `thread_status` can say; "unknown" only for a thread whose rows are damaged.
THREAD_STATES = ("idle", "running", "interrupted", "failed", "unknown")
_FAILED = ("run_failed", "run_timed_out")


@dataclasses.dataclass(frozen=True)
class ThreadStatus:
    """What a thread is doing, as an operator asks it (`lgfs threads` STATUS).

    The judgement, in order (the first that holds decides):

    - `running`: the thread has a live claim (`holder` and `expires_at` say
      whose, and until when);
    - `interrupted`: the latest root checkpoint has a pending interrupt
      (`node` is the node waiting; for an interrupt inside a subgraph, the
      parent's node that runs it), or the last run ended `run_interrupted`
      (a static `interrupt_before/after`);
    - `failed`: the last run ended `run_failed` (or timed out), or it began
      and never ended while its claim ran out (a crashed worker); `reason`
      says which. An ended run stops counting once a root checkpoint is
      committed after its end (the thread was run again without a runner);
    - `idle`: anything else: never run under a runner, completed, cancelled,
      or stopped by an operator (`claims release`).

    A thread whose rows do not decode is `unknown` (with the error as
    `reason`); the other threads are judged as usual.

    Attributes:
        state: One of `THREAD_STATES`.
        holder: The claim's holder, live or expired (None without a claim).
        expires_at: When that claim stops (or stopped) being live (store clock).
        node: The node an interrupted thread waits at, else None.
        reason: Why a thread is `failed` (the run's error) or `unknown`.
        run_id: The run its last lifecycle event names, if any.
    """

    state: str
    holder: str | None = None
    expires_at: float | None = None
    node: str | None = None
    reason: str | None = None
    run_id: str | None = None


def _node_of(task_path: Any) -> str | None:
    # LangGraph's task paths: "~__pregel_pull, NODE" for a node's own task;
    # anything else (a `Send`) is shown as it is stored.
    if not isinstance(task_path, str) or not task_path:
        return None
    parts = task_path.split(", ")
    return parts[1] if parts[0] == "~__pregel_pull" and len(parts) > 1 else task_path


def _data(raw: Any) -> dict[str, Any]:
    # Only words for an operator are taken from it: a damaged cell says nothing.
    try:
        data = json.loads(raw) if isinstance(raw, str) else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _status_in(conn: Any, thread_id: str, now: float) -> ThreadStatus:
    """Judge one thread's status (see `ThreadStatus`) inside a read transaction."""
    try:
        row = claims.read_thread(conn, thread_id)
    except UndecodableRow as exc:
        return ThreadStatus("unknown", reason=str(exc))
    holder = None if row is None or row.token is None else row.holder
    expires = None if row is None or row.token is None else row.expires_at
    if row is not None and row.live(now):
        return ThreadStatus("running", holder, expires, run_id=row.run_id)
    last = conn.execute(schema.LAST_RUN_EVENT, (thread_id,)).fetchone()
    kind, data = (None, {}) if last is None else (last[1], _data(last[2]))
    run_id = data.get("run_id") if isinstance(data.get("run_id"), str) else None
    paths = [r[0] for r in conn.execute(schema.LATEST_ROOT_INTERRUPTS, (thread_id,))]
    if paths:
        node = _node_of(paths[0])
        return ThreadStatus("interrupted", holder, expires, node=node, run_id=run_id)
    if kind in ("run_interrupted", *_FAILED):
        # An ended run describes the thread until a root checkpoint is
        # committed after it (a later plain `invoke`): positions are seqs.
        (latest,) = conn.execute(schema.LATEST_ROOT_POSITION, (thread_id,)).fetchone()
        if isinstance(latest, int) and latest > last[0]:
            kind = None
    if kind == "run_interrupted":
        return ThreadStatus("interrupted", holder, expires, run_id=run_id)
    if kind in _FAILED:
        why = ": ".join(str(data[k]) for k in ("error", "message") if data.get(k)) or kind
        return ThreadStatus("failed", holder, expires, reason=why, run_id=run_id)
    if kind == "run_started" and row is not None and row.token is not None:
        # Begun, never ended, and its claim ran out: the worker is gone.
        why = f"the run never ended and its claim (holder {holder!r}) expired"
        return ThreadStatus("failed", holder, expires, reason=why, run_id=run_id)
    return ThreadStatus("idle", holder, expires, run_id=run_id)


def last_activity(last_checkpoint_at: Any, last_event_at: Any) -> float:
    """Return when a thread was last written: its newest checkpoint or event (0.0 if never).

    The one definition of activity, for `threads(inactive_for=...)` and for
    `sweep(inactive_for=...)`; a damaged (non-numeric) cell counts as never.
    """
    return max((x for x in (last_checkpoint_at, last_event_at, 0.0) if _number(x)), default=0.0)


def inactive_for_seconds(inactive_for: float | timedelta | None) -> float | None:
    """Check an `inactive_for` argument; return it in seconds (None for no filter)."""
    return None if inactive_for is None else to_seconds(inactive_for, "inactive_for")


def _states(status: str | Iterable[str] | None) -> set[str] | None:
    if status is None:
        return None
    wanted = [status] if isinstance(status, str) else check_iterable(status, "status")
    for state in wanted:
        if state not in THREAD_STATES:
            raise bad_argument("status", f"expected one of {THREAD_STATES}, got {state!r}")
    return set(wanted)


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

    def threads(
        self,
        *,
        status: str | Iterable[str] | None = None,
        inactive_for: float | timedelta | None = None,
    ) -> _list[dict[str, Any]]:
        """Summarise every thread: counts, namespaces, latest step, claim, events, floor, status.

        Each summary also has `error`: None, or (an `UndecodableRow` as a dict)
        when a cell of the thread's rows holds a value of the wrong type; the
        other threads are summarised as usual. `status` is the thread's
        `ThreadStatus` as a dict (`state`, `holder`, `expires_at`, `node`,
        `reason`, `run_id`); all summaries come from one snapshot.

        Args:
            status: Only threads in this state (or these states), of `THREAD_STATES`.
            inactive_for: Only threads not written for at least this long
                (seconds or a timedelta, by the store's clock): no checkpoint
                and no event newer than that.
        """
        states = _states(status)
        idle_for = inactive_for_seconds(inactive_for)

        def job(conn: Any) -> _list[dict[str, Any]]:
            now = read_now(self._engine.clock)
            out = []
            for summary in _thread_summaries(conn):
                if idle_for is not None and summary["last_activity"] > now - idle_for:
                    continue
                judged = _status_in(conn, summary["thread_id"], now)
                if states is not None and judged.state not in states:
                    continue
                out.append({**summary, "status": dataclasses.asdict(judged)})
            return out

        return self._engine.read("threads", job)

    def thread_status(self, thread_id: str) -> ThreadStatus:
        """Judge what a thread is doing: idle, running, interrupted or failed (see `ThreadStatus`).

        An unknown thread is `idle`.
        """
        check_name(thread_id, "thread_id")
        return self._engine.read(
            "thread_status",
            lambda c: _status_in(c, thread_id, read_now(self._engine.clock)),
        )

    async def athread_status(self, thread_id: str) -> ThreadStatus:
        """Async twin of `thread_status`."""
        return await self._engine.arun(self.thread_status, thread_id)

    def namespaces(self, thread_id: str) -> _list[str]:
        """Return the checkpoint namespaces a thread has checkpoints in, sorted ("" first)."""
        check_name(thread_id, "thread_id")
        return self._engine.read(
            "namespaces",
            lambda c: [r[0] for r in c.execute(schema.THREAD_NAMESPACES, (thread_id,))],
        )

    def resolve_namespace(self, thread_id: str, prefix: str) -> str:
        """Return the one namespace of a thread that is `prefix` or starts with it.

        An exact match wins, and "" is always the root graph's; otherwise
        exactly one namespace must start with `prefix`, e.g. `agent` for
        `agent:<uuid>`.

        Raises:
            InvalidArgument: (`checkpoint_ns`) none or several match; the
                message lists the thread's namespaces.
        """
        check_name(prefix, "checkpoint_ns", allow_empty=True)
        found = self.namespaces(thread_id)
        if prefix in found or prefix == "":
            return prefix  # the root graph's namespace, even before its first checkpoint
        matches = [ns for ns in found if ns.startswith(prefix)]
        if len(matches) == 1:
            return matches[0]
        listed = ", ".join(repr(ns) for ns in (matches or found)) or "(none)"
        what = "several namespaces start with" if matches else "no namespace starts with"
        which = "these match" if matches else "its namespaces"
        raise bad_argument(
            "checkpoint_ns", f"thread {thread_id!r}: {what} {prefix!r}; {which}: {listed}"
        )

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
                "last_activity": last_activity(last_cp, last_ev),
                "claim": claim,
                "events": n_events,
                "floor": floor,
                "next_seq": next_seq,
                "error": error,
            }
        )
    out.sort(key=lambda t: t["last_activity"], reverse=True)
    return out
