"""The PostgreSQL store's thread reads: `threads`, `thread_summary`, `thread_status`,
`athread_status`, `namespaces`, `resolve_namespace`.

The reference is the SQLite saver: the same threads, written through the
real runner and LangGraph with one manual clock into both stores, must read
back the same (ids, which LangGraph and the runner draw at random, aside).
Then what only a database shared by hosts shows: one snapshot while another
connection commits, and the database's clock judging a claim.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from support.graphs import DAY, same_ids, write_threads
from support.puts import put

from langgraph_fenced_sqlite import InvalidArgument, ManualClock, ReplayUnavailable


def everything_read(saver: Any) -> dict[str, Any]:
    """Every thread read of `saver`, ids made alike."""
    summaries = saver.threads()
    by_id = {t["thread_id"]: t for t in summaries}
    out: dict[str, Any] = {
        "threads": by_id,
        "order": [t["last_activity"] for t in summaries],
        "failed": [t["thread_id"] for t in saver.threads(status="failed")],
        "busy or waiting": sorted(
            t["thread_id"] for t in saver.threads(status=["running", "interrupted"])
        ),
        "inactive 30 days": [t["thread_id"] for t in saver.threads(inactive_for=30 * DAY)],
        "inactive 1 s": sorted(
            t["thread_id"] for t in saver.threads(inactive_for=timedelta(seconds=1))
        ),
        "unknown": (saver.thread_summary("nobody"), saver.thread_status("nobody")),
    }
    for thread_id in [*by_id, "deleted"]:
        status = saver.thread_status(thread_id)
        out[thread_id] = {
            "summary": saver.thread_summary(thread_id),
            "status": None if status is None else status.to_dict(),
            "namespaces": saver.namespaces(thread_id),
        }
    out["sub"] = saver.resolve_namespace("done", "sub")
    return same_ids(out)


def test_the_thread_reads_are_the_sqlite_savers_on_the_same_runs(
    open_store: Any, open_pg: Any
) -> None:
    """threads (every filter), thread_summary, thread_status, namespaces: equal, key by key."""
    reads = []
    for opener in (open_store, open_pg):
        clock = ManualClock()  # each store its own, from the same start
        saver = opener(clock=clock)
        write_threads(saver, clock)
        reads.append(everything_read(saver))
    expected, got = reads
    assert set(got["threads"]) == {"old", "done", "waiting", "broken", "plain", "busy", "released"}
    for key in expected:
        assert got[key] == expected[key], key
    assert got == expected
    assert got["order"] == sorted(got["order"], reverse=True)  # newest activity first
    statuses = {t: s["status"]["state"] for t, s in got["threads"].items()}
    assert statuses == {
        "old": "idle",
        "done": "idle",
        "waiting": "interrupted",
        "broken": "failed",
        "plain": "idle",
        "busy": "running",
        "released": "idle",
    }


def _put_step(saver: Any, thread_id: str, step: int, parent: str | None, ns: str = "") -> str:
    """Put an unfenced checkpoint named after its step (`s00007`); return its id."""
    return put(saver, thread_id, new_id=f"s{step:05d}", step=step, parent=parent, ns=ns)


def test_threads_reads_every_thread_in_one_snapshot_while_another_host_commits(
    open_pg: Any,
) -> None:
    """Each summary and its status are of one moment, however long the listing takes.

    A writer (its own connection, as another host) commits checkpoints to
    `z-hot` as fast as it can while `threads()` reads 80 other threads
    first (ties in activity list by id). The summary's `latest_step` comes
    from the first statement, the status's `checkpoint_id` from one of the
    last: under READ COMMITTED (each statement its own snapshot) the two
    disagree as soon as a commit lands between them.
    """
    reader, writer = open_pg(), open_pg()
    for i in range(80):
        _put_step(reader, f"t{i:02d}", 0, None)
    parent = _put_step(writer, "z-hot", 0, None)
    stop = threading.Event()
    committed = [0]

    def write() -> None:
        step, last = 1, parent
        while not stop.is_set():
            last = _put_step(writer, "z-hot", step, last)
            committed[0] = step
            step += 1

    thread = threading.Thread(target=write)
    thread.start()
    try:
        # At least 15 listings, and until the writer committed more than 15
        # checkpoints meanwhile: a listing is one round trip, so the writer's
        # commits may come slower than the listings do.
        listed, deadline = 0, time.monotonic() + 120
        while listed < 15 or committed[0] <= 15:
            assert time.monotonic() < deadline, (listed, committed)
            (hot,) = [t for t in reader.threads() if t["thread_id"] == "z-hot"]
            assert hot["status"]["checkpoint_id"] == f"s{hot['latest_step']:05d}", hot
            assert hot["checkpoints"] == hot["latest_step"] + 1 == hot["next_seq"] - 1, hot
            listed += 1
    finally:
        stop.set()
        thread.join()
    assert writer.thread_summary("z-hot")["latest_step"] > 15  # type: ignore[index]


def test_a_claim_is_judged_by_the_database_clock(open_pg: Any) -> None:
    """With no clock given, `threads`/`thread_status` judge expiry and activity by the server's.

    Claims recorded by stores with injected clocks far in the past and far
    ahead: the database's clock (now) finds the first expired, the second live.
    """
    open_pg(clock=ManualClock(1_000_000.0)).claim("past", "w1", 60)  # expired in 1970
    open_pg(clock=ManualClock(4_000_000_000.0)).claim("ahead", "w2", 60)  # live until 2096
    saver = open_pg(clock=None)
    assert saver.thread_status("past").state == "idle"  # type: ignore[union-attr]
    assert saver.thread_status("ahead").state == "running"  # type: ignore[union-attr]
    listed = {t["thread_id"]: t["status"]["state"] for t in saver.threads()}
    assert listed == {"past": "idle", "ahead": "running"}
    assert [t["thread_id"] for t in saver.threads(status="running")] == ["ahead"]
    _put_step(saver, "fresh", 0, None)
    # `fresh` was written by the database's clock just now; no thread was written in 2096.
    assert "fresh" not in [t["thread_id"] for t in saver.threads(inactive_for=3600)]
    assert saver.threads(inactive_for=timedelta(days=365 * 80)) == []
    remaining = saver.thread_summary("ahead")["status"]["expires_in"]  # type: ignore[index]
    assert 4_000_000_000.0 - 2e9 < remaining < 4_000_000_060.0


_BAD_CALLS = [
    ("threads-status", "status", lambda s: s.threads(status="sleeping")),
    ("threads-status-type", "status", lambda s: s.threads(status=[1])),
    ("threads-inactive", "inactive_for", lambda s: s.threads(inactive_for=-1)),
    ("threads-inactive-type", "inactive_for", lambda s: s.threads(inactive_for="1d")),
    ("summary-empty", "thread_id", lambda s: s.thread_summary("")),
    ("summary-type", "thread_id", lambda s: s.thread_summary(7)),
    ("status-nul", "thread_id", lambda s: s.thread_status("t\x00")),
    ("status-long", "thread_id", lambda s: s.thread_status("t" * 100_000)),
    ("namespaces", "thread_id", lambda s: s.namespaces(None)),
    ("resolve-thread", "thread_id", lambda s: s.resolve_namespace("", "sub")),
    ("resolve-prefix", "checkpoint_ns", lambda s: s.resolve_namespace("t", "a\x00")),
    ("resolve-prefix-type", "checkpoint_ns", lambda s: s.resolve_namespace("t", 3)),
]


@pytest.mark.parametrize(("label", "argument", "call"), _BAD_CALLS, ids=[c[0] for c in _BAD_CALLS])
def test_bad_arguments_are_refused_naming_them_before_the_store_is_used(
    either_store: Any, label: str, argument: str, call: Any
) -> None:
    """Each bad argument is `InvalidArgument` naming it, even on a closed store (nothing ran)."""
    either_store.close()
    with pytest.raises(InvalidArgument) as caught:
        call(either_store)
    assert caught.value.argument == argument, (label, caught.value)
    assert str(caught.value).startswith(f"{argument}:"), str(caught.value)


def test_resolve_namespace_finds_one_or_names_the_candidates(either_store: Any) -> None:
    """An exact name or a unique prefix resolves; none or several is an error listing them."""
    _put_step(either_store, "t", 0, None)
    _put_step(either_store, "t", 0, None, ns="agent:1")
    _put_step(either_store, "t", 0, None, ns="tools:1")
    _put_step(either_store, "t", 0, None, ns="tools:2")
    assert either_store.namespaces("t") == ["", "agent:1", "tools:1", "tools:2"]
    assert either_store.namespaces("nobody") == []
    assert either_store.resolve_namespace("t", "agent") == "agent:1"
    assert either_store.resolve_namespace("t", "tools:2") == "tools:2"
    assert either_store.resolve_namespace("t", "") == ""
    for prefix, listed in (("tools", "'tools:1', 'tools:2'"), ("x", "'', 'agent:1'")):
        with pytest.raises(InvalidArgument) as caught:
            either_store.resolve_namespace("t", prefix)
        assert caught.value.argument == "checkpoint_ns" and listed in str(caught.value)


def test_the_async_twin_is_the_sync_call(open_pg: Any, clock: ManualClock) -> None:
    """`athread_status` gives what `thread_status` gives, for a thread and for none."""
    saver = open_pg()
    claim = saver.claim("t", "w", 30)

    async def both() -> tuple[Any, Any]:
        return await saver.athread_status("t"), await saver.athread_status("nobody")

    got, none = asyncio.run(both())
    assert none is None
    assert got == saver.thread_status("t")
    assert (got.state, got.holder, got.token) == ("running", "w", claim.token)


def test_a_damaged_interrupt_write_reads_as_in_the_sqlite_store(
    open_store: Any, open_pg: Any, db_path: str, pg_dsn: str
) -> None:
    """A flipped byte in the waiting thread's `__interrupt__` write: both stores judge alike.

    The write's checksum no longer holds; neither store fails the listing,
    nor shows the damaged value as if it were the interrupt's.
    """
    reads = []
    damages = (lambda: _damage_sqlite(db_path), lambda: _damage_pg(pg_dsn))
    for saver, damage in _written_stores(open_store, open_pg, damages):
        before = saver.thread_status("waiting")
        assert before.state == "interrupted" and before.waiting
        damage()
        status = saver.thread_status("waiting")
        summary = saver.thread_summary("waiting")
        assert summary["status"] == status.to_dict()
        reads.append(same_ids({"status": status.to_dict(), "threads": saver.threads()}))
    assert reads[0] == reads[1]
    assert reads[1]["status"]["waiting"] == []  # the damaged interrupt is not shown as one


def _written_stores(
    open_store: Any, open_pg: Any, damages: tuple[Callable[[], None], Callable[[], None]]
) -> Iterator[tuple[Any, Callable[[], None]]]:
    """Each store (SQLite, then PostgreSQL) written by `write_threads`, and its damage."""
    for opener, damage in zip((open_store, open_pg), damages, strict=True):
        clock = ManualClock()
        saver = opener(clock=clock)
        write_threads(saver, clock)
        yield saver, damage


_FLIP = "WHERE thread_id = 'waiting' AND channel = '__interrupt__'"


def _damage_sqlite(path: str) -> None:
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        (blob,) = conn.execute(f"SELECT blob FROM writes {_FLIP}").fetchone()
        conn.execute(f"UPDATE writes SET blob = ? {_FLIP}", (bytes([blob[0] ^ 4]) + blob[1:],))
        conn.commit()
    finally:
        conn.close()


def _damage_pg(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        (blob,) = conn.execute(f"SELECT blob FROM lgfs_writes {_FLIP}").fetchone()
        flipped = bytes([blob[0] ^ 4]) + blob[1:]
        conn.execute(f"UPDATE lgfs_writes SET blob = %s {_FLIP}", (flipped,))


def test_a_damaged_or_outdated_run_event_is_judged_as_in_the_sqlite_store(
    open_store: Any, open_pg: Any, db_path: str, pg_dsn: str
) -> None:
    """`broken`'s `run_failed` event damaged, and `done` checkpointed after its run by a plain
    (unfenced) write: each store ignores that event when judging, alike, in every read."""
    reads = []
    damages = (lambda: _damage_event_sqlite(db_path), lambda: _damage_event_pg(pg_dsn))
    for saver, damage in _written_stores(open_store, open_pg, damages):
        before = {t: saver.thread_status(t) for t in ("broken", "done")}
        assert before["broken"].state == "failed"
        assert before["broken"].run_id and before["done"].run_id  # from their run events
        damage()
        latest = saver.get_tuple({"configurable": {"thread_id": "done", "checkpoint_ns": ""}})
        _put_step(saver, "done", 99, latest.config["configurable"]["checkpoint_id"])
        statuses = {t: saver.thread_status(t).to_dict() for t in ("broken", "done")}
        summaries = {t: saver.thread_summary(t)["status"] for t in ("broken", "done")}
        assert summaries == statuses
        listed = {t["thread_id"]: t["status"] for t in saver.threads()}
        assert {t: listed[t] for t in statuses} == statuses
        reads.append(same_ids(statuses))
    assert reads[0] == reads[1]
    # Neither event speaks for its thread any more: no run is named.
    assert reads[1]["broken"]["run_id"] is reads[1]["done"]["run_id"] is None
    assert reads[1]["broken"]["state"] == "failed"  # by its checkpoint's error write


_LAST_FAILED = "WHERE thread_id = 'broken' AND kind = 'run_failed'"


def _damage_event_sqlite(path: str) -> None:
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        conn.execute(f"UPDATE events SET checksum = checksum + 1 {_LAST_FAILED}")
        conn.commit()
    finally:
        conn.close()


def _damage_event_pg(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE lgfs_events SET checksum = checksum + 1 {_LAST_FAILED}")


def test_a_thread_cell_of_the_wrong_type_cannot_be_stored(pg_dsn: str, open_pg: Any) -> None:
    """Why this store's summaries carry no "wrong type" error, unlike the SQLite store's.

    SQLite keeps text in an integer column, so its `threads()` reports such a
    cell; PostgreSQL's typed columns refuse it at the write, so no reader
    ever meets one.
    """
    saver = open_pg()
    saver.claim("t", "w", 30)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for column in ("token", "expires_at", "next_seq", "incarnation"):
            with pytest.raises(psycopg.errors.InvalidTextRepresentation):
                conn.execute(f"UPDATE lgfs_threads SET {column} = 'x' WHERE thread_id = 't'")
    assert [t["error"] for t in saver.threads()] == [None]


def test_a_deleted_thread_is_listed_no_more_even_if_it_held_only_a_claim(either_store: Any) -> None:
    """Claimed, released, deleted: no longer a thread, and a new incarnation, in both stores.

    PostgreSQL's `delete_thread` used to start a new incarnation only for a
    thread with events or a claim in force, so this one stayed listed by
    `threads()` (and in incarnation 1), unlike in the SQLite store.
    """
    either_store.release("r", either_store.claim("r", "w", 60).token)
    assert [t["thread_id"] for t in either_store.threads()] == ["r"]
    either_store.delete_thread("r")
    assert either_store.threads() == []
    assert either_store.thread_summary("r") is None and either_store.thread_status("r") is None
    with pytest.raises(ReplayUnavailable) as gone:
        either_store.events_after("r", 0, incarnation=1)
    assert gone.value.incarnation == 2
    either_store.delete_thread("r")  # a tombstone deleted again stays what it is
    assert either_store.events_after("r", 0, incarnation=2) == []
    fresh = either_store.claim("r", "w", 60)
    assert [t["thread_id"] for t in either_store.threads()] == ["r"]
    assert either_store.thread_status("r").token == fresh.token  # type: ignore[union-attr]


def test_search_index_follows_rows_stored_below_the_api(open_pg: Any, pg_dsn: str) -> None:
    """`lgfs_thread_tags` is kept by triggers, whatever stores the row (as the SQLite file's).

    A row whose metadata is JSON but not an object (damage) leaves its thread
    untagged; one whose metadata is not JSON at all is refused by the trigger
    (every path of the library stores JSON; only a hand-made row can).
    """
    saver = open_pg()
    for thread_id in ("t", "u"):
        metadata = {"source": "loop", "step": 0, "parents": {}, "user": "ann"}
        saver.put(
            {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}},
            _checkpoint(),
            metadata,
            {},
        )
    copy = (
        "INSERT INTO lgfs_checkpoints SELECT thread_id, checkpoint_ns, %s, position + 1, "
        "parent_checkpoint_id, envelope, values_type, values_blob, %s, source, step, run_id, "
        "token, created_at, checksum FROM lgfs_checkpoints WHERE thread_id = 't' "
        "AND checkpoint_id NOT IN ('changed', 'damaged')"
    )
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(copy, ("changed", '{"step": 1, "user": "bob"}'))
        assert [t["thread_id"] for t in saver.search_threads(metadata={"user": "bob"})] == ["t"]
        conn.execute(copy.replace("position + 1", "position + 2"), ("damaged", "[1, 2]"))
        with pytest.raises(psycopg.errors.InvalidTextRepresentation):
            conn.execute(copy.replace("position + 1", "position + 3"), ("not-json", "{oops"))
    assert [t["thread_id"] for t in saver.search_threads(metadata={"user": "ann"})] == ["u"]
    assert saver.count_threads(metadata={"user": "bob"}) == 0
    saver.delete_thread("u")
    assert saver.count_threads(metadata={"user": "ann"}) == 0
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        left = conn.execute("SELECT count(*) FROM lgfs_thread_tags WHERE thread_id = 'u'")
        assert left.fetchone() == (0,)


def _checkpoint() -> Any:
    from langgraph_fenced_sqlite.testing._helpers import values_checkpoint

    return values_checkpoint({"n": 1})
