"""The per-thread event log's records: what an event is, and what each write logs.

Invariant: both stores log the same events with the same data (`NewEvent`,
the `*_event_data` builders) and read them back as the same `Event`
(`decode_event`, which checks every cell's type); the caller's own events
are checked once, here (`normalize_caller_events`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import SerializationError, UndecodableRow, bad_argument
from .checksums import checksum
from .stored_json import MAX_INT, MIN_INT, PLAIN, dumps_json, loads_json
from .validation import check_iterable, check_json, check_name

__all__ = ["Event", "NewEvent", "decode_event", "normalize_caller_events"]


@dataclass(frozen=True)
class Event:
    """One record of a thread's event log.

    Attributes:
        thread_id: The thread.
        seq: Its number, 1, 2, 3, ... per thread.
        kind: `checkpoint`, `writes`, `retracted`, `pruned` or a caller's kind.
        data: A JSON object (never channel values).
        checkpoint_ns: The namespace of the checkpoint it concerns, if any.
        checkpoint_id: The checkpoint it concerns, if any.
        token: The fencing token of the write, if fenced.
        ts: Store-clock seconds since the epoch at commit.
        incarnation: The thread's incarnation (1, then one more after each
            `delete_thread`); `(incarnation, seq)` is a reader's position.
    """

    thread_id: str
    seq: int
    kind: str
    data: dict[str, Any]
    checkpoint_ns: str | None = None
    checkpoint_id: str | None = None
    token: int | None = None
    ts: float = 0.0
    incarnation: int = 1

    def to_dict(self) -> dict[str, Any]:
        """Return the event as a JSON-ready dict."""
        return {
            "thread_id": self.thread_id,
            "seq": self.seq,
            "kind": self.kind,
            "data": self.data,
            "checkpoint_ns": self.checkpoint_ns,
            "checkpoint_id": self.checkpoint_id,
            "token": self.token,
            "ts": self.ts,
            "incarnation": self.incarnation,
        }


@dataclass(frozen=True)
class NewEvent:
    """An event about to be appended (no seq yet)."""

    kind: str
    data: Mapping[str, Any]
    checkpoint_ns: str | None = None
    checkpoint_id: str | None = None


def normalize_caller_events(events: Iterable[Any]) -> list[NewEvent]:
    """Validate caller events: `(kind, data)` pairs or `{"kind", "data"}` dicts.

    Raises:
        InvalidArgument: (naming `events`, or `events[i]...`) not a list of
            events, an event of the wrong shape, an empty/too long/non-UTF-8
            kind, data that is not a JSON object with string keys.
        SerializationError: data holds a value JSON cannot store (naming it).
    """
    out: list[NewEvent] = []
    for i, item in enumerate(check_iterable(events, "events")):
        if isinstance(item, Mapping):
            kind, data = item.get("kind"), item.get("data", {})
        elif isinstance(item, tuple) and len(item) == 2:
            kind, data = item
        else:
            raise bad_argument("events", f"each event must be (kind, data) or a dict, got {item!r}")
        if not isinstance(kind, str) or not kind or len(kind) > 200:
            raise bad_argument("events", f"kind must be a non-empty string, got {kind!r}")
        check_name(kind, f"events[{i}] kind")
        if not isinstance(data, Mapping):
            raise bad_argument("events", f"data must be a JSON object, got {type(data).__name__}")
        check_json(dict(data), f"events[{i}] data")
        dumps_json(dict(data), "events data")
        out.append(NewEvent(kind, dict(data)))
    return out


def checkpoint_event_data(
    step: int | None, source: str | None, parent_id: str | None, run_id: str | None
) -> dict[str, Any]:
    """Return the data of a put's `checkpoint` event, as both stores log it.

    `{"step", "source", "parent_checkpoint_id"}`, and `"run_id"` unless it is None.
    """
    data: dict[str, Any] = {"step": step, "source": source, "parent_checkpoint_id": parent_id}
    if run_id is not None:
        data["run_id"] = run_id
    return data


def checkpoint_event_text(
    step: int | None, source: str | None, parent_id: str | None, run_id: str | None
) -> str:
    """Return `checkpoint_event_data` as `dumps_json` writes it.

    Judged `PLAIN` field by field (what `json_kind` would walk), so that the
    common event is encoded by orjson with no walk.
    """
    data = checkpoint_event_data(step, source, parent_id, run_id)
    plain = (
        (step is None or (type(step) is int and MIN_INT <= step <= MAX_INT))
        and (source is None or (type(source) is str and source.isascii()))
        and (parent_id is None or (type(parent_id) is str and parent_id.isascii()))
        and (run_id is None or (type(run_id) is str and run_id.isascii()))
    )
    return dumps_json(data, "event data", kind=PLAIN if plain else None)


def writes_event_data(task_id: str, task_path: str, channels: list[str]) -> dict[str, Any]:
    """Return the data of a put_writes' `writes` event, as both stores log it."""
    return {"task_id": task_id, "task_path": task_path, "channels": channels}


