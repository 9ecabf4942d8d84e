"""The PostgreSQL store's server-side functions: a fenced put and put_writes in one statement.

Invariant: each function runs `txns.put`'s or `txns.put_writes`' statements
in their order, the fence's `UPDATE ... WHERE thread_id = ... AND token = ...`
first (the row lock); a VOLATILE function takes a fresh snapshot for each
statement it runs, so under READ COMMITTED the statements after the fence
see every commit made before the lock was had, as the statement-by-statement
path does (one data-modifying CTE would read with the snapshot taken before
it waited for the lock, and its version check would miss a checkpoint
committed meanwhile: tests/postgres/test_postgres_fencing.py). Anything but a new
checkpoint whose parent passes the version check, or writes under the
current token, refuses (`lgfs_refuse`): the caller then decides statement
by statement. psycopg's cost is per statement (about 100 us of client CPU
each, in a pipeline), the server's per round trip.

`FENCED_WRITES` is migration 6 of `sql.MIGRATIONS`: its text is frozen once
released (a change is a new migration). The last-writer-wins rule is
`sql._LAST_WINS`'s, written out.
"""

from __future__ import annotations

FENCED_WRITES = """
    CREATE OR REPLACE FUNCTION lgfs_put(
        p_thread_id text, p_checkpoint_ns text, p_checkpoint_id text, p_parent_id text,
        p_envelope text, p_values_type text, p_values_blob bytea, p_metadata text,
        p_source text, p_step bigint, p_run_id text, p_token bigint, p_now float8,
        p_checksum bigint, p_event_data text, p_event_checksum bigint,
        p_check_version boolean, p_notify boolean
    ) RETURNS void LANGUAGE plpgsql AS $$
    DECLARE
        v_position bigint;
        v_now float8 := coalesce(p_now, extract(epoch FROM clock_timestamp())::float8);
    BEGIN
        UPDATE lgfs_threads SET next_seq = next_seq + 1
            WHERE thread_id = p_thread_id AND token = p_token
            RETURNING next_seq - 1 INTO v_position;
        IF NOT FOUND THEN PERFORM lgfs_refuse('put: stale token'); END IF;
        -- The checkpoint (if its id is new and, with p_check_version, its
        -- parent is the latest before its position) and its event: one
        -- statement, whose snapshot is taken after the lock was had.
        WITH ins AS (
            INSERT INTO lgfs_checkpoints (thread_id, checkpoint_ns, checkpoint_id, position,
                parent_checkpoint_id, envelope, values_type, values_blob, metadata, source,
                step, run_id, token, created_at, checksum)
            SELECT p_thread_id, p_checkpoint_ns, p_checkpoint_id, v_position, p_parent_id,
                p_envelope, p_values_type, p_values_blob, p_metadata, p_source, p_step,
                p_run_id, p_token, v_now, p_checksum
            WHERE NOT p_check_version OR (SELECT c.checkpoint_id FROM lgfs_checkpoints c
                WHERE c.thread_id = p_thread_id AND c.checkpoint_ns = p_checkpoint_ns
                AND c.position < v_position ORDER BY c.position DESC LIMIT 1)
                IS NOT DISTINCT FROM p_parent_id
            ON CONFLICT DO NOTHING RETURNING position
        )
        INSERT INTO lgfs_events (thread_id, seq, kind, checkpoint_ns, checkpoint_id, data,
            token, ts, checksum) SELECT p_thread_id, ins.position, 'checkpoint', p_checkpoint_ns,
            p_checkpoint_id, p_event_data, p_token, v_now, p_event_checksum FROM ins;
        IF NOT FOUND THEN PERFORM lgfs_refuse('put: id stored, or parent not latest'); END IF;
        IF p_notify THEN PERFORM pg_notify('lgfs_events', p_thread_id); END IF;
    END $$;
    CREATE OR REPLACE FUNCTION lgfs_put_writes(
        p_thread_id text, p_checkpoint_ns text, p_checkpoint_id text, p_run_id text,
        p_token bigint, p_now float8, p_event_data text, p_event_checksum bigint,
        p_task_ids text[], p_idxs int[], p_task_paths text[], p_channels text[],
        p_types text[], p_blobs bytea[], p_sums bigint[], p_specials boolean[],
        p_notify boolean
    ) RETURNS bigint LANGUAGE plpgsql AS $$
    DECLARE
        v_position bigint;
        v_first bigint := 0;
        v_last bigint := 0;
    BEGIN
        UPDATE lgfs_threads SET next_seq = next_seq + 1
            WHERE thread_id = p_thread_id AND token = p_token
            RETURNING next_seq - 1 INTO v_position;
        IF NOT FOUND THEN PERFORM lgfs_refuse('put_writes: stale token'); END IF;
        -- Each INSERT only if it has rows (an empty one costs a statement).
        IF false = ANY(p_specials) THEN
            INSERT INTO lgfs_writes AS w (thread_id, checkpoint_ns, checkpoint_id, task_id, idx,
                task_path, channel, type, blob, position, run_id, token, checksum)
                SELECT p_thread_id, p_checkpoint_ns, p_checkpoint_id, r.task_id, r.idx, r.task_path,
                r.channel, r.type, r.blob, v_position, p_run_id, p_token, r.checksum
                FROM unnest(p_task_ids, p_idxs, p_task_paths, p_channels, p_types, p_blobs, p_sums,
                p_specials) AS r(task_id, idx, task_path, channel, type, blob, checksum, special)
                WHERE NOT r.special ON CONFLICT DO NOTHING;
            GET DIAGNOSTICS v_first = ROW_COUNT;
        END IF;
        IF true = ANY(p_specials) THEN
            INSERT INTO lgfs_writes AS w (thread_id, checkpoint_ns, checkpoint_id, task_id, idx,
                task_path, channel, type, blob, position, run_id, token, checksum)
                SELECT p_thread_id, p_checkpoint_ns, p_checkpoint_id, r.task_id, r.idx, r.task_path,
                r.channel, r.type, r.blob, v_position, p_run_id, p_token, r.checksum
                FROM unnest(p_task_ids, p_idxs, p_task_paths, p_channels, p_types, p_blobs, p_sums,
                p_specials) AS r(task_id, idx, task_path, channel, type, blob, checksum, special)
                WHERE r.special
                ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
                DO UPDATE SET task_path = excluded.task_path, channel = excluded.channel,
                type = excluded.type, blob = excluded.blob, position = excluded.position,
                run_id = excluded.run_id, token = excluded.token, checksum = excluded.checksum
                WHERE coalesce(excluded.token, 0) >= coalesce(w.token, 0)
                AND (w.channel IS DISTINCT FROM excluded.channel
                OR w.type IS DISTINCT FROM excluded.type OR w.blob IS DISTINCT FROM excluded.blob
                OR w.task_path IS DISTINCT FROM excluded.task_path);
            GET DIAGNOSTICS v_last = ROW_COUNT;
        END IF;
        IF v_first + v_last = 0 THEN
            -- A retry that changed nothing: the position is given back.
            UPDATE lgfs_threads SET next_seq = next_seq - 1 WHERE thread_id = p_thread_id;
            RETURN 0;
        END IF;
        INSERT INTO lgfs_events (thread_id, seq, kind, checkpoint_ns, checkpoint_id, data,
            token, ts, checksum) VALUES (p_thread_id, v_position, 'writes', p_checkpoint_ns,
            p_checkpoint_id, p_event_data, p_token,
            coalesce(p_now, extract(epoch FROM clock_timestamp())::float8), p_event_checksum);
        IF p_notify THEN PERFORM pg_notify('lgfs_events', p_thread_id); END IF;
        RETURN v_first + v_last;
    END $$;
"""

