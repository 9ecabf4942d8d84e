"""All of the PostgreSQL store's SQL: `MIGRATIONS` and named statements.

Invariant: every fenced write's first statement is `FENCE`, an `UPDATE ...
WHERE thread_id = %s AND token = %s RETURNING ...`: one statement checks the
fence, locks the thread's row until commit (so a takeover waits for the write,
or the write sees the takeover) and hands out the commit's gap-free position.
A `SELECT` as the fence check would let a stale write land under READ
COMMITTED (the takeover commits between the check and the insert). Tokens are
drawn from `lgfs_tokens` only after the row is locked (`LOCK_THREAD`, then
`SET_CLAIM`): drawn before, two concurrent takeovers could commit in the other
order and lower the thread's token. Expiry is judged by `NOW`, the database's
clock (or a time the caller passes, for tests), never a worker host's.

Key columns use the "C" collation: LangGraph's `list` orders and pages by
checkpoint id, and a linguistic collation (en_US...) ignores the dashes of a
UUID, so ids would sort differently from every other store.

Table names carry an `lgfs_` prefix, so this store shares a database with
LangGraph's `PostgresSaver` (whose tables are `checkpoints`, ...). Builders
return `(sql, params)`; nothing here executes anything.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from ..core.status import ERROR, INTERRUPT, RESUME
from ..core.stored_json import dumps_json
from ..core.values import LENT
from .sql_functions import (
    BEGIN_RUN,
    FENCED_WRITES,
    ONE_WRITE,
    PUT_VALUES,
    THREAD_TAGS,
    UNFENCED,
    VALUE_TABLE,
)

# The SQLSTATE `lgfs_refuse` raises (migration 4): a batch that refused itself.
REFUSED = "LGFS1"

# The stored version is the number of migrations applied; append only.
MIGRATIONS: list[str] = [
    "CREATE TABLE IF NOT EXISTS lgfs_migrations (v integer PRIMARY KEY)",
    """
    CREATE SEQUENCE lgfs_tokens;
    CREATE TABLE lgfs_threads (
        thread_id text COLLATE "C" PRIMARY KEY,
        next_seq bigint NOT NULL DEFAULT 1,
        holder text,
        token bigint,
        expires_at double precision,
        claimed_at double precision,
        last_holder text,
        last_token bigint
    );
    CREATE TABLE lgfs_checkpoints (
        thread_id text COLLATE "C" NOT NULL,
        checkpoint_ns text COLLATE "C" NOT NULL,
        checkpoint_id text COLLATE "C" NOT NULL,
        position bigint NOT NULL,
        parent_checkpoint_id text,
        envelope text NOT NULL,
        values_type text NOT NULL,
        values_blob bytea NOT NULL,
        metadata text NOT NULL,
        source text,
        step bigint,
        run_id text,
        token bigint,
        created_at double precision NOT NULL,
        checksum bigint NOT NULL,
        PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
    );
    CREATE INDEX lgfs_checkpoints_latest ON lgfs_checkpoints (thread_id, checkpoint_ns, position);
    CREATE INDEX lgfs_checkpoints_run ON lgfs_checkpoints (run_id) WHERE run_id IS NOT NULL;
    CREATE TABLE lgfs_writes (
        thread_id text COLLATE "C" NOT NULL,
        checkpoint_ns text COLLATE "C" NOT NULL,
        checkpoint_id text COLLATE "C" NOT NULL,
        task_id text NOT NULL,
        idx integer NOT NULL,
        task_path text NOT NULL,
        channel text NOT NULL,
        type text NOT NULL,
        blob bytea NOT NULL,
        position bigint NOT NULL,
        run_id text,
        token bigint,
        checksum bigint NOT NULL,
        PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
    );
    CREATE INDEX lgfs_writes_run ON lgfs_writes (run_id) WHERE run_id IS NOT NULL;
    """,
    # 2: the event log. Its seqs are the commit positions `FENCE` hands out;
    # `incarnation` counts a thread's lives (delete_thread starts a new one).
    """
    ALTER TABLE lgfs_threads ADD COLUMN incarnation bigint NOT NULL DEFAULT 1;
    CREATE TABLE lgfs_events (
        thread_id text COLLATE "C" NOT NULL,
        seq bigint NOT NULL,
        kind text NOT NULL,
        checkpoint_ns text,
        checkpoint_id text,
        data text NOT NULL,
        token bigint,
        ts double precision NOT NULL,
        checksum bigint NOT NULL,
        PRIMARY KEY (thread_id, seq)
    );
    """,
    # 3: runs (`begin_run` ... `end_run`). `run_id` is the run the claim was
    # granted for (NULL for a plain claim), `cancel_by` who asked that run to
    # stop (it goes with the claim), `tenant` whose thread it is (NULL: none).
    """
    ALTER TABLE lgfs_threads ADD COLUMN run_id text;
    ALTER TABLE lgfs_threads ADD COLUMN cancel_by text;
    ALTER TABLE lgfs_threads ADD COLUMN tenant text;
    """,
    # 4: the replay floor (`compact_events`): events below it are gone, and a
    # reader asking from below it gets `ReplayUnavailable`, never a gap.
    """
    ALTER TABLE lgfs_threads ADD COLUMN floor bigint NOT NULL DEFAULT 1;
    """,
    # 5: `lgfs_refuse`, which a one-round-trip batch (`PgConnection.run`'s
    # `batch`) calls to roll itself back when the fast path does not apply;
    # the caller then decides in a transaction of its own. VOLATILE (the
    # default), so the planner never evaluates it ahead of its CASE branch.
    # The server logs each refusal as an ERROR ("lgfs: ..."): a stale token,
    # an identical retry or a version conflict, each rare.
    f"""
    CREATE OR REPLACE FUNCTION lgfs_refuse(reason text) RETURNS bigint
    LANGUAGE plpgsql AS $$
    BEGIN RAISE EXCEPTION USING ERRCODE = '{REFUSED}', MESSAGE = 'lgfs: ' || reason; END $$;
    """,
    # 6: a fenced put and put_writes as one statement each: the functions
    # `lgfs_put` and `lgfs_put_writes` (`sql_functions.FENCED_WRITES`).
    FENCED_WRITES,
    # 7: `lgfs_put_write`, `lgfs_put_writes` for a call of one write
    # (`sql_functions.ONE_WRITE`).
    ONE_WRITE,
    # 8: `lgfs_begin_run`, a run's common grant in one statement
    # (`sql_functions.BEGIN_RUN`).
    BEGIN_RUN,
    # 9: the columns that hold a checkpoint's or a write's payload compressed
    # with lz4 where the server offers it (PostgreSQL 14 and later, built
    # with lz4; elsewhere nothing changes). A value over the 2 KB TOAST
    # threshold is compressed on every put and inflated on every read, with
    # pglz by default: measured on a 40-message chat history (18 KB msgpack),
    # a put took 858 us with pglz and 609 us with lz4 (PostgresSaver's, on
    # pglz, 736 us). Only the catalog changes (no rewrite): stored values
    # keep their compression and stay readable; new ones take lz4.
    """
    DO $$
    BEGIN
        IF EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression'
                AND 'lz4' = ANY(enumvals)) THEN
            ALTER TABLE lgfs_checkpoints ALTER COLUMN values_blob SET COMPRESSION lz4,
                ALTER COLUMN envelope SET COMPRESSION lz4,
                ALTER COLUMN metadata SET COMPRESSION lz4;
            ALTER TABLE lgfs_writes ALTER COLUMN blob SET COMPRESSION lz4;
        END IF;
    END $$;
    """,
    # 10: `lgfs_put`, `lgfs_put_write` and `lgfs_put_writes` take an unfenced
    # write (a NULL token) in their one statement too (`sql_functions.UNFENCED`).
    UNFENCED,
    # 11: the value table `lgfs_blobs` (channel values stored once each, the
    # SQLite store's schema 5), `lgfs_refs` and `lgfs_put_values`
    # (`sql_functions.VALUE_TABLE`).
    VALUE_TABLE,
    # 12: thread search's index of each thread's latest root metadata,
    # `lgfs_thread_tags`, kept by triggers (`sql_functions.THREAD_TAGS`).
    THREAD_TAGS,
    # 13: thread expiry, as the SQLite store's migration 6 -> 7: a thread's
    # own TTL (`ttl`, `ttl_strategy`) and the sweepers' bookkeeping
    # `ttl_seen` (the activity a sweep last saw, a lower bound; NULL: not
    # seen; 'Infinity': parked, nothing left to expire), with the indexes a
    # sweep finds due threads through (idempotent, as the migrations before
    # it: run again, it changes nothing). Every commit already updates its
    # thread's row (`next_seq`); the trigger un-parks a parked thread there,
    # and leaves every other update as it was (heap-only: no indexed column
    # changes).
    """
    ALTER TABLE lgfs_threads ADD COLUMN IF NOT EXISTS ttl double precision,
        ADD COLUMN IF NOT EXISTS ttl_strategy text,
        ADD COLUMN IF NOT EXISTS ttl_seen double precision;
    CREATE INDEX IF NOT EXISTS lgfs_threads_ttl_seen ON lgfs_threads (ttl_seen);
    CREATE INDEX IF NOT EXISTS lgfs_threads_ttl_due ON lgfs_threads ((ttl_seen + ttl))
        WHERE ttl IS NOT NULL;
    CREATE INDEX IF NOT EXISTS lgfs_threads_ttl_unseen ON lgfs_threads (thread_id)
        WHERE ttl_seen IS NULL AND ttl IS NOT NULL;
    CREATE OR REPLACE FUNCTION lgfs_unpark_ttl() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN NEW.ttl_seen := NULL; RETURN NEW; END $$;
    DROP TRIGGER IF EXISTS lgfs_threads_unpark_ttl ON lgfs_threads;
    CREATE TRIGGER lgfs_threads_unpark_ttl BEFORE UPDATE OF next_seq ON lgfs_threads
        FOR EACH ROW WHEN (OLD.ttl_seen = 'Infinity'::float8 AND NEW.next_seq > OLD.next_seq)
        EXECUTE FUNCTION lgfs_unpark_ttl();
    """,
    # 14: `lgfs_put_values` refuses a put whose borrow rows name a pending
    # write not stored as named (`sql_functions.PUT_VALUES`, `values.LENT`).
    # Every removal of writes makes the borrow rows naming them whole first;
    # an earlier version would not, and it refuses a newer schema.
    PUT_VALUES,
]
SCHEMA_VERSION = len(MIGRATIONS)

# Serialises concurrent `setup()` calls (any number of hosts) on one database.
MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(7314942706151652193)"
GET_VERSION = "SELECT coalesce(max(v), 0) FROM lgfs_migrations"
SET_VERSION = "INSERT INTO lgfs_migrations (v) VALUES (%s)"
# `stats()`: the last token issued (0 before the first), and the row counts.
STATS = (
    "SELECT (SELECT coalesce(max(v), 0) FROM lgfs_migrations), "
    "(SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM lgfs_tokens), "
    "(SELECT count(*) FROM lgfs_threads), (SELECT count(*) FROM lgfs_checkpoints), "
    "(SELECT count(*) FROM lgfs_writes), (SELECT count(*) FROM lgfs_events)"
)
HAS_MIGRATIONS_TABLE = "SELECT to_regclass('lgfs_migrations') IS NOT NULL"

# --- read-only stores and vacuum (`connection.py`, `saver_retention.py`) -----------------

# The first statement of a `readonly` store's transaction when its session
# does not make every transaction read-only already: the server refuses any
# write in it (SQLSTATE 25006), whatever path sent it.
READ_ONLY_TRANSACTION = "SET TRANSACTION READ ONLY"
# What `from_conn_string(readonly=True)` sets on the connection it opens.
READ_ONLY_SESSION = "SET default_transaction_read_only = on"
# The store's tables (the sequence `lgfs_tokens` has nothing to vacuum).
TABLES = (
    "lgfs_threads",
    "lgfs_checkpoints",
    "lgfs_blobs",
    "lgfs_thread_tags",
    "lgfs_writes",
    "lgfs_events",
    "lgfs_migrations",
)
# Plain VACUUM, never FULL: it takes no lock that stops writers (FULL rewrites
# each table under an ACCESS EXCLUSIVE lock), and makes dead rows' space
# reusable; ANALYZE refreshes the planner's statistics after a large prune.
VACUUM_TABLES = f"VACUUM (ANALYZE) {', '.join(TABLES)}"
# Their size with indexes and TOAST, in bytes (0 for a table that is missing).
STORE_BYTES = (
    "SELECT coalesce(sum(pg_total_relation_size(to_regclass(t))), 0)::bigint "
    "FROM unnest(%(tables)s::text[]) AS t"
)

# The store's time in seconds since the epoch: the parameter when the caller
# passes one (an injected clock), else the database server's clock, so that
# hosts whose clocks disagree still agree on when a claim expires.
NOW = "coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)"
GET_NOW = f"SELECT {NOW}"

# --- who waits on a thread: NOTIFY only for them -------------------------------------


# NOTIFY serialises committing transactions (measured with fsync on, 8
# clients: about a fifth fewer puts a second), so a commit notifies only if
# someone waits on its thread. A waiter of this library, in any process,
# holds a shared session lock on the thread's listen key (`HEAR`) from before
# its LISTEN and its first read until it gives its connection back. A commit
# that notifies tries to take that key itself in its transaction (`heard`):
# a waiter holds it, so it cannot, and notifies; nobody does, so it can,
# and holds it until it commits: a waiter arriving meanwhile waits for the
# commit, then reads it. A spurious NOTIFY (two commits of one thread at
# once) costs a read; none is missed. The key names the thread, not the
# schema, as the channels do: a waiter's own connection may not have its
# store's `search_path` (one set after connecting), and a thread of the same
# name in another schema waited on costs its commits a NOTIFY, nothing more.
def _listen_key(thread_id: str) -> str:
    return f"hashtextextended('lgfs-listen:' || {thread_id}, 0)"


def heard(prefix: str = "") -> str:
    """The SQL that says a commit of `%({prefix}thread_id)s` must notify (see `HEAR`)."""
    return f"NOT pg_try_advisory_xact_lock({_listen_key(f'%({prefix}thread_id)s')})"


HEAR = (
    "SELECT set_config('lock_timeout', %(timeout)s, false), "
    f"pg_advisory_lock_shared({_listen_key('%(thread_id)s')})"
)


# --- threads, claims, fence -------------------------------------------------------

# The fence: checks the token, locks the row, takes the commit's position.
FENCE = (
    "UPDATE lgfs_threads SET next_seq = next_seq + 1 "
    "WHERE thread_id = %(thread_id)s AND token = %(token)s RETURNING next_seq - 1"
)
# Create the thread's row if needed and lock it; return its claim and the time
# read after the lock was had (a call that waited judges expiry when it decides).
LOCK_THREAD = (
    "INSERT INTO lgfs_threads AS t (thread_id) VALUES (%(thread_id)s) "
    "ON CONFLICT (thread_id) DO UPDATE SET thread_id = t.thread_id "
    f"RETURNING t.holder, t.token, t.expires_at, {NOW}"
)
# An unfenced write the caller has judged allowed, on a row it has locked.
TAKE_POSITION = (
    "UPDATE lgfs_threads SET next_seq = next_seq + %(n)s "
    "WHERE thread_id = %(thread_id)s RETURNING next_seq - %(n)s"
)
# Grant a claim on a locked row; the token is drawn here, after the lock. The
# claim records the run it is for (NULL: a plain claim) and drops a cancel
# asked of the claim before.
SET_CLAIM = (
    "UPDATE lgfs_threads SET token = nextval('lgfs_tokens'), holder = %(holder)s, "
    "expires_at = %(at)s + %(ttl)s, claimed_at = %(at)s, last_holder = %(holder)s, "
    "last_token = currval('lgfs_tokens'), run_id = %(run_id)s, cancel_by = NULL "
    "WHERE thread_id = %(thread_id)s RETURNING token, expires_at"
)
# `begin_run`'s grant, which also takes the commit's position for its events
# (the fence under the new token, on the row the grant locked): one round trip.
SET_RUN_CLAIM = (
    "UPDATE lgfs_threads SET token = nextval('lgfs_tokens'), holder = %(holder)s, "
    "expires_at = %(at)s + %(ttl)s, claimed_at = %(at)s, last_holder = %(holder)s, "
    "last_token = currval('lgfs_tokens'), run_id = %(run_id)s, cancel_by = NULL, "
    "next_seq = next_seq + 1 WHERE thread_id = %(thread_id)s "
    "RETURNING token, expires_at, next_seq - 1"
)
# Whether a run wrote a thread (a run fenced off since is stale: `core.run_fence`).
RUN_WROTE = (
    "SELECT EXISTS (SELECT 1 FROM lgfs_checkpoints WHERE run_id = %(run_id)s "
    "AND thread_id = %(thread_id)s) OR EXISTS (SELECT 1 FROM lgfs_writes "
    "WHERE run_id = %(run_id)s AND thread_id = %(thread_id)s)"
)
# Also returns who asked the claim's run to stop (NULL: nobody), so a run's
# renewal learns of a cancel in the statement that renews it.
RENEW_CLAIM = (
    f"UPDATE lgfs_threads SET expires_at = {NOW} + %(ttl)s "
    "WHERE thread_id = %(thread_id)s AND token = %(token)s RETURNING holder, expires_at, cancel_by"
)
RELEASE_CLAIM = (
    "UPDATE lgfs_threads SET holder = NULL, token = NULL, expires_at = NULL, claimed_at = NULL, "
    "run_id = NULL, cancel_by = NULL WHERE thread_id = %(thread_id)s AND token = %(token)s"
)
GET_CLAIM = "SELECT holder, token, expires_at FROM lgfs_threads WHERE thread_id = %(thread_id)s"
GET_LAST_CLAIM = (
    "SELECT token, last_holder, last_token FROM lgfs_threads WHERE thread_id = %(thread_id)s"
)
# delete_thread: the claim goes with the thread (its holder is fenced off), and
# a thread that is more than a tombstone (in its first incarnation, claimed, or
# holding anything: the SQLite store's `TOMBSTONE_THREAD` rule) starts its next
# incarnation, numbered from 1 again, so a reader of the old one is told
# (ReplayUnavailable), not misled. A thread claimed and released with nothing
# written counts too: else it would stay listed by `threads()` once deleted.
NEW_INCARNATION = (
    "UPDATE lgfs_threads SET holder = NULL, token = NULL, expires_at = NULL, claimed_at = NULL, "
    "run_id = NULL, cancel_by = NULL, incarnation = incarnation "
    "+ CASE WHEN incarnation = 1 OR next_seq > 1 OR token IS NOT NULL THEN 1 ELSE 0 END, "
    "next_seq = 1, floor = 1 WHERE thread_id = %(thread_id)s"
)
# A commit that appends n events took one position at the fence: give back
# or take the difference (the row is locked, so seqs stay gap-free).
ADJUST_SEQ = "UPDATE lgfs_threads SET next_seq = next_seq + %(n)s WHERE thread_id = %(thread_id)s"

# --- runs (`runs.py`) -----------------------------------------------------------------

# Whether thread row `t` holds anything a tenant could own (an event or a checkpoint).
_HOLDS_DATA = (
    "t.next_seq > 1 OR EXISTS (SELECT 1 FROM lgfs_checkpoints c WHERE c.thread_id = t.thread_id)"
)
# `LOCK_THREAD` for a run: also the claim's run, the thread's tenant, whether
# it holds anything a tenant could own, and whether this statement created the
# row (an inserted row version has no xmax; an upserted one has ours).
LOCK_RUN_THREAD = (
    "INSERT INTO lgfs_threads AS t (thread_id) VALUES (%(thread_id)s) "
    "ON CONFLICT (thread_id) DO UPDATE SET thread_id = t.thread_id "
    f"RETURNING t.holder, t.token, t.expires_at, {NOW}, t.run_id, t.tenant, {_HOLDS_DATA}, "
    "t.xmax::text = '0'"
)
# `LOCK_RUN_THREAD` for a grant that does not take over (a run, a claim,
# `delete_unclaimed`: `txns.lock_unless_live`), unless the thread's claim is
# live: it first reads the row without locking it (`peek`, the same cells,
# and the latest root checkpoint for ThreadBusy), and locks (creating) it
# only if that read shows no live claim. One round trip either way. The
# first column says which: true, the locked row's cells (then NULL); false,
# the read's (then the latest root checkpoint id), with no lock taken and
# nothing written. The time of the read is taken after its snapshot, so a
# claim live by it was live at that snapshot's moment. This comparison only
# chooses not to lock: the caller judges the cells with `claim_live`.
LOCK_RUN_THREAD_UNLESS_LIVE = (
    f"WITH peek AS (SELECT t.holder, t.token, t.expires_at, {NOW} AS now, t.run_id, t.tenant, "
    f"{_HOLDS_DATA}, false, (SELECT c.checkpoint_id FROM lgfs_checkpoints c "
    "WHERE c.thread_id = t.thread_id AND c.checkpoint_ns = '' ORDER BY c.position DESC LIMIT 1) "
    "FROM lgfs_threads t WHERE t.thread_id = %(thread_id)s), "
    "locked AS (INSERT INTO lgfs_threads AS t (thread_id) SELECT %(thread_id)s "
    "WHERE NOT EXISTS (SELECT 1 FROM peek WHERE peek.now < peek.expires_at "
    "AND peek.token IS NOT NULL) ON CONFLICT (thread_id) DO UPDATE SET thread_id = t.thread_id "
    f"RETURNING t.holder, t.token, t.expires_at, {NOW}, t.run_id, t.tenant, {_HOLDS_DATA}, "
    "t.xmax::text = '0') "
    "SELECT true, locked.*, NULL FROM locked "
    "UNION ALL SELECT false, peek.* FROM peek WHERE NOT EXISTS (SELECT 1 FROM locked)"
)
# `begin_run` in one statement (`runs.begin_run_batch`, migration 8): a live
# claim's holder, token, expiry and the latest root checkpoint (not granted),
# or the grant (granted), or a refusal (`lgfs_refuse`) for `runs.begin_run`.
BEGIN_RUN_AT_LOCK = (
    "SELECT * FROM lgfs_begin_run(%(thread_id)s, %(holder)s, %(ttl)s::float8, %(run_id)s, "
    f"%(now)s::float8, %(data)s, %(checksum)s, (%(notify)s AND {heard()}))"
)
# A thread's tenant and whether it holds anything (no row: a new thread).
GET_TENANT = f"SELECT t.tenant, {_HOLDS_DATA} FROM lgfs_threads t WHERE t.thread_id = %(thread_id)s"
SET_TENANT = (
    "UPDATE lgfs_threads SET tenant = %(tenant)s WHERE thread_id = %(thread_id)s AND tenant IS NULL"
)
# Ask the current claim's run to stop, and take the commit's position for its
# (unfenced) event; no row when nothing holds the thread.
REQUEST_CANCEL = (
    "UPDATE lgfs_threads SET cancel_by = %(by)s, next_seq = next_seq + 1 "
    "WHERE thread_id = %(thread_id)s AND token IS NOT NULL "
    "RETURNING holder, token, expires_at, run_id, next_seq - 1"
)
# The latest root checkpoint and how many interrupt writes it has pending.
LATEST_INTERRUPTS = (
    "SELECT c.checkpoint_id, (SELECT count(*) FROM lgfs_writes w WHERE w.thread_id = "
    "c.thread_id AND w.checkpoint_ns = '' AND w.checkpoint_id = c.checkpoint_id "
    "AND w.channel = '__interrupt__') FROM lgfs_checkpoints c "
    "WHERE c.thread_id = %(thread_id)s AND c.checkpoint_ns = '' ORDER BY c.position DESC LIMIT 1"
)
# A turn (`retract_turn`, a "rollback" run): what `retention.plan_retraction`
# reads of every checkpoint, by commit position; then its checkpoints by key,
# and the writes of those, with the run's writes (or, for a turn found by its
# input checkpoint, every write from its position on).
TURN_SKELETON = (
    "SELECT checkpoint_ns, checkpoint_id, position, source, run_id FROM lgfs_checkpoints "
    "WHERE thread_id = %(thread_id)s ORDER BY position"
)
DELETE_CHECKPOINTS_BY_KEY = (
    "DELETE FROM lgfs_checkpoints c USING unnest(%(namespaces)s::text[], %(ids)s::text[]) "
    "AS k(ns, id) WHERE c.thread_id = %(thread_id)s AND c.checkpoint_ns = k.ns "
    "AND c.checkpoint_id = k.id"
)
# Each removal of some of a thread's writes returns them, so that the borrow
# rows naming their bytes are made whole (`values.unlend`).
_GONE = (
    " RETURNING w.checkpoint_ns, w.checkpoint_id, w.task_id, w.idx, w.channel, w.type, w.blob, "
    "w.checksum"
)
DELETE_WRITES_OF_TURN = (
    "DELETE FROM lgfs_writes w WHERE w.thread_id = %(thread_id)s AND ("
    "(%(run_id)s::text IS NOT NULL AND w.run_id = %(run_id)s) "
    "OR (%(run_id)s::text IS NULL AND w.position >= %(start)s) "
    "OR (w.checkpoint_ns, w.checkpoint_id) IN (SELECT k.ns, k.id FROM "
    "unnest(%(namespaces)s::text[], %(ids)s::text[]) AS k(ns, id)))" + _GONE
)
# An operator's release: lock the row only if the thread exists.
LOCK_CLAIM = (
    f"SELECT holder, token, expires_at, run_id, {NOW} FROM lgfs_threads "
    "WHERE thread_id = %(thread_id)s FOR UPDATE"
)
# Only for a row made in the same transaction (a thread that never existed).
DELETE_THREAD_ROW = "DELETE FROM lgfs_threads WHERE thread_id = %(thread_id)s"

# --- events -------------------------------------------------------------------------

# Appends a commit's events. With notify, the same statement queues one
# NOTIFY (payload: the thread id, a hint) that PostgreSQL delivers at commit:
# one per transaction, since NOTIFY serialises committing transactions.
_INSERT_EVENTS = (
    "INSERT INTO lgfs_events (thread_id, seq, kind, checkpoint_ns, checkpoint_id, data, token, "
    f"ts, checksum) SELECT %(thread_id)s, e.seq, e.kind, e.ns, e.cid, e.data, %(token)s, {NOW}, "
    "e.checksum FROM unnest(%(seqs)s::bigint[], %(kinds)s::text[], %(nss)s::text[], "
    "%(cids)s::text[], %(datas)s::text[], %(sums)s::bigint[]) AS e(seq, kind, ns, cid, data, "
    "checksum)"
)
INSERT_EVENTS = _INSERT_EVENTS
# The notifications, each only if someone waits (`heard`), in a subquery:
# a FROM item of the INSERT's SELECT, evaluated once however many events.
_NOTIFY_EVENTS = f"CASE WHEN {heard()} THEN pg_notify('lgfs_events', %(thread_id)s) END"
_NOTIFY_RUNS = f"CASE WHEN {heard()} THEN pg_notify('lgfs_runs', %(thread_id)s) END"
INSERT_EVENTS_NOTIFY = _INSERT_EVENTS + f", (SELECT {_NOTIFY_EVENTS}) AS n"
# A transaction that ends a run (`status.RUN_ENDS`) notifies `lgfs_runs`
# too: a worker waiting for the thread ("enqueue", `runqueue.Place`) listens
# to that channel alone, so a run's steps (each commit notifies
# `lgfs_events`, and wakes every listener of it) do not wake it. The
# transaction already notifies: a second channel adds no serialisation
# (PostgreSQL queues a transaction's notifications at its commit, at once).
INSERT_EVENTS_NOTIFY_END = _INSERT_EVENTS + f", (SELECT {_NOTIFY_EVENTS}, {_NOTIFY_RUNS}) AS n"
# `end_run` in one statement (`runs.end_run_batch`): the fence and the
# release in one UPDATE (`FENCE` and `RELEASE_CLAIM`'s assignments: it takes
# the row lock and the position), then the end event at that position. A
# `run_completed` event names the latest root checkpoint and its interrupts,
# made into the event (and its checksum) by the client beforehand from what
# this saver committed (`check_latest`): the statement checks it against its
# snapshot, which it trusts only if that holds the commit just before this
# one (every commit that takes positions logs its last event at the last of
# them, and commits take them under the row lock, in commit order; a commit
# made while this statement waited for the lock is not in its snapshot).
# A stale token (a superseded run: the fence matched no row, so nothing was
# written) answers 0, unless `raise_stale` (StaleClaim needs the current
# claim's holder): no refusal, no ERROR in the server's log, one round trip.
# Anything else refuses (`lgfs_refuse`) and `runs.end_run` decides statement
# by statement.
_END_RUN_AT_FENCE = (
    "WITH f AS (UPDATE lgfs_threads SET next_seq = next_seq + 1, holder = NULL, token = NULL, "
    "expires_at = NULL, claimed_at = NULL, run_id = NULL, cancel_by = NULL "
    "WHERE thread_id = %(thread_id)s AND token = %(token)s RETURNING next_seq - 1 AS seq), "
    "e AS (INSERT INTO lgfs_events (thread_id, seq, kind, checkpoint_ns, checkpoint_id, data, "
    f"token, ts, checksum) SELECT %(thread_id)s, f.seq, %(kind)s, '', NULL, %(data)s, "
    f"%(token)s, {NOW}, %(checksum)s FROM f WHERE NOT %(check_latest)s OR ((f.seq = 1 OR "
    "EXISTS (SELECT 1 FROM lgfs_events p WHERE p.thread_id = %(thread_id)s "
    "AND p.seq = f.seq - 1)) AND (SELECT c.checkpoint_id FROM lgfs_checkpoints c "
    "WHERE c.thread_id = %(thread_id)s AND c.checkpoint_ns = '' ORDER BY c.position DESC "
    "LIMIT 1) IS NOT DISTINCT FROM %(latest_id)s::text AND (SELECT count(*) FROM lgfs_writes w "
    "WHERE w.thread_id = %(thread_id)s AND w.checkpoint_ns = '' "
    "AND w.checkpoint_id = %(latest_id)s::text AND w.channel = '__interrupt__') "
    "= %(interrupts)s::bigint) RETURNING seq) "
    "SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM f) AND NOT %(raise_stale)s THEN 0 "
    "WHEN e.seq IS NULL THEN lgfs_refuse('end_run: stale token, or not the latest "
    "expected') ELSE e.seq END"
)
_END_RUN_FROM = " FROM (SELECT 1) AS one LEFT JOIN e ON true"
END_RUN_AT_FENCE = _END_RUN_AT_FENCE + _END_RUN_FROM
END_RUN_AT_FENCE_NOTIFY = _END_RUN_AT_FENCE + f", {_NOTIFY_EVENTS}, {_NOTIFY_RUNS}" + _END_RUN_FROM
NOTIFY_CHANNEL = "lgfs_events"
LISTEN = "LISTEN lgfs_events"
UNLISTEN = "UNLISTEN lgfs_events"
LISTEN_RUNS = "LISTEN lgfs_runs"
UNLISTEN_RUNS = "UNLISTEN lgfs_runs"
# One waiting process at a time listens for a thread's run to end and then
# claims it (`PgEventPoller.lead`): the one holding this session advisory
# lock, keyed by the schema and the thread; the others wait for the lock in
# the server's queue, asleep, up to `lock_timeout` at a time. Only who tries
# when: the claim decides who runs.
LEAD_TIMEOUT = "SELECT set_config('lock_timeout', %(timeout)s, false)"
LEAD = (
    "SELECT pg_advisory_lock(hashtextextended('lgfs-enqueue:' || current_schema() || ':' "
    "|| %(thread_id)s, 0))"
)
# Every `LEAD` lock of the session: a listener given back for the next
# waiter (`listeners.IdleListeners`) holds none.
UNLEAD_ALL = "SELECT pg_advisory_unlock_all()"
# In `events.decode_event`'s order.
EVENTS_AFTER = (
    "SELECT seq, kind, checkpoint_ns, checkpoint_id, data, token, ts, checksum FROM lgfs_events "
    "WHERE thread_id = %(thread_id)s AND seq > %(after)s ORDER BY seq LIMIT %(limit)s"
)
# What a reader's position is checked against: floor and incarnation.
GET_REPLAY_BOUNDS = "SELECT floor, incarnation FROM lgfs_threads WHERE thread_id = %(thread_id)s"
# `events_after` in one statement (one snapshot, one round trip): the bounds
# on every row, then `EVENTS_AFTER`'s columns (NULL on the one row of a
# thread with no event after the position); no row for an unknown thread.
EVENTS_AFTER_WITH_BOUNDS = (
    "SELECT t.floor, t.incarnation, e.seq, e.kind, e.checkpoint_ns, e.checkpoint_id, e.data, "
    "e.token, e.ts, e.checksum FROM lgfs_threads t LEFT JOIN LATERAL (SELECT * FROM lgfs_events "
    "e WHERE e.thread_id = t.thread_id AND e.seq > %(after)s ORDER BY e.seq LIMIT %(limit)s) e "
    "ON true WHERE t.thread_id = %(thread_id)s ORDER BY e.seq"
)
# `compact_events`: the floor goes up to min(before, next seq), never down,
# and only in the incarnation asked for (NULL: the current one); no row comes
# back for an unknown thread or another incarnation.
RAISE_FLOOR = (
    "UPDATE lgfs_threads SET floor = GREATEST(floor, LEAST(%(before)s, next_seq)) "
    "WHERE thread_id = %(thread_id)s "
    "AND (%(incarnation)s::bigint IS NULL OR incarnation = %(incarnation)s) RETURNING floor"
)
GET_FLOOR = "SELECT floor FROM lgfs_threads WHERE thread_id = %(thread_id)s"
# `read_tail`: the last seq handed out and the incarnation.
GET_EVENT_TAIL = (
    "SELECT next_seq - 1, incarnation FROM lgfs_threads WHERE thread_id = %(thread_id)s"
)
DELETE_EVENTS_BELOW = "DELETE FROM lgfs_events WHERE thread_id = %(thread_id)s AND seq < %(floor)s"
DELETE_THREAD_EVENTS = "DELETE FROM lgfs_events WHERE thread_id = %(thread_id)s"

# --- checkpoints ----------------------------------------------------------------------

# In `checkpoints.decode_tuple`'s order (the SQLite store's `_CHECKPOINT_COLUMNS`).
CHECKPOINT_COLUMNS = (
    "thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, envelope, "
    "values_type, values_blob, metadata, position, token, created_at, checksum"
)
INSERT_CHECKPOINT = (
    "INSERT INTO lgfs_checkpoints (thread_id, checkpoint_ns, checkpoint_id, position, "
    "parent_checkpoint_id, envelope, values_type, values_blob, metadata, source, step, "
    "run_id, token, created_at, checksum) VALUES (%(thread_id)s, %(checkpoint_ns)s, "
    "%(checkpoint_id)s, %(position)s, %(parent_id)s, %(envelope)s, %(values_type)s, "
    "%(values_blob)s, %(metadata)s, %(source)s, %(step)s, %(run_id)s, %(token)s, "
    f"{NOW}, %(checksum)s) ON CONFLICT DO NOTHING"
)
# The fenced put's batch (`txns.put_batch`), one statement: `lgfs_put_values`
# (migration 11) calls `lgfs_put` (migration 6), which stores the checkpoint
# at the position its fence took, with its event (and NOTIFY), or refuses
# (`lgfs_refuse`): the token is not the claim's, the id is already stored, or
# (`check_version`) the parent is not the latest; then it stores the
# checkpoint's value rows, and refuses if the parent whose rows it names no
# longer holds them. `txns.put` then decides in a transaction of its own.
_PUT_ARGS = (
    "%(thread_id)s, %(checkpoint_ns)s, %(checkpoint_id)s, %(parent_id)s, "
    "%(envelope)s, %(values_type)s, %(values_blob)s, %(metadata)s, %(source)s, "
    "%(step)s::bigint, %(run_id)s, %(token)s, %(now)s::float8, %(checksum)s, %(event_data)s, "
    f"%(event_checksum)s, %(check_version)s, (%(notify)s AND {heard()})"
)
# A put's value rows (`values.Blob`, less its thread and namespace), one array
# per column: `(parameter name, SQL type)`, in `lgfs_put_values`' order.
_BLOB_ARRAYS = (
    ("v_channel", "text"),
    ("v_key", "text"),
    ("v_base", "text"),
    ("v_type", "text"),
    ("v_items", "int"),
    ("v_ordinal", "int"),
    ("v_codec", "text"),
    ("v_size", "int"),
    ("v_data", "bytea"),
    ("v_sum", "bigint"),
)
# Parameters a put's statement has, at most, besides its value rows' (`put_at_fence`).
PUT_PARAMS = 20
BLOB_PARAMS = len(_BLOB_ARRAYS)


@functools.lru_cache(maxsize=64)
def put_values_param_names(n: int) -> tuple[tuple[str, ...], ...]:
    """The parameter names of `put_at_fence(n)`'s value rows, per row, in `_BLOB_ARRAYS` order."""
    return tuple(tuple(f"{name}{i}" for name, _ in _BLOB_ARRAYS) for i in range(n))


