"""The threads of a PostgreSQL store: summaries, namespaces and statuses.

Invariant: as in the SQLite store's `api_threads.py`, a thread's status is
`status.judge`'s (through the SQLite saver's own `_judge`, inherited), from facts read
in the same snapshot as its summary: `threads()` reads every thread's
summary, the store's time and every status's facts in one REPEATABLE READ
transaction (`read_snapshot`), and decodes outside it. Summaries are built
by the SQLite store's `_summaries` from rows of the same columns, so both
stores define activity, namespaces and errors once. Mixed into
`FencedPostgresSaver`, which provides `_engine`, `_now` and `serde`.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from .. import status as st
from ..api_threads import ThreadsAPI, _summaries, inactive_for_seconds
from ..claims import ThreadRow
from ..errors import ReplayUnavailable, UndecodableRow
from ..status import ThreadStatus, check_states
from ..validation import check_name
from . import events, sql, txns
from .api_inspect import PgInspectionAPI, read_snapshot
from .connection import PgConnection

__all__ = ["STORE_NEUTRAL", "PgReadAPI", "PgThreadsAPI"]

Cursor = Any
# `list` is a method of the saver this class is mixed into.
_list = builtins.list


# Methods of `ThreadsAPI` this class inherits as they are: they read only through
# the methods below (`_judge` applies `status.judge` to facts `_status_facts`
# read). tests/test_postgres_threads.py checks that nothing else is inherited.
STORE_NEUTRAL = ("_judge", "athread_status", "resolve_namespace")


class PgThreadsAPI(ThreadsAPI):
    """What a database's threads are: summaries, statuses (`status.judge`) and namespaces."""

    _engine: PgConnection  # type: ignore[assignment]
    serde: Any

    def _now(self) -> float | None:
        raise NotImplementedError  # the saver's

    def threads(
        self,
        *,
        status: str | Iterable[str] | None = None,
        inactive_for: float | timedelta | None = None,
    ) -> _list[dict[str, Any]]:
        """Summarise every thread: counts, namespaces, latest step, claim, events, floor, status.

        As `FencedSqliteSaver.threads` (the same keys, the same `status`
        dicts, newest activity first), all from one snapshot.

        Args:
            status: Only threads in this state (or these states), of `THREAD_STATES`.
            inactive_for: Only threads not written for at least this long
                (seconds or a timedelta, by the store's clock: the
                database's unless the saver was given one).
        """
        states = check_states(status)  # `status` is the argument here, not the module
        idle_for = inactive_for_seconds(inactive_for)
        at = self._now()

        def job(cur: Cursor) -> tuple[float, _list[tuple[dict[str, Any], Any]]]:
            now = _store_now(cur, at)
            found = []
            for summary in _summaries(cur.execute(sql.THREAD_SUMMARIES).fetchall()):
                if idle_for is not None and summary["last_activity"] > now - idle_for:
                    continue
                found.append((summary, _status_facts(cur, summary["thread_id"])))
            return now, found

        now, found = read_snapshot(self._engine, "threads", job)
        out = []
        for summary, facts in found:
            judged = self._judge(summary["thread_id"], facts, now)
            if states is None or judged.state in states:
                out.append({**summary, "status": judged.to_dict()})
        return out

    def thread_summary(self, thread_id: str) -> dict[str, Any] | None:
        """Summarise one thread as `threads()` does (status included); None if there is none."""
        check_name(thread_id, "thread_id")
        at = self._now()

        def job(cur: Cursor) -> tuple[float, dict[str, Any], Any] | None:
            rows = cur.execute(sql.THREAD_SUMMARY, {"thread_id": thread_id}).fetchall()
            found = _summaries(rows)
            if not found:
                return None
            return _store_now(cur, at), found[0], _status_facts(cur, thread_id)

        got = read_snapshot(self._engine, "thread_summary", job)
        if got is None:
            return None
        now, summary, facts = got
        return {**summary, "status": self._judge(thread_id, facts, now).to_dict()}

    def thread_status(self, thread_id: str) -> ThreadStatus | None:
        """Judge what a thread is doing: idle, running, interrupted or failed.

        As `FencedSqliteSaver.thread_status`: reads the thread's claim, its
        latest root checkpoint's pending writes and its latest run event in
        one snapshot, and applies the one rule (`status.judge`).

        Returns:
            None if the database has no such thread.
        """
        check_name(thread_id, "thread_id")
        at = self._now()

        def job(cur: Cursor) -> tuple[float, Any]:
            return _store_now(cur, at), _status_facts(cur, thread_id)

        now, facts = read_snapshot(self._engine, "thread_status", job)
        if facts is None:
            return None
        return self._judge(thread_id, facts, now)

    def namespaces(self, thread_id: str) -> _list[str]:
        """Return the checkpoint namespaces a thread has checkpoints in, sorted ("" first)."""
        check_name(thread_id, "thread_id")
        rows = self._engine.run(
            "namespaces",
            lambda cur: cur.execute(sql.THREAD_NAMESPACES, {"thread_id": thread_id}).fetchall(),
            read_only=True,
        )
        return [r[0] for r in rows]


# Both bases narrow the SQLite mixins' `_engine: Engine` to a `PgConnection`.
class PgReadAPI(PgInspectionAPI, PgThreadsAPI):  # type: ignore[misc]
    """Every read the SQLite saver offers for operators: history, inspection, threads."""


def _store_now(cur: Cursor, at: float | None) -> float:
    """Read the store's time in the caller's transaction: `at` (a given clock's) or the server's."""
    cur.execute(sql.GET_NOW, {"now": at})
    return float(cur.fetchone()[0])


def _status_facts(cur: Cursor, thread_id: str) -> dict[str, Any] | None:
    """Read what a status is judged from, in the caller's snapshot (None: no such thread).

    Unlike the SQLite store's, the thread row cannot hold a cell of the wrong
    type (its columns are typed), so there is no `error` fact to give.
    """
    if cur.execute(sql.THREAD_EXISTS, {"thread_id": thread_id}).fetchone() is None:
        return None
    next_seq, floor, holder, token, expires_at, run_id, incarnation = cur.execute(
        sql.GET_THREAD_ROW, {"thread_id": thread_id}
    ).fetchone()
    row = ThreadRow(
        int(next_seq),
        int(floor),
        holder,
        None if token is None else int(token),
        None if expires_at is None else float(expires_at),
        run_id,
        int(incarnation),
    )
    latest = txns.fetch_tuple(cur, thread_id, "", None)
    return {"row": row, "latest": latest, "last_run": _last_run_event(cur, thread_id, row)}


def _last_run_event(cur: Cursor, thread_id: str, row: ThreadRow) -> Any:
    """Return the thread's latest run lifecycle event (`status.RUN_EVENTS`), if still current.

    The SQLite store's rule: a root checkpoint committed after it under
    another token (or none: a graph run outside the runner) makes it stale,
    and so does a damaged event: None.
    """
    params = {"thread_id": thread_id, "kinds": sorted(st.RUN_EVENTS)}
    found = cur.execute(sql.LAST_EVENT_OF_KINDS, params).fetchone()
    if found is None:
        return None
    seq = int(found[0])
    try:
        page = events.read_after(cur, thread_id, seq - 1, 1, row.incarnation)
    except (UndecodableRow, ReplayUnavailable):
        return None
    if not page or page[0].seq != seq:
        return None
    event = page[0]
    after = {"thread_id": thread_id, "seq": event.seq, "token": event.token}
    if cur.execute(sql.ROOT_CHECKPOINT_AFTER, after).fetchone():
        return None
    return event