# Migration 7 (`sql.MIGRATIONS`), first: `lgfs_put_writes` for a call of one
# write, its cells as scalars (`sql.put_writes_at_fence(1)`): the same
# statements and rules as `lgfs_put_writes`' (the special channel's
# last-writer-wins written out again), without building and unnesting eight
# one-element arrays, which cost about 15 us of server CPU a call. Then
# `lgfs_put` again, its version check looking first among the 16 positions
# before its own: a backward index scan reads every entry of the leaf page
# below where it starts (all of the thread's older checkpoints there), and
# the bound stops it within them. The latest checkpoint below the position
# is in that window whenever any is, so the answer is the unbounded
# query's, which runs (`coalesce`) only when the window holds none.
ONE_WRITE = """
    CREATE OR REPLACE FUNCTION lgfs_put_write(
        p_thread_id text, p_checkpoint_ns text, p_checkpoint_id text, p_run_id text,
        p_token bigint, p_now float8, p_event_data text, p_event_checksum bigint,
        p_task_id text, p_idx int, p_task_path text, p_channel text,
        p_type text, p_blob bytea, p_sum bigint, p_special boolean,
        p_notify boolean
    ) RETURNS bigint LANGUAGE plpgsql AS $$
    DECLARE
        v_position bigint;
        v_changed bigint := 0;
    BEGIN
        UPDATE lgfs_threads SET next_seq = next_seq + 1
            WHERE thread_id = p_thread_id AND token = p_token
            RETURNING next_seq - 1 INTO v_position;
        IF NOT FOUND THEN PERFORM lgfs_refuse('put_writes: stale token'); END IF;
        IF p_special THEN
            INSERT INTO lgfs_writes AS w (thread_id, checkpoint_ns, checkpoint_id, task_id, idx,
                task_path, channel, type, blob, position, run_id, token, checksum)
                VALUES (p_thread_id, p_checkpoint_ns, p_checkpoint_id, p_task_id, p_idx,
                p_task_path, p_channel, p_type, p_blob, v_position, p_run_id, p_token, p_sum)
                ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
                DO UPDATE SET task_path = excluded.task_path, channel = excluded.channel,
                type = excluded.type, blob = excluded.blob, position = excluded.position,
                run_id = excluded.run_id, token = excluded.token, checksum = excluded.checksum
                WHERE coalesce(excluded.token, 0) >= coalesce(w.token, 0)
                AND (w.channel IS DISTINCT FROM excluded.channel
                OR w.type IS DISTINCT FROM excluded.type OR w.blob IS DISTINCT FROM excluded.blob
                OR w.task_path IS DISTINCT FROM excluded.task_path);
        ELSE
            INSERT INTO lgfs_writes AS w (thread_id, checkpoint_ns, checkpoint_id, task_id, idx,
                task_path, channel, type, blob, position, run_id, token, checksum)
                VALUES (p_thread_id, p_checkpoint_ns, p_checkpoint_id, p_task_id, p_idx,
                p_task_path, p_channel, p_type, p_blob, v_position, p_run_id, p_token, p_sum)
                ON CONFLICT DO NOTHING;
        END IF;
        GET DIAGNOSTICS v_changed = ROW_COUNT;
        IF v_changed = 0 THEN
            -- A retry that changed nothing: the position is given back.
            UPDATE lgfs_threads SET next_seq = next_seq - 1 WHERE thread_id = p_thread_id;
            RETURN 0;
        END IF;
        INSERT INTO lgfs_events (thread_id, seq, kind, checkpoint_ns, checkpoint_id, data,
            token, ts, checksum) VALUES (p_thread_id, v_position, 'writes', p_checkpoint_ns,
            p_checkpoint_id, p_event_data, p_token,
            coalesce(p_now, extract(epoch FROM clock_timestamp())::float8), p_event_checksum);
        IF p_notify THEN PERFORM pg_notify('lgfs_events', p_thread_id); END IF;
        RETURN v_changed;
    END $$;

    CREATE OR REPLACE FUNCTION lgfs_put(
        p_thread_id text, p_checkpoint_ns text, p_checkpoint_id text, p_parent_id text,
        p_envelope text, p_values_type text, p_values_blob bytea, p_metadata text,
        p_source text, p_step bigint, p_run_id text, p_token bigint, p_now float8,
        p_checksum bigint, p_event_data text, p_event_checksum bigint,
        p_check_version boolean, p_notify boolean
    ) RETURNS void LANGUAGE plpgsql AS $$
    DECLARE
        v_position bigint;
        v_now float8 := coalesce(p_now, extract(epoch FROM clock_timestamp())::float8);
    BEGIN
        UPDATE lgfs_threads SET next_seq = next_seq + 1
            WHERE thread_id = p_thread_id AND token = p_token
            RETURNING next_seq - 1 INTO v_position;
        IF NOT FOUND THEN PERFORM lgfs_refuse('put: stale token'); END IF;
        -- The checkpoint (if its id is new and, with p_check_version, its
        -- parent is the latest before its position) and its event: one
        -- statement, whose snapshot is taken after the lock was had.
        WITH ins AS (
            INSERT INTO lgfs_checkpoints (thread_id, checkpoint_ns, checkpoint_id, position,
                parent_checkpoint_id, envelope, values_type, values_blob, metadata, source,
                step, run_id, token, created_at, checksum)
            SELECT p_thread_id, p_checkpoint_ns, p_checkpoint_id, v_position, p_parent_id,
                p_envelope, p_values_type, p_values_blob, p_metadata, p_source, p_step,
                p_run_id, p_token, v_now, p_checksum
            WHERE NOT p_check_version OR coalesce((SELECT c.checkpoint_id
                FROM lgfs_checkpoints c WHERE c.thread_id = p_thread_id
                AND c.checkpoint_ns = p_checkpoint_ns AND c.position < v_position
                AND c.position >= v_position - 16 ORDER BY c.position DESC LIMIT 1),
                (SELECT c.checkpoint_id FROM lgfs_checkpoints c
                WHERE c.thread_id = p_thread_id AND c.checkpoint_ns = p_checkpoint_ns
                AND c.position < v_position ORDER BY c.position DESC LIMIT 1))
                IS NOT DISTINCT FROM p_parent_id
            ON CONFLICT DO NOTHING RETURNING position
        )
        INSERT INTO lgfs_events (thread_id, seq, kind, checkpoint_ns, checkpoint_id, data,
            token, ts, checksum) SELECT p_thread_id, ins.position, 'checkpoint', p_checkpoint_ns,
            p_checkpoint_id, p_event_data, p_token, v_now, p_event_checksum FROM ins;
        IF NOT FOUND THEN PERFORM lgfs_refuse('put: id stored, or parent not latest'); END IF;
        IF p_notify THEN PERFORM pg_notify('lgfs_events', p_thread_id); END IF;
    END $$;
"""