def _put_call(n: int) -> str:
    """The `lgfs_put_values` call of a put with `n` value rows (params `v_channel0`, ...).

    Each array is spelled `ARRAY[%(v_channel0)s::text, ...]`, one parameter
    per row, as `put_writes_at_fence`'s are (psycopg dumps a scalar in C, a
    list in Python).
    """
    arrays = ", ".join(
        "ARRAY[" + ", ".join(f"%({name}{i})s::{cast}" for i in range(n)) + "]"
        if n
        else f"ARRAY[]::{cast}[]"
        for name, cast in _BLOB_ARRAYS
    )
    return f"lgfs_put_values({_PUT_ARGS}, {arrays}, %(borrows)s::bytea)"


@functools.lru_cache(maxsize=64)
def put_at_fence(n: int) -> str:
    """Build the put's batch statement for a checkpoint with `n` value rows (`_put_call`)."""
    return f"SELECT {_put_call(n)}"


_KEY = "thread_id = %(thread_id)s AND checkpoint_ns = %(checkpoint_ns)s"
GET_CHECKPOINT_BY_ID = (
    f"SELECT {CHECKPOINT_COLUMNS} FROM lgfs_checkpoints "
    f"WHERE {_KEY} AND checkpoint_id = %(checkpoint_id)s"
)
GET_LATEST_CHECKPOINT = (
    f"SELECT {CHECKPOINT_COLUMNS} FROM lgfs_checkpoints WHERE {_KEY} ORDER BY position DESC LIMIT 1"
)
GET_LATEST_ID = (
    f"SELECT checkpoint_id FROM lgfs_checkpoints WHERE {_KEY} ORDER BY position DESC LIMIT 1"
)
GET_LATEST_ID_BEFORE = (
    f"SELECT checkpoint_id FROM lgfs_checkpoints WHERE {_KEY} AND position < %(position)s "
    "ORDER BY position DESC LIMIT 1"
)
GET_STORED_IDENTITY = (
    "SELECT parent_checkpoint_id, envelope, values_type, values_blob, metadata "
    f"FROM lgfs_checkpoints WHERE {_KEY} AND checkpoint_id = %(checkpoint_id)s"
)
DELETE_THREAD_CHECKPOINTS = "DELETE FROM lgfs_checkpoints WHERE thread_id = %(thread_id)s"
DELETE_THREAD_WRITES = "DELETE FROM lgfs_writes WHERE thread_id = %(thread_id)s"

