"""`readonly=True` stores, and writable opens of read-only places (docs/semantics.md §8, case 37).

The location is made really read-only: a tmpfs mounted and then remounted
read-only when the tests run as root (root ignores file modes, so `chmod`
would prove nothing), or a directory without write permission otherwise.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from support.configs import saver_config

from langgraph_fenced_sqlite import (
    FencedSqliteSaver,
    InvalidArgument,
    ReadOnlyStore,
    RetentionPolicy,
    StoreError,
)


def _files(directory: str) -> dict[str, str]:
    out = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


@pytest.fixture
def read_only_dir(tmp_path: Any) -> Iterator[tuple[str, Callable[[], None]]]:
    """A directory, and a function that makes it (and its files) read-only for real."""
    directory = str(tmp_path / "ro")
    os.mkdir(directory)
    mounted = False
    if os.geteuid() == 0:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", directory], capture_output=True
        )
        if done.returncode != 0:
            pytest.fail(f"root, but cannot mount a tmpfs to make read-only: {done.stderr!r}")
        mounted = True

    def make_read_only() -> None:
        if mounted:
            subprocess.run(["mount", "-o", "remount,ro", directory], check=True)
        else:
            for name in os.listdir(directory):
                os.chmod(os.path.join(directory, name), 0o444)
            os.chmod(directory, 0o555)
        assert not os.access(directory, os.W_OK)

    try:
        yield directory, make_read_only
    finally:
        if mounted:
            subprocess.run(["umount", "-l", directory], check=True)
        else:
            os.chmod(directory, 0o755)


def _fill(path: str) -> tuple[dict[str, Any], int]:
    with FencedSqliteSaver(path) as saver:
        claim = saver.claim("t", "alice", 3600)
        config = saver.put(claim.config(), empty_checkpoint(), {"source": "input", "step": -1}, {})
        saver.put_writes(claim.config(config), [("ch", {"v": 1})], "task-1")
        saver.append_events("t", claim.token, [("note", {"n": 1})])
    return config, claim.token


def test_a_readonly_store_reads_a_read_only_location(read_only_dir: Any) -> None:
    """Reads work on a read-only mount; every write raises ReadOnlyStore; nothing changes."""
    directory, make_read_only = read_only_dir
    path = os.path.join(directory, "store.db")
    config, token = _fill(path)
    make_read_only()
    before = _files(directory)
    with FencedSqliteSaver(path, readonly=True) as saver:
        assert saver.readonly
        found = saver.get_tuple(config)
        assert found is not None and found.pending_writes == [("task-1", "ch", {"v": 1})]
        assert [t.config for t in saver.list(saver_config())] == [found.config]
        assert [e.kind for e in saver.events_after("t")][-1] == "note"
        assert [e.kind for e in saver.wait_events("t", 0, timeout=0.1)][-1] == "note"
        assert saver.current_claim("t").token == token
        writes: list[Callable[[], Any]] = [
            lambda: saver.put(
                saver_config("u"), empty_checkpoint(), {"source": "update", "step": 0}, {}
            ),
            lambda: saver.put_writes(config, [("ch", 2)], "task-2"),
            lambda: saver.claim("u", "bob", 10),
            lambda: saver.append_events("t", token, [("x", {})]),
            lambda: saver.compact_events("t", 2),
            lambda: saver.delete_thread("t"),
            lambda: asyncio.run(
                saver.aput(
                    saver_config("u"), empty_checkpoint(), {"source": "update", "step": 0}, {}
                )
            ),
        ]
        for write in writes:
            with pytest.raises(ReadOnlyStore) as exc:
                write()
            assert "read-only" in str(exc.value) and path in str(exc.value), str(exc.value)
            assert exc.value.code == "read_only_store"
        assert saver.get_tuple(config) is not None
    assert _files(directory) == before


def test_a_writable_open_of_a_read_only_location_says_so(read_only_dir: Any) -> None:
    """Opening a read-only location for writing fails naming the cause and `readonly=True`."""
    directory, make_read_only = read_only_dir
    path = os.path.join(directory, "store.db")
    _fill(path)
    make_read_only()
    before = _files(directory)
    with pytest.raises(ReadOnlyStore) as exc:
        FencedSqliteSaver(path)
    assert "read-only" in str(exc.value) and "readonly=True" in str(exc.value), str(exc.value)
    assert isinstance(exc.value, StoreError)
    assert _files(directory) == before


def test_a_readonly_store_on_a_writable_location_follows_the_writers(db_path: str) -> None:
    """Where others write, a readonly store sees their commits; its own writes are refused."""
    with pytest.raises(StoreError, match="no such file"):
        FencedSqliteSaver(db_path, readonly=True)
    assert not os.path.exists(db_path)
    with FencedSqliteSaver(db_path) as writer:
        claim = writer.claim("t", "alice", 3600)
        with FencedSqliteSaver(db_path, readonly=True) as reader:
            writer.append_events("t", claim.token, [("a", {})])
            assert [e.kind for e in reader.wait_events("t", 0, timeout=5)] == ["a"]
            with pytest.raises(ReadOnlyStore):
                reader.release("t", claim.token)
        assert writer.current_claim("t") == claim
    with pytest.raises(InvalidArgument) as exc:
        FencedSqliteSaver(db_path, readonly="yes")  # type: ignore[arg-type]
    assert exc.value.argument == "readonly"


def test_a_readonly_sweep_is_refused_even_with_nothing_to_sweep(db_path: str) -> None:
    """`sweep` refuses before it lists threads: the same answer whatever the store holds.

    Each thread's prune is a write, so a sweep of a store with threads was
    always refused; one with none used to return an empty result instead.
    """
    FencedSqliteSaver(db_path).close()
    with FencedSqliteSaver(db_path, readonly=True) as saver:
        for dry_run in (False, True):
            with pytest.raises(ReadOnlyStore) as exc:
                saver.sweep(RetentionPolicy(max_checkpoints=1), dry_run=dry_run)
            assert exc.value.op == "sweep" and exc.value.path == db_path


def test_a_read_only_copy_with_commits_left_in_its_wal_is_refused(
    read_only_dir: Any, tmp_path: Any
) -> None:
    """A file whose -wal still holds commits cannot be read right where no -shm can be made.

    SQLite's `immutable=1` (the only way to read a WAL file there) ignores the
    -wal, so reading would silently show an older state: refused instead.
    """
    directory, make_read_only = read_only_dir
    source = str(tmp_path / "live.db")
    with FencedSqliteSaver(source) as saver:
        saver.put(saver_config(), empty_checkpoint(), {"source": "update", "step": 0}, {})
        assert os.path.getsize(source + "-wal") > 0  # not checkpointed yet
        for suffix in ("", "-wal"):  # a copy taken while the store was open
            with (
                open(source + suffix, "rb") as f,
                open(os.path.join(directory, "copy.db" + suffix), "wb") as g,
            ):
                g.write(f.read())
    make_read_only()
    before = _files(directory)
    with pytest.raises(StoreError) as exc:
        FencedSqliteSaver(os.path.join(directory, "copy.db"), readonly=True)
    assert "-wal" in str(exc.value) and "writable" in str(exc.value), str(exc.value)
    assert _files(directory) == before
