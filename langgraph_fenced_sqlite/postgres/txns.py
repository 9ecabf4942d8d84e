"""The PostgreSQL store's transactions: fence, claims, checkpoints, writes (removals: `removals`).

Invariant: every write begins by locking its thread's row, through `FENCE`
(with a token: checks it, locks, takes the position in one statement) or
`LOCK_THREAD` (without one: locks, then `claims.claim_live` judges the claim,
the one liveness rule both stores use). So a write and a takeover of its
thread are ordered by the row lock, and a write whose token was superseded
before it took the lock never lands. Checks follow docs/semantics.md §3's order
(fence, then version/identity) as the SQLite store's `checkpoints.put_txn` does.
Each function runs inside the transaction `PgConnection.run` opened; raising
rolls everything back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langgraph.checkpoint.base import WRITES_IDX_MAP
from psycopg.rows import tuple_row

from ..checkpoints import EncodedCheckpoint, EncodedWrite, Row, WriteRow
from ..checksums import checksum
from ..claims import Claim, claim_live
from ..errors import CheckpointConflict, StaleClaim, ThreadBusy
from ..events import NewEvent
from ..stored_json import dumps_json
from . import sql
from .events import append

Cursor = Any  # a psycopg cursor returning tuples
_FENCED_SOURCES = frozenset({"input", "loop"})


def _one(cur: Cursor, query: str, params: dict[str, Any]) -> Any:
    cur.execute(query, params)
    return cur.fetchone()


# --- the fence ------------------------------------------------------------------------


def fence(
    cur: Cursor, thread_id: str, token: int | None, *, now: float | None, require_claim: bool
) -> int:
    """Check that a write may land on `thread_id`, lock its row; return the commit's position.

    With a token, the thread's current claim must carry it (expiry is not
    considered). Without one, a live claim refuses the write, and so does
    `require_claim`.

    Raises:
        StaleClaim: the token is not the current claim's.
        ThreadBusy: an unfenced write met a live claim or `require_claim`.
    """
    if token is not None:
        row = _one(cur, sql.FENCE, {"thread_id": thread_id, "token": token})
        if row is None:
            raise stale(cur, thread_id, token)
        return int(row[0])
    holder, current, expires_at, at = _one(
        cur, sql.LOCK_THREAD, {"thread_id": thread_id, "now": now}
    )
    if claim_live(current, expires_at, at):
        raise ThreadBusy(thread_id, holder, latest_id(cur, thread_id))
    if require_claim:
        raise ThreadBusy(
            thread_id,
            holder,
            latest_id(cur, thread_id),
            message=(
                f"thread {thread_id!r}: this store requires a claim for every write "
                "(require_claim=True); claim the thread and pass claim.config()"
            ),
        )
    return int(_one(cur, sql.TAKE_POSITION, {"thread_id": thread_id, "n": 1})[0])


def append_events(
    cur: Cursor,
    thread_id: str,
    token: int,
    new: Sequence[NewEvent],
    *,
    now: float | None,
    notify: bool = True,
) -> list[int]:
    """Append caller events under the claim carrying `token`; return their seqs.

    Raises:
        StaleClaim: `token` is not the thread's claim.
    """
    position = fence(cur, thread_id, token, now=now, require_claim=True)
    return append(cur, thread_id, position, new, token=token, now=now, notify=notify)


def stale(cur: Cursor, thread_id: str, token: int) -> StaleClaim:
    """Return the error for a `token` that is not the thread's claim (naming who holds it)."""
    row = _one(cur, sql.GET_LAST_CLAIM, {"thread_id": thread_id})
    if row is None:
        return StaleClaim(thread_id, token, None)
    return StaleClaim(thread_id, token, row[0], row[1], row[2])


def latest_id(cur: Cursor, thread_id: str, checkpoint_ns: str = "") -> str | None:
    """Return the id of the namespace's latest checkpoint (by commit order), or None."""
    row = _one(cur, sql.GET_LATEST_ID, {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns})
    return None if row is None else row[0]


# --- claims ---------------------------------------------------------------------------


