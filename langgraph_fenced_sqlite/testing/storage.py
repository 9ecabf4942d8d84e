"""What contract cases read or damage below a store's API: its value table ("storage").

Invariant: a `Storage` only reads a store's value rows, or damages their
bytes in place as a failing disk would (checksums left as they were); it
never writes through the store, so what a case then sees is what the
store's own reads make of it. Each store's is written with its plain
database client (sqlite3, psycopg), as the damage cases' `plant` is.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from typing import Any, Protocol

from ..core.checksums import blob_checksum, write_checksum
from ..core.slices import SLICE

__all__ = ["PostgresStorage", "SqliteStorage", "Storage"]


class Storage(Protocol):
    """A store's value table (docs/semantics.md §7), as a case reads or damages it."""

    def value_rows(self, thread_id: str) -> list[tuple[str, str, int]]:
        """Return the thread's value rows: `(channel, key, bytes stored)`."""
        ...

    def damage_values(self, thread_id: str, channel: str) -> int:
        """Flip one bit in the stored bytes of each of the channel's value rows; return how many."""
        ...

    def forge_values(self, thread_id: str, channel: str) -> int:
        """Flip a bit in each of the channel's value rows, fix its checksum; return how many.

        What someone who can write the file, but holds no key, can do.
        """
        ...

    def plant_clear_writes(self, thread_id: str, value: bytes) -> int:
        """Put `value` in clear in every pending write (checksum fixed); return how many.

        `value` is msgpack (the `"msgpack"` serializer tag).
        """
        ...

    def cells(self, thread_id: str) -> list[bytes]:
        """Return every stored value cell of the thread, as stored (inline values, writes, rows)."""
        ...

    def write_types(self, thread_id: str) -> list[str]:
        """Return the type cell of each of the thread's pending writes."""
        ...

    def shift_slices(self, thread_id: str) -> int:
        """Point each write stored as a slice one byte further (checksum fixed); return how many.

        What someone who can write the file can do: the slice still names
        bytes of its checkpoint's values, other ones.
        """
        ...

    def borrow_cells(self, thread_id: str) -> list[dict[str, Any]]:
        """Return the cell of each of the thread's borrow rows (`values.BORROW`), parsed."""
        ...


def _shifted(channel: str, cell: bytes) -> tuple[bytes, int]:
    # A slice cell (`slices.SLICE`) one byte further on, with the write's checksum fixed.
    shifted = (int.from_bytes(cell[:4], "big") + 1).to_bytes(4, "big") + cell[4:]
    return shifted, write_checksum(channel, SLICE, shifted)


def _forged(row: tuple[Any, ...]) -> tuple[bytes, int]:
    # A value row's (channel, key, base, type, count, ordinal, codec, size, data):
    # its data with a bit flipped, and the checksum that then holds.
    data = _flipped(bytes(row[8]))
    channel, key, base, type_, count, ordinal, codec, size = row[:8]
    return data, blob_checksum(channel, key, base, type_, count, ordinal, codec, size, data)


_BLOB_CELLS = "channel, key, base, type, count, ordinal, codec, size, data"
_PG_BLOB_CELLS = _BLOB_CELLS.replace("count", "items")


def _flipped(data: bytes) -> bytes:
    mid = len(data) // 2
    return data[:mid] + bytes([data[mid] ^ 0x10]) + data[mid + 1 :]


