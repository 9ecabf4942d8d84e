"""Model-based test of docs/semantics.md: two stores on one file against a pure model.

A hypothesis `RuleBasedStateMachine` drives two `FencedSqliteSaver`s opened
on one file with one shared `ManualClock` through claims, takeovers,
renewals, releases, fenced and unfenced puts and writes, caller events,
compaction, pruning, retraction, deletion, copying and clock moves (to
exactly a claim's `expires_at` too). After every step it compares the
result (return value, or the exact error class and its fields) with what
`tests/support/model.py` says docs/semantics.md requires, checks that a refused call
changed no byte of any table, and compares every thread's state (latest per
namespace, history order, pending writes, orphan writes, events above the
floor, the floor, the claim) read through the public API.

Profiles: the default runs in well under a minute on a loaded CI box. Set
`LGFS_MODEL_PROFILE=long` for a longer search (more examples, longer runs):

    LGFS_MODEL_PROFILE=long python -m pytest tests/conformance/test_model.py -q

The model follows docs/semantics.md where the library disagrees. It found
these library defects, fixed since (the test passes):

- an unfenced special-channel write (`__resume__`, ...) accepted after a
  claim expired unreplaced is silently dropped (docs/semantics.md §3);
- after `delete_thread`, `events_after` from a seq of the old incarnation
  returns [] (a silent gap; §5);
- `prune(strategy="keep_latest")` under a live claim is not refused with
  `ThreadBusy` and logs no event naming what it removed (§6);
- a fenced `loop`/`input` put of a stored id with a wrong parent reports the
  identity conflict `(id, id)` rather than the version conflict
  `(parent, latest)` that §3's check order puts first.

The second test runs the same machine with the second store in a child
process (`sys.executable`, pickles over its pipes); it is marked slow.
"""

from __future__ import annotations

import os
import pickle
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import traceback
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from support.configs import saver_config
from support.files import dump
from support.model import CopyCollision, Cp, Model, ThreadM
from support.processes import import_path
from support.puts import new_checkpoint

from langgraph_fenced_sqlite import (
    FencedSqliteError,
    FencedSqliteSaver,
    ManualClock,
    ReplayUnavailable,
    RetentionPolicy,
)

THREADS = ("t1", "t2")  # the threads most rules act on
ALL_THREADS = (*THREADS, "t3")  # t3 is only ever a copy target
NAMESPACES = ("", "sub")
HOLDERS = ("h1", "h2")
RUN_IDS = (None, "r1", "r2")
SOURCES = ("input", "loop", "fork", "update")
CHANNELS = ("x", "__interrupt__", "__resume__")
ORPHANS = ("o1",)  # checkpoint ids that get writes before (or without) a put
# "current" thrice: most calls are a well-behaved caller's.
TOKEN_MODES = ("none", "current", "stale", "never", "current", "current")

