"""Claims (leases) on threads and the fencing tokens that guard writes.

Invariant: tokens come from one counter per file, incremented inside the
transaction that grants the claim, so each is greater than every token issued
before in that file and none is issued twice. Every function here runs inside
a transaction the engine opened; `check_fence` is the first check of every
write, before any version check, so a stale writer learns nothing else.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from langchain_core.runnables import RunnableConfig

from ..core.stored_json import MAX_INT, MIN_INT
from ..errors import StaleClaim, StoreError, ThreadBusy, UndecodableRow, bad_argument
from . import schema

__all__ = ["TOKEN_KEY", "Claim", "ThreadRow", "check_fence", "claim_live", "token_from_config"]

# The `config["configurable"]` key that carries a fencing token. The leading
# "__" keeps LangGraph from copying it into checkpoint metadata.
TOKEN_KEY = "__fence_token__"

_new_tuple = tuple.__new__


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


def read_thread(conn: sqlite3.Connection, thread_id: str) -> ThreadRow | None:
    """Return the thread's row, or None if the thread was never written or claimed.

    Raises:
        UndecodableRow: a cell of the row holds the wrong SQL type.
    """
    row = conn.execute(schema.GET_THREAD, (thread_id,)).fetchone()
    if row is None:
        return None
    next_seq, floor, holder, token, expires_at, run_id, incarnation = row
    # The common row (every write reads one) in one test, taken as it is;
    # the checks below name the cell of a row that fails it.
    if (
        type(next_seq) is int
        and type(floor) is int
        and type(incarnation) is int
        and (holder is None or type(holder) is str)
        and (token is None or type(token) is int)
        and (expires_at is None or type(expires_at) is float)
        and (run_id is None or type(run_id) is str)
    ):
        return _new_tuple(ThreadRow, row)
    # Checked here, once, because every fence and claim decision compares
    # these cells: text where a number belongs would raise TypeError from a
    # comparison, or silently never match.
    floor = _int_cell(thread_id, "floor", floor)  # first: next_seq derives from it
    return ThreadRow(
        _int_cell(thread_id, "next seq", next_seq),
        floor,
        _text_cell(thread_id, "holder", holder),
        _int_cell(thread_id, "token", token, nullable=True),
        _number_cell(thread_id, "expires_at", expires_at),
        _text_cell(thread_id, "run_id", run_id),
        _int_cell(thread_id, "incarnation", incarnation),
    )


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


def ensure_thread(conn: sqlite3.Connection, thread_id: str) -> ThreadRow:
    """Return the thread's row, creating it (counters at 1, no claim) if needed."""
    row = read_thread(conn, thread_id)
    if row is None:
        conn.execute(schema.ENSURE_THREAD, (thread_id,))
        row = ThreadRow(1, 1, None, None, None)
    return row


def check_fence(
    conn: sqlite3.Connection,
    thread_id: str,
    token: int | None,
    *,
    now: float,
    require_claim: bool,
) -> ThreadRow:
    """Check that a write may land on `thread_id`; return the thread's row.

    With a token, the thread's current claim must carry it (expiry is not
    considered). Without one, a live claim refuses the write, and so does
    `require_claim`.

    Raises:
        StaleClaim: the token is not the current claim's.
        ThreadBusy: an unfenced write met a live claim or `require_claim`.
    """
    row = ensure_thread(conn, thread_id)
    if token is not None:
        if row.token != token:
            raise stale(conn, thread_id, token)
        return row
    check_unfenced(
        thread_id, row.holder, row.live(now), require_claim, lambda: _latest(conn, thread_id)
    )
    return row


def next_seq_if_fenced(
    conn: sqlite3.Connection,
    thread_id: str,
    token: int | None,
    *,
    now: float,
    require_claim: bool,
    latest: tuple[str, str | None] | None = None,
) -> int | None:
    """Return the thread's next seq if `check_fence` would let the write land; else None.

    One cell read (`schema.NEXT_SEQ_IF_*`) instead of the thread row, for the
    common write. None says only "not known to land" (a refusal, a thread
    never written, a damaged row, a token no claim can hold): the caller
    then runs `check_fence`, which decides and raises as it always did.

    Args:
        latest: `(checkpoint_ns, parent_id)`: also require that the parent
            is the namespace's latest checkpoint (`checkpoints.check_version`).
    """
    if token is None:
        if require_claim:
            return None
        row = conn.execute(schema.NEXT_SEQ_IF_UNCLAIMED, (thread_id, now)).fetchone()
    elif not MIN_INT <= token <= MAX_INT:
        return None  # beyond 64 bits: no claim's token, and SQLite could not bind it
    elif latest is None:
        row = conn.execute(schema.NEXT_SEQ_IF_FENCED, (thread_id, token)).fetchone()
    else:
        row = conn.execute(
            schema.NEXT_SEQ_IF_FENCED_AND_LATEST, (thread_id, token, *latest)
        ).fetchone()
    if row is None or type(row[0]) is not int:
        return None
    seq: int = row[0]
    return seq


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


