"""Types for users: what a user's type checker sees, and the keyword checks behind them.

- After the README's `pip install -e .`, mypy finds the package (a static
  path entry, not an import hook that type checkers cannot follow).
- `mypy --strict` passes on every Python snippet of README.md and of the
  site's pages under docs/ (`_doc_pages.SNIPPETS`), on `examples/`, and
  on a probe of the runner's and the opener's types:
  `stream`/`astream` are generators that `contextlib.closing`/`aclosing`
  take, the runner's results are typed as LangGraph's, a misspelt
  keyword of `from_conn_string` is a type error, and the PostgreSQL saver's
  reads (the SQLite saver's methods, inherited) type-check on it.
- At run time a misspelt keyword is an `InvalidArgument` naming it.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import AsyncGenerator, Generator
from pathlib import Path
from typing import Any

import pytest
from _doc_pages import ROOT, SNIPPETS, Snippet
from langchain_core.runnables import RunnableConfig
from langgraph.graph import START, StateGraph
from typing_extensions import TypedDict

from langgraph_fenced_sqlite import FencedRunner, FencedSqliteSaver, InvalidArgument

RUNNER_PAGE = ROOT / "docs" / "runner.md"
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

# What a user writes against the runner and the opener. Lines marked
# `# error: CODE` must be reported with that code; every other line must pass.
PROBE = """
import contextlib
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.graph import START, StateGraph
from typing_extensions import TypedDict, assert_type

from langgraph.checkpoint.base import CheckpointTuple

from langgraph_fenced_sqlite import CheckpointDiff, FencedRunner, FencedSqliteSaver, ThreadStatus
from langgraph_fenced_sqlite.postgres import FencedPostgresSaver


class State(TypedDict):
    n: int


async def main(path: str) -> None:
    builder = StateGraph(State)
    builder.add_node("inc", lambda s: {"n": s["n"] + 1})
    builder.add_edge(START, "inc")
    with FencedSqliteSaver.from_conn_string(path, busy_timeout=1.0, readonly=False) as saver:
        assert_type(saver, FencedSqliteSaver)
        runner = FencedRunner(builder.compile(checkpointer=saver), saver)
        config: RunnableConfig = {"configurable": {"thread_id": "t"}}
        assert_type(runner.invoke({"n": 1}, config), dict[str, Any] | Any)
        assert_type(await runner.ainvoke({"n": 1}, config), dict[str, Any] | Any)
        with contextlib.closing(runner.stream({"n": 1}, config)) as chunks:
            for chunk in chunks:
                assert_type(chunk, dict[str, Any] | Any)
        async with contextlib.aclosing(runner.astream({"n": 1}, config)) as achunks:
            async for achunk in achunks:
                assert_type(achunk, dict[str, Any] | Any)
    async with FencedSqliteSaver.from_conn_string(path) as asaver:
        assert_type(asaver, FencedSqliteSaver)
    FencedSqliteSaver.from_conn_string(path, busy_timout=1.0)  # error: call-arg
    FencedSqliteSaver(path, busy_timout=1.0)  # error: call-arg


def pg_reads(pg: FencedPostgresSaver) -> None:
    assert_type(pg.history("t", limit=2), list[CheckpointTuple])
    assert_type(pg.history_records("t", before="c1"), list[dict[str, Any]])
    assert_type(pg.inspect_checkpoint("t", checkpoint_id="c1"), dict[str, Any] | None)
    assert_type(pg.diff_checkpoints("t"), CheckpointDiff | None)
    assert_type(pg.threads(status="idle", inactive_for=60), list[dict[str, Any]])
    assert_type(pg.thread_status("t"), ThreadStatus | None)
    assert_type(pg.resolve_namespace("t", "sub"), str)