settings.register_profile(
    "model-default",
    max_examples=30,
    stateful_step_count=100,
    deadline=None,
    database=None,  # no .hypothesis/ in the tree; a failure prints its reproducer
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile(
    "model-long",
    max_examples=400,
    stateful_step_count=80,
    deadline=None,
    database=None,  # no .hypothesis/ in the tree; a failure prints its reproducer
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
PROFILE = "model-long" if os.environ.get("LGFS_MODEL_PROFILE") == "long" else "model-default"


def _fields(exc: FencedSqliteError) -> tuple[Any, ...]:
    return (type(exc), *(getattr(exc, name) for name in exc._fields))


def _writes_table(path: str) -> dict[str, set[tuple[str, str, str, int]]]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        out: dict[str, set[tuple[str, str, str, int]]] = {t: set() for t in ALL_THREADS}
        for t, ns, cid, task, idx in conn.execute(
            "SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, idx FROM writes"
        ):
            out.setdefault(t, set()).add((ns, cid, task, idx))
        return out
    finally:
        conn.close()


class ContractMachine(RuleBasedStateMachine):
    """Two stores, one file, one clock; every step checked against `Model`."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="lgfs-model-")
        self.path = os.path.join(self.dir, "model.db")
        self.clock = ManualClock()
        self.stores: list[Any] = [
            FencedSqliteSaver(self.path, clock=self.clock),
            self.second_store(),
        ]
        self.model = Model()
        self.fresh = 0
        self.puts: list[tuple[str, str, str | None, Cp]] = []  # for retries
        self.floors: dict[str, int] = {}
        self.incarnations: dict[str, int] = {}
        self.steps = 0

    def second_store(self) -> Any:
        """The other store on the file: here a sibling in this process."""
        return FencedSqliteSaver(self.path, clock=self.clock)

    def teardown(self) -> None:
        for store in self.stores:
            store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @initialize(ttl=st.integers(1, 5))
    def start(self, ttl: int) -> None:
        """Start with t1 claimed, so fenced calls and expiries come early."""
        self.call(
            lambda: self.stores[0].claim("t1", "h1", ttl),
            lambda: self.model.claim("t1", "h1", ttl, self.now, False),
        )

    # --- helpers ----------------------------------------------------------------------

    @property
    def now(self) -> float:
        return self.clock.now()

    def th(self, thread_id: str) -> ThreadM:
        return self.model.t(thread_id)

    def token(
        self, data: st.DataObject, thread_id: str, mode: str, *, required: bool = False
    ) -> int | None:
        """A token for a call: the current claim's, a stale one, one never issued, or none.

        With `mode="current"` and no claim, a write goes unfenced (what a
        well-behaved caller does); calls that need a token get a stale one.
        """
        claim = self.th(thread_id).claim
        if mode == "none":
            return None
        if mode == "current" and claim is not None:
            return claim.token
        if mode == "current" and not required:
            return None
        others = [tok for tok in self.model.issued if claim is None or tok != claim.token]
        if others:
            return data.draw(st.sampled_from(others), label="stale token")
        return (self.model.issued[-1] if self.model.issued else 0) + 1000

    def call(self, library: Any, model: Any) -> Any:
        """Run the call on the library and on the model; compare; return the result.

        A refused call must raise the error (class and fields) the model
        raised, and leave every table exactly as it was.
        """
        before = dump(self.path)
        try:
            got, got_exc = library(), None
        except FencedSqliteError as exc:
            got, got_exc = None, exc
        try:
            want, want_exc = model(), None
        except FencedSqliteError as exc:
            want, want_exc = None, exc
        if want_exc is not None:
            assert got_exc is not None, f"expected {want_exc!r}, the library returned {got!r}"
            if isinstance(want_exc, CopyCollision):
                pass  # no class named by the contract: any package error
            else:
                assert _fields(got_exc) == _fields(want_exc), (got_exc, want_exc)
            assert dump(self.path) == before, f"a refused call ({got_exc!r}) changed the file"
            return None
        if got_exc is not None:
            raise AssertionError(f"expected {want!r}, the library raised {got_exc!r}")
        assert got == want, (got, want)
        return got

    # --- clock --------------------------------------------------------------------------

    @rule(
        thread_id=st.sampled_from(THREADS),
        to=st.sampled_from(("by", "expiry", "tick before expiry")),
        seconds=st.integers(1, 6),
    )
    def advance(self, thread_id: str, to: str, seconds: int) -> None:
        """Move the shared clock on: by some seconds, or to (a tick before) a claim's expiry."""
        claim = self.th(thread_id).claim
        if to == "by" or claim is None:
            self.clock.advance(seconds)
        elif claim.expires_at - (to != "expiry") >= self.now:
            self.clock.set(claim.expires_at - (to != "expiry"))

    # --- claims -------------------------------------------------------------------------

    @rule(
        s=st.integers(0, 1),
        thread_id=st.sampled_from(THREADS),
        holder=st.sampled_from(HOLDERS),
        ttl=st.integers(1, 5),
        force=st.booleans(),
    )
    def claim(self, s: int, thread_id: str, holder: str, ttl: int, force: bool) -> None:
        store = self.stores[s]
        grant = store.take_over if force else store.claim
        before = max(self.model.issued, default=0)
        claim = self.call(
            lambda: grant(thread_id, holder, ttl),
            lambda: self.model.claim(thread_id, holder, ttl, self.now, force),
        )
        if claim is not None:
            assert claim.token > before, "a token must exceed every token issued before"

    @rule(
        data=st.data(),
        s=st.integers(0, 1),
        thread_id=st.sampled_from(THREADS),
        mode=st.sampled_from(TOKEN_MODES[1:]),
        ttl=st.integers(1, 5),
    )
    def renew(self, data: st.DataObject, s: int, thread_id: str, mode: str, ttl: int) -> None:
        token = self.token(data, thread_id, mode, required=True)
        assert token is not None
        self.call(
            lambda: self.stores[s].renew(thread_id, token, ttl),
            lambda: self.model.renew(thread_id, token, ttl, self.now),
        )

    @rule(
        data=st.data(),
        s=st.integers(0, 1),
        thread_id=st.sampled_from(THREADS),
        mode=st.sampled_from(TOKEN_MODES[1:]),
    )
    def release(self, data: st.DataObject, s: int, thread_id: str, mode: str) -> None:
        token = self.token(data, thread_id, mode, required=True)
        assert token is not None
        before = dump(self.path)
        released = self.call(
            lambda: self.stores[s].release(thread_id, token),
            lambda: self.model.release(thread_id, token),
        )
        if released is False:
            assert dump(self.path) == before, "a release with another token changed the file"

    # --- puts ---------------------------------------------------------------------------

    def _put(self, s: int, thread_id: str, ns: str, new: Cp, token: int | None) -> None:
        metadata: dict[str, Any] = {"source": new.source, "step": new.step, "parents": {}}
        if new.run_id is not None:
            metadata["run_id"] = new.run_id
        config = saver_config(thread_id, ns=ns, checkpoint_id=new.parent, token=token)
        # A fixed id and timestamp: a retried put hands over the identical checkpoint.
        cp = new_checkpoint(
            {"v": new.value}, id=new.cid, ts="2026-01-01T00:00:00+00:00", channel_versions={"v": 1}
        )
        stored = {
            "configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": new.cid}
        }
        got = self.call(
            lambda: self.stores[s].put(config, cp, metadata, {}),
            lambda: (self.model.put(thread_id, ns, new, token, self.now), stored)[1],
        )
        if got is not None:
            self.puts.append((thread_id, ns, token, new))

    @rule(
        data=st.data(),
        s=st.integers(0, 1),
        thread_id=st.sampled_from(THREADS),
        ns=st.sampled_from(NAMESPACES),
        mode=st.sampled_from(TOKEN_MODES),
        source=st.sampled_from(SOURCES),
        parent_mode=st.sampled_from(("latest", "older", "none", "missing")),
        id_mode=st.sampled_from(("fresh", "fresh", "stored", "orphan")),
        value=st.integers(0, 2),
        run_id=st.sampled_from(RUN_IDS),
    )
    def put(
        self,
        data: st.DataObject,
        s: int,
        thread_id: str,
        ns: str,
        mode: str,
        source: str,
        parent_mode: str,
        id_mode: str,
        value: int,
        run_id: str | None,
    ) -> None:
        th = self.th(thread_id)
        token = self.token(data, thread_id, mode)
        latest = th.latest(ns)
        in_ns = [c.cid for c in th.cps if c.ns == ns]
        older = [cid for cid in in_ns if latest is None or cid != latest.cid]
        if parent_mode == "older" and older:
            parent: str | None = data.draw(st.sampled_from(older), label="parent")
        elif parent_mode == "none" or (parent_mode == "older" and not older):
            parent = None
        elif parent_mode == "missing":
            parent = "missing"
        else:
            parent = None if latest is None else latest.cid
        if source in ("fork", "update") and token is not None and (parent not in in_ns):
            # docs/semantics.md §3 lets a fork name any *stored* checkpoint; other
            # parents are left unspecified, so fenced forks name the latest.
            parent = None if latest is None else latest.cid
        stored_ids = sorted({c.cid for c in th.cps})
        if id_mode == "stored" and stored_ids:
            cid = data.draw(st.sampled_from(stored_ids), label="stored id")
        elif id_mode == "orphan":
            cid = data.draw(st.sampled_from(ORPHANS), label="orphan id")
        else:
            self.fresh += 1
            cid = f"{data.draw(st.integers(10, 99), label='id prefix')}-{self.fresh}"
        new = Cp(ns, cid, parent, value, source, len(th.cps), run_id, None, 0.0, 0)
        self._put(s, thread_id, ns, new, token)

    @rule(data=st.data(), s=st.integers(0, 1), mode=st.sampled_from(TOKEN_MODES))
    def retry_put(self, data: st.DataObject, s: int, mode: str) -> None:
        if not self.puts:
            return
        thread_id, ns, _, new = data.draw(st.sampled_from(self.puts), label="earlier put")
        self._put(s, thread_id, ns, new, self.token(data, thread_id, mode))

    # --- writes and events ----------------------------------------------------------------

    @rule(
        data=st.data(),
        s=st.integers(0, 1),
        thread_id=st.sampled_from(THREADS),
        ns=st.sampled_from((*NAMESPACES, "")),
        mode=st.sampled_from(("none", *TOKEN_MODES)),
        where=st.sampled_from(("stored", "orphan", "rewrite")),
        writes=st.lists(
            st.tuples(st.sampled_from(CHANNELS), st.integers(0, 2)), min_size=1, max_size=2
        ),
        task_id=st.sampled_from(("ta", "ta", "tb")),
        task_path=st.sampled_from(("", "p")),
        run_id=st.sampled_from(RUN_IDS),
    )
    def put_writes(
        self,
        data: st.DataObject,
        s: int,
        thread_id: str,
        ns: str,
        mode: str,
        where: str,
        writes: list[tuple[str, int]],
        task_id: str,
        task_path: str,
        run_id: str | None,
    ) -> None:
        th = self.th(thread_id)
        token = self.token(data, thread_id, mode)
        in_ns = [c.cid for c in th.cps if c.ns == ns]
        if where == "rewrite" and th.writes:
            # Write again under a key already written (first/last writer wins).
            key = data.draw(st.sampled_from(sorted(th.writes)), label="written key")
            ns, cid, task_id = key[:3]
            writes = [(th.writes[key].channel, writes[0][1])]
        elif where == "stored" and in_ns:
            cid = data.draw(st.sampled_from(in_ns), label="checkpoint")
        else:
            cid = data.draw(st.sampled_from(ORPHANS), label="orphan")
        config = saver_config(thread_id, ns=ns, checkpoint_id=cid, token=token)
        if run_id is not None:
            config["metadata"] = {"run_id": run_id}
        self.call(
            lambda: self.stores[s].put_writes(config, writes, task_id, task_path),
            lambda: self.model.put_writes(
                thread_id, ns, cid, writes, task_id, task_path, token, run_id, self.now
            ),
        )

    @rule(
        data=st.data(),
        s=st.integers(0, 1),
        thread_id=st.sampled_from(THREADS),
        mode=st.sampled_from(TOKEN_MODES[1:]),
        kinds=st.lists(st.sampled_from(("note", "progress")), max_size=2),
    )
    def append_events(
        self, data: st.DataObject, s: int, thread_id: str, mode: str, kinds: list[str]
    ) -> None:
        token = self.token(data, thread_id, mode, required=True)
        assert token is not None
        self.call(
            lambda: self.stores[s].append_events(thread_id, token, [(k, {}) for k in kinds]),
            lambda: self.model.append_events(thread_id, token, kinds, self.now),
        )

    @rule(s=st.integers(0, 1), thread_id=st.sampled_from(THREADS), ahead=st.integers(-3, 2))
    def compact_events(self, s: int, thread_id: str, ahead: int) -> None:
        before_seq = max(1, self.th(thread_id).next_seq + ahead)
        self.call(
            lambda: self.stores[s].compact_events(thread_id, before_seq),
            lambda: self.model.compact(thread_id, before_seq),
        )

    # --- retention, retraction, deletion, copy -------------------------------------------

    @rule(
        s=st.integers(0, 1),
        thread_id=st.sampled_from(THREADS),
        keep_latest=st.booleans(),
        max_checkpoints=st.sampled_from((None, 0, 1, 2, 3)),
        max_age=st.sampled_from((None, 3, 6)),
        max_events=st.sampled_from((None, 0, 1, 3)),
    )
    def prune(
        self,
        s: int,
        thread_id: str,
        keep_latest: bool,
        max_checkpoints: int | None,
        max_age: int | None,
        max_events: int | None,
    ) -> None:
        if keep_latest:
            # LangGraph's strategy: fenced and logged (docs/semantics.md §6).
            self.call(
                lambda: self.stores[s].prune([thread_id], strategy="keep_latest"),
                lambda: [self.model.prune_keep_latest(thread_id, self.now)],
            )
            return
        policy = RetentionPolicy(max_checkpoints, max_age, max_events)
        self.call(
            lambda: self.stores[s].prune([thread_id], strategy=policy),
            lambda: [
                self.model.prune_policy(thread_id, max_checkpoints, max_age, max_events, self.now)
            ],
        )

    @rule(
        data=st.data(),
        s=st.integers(0, 1),
        thread_id=st.sampled_from(THREADS),
        mode=st.sampled_from(TOKEN_MODES[1:]),
        run_id=st.sampled_from(RUN_IDS),
    )
    def retract_turn(
        self, data: st.DataObject, s: int, thread_id: str, mode: str, run_id: str | None
    ) -> None:
        token = self.token(data, thread_id, mode, required=True)
        assert token is not None
        self.call(
            lambda: self.stores[s].retract_turn(thread_id, token, run_id=run_id),
            lambda: self.model.retract(thread_id, token, run_id, self.now),
        )

    @rule(s=st.integers(0, 1), thread_id=st.sampled_from(THREADS))
    def delete_thread(self, s: int, thread_id: str) -> None:
        self.call(
            lambda: self.stores[s].delete_thread(thread_id),
            lambda: self.model.delete_thread(thread_id),
        )
        self.puts = [p for p in self.puts if p[0] != thread_id]
        self.floors.pop(thread_id, None)

    @rule(s=st.integers(0, 1), source=st.sampled_from(THREADS), dest=st.sampled_from(ALL_THREADS))
    def copy_thread(self, s: int, source: str, dest: str) -> None:
        self.call(
            lambda: self.stores[s].copy_thread(source, dest),
            lambda: (self.model.copy_thread(source, dest, self.now), None)[1],
        )

    # The rules that make history and writes run twice as often as the rest,
    # so runs build up state for the others to act on.
    put_again = put
    put_writes_again = put_writes
    claim_again = claim
    advance_again = advance

    # --- what every step must leave true -------------------------------------------------

    @invariant()
    def state_matches_model(self) -> None:
        self.steps += 1
        store = self.stores[self.steps % 2]
        table = _writes_table(self.path)
        for thread_id in ALL_THREADS:
            th = self.th(thread_id)
            self._check_checkpoints(store, thread_id, th)
            self._check_events(store, thread_id, th)
            assert store.current_claim(thread_id) == th.claim
            assert table.get(thread_id, set()) == set(th.writes), f"writes of {thread_id}"

    def _check_checkpoints(self, store: FencedSqliteSaver, thread_id: str, th: ThreadM) -> None:
        for ns in NAMESPACES:
            want = [c for c in reversed(th.cps) if c.ns == ns]
            got = store.history(thread_id, checkpoint_ns=ns, limit=1000)
            assert [t.config["configurable"]["checkpoint_id"] for t in got] == [
                c.cid for c in want
            ], f"history of {thread_id}/{ns!r}: newest commit first"
            for tup, cp in zip(got, want, strict=True):
                parent = None if tup.parent_config is None else tup.parent_config["configurable"]
                assert (parent or {}).get("checkpoint_id") == cp.parent
                assert tup.checkpoint["channel_values"] == {"v": cp.value}
                md = tup.metadata
                assert (md["source"], md["step"], md.get("run_id")) == (
                    cp.source,
                    cp.step,
                    cp.run_id,
                )
                assert list(tup.pending_writes or []) == th.pending(ns, cp.cid), (
                    f"pending writes of {thread_id}/{ns!r}/{cp.cid}"
                )
            latest = store.get_tuple(
                {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}}
            )
            assert (None if latest is None else latest.config["configurable"]["checkpoint_id"]) == (
                want[0].cid if want else None
            ), f"latest of {thread_id}/{ns!r} is the last committed"
        listed = [
            (t.config["configurable"]["checkpoint_id"], t.config["configurable"]["checkpoint_ns"])
            for t in store.list({"configurable": {"thread_id": thread_id}})
        ]
        assert listed == sorted(((c.cid, c.ns) for c in th.cps), reverse=True), (
            "list: newest id first"
        )

    @staticmethod
    def _incarnation(store: FencedSqliteSaver, thread_id: str) -> int | None:
        # None: no event at all yet (seq 0 of whatever incarnation is current).
        try:
            first = store.events_after(thread_id, 0, 1)
        except ReplayUnavailable as exc:  # compacted: the error names it too
            return exc.incarnation
        return first[0].incarnation if first else None

    def _check_events(self, store: FencedSqliteSaver, thread_id: str, th: ThreadM) -> None:
        floor = self.floors.get(thread_id, 1)
        assert th.floor >= floor, "the floor went down"
        self.floors[thread_id] = th.floor
        # Positions are (incarnation, seq): the contract fixes no number for an
        # incarnation, only that it changes with delete_thread, so the reader
        # learns the current one from the library (never going back) and the
        # events themselves are checked against the model.
        incarnation = self._incarnation(store, thread_id)
        if incarnation is not None:
            assert incarnation >= self.incarnations.get(thread_id, 1), "the incarnation went back"
            self.incarnations[thread_id] = incarnation
        got = store.events_after(thread_id, th.floor - 1, 10_000, incarnation=incarnation)
        assert [(e.seq, e.kind, e.checkpoint_ns, e.checkpoint_id, e.token) for e in got] == [
            (e.seq, e.kind, e.ns, e.cid, e.token) for e in th.events
        ], f"events of {thread_id} above floor {th.floor}"
        assert [e.seq for e in th.events] == list(range(th.floor, th.next_seq))
        if th.floor > 1:
            try:
                store.events_after(thread_id, th.floor - 2, 10, incarnation=incarnation)
            except ReplayUnavailable as exc:
                assert (exc.thread_id, exc.floor) == (thread_id, th.floor)
            else:
                raise AssertionError(f"{thread_id}: reading below floor {th.floor} must fail")
        if th.old_last_seq > th.next_seq - 1:
            # §5: a reader of an earlier incarnation resuming at its last seq
            # gets ReplayUnavailable or the new incarnation from seq 1.
            try:
                resumed = store.events_after(thread_id, th.old_last_seq, 10_000)
            except ReplayUnavailable:
                pass
            else:
                assert th.floor == 1 and [e.seq for e in resumed] == [e.seq for e in th.events], (
                    f"{thread_id}: silent gap after delete_thread (resumed at {th.old_last_seq})"
                )