def grant(
    cur: Cursor,
    thread_id: str,
    holder: str,
    ttl: float,
    *,
    now: float | None,
    force: bool,
    run_id: str | None = None,
) -> Claim:
    """Grant a claim with a new token; unless `force`, only if none is live.

    The row is locked first and the token drawn after (`SET_CLAIM`), so
    concurrent grants on one thread commit tokens in increasing order.

    Raises:
        ThreadBusy: a live claim exists and `force` is false (nothing changes).
    """
    current_holder, token, expires_at, at = _one(
        cur, sql.LOCK_THREAD, {"thread_id": thread_id, "now": now}
    )
    if not force and claim_live(token, expires_at, at):
        raise ThreadBusy(thread_id, current_holder, latest_id(cur, thread_id))
    return set_claim(cur, thread_id, holder, ttl, at=at, run_id=run_id)


def set_claim(
    cur: Cursor, thread_id: str, holder: str, ttl: float, *, at: float, run_id: str | None
) -> Claim:
    """Grant a claim on a row this transaction has locked, judged free at time `at`."""
    new_token, new_expiry = _one(
        cur,
        sql.SET_CLAIM,
        {"thread_id": thread_id, "holder": holder, "at": at, "ttl": ttl, "run_id": run_id},
    )
    return Claim(thread_id, holder, int(new_token), float(new_expiry))


def renew(cur: Cursor, thread_id: str, token: int, ttl: float, *, now: float | None) -> Claim:
    """Extend the claim carrying `token` to now + `ttl` (the store's clock).

    Raises:
        StaleClaim: `token` is not the thread's current claim.
    """
    return renew_run(cur, thread_id, token, ttl, now=now)[0]


def renew_run(
    cur: Cursor, thread_id: str, token: int, ttl: float, *, now: float | None
) -> tuple[Claim, str | None]:
    """Extend the claim carrying `token`; return it and who asked its run to stop.

    Raises:
        StaleClaim: `token` is not the thread's current claim.
    """
    row = _one(
        cur, sql.RENEW_CLAIM, {"thread_id": thread_id, "token": token, "ttl": ttl, "now": now}
    )
    if row is None:
        raise stale(cur, thread_id, token)
    return Claim(thread_id, row[0] or "", token, float(row[1])), row[2]


def release(cur: Cursor, thread_id: str, token: int) -> bool:
    """End the claim carrying `token`; return whether one was released."""
    cur.execute(sql.RELEASE_CLAIM, {"thread_id": thread_id, "token": token})
    return bool(cur.rowcount)


def current_claim(cur: Cursor, thread_id: str) -> Claim | None:
    """Return the thread's claim (live or expired), or None."""
    row = _one(cur, sql.GET_CLAIM, {"thread_id": thread_id})
    if row is None or row[1] is None:
        return None
    return Claim(thread_id, row[0] or "", int(row[1]), float(row[2] or 0.0))


# --- checkpoints and writes -------------------------------------------------------------


