"""The repository's documents stay true: links resolve, contents list every section,
the demo prints what the README shows, and the project files say what pyproject says.

The documents are README.md, CONTRIBUTING.md, CHANGELOG.md and every page of
the site under docs/ (`_doc_pages.PAGES`).
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _doc_pages import PAGES, page_name

import langgraph_fenced_sqlite
from langgraph_fenced_sqlite import FencedSqliteError

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SEMANTICS = ROOT / "docs" / "semantics.md"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
DOCS = [*PAGES, ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md"]
PYPROJECT = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
# The package's and the tests' Python files, which point readers at docs/semantics.md.
CODE = sorted([*(ROOT / "langgraph_fenced_sqlite").rglob("*.py"), *(ROOT / "tests").rglob("*.py")])
FENCE = re.compile(r"^(```|~~~)")


def prose(path: Path) -> list[str]:
    """The lines of a Markdown file outside its fenced code blocks."""
    lines, inside = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            lines.append(line)
    return lines


def headings(path: Path, level: str = "#+") -> list[str]:
    """The heading texts of a Markdown file (outside code), at `level` (a regex of #s)."""
    found = []
    for line in prose(path):
        match = re.match(rf"^({level}) (.+?)\s*$", line)
        if match:
            found.append(match.group(2))
    return found


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a file's headings (lowercased, punctuation dropped)."""
    seen: dict[str, int] = {}
    out = set()
    for text in headings(path):
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        if slug in seen:
            seen[slug] += 1
            slug = f"{slug}-{seen[slug]}"
        else:
            seen[slug] = 0
        out.add(slug)
    return out


def links(path: Path) -> list[str]:
    """Every Markdown link target in a file's prose (inline code excluded)."""
    text = "\n".join(re.sub(r"`[^`]*`", "", line) for line in prose(path))
    return re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("doc", DOCS, ids=[page_name(d) for d in DOCS])
def test_every_link_resolves(doc: Path) -> None:
    """Relative links name files of the repo; anchors name headings that exist."""
    assert doc.exists(), f"{doc.relative_to(ROOT)} is missing"
    broken = []
    for target in links(doc):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, fragment = target.partition("#")
        where = (doc.parent / file).resolve() if file else doc
        if not where.exists() or ROOT not in where.parents and where != ROOT:
            broken.append(f"{target}: no such file in the repo")
        elif fragment and where.suffix == ".md" and fragment not in anchors(where):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, "\n".join(broken)


# A repository path (`tests/...`, `examples/...`), or a module path inside the package
# (`sqlite/schema.py`), as the documents name files for readers to open.
REPO_PATH = re.compile(r"(?<![\w./-])((?:tests|examples|benchmarks|docs)/[\w./-]*\w)")
MODULE_PATH = re.compile(r"`((?:core|sqlite|postgres|runner|tools|cli|testing)/\w+\.py)`")
NAMING_FILES = [*PAGES, ROOT / "CONTRIBUTING.md"]  # CHANGELOG.md's history may name old files


@pytest.mark.parametrize("doc", NAMING_FILES, ids=[page_name(d) for d in NAMING_FILES])
def test_every_file_a_document_names_exists(doc: Path) -> None:
    """Each repository file or package module a page names (in prose or a command) exists.

    Files move (the package into layers, the tests into folders); a page that
    still names the old place sends its reader nowhere.
    """
    text = doc.read_text(encoding="utf-8")
    missing = [
        name for name in REPO_PATH.findall(text) if "*" not in name and not (ROOT / name).exists()
    ]
    missing += [
        name
        for name in MODULE_PATH.findall(text)
        if not (ROOT / "langgraph_fenced_sqlite" / name).exists()
    ]
    assert not missing, f"{page_name(doc)} names files that do not exist: {missing}"


@pytest.mark.parametrize("doc", [README, SEMANTICS], ids=["README.md", "semantics.md"])
def test_contents_list_every_section(doc: Path) -> None:
    """The table of contents links every `##` section (and every link in it resolves)."""
    lines = prose(doc)
    start = lines.index("## Contents")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("#"))
    toc = {t.lstrip("#") for t in re.findall(r"\]\((#[^)]+)\)", "\n".join(lines[start:end]))}
    sections = set()
    for text in headings(doc, "##"):
        if text != "Contents":
            sections.add(re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-"))
    assert sections - toc == set(), "sections missing from the contents"
    assert toc - anchors(doc) == set(), "contents entries with no section"


def test_the_semantics_are_in_the_repo_and_the_package_points_there() -> None:
    """No pointer to a contract file outside the repo; the README and package point here.

    The tests too: a reader who follows a test's section reference must find it.
    So do the site's pages.
    """
    stale = []
    for path in [*PAGES, *CODE]:
        if path == Path(__file__).resolve():  # this test names the word it looks for
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "CONTRACT" in line:
                stale.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not stale, "points to a file that is not in the repo:\n" + "\n".join(stale)
    assert "(docs/semantics.md)" in README.read_text(encoding="utf-8")
    assert "docs/semantics.md" in (langgraph_fenced_sqlite.__doc__ or "")


def test_section_references_name_sections_that_exist() -> None:
    """Every `docs/semantics.md §N` in the package or tests names one of its sections."""
    numbers = {m.group(1) for h in headings(SEMANTICS, "##") if (m := re.match(r"(\d+)\. ", h))}
    wrong = []
    for path in CODE:
        for n in re.findall(r"docs/semantics\.md §(\d+)", path.read_text(encoding="utf-8")):
            if n not in numbers:
                wrong.append(f"{path.relative_to(ROOT)}: §{n}")
    assert not wrong, "\n".join(wrong)


def test_every_error_is_in_the_semantics_table() -> None:
    """Each public error class has a row in docs/semantics.md with its stable code."""
    rows = [line for line in prose(SEMANTICS) if line.startswith("| `")]
    missing = []
    for name in langgraph_fenced_sqlite.__all__:
        cls = getattr(langgraph_fenced_sqlite, name)
        if (
            inspect.isclass(cls)
            and issubclass(cls, FencedSqliteError)
            and cls is not (FencedSqliteError)
        ):
            row = next((r for r in rows if r.startswith(f"| `{name}`")), None)
            if row is None or f"`{cls.code}`" not in row:
                missing.append(f"{name} ({cls.code})")
    assert not missing, "errors without a row naming their code: " + ", ".join(missing)


SEMANTICS_SNIPPETS = re.findall(r"```python\n(.*?)```", SEMANTICS.read_text(encoding="utf-8"), re.S)


@pytest.mark.subprocess
@pytest.mark.parametrize("snippet", SEMANTICS_SNIPPETS)
def test_semantics_snippet_runs(snippet: str, tmp_path: Path) -> None:
    """A Python block of docs/semantics.md runs to completion in a fresh interpreter."""
    result = subprocess.run(
        [sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr


# --- the demo -------------------------------------------------------------------------------


def _normalised(text: str) -> str:
    text = re.sub(r"\brun [0-9a-f]{8}\b", "run <id>", text)
    return re.sub(r"^read back from .*:$", "read back from <path>:", text, flags=re.M).strip()


@pytest.mark.subprocess
@pytest.mark.parametrize("doc", [README, GETTING_STARTED], ids=page_name)
def test_readme_shows_the_demos_real_output(doc: Path, tmp_path: Path) -> None:
    """The demo output shown (README, Getting started) is what the demo prints (ids aside)."""
    text = doc.read_text(encoding="utf-8")
    assert "python -m pip install -e . && python examples/quickstart.py" in text
    block = text.split("<!-- demo-output:start -->", 1)[1].split("<!-- demo-output:end -->")[0]
    shown = block.strip().removeprefix("```text").removesuffix("```")
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert _normalised(result.stdout) == _normalised(shown)


# --- project files --------------------------------------------------------------------------


def test_license_is_the_mit_license_pyproject_declares() -> None:
    """LICENSE holds the MIT text pyproject declares, for the project's authors."""
    assert re.search(r'^license = \{ text = "MIT" \}$', PYPROJECT, re.M)
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License\n")
    assert re.search(r"^Copyright \(c\) \d{4} the langgraph-fenced-sqlite authors$", text, re.M)
    assert "Permission is hereby granted, free of charge" in text
    assert 'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND' in text


def test_changelog_keeps_a_changelog() -> None:
    """CHANGELOG.md: Keep a Changelog's shape, an Unreleased section, known change types."""
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert text.startswith("# Changelog\n") and "keepachangelog.com" in text
    releases = headings(ROOT / "CHANGELOG.md", "##")
    assert releases and releases[0] == "[Unreleased]"
    for release in releases[1:]:
        assert re.fullmatch(r"\[\d+\.\d+\.\d+\] - \d{4}-\d{2}-\d{2}", release), release
    kinds = set(headings(ROOT / "CHANGELOG.md", "###"))
    assert kinds and kinds <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
    match = re.search(r'^version = "([^"]+)"$', PYPROJECT, re.M)
    assert match
    version = match.group(1)
    assert version in text, f"the changelog does not mention version {version}"


def test_contributing_lists_what_ci_runs() -> None:
    """CONTRIBUTING.md shows the lint, format, type and site checks of .ci/run, and the tests."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    guide = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    checks = [line for line in ci.splitlines() if line.split(" ")[0] in ("ruff", "mypy", "mkdocs")]
    assert len(checks) == 4
    assert "mkdocs build --strict" in checks
    for check in checks + ['python -m pip install -e ".[dev]"', "python -m pytest"]:
        assert check in guide, f"CONTRIBUTING.md does not show `{check}`"
    for topic in ("## Set up", "## Test", "## Benchmarks", "## Commits", "## Map of the layers"):
        assert topic in guide


def test_contributing_maps_every_layer_and_names_only_files_that_exist() -> None:
    """The map of the layers shows every folder of the package, and each module it names exists."""
    guide = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = guide.split("## Map of the layers", 1)[1]
    tree = section.split("```", 2)[1]
    assert tree.startswith("\nlanggraph_fenced_sqlite/\n"), tree[:40]
    package = ROOT / "langgraph_fenced_sqlite"
    folders = sorted(p.parent.name for p in package.glob("*/__init__.py"))
    named: dict[str, list[str]] = {"": []}
    folder = ""
    for line in tree.splitlines()[2:]:
        match = re.match(r"^  (\w+)/ ", line)
        if match:
            folder = match.group(1)
            named[folder] = []
        named[folder] += re.findall(r"\b(\w+)\.py\b", line)
    assert sorted(set(named) - {""}) == folders, "folders missing from the map (or gone)"
    missing = [
        f"{folder}/{module}.py"
        for folder, modules in named.items()
        for module in modules
        if not (package / folder / f"{module}.py").exists()
    ]
    assert not missing, f"the map names modules that do not exist: {missing}"
    assert len([m for modules in named.values() for m in modules]) >= 40


def _hooks() -> dict[str, dict[str, object]]:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8"))
    return {hook["id"]: hook for repo in config["repos"] for hook in repo["hooks"]}


def test_pre_commit_runs_ruff_the_formatter_and_mypy_from_the_venv() -> None:
    """Local hooks (nothing to download) for ruff, ruff format and mypy, tools of the venv."""
    hooks = _hooks()
    assert set(hooks) >= {"ruff", "ruff-format", "mypy"}
    assert str(hooks["ruff"]["entry"]).startswith("ruff check")
    assert str(hooks["ruff-format"]["entry"]).startswith("ruff format")
    assert str(hooks["mypy"]["entry"]) == "mypy langgraph_fenced_sqlite"
    bindir = Path(sys.executable).parent
    for hook in hooks.values():
        assert hook["language"] == "system"
        tool = str(hook["entry"]).split()[0]
        assert (bindir / tool).exists() or (bindir / f"{tool}.exe").exists(), tool


@pytest.mark.slow
@pytest.mark.subprocess
def test_pre_commit_config_is_valid_and_its_checks_pass(tmp_path: Path) -> None:
    """`pre-commit` accepts the config, and its non-rewriting hooks pass on the tree."""
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "home")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    pre_commit = [sys.executable, "-m", "pre_commit"]
    valid = subprocess.run(
        [*pre_commit, "validate-config", ".pre-commit-config.yaml"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert valid.returncode == 0, valid.stdout + valid.stderr
    for hook in ("ruff", "mypy"):  # ruff-format rewrites files; CI checks it with --check
        result = subprocess.run(
            [*pre_commit, "run", hook, "--all-files"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, result.stdout + result.stderr
