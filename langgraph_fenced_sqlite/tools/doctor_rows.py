"""Reading back every row of a store, as its readers read it, for `lgfs doctor`.

Invariant: a row is judged only by the functions the store's own reads use
(`saver_inspect.shown_checkpoint` for a checkpoint and its writes, checksum
first; `events_after` for events), through the calls both stores have
(`threads`, `_history_page`, `events_after`), so what the
doctor calls damaged is exactly what a read would refuse. Nothing is
written; one damaged row does not stop the scan.
"""

from __future__ import annotations

from typing import Any

from ..core.saver_inspect import shown_checkpoint
from ..errors import ReplayUnavailable, UndecodableRow

__all__ = ["scan_rows"]

_PAGE = 100


def scan_rows(saver: Any) -> tuple[dict[str, int], list[str]]:
    """Read every checkpoint, write and event of every thread; name the rows that do not decode.

    Returns:
        `({"checkpoints": n, "writes": n, "events": n}, damaged)`: how many
        rows were read, and one message per row (or thread summary) that
        does not decode.
    """
    read = {"checkpoints": 0, "writes": 0, "events": 0}
    damaged: list[str] = []
    for summary in saver.threads():
        thread_id = summary["thread_id"]
        if summary["error"]:  # its counters are not to be trusted either
            damaged.append(summary["error"]["message"])
            continue
        for ns in summary["namespaces"]:
            _scan_checkpoints(saver, thread_id, ns, read, damaged)
        _scan_events(saver, summary, read, damaged)
    return read, damaged


def _scan_checkpoints(
    saver: Any, thread_id: str, ns: str, read: dict[str, int], damaged: list[str]
) -> None:
    before = None
    while True:
        rows, writes = saver._history_page("doctor", thread_id, ns, before, _PAGE, True)
        for row in rows:
            shown = shown_checkpoint(saver.serde, thread_id, row, writes[(row[0], row[1], row[2])])
            read["checkpoints"] += 1
            read["writes"] += len(shown["writes"])
            errors = [shown["error"]] + [w["error"] for w in shown["writes"]]
            damaged += [e["message"] for e in errors if e]
        if len(rows) < _PAGE:
            return
        before = rows[-1][2]


def _scan_events(
    saver: Any, summary: dict[str, Any], read: dict[str, int], damaged: list[str]
) -> None:
    thread_id, floor = summary["thread_id"], summary["floor"]
    after, incarnation = max(int(floor) - 1, 0), None
    while after + 1 < summary["next_seq"]:
        try:
            page = saver.events_after(thread_id, after, _PAGE, incarnation=incarnation)
        except ReplayUnavailable as exc:
            # Re-created by `delete_thread`, or compacted meanwhile: go on
            # from the floor it names, in its incarnation.
            if incarnation == exc.incarnation and after >= exc.floor - 1:
                raise
            after, incarnation = max(after, exc.floor - 1), exc.incarnation
            continue
        except UndecodableRow:
            # Seqs are gap-free above the floor: the first of the page is
            # `after + 1`; read it alone to tell which row it is.
            try:
                page = saver.events_after(thread_id, after, 1, incarnation=incarnation)
            except UndecodableRow as one:
                damaged.append(str(one))
                read["events"] += 1
                after += 1
                continue
            # A later row of the page: the one-row read moved past this one.
        if not page:
            return
        read["events"] += len(page)
        after = page[-1].seq
        incarnation = page[-1].incarnation
