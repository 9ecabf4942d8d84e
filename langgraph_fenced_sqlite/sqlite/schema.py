"""All SQL of the package: pragmas, migrations and named statements.

Invariant: this module executes nothing. The engine applies `PRAGMAS` to every
connection and `MIGRATIONS[i]` moves a file from schema version `i` to `i + 1`
(the stored version is `PRAGMA user_version`); entries are only ever appended.
Fenced statements carry the token in their `WHERE` clause, and no fenced table
is written with `INSERT OR REPLACE`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..core.values import LENT

# Identifies our files: `PRAGMA application_id` of every file we set up.
APPLICATION_ID = 0x4C474653  # "LGFS"

# The size (bytes) the WAL is truncated back to after a checkpoint.
JOURNAL_SIZE_LIMIT = 8 * 1024 * 1024
# WAL pages after which a commit checkpoints (SQLite's default is 1000). Each
# checkpoint syncs twice (the WAL, then the database): at 1000 pages that was
# 0.21 of the 7.3 syncs of a 5-node chain invoke, at 2000 it is 0.11. Set per
# connection; a full WAL (2000 frames of a 4 KB page) stays under the limit.
WAL_AUTOCHECKPOINT = 2000

# (name, value) applied to every new connection, in order; the engine only
# changes one whose current value differs.
PRAGMAS: tuple[tuple[str, str], ...] = (
    ("journal_mode", "wal"),
    ("synchronous", "2"),  # FULL: a commit that returned survives power loss
    ("foreign_keys", "0"),
    # A reader holding a snapshot keeps every later commit in the WAL (it
    # cannot be checkpointed past the reader), and SQLite never shrinks the
    # file by itself: a slow consumer once left it at 354 MB. With a limit,
    # the first commit after a complete checkpoint truncates it back to this.
    ("journal_size_limit", str(JOURNAL_SIZE_LIMIT)),
)

# The oldest SQLite whose SQL dialect the statements below need: RETURNING
# (3.35.0), UPSERT with several ON CONFLICT clauses (3.35.0) and the JSON
# functions (built in from 3.38.0, compiled in by every CPython build before).
MIN_SQLITE_VERSION = (3, 35, 0)
# Probed at open: SQLite builds without JSON support fail it.
PROBE_JSON = "SELECT json_extract('{\"a\": 1}', '$.a')"

# Which of a metadata object's top-level entries `thread_tags` holds:
# not LangGraph's per-step keys (`core.thread_search.UNINDEXED_KEYS`), not a
# JSON null. Migrations are append-only: never edit these once shipped.
_TAGGED = "j.key NOT IN ('source', 'step', 'parents', 'writes') AND j.type <> 'null'"
# The part of a metadata text that `thread_tags` is made from, as one text
# (NULL for a text that is not JSON), kept per thread in `thread_tag_sources`:
# a put whose metadata gives the same text (the common put: only LangGraph's
# per-step keys changed) cannot change the thread's tags, and its trigger
# stops at that comparison (one JSON parse and one seek, instead of reading
# each key's row).
_TAG_SOURCE = (
    "CASE WHEN json_valid({metadata}) THEN json_remove({metadata}, "
    "'$.source', '$.step', '$.parents', '$.writes') END"
)
# Make a thread's rows of `thread_tags` those of `{metadata}` (a metadata text,
# or NULL: none): drop keys gone or left out, then insert new keys and update
# changed values (a value that did not change writes nothing: the upsert's
# WHERE), and record the text they were made from. Damaged metadata (not a
# JSON object) counts as none: a put never fails here.
_RETAG = (
    """DELETE FROM thread_tags WHERE thread_id = {thread} AND key NOT IN (
                SELECT j.key FROM json_each(CASE WHEN json_valid({metadata})
                AND json_type({metadata}) = 'object' THEN {metadata} ELSE '{{}}' END) j
                WHERE """
    + _TAGGED
    + """);
            INSERT INTO thread_tags (thread_id, key, value)
                SELECT {thread}, j.key, j.value FROM json_each(CASE WHEN json_valid({metadata})
                AND json_type({metadata}) = 'object' THEN {metadata} ELSE '{{}}' END) j
                WHERE """
    + _TAGGED
    + """
                ON CONFLICT (thread_id, key) DO UPDATE SET value = excluded.value
                WHERE value IS NOT excluded.value;
            DELETE FROM thread_tag_sources WHERE thread_id = {thread} AND ("""
    + _TAG_SOURCE
    + """) IS NULL;
            INSERT INTO thread_tag_sources (thread_id, tagged) SELECT {thread}, """
    + _TAG_SOURCE
    + """ WHERE ("""
    + _TAG_SOURCE
    + """) IS NOT NULL
                ON CONFLICT (thread_id) DO UPDATE SET tagged = excluded.tagged;"""
)
_LATEST_ROOT_METADATA = (
    "(SELECT l.metadata FROM checkpoints l WHERE l.thread_id = OLD.thread_id "
    "AND l.checkpoint_ns = '' ORDER BY l.position DESC LIMIT 1)"
)

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 0 -> 1: the first schema.
    (
        """CREATE TABLE meta (
            key TEXT PRIMARY KEY,
            value INTEGER NOT NULL
        )""",
        "INSERT INTO meta (key, value) VALUES ('token_counter', 0)",
        # One row per thread: its replay floor and its claim. It is written
        # only by claims and compaction, never by a checkpoint or a write, so
        # a commit touches one page fewer. The next event seq is derived
        # from the log (see NEXT_SEQ_OF).
        """CREATE TABLE threads (
            thread_id TEXT PRIMARY KEY,
            floor INTEGER NOT NULL DEFAULT 1,
            holder TEXT,
            token INTEGER,
            expires_at REAL,
            claimed_at REAL
        )""",
        # A rowid table with two indexes (three B-trees per insert), not a
        # WITHOUT ROWID table keyed by position with one index (two): rows
        # append at the rowid tree's right edge, where a full leaf splits by
        # starting one new page, while an index B-tree (WITHOUT ROWID) splits
        # by rewriting up to three sibling leaves, and a checkpoint's cell is
        # large (4-8 to a 4 KB page). Measured with 16 threads: 7.9-8.2 vs
        # 7.3 WAL frames per 4 KB put, 7.0-7.2 vs 5.6-5.8 per 256 B put
        # (benchmarks/bench_layout.py).
        """CREATE TABLE checkpoints (
            thread_id TEXT NOT NULL,
            checkpoint_ns TEXT NOT NULL,
            checkpoint_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            parent_checkpoint_id TEXT,
            envelope TEXT NOT NULL,
            values_type TEXT NOT NULL,
            values_blob BLOB NOT NULL,
            metadata TEXT NOT NULL,
            source TEXT,
            step INTEGER,
            run_id TEXT,
            token INTEGER,
            created_at REAL NOT NULL,
            PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
        )""",
        """CREATE INDEX checkpoints_by_position
            ON checkpoints (thread_id, checkpoint_ns, position)""",
        """CREATE INDEX checkpoints_by_run ON checkpoints (run_id)
            WHERE run_id IS NOT NULL""",
        """CREATE TABLE writes (
            thread_id TEXT NOT NULL,
            checkpoint_ns TEXT NOT NULL,
            checkpoint_id TEXT NOT NULL,
            task_id TEXT NOT NULL,
            idx INTEGER NOT NULL,
            task_path TEXT NOT NULL DEFAULT '',
            channel TEXT NOT NULL,
            type TEXT NOT NULL,
            blob BLOB NOT NULL,
            position INTEGER NOT NULL,
            run_id TEXT,
            token INTEGER,
            PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
        ) WITHOUT ROWID""",
        """CREATE INDEX writes_by_run ON writes (run_id) WHERE run_id IS NOT NULL""",
        """CREATE TABLE events (
            thread_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            kind TEXT NOT NULL,
            checkpoint_ns TEXT,
            checkpoint_id TEXT,
            data TEXT NOT NULL,
            token INTEGER,
            ts REAL NOT NULL,
            PRIMARY KEY (thread_id, seq)
        ) WITHOUT ROWID""",
    ),
    # 1 -> 2: a checksum on every stored value (docs/semantics.md §7), thread
    # incarnations (§4: `delete_thread` raises it, so a reader of an earlier
    # incarnation is never silently shown a gap), and the run id a claim was
    # granted for (what `strategy="rollback"` retracts; events may be pruned).
    # Existing rows get their checksums here, computed by the function the
    # engine registers on every connection (CHECKSUM_FUNCTION). Cells go in as
    # blobs: the same bytes as the text's UTF-8 (so the same checksum), but a
    # damaged cell that is not UTF-8 cannot fail the Python function.
    (
        "ALTER TABLE checkpoints ADD COLUMN checksum INTEGER",
        "ALTER TABLE writes ADD COLUMN checksum INTEGER",
        "ALTER TABLE events ADD COLUMN checksum INTEGER",
        "ALTER TABLE threads ADD COLUMN incarnation INTEGER NOT NULL DEFAULT 1",
        "ALTER TABLE threads ADD COLUMN run_id TEXT",
        "UPDATE checkpoints SET checksum = lgfs_checksum(CAST(envelope AS BLOB), "
        "CAST(values_type AS BLOB), CAST(values_blob AS BLOB), CAST(metadata AS BLOB))",
        "UPDATE writes SET checksum = "
        "lgfs_checksum(CAST(channel AS BLOB), CAST(type AS BLOB), CAST(blob AS BLOB))",
        "UPDATE events SET checksum = lgfs_checksum(CAST(kind AS BLOB), CAST(data AS BLOB))",
    ),
    # 2 -> 3: runs an operator can steer. `tenant` is the tenant a thread
    # belongs to (set by its first run under a tenant's runner; NULL: none).
    # `cancel_by` says who asked the current claim's run to stop (cleared by
    # every grant and release, so a request never outlives the claim it was
    # for); the run's renewal reads it. `last_holder`/`last_token` are the
    # latest claim granted, kept after its release, so that a stale writer
    # learns who took the thread over even once that claim has ended.
    (
        "ALTER TABLE threads ADD COLUMN tenant TEXT",
        "ALTER TABLE threads ADD COLUMN cancel_by TEXT",
        "ALTER TABLE threads ADD COLUMN last_holder TEXT",
        "ALTER TABLE threads ADD COLUMN last_token INTEGER",
        "UPDATE threads SET last_holder = holder, last_token = token WHERE token IS NOT NULL",
    ),
    # 3 -> 4: lighter commits. The two run-id indexes cost every checkpoint
    # and every write of a run one more page in its commit (measured: 8.2 vs
    # 7.2 WAL frames per 4 KB `put`, 7.6 vs 6.3 per `put_writes`; see
    # benchmarks/bench_pages.py), only so that `delete_for_runs` can find a
    # run's threads. `thread_runs` holds each (thread, run) pair once, written
    # by the first checkpoint or write of a run in a thread (later ones change
    # no row, so no page), by triggers, so that every path that stores a row
    # of a run (put, put_writes, copy_thread, import) keeps it complete. It
    # may name more than still exists (prune and retraction leave a pair whose
    # rows went): THREADS_OF_RUN checks. Within one thread a run's rows are
    # found by scanning the thread, as prune and retraction already do.
    (
        "DROP INDEX checkpoints_by_run",
        "DROP INDEX writes_by_run",
        """CREATE TABLE thread_runs (
            thread_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            PRIMARY KEY (thread_id, run_id)
        ) WITHOUT ROWID""",
        "CREATE INDEX thread_runs_by_run ON thread_runs (run_id)",
        "INSERT INTO thread_runs (thread_id, run_id) "
        "SELECT thread_id, run_id FROM checkpoints WHERE run_id IS NOT NULL "
        "UNION SELECT thread_id, run_id FROM writes WHERE run_id IS NOT NULL",
        # Each inserts the pair only when it is missing. Not `INSERT OR IGNORE`:
        # inside a trigger the firing statement's conflict policy replaces the
        # trigger statement's, and an upsert's DO UPDATE (a special-channel
        # write replaced by the same run) makes that ABORT, so the ignored
        # duplicate failed the whole write (`test_schema.py` pins it).
        """CREATE TRIGGER checkpoints_thread_runs AFTER INSERT ON checkpoints
            WHEN NEW.run_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM thread_runs
                WHERE thread_id = NEW.thread_id AND run_id = NEW.run_id) BEGIN
            INSERT INTO thread_runs (thread_id, run_id) VALUES (NEW.thread_id, NEW.run_id);
        END""",
        """CREATE TRIGGER writes_thread_runs AFTER INSERT ON writes
            WHEN NEW.run_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM thread_runs
                WHERE thread_id = NEW.thread_id AND run_id = NEW.run_id) BEGIN
            INSERT INTO thread_runs (thread_id, run_id) VALUES (NEW.thread_id, NEW.run_id);
        END""",
        # A special-channel write replaced by a later one takes its run id.
        """CREATE TRIGGER writes_thread_runs_update AFTER UPDATE OF run_id ON writes
            WHEN NEW.run_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM thread_runs
                WHERE thread_id = NEW.thread_id AND run_id = NEW.run_id) BEGIN
            INSERT INTO thread_runs (thread_id, run_id) VALUES (NEW.thread_id, NEW.run_id);
        END""",
    ),
    # 4 -> 5: channel values stored once each (core/values.py). A checkpoint
    # written from now on holds `{channel: key}` (values_type 'lgfs-refs')
    # naming rows here; rows written before keep their values inline and
    # read as they always did (`lgfs compact` rewrites them). A rowid table:
    # its rows are large (a whole list, or a step's new elements) and append
    # at the right edge; the primary key is a second, small B-tree.
    (
        """CREATE TABLE blobs (
            thread_id TEXT NOT NULL,
            checkpoint_ns TEXT NOT NULL,
            channel TEXT NOT NULL,
            key TEXT NOT NULL,
            base TEXT,
            type TEXT NOT NULL,
            count INTEGER NOT NULL,
            ordinal INTEGER NOT NULL,
            codec TEXT NOT NULL,
            size INTEGER NOT NULL,
            data BLOB NOT NULL,
            checksum INTEGER,
            PRIMARY KEY (thread_id, checkpoint_ns, channel, key)
        )""",
    ),
    # 5 -> 6: thread search (`search_threads`, `count_threads`). `thread_tags`
    # holds each thread's latest root checkpoint's top-level metadata keys
    # and values (as `json_each` gives them, which is what `list(filter=)`'s
    # `json_extract` compares), so a metadata filter seeks an index instead
    # of reading every thread's latest checkpoint. Kept by triggers, so every
    # path that stores or removes a root checkpoint (put, copy, import, prune,
    # retraction, deletion) keeps it current. LangGraph's per-step keys
    # (`core.saver_threads.UNINDEXED_KEYS`: source, step, parents, writes)
    # and JSON nulls are left out: they change at every step, and a row
    # rewritten at every put would cost each commit pages. A put whose
    # indexed keys did not change writes no row (the upsert's WHERE), so the
    # hot path only reads here. Searching by a key left out reads each
    # candidate thread's latest checkpoint instead.
    (
        """CREATE TABLE thread_tags (
            thread_id TEXT NOT NULL,
            key TEXT NOT NULL,
            value,
            PRIMARY KEY (thread_id, key)
        ) WITHOUT ROWID""",
        "CREATE INDEX thread_tags_by_value ON thread_tags (key, value, thread_id)",
        """CREATE TABLE thread_tag_sources (
            thread_id TEXT PRIMARY KEY,
            tagged TEXT NOT NULL
        ) WITHOUT ROWID""",
        # Only when the tags can change (`_TAG_SOURCE`), and only for the
        # thread's latest root checkpoint (nothing newer stored: an import
        # or copy may store older ones after it).
        f"""CREATE TRIGGER checkpoints_thread_tags AFTER INSERT ON checkpoints
            WHEN NEW.checkpoint_ns = '' AND ({_TAG_SOURCE.format(metadata="NEW.metadata")})
                IS NOT (SELECT s.tagged FROM thread_tag_sources s
                WHERE s.thread_id = NEW.thread_id)
                AND NOT EXISTS (SELECT 1 FROM checkpoints c
                WHERE c.thread_id = NEW.thread_id AND c.checkpoint_ns = ''
                AND c.position > NEW.position) BEGIN
            {_RETAG.format(thread="NEW.thread_id", metadata="NEW.metadata")}
        END""",
        # Removing the latest root checkpoint (retraction, deletion) makes
        # the one before it the latest: its keys replace the thread's.
        f"""CREATE TRIGGER checkpoints_thread_tags_delete AFTER DELETE ON checkpoints
            WHEN OLD.checkpoint_ns = '' AND NOT EXISTS (SELECT 1 FROM checkpoints c
                WHERE c.thread_id = OLD.thread_id AND c.checkpoint_ns = ''
                AND c.position > OLD.position) BEGIN
            {_RETAG.format(thread="OLD.thread_id", metadata=_LATEST_ROOT_METADATA)}
        END""",
        f"""INSERT INTO thread_tags (thread_id, key, value)
            SELECT c.thread_id, j.key, j.value FROM checkpoints c, json_each(
                CASE WHEN json_valid(c.metadata) AND json_type(c.metadata) = 'object'
                THEN c.metadata ELSE '{{}}' END) j
            WHERE c.checkpoint_ns = '' AND c.position = (SELECT max(l.position)
                FROM checkpoints l WHERE l.thread_id = c.thread_id AND l.checkpoint_ns = '')
            AND {_TAGGED}""",
        f"""INSERT INTO thread_tag_sources (thread_id, tagged)
            SELECT c.thread_id, {_TAG_SOURCE.format(metadata="c.metadata")} FROM checkpoints c
            WHERE c.checkpoint_ns = '' AND c.position = (SELECT max(l.position)
                FROM checkpoints l WHERE l.thread_id = c.thread_id AND l.checkpoint_ns = '')
            AND ({_TAG_SOURCE.format(metadata="c.metadata")}) IS NOT NULL""",
    ),
    # 6 -> 7: thread expiry (docs/semantics.md §6). `ttl`/`ttl_strategy` are a
    # thread's own time to live (NULL: the sweeper's default applies);
    # `ttl_seen` is the sweepers' bookkeeping: the thread's last activity as
    # a sweep last saw it (a lower bound: activity only grows), so a thread
    # is due no earlier than `ttl_seen + ttl`, found through an index with no
    # look at the thread's own rows; NULL: not seen yet; 9e999 (infinity):
    # parked, holding nothing left to expire. A commit does not write the
    # thread's row (a page per commit), so a sweep re-reads a due-looking
    # thread's activity before it acts, and the trigger below un-parks a
    # parked thread when an event is appended to it (the WHEN finds the row
    # through its key, on a page the commit's fence has just read; it writes
    # only when the thread was parked).
    (
        "ALTER TABLE threads ADD COLUMN ttl REAL",
        "ALTER TABLE threads ADD COLUMN ttl_strategy TEXT",
        "ALTER TABLE threads ADD COLUMN ttl_seen REAL",
        "CREATE INDEX threads_by_ttl_seen ON threads (ttl_seen)",
        "CREATE INDEX threads_by_ttl_due ON threads (ttl_seen + ttl) WHERE ttl IS NOT NULL",
        "CREATE INDEX threads_ttl_unseen ON threads (thread_id) "
        "WHERE ttl_seen IS NULL AND ttl IS NOT NULL",
        """CREATE TRIGGER events_unpark_ttl AFTER INSERT ON events
            WHEN (SELECT ttl_seen FROM threads WHERE thread_id = NEW.thread_id) = 9e999 BEGIN
            UPDATE threads SET ttl_seen = NULL WHERE thread_id = NEW.thread_id;
        END""",
    ),
    # 7 -> 8: no table changes. A borrow row may now name the bytes of a
    # pending write (`values.LENT`, docs/semantics.md §7a), which every
    # removal of writes makes whole first. An earlier version would remove
    # writes under such rows, so it must refuse the file (it refuses a newer
    # schema) rather than write to it.
    (),
)

SCHEMA_VERSION = len(MIGRATIONS)

# Recompute every row's checksum from its cells: migration 1 -> 2's last three
# statements, named so that tests which plant a hostile row on purpose can
# give it a valid checksum (and so test what lies behind the checksum).
BACKFILL_CHECKSUMS: tuple[str, ...] = MIGRATIONS[1][-3:]

# The SQL name of `checksums.checksum` (any arity), registered by the engine on
# every connection it opens (migrations use it to checksum existing rows).
# What each table's checksum covers is listed in `checksums`; the statements
# below write and read the `checksum` column beside those cells.
CHECKSUM_FUNCTION = "lgfs_checksum"

# --- file identity -----------------------------------------------------------

GET_USER_VERSION = "PRAGMA user_version"
GET_APPLICATION_ID = "PRAGMA application_id"
COUNT_SCHEMA_OBJECTS = "SELECT count(*) FROM sqlite_master"
GET_DATA_VERSION = "PRAGMA data_version"
# The tables of a file and their columns: checked against the shape the
# migrations build, so a file that claims our version but lost a table or a
# column is refused instead of failing later, mid-write.
LIST_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table'"
LIST_TRIGGERS = "SELECT name FROM sqlite_master WHERE type = 'trigger' ORDER BY name"
TABLE_COLUMNS = "SELECT name FROM pragma_table_info(?)"


def set_user_version(version: int) -> str:
    """Return the statement that records `version` (pragmas take no parameters)."""
    return f"PRAGMA user_version = {int(version)}"


SET_APPLICATION_ID = f"PRAGMA application_id = {APPLICATION_ID}"
GET_JOURNAL_MODE = "PRAGMA journal_mode"
GET_SYNCHRONOUS = "PRAGMA synchronous"


def get_pragma(name: str) -> str:
    """Return the statement that reads pragma `name` (one of `PRAGMAS`)."""
    return f"PRAGMA {name}"


def pragma_matches(current: object, value: str) -> bool:
    """Whether a pragma read back as `current` already has `value` (its `PRAGMAS` value)."""
    return current is not None and str(current).lower() == value


def set_pragma(name: str, value: str | int) -> str:
    """Return the statement that sets pragma `name` (pragmas take no parameters)."""
    return f"PRAGMA {name} = {value}"


# --- threads and claims --------------------------------------------------------

ENSURE_THREAD = "INSERT INTO threads (thread_id) VALUES (?) ON CONFLICT DO NOTHING"
# The next event seq: one past the newest event, and never below the floor
# (compaction may have removed every event; seqs are never reused). Every
# commit's position is the seq of its first event, so positions increase in
# commit order too.
_NEXT_SEQ_OF = (
    "max(t.floor, coalesce((SELECT max(e.seq) FROM events e "
    "WHERE e.thread_id = t.thread_id), 0) + 1)"
)
GET_THREAD = (
    f"SELECT {_NEXT_SEQ_OF}, t.floor, t.holder, t.token, t.expires_at, t.run_id, "
    "t.incarnation FROM threads t WHERE t.thread_id = ?"
)
# The fence of `claims.check_fence` in one cell, for the common write: the
# thread's next seq (as `GET_THREAD`'s), but only if the fence lets the
# write land and the row's cells hold the SQL types `claims.read_thread`
# accepts; no row otherwise, and the caller then checks one by one (the
# error, a damaged cell named, a thread not yet written). One cell, not
# `GET_THREAD`'s seven, each of which costs the sqlite3 module about 1.5k
# instructions. `{0}`: the claim is the token's (fenced) or not live
# (unfenced: `claim_live`, negated). (No `IN` list of three: SQLite builds a
# table for one, each time the statement runs.)
_NEXT_SEQ_IF = (
    f"SELECT {_NEXT_SEQ_OF} FROM threads t WHERE t.thread_id = ?1 "
    "AND typeof(t.floor) = 'integer' AND typeof(t.incarnation) = 'integer' "
    "AND (t.holder IS NULL OR typeof(t.holder) = 'text') "
    "AND (t.token IS NULL OR typeof(t.token) = 'integer') "
    "AND (t.expires_at IS NULL OR typeof(t.expires_at) IN ('real', 'integer')) "
    "AND (t.run_id IS NULL OR typeof(t.run_id) = 'text') AND {0}"
)
# For a put `checkpoints.needs_version_check` checks, the version check too:
# its parent (`?4`) is the namespace's (`?3`) latest checkpoint before this
# commit, as `GET_LATEST_ID_BEFORE` reads it.
_PARENT_IS_LATEST = (
    " AND ?4 IS (SELECT c.checkpoint_id FROM checkpoints c WHERE c.thread_id = ?1 "
    f"AND c.checkpoint_ns = ?3 AND c.position < {_NEXT_SEQ_OF} "
    "ORDER BY c.position DESC LIMIT 1)"
)
# Parameters: thread id, then now (unfenced) or the token (fenced; then the
# namespace and the parent id for the version check).
NEXT_SEQ_IF_UNCLAIMED = _NEXT_SEQ_IF.format(
    "(t.token IS NULL OR t.expires_at IS NULL OR NOT (?2 < t.expires_at))"
)
NEXT_SEQ_IF_FENCED = _NEXT_SEQ_IF.format("t.token = ?2")
NEXT_SEQ_IF_FENCED_AND_LATEST = NEXT_SEQ_IF_FENCED + _PARENT_IS_LATEST
# Only an integer counter counts up: SQLite would turn text into 0 + 1 and
# issue token 1 again, so a damaged counter gives no row (an error) instead.
NEXT_TOKEN = (
    "UPDATE meta SET value = value + 1 WHERE key = 'token_counter' "
    "AND typeof(value) = 'integer' RETURNING value"
)
GET_TOKEN_COUNTER = "SELECT value FROM meta WHERE key = 'token_counter'"
# `run_id` is the run the claim was granted for (`begin_run`), NULL for a
# plain claim or takeover: `strategy="rollback"` retracts that run even after
# its `run_started` event was compacted or pruned away.
# Parameters: holder, token, expires_at, claimed_at, run_id, thread_id (each
# grant is also the latest claim, and drops a cancel asked of the one before).
SET_CLAIM = (
    "UPDATE threads SET holder = ?1, token = ?2, expires_at = ?3, claimed_at = ?4, "
    "run_id = ?5, last_holder = ?1, last_token = ?2, cancel_by = NULL WHERE thread_id = ?6"
)
# Also returns who asked the claim's run to stop (NULL: nobody), so a run's
# renewal learns of a cancel in the statement that renews it.
RENEW_CLAIM = (
    "UPDATE threads SET expires_at = ? WHERE thread_id = ? AND token = ? "
    "RETURNING holder, token, expires_at, cancel_by"
)
RELEASE_CLAIM = (
    "UPDATE threads SET holder = NULL, token = NULL, expires_at = NULL, "
    "claimed_at = NULL, run_id = NULL, cancel_by = NULL WHERE thread_id = ? AND token = ?"
)
# What a stale writer is told: the current token and the latest claim granted.
GET_LAST_CLAIM = "SELECT token, last_holder, last_token FROM threads WHERE thread_id = ?"
# Ask the current claim's run to stop; no row when nothing holds the thread.
REQUEST_CANCEL = (
    "UPDATE threads SET cancel_by = ? WHERE thread_id = ? AND token IS NOT NULL "
    "RETURNING holder, token, expires_at, run_id"
)
# A thread's tenant, and whether it holds anything a tenant could own.
GET_TENANT = (
    "SELECT t.tenant, EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = t.thread_id) "
    "OR EXISTS (SELECT 1 FROM events e WHERE e.thread_id = t.thread_id) "
    "FROM threads t WHERE t.thread_id = ?"
)
SET_TENANT = "UPDATE threads SET tenant = ? WHERE thread_id = ? AND tenant IS NULL"
LIST_CLAIMS = (
    "SELECT thread_id, holder, token, expires_at, claimed_at FROM threads "
    "WHERE token IS NOT NULL ORDER BY thread_id"
)
SET_FLOOR = "UPDATE threads SET floor = ? WHERE thread_id = ? AND floor < ?"
# Only for a row made in the same transaction (a thread that never existed).
DELETE_THREAD_ROW = "DELETE FROM threads WHERE thread_id = ?"
# The file a connection has open (`main`'s path), for errors raised below the engine.
GET_MAIN_FILE = "SELECT file FROM pragma_database_list WHERE name = 'main'"
# A thread row that is more than a tombstone: in its first incarnation, or
# claimed, compacted, or holding events or checkpoints. Every commit appends
# an event, so a re-created thread shows up at its first commit.
_NOT_TOMBSTONE = (
    "(t.incarnation = 1 OR t.token IS NOT NULL OR t.floor > 1 "
    "OR EXISTS (SELECT 1 FROM events e WHERE e.thread_id = t.thread_id) "
    "OR EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = t.thread_id))"
)
# `delete_thread` keeps the row as a tombstone of the next incarnation (floor
# back at 1, no claim) instead of deleting it: a reader holding a position of
# the old incarnation must learn that numbering restarted (docs/semantics.md §5).
# Run before the thread's rows are deleted; a bare tombstone is left as it is
# (deleting it again gives no reader anything to miss). Tokens come from the
# file's counter, so they stay monotonic regardless. Parameters: the id twice.
TOMBSTONE_THREAD = (
    "UPDATE threads SET incarnation = incarnation + 1, floor = 1, holder = NULL, "
    "token = NULL, expires_at = NULL, claimed_at = NULL, run_id = NULL WHERE thread_id = ? "
    f"AND thread_id IN (SELECT t.thread_id FROM threads t WHERE t.thread_id = ? "
    f"AND {_NOT_TOMBSTONE})"
)

# --- checkpoints -----------------------------------------------------------------

_CHECKPOINT_COLUMNS = (
    "thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, envelope, "
    "values_type, values_blob, metadata, position, token, created_at, checksum"
)
INSERT_CHECKPOINT = (
    "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, position, "
    "parent_checkpoint_id, envelope, values_type, values_blob, metadata, source, "
    "step, run_id, token, created_at, checksum) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)
GET_CHECKPOINT_BY_ID = (
    f"SELECT {_CHECKPOINT_COLUMNS} FROM checkpoints "
    "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"
)
GET_LATEST_CHECKPOINT = (
    f"SELECT {_CHECKPOINT_COLUMNS} FROM checkpoints "
    "WHERE thread_id = ? AND checkpoint_ns = ? ORDER BY position DESC LIMIT 1"
)
GET_LATEST_ID = (
    "SELECT checkpoint_id FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? "
    "ORDER BY position DESC LIMIT 1"
)
# `get_tuple` in one statement: the checkpoint row (`_CHECKPOINT_COLUMNS`,
# then 0) and each of its writes (`_TUPLE_WRITE`: `WRITES_OF_CHECKPOINT`'s
# columns, five NULLs, then 1), in no particular order. One statement reads
# one snapshot, so the checkpoint and its writes agree without the BEGIN and
# COMMIT that two statements need (two statements more per read). The
# latest's id is the same subquery in both arms: on one snapshot it names
# the same row. Parameters: thread id, namespace (and the id).
_TUPLE_WRITE = (
    "SELECT task_id, channel, type, blob, task_path, idx, checksum, "
    "NULL, NULL, NULL, NULL, NULL, 1 FROM writes WHERE thread_id = ?1 AND checkpoint_ns = ?2 "
)
_LATEST_ID = (
    "(SELECT checkpoint_id FROM checkpoints WHERE thread_id = ?1 AND checkpoint_ns = ?2 "
    "ORDER BY position DESC LIMIT 1)"
)
GET_TUPLE_BY_ID = (
    f"SELECT {_CHECKPOINT_COLUMNS}, 0 FROM checkpoints WHERE thread_id = ?1 "
    "AND checkpoint_ns = ?2 AND checkpoint_id = ?3 "
    f"UNION ALL {_TUPLE_WRITE}AND checkpoint_id = ?3"
)
GET_TUPLE_LATEST = (
    f"SELECT {_CHECKPOINT_COLUMNS}, 0 FROM checkpoints WHERE thread_id = ?1 "
    f"AND checkpoint_ns = ?2 AND checkpoint_id = {_LATEST_ID} "
    f"UNION ALL {_TUPLE_WRITE}AND checkpoint_id = {_LATEST_ID}"
)


def get_tuple(thread_id: str, checkpoint_ns: str, checkpoint_id: str | None) -> tuple[str, Any]:
    """Build `get_tuple`'s one statement: `GET_TUPLE_BY_ID`, or `GET_TUPLE_LATEST` with no id."""
    if checkpoint_id:
        return GET_TUPLE_BY_ID, (thread_id, checkpoint_ns, checkpoint_id)
    return GET_TUPLE_LATEST, (thread_id, checkpoint_ns)


