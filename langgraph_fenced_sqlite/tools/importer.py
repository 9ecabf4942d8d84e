"""Copy a LangGraph `SqliteSaver` file (or, through `import_postgres.py`, a
`PostgresSaver` database) into a fenced store.

Invariant: the source is only read (a file opened `mode=ro`; a database in a
read-only transaction) and its values are decoded only by the data-only
serializer, so importing never writes the source and never runs code stored
in it. A thread is imported whole or not at all: every row of it is decoded,
and every value proven storable, before its first `put`; a thread with a row
that does not (pickle, a type outside the allow-list, a value that does not
rebuild) is skipped and named in the report with the checkpoint and the
reason, and the other threads are imported. Everything is written through
the saver's public `put`/`put_writes`, one thread at a time, each checkpoint
after its parent (id order), so positions follow the source's history and a
rerun changes nothing: an identical `put` is a no-op and regular writes are
first-writer-wins. `_Importer` does this for any `Source`: each kind of
source only says how its rows are read.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

from langgraph.checkpoint.base import WRITES_IDX_MAP, Checkpoint

from ..core.fenced_store import FencedStore
from ..core.serde import DataOnlySerializer
from ..errors import (
    FencedSqliteError,
    SerializationError,
    StoreError,
    UndecodableRow,
    UnsupportedFormat,
)
from ..sqlite import schema

if TYPE_CHECKING:
    pass

__all__ = ["ImportReport", "check_source", "import_sqlitesaver"]

_CHECKPOINT_COLUMNS = {"thread_id", "checkpoint_ns", "checkpoint_id", "parent_checkpoint_id"}
_CHECKPOINT_COLUMNS |= {"type", "checkpoint", "metadata"}
_WRITE_COLUMNS = {"thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx", "channel"}
_WRITE_COLUMNS |= {"type", "value"}

# One checkpoint's decoded writes by (task_id, task_path): (idx, channel, value).
_Groups = dict[tuple[str, str], list[tuple[int, str, Any]]]


@dataclass(frozen=True)
class ImportReport:
    """What `import_sqlitesaver` copied.

    Attributes:
        source: The `SqliteSaver` file read.
        dest: The fenced file written.
        threads: Threads copied.
        checkpoints: Checkpoints copied (an identical one already there counts too).
        writes: Pending writes copied (likewise).
        skipped: Threads not imported, each `{"thread_id", "checkpoint_id",
            "reason"}` naming the first row that did not decode or store.
    """

    source: str
    dest: str
    threads: int
    checkpoints: int
    writes: int
    skipped: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Return the report as a JSON-ready dict."""
        return asdict(self)


