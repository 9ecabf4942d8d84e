"""The PostgreSQL tests' own server, from the pgserver wheel (a machine without the system's).

`find_pg_bin` prefers the system's binaries; a fresh machine with only Python
and pip has none, and gets them from the `pgserver` wheel of the dev extra.
This runs the wheel's binaries for real, from a directory only root can
enter when the tests run as root (a virtualenv under /root, as on CI), so the
copy the server's user is given is what runs.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest
from support.postgres import compressions, large_values, offers_lz4, put_inline

from langgraph_fenced_sqlite.postgres import FencedPostgresSaver
from langgraph_fenced_sqlite.testing._helpers import plain_config, values_checkpoint
from langgraph_fenced_sqlite.testing.postgres_server import PostgresServer, start_server

pytestmark = pytest.mark.subprocess


def wheel_install(into: Path) -> str:
    """Copy the installed pgserver package (and its `.libs`) under `into`; return its bin dir."""
    spec = importlib.util.find_spec("pgserver")
    assert spec is not None and spec.submodule_search_locations, "the dev extra installs pgserver"
    package = Path(next(iter(spec.submodule_search_locations)))
    shutil.copytree(package / "pginstall", into / "pgserver" / "pginstall", symlinks=True)
    libs = package.parent / "pgserver.libs"
    if libs.is_dir():
        shutil.copytree(libs, into / "pgserver.libs")
    return str(into / "pgserver" / "pginstall" / "bin")


def test_a_server_from_the_wheels_binaries_stores_and_reads_back(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    bindir = wheel_install(private)
    server = start_server(bindir)
    try:
        if os.geteuid() == 0:  # the server's user could not enter `private`: it runs a copy
            assert not server.bindir.startswith(str(private))
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        wheel = subprocess.run(
            [os.path.join(bindir, "postgres"), "--version"], capture_output=True, text=True
        ).stdout  # "postgres (PostgreSQL) 16.2"
        assert row is not None and wheel.split()[-1] == row[0]  # the wheel's server answered
        dsn = server.fresh_dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            saver = FencedPostgresSaver(conn)
            saver.setup()
            config = saver.put(plain_config("t"), values_checkpoint({"x": 1}), {}, {})
            got = saver.get_tuple(plain_config("t"))
            assert got is not None and got.config == config
            assert got.checkpoint["channel_values"] == {"x": 1}
            # The wheel's build has no lz4: migration 9 leaves pglz, and large
            # values (inline, as a client before migration 11 stored them)
            # are stored and read back as on any server.
            assert not offers_lz4(server.dsn)
            large = values_checkpoint(large_values(30))
            put_inline(saver, plain_config("t"), large, {})
            got = saver.get_tuple(plain_config("t"))
            assert got is not None and got.checkpoint["channel_values"] == large["channel_values"]
            assert compressions(dsn)[0] == [None, "pglz"]
    finally:
        server.stop()
    assert not os.path.exists(server.datadir)


def test_a_server_runs_with_the_settings_it_was_started_with_and_keeps_them_on_restart() -> None:
    # The tests' servers skip fsync; `bench_postgres.py --durable` asks for a
    # server that syncs as a deployed one does, and must get one.
    def shown(server: PostgresServer, name: str) -> str:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            row = conn.execute(f"SHOW {name}").fetchone()
        assert row is not None
        return str(row[0])

    plain = start_server()
    durable = start_server(settings={"fsync": "on", "full_page_writes": "on"})
    try:
        assert (shown(plain, "fsync"), shown(plain, "full_page_writes")) == ("off", "off")
        assert (shown(durable, "fsync"), shown(durable, "full_page_writes")) == ("on", "on")
        durable.restart()
        assert shown(durable, "fsync") == "on"
    finally:
        plain.stop()
        durable.stop()