# --- writes ---------------------------------------------------------------------------

_WRITE_INSERT = (
    "INSERT INTO lgfs_writes AS w (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, "
    "task_path, channel, type, blob, position, run_id, token, checksum) VALUES "
    "(%(thread_id)s, %(checkpoint_ns)s, %(checkpoint_id)s, %(task_id)s, %(idx)s, "
    "%(task_path)s, %(channel)s, %(type)s, %(blob)s, %(position)s, %(run_id)s, %(token)s, "
    "%(checksum)s) "
)
# Regular writes: first writer wins per (task_id, idx); a retry is a no-op.
INSERT_WRITE_FIRST_WINS = _WRITE_INSERT + "ON CONFLICT DO NOTHING"
# Special channels: last writer wins, never over a greater token's write,
# except for an unfenced write the fence accepted (no live claim: see the
# SQLite store's UPSERT_WRITE_LAST_WINS). An identical retry changes nothing.
_LAST_WINS = (
    "ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) "
    "DO UPDATE SET task_path = excluded.task_path, channel = excluded.channel, "
    "type = excluded.type, blob = excluded.blob, position = excluded.position, "
    "run_id = excluded.run_id, token = excluded.token, checksum = excluded.checksum "
    "WHERE (coalesce(excluded.token, 0) >= coalesce(w.token, 0) OR %(unfenced)s) "
    "AND (w.channel IS DISTINCT FROM excluded.channel OR w.type IS DISTINCT FROM excluded.type "
    "OR w.blob IS DISTINCT FROM excluded.blob OR w.task_path IS DISTINCT FROM excluded.task_path)"
)
UPSERT_WRITE_LAST_WINS = _WRITE_INSERT + _LAST_WINS
# The fenced put_writes' batch (`txns.put_writes_batch`), one statement:
# `lgfs_put_writes` (migration 6) stores every write at the position its fence
# took (regular channels first-writer-wins, special ones `_LAST_WINS`), then
# the one `writes` event if a row changed, else gives the position back, so
# the commit spends no seq; a stale token refuses. Returns how many rows
# changed. The writes travel as arrays, so any number is one statement; a call
# writing one special (task, idx) twice goes statement by statement (one
# INSERT cannot update a row twice).
_PUT_WRITES_ARRAYS = (
    ("task_id", "text"),
    ("idx", "int"),
    ("task_path", "text"),
    ("channel", "text"),
    ("type", "text"),
    ("blob", "bytea"),
    ("sum", "bigint"),
    ("special", "bool"),
)


