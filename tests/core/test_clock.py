"""The store's clock: a reading that is not a finite number is refused before the file is touched.

NaN compares false with everything, so with a NaN clock `now < expires_at`
called every claim expired and a second live claim was granted; +inf did the
same, and -inf granted claims that never expire. `read_now` is the one place
the store reads its clock, and it refuses such readings with
`InvalidArgument("clock")`.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import pytest
from support.files import dump, read_bytes
from support.puts import new_checkpoint

from langgraph_fenced_sqlite import FencedSqliteSaver, InvalidArgument, ManualClock, ThreadBusy

_UNSET = object()


class SwitchClock(ManualClock):
    """A manual clock whose next readings can be replaced by any value."""

    def __init__(self) -> None:
        super().__init__()
        self.reading: Any = _UNSET

    def now(self) -> Any:
        return super().now() if self.reading is _UNSET else self.reading


BAD_READINGS = [math.nan, math.inf, -math.inf, "1000000.0", None, Decimal("1e6"), True, 10**400]


@pytest.mark.parametrize(
    "reading", BAD_READINGS, ids=["nan", "inf", "-inf", "str", "None", "Decimal", "True", "10**400"]
)
def test_bad_reading_never_grants_a_second_live_claim(db_path: str, reading: Any) -> None:
    """With alice's claim live, a bad reading refuses bob's claim; alice still holds it."""
    clock = SwitchClock()
    with FencedSqliteSaver(db_path, clock=clock) as store:
        alice = store.claim("t", "alice", 60)
        before = (dump(db_path), read_bytes(db_path), read_bytes(db_path + "-wal"))
        clock.reading = reading
        calls = [
            lambda: store.claim("t", "bob", 60),
            lambda: store.take_over("u", "bob", 60),
            lambda: store.renew("t", alice.token, 60),
            lambda: store.append_events("t", alice.token, [("k", {})]),
            lambda: store.begin_run("v", "bob", 60, run_id="r"),
            lambda: store.end_run("t", alice.token, "run_failed"),
            lambda: store.delete_unclaimed_thread("t", "bob"),
            lambda: store.put(
                alice.config({"configurable": {"thread_id": "t"}}),
                {**new_checkpoint()},
                {"source": "input", "step": -1},
                {},
            ),
            lambda: store.prune(["t"]),
            lambda: store.retract_turn("t", alice.token),
        ]
        for call in calls:
            with pytest.raises(InvalidArgument) as info:
                call()
            assert info.value.argument == "clock" and "now()" in str(info.value)
        assert (dump(db_path), read_bytes(db_path), read_bytes(db_path + "-wal")) == before
        clock.reading = _UNSET
        with pytest.raises(ThreadBusy) as busy:
            store.claim("t", "bob", 60)
        assert busy.value.holder == "alice"
        current = store.current_claim("t")
        assert current is not None and current.token == alice.token


def test_read_now_passes_finite_readings_as_floats() -> None:
    """An int or float reading comes back as a float, unchanged in value."""
    from langgraph_fenced_sqlite.clock import read_now

    clock = SwitchClock()
    for value in (0, 1_700_000_000, 1.5, -3.0):
        clock.reading = value
        got = read_now(clock)
        assert got == value and type(got) is float


def test_a_clock_without_now_is_refused_at_open(db_path: str) -> None:
    """A clock must be a Clock: refused naming `clock` before the file is created."""
    import os

    with pytest.raises(InvalidArgument) as info:
        FencedSqliteSaver(db_path, clock=object())  # type: ignore[arg-type]
    assert info.value.argument == "clock"
    assert not os.path.exists(db_path)
