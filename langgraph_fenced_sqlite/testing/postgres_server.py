"""A throwaway PostgreSQL server for tests: `initdb` + `pg_ctl` in a temp dir.

Invariant: every server this module starts listens on 127.0.0.1 only (no
Unix socket), on a port nobody else had, in a directory nobody else uses,
and is stopped by `stop()` (also from `atexit`, so an interpreter that ends
without calling it leaves no server behind). Several processes (pytest-xdist
workers) may each start their own at once: nothing is shared between them.

PostgreSQL refuses to run as root; as root, the server runs as the `postgres`
user (or `nobody`) through `subprocess`'s `user=`/`group=`, with its directory
owned by that user.

The binaries are the system's when it has them, else those of the `pgserver`
wheel (the dev extra installs it), so that a machine with only Python and
pip runs the PostgreSQL tests too.

`start_replica` makes a hot standby of a running server (`pg_basebackup -R`
over a streaming-replication connection, about a second), for the tests of
stores that read from a replica.
"""

from __future__ import annotations

import atexit
import glob
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "PostgresServer",
    "find_pg_bin",
    "round_trips",
    "start_replica",
    "start_server",
    "wait_replayed",
]

# The settings a test server runs with. fsync=off trades durability across an
# OS crash (which no test makes) for speed; a killed postmaster loses nothing,
# since synchronous_commit stays on and committed WAL is in the OS's cache.
_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "unix_socket_directories": "",
    "fsync": "off",
    "full_page_writes": "off",
    "shared_buffers": "32MB",
    "max_connections": "100",
    "max_prepared_transactions": "0",
    "log_min_messages": "warning",
    # No autovacuum worker's transactions in `pg_stat_database.xact_commit`,
    # which tests read to count a store's commits; a throwaway server's
    # tables never grow enough to need it.
    "autovacuum": "off",
}


def find_pg_bin() -> str:
    """Return the directory holding `initdb`, `pg_ctl` and `postgres`.

    Looks on PATH first, then under `/usr/lib/postgresql/*/bin` (Debian's
    `postgresql` package puts them there, not on PATH), newest version first,
    then in the `pgserver` wheel's install (found without importing it: its
    import has side effects, and only its files are needed).

    Raises:
        FileNotFoundError: no PostgreSQL server binaries were found.
    """
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return os.path.dirname(os.path.realpath(found))

    def version(path: str) -> tuple[int, ...]:
        name = path.split("/")[-2]
        return tuple(int(p) for p in name.split(".") if p.isdigit())

    for bindir in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        if os.path.exists(os.path.join(bindir, "initdb")):
            return bindir
    spec = importlib.util.find_spec("pgserver")
    for root in (spec.submodule_search_locations or []) if spec else []:
        bindir = os.path.join(root, "pginstall", "bin")
        if os.path.exists(os.path.join(bindir, "initdb")):
            return bindir
    raise FileNotFoundError(
        "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH, under "
        "/usr/lib/postgresql/*/bin or in the pgserver wheel; install them "
        "(Debian: apt-get install postgresql; or pip install pgserver)"
    )


def _reachable_by_all(path: str) -> bool:
    """Whether every directory on the way to `path` lets any user through."""
    path = os.path.realpath(path)
    while True:
        if not os.stat(path).st_mode & 0o001:
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def _copy_install(bindir: str, dest: str) -> str:
    """Copy the install around `bindir` into `dest`; return the copy's bin directory.

    For binaries the server's user cannot reach (a wheel inside a virtualenv
    under /root, say). Copied: the install's bin, lib and share (what initdb
    and postgres look up beside their own directory) and, for a wheel, the
    shared libraries auditwheel put beside its package (`<package>.libs`,
    which the binaries' rpath names relative to themselves), in the same
    layout.
    """
    install = os.path.dirname(os.path.realpath(bindir))  # .../pgserver/pginstall
    package = os.path.dirname(install)  # .../pgserver
    site = os.path.dirname(package)
    copy_install = os.path.join(dest, os.path.basename(package), os.path.basename(install))
    for part in ("bin", "lib", "share"):
        if os.path.isdir(os.path.join(install, part)):
            shutil.copytree(os.path.join(install, part), os.path.join(copy_install, part))
    libs = os.path.join(site, os.path.basename(package) + ".libs")
    if os.path.isdir(libs):
        shutil.copytree(libs, os.path.join(dest, os.path.basename(libs)))
    os.chmod(dest, 0o755)
    return os.path.join(copy_install, "bin")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_as() -> tuple[int, int] | None:
    """Return the (uid, gid) to run the server as when we are root, else None."""
    if os.geteuid() != 0:
        return None
    import pwd

    for name in ("postgres", "nobody"):
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            continue
        return pw.pw_uid, pw.pw_gid
    raise RuntimeError("running as root, and neither a 'postgres' nor a 'nobody' user exists")


