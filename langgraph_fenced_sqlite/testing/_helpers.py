"""Helpers shared by the contract case modules, one section per family of cases.

Each family of cases was written with its own small helpers, and the
families' helpers that look alike are not interchangeable (different
signatures, checkpoint ids, channel versions, failure messages), so each
section serves only its own modules. The case modules import these under
their old local names (`from ._helpers import plain_config as _config`).
Helpers one module alone uses stay in that module.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint
from langgraph.checkpoint.base.id import uuid6

from ..core.claims import TOKEN_KEY, Claim
from .harness import ContractEnv, raw

# --- cases 1-7, 29, 30 (cases_store, cases_input) --------------------------------------

_E = TypeVar("_E", bound=BaseException)

# A call taking no arguments. Spelled `...` because many of these are lambdas
# that bind a loop value as a default (`lambda b=bad: ...`), and mypy cannot
# infer such a lambda against `Callable[[], Any]` (python/mypy#15459).
AnyCall = Callable[..., Any]


def plain_config(thread_id: str, ns: str = "", checkpoint_id: str | None = None) -> RunnableConfig:
    conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def values_checkpoint(values: dict[str, Any] | None = None) -> Checkpoint:
    cp = empty_checkpoint()
    cp["channel_values"] = dict(values or {})
    cp["channel_versions"] = {k: f"{1:032}.0" for k in cp["channel_values"]}
    return cp


def put_chain(
    store: Any, thread_id: str, n: int, *, ns: str = "", config: RunnableConfig | None = None
) -> list[str]:
    """Put `n` checkpoints as one chain (each the parent of the next); return their ids."""
    config = config or plain_config(thread_id, ns)
    ids = []
    for step in range(n):
        cp = values_checkpoint({"step": step})
        stored = store.put(config, cp, {"source": "loop", "step": step, "parents": {}}, {})
        config = {**config, "configurable": {**config["configurable"], **stored["configurable"]}}
        ids.append(cp["id"])
    return ids


def expect_error(fn: AnyCall, errors: type[_E] | tuple[type[_E], ...]) -> _E:
    """Call `fn`; return the error it raised, failing if it raised none of `errors`."""
    try:
        fn()
    except errors as exc:
        return exc
    raise AssertionError(f"expected {errors}, got no error")


def dump(path: str) -> list[tuple[Any, ...]]:
    """Read every row of every table of `path` with plain sqlite3 (a fingerprint)."""
    conn = sqlite3.connect(path)
    try:
        out: list[tuple[Any, ...]] = []
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in sorted(tables):
            out.extend((table, *r) for r in conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2"))
        return out
    finally:
        conn.close()


# --- cases 8-18 (cases_claims, cases_fencing) -------------------------------------------


def named_checkpoint(checkpoint_id: str, value: Any = None) -> Checkpoint:
    cp = empty_checkpoint()
    cp["id"] = checkpoint_id
    cp["channel_values"] = {} if value is None else {"value": value}
    return cp


def claim_config(
    thread_id: str,
    *,
    claim: Claim | None = None,
    token: int | None = None,
    parent: str | None = None,
    ns: str = "",
) -> dict[str, Any]:
    """A put/put_writes config: fenced by `claim` (or a bare `token`), else unfenced."""
    conf: dict[str, Any] = {"checkpoint_ns": ns}
    if parent is not None:
        conf["checkpoint_id"] = parent
    if claim is not None:
        return claim.config(**conf)  # type: ignore[return-value]
    conf["thread_id"] = thread_id
    if token is not None:
        conf[TOKEN_KEY] = token
    return {"configurable": conf}


def put_named(
    store: Any,
    thread_id: str,
    checkpoint_id: str,
    *,
    parent: str | None = None,
    source: str = "loop",
    step: int = 0,
    claim: Claim | None = None,
    token: int | None = None,
    ns: str = "",
) -> None:
    config = claim_config(thread_id, claim=claim, token=token, parent=parent, ns=ns)
    metadata = {"source": source, "step": step, "parents": {}}
    store.put(config, named_checkpoint(checkpoint_id, checkpoint_id), metadata, {})


def expect_raised(
    errors: type[BaseException], fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    """Call `fn(*args, **kwargs)`; return the error of type `errors` it raised, else fail."""
    try:
        result = fn(*args, **kwargs)
    except errors as exc:
        return exc
    raise AssertionError(f"expected {errors.__name__}, got {result!r}")


def snapshot(store: Any, thread_id: str) -> tuple[Any, ...]:
    """Everything a thread holds: checkpoints (with writes), events, claim, counter."""
    return (
        list(store.list({"configurable": {"thread_id": thread_id}})),
        store.events_after(thread_id, 0, 10_000),
        store.current_claim(thread_id),
        raw(store).stats()["token_counter"],
    )


def latest_id(store: Any, thread_id: str, ns: str = "") -> str | None:
    found = store.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}})
    return None if found is None else found.config["configurable"]["checkpoint_id"]


def token_of(store: Any, thread_id: str, checkpoint_id: str, ns: str = "") -> int | None:
    found = raw(store).inspect_checkpoint(thread_id, checkpoint_ns=ns, checkpoint_id=checkpoint_id)
    assert found is not None, f"{checkpoint_id} is not stored"
    return found["token"]


def store_pair(env: ContractEnv, siblings: bool) -> tuple[Any, Any]:
    first = env.open()
    return first, (env.open() if siblings else first)


# --- cases 19-28 (cases_events, cases_history) ------------------------------------------


def step_checkpoint(step: int, values: dict[str, Any] | None = None) -> Checkpoint:
    cp = empty_checkpoint()
    cp["id"] = str(uuid6(clock_seq=step))
    cp["channel_values"] = dict(values or {})
    cp["channel_versions"] = {k: 1 for k in cp["channel_values"]}
    return cp


def token_config(
    thread_id: str, cid: str | None, token: int | None, ns: str = ""
) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
    if cid is not None:
        conf["checkpoint_id"] = cid
    if token is not None:
        conf[TOKEN_KEY] = token
    return {"configurable": conf}


def put_step(
    store: Any,
    thread_id: str,
    parent: str | None,
    *,
    token: int | None = None,
    ns: str = "",
    source: str = "loop",
    step: int = 0,
    values: dict[str, Any] | None = None,
    parents: dict[str, str] | None = None,
    checkpoint_id: str | None = None,
) -> str:
    cp = step_checkpoint(step, values)
    cp["id"] = checkpoint_id or cp["id"]
    metadata = {"source": source, "step": step, "parents": parents or {}}
    store.put(token_config(thread_id, parent, token, ns), cp, metadata, {})
    return cp["id"]


def raises(exc_type: type[BaseException], fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    try:
        fn(*args, **kw)
    except exc_type as exc:
        return exc
    raise AssertionError(f"{getattr(fn, '__name__', fn)} did not raise {exc_type.__name__}")


def event_seqs(events: list[Any]) -> list[int]:
    return [e.seq for e in events]


# --- cases 30, 34, 35 (cases_input, cases_edges_data): planting rows ----------------------


def plant(path: str, sql: str, params: tuple[Any, ...] = (), *, reseal: bool = False) -> None:
    """Change rows of `path` with plain sqlite3, as damage or an attacker would.

    Args:
        path: The database file.
        sql: One statement; it must change at least one row.
        params: Its parameters.
        reseal: Then give every row a valid checksum again, as a forger who
            knows the format would: what lies behind the checksum is tested.
    """
    from ..core.checksums import checksum
    from ..sqlite import schema

    conn = sqlite3.connect(path)
    try:
        conn.create_function(schema.CHECKSUM_FUNCTION, -1, checksum, deterministic=True)
        assert conn.execute(sql, params).rowcount >= 1, sql
        if reseal:
            for statement in schema.BACKFILL_CHECKSUMS:
                conn.execute(statement)
        conn.commit()
    finally:
        conn.close()


async def longest_loop_stall(work: Callable[[], Awaitable[Any]]) -> float:
    """Await `work()` while a ticker task runs on the loop; return the longest gap between ticks.

    A tick is due every 10 ms, so a gap much longer than that is time the
    event loop was blocked (docs/semantics.md §8: no async method blocks it).
    """
    gaps: list[float] = []
    stop = asyncio.Event()

    async def tick() -> None:
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.05)
    try:
        await work()
    finally:
        stop.set()
        await ticker
    return max(gaps, default=0.0)
