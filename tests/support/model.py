"""A small pure-Python model of docs/semantics.md, for the model-based test (test_model.py).

Invariant: every method here either raises the error the contract names (the
same exception class the library uses, built with the fields the contract
gives it) *before changing anything*, or applies the whole change. Nothing
here reads the database: it is what the contract says the file must hold.

Where the contract leaves a detail open, the choice made is said next to it
(look for "Interpretation"). Where the library is known to disagree (defects
being fixed elsewhere), the model still follows the contract.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from langgraph_fenced_sqlite import (
    CheckpointConflict,
    Claim,
    FencedSqliteError,
    PruneResult,
    Retraction,
    StaleClaim,
    ThreadBusy,
)

# LangGraph's WRITES_IDX_MAP: special channels and the idx they are stored under.
SPECIAL_IDX = {"__error__": -1, "__scheduled__": -2, "__interrupt__": -3, "__resume__": -4}
_VERSIONED_SOURCES = frozenset({"input", "loop"})

# docs/semantics.md §6: LangGraph's `prune(thread_ids, strategy)` "logs an event
# naming what it removed" (`pruned`), so that is the kind the model expects.
PRUNED_KIND = "pruned"


class CopyCollision(FencedSqliteError):
    """What the model raises when a copy would store an id the target already has.

    The contract gives no class for this; the test accepts any package error,
    as long as nothing changed.
    """

    code = "copy_collision"


@dataclass(frozen=True)
class Cp:
    """One stored checkpoint."""

    ns: str
    cid: str
    parent: str | None
    value: int
    source: str
    step: int
    run_id: str | None
    token: int | None
    created_at: float
    commit: int

    def identity(self) -> tuple[Any, ...]:
        """What makes a second put of this id an identical retry."""
        return (self.parent, self.value, self.source, self.step, self.run_id)


@dataclass(frozen=True)
class W:
    """One pending write, keyed elsewhere by `(ns, cid, task_id, idx)`."""

    channel: str
    value: int
    task_path: str
    token: int | None
    run_id: str | None
    commit: int


@dataclass(frozen=True)
class Ev:
    """One event of the log (only what the test compares)."""

    seq: int
    kind: str
    ns: str | None
    cid: str | None
    token: int | None


WKey = tuple[str, str, str, int]  # (ns, cid, task_id, idx)


@dataclass
class ThreadM:
    """Everything the contract says one thread holds."""

    cps: list[Cp] = field(default_factory=list)  # commit order
    writes: dict[WKey, W] = field(default_factory=dict)
    events: list[Ev] = field(default_factory=list)  # seq >= floor, ascending
    next_seq: int = 1
    floor: int = 1
    claim: Claim | None = None
    # The latest claim granted, kept after it ends (and across delete_thread):
    # `StaleClaim` names its holder and token.
    last: Claim | None = None
    # The last seq of every earlier incarnation (delete_thread), for §5's "no silent gap".
    old_last_seq: int = 0

    def latest(self, ns: str) -> Cp | None:
        """The namespace's latest checkpoint: highest commit, not highest id."""
        for cp in reversed(self.cps):
            if cp.ns == ns:
                return cp
        return None

    def find(self, ns: str, cid: str) -> Cp | None:
        """The stored checkpoint `(ns, cid)`, if any."""
        for cp in self.cps:
            if cp.ns == ns and cp.cid == cid:
                return cp
        return None

    def pending(self, ns: str, cid: str) -> list[tuple[str, str, int]]:
        """A checkpoint's pending writes in `writes_sort_key` order."""
        rows = sorted(
            (w.task_path, k[2], k[3], w.channel, w.value)
            for k, w in self.writes.items()
            if k[0] == ns and k[1] == cid
        )
        return [(task_id, channel, value) for _, task_id, _, channel, value in rows]

    def live(self, now: float) -> bool:
        """docs/semantics.md §2: live while `now < expires_at`, strictly."""
        return self.claim is not None and now < self.claim.expires_at


