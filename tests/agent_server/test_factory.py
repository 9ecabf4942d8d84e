"""`langgraph_fenced_sqlite.agent_server`: its settings, its naming of graph modules, one saver.

The settings come from the environment and bad ones are `InvalidArgument`s
naming the variable; the graph modules are named as the installed server
names them (checked against langgraph-api's own loader, in a child process,
where a store then rebuilds the module's types with no configuration); every
entry in a process shares one saver, closed when the last running entry
exits, or at the interpreter's exit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.agent_server import GRAPH, GRAPH_MODULE

from langgraph_fenced_sqlite import FencedSqliteSaver, InvalidArgument, StoreClosed, UndecodableRow
from langgraph_fenced_sqlite.agent_server import Settings, checkpointer, graph_modules

CONFIG: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
KEY, OLD_KEY = "k" * 32, "o" * 32  # AES-256 keys, as LANGGRAPH_AES_KEY holds them


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """An environment naming a file in `tmp_path`, plus `extra`."""
    return {"LGFS_PATH": str(tmp_path / "app.db"), **extra}


# --- settings -------------------------------------------------------------------------------


def test_settings_read_the_store_and_the_allow_list(tmp_path: Path) -> None:
    graphs = json.dumps({"agent": "./src/agent.py:graph", "other": {"path": "pkg.graphs:g"}})
    settings = Settings.from_env(
        env(tmp_path, LGFS_ALLOW="myapp, other.mod:Thing", LANGSERVE_GRAPHS=graphs)
    )
    assert settings.location == str(tmp_path / "app.db") and not settings.postgres
    assert settings.allowed_modules == ("__src__agent", "myapp", "pkg.graphs")
    assert settings.allowed_types == (("other.mod", "Thing"),)
    assert settings.busy_timeout is None
    assert settings.fence_runs, "runs are fenced by their id unless turned off"
    assert Settings.from_env(env(tmp_path, LGFS_BUSY_TIMEOUT="2.5")).saver_options() == {
        "allowed_types": (),
        "allowed_modules": (),
        "fence_runs": True,
        "busy_timeout": 2.5,
    }
    off = Settings.from_env(env(tmp_path, LGFS_FENCE_RUNS="false"))
    assert off.saver_options()["fence_runs"] is False
    url = "postgresql://app@db:5432/app"
    assert Settings.from_env({"LGFS_PATH": url}).postgres


@pytest.mark.parametrize(
    "variables,variable",
    [
        ({"LGFS_PATH": None}, "LGFS_PATH"),
        ({"LGFS_PATH": "  "}, "LGFS_PATH"),
        ({"LGFS_PATH": "/no/such/dir/app.db"}, "LGFS_PATH"),
        ({"LGFS_PATH": "host=127.0.0.1 dbname=app"}, "LGFS_PATH"),
        ({"LGFS_ALLOW": "mod:"}, "LGFS_ALLOW"),
        ({"LGFS_ALLOW": "a:b:c"}, "LGFS_ALLOW"),
        ({"LGFS_ALLOW": "not-a-module"}, "LGFS_ALLOW"),
        ({"LGFS_BUSY_TIMEOUT": "soon"}, "LGFS_BUSY_TIMEOUT"),
        ({"LGFS_BUSY_TIMEOUT": "-1"}, "LGFS_BUSY_TIMEOUT"),
        ({"LGFS_BUSY_TIMEOUT": "inf"}, "LGFS_BUSY_TIMEOUT"),
        ({"LGFS_PATH": "postgresql://db/app", "LGFS_BUSY_TIMEOUT": "1"}, "LGFS_BUSY_TIMEOUT"),
        ({"LGFS_FENCE_RUNS": "maybe"}, "LGFS_FENCE_RUNS"),
        ({"LANGGRAPH_AES_KEY": "short"}, "LANGGRAPH_AES_KEY"),
        ({"LANGGRAPH_AES_KEY": KEY, "LGFS_AES_OLD_KEYS": "short"}, "LGFS_AES_OLD_KEYS"),
        ({"LGFS_AES_OLD_KEYS": KEY}, "LGFS_AES_OLD_KEYS"),  # older keys, no current one
        ({"LGFS_ACCEPT_PLAINTEXT": "sometimes"}, "LGFS_ACCEPT_PLAINTEXT"),
        ({"LGFS_PTAH": "x.db"}, "LGFS_PTAH"),  # a misspelling is never ignored
        ({"LANGSERVE_GRAPHS": "{not json"}, "LANGSERVE_GRAPHS"),
        ({"LANGSERVE_GRAPHS": "[]"}, "LANGSERVE_GRAPHS"),
    ],
)
def test_bad_settings_name_the_variable(
    tmp_path: Path, variables: dict[str, str | None], variable: str
) -> None:
    given = {k: v for k, v in {**env(tmp_path), **variables}.items() if v is not None}
    with pytest.raises(InvalidArgument) as caught:
        Settings.from_env(given)
    assert caught.value.argument == variable
    assert str(caught.value).startswith(f"{variable}: ")


async def test_a_key_in_the_environment_seals_what_the_factorys_saver_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LangGraph's `LANGGRAPH_AES_KEY` (and lgfs's older keys) turn encryption at rest on."""
    monkeypatch.setenv("LGFS_PATH", str(tmp_path / "app.db"))
    monkeypatch.setenv("LANGGRAPH_AES_KEY", KEY)
    monkeypatch.setenv("LGFS_AES_OLD_KEYS", OLD_KEY)
    settings = Settings.from_env()
    assert settings.keys == (KEY, OLD_KEY) and KEY not in repr(settings)
    checkpoint: Any = {
        "v": 1,
        "id": "1ef4f797-8335-6428-8001-8a1503f9b875",
        "ts": "2024-07-31",
        "channel_values": {"note": "private words " * 4},
        "channel_versions": {"note": "1"},
        "versions_seen": {},
    }
    async with checkpointer() as saver:
        await saver.aput(CONFIG, checkpoint, {}, {"note": "1"})
        found = await saver.aget_tuple(CONFIG)
        assert found is not None and found.checkpoint["channel_values"]["note"].startswith("priv")
        cells = await saver.acell_keys()
        assert cells.clear == 0 and sum(cells.cells.values()) > 0, cells
    with FencedSqliteSaver(str(tmp_path / "app.db")) as keyless:
        with pytest.raises(UndecodableRow):
            keyless.get_tuple(CONFIG)
    assert b"private words" not in (tmp_path / "app.db").read_bytes()


