"""Argument checks that run before the file is touched.

Invariant: every public entry point validates its arguments here first, and a
bad argument raises `InvalidArgument` (both a `ValueError` and a `TypeError`)
naming it, before any engine job is submitted. What these checks let through
can be bound to SQLite and encoded without a raw error: strings hold no lone
surrogate (SQLite text is UTF-8, and encoding one fails *inside* the write
transaction), integers fit SQLite's signed 64 bits, JSON objects have string
keys (JSON would silently turn others into strings) and bounded nesting.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
from collections import ChainMap, deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ParamSpec, TypeVar

from langchain_core.runnables import RunnableConfig

from ..errors import bad_argument

# One bound for JSON nesting and integers, on arguments and on stored cells
# alike; one quick walk (`json_kind`) for both.
from .stored_json import MAX_INT, MAX_JSON_DEPTH, MIN_INT, NOT_FINE, PLAIN, json_kind

P = ParamSpec("P")
R = TypeVar("R")

MAX_ID_LENGTH = 1024


def _has_surrogate(value: str) -> bool:
    if value.isascii():
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_text(value: Any, name: str) -> str:
    """Return `value` if it is a string SQLite can store as UTF-8 text.

    Raises:
        InvalidArgument: not a string, or it holds a lone surrogate.
    """
    if not isinstance(value, str):
        raise bad_argument(name, f"expected a string, got {type(value).__name__}")
    if _has_surrogate(value):
        raise bad_argument(name, "contains a lone surrogate (not valid UTF-8)")
    return value


def check_name(value: Any, name: str, *, allow_empty: bool = False) -> str:
    """Return `value` if it is a bounded string without NUL (non-empty unless allowed).

    Raises:
        InvalidArgument: not a string; empty, too long, containing NUL or a
            lone surrogate.
    """
    if type(value) is str and len(value) <= MAX_ID_LENGTH and value.isascii():
        # The common case (ids LangGraph makes, the empty root namespace), in one test.
        if "\x00" not in value and (value or allow_empty):
            return value
    if not isinstance(value, str):
        raise bad_argument(name, f"expected a string, got {type(value).__name__}")
    if not value and not allow_empty:
        raise bad_argument(name, "must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise bad_argument(name, f"longer than {MAX_ID_LENGTH} characters")
    if "\x00" in value:
        raise bad_argument(name, "must not contain NUL")
    return check_text(value, name)


def check_int(value: Any, name: str, *, minimum: int = 0) -> int:
    """Return `value` if it is an int (not bool) from `minimum` to 2**63 - 1.

    Raises:
        InvalidArgument: not an int, below `minimum`, or beyond 64 bits.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_argument(name, f"expected an int, got {type(value).__name__}")
    if value < minimum:
        raise bad_argument(name, f"must be at least {minimum}, got {value}")
    if value > MAX_INT:
        raise bad_argument(name, f"must be at most 2**63 - 1 (SQLite's INTEGER), got {value}")
    return value


def check_bool(value: Any, name: str) -> bool:
    """Return `value` if it is a bool.

    Raises:
        InvalidArgument: anything else (a truthy string is not a yes).
    """
    if not isinstance(value, bool):
        raise bad_argument(name, f"expected a bool, got {type(value).__name__}")
    return value


def check_limit(value: Any, name: str = "limit") -> int | None:
    """Return a positive page size, or None for no limit."""
    if value is None:
        return None
    return check_int(value, name, minimum=1)