# Migration 8 (`sql.MIGRATIONS`): `begin_run` in one statement for a run
# that does not take over and names no tenant (`runs.begin_run_batch`), the
# common turn of a worker: `runs.begin_run`'s statements in their order. A
# read that takes no lock answers a live claim (with the latest root
# checkpoint, for ThreadBusy) without waiting for the holder's row lock, as
# `sql.LOCK_RUN_THREAD_UNLESS_LIVE` does; otherwise the row is locked
# (created), and a thread with no claim is granted under the new token, at
# the position its grant took, with its `run_started` event (made by the
# client) and NOTIFY. A live claim found under the lock (a grant that won
# the race, as workers woken by one run's end race) is answered as busy
# too; an expired one (a crashed holder's, which `run_superseded` must
# name) refuses (`lgfs_refuse`), and `runs.begin_run` decides statement by
# statement. Its output columns are prefixed: PL/pgSQL would read an output
# column named like a table's (`token`) in place of that column.
BEGIN_RUN = """
    CREATE OR REPLACE FUNCTION lgfs_begin_run(
        p_thread_id text, p_holder text, p_ttl float8, p_run_id text, p_now float8,
        p_event_data text, p_event_checksum bigint, p_notify boolean
    ) RETURNS TABLE (o_granted boolean, o_holder text, o_token bigint, o_expires float8,
        o_latest text) LANGUAGE plpgsql AS $$
    DECLARE
        v_holder text;
        v_token bigint;
        v_expires float8;
        v_at float8;
        v_seq bigint;
    BEGIN
        SELECT t.holder, t.token, t.expires_at INTO v_holder, v_token, v_expires
            FROM lgfs_threads t WHERE t.thread_id = p_thread_id;
        v_at := coalesce(p_now, extract(epoch FROM clock_timestamp())::float8);
        -- NaN (a damaged cell) sorts above every number here, but is not
        -- live by `claims.claim_live`: the lock decides it, as it always did.
        IF v_token IS NOT NULL AND v_at < v_expires AND v_expires <> 'NaN'::float8 THEN
            RETURN QUERY SELECT false, v_holder, v_token, v_expires, (SELECT c.checkpoint_id
                FROM lgfs_checkpoints c WHERE c.thread_id = p_thread_id
                AND c.checkpoint_ns = '' ORDER BY c.position DESC LIMIT 1);
            RETURN;
        END IF;
        INSERT INTO lgfs_threads AS t (thread_id) VALUES (p_thread_id)
            ON CONFLICT (thread_id) DO UPDATE SET thread_id = t.thread_id
            RETURNING t.holder, t.token, t.expires_at INTO v_holder, v_token, v_expires;
        v_at := coalesce(p_now, extract(epoch FROM clock_timestamp())::float8);
        IF v_token IS NOT NULL THEN
            IF v_at < v_expires AND v_expires <> 'NaN'::float8 THEN
                -- Another grant won the race for the lock: busy, as the
                -- statements would say, with nothing written.
                RETURN QUERY SELECT false, v_holder, v_token, v_expires, (SELECT c.checkpoint_id
                    FROM lgfs_checkpoints c WHERE c.thread_id = p_thread_id
                    AND c.checkpoint_ns = '' ORDER BY c.position DESC LIMIT 1);
                RETURN;
            END IF;
            PERFORM lgfs_refuse('begin_run: an expired claim to supersede');
        END IF;
        UPDATE lgfs_threads t SET token = nextval('lgfs_tokens'), holder = p_holder,
            expires_at = v_at + p_ttl, claimed_at = v_at, last_holder = p_holder,
            last_token = currval('lgfs_tokens'), run_id = p_run_id, cancel_by = NULL,
            next_seq = t.next_seq + 1 WHERE t.thread_id = p_thread_id
            RETURNING t.token, t.expires_at, t.next_seq - 1 INTO v_token, v_expires, v_seq;
        INSERT INTO lgfs_events (thread_id, seq, kind, checkpoint_ns, checkpoint_id, data,
            token, ts, checksum) VALUES (p_thread_id, v_seq, 'run_started', NULL, NULL,
            p_event_data, v_token, coalesce(p_now, extract(epoch FROM clock_timestamp())::float8),
            p_event_checksum);
        IF p_notify THEN PERFORM pg_notify('lgfs_events', p_thread_id); END IF;
        RETURN QUERY SELECT true, p_holder, v_token, v_expires, NULL::text;
    END $$;
"""