# `get_tuple` and `list` as LangGraph calls them read fewer cells than the
# statements above: each cell costs the sqlite3 module about 1.5k CPU
# instructions (a mutex per call, a Python object), about as much as the
# seek that finds the row. A checkpoint row is `_READ_COLUMNS` then
# `_TYPES_OK` (0: position, token and created_at hold the SQL types
# `checkpoints.check_row` accepts; 2: not, and the reader reads the row again
# through `GET_TUPLE_*` to name the cell): they are checked, not returned.
_READ_COLUMNS = (
    "checkpoint_id, parent_checkpoint_id, envelope, values_type, values_blob, metadata, checksum"
)
_TYPES_OK = (
    "CASE WHEN typeof(position) = 'integer' AND (token IS NULL OR typeof(token) = 'integer') "
    "AND typeof(created_at) IN ('integer', 'real') THEN 0 ELSE 2 END"
)
# The write rows: `WRITES_OF_CHECKPOINT`'s columns, then 1.
_READ_WRITE = (
    "SELECT task_id, channel, type, blob, task_path, idx, checksum, 1 FROM writes "
    "WHERE thread_id = ?1 AND checkpoint_ns = ?2 AND checkpoint_id = "
)
# The latest by position, found in the position index alone (its entries end
# in the rowid): one seek fewer than through its id and the primary key.
_LATEST_ROWID = (
    "(SELECT rowid FROM checkpoints WHERE thread_id = ?1 AND checkpoint_ns = ?2 "
    "ORDER BY position DESC LIMIT 1)"
)
READ_TUPLE_BY_ID = (
    f"SELECT {_READ_COLUMNS}, {_TYPES_OK} FROM checkpoints WHERE thread_id = ?1 "
    f"AND checkpoint_ns = ?2 AND checkpoint_id = ?3 UNION ALL {_READ_WRITE}?3"
)
READ_TUPLE_LATEST = (
    f"SELECT {_READ_COLUMNS}, {_TYPES_OK} FROM checkpoints WHERE rowid = {_LATEST_ROWID} "
    f"UNION ALL {_READ_WRITE}(SELECT checkpoint_id FROM checkpoints WHERE rowid = "
    f"{_LATEST_ROWID})"
)