@dataclass
class PostgresServer:
    """A running throwaway server; `dsn` connects to its `postgres` database as `lgfs`."""

    bindir: str
    datadir: str
    port: int
    run_as: tuple[int, int] | None
    _stopped: bool = field(default=False, repr=False)
    # The settings it runs with: `_SETTINGS` and `start_server(settings=...)`.
    settings: dict[str, str] = field(default_factory=lambda: dict(_SETTINGS), repr=False)

    @property
    def dsn(self) -> str:
        """The libpq connection string of the server's `postgres` database."""
        return f"host=127.0.0.1 port={self.port} user=lgfs dbname=postgres"

    def _cmd(self, *args: str, check: bool = True, timeout: float = 60) -> None:
        user: int | None = None
        group: int | None = None
        extra_groups: list[int] | None = None
        if self.run_as is not None:
            user, group = self.run_as
            extra_groups = []
        subprocess.run(
            args,
            check=check,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=self.datadir,
            user=user,
            group=group,
            extra_groups=extra_groups,
        )

    def restart(self, mode: str = "immediate") -> None:
        """Stop the server with `pg_ctl stop -m mode` and start it again on the same port."""
        self._cmd(self._pg_ctl, "stop", "-D", self._pgdata, "-m", mode, "-w")
        self._start()

    @property
    def _pg_ctl(self) -> str:
        return os.path.join(self.bindir, "pg_ctl")

    @property
    def _pgdata(self) -> str:
        return os.path.join(self.datadir, "data")

    def _start(self) -> None:
        options = " ".join(f"-c {k}={v!s}" if v else f"-c {k}=''" for k, v in self.settings.items())
        self._cmd(
            self._pg_ctl,
            "start",
            "-D",
            self._pgdata,
            "-w",
            "-t",
            "60",
            "-l",
            os.path.join(self.datadir, "server.log"),
            "-o",
            f"-p {self.port} {options}",
        )

    def stop(self) -> None:
        """Stop the server (immediately: nothing of it is kept) and remove its directory."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self._cmd(
                self._pg_ctl, "stop", "-D", self._pgdata, "-m", "immediate", "-w", check=False
            )
        finally:
            shutil.rmtree(self.datadir, ignore_errors=True)

    def fresh_dsn(self) -> str:
        """Create a new, empty schema and return a DSN whose connections use only it.

        Much faster than a database per test (no template copy), and just as
        separate for a store whose SQL names no schema.
        """
        import secrets

        import psycopg
        from psycopg.conninfo import make_conninfo

        # Not uuid4: a test under test may patch it (LangGraph's do).
        name = f"t_{secrets.token_hex(8)}"
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {name}")
        return make_conninfo(self.dsn, options=f"-c search_path={name}")

    def log(self) -> str:
        """Return the server's log so far (for a failing test's message)."""
        try:
            with open(os.path.join(self.datadir, "server.log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""


def start_server(
    bindir: str | None = None, *, attempts: int = 3, settings: dict[str, str] | None = None
) -> PostgresServer:
    """Create a cluster in a new temp dir and start it on a free loopback port.

    Takes about a second. The superuser is `lgfs`, trusted on 127.0.0.1 only.

    Args:
        bindir: Where the binaries are (default: `find_pg_bin()`).
        attempts: How many free ports to try (another process may take the
            one picked between the pick and the server's bind).
        settings: Server settings over the test defaults (which run with
            `fsync=off`): e.g. `{"fsync": "on", "full_page_writes": "on"}`
            for a server as durable as a deployed one.

    Raises:
        FileNotFoundError: no binaries.
        subprocess.CalledProcessError: initdb or the server failed (stderr attached).
    """
    bindir = bindir or find_pg_bin()
    run_as = _run_as()
    # Directly under the system temp dir: as root, the server's user must be
    # able to reach it, and pytest's own temp dirs are private to root.
    datadir = tempfile.mkdtemp(prefix="lgfs-pg-")
    if run_as is not None:
        os.chown(datadir, *run_as)
        if not _reachable_by_all(bindir):
            bindir = _copy_install(bindir, os.path.join(datadir, "install"))
    server = PostgresServer(bindir, datadir, 0, run_as)
    server.settings.update(settings or {})
    try:
        server._cmd(
            os.path.join(bindir, "initdb"),
            "-D",
            server._pgdata,
            "-U",
            "lgfs",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-locale",
            "--no-sync",
        )
        for attempt in range(attempts):
            server.port = _free_port()
            try:
                server._start()
                break
            except subprocess.CalledProcessError:
                if attempt == attempts - 1:
                    raise RuntimeError(f"PostgreSQL did not start:\n{server.log()}") from None
                time.sleep(0.1)
    except BaseException:
        server.stop()
        raise
    atexit.register(server.stop)
    return server


def start_replica(primary: PostgresServer, *, attempts: int = 3) -> PostgresServer:
    """Start a hot standby of `primary`, streaming its WAL, on a free loopback port.

    `pg_basebackup -R` copies the primary's cluster into a new temp dir
    (streaming the WAL it needs, no checkpoint wait) and writes the standby's
    `primary_conninfo`; the copy then starts as a read-only hot standby. The
    primary needs nothing set: its defaults (`wal_level=replica`,
    `max_wal_senders`, initdb's trusted replication entries for 127.0.0.1)
    allow it.

    Raises:
        subprocess.CalledProcessError: the base backup failed (stderr attached).
        RuntimeError: the standby did not start.
    """
    datadir = tempfile.mkdtemp(prefix="lgfs-pg-replica-")
    if primary.run_as is not None:
        os.chown(datadir, *primary.run_as)
    replica = PostgresServer(primary.bindir, datadir, 0, primary.run_as)
    replica.settings = dict(primary.settings)  # as durable as its primary
    try:
        replica._cmd(
            os.path.join(primary.bindir, "pg_basebackup"),
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            "lgfs",
            "-D",
            replica._pgdata,
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "--no-sync",
        )
        for attempt in range(attempts):
            replica.port = _free_port()
            try:
                replica._start()
                break
            except subprocess.CalledProcessError:
                if attempt == attempts - 1:
                    raise RuntimeError(f"the standby did not start:\n{replica.log()}") from None
    except BaseException:
        replica.stop()
        raise
    atexit.register(replica.stop)
    return replica


def wait_replayed(primary: PostgresServer, replica: PostgresServer, timeout: float = 30) -> None:
    """Return once `replica` has replayed everything `primary` had committed when called.

    Raises:
        TimeoutError: not within `timeout` seconds (the replica's log attached).
    """
    import psycopg

    with psycopg.connect(primary.dsn, autocommit=True) as conn:
        target = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
    deadline = time.monotonic() + timeout
    with psycopg.connect(replica.dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)
            ).fetchone()
            if row is not None and row[0]:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"replica not at {target} in {timeout}s:\n{replica.log()}")
            time.sleep(0.005)


def round_trips(conn: Any, call: Callable[[], Any]) -> int:
    """Run `call`; return how many times the client waited for the server on `conn`.

    Counted from libpq's protocol trace (a frontend message followed by a
    backend one is one wait), so the figure does not depend on load; the
    tests pin it and `benchmarks/bench_postgres.py` reports it.
    """
    fd, path = tempfile.mkstemp(suffix=".trace")
    try:
        conn.pgconn.trace(fd)
        try:
            call()
        finally:
            conn.pgconn.untrace()
        with open(path) as f:
            senders = [line.split("\t")[1] for line in f if line.count("\t") >= 2]
    finally:
        os.close(fd)
        os.unlink(path)
    return sum(1 for a, b in zip(senders, senders[1:], strict=False) if (a, b) == ("F", "B"))
