"""Every Python snippet in README.md runs as it is shown."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_readme_has_snippets() -> None:
    """The README shows runnable code (the parametrized test below runs it)."""
    assert len(SNIPPETS) >= 7


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[f"snippet{i}" for i in range(len(SNIPPETS))])
def test_readme_snippet_runs(snippet: str, tmp_path: pathlib.Path) -> None:
    """A README snippet runs to completion in a fresh interpreter."""
    result = subprocess.run(
        [sys.executable, "-c", snippet],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
