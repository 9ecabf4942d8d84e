"""What a PostgreSQL store holds, read (or written as an older client did) with plain psycopg.

How its values are compressed; its value table (`lgfs_blobs`): which rows a
thread holds and needs; rows as a client before migration 11 stored them.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict

from langgraph_fenced_sqlite.core import values
from langgraph_fenced_sqlite.core.checksums import checkpoint_checksum, write_checksum
from langgraph_fenced_sqlite.core.slices import SLICE, open_slice
from langgraph_fenced_sqlite.postgres import sql
from langgraph_fenced_sqlite.postgres.values import resolved


def large_values(n: int) -> dict[str, Any]:
    """Channel values of `n` chat turns, as large as a chat's."""
    # Text well over the 2 KB TOAST threshold, and compressible, as a chat's is.
    return {"messages": [f"turn {i}: " + "the answer is in the log " * 20 for i in range(n)]}


def compressions(dsn: str) -> tuple[list[str], list[str]]:
    """Each stored checkpoint's values and each write's value: how they are compressed."""
    with psycopg.connect(dsn) as conn:
        checkpoints = conn.execute(
            "SELECT pg_column_compression(values_blob) FROM lgfs_checkpoints ORDER BY position"
        ).fetchall()
        writes = conn.execute(
            "SELECT pg_column_compression(blob) FROM lgfs_writes ORDER BY position"
        ).fetchall()
    return [r[0] for r in checkpoints], [r[0] for r in writes]


def offers_lz4(dsn: str) -> bool:
    """Whether the server can compress with lz4 (`default_toast_compression`)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
        ).fetchone()
    return bool(row and row[0])


def put_inline(saver: Any, config: Any, checkpoint: Any, metadata: Any) -> None:
    """Put a checkpoint as a client before migration 11 stored it: values inline in its row.

    Unfenced, statement by statement (`txns.put`), so it runs on a schema
    of any version since migration 1, as the older client's did.
    """
    from langgraph_fenced_sqlite.core import checkpoints as cps
    from langgraph_fenced_sqlite.postgres import txns

    conf = config["configurable"]
    thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns", "")
    enc = cps.encode_checkpoint(saver.serde, config, checkpoint, metadata, thread_id, ns)
    saver._engine.run("put", lambda cur: txns.put(cur, enc, None, now=None, require_claim=False))


def put_writes_inline(saver: Any, config: Any, writes: Any, task_id: str) -> None:
    """Put writes as a client before migration 11 stored them: msgpack, not zstd (unfenced)."""
    from langgraph_fenced_sqlite.core import checkpoints as cps
    from langgraph_fenced_sqlite.postgres import txns

    conf = config["configurable"]
    encoded = cps.encode_writes(saver.serde, writes, task_id, "")
    saver._engine.run(
        "put_writes",
        lambda cur: txns.put_writes(
            cur,
            conf["thread_id"],
            conf.get("checkpoint_ns", ""),
            conf["checkpoint_id"],
            encoded,
            None,
            run_id=None,
            now=None,
            require_claim=False,
        ),
    )


# --- the value table (migration 11) ------------------------------------------------------


def rows(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    """Run one statement with plain psycopg; return its rows (a write: those it RETURNs)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(query, params).fetchall()]


def blob_rows(dsn: str, thread: str = "t") -> list[tuple[Any, ...]]:
    return rows(
        dsn,
        # The bytes each row holds of its value, uncompressed: none for a
        # prefix, only its cell for a borrow row.
        "SELECT channel, key, base, ordinal, CASE WHEN codec = 'prefix' THEN 0 "
        "WHEN codec = 'borrow' THEN length(data) ELSE size END FROM lgfs_blobs "
        "WHERE thread_id = %s",
        thread,
    )


def values_types(dsn: str) -> set[str]:
    return {r[0] for r in rows(dsn, "SELECT DISTINCT values_type FROM lgfs_checkpoints")}


def refs_of(dsn: str, checkpoint_id: str) -> dict[str, str]:
    """A checkpoint's refs: `{channel: key}`."""
    (row,) = rows(
        dsn, "SELECT values_blob FROM lgfs_checkpoints WHERE checkpoint_id = %s", checkpoint_id
    )
    refs: dict[str, str] = json.loads(bytes(row[0]))
    return refs


