"""Contract cases 8-18: claims, tokens and fenced writes."""

from __future__ import annotations

from ..errors import ThreadBusy
from .harness import ContractEnv, contract_case


@contract_case(8)
def case_claim_is_exclusive_until_expiry(env: ContractEnv) -> None:
    """A live claim refuses every other claim, the same holder's included."""
    store = env.open()
    granted = store.claim("t", "alice", 10)
    assert granted.holder == "alice"
    assert granted.expires_at == env.clock.now() + 10
    for holder in ("bob", "alice"):
        try:
            store.claim("t", holder, 10)
        except ThreadBusy as exc:
            assert exc.holder == "alice", exc.holder
        else:
            raise AssertionError(f"{holder} claimed a thread alice holds")
