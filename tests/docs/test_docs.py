"""The `lgfs` guide (docs/cli.md) documents every command and exit code, with current help;
the generated reference (docs/reference/cli.md) holds every command's current `--help`.

Like sqlite-utils' `tests/test_docs.py`: adding a command to the parser
without documenting it (with real output) fails here.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from langgraph_fenced_sqlite.cli.main import EXIT_CODES, build_parser

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "cli.md"
HOOKS = ROOT / "docs" / "_hooks.py"


def cli_section() -> str:
    """The text between the guide's `cli` markers."""
    text = GUIDE.read_text(encoding="utf-8")
    start, end = "<!-- cli:start -->", "<!-- cli:end -->"
    assert start in text and end in text, "docs/cli.md lost its cli markers"
    return text.split(start, 1)[1].split(end, 1)[0]


def subparsers() -> dict[str, argparse.ArgumentParser]:
    """Every subcommand the parser knows, with its parser."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def commands() -> list[str]:
    """Every subcommand the parser knows."""
    return sorted(subparsers())


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


# --- the generated reference ------------------------------------------------------------------


def load_hooks() -> ModuleType:
    """Import docs/_hooks.py, the MkDocs hook that writes the reference page."""
    spec = importlib.util.spec_from_file_location("lgfs_docs_hooks", HOOKS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference() -> str:
    """The Markdown the hook puts on docs/reference/cli.md (as `mkdocs build` does)."""
    text: str = load_hooks().render()
    return text


@pytest.mark.subprocess
@pytest.mark.parametrize("command", commands())
def test_every_command_has_its_current_help_in_the_reference(
    command: str, reference: str, monkeypatch: Any
) -> None:
    """The generated page has a section per command holding the parser's help, word for word."""
    monkeypatch.setenv("COLUMNS", "100")  # the hook takes the help at 100 columns
    assert f"\n## `lgfs {command}`\n" in reference, f"`lgfs {command}` has no reference section"
    help_text = subparsers()[command].format_help().rstrip()
    assert f"$ lgfs {command} --help\n{help_text}\n```" in reference


@pytest.mark.subprocess
def test_the_reference_lists_exactly_the_parsers_commands(reference: str) -> None:
    """No section for a command the parser does not have; `lgfs --help` comes first."""
    sections = re.findall(r"^## `lgfs ?([\w-]*)`$", reference, re.M)
    assert sections[0] == ""
    assert sorted(sections[1:]) == commands()
    assert "$ lgfs --help\nusage: lgfs " in reference


def test_the_reference_page_keeps_the_hooks_marker() -> None:
    """The page the hook fills in still has the marker it replaces (else the build fails)."""
    hooks = load_hooks()
    assert hooks.MARKER in (ROOT / "docs" / hooks.PAGE).read_text(encoding="utf-8")
    mkdocs = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^hooks:\n  - docs/_hooks\.py", mkdocs, re.M)