@functools.lru_cache(maxsize=32)
def put_writes_param_names(n: int) -> tuple[tuple[str, ...], ...]:
    """The parameter names of `put_writes_at_fence(n)`, per write, in `_PUT_WRITES_ARRAYS` order."""
    return tuple(tuple(f"{name}{i}" for name, _ in _PUT_WRITES_ARRAYS) for i in range(n))


@functools.lru_cache(maxsize=32)
def put_writes_at_fence(n: int) -> str:
    """Build the fenced put_writes' statement for `n` writes (params `task_id0`, `idx0`, ...).

    Each array is spelled `ARRAY[%(task_id0)s::text, ...]` of one parameter per
    write: psycopg dumps a list in Python (about 20 us for each of the eight
    arrays, half a put_writes' client CPU), a scalar in C.
    """
    return f"SELECT {_put_writes_call(n, '')}"


def _put_writes_call(n: int, prefix: str) -> str:
    """The `lgfs_put_writes` call of `put_writes_at_fence(n)`, each parameter name prefixed.

    One write calls `lgfs_put_write` (migration 7), the same with scalars.
    """
    if n == 1:
        return (
            f"lgfs_put_write(%({prefix}thread_id)s, %({prefix}checkpoint_ns)s, "
            f"%({prefix}checkpoint_id)s, %({prefix}run_id)s, %({prefix}token)s, "
            f"%({prefix}now)s::float8, %({prefix}event_data)s, %({prefix}event_checksum)s, "
            + ", ".join(f"%({prefix}{name}0)s::{cast}" for name, cast in _PUT_WRITES_ARRAYS)
            + f", (%({prefix}notify)s AND {heard(prefix)}))"
        )
    arrays = ", ".join(
        "ARRAY[" + ", ".join(f"%({prefix}{name}{i})s::{cast}" for i in range(n)) + "]"
        for name, cast in _PUT_WRITES_ARRAYS
    )
    return (
        f"lgfs_put_writes(%({prefix}thread_id)s, %({prefix}checkpoint_ns)s, "
        f"%({prefix}checkpoint_id)s, %({prefix}run_id)s, %({prefix}token)s, "
        f"%({prefix}now)s::float8, %({prefix}event_data)s, %({prefix}event_checksum)s, {arrays}, "
        f"(%({prefix}notify)s AND {heard(prefix)}))"
    )


@functools.lru_cache(maxsize=32)
def put_after_writes(counts: tuple[int, ...], blobs: int) -> str:
    """Build a step's joint batch as one statement: its writes' calls in order, then its put.

    `counts[i]` is how many writes the i-th `put_writes` call has; its
    parameters are `put_writes_at_fence`'s prefixed `w{i}_`, the put's are
    `put_at_fence(blobs)`'s. Each call is the select list of a subquery the next one
    reads from (`OFFSET 0` keeps the planner from merging them), so each runs
    only once the one before it returned: the order the calls came in, as a
    pipeline of their statements would run them, in one statement's implicit
    transaction. The row holds the put's (void) result, then each call's
    changed rows. Each function takes its own snapshots after its fence's
    lock (module `sql_functions`), so a later call sees what an earlier one
    wrote.
    """
    source, columns = "", list[str]()
    for i, n in enumerate(counts):
        call = f"{_put_writes_call(n, f'w{i}_')} AS c{i}"
        source = f" FROM (SELECT {', '.join([*columns, call])}{source} OFFSET 0) AS s{i}"
        columns.append(f"c{i}")
    return f"SELECT {_put_call(blobs)}, {', '.join(columns)}{source}"


# The writes of a page of checkpoints, in `writes_sort_key` order.
_WRITE_COLUMNS = (
    "w.thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.channel, w.type, "
    "w.blob, w.task_path, w.idx, w.checksum"
)
_WRITES_ORDER = "ORDER BY w.task_path, w.task_id, w.idx"
WRITES_OF_CHECKPOINTS = (
    f"SELECT {_WRITE_COLUMNS} FROM lgfs_writes w "
    "JOIN unnest(%(threads)s::text[], %(namespaces)s::text[], %(ids)s::text[]) "
    "AS k(t, ns, id) ON w.thread_id = k.t AND w.checkpoint_ns = k.ns AND w.checkpoint_id = k.id "
    f"{_WRITES_ORDER}"
)
# --- channel values (core/values.py, migration 11) --------------------------------------