def read_tuple(thread_id: str, checkpoint_ns: str, checkpoint_id: str | None) -> tuple[str, Any]:
    """Build `get_tuple`'s one statement: `READ_TUPLE_BY_ID`, or `READ_TUPLE_LATEST` with no id.

    Rows are the checkpoint's (`_READ_COLUMNS`, then 0 or 2) and its writes'
    (`task_id, channel, type, blob, task_path, idx, checksum, 1`), in no
    particular order; one snapshot, as `get_tuple`'s.
    """
    if checkpoint_id:
        return READ_TUPLE_BY_ID, (thread_id, checkpoint_ns, checkpoint_id)
    return READ_TUPLE_LATEST, (thread_id, checkpoint_ns)


# The namespace's latest checkpoint committed before `position`.
GET_LATEST_ID_BEFORE = (
    "SELECT checkpoint_id FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? "
    "AND position < ? ORDER BY position DESC LIMIT 1"
)
GET_STORED_IDENTITY = (
    "SELECT parent_checkpoint_id, envelope, values_type, values_blob, metadata "
    "FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"
)
GET_POSITION = (
    "SELECT position FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? "
    "AND checkpoint_id = ?"
)
HISTORY_PAGE = (
    f"SELECT {_CHECKPOINT_COLUMNS} FROM checkpoints "
    "WHERE thread_id = ? AND checkpoint_ns = ? AND position < ? "
    "ORDER BY position DESC LIMIT ?"
)
# Rows that retention and retraction reason about (no value rows leave SQLite;
# the metadata's delta counters as JSON text, the envelope as stored: packed,
# `envelopes.pack`, it is decoded by the reader). The last two columns say
# whether the row's checksum holds (computed in SQL by the registered
# function) and whether the metadata is a JSON object; JSON is only extracted
# from those, so a damaged cell is reported, not an SQL error ("malformed
# JSON") or a silently empty value.
_IS_OBJECT = "CASE WHEN json_valid({0}) THEN json_type({0}) = 'object' ELSE 0 END"
CHECKPOINT_SKELETON = (
    "SELECT checkpoint_ns, checkpoint_id, parent_checkpoint_id, position, source, "
    "run_id, created_at, step, CASE WHEN json_valid(metadata) "
    "THEN json_extract(metadata, '$.counters_since_delta_snapshot') END, envelope, "
    f"checksum IS {CHECKSUM_FUNCTION}(CAST(envelope AS BLOB), CAST(values_type AS BLOB), "
    "CAST(values_blob AS BLOB), CAST(metadata AS BLOB)), "
    f"{_IS_OBJECT.format('metadata')} "
    "FROM checkpoints WHERE thread_id = ? ORDER BY position"
)
DELETE_CHECKPOINT = (
    "DELETE FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"
)
DELETE_THREAD_CHECKPOINTS = "DELETE FROM checkpoints WHERE thread_id = ?"
# Every thread holding a checkpoint or a write of a run (`?` 1 and 2, both the
# run id): the threads `thread_runs` names for it, less those whose rows of
# the run are gone. Ascending thread id.
THREADS_OF_RUN = (
    "SELECT m.thread_id FROM thread_runs m WHERE m.run_id = ?1 AND ("
    "EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = m.thread_id AND c.run_id = ?1) "
    "OR EXISTS (SELECT 1 FROM writes w WHERE w.thread_id = m.thread_id AND w.run_id = ?2)) "
    "ORDER BY m.thread_id"
)
# Forget a thread's runs (all its rows went), or one run of it.
DELETE_THREAD_RUNS = "DELETE FROM thread_runs WHERE thread_id = ?"
# When a thread was last written: its latest event's time.
LAST_EVENT_TS = "SELECT ts FROM events WHERE thread_id = ? ORDER BY seq DESC LIMIT 1"
# Whether a run wrote a thread (a run fenced off since is stale: `core.run_fence`).
RUN_WROTE = "SELECT 1 FROM thread_runs WHERE thread_id = ? AND run_id = ?"
DELETE_THREAD_RUN = "DELETE FROM thread_runs WHERE thread_id = ? AND run_id = ?"
# Which of a thread's checkpoints a run wrote, oldest first.
CHECKPOINTS_OF_RUN_IN_THREAD = (
    "SELECT checkpoint_ns, checkpoint_id FROM checkpoints WHERE thread_id = ? AND run_id = ? "
    "ORDER BY position"
)
THREAD_WRITE_COUNT = "SELECT count(*) FROM writes WHERE thread_id = ?"
# Copy one checkpoint of the source thread (`?` 3, 4 and 5) into the target
# thread (`?` 1) at a new position (`?` 2), as a new commit of the target. An
# id the target already has is left alone (no row changes): the caller then
# compares the two (COPY_IDENTITY) and refuses a different one. The checksum
# covers the content only, so it is copied as it is.
COPY_CHECKPOINT = (
    "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, position, "
    "parent_checkpoint_id, envelope, values_type, values_blob, metadata, source, "
    "step, run_id, token, created_at, checksum) "
    "SELECT ?, checkpoint_ns, checkpoint_id, ?, parent_checkpoint_id, "
    "envelope, values_type, values_blob, metadata, source, step, run_id, NULL, "
    "created_at, checksum FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? "
    "AND checkpoint_id = ? ON CONFLICT DO NOTHING"
)
# Whether the target's checkpoint (`?` 1-3) is the source's (`?` 4) exactly.
COPY_IDENTITY = (
    "SELECT (t.parent_checkpoint_id IS s.parent_checkpoint_id AND t.envelope = s.envelope "
    "AND t.values_type = s.values_type AND t.values_blob = s.values_blob "
    "AND t.metadata = s.metadata) FROM checkpoints t JOIN checkpoints s "
    "ON s.thread_id = ? AND s.checkpoint_ns = t.checkpoint_ns "
    "AND s.checkpoint_id = t.checkpoint_id "
    "WHERE t.thread_id = ? AND t.checkpoint_ns = ? AND t.checkpoint_id = ?"
)

