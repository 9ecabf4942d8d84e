"""LangGraph's real Agent Server (`langgraph dev`) on the shipped factory, driven by langgraph-sdk.

One deployment (`support.agent_server.project`: a `langgraph.json` naming
`langgraph_fenced_sqlite.agent_server.checkpointer`, a graph whose state holds
the deployment's own dataclass, pydantic model and enum), served with a loop
per background worker (`BG_JOB_ISOLATED_LOOPS=true`, the case where the
server enters the factory more than once): runs, streams, an interrupt and
its resume, history paged with the server's `before` down to the first
checkpoint, the four multitask strategies and both cancel actions, every
run fenced by its id as `lgfs` shows it; then a restart, after which the
threads holding the user's types still read, resume and run; then `lgfs
doctor` on the store. Once on a SQLite file, once on PostgreSQL (a fresh
schema of the session's server, by `postgresql://` URL).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.agent_server import GRAPH_ID, Server, project
from support.postgres import as_url
from support.processes import lgfs, parsed

langgraph_sdk = pytest.importorskip("langgraph_sdk")
pytest.importorskip("langgraph_api")  # langgraph-cli[inmem], in the dev extra

from langgraph_sdk.errors import ConflictError, NotFoundError  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

Client = Any  # langgraph_sdk's SyncLangGraphClient


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the deployment keeps its checkpoints: `$LGFS_PATH`, a file or a `postgresql://`
    URL of a fresh schema of the session's PostgreSQL server."""
    if request.param == "postgres":
        return as_url(request.getfixturevalue("pg_dsn"))
    return str(tmp_path / "app.db")


@pytest.fixture
def server(tmp_path: Path, store: str) -> Iterator[Server]:
    """The deployment served by `langgraph dev`; its process group is always ended."""
    served = Server(project(tmp_path / "project", store))
    try:
        served.start()
        yield served
    finally:
        served.stop()


