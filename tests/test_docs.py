"""README.md's CLI section documents every `lgfs` command and exit code, with current help.

Like sqlite-utils' `tests/test_docs.py`: adding a command to the parser
without documenting it (with real output) fails here.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest

from langgraph_fenced_sqlite.cli.main import EXIT_CODES, build_parser

README = Path(__file__).resolve().parent.parent / "README.md"


def cli_section() -> str:
    """The text between the README's `cli` markers."""
    text = README.read_text(encoding="utf-8")
    start, end = "<!-- cli:start -->", "<!-- cli:end -->"
    assert start in text and end in text, "README.md lost its cli markers"
    return text.split(start, 1)[1].split(end, 1)[0]


def commands() -> list[str]:
    """Every subcommand the parser knows."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


@pytest.mark.parametrize("command", commands())
def test_every_command_is_documented_with_real_output(command: str) -> None:
    section = cli_section()
    name = re.escape(command)
    assert re.search(rf"`lgfs {name}(?![\w-])", section), f"`lgfs {command}` is not described"
    assert re.search(rf"^\$ lgfs {name}(?![\w-])", section, re.M), (
        f"`lgfs {command}` has no example output"
    )


def test_every_exit_code_is_documented() -> None:
    section = cli_section()
    for code, meaning in EXIT_CODES:
        assert f"| {code} | {meaning} |" in section


def test_the_documented_help_is_the_current_help(monkeypatch: Any) -> None:
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps to the terminal's width
    assert f"$ lgfs --help\n{build_parser().format_help()}```" in cli_section()
