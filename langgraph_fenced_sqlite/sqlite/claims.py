"""Claims (leases) on threads and the fencing tokens that guard writes, on SQLite.

Invariant: tokens come from one counter per file, incremented inside the
transaction that grants the claim, so each is greater than every token issued
before in that file and none is issued twice. Every function here runs inside
a transaction the engine opened; `check_fence` is the first check of every
write, before any version check, so a stale writer learns nothing else. The
rules these transactions apply are `core/claims.py`'s.
"""

from __future__ import annotations

import sqlite3

from ..core.claims import (
    Claim,
    ThreadRow,
    _int_cell,
    _new_tuple,
    _number_cell,
    _text_cell,
    check_unfenced,
    claim_row,
)
from ..core.stored_json import MAX_INT, MIN_INT
from ..errors import StaleClaim, StoreError, ThreadBusy
from . import schema

__all__ = ["check_fence", "current_claim", "grant", "read_thread", "release", "renew"]


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
