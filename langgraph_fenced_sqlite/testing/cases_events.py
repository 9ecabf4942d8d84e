"""Contract cases 19-28: the event log, retraction, retention and deletion."""

from __future__ import annotations

from .harness import ContractEnv, contract_case


@contract_case(21)
def case_events_after_unknown_thread_is_empty(env: ContractEnv) -> None:
    """`events_after` on a thread never written returns []."""
    store = env.open()
    assert store.events_after("never-written", 0, 10) == []
