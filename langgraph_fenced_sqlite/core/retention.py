"""Removing history, decided once: retention policies, what a prune keeps, retraction, expiry.

Invariant: a prune keeps the latest checkpoint of every namespace and every
ancestor a kept checkpoint still needs (the parent chain back to a delta
snapshot) (`plan_prune`); a retraction removes one run's checkpoints and
writes, nothing committed before it began (`plan_retraction`); a thread
expires once idle its TTL, never under a live claim (`judge_expiry`). Both
stores apply these plans in their own transactions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

from ..clock import to_seconds
from ..errors import bad_argument
from . import events
from .activity import last_activity

__all__ = [
    "Expired",
    "Expiry",
    "ExpiryReport",
    "PruneResult",
    "RetentionPolicy",
    "Retraction",
    "ThreadTTL",
    "judge_expiry",
    "plan_prune",
    "plan_retraction",
]


@dataclass(frozen=True)
class RetentionPolicy:
    """How much history `prune` keeps; `None` means no limit on that axis.

    The latest checkpoint of each namespace, and any checkpoint a kept one
    still needs, are always kept.

    Attributes:
        max_checkpoints: Keep at most this many newest checkpoints per thread.
        max_age: Remove checkpoints older than this (seconds or timedelta),
            by the store's clock.
        max_events: Keep at most this many newest events (raises the floor).
        max_subgraph_runs: Keep the checkpoints of at most this many past
            subgraph runs per thread (newest first); the others' namespaces
            go entirely, latest checkpoint included (see `subgraph_runs.py`:
            a subgraph still running or waiting at an interrupt is never
            past). None keeps every run's namespace.
    """

    max_checkpoints: int | None = None
    max_age: float | timedelta | None = None
    max_events: int | None = None
    max_subgraph_runs: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_checkpoints", "max_events", "max_subgraph_runs"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise bad_argument(name, f"expected a non-negative int or None, got {value!r}")
        if self.max_age is not None:
            to_seconds(self.max_age, "max_age")

    @property
    def max_age_seconds(self) -> float | None:
        """`max_age` in seconds, or None."""
        return None if self.max_age is None else to_seconds(self.max_age, "max_age")


@dataclass(frozen=True)
class PruneResult:
    """What a prune removed (or, with `dry_run`, would remove).

    Attributes:
        thread_id: The thread pruned.
        checkpoints: `(checkpoint_ns, checkpoint_id)` of removed checkpoints.
        floor: The replay floor afterwards.
        events_removed: How many events went below the floor.
        writes_removed: How many orphan writes went (writes whose checkpoint
            is not stored, older than their namespace's latest checkpoint);
            the writes of removed checkpoints go with them uncounted.
    """

    thread_id: str
    checkpoints: list[tuple[str, str]] = field(default_factory=list)
    floor: int = 1
    events_removed: int = 0
    writes_removed: int = 0


@dataclass(frozen=True)
class Retraction:
    """What `retract_turn` removed.

    Attributes:
        thread_id: The thread.
        run_id: The run removed (None when found by the `input` checkpoint).
        checkpoints: `(checkpoint_ns, checkpoint_id)` removed, oldest first.
        writes: How many pending writes were removed.
        seq: The seq of the `retracted` event (None if nothing was removed).
    """

    thread_id: str
    run_id: str | None
    checkpoints: list[tuple[str, str]]
    writes: int
    seq: int | None


@dataclass(frozen=True)
class _Node:
    ns: str
    cid: str
    parent: str | None
    position: int
    source: str | None
    run_id: str | None
    created_at: float
    step: int | None
    # Delta channels not snapshotted here (nonzero counters) that also have a
    # version in this checkpoint: the ones LangGraph rebuilds from ancestors.
    replays: bool = False


def skeleton_node(
    ns: str,
    cid: str,
    parent: str | None,
    position: int,
    source: str | None,
    run_id: str | None,
    created_at: float,
    step: int | None,
    counters: dict[str, Any] | None,
    versions: dict[str, Any] | None,
) -> _Node:
    """What `plan_prune` reasons about for one checkpoint, from either store's row.

    Args:
        counters: The metadata's `counters_since_delta_snapshot` (or None).
        versions: The checkpoint's `channel_versions` (or None).
    """
    replays = _replays(counters, versions)
    return _Node(ns, cid, parent, position, source, run_id, created_at, step, replays)


def _replays(counters: dict[str, Any] | None, versions: dict[str, Any] | None) -> bool:
    # DeltaChannel (beta) stores deltas between snapshots. LangGraph rebuilds
    # a delta channel that has a version here but no stored value by walking
    # the ancestors' writes back to a snapshot (`_delta_channels_to_replay`).
    # Nonzero counters name the delta channels not snapshotted here; one with
    # no version was never written and needs no walk, yet its superstep
    # counter grows every step, so counting it would keep all history.
    if not counters:
        return False
    versioned = versions or {}
    return any(
        name in versioned and any(part for part in value) for name, value in counters.items()
    )


def _close_over_ancestors(nodes: Sequence[_Node], keep: set[tuple[str, str]]) -> None:
    by_key = {(n.ns, n.cid): n for n in nodes}
    stack = list(keep)
    while stack:
        node = by_key.get(stack.pop())
        if node is None or not node.parent or not node.replays:
            continue
        parent_key = (node.ns, node.parent)
        if parent_key in by_key and parent_key not in keep:
            keep.add(parent_key)
            stack.append(parent_key)


def plan_prune(
    nodes: Sequence[_Node],
    policy: RetentionPolicy,
    now: float,
    *,
    keep_latest_only: bool = False,
    past: Iterable[str] = (),
) -> list[tuple[str, str]]:
    """The `(ns, id)` keys a prune removes, oldest first (the rule of both stores).

    Keeps the latest checkpoint of each namespace not in `past` (past
    subgraph runs' namespaces go whole), the newest and young ones `policy`
    keeps (none beyond the latest with `keep_latest_only`), and every
    ancestor a kept checkpoint still needs (its delta chain).

    Args:
        nodes: Every checkpoint of the thread (`skeleton_node`), by position.
        now: The store's clock, for `max_age`.
    """
    gone = set(past)
    candidates = [n for n in nodes if n.ns not in gone] if gone else list(nodes)
    latest: dict[str, _Node] = {}
    for node in candidates:
        latest[node.ns] = node
    keep = {(n.ns, n.cid) for n in latest.values()}
    newest_first = sorted(candidates, key=lambda n: n.position, reverse=True)
    max_age = policy.max_age_seconds
    for rank, node in enumerate(newest_first):
        if keep_latest_only:
            break
        if policy.max_checkpoints is not None and rank >= policy.max_checkpoints:
            continue
        if max_age is not None and node.created_at < now - max_age:
            continue
        keep.add((node.ns, node.cid))
    _close_over_ancestors(nodes, keep)
    return [(n.ns, n.cid) for n in nodes if (n.ns, n.cid) not in keep]


class TurnNode(Protocol):
    """What `plan_retraction` reads of a checkpoint (either store's row)."""

    @property
    def ns(self) -> str: ...
    @property
    def cid(self) -> str: ...
    @property
    def position(self) -> int: ...
    @property
    def source(self) -> str | None: ...
    @property
    def run_id(self) -> str | None: ...


def plan_retraction(
    nodes: Sequence[TurnNode],
    run_id: str | None,
    parents: Callable[[str, str], dict[str, Any]],
) -> tuple[str | None, list[tuple[str, str]], int] | None:
    """Which checkpoints `retract_turn` removes (docs/semantics.md §6), for both stores.

    Args:
        nodes: Every checkpoint of the thread, all namespaces, by commit position.
        run_id: The run asked for; None: the run of the latest root
            checkpoint, or, where that carries none, everything from the
            newest root `input` checkpoint on.
        parents: Reads a checkpoint's metadata `parents` (`subgraph_runs.parents_of`
            of the stored value), asked only of a subgraph checkpoint saved
            between the turn before's last root checkpoint and the input one.

    Returns:
        None when there is no turn to remove (no run id and no root input
        checkpoint); else `(run_id, keys, start)`: the run removed (None when
        found by the input checkpoint), the `(ns, id)` keys to remove oldest
        first, and the commit position from which writes go too (used when
        `run_id` is None; a run's writes go by their run id instead; the
        writes of every removed checkpoint go in both cases).
    """
    if run_id is None:
        roots = [n for n in nodes if n.ns == ""]
        if roots and roots[-1].run_id is not None:
            run_id = roots[-1].run_id
    if run_id is not None:
        return run_id, [(n.ns, n.cid) for n in nodes if n.run_id == run_id], 0
    inputs = [n for n in nodes if n.ns == "" and n.source == "input"]
    if not inputs:
        return None
    start = inputs[-1].position
    turn = {n.cid for n in nodes if n.ns == "" and n.position >= start}
    # With durability "async" LangGraph saves a subgraph's checkpoints on
    # their own loop, not after the root's pending ones: a slow root put
    # lets a whole subgraph run commit before the turn's input checkpoint
    # (tests/graphs/test_retract_graphs.py pins it). Such a checkpoint names
    # its root checkpoint in `parents[""]`, and it was saved after the turn
    # before had saved its last root checkpoint (an invocation returns only
    # once its own puts are done).
    floor = max((n.position for n in nodes if n.ns == "" and n.position < start), default=0)
    early = {
        (n.ns, n.cid)
        for n in nodes
        if n.ns != "" and floor < n.position < start and parents(n.ns, n.cid).get("") in turn
    }
    keys = [(n.ns, n.cid) for n in nodes if n.position >= start or (n.ns, n.cid) in early]
    return None, keys, start


def retracted_event(
    run_id: str | None, removed: Sequence[tuple[str, str]], writes: int
) -> events.NewEvent:
    """The `retracted` event of a retraction that removed `removed` and `writes` writes."""
    data = {"run_id": run_id, "checkpoints": [list(k) for k in removed], "writes": writes}
    return events.NewEvent("retracted", data)


# --- thread expiry (time to live) ------------------------------------------------------

TTL_STRATEGIES = ("delete", "keep_latest")
# `ttl_seen` of a thread that holds nothing left to expire (bare, deleted, or
# trimmed to its latest): no sweep looks at it until it is written again (a
# commit sets it back to NULL, "not seen": the stores' unpark trigger).
PARKED = float("inf")


def check_strategy(strategy: Any, name: str = "strategy") -> str:
    """Return `strategy` if it is one of `TTL_STRATEGIES`, else raise `InvalidArgument`."""
    if not isinstance(strategy, str) or strategy not in TTL_STRATEGIES:
        raise bad_argument(name, f"expected 'delete' or 'keep_latest', got {strategy!r}")
    return strategy


@dataclass(frozen=True)
class ThreadTTL:
    """A thread's time to live: what happens to it once idle `ttl` seconds.

    Attributes:
        ttl: Seconds (or a timedelta) since the thread's last activity (its
            newest checkpoint or event, as `threads(inactive_for=)` counts it).
        strategy: `"delete"` (the whole thread, as `delete_thread`) or
            `"keep_latest"` (its history trimmed to the latest checkpoint of
            each namespace, as `prune(strategy="keep_latest")`).
    """

    ttl: float | timedelta
    strategy: str = "delete"

    def __post_init__(self) -> None:
        to_seconds(self.ttl, "ttl")
        check_strategy(self.strategy)

    @property
    def seconds(self) -> float:
        """`ttl` in seconds."""
        return to_seconds(self.ttl, "ttl")


@dataclass(frozen=True)
class Expiry:
    """A saver's expiry option: the store-wide default TTL, and the sweeper that applies TTLs.

    Attributes:
        default_ttl: The TTL of every thread that has none of its own
            (`set_thread_ttl`); None: only threads with their own TTL expire.
        strategy: The default TTL's strategy (`"delete"` or `"keep_latest"`).
        sweep_every: Start a sweeper with the saver that runs `expire()` this
            often (seconds or timedelta), stopped by `close()`; None: none
            (call `expire()` yourself, or run `lgfs sweep --every`).
        on_expire: Called with each `Expired` thread, after its transaction,
            by whoever expires it (the sweeper, or `expire()`'s caller).
    """

    default_ttl: float | timedelta | None = None
    strategy: str = "delete"
    sweep_every: float | timedelta | None = None
    on_expire: Callable[[Expired], None] | None = None

    def __post_init__(self) -> None:
        if self.default_ttl is not None:
            to_seconds(self.default_ttl, "default_ttl")
        check_strategy(self.strategy)
        if self.sweep_every is not None:
            to_seconds(self.sweep_every, "sweep_every")
        if self.on_expire is not None and not callable(self.on_expire):
            raise bad_argument("on_expire", "expected a callable or None")

    @property
    def default(self) -> ThreadTTL | None:
        """The default TTL as a `ThreadTTL`, or None."""
        if self.default_ttl is None:
            return None
        return ThreadTTL(to_seconds(self.default_ttl, "default_ttl"), self.strategy)


def check_expiry(expiry: Any, readonly: bool) -> Expiry | None:
    """Check a saver's `expiry` option (before the store is touched) and return it.

    Raises:
        InvalidArgument: not an `Expiry` or None, or a sweeper on a read-only store.
    """
    if expiry is None:
        return None
    if not isinstance(expiry, Expiry):
        raise bad_argument("expiry", f"expected an Expiry or None, got {expiry!r}")
    if readonly and expiry.sweep_every is not None:
        raise bad_argument("expiry", "a read-only store cannot sweep (sweep_every is set)")
    return expiry


@dataclass(frozen=True)
class Expired:
    """One thread a sweep expired.

    Attributes:
        thread_id: The thread.
        strategy: `"delete"` or `"keep_latest"`.
        ttl: The TTL applied (seconds): the thread's own, or the default.
        last_activity: When the thread was last written (store clock).
        checkpoints: `(checkpoint_ns, checkpoint_id)` removed (`keep_latest`;
            empty for `delete`, which removed everything).
        seq: The seq of the `pruned` event logged (`keep_latest` that removed
            something); None for `delete`: the log went with the thread, whose
            readers learn it from `ReplayUnavailable` (a new incarnation).
    """

    thread_id: str
    strategy: str
    ttl: float
    last_activity: float
    checkpoints: list[tuple[str, str]] = field(default_factory=list)
    seq: int | None = None


@dataclass(frozen=True)
class ExpiryReport:
    """What one `expire()` pass did.

    Attributes:
        expired: The threads expired, in the order done.
        busy: Due threads left alone because a live claim holds them (a later
            pass expires them once the claim ends, if still idle).
        errors: Due threads left alone because a row of theirs does not decode.
        scheduled: Threads whose next due time this pass (re)computed: new
            threads, and due-looking ones written since they were last seen.
    """

    expired: list[Expired] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    scheduled: int = 0


@dataclass(frozen=True)
class ExpiryFacts:
    """What one thread's expiry is judged on, read inside its transaction.

    Attributes:
        ttl, strategy: The thread's own TTL (None: none).
        seen: The activity a sweep last saw (None: not seen; `PARKED`).
        last_checkpoint_at, last_event_at: The thread's newest cells (None:
            none).
        live: Whether a live claim holds it.
    """

    ttl: float | None
    strategy: str | None
    seen: float | None
    last_checkpoint_at: Any
    last_event_at: Any
    live: bool


def judge_expiry(
    facts: ExpiryFacts, default: ThreadTTL | None, now: float
) -> tuple[str, ThreadTTL | None, float]:
    """Decide one thread's expiry (the rule of both stores and every sweeper).

    Returns:
        `(verdict, rule, activity)`: verdict `"skip"` (no TTL applies, or
        another sweep finished it), `"park"` (it holds nothing: no checkpoint,
        no event), `"schedule"` (not due: remember `activity`, the lower bound
        the next due time is computed from), `"busy"` (due, under a live
        claim), `"expire"` (due: apply `rule`).
    """
    if facts.seen == PARKED:
        return "skip", None, 0.0
    rule = default
    if facts.ttl is not None and facts.strategy in TTL_STRATEGIES:
        rule = ThreadTTL(float(facts.ttl), facts.strategy)
    if rule is None:
        return "skip", None, 0.0
    if facts.last_checkpoint_at is None and facts.last_event_at is None:
        return "park", rule, 0.0
    activity = last_activity(facts.last_checkpoint_at, facts.last_event_at)
    if activity + rule.seconds > now:
        return ("skip" if facts.seen == activity else "schedule"), rule, activity
    if facts.live:
        return "busy", rule, activity
    return "expire", rule, activity