def put(
    cur: Cursor,
    enc: EncodedCheckpoint,
    token: int | None,
    *,
    now: float | None,
    require_claim: bool,
    notify: bool = True,
) -> bool:
    """Store one checkpoint and its `checkpoint` event; return False for an identical retry.

    A fenced put sends its four statements in one pipeline; run it with
    `PgConnection.run(..., pipeline=True)` and BEGIN travels with them: two
    round trips in all, the second the COMMIT's (see `sql.INSERT_CHECKPOINT_AT_FENCE`).

    Raises:
        StaleClaim, ThreadBusy: the fence refused the write.
        CheckpointConflict: the parent is not the latest (fenced input/loop
            puts), or a different checkpoint is stored under this id.
    """
    event = _checkpoint_event(enc)
    if token is None:
        position = fence(cur, enc.thread_id, token, now=now, require_claim=require_claim)
        cur.execute(sql.INSERT_CHECKPOINT, _checkpoint_params(enc, token, now, position))
        inserted = bool(cur.rowcount)
        latest = _latest_before(cur, enc, position) if inserted else None
    else:
        conn = cur.connection
        params = _checkpoint_params(enc, token, now, None)
        data = dumps_json(dict(event.data), "event data")
        params.update(event_data=data, event_checksum=checksum(event.kind, data))
        with conn.pipeline():
            fenced, ins, ver, ev = (conn.cursor(row_factory=tuple_row) for _ in range(4))
            fenced.execute(sql.FENCE, params)
            ins.execute(sql.INSERT_CHECKPOINT_AT_FENCE, params)
            ver.execute(sql.LATEST_ID_BEFORE_FENCE, params)
            ev.execute(
                sql.INSERT_EVENT_AT_FENCE_NOTIFY if notify else sql.INSERT_EVENT_AT_FENCE, params
            )
        row = fenced.fetchone()
        if row is None:
            raise stale(cur, enc.thread_id, token)
        position = int(row[0])
        inserted = bool(ins.rowcount)
        found = ver.fetchone()
        latest = None if found is None else found[0]
    if not inserted:
        # An identical retry first (see the SQLite store's put_txn); it spent no seq.
        cur.execute(sql.ADJUST_SEQ, {"thread_id": enc.thread_id, "n": -1})
        key = {
            "thread_id": enc.thread_id,
            "checkpoint_ns": enc.checkpoint_ns,
            "checkpoint_id": enc.checkpoint_id,
        }
        stored = _one(cur, sql.GET_STORED_IDENTITY, key)
        mine = (enc.parent_id, enc.envelope, enc.values_type, enc.values_blob, enc.metadata)
        if stored is not None and tuple(stored) == mine:
            return False
        _check_version(enc, token, _latest_before(cur, enc, position))
        raise CheckpointConflict(
            enc.thread_id,
            enc.checkpoint_ns,
            enc.checkpoint_id,
            enc.checkpoint_id,
            message=(
                f"thread {enc.thread_id!r} namespace {enc.checkpoint_ns!r}: a different "
                f"checkpoint is already stored as {enc.checkpoint_id!r}"
            ),
        )
    _check_version(enc, token, latest)
    if token is None:
        append(cur, enc.thread_id, position, [event], token=token, now=now, notify=notify)
    return True


def _checkpoint_event(enc: EncodedCheckpoint) -> NewEvent:
    data: dict[str, Any] = {
        "step": enc.step,
        "source": enc.source,
        "parent_checkpoint_id": enc.parent_id,
    }
    if enc.run_id is not None:
        data["run_id"] = enc.run_id
    return NewEvent("checkpoint", data, enc.checkpoint_ns, enc.checkpoint_id)


def _checkpoint_params(
    enc: EncodedCheckpoint, token: int | None, now: float | None, position: int | None
) -> dict[str, Any]:
    return {
        "thread_id": enc.thread_id,
        "checkpoint_ns": enc.checkpoint_ns,
        "checkpoint_id": enc.checkpoint_id,
        "position": position,
        "parent_id": enc.parent_id,
        "envelope": enc.envelope,
        "values_type": enc.values_type,
        "values_blob": enc.values_blob,
        "metadata": enc.metadata,
        "source": enc.source,
        "step": enc.step,
        "run_id": enc.run_id,
        "token": token,
        "now": now,
        "checksum": enc.checksum,
    }


def _latest_before(cur: Cursor, enc: EncodedCheckpoint, position: int) -> str | None:
    row = _one(
        cur,
        sql.GET_LATEST_ID_BEFORE,
        {"thread_id": enc.thread_id, "checkpoint_ns": enc.checkpoint_ns, "position": position},
    )
    return None if row is None else row[0]


def _check_version(enc: EncodedCheckpoint, token: int | None, latest: str | None) -> None:
    """Refuse a fenced input/loop put whose parent is not the namespace's latest.

    `latest` is the namespace's latest checkpoint committed before this one.
    """
    if token is None or enc.source not in _FENCED_SOURCES:
        return
    if latest != enc.parent_id:
        raise CheckpointConflict(enc.thread_id, enc.checkpoint_ns, enc.parent_id, latest)