def _latest(conn: sqlite3.Connection, thread_id: str) -> str | None:
    row = conn.execute(schema.GET_LATEST_ID, (thread_id, "")).fetchone()
    return None if row is None else row[0]


def grant(
    conn: sqlite3.Connection,
    thread_id: str,
    holder: str,
    ttl: float,
    *,
    now: float,
    force: bool,
    run_id: str | None = None,
) -> Claim:
    """Grant a claim with a new token; unless `force`, only if none is live.

    Args:
        run_id: The run the claim is for, recorded on the claim (None for a
            plain claim or takeover; a replaced claim's run id goes with it).

    Raises:
        ThreadBusy: a live claim exists and `force` is false (nothing changes).
    """
    row = ensure_thread(conn, thread_id)
    if not force and row.live(now):
        raise ThreadBusy(thread_id, row.holder, _latest(conn, thread_id))
    issued = conn.execute(schema.NEXT_TOKEN).fetchone()
    if issued is None:
        # Without its counter a file could issue a token twice: refuse to guess.
        (path,) = conn.execute(schema.GET_MAIN_FILE).fetchone() or ("",)
        raise StoreError(
            "claim",
            path,
            message=(
                f"claim on {path}: the token counter (meta 'token_counter') is missing "
                "or not an integer; the file is damaged, and no token was issued"
            ),
        )
    token = issued[0]
    expires_at = now + ttl
    conn.execute(schema.SET_CLAIM, (holder, token, expires_at, now, run_id, thread_id))
    return Claim(thread_id, holder, token, expires_at)


def stale(conn: sqlite3.Connection, thread_id: str, token: int) -> StaleClaim:
    """Return the error for a `token` that is not the thread's claim.

    It names the current token and the latest claim granted (holder and
    token), which the thread row keeps after that claim ended, so a writer
    fenced off by a run that has finished since still learns who it was.
    """
    row = conn.execute(schema.GET_LAST_CLAIM, (thread_id,)).fetchone()
    if row is None:
        return StaleClaim(thread_id, token, None)
    current = _int_cell(thread_id, "token", row[0], nullable=True)
    holder = _text_cell(thread_id, "last_holder", row[1])
    latest = _int_cell(thread_id, "last_token", row[2], nullable=True)
    return StaleClaim(thread_id, token, current, holder, latest)


def renew(conn: sqlite3.Connection, thread_id: str, token: int, ttl: float, *, now: float) -> Claim:
    """Extend the claim carrying `token` to `now + ttl`.

    Raises:
        StaleClaim: `token` is not the thread's current claim.
    """
    return renew_run(conn, thread_id, token, ttl, now=now)[0]


def renew_run(
    conn: sqlite3.Connection, thread_id: str, token: int, ttl: float, *, now: float
) -> tuple[Claim, str | None]:
    """Extend the claim carrying `token`; return it and who asked its run to stop.

    Raises:
        StaleClaim: `token` is not the thread's current claim.
    """
    row = conn.execute(schema.RENEW_CLAIM, (now + ttl, thread_id, token)).fetchone()
    if row is None:
        raise stale(conn, thread_id, token)
    holder, _, expires_at = claim_row(thread_id, *row[:3])
    cancel_by = _text_cell(thread_id, "cancel_by", row[3])
    return Claim(thread_id, holder or "", token, expires_at or 0.0), cancel_by


def release(conn: sqlite3.Connection, thread_id: str, token: int) -> bool:
    """End the claim carrying `token`; any other token changes nothing.

    Returns:
        Whether a claim was released.
    """
    return conn.execute(schema.RELEASE_CLAIM, (thread_id, token)).rowcount > 0


def current_claim(conn: sqlite3.Connection, thread_id: str) -> Claim | None:
    """Return the thread's current claim (live or expired), or None."""
    row = read_thread(conn, thread_id)
    if row is None or row.token is None:
        return None
    return Claim(thread_id, row.holder or "", row.token, row.expires_at or 0.0)
