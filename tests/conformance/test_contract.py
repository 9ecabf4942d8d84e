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


# --- the cases FencedPostgresSaver claims, on a real server -------------------------------


def _pg_cases() -> list[Any]:
    from langgraph_fenced_sqlite.testing.postgres_contract import PG_CASES

    by_id = {case.id: case for case, _ in select_cases()}
    return [pytest.param(by_id[case_id], id=case_id) for case_id in PG_CASES]


@pytest.mark.parametrize("api", ["sync", "async"])
@pytest.mark.parametrize("case", _pg_cases())
def test_contract_case_on_postgres(case: Any, api: str, pg_dsn: str, tmp_path: Any) -> None:
    """Each case the PostgreSQL store claims holds on it, through this API."""
    from langgraph_fenced_sqlite.testing.postgres_contract import make_pg_env

    env = make_pg_env(pg_dsn, api=api, directory=str(tmp_path))
    try:
        case.fn(env)
    finally:
        env.close()


def test_every_case_postgres_does_not_claim_is_named_in_the_readme() -> None:
    """The PostgreSQL page's "not claimed" list (docs/postgres.md) names exactly those cases."""
    import re
    from pathlib import Path

    from langgraph_fenced_sqlite.testing.postgres_contract import PG_CASES

    every = {case.id for case, _ in select_cases()}
    assert set(PG_CASES) <= every, set(PG_CASES) - every
    page = (Path(__file__).resolve().parents[2] / "docs" / "postgres.md").read_text()
    section = page.split("<!-- pg-contract-not-claimed -->")[1]
    named = set(re.findall(r"`(\d\d-[a-z0-9_]+)`", section.split("<!-- /pg-contract")[0]))
    assert named == every - set(PG_CASES)
