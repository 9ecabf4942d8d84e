"""The threads of a store as both stores judge them: activity, summaries, statuses.

Invariant: a thread's status is `status.judge`'s, applied by `_judge` to
facts each store reads in one snapshot with the summary (its
`_status_facts`); activity (`last_activity`) and a summary's shape
(`_summaries`) are defined here once, for `threads(inactive_for=)` and for
sweeps on either store. Each store's `saver_threads.py` reads; nothing there
decides a state.
"""

from __future__ import annotations

import builtins
from datetime import timedelta
from typing import Any

from ..clock import to_seconds
from ..errors import UndecodableRow, bad_argument
from . import status
from .saver_inspect import decode_values, decode_writes
from .status import ThreadStatus
from .store import UsesStore
from .validation import check_name

__all__ = ["ThreadsBase", "inactive_for_seconds", "last_activity"]


class ThreadsBase(UsesStore):
    """A store's threads as both stores judge them: statuses (`status.judge`) and namespaces."""

    serde: Any

    def thread_status(self, thread_id: str) -> ThreadStatus | None:
        """Judge what a thread is doing: idle, running, interrupted or failed (the store's)."""
        raise NotImplementedError

    def namespaces(self, thread_id: str) -> _list[str]:
        """Return the namespaces a thread has checkpoints in, sorted ("" first): the store's."""
        raise NotImplementedError

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
            active_at=facts.get("active_at"),
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


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
