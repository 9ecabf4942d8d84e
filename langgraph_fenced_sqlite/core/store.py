"""The boundary between the rules written once (`core/`) and a store that applies them.

Invariant: what `core/` needs of a store is named here, and nowhere else.
The shared mixins (`saver.py`, `saver_claims.py`, `saver_events.py`,
`saver_retention.py`, `saver_inspect.py`, `saver_threads.py`) check
arguments, encode and judge, then call `_`-prefixed primitives that each
store's own modules implement, one transaction each; of the store's engine
they use only `StoreEngine`'s few members, through `UsesStore._engine`.
`fenced_store.FencedStore` is the one type of "a fenced store".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

__all__ = ["StoreEngine", "UsesStore"]

T = TypeVar("T")


class StoreEngine(Protocol):
    """What the shared rules use of a store's engine (its connection and transactions).

    `sqlite.engine.Engine` and `postgres.connection.PgConnection` are the two.
    """

    @property
    def closed(self) -> bool:
        """Whether the store was closed."""
        ...

    @property
    def readonly(self) -> bool:
        """Whether the store refuses every write (`ReadOnlyStore`)."""
        ...

    @property
    def path(self) -> str:
        """What the store's errors name: the file's path, or the database's."""
        ...

    async def arun(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a sync store method for an async caller (the store's one hop)."""
        ...


class UsesStore:
    """A mixin of the rules written once: it reaches its store only through `_engine`.

    Each store's mixins declare `_engine` as their own engine's type (their
    primitives use more of it); here it is read-only, so that narrowing it
    is sound and needs no cast.
    """

    if TYPE_CHECKING:

        @property
        def _engine(self) -> StoreEngine:
            """The store's engine (`StoreEngine`), set by the saver's `__init__`."""
            ...
