"""Contract case 38: runs fenced by their run id, with no runner (`fence_runs=True`).

Each case runs real graphs (a subgraph node, so a run writes two namespaces)
through the API under test; the run id travels as LangGraph's Agent Server
sends it, in `config["metadata"]["run_id"]`.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from typing_extensions import TypedDict

from ..core.run_fence import BY_RUN, IDLE_AFTER, RUN_HOLDER
from ..errors import StaleClaim, ThreadBusy
from ._helpers import expect_raised as _expect
from ._helpers import snapshot as _snapshot
from ._helpers import token_of as _token_of
from .harness import AsyncFacade, ContractEnv, contract_case, raw


class _State(TypedDict):
    log: Annotated[list[str], operator.add]


def _graph(saver: Any, *, ask: bool = False, fail: bool = False) -> Any:
    """A root graph whose second node is a subgraph; it may ask (interrupt) or fail."""

    def inner(state: _State) -> dict[str, Any]:
        if fail:
            raise ValueError("the model is down")
        answer = interrupt("go on?") if ask else "inner"
        return {"log": [str(answer)]}

    sub = StateGraph(_State)
    sub.add_node("inner", inner)
    sub.add_edge(START, "inner")
    sub.add_edge("inner", END)
    root = StateGraph(_State)
    root.add_node("first", lambda state: {"log": ["first"]})
    root.add_node("sub", sub.compile())
    root.add_edge(START, "first")
    root.add_edge("first", "sub")
    root.add_edge("sub", END)
    return root.compile(checkpointer=saver)


def _config(thread_id: str, run_id: str | None = None, **configurable: Any) -> Any:
    config: dict[str, Any] = {"configurable": {"thread_id": thread_id, **configurable}}
    if run_id is not None:
        config["metadata"] = {"run_id": run_id}
    return config


def _run(env: ContractEnv, store: Any, graph: Any, inputs: Any, config: Any) -> Any:
    if isinstance(store, AsyncFacade):
        return env.run_async(graph.ainvoke(inputs, config))
    return graph.invoke(inputs, config)


def _runs_started(store: Any, thread_id: str) -> list[tuple[str, int | None]]:
    return [
        (e.data["run_id"], e.token)
        for e in store.events_after(thread_id, 0, 10_000)
        if e.kind == "run_started"
    ]


def _later_run_fences(env: ContractEnv, siblings: bool) -> None:
    a = env.open(fence_runs=True)
    b = env.open(fence_runs=True) if siblings else a
    graph_a, graph_b = _graph(raw(a)), _graph(raw(b))
    # Runs one after another, as a server serialises them, proceed untouched.
    for run_id in ("r1", "r2"):
        _run(env, a, graph_a, {"log": [run_id]}, _config("t", run_id))
    claims = _runs_started(a, "t")
    assert [run for run, _ in claims] == ["r1", "r2"], claims
    assert claims[0][1] is not None and claims[1][1] is not None
    assert claims[0][1] < claims[1][1], "a later run's claim has a newer token"
    claim = a.current_claim("t")
    assert claim is not None and claim.holder == RUN_HOLDER and claim.token == claims[1][1]
    # Every write of a run carries its claim's token, in every namespace.
    namespaces = set()
    for tup in a.list(_config("t")):
        where = tup.config["configurable"]
        namespaces.add(where["checkpoint_ns"].split(":")[0])
        token = _token_of(a, "t", where["checkpoint_id"], where["checkpoint_ns"])
        assert token == dict(claims)[tup.metadata["run_id"]], (where, token)
    assert namespaces == {"", "sub"}, namespaces
    # A third run, from the other store, fences both off: a write of an
    # earlier run lands nothing, whether this process remembers its claim
    # (a: r2) or not (a store that never saw it: r1 from b, or a reopened a).
    _run(env, b, graph_b, {"log": ["r3"]}, _config("t", "r3"))
    before = _snapshot(a, "t")
    for store, graph, run_id in ((a, graph_a, "r2"), (b, graph_b, "r1")):
        exc = _expect(StaleClaim, _run, env, store, graph, {"log": ["late"]}, _config("t", run_id))
        assert exc.current_token == _runs_started(a, "t")[-1][1], exc
    fresh = env.open(fence_runs=True)
    _expect(StaleClaim, _run, env, fresh, _graph(raw(fresh)), {"log": ["x"]}, _config("t", "r2"))
    assert _snapshot(a, "t") == before, "a fenced-off run changed the thread"
    assert _runs_started(a, "t")[-1][0] == "r3"


@contract_case(38)
def case_a_later_run_fences_off_every_earlier_run(env: ContractEnv) -> None:
    """A run's first write claims its thread; a later run's fences every earlier one off."""
    _later_run_fences(env, siblings=False)


@contract_case(38, needs=("sibling",))
def case_a_later_run_fences_off_every_earlier_run_siblings(env: ContractEnv) -> None:
    """Runs on two stores of one file fence each other off by their claims."""
    _later_run_fences(env, siblings=True)


@contract_case(38)
def case_a_runs_claim_yields_to_every_other_writer(env: ContractEnv) -> None:
    """A run's claim is never live: writes without a run id and claims go on; claims fence it."""
    store = env.open(fence_runs=True)
    graph = _graph(raw(store))
    _run(env, store, graph, {"log": ["r1"]}, _config("t", "r1"))
    # A write with no run id (`update_state` from a client) lands as without the option.
    graph.update_state(_config("t"), {"log": ["edited"]})
    assert graph.get_state(_config("t")).values["log"][-1] == "edited"
    # A claim (a lease, a runner) is granted at once and fences the run off...
    claim = store.claim("t", "worker", 60)
    exc = _expect(StaleClaim, _run, env, store, graph, {"log": ["late"]}, _config("t", "r1"))
    assert exc.current_token == claim.token
    # ...and while it is live, a new run is refused, changing nothing.
    before = _snapshot(store, "t")
    busy = _expect(ThreadBusy, _run, env, store, graph, {"log": ["r2"]}, _config("t", "r2"))
    assert busy.holder == "worker"
    assert _snapshot(store, "t") == before
    # Once it is released, the next run claims the thread, and says whom it fenced off.
    store.release("t", claim.token)
    env.clock.advance(1)
    _run(env, store, graph, {"log": ["r2"]}, _config("t", "r2"))
    assert _runs_started(store, "t")[-1][0] == "r2"
    # Without the option, nothing is claimed for a run.
    plain = env.open()
    _run(env, plain, _graph(raw(plain)), {"log": ["r9"]}, _config("u", "r9"))
    assert plain.current_claim("u") is None and _runs_started(plain, "u") == []