def writes_event_text(task_id: str, task_path: str, channels: list[str]) -> str:
    """Return `writes_event_data` as `dumps_json` writes it.

    Judged `PLAIN` as
    `checkpoint_event_text` judges a put's (a loop, not `all()` over a
    generator: a put_writes has one or two channels, and the generator
    cost more than the rest of the test).
    """
    plain = (
        type(task_id) is str
        and task_id.isascii()
        and type(task_path) is str
        and task_path.isascii()
    )
    if plain:
        for channel in channels:
            if type(channel) is not str or not channel.isascii():
                plain = False
                break
    data = writes_event_data(task_id, task_path, channels)
    return dumps_json(data, "event data", kind=PLAIN if plain else None)


def decode_event(thread_id: str, row: tuple[Any, ...], incarnation: int = 1) -> Event:
    """Rebuild an `Event` from an `EVENTS_AFTER` row, checking its checksum first.

    Raises:
        UndecodableRow: the checksum does not hold (or is missing), or a cell
            has the wrong type, or `data` is not a JSON object.
    """
    seq, kind, ns, cid, data, token, ts, stored = row

    def bad(reason: str) -> UndecodableRow:
        where = f"event seq {seq!r:.40}"
        return UndecodableRow(
            thread_id,
            None,
            f"{where}: {reason}",
            message=f"thread {thread_id!r} {where} does not decode: {reason}",
        )

    if type(seq) is not int:
        raise bad(f"seq holds {type(seq).__name__}, expected an integer")
    # The checksum first: nothing of a damaged row is decoded or trusted.
    if stored is None:
        raise bad("the row has no checksum (written outside this library?)")
    if stored != checksum(kind, data):
        raise bad("checksum mismatch: the row was damaged or changed outside this library")
    for column, value, types in (
        ("kind", kind, (str,)),
        ("checkpoint_ns", ns, (str, type(None))),
        ("checkpoint_id", cid, (str, type(None))),
        ("token", token, (int, type(None))),
        ("ts", ts, (int, float)),
    ):
        if type(value) not in types:
            raise bad(f"{column} holds {type(value).__name__}")
    try:
        decoded = loads_json(data, "event data")
    except SerializationError as exc:
        raise bad(str(exc)) from exc
    if not isinstance(decoded, dict):
        raise bad(f"data is JSON {type(decoded).__name__}, expected an object")
    return Event(thread_id, seq, kind, decoded, ns, cid, token, float(ts), incarnation)


def _floor_of(thread_id: str, row: tuple[Any, ...]) -> tuple[int, int]:
    # GET_FLOOR's (floor, next_seq), GET_REPLAY_BOUNDS' (floor, incarnation):
    # text there would break the arithmetic.
    floor, next_seq = row
    if type(floor) is not int or type(next_seq) is not int:
        reason = f"threads.floor holds {type(floor).__name__} {floor!r:.40}, expected an integer"
        raise UndecodableRow(
            thread_id, None, reason, message=f"thread {thread_id!r}: damaged thread row: {reason}"
        )
    return floor, next_seq


# With a doorbell, watchers poll `PRAGMA data_version` only as a safety net,
# for commits that ring no bell (plain sqlite3, an older version of this
# library, another host on a network file system): at least this often.
SAFETY_POLL = 1.0