# Migration 10 (`sql.MIGRATIONS`): the unfenced put and put_writes in one
# statement too (before, six round trips each: `txns.fence` and its
# statements), which is every write of a graph compiled with the saver and
# run without a claim. Each function of migrations 6 and 7 again, its fence
# now also taking a NULL token: the thread's row, made if missing (as
# `sql.LOCK_THREAD`) and locked either way, takes the position as
# `sql.TAKE_POSITION` does; a row holding any claim (live, expired or
# damaged) refuses, and the caller decides statement by statement
# (`txns.fence`: ThreadBusy, or a write allowed past an expired claim).
# Written as those texts with their fence replaced (`_unfenced`), so the
# rest of each body is theirs, letter for letter.
_FENCE = """        UPDATE lgfs_threads SET next_seq = next_seq + 1
            WHERE thread_id = p_thread_id AND token = p_token
            RETURNING next_seq - 1 INTO v_position;
        IF NOT FOUND THEN PERFORM lgfs_refuse('{op}: stale token'); END IF;"""
_FENCE_OR_UNFENCED = """        IF p_token IS NULL THEN
            INSERT INTO lgfs_threads AS t (thread_id, next_seq) VALUES (p_thread_id, 2)
                ON CONFLICT (thread_id) DO UPDATE SET next_seq = t.next_seq + 1
                RETURNING t.next_seq - 1, t.token INTO v_position, v_claim;
            IF v_claim IS NOT NULL THEN
                PERFORM lgfs_refuse('{op}: unfenced, on a claimed thread');
            END IF;
        ELSE
            UPDATE lgfs_threads SET next_seq = next_seq + 1
                WHERE thread_id = p_thread_id AND token = p_token
                RETURNING next_seq - 1 INTO v_position;
            IF NOT FOUND THEN PERFORM lgfs_refuse('{op}: stale token'); END IF;
        END IF;"""
