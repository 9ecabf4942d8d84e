"""What a thread search asks, checked once for both stores: `ThreadQuery`.

Invariant: `search_threads` and `count_threads` (`saver_threads.ThreadsBase`)
check every argument here before anything is read, and the rules a search
applies are these: metadata is matched as `list(filter=...)` matches it
(each store's SQL), on the thread's latest root checkpoint; `status` is
`status.judge`'s, `inactive_for` is `activity.last_activity`'s (the
rules `threads()` applies), and the order is `SORT_BY`'s, ties broken by
thread id, so paging with `offset` never skips nor repeats a thread of an
unchanged store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..clock import to_seconds
from ..errors import InvalidArgument, bad_argument
from .status import check_states
from .validation import check_filter, check_int, check_iterable, check_limit, check_name

__all__ = ["ORDERS", "SORT_BY", "UNINDEXED_KEYS", "ThreadQuery", "thread_query"]

# What a search can be ordered by: "updated_at", a thread's last activity
# (`threads()`' `last_activity`: its newest checkpoint or event), or
# "thread_id". Not "created_at": a store does not record when a thread
# began, and retention removes its first checkpoints.
SORT_BY = ("updated_at", "thread_id")
ORDERS = ("asc", "desc")
# LangGraph's own per-step metadata keys. Each store's index of the latest
# metadata (SQLite `thread_tags`, PostgreSQL `lgfs_thread_tags`) leaves them
# out, since they change at every step (an index row rewritten at every put
# would cost each commit pages): a filter on one of them, or on the value
# None (`list(filter=)` matches a missing key too), reads each candidate
# thread's latest checkpoint instead of seeking the index.
UNINDEXED_KEYS = ("source", "step", "parents", "writes")


@dataclass(frozen=True)
class ThreadQuery:
    """One checked search: filters, order and page (`thread_query` builds it).

    Attributes:
        metadata: Keys and values the latest root checkpoint's metadata must
            all have (empty: no metadata filter).
        ids: Only these threads (None: any).
        states: Only threads judged in one of these states (None: any).
        idle_for: Only threads inactive for at least this long, in seconds.
        sort_by: One of `SORT_BY`.
        desc: Whether the order is descending.
        limit: The page size (None: every match).
        offset: How many matching threads the page skips.
    """

    metadata: Mapping[str, Any]
    ids: tuple[str, ...] | None
    states: frozenset[str] | None
    idle_for: float | None
    sort_by: str
    desc: bool
    limit: int | None
    offset: int

    @property
    def indexed(self) -> list[tuple[str, Any]]:
        """The metadata entries a store's tag index answers."""
        return [(k, v) for k, v in self.metadata.items() if _indexed(k, v)]

    @property
    def unindexed(self) -> list[tuple[str, Any]]:
        """The metadata entries matched on each candidate's latest checkpoint."""
        return [(k, v) for k, v in self.metadata.items() if not _indexed(k, v)]

    @property
    def in_sql(self) -> bool:
        """Whether the store can page by itself: ordered by thread id, nothing judged after."""
        return self.sort_by == "thread_id" and self.states is None and self.idle_for is None

    @property
    def window(self) -> tuple[bool, int, int]:
        """`(descending, limit, offset)` for a store's SQL (-1: no limit, as SQLite's)."""
        return self.desc, -1 if self.limit is None else self.limit, self.offset

    @property
    def needs_activity(self) -> bool:
        """Whether candidates must carry their activity (to sort or to filter by it)."""
        return self.sort_by == "updated_at" or self.idle_for is not None


def _indexed(key: str, value: Any) -> bool:
    return value is not None and key not in UNINDEXED_KEYS


def thread_query(
    metadata: Any = None,
    status: str | Iterable[str] | None = None,
    ids: Any = None,
    inactive_for: float | timedelta | None = None,
    sort_by: Any = "updated_at",
    order: Any = "desc",
    limit: Any = 10,
    offset: Any = 0,
) -> ThreadQuery:
    """Check a search's arguments and return them as a `ThreadQuery`.

    Raises:
        InvalidArgument: naming the argument: `metadata` not a dict of JSON
            values under string keys, an unknown `status`, `ids` not a list
            of thread ids, a negative `inactive_for`, `sort_by` not in
            `SORT_BY`, `order` not "asc"/"desc", `limit` not None or an int from 1,
            `offset` not an int from 0.
    """
    try:
        matched = dict(check_filter(metadata) or {})
    except InvalidArgument as exc:  # `list`'s check names `filter`: here it is `metadata`
        raise bad_argument("metadata", str(exc).removeprefix("filter: ")) from None
    states = check_states(status)
    wanted = None
    if ids is not None:
        wanted = tuple(dict.fromkeys(check_name(i, "ids") for i in check_iterable(ids, "ids")))
    idle_for = None if inactive_for is None else to_seconds(inactive_for, "inactive_for")
    if sort_by not in SORT_BY:
        raise bad_argument("sort_by", f"expected one of {SORT_BY}, got {sort_by!r}")
    if order not in ORDERS:
        raise bad_argument("order", f"expected one of {ORDERS}, got {order!r}")
    return ThreadQuery(
        matched,
        wanted,
        states,
        idle_for,
        sort_by,
        order == "desc",
        check_limit(limit),
        check_int(offset, "offset"),
    )
