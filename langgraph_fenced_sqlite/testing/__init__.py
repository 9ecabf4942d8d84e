"""The shipped contract suite and test helpers for `langgraph_fenced_sqlite`.

Cases are plain functions taking a `ContractEnv`; run them all with
`run_contract(make_env)` or parametrize pytest with `select_cases()`.
"""

from ..clock import ManualClock
from .harness import (
    CAPABILITIES,
    CASES,
    AsyncFacade,
    Case,
    ContractEnv,
    ContractReport,
    contract_case,
    make_env,
    raw,
    run_contract,
    select_cases,
)

__all__ = [
    "CAPABILITIES",
    "CASES",
    "AsyncFacade",
    "Case",
    "ContractEnv",
    "ContractReport",
    "ManualClock",
    "contract_case",
    "make_env",
    "raw",
    "run_contract",
    "select_cases",
]