def import_sqlitesaver(
    src_path: str | os.PathLike[str],
    dest_saver: FencedStore,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> ImportReport:
    """Copy every thread, checkpoint and pending write of a `SqliteSaver` file.

    Each thread's checkpoints are put in checkpoint-id order (a parent before
    its children), each followed by its pending writes; writes whose
    checkpoint the source never stored come last. Afterwards both files give
    the same `get_state_history` for every thread. Import into a file nobody
    writes meanwhile; rerunning it (e.g. after an interruption) is safe.

    Args:
        src_path: The `SqliteSaver` file; never written.
        dest_saver: The fenced store to write (unfenced writes: a thread with a
            live claim raises `ThreadBusy`).
        progress: Called as `progress(rows_done, rows_total)` after each
            checkpoint and its writes.

    Returns:
        What was copied, and which threads were skipped whole because a row
        did not decode as data (pickle, a type outside the dest saver's
        allow-list, corrupt bytes) or would not be stored; each names the
        thread, the checkpoint and the reason.

    Raises:
        FileNotFoundError: `src_path` does not exist.
        UnsupportedFormat: `src_path` is not a `SqliteSaver` file.
        StoreError: the source cannot be read (locked, unreadable).
    """
    src = os.fspath(src_path)
    conn = _open_source(src)
    try:
        # One read transaction: a consistent snapshot even if someone writes the source.
        conn.execute("BEGIN")
        try:
            return _Importer(_SqliteSaverFile(conn, src), dest_saver, progress).run()
        finally:
            conn.execute("COMMIT")
    except sqlite3.Error as exc:
        raise StoreError("import", src, message=f"import {src}: reading the source: {exc}") from exc
    finally:
        conn.close()


def import_serde(dest_saver: Any) -> DataOnlySerializer:
    """The serializer an import decodes its source with: `dest_saver`'s allow-list
    (so its users' types import), but never into display-only tagged data that
    would then be stored. The source's rows are LangGraph's, in clear: they are
    decoded with no key (the destination seals what it stores with its own)."""
    serde = dest_saver.serde
    if not isinstance(serde, DataOnlySerializer):
        return DataOnlySerializer()
    return serde.refusing().with_encryption(None)


def check_source(src_path: str | os.PathLike[str]) -> None:
    """Check, reading only, that `src_path` is a LangGraph `SqliteSaver` file.

    Raises:
        FileNotFoundError: `src_path` does not exist.
        UnsupportedFormat: it is not a `SqliteSaver` file.
    """
    _open_source(os.fspath(src_path)).close()


def _open_source(src: str) -> sqlite3.Connection:
    if not os.path.isfile(src):
        raise FileNotFoundError(2, "No such file", src)
    uri = "file:" + os.path.abspath(src).replace("?", "%3f").replace("#", "%23") + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise StoreError("import", src, message=f"import {src}: {exc}") from exc
    try:
        tables = {
            "checkpoints": _columns(conn, "checkpoints"),
            "writes": _columns(conn, "writes"),
        }
    except sqlite3.DatabaseError as exc:
        conn.close()
        if isinstance(exc, sqlite3.OperationalError):  # locked, unreadable: not a format issue
            raise StoreError("import", src, message=f"import {src}: {exc}") from exc
        raise UnsupportedFormat(
            "import", src, message=f"import {src}: not an SQLite database ({exc})"
        ) from exc
    if not (_CHECKPOINT_COLUMNS <= tables["checkpoints"] and _WRITE_COLUMNS <= tables["writes"]):
        conn.close()
        raise UnsupportedFormat(
            "import", src, message=f"import {src}: not a LangGraph SqliteSaver file"
        )
    return conn


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[0] for row in conn.execute(schema.SQLITESAVER_TABLE_COLUMNS, (table,))}


# A write row as a source gives it: (task_id, task_path, idx, channel, type, value).
WriteRow = tuple[str, str, int, str, str, bytes]


class Source(Protocol):
    """A LangGraph saver's rows as `_Importer` reads them, inside one snapshot of the source.

    Threads are the source's own values (passed back as they came); every
    method only reads. `checkpoint` decodes with the serializer it is given
    and raises `SerializationError`, `ValueError` or `TypeError` for a row
    that is not data.
    """

    name: str

    def counts(self) -> tuple[int, int]:
        """Checkpoints and writes in the source."""
        ...

    def threads(self) -> list[Any]:
        """Every thread with a checkpoint or a write, in order."""
        ...

    def checkpoint_keys(self, thread: Any) -> list[tuple[str, str, str | None]]:
        """The thread's checkpoints as `(ns, id, parent id)`, in id order."""
        ...

    def orphan_write_keys(self, thread: Any) -> list[tuple[str, str]]:
        """`(ns, id)` of the thread's writes whose checkpoint the source never stored."""
        ...

    def checkpoint(
        self, thread: Any, ns: str, cid: str, serde: DataOnlySerializer
    ) -> tuple[Any, dict[str, Any]]:
        """One checkpoint, decoded, and its metadata."""
        ...

    def write_rows(self, thread: Any, ns: str, cid: str) -> list[WriteRow]:
        """One checkpoint's writes, undecoded, in `(task_path, task_id, idx)` order."""
        ...


class _SqliteSaverFile:
    """A `SqliteSaver` file as a `Source` (its connection inside a read transaction)."""

    def __init__(self, conn: sqlite3.Connection, src: str) -> None:
        self.conn, self.name = conn, src
        self.writes_sql = (
            schema.SQLITESAVER_WRITES_OF_CHECKPOINT
            if "task_path" in _columns(conn, "writes")
            else schema.SQLITESAVER_WRITES_OF_CHECKPOINT_NO_TASK_PATH
        )

    def counts(self) -> tuple[int, int]:
        n_checkpoints, n_writes = self.conn.execute(schema.SQLITESAVER_COUNTS).fetchone()
        return int(n_checkpoints), int(n_writes)

    def threads(self) -> list[Any]:
        return [row[0] for row in self.conn.execute(schema.SQLITESAVER_THREADS)]

    def checkpoint_keys(self, thread: Any) -> list[tuple[str, str, str | None]]:
        return self.conn.execute(schema.SQLITESAVER_CHECKPOINT_KEYS, (thread,)).fetchall()

    def orphan_write_keys(self, thread: Any) -> list[tuple[str, str]]:
        return self.conn.execute(schema.SQLITESAVER_ORPHAN_WRITE_KEYS, (thread,)).fetchall()

    def checkpoint(
        self, thread: Any, ns: str, cid: str, serde: DataOnlySerializer
    ) -> tuple[Any, dict[str, Any]]:
        type_, blob, metadata = self.conn.execute(
            schema.SQLITESAVER_GET_CHECKPOINT, (thread, ns, cid)
        ).fetchone()
        return serde.loads_typed((type_, blob)), _metadata(metadata)

    def write_rows(self, thread: Any, ns: str, cid: str) -> list[WriteRow]:
        return self.conn.execute(self.writes_sql, (thread, ns, cid)).fetchall()