def _needed(dsn: str, thread: str) -> tuple[set[Any], set[Any]]:
    """The value rows the thread's checkpoints need (refs, then bases and donors), and those held.

    A borrow row (`values.BORROW`) needs the row its JSON cell names too, or
    the pending write it names (`values.LENT`): the edge `(ns, LENT, write key)`,
    held when that write is stored with the checksum the cell names.
    """
    held: dict[Any, list[Any]] = {}
    for ns, c, k, base, codec, data in rows(
        dsn,
        "SELECT checkpoint_ns, channel, key, base, codec, data FROM lgfs_blobs "
        "WHERE thread_id = %s",
        thread,
    ):
        edges = [(ns, c, base)] if base is not None else []
        if codec == "borrow":
            cell = json.loads(bytes(data))
            if "w" in cell:
                edges.append((ns, values.LENT, (*cell["w"], cell["s"])))
            else:
                edges.append((ns, cell["c"], cell["k"]))
        held[(ns, c, k)] = edges
    for ns, cid, task_id, idx, checksum in rows(
        dsn,
        "SELECT checkpoint_ns, checkpoint_id, task_id, idx, checksum FROM lgfs_writes "
        "WHERE thread_id = %s",
        thread,
    ):
        held[(ns, values.LENT, (cid, task_id, idx, checksum))] = []
    need: set[Any] = set()
    todo = [
        (ns, channel, key)
        for ns, refs in rows(
            dsn,
            "SELECT checkpoint_ns, values_blob FROM lgfs_checkpoints WHERE thread_id = %s "
            "AND values_type = 'lgfs-refs'",
            thread,
        )
        for channel, key in json.loads(bytes(refs)).items()
    ]
    while todo:
        at = todo.pop()
        if at not in need:
            need.add(at)
            todo.extend(held.get(at, ()))
    return need, set(held)


def exactly_what_is_needed(dsn: str, thread: str = "t") -> int:
    """Assert the thread holds exactly the value rows its checkpoints need; return how many."""
    need, held = _needed(dsn, thread)
    writes = {k for k in held if k[1] == values.LENT}
    # Writes stay for their checkpoints, needed or not; every write needed is there.
    assert need <= held and need - writes == held - writes, (
        sorted(need - held, key=str)[:3],
        sorted(held - need - writes, key=str)[:3],
    )
    return len(held - writes)


def as_url(dsn: str) -> str:
    """The test server's key=value DSN as the `postgresql://` URL `lgfs --db` takes."""
    d = conninfo_to_dict(dsn)
    query = f"?options={quote(str(d['options']))}" if d.get("options") else ""
    return f"postgresql://{d['user']}@{d['host']}:{d['port']}/{d['dbname']}{query}"


def make_inline(dsn: str) -> None:
    """Give every checkpoint its values inline, as a database before migration 11 held them."""
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        cur = conn.cursor()
        cur.execute(f"SELECT {sql.CHECKPOINT_COLUMNS} FROM lgfs_checkpoints")
        rows = resolved(cur, [tuple(r) for r in cur.fetchall()], strict=True)
        for r in rows:
            # A rebuilt row's checksum cell says it was checked (`REBUILT`): sealed here.
            seal = checkpoint_checksum(r[4], r[5], r[6], r[7])
            cur.execute(
                "UPDATE lgfs_checkpoints SET values_type = %s, values_blob = %s, checksum = %s "
                "WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s",
                (r[5], r[6], seal, r[0], r[1], r[2]),
            )
            # Its writes stored as slices of its values, whole: those databases held no slice.
            cur.execute(
                "SELECT task_id, idx, channel, blob FROM lgfs_writes WHERE thread_id = %s "
                "AND checkpoint_ns = %s AND checkpoint_id = %s AND type = %s",
                (r[0], r[1], r[2], SLICE),
            )
            for task_id, idx, channel, cell in cur.fetchall():
                data = open_slice(r[5], r[6], bytes(cell))
                cur.execute(
                    "UPDATE lgfs_writes SET type = 'msgpack', blob = %s, checksum = %s "
                    "WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s "
                    "AND task_id = %s AND idx = %s",
                    (data, write_checksum(channel, "msgpack", data), *r[:3], task_id, idx),
                )
        cur.execute("DELETE FROM lgfs_blobs")


def dump_tables(dsn: str) -> dict[str, list[Any]]:
    """Every row of the store's data tables (a fingerprint: a dry run changes none)."""
    return {
        table: rows(dsn, f"SELECT * FROM {table} ORDER BY 1, 2, 3")
        for table in ("lgfs_checkpoints", "lgfs_blobs", "lgfs_writes", "lgfs_events")
    }
