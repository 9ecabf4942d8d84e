"""The threads of a PostgreSQL store: summaries, namespaces and statuses.

Invariant: as in the SQLite store's `saver_threads.py`, a thread's status is
`status.judge`'s (through `core/saver_threads.py`'s `_judge`, inherited), from facts read
in the same snapshot as its summary: `threads()` reads every thread's
summary, the store's time and every status's facts in one REPEATABLE READ
snapshot, five statements in one round trip whatever the number of threads
(`_facts_batch`), and decodes outside it. Summaries are built
by `core/saver_threads.py`'s `_summaries` from rows of the same columns, so both
stores define activity, namespaces and errors once. Mixed into
`FencedPostgresSaver`, which provides `_engine`, `_now` and `serde`.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any

from ..core import status as st
from ..core.activity import is_inactive
from ..core.claims import ThreadRow
from ..core.encryption import Encryption, encryption_of
from ..core.events import decode_event
from ..core.run_fence import RUN_HOLDER
from ..core.saver_threads import ThreadsBase, _summaries, inactive_for_seconds
from ..core.status import ThreadStatus, check_states
from ..core.thread_search import ThreadQuery
from ..core.validation import check_name
from ..errors import UndecodableRow
from . import sql
from .connection import Execute, PgConnection, Send
from .saver_inspect import PgInspectionAPI
from .values import resolved_from

__all__ = ["STORE_NEUTRAL", "PgReadAPI", "PgThreadsAPI"]

Cursor = Any
# `list` is a method of the saver this class is mixed into.
_list = builtins.list


# Methods of `ThreadsBase` (core/) this class inherits as they are: they read only through
# the methods below (`_judge` applies `status.judge` to facts `_status_facts`
# read). tests/postgres/test_postgres_inspect.py checks that nothing else is inherited.
STORE_NEUTRAL = (
    "_judge",
    "athread_status",
    "resolve_namespace",
    # The search (`search_threads`, `count_threads`) reads only through
    # `_search_candidates`, `_count_candidates` and `_thread_page` below.
    "search_threads",
    "count_threads",
    "asearch_threads",
    "acount_threads",
    "_ordered",
    "_judged",
)


class PgThreadsAPI(ThreadsBase):
    """What a database's threads are: summaries, statuses (`status.judge`) and namespaces."""

    _engine: PgConnection
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
        dicts, newest activity first), all from one snapshot, in one round
        trip however many threads there are.

        Args:
            status: Only threads in this state (or these states), of `THREAD_STATES`.
            inactive_for: Only threads not written for at least this long
                (seconds or a timedelta, by the store's clock: the
                database's unless the saver was given one).
        """
        states = check_states(status)  # `status` is the argument here, not the module
        idle_for = inactive_for_seconds(inactive_for)
        now, rows, facts = self._engine.run(
            "threads",
            batch=_facts_batch(None, self._now(), enc=encryption_of(self.serde)),
            read_only=True,
        )
        out = []
        for summary in _summaries(rows):
            if idle_for is not None and not is_inactive(summary["last_activity"], now, idle_for):
                continue
            judged = self._judge(summary["thread_id"], facts.get(summary["thread_id"]), now)
            if states is None or judged.state in states:
                out.append({**summary, "status": judged.to_dict()})
        return out

    def _search_candidates(
        self, q: ThreadQuery, *, page: bool
    ) -> tuple[float, _list[tuple[Any, Any, Any]]]:
        window = q.window if page else None
        query = sql.search_threads(
            q.indexed, q.unindexed, q.ids, activity=q.needs_activity, page=window
        )
        at = self._now()

        def send(execute: Execute) -> Callable[[], tuple[float, _list[Any]]]:
            clock = execute(sql.GET_NOW, {"now": at})
            found = execute(*query)
            return lambda: (float(clock.fetchall()[0][0]), found.fetchall())

        return self._engine.run("search_threads", batch=send, read_only=True)

    def _count_candidates(self, q: ThreadQuery) -> int:
        query = sql.search_threads(q.indexed, q.unindexed, q.ids, count=True)
        found: int = self._engine.run(
            "count_threads", lambda cur: cur.execute(*query).fetchall()[0][0], read_only=True
        )
        return found

    def _thread_page(
        self, ids: Sequence[str]
    ) -> tuple[float, _list[Any], dict[str, dict[str, Any] | None]]:
        batch = _facts_batch(list(ids), self._now(), enc=encryption_of(self.serde))
        now, rows, facts = self._engine.run("search_threads", batch=batch, read_only=True)
        return now, rows, dict(facts)

    def thread_summary(self, thread_id: str) -> dict[str, Any] | None:
        """Summarise one thread as `threads()` does (status included); None if there is none."""
        check_name(thread_id, "thread_id")
        batch = _facts_batch(thread_id, self._now(), enc=encryption_of(self.serde))
        now, rows, facts = self._engine.run("thread_summary", batch=batch, read_only=True)
        found = _summaries(rows)
        if not found:
            return None
        judged = self._judge(thread_id, facts.get(thread_id), now)
        return {**found[0], "status": judged.to_dict()}

    def thread_status(self, thread_id: str) -> ThreadStatus | None:
        """Judge what a thread is doing: idle, running, interrupted or failed.

        As `FencedSqliteSaver.thread_status`: reads the thread's claim, its
        latest root checkpoint's pending writes and its latest run event in
        one snapshot (one round trip), and applies the one rule (`status.judge`).

        Returns:
            None if the database has no such thread.
        """
        check_name(thread_id, "thread_id")
        batch = _facts_batch(thread_id, self._now(), summaries=False, enc=encryption_of(self.serde))
        now, _, facts = self._engine.run("thread_status", batch=batch, read_only=True)
        if thread_id not in facts:
            return None
        return self._judge(thread_id, facts[thread_id], now)

    def namespaces(self, thread_id: str) -> _list[str]:
        """Return the checkpoint namespaces a thread has checkpoints in, sorted ("" first)."""
        check_name(thread_id, "thread_id")
        rows = self._engine.run(
            "namespaces",
            lambda cur: cur.execute(sql.THREAD_NAMESPACES, {"thread_id": thread_id}).fetchall(),
            read_only=True,
        )
        return [r[0] for r in rows]


# Both bases narrow the shared read mixins' `_engine` (a `StoreEngine`) to a `PgConnection`.
class PgReadAPI(PgInspectionAPI, PgThreadsAPI):
    """Every read the SQLite saver offers for operators: history, inspection, threads."""


_Read = tuple[float, _list[Any], dict[str, dict[str, Any]]]


def _facts_batch(
    thread_id: str | _list[str] | None,
    at: float | None,
    *,
    summaries: bool = True,
    enc: Encryption | None = None,
) -> Send[_Read]:
    """Read summaries, the store's time and status facts of every thread (or one): one round trip.

    Five statements of one read-only snapshot (`PgConnection.run`'s
    `read_only` batch): `THREAD_SUMMARIES` (none with `summaries=False`),
    the time (`at`, a given clock's, or the server's), `STATUS_FACTS`, the
    writes of each latest root checkpoint, and the value rows of those whose
    values a status decodes (`LATEST_ROOT_VALUES`). The reader returns the
    time, the summary rows and each thread's facts by id (no entry: no
    such thread).
    """
    one: dict[str, Any] = {}
    queries: tuple[str, ...] = (sql.THREAD_SUMMARIES, sql.STATUS_FACTS, sql.LATEST_ROOT_WRITES)
    queries += (sql.LATEST_ROOT_VALUES,)
    if isinstance(thread_id, list):  # a page of threads (`search_threads`)
        one = {"ids": thread_id}
        queries = (sql.THREAD_SUMMARIES_OF_IDS, sql.STATUS_FACTS_OF_IDS)
        queries += (sql.LATEST_ROOT_WRITES_OF_IDS, sql.LATEST_ROOT_VALUES_OF_IDS)
    elif thread_id is not None:
        one = {"thread_id": thread_id}
        queries = (sql.THREAD_SUMMARY, sql.STATUS_FACTS_OF, sql.LATEST_ROOT_WRITES_OF)
        queries += (sql.LATEST_ROOT_VALUES_OF,)
    by_kind = {"kinds": sorted(st.RUN_EVENTS), "run_holder": RUN_HOLDER, **one}

    def send(execute: Execute) -> Callable[[], _Read]:
        listed = None
        if summaries:
            listed = execute(queries[0], one)
        clock = execute(sql.GET_NOW, {"now": at})
        facts = execute(queries[1], by_kind)
        writes = execute(queries[2], one)
        values = execute(queries[3], one)

        def finish() -> _Read:
            of: dict[str, _list[Any]] = {}
            for t, _ns, _cid, *write in writes.fetchall():
                of.setdefault(t, []).append(tuple(write))
            latest = _with_values(facts.fetchall(), of, values.fetchall(), enc)
            found = {row[0]: _status_facts(row, of.get(row[0], [])) for row in latest}
            rows = [] if listed is None else listed.fetchall()
            (now,) = clock.fetchall()[0]
            return float(now), rows, found

        return finish

    return send


def _with_values(
    rows: _list[Any],
    writes: dict[str, _list[Any]],
    blobs: _list[Any],
    enc: Encryption | None = None,
) -> _list[Any]:
    """`STATUS_FACTS` rows, each latest root checkpoint a status decodes with its values inline.

    Those whose writes name a `Send` task (`sql.LATEST_ROOT_VALUES`: the
    status names its node from the values), as a display read resolves them
    (`value_reads.resolve_rows`, `strict=False`); the others are not decoded.
    """
    out = list(rows)
    for i, row in enumerate(rows):
        if not any(
            w[1] in sql.STATUS_WRITE_CHANNELS and sql.PUSH_TASK_PATH in str(w[4])
            for w in writes.get(row[0], [])
        ):
            continue
        (checkpoint,) = resolved_from([tuple(row[8:20])], blobs, strict=False, enc=enc)
        out[i] = (*row[:8], *checkpoint, *row[20:])
    return out


def _status_facts(row: Any, writes: _list[Any]) -> dict[str, Any]:
    """Make what a status is judged from of one `STATUS_FACTS` row and its latest's writes.

    Unlike the SQLite store's, the thread row cannot hold a cell of the wrong
    type (its columns are typed), so there is no `error` fact to give.
    """
    thread_id, next_seq, floor, holder, token, expires_at, run_id, incarnation = row[:8]
    thread = ThreadRow(
        int(next_seq),
        int(floor),
        holder,
        None if token is None else int(token),
        None if expires_at is None else float(expires_at),
        run_id,
        int(incarnation),
    )
    checkpoint = tuple(row[8:20])
    latest = None if checkpoint[0] is None else (checkpoint, writes)
    last_run = _last_run_event(thread_id, thread, tuple(row[20:28]), bool(row[28]))
    active_at = None if row[29] is None else float(row[29])
    return {"row": thread, "latest": latest, "last_run": last_run, "active_at": active_at}


def _last_run_event(thread_id: str, row: ThreadRow, cells: tuple[Any, ...], after: bool) -> Any:
    """Return the thread's latest run lifecycle event (`status.RUN_EVENTS`), if still current.

    The SQLite store's rule: a root checkpoint committed after it under
    another token (or none: a graph run outside the runner, `after`) makes it
    stale, and so does a damaged event, or one below the floor: None.
    """
    if cells[0] is None or int(cells[0]) < row.floor:
        return None
    try:
        event = decode_event(thread_id, cells, row.incarnation)
    except UndecodableRow:
        return None
    return None if after else event