# --- channel values (core/values.py) ------------------------------------------------

_BLOB_COLUMNS = (
    "thread_id, checkpoint_ns, channel, key, base, type, count, ordinal, codec, size, data, "
    "checksum"
)
# A row already stored under its key holds the same value (keys name content).
# Rowids come from two ranges: a single extension (`?13` = 1) appends at the
# end of the upper one, every other row at the end of the lower one. A single
# extension gives its bytes up when a merged row holds them too (DELETE_TAIL,
# then its prefix row inserted below), and SQLite frees a page only once every
# row in it is gone: kept apart, those pages empty out together and are
# reused, instead of leaving holes between rows that stay.
_TAILS = 4611686018427387904  # 2**62
INSERT_BLOB = (
    f"INSERT INTO blobs (rowid, {_BLOB_COLUMNS}) VALUES (CASE WHEN ?13 THEN "
    f"max(coalesce((SELECT max(rowid) FROM blobs), 0), {_TAILS}) + 1 ELSE "
    f"coalesce((SELECT max(rowid) FROM blobs WHERE rowid < {_TAILS}), 0) + 1 END, "
    "?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12) ON CONFLICT DO NOTHING"
)
# A single extension whose elements a merged row now holds too becomes the
# prefix of it that it is (`values.PREFIX`): the row, if it is still a single
# extension, is deleted here and its prefix row inserted (INSERT_BLOB).
DELETE_TAIL = (
    "DELETE FROM blobs WHERE thread_id = ? AND checkpoint_ns = ? AND channel = ? AND key = ? "
    "AND codec IS NOT 'prefix'"
)
# Whether the parent (thread, ns, id) still holds the refs (`?4`) a put's values
# were encoded against: a put names rows only through its parent.
HOLDS_REFS = (
    "SELECT 1 FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? "
    "AND checkpoint_id = ? AND values_type = 'lgfs-refs' AND values_blob = ?"
)
# Whether a pending write `(thread, ns, checkpoint, task, idx)` is stored with
# checksum `?6`: a put naming its bytes (`values.LENT`) checks so.
HOLDS_WRITE = (
    "SELECT 1 FROM writes WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ? "
    "AND task_id = ? AND idx = ? AND checksum = ?"
)
# A value row's edges to the rows a read of it needs (`e.i` 0: the row it
# extends, its `base`; 1: the row a borrow row (`values.BORROW`) takes its
# bytes from, named by its JSON cell, read only when that cell is valid JSON
# and names a row: one naming a write, `values.LENT`, has no edge here, and no
# NULL ever reaches a `NOT IN` of `COLLECT_BLOBS`), as `(channel, key)`: join
# `blobs b` with `_EDGES`, select `_EDGE_CHANNEL` and `_EDGE_KEY`.
_BORROWED = "json_extract(CAST(b.data AS TEXT), '$.{0}')"
_EDGES = (
    "JOIN (SELECT 0 AS i UNION ALL SELECT 1) e ON (e.i = 0 AND b.base IS NOT NULL) "
    "OR (e.i = 1 AND b.codec = 'borrow' AND json_valid(CAST(b.data AS TEXT)) "
    "AND json_type(CAST(b.data AS TEXT), '$.c') = 'text' "
    "AND json_type(CAST(b.data AS TEXT), '$.k') = 'text')"
)
# A borrow row's cell that names a pending write (`values.LENT`), as JSON text.
_LENT_CELL = "CAST(b.data AS TEXT)"
_LENT_PART = "json_extract(" + _LENT_CELL + ", '$.w[{0}]')"
_EDGE_CHANNEL = f"CASE WHEN e.i = 0 THEN b.channel ELSE {_BORROWED.format('c')} END"
_EDGE_KEY = f"CASE WHEN e.i = 0 THEN b.base ELSE {_BORROWED.format('k')} END"
# The value rows that the refs `?1` (JSON `[[thread, ns, channel, key], ...]`)
# name, the rows each extends, back to its whole value, and the rows they
# borrow from: one statement, so one snapshot with the checkpoint rows read
# in the same transaction. UNION, not UNION ALL: a damaged `base` naming a
# row of its own chain ends the walk instead of looping (the reader then
# refuses the value).
READ_BLOBS = (
    "WITH RECURSIVE want(t, n, c, k) AS (SELECT json_extract(value, '$[0]'), "
    "json_extract(value, '$[1]'), json_extract(value, '$[2]'), json_extract(value, '$[3]') "
    f"FROM json_each(?1) UNION SELECT b.thread_id, b.checkpoint_ns, {_EDGE_CHANNEL}, "
    f"{_EDGE_KEY} FROM want w JOIN blobs b ON b.thread_id = w.t AND b.checkpoint_ns = w.n "
    f"AND b.channel = w.c AND b.key = w.k {_EDGES}) "
    "SELECT b.thread_id, b.checkpoint_ns, b.channel, b.key, b.base, b.type, b.count, "
    "b.ordinal, b.codec, b.size, b.data, b.checksum FROM want w JOIN blobs b "
    "ON b.thread_id = w.t AND b.checkpoint_ns = w.n AND b.channel = w.c AND b.key = w.k "
    # The pending writes borrow rows name (`values.LENT`), each as the row
    # `(LENT, "cid/task/idx")` holding its channel, type, idx, blob, checksum.
    f"UNION ALL SELECT b.thread_id, b.checkpoint_ns, '{LENT}', {_LENT_PART.format(0)} || '/' "
    f"|| {_LENT_PART.format(1)} || '/' || {_LENT_PART.format(2)}, wr.channel, wr.type, "
    "wr.idx, 0, 'write', 0, wr.blob, wr.checksum FROM want w JOIN blobs b "
    "ON b.thread_id = w.t AND b.checkpoint_ns = w.n AND b.channel = w.c AND b.key = w.k "
    "JOIN writes wr ON wr.thread_id = b.thread_id AND wr.checkpoint_ns = b.checkpoint_ns "
    f"AND wr.checkpoint_id = {_LENT_PART.format(0)} AND wr.task_id = {_LENT_PART.format(1)} "
    f"AND wr.idx = {_LENT_PART.format(2)} WHERE b.codec = 'borrow' "
    f"AND json_valid({_LENT_CELL}) AND json_type({_LENT_CELL}, '$.w') = 'array'"
)
DELETE_THREAD_BLOBS = "DELETE FROM blobs WHERE thread_id = ?"
# A refs cell as the JSON object it must be (else NULL: damage).
_REFS_OF = (
    "CASE WHEN json_valid(CAST({0}.values_blob AS TEXT)) "
    "AND json_type(CAST({0}.values_blob AS TEXT)) = 'object' "
    "THEN CAST({0}.values_blob AS TEXT) END"
)
# Remove the thread's (`?1`) value rows that no checkpoint of it needs: those
# its checkpoints' refs name, and the rows those extend or borrow from, stay.
# Nothing goes while any of its refs cells is damaged: what it named cannot be
# known.
COLLECT_BLOBS = (
    "WITH RECURSIVE live(n, c, k) AS (SELECT c.checkpoint_ns, j.key, j.value "
    f"FROM checkpoints c, json_each({_REFS_OF.format('c')}) j "
    "WHERE c.thread_id = ?1 AND c.values_type = 'lgfs-refs' "
    f"AND {_REFS_OF.format('c')} IS NOT NULL "
    f"UNION SELECT b.checkpoint_ns, {_EDGE_CHANNEL}, {_EDGE_KEY} FROM live l JOIN blobs b "
    f"ON b.thread_id = ?1 AND b.checkpoint_ns = l.n AND b.channel = l.c AND b.key = l.k "
    f"{_EDGES}) "
    "DELETE FROM blobs WHERE thread_id = ?1 "
    "AND (checkpoint_ns, channel, key) NOT IN (SELECT n, c, k FROM live) "
    "AND NOT EXISTS (SELECT 1 FROM checkpoints d WHERE d.thread_id = ?1 "
    f"AND d.values_type = 'lgfs-refs' AND {_REFS_OF.format('d')} IS NULL)"
)
# `repack`: the threads holding checkpoints with values inline, and a
# thread's checkpoints in commit order; a checkpoint's values moved to the
# value table only if its row is still the one read (type and checksum).
THREADS_WITH_INLINE_VALUES = (
    "SELECT DISTINCT thread_id FROM checkpoints WHERE values_type IS NOT 'lgfs-refs' "
    "ORDER BY thread_id"
)
THREAD_CHECKPOINTS_IN_ORDER = (
    f"SELECT {_CHECKPOINT_COLUMNS} FROM checkpoints WHERE thread_id = ? ORDER BY position"
)
REPACK_CHECKPOINT = (
    "UPDATE checkpoints SET values_type = 'lgfs-refs', values_blob = ?, checksum = ? "
    "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ? AND values_type IS ? "
    "AND checksum IS ?"
)
# --- rekey (core/rekey.py): every value cell, by the key it is sealed under ---------------
# (Not a checkpoint's refs, a prefix or borrow row, or a write stored as a slice: they hold
# no value.)
# A sealed cell starts with `encryption.MAGIC` (x'a701') and the key id's 4 bytes.
_KEY_ID_OF = "CASE WHEN substr({0}, 1, 2) = x'a701' AND {1} THEN lower(hex(substr({0}, 3, 4))) END"
_SEALED_CHECKPOINT = _KEY_ID_OF.format("values_blob", "values_type LIKE '%+aes'")
_SEALED_WRITE = _KEY_ID_OF.format("blob", "type LIKE '%+aes'")
_SEALED_BLOB = _KEY_ID_OF.format("data", "codec IN ('aes', 'zstd+aes')")
CELL_KEYS = (
    "SELECT k, count(*) FROM ("
    f"SELECT {_SEALED_CHECKPOINT} AS k FROM checkpoints WHERE values_type IS NOT 'lgfs-refs' "
    f"UNION ALL SELECT {_SEALED_WRITE} FROM writes WHERE type IS NOT 'lgfs-slice' "
    f"UNION ALL SELECT {_SEALED_BLOB} FROM blobs WHERE codec NOT IN ('prefix', 'borrow')"
    ") GROUP BY k"
)
# Value rows named by their own bytes (`values._small_key`): written in clear.
BLOBS_NAMED_IN_CLEAR = "SELECT count(*) FROM blobs WHERE key LIKE '=%'"
THREADS_WITH_CELLS = (
    "SELECT thread_id FROM checkpoints UNION SELECT thread_id FROM writes ORDER BY thread_id"
)
REKEY_READ_CHECKPOINTS = (
    "SELECT checkpoint_ns, checkpoint_id, envelope, values_type, values_blob, metadata, "
    "checksum FROM checkpoints WHERE thread_id = ? AND values_type IS NOT 'lgfs-refs'"
)
REKEY_READ_WRITES = (
    "SELECT checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob, checksum "
    "FROM writes WHERE thread_id = ?"
)
REKEY_READ_BLOBS = (
    "SELECT checkpoint_ns, channel, key, base, type, count, ordinal, codec, size, data, "
    "checksum FROM blobs WHERE thread_id = ? AND (codec NOT IN ('prefix', 'borrow') "
    # A borrow row naming a write (`values.LENT`): made whole, sealed.
    "OR (codec = 'borrow' AND substr(data, 1, 5) = CAST('{\"w\":' AS BLOB)))"
)
# Each: the new cells and checksum, then the row's key and the checksum it was read with.
REKEY_CHECKPOINT = (
    "UPDATE checkpoints SET values_type = ?, values_blob = ?, checksum = ? "
    "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ? AND checksum IS ?"
)
REKEY_WRITE = (
    "UPDATE writes SET type = ?, blob = ?, checksum = ? WHERE thread_id = ? "
    "AND checkpoint_ns = ? AND checkpoint_id = ? AND task_id = ? AND idx = ? AND checksum IS ?"
)
REKEY_BLOB = (
    "UPDATE blobs SET codec = ?, data = ?, checksum = ? WHERE thread_id = ? "
    "AND checkpoint_ns = ? AND channel = ? AND key = ? AND checksum IS ?"
)
# Every value row of the source thread (`?2`) into the target (`?1`).
COPY_BLOBS = (
    f"INSERT INTO blobs ({_BLOB_COLUMNS}) SELECT ?1, checkpoint_ns, channel, key, base, type, "
    "count, ordinal, codec, size, data, checksum FROM blobs WHERE thread_id = ?2 "
    "ON CONFLICT DO NOTHING"
)

