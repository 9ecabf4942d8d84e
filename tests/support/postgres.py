"""What a PostgreSQL store holds, read with plain psycopg: how its values are compressed."""

from __future__ import annotations

from typing import Any

import psycopg


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