class _Importer:
    def __init__(
        self, source: Source, dest: Any, progress: Callable[[int, int], None] | None
    ) -> None:
        self.source, self.dest, self.serde = source, dest, import_serde(dest)
        self.progress = progress
        self.done = 0
        self.total = 0
        self.checkpoints = 0
        self.writes = 0
        self.skipped: list[dict[str, Any]] = []

    def run(self) -> ImportReport:
        """Import every thread of the source (inside the snapshot its caller holds)."""
        self.total = sum(self.source.counts())
        self._report()
        threads = self.source.threads()
        for thread in threads:
            self._thread(thread)
        imported = len(threads) - len(self.skipped)
        return ImportReport(
            self.source.name,
            self.dest.path,
            imported,
            self.checkpoints,
            self.writes,
            tuple(self.skipped),
        )

    def _report(self) -> None:
        if self.progress is not None:
            self.progress(self.done, self.total)

    def _thread(self, raw_thread: Any) -> None:
        thread_id = str(raw_thread)
        keys = self.source.checkpoint_keys(raw_thread)
        parent_of = {(ns, cid): parent for ns, cid, parent in keys}
        orphans = self.source.orphan_write_keys(raw_thread)
        # Decode and prove the whole thread before its first put: a row that
        # fails halfway must not leave half a thread behind.
        plan: list[tuple[str, str, Any, _Groups, int]] = []
        try:
            for ns, cid in _parents_first(keys):
                checkpoint = self._checkpoint(raw_thread, thread_id, ns, cid, parent_of[(ns, cid)])
                plan.append((ns, cid, checkpoint, *self._writes(raw_thread, thread_id, ns, cid)))
            for ns, cid in orphans:
                plan.append((ns, cid, None, *self._writes(raw_thread, thread_id, ns, cid)))
        except UndecodableRow as exc:
            self.skipped.append(
                {"thread_id": thread_id, "checkpoint_id": exc.checkpoint_id, "reason": exc.reason}
            )
            rows = len(keys) + sum(
                len(self.source.write_rows(raw_thread, ns, cid))
                for ns, cid in [(k[0], k[1]) for k in keys] + [(o[0], o[1]) for o in orphans]
            )
            self.done += rows
            self._report()
            return
        for ns, cid, checkpoint, groups, n_writes in plan:
            if checkpoint is not None:
                self._put_checkpoint(thread_id, ns, checkpoint, parent_of[(ns, cid)])
            self._put_writes(thread_id, ns, cid, groups, n_writes)
            self._report()

    def _checkpoint(
        self, raw_thread: Any, thread_id: str, ns: str, cid: str, parent: str | None
    ) -> tuple[Checkpoint, dict[str, Any]]:
        try:
            checkpoint, md = self.source.checkpoint(raw_thread, ns, cid, self.serde)
            if not isinstance(checkpoint, dict) or checkpoint.get("id") != cid:
                raise ValueError("the checkpoint blob is not a checkpoint with this id")
            self.serde.dumps_typed(checkpoint.get("channel_values", {}))  # proves it stores
        except (SerializationError, ValueError, TypeError) as exc:
            raise _undecodable(thread_id, ns, cid, str(exc)) from exc
        return checkpoint, md  # type: ignore[return-value]

    def _put_checkpoint(
        self, thread_id: str, ns: str, found: tuple[Checkpoint, dict[str, Any]], parent: str | None
    ) -> None:
        checkpoint, md = found
        conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
        if parent:
            conf["checkpoint_id"] = parent
        self.dest.put({"configurable": conf}, checkpoint, md, {})
        self.checkpoints += 1
        self.done += 1

    def _writes(self, raw_thread: Any, thread_id: str, ns: str, cid: str) -> tuple[_Groups, int]:
        rows = self.source.write_rows(raw_thread, ns, cid)
        groups: _Groups = {}
        for task_id, task_path, idx, channel, type_, value in rows:
            try:
                decoded = self.serde.loads_typed((type_, value))
                self.serde.dumps_typed(decoded)  # proves it stores
            except (SerializationError, ValueError, TypeError) as exc:
                reason = f"write {task_id}/{idx} ({channel}): {exc}"
                raise _undecodable(thread_id, ns, cid, reason) from exc
            groups.setdefault((task_id, task_path or ""), []).append((idx, channel, decoded))
        return groups, len(rows)

    def _put_writes(
        self,
        thread_id: str,
        ns: str,
        cid: str,
        groups: _Groups,
        n_writes: int,
    ) -> None:
        config = {
            "configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}
        }
        stored: dict[tuple[str, int], tuple[str, Any]] | None = None
        for (task_id, task_path), writes in groups.items():
            for batch in _batches(writes):
                if any(channel in WRITES_IDX_MAP for channel, _ in batch):
                    # Special channels are last-writer-wins, so putting them
                    # again would log a new event; skip what is already there.
                    if stored is None:
                        stored = self._stored_writes(thread_id, ns, cid)
                    if _already_stored(batch, task_id, stored):
                        continue
                self.dest.put_writes(config, batch, task_id, task_path)
        self.writes += n_writes
        self.done += n_writes

    def _stored_writes(
        self, thread_id: str, ns: str, cid: str
    ) -> dict[tuple[str, int], tuple[str, Any]]:
        found = self.dest.inspect_checkpoint(thread_id, checkpoint_ns=ns, checkpoint_id=cid)
        if found is None:
            return {}
        return {
            (w["task_id"], w["idx"]): (w["channel"], w["value"])
            for w in found["writes"]
            if w["error"] is None
        }