_DECLARE = "    DECLARE\n        v_position bigint;\n"


def _unfenced(text: str, functions: int) -> str:
    """`text` (`functions` CREATE FUNCTIONs) with each fence taking a NULL token too."""
    out = text.replace(_DECLARE, _DECLARE + "        v_claim bigint;\n")
    for op in ("put", "put_writes"):
        out = out.replace(_FENCE.format(op=op), _FENCE_OR_UNFENCED.format(op=op))
    if out.count("IF p_token IS NULL") != functions or out.count("v_claim bigint") != functions:
        raise AssertionError("migration 10: a fence or DECLARE of migrations 6-7 changed")
    return out


UNFENCED = _unfenced(ONE_WRITE, 2) + _unfenced(
    FENCED_WRITES[FENCED_WRITES.index("    CREATE OR REPLACE FUNCTION lgfs_put_writes(") :], 1
)

# Migration 11 (`sql.MIGRATIONS`): channel values stored once each
# (core/values.py, docs/semantics.md §7), as the SQLite store's schema 5
# `blobs` table holds them. A checkpoint written from now on holds `{channel:
# key}` (values_type 'lgfs-refs') naming rows of `lgfs_blobs` of its thread
# and namespace; rows written before keep their values inline and read as
# they always did (`repack` moves them). `data` is stored as the client
# gave it (zstd-compressed when that paid): EXTERNAL, so the server does not
# try to compress it again. Each statement may run again (IF NOT EXISTS, OR
# REPLACE), as the functions-only migrations before it could.
#
# `lgfs_refs(values_blob)` is a refs cell as the JSON object it must be, or
# NULL when it is not one (damage: not UTF-8, not JSON, not an object), so
# that a statement walking every checkpoint's refs never fails on one
# damaged cell: a read then finds no value row for it (its reader names the
# damage), and a collection frees nothing of the thread.
#
# `lgfs_put_values` is `lgfs_put` (which it calls, unchanged, so a client of
# an older version keeps calling that) followed, in the same statement and
# transaction, by the put's value rows: each single extension a merged row
# now holds becomes the prefix of it that it is (`values.PREFIX`: its row,
# if still a single extension, rewritten in place), every other row inserted
# unless its key is stored (keys name content). Then, when the put's values
# name rows of its parent's (`p_borrows`, the parent's refs as this process
# read them), it refuses unless the parent still holds those refs: the
# parent was deleted or replaced since, so those rows may be gone. The
# caller then decides statement by statement (`txns.put`), which raises
# `StaleParent`, and the saver stores the values whole. Each statement runs
# after `lgfs_put`'s fence took the thread's row lock, which every removal
# of the thread's rows takes too, so no collection runs between the check
# and the commit. Since migration 14 (which creates it again, `PUT_VALUES`)
# it also refuses a put whose borrow rows name a pending write
# (`values.LENT`) not stored with the checksum the cell names (a write that
# lost to another process's, or was never stored): the saver then encodes
# the values again, naming no write.
PUT_VALUES = """
    CREATE OR REPLACE FUNCTION lgfs_put_values(
        p_thread_id text, p_checkpoint_ns text, p_checkpoint_id text, p_parent_id text,
        p_envelope text, p_values_type text, p_values_blob bytea, p_metadata text,
        p_source text, p_step bigint, p_run_id text, p_token bigint, p_now float8,
        p_checksum bigint, p_event_data text, p_event_checksum bigint,
        p_check_version boolean, p_notify boolean,
        p_channels text[], p_keys text[], p_bases text[], p_types text[], p_items int[],
        p_ordinals int[], p_codecs text[], p_sizes int[], p_datas bytea[], p_sums bigint[],
        p_borrows bytea
    ) RETURNS void LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM lgfs_put(p_thread_id, p_checkpoint_ns, p_checkpoint_id, p_parent_id,
            p_envelope, p_values_type, p_values_blob, p_metadata, p_source, p_step, p_run_id,
            p_token, p_now, p_checksum, p_event_data, p_event_checksum, p_check_version,
            p_notify);
        IF 'prefix' = ANY(p_codecs) THEN
            UPDATE lgfs_blobs b SET base = r.base, type = r.type, items = r.items,
                ordinal = r.ordinal, codec = r.codec, size = r.size, data = r.data,
                checksum = r.checksum
                FROM unnest(p_channels, p_keys, p_bases, p_types, p_items, p_ordinals, p_codecs,
                p_sizes, p_datas, p_sums) AS r(channel, key, base, type, items, ordinal, codec,
                size, data, checksum)
                WHERE r.codec = 'prefix' AND b.thread_id = p_thread_id
                AND b.checkpoint_ns = p_checkpoint_ns AND b.channel = r.channel
                AND b.key = r.key AND b.codec <> 'prefix';
        END IF;
        IF EXISTS (SELECT 1 FROM unnest(p_codecs) AS r(codec) WHERE r.codec <> 'prefix') THEN
            INSERT INTO lgfs_blobs (thread_id, checkpoint_ns, channel, key, base, type, items,
                ordinal, codec, size, data, checksum)
                SELECT p_thread_id, p_checkpoint_ns, r.* FROM unnest(p_channels, p_keys, p_bases,
                p_types, p_items, p_ordinals, p_codecs, p_sizes, p_datas, p_sums)
                AS r(channel, key, base, type, items, ordinal, codec, size, data, checksum)
                WHERE r.codec <> 'prefix' ON CONFLICT DO NOTHING;
        END IF;
        IF p_borrows IS NOT NULL AND NOT EXISTS (SELECT 1 FROM lgfs_checkpoints c
                WHERE c.thread_id = p_thread_id AND c.checkpoint_ns = p_checkpoint_ns
                AND c.checkpoint_id = p_parent_id AND c.values_type = 'lgfs-refs'
                AND c.values_blob = p_borrows) THEN
            PERFORM lgfs_refuse('put: its parent no longer holds the values it names');
        END IF;
        IF 'borrow' = ANY(p_codecs) AND EXISTS (SELECT 1
                FROM unnest(p_codecs, p_datas) AS r(codec, data)
                CROSS JOIN LATERAL (SELECT lgfs_refs(r.data) AS cell) x
                WHERE r.codec = 'borrow' AND jsonb_typeof(x.cell -> 'w') = 'array'
                AND NOT EXISTS (SELECT 1 FROM lgfs_writes w WHERE w.thread_id = p_thread_id
                    AND w.checkpoint_ns = p_checkpoint_ns
                    AND w.checkpoint_id = x.cell -> 'w' ->> 0
                    AND w.task_id = x.cell -> 'w' ->> 1 AND w.idx::text = x.cell -> 'w' ->> 2
                    AND w.checksum::text = x.cell ->> 's')) THEN
            PERFORM lgfs_refuse('put: a pending write its values name is not stored as named');
        END IF;
    END $$;
"""
VALUE_TABLE = (
    """
    CREATE TABLE IF NOT EXISTS lgfs_blobs (
        thread_id text COLLATE "C" NOT NULL,
        checkpoint_ns text COLLATE "C" NOT NULL,
        channel text COLLATE "C" NOT NULL,
        key text COLLATE "C" NOT NULL,
        base text COLLATE "C",
        type text NOT NULL,
        items integer NOT NULL,
        ordinal integer NOT NULL,
        codec text NOT NULL,
        size integer NOT NULL,
        data bytea NOT NULL,
        checksum bigint NOT NULL,
        PRIMARY KEY (thread_id, checkpoint_ns, channel, key)
    );
    ALTER TABLE lgfs_blobs ALTER COLUMN data SET STORAGE EXTERNAL;
    CREATE OR REPLACE FUNCTION lgfs_refs(p_refs bytea) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
    DECLARE
        v_refs jsonb;
    BEGIN
        v_refs := convert_from(p_refs, 'UTF8')::jsonb;
        IF jsonb_typeof(v_refs) = 'object' THEN RETURN v_refs; END IF;
        RETURN NULL;
    EXCEPTION WHEN others THEN
        RETURN NULL;
    END $$;
"""
    + PUT_VALUES
)


