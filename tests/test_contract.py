"""Run the shipped contract suite against the sync and the async API."""

from __future__ import annotations

from typing import Any

import pytest

from langgraph_fenced_sqlite.testing import make_env, select_cases

_PARAMS = [
    pytest.param(
        case,
        id=case.id,
        marks=[pytest.mark.slow, pytest.mark.subprocess] if "processes" in case.needs else [],
    )
    for case, _skip in select_cases()
]


@pytest.mark.parametrize("api", ["sync", "async"])
@pytest.mark.parametrize("case", _PARAMS)
def test_contract_case(case: Any, api: str, tmp_path: Any) -> None:
    """Each contract case holds through this API."""
    env = make_env(str(tmp_path), api=api)
    try:
        case.fn(env)
    finally:
        env.close()