# A value row as `value_reads.resolve_rows` reads it: its thread and namespace,
# then `values.Blob`'s cells.
_BLOB_ROW = (
    "b.thread_id, b.checkpoint_ns, b.channel, b.key, b.base, b.type, b.items, b.ordinal, "
    "b.codec, b.size, b.data, b.checksum"
)
_NO_BLOB = (
    "NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::int, "
    "NULL::int, NULL::text, NULL::int, NULL::bytea, NULL::bigint"
)
_ON_WANT = "ON b.thread_id = w.t AND b.checkpoint_ns = w.n AND b.channel = w.c AND b.key = w.k"
# The value rows `want` names, and the pending writes borrow rows among them
# name (`values.LENT`), each as the row `(LENT, "cid/task/idx")` holding its
# channel, type, idx, blob and checksum (`value_reads` reads it so): a
# derived table `b` of `lgfs_blobs`' columns, for `SELECT {_BLOB_ROW} FROM`.
_LENT_CELL = "substring(b.data from 1 for 5) = '\\x7b2277223a'::bytea"  # starts {"w":
_WANTED = (
    f"(SELECT b.* FROM want w JOIN lgfs_blobs b {_ON_WANT} UNION ALL SELECT l.thread_id, "
    f"l.checkpoint_ns, '{LENT}' COLLATE \"C\", (l.cid || '/' || l.task || '/' || l.idx) "
    'COLLATE "C", wr.channel COLLATE "C", wr.type, wr.idx, 0, \'write\', 0, wr.blob, '
    "wr.checksum FROM (SELECT b.thread_id, b.checkpoint_ns, x.cell -> 'w' ->> 0 AS cid, "
    "x.cell -> 'w' ->> 1 AS task, x.cell -> 'w' ->> 2 AS idx "
    f"FROM want w JOIN lgfs_blobs b {_ON_WANT} "
    "CROSS JOIN LATERAL (SELECT lgfs_refs(b.data) AS cell) x "
    f"WHERE b.codec = 'borrow' AND {_LENT_CELL} "
    # OFFSET 0: a subquery of its own, so `lgfs_refs` runs once per borrow
    # row, never once per write row the join compares it with.
    "AND jsonb_typeof(x.cell -> 'w') = 'array' OFFSET 0) l JOIN lgfs_writes wr "
    "ON wr.thread_id = l.thread_id AND wr.checkpoint_ns = l.checkpoint_ns "
    "AND wr.checkpoint_id = l.cid AND wr.task_id = l.task AND wr.idx::text = l.idx) b"
)
# A value row `b`'s edges to the rows a read of it needs, as `e(c, k)`: the
# row it extends (its `base`), and the row a borrow row (`values.BORROW`)
# takes its bytes from, named by its JSON cell (`lgfs_refs`, parsed once: none
# for a damaged cell, which its reader then refuses). Join after `lgfs_blobs b`.
_EDGES = (
    "CROSS JOIN LATERAL (SELECT CASE WHEN b.codec = 'borrow' THEN lgfs_refs(b.data) END "
    'AS cell) x CROSS JOIN LATERAL (VALUES (b.channel, b.base COLLATE "C"), '
    "((x.cell ->> 'c') COLLATE \"C\", (x.cell ->> 'k') COLLATE \"C\")) AS e(c, k)"
)


def _want(source: str) -> str:
    """The recursive CTE `want(t, n, c, k)`: the value rows the refs of `source` name.

    `source` is a FROM item with columns `thread_id`, `checkpoint_ns` and
    `values_blob`, holding only checkpoints of the value table. Each refs
    cell names a row per channel (`lgfs_refs`: none for a damaged cell,
    which its reader then refuses), and each row the row it extends, back
    to its whole value, and the row it borrows from (`_EDGES`): one
    statement, so one snapshot with the checkpoint rows it reads them with.
    UNION, not UNION ALL: a damaged `base` naming a row of its own chain
    ends the walk instead of looping (the reader then refuses the value).
    """
    return (
        'want(t, n, c, k) AS (SELECT s.thread_id, s.checkpoint_ns, j.key COLLATE "C", '
        f'j.value COLLATE "C" FROM {source} CROSS JOIN LATERAL '
        "jsonb_each_text(lgfs_refs(s.values_blob)) j UNION SELECT b.thread_id, "
        f"b.checkpoint_ns, e.c, e.k FROM want w JOIN lgfs_blobs b {_ON_WANT} {_EDGES} "
        "WHERE e.k IS NOT NULL)"
    )


# The value rows `(thread, ns, channel, key)` of the arrays name, and those
# each extends or borrows from (a read that decoded the refs itself, in its
# snapshot).
READ_BLOBS = (
    'WITH RECURSIVE want(t, n, c, k) AS (SELECT u.t COLLATE "C", u.n COLLATE "C", '
    'u.c COLLATE "C", u.k COLLATE "C" FROM unnest(%(threads)s::text[], '
    "%(namespaces)s::text[], %(channels)s::text[], %(keys)s::text[]) AS u(t, n, c, k) "
    "UNION SELECT b.thread_id, b.checkpoint_ns, e.c, e.k FROM want w "
    f"JOIN lgfs_blobs b {_ON_WANT} {_EDGES} WHERE e.k IS NOT NULL) "
    f"SELECT {_BLOB_ROW} FROM {_WANTED}"
)
# A put's value rows, statement by statement (`txns.put`, `repack`), as
# `lgfs_put_values` stores them: the single extensions a merged row now
# holds become prefixes of it (if still single extensions), then the other
# rows, unless stored (keys name content). Arrays in `_BLOB_ARRAYS` order.
_BLOB_UNNEST = (
    "unnest(%(channels)s::text[], %(keys)s::text[], %(bases)s::text[], %(types)s::text[], "
    "%(items)s::int[], %(ordinals)s::int[], %(codecs)s::text[], %(sizes)s::int[], "
    "%(datas)s::bytea[], %(sums)s::bigint[]) AS r(channel, key, base, type, items, ordinal, "
    "codec, size, data, checksum)"
)
PREFIX_BLOBS = (
    "UPDATE lgfs_blobs b SET base = r.base, type = r.type, items = r.items, "
    "ordinal = r.ordinal, codec = r.codec, size = r.size, data = r.data, checksum = r.checksum "
    f"FROM {_BLOB_UNNEST} WHERE r.codec = 'prefix' AND b.thread_id = %(thread_id)s "
    "AND b.checkpoint_ns = %(checkpoint_ns)s AND b.channel = r.channel AND b.key = r.key "
    "AND b.codec <> 'prefix'"
)
INSERT_BLOBS = (
    "INSERT INTO lgfs_blobs (thread_id, checkpoint_ns, channel, key, base, type, items, "
    "ordinal, codec, size, data, checksum) SELECT %(thread_id)s, %(checkpoint_ns)s, r.* "
    f"FROM {_BLOB_UNNEST} WHERE r.codec <> 'prefix' ON CONFLICT DO NOTHING"
)
# Whether the parent still holds the refs (`borrows`) a put's values were
# encoded against: a put names rows only through its parent.
HOLDS_REFS = (
    f"SELECT 1 FROM lgfs_checkpoints WHERE {_KEY} AND checkpoint_id = %(parent_id)s "
    "AND values_type = 'lgfs-refs' AND values_blob = %(borrows)s"
)
# The thread's borrow rows naming a pending write (`values.LENT`), as
# `lending.unlent_rows` reads them; one made whole, if still as read.
LENT_BORROWERS = (
    "SELECT checkpoint_ns, channel, key, base, type, items, ordinal, codec, size, data, "
    "checksum FROM lgfs_blobs WHERE thread_id = %(thread_id)s AND codec = 'borrow' "
    "AND substring(data from 1 for 5) = '\\x7b2277223a'::bytea"
)
UNLEND_BLOB = (
    "UPDATE lgfs_blobs SET codec = %(codec)s, size = %(size)s, data = %(data)s, "
    "checksum = %(checksum)s WHERE thread_id = %(thread_id)s "
    "AND checkpoint_ns = %(checkpoint_ns)s AND channel = %(channel)s AND key = %(key)s "
    "AND codec = 'borrow' AND data = %(cell)s"
)
# Whether a pending write is stored with the checksum a borrow row's cell
# names (`values.LENT`): a put naming its bytes checks so.
HOLDS_WRITE = (
    f"SELECT 1 FROM lgfs_writes WHERE {_KEY} AND checkpoint_id = %(checkpoint_id)s "
    "AND task_id = %(task_id)s AND idx = %(idx)s AND checksum = %(checksum)s"
)
DELETE_THREAD_BLOBS = "DELETE FROM lgfs_blobs WHERE thread_id = %(thread_id)s"
# Remove the thread's value rows that no checkpoint of it needs: those its
# checkpoints' refs name, and the rows those extend or borrow from, stay. Nothing goes
# while any of its refs cells is damaged: what it named cannot be known.
# Run in the transaction that removed checkpoints, which holds the thread's
# row lock (its fence), as every put of the thread takes it first: no put
# can name a row between this statement's snapshot and the commit.
COLLECT_BLOBS = (
    "WITH RECURSIVE r AS (SELECT c.checkpoint_ns, lgfs_refs(c.values_blob) AS refs "
    "FROM lgfs_checkpoints c WHERE c.thread_id = %(thread_id)s "
    "AND c.values_type = 'lgfs-refs'), live(n, c, k) AS (SELECT r.checkpoint_ns, "
    'j.key COLLATE "C", j.value COLLATE "C" FROM r CROSS JOIN LATERAL '
    "jsonb_each_text(r.refs) j UNION SELECT b.checkpoint_ns, e.c, e.k FROM live l "
    "JOIN lgfs_blobs b ON b.thread_id = %(thread_id)s AND b.checkpoint_ns = l.n "
    f"AND b.channel = l.c AND b.key = l.k {_EDGES} WHERE e.k IS NOT NULL) "
    "DELETE FROM lgfs_blobs b WHERE b.thread_id = %(thread_id)s AND NOT EXISTS (SELECT 1 "
    "FROM live l WHERE l.n = b.checkpoint_ns AND l.c = b.channel AND l.k = b.key) "
    "AND NOT EXISTS (SELECT 1 FROM r WHERE r.refs IS NULL)"
)
# `repack`: the threads holding checkpoints with values inline, and a
# thread's checkpoints in commit order; a checkpoint's values moved to the
# value table only if its row is still the one read (type and checksum).
THREADS_WITH_INLINE_VALUES = (
    "SELECT DISTINCT thread_id FROM lgfs_checkpoints WHERE values_type <> 'lgfs-refs' "
    "ORDER BY thread_id"
)
THREAD_CHECKPOINTS_IN_ORDER = (
    f"SELECT {CHECKPOINT_COLUMNS} FROM lgfs_checkpoints WHERE thread_id = %(thread_id)s "
    "ORDER BY position"
)
REPACK_CHECKPOINT = (
    "UPDATE lgfs_checkpoints SET values_type = 'lgfs-refs', values_blob = %(refs)s, "
    f"checksum = %(checksum)s WHERE {_KEY} AND checkpoint_id = %(checkpoint_id)s "
    "AND values_type = %(old_type)s AND checksum = %(old_checksum)s"
)

# --- rekey (core/rekey.py): every value cell, by the key it is sealed under ---------------
# A sealed cell starts with `encryption.MAGIC` (a7 01) and the key id's 4 bytes.
_KEY_ID_OF = (
    "CASE WHEN substring({0} from 1 for 2) = '\\xa701'::bytea AND {1} "
    "THEN encode(substring({0} from 3 for 4), 'hex') END"
)
_SEALED_CHECKPOINT = _KEY_ID_OF.format("values_blob", "values_type LIKE '%%+aes'")
_SEALED_WRITE = _KEY_ID_OF.format("blob", "type LIKE '%%+aes'")
_SEALED_BLOB = _KEY_ID_OF.format("data", "codec IN ('aes', 'zstd+aes')")
CELL_KEYS = (
    "SELECT k, count(*) FROM ("
    f"SELECT {_SEALED_CHECKPOINT} AS k FROM lgfs_checkpoints WHERE values_type <> 'lgfs-refs' "
    f"UNION ALL SELECT {_SEALED_WRITE} FROM lgfs_writes WHERE type <> 'lgfs-slice' "
    f"UNION ALL SELECT {_SEALED_BLOB} FROM lgfs_blobs WHERE codec NOT IN ('prefix', 'borrow')"
    ") s GROUP BY k"
)
# Value rows named by their own bytes (`values._small_key`): written in clear.
BLOBS_NAMED_IN_CLEAR = "SELECT count(*) FROM lgfs_blobs WHERE key LIKE '=%%'"
THREADS_WITH_CELLS = (
    "SELECT thread_id FROM lgfs_checkpoints UNION SELECT thread_id FROM lgfs_writes "
    "ORDER BY thread_id"
)
REKEY_READ_CHECKPOINTS = (
    "SELECT checkpoint_ns, checkpoint_id, envelope, values_type, values_blob, metadata, "
    "checksum FROM lgfs_checkpoints WHERE thread_id = %(thread_id)s "
    "AND values_type <> 'lgfs-refs'"
)
REKEY_READ_WRITES = (
    "SELECT checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob, checksum "
    "FROM lgfs_writes WHERE thread_id = %(thread_id)s"
)
REKEY_READ_BLOBS = (
    "SELECT checkpoint_ns, channel, key, base, type, items, ordinal, codec, size, data, "
    "checksum FROM lgfs_blobs WHERE thread_id = %(thread_id)s "
    "AND (codec NOT IN ('prefix', 'borrow') OR (codec = 'borrow' "
    # A borrow row naming a write (`values.LENT`): made whole, sealed.
    "AND substring(data from 1 for 5) = '\\x7b2277223a'::bytea))"
)
REKEY_CHECKPOINT = (
    "UPDATE lgfs_checkpoints SET values_type = %(type)s, values_blob = %(data)s, "
    "checksum = %(checksum)s WHERE thread_id = %(thread_id)s AND checkpoint_ns = %(a)s "
    "AND checkpoint_id = %(b)s AND checksum = %(old_checksum)s"
)
REKEY_WRITE = (
    "UPDATE lgfs_writes SET type = %(type)s, blob = %(data)s, checksum = %(checksum)s "
    "WHERE thread_id = %(thread_id)s AND checkpoint_ns = %(a)s AND checkpoint_id = %(b)s "
    "AND task_id = %(c)s AND idx = %(d)s AND checksum = %(old_checksum)s"
)
REKEY_BLOB = (
    "UPDATE lgfs_blobs SET codec = %(type)s, data = %(data)s, checksum = %(checksum)s "
    "WHERE thread_id = %(thread_id)s AND checkpoint_ns = %(a)s AND channel = %(b)s "
    "AND key = %(c)s AND checksum = %(old_checksum)s"
)

