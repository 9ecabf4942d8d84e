"""The documentation's pages and the code blocks on them, for the docs tests.

The pages are README.md (the front page) and every Markdown file under
docs/ (the site MkDocs builds, docs/semantics.md included). A test that runs
or type-checks the documentation's code takes its blocks from here, so a new
page is covered the moment it exists.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
SEMANTICS = DOCS / "semantics.md"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]


class Snippet(NamedTuple):
    """One fenced ```python block of one page."""

    page: Path
    index: int  # its place among the page's Python blocks, from 0
    code: str

    @property
    def id(self) -> str:
        """Name it for test ids and messages: `docs/claims.md-block2`."""
        return f"{page_name(self.page)}-block{self.index}"


def page_name(page: Path) -> str:
    """Return a page's path from the repository root, with forward slashes."""
    return page.relative_to(ROOT).as_posix()


def python_blocks(page: Path) -> list[str]:
    """Return the code of each ```python block of a page, in order."""
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)


SNIPPETS = [Snippet(page, i, code) for page in PAGES for i, code in enumerate(python_blocks(page))]