async def test_the_factory_reads_the_environment_and_refuses_before_opening(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LGFS_PATH", raising=False)
    with pytest.raises(InvalidArgument, match="^LGFS_PATH: not set"):
        async with checkpointer():
            pass
    monkeypatch.setenv("LGFS_PATH", str(tmp_path / "app.db"))
    async with checkpointer() as saver:
        assert saver.path == str(tmp_path / "app.db")
        assert saver.fence_runs


# --- the server's module names ----------------------------------------------------------------


@pytest.mark.parametrize(
    "spec,module",
    [
        ("./src/typed.py:graph", "__src__typed"),  # langgraph.json's usual form
        ("./agent.py:graph", "__agent"),
        ("src/agent/graph.py:make_graph", "src__agent__graph"),
        ("/deps/app/src/graph.py:graph", "__deps__app__src__graph"),  # langgraph build's paths
        ({"path": "./src/typed.py:graph", "description": "typed"}, "__src__typed"),
        ("my_agent.graph:graph", "my_agent.graph"),  # a module: its own name
        ("./ui/agent.ts:graph", None),  # JavaScript: not Python's
        ("./graph.py", None),  # no variable: the server refuses it
    ],
)
def test_graph_modules_follow_the_servers_naming(spec: Any, module: str | None) -> None:
    assert graph_modules({"g": spec}) == ([module] if module else [])


def test_a_graph_module_that_is_no_python_name_is_logged_and_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="langgraph_fenced_sqlite.agent_server"):
        assert graph_modules({"g": "./src/my-graph.py:graph"}) == []
    assert "__src__my-graph" in caplog.text and "LGFS_ALLOW" in caplog.text


