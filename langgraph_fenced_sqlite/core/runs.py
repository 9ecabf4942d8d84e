"""Run lifecycle, decided once: the strategies, and the events a run's start and end log.

Invariant: both stores log a run with the same events and data
(`started_event`, `end_event`, `superseded_data`); `RUN_STRATEGIES` are the
only double-texting strategies a store accepts.
"""

from __future__ import annotations

from typing import Any

from . import claims, events

__all__ = ["RUN_STRATEGIES", "end_event", "started_event", "superseded_data"]

# What a run does when its thread is busy: refuse, or take the thread over.
RUN_STRATEGIES = ("reject", "enqueue", "interrupt", "rollback")


_TAKE_OVER = frozenset({"interrupt", "rollback"})


_SCAN_PAGE = 64  # events read per step when looking for a superseded run


# LangGraph's channel for interrupt writes (its constant is private since 1.0).
_INTERRUPT = "__interrupt__"


def superseded_data(
    run_id: str | None,
    token: int,
    holder: str | None,
    was_live: bool,
    by_run_id: str,
    by_principal: str | None,
    tenant: str | None,
    strategy: str,
) -> dict[str, Any]:
    """Return the data of a `run_superseded` event (both stores): whose run, superseded by which.

    Args:
        run_id: The superseded run's id (None if no record of it is left).
        token: The superseded claim's token.
        holder: Its holder.
        was_live: Whether it was live (else it had expired, its holder crashed).
        by_run_id: The run taking the thread over.
        by_principal: Who that run acts for.
        tenant: That run's tenant.
        strategy: That run's strategy (any, when the superseded claim had expired).
    """
    return {
        "run_id": run_id,
        "token": token,
        "holder": holder,
        "was_live": was_live,
        "by_run_id": by_run_id,
        "by_principal": by_principal,
        "tenant": tenant,
        "strategy": strategy,
    }


def started_event(
    run_id: str, holder: str, strategy: str, tenant: str | None, principal: str | None
) -> events.NewEvent:
    """Return a run's `run_started` event (both stores), committed with its claim."""
    data = {
        "run_id": run_id,
        "holder": holder,
        "strategy": strategy,
        "tenant": tenant,
        "principal": principal,
    }
    return events.NewEvent("run_started", data)


def end_event(
    kind: str,
    data: dict[str, Any],
    *,
    latest: tuple[str, int] | None,
    static_interrupt: bool,
) -> events.NewEvent:
    """Return the event a run's end logs (both stores): an interrupted completion is named so.

    A `run_completed` records the latest root checkpoint's id; if that
    checkpoint has pending interrupts, or the graph stopped at a static
    interrupt, it is logged as `run_interrupted` with their number.

    Args:
        kind: The end the runner reports (`run_completed`, `run_failed`, ...).
        data: The event's data (copied, not changed).
        latest: For `run_completed`: the latest root checkpoint's id and its
            number of pending interrupt writes; None when there is none.
        static_interrupt: The graph stopped at an `interrupt_before/after`.
    """
    data = dict(data)
    if kind == "run_completed":
        data["checkpoint_id"] = None if latest is None else latest[0]
        if latest is not None and (latest[1] or static_interrupt):
            kind, data["interrupts"] = "run_interrupted", latest[1]
    return events.NewEvent(kind, data)


OPERATOR_RELEASED = "claim_released_by_operator"


OPERATOR_TOOK_OVER = "claim_taken_over"


def _previous(row: claims.ThreadRow, operator: str, now: float) -> dict[str, Any]:
    return {
        "operator": operator,
        "previous_holder": row.holder,
        "previous_token": row.token,
        "previous_run_id": row.run_id,
        "was_live": row.live(now),
    }
