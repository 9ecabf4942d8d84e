"""`core/retention.py`'s expiry rule (`judge_expiry`) and options, which both stores apply.

The stores' transactions around it are checked by contract case 41 and the
per-store tests; here, the rule on the facts alone, damaged cells included.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from langgraph_fenced_sqlite import Expiry, InvalidArgument, ThreadTTL
from langgraph_fenced_sqlite.core.retention import PARKED, ExpiryFacts, judge_expiry

NOW = 1_000_000.0
DEFAULT = ThreadTTL(100, "keep_latest")


def facts(**overrides: Any) -> ExpiryFacts:
    base: dict[str, Any] = {
        "ttl": None,
        "strategy": None,
        "seen": None,
        "last_checkpoint_at": NOW - 500,
        "last_event_at": NOW - 400,
        "live": False,
    }
    return ExpiryFacts(**{**base, **overrides})


def test_activity_is_the_newest_checkpoint_or_event() -> None:
    assert judge_expiry(facts(last_event_at=NOW - 50), DEFAULT, NOW)[0] == "schedule"
    verdict, rule, activity = judge_expiry(facts(), DEFAULT, NOW)
    assert (verdict, rule, activity) == ("expire", DEFAULT, NOW - 400)
    assert judge_expiry(facts(last_checkpoint_at=None), DEFAULT, NOW)[0] == "expire"


def test_due_exactly_at_activity_plus_ttl() -> None:
    at = facts(last_checkpoint_at=NOW - 100, last_event_at=None)
    assert judge_expiry(at, DEFAULT, NOW)[0] == "expire"
    assert judge_expiry(at, DEFAULT, NOW - 0.001)[0] == "schedule"


def test_a_threads_own_ttl_overrides_the_default() -> None:
    own = facts(ttl=1000.0, strategy="delete")
    assert judge_expiry(own, DEFAULT, NOW)[0] == "schedule"
    verdict, rule, _ = judge_expiry(own, DEFAULT, NOW + 1000)
    assert verdict == "expire" and rule == ThreadTTL(1000.0, "delete")


def test_no_ttl_parked_or_bare_threads_are_not_expired() -> None:
    assert judge_expiry(facts(), None, NOW)[0] == "skip"
    assert judge_expiry(facts(seen=PARKED), DEFAULT, NOW)[0] == "skip"
    bare = facts(last_checkpoint_at=None, last_event_at=None)
    assert judge_expiry(bare, DEFAULT, NOW)[0] == "park"


def test_a_live_claim_keeps_a_due_thread() -> None:
    assert judge_expiry(facts(live=True), DEFAULT, NOW)[0] == "busy"
    assert judge_expiry(facts(live=True, last_event_at=NOW), DEFAULT, NOW)[0] == "schedule"


def test_a_seen_thread_not_written_since_is_not_rescheduled() -> None:
    written = NOW - 10
    seen = facts(seen=written, last_checkpoint_at=written, last_event_at=written)
    assert judge_expiry(seen, DEFAULT, NOW)[0] == "skip"  # nothing to write


def test_damaged_cells_fall_back_to_the_default_or_count_as_never() -> None:
    odd = facts(strategy="archive", ttl=5.0)
    assert judge_expiry(odd, DEFAULT, NOW)[1] == DEFAULT
    text = facts(last_checkpoint_at="yesterday", last_event_at=NOW - 500)
    assert judge_expiry(text, DEFAULT, NOW)[2] == NOW - 500


def test_options_take_seconds_or_timedeltas_and_refuse_the_rest() -> None:
    assert Expiry(default_ttl=timedelta(days=1)).default == ThreadTTL(86400.0, "delete")
    assert Expiry().default is None
    assert ThreadTTL(timedelta(minutes=1)).seconds == 60.0
    with pytest.raises(InvalidArgument, match="strategy"):
        ThreadTTL(60, "rollback")
    with pytest.raises(InvalidArgument, match="on_expire"):
        Expiry(on_expire="print")  # type: ignore[arg-type]
