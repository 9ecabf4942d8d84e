"""Module-level user types for tests/core/test_user_types.py, importable by a fresh process.

The tests put the tests folder on a child's `sys.path` and read the file back
there, so everything here (but `Outer.Inner`) rebuilds by `module.name`.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Annotated, Any, NamedTuple

from pydantic import BaseModel, field_validator
from typing_extensions import TypedDict


class Color(enum.Enum):
    """A user enum."""

    RED = "red"
    BLUE = "blue"


class Point(NamedTuple):
    """A user named tuple."""

    x: int
    y: int


@dataclasses.dataclass
class Order:
    """A user dataclass with a field the constructor does not take."""

    sku: str
    qty: int
    total: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.total = self.qty * 10


class Profile(BaseModel):
    """A user pydantic model holding other user types."""

    name: str
    color: Color
    orders: list[Order] = []


class Shouting(BaseModel):
    """A model whose validator rewrites what it is given: it does not read back equal."""

    text: str

    @field_validator("text")
    @classmethod
    def _exclaim(cls, value: str) -> str:
        return value + "!"


class Outer:
    """Holds a nested class, which a reader cannot find by `module.name` (only by the object)."""

    @dataclasses.dataclass
    class Inner:
        """Nested: stored as `support.user_types.Inner`, which the module does not have."""

        v: int


def _keep(old: object, new: object) -> object:
    return new


class State(TypedDict):
    """A graph state declaring user types in its schema."""

    profile: Annotated[Profile, _keep]
    color: Color
    where: Point
    last: Order


class Decision(BaseModel):
    """An `interrupt(response_schema=...)` type: no graph schema declares it."""

    approved: bool
    note: str | None = None


class Ticket(BaseModel):
    """A pydantic graph state holding user types."""

    profile: Profile
    color: Color = Color.RED
    answer: Any = None  # as LangGraph's response_schema tests declare it


def ask_builder() -> Any:
    """A graph on a `Ticket` state whose node asks a question answered as a `Decision`."""
    from langgraph.graph import START, StateGraph
    from langgraph.types import interrupt

    def ask(state: Ticket) -> dict[str, Any]:
        return {"answer": interrupt({"question": "ship?"}, response_schema=Decision)}

    builder = StateGraph(Ticket)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    return builder


@dataclasses.dataclass
class Receipt:
    """A user dataclass, outside the default allow-list (the importers' tests write one)."""

    key: str
    n: int


class Boom:
    """Unpickling this would create a file: proof that code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (open, (self.marker, "w"))
