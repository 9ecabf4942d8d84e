"""`lgfs`'s commands as they register: each command's arguments stand beside its body.

Invariant: a command is one function decorated with `@command(name, help,
*options)`, whose options (`arg(...)` and the shared groups below) add its
arguments, as sqlite-utils stacks `@click.option`s on its commands.
`main.build_parser` builds the parser from this registry in `ORDER`, so
`--help` lists the commands in one order whichever module registered them,
and a command registered twice, or left out of `ORDER`, fails at once.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ORDER", "REGISTRY", "Command", "arg", "command", "defaults"]

# What `lgfs --help` lists, in this order (each name registered by its module).
ORDER = (
    "threads",
    "history",
    "show",
    "diff",
    "claims",
    "events",
    "prune",
    "sweep",
    "compact",
    "retract",
    "delete",
    "runs",
    "doctor",
    "migrate",
    "repack",
    "rekey",
    "vacuum",
    "import-sqlitesaver",
    "import-postgressaver",
    "copy-to",
)

# Adds arguments (or defaults) to a command's parser.
Option = Callable[[argparse.ArgumentParser], object]


@dataclass(frozen=True)
class Command:
    """One `lgfs` command: its function, one-line help and the options that add its arguments."""

    name: str
    fn: Callable[..., int]
    help: str
    options: tuple[Option, ...]
    streams: bool
    usage: str | None


REGISTRY: dict[str, Command] = {}


def command(
    name: str, help: str, *options: Option, streams: bool = False, usage: str | None = None
) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Register the decorated function as `lgfs NAME`, with its arguments added by `options`.

    Args:
        name: The command's name (one of `ORDER`).
        help: Its one line in `lgfs --help`, and its description.
        options: What adds its arguments, in order: `arg(...)` or a shared group.
        streams: Whether it may print `--nl` (one JSON object per line) as well as `--json`.
        usage: A usage line of its own (default: argparse's).

    Raises:
        RuntimeError: the name is registered already, or not in `ORDER`.
    """

    def register(fn: Callable[..., int]) -> Callable[..., int]:
        if name in REGISTRY:
            raise RuntimeError(f"lgfs {name} is registered twice")
        if name not in ORDER:
            raise RuntimeError(f"lgfs {name} is missing from commands.ORDER")
        REGISTRY[name] = Command(name, fn, help, options, streams, usage)
        return fn

    return register


def arg(*names: str, **kwargs: Any) -> Option:
    """Return an option that adds one argument (`ArgumentParser.add_argument`'s arguments)."""
    return lambda parser: parser.add_argument(*names, **kwargs)


def defaults(**values: Any) -> Option:
    """Return an option that sets argument defaults the command's body reads."""
    return lambda parser: parser.set_defaults(**values)


# --- argument groups several commands share -------------------------------------------

FILE_HELP = "the checkpoint file (or --db PATH, or $LGFS_PATH)"


def path_only(parser: argparse.ArgumentParser) -> None:
    """Add `PATH`, the checkpoint file (optional: `--db` or `$LGFS_PATH` name it too)."""
    parser.add_argument("path", metavar="PATH", nargs="?", help=FILE_HELP)


def path_thread(parser: argparse.ArgumentParser) -> None:
    """Add `PATH THREAD`."""
    path_only(parser)
    parser.add_argument("thread", metavar="THREAD", help="the thread id")


def path_thread_ns(parser: argparse.ArgumentParser) -> None:
    """Add `PATH THREAD` and `--ns`, a checkpoint namespace or a unique prefix of one."""
    path_thread(parser)
    parser.add_argument(
        "--ns",
        default="",
        help='checkpoint namespace, or a unique prefix of one (default "", the root)',
    )


def yes(what: str = "remove data") -> Option:
    """Return the `-y/--yes` option: do `what` without asking."""
    return arg("-y", "--yes", action="store_true", help=f"{what} without asking")


def view(parser: argparse.ArgumentParser) -> None:
    """Add `--full`: show everything, uncut."""
    parser.add_argument("--full", action="store_true", help="show everything, uncut")


def view_channels(parser: argparse.ArgumentParser) -> None:
    """Add `--full` and `--all-channels` (LangGraph's internal channels too)."""
    view(parser)
    parser.add_argument(
        "--all-channels", action="store_true", help="show LangGraph's internal channels too"
    )