def put_writes(
    cur: Cursor,
    thread_id: str,
    checkpoint_ns: str,
    checkpoint_id: str,
    writes: Sequence[EncodedWrite],
    token: int | None,
    *,
    run_id: str | None,
    now: float | None,
    require_claim: bool,
    notify: bool = True,
) -> int:
    """Store pending writes and one `writes` event; return how many rows changed.

    The semantics are the SQLite store's `checkpoints.put_writes_txn`'s; a
    call that changes nothing appends no event and spends no seq. A fenced
    call sends everything in one pipeline, as `put` does (run it with
    `pipeline=True`).
    """
    data = {
        "task_id": writes[0].task_id,
        "task_path": writes[0].task_path,
        "channels": [w.channel for w in writes],
    }
    base: dict[str, Any] = {
        "thread_id": thread_id,
        "checkpoint_ns": checkpoint_ns,
        "checkpoint_id": checkpoint_id,
        "run_id": run_id,
        "token": token,
        "unfenced": token is None,
    }
    rows = [
        {
            **base,
            "task_id": w.task_id,
            "idx": w.idx,
            "task_path": w.task_path,
            "channel": w.channel,
            "type": w.type,
            "blob": w.blob,
            "checksum": w.checksum,
        }
        for w in writes
    ]
    if token is None:
        position = fence(cur, thread_id, token, now=now, require_claim=require_claim)
        changed = 0
        for params in rows:
            statement = (
                sql.UPSERT_WRITE_LAST_WINS
                if params["channel"] in WRITES_IDX_MAP
                else (sql.INSERT_WRITE_FIRST_WINS)
            )
            cur.execute(statement, {**params, "position": position})
            changed += cur.rowcount
        new = [NewEvent("writes", data, checkpoint_ns, checkpoint_id)] if changed else []
        append(cur, thread_id, position, new, token=token, now=now, notify=notify)
        return changed
    conn = cur.connection
    text = dumps_json(data, "event data")
    event = {**base, "event_data": text, "event_checksum": checksum("writes", text), "now": now}
    with conn.pipeline():
        fenced = conn.cursor(row_factory=tuple_row)
        fenced.execute(sql.FENCE, base)
        inserts = []
        for w, params in zip(writes, rows, strict=True):
            c = conn.cursor(row_factory=tuple_row)
            statement = (
                sql.UPSERT_WRITE_LAST_WINS_AT_FENCE
                if w.special
                else sql.INSERT_WRITE_FIRST_WINS_AT_FENCE
            )
            c.execute(statement, params)
            inserts.append(c)
        ev = conn.cursor(row_factory=tuple_row)
        ev.execute(
            sql.INSERT_WRITES_EVENT_AT_FENCE_NOTIFY if notify else sql.INSERT_WRITES_EVENT_AT_FENCE,
            event,
        )
    if fenced.fetchone() is None:
        raise stale(cur, thread_id, token)
    changed = sum(c.rowcount for c in inserts)
    if not changed:
        cur.execute(sql.ADJUST_SEQ, {"thread_id": thread_id, "n": -1})
    return changed


def fetch_tuple(
    cur: Cursor, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
) -> tuple[Row, list[WriteRow]] | None:
    """Read one checkpoint row (latest by position if no id) and its writes."""
    key = {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id}
    row = _one(cur, sql.GET_CHECKPOINT_BY_ID if checkpoint_id else sql.GET_LATEST_CHECKPOINT, key)
    if row is None:
        return None
    writes = fetch_writes_for(cur, [row])[(row[0], row[1], row[2])]
    return tuple(row), writes


def fetch_writes_for(
    cur: Cursor, rows: Sequence[Row]
) -> dict[tuple[str, str, str], list[WriteRow]]:
    """Read the writes of a page of checkpoints in one query."""
    out: dict[tuple[str, str, str], list[WriteRow]] = {(r[0], r[1], r[2]): [] for r in rows}
    if not rows:
        return out
    query, params = sql.writes_of_checkpoints(list(out))
    cur.execute(query, params)
    for t, ns, cid, *write in cur.fetchall():
        out[(t, ns, cid)].append(tuple(write))
    return out
