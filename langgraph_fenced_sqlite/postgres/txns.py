"""The PostgreSQL store's transactions: fence, claims, checkpoints, writes (removals: `removals`).

Invariant: every write begins by locking its thread's row, through `FENCE`
(with a token: checks it, locks, takes the position in one statement) or
`LOCK_THREAD` (without one: locks, then `claims.claim_live` judges the claim,
the one liveness rule both stores use). So a write and a takeover of its
thread are ordered by the row lock, and a write whose token was superseded
before it took the lock never lands. Checks follow docs/semantics.md §3's order
(fence, then version/identity), decided by the same functions as the SQLite
store's (`checkpoints.stored_put`, `check_version`, `claims.check_unfenced`).
Each function runs inside the transaction `PgConnection.run` opened; raising
rolls everything back. The `*_batch` functions build the one-round-trip form
of a fenced write or a read (`PgConnection.run`'s `batch`): a fenced write's
batch commits only what the statement-by-statement function would have
committed, and refuses itself (`lgfs_refuse`, all rolled back) otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from langgraph.checkpoint.base import WRITES_IDX_MAP
from psycopg.types.numeric import Int8

from ..core.checkpoints import (
    EncodedCheckpoint,
    EncodedWrite,
    Row,
    WriteRow,
    check_version,
    needs_version_check,
    stored_put,
)
from ..core.checksums import checksum
from ..core.claims import Claim, check_unfenced, claim_live
from ..core.events import (
    NewEvent,
    checkpoint_event_data,
    checkpoint_event_text,
    writes_event_data,
    writes_event_text,
)
from ..errors import StaleClaim, ThreadBusy
from . import sql
from .connection import Execute, Send
from .events import append
from .values import check_parent, put_params, store_blobs

Cursor = Any  # a psycopg cursor returning tuples
# Eight parameters a write (`sql.put_writes_at_fence`), 65535 a statement.
_MAX_BATCH_WRITES = 4096
_MAX_PARAMS = 65535
# Checksums are sent as int8 whatever their size: psycopg picks int2/4/8 by
# value and keys its prepared statements by the types it sent, so a checksum
# that fit int4 one time and not the next kept a statement from ever being
# prepared (the server then planned the put's statement on every call).


def _one(cur: Cursor, query: str, params: dict[str, Any]) -> Any:
    cur.execute(query, params)
    return cur.fetchone()


# --- the fence ------------------------------------------------------------------------


def fence(
    cur: Cursor, thread_id: str, token: int | None, *, now: float | None, require_claim: bool
) -> int:
    """Check that a write may land on `thread_id`, lock its row; return the commit's position.

    The rule is the SQLite store's `claims.check_fence`: a token must be the
    current claim's (`FENCE`, expiry not considered); without one,
    `claims.check_unfenced` decides.

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
    check_unfenced(
        thread_id,
        holder,
        bool(claim_live(current, expires_at, at)),
        require_claim,
        lambda: latest_id(cur, thread_id),
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
    concurrent grants on one thread commit tokens in increasing order. A
    grant that is not forced is refused without the lock when a read shows
    a live claim (`lock_unless_live`): a worker polling a busy thread never
    waits for, or holds up, its holder's writes.

    Raises:
        ThreadBusy: a live claim exists and `force` is false (nothing changes).
    """
    if force:
        current_holder, token, expires_at, at = _one(
            cur, sql.LOCK_THREAD, {"thread_id": thread_id, "now": now}
        )
    else:
        current_holder, token, expires_at, at, *_ = lock_unless_live(cur, thread_id, now)
    if not force and claim_live(token, expires_at, at):
        raise ThreadBusy(thread_id, current_holder, latest_id(cur, thread_id))
    return set_claim(cur, thread_id, holder, ttl, at=at, run_id=run_id)


def lock_run_thread(cur: Cursor, thread_id: str, now: float | None) -> tuple[Any, ...]:
    """Lock (creating) the thread's row; return its run cells (see `sql.LOCK_RUN_THREAD`)."""
    return tuple(_one(cur, sql.LOCK_RUN_THREAD, {"thread_id": thread_id, "now": now}))


def lock_unless_live(
    cur: Cursor,
    thread_id: str,
    now: float | None,
    *,
    judge: Callable[[Sequence[Any]], None] | None = None,
) -> tuple[Any, ...]:
    """Lock the thread's row as `lock_run_thread` does, unless a read that takes no lock refuses.

    The read (in `sql.LOCK_RUN_THREAD_UNLESS_LIVE`, one round trip) is one READ
    COMMITTED snapshot, which may be stale by the time it is used: it raises
    only what the locked path would have raised at that moment (`judge`'s
    error first, given the read's cells, then ThreadBusy for a claim live by
    the database's clock, read after the snapshot). A new thread, no claim,
    or an expired one is locked in the same statement and judged by the
    caller, under the lock.

    Raises:
        ThreadBusy: the thread has a live claim.
    """
    locked, *cells, latest = _one(
        cur, sql.LOCK_RUN_THREAD_UNLESS_LIVE, {"thread_id": thread_id, "now": now}
    )
    if locked:
        return tuple(cells)
    if judge is not None:
        judge(cells)
    holder, token, expires_at, at = cells[:4]
    if claim_live(token, expires_at, at):
        raise ThreadBusy(thread_id, holder, latest)
    # The statement saw a live claim that `claim_live` does not (a damaged
    # cell): the lock decides, as for any other claim that is not live.
    return lock_run_thread(cur, thread_id, now)


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

    Statement by statement, deciding in Python as the SQLite store's
    `checkpoints.put_txn` does (`stored_put`, `check_version`). A fenced put
    first tries `put_batch`, and comes here only when that batch refused.

    Raises:
        StaleClaim, ThreadBusy: the fence refused the write.
        CheckpointConflict: the parent is not the latest (fenced input/loop
            puts), or a different checkpoint is stored under this id.
        StaleParent: its values name rows of a parent that no longer holds
            them (`values.check_parent`).
    """
    position = fence(cur, enc.thread_id, token, now=now, require_claim=require_claim)
    cur.execute(sql.INSERT_CHECKPOINT, _checkpoint_params(enc, token, now, position))
    if not cur.rowcount:
        # Given back, for an identical retry (which spends no seq).
        cur.execute(sql.ADJUST_SEQ, {"thread_id": enc.thread_id, "n": -1})
        key = {
            "thread_id": enc.thread_id,
            "checkpoint_ns": enc.checkpoint_ns,
            "checkpoint_id": enc.checkpoint_id,
        }
        stored = _one(cur, sql.GET_STORED_IDENTITY, key)
        return stored_put(enc, token, stored, lambda: _latest_before(cur, enc, position))
    check_version(enc, token, lambda: _latest_before(cur, enc, position))
    store_blobs(cur, enc.thread_id, enc.checkpoint_ns, enc.blobs)
    check_parent(cur, enc)  # StaleParent: rolled back, the saver stores the values whole
    event = _checkpoint_event(enc)
    append(cur, enc.thread_id, position, [event], token=token, now=now, notify=notify)
    return True


def put_batch(
    enc: EncodedCheckpoint,
    token: int | None,
    *,
    now: float | None,
    require_claim: bool,
    notify: bool = True,
    late: Late | None = None,
) -> Send[bool] | None:
    """Return a put as one statement in one round trip (a `batch`); None under `require_claim`
    without a token (`put` refuses it).

    `late`: called when the put takes its step's writes into its statement
    (`_PutBatch.join`), with where to register what runs at its commit and
    the keys of those writes: the put's value rows naming those of them that
    came while it encoded (`lending.lend_late`), or None when nothing changes.

    `sql.put_at_fence` runs `put`'s statements in the server
    (`lgfs_put_values`): the fence (or, unfenced, the thread's row with no
    claim on it), the checkpoint, the version check, its event, its value
    rows and its parent's check. It commits only a new checkpoint whose
    parent passes the checks; anything else (a stale token, a claimed thread
    for an unfenced put, a stored id, a parent not the latest, a parent
    that no longer holds the values named) refuses it, and `put` decides.
    None too for more value rows than one statement takes.
    """
    if token is None and require_claim:
        return None
    blobs = len(enc.blobs)
    if sql.PUT_PARAMS + sql.BLOB_PARAMS * blobs > _MAX_PARAMS:
        return None
    params = _checkpoint_params(enc, token, now, None)
    data = checkpoint_event_text(enc.step, enc.source, enc.parent_id, enc.run_id)
    params.update(
        event_data=data,
        event_checksum=Int8(checksum("checkpoint", data)),
        check_version=needs_version_check(enc.source, token),
        notify=notify,
    )
    params.update(put_params(enc.blobs, enc.borrows))
    return _PutBatch(params, blobs, late)


# `put_batch`'s `late`: given where to register what runs once the joint
# statement committed, the put's value rows as they are to be stored now (as
# many), or None.
OnCommit = Callable[[Callable[[], None]], None]
Late = Callable[[OnCommit, frozenset[tuple[str, str, int]]], Sequence[Any] | None]


class _PutBatch:
    """A put's batch (`put_batch`); `join` takes its step's writes into its statement."""

    __slots__ = ("blobs", "late", "params")

    def __init__(self, params: dict[str, Any], blobs: int, late: Late | None = None) -> None:
        self.params, self.blobs, self.late = params, blobs, late

    def __call__(self, execute: Execute) -> Callable[[], bool]:
        execute(sql.put_at_fence(self.blobs), self.params)
        return _stored

    def join(self, writes: Sequence[Any]) -> Send[tuple[bool, list[int]]] | None:
        """Return `writes` (`put_writes_batch`es, in order) and this put as one statement.

        `sql.put_after_writes`: the calls run in that order in one implicit
        transaction, each as its own statement would have, and any refusal
        rolls all of it back, as a pipeline of their statements would; but
        it costs psycopg one statement, not one each and a pipeline's.
        Returns None (send them as they are) for anything else, or more
        parameters than one statement takes. The reader returns the put's
        result and each call's changed rows.
        """
        if not writes or any(type(w) is not _PutWritesBatch for w in writes):
            return None
        counts = tuple(w.count for w in writes)
        own = sql.PUT_PARAMS + sql.BLOB_PARAMS * self.blobs
        if 8 * sum(counts) + 9 * len(counts) + own > _MAX_PARAMS:
            return None
        statement = sql.put_after_writes(counts, self.blobs)
        params = dict(self.params)
        committed: list[Callable[[], None]] = []
        if self.late is not None:
            # The step's writes, all encoded by now: the put names those of
            # them that came while it encoded, checked in the same statement.
            rows = self.late(committed.append, frozenset().union(*(w.keys for w in writes)))
            if rows is not None:
                params.update(put_params(rows, params["borrows"]))
        for i, w in enumerate(writes):
            prefix = f"w{i}_"
            params.update({prefix + k: v for k, v in w.params.items()})
            # NOTIFY once per transaction: the put's (as ever, at its commit).
            params[prefix + "notify"] = False

        def send(execute: Execute) -> Callable[[], tuple[bool, list[int]]]:
            done = execute(statement, params)

            def finish() -> tuple[bool, list[int]]:
                row = done.fetchone()
                assert row is not None  # the statement returns one row
                for then in committed:
                    then()
                return True, [int(c) for c in row[1:]]

            return finish

        return send


def _stored() -> bool:
    return True


def _checkpoint_event(enc: EncodedCheckpoint) -> NewEvent:
    data = checkpoint_event_data(enc.step, enc.source, enc.parent_id, enc.run_id)
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
        "checksum": Int8(enc.checksum),
    }


def _latest_before(cur: Cursor, enc: EncodedCheckpoint, position: int) -> str | None:
    row = _one(
        cur,
        sql.GET_LATEST_ID_BEFORE,
        {"thread_id": enc.thread_id, "checkpoint_ns": enc.checkpoint_ns, "position": position},
    )
    return None if row is None else row[0]


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
    call first tries `put_writes_batch`, and comes here only when it refused.
    """
    base = _write_params(thread_id, checkpoint_ns, checkpoint_id, token, run_id)
    data = writes_event_data(writes[0].task_id, writes[0].task_path, [w.channel for w in writes])
    position = fence(cur, thread_id, token, now=now, require_claim=require_claim)
    changed = 0
    for w in writes:
        last_wins = w.channel in WRITES_IDX_MAP
        statement = sql.UPSERT_WRITE_LAST_WINS if last_wins else sql.INSERT_WRITE_FIRST_WINS
        params = {
            **base,
            "task_id": w.task_id,
            "idx": w.idx,
            "task_path": w.task_path,
            "channel": w.channel,
            "type": w.type,
            "blob": w.blob,
            "checksum": Int8(w.checksum),
            "position": position,
        }
        cur.execute(statement, params)
        changed += cur.rowcount
    new = [NewEvent("writes", data, checkpoint_ns, checkpoint_id)] if changed else []
    append(cur, thread_id, position, new, token=token, now=now, notify=notify)
    return changed


def put_writes_batch(
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
) -> Send[int] | None:
    """Return a `put_writes` as one statement, one round trip (a `batch`); None under
    `require_claim` without a token (`put_writes` refuses it).

    `sql.put_writes_at_fence` runs `put_writes`' statements in the server
    (`lgfs_put_writes`: the fence, or unfenced the thread's row with no claim
    on it, the writes, and the event or the position given back when nothing
    changed; a stale token or a claimed thread refuses the batch, and
    `put_writes` decides). The reader returns how many rows changed.
    None too for a call that writes one special (task, idx) twice, or more
    than `_MAX_BATCH_WRITES` writes (a statement takes at most 65535 parameters).
    """
    specials = [(w.task_id, w.idx) for w in writes if w.special]
    if token is None and require_claim:
        return None
    if len(set(specials)) < len(specials) or len(writes) > _MAX_BATCH_WRITES:
        return None
    base = _write_params(thread_id, checkpoint_ns, checkpoint_id, token, run_id)
    text = writes_event_text(writes[0].task_id, writes[0].task_path, [w.channel for w in writes])
    params = {**base, "event_data": text, "event_checksum": Int8(checksum("writes", text))}
    params.update(now=now, notify=notify)
    for w, names in zip(writes, sql.put_writes_param_names(len(writes)), strict=True):
        values = (w.task_id, Int8(w.idx), w.task_path, w.channel, w.type, w.blob)
        params.update(zip(names, (*values, Int8(w.checksum), w.special), strict=True))
    keys = frozenset((checkpoint_id, w.task_id, w.idx) for w in writes)
    return _PutWritesBatch(params, len(writes), keys)


class _PutWritesBatch:
    """A put_writes' batch (`put_writes_batch`), which a put may join (`_PutBatch.join`)."""

    __slots__ = ("count", "keys", "params")

    def __init__(
        self, params: dict[str, Any], count: int, keys: frozenset[tuple[str, str, int]]
    ) -> None:
        # `keys`: each write's (checkpoint_id, task_id, idx).
        self.params, self.count, self.keys = params, count, keys

    def __call__(self, execute: Execute) -> Callable[[], int]:
        done = execute(sql.put_writes_at_fence(self.count), self.params)

        def changed() -> int:
            row = done.fetchone()
            assert row is not None  # the statement returns one row
            return int(row[0])

        return changed


def _write_params(
    thread_id: str,
    checkpoint_ns: str,
    checkpoint_id: str,
    token: int | None,
    run_id: str | None,
) -> dict[str, Any]:
    base: dict[str, Any] = {
        "thread_id": thread_id,
        "checkpoint_ns": checkpoint_ns,
        "checkpoint_id": checkpoint_id,
        "run_id": run_id,
        "token": token,
        "unfenced": token is None,
    }
    return base


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


# What a one-statement read returns: its checkpoint rows, their writes by
# checkpoint key, and the value rows their refs name.
_Found = tuple[Row, list[WriteRow], list[Any]]
_Page = tuple[list[Row], dict[tuple[str, str, str], list[WriteRow]], list[Any]]


def fetch_tuple_batch(
    thread_id: str,
    checkpoint_ns: str,
    checkpoint_id: str | None,
    known: tuple[str, bytes] | None = None,
) -> Send[_Found | None]:
    """`fetch_tuple` as one statement, one round trip (`sql.TUPLE_BY_ID`/`TUPLE_LATEST`).

    Its reader returns the checkpoint row, its writes and the value rows its
    refs name, unless it is `known` (`(checkpoint_id, refs)` of the one this
    process holds), whose value rows it leaves out.
    """
    # None known: an id no checkpoint has (ids are never empty). Never None:
    # psycopg keys its prepared statements by the types it sent.
    key = {
        "thread_id": thread_id,
        "checkpoint_ns": checkpoint_ns,
        "checkpoint_id": checkpoint_id,
        "known_id": "" if known is None else known[0],
        "known_refs": b"" if known is None else known[1],
    }
    statement = sql.TUPLE_BY_ID if checkpoint_id is not None else sql.TUPLE_LATEST

    def send(execute: Execute) -> Callable[[], _Found | None]:
        found = execute(statement, key)

        def finish() -> _Found | None:
            rows = found.fetchall()
            if not rows:
                return None
            writes, blobs = [], []
            for r in rows[1:]:
                if r[0] == 1:
                    writes.append(tuple(r[_WRITES]))
                else:
                    blobs.append(tuple(r[_BLOBS]))
            return tuple(rows[0][_CHECKPOINT]), writes, blobs

        return finish

    return send


_CHECKPOINT_WIDTH = len(sql.CHECKPOINT_COLUMNS.split(","))
# A `fetch_tuple_batch` row's cells: after its kind, a checkpoint's, a write's, a value row's.
_CHECKPOINT = slice(1, 1 + _CHECKPOINT_WIDTH)
_WRITES = slice(1 + _CHECKPOINT_WIDTH, 8 + _CHECKPOINT_WIDTH)
_BLOBS = slice(8 + _CHECKPOINT_WIDTH, 20 + _CHECKPOINT_WIDTH)


def list_page_batch(statement: str, params: dict[str, Any]) -> Send[_Page]:
    """One page of `list` (`sql.list_checkpoints`), its writes and its values, as one statement.

    `sql.page_with_writes`: its rows are the page's checkpoints, then their
    writes, then the value rows their refs name, each marked by its first
    column (0, 1 or 2).
    """

    def send(execute: Execute) -> Callable[[], _Page]:
        done = execute(sql.page_with_writes(statement), params)

        def finish() -> _Page:
            rows: list[Row] = []
            out: dict[tuple[str, str, str], list[WriteRow]] = {}
            blobs: list[Any] = []
            for r in done.fetchall():
                if r[0] == 0:
                    rows.append(tuple(r[1:13]))
                    out[(r[1], r[2], r[3])] = []
                elif r[0] == 1:
                    out[(r[13], r[14], r[15])].append(tuple(r[16:23]))
                else:
                    blobs.append(tuple(r[23:35]))
            return rows, out, blobs

        return finish

    return send