# What a child runs in a deployment's directory: langgraph-api's own loader imports the
# graph file, a saver stores the file's dataclass, and a fresh saver (a restart) with the
# factory's settings reads it back, where one without them refuses it.
LOADER = """
import json, os, sys
os.environ.update(REDIS_URI="fake", DATABASE_URI=":memory:", MIGRATIONS_PATH="__inmem")
from langgraph_api.graph import GraphSpec, _graph_from_spec
from langgraph_fenced_sqlite import FencedSqliteSaver, UndecodableRow
from langgraph_fenced_sqlite.agent_server import Settings

graph = _graph_from_spec(GraphSpec("typed", path="./src/typed.py", variable="graph"))
module = sys.modules[graph.builder.state_schema.__module__]  # the name the server gave it
order = module.Order("sku-1", 2, module.Priority.HIGH)
config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
checkpoint = {"v": 1, "id": "1ef4f797-8335-6428-8001-8a1503f9b875", "ts": "2024-07-31",
              "channel_values": {"order": order}, "channel_versions": {}, "versions_seen": {}}
with FencedSqliteSaver("app.db") as writer:
    writer.put(config, checkpoint, {}, {})
settings = Settings.from_env()
with FencedSqliteSaver("app.db", **settings.saver_options()) as reader:
    read = reader.get_tuple(config).checkpoint["channel_values"]["order"]
with FencedSqliteSaver("app.db") as plain:
    try:
        plain.get_tuple(config)
        refused = None
    except UndecodableRow as exc:
        refused = str(exc)
print(json.dumps({"module": type(order).__module__, "allowed": settings.allowed_modules,
                  "rebuilt": read == order and type(read) is type(order), "refused": refused}))
"""