# `get_tuple` in one statement (one snapshot, one round trip, no pipeline):
# its first column says what each row is. The checkpoint's row (0:
# `CHECKPOINT_COLUMNS`), then each of its writes (1: `WRITES_OF_CHECKPOINTS`'
# columns after the key, output columns 14-20) in `_WRITES_ORDER` (output
# columns 18, 14, 19: task_path, task_id, idx), then the value rows its refs
# name (2: `_BLOB_ROW`, output columns 21-32), unless the checkpoint is the
# one this process holds (`known_id`, with the refs `known_refs`: its values
# are the bytes the process holds, `values.ValueCache`). No row: no such
# checkpoint.
_NO_CHECKPOINT = (
    "NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::bytea, "
    "NULL::text, NULL::bigint, NULL::bigint, NULL::float8, NULL::bigint"
)
_NO_WRITE = "NULL::text, NULL::text, NULL::text, NULL::bytea, NULL::text, NULL::int, NULL::bigint"
_UNKNOWN = (
    "(SELECT thread_id, checkpoint_ns, values_blob FROM c WHERE values_type = 'lgfs-refs' "
    "AND NOT coalesce(checkpoint_id = %(known_id)s::text "
    "AND values_blob = %(known_refs)s::bytea, false)) s"
)
_TUPLE_OF = (
    "WITH RECURSIVE c AS ({found}), "
    + _want(_UNKNOWN)
    + " SELECT 0, c.*, {no_write}, {no_blob} FROM c UNION ALL SELECT 1, {no_checkpoint}, "
    "w.task_id, w.channel, w.type, w.blob, w.task_path, w.idx, w.checksum, {no_blob} FROM c "
    "JOIN lgfs_writes w ON w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns "
    "AND w.checkpoint_id = c.checkpoint_id UNION ALL SELECT 2, {no_checkpoint}, {no_write}, "
    f"{_BLOB_ROW} FROM {_WANTED} ORDER BY 1, 18, 14, 19"
)
TUPLE_BY_ID = _TUPLE_OF.format(
    found=GET_CHECKPOINT_BY_ID, no_write=_NO_WRITE, no_checkpoint=_NO_CHECKPOINT, no_blob=_NO_BLOB
)
TUPLE_LATEST = _TUPLE_OF.format(
    found=GET_LATEST_CHECKPOINT, no_write=_NO_WRITE, no_checkpoint=_NO_CHECKPOINT, no_blob=_NO_BLOB
)
# A read batch's transaction: its statements share one snapshot, so a commit
# between them cannot pair a checkpoint with another's writes.
READ_SNAPSHOT = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
# What a native async connection (`native.NativeConns`) must share with the
# store's connection for our statements to do the same there: the role, then
# the settings `SET_SESSION` copies (the tables' schema, the waits, and
# whether a transaction may write).
SESSION = (
    "SELECT current_user, current_setting('search_path'), current_setting('lock_timeout'), "
    "current_setting('statement_timeout'), current_setting('default_transaction_read_only')"
)
SET_SESSION = (
    "SELECT set_config('search_path', %(search_path)s, false), "
    "set_config('lock_timeout', %(lock_timeout)s, false), "
    "set_config('statement_timeout', %(statement_timeout)s, false), "
    "set_config('default_transaction_read_only', %(read_only)s, false)"
)
SESSION_SETTINGS = ("search_path", "lock_timeout", "statement_timeout", "read_only")

# --- runs, copies, prunes ---------------------------------------------------------------

THREADS_OF_RUNS = (
    "SELECT thread_id FROM lgfs_checkpoints WHERE run_id = ANY(%(runs)s) "
    "UNION SELECT thread_id FROM lgfs_writes WHERE run_id = ANY(%(runs)s) ORDER BY 1"
)
DELETE_CHECKPOINTS_OF_RUNS = (
    "DELETE FROM lgfs_checkpoints WHERE thread_id = %(thread_id)s AND run_id = ANY(%(runs)s) "
    "RETURNING checkpoint_ns, checkpoint_id"
)
# A thread's writes of the runs, and every write of a checkpoint removed with them.
DELETE_WRITES_OF_RUNS = (
    "DELETE FROM lgfs_writes w WHERE w.thread_id = %(thread_id)s AND (w.run_id = ANY(%(runs)s) "
    "OR (w.checkpoint_ns, w.checkpoint_id) IN (SELECT k.ns, k.id FROM "
    "unnest(%(namespaces)s::text[], %(ids)s::text[]) AS k(ns, id)))" + _GONE
)
COUNT_CHECKPOINTS = "SELECT count(*) FROM lgfs_checkpoints WHERE thread_id = %(thread_id)s"
# Source checkpoints whose id the target holds with different content.
COPY_CONFLICTS = (
    "SELECT s.checkpoint_ns, s.checkpoint_id FROM lgfs_checkpoints s JOIN lgfs_checkpoints t "
    "ON t.thread_id = %(target)s AND t.checkpoint_ns = s.checkpoint_ns "
    "AND t.checkpoint_id = s.checkpoint_id WHERE s.thread_id = %(source)s AND NOT "
    "(t.parent_checkpoint_id IS NOT DISTINCT FROM s.parent_checkpoint_id "
    "AND t.envelope = s.envelope AND t.values_type = s.values_type "
    "AND t.values_blob = s.values_blob AND t.metadata = s.metadata) "
    "ORDER BY s.position"
)
# Copy every source checkpoint the target lacks, each at its own new position
# (from %(position)s, in source commit order); returns how many were copied.
# In the same statement (one snapshot: a removal committed meanwhile took
# both or neither), every value row of the source: keys name content, so a
# row the target holds already is the same value.
COPY_CHECKPOINTS = (
    "WITH v AS (INSERT INTO lgfs_blobs (thread_id, checkpoint_ns, channel, key, base, type, "
    "items, ordinal, codec, size, data, checksum) SELECT %(target)s, s.checkpoint_ns, "
    "s.channel, s.key, s.base, s.type, s.items, s.ordinal, s.codec, s.size, s.data, "
    "s.checksum FROM lgfs_blobs s WHERE s.thread_id = %(source)s ON CONFLICT DO NOTHING) "
    "INSERT INTO lgfs_checkpoints (thread_id, checkpoint_ns, checkpoint_id, position, "
    "parent_checkpoint_id, envelope, values_type, values_blob, metadata, source, step, "
    "run_id, token, created_at, checksum) "
    "SELECT %(target)s, s.checkpoint_ns, s.checkpoint_id, "
    "%(position)s + row_number() OVER (ORDER BY s.position) - 1, s.parent_checkpoint_id, "
    "s.envelope, s.values_type, s.values_blob, s.metadata, s.source, s.step, s.run_id, NULL, "
    "s.created_at, s.checksum FROM lgfs_checkpoints s WHERE s.thread_id = %(source)s "
    "AND NOT EXISTS (SELECT 1 FROM lgfs_checkpoints t WHERE t.thread_id = %(target)s "
    "AND t.checkpoint_ns = s.checkpoint_ns AND t.checkpoint_id = s.checkpoint_id) "
    "ORDER BY s.position RETURNING checkpoint_ns, checkpoint_id, position, step, source, "
    "parent_checkpoint_id"
)
COPY_WRITES = (
    "INSERT INTO lgfs_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, "
    "task_path, channel, type, blob, position, run_id, token, checksum) "
    "SELECT %(target)s, s.checkpoint_ns, s.checkpoint_id, s.task_id, s.idx, s.task_path, "
    "s.channel, s.type, s.blob, %(position)s, s.run_id, NULL, s.checksum "
    "FROM lgfs_writes s WHERE s.thread_id = %(source)s ORDER BY s.position "
    "ON CONFLICT DO NOTHING"
)
# keep_latest: every checkpoint but the latest of its namespace, with its writes.
# What `retention.plan_prune` reasons about for each checkpoint, by position:
# the envelope as stored (packed: `envelopes.channel_versions` reads it).
# `json`, not `jsonb`: one field is read, and `json` takes any text the
# store wrote (jsonb refuses a \u0000 escape).
PRUNE_SKELETON = (
    "SELECT checkpoint_ns, checkpoint_id, parent_checkpoint_id, position, source, run_id, "
    "created_at, step, metadata::json -> 'counters_since_delta_snapshot', envelope "
    "FROM lgfs_checkpoints WHERE thread_id = %(thread_id)s ORDER BY position"
)
DELETE_WRITES_OF_PRUNED = (
    "DELETE FROM lgfs_writes w USING unnest(%(namespaces)s::text[], %(ids)s::text[]) "
    "AS k(ns, id) WHERE w.thread_id = %(thread_id)s AND w.checkpoint_ns = k.ns "
    "AND w.checkpoint_id = k.id" + _GONE
)
# The first event about a checkpoint still stored (where keep_latest's floor
# goes), and one past the last event about a removed one (where it goes when
# no stored checkpoint has an event left), at or above the floor.
FIRST_EVENT_OF_STORED = (
    "SELECT min(e.seq) FROM lgfs_events e WHERE e.thread_id = %(thread_id)s "
    "AND e.checkpoint_id IS NOT NULL AND EXISTS (SELECT 1 FROM lgfs_checkpoints c "
    "WHERE c.thread_id = e.thread_id AND c.checkpoint_ns = e.checkpoint_ns "
    "AND c.checkpoint_id = e.checkpoint_id)"
)
PAST_LAST_EVENT_OF = (
    "SELECT max(e.seq) + 1 FROM lgfs_events e JOIN unnest(%(namespaces)s::text[], "
    "%(ids)s::text[]) AS k(ns, id) ON e.checkpoint_ns = k.ns AND e.checkpoint_id = k.id "
    "WHERE e.thread_id = %(thread_id)s AND e.seq >= %(floor)s"
)
# Orphan writes (as the SQLite store's): their checkpoint is not stored, and
# they were committed before the latest checkpoint of their namespace.
_ORPHAN = (
    "NOT EXISTS (SELECT 1 "
    "FROM lgfs_checkpoints c WHERE c.thread_id = w.thread_id AND c.checkpoint_ns = "
    "w.checkpoint_ns AND c.checkpoint_id = w.checkpoint_id) AND w.position < (SELECT "
    "max(l.position) FROM lgfs_checkpoints l WHERE l.thread_id = w.thread_id "
    "AND l.checkpoint_ns = w.checkpoint_ns)"
)
DELETE_ORPHAN_WRITES = (
    "DELETE FROM lgfs_writes w WHERE w.thread_id = %(thread_id)s AND " + _ORPHAN + _GONE
)
# Of every thread (`lgfs doctor`): what the next prune of each would remove.
COUNT_ALL_ORPHAN_WRITES = "SELECT count(*) FROM lgfs_writes w WHERE " + _ORPHAN
# A retention policy's prune (no claim needed): the thread row locked, so it
# waits for the thread's writers (and they for it) as on SQLite's write lock.
LOCK_FOR_PRUNE = (
    f"SELECT floor, next_seq, {NOW} FROM lgfs_threads WHERE thread_id = %(thread_id)s FOR UPDATE"
)
# A sweep: every thread but a bare tombstone (the SQLite store's `THREAD_IDS`),
# then, per thread in its own transaction, its row locked with its claim and
# last activity (newest checkpoint or event).
SWEEP_THREAD_IDS = (
    "SELECT t.thread_id FROM lgfs_threads t WHERE (t.incarnation = 1 OR t.token IS NOT NULL "
    "OR t.floor > 1 OR EXISTS (SELECT 1 FROM lgfs_events e WHERE e.thread_id = t.thread_id) "
    "OR EXISTS (SELECT 1 FROM lgfs_checkpoints c WHERE c.thread_id = t.thread_id)) "
    "ORDER BY t.thread_id"
)
SWEEP_THREAD = (
    f"SELECT t.token, t.expires_at, {NOW}, (SELECT max(c.created_at) FROM lgfs_checkpoints c "
    "WHERE c.thread_id = t.thread_id), (SELECT max(e.ts) FROM lgfs_events e "
    "WHERE e.thread_id = t.thread_id) FROM lgfs_threads t WHERE t.thread_id = %(thread_id)s "
    "FOR UPDATE"
)
# --- thread expiry (migration 12; `removals.py`) ---------------------------------------

