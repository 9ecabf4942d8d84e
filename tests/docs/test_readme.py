"""Every Python snippet of the documentation runs as it is shown.

The pages are README.md and every page of the site under docs/ (see
`_doc_pages.py`); docs/semantics.md's blocks are run by
`test_repo_docs.py::test_semantics_snippet_runs`.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
from _doc_pages import README, SEMANTICS, SNIPPETS, Snippet

RUN_HERE = [s for s in SNIPPETS if s.page != SEMANTICS]


def test_readme_has_snippets() -> None:
    """The documentation shows runnable code (the parametrized test below runs it).

    The README keeps one example each of the checkpointer, a claim and a watch;
    the guides hold the rest, and no snippet was lost when they moved there.
    """
    assert len(SNIPPETS) >= 7
    readme = [s.code for s in SNIPPETS if s.page == README]
    assert len(readme) >= 3
    assert any("compile(checkpointer=saver)" in code for code in readme)
    assert any(".claim(" in code and "StaleClaim" in code for code in readme)
    assert any(".watch(" in code for code in readme)
    # The README held 31 Python blocks before the guides moved to docs/.
    assert len(RUN_HERE) >= 31


@pytest.mark.parametrize("snippet", RUN_HERE, ids=[s.id for s in RUN_HERE])
def test_doc_snippet_runs(snippet: Snippet, tmp_path: pathlib.Path) -> None:
    """A snippet of a page runs to completion in a fresh interpreter."""
    result = subprocess.run(
        [sys.executable, "-c", snippet.code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"{snippet.id}:\n{result.stderr}"