"""


def snippet_file(snippet: Snippet) -> str:
    """Name the file a snippet is checked as: a module name mypy accepts, unique per block."""
    return re.sub(r"\W", "_", snippet.id) + ".py"


def run_mypy(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run this interpreter's mypy in `cwd`, with no project configuration."""
    env = {k: v for k, v in os.environ.items() if k != "MYPYPATH"}
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--no-color-output", "--no-error-summary", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def errors_by_file(output: str) -> dict[str, list[str]]:
    """Group mypy's `file:line: error: ...` lines by file name."""
    found: dict[str, list[str]] = {}
    for line in output.splitlines():
        match = re.match(r"([^:]+):(\d+): error: (.*)", line)
        if match:
            found.setdefault(match.group(1), []).append(f"{match.group(2)}: {match.group(3)}")
    return found


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, list[str]]]:
    """One `mypy --strict` run over the pages' snippets, the examples and the probe."""
    where = tmp_path_factory.mktemp("strict")
    for snippet in SNIPPETS:
        (where / snippet_file(snippet)).write_text(snippet.code, encoding="utf-8")
    for example in EXAMPLES:
        (where / f"example_{example.name}").write_text(example.read_text(encoding="utf-8"))
    (where / "probe.py").write_text(PROBE, encoding="utf-8")
    result = run_mypy(["--strict", "--cache-dir", str(where / ".cache"), "."], where)
    lost = [line for line in result.stdout.splitlines() if "langgraph_fenced_sqlite" in line]
    assert not any("import-not-found" in line for line in lost), (
        "mypy cannot find the package: reinstall it with `pip install -e .` (an install "
        "made before pyproject set package-dir uses an import hook)\n" + result.stdout
    )
    assert result.returncode in (0, 1), result.stdout + result.stderr
    return result.stdout, errors_by_file(result.stdout)


@pytest.mark.subprocess
@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.id for s in SNIPPETS])
def test_doc_snippet_passes_mypy_strict(
    strict: tuple[str, dict[str, list[str]]], snippet: Snippet
) -> None:
    """A snippet of a page type-checks under `mypy --strict` as a user would run it."""
    assert strict[1].get(snippet_file(snippet), []) == []


@pytest.mark.subprocess
@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_example_passes_mypy_strict(
    strict: tuple[str, dict[str, list[str]]], example: Path
) -> None:
    """An example type-checks under `mypy --strict`."""
    assert strict[1].get(f"example_{example.name}", []) == []


@pytest.mark.subprocess
def test_runner_and_opener_types_as_a_user_sees_them(
    strict: tuple[str, dict[str, list[str]]],
) -> None:
    """Generators `closing`/`aclosing` take, LangGraph's result types, a typo flagged."""
    expected = {
        n: m.group(1)
        for n, line in enumerate(PROBE.splitlines(), 1)
        if (m := re.search(r"# error: ([\w-]+)", line))
    }
    got = strict[1].get("probe.py", [])
    assert {int(e.split(":")[0]) for e in got} == set(expected), "\n".join(got)
    for error in got:
        line = int(error.split(":")[0])
        assert error.endswith(f"[{expected[line]}]") and "busy_timout" in error, error
        assert 'did you mean "busy_timeout"' in error


def test_readme_shows_aclosing_and_closing() -> None:
    """The runner's guide shows closing a stream early, which the strict run type-checks."""
    assert any(
        "contextlib.aclosing(" in s.code and "contextlib.closing(" in s.code
        for s in SNIPPETS
        if s.page == RUNNER_PAGE
    )


# --- an editable install, as the README makes it -------------------------------------------