@contract_case(38)
def case_a_run_may_start_from_any_checkpoint(env: ContractEnv) -> None:
    """A run fenced by its id may start from an older checkpoint (time travel)."""
    store = env.open(fence_runs=True)
    graph = _graph(raw(store))
    _run(env, store, graph, {"log": ["r1"]}, _config("t", "r1"))
    values = graph.get_state(_config("t")).values
    history = list(graph.get_state_history(_config("t")))
    old = next(s for s in history if s.metadata["step"] == 0).config["configurable"]
    _run(env, store, graph, None, _config("t", "r2", checkpoint_id=old["checkpoint_id"]))
    replayed = [s for s in graph.get_state_history(_config("t")) if s.metadata["run_id"] == "r2"]
    assert replayed and replayed[-1].parent_config["configurable"] == old, replayed
    assert graph.get_state(_config("t")).values == values  # the same steps, run again


@contract_case(38)
def case_a_runs_lifecycle_reaches_the_log_and_its_status(env: ContractEnv) -> None:
    """`run_started` per run; an interrupt or an error ends it in the log; status agrees."""
    store = env.open(fence_runs=True)
    asking = _graph(raw(store), ask=True)
    _run(env, store, asking, {"log": ["r1"]}, _config("t", "r1"))
    status = store.thread_status("t")
    assert status.state == "interrupted" and status.run_id == "r1", status
    kinds = [e.kind for e in store.events_after("t", 0, 10_000)]
    assert kinds[0] == "run_started" and kinds.count("run_interrupted") == 1, kinds
    started = store.events_after("t", 0, 1)[0]
    assert started.data["strategy"] == BY_RUN and started.data["holder"] == RUN_HOLDER
    # The resume is a new run: running while it writes, idle once it has not
    # written for `idle_after` seconds (LangGraph does not say when a run ends).
    _run(env, store, asking, Command(resume="yes"), _config("t", "r2"))
    status = store.thread_status("t")
    assert status.state == "running" and status.run_id == "r2", status
    assert asking.get_state(_config("t")).values["log"][-1] == "yes"
    env.clock.advance(IDLE_AFTER + 1)
    status = store.thread_status("t")
    assert status.state == "idle" and status.failure is None, status
    # An error write fails the run, with its error in the log and the status.
    failing = _graph(raw(store), fail=True)
    _expect(ValueError, _run, env, store, failing, {"log": ["r3"]}, _config("u", "r3"))
    failed = [e for e in store.events_after("u", 0, 10_000) if e.kind == "run_failed"]
    assert len(failed) == 1 and failed[0].data["error"] == "ValueError", failed
    assert failed[0].data["run_id"] == "r3"
    env.clock.advance(IDLE_AFTER + 1)
    status = store.thread_status("u")
    assert status.state == "failed" and status.run_id == "r3", status
    assert status.reason == "ValueError: the model is down", status.reason
    listed = {t["thread_id"]: t["status"]["state"] for t in store.threads()}
    assert listed == {"t": "idle", "u": "failed"}, listed