# --- writes ------------------------------------------------------------------------

_WRITE_VALUES = "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_WRITE_INSERT = (
    "INSERT INTO writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, "
    "task_path, channel, type, blob, position, run_id, token, checksum) "
)
# Regular writes: first writer wins per (task_id, idx); a retry is a no-op.
INSERT_WRITE_FIRST_WINS = _WRITE_INSERT + _WRITE_VALUES + " ON CONFLICT DO NOTHING"
# Special channels (WRITES_IDX_MAP): last writer wins, but never over a write
# made under a greater token, so a stale owner cannot displace the current one
# (the fence, checked first in the same transaction, already refuses a stale
# token; this guard keeps that true of the row itself). The last parameter is
# true for an unfenced write the fence accepted: no claim is live (none,
# released, or expired unreplaced), so nobody's fence protects the stored
# write, and an accepted write must take effect (docs/semantics.md §3), not be
# silently dropped under an expired holder's token.
UPSERT_WRITE_LAST_WINS = (
    _WRITE_INSERT + _WRITE_VALUES + " ON CONFLICT DO UPDATE SET task_path = excluded.task_path, "
    "channel = excluded.channel, type = excluded.type, blob = excluded.blob, "
    "position = excluded.position, run_id = excluded.run_id, token = excluded.token, "
    "checksum = excluded.checksum "
    "WHERE (coalesce(excluded.token, 0) >= coalesce(writes.token, 0) OR ?) "
    # An identical retry changes nothing (and so appends no event).
    "AND (writes.channel IS NOT excluded.channel OR writes.type IS NOT excluded.type "
    "OR writes.blob IS NOT excluded.blob OR writes.task_path IS NOT excluded.task_path)"
)
WRITES_OF_CHECKPOINT = (
    "SELECT task_id, channel, type, blob, task_path, idx, checksum FROM writes "
    "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ? "
    "ORDER BY task_path, task_id, idx"
)
# Each removal of some of a thread's writes returns them, so that the borrow
# rows naming their bytes are made whole (`checkpoints.unlend`).
_GONE = " RETURNING checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob, checksum"
DELETE_WRITES_OF_CHECKPOINT = (
    "DELETE FROM writes WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?" + _GONE
)
DELETE_THREAD_WRITES = "DELETE FROM writes WHERE thread_id = ?"
DELETE_WRITES_OF_RUN = "DELETE FROM writes WHERE thread_id = ? AND run_id = ?" + _GONE
DELETE_WRITES_FROM_POSITION = "DELETE FROM writes WHERE thread_id = ? AND position >= ?" + _GONE
# The thread's borrow rows naming a pending write (`values.LENT`), as
# `lending.unlent_rows` reads them; one made whole, if still as read.
LENT_BORROWERS = (
    "SELECT checkpoint_ns, channel, key, base, type, count, ordinal, codec, size, data, "
    "checksum FROM blobs WHERE thread_id = ? AND codec = 'borrow' "
    "AND substr(data, 1, 5) = CAST('{\"w\":' AS BLOB)"
)
UNLEND_BLOB = (
    "UPDATE blobs SET codec = ?, size = ?, data = ?, checksum = ? WHERE thread_id = ? "
    "AND checkpoint_ns = ? AND channel = ? AND key = ? AND codec = 'borrow' AND data = ?"
)
# Orphan writes: their checkpoint is not stored, and they were committed
# before the latest checkpoint of their namespace. LangGraph sends a step's
# writes BEFORE the put of their checkpoint, so writes for the next,
# not-yet-stored checkpoint of an in-flight step are newer than the latest
# stored one and stay; a namespace with no checkpoint keeps its writes.
_ORPHAN = (
    "NOT EXISTS (SELECT 1 FROM checkpoints c "
    "WHERE c.thread_id = writes.thread_id AND c.checkpoint_ns = writes.checkpoint_ns "
    "AND c.checkpoint_id = writes.checkpoint_id) AND position < (SELECT max(l.position) "
    "FROM checkpoints l WHERE l.thread_id = writes.thread_id "
    "AND l.checkpoint_ns = writes.checkpoint_ns)"
)
_ORPHAN_WRITES = "FROM writes WHERE thread_id = ? AND " + _ORPHAN
COUNT_ORPHAN_WRITES = "SELECT count(*) " + _ORPHAN_WRITES
# Of every thread (`lgfs doctor`): what the next prune of each would remove.
COUNT_ALL_ORPHAN_WRITES = "SELECT count(*) FROM writes WHERE " + _ORPHAN
DELETE_ORPHAN_WRITES = "DELETE " + _ORPHAN_WRITES + _GONE
# Writes of one namespace whose checkpoint is not stored (a past subgraph run's
# namespace, once its checkpoints are removed: all of its writes).
_NS_ORPHAN_WRITES = (
    "FROM writes WHERE thread_id = ? AND checkpoint_ns = ? AND NOT EXISTS (SELECT 1 "
    "FROM checkpoints c WHERE c.thread_id = writes.thread_id AND c.checkpoint_ns = "
    "writes.checkpoint_ns AND c.checkpoint_id = writes.checkpoint_id)"
)
# Before the removal (a dry run): those the general count above leaves out.
COUNT_NS_ORPHAN_WRITES = (
    "SELECT count(*) " + _NS_ORPHAN_WRITES + " AND position >= (SELECT max(l.position) "
    "FROM checkpoints l WHERE l.thread_id = writes.thread_id "
    "AND l.checkpoint_ns = writes.checkpoint_ns)"
)
DELETE_NS_ORPHAN_WRITES = "DELETE " + _NS_ORPHAN_WRITES + _GONE
# Copy the writes of one source checkpoint, at the position its copy got.
# A write the target already has for that key stays (first writer wins), so
# copying again adds nothing.
COPY_WRITES_OF_CHECKPOINT = (
    "INSERT INTO writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, "
    "task_path, channel, type, blob, position, run_id, token, checksum) "
    "SELECT ?, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, "
    "blob, ?, run_id, NULL, checksum FROM writes WHERE thread_id = ? AND checkpoint_ns = ? "
    "AND checkpoint_id = ? ON CONFLICT DO NOTHING"
)
# Every (namespace, checkpoint) that has writes in a thread, oldest write first.
WRITE_KEYS_OF_THREAD = (
    "SELECT checkpoint_ns, checkpoint_id FROM writes WHERE thread_id = ? "
    "GROUP BY checkpoint_ns, checkpoint_id ORDER BY min(position)"
)