class SqliteStorage:
    """The value table (`blobs`) of a SQLite file, through plain sqlite3."""

    def __init__(self, path: str) -> None:
        """Read and damage the file at `path`."""
        self.path = path

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        # One connection per call, committed when the call returns.
        conn = sqlite3.connect(self.path)
        try:
            yield conn
            conn.commit()
        finally:
            conn.close()

    def value_rows(self, thread_id: str) -> list[tuple[str, str, int]]:
        """Return the thread's value rows: `(channel, key, bytes stored)`."""
        with self._connect() as conn:
            return [
                (r[0], r[1], int(r[2]))
                for r in conn.execute(
                    "SELECT channel, key, length(data) FROM blobs WHERE thread_id = ?", (thread_id,)
                )
            ]

    def damage_values(self, thread_id: str, channel: str) -> int:
        """Flip one bit in the stored bytes of each of the channel's value rows; return how many."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT rowid, data FROM blobs WHERE thread_id = ? AND channel = ? "
                "AND length(data) > 0",
                (thread_id, channel),
            ).fetchall()
            for rowid, data in rows:
                conn.execute("UPDATE blobs SET data = ? WHERE rowid = ?", (_flipped(data), rowid))
            return len(rows)

    def forge_values(self, thread_id: str, channel: str) -> int:
        """Flip a bit in each of the channel's value rows, fix its checksum; return how many."""
        with self._connect() as conn:
            rows = conn.execute(
                f"SELECT rowid, {_BLOB_CELLS} FROM blobs WHERE thread_id = ? AND channel = ? "
                "AND length(data) > 0",
                (thread_id, channel),
            ).fetchall()
            for rowid, *cells in rows:
                data, sum_ = _forged(tuple(cells))
                conn.execute(
                    "UPDATE blobs SET data = ?, checksum = ? WHERE rowid = ?", (data, sum_, rowid)
                )
            return len(rows)

    def plant_clear_writes(self, thread_id: str, value: bytes) -> int:
        """Put `value` in clear in every pending write (checksum fixed); return how many."""
        with self._connect() as conn:
            n = 0
            for (channel,) in conn.execute(
                "SELECT DISTINCT channel FROM writes WHERE thread_id = ?", (thread_id,)
            ).fetchall():
                n += conn.execute(
                    "UPDATE writes SET type = 'msgpack', blob = ?, checksum = ? "
                    "WHERE thread_id = ? AND channel = ?",
                    (value, write_checksum(channel, "msgpack", value), thread_id, channel),
                ).rowcount
            return n

    def cells(self, thread_id: str) -> list[bytes]:
        """Return every stored value cell of the thread, as stored (inline values, writes, rows)."""
        with self._connect() as conn:
            return [
                bytes(r[0])
                for r in conn.execute(
                    "SELECT values_blob FROM checkpoints WHERE thread_id = ?1 "
                    "UNION ALL SELECT blob FROM writes WHERE thread_id = ?1 "
                    "UNION ALL SELECT data FROM blobs WHERE thread_id = ?1 "
                    "UNION ALL SELECT CAST(key AS BLOB) FROM blobs WHERE thread_id = ?1",
                    (thread_id,),
                )
            ]

    def write_types(self, thread_id: str) -> list[str]:
        """Return the type cell of each of the thread's pending writes."""
        with self._connect() as conn:
            rows = conn.execute("SELECT type FROM writes WHERE thread_id = ?", (thread_id,))
            return [r[0] for r in rows]

    def shift_slices(self, thread_id: str) -> int:
        """Point each write stored as a slice one byte further (checksum fixed); return how many."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT checkpoint_ns, checkpoint_id, task_id, idx, channel, blob FROM writes "
                "WHERE thread_id = ? AND type = ?",
                (thread_id, SLICE),
            ).fetchall()
            for ns, cid, task_id, idx, channel, cell in rows:
                conn.execute(
                    "UPDATE writes SET blob = ?, checksum = ? WHERE thread_id = ? "
                    "AND checkpoint_ns = ? AND checkpoint_id = ? AND task_id = ? AND idx = ?",
                    (*_shifted(channel, cell), thread_id, ns, cid, task_id, idx),
                )
            return len(rows)

    def borrow_cells(self, thread_id: str) -> list[dict[str, Any]]:
        """Return the cell of each of the thread's borrow rows (`values.BORROW`), parsed."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT data FROM blobs WHERE thread_id = ? AND codec = 'borrow'", (thread_id,)
            ).fetchall()
        return [json.loads(bytes(r[0])) for r in rows]


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

    def forge_values(self, thread_id: str, channel: str) -> int:
        """Flip a bit in each of the channel's value rows, fix its checksum; return how many."""
        with self._connect() as conn:
            rows = conn.execute(
                f"SELECT checkpoint_ns, {_PG_BLOB_CELLS} FROM lgfs_blobs WHERE thread_id = %s "
                "AND channel = %s AND octet_length(data) > 0",
                (thread_id, channel),
            ).fetchall()
            for ns, *cells in rows:
                data, sum_ = _forged(tuple(cells))
                conn.execute(
                    "UPDATE lgfs_blobs SET data = %s, checksum = %s WHERE thread_id = %s "
                    "AND checkpoint_ns = %s AND channel = %s AND key = %s",
                    (data, sum_, thread_id, ns, channel, cells[1]),
                )
        return len(rows)

    def plant_clear_writes(self, thread_id: str, value: bytes) -> int:
        """Put `value` in clear in every pending write (checksum fixed); return how many."""
        n = 0
        with self._connect() as conn:
            for (channel,) in conn.execute(
                "SELECT DISTINCT channel FROM lgfs_writes WHERE thread_id = %s", (thread_id,)
            ).fetchall():
                cur = conn.execute(
                    "UPDATE lgfs_writes SET type = 'msgpack', blob = %s, checksum = %s "
                    "WHERE thread_id = %s AND channel = %s",
                    (value, write_checksum(channel, "msgpack", value), thread_id, channel),
                )
                n += cur.rowcount
        return n

    def cells(self, thread_id: str) -> list[bytes]:
        """Return every stored value cell of the thread, as stored (inline values, writes, rows)."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT values_blob FROM lgfs_checkpoints WHERE thread_id = %(t)s "
                "UNION ALL SELECT blob FROM lgfs_writes WHERE thread_id = %(t)s "
                "UNION ALL SELECT data FROM lgfs_blobs WHERE thread_id = %(t)s "
                "UNION ALL SELECT convert_to(key, 'UTF8') FROM lgfs_blobs WHERE thread_id = %(t)s",
                {"t": thread_id},
            ).fetchall()
        return [bytes(r[0]) for r in rows]

    def write_types(self, thread_id: str) -> list[str]:
        """Return the type cell of each of the thread's pending writes."""
        with self._connect() as conn:
            rows = conn.execute("SELECT type FROM lgfs_writes WHERE thread_id = %s", (thread_id,))
            return [r[0] for r in rows.fetchall()]

    def shift_slices(self, thread_id: str) -> int:
        """Point each write stored as a slice one byte further (checksum fixed); return how many."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT checkpoint_ns, checkpoint_id, task_id, idx, channel, blob FROM lgfs_writes "
                "WHERE thread_id = %s AND type = %s",
                (thread_id, SLICE),
            ).fetchall()
            for ns, cid, task_id, idx, channel, cell in rows:
                conn.execute(
                    "UPDATE lgfs_writes SET blob = %s, checksum = %s WHERE thread_id = %s "
                    "AND checkpoint_ns = %s AND checkpoint_id = %s AND task_id = %s AND idx = %s",
                    (*_shifted(channel, bytes(cell)), thread_id, ns, cid, task_id, idx),
                )
        return len(rows)

    def borrow_cells(self, thread_id: str) -> list[dict[str, Any]]:
        """Return the cell of each of the thread's borrow rows (`values.BORROW`), parsed."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT data FROM lgfs_blobs WHERE thread_id = %s AND codec = 'borrow'",
                (thread_id,),
            ).fetchall()
        return [json.loads(bytes(r[0])) for r in rows]
