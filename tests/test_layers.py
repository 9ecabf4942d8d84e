"""The package's layers, as CONTRIBUTING.md maps them, hold: imports flow one way.

`errors`/`clock` -> `core` -> `sqlite` | `postgres` -> `runner` -> `tools` -> `cli`.
`core/` is what the contract decides, written once: it imports neither
`sqlite3` nor `psycopg`, nor either store; `postgres/` builds on `core/`,
never on `sqlite/`. Read from the source (every import statement, those
inside functions and `TYPE_CHECKING` blocks too), since importing any
submodule runs the package's `__init__`, which loads the SQLite store.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "langgraph_fenced_sqlite"
NAME = "langgraph_fenced_sqlite"

# What each layer may import of the package (besides itself).
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "clock": {"errors"},
    "core": {"errors", "clock"},
    "sqlite": {"errors", "clock", "core"},
    "postgres": {"errors", "clock", "core"},
    "runner": {"errors", "clock", "core"},
    "tools": {"errors", "clock", "core", "sqlite", "postgres"},
    "cli": {"errors", "clock", "core", "sqlite", "postgres", "runner", "tools"},
    # The Agent Server's factory (`agent_server.py`): opens either store, as a tool does.
    "agent_server": {"errors", "clock", "core", "sqlite", "postgres"},
}
# Modules of these layers must not import these third-party drivers.
FORBIDDEN_DRIVERS = {
    "core": {"sqlite3", "psycopg", "psycopg_pool"},
    "runner": {"sqlite3", "psycopg", "psycopg_pool"},
}


def _layer(module: str) -> str:
    """`langgraph_fenced_sqlite.core.claims` -> `core`; a top-level module is its own layer."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append((".".join(parts), path))
    return out


def _imports(module: str, path: Path) -> set[str]:
    """Every module `module` imports, as absolute names."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            # `from . import schema` imports a module, not a name.
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def _package_layers(imported: set[str]) -> set[str]:
    return {_layer(name) for name in imported if name.startswith(NAME + ".")} - {""}


LAYERED = [(m, p) for m, p in _modules() if _layer(m) in ALLOWED and m != f"{NAME}.{_layer(m)}"]


def test_every_module_is_in_a_layer() -> None:
    """A new top-level module or folder has to be placed in a layer (and in CONTRIBUTING.md)."""
    top = {_layer(m) for m, _ in _modules()} - {""}
    assert top <= set(ALLOWED) | {"testing", "__main__", "transfer"}, top - set(ALLOWED)


def _violations(module: str, path: Path) -> list[str]:
    """What `module` imports against the layers: package modules above or beside it, drivers."""
    layer = _layer(module)
    imported = _imports(module, path)
    wrong = [
        name
        for name in imported
        if name.startswith(NAME + ".")
        and _layer(name) in ALLOWED
        and _layer(name) not in ALLOWED[layer] | {layer}
    ]
    wrong += [n for n in imported if n.split(".")[0] in FORBIDDEN_DRIVERS.get(layer, set())]
    return sorted(wrong)


@pytest.mark.parametrize("module,path", LAYERED, ids=[m for m, _ in LAYERED])
def test_imports_flow_one_way(module: str, path: Path) -> None:
    """A module imports only its own layer and the layers below it, and its layer's drivers."""
    assert _violations(module, path) == []


def test_core_imports_neither_store_nor_driver() -> None:
    """The rules written once name no store: no sqlite3, no psycopg, no sqlite/ or postgres/."""
    core = [(m, p) for m, p in _modules() if _layer(m) == "core"]
    assert len(core) > 20  # the folder is where the rules are
    for module, path in core:
        imported = _imports(module, path)
        assert not {n.split(".")[0] for n in imported} & {"sqlite3", "psycopg"}, module
        assert not _package_layers(imported) & {"sqlite", "postgres"}, module


def test_the_checker_reports_an_upward_import(tmp_path: Path) -> None:
    """The rule is not vacuous: a core module that reaches into a store is reported."""
    fake = tmp_path / "fake.py"
    fake.write_text(
        "import sqlite3\n"
        "from ..sqlite import schema\n"
        "def f():\n"
        "    from ..postgres.sql import HEAR\n"
        "from .claims import Claim\n"
    )
    assert _violations(f"{NAME}.core.fake", fake) == [
        f"{NAME}.postgres.sql",
        f"{NAME}.postgres.sql.HEAR",
        f"{NAME}.sqlite",
        f"{NAME}.sqlite.schema",
        "sqlite3",
    ]