def writes_of_checkpoints(keys: Sequence[tuple[str, str, str]]) -> tuple[str, list[Any]]:
    """Build the one query that fetches the writes of a page of checkpoints.

    Args:
        keys: `(thread_id, checkpoint_ns, checkpoint_id)` of each checkpoint.

    Returns:
        `(sql, params)`; rows are `(thread_id, checkpoint_ns, checkpoint_id,
        task_id, channel, type, blob, task_path, idx, checksum)` in
        `writes_sort_key` order.
    """
    values = ", ".join("(?, ?, ?)" for _ in keys)
    params: list[Any] = [part for key in keys for part in key]
    # A join, not `(t, ns, id) IN (VALUES ...)`: SQLite 3.40 plans that IN
    # as a scan of the whole writes table; the join seeks the primary key.
    sql = (
        "SELECT w.thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.channel, "
        f"w.type, w.blob, w.task_path, w.idx, w.checksum FROM (VALUES {values}) AS k "
        "JOIN writes AS w ON w.thread_id = k.column1 AND w.checkpoint_ns = k.column2 "
        "AND w.checkpoint_id = k.column3 ORDER BY w.task_path, w.task_id, w.idx"
    )
    return sql, params


def list_checkpoints(
    *,
    thread_id: str | None,
    checkpoint_ns: str | None,
    checkpoint_id: str | None,
    metadata_filter: dict[str, Any] | None,
    before_id: str | None,
    after_key: tuple[str, str, str] | None,
    limit: int,
) -> tuple[str, list[Any]]:
    """Build one page of LangGraph's `list`, newest checkpoint id first.

    Args:
        thread_id: Only this thread, if given.
        checkpoint_ns: Only this namespace, if given.
        checkpoint_id: Only this checkpoint id, if given.
        metadata_filter: `{key: value}` pairs that must all equal the metadata's
            (JSON equality).
        before_id: Only ids less than this (LangGraph's `before`).
        after_key: Keyset cursor `(checkpoint_id, thread_id, checkpoint_ns)` of
            the last row of the previous page.
        limit: Page size.

    Returns:
        `(sql, params)`.
    """
    clause, params = _list_where(
        thread_id, checkpoint_ns, checkpoint_id, metadata_filter, before_id, after_key
    )
    return f"SELECT {_CHECKPOINT_COLUMNS} FROM checkpoints {clause}{_LIST_ORDER}", [*params, limit]


