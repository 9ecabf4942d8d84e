"""What contract cases read or damage below a store's API: its value table ("storage").

Invariant: a `Storage` only reads a store's value rows, or damages their
bytes in place as a failing disk would (checksums left as they were); it
never writes through the store, so what a case then sees is what the
store's own reads make of it. Each store's is written with its plain
database client (sqlite3, psycopg), as the damage cases' `plant` is.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Protocol

__all__ = ["PostgresStorage", "SqliteStorage", "Storage"]


class Storage(Protocol):
    """A store's value table (docs/semantics.md §7), as a case reads or damages it."""

    def value_rows(self, thread_id: str) -> list[tuple[str, str, int]]:
        """Return the thread's value rows: `(channel, key, bytes stored)`."""
        ...

    def damage_values(self, thread_id: str, channel: str) -> int:
        """Flip one bit in the stored bytes of each of the channel's value rows; return how many."""
        ...


def _flipped(data: bytes) -> bytes:
    mid = len(data) // 2
    return data[:mid] + bytes([data[mid] ^ 0x10]) + data[mid + 1 :]


class SqliteStorage:
    """The value table (`blobs`) of a SQLite file, through plain sqlite3."""

    def __init__(self, path: str) -> None:
        """Read and damage the file at `path`."""
        self.path = path

    def value_rows(self, thread_id: str) -> list[tuple[str, str, int]]:
        """Return the thread's value rows: `(channel, key, bytes stored)`."""
        conn = sqlite3.connect(self.path)
        try:
            return [
                (r[0], r[1], int(r[2]))
                for r in conn.execute(
                    "SELECT channel, key, length(data) FROM blobs WHERE thread_id = ?", (thread_id,)
                )
            ]
        finally:
            conn.close()

    def damage_values(self, thread_id: str, channel: str) -> int:
        """Flip one bit in the stored bytes of each of the channel's value rows; return how many."""
        conn = sqlite3.connect(self.path)
        try:
            rows = conn.execute(
                "SELECT rowid, data FROM blobs WHERE thread_id = ? AND channel = ? "
                "AND length(data) > 0",
                (thread_id, channel),
            ).fetchall()
            for rowid, data in rows:
                conn.execute("UPDATE blobs SET data = ? WHERE rowid = ?", (_flipped(data), rowid))
            conn.commit()
            return len(rows)
        finally:
            conn.close()


class PostgresStorage:
    """The value table (`lgfs_blobs`) of a PostgreSQL store, through plain psycopg."""

    def __init__(self, dsn: str) -> None:
        """Read and damage the store that connections to `dsn` see."""
        self.dsn = dsn

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.dsn, autocommit=True)

    def value_rows(self, thread_id: str) -> list[tuple[str, str, int]]:
        """Return the thread's value rows: `(channel, key, bytes stored)`."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT channel, key, octet_length(data) FROM lgfs_blobs WHERE thread_id = %s",
                (thread_id,),
            ).fetchall()
        return [(r[0], r[1], int(r[2])) for r in rows]

    def damage_values(self, thread_id: str, channel: str) -> int:
        """Flip one bit in the stored bytes of each of the channel's value rows; return how many."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT checkpoint_ns, key, data FROM lgfs_blobs WHERE thread_id = %s "
                "AND channel = %s AND octet_length(data) > 0",
                (thread_id, channel),
            ).fetchall()
            for ns, key, data in rows:
                conn.execute(
                    "UPDATE lgfs_blobs SET data = %s WHERE thread_id = %s AND checkpoint_ns = %s "
                    "AND channel = %s AND key = %s",
                    (_flipped(bytes(data)), thread_id, ns, channel, key),
                )
        return len(rows)
