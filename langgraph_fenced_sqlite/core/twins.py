"""Async twins of the stores' sync methods, written once: `aclaim = async_twin(claim)`.

Invariant: an async twin does nothing but run its sync method, looked up on
the instance (so an override is the one run), through the store's one
thread hop (`_engine.arun`, of `store.StoreEngine`, which both stores' engines are). Its
signature and annotations are the sync method's, so the two cannot drift.
A cancelled await does not stop a call already handed over: it may still
commit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

if TYPE_CHECKING:
    from .store import UsesStore

__all__ = ["async_twin"]

P = ParamSpec("P")
T = TypeVar("T")


def async_twin(
    method: Callable[Concatenate[Any, P], T], doc: str | None = None
) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, T]]:
    """Return the async twin of the sync store method `method`.

    Args:
        method: The sync method (a plain function in the class body).
        doc: The twin's docstring; by default "Async twin of `method`.".

    Returns:
        A coroutine function named `a<method>` that awaits
        `self._engine.arun(self.<method>, *args, **kwargs)`.
    """
    name = method.__name__

    @functools.wraps(method)
    async def twin(self: UsesStore, *args: P.args, **kwargs: P.kwargs) -> T:
        result: T = await self._engine.arun(getattr(self, name), *args, **kwargs)
        return result

    twin.__name__ = f"a{name}"
    twin.__qualname__ = f"{method.__qualname__.rpartition('.')[0]}.a{name}".lstrip(".")
    twin.__doc__ = doc if doc is not None else f"Async twin of `{name}`."
    return twin
