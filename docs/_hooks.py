"""MkDocs hook: the `lgfs` reference page, generated from the program's own `--help`.

The page `reference/cli.md` holds a marker that this hook replaces with
`lgfs --help` and every command's `--help`, each taken from
`python -m langgraph_fenced_sqlite` at build time (the public entry point, so
nothing here depends on where the CLI's modules live). A command added to the
parser is on the page at the next build; a page that lost its marker, or a
program that lists no command, fails the build.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

from mkdocs.exceptions import PluginError

PAGE = "reference/cli.md"
MARKER = "<!-- lgfs-help -->"
COLUMNS = "100"  # argparse wraps to $COLUMNS; the guide's `lgfs --help` is shown at 100 too

# Run in one child interpreter: `python -m langgraph_fenced_sqlite ARGS --help` for each
# ARGS, stdout captured; prints {"ARGS joined by spaces": help text} as JSON.
_COLLECT = """
import contextlib, io, json, runpy, sys
out = {}
for args in json.loads(sys.argv[1]):
    buf = io.StringIO()
    sys.argv = ["lgfs", *args, "--help"]
    with contextlib.redirect_stdout(buf):
        try:
            runpy.run_module("langgraph_fenced_sqlite", run_name="__main__", alter_sys=True)
        except SystemExit as exit:
            if exit.code not in (0, None):
                raise
    out[" ".join(args)] = buf.getvalue()
print(json.dumps(out))
"""


def collect_help(commands: list[list[str]]) -> dict[str, str]:
    """Return the `--help` of each command (a list of arguments; `[]` is `lgfs` itself)."""
    env = {**os.environ, "COLUMNS": COLUMNS, "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _COLLECT, json.dumps(commands)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    if done.returncode != 0:
        raise PluginError(f"`lgfs --help` failed:\n{done.stderr}")
    result: dict[str, str] = json.loads(done.stdout)
    return result


def command_names(top_help: str) -> list[str]:
    """Return the commands `lgfs --help` lists under its COMMAND argument, in its order."""
    block = top_help.split("positional arguments:", 1)[-1].split("\n\n", 1)[0]
    names = re.findall(r"^ {4}([a-z][a-z0-9-]*)(?: |$)", block, re.M)
    if not names:
        raise PluginError("`lgfs --help` lists no command: the reference would be empty")
    return names


def render() -> str:
    """Return the Markdown of the reference: `lgfs --help`, then each command's."""
    top = collect_help([[]])[""]
    names = command_names(top)
    helps = collect_help([[name] for name in names])
    parts = ["## `lgfs`", "", "```text", f"$ lgfs --help\n{top.rstrip()}", "```", ""]
    for name in names:
        parts += [f"## `lgfs {name}`", "", "```text"]
        parts += [f"$ lgfs {name} --help\n{helps[name].rstrip()}", "```", ""]
    return "\n".join(parts)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Put the generated reference in place of the marker on the reference page."""
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise PluginError(f"{PAGE} lost its marker {MARKER!r}: nothing to generate into")
    return markdown.replace(MARKER, render())