def wait_until(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Return `check()`'s first true result, polling; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def history(client: Client, thread: str) -> list[dict[str, Any]]:
    """Every checkpoint of `thread`, newest first."""
    return list(client.threads.get_history(thread, limit=1000))


def run_ids(client: Client, thread: str) -> set[str]:
    """The run ids the thread's checkpoints carry."""
    return {h["metadata"].get("run_id") for h in history(client, thread)}


def held_run(client: Client, thread: str, gate: Path) -> str:
    """Start a run that waits at `gate` and return its id once it has written a checkpoint."""
    run = client.runs.create(
        thread, GRAPH_ID, input={"text": "held"}, config={"configurable": {"gate": str(gate)}}
    )
    run_id = str(run["run_id"])
    wait_until(lambda: run_id in run_ids(client, thread), f"run {run_id}'s first checkpoint")
    return run_id


def gone(client: Client, thread: str, run_id: str) -> bool:
    """Whether the server has deleted the run (as a rollback does)."""
    try:
        client.runs.get(thread, run_id)
    except NotFoundError:
        return True
    return False


# --- what one server run checks -----------------------------------------------------------


def check_wait_and_stream(client: Client) -> str:
    thread = client.threads.create()["thread_id"]
    result = client.runs.wait(thread, GRAPH_ID, input={"text": "first"})
    assert result["customer"]["orders"] == [{"sku": "first", "quantity": 2, "priority": "high"}]
    assert result["approved"] is True and result["steps"] == 2
    chunks = list(
        client.runs.stream(thread, GRAPH_ID, input={"text": "second"}, stream_mode="values")
    )
    values = [c.data for c in chunks if c.event == "values"]
    assert values[-1]["steps"] == 4
    assert [o["sku"] for o in values[-1]["customer"]["orders"]] == ["first", "second"]
    return str(thread)


def check_interrupt_and_resume(client: Client) -> str:
    thread = client.threads.create()["thread_id"]
    result = client.runs.wait(thread, GRAPH_ID, input={"text": "ask-1"})
    assert result["__interrupt__"][0]["value"] == {"question": "approve?"}
    state = client.threads.get_state(thread)
    assert state["next"] == ["review"]
    resumed = client.runs.wait(thread, GRAPH_ID, command={"resume": False})
    assert resumed["approved"] is False and resumed["steps"] == 2
    # Left waiting again, for the restart to resume.
    client.runs.wait(thread, GRAPH_ID, input={"text": "ask-2"})
    assert client.threads.get_state(thread)["next"] == ["review"]
    return str(thread)


def check_fenced(client: Client, store: str, thread: str) -> None:
    """Each of the server's runs claimed the thread with its first write (`fence_runs`)."""
    runs = sorted(client.runs.list(thread), key=lambda r: r["created_at"])
    events = parsed(lgfs("events", thread, "--json", "--limit", "1000", "--db", store))
    started = [(e["data"]["run_id"], e["token"]) for e in events if e["kind"] == "run_started"]
    assert [run for run, _ in started] == [r["run_id"] for r in runs], (started, runs)
    tokens = [token for _, token in started]
    assert tokens == sorted(set(tokens)), "each run has a newer token than the one before"
    # Both interrupted runs logged it; the status agrees with the server's.
    assert [e["data"]["run_id"] for e in events if e["kind"] == "run_interrupted"] == [
        runs[0]["run_id"],
        runs[2]["run_id"],
    ]
    threads = parsed(lgfs("threads", "--json", "--db", store))
    status = next(t["status"] for t in threads if t["thread_id"] == thread)
    assert client.threads.get(thread)["status"] == status["state"] == "interrupted"
    assert status["run_id"] == runs[-1]["run_id"] and status["token"] == tokens[-1]


def check_history_paging(client: Client, thread: str) -> None:
    everything = [h["checkpoint"]["checkpoint_id"] for h in history(client, thread)]
    assert len(everything) >= 8
    paged: list[str] = []
    page = client.threads.get_history(thread, limit=3)
    while page:
        paged += [h["checkpoint"]["checkpoint_id"] for h in page]
        # The server's own `before`: the checkpoint's key, with no "configurable".
        page = client.threads.get_history(thread, limit=3, before=page[-1]["checkpoint"])
    assert paged == everything
    assert history(client, thread)[-1]["parent_checkpoint"] is None  # down to the first


def check_multitask(client: Client, gates: Path) -> None:
    thread = client.threads.create()["thread_id"]

    # reject: refused while a run holds the thread.
    held = held_run(client, thread, gates / "reject")
    with pytest.raises(ConflictError):
        client.runs.create(thread, GRAPH_ID, input={"text": "x"}, multitask_strategy="reject")
    # enqueue: runs once the held run has finished.
    queued = client.runs.create(
        thread, GRAPH_ID, input={"text": "queued"}, multitask_strategy="enqueue"
    )
    assert client.runs.get(thread, queued["run_id"])["status"] == "pending"
    (gates / "reject").touch()
    client.runs.join(thread, queued["run_id"])
    assert client.runs.get(thread, held)["status"] == "success"
    assert client.runs.get(thread, queued["run_id"])["status"] == "success"
    assert client.threads.get_state(thread)["values"]["steps"] == 4

    # interrupt: the held run stops, keeping what it wrote; the new one runs.
    held = held_run(client, thread, gates / "never")
    new = client.runs.create(thread, GRAPH_ID, input={"text": "i"}, multitask_strategy="interrupt")
    client.runs.join(thread, new["run_id"])
    assert client.runs.get(thread, held)["status"] == "interrupted"
    assert client.runs.get(thread, new["run_id"])["status"] == "success"
    assert held in run_ids(client, thread)

    # rollback: the held run and its checkpoints are deleted (adelete_for_runs).
    held = held_run(client, thread, gates / "never")
    new = client.runs.create(thread, GRAPH_ID, input={"text": "r"}, multitask_strategy="rollback")
    client.runs.join(thread, new["run_id"])
    wait_until(lambda: gone(client, thread, held), f"rolled-back run {held} deleted")
    wait_until(lambda: held not in run_ids(client, thread), f"run {held}'s checkpoints deleted")

    # cancel, interrupt: the run stops, its checkpoints kept.
    held = held_run(client, thread, gates / "never")
    client.runs.cancel(thread, held, wait=True, action="interrupt")
    assert client.runs.get(thread, held)["status"] == "interrupted"
    assert held in run_ids(client, thread)

    # cancel, rollback: the run and its checkpoints are deleted.
    held = held_run(client, thread, gates / "never")
    client.runs.cancel(thread, held, wait=True, action="rollback")
    wait_until(lambda: gone(client, thread, held), f"cancelled run {held} deleted")
    wait_until(lambda: held not in run_ids(client, thread), f"run {held}'s checkpoints deleted")

    # The thread still runs, from the last checkpoint that was kept.
    result = client.runs.wait(thread, GRAPH_ID, input={"text": "after"})
    assert result["customer"]["orders"][-1]["sku"] == "after"


def check_after_restart(client: Client, served: str, waiting: str) -> None:
    # langgraph dev's own thread list is a pickle in .langgraph_api/ that holds the
    # threads' values; with the deployment's classes in them, langgraph-api 0.16.7
    # cannot load it back (it reads it before importing the graphs) and starts empty.
    # The threads' checkpoints are in the store: naming a thread brings it back.
    for thread in (served, waiting):
        client.threads.create(thread_id=thread, if_exists="do_nothing")
    # The first read of each thread decodes what the previous process wrote: the
    # graph module's dataclass, model and enum, rebuilt with no configuration.
    result = client.runs.wait(served, GRAPH_ID, input={"text": "third"})
    assert [o["sku"] for o in result["customer"]["orders"]] == ["first", "second", "third"]
    assert result["steps"] == 6
    state = client.threads.get_state(served)
    assert state["values"]["customer"]["orders"][0] == {
        "sku": "first",
        "quantity": 2,
        "priority": "high",
    }
    older = history(client, served)  # the previous process's checkpoints included
    assert [o["sku"] for o in older[4]["values"]["customer"]["orders"]] == ["first", "second"]
    resumed = client.runs.wait(waiting, GRAPH_ID, command={"resume": True})
    assert resumed["approved"] is True and resumed["customer"]["orders"][-1]["sku"] == "ask-2"


def test_the_agent_server_serves_from_the_shipped_factory(
    server: Server, store: str, tmp_path: Path
) -> None:
    """Runs, streams, interrupts, history paging and multitasking; a restart; a healthy store."""
    gates = tmp_path / "gates"
    gates.mkdir()
    with langgraph_sdk.get_sync_client(url=server.url, api_key=None) as client:
        served = check_wait_and_stream(client)
        waiting = check_interrupt_and_resume(client)
        check_fenced(client, store, waiting)
        check_history_paging(client, served)
        check_multitask(client, gates)

    # A restart: the server stops as an operator stops it, and the store is left
    # closed (one saver for all the server's event loops, closed at its shutdown).
    assert server.stop() in (0, -15)  # shut down, not killed (uvicorn re-raises SIGTERM)
    assert server.log_text().count("langgraph-fenced-sqlite: serving") == 1
    if not store.startswith("postgres"):
        wal = Path(store + "-wal")
        assert not wal.exists() or wal.stat().st_size == 0, "the WAL was left unfolded"
    server.start()
    with langgraph_sdk.get_sync_client(url=server.url, api_key=None) as client:
        check_after_restart(client, served, waiting)
    server.stop()

    doctor = lgfs("doctor", "--json", "--db", store)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert parsed(doctor)["ok"] is True
