"""The checkpointer LangGraph's Agent Server takes from `langgraph.json`, on a fenced store.

`langgraph dev` (langgraph-api) loads a custom checkpointer from the
`checkpointer.path` of `langgraph.json`; a dotted path names an object of
an installed module, so nothing needs to be copied into the project:

    "checkpointer": {"path": "langgraph_fenced_sqlite.agent_server.checkpointer"}

Invariant: one saver per process and store. The server enters
`checkpointer()` once per event loop that needs a checkpointer (its main
loop, and each background worker's loop under `BG_JOB_ISOLATED_LOOPS=true`);
every entry gets the same saver, which is closed when the last entry whose
event loop still runs exits (the server never exits its worker loops'
entries, and those loops are idle by its shutdown), or at the interpreter's
exit, so the file is left closed, its WAL folded. A process forked
meanwhile opens its own. The saver rebuilds the classes of the
deployment's own graph modules (named as the server names them, from the
graphs it loads) and what `$LGFS_ALLOW` names; nothing else is ever rebuilt.
Bad configuration is an `InvalidArgument` naming the variable, raised before
any store is opened.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import functools
import json
import logging
import os
import re
import threading
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from .core.encryption import KEY_ENV, OLD_KEYS_ENV, Encryption
from .core.serde import DataOnlySerializer
from .core.user_types import ALLOW_ENV, parse_allow
from .errors import FencedSqliteError, bad_argument
from .sqlite.saver import FencedSqliteSaver

if TYPE_CHECKING:
    from .postgres.saver import FencedPostgresSaver

__all__ = ["Settings", "checkpointer", "graph_modules"]

logger = logging.getLogger(__name__)

# The variables the factory reads. `LGFS_PATH` and `LGFS_ALLOW` (`ALLOW_ENV`) mean what
# they mean to `lgfs`, so one environment serves the server and the operator's CLI alike.
PATH_ENV = "LGFS_PATH"  # the SQLite file, or a postgresql:// URL
BUSY_TIMEOUT_ENV = "LGFS_BUSY_TIMEOUT"  # seconds (SQLite's busy_timeout)
FENCE_RUNS_ENV = "LGFS_FENCE_RUNS"  # "true" (the default) or "false"
# Encryption at rest, with the variables `lgfs` reads: LangGraph's key (its
# presence turns encryption on), older keys, and reading cells in clear.
ACCEPT_PLAINTEXT_ENV = "LGFS_ACCEPT_PLAINTEXT"  # "false" (the default) or "true"
# Set by langgraph-api's `run_server` from langgraph.json's "graphs" (read, never set here).
GRAPHS_ENV = "LANGSERVE_GRAPHS"
# Every `LGFS_*` variable something reads; any other is a misspelling, refused.
_KNOWN = frozenset(
    {PATH_ENV, ALLOW_ENV, BUSY_TIMEOUT_ENV, FENCE_RUNS_ENV, OLD_KEYS_ENV, ACCEPT_PLAINTEXT_ENV}
)
_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}

_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")
_KEYWORDS = re.compile(r"\w+\s*=")  # libpq's "host=... dbname=..." form
_URL_SCHEMES = ("postgresql://", "postgres://")
# Graph files the server hands to its JavaScript runtime, not to Python.
_JS = (".ts", ".mts", ".cts", ".js", ".mjs", ".cjs", ".tsx", ".jsx")


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the factory opens: a store and the saver's options.

    Each field is one saver option, read from one variable by `from_env`.
    Two equal settings share one saver in a process.

    Attributes:
        location: The SQLite file, or a `postgresql://` / `postgres://` URL
            (`$LGFS_PATH`).
        allowed_types: `(module, name)` classes the saver rebuilds (the
            `MODULE:NAME` entries of `$LGFS_ALLOW`).
        allowed_modules: Modules whose classes the saver rebuilds: the
            deployment's graph modules (`graph_modules`) and the packages
            `$LGFS_ALLOW` names.
        busy_timeout: SQLite's `busy_timeout` in seconds (`$LGFS_BUSY_TIMEOUT`);
            None keeps the saver's default.
        fence_runs: Each run claims its thread with its first write, fencing
            off every earlier run (`$LGFS_FENCE_RUNS`, on unless "false").
        keys: The encryption keyring, current key first (`$LANGGRAPH_AES_KEY`,
            then `$LGFS_AES_OLD_KEYS`); empty: values are stored in clear.
        accept_plaintext: Read values stored in clear, with a keyring
            (`$LGFS_ACCEPT_PLAINTEXT`: while migrating a store to encryption).
    """

    location: str
    allowed_types: tuple[tuple[str, ...], ...] = ()
    allowed_modules: tuple[str, ...] = ()
    busy_timeout: float | None = None
    fence_runs: bool = True
    keys: tuple[str, ...] = dataclasses.field(default=(), repr=False)
    accept_plaintext: bool = False

    @property
    def postgres(self) -> bool:
        """Whether `location` names a PostgreSQL database."""
        return self.location.startswith(_URL_SCHEMES)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read the settings from the environment (`os.environ` unless given).

        Args:
            environ: The variables to read.

        Returns:
            The settings: the store `$LGFS_PATH` names, and as allowed modules
            the server's graph modules (from `$LANGSERVE_GRAPHS`) and the
            entries of `$LGFS_ALLOW`.

        Raises:
            InvalidArgument: naming the variable: `LGFS_PATH` unset, naming
                a file in a missing directory or a libpq `key=value` string
                (PostgreSQL is named by URL), a malformed `LGFS_ALLOW` or
                `LGFS_BUSY_TIMEOUT`, `LGFS_FENCE_RUNS` or `LGFS_ACCEPT_PLAINTEXT`
                not true or false, a key that is not 32 bytes, an unknown
                `LGFS_*` variable (a misspelling), `LANGSERVE_GRAPHS` not a
                JSON object.
        """
        env = os.environ if environ is None else environ
        unknown = sorted(k for k in env if k.startswith("LGFS_") and k not in _KNOWN)
        if unknown:
            raise bad_argument(
                unknown[0],
                f"not a variable langgraph-fenced-sqlite reads; expected {sorted(_KNOWN)}",
            )
        location = env.get(PATH_ENV, "")
        if _KEYWORDS.match(location):
            # A libpq "host=... dbname=..." string would otherwise name a SQLite file.
            raise bad_argument(
                PATH_ENV,
                "looks like a libpq key=value string; name PostgreSQL by URL "
                "(postgresql://USER@HOST:PORT/DB), or a file whose name has no '='",
            )
        if not location.strip():
            raise bad_argument(
                PATH_ENV,
                "not set: name the SQLite file (a path, relative to the server's working "
                'directory) or a postgresql:// URL, e.g. in langgraph.json\'s "env"',
            )
        types, modules = parse_allow(env.get(ALLOW_ENV, ""), ALLOW_ENV)
        try:  # the serializer's own checks, restated as the variable's
            DataOnlySerializer(types, allowed_modules=modules)
        except FencedSqliteError as exc:
            raise bad_argument(ALLOW_ENV, str(exc)) from exc
        graphs = _graphs(env.get(GRAPHS_ENV))
        postgres = location.startswith(_URL_SCHEMES)
        settings = cls(
            # A file by its absolute path: "app.db" and "./app.db" share one saver.
            location=location if postgres else os.path.abspath(location),
            allowed_types=tuple(sorted(set(types))),
            allowed_modules=tuple(sorted(set(modules) | set(graph_modules(graphs)))),
            busy_timeout=_seconds(env.get(BUSY_TIMEOUT_ENV), BUSY_TIMEOUT_ENV),
            fence_runs=_bool(env.get(FENCE_RUNS_ENV), FENCE_RUNS_ENV, default=True),
            keys=_keys(env),
            accept_plaintext=_bool(
                env.get(ACCEPT_PLAINTEXT_ENV), ACCEPT_PLAINTEXT_ENV, default=False
            ),
        )
        settings._check()
        return settings

    def _check(self) -> None:
        if self.postgres:
            if self.busy_timeout is not None:
                raise bad_argument(BUSY_TIMEOUT_ENV, "applies to a SQLite file only")
            return
        folder = os.path.dirname(self.location)
        if not os.path.isdir(folder):
            raise bad_argument(
                PATH_ENV, f"{self.location!r}: the directory {folder!r} does not exist"
            )

    def saver_options(self) -> dict[str, Any]:
        """Return the keyword arguments the saver is opened with."""
        options: dict[str, Any] = {
            "allowed_types": self.allowed_types,
            "allowed_modules": self.allowed_modules,
            "fence_runs": self.fence_runs,
        }
        if self.keys:
            current, *old = self.keys
            options["encryption"] = Encryption(
                current, old_keys=old, accept_plaintext=self.accept_plaintext
            )
        if self.busy_timeout is not None:
            options["busy_timeout"] = self.busy_timeout
        return options


def _graphs(text: str | None) -> Mapping[str, Any]:
    if not text:
        return {}
    try:
        graphs = json.loads(text)
    except ValueError as exc:
        raise bad_argument(GRAPHS_ENV, f"not JSON: {exc}") from exc
    if not isinstance(graphs, dict):
        raise bad_argument(GRAPHS_ENV, "expected a JSON object (langgraph.json's graphs)")
    return graphs


def _keys(env: Mapping[str, str]) -> tuple[str, ...]:
    """The keyring the variables name (checked now, so a bad key stops the start)."""
    if not env.get(KEY_ENV):
        if env.get(OLD_KEYS_ENV):
            raise bad_argument(OLD_KEYS_ENV, f"older keys need the current one in {KEY_ENV}")
        return ()
    Encryption.from_env(environ=env)  # InvalidArgument naming the variable
    return (env[KEY_ENV], *(k for k in env.get(OLD_KEYS_ENV, "").split(",") if k))


def _bool(text: str | None, variable: str, *, default: bool) -> bool:
    if text is None or not text.strip():
        return default
    value = _BOOLS.get(text.strip().lower())
    if value is None:
        raise bad_argument(variable, f"expected true or false, got {text!r}")
    return value


def _seconds(text: str | None, variable: str) -> float | None:
    if text is None or not text.strip():
        return None
    try:
        seconds = float(text)
    except ValueError:
        raise bad_argument(variable, f"expected seconds, got {text!r}") from None
    if not (0 < seconds < float("inf")):
        raise bad_argument(variable, f"must be positive and finite, got {text!r}")
    return seconds


def graph_modules(graphs: Mapping[str, Any]) -> list[str]:
    """Return the names of the modules the Agent Server imports the graphs of `graphs` as.

    The server's own rule (langgraph-api's `graph._graph_from_spec`): a graph
    given by file (`"./src/agent.py:graph"`, any source with a `/`) is
    imported under a name made from its path: `/` becomes `__`, `.py` is
    dropped, spaces become `_` and leading dots go, so `./src/agent.py` is
    module `__src__agent`. A graph given by module (`"my_agent.graph:graph"`)
    is that module. JavaScript graphs are left out. A name that is not a
    dotted Python name (a file called `my-graph.py`) is left out too, and
    logged: its classes are rebuilt only by `MODULE:NAME` in `$LGFS_ALLOW`.

    Args:
        graphs: langgraph.json's `"graphs"`: id -> `"path:variable"`, or
            id -> `{"path": "path:variable", ...}`.

    Returns:
        The module names, sorted, each once.
    """
    found: set[str] = set()
    for graph_id, spec in graphs.items():
        source = spec.get("path") if isinstance(spec, Mapping) else spec
        if not isinstance(source, str) or ":" not in source:
            continue  # the server refuses it itself, naming the graph
        where = source.rsplit(":", 1)[0]
        if "/" not in where:
            name = where
        elif where.endswith(_JS):
            continue
        else:
            name = where.replace("/", "__").replace(".py", "").replace(" ", "_").lstrip(".")
        if _MODULE.match(name):
            found.add(name)
        else:
            logger.warning(
                "graph %r: its module %r is not a Python module name, so the classes it "
                "defines are not rebuilt after a restart; rename the file, or list them "
                "in $%s as MODULE:NAME",
                graph_id,
                name,
                ALLOW_ENV,
            )
    return sorted(found)


# --- one saver per process and store ------------------------------------------------------


@dataclasses.dataclass
class _Shared:
    saver: FencedSqliteSaver | FencedPostgresSaver
    stack: contextlib.ExitStack
    # The event loop of each entry not yet exited (a loop entered twice, twice).
    users: list[asyncio.AbstractEventLoop] = dataclasses.field(default_factory=list)

    def waiting_for(self) -> list[asyncio.AbstractEventLoop]:
        # An entry whose loop no longer runs cannot be inside its `async with`
        # doing anything: it was left suspended (the server's worker loops, run
        # one run at a time and never exited) and is not waited for.
        return [loop for loop in self.users if loop.is_running()]


_LOCK = threading.Lock()
_SHARED: dict[tuple[int, Settings], _Shared] = {}


def _open(settings: Settings) -> _Shared:
    stack = contextlib.ExitStack()
    saver: FencedSqliteSaver | FencedPostgresSaver
    if settings.postgres:
        from .postgres.saver import FencedPostgresSaver

        saver = stack.enter_context(
            FencedPostgresSaver.from_conn_string(settings.location, **settings.saver_options())
        )
        try:
            saver.setup()
        except BaseException:
            stack.close()
            raise
    else:
        saver = stack.enter_context(
            FencedSqliteSaver.from_conn_string(settings.location, **settings.saver_options())
        )
    logger.info(
        "langgraph-fenced-sqlite: serving %s; rebuilding the classes of %s",
        saver.path,
        list(settings.allowed_modules) + [":".join(t) for t in settings.allowed_types],
    )
    return _Shared(saver, stack)


def _acquire(
    settings: Settings, loop: asyncio.AbstractEventLoop
) -> FencedSqliteSaver | FencedPostgresSaver:
    key = (os.getpid(), settings)
    with _LOCK:
        shared = _SHARED.get(key)
        if shared is None:
            shared = _SHARED[key] = _open(settings)
        shared.users.append(loop)
        return shared.saver


def _release(settings: Settings, saver: object, loop: asyncio.AbstractEventLoop) -> None:
    key = (os.getpid(), settings)
    with _LOCK:
        shared = _SHARED.get(key)
        if shared is None or shared.saver is not saver:
            return  # closed already (at exit)
        shared.users.remove(loop)
        if shared.waiting_for():
            return
        del _SHARED[key]
    if shared.users:
        logger.info(
            "langgraph-fenced-sqlite: closing %s; %d entries on stopped event loops never exited",
            shared.saver.path,
            len(shared.users),
        )
    shared.stack.close()


@atexit.register
def _close_all() -> None:
    # What is left at a normal exit (a user that never exited its entry). The
    # Agent Server ends on SIGTERM by raising the signal again once shut down,
    # which runs no atexit hook: there the last exit above closes the saver.
    pid = os.getpid()
    with _LOCK:
        mine = [key for key in _SHARED if key[0] == pid]
        left = [_SHARED.pop(key) for key in mine]
    for shared in left:
        with contextlib.suppress(Exception):  # at exit: nobody left to report to
            shared.stack.close()


def _give_back(
    settings: Settings, loop: asyncio.AbstractEventLoop, acquired: asyncio.Future[Any]
) -> None:
    if not acquired.cancelled() and acquired.exception() is None:
        args = (settings, acquired.result(), loop)
        threading.Thread(target=_release, args=args, daemon=True).start()


@contextlib.asynccontextmanager
async def checkpointer(
    settings: Settings | None = None,
) -> AsyncIterator[FencedSqliteSaver | FencedPostgresSaver]:
    """Yield this process's saver on the store `$LGFS_PATH` names: what `langgraph.json` names.

    `"checkpointer": {"path": "langgraph_fenced_sqlite.agent_server.checkpointer"}`.
    Every entry in a process with equal settings gets the same saver (one
    per event loop is how the server enters it); the saver is closed when
    the last entry whose event loop still runs exits, or when the process
    exits.

    Args:
        settings: What to open; `Settings.from_env()` if None (the server
            calls it with no argument).

    Yields:
        A `FencedSqliteSaver` on the file, or a set-up `FencedPostgresSaver`
        on the database.

    Raises:
        InvalidArgument: bad configuration, naming the variable.
        StoreError: the store cannot be opened.
    """
    # Off the event loop, all of it: the checks touch the file system, and langgraph
    # dev's blockbuster fails a run whose loop makes a blocking call (even os.getcwd).
    if settings is None:
        settings = await asyncio.to_thread(Settings.from_env)
    loop = asyncio.get_running_loop()
    acquiring = asyncio.ensure_future(asyncio.to_thread(_acquire, settings, loop))
    try:
        saver = await asyncio.shield(acquiring)
    except asyncio.CancelledError:
        # The thread acquires all the same: give back what it gets, off this loop.
        acquiring.add_done_callback(functools.partial(_give_back, settings, loop))
        raise
    try:
        yield saver
    finally:
        await asyncio.to_thread(_release, settings, saver, loop)