_LIST_ORDER = "ORDER BY checkpoint_id DESC, thread_id DESC, checkpoint_ns DESC LIMIT ?"


_KEYS = ("thread_id, checkpoint_ns, ", "w.thread_id, w.checkpoint_ns, ")
# `_TYPES_OK`, and the envelope and the metadata are TEXT (`read_page` reads
# their bytes, whose SQL type is then no longer seen): 0, else 2.
_PAGE_TYPES_OK = (
    "CASE WHEN typeof(position) = 'integer' AND (token IS NULL OR typeof(token) = 'integer') "
    "AND typeof(created_at) IN ('integer', 'real') AND typeof(envelope) = 'text' "
    "AND typeof(metadata) = 'text' THEN 0 ELSE 2 END"
)


def read_page(
    *,
    thread_id: str | None,
    checkpoint_ns: str | None,
    checkpoint_id: str | None,
    metadata_filter: dict[str, Any] | None,
    before_id: str | None,
    after_key: tuple[str, str, str] | None,
    limit: int,
) -> tuple[str, list[Any]]:
    """Build one page of `list` and the page's writes, as one statement.

    The arguments are `list_checkpoints`'s. One statement reads one snapshot,
    so the page and its writes agree with no BEGIN and COMMIT around them.
    The page's keys are selected (same filter, same total order, same
    snapshot: the same rows) once for the checkpoints and once for the
    writes, each read by a CROSS JOIN, so that SQLite reads them as a
    co-routine (a plain JOIN materializes them in a temporary table first:
    about 15k CPU instructions a page) and joins the rows by seek. A join,
    not `(t, ns, id) IN (...)`, which SQLite 3.40 plans as a scan of the
    writes. The checkpoints' co-routine yields rowids only: one that yields
    the cells passes each through a copy (a checkpoint's blob copied once
    more per row), and an ORDER BY on a page with no thread sorts rowids,
    not whole rows. Checkpoint rows carry only the cells `list` returns or
    checks (see `_READ_COLUMNS`); when the query names the thread and the
    namespace (as LangGraph's history does), rows do not carry them (the
    reader knows them: two cells fewer a row). The envelope and the
    metadata come as their UTF-8 bytes (`CAST ... AS BLOB`, no copy in
    SQLite): those are what the checksum hashes and what orjson reads, so
    they are not decoded to str and encoded back (`_PAGE_TYPES_OK` checks
    that they are TEXT). A row's last cell tells the two kinds apart.

    Returns:
        `(sql, params)`; rows are the page's checkpoints in order
        (`thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
        envelope, values_type, values_blob, metadata, checksum, NULL`, then
        `_PAGE_TYPES_OK`: 0 or 2), then their writes in no particular order:
        `(thread_id, checkpoint_ns, checkpoint_id, task_id, channel, type,
        blob, task_path, idx, checksum, 1)`; without their first two cells
        when the query names the thread and the namespace.
    """
    clause, params = _list_where(
        thread_id, checkpoint_ns, checkpoint_id, metadata_filter, before_id, after_key
    )
    known = thread_id is not None and checkpoint_ns is not None
    keys, w_keys = ("", "") if known else _KEYS
    sql = (
        f"SELECT {keys}checkpoint_id, parent_checkpoint_id, CAST(envelope AS BLOB), "
        "values_type, values_blob, CAST(metadata AS BLOB), checksum, NULL, "
        f"{_PAGE_TYPES_OK} FROM (SELECT rowid AS r "
        f"FROM checkpoints {clause}{_LIST_ORDER}) AS p CROSS JOIN checkpoints AS c "
        f"ON c.rowid = p.r UNION ALL SELECT {w_keys}w.checkpoint_id, w.task_id, w.channel, "
        "w.type, w.blob, w.task_path, w.idx, w.checksum, 1 FROM (SELECT thread_id, "
        f"checkpoint_ns, checkpoint_id FROM checkpoints {clause}{_LIST_ORDER}) AS k "
        "CROSS JOIN writes AS w ON w.thread_id = k.thread_id "
        "AND w.checkpoint_ns = k.checkpoint_ns AND w.checkpoint_id = k.checkpoint_id"
    )
    return sql, [*params, limit, *params, limit]


def _list_where(
    thread_id: str | None,
    checkpoint_ns: str | None,
    checkpoint_id: str | None,
    metadata_filter: dict[str, Any] | None,
    before_id: str | None,
    after_key: tuple[str, str, str] | None,
) -> tuple[str, list[Any]]:
    """Return `list`'s WHERE clause (empty, or ending in a space) and its parameters."""
    where: list[str] = []
    params: list[Any] = []
    if thread_id is not None:
        where.append("thread_id = ?")
        params.append(thread_id)
    if checkpoint_ns is not None:
        where.append("checkpoint_ns = ?")
        params.append(checkpoint_ns)
    if checkpoint_id is not None:
        where.append("checkpoint_id = ?")
        params.append(checkpoint_id)
    if before_id is not None:
        where.append("checkpoint_id < ?")
        params.append(before_id)
    for key, value in (metadata_filter or {}).items():
        where.append(_METADATA_MATCH.format(metadata="metadata"))
        params.extend([_json_path(key), _json_literal(value)])
    if after_key is not None:
        where.append("(checkpoint_id, thread_id, checkpoint_ns) < (?, ?, ?)")
        params.extend(after_key)
    return (f"WHERE {' AND '.join(where)} " if where else ""), params


# One key of `list`'s metadata filter (and of a thread search's), on the
# metadata column `{metadata}`; parameters: `_json_path(key)`,
# `_json_literal(value)`. Rows whose metadata is not a JSON object match, so
# that reading them reports the damage (UndecodableRow) instead of an SQL
# error for the whole query, or silently leaving them out.
_METADATA_MATCH = (
    "CASE WHEN NOT json_valid({metadata}) THEN 1 WHEN json_type({metadata}) <> 'object' "
    "THEN 1 ELSE json_extract({metadata}, ?) IS json_extract(?, '$') END"
)


def _json_path(key: str) -> str:
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    return f'$."{escaped}"'


def _json_literal(value: Any) -> str:
    import json

    # json_extract(x, '$') turns the literal back into the SQL value that
    # json_extract(metadata, path) gives for an equal stored value (objects and
    # arrays come back as minified JSON text, so key order must match too).
    # Escaping must match as well: stored metadata keeps non-ASCII as is
    # (`dumps_json`), and an object's text comes back verbatim, "\u00fc" and all.
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


# --- events --------------------------------------------------------------------------

