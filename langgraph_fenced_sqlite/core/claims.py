"""Claims (leases) on threads and the fencing tokens that guard writes: the rules.

Invariant: liveness has one rule (`claim_live`: a claim is live while
`now < expires_at`), a token travels in a config under one key
(`TOKEN_KEY`), and an unfenced write meets one refusal (`check_unfenced`);
both stores apply them inside their transactions (`sqlite/claims.py`,
`postgres/txns.py`). A thread row's cells are type-checked here before any
rule reads them, so a damaged row is an `UndecodableRow`, never a judgement.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from langchain_core.runnables import RunnableConfig

from ..errors import ThreadBusy, UndecodableRow, bad_argument

__all__ = [
    "TOKEN_KEY",
    "Claim",
    "RunToken",
    "ThreadRow",
    "check_unfenced",
    "claim_live",
    "claim_row",
    "tenant_cells",
    "token_from_config",
]

# The `config["configurable"]` key that carries a fencing token. The leading
# "__" keeps LangGraph from copying it into checkpoint metadata.
TOKEN_KEY = "__fence_token__"


_new_tuple = tuple.__new__


class RunToken(int):
    """A fencing token that a run's own write took by its run id (`fence_runs`).

    It fences as every token does. Unlike a runner's, a put under it is not
    version-checked (docs/semantics.md §3): a run may start from any
    checkpoint, as LangGraph's time travel does, and every earlier run is
    fenced off by its claim anyway.
    """

    __slots__ = ()


def claim_live(token: Any, expires_at: Any, now: float) -> bool | None:
    """Judge a claim's liveness: the one rule every caller uses (`now < expires_at`).

    Args:
        token: The claim's token cell (None: no claim).
        expires_at: The claim's expiry cell (store-clock seconds).
        now: The store clock's current time.

    Returns:
        True if a claim exists and has not expired, False if there is none or
        it expired, None if a cell holds a value of the wrong type (a damaged
        row: nothing can be judged).
    """
    if token is None or expires_at is None:
        return False
    if not (_is_number(token) and _is_number(expires_at)):
        return None
    return bool(now < expires_at)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


@dataclass(frozen=True)
class Claim:
    """A granted claim on a thread.

    Attributes:
        thread_id: The claimed thread.
        holder: Who holds it (free text: a worker name, a host:pid).
        token: The fencing token; every fenced write presents it.
        expires_at: Store-clock seconds since the epoch when it stops being live.
    """

    thread_id: str
    holder: str
    token: int
    expires_at: float

    def config(self, config: RunnableConfig | None = None, **configurable: Any) -> RunnableConfig:
        """Return a `RunnableConfig` for this thread carrying the token.

        Args:
            config: A config to extend (its other keys are kept).
            **configurable: Extra `configurable` entries.

        Returns:
            A config ready for `graph.invoke(inputs, claim.config())`.
        """
        base: dict[str, Any] = dict(config or {})
        conf = dict(base.get("configurable") or {})
        conf.update(configurable)
        conf["thread_id"] = self.thread_id
        conf[TOKEN_KEY] = self.token
        base["configurable"] = conf
        return base  # type: ignore[return-value]

    def live(self, now: float) -> bool:
        """Whether this claim is live at store-clock time `now` (see `claim_live`)."""
        return claim_live(self.token, self.expires_at, now) is True


# A named tuple, not a frozen dataclass: every write reads one, and a frozen
# dataclass sets each of its seven fields through `object.__setattr__`.
class ThreadRow(NamedTuple):
    """A thread's next event seq, floor and claim, read inside a transaction.

    `next_seq` is also the position of the commit being made: every commit
    appends at least one event, and takes its first event's seq. `run_id` is
    the run the claim was granted for (`begin_run`), and `incarnation` counts
    the thread's lives: `delete_thread` raises it (docs/semantics.md §5).
    """

    next_seq: int
    floor: int
    holder: str | None
    token: int | None
    expires_at: float | None
    run_id: str | None = None
    incarnation: int = 1

    def live(self, now: float) -> bool:
        """Whether a claim exists and `now < expires_at` (see `claim_live`)."""
        return claim_live(self.token, self.expires_at, now) is True


def token_from_config(config: RunnableConfig | None) -> int | None:
    """Return the fencing token a config carries, or None.

    Raises:
        TypeError: the token is present but not an integer.
    """
    if not config:
        return None
    token = (config.get("configurable") or {}).get(TOKEN_KEY)
    if token is None:
        return None
    if isinstance(token, bool) or not isinstance(token, int):
        raise bad_argument(f"config['configurable'][{TOKEN_KEY!r}]", "expected an int token")
    return token


def claim_row(
    thread_id: str, holder: Any, token: Any, expires_at: Any
) -> tuple[str | None, int | None, float | None]:
    """Check a claim's cells as read from `threads`; return them typed.

    Raises:
        UndecodableRow: a cell holds the wrong SQL type.
    """
    return (
        _text_cell(thread_id, "holder", holder),
        _int_cell(thread_id, "token", token, nullable=True),
        _number_cell(thread_id, "expires_at", expires_at),
    )


def tenant_cells(thread_id: str, tenant: Any, holds_data: Any) -> tuple[str | None, bool]:
    """Check a thread's tenant cell (and the data flag read beside it); return them typed.

    Raises:
        UndecodableRow: the tenant cell holds the wrong SQL type.
    """
    return _text_cell(thread_id, "tenant", tenant), bool(holds_data)


def _bad_cell(thread_id: str, column: str, value: Any, expected: str) -> UndecodableRow:
    reason = f"threads.{column} holds {type(value).__name__} {value!r:.40}, expected {expected}"
    return UndecodableRow(
        thread_id, None, reason, message=f"thread {thread_id!r}: damaged thread row: {reason}"
    )


def _int_cell(thread_id: str, column: str, value: Any, *, nullable: bool = False) -> Any:
    if (value is None and nullable) or type(value) is int:
        return value
    raise _bad_cell(thread_id, column, value, "an integer")


def _text_cell(thread_id: str, column: str, value: Any) -> str | None:
    if value is None or type(value) is str:
        return value
    raise _bad_cell(thread_id, column, value, "text")


def _number_cell(thread_id: str, column: str, value: Any) -> float | None:
    if value is None or type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    raise _bad_cell(thread_id, column, value, "a number")


def check_unfenced(
    thread_id: str,
    holder: str | None,
    live: bool,
    require_claim: bool,
    latest: Callable[[], str | None],
) -> None:
    """Refuse an unfenced write (no token) that may not land: the rule both stores' fences use.

    `live` is whether the thread's claim is live (`claim_live`), `latest()`
    the id of the thread's latest root checkpoint, read only for the error.

    Raises:
        ThreadBusy: the thread has a live claim, or the store requires one.
    """
    if live:
        raise ThreadBusy(thread_id, holder, latest())
    if require_claim:
        raise ThreadBusy(
            thread_id,
            holder,
            latest(),
            message=(
                f"thread {thread_id!r}: this store requires a claim for every write "
                "(require_claim=True); claim the thread and pass claim.config()"
            ),
        )
