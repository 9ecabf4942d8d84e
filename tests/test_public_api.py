"""What users import keeps working, whatever the package's inside looks like.

The package was layered (core/, sqlite/, postgres/, runner/, tools/, cli/);
every name it exports, every import path its docs have shown, the `lgfs`
entry point, `python -m langgraph_fenced_sqlite` and the errors' pickled
module path stay as they were.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

import langgraph_fenced_sqlite
from langgraph_fenced_sqlite import FencedSqliteError

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = [
    "langgraph_fenced_sqlite",
    "langgraph_fenced_sqlite.agent_server",
    "langgraph_fenced_sqlite.postgres",
    "langgraph_fenced_sqlite.testing",
]

# The import paths the docs showed before the package was layered (README.md,
# docs/semantics.md, CONTRIBUTING.md and examples/ at 8ede937, plus the two
# paths its prose named). Users copied these; each must keep working.
DOCUMENTED = {
    "langgraph_fenced_sqlite": [
        "FencedRunner", "FencedSqliteSaver", "ManualClock", "ReadOnlyStore",
        "ReplayUnavailable", "RetentionPolicy", "RunCancelled", "RunTimedOut",
        "SerializationError", "StaleClaim", "StoreBusy", "TenantMismatch", "ThreadBusy",
        "UndecodableRow", "diagnose", "import_sqlitesaver",
    ],
    "langgraph_fenced_sqlite.postgres": ["FencedPostgresSaver", "import_postgressaver"],
    "langgraph_fenced_sqlite.postgres.sql": ["HEAR"],
    "langgraph_fenced_sqlite.testing": ["make_env", "run_contract"],
    "langgraph_fenced_sqlite.testing.postgres_contract": ["make_pg_env"],
    "langgraph_fenced_sqlite.testing.postgres_server": [
        "start_replica", "start_server", "wait_replayed",
    ],
    "langgraph_fenced_sqlite.transfer": ["copy_threads"],
}  # fmt: skip


def _exported() -> list[tuple[str, str]]:
    return [(m, n) for m in PUBLIC for n in importlib.import_module(m).__all__]


@pytest.mark.parametrize("module,name", _exported(), ids=lambda v: str(v))
def test_every_exported_name_imports_and_has_a_docstring(module: str, name: str) -> None:
    """`from <public package> import <name>` works for each name of its `__all__`."""
    value = getattr(importlib.import_module(module), name)
    if callable(value) or isinstance(value, type):
        assert (value.__doc__ or "").strip(), f"{module}.{name} has no docstring"


@pytest.mark.parametrize(
    "module,name", [(m, n) for m, names in DOCUMENTED.items() for n in names], ids=str
)
def test_every_documented_import_path_still_works(module: str, name: str) -> None:
    """Each import the docs showed before the layering resolves to the same public object."""
    value = getattr(importlib.import_module(module), name)
    if module == "langgraph_fenced_sqlite.transfer":  # a moved module, re-exported
        from langgraph_fenced_sqlite.tools.transfer import copy_threads

        assert value is copy_threads


def _doc_imports() -> list[str]:
    """Every `from langgraph_fenced_sqlite... import` in today's docs and examples."""
    found: set[str] = set()
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    blocks = [b for p in pages for b in re.findall(r"```python\n(.*?)```", p.read_text(), re.S)]
    blocks += [p.read_text() for p in sorted((ROOT / "examples").glob("*.py"))]
    for block in blocks:
        try:
            tree = ast.parse(block)
        except SyntaxError:
            continue  # a fragment; the docs tests run every runnable block
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "langgraph_fenced_sqlite"
            ):
                found.update(f"{node.module}:{a.name}" for a in node.names)
    return sorted(found)


def test_the_docs_show_imports_to_check() -> None:
    """The scan below is not vacuous: the docs import the saver from the package."""
    assert "langgraph_fenced_sqlite:FencedSqliteSaver" in _doc_imports()


@pytest.mark.parametrize("spec", _doc_imports())
def test_every_import_the_docs_show_resolves(spec: str) -> None:
    """Each import statement in README.md, docs/ and examples/ names a real object."""
    module, name = spec.split(":")
    assert hasattr(importlib.import_module(module), name), spec


def test_errors_keep_their_public_module_and_pickle() -> None:
    """Error classes report and pickle as `langgraph_fenced_sqlite.<Name>`, wherever defined."""
    errors = [
        getattr(langgraph_fenced_sqlite, n)
        for n in langgraph_fenced_sqlite.__all__
        if isinstance(getattr(langgraph_fenced_sqlite, n), type)
        and issubclass(getattr(langgraph_fenced_sqlite, n), FencedSqliteError)
    ]
    assert len(errors) > 15
    for cls in errors:
        assert cls.__module__ == "langgraph_fenced_sqlite", cls
        assert b"langgraph_fenced_sqlite" in pickle.dumps(cls)
    busy = langgraph_fenced_sqlite.StoreBusy("put", "/x.db", 1.5)
    again = pickle.loads(pickle.dumps(busy))
    assert type(again) is langgraph_fenced_sqlite.StoreBusy and again.waited_s == 1.5


def test_lgfs_entry_point_and_python_m() -> None:
    """`lgfs` names `langgraph_fenced_sqlite.cli:main`, and `python -m` runs the same CLI."""
    (entry,) = [
        e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "lgfs"
    ]
    assert entry.value == "langgraph_fenced_sqlite.cli:main"
    from langgraph_fenced_sqlite.cli import main

    assert entry.load() is main
    out = subprocess.run(
        [sys.executable, "-m", "langgraph_fenced_sqlite", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and langgraph_fenced_sqlite.__version__ in out.stdout