@pytest.mark.slow
@pytest.mark.subprocess
def test_mypy_finds_the_package_after_an_editable_install(tmp_path: Path) -> None:
    """`pip install -e .` in a fresh venv, then `mypy script.py` outside the repo finds it."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps"]
        + ["-e", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    # The dependencies (langgraph...) are this venv's: one path entry, no second install.
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "zz_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            """
            from langgraph_fenced_sqlite import FencedSqliteSaver

            def open_store(path: str) -> FencedSqliteSaver:
                return FencedSqliteSaver(path, busy_timeout=1.0)

            reveal_type(FencedSqliteSaver.from_conn_string)
            """
        )
    )
    # LangGraph's and langchain_core's own modules are not followed: this test is
    # about finding our package (35 s of analysing theirs against 7 s here);
    # the strict run above type-checks the snippets with everything followed.
    (tmp_path / "mypy.ini").write_text(
        "[mypy]\n[mypy-langgraph.*,langchain_core.*,langsmith.*,pydantic.*,pydantic_core.*]\n"
        "follow_imports = skip\n"
    )
    result = run_mypy(
        ["--python-executable", str(python), "--no-incremental", "--config-file", "mypy.ini"]
        + ["script.py"],
        tmp_path,
    )
    assert "import-not-found" not in result.stdout, result.stdout
    assert "def (conn_string: str, *, busy_timeout: float" in result.stdout, result.stdout
    assert result.returncode == 0, result.stdout + result.stderr


# --- the same at run time --------------------------------------------------------------------


def test_from_conn_string_spells_out_the_savers_options() -> None:
    """`from_conn_string` takes exactly `__init__`'s keywords, with the same defaults and types."""
    opener = inspect.signature(FencedSqliteSaver.from_conn_string).parameters
    init = inspect.signature(FencedSqliteSaver.__init__).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in opener.values())
    keywords = [p for p in opener.values() if p.kind is p.KEYWORD_ONLY]
    assert keywords == [p for p in init.values() if p.kind is p.KEYWORD_ONLY]


@pytest.mark.parametrize(
    "open_it",
    [
        lambda path: FencedSqliteSaver.from_conn_string(path, busy_timout=1.0),
        lambda path: FencedSqliteSaver(path, busy_timout=1.0),
    ],
    ids=["from_conn_string", "constructor"],
)
def test_misspelt_keyword_is_invalid_argument_naming_it(tmp_path: Path, open_it: Any) -> None:
    """A typo is an `InvalidArgument` naming it and the right spelling; no file is made."""
    path = str(tmp_path / "typo.db")
    with pytest.raises(InvalidArgument) as caught:
        open_it(path)
    assert caught.value.argument == "busy_timout"
    assert "did you mean 'busy_timeout'?" in str(caught.value)
    assert caught.value.code == "invalid_argument"
    assert not os.path.exists(path)


def test_missing_or_doubled_arguments_are_invalid_arguments(tmp_path: Path) -> None:
    """A missing path, or a path given twice, is an `InvalidArgument` naming it."""
    with pytest.raises(InvalidArgument) as missing:
        FencedSqliteSaver()  # type: ignore[call-arg]
    assert missing.value.argument == "path"
    with pytest.raises(InvalidArgument) as twice:
        FencedSqliteSaver(str(tmp_path / "a.db"), path="b.db")  # type: ignore[misc]
    assert twice.value.argument == "path"
    assert os.listdir(tmp_path) == []


class _State(TypedDict):
    n: int


def _runner(saver: FencedSqliteSaver) -> FencedRunner:
    builder = StateGraph(_State)
    builder.add_node("inc", lambda s: {"n": s["n"] + 1})
    builder.add_node("double", lambda s: {"n": s["n"] * 2})
    builder.add_edge(START, "inc")
    builder.add_edge("inc", "double")
    return FencedRunner(builder.compile(checkpointer=saver), saver)


def test_stream_is_a_generator_that_closing_releases(store: FencedSqliteSaver) -> None:
    """`stream` returns a generator; `contextlib.closing` ends it early and frees the thread."""
    config: RunnableConfig = {"configurable": {"thread_id": "t"}}
    stream = _runner(store).stream({"n": 1}, config, stream_mode="updates")
    assert isinstance(stream, Generator)
    with contextlib.closing(stream) as chunks:
        assert next(chunks) == {"inc": {"n": 2}}
        assert store.current_claim("t") is not None
    assert store.current_claim("t") is None


async def test_astream_is_an_async_generator_that_aclosing_releases(
    store: FencedSqliteSaver,
) -> None:
    """`astream` returns an async generator; `contextlib.aclosing` ends it and frees the thread."""
    config: RunnableConfig = {"configurable": {"thread_id": "t"}}
    stream = _runner(store).astream({"n": 1}, config, stream_mode="updates")
    assert isinstance(stream, AsyncGenerator)
    async with contextlib.aclosing(stream) as chunks:
        async for chunk in chunks:
            assert chunk == {"inc": {"n": 2}}
            assert await store.acurrent_claim("t") is not None
            break
    assert await store.acurrent_claim("t") is None
