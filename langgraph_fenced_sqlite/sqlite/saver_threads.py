"""The threads of a file: summaries, namespaces and statuses.

Invariant: a thread's status is `status.judge`'s, from facts read in the same
read transaction as its summary (`threads()` reads every thread's in one
snapshot), decoded outside the store's lock; nothing here decides a state.
Activity (`last_activity`) is defined here once, for `threads(inactive_for=)`
and for sweeps. Mixed into `FencedSqliteSaver`, which provides `_engine` and
`serde`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..clock import read_now
from ..core import status
from ..core.activity import is_inactive
from ..core.encryption import Encryption, encryption_of
from ..core.run_fence import RUN_HOLDER
from ..core.saver_threads import (  # noqa: F401 (moved)
    ThreadsBase,
    _list,
    _number,
    _summaries,
    inactive_for_seconds,
    last_activity,
)
from ..core.status import ThreadStatus, check_states
from ..core.thread_search import ThreadQuery
from ..core.validation import check_name
from ..errors import ReplayUnavailable, UndecodableRow
from . import checkpoints as cps
from . import events, schema
from .claims import read_thread

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["ThreadsAPI", "inactive_for_seconds", "last_activity"]


class ThreadsAPI(ThreadsBase):
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
        enc = encryption_of(self.serde)

        def job(conn: Any) -> tuple[float, _list[tuple[dict[str, Any], Any]]]:
            now = read_now(self._engine.clock)
            found = []
            for summary in _summaries(conn.execute(schema.THREAD_SUMMARIES)):
                if idle_for is not None and not is_inactive(
                    summary["last_activity"], now, idle_for
                ):
                    continue
                found.append((summary, _status_facts(conn, summary["thread_id"], enc)))
            return now, found

        now, found = self._engine.read("threads", job)
        out = []
        for summary, facts in found:
            judged = self._judge(summary["thread_id"], facts, now)
            if states is None or judged.state in states:
                out.append({**summary, "status": judged.to_dict()})
        return out

    def _search_candidates(
        self, q: ThreadQuery, *, page: bool
    ) -> tuple[float, _list[tuple[Any, Any, Any]]]:
        window = q.window if page else None
        query = schema.search_threads(
            q.indexed, q.unindexed, q.ids, activity=q.needs_activity, page=window
        )

        def job(conn: Any) -> tuple[float, _list[tuple[Any, Any, Any]]]:
            return read_now(self._engine.clock), conn.execute(*query).fetchall()

        return self._engine.read("search_threads", job)

    def _count_candidates(self, q: ThreadQuery) -> int:
        query = schema.search_threads(q.indexed, q.unindexed, q.ids, count=True)
        found: int = self._engine.read("count_threads", lambda c: c.execute(*query).fetchone()[0])
        return found

    def _thread_page(
        self, ids: Sequence[str]
    ) -> tuple[float, _list[Any], dict[str, dict[str, Any] | None]]:
        def job(conn: Any) -> tuple[float, _list[Any], dict[str, dict[str, Any] | None]]:
            rows: _list[Any] = []
            facts = {}
            for thread_id in ids:
                found = conn.execute(schema.THREAD_SUMMARY, (thread_id,)).fetchall()
                if found:
                    rows += found
                    facts[thread_id] = _status_facts(conn, thread_id)
            return read_now(self._engine.clock), rows, facts

        return self._engine.read("search_threads", job)

    def thread_summary(self, thread_id: str) -> dict[str, Any] | None:
        """Summarise one thread as `threads()` does (status included); None if there is none."""
        check_name(thread_id, "thread_id")
        enc = encryption_of(self.serde)

        def job(conn: Any) -> tuple[dict[str, Any], Any] | None:
            found = _summaries(conn.execute(schema.THREAD_SUMMARY, (thread_id,)))
            return (found[0], _status_facts(conn, thread_id, enc)) if found else None

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
        facts = self._engine.read(
            "thread_status", lambda c: _status_facts(c, thread_id, encryption_of(self.serde))
        )
        if facts is None:
            return None
        return self._judge(thread_id, facts, read_now(self._engine.clock))

    def namespaces(self, thread_id: str) -> _list[str]:
        """Return the checkpoint namespaces a thread has checkpoints in, sorted ("" first)."""
        check_name(thread_id, "thread_id")
        return self._engine.read(
            "namespaces",
            lambda c: [r[0] for r in c.execute(schema.THREAD_NAMESPACES, (thread_id,))],
        )


def _status_facts(
    conn: Any, thread_id: str, enc: Encryption | None = None
) -> dict[str, Any] | None:
    """Read what a status is judged from, in the caller's read transaction."""
    if conn.execute(schema.THREAD_EXISTS, (thread_id,)).fetchone() is None:
        return None
    try:
        row = read_thread(conn, thread_id)
    except UndecodableRow as exc:
        return {"error": exc.to_dict()}
    assert row is not None
    latest = cps.fetch_tuple(conn, thread_id, "", None, enc=enc)
    facts = {"row": row, "latest": latest, "last_run": _last_run_event(conn, thread_id, row)}
    if row.holder == RUN_HOLDER:  # a run fenced by its id runs while it writes
        found = conn.execute(schema.LAST_EVENT_TS, (thread_id,)).fetchone()
        facts["active_at"] = found[0] if found and isinstance(found[0], float) else None
    return facts


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