# A thread's own TTL, set or cleared on its (created if need be) locked row.
SET_THREAD_TTL = (
    "INSERT INTO lgfs_threads AS t (thread_id, ttl, ttl_strategy) "
    "VALUES (%(thread_id)s, %(ttl)s, %(strategy)s) ON CONFLICT (thread_id) DO UPDATE "
    "SET ttl = %(ttl)s, ttl_strategy = %(strategy)s, ttl_seen = NULL"
)
GET_THREAD_TTL = "SELECT ttl, ttl_strategy FROM lgfs_threads WHERE thread_id = %(thread_id)s"
SET_TTL_SEEN = "UPDATE lgfs_threads SET ttl_seen = %(seen)s WHERE thread_id = %(thread_id)s"
GET_NEXT_SEQ = "SELECT next_seq FROM lgfs_threads WHERE thread_id = %(thread_id)s"
FORGET_THREAD_TTL = (
    "UPDATE lgfs_threads SET ttl = NULL, ttl_strategy = NULL, ttl_seen = 'Infinity' "
    "WHERE thread_id = %(thread_id)s"
)
TTL_UNSEEN = "SELECT thread_id FROM lgfs_threads WHERE ttl_seen IS NULL LIMIT %(limit)s"
TTL_UNSEEN_OWN = (
    "SELECT thread_id FROM lgfs_threads WHERE ttl_seen IS NULL AND ttl IS NOT NULL LIMIT %(limit)s"
)
# Due-looking threads, each through its index (the expression `ttl_seen +
# ttl`; `ttl_seen` against now minus the default TTL), with their claims.
TTL_DUE_OWN = (
    "SELECT thread_id, token, expires_at FROM lgfs_threads "
    "WHERE ttl IS NOT NULL AND ttl_seen + ttl <= %(now)s::float8"
)
TTL_DUE_DEFAULT = (
    "SELECT thread_id, token, expires_at FROM lgfs_threads "
    "WHERE ttl IS NULL AND ttl_seen <= %(before)s::float8"
)
# One thread's expiry facts, its row locked (it waits for the thread's
# writers, and they for it), and the time judged at.
TTL_FACTS = (
    "SELECT t.ttl, t.ttl_strategy, t.ttl_seen, t.token, t.expires_at, "
    "(SELECT max(c.created_at) FROM lgfs_checkpoints c WHERE c.thread_id = t.thread_id), "
    f"(SELECT max(e.ts) FROM lgfs_events e WHERE e.thread_id = t.thread_id), {NOW} "
    "FROM lgfs_threads t WHERE t.thread_id = %(thread_id)s FOR UPDATE"
)
CHECKPOINT_PARENTS = (
    "SELECT metadata::json -> 'parents' FROM lgfs_checkpoints WHERE thread_id = %(thread_id)s "
    "AND checkpoint_ns = %(ns)s AND checkpoint_id = %(cid)s"
)
# Every write of a past subgraph run's namespace whose checkpoint is gone.
DELETE_NS_ORPHAN_WRITES = (
    "DELETE FROM lgfs_writes w WHERE w.thread_id = %(thread_id)s AND w.checkpoint_ns = %(ns)s "
    "AND NOT EXISTS (SELECT 1 FROM lgfs_checkpoints c WHERE c.thread_id = w.thread_id "
    "AND c.checkpoint_ns = w.checkpoint_ns AND c.checkpoint_id = w.checkpoint_id)" + _GONE
)
DELETE_ALL_RETURNING = (
    "DELETE FROM lgfs_checkpoints WHERE thread_id = %(thread_id)s "
    "RETURNING checkpoint_ns, checkpoint_id, position"
)


def writes_of_checkpoints(keys: Sequence[tuple[str, str, str]]) -> tuple[str, dict[str, Any]]:
    """Build the one query that fetches the writes of a page of checkpoints."""
    return WRITES_OF_CHECKPOINTS, {
        "threads": [k[0] for k in keys],
        "namespaces": [k[1] for k in keys],
        "ids": [k[2] for k in keys],
    }


@functools.lru_cache(maxsize=64)
def page_with_writes(page_sql: str) -> str:
    """Build one `list_checkpoints` page, its checkpoints' writes and values as one statement.

    One statement is one snapshot and one round trip, with no pipeline to
    enter and leave (about 50 us of client CPU, as `send.send_batch` says).
    The first column says what each row is: a checkpoint (0, then
    `CHECKPOINT_COLUMNS`), a write (1, then `_WRITE_COLUMNS`, output columns
    14-23) or a value row its refs name (2, then `_BLOB_ROW`, 24-35): the
    page's rows first, in its order (columns 4, 2 and 3 descending), then
    every write, by checkpoint key (14-16) and in `_WRITES_ORDER` (21, 17,
    22), then the value rows. Cached: a page's text depends only on which
    filters `list` was given.
    """
    page_writes = (
        "w.thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.channel, w.type, w.blob, "
        "w.task_path, w.idx, w.checksum"
    )
    no_writes = ", ".join(["NULL::text"] * 6 + ["NULL::bytea", "NULL::text", "NULL::int"])
    values = (
        "(SELECT thread_id, checkpoint_ns, values_blob FROM page WHERE values_type = 'lgfs-refs') s"
    )
    return (
        f"WITH RECURSIVE page AS MATERIALIZED ({page_sql}), {_want(values)} "
        f"SELECT 0, p.*, {no_writes}, NULL::bigint, {_NO_BLOB} FROM page p UNION ALL "
        f"SELECT 1, {_NO_CHECKPOINT}, {page_writes}, {_NO_BLOB} FROM lgfs_writes w JOIN page p "
        "ON w.thread_id = p.thread_id AND w.checkpoint_ns = p.checkpoint_ns "
        "AND w.checkpoint_id = p.checkpoint_id UNION ALL "
        f"SELECT 2, {_NO_CHECKPOINT}, {no_writes}, NULL::bigint, {_BLOB_ROW} FROM {_WANTED} "
        "ORDER BY 1, 4 DESC, 2 DESC, 3 DESC, 14, 15, 16, 21, 17, 22"
    )


def _metadata_match(column: str, name: str, key: str, value: Any, params: dict[str, Any]) -> str:
    """Return one key of `list`'s metadata filter on `column`, its parameters put in `params`.

    JSON equality; None also matches a missing key (as the SQLite store's
    `IS` does). Also a thread search's match on a latest root checkpoint.
    """
    params[f"{name}k"] = key
    params[f"{name}v"] = dumps_json(value, "filter")
    return f"coalesce(({column})::jsonb -> %({name}k)s, 'null') = %({name}v)s::jsonb"


def list_checkpoints(
    *,
    thread_id: str | None,
    checkpoint_ns: str | None,
    checkpoint_id: str | None,
    metadata_filter: dict[str, Any] | None,
    before_id: str | None,
    after_key: tuple[str, str, str] | None,
    limit: int,
) -> tuple[str, dict[str, Any]]:
    """Build one page of LangGraph's `list`, newest checkpoint id first.

    The arguments are the SQLite store's `schema.list_checkpoints`'s. A filter
    value matches by JSON equality; `None` also matches a missing key (as the
    SQLite store's `IS` does).
    """
    where: list[str] = []
    params: dict[str, Any] = {"limit": limit}
    for column, value in (
        ("thread_id", thread_id),
        ("checkpoint_ns", checkpoint_ns),
        ("checkpoint_id", checkpoint_id),
    ):
        if value is not None:
            where.append(f"{column} = %({column})s")
            params[column] = value
    if before_id is not None:
        where.append("checkpoint_id < %(before_id)s")
        params["before_id"] = before_id
    for i, (key, value) in enumerate((metadata_filter or {}).items()):
        where.append(_metadata_match("metadata", f"f{i}", key, value, params))
    if after_key is not None:
        where.append("(checkpoint_id, thread_id, checkpoint_ns) < (%(a0)s, %(a1)s, %(a2)s)")
        params.update(a0=after_key[0], a1=after_key[1], a2=after_key[2])
    clause = f"WHERE {' AND '.join(where)} " if where else ""
    sql = (
        f"SELECT {CHECKPOINT_COLUMNS} FROM lgfs_checkpoints {clause}"
        "ORDER BY checkpoint_id DESC, thread_id DESC, checkpoint_ns DESC LIMIT %(limit)s"
    )
    return sql, params


# --- reads: history, inspection, threads (`saver_inspect.py`, `saver_threads.py`) ---------------

