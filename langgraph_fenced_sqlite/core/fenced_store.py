"""The one type of "a fenced store", whichever store it is.

Invariant: the runner, leases, importers and transfer annotate a store with
`FencedStore` and test one with `isinstance(x, FencedStore)`; none of them
names `FencedSqliteSaver` or `FencedPostgresSaver` for that, so no
annotation ties the two stores into one import cycle.
"""

from __future__ import annotations

from .saver import FencedSaverBase
from .saver_claims import ClaimsBase
from .saver_events import EventsBase
from .saver_inspect import InspectionBase
from .saver_retention import RemovalsBase
from .saver_threads import ThreadsBase

__all__ = ["FencedStore"]


# `prune`/`aprune` return a report where LangGraph's return None (as both savers say).
class FencedStore(  # type: ignore[misc]
    ClaimsBase, EventsBase, RemovalsBase, InspectionBase, ThreadsBase, FencedSaverBase
):
    """A LangGraph checkpointer with claims, fencing tokens and an event log, on any store.

    `FencedSqliteSaver` and `FencedPostgresSaver` are the two; each supplies
    the primitives behind these mixins. Annotate with this type, and test
    with `isinstance(saver, FencedStore)`, where either store will do.
    """
