"""The threads of a file: summaries, namespaces and statuses.

Invariant: a thread's status is `status.judge`'s, from facts read in the same
read transaction as its summary (`threads()` reads every thread's in one
snapshot), decoded outside the store's lock; nothing here decides a state.
Activity (`last_activity`) is defined here once, for `threads(inactive_for=)`
and for sweeps. Mixed into `FencedSqliteSaver`, which provides `_engine` and
`serde`.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..clock import read_now, to_seconds
from ..core import status
from ..core.status import ThreadStatus, check_states
from ..core.validation import check_name
from ..errors import ReplayUnavailable, UndecodableRow, bad_argument
from . import checkpoints as cps
from . import events, schema
from .claims import read_thread
from .saver_inspect import decode_values, decode_writes

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["ThreadsAPI", "inactive_for_seconds", "last_activity"]

# `list` is a method of the saver this class is mixed into.
_list = builtins.list


def last_activity(last_checkpoint_at: Any, last_event_at: Any) -> float:
    """Return when a thread was last written: its newest checkpoint or event (0.0 if never).

    The one definition of activity, for `threads(inactive_for=...)` and for
    `sweep(inactive_for=...)`; a damaged (non-numeric) cell counts as never.
    """
    return max((x for x in (last_checkpoint_at, last_event_at, 0.0) if _number(x)), default=0.0)


def inactive_for_seconds(inactive_for: float | timedelta | None) -> float | None:
    """Check an `inactive_for` argument; return it in seconds (None for no filter)."""
    return None if inactive_for is None else to_seconds(inactive_for, "inactive_for")


class ThreadsAPI:
    """What a file's threads are: summaries, statuses (`status.judge`) and namespaces."""

    _engine: Engine
    serde: Any

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
        `ThreadStatus` as `ThreadStatus.to_dict` gives it (`state`, `holder`,
        `expires_at`, `node`, `reason`, `run_id`, `waiting`, `failure`...);
        all summaries come from one snapshot.

        Args:
            status: Only threads in this state (or these states), of `THREAD_STATES`.
            inactive_for: Only threads not written for at least this long
                (seconds or a timedelta, by the store's clock): no checkpoint
                and no event newer than that.
        """
        states = check_states(status)  # `status` is the argument here, not the module
        idle_for = inactive_for_seconds(inactive_for)

        def job(conn: Any) -> tuple[float, _list[tuple[dict[str, Any], Any]]]:
            now = read_now(self._engine.clock)
            found = []
            for summary in _summaries(conn.execute(schema.THREAD_SUMMARIES)):
                if idle_for is not None and summary["last_activity"] > now - idle_for:
                    continue
                found.append((summary, _status_facts(conn, summary["thread_id"])))
            return now, found

        now, found = self._engine.read("threads", job)
        out = []
        for summary, facts in found:
            judged = self._judge(summary["thread_id"], facts, now)
            if states is None or judged.state in states:
                out.append({**summary, "status": judged.to_dict()})
        return out

    def thread_summary(self, thread_id: str) -> dict[str, Any] | None:
        """Summarise one thread as `threads()` does (status included); None if there is none."""
        check_name(thread_id, "thread_id")

        def job(conn: Any) -> tuple[dict[str, Any], Any] | None:
            found = _summaries(conn.execute(schema.THREAD_SUMMARY, (thread_id,)))
            return (found[0], _status_facts(conn, thread_id)) if found else None

        got = self._engine.read("thread_summary", job)
        if got is None:
            return None
        summary, facts = got
        judged = self._judge(thread_id, facts, read_now(self._engine.clock))
        return {**summary, "status": judged.to_dict()}

    def thread_status(self, thread_id: str) -> ThreadStatus | None:
        """Judge what a thread is doing: idle, running, interrupted or failed.

        Reads the thread's claim, its latest root checkpoint's pending writes
        and its latest run event in one snapshot, and applies the one rule
        (`status.judge`; `ThreadStatus` documents each state). A damaged
        thread row gives `state="unknown"` with the error, not an exception.

        Returns:
            None if the file has no such thread.
        """
        check_name(thread_id, "thread_id")
        facts = self._engine.read("thread_status", lambda c: _status_facts(c, thread_id))
        if facts is None:
            return None
        return self._judge(thread_id, facts, read_now(self._engine.clock))

    async def athread_status(self, thread_id: str) -> ThreadStatus | None:
        """Async twin of `thread_status`."""
        return await self._engine.arun(self.thread_status, thread_id)

    def _judge(self, thread_id: str, facts: dict[str, Any] | None, now: float) -> ThreadStatus:
        """Decode what `_status_facts` read and apply the one rule (`status.judge`)."""
        if facts is None:  # not a thread (a summary always has its row)
            return ThreadStatus(thread_id, "idle")
        if "error" in facts:
            return ThreadStatus(thread_id, "unknown", error=facts["error"])
        row, latest, last_run = facts["row"], facts["latest"], facts["last_run"]
        writes, values, cid = [], None, None
        if latest is not None:
            cid = latest[0][2]
            wanted = (status.INTERRUPT, status.RESUME, status.ERROR)
            writes = decode_writes(self.serde, thread_id, cid, latest[1], only=wanted)
            if any("__pregel_push" in str(w["task_path"]) for w in writes):
                values = decode_values(self.serde, latest[0])  # names the nodes of Send tasks
        return status.judge(
            thread_id,
            now=now,
            holder=row.holder,
            token=row.token,
            expires_at=row.expires_at,
            claim_run_id=row.run_id,
            checkpoint_id=cid,
            waiting=status.pending_interrupts(writes, values),
            failures=status.failed_tasks(writes, values),
            last_run=last_run,
        )

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


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _status_facts(conn: Any, thread_id: str) -> dict[str, Any] | None:
    """Read what a status is judged from, in the caller's read transaction."""
    if conn.execute(schema.THREAD_EXISTS, (thread_id,)).fetchone() is None:
        return None
    try:
        row = read_thread(conn, thread_id)
    except UndecodableRow as exc:
        return {"error": exc.to_dict()}
    assert row is not None
    latest = cps.fetch_tuple(conn, thread_id, "", None)
    return {"row": row, "latest": latest, "last_run": _last_run_event(conn, thread_id, row)}


def _last_run_event(conn: Any, thread_id: str, row: Any) -> Any:
    """Return the thread's latest run lifecycle event (`status.RUN_EVENTS`), if still current.

    A root checkpoint committed after it under another token (or none: a
    graph run outside the runner) makes it stale: None. A damaged or
    compacted event gives None too.
    """
    found = conn.execute(*schema.last_event_of_kinds(thread_id, status.RUN_EVENTS)).fetchone()
    if found is None or not isinstance(found[0], int):
        return None
    try:
        page = events.read_after(conn, thread_id, found[0] - 1, 1, row.incarnation)
    except (UndecodableRow, ReplayUnavailable):
        return None
    if not page or page[0].seq != found[0]:
        return None
    event = page[0]
    if conn.execute(schema.ROOT_CHECKPOINT_AFTER, (thread_id, event.seq, event.token)).fetchone():
        return None
    return event


def _summaries(rows: Any) -> list[dict[str, Any]]:
    out = []
    for row in rows:
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
