"""Contract cases 1-7, 29 and 30: the store, history, bad input, hostile rows."""

from __future__ import annotations

from ..errors import StoreClosed
from .harness import ContractEnv, contract_case, raw


@contract_case(6)
def case_close_twice_then_calls_raise_store_closed(env: ContractEnv) -> None:
    """`close()` twice is fine; any call after it raises `StoreClosed`."""
    store = env.open()
    raw(store).close()
    raw(store).close()
    try:
        store.get_tuple({"configurable": {"thread_id": "t"}})
    except StoreClosed:
        pass
    else:
        raise AssertionError("get_tuple after close() did not raise StoreClosed")