# The first statement of every multi-statement read inside `PgConnection.run`'s
# transaction: one snapshot for all its statements, as the SQLite store's read
# transaction gives (under READ COMMITTED each statement would see the commits
# made since the one before). `READ_SNAPSHOT` (above) opens the same for a batch.
SNAPSHOT_IN_TRANSACTION = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
GET_POSITION = (
    "SELECT position FROM lgfs_checkpoints WHERE thread_id = %(thread_id)s "
    "AND checkpoint_ns = %(checkpoint_ns)s AND checkpoint_id = %(checkpoint_id)s"
)
# One page of `history`: newest commit first, below `start` (a position).
HISTORY_PAGE = (
    f"SELECT {CHECKPOINT_COLUMNS} FROM lgfs_checkpoints WHERE {_KEY} "
    "AND position < %(start)s ORDER BY position DESC LIMIT %(limit)s"
)
LIST_CLAIMS = (
    "SELECT thread_id, holder, token, expires_at, claimed_at FROM lgfs_threads "
    "WHERE token IS NOT NULL ORDER BY thread_id"
)
# A thread row that is more than what `delete_thread` leaves of a thread (the
# SQLite store's `_NOT_TOMBSTONE`): in its first incarnation, or claimed,
# compacted, or holding events or checkpoints.
_NOT_TOMBSTONE = (
    "(t.incarnation = 1 OR t.token IS NOT NULL OR t.floor > 1 "
    "OR EXISTS (SELECT 1 FROM lgfs_events e WHERE e.thread_id = t.thread_id) "
    "OR EXISTS (SELECT 1 FROM lgfs_checkpoints c WHERE c.thread_id = t.thread_id))"
)
# The columns `saver_threads._summaries` reads, in the SQLite store's
# `THREAD_SUMMARIES` order.
_SUMMARIES = (
    "SELECT t.thread_id, t.holder, t.token, t.expires_at, t.floor, t.next_seq, "
    "(SELECT count(*) FROM lgfs_checkpoints c WHERE c.thread_id = t.thread_id), "
    "(SELECT string_agg(DISTINCT c.checkpoint_ns, ',') FROM lgfs_checkpoints c "
    " WHERE c.thread_id = t.thread_id), "
    "(SELECT count(*) FROM lgfs_events e WHERE e.thread_id = t.thread_id), "
    "(SELECT max(c.created_at) FROM lgfs_checkpoints c WHERE c.thread_id = t.thread_id), "
    "(SELECT c.step FROM lgfs_checkpoints c WHERE c.thread_id = t.thread_id "
    " AND c.checkpoint_ns = '' ORDER BY c.position DESC LIMIT 1), "
    "(SELECT max(e.ts) FROM lgfs_events e WHERE e.thread_id = t.thread_id) "
    f"FROM lgfs_threads t WHERE {_NOT_TOMBSTONE}"
)
THREAD_SUMMARIES = f"{_SUMMARIES} ORDER BY t.thread_id"
THREAD_SUMMARY = f"{_SUMMARIES} AND t.thread_id = %(thread_id)s"
# What a thread's status is judged from (`saver_threads._status_facts`), for
# every thread `_SUMMARIES` lists, in one statement: its row in
# `claims.ThreadRow`'s order; its latest root checkpoint (`CHECKPOINT_COLUMNS`,
# NULLs if none); its latest run lifecycle event (`EVENTS_AFTER`'s columns,
# NULLs if none); whether a root checkpoint was committed after that
# event under another token; and, for a run's own claim, when it last wrote.
_LATEST_ROOT = (
    "SELECT * FROM lgfs_checkpoints c WHERE c.thread_id = t.thread_id AND c.checkpoint_ns = '' "
    "ORDER BY c.position DESC LIMIT 1"
)
_STATUS_FACTS = (
    "SELECT t.thread_id, t.next_seq, t.floor, t.holder, t.token, t.expires_at, t.run_id, "
    "t.incarnation, "
    + ", ".join(f"lc.{column.strip()}" for column in CHECKPOINT_COLUMNS.split(","))
    + ", le.seq, le.kind, le.checkpoint_ns, le.checkpoint_id, le.data, le.token, le.ts, "
    "le.checksum, EXISTS (SELECT 1 FROM lgfs_checkpoints a WHERE a.thread_id = t.thread_id "
    "AND a.checkpoint_ns = '' AND a.position > le.seq AND a.token IS DISTINCT FROM le.token), "
    # When a run fenced by its id (`core.run_fence`) last wrote: its latest event's time.
    "CASE WHEN t.holder = %(run_holder)s THEN (SELECT e.ts FROM lgfs_events e "
    "WHERE e.thread_id = t.thread_id ORDER BY e.seq DESC LIMIT 1) END "
    f"FROM lgfs_threads t LEFT JOIN LATERAL ({_LATEST_ROOT}) lc ON true "
    "LEFT JOIN LATERAL (SELECT * FROM lgfs_events e WHERE e.thread_id = t.thread_id "
    "AND e.kind = ANY(%(kinds)s) ORDER BY e.seq DESC LIMIT 1) le ON true "
    f"WHERE {_NOT_TOMBSTONE}"
)
STATUS_FACTS = _STATUS_FACTS
STATUS_FACTS_OF = f"{_STATUS_FACTS} AND t.thread_id = %(thread_id)s"
# The writes of those latest root checkpoints (`WRITES_OF_CHECKPOINTS`' columns
# and order, thread by thread).
_LATEST_ROOT_WRITES = (
    f"SELECT {_WRITE_COLUMNS} FROM lgfs_threads t JOIN LATERAL ({_LATEST_ROOT}) lc ON true "
    "JOIN lgfs_writes w ON w.thread_id = t.thread_id AND w.checkpoint_ns = '' "
    "AND w.checkpoint_id = lc.checkpoint_id"
)
_BY_THREAD = "ORDER BY w.thread_id, w.task_path, w.task_id, w.idx"
LATEST_ROOT_WRITES = f"{_LATEST_ROOT_WRITES} {_BY_THREAD}"
LATEST_ROOT_WRITES_OF = f"{_LATEST_ROOT_WRITES} WHERE t.thread_id = %(thread_id)s {_BY_THREAD}"
# The value rows of those latest root checkpoints whose values a status
# decodes: those with an interrupt, resume or error write of a `Send` task,
# whose path holds `PUSH_TASK_PATH` (`core.saver_threads.ThreadsBase._judge`
# names the task's node from the values).
STATUS_WRITE_CHANNELS = (INTERRUPT, RESUME, ERROR)
PUSH_TASK_PATH = "__pregel_push"
_PUSHED = (
    "SELECT lc.thread_id, lc.checkpoint_ns, lc.values_blob FROM lgfs_threads t "
    f"JOIN LATERAL ({_LATEST_ROOT}) lc ON true WHERE lc.values_type = 'lgfs-refs' "
    "AND EXISTS (SELECT 1 FROM lgfs_writes w WHERE w.thread_id = t.thread_id "
    "AND w.checkpoint_ns = '' AND w.checkpoint_id = lc.checkpoint_id AND w.channel IN ("
    + ", ".join(f"'{c}'" for c in STATUS_WRITE_CHANNELS)
    + f") AND strpos(w.task_path, '{PUSH_TASK_PATH}') > 0)"
)
_LATEST_ROOT_VALUES = "WITH RECURSIVE {want} SELECT " + _BLOB_ROW + f" FROM {_WANTED}"
LATEST_ROOT_VALUES = _LATEST_ROOT_VALUES.format(want=_want(f"({_PUSHED}) s"))
LATEST_ROOT_VALUES_OF = _LATEST_ROOT_VALUES.format(
    want=_want(f"({_PUSHED} AND t.thread_id = %(thread_id)s) s")
)
# The same four for a page of threads (`search_threads`).
_OF_IDS = "t.thread_id = ANY(%(ids)s)"
THREAD_SUMMARIES_OF_IDS = f"{_SUMMARIES} AND {_OF_IDS}"
STATUS_FACTS_OF_IDS = f"{_STATUS_FACTS} AND {_OF_IDS}"
LATEST_ROOT_WRITES_OF_IDS = f"{_LATEST_ROOT_WRITES} WHERE {_OF_IDS} {_BY_THREAD}"
LATEST_ROOT_VALUES_OF_IDS = _LATEST_ROOT_VALUES.format(want=_want(f"({_PUSHED} AND {_OF_IDS}) s"))


def search_threads(
    indexed: Sequence[tuple[str, Any]],
    unindexed: Sequence[tuple[str, Any]],
    ids: Sequence[str] | None,
    *,
    count: bool = False,
    activity: bool = False,
    page: tuple[bool, int, int] | None = None,
) -> tuple[str, dict[str, Any]]:
    """Build the query of a thread search's candidates: the SQLite store's `schema.search_threads`.

    Each `indexed` entry seeks `lgfs_thread_tags_value`; each `unindexed`
    one is `list`'s match on the thread's latest root checkpoint. The
    arguments and rows are `schema.search_threads`'s.
    """
    where: list[str] = []
    params: dict[str, Any] = {}
    for i, (key, value) in enumerate(indexed):
        where.append(
            "t.thread_id IN (SELECT g.thread_id FROM lgfs_thread_tags g "
            f"WHERE g.key = %(ik{i})s AND g.value = %(iv{i})s::jsonb)"
        )
        params[f"ik{i}"] = key
        params[f"iv{i}"] = dumps_json(value, "metadata")
    if ids is not None:
        where.append(_OF_IDS)
        params["ids"] = list(ids)
    if unindexed:  # on the latest root checkpoint: a thread with none matches nothing
        matches = " AND ".join(
            _metadata_match("m.metadata", f"u{i}", key, value, params)
            for i, (key, value) in enumerate(unindexed)
        )
        where.append(
            "EXISTS (SELECT 1 FROM (SELECT l.metadata FROM lgfs_checkpoints l "
            "WHERE l.thread_id = t.thread_id AND l.checkpoint_ns = '' "
            f"ORDER BY l.position DESC LIMIT 1) m WHERE {matches})"
        )
    where.append(_NOT_TOMBSTONE)
    activity_cells = (
        "(SELECT max(c.created_at) FROM lgfs_checkpoints c WHERE c.thread_id = t.thread_id), "
        "(SELECT max(e.ts) FROM lgfs_events e WHERE e.thread_id = t.thread_id)"
    )
    cells = activity_cells if activity else "NULL::float8, NULL::float8"
    sql = (
        f"SELECT {'count(*)' if count else f't.thread_id, {cells}'} FROM lgfs_threads t "
        f"WHERE {' AND '.join(where)}"
    )
    if page is not None:
        descending, limit, params["offset"] = page
        params["limit"] = None if limit < 0 else limit  # LIMIT NULL: no limit
        sql += (
            f" ORDER BY t.thread_id{' DESC' if descending else ''} "
            "LIMIT %(limit)s OFFSET %(offset)s"
        )
    return sql, params


THREAD_NAMESPACES = (
    "SELECT DISTINCT checkpoint_ns FROM lgfs_checkpoints WHERE thread_id = %(thread_id)s "
    "ORDER BY checkpoint_ns"
)


# --- PostgresSaver import (read-only source) ------------------------------------------
# Run by `tools/import_postgres.py` on a LangGraph `PostgresSaver` database, in a
# read-only REPEATABLE READ transaction; they only read. That layout:
# checkpoints(thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
# type, checkpoint jsonb, metadata jsonb), checkpoint_blobs (one value per
# channel version, rebuilt into checkpoints by PostgresSaver's own code) and
# checkpoint_writes(thread_id, checkpoint_ns, checkpoint_id, task_id,
# task_path, idx, channel, type, blob), at the version of the installed
# `langgraph-checkpoint-postgres` (`POSTGRESSAVER_VERSION`).

POSTGRESSAVER_TABLES = (
    "SELECT to_regclass('checkpoints') IS NOT NULL AND to_regclass('checkpoint_blobs') IS NOT "
    "NULL AND to_regclass('checkpoint_writes') IS NOT NULL AND "
    "to_regclass('checkpoint_migrations') IS NOT NULL"
)
# The migrations applied (PostgresSaver stores each version it reached).
POSTGRESSAVER_VERSION = "SELECT max(v) FROM checkpoint_migrations"
POSTGRESSAVER_COUNTS = (
    "SELECT (SELECT count(*) FROM checkpoints), (SELECT count(*) FROM checkpoint_writes)"
)
POSTGRESSAVER_THREADS = (
    "SELECT thread_id FROM checkpoints UNION SELECT thread_id FROM checkpoint_writes ORDER BY 1"
)
POSTGRESSAVER_CHECKPOINT_KEYS = (
    "SELECT checkpoint_ns, checkpoint_id, parent_checkpoint_id FROM checkpoints "
    "WHERE thread_id = %s ORDER BY checkpoint_id, checkpoint_ns"
)
POSTGRESSAVER_WRITES_OF_CHECKPOINT = (
    "SELECT task_id, task_path, idx, channel, type, blob FROM checkpoint_writes "
    "WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s "
    "ORDER BY task_path, task_id, idx"
)
# Writes whose checkpoint the source never stored (LangGraph writes first).
POSTGRESSAVER_ORPHAN_WRITE_KEYS = (
    "SELECT DISTINCT w.checkpoint_ns, w.checkpoint_id FROM checkpoint_writes w "
    "WHERE w.thread_id = %s AND NOT EXISTS (SELECT 1 FROM checkpoints c "
    "WHERE c.thread_id = w.thread_id AND c.checkpoint_ns = w.checkpoint_ns "
    "AND c.checkpoint_id = w.checkpoint_id) ORDER BY w.checkpoint_id, w.checkpoint_ns"
)
