"""Argument checks that run before the file is touched.

Invariant: every public entry point validates its arguments here first, and a
bad argument raises a `ValueError`/`TypeError` that names it.
"""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig

from .errors import bad_argument

MAX_ID_LENGTH = 1024


def check_name(value: Any, name: str, *, allow_empty: bool = False) -> str:
    """Return `value` if it is a bounded string without NUL (non-empty unless allowed).

    Raises:
        TypeError: not a string.
        ValueError: empty, too long, or containing NUL.
    """
    if not isinstance(value, str):
        raise bad_argument(name, f"expected a string, got {type(value).__name__}")
    if not value and not allow_empty:
        raise bad_argument(name, "must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise bad_argument(name, f"longer than {MAX_ID_LENGTH} characters")
    if "\x00" in value:
        raise bad_argument(name, "must not contain NUL")
    return value


def check_int(value: Any, name: str, *, minimum: int = 0) -> int:
    """Return `value` if it is an int (not bool) of at least `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_argument(name, f"expected an int, got {type(value).__name__}")
    if value < minimum:
        raise bad_argument(name, f"must be at least {minimum}, got {value}")
    return value


def check_limit(value: Any, name: str = "limit") -> int | None:
    """Return a positive page size, or None for no limit."""
    if value is None:
        return None
    return check_int(value, name, minimum=1)


def config_target(
    config: RunnableConfig | None, *, need_id: bool = False
) -> tuple[str, str, str | None]:
    """Return `(thread_id, checkpoint_ns, checkpoint_id)` from a config.

    Raises:
        ValueError: the config names no thread, or (with `need_id`) no checkpoint.
    """
    if not isinstance(config, dict):
        raise bad_argument("config", f"expected a RunnableConfig dict, got {type(config).__name__}")
    conf = config.get("configurable")
    if not isinstance(conf, dict) or conf.get("thread_id") is None:
        raise bad_argument('config["configurable"]["thread_id"]', "required")
    thread_id = conf["thread_id"]
    if isinstance(thread_id, int) and not isinstance(thread_id, bool):
        thread_id = str(thread_id)  # LangGraph itself turns non-str ids into str
    check_name(thread_id, 'config["configurable"]["thread_id"]')
    ns = conf.get("checkpoint_ns") or ""
    check_name(ns, 'config["configurable"]["checkpoint_ns"]', allow_empty=True)
    cid = conf.get("checkpoint_id") or None
    if cid is not None:
        check_name(cid, 'config["configurable"]["checkpoint_id"]')
    elif need_id:
        raise bad_argument('config["configurable"]["checkpoint_id"]', "required")
    return thread_id, ns, cid