def _already_stored(
    batch: list[tuple[str, Any]], task_id: str, stored: dict[tuple[str, int], tuple[str, Any]]
) -> bool:
    for position, (channel, value) in enumerate(batch):
        idx = WRITES_IDX_MAP.get(channel, position)
        if stored.get((task_id, idx)) != (channel, value):
            return False
    return True


def _undecodable(thread_id: str, ns: str, cid: str, reason: str) -> FencedSqliteError:
    where = f" (namespace {ns!r})" if ns else ""
    return UndecodableRow(
        thread_id,
        cid,
        reason,
        message=f"source thread {thread_id!r} checkpoint {cid!r}{where} does not decode: {reason}",
    )


def _metadata(raw: Any) -> dict[str, Any]:
    # SqliteSaver stores `json.dumps(metadata).encode()`; plain JSON text is fine too.
    if raw is None:
        return {}
    text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw
    if not isinstance(text, str):
        raise ValueError(f"metadata: unexpected {type(raw).__name__}")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"metadata is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError("metadata is not a JSON object")
    return value


def _parents_first(keys: list[tuple[str, str, str | None]]) -> Iterator[tuple[str, str]]:
    """Yield `(ns, id)` in id order, but never a checkpoint before its stored parent."""
    parent_of = {(ns, cid): parent for ns, cid, parent in keys}
    emitted: set[tuple[str, str]] = set()
    for ns, cid, _ in keys:
        chain = []
        key: tuple[str, str] | None = (ns, cid)
        while key is not None and key not in emitted and key not in chain:
            chain.append(key)
            parent = parent_of[key]
            key = (ns, parent) if parent and (ns, parent) in parent_of else None
        for item in reversed(chain):
            emitted.add(item)
            yield item


def _batches(writes: list[tuple[int, str, Any]]) -> list[list[tuple[str, Any]]]:
    """Split one task's writes into `put_writes` calls that give back each idx.

    `put_writes` numbers regular writes by their place in the call and maps
    special channels to their fixed negative idx, so a special write can stand
    in a gap between regular ones. Gaps nothing can fill are closed up, which
    keeps the order (all that `writes_sort_key` reads) but not the number.
    """
    regular = sorted((w for w in writes if w[1] not in WRITES_IDX_MAP), key=lambda w: w[0])
    special = [(channel, value) for idx, channel, value in writes if channel in WRITES_IDX_MAP]
    batch: list[tuple[str, Any]] = []
    for idx, channel, value in regular:
        while len(batch) < idx and special:
            batch.append(special.pop(0))
        batch.append((channel, value))
    return [batch + special] if batch or special else []
