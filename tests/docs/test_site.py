"""The documentation site builds strictly, with every public name and `lgfs` command on it.

`mkdocs build --strict` (as `.ci/run` runs it) fails on a broken link or
anchor, a page left out of the nav, or a `:::` reference that names nothing;
the builds below check that it does, and that what the reference pages
promise is on the built site: every public name at its public path, every
command's current `--help`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _doc_pages import DOCS, PAGES, ROOT

import langgraph_fenced_sqlite
import langgraph_fenced_sqlite.agent_server
import langgraph_fenced_sqlite.postgres
import langgraph_fenced_sqlite.testing
from langgraph_fenced_sqlite.cli.main import build_parser

PUBLIC = {
    f"{module.__name__}.{name}"
    for module in (
        langgraph_fenced_sqlite,
        langgraph_fenced_sqlite.agent_server,
        langgraph_fenced_sqlite.postgres,
        langgraph_fenced_sqlite.testing,
    )
    for name in module.__all__
}


def references() -> list[str]:
    """Every `::: identifier` line of the site's pages, in page order."""
    found = []
    for page in PAGES:
        found += re.findall(r"^::: (\S+)\s*$", page.read_text(encoding="utf-8"), re.M)
    return found


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """Run `mkdocs build --strict` on a config, into `site`."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def commands() -> list[str]:
    """Every subcommand the parser knows."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


def test_the_reference_shows_every_public_name_by_its_public_path() -> None:
    """The API pages render each name of the three `__all__`s, once, and nothing else.

    An internal module's path (`langgraph_fenced_sqlite.sqlite.saver...`) in a
    `:::` line would break when that module moves; a public name without one
    is missing from the reference.
    """
    found = references()
    assert sorted(set(found)) == sorted(found), "a name is rendered twice"
    assert set(found) - PUBLIC == set(), "names that are not public (or not at their public path)"
    assert PUBLIC - set(found) == set(), "public names missing from docs/reference/"


@pytest.mark.subprocess
def test_site_builds_strictly_with_every_name_and_command(tmp_path: Path) -> None:
    """`mkdocs build --strict` passes; the API and `lgfs` pages hold what they promise."""
    site = tmp_path / "site"
    result = build(ROOT / "mkdocs.yml", site)
    assert result.returncode == 0, result.stdout + result.stderr

    api = "".join(p.read_text(encoding="utf-8") for p in (site / "reference").rglob("*.html"))
    missing = [name for name in sorted(PUBLIC) if f'id="{name}"' not in api]
    assert not missing, f"not rendered: {missing}"
    # The savers' inherited methods (written once for both stores) are listed too.
    savers = ["FencedSqliteSaver", "postgres.FencedPostgresSaver"]
    for saver in (f"langgraph_fenced_sqlite.{name}" for name in savers):
        for method in ("claim", "take_over", "events_after", "watch", "prune", "get_tuple"):
            assert f'id="{saver}.{method}"' in api, f"{saver}.{method}"

    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "lgfs-help" not in cli, "the marker was not replaced"
    for command in commands():
        assert f"usage: lgfs {command} " in cli, f"`lgfs {command}` has no reference"

    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    titles = {doc["title"] for doc in index["docs"]}
    assert {"Claims, leases and fencing", "Events and watching"} <= titles
    for page in PAGES:  # every page under docs/ is built (and, by --strict, in the nav)
        if page.is_relative_to(DOCS):
            where = page.relative_to(DOCS).with_suffix("")
            built = site / (where.parent if where.name == "index" else where) / "index.html"
            assert built.exists(), page


DEFECTS = {
    "broken anchor": ("index.md", "\n[nowhere](semantics.md#no-such-section)\n", "no-such-section"),
    "broken link": ("index.md", "\n[nowhere](no-such-page.md)\n", "no-such-page.md"),
    "unknown reference": (
        "reference/errors.md",
        "\n::: langgraph_fenced_sqlite.Nothing\n",
        "langgraph_fenced_sqlite.Nothing",
    ),
    "page left out of the nav": ("stray.md", "# Stray\n", "stray.md"),
}


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_the_strict_build_fails_on(defect: str, tmp_path: Path) -> None:
    """The configuration CI builds with turns each kind of defect into a failed build."""
    page, text, named = DEFECTS[defect]
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs, ignore=shutil.ignore_patterns("__pycache__"))
    with open(docs / page, "a", encoding="utf-8") as f:
        f.write(text)
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"INHERIT: {ROOT / 'mkdocs.yml'}\ndocs_dir: docs\n", encoding="utf-8")
    result = build(config, tmp_path / "site")
    assert result.returncode != 0, result.stderr
    assert named in result.stdout + result.stderr