# Migration 12: thread search (`search_threads`, `count_threads`), the SQLite
# store's `thread_tags` (its schema 6). `lgfs_thread_tags` holds each
# thread's latest root checkpoint's top-level metadata keys and values, so a
# metadata filter seeks `lgfs_thread_tags_value` instead of reading every
# thread's latest checkpoint; LangGraph's per-step keys
# (`core.thread_search.UNINDEXED_KEYS`) and JSON nulls are left out (they
# change at every step). Kept by triggers, so every path that stores or
# removes a root checkpoint keeps it current; a thread's puts are serialised
# by its row's lock (`FENCE`), so one thread's tags are never written by two
# transactions at once. `lgfs_thread_tag_sources` holds, per thread, the
# metadata its tags were made from less the per-step keys: a put whose
# metadata gives the same (the common put) stops at that comparison, one
# parse and one seek. Only the rare path (the tags change) runs in an
# exception block, so that metadata that is not a JSON object (damage)
# counts as none there; the common path parses without one (a
# subtransaction per put would cost more than the rest), so a row inserted
# below the API whose metadata is not JSON at all is refused (every path of
# the library stores JSON).
THREAD_TAGS = """
    CREATE TABLE IF NOT EXISTS lgfs_thread_tags (
        thread_id text COLLATE "C" NOT NULL,
        key text COLLATE "C" NOT NULL,
        value jsonb NOT NULL,
        PRIMARY KEY (thread_id, key)
    );
    CREATE INDEX IF NOT EXISTS lgfs_thread_tags_value
        ON lgfs_thread_tags (key, value, thread_id);
    CREATE TABLE IF NOT EXISTS lgfs_thread_tag_sources (
        thread_id text COLLATE "C" PRIMARY KEY,
        tagged jsonb NOT NULL
    );
    CREATE OR REPLACE FUNCTION lgfs_tag_source(m jsonb) RETURNS jsonb
    LANGUAGE sql IMMUTABLE AS $$
        SELECT CASE WHEN jsonb_typeof(m) = 'object'
            THEN m - '{source,step,parents,writes}'::text[] ELSE m END
    $$;
    CREATE OR REPLACE FUNCTION lgfs_parsed(p_metadata text) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE AS $$
    BEGIN
        RETURN p_metadata::jsonb;
    EXCEPTION WHEN others THEN
        RETURN NULL;
    END $$;
    CREATE OR REPLACE FUNCTION lgfs_retag(p_thread_id text, p_metadata text) RETURNS void
    LANGUAGE plpgsql AS $$
    DECLARE
        parsed jsonb := lgfs_parsed(p_metadata);
        m jsonb := '{}'::jsonb;
    BEGIN
        IF jsonb_typeof(parsed) = 'object' THEN
            m := (SELECT coalesce(jsonb_object_agg(e.key, e.value), '{}'::jsonb)
                FROM jsonb_each(lgfs_tag_source(parsed)) e WHERE e.value <> 'null'::jsonb);
        END IF;
        DELETE FROM lgfs_thread_tags g WHERE g.thread_id = p_thread_id
            AND (m -> g.key) IS DISTINCT FROM g.value;
        INSERT INTO lgfs_thread_tags (thread_id, key, value)
            SELECT p_thread_id, e.key, e.value FROM jsonb_each(m) e
            WHERE NOT EXISTS (SELECT 1 FROM lgfs_thread_tags g
                WHERE g.thread_id = p_thread_id AND g.key = e.key);
        IF parsed IS NULL THEN
            DELETE FROM lgfs_thread_tag_sources WHERE thread_id = p_thread_id;
        ELSE
            INSERT INTO lgfs_thread_tag_sources (thread_id, tagged)
                VALUES (p_thread_id, lgfs_tag_source(parsed))
                ON CONFLICT (thread_id) DO UPDATE SET tagged = EXCLUDED.tagged;
        END IF;
    END $$;
    CREATE OR REPLACE FUNCTION lgfs_tag_put() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        -- A simple expression (no executor) and one index seek: the common
        -- put ends at the comparison (measured: one query doing both cost
        -- about twice as much).
        source jsonb := lgfs_tag_source(NEW.metadata::jsonb);
        stored jsonb;
    BEGIN
        SELECT s.tagged INTO stored FROM lgfs_thread_tag_sources s
            WHERE s.thread_id = NEW.thread_id;
        IF source IS NOT DISTINCT FROM stored THEN
            RETURN NULL;
        END IF;
        IF EXISTS (SELECT 1 FROM lgfs_checkpoints c WHERE c.thread_id = NEW.thread_id
                AND c.checkpoint_ns = '' AND c.position > NEW.position) THEN
            RETURN NULL;
        END IF;
        PERFORM lgfs_retag(NEW.thread_id, NEW.metadata);
        RETURN NULL;
    END $$;
    CREATE OR REPLACE FUNCTION lgfs_tag_delete() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM lgfs_checkpoints c WHERE c.thread_id = OLD.thread_id
                AND c.checkpoint_ns = '' AND c.position > OLD.position) THEN
            PERFORM lgfs_retag(OLD.thread_id, (SELECT c.metadata FROM lgfs_checkpoints c
                WHERE c.thread_id = OLD.thread_id AND c.checkpoint_ns = ''
                ORDER BY c.position DESC LIMIT 1));
        END IF;
        RETURN NULL;
    END $$;
    DROP TRIGGER IF EXISTS lgfs_checkpoints_tags ON lgfs_checkpoints;
    CREATE TRIGGER lgfs_checkpoints_tags AFTER INSERT ON lgfs_checkpoints
        FOR EACH ROW WHEN (NEW.checkpoint_ns = '') EXECUTE FUNCTION lgfs_tag_put();
    DROP TRIGGER IF EXISTS lgfs_checkpoints_tags_delete ON lgfs_checkpoints;
    CREATE TRIGGER lgfs_checkpoints_tags_delete AFTER DELETE ON lgfs_checkpoints
        FOR EACH ROW WHEN (OLD.checkpoint_ns = '') EXECUTE FUNCTION lgfs_tag_delete();
    SELECT lgfs_retag(l.thread_id, l.metadata) FROM (SELECT DISTINCT ON (c.thread_id)
        c.thread_id, c.metadata FROM lgfs_checkpoints c WHERE c.checkpoint_ns = ''
        ORDER BY c.thread_id, c.position DESC) l;
"""
