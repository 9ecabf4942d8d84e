"""The threads of a store as both stores judge them: activity, summaries, statuses.

Invariant: a thread's status is `status.judge`'s, applied by `_judge` to
facts each store reads in one snapshot with the summary (its
`_status_facts`); a summary's shape (`_summaries`) is defined here once,
for `threads()` and searches on either store, with activity as
`activity.last_activity` defines it. Each store's `saver_threads.py` reads; nothing there
decides a state.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from ..clock import to_seconds
from ..errors import UndecodableRow, bad_argument
from . import status
from .activity import is_inactive, last_activity
from .saver_inspect import decode_values, decode_writes
from .status import ThreadStatus
from .store import UsesStore
from .thread_search import ThreadQuery, thread_query
from .twins import async_twin
from .validation import check_name

__all__ = ["ThreadsBase", "inactive_for_seconds", "last_activity"]

# Threads whose status a filtered search judges per read (one snapshot each).
_JUDGE_CHUNK = 100


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

    # --- search -------------------------------------------------------------------

    def search_threads(
        self,
        *,
        metadata: dict[str, Any] | None = None,
        status: str | Iterable[str] | None = None,
        ids: Iterable[str] | None = None,
        inactive_for: float | timedelta | None = None,
        sort_by: str = "updated_at",
        order: str = "desc",
        limit: int | None = 10,
        offset: int = 0,
    ) -> _list[dict[str, Any]]:
        """Find threads by their latest metadata, status and activity; return one page.

        Each item is the thread's summary exactly as `threads()` gives it
        (`thread_id`, `checkpoints`, `namespaces`, `latest_step`,
        `last_activity`, `claim`, `events`, `floor`, `next_seq`, `error`,
        `status`): plain data. A metadata filter is matched as
        `list(filter=...)` matches it (every key equal; a value of None also
        matches a missing key), on the thread's latest checkpoint of the root
        namespace; a thread with no root checkpoint matches no metadata
        filter. Metadata keys are found through an index kept at each commit,
        except LangGraph's per-step keys (`UNINDEXED_KEYS`: source, step,
        parents, writes) and the value None, which are checked on each
        candidate's latest checkpoint. Candidates are read in one snapshot,
        the page's summaries in another: a thread deleted in between is left
        out of the page.

        Args:
            metadata: Keys and values the latest root checkpoint's metadata
                must all have.
            status: Only threads in this state (or these states), of
                `THREAD_STATES` (judged per thread, as `threads()` judges).
            ids: Only these thread ids.
            inactive_for: Only threads not written for at least this long
                (seconds or a timedelta), as `threads(inactive_for=)`.
            sort_by: "updated_at" (the summary's `last_activity`) or
                "thread_id"; threads equally recent are in thread id order.
            order: "desc" (default) or "asc".
            limit: The page size (from 1), or None for every match.
            offset: How many matching threads to skip (from 0).

        Returns:
            Up to `limit` summaries, in the order asked for.

        Raises:
            InvalidArgument: (naming the argument) any argument malformed:
                nothing is read.
        """
        q = thread_query(metadata, status, ids, inactive_for, sort_by, order, limit, offset)
        if q.in_sql:  # ordered and paged by the store's own index
            _, rows = self._search_candidates(q, page=True)
            return self._judged([r[0] for r in rows], None, q.limit)
        ordered = self._ordered(q)
        if q.states is None:
            end = None if q.limit is None else q.offset + q.limit
            return self._judged(ordered[q.offset : end], None, q.limit)
        return self._judged(ordered, q.states, q.limit, skip=q.offset)

    def count_threads(
        self,
        *,
        metadata: dict[str, Any] | None = None,
        status: str | Iterable[str] | None = None,
        ids: Iterable[str] | None = None,
        inactive_for: float | timedelta | None = None,
    ) -> int:
        """Count the threads `search_threads` finds with the same filters (every page).

        With only `metadata` and `ids`, the store counts in one indexed
        query; `inactive_for` reads each candidate's activity, and `status`
        judges each candidate.

        Raises:
            InvalidArgument: (naming the argument) any argument malformed.
        """
        q = thread_query(metadata, status, ids, inactive_for)
        if q.states is None and q.idle_for is None:
            return self._count_candidates(q)
        ordered = self._ordered(q)
        if q.states is None:
            return len(ordered)
        return len(self._judged(ordered, q.states, None))

    asearch_threads = async_twin(search_threads)
    acount_threads = async_twin(count_threads)

    def _search_candidates(
        self, q: ThreadQuery, *, page: bool
    ) -> tuple[float, _list[tuple[Any, Any, Any]]]:
        """Read the threads matching `q`'s metadata and ids (the store's), in one snapshot.

        Returns:
            The store's time and `(thread_id, last_checkpoint_at,
            last_event_at)` rows (the activity cells None unless
            `q.needs_activity`); with `page`, only `q`'s page, ordered by
            thread id (`q.in_sql`).
        """
        raise NotImplementedError

    def _count_candidates(self, q: ThreadQuery) -> int:
        """Count the threads matching `q`'s metadata and ids (the store's), in one query."""
        raise NotImplementedError

    def _thread_page(
        self, ids: Sequence[str]
    ) -> tuple[float, _list[Any], dict[str, dict[str, Any] | None]]:
        """Read the summaries and status facts of `ids` in one snapshot (the store's).

        Returns:
            The store's time, `_summaries`' rows (none for a thread that is
            gone), and each thread's `_status_facts` by id.
        """
        raise NotImplementedError

    def _ordered(self, q: ThreadQuery) -> _list[str]:
        """Return the ids of every candidate of `q`, filtered by activity and sorted."""
        now, rows = self._search_candidates(q, page=False)
        keyed = []
        for thread_id, last_cp, last_ev in rows:
            activity = last_activity(last_cp, last_ev)
            if q.idle_for is not None and not is_inactive(activity, now, q.idle_for):
                continue
            keyed.append((activity, str(thread_id)))
        if q.sort_by == "thread_id":
            keyed.sort(key=lambda k: k[1], reverse=q.desc)
        else:  # threads equally recent in thread id order, whichever the order (as `threads()`)
            keyed.sort(key=lambda k: (-k[0] if q.desc else k[0], k[1]))
        return [thread_id for _, thread_id in keyed]

    def _judged(
        self, ids: Sequence[str], states: frozenset[str] | None, limit: int | None, skip: int = 0
    ) -> _list[dict[str, Any]]:
        """Summarise `ids` in order, judged as `threads()` judges, keeping those in `states`.

        Reads a chunk of threads per snapshot until `limit` are kept (after
        skipping `skip` that match).
        """
        out: _list[dict[str, Any]] = []
        size = _JUDGE_CHUNK if states is not None else max(len(ids), 1)
        for start in range(0, len(ids), size):
            chunk = ids[start : start + size]
            now, rows, facts = self._thread_page(chunk)
            found = {summary["thread_id"]: summary for summary in _summaries(rows)}
            for thread_id in chunk:
                summary = found.get(thread_id)
                if summary is None:
                    continue  # deleted since the candidates were read
                judged = self._judge(thread_id, facts.get(thread_id), now)
                if states is not None and judged.state not in states:
                    continue
                if skip:
                    skip -= 1
                    continue
                out.append({**summary, "status": judged.to_dict()})
                if limit is not None and len(out) >= limit:
                    return out
        return out

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
            writes = decode_writes(
                self.serde, thread_id, cid, latest[1], only=wanted, values=latest[0][5:7]
            )
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