INSERT_EVENT = (
    "INSERT INTO events (thread_id, seq, kind, checkpoint_ns, checkpoint_id, data, "
    "token, ts, checksum) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
EVENTS_AFTER = (
    "SELECT seq, kind, checkpoint_ns, checkpoint_id, data, token, ts, checksum FROM events "
    "WHERE thread_id = ? AND seq > ? ORDER BY seq LIMIT ?"
)
GET_FLOOR = f"SELECT t.floor, {_NEXT_SEQ_OF} FROM threads t WHERE t.thread_id = ?"
# What a reader's position is checked against: floor and incarnation.
GET_REPLAY_BOUNDS = "SELECT floor, incarnation FROM threads WHERE thread_id = ?"
DELETE_EVENTS_BELOW = "DELETE FROM events WHERE thread_id = ? AND seq < ?"
DELETE_THREAD_EVENTS = "DELETE FROM events WHERE thread_id = ?"
EVENT_SEQS_OF_CHECKPOINTS = (
    "SELECT min(seq) FROM events WHERE thread_id = ? AND checkpoint_id IS NOT NULL "
    "AND EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = events.thread_id "
    "AND c.checkpoint_ns = events.checkpoint_ns AND c.checkpoint_id = events.checkpoint_id)"
)

# --- thread search (`search_threads`, `count_threads`) -----------------------------------

# A thread's activity cells, as `THREAD_SUMMARIES` reads them.
_ACTIVITY_OF = (
    "(SELECT max(c.created_at) FROM checkpoints c WHERE c.thread_id = t.thread_id), "
    "(SELECT max(e.ts) FROM events e WHERE e.thread_id = t.thread_id)"
)
_LATEST_ROOT_ROWID_OF = (
    "(SELECT l.rowid FROM checkpoints l WHERE l.thread_id = t.thread_id "
    "AND l.checkpoint_ns = '' ORDER BY l.position DESC LIMIT 1)"
)


def search_threads(
    indexed: Sequence[tuple[str, Any]],
    unindexed: Sequence[tuple[str, Any]],
    ids: Sequence[str] | None,
    *,
    count: bool = False,
    activity: bool = False,
    page: tuple[bool, int, int] | None = None,
) -> tuple[str, list[Any]]:
    """Build the query of a thread search's candidates (`core.thread_search.ThreadQuery`).

    Each `indexed` entry is a seek of `thread_tags_by_value` (an `IN` over
    that index's range, which SQLite runs first and joins to `threads` by
    its key); each `unindexed` one is `list`'s match on the thread's latest
    root checkpoint's metadata.

    Args:
        indexed: Metadata keys and values `thread_tags` answers.
        unindexed: Metadata keys and values matched on the latest root checkpoint.
        ids: Only these threads (None: any).
        count: Count the candidates (one row, one cell) instead of listing them.
        activity: Give each row its activity cells (else two NULLs).
        page: `(descending, limit, offset)`: order by thread id and page.

    Returns:
        `(sql, params)`; rows `(thread_id, last_checkpoint_at, last_event_at)`,
        or one `(count,)`.
    """
    where: list[str] = []
    params: list[Any] = []
    for key, value in indexed:
        where.append(
            "t.thread_id IN (SELECT g.thread_id FROM thread_tags g "
            "WHERE g.key = ? AND g.value = json_extract(?, '$'))"
        )
        params.extend([key, _json_literal(value)])
    if ids is not None:
        where.append(f"t.thread_id IN ({', '.join('?' for _ in ids)})")
        params.extend(ids)
    if unindexed:
        matches = " AND ".join(_METADATA_MATCH.format(metadata="m.metadata") for _ in unindexed)
        where.append(
            f"EXISTS (SELECT 1 FROM checkpoints m WHERE m.rowid = {_LATEST_ROOT_ROWID_OF} "
            f"AND {matches})"
        )
        for key, value in unindexed:
            params.extend([_json_path(key), _json_literal(value)])
    where.append(_NOT_TOMBSTONE)
    cells = "count(*)" if count else f"t.thread_id, {_ACTIVITY_OF if activity else 'NULL, NULL'}"
    sql = f"SELECT {cells} FROM threads t WHERE {' AND '.join(where)}"
    if page is not None:
        descending, limit, offset = page
        sql += f" ORDER BY t.thread_id{' DESC' if descending else ''} LIMIT ? OFFSET ?"
        params.extend([limit, offset])
    return sql, params


# --- inspection (CLI, doctor) ----------------------------------------------------------

THREAD_SUMMARIES = (
    f"SELECT t.thread_id, t.holder, t.token, t.expires_at, t.floor, {_NEXT_SEQ_OF}, "
    "(SELECT count(*) FROM checkpoints c WHERE c.thread_id = t.thread_id), "
    "(SELECT group_concat(DISTINCT c.checkpoint_ns) FROM checkpoints c "
    " WHERE c.thread_id = t.thread_id), "
    "(SELECT count(*) FROM events e WHERE e.thread_id = t.thread_id), "
    "(SELECT max(c.created_at) FROM checkpoints c WHERE c.thread_id = t.thread_id), "
    "(SELECT c.step FROM checkpoints c WHERE c.thread_id = t.thread_id "
    " AND c.checkpoint_ns = '' ORDER BY c.position DESC LIMIT 1), "
    "(SELECT max(e.ts) FROM events e WHERE e.thread_id = t.thread_id) "
    f"FROM threads t WHERE {_NOT_TOMBSTONE}"
)
# One thread's summary (the columns of `THREAD_SUMMARIES`); no row for a
# thread that does not exist (or is a tombstone).
THREAD_SUMMARY = f"{THREAD_SUMMARIES} AND t.thread_id = ?"
THREAD_EXISTS = f"SELECT 1 FROM threads t WHERE t.thread_id = ? AND {_NOT_TOMBSTONE}"
TABLE_COUNTS = (
    "SELECT (SELECT count(*) FROM threads), (SELECT count(*) FROM checkpoints), "
    "(SELECT count(*) FROM writes), (SELECT count(*) FROM events)"
)
INTEGRITY_CHECK = "PRAGMA integrity_check"
# A thread's status (`saver_threads`): its latest run lifecycle event (found
# through the primary key, newest first, however long the log), and whether
# a root checkpoint was committed after it under another token (the thread
# was run again, outside that run: the event no longer describes it).
ROOT_CHECKPOINT_AFTER = (
    "SELECT 1 FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = '' "
    "AND position > ? AND token IS NOT ? LIMIT 1"
)


def last_event_of_kinds(thread_id: str, kinds: Iterable[str]) -> tuple[str, list[Any]]:
    """Build the query for the seq of a thread's latest event of one of `kinds`.

    Returns:
        `(sql, params)`; one row `(seq,)`, or none.
    """
    wanted = sorted(kinds)
    marks = ", ".join("?" for _ in wanted)
    sql = (
        f"SELECT seq FROM events WHERE thread_id = ? AND kind IN ({marks}) "
        "ORDER BY seq DESC LIMIT 1"
    )
    return sql, [thread_id, *wanted]


# The namespaces a thread's checkpoints are in (for `--ns` prefixes).
THREAD_NAMESPACES = (
    "SELECT DISTINCT checkpoint_ns FROM checkpoints WHERE thread_id = ? ORDER BY checkpoint_ns"
)
# When a thread was last written: its newest checkpoint and its newest event.
THREAD_ACTIVITY = (
    "SELECT (SELECT max(created_at) FROM checkpoints WHERE thread_id = ?), "
    "(SELECT max(ts) FROM events WHERE thread_id = ?)"
)
# --- thread expiry (migration 5 -> 6; `maintenance.py`) ------------------------------

# A thread's own TTL, set or cleared; a sweep then looks at it afresh.
SET_THREAD_TTL = (
    "UPDATE threads SET ttl = ?1, ttl_strategy = ?2, ttl_seen = NULL WHERE thread_id = ?3"
)
GET_THREAD_TTL = "SELECT ttl, ttl_strategy FROM threads WHERE thread_id = ?"
# What a sweep remembers of a thread: the activity it saw, or 9e999 (parked).
SET_TTL_SEEN = "UPDATE threads SET ttl_seen = ? WHERE thread_id = ?"
# A deleted thread's TTL goes with it; the tombstone holds nothing (parked).
FORGET_THREAD_TTL = (
    "UPDATE threads SET ttl = NULL, ttl_strategy = NULL, ttl_seen = 9e999 WHERE thread_id = ?"
)
# Threads no sweep has seen: all (with a default TTL) or those with their own.
TTL_UNSEEN = "SELECT thread_id FROM threads WHERE ttl_seen IS NULL LIMIT ?"
TTL_UNSEEN_OWN = (
    "SELECT thread_id FROM threads INDEXED BY threads_ttl_unseen "
    "WHERE ttl_seen IS NULL AND ttl IS NOT NULL LIMIT ?"
)
# Due-looking threads, each through its index (`ttl_seen + ttl` for their own
# TTL; `ttl_seen` against `now - default` for the others), with the claim a
# sweep leaves alone without opening a write transaction.
TTL_DUE_OWN = (
    "SELECT thread_id, token, expires_at FROM threads INDEXED BY threads_by_ttl_due "
    "WHERE ttl IS NOT NULL AND ttl_seen + ttl <= ?"
)
TTL_DUE_DEFAULT = (
    "SELECT thread_id, token, expires_at FROM threads INDEXED BY threads_by_ttl_seen "
    "WHERE ttl_seen <= ? AND ttl IS NULL"
)
# One thread's expiry facts (`retention.ExpiryFacts`), read in its transaction.
TTL_FACTS = (
    "SELECT ttl, ttl_strategy, ttl_seen, (SELECT max(created_at) FROM checkpoints "
    "WHERE thread_id = ?1), (SELECT max(ts) FROM events WHERE thread_id = ?1) "
    "FROM threads WHERE thread_id = ?1"
)
# Every listed thread's id, for a sweep (tombstones hold nothing to prune).
THREAD_IDS = f"SELECT t.thread_id FROM threads t WHERE {_NOT_TOMBSTONE} ORDER BY t.thread_id"
# `parents` of a checkpoint's metadata: the checkpoint of each enclosing
# namespace it was written under (LangGraph's `{"": parent_id, ...}`).
CHECKPOINT_PARENTS = (
    "SELECT CASE WHEN json_valid(metadata) THEN json_extract(metadata, '$.parents') END "
    "FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"
)

# --- vacuum ----------------------------------------------------------------------------
# VACUUM cannot run inside a transaction; the WAL it fills is then truncated.
VACUUM = "VACUUM"
WAL_CHECKPOINT_TRUNCATE = "PRAGMA wal_checkpoint(TRUNCATE)"
GET_PAGE_COUNT = "PRAGMA page_count"
GET_FREELIST_COUNT = "PRAGMA freelist_count"
GET_PAGE_SIZE = "PRAGMA page_size"

# --- SqliteSaver import (read-only source) ---------------------------------------------
# Run by `importer.py` on a LangGraph `SqliteSaver` file opened read-only
# (`mode=ro`); they only read. That file's layout: checkpoints(thread_id,
# checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata)
# and writes(thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx,
# channel, type, value); files made before `task_path` existed lack that column.

SQLITESAVER_TABLE_COLUMNS = "SELECT name FROM pragma_table_info(?)"
SQLITESAVER_COUNTS = "SELECT (SELECT count(*) FROM checkpoints), (SELECT count(*) FROM writes)"
SQLITESAVER_THREADS = (
    "SELECT thread_id FROM checkpoints UNION SELECT thread_id FROM writes ORDER BY 1"
)
SQLITESAVER_CHECKPOINT_KEYS = (
    "SELECT checkpoint_ns, checkpoint_id, parent_checkpoint_id FROM checkpoints "
    "WHERE thread_id = ? ORDER BY checkpoint_id, checkpoint_ns"
)
SQLITESAVER_GET_CHECKPOINT = (
    "SELECT type, checkpoint, metadata FROM checkpoints "
    "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"
)
SQLITESAVER_WRITES_OF_CHECKPOINT = (
    "SELECT task_id, task_path, idx, channel, type, value FROM writes "
    "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ? "
    "ORDER BY task_path, task_id, idx"
)
SQLITESAVER_WRITES_OF_CHECKPOINT_NO_TASK_PATH = (
    "SELECT task_id, '' AS task_path, idx, channel, type, value FROM writes "
    "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ? "
    "ORDER BY task_id, idx"
)
# Writes whose checkpoint the source never stored (LangGraph writes first).
SQLITESAVER_ORPHAN_WRITE_KEYS = (
    "SELECT DISTINCT w.checkpoint_ns, w.checkpoint_id FROM writes w WHERE w.thread_id = ? "
    "AND NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = w.thread_id "
    "AND c.checkpoint_ns = w.checkpoint_ns AND c.checkpoint_id = w.checkpoint_id) "
    "ORDER BY w.checkpoint_id, w.checkpoint_ns"
)