class Model:
    """The whole file: threads and the one token counter."""

    def __init__(self) -> None:
        self.threads: dict[str, ThreadM] = {}
        self.issued: list[int] = []  # every token, in issue order
        self._commit = 0

    def t(self, thread_id: str) -> ThreadM:
        """The thread's state (a never-written thread is empty)."""
        return self.threads.setdefault(thread_id, ThreadM())

    def _next_commit(self) -> int:
        self._commit += 1
        return self._commit

    def _append(self, th: ThreadM, kind: str, ns: str | None, cid: str | None, token: Any) -> int:
        seq = th.next_seq
        th.events.append(Ev(seq, kind, ns, cid, token))
        th.next_seq += 1
        return seq

    def _latest_root(self, thread_id: str) -> str | None:
        cp = self.t(thread_id).latest("")
        return None if cp is None else cp.cid

    # --- §2 claims -----------------------------------------------------------------

    def _issue(self) -> int:
        # Interpretation: the contract only says "greater than every token
        # before"; the library's counter counts by one, and so does the model.
        token = (self.issued[-1] if self.issued else 0) + 1
        self.issued.append(token)
        return token

    def claim(self, thread_id: str, holder: str, ttl: float, now: float, force: bool) -> Claim:
        """`claim` (force=False) and `take_over` (force=True)."""
        th = self.t(thread_id)
        if not force and th.live(now):
            assert th.claim is not None
            raise ThreadBusy(thread_id, th.claim.holder, self._latest_root(thread_id))
        th.claim = th.last = Claim(thread_id, holder, self._issue(), now + ttl)
        return th.claim

    @staticmethod
    def _stale(thread_id: str, th: ThreadM, token: int) -> StaleClaim:
        current = None if th.claim is None else th.claim.token
        if th.last is None:
            return StaleClaim(thread_id, token, current)
        return StaleClaim(thread_id, token, current, th.last.holder, th.last.token)

    def renew(self, thread_id: str, token: int, ttl: float, now: float) -> Claim:
        """Extend the claim carrying `token`, expired or not."""
        th = self.t(thread_id)
        if th.claim is None or th.claim.token != token:
            raise self._stale(thread_id, th, token)
        th.claim = replace(th.claim, expires_at=now + ttl)
        return th.claim

    def release(self, thread_id: str, token: int) -> bool:
        """End the claim carrying `token`; any other token changes nothing."""
        th = self.t(thread_id)
        if th.claim is None or th.claim.token != token:
            return False
        th.claim = None
        return True

    def _fence(self, thread_id: str, token: int | None, now: float) -> ThreadM:
        """docs/semantics.md §3 check 1 (store opened without `require_claim`)."""
        th = self.t(thread_id)
        if token is not None:
            if th.claim is None or th.claim.token != token:
                raise self._stale(thread_id, th, token)
        elif th.live(now):
            assert th.claim is not None
            raise ThreadBusy(thread_id, th.claim.holder, self._latest_root(thread_id))
        return th

    # --- §3 writes -----------------------------------------------------------------

    def put(self, thread_id: str, ns: str, new: Cp, token: int | None, now: float) -> bool:
        """Store `new` (its token/created_at/commit are filled in here).

        Returns:
            False for an identical retry (a no-op).
        """
        th = self._fence(thread_id, token, now)
        stored = th.find(ns, new.cid)
        # Interpretation: "a retried put must not fail", so an identical
        # retry is a no-op even though its parent is no longer the latest
        # (which check 2, run first, would otherwise refuse).
        if stored is not None and stored.identity() == new.identity():
            return False
        if token is not None and new.source in _VERSIONED_SOURCES:
            latest = th.latest(ns)
            latest_id = None if latest is None else latest.cid
            if new.parent != latest_id:
                raise CheckpointConflict(thread_id, ns, new.parent, latest_id)
        if stored is not None:
            # errors.py: for an identity conflict, expected and actual are the id.
            raise CheckpointConflict(thread_id, ns, new.cid, new.cid)
        commit = self._next_commit()
        th.cps.append(replace(new, token=token, created_at=now, commit=commit))
        self._append(th, "checkpoint", ns, new.cid, token)
        return True

    def put_writes(
        self,
        thread_id: str,
        ns: str,
        cid: str,
        writes: list[tuple[str, int]],
        task_id: str,
        task_path: str,
        token: int | None,
        run_id: str | None,
        now: float,
    ) -> None:
        """Regular writes first-writer-wins, special channels last-writer-wins."""
        th = self._fence(thread_id, token, now)
        commit = self._next_commit()
        changed = False
        for i, (channel, value) in enumerate(writes):
            key = (ns, cid, task_id, SPECIAL_IDX.get(channel, i))
            new = W(channel, value, task_path, token, run_id, commit)
            old = th.writes.get(key)
            if channel in SPECIAL_IDX:
                # §3: an accepted special write takes effect (an unfenced one
                # after a claim expired unreplaced included); a retry of the
                # same value changes nothing.
                if old is None or (old.channel, old.value, old.task_path) != (
                    channel,
                    value,
                    task_path,
                ):
                    th.writes[key] = new
                    changed = True
            elif old is None:
                th.writes[key] = new
                changed = True
        # Interpretation: a put_writes that changes nothing (a retry, or only
        # regular writes that lost to the first writer) is an idempotent
        # no-op like a retried put, and appends no event.
        if changed:
            self._append(th, "writes", ns, cid, token)

    def append_events(self, thread_id: str, token: int, kinds: list[str], now: float) -> list[int]:
        """Caller events under a claim."""
        th = self._fence(thread_id, token, now)
        return [self._append(th, kind, None, None, token) for kind in kinds]

    # --- §5 events -----------------------------------------------------------------

    def compact(self, thread_id: str, before_seq: int) -> int:
        """Raise the floor to `min(before_seq, next_seq)`, never lower."""
        th = self.t(thread_id)
        self._raise_floor(th, before_seq)
        return th.floor

    def _raise_floor(self, th: ThreadM, target: int) -> None:
        target = min(target, th.next_seq)
        if target > th.floor:
            th.floor = target
            th.events = [e for e in th.events if e.seq >= target]

    # --- §6 retention, retraction, deletion, copying ---------------------------------

    def _floor_after_removal(
        self, th: ThreadM, removed: set[tuple[str, str]], max_events: int | None
    ) -> int:
        # Interpretation of "events go with their checkpoints; the floor moves
        # up accordingly" (the log stays contiguous, so events can only go
        # from the bottom): the floor rises to the first event about a
        # checkpoint still stored, or, if none is left, past the last event
        # about a removed one.
        target = th.floor
        if removed:
            kept = {(c.ns, c.cid) for c in th.cps}
            firsts = [e.seq for e in th.events if e.cid is not None and (e.ns, e.cid) in kept]
            if firsts:
                first = min(firsts)
            else:
                about = [e.seq + 1 for e in th.events if (e.ns, e.cid) in removed]
                first = max(about, default=th.floor)
            target = max(target, first)
        if max_events is not None:
            target = max(target, th.next_seq - max_events)
        return target

    def prune_policy(
        self,
        thread_id: str,
        max_checkpoints: int | None,
        max_age: float | None,
        max_events: int | None,
        now: float,
    ) -> PruneResult:
        """§6 `prune(thread_id, policy)`: no claim needed, no event."""
        th = self.t(thread_id)
        keep = {(c.ns, c.cid) for c in (th.latest(ns) for ns in {c.ns for c in th.cps}) if c}
        for rank, cp in enumerate(reversed(th.cps)):
            if max_checkpoints is not None and rank >= max_checkpoints:
                continue
            if max_age is not None and cp.created_at < now - max_age:
                continue
            keep.add((cp.ns, cp.cid))
        removed = [c for c in th.cps if (c.ns, c.cid) not in keep]
        self._remove(th, removed)
        orphans = self._remove_orphans(th)
        floor = th.floor
        self._raise_floor(
            th, self._floor_after_removal(th, {(c.ns, c.cid) for c in removed}, max_events)
        )
        return PruneResult(
            thread_id, [(c.ns, c.cid) for c in removed], th.floor, th.floor - floor, orphans
        )

    @staticmethod
    def _remove_orphans(th: ThreadM) -> int:
        # Interpretation (the library's documented rule; the contract says
        # only that writes are kept for every stored checkpoint): a write
        # whose checkpoint is not stored, committed before its namespace's
        # latest checkpoint, belongs to nothing any kept checkpoint needs, and
        # every prune but "delete" removes it. Later ones may be in flight
        # (LangGraph writes before it puts): kept.
        orphans = [
            k
            for k, w in th.writes.items()
            if th.find(k[0], k[1]) is None
            and (latest := th.latest(k[0])) is not None
            and w.commit < latest.commit
        ]
        for k in orphans:
            del th.writes[k]
        return len(orphans)

    def prune_keep_latest(self, thread_id: str, now: float) -> PruneResult:
        """§6 LangGraph's `prune(thread_ids, "keep_latest")`: fenced, logged."""
        th = self._fence(thread_id, None, now)
        keep = {(c.ns, c.cid) for c in (th.latest(ns) for ns in {c.ns for c in th.cps}) if c}
        removed = [c for c in th.cps if (c.ns, c.cid) not in keep]
        self._remove(th, removed)
        orphans = self._remove_orphans(th)
        floor = th.floor
        self._raise_floor(th, self._floor_after_removal(th, {(c.ns, c.cid) for c in removed}, None))
        result = PruneResult(
            thread_id, [(c.ns, c.cid) for c in removed], th.floor, th.floor - floor, orphans
        )
        if removed or orphans:
            self._append(th, PRUNED_KIND, None, None, None)
        return result

    def _remove(self, th: ThreadM, cps: list[Cp]) -> int:
        keys = {(c.ns, c.cid) for c in cps}
        th.cps = [c for c in th.cps if (c.ns, c.cid) not in keys]
        gone = [k for k in th.writes if (k[0], k[1]) in keys]
        for k in gone:
            del th.writes[k]
        return len(gone)

    def retract(self, thread_id: str, token: int, run_id: str | None, now: float) -> Retraction:
        """§6 `retract_turn`: fenced; one run, or everything since the last input."""
        th = self._fence(thread_id, token, now)
        if run_id is None:
            root = th.latest("")
            if root is not None and root.run_id is not None:
                run_id = root.run_id
        if run_id is not None:
            targets = [c for c in th.cps if c.run_id == run_id]
            extra = [k for k, w in th.writes.items() if w.run_id == run_id]
        else:
            inputs = [c for c in th.cps if c.ns == "" and c.source == "input"]
            if not inputs:
                return Retraction(thread_id, None, [], 0, None)
            start = inputs[-1].commit
            targets = [c for c in th.cps if c.commit >= start]
            extra = [k for k, w in th.writes.items() if w.commit >= start]
        keys = {(c.ns, c.cid) for c in targets}
        extra = [k for k in extra if (k[0], k[1]) not in keys]
        writes = self._remove(th, targets)
        for k in extra:
            del th.writes[k]
        writes += len(extra)
        if not targets and not writes:
            return Retraction(thread_id, run_id, [], 0, None)
        seq = self._append(th, "retracted", None, None, token)
        return Retraction(thread_id, run_id, [(c.ns, c.cid) for c in targets], writes, seq)

    def delete_thread(self, thread_id: str) -> None:
        """Remove everything of the thread; a new incarnation starts at seq 1."""
        old = self.t(thread_id)
        last = max(old.old_last_seq, old.next_seq - 1)
        self.threads[thread_id] = ThreadM(old_last_seq=last, last=old.last)

    def copy_thread(self, source: str, target: str, now: float) -> int:
        """LangGraph's `copy_thread`, fenced on the target; returns how many copied.

        Interpretation (the library's documented choice; the contract names
        no behaviour for ids the target already has): idempotent. A source
        checkpoint the target holds identically is left as it is, a write the
        target already has too; a different checkpoint under a source id is
        refused, changing nothing. When nothing at all is new, no event.
        """
        dst = self._fence(target, None, now)
        src = self.t(source)
        new_cps = []
        for cp in src.cps:
            have = dst.find(cp.ns, cp.cid)
            if have is None:
                new_cps.append(cp)
            elif have.identity() != cp.identity():
                raise CopyCollision()
        src_writes = dict(src.writes)
        copied = {(c.ns, c.cid) for c in new_cps}
        changed = False
        for cp in new_cps:
            commit = self._next_commit()
            dst.cps.append(replace(cp, token=None, commit=commit))
            for k, w in src_writes.items():
                if (k[0], k[1]) == (cp.ns, cp.cid) and k not in dst.writes:
                    dst.writes[k] = replace(w, token=None, commit=commit)
            self._append(dst, "checkpoint", cp.ns, cp.cid, None)
            changed = True
        rest = [k for k in src_writes if (k[0], k[1]) not in copied and k not in dst.writes]
        if not changed and not rest:
            return 0
        commit = self._next_commit()
        for k in rest:
            dst.writes[k] = replace(src_writes[k], token=None, commit=commit)
        self._append(dst, "copied", None, None, None)
        return len(new_cps)
