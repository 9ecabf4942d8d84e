"""`lgfs` with an encrypted store: the key as the app takes it, `rekey`, `doctor`'s cell counts.

Every test runs on a SQLite file and on a PostgreSQL store (`--db URL`).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.postgres import as_url

from langgraph_fenced_sqlite import Encryption, FencedSqliteSaver
from langgraph_fenced_sqlite.testing._helpers import plain_config, values_checkpoint

OLD = "o" * 32
NEW = "n" * 32
SECRET = "a secret worth keeping " * 8
PROBLEM, USAGE = 1, 2

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: Any, tmp_path: Path) -> Iterator[tuple[str, Callable[..., Any]]]:
    """`(--db value, open(**saver options))` of an empty store of each kind."""
    if request.param == "sqlite":
        path = str(tmp_path / "sealed.db")
        FencedSqliteSaver(path).close()
        yield path, lambda **kw: FencedSqliteSaver(path, **kw)
        return
    from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

    dsn = request.getfixturevalue("pg_server").fresh_dsn()
    with FencedPostgresSaver.from_conn_string(dsn) as saver:
        saver.setup()
    yield as_url(dsn), lambda **kw: FencedPostgresSaver.from_conn_string(dsn, **kw)


def _put(saver: Any, thread_id: str) -> None:
    cp = values_checkpoint({"note": SECRET})
    stored = saver.put(plain_config(thread_id), cp, {"source": "input", "step": -1}, {})
    saver.put_writes(stored, [("note", SECRET)], "task")


def _doc(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(done.stdout)


def test_show_takes_the_key_from_the_environment_or_a_key_file(
    store: tuple[str, Callable[..., Any]], cli: Cli, tmp_path: Path
) -> None:
    """With the key, values show; without it, the checkpoint is named as undecodable."""
    db, open_store = store
    with open_store(encryption=Encryption(OLD)) as saver:
        _put(saver, "t")
    shown = _doc(cli("show", "t", "--db", db, "--json", env={"LANGGRAPH_AES_KEY": OLD}))
    assert shown["values"]["note"] == SECRET
    key_file = tmp_path / "keys"
    key_file.write_text(f"{NEW}\n{OLD}\n")
    shown = _doc(cli("show", "t", "--db", db, "--json", "--key-file", str(key_file)))
    assert shown["values"]["note"] == SECRET
    blind = cli("show", "t", "--db", db)
    assert "the value is encrypted" in blind.stdout and SECRET not in blind.stdout
    bad = cli("show", "t", "--db", db, env={"LANGGRAPH_AES_KEY": "short"})
    assert bad.returncode == USAGE and "LANGGRAPH_AES_KEY" in bad.stderr
    lone = cli("show", "t", "--db", db, "--accept-plaintext")
    assert lone.returncode == USAGE and "needs a key" in lone.stderr


def test_rekey_moves_every_cell_and_doctor_counts_them(
    store: tuple[str, Callable[..., Any]], cli: Cli, tmp_path: Path
) -> None:
    """doctor fails while a cell is in clear; rekey --dry-run writes nothing; rekey seals all."""
    db, open_store = store
    with open_store(encryption=Encryption(OLD)) as saver:
        _put(saver, "t")
    with open_store() as saver:  # a process with no key: cells in clear
        _put(saver, "plain")
    old_id, new_id = Encryption(OLD).key_id, Encryption(NEW).key_id
    key_file = tmp_path / "keys"
    key_file.write_text(f"{NEW}\n{OLD}\n")
    keys = ("--key-file", str(key_file))

    before = cli("doctor", "--db", db, "--json", *keys)
    assert before.returncode == PROBLEM, before.stderr
    report = _doc(before)
    assert report["cells"][old_id] > 0 and report["cells"]["clear"] > 0
    assert any("stored in clear" in p for p in report["problems"])

    refused = cli("rekey", "--db", db, "--json", *keys)  # clear cells need --accept-plaintext
    assert refused.returncode == PROBLEM
    assert _doc(refused)["threads"] == ["t"] and _doc(refused)["skipped"]

    dry = _doc(cli("rekey", "--db", db, "--json", "--dry-run", "--accept-plaintext", *keys))
    assert dry["dry_run"] and dry["cells"].get("clear", 0) > 0
    assert _doc(cli("doctor", "--db", db, "--json", *keys))["cells"] == {
        "clear": report["cells"]["clear"],  # the dry run sealed nothing
        new_id: report["cells"][old_id],  # the refused run moved the old key's
    }

    done = cli("rekey", "--db", db, "--json", "--accept-plaintext", *keys)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(_doc(done)["threads"]) == ["plain"]
    after = cli("doctor", "--db", db, "--json", "--key-file", str(key_file))
    assert after.returncode == 0, after.stdout
    assert set(_doc(after)["cells"]) == {new_id}
    shown = cli("show", "plain", "--db", db, "--json", env={"LANGGRAPH_AES_KEY": NEW})
    assert _doc(shown)["values"]["note"] == SECRET
    usage = cli("rekey", "--db", db)  # no key at all
    assert usage.returncode == USAGE and "--key-file" in usage.stderr