def check_json(value: Any, name: str, *, strict: bool = False) -> Any:
    """Return `value` if its structure can be stored as JSON and read back equal.

    Checks every dict key is a string, every string is valid UTF-8, every int
    fits 64 bits and nesting stays within `MAX_JSON_DEPTH`. With `strict`,
    only JSON types (and finite floats) pass; otherwise other leaves are left
    for the serializer, which refuses them naming their type.

    Raises:
        InvalidArgument: naming `name` and the path to the offending part.
    """
    # Every put checks its envelope and metadata: a walk that only answers
    # "fine" (no paths built) first; the walk below, which names the
    # offending part, runs only for a value that is not.
    try:
        if _json_fine(value, 0, strict):
            return value
    except RecursionError:
        pass  # far too deep for the quick walk: the walk below names where
    stack: list[tuple[Any, str, int]] = [(value, name, 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, str):
            check_text(item, where)
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not MIN_INT <= item <= MAX_INT:
                raise bad_argument(where, f"integer beyond 64 bits: {item}")
        elif isinstance(item, float):
            if strict and not math.isfinite(item):
                raise bad_argument(where, f"must be a finite number, got {item!r}")
        elif isinstance(item, (Mapping, list, tuple)):
            if depth >= MAX_JSON_DEPTH:
                raise bad_argument(where, f"nested deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(item, Mapping):
                for key, sub in item.items():
                    if not isinstance(key, str):
                        raise bad_argument(
                            where, f"keys must be strings, got {type(key).__name__} {key!r}"
                        )
                    check_text(key, f"{where}[{key!r}]")
                    stack.append((sub, f"{where}[{key!r}]", depth + 1))
            else:
                stack.extend((sub, f"{where}[{i}]", depth + 1) for i, sub in enumerate(item))
        elif strict:
            raise bad_argument(where, f"expected JSON data, got {type(item).__name__}")
    return value


def _json_fine(item: Any, depth: int, strict: bool) -> int:
    """Whether `check_json` would accept `item` at `depth` (exact types first, fast).

    Truthy (`FINE` or `PLAIN`, see `stored_json.json_kind`) if it would;
    `NOT_FINE` means the full walk decides.
    """
    return json_kind(item, depth, strict)


def check_dict(value: Any, name: str, *, optional: bool = False) -> Mapping[str, Any]:
    """Return `value` if it is a dict or another mapping (`{}` for None when `optional`)."""
    if value is None and optional:
        return {}
    if not isinstance(value, Mapping):
        raise bad_argument(name, f"expected a dict, got {type(value).__name__}")
    return value


def check_config(config: Any, name: str = "config") -> Mapping[str, Any]:
    """Return a config's `configurable` dict, checking the config's shape.

    A config is a dict; its `configurable` and `metadata`, when present, are
    dicts (LangGraph copies their keys into checkpoint metadata); its
    `configurable` string values become metadata, so they must be storable.

    Raises:
        InvalidArgument: naming the part of the config that is wrong.
    """
    # Every call checks its config: exact dicts and types first (an ABC
    # isinstance check costs more than the rest of this walk).
    if type(config) is not dict and not isinstance(config, Mapping):
        raise bad_argument(name, f"expected a RunnableConfig dict, got {type(config).__name__}")
    conf = config.get("configurable", {})
    if type(conf) is not dict and not isinstance(conf, Mapping):
        raise bad_argument(f'{name}["configurable"]', f"expected a dict, got {conf!r}")
    for key, value in conf.items():
        if type(key) is not str and not isinstance(key, str):
            raise bad_argument(f'{name}["configurable"]', f"keys must be strings, got {key!r}")
        kind = type(value)
        if kind is str:
            if value.isascii():
                continue
        elif kind is not int and not isinstance(value, (str, int)):
            continue
        if not _json_fine(value, 0, False):
            check_json(value, f'{name}["configurable"][{key!r}]')
    metadata = config.get("metadata")
    if metadata is not None and not _metadata_fine(metadata):
        check_json(check_dict(metadata, f'{name}["metadata"]'), f'{name}["metadata"]')
    return conf


def flat_metadata(metadata: Any) -> dict[Any, Any] | None:
    """Return a config's metadata as one exact dict, or None when it is neither kind below.

    An exact dict is returned as it is; what LangGraph passes in a graph (a
    `ChainMap` of dicts) as its dicts merged the way its lookups see them
    (the first map holding a key wins), in its iteration order: the same
    items, read in C instead of through `ChainMap`'s Python methods (every
    call of a graph's step reads its config's metadata).
    """
    kind = type(metadata)
    if kind is dict:
        return metadata
    if kind is not ChainMap:
        return None
    maps = metadata.maps
    for part in maps:
        if type(part) is not dict:
            return None
    merged: dict[Any, Any] = {}
    for part in reversed(maps):
        merged.update(part)
    return merged


def _metadata_fine(metadata: Any) -> bool:
    """Whether `check_json(check_dict(metadata))` surely accepts a config's metadata.

    Its quick walk, for an exact dict and for a `ChainMap` of dicts
    (`flat_metadata`): `check_json` walks any other mapping in full,
    building a path per key, 30k instructions on every call of a graph's
    step. False: the full check decides (and names what is wrong).
    """
    flat = flat_metadata(metadata)
    if flat is None:
        return False
    try:
        return json_kind(flat) != NOT_FINE
    except RecursionError:
        return False  # far too deep for the quick walk: `check_json` names where


def config_target(
    config: RunnableConfig | None, *, need_id: bool = False
) -> tuple[str, str, str | None]:
    """Return `(thread_id, checkpoint_ns, checkpoint_id)` from a config.

    Raises:
        InvalidArgument: the config is malformed, names no thread, or (with
            `need_id`) no checkpoint.
    """
    return conf_target(check_config(config), need_id=need_id)


def conf_target(conf: Mapping[str, Any], *, need_id: bool = False) -> tuple[str, str, str | None]:
    """`config_target` of a config whose `configurable` dict `check_config` returned.

    For a caller that checked the config already (`list`), so that it is
    not walked twice.

    Raises:
        InvalidArgument: as `config_target`, but for the config's shape.
    """
    thread_id = conf.get("thread_id")
    ns = conf.get("checkpoint_ns") or ""
    cid = conf.get("checkpoint_id") or None
    # The common config (ids LangGraph makes, the root namespace): what
    # `check_name` accepts at once, tested inline for the three (every
    # call of the saver starts here); any other goes the whole way below.
    if (
        type(thread_id) is str
        and 0 < len(thread_id) <= MAX_ID_LENGTH
        and thread_id.isascii()
        and "\x00" not in thread_id
        and type(ns) is str
        and len(ns) <= MAX_ID_LENGTH
        and ns.isascii()
        and "\x00" not in ns
    ):
        if cid is None:
            if not need_id:
                return thread_id, ns, None
        elif type(cid) is str and len(cid) <= MAX_ID_LENGTH and cid.isascii() and "\x00" not in cid:
            return thread_id, ns, cid
    if thread_id is None:
        raise bad_argument('config["configurable"]["thread_id"]', "required")
    if isinstance(thread_id, int) and not isinstance(thread_id, bool):
        thread_id = str(thread_id)  # LangGraph itself turns non-str ids into str
    check_name(thread_id, 'config["configurable"]["thread_id"]')
    check_name(ns, 'config["configurable"]["checkpoint_ns"]', allow_empty=True)
    if cid is not None:
        check_name(cid, 'config["configurable"]["checkpoint_id"]')
    elif need_id:
        raise bad_argument('config["configurable"]["checkpoint_id"]', "required")
    return thread_id, ns, cid


def check_checkpoint(checkpoint: Any, metadata: Any) -> tuple[dict[str, Any], bool, bool]:
    """Check a `put`'s checkpoint envelope and metadata can be stored and read back.

    Channel values are the serializer's to judge; everything else is JSON.

    Returns:
        The envelope (the checkpoint without its channel values: a new dict,
        which `encode_checkpoint` takes instead of building it again);
        whether it is `PLAIN` JSON, which `dumps_json(..., kind=PLAIN)` then
        encodes with no second walk; and whether the metadata is (an exact
        dict, `PLAIN`), so that `encode_checkpoint` need not walk it again either.

    Raises:
        InvalidArgument: naming `checkpoint` or `metadata` and the bad part.
    """
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("id"), str):
        raise bad_argument("checkpoint", 'expected a Checkpoint dict with a str "id"')
    check_name(checkpoint["id"], 'checkpoint["id"]')
    # One quick walk of the whole envelope (its parts one level down, as
    # below); the walk that names the bad part only when it is not fine.
    if type(checkpoint) is dict:
        # A copy in C, then one key out: a comprehension costs 7k instructions.
        envelope = checkpoint.copy()
        envelope.pop("channel_values", None)
    else:
        envelope = {k: v for k, v in checkpoint.items() if k != "channel_values"}
    kind = json_kind(envelope, -1, False)
    if kind == NOT_FINE:
        for key, value in checkpoint.items():
            if key != "channel_values":
                check_json(value, f"checkpoint[{key!r}]")
    # `check_json(check_dict(metadata))`, its quick walk done here so that
    # its answer (plain or not) is kept.
    try:
        md_kind = json_kind(metadata) if type(metadata) is dict else NOT_FINE
    except RecursionError:
        md_kind = NOT_FINE  # far too deep for the quick walk: `check_json` names where
    if md_kind == NOT_FINE:
        check_json(check_dict(metadata, "metadata"), "metadata")
    return envelope, kind == PLAIN, md_kind == PLAIN


def check_writes(writes: Any) -> list[tuple[str, Any]]:
    """Return `put_writes`' writes as a list of `(channel, value)` pairs.

    Raises:
        InvalidArgument: not a sequence of 2-tuples whose channel is a name.
    """
    # A list, tuple or deque (LangGraph's loop passes a deque) is taken as it
    # is, without `check_iterable`'s two ABC checks (6k instructions a write).
    kind = type(writes)
    if kind is list or kind is tuple or kind is deque:
        items = list(writes)
    else:
        items = check_iterable(writes, "writes")
    for i, item in enumerate(items):
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise bad_argument(f"writes[{i}]", f"expected a (channel, value) pair, got {item!r}")
        channel = item[0]
        # `check_name`'s common case, tested here: its argument's name is
        # built only for a channel that fails it.
        if not (
            type(channel) is str
            and channel
            and len(channel) <= MAX_ID_LENGTH
            and channel.isascii()
            and "\x00" not in channel
        ):
            check_name(channel, f"writes[{i}][0] (channel)")
    return items


def check_iterable(value: Any, name: str) -> list[Any]:
    """Return the items of a list-like argument (not a string, bytes or a dict).

    Raises:
        InvalidArgument: `value` is not iterable, or is a str/bytes/mapping.
    """
    if isinstance(value, (str, bytes, bytearray, Mapping)) or not isinstance(value, Iterable):
        raise bad_argument(name, f"expected a list, got {type(value).__name__}")
    return list(value)


def check_filter(value: Any) -> Mapping[str, Any] | None:
    """Return a `list` metadata filter: None, or a dict of JSON values under string keys."""
    if value is None:
        return None
    return check_json(check_dict(value, "filter"), "filter", strict=True)


# A checkpoint's own key, as LangGraph's Agent Server passes `before`.
_CHECKPOINT_KEYS = frozenset({"thread_id", "checkpoint_ns", "checkpoint_id"})


def check_keys_nested(config: Any, name: str) -> None:
    """Refuse a config whose checkpoint keys stand beside `configurable`, not in it.

    Read as it is, such a config names no thread or checkpoint at all.

    Raises:
        InvalidArgument: (`name`) `thread_id`, `checkpoint_ns` or
            `checkpoint_id` at the config's top level, with no `configurable`.
    """
    if isinstance(config, Mapping) and "configurable" not in config:
        stray = sorted(k for k in _CHECKPOINT_KEYS if k in config)
        if stray:
            raise bad_argument(name, f"put {', '.join(stray)} in {name}['configurable']")


def check_before(value: Any) -> str | None:
    """Return the checkpoint id `list`'s `before` names (None: no `before`).

    Two shapes name a checkpoint: a config (`{"configurable": {...,
    "checkpoint_id": ID}}`, as LangGraph passes it) and a checkpoint's own
    key (`{"thread_id": ..., "checkpoint_ns": ..., "checkpoint_id": ID}`,
    with no `configurable`, as LangGraph's Agent Server passes it when it
    pages history). Anything else names no checkpoint and is refused: read
    as "no `before`", it would silently return the first page again.

    Raises:
        InvalidArgument: (`before...`) any other shape, or a bad id.
    """
    if value is None:
        return None
    if (
        isinstance(value, Mapping)
        and "configurable" not in value
        and value.keys() & _CHECKPOINT_KEYS
    ):
        extra = sorted(map(str, value.keys() - _CHECKPOINT_KEYS))
        if extra:
            raise bad_argument("before", f"a checkpoint's key has no {', '.join(extra)}")
        for key in ("thread_id", "checkpoint_ns"):
            if key in value:
                check_name(value[key], f"before[{key!r}]", allow_empty=key == "checkpoint_ns")
        if value.get("checkpoint_id") is None:
            raise bad_argument('before["checkpoint_id"]', "names no checkpoint")
        return check_name(value["checkpoint_id"], 'before["checkpoint_id"]')
    conf = check_config(value, "before")
    cid = conf.get("checkpoint_id")
    if cid is None:
        raise bad_argument(
            'before["configurable"]["checkpoint_id"]',
            "names no checkpoint: give the config of the checkpoint to page below",
        )
    return check_name(cid, 'before["configurable"]["checkpoint_id"]')


def checked_arguments(fn: Callable[P, R]) -> Callable[P, R]:
    """Make a call with an unknown, missing or surplus argument raise `InvalidArgument`.

    Python reports these as a bare `TypeError` ("unexpected keyword argument
    'busy_timout'"); the wrapped function names the argument instead, and for
    a misspelt keyword the one it resembles, before its body runs. The
    signature is kept, so a type checker still flags the typo.

    Args:
        fn: The function (or method) to wrap.

    Returns:
        `fn`, checking how it is called.
    """
    signature = inspect.signature(fn)
    where = fn.__qualname__.removesuffix(".__init__")

    @functools.wraps(fn)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise _binding_error(signature, where, args, kwargs, exc) from None
        return fn(*args, **kwargs)

    return checked


def _binding_error(
    signature: inspect.Signature,
    where: str,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    exc: TypeError,
) -> Exception:
    """Return the `InvalidArgument` for a call that does not fit `signature`."""
    params = [p for p in signature.parameters.values() if p.name not in ("self", "cls")]
    offset = len(signature.parameters) - len(params)  # self/cls, passed positionally
    keywords = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [name for name in kwargs if name not in keywords]
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(name, keywords, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return bad_argument(
            name, f"{where} takes no argument {name!r}{hint}; it takes {', '.join(keywords)}"
        )
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    given = positional[: max(len(args) - offset, 0)]
    for p in given:
        if p.name in kwargs:
            return bad_argument(p.name, f"{where} got it both by position and by keyword")
    for p in params:
        required = p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        if required and p not in given and p.name not in kwargs:
            return bad_argument(p.name, f"{where} needs it")
    return bad_argument("args", f"{where}: {exc}")