ContractMachine.TestCase.settings = settings.get_profile(PROFILE)
TestContractModel = ContractMachine.TestCase


# --- the same machine with the second store in another process ---------------------------


class ChildStore:
    """A store served by a child process (`sys.executable`), called over its pipes.

    Each call sends `(now, method, args, kwargs)`; the child first moves its
    own `ManualClock` to `now` (the parent's shared clock), so both processes
    judge expiry alike. Package errors come back pickled and are raised here;
    anything else the child raises fails the test with its traceback.
    """

    def __init__(self) -> None:
        path = import_path(__file__).split(os.pathsep)
        code = f"import sys; sys.path[:0] = {path!r}; import test_model; test_model.serve()"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self.clock: ManualClock | None = None

    def request(self, *message: Any) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        pickle.dump(message, self.proc.stdin)
        self.proc.stdin.flush()
        status, value = pickle.load(self.proc.stdout)
        if status == "error":
            raise value
        if status == "crash":
            raise AssertionError(f"the child store failed:\n{value}")
        return value

    def __getattr__(self, method: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            assert self.clock is not None
            return self.request("call", self.clock.now(), method, args, kwargs)

        return call

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def serve() -> None:
    """Run in the child: open a store when told to, then run the calls it is sent."""
    store: FencedSqliteSaver | None = None
    clock = ManualClock()
    while True:
        try:
            message = pickle.load(sys.stdin.buffer)
        except EOFError:
            break
        try:
            if message[0] == "open":
                clock = ManualClock(message[2])
                store = FencedSqliteSaver(message[1], clock=clock)
                reply: tuple[str, Any] = ("ok", None)
            elif message[0] == "close":
                assert store is not None
                store.close()
                reply = ("ok", None)
            else:
                _, now, method, args, kwargs = message
                if now > clock.now():
                    clock.set(now)
                assert store is not None
                result = getattr(store, method)(*args, **kwargs)
                reply = ("ok", list(result) if method == "list" else result)
        except FencedSqliteError as exc:
            reply = ("error", exc)
        except BaseException:
            reply = ("crash", traceback.format_exc())
        pickle.dump(reply, sys.stdout.buffer)
        sys.stdout.buffer.flush()
    if store is not None:
        store.close()


_CHILD: list[ChildStore] = []  # the child serving the current TwoProcessMachine run


class TwoProcessMachine(ContractMachine):
    """`ContractMachine` with its second store in a child process."""

    def second_store(self) -> Any:
        # Not a class attribute: hypothesis inspects those for rules.
        child = _CHILD[0]
        child.clock = self.clock
        child.request("open", self.path, self.clock.now())
        return child

    def teardown(self) -> None:
        _CHILD[0].request("close")
        self.stores = self.stores[:1]
        super().teardown()


@pytest.mark.slow
@pytest.mark.subprocess
def test_contract_model_two_processes() -> None:
    """The contract machine with the second store served by another process."""
    child = ChildStore()
    _CHILD[:] = [child]
    try:
        run_state_machine_as_test(
            TwoProcessMachine,
            settings=settings(
                settings.get_profile(PROFILE),
                max_examples=settings.get_profile(PROFILE).max_examples // 3,
            ),
        )
    finally:
        child.stop()