@pytest.mark.subprocess
def test_the_servers_own_loader_names_the_module_the_factory_allows(tmp_path: Path) -> None:
    """langgraph-api imports `./src/typed.py` as `__src__typed`; the factory allows exactly it."""
    pytest.importorskip("langgraph_api")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "typed.py").write_text(GRAPH)
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("LGFS_")}
    child_env.update(
        LGFS_PATH="app.db", LANGSERVE_GRAPHS=json.dumps({"typed": "./src/typed.py:graph"})
    )
    done = subprocess.run(
        [sys.executable, "-c", LOADER],
        cwd=tmp_path,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["module"] == GRAPH_MODULE
    assert found["allowed"] == [GRAPH_MODULE]
    assert found["rebuilt"] is True
    assert f"type {GRAPH_MODULE}." in found["refused"] and "is not allowed" in found["refused"]


# --- one saver per process ----------------------------------------------------------------------


class LoopThread:
    """An event loop running in its own thread, as the server's worker loops do."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        """Run `coro` on the loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


@pytest.fixture
def loops() -> Iterator[list[LoopThread]]:
    """Two running event loops in two threads; stopped and closed at teardown."""
    made = [LoopThread(), LoopThread()]
    yield made
    for each in made:
        each.close()


def closed(saver: Any) -> bool:
    try:
        saver.get_tuple(CONFIG)
    except StoreClosed:
        return True
    return False


def test_every_entry_shares_one_saver_closed_when_the_last_exits(
    tmp_path: Path, loops: list[LoopThread]
) -> None:
    """Entries on several loops get one saver; it closes only when the last one exits."""
    settings = Settings.from_env(env(tmp_path))
    entries = [checkpointer(settings) for _ in loops]
    first, second = (each.run(cm.__aenter__()) for each, cm in zip(loops, entries, strict=True))
    assert first is second
    loops[0].run(entries[0].__aexit__(None, None, None))
    assert not closed(second)  # the other entry still uses it
    loops[1].run(entries[1].__aexit__(None, None, None))
    assert closed(first)
    assert not (tmp_path / "app.db-wal").exists()  # closed cleanly: the WAL folded away

    async def again() -> bool:
        async with checkpointer(settings) as fresh:
            return fresh is not first and not closed(fresh)

    assert loops[0].run(again())  # a later entry opens a new one


def test_an_entry_left_on_a_stopped_loop_does_not_keep_the_saver_open(tmp_path: Path) -> None:
    """The server's worker loops run one run at a time and never exit their entries."""
    settings = Settings.from_env(env(tmp_path))
    worker = asyncio.new_event_loop()
    try:
        left = checkpointer(settings)
        shared = worker.run_until_complete(left.__aenter__())  # then the loop stops

        async def lifespan() -> Any:
            async with checkpointer(settings) as saver:
                assert saver is shared
                return saver

        asyncio.run(lifespan())
        assert closed(shared)
        assert not (tmp_path / "app.db-wal").exists()
    finally:
        worker.close()


async def test_an_entry_cancelled_while_opening_gives_the_saver_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread that opens the store runs on after a cancel; what it gets is released."""
    from langgraph_fenced_sqlite import agent_server

    settings = Settings.from_env(env(tmp_path))
    go, opened = threading.Event(), []
    real = agent_server._acquire

    def slow_acquire(*args: Any) -> Any:
        go.wait(30)
        opened.append(real(*args))
        return opened[-1]

    monkeypatch.setattr(agent_server, "_acquire", slow_acquire)

    async def enter() -> None:
        async with checkpointer(settings):
            raise AssertionError("never entered")

    task = asyncio.ensure_future(enter())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    go.set()
    for _ in range(600):
        if opened and closed(opened[0]):
            break
        await asyncio.sleep(0.05)
    assert opened and closed(opened[0])


async def test_different_settings_get_different_savers(tmp_path: Path) -> None:
    one = Settings.from_env(env(tmp_path))
    other = Settings.from_env({"LGFS_PATH": str(tmp_path / "other.db")})
    async with checkpointer(one) as a, checkpointer(other) as b, checkpointer(one) as c:
        assert a is c and a is not b
        assert (a.path, b.path) == (str(tmp_path / "app.db"), str(tmp_path / "other.db"))


HOLDER = """
import asyncio, os, sys, threading
from langgraph_fenced_sqlite.agent_server import checkpointer
config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
checkpoint = {"v": 1, "id": "1ef4f797-8335-6428-8001-8a1503f9b875", "ts": "2024-07-31",
              "channel_values": {"a": "x" * 10000}, "channel_versions": {}, "versions_seen": {}}

async def hold(entered):
    async with checkpointer() as saver:
        saver.put(config, checkpoint, {}, {})
        entered.set()
        await asyncio.sleep(3600)  # never exits: its loop still runs at exit

entered = threading.Event()
threading.Thread(target=asyncio.run, args=(hold(entered),), daemon=True).start()
entered.wait(30)
async def main():
    async with checkpointer():
        pass
asyncio.run(main())
assert os.path.getsize(os.environ["LGFS_PATH"] + "-wal") > 0  # still open here
"""


@pytest.mark.subprocess
def test_what_is_left_open_is_closed_at_exit(tmp_path: Path) -> None:
    """An entry that never exits (its loop still running) is closed by the interpreter's exit."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("LGFS_")}
    child_env["LGFS_PATH"] = str(tmp_path / "app.db")
    done = subprocess.run(
        [sys.executable, "-c", HOLDER], env=child_env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "app.db-wal").exists()


# --- PostgreSQL -------------------------------------------------------------------------------


def url_of(dsn: str) -> str:
    """The `postgresql://` URL of a libpq key=value DSN (the factory takes URLs, as `lgfs`)."""
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(dsn)
    options = {"options": parts["options"]} if "options" in parts else {}
    query = urllib.parse.urlencode(options, quote_via=urllib.parse.quote)
    return f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}" + (
        f"?{query}" if query else ""
    )


@pytest.mark.slow
async def test_a_postgresql_url_opens_a_set_up_fenced_postgres_saver(pg_dsn: str) -> None:
    from langgraph_fenced_sqlite.postgres import FencedPostgresSaver

    settings = Settings.from_env({"LGFS_PATH": url_of(pg_dsn)})
    async with checkpointer(settings) as saver, checkpointer(settings) as same:
        assert isinstance(saver, FencedPostgresSaver) and same is saver
        checkpoint: Any = {
            "v": 1,
            "id": "1ef4f797-8335-6428-8001-8a1503f9b875",
            "ts": "2024-07-31",
            "channel_values": {"a": 1},
            "channel_versions": {},
            "versions_seen": {},
        }
        await saver.aput(CONFIG, checkpoint, {}, {})
        found = await saver.aget_tuple(CONFIG)
        assert found is not None and found.checkpoint["channel_values"] == {"a": 1}
    assert closed(saver)
