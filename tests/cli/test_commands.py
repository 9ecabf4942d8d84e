"""`lgfs`'s command registry: every command registers once, beside its body, in one order."""

from __future__ import annotations

import argparse

import pytest

from langgraph_fenced_sqlite.cli import commands
from langgraph_fenced_sqlite.cli.main import build_parser


def _subcommands(parser: argparse.ArgumentParser) -> list[str]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(sub.choices)


def test_the_parser_lists_every_registered_command_in_order() -> None:
    """`lgfs --help` lists exactly `ORDER`, each command run by the function it decorates."""
    parser = build_parser()
    assert _subcommands(parser) == list(commands.ORDER)
    assert set(commands.REGISTRY) == set(commands.ORDER)
    for name, spec in commands.REGISTRY.items():
        args = parser.parse_args(
            {
                "runs": ["runs", "cancel", "t"],
                "copy-to": ["copy-to", "postgresql://x"],
                "import-sqlitesaver": [name, "a", "b"],
                "import-postgressaver": [name, "a", "b"],
                "compact": ["compact", "t", "--before", "2"],
            }.get(
                name,
                [name, "t"]
                if name in {"history", "show", "diff", "events", "retract", "delete"}
                else [name],
            )
        )
        assert args.func is spec.fn, name


def test_a_command_registers_once_and_only_by_a_known_name() -> None:
    """A second `threads`, or a name `ORDER` does not list, fails when its module loads."""
    before = dict(commands.REGISTRY)
    with pytest.raises(RuntimeError, match="registered twice"):
        commands.command("threads", "again")(lambda args, out: 0)
    with pytest.raises(RuntimeError, match="missing from commands.ORDER"):
        commands.command("no-such-command", "new")(lambda args, out: 0)
    assert commands.REGISTRY == before
