"""The package's folders show its extras.

One wheel: the core at ``llm_db/`` (the driver, ``migrate`` and what they need) and a
folder per extra (``cli/``, ``service/``, ``testing/``) and for the demo. The core
imports none of those folders; no two modules of the package import each other,
even through a chain, under ``TYPE_CHECKING`` or inside a function; the wheel holds
no build-time module and none of the shims 0.3.x kept for 0.2.0's module paths; and
every import the README and docs/ show still imports.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "llm_db"

CORE = ["llm_db", "llm_db.client", "llm_db._client_methods", "llm_db.models", "llm_db.errors",
        "llm_db.migrate", "llm_db._migrate_run", "llm_db._migrate_locks", "llm_db._migrate_steps",
        "llm_db.executions", "llm_db._extras", "llm_db.queries",
        "llm_db._text", "llm_db._types", "llm_db.__main__"]  # fmt: skip
EXTRA_FOLDERS = ("llm_db.cli", "llm_db.service", "llm_db.testing", "llm_db.demo")
FOLDER_PREFIXES = tuple(f"{folder}." for folder in EXTRA_FOLDERS)
# 0.2.0's module paths that 0.3.x kept as shims and 0.4.0 removed -> where the module lives
REMOVED = {
    "llm_db.requests": "llm_db.client",
    "llm_db.report": "llm_db.cli.report",
    "llm_db.doctor": "llm_db.cli.doctor",
    "llm_db.commands": "llm_db.cli.commands",
    **{f"llm_db.commands.{m}": f"llm_db.cli.commands.{m}"
       for m in ("common", "demo", "doctor", "notices", "passes", "reports", "setup")},
    "llm_db.worker": "llm_db.service.worker",
    "llm_db.notices": "llm_db.service.notices",
    "llm_db.metrics": "llm_db.service.metrics",
    "llm_db._server": "llm_db.testing._server",
    "llm_db._pgbouncer": "llm_db.testing._pgbouncer",
}  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(path: Path) -> set[str]:
    """The package's modules that ``path`` imports anywhere in it: at the top, under
    ``TYPE_CHECKING``, inside a function. ``from a import b`` is module ``a.b`` when
    there is one, else ``a`` (the package's ``__init__``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}: relative import"
            found.update(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES
                         else node.module for alias in node.names)  # fmt: skip
    return found & MODULES.keys()


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or one importing
    itself), by Tarjan's algorithm: each holds at least one import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle_through_a_chain():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c"], ["e"]]


def test_the_import_scanner_sees_type_checking_and_function_level_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from llm_db.client import Llm\n"
        "def f():\n    from llm_db import queries\n    import llm_db.service.worker\n"
    )  # fmt: skip
    assert imported_modules(source) == {"llm_db.client", "llm_db.queries", "llm_db.service.worker"}


def test_no_import_cycle_among_the_packages_modules():
    """None, counting imports under TYPE_CHECKING and inside functions
    (0.2.0 had two: operations.py with requests.py, _server.py with _postgresql.py)."""
    graph = {name: imported_modules(path) - {name} for name, path in MODULES.items()}
    assert sum(len(targets) for targets in graph.values()) >= 60  # the scanner sees the imports
    assert cycles(graph) == []


def loaded_after_import(module: str) -> list[str]:
    """The modules of llm_db a fresh interpreter has loaded after ``import module``."""
    code = f"import json, sys, {module}\nprint(json.dumps(sorted(m for m in sys.modules if m.startswith('llm_db'))))"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(proc.stdout)


@pytest.mark.parametrize("module", CORE)
def test_a_core_module_imports_no_extras_folder(module):
    """The core (what ``pip install llm-db`` is for) loads nothing of cli/, service/,
    testing/ or demo/."""
    loaded = loaded_after_import(module)
    assert module in loaded
    assert [
        m for m in loaded if m in EXTRA_FOLDERS or m.startswith(FOLDER_PREFIXES)
    ] == []


def test_the_notice_names_have_one_home_and_llm_db_forwards_nothing():
    """``deliver_notices``, ``verify_webhook``, ... are ``llm_db.service.notices``'s only:
    ``llm_db`` no longer finds names of other modules on first use (no module
    ``__getattr__``), so what ``dir(llm_db)`` lists is what it holds."""
    import llm_db
    from llm_db.service import notices

    moved = {"DeliverySummary", "InvalidSecret", "async_deliver_notices", "deliver_notices",
             "new_secret", "verify_webhook"}  # fmt: skip
    assert moved <= set(notices.__all__)
    assert not moved & set(llm_db.__all__) and not moved & set(dir(llm_db))
    assert not hasattr(llm_db, "__getattr__")
    assert set(llm_db.__all__) <= set(vars(llm_db))
    for name in moved:
        with pytest.raises(AttributeError):
            getattr(llm_db, name)


@pytest.mark.parametrize(("old", "new"), REMOVED.items())
def test_a_module_path_of_0_2_0_is_gone_and_the_changelog_names_its_home(old, new):
    """0.3.x kept 0.2.0's module paths as shims that forwarded every name; 0.4.0 removed
    them, and its CHANGELOG section names each one with where the module lives."""
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)
    importlib.import_module(new)
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    release = changelog.split("\n## 0.4.0", 1)[1].split("\n## 0.3.0", 1)[0]
    assert f"`{old}` -> `{new}`" in release, old


def test_no_shim_is_left_in_the_package():
    """No module of ``llm_db/`` forwards another's names (``import *`` of a module of the
    package, or ``_moved.forward``), and ``_moved.py`` is gone."""
    forwarding = re.compile(r"^from llm_db\S* import \*|\b_moved\b", re.MULTILINE)
    assert [name for name, path in MODULES.items() if forwarding.search(path.read_text(encoding="utf-8"))] == []
    assert "llm_db._moved" not in MODULES


DOC_IMPORT = re.compile(r"^[ \t]*((?:from|import) llm_db\b[^\n(]*(?:\([^)]*\))?)", re.MULTILINE)
INLINE_IMPORT = re.compile(r"`((?:from|import) llm_db\b[^`]*)`")


def doc_imports() -> list[tuple[str, str]]:
    """(file, statement) of every import of llm_db shown in README.md and docs/*.md,
    in code blocks or inline."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        for statement in {*DOC_IMPORT.findall(text), *INLINE_IMPORT.findall(text)}:
            found.append((doc.name, statement.split("#")[0].strip()))
    return sorted(found)


def test_the_docs_show_imports():
    shown = {statement for _, statement in doc_imports()}
    assert len(shown) >= 8, shown
    assert "from llm_db.client import Llm" in shown


@pytest.mark.parametrize(("doc", "statement"), doc_imports())
def test_every_import_the_docs_show_imports(doc, statement):
    """Every import shown in README.md and docs/ works."""
    exec(compile(statement, f"{doc}: {statement}", "exec"), {})


def test_the_cli_package_lists_and_reads_the_groups_names():
    """``llm_db.cli`` names ``main`` and the exit codes without importing click, and
    reads each from ``llm_db.cli.group``, where they live."""
    import llm_db.cli
    from llm_db.cli import group

    assert llm_db.cli.__all__ == group.__all__
    for name in group.__all__:
        assert getattr(llm_db.cli, name) is getattr(group, name)


def test_the_wheel_holds_no_build_time_module_and_no_shim(wheel):
    """The driver's table of operations (``codegen/operations.py``) is read by the
    generator, the reference pages and the tests, never at run time: it stays out of
    the wheel, as do 0.2.0's module paths; the wheel's modules are the package's."""
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        shipped = {name for name in zf.namelist() if name.endswith(".py")}
    assert shipped == {path.relative_to(ROOT).as_posix() for path in MODULES.values()}
    assert not any(name.startswith("codegen/") or name.endswith("/operations.py") for name in shipped)
    assert not {f"{old.replace('.', '/')}.py" for old in REMOVED} & shipped
    assert not {f"{old.replace('.', '/')}/__init__.py" for old in REMOVED} & shipped


def test_the_fixtures_are_the_plugins_only():
    """0.2.0's ``llm_db.testing`` defined the fixtures; 0.3.x forwarded them from there;
    since 0.4.0 they are ``llm_db.testing.plugin``'s only."""
    import llm_db.testing
    from llm_db.testing import plugin

    assert hasattr(plugin, "llm_conn")
    assert not hasattr(llm_db.testing, "__getattr__")
    with pytest.raises(AttributeError):
        llm_db.testing.llm_conn  # noqa: B018


def test_the_servers_and_the_demo_import_without_pytest():
    """The ``testing`` extra brings no pytest: ``llm-db demo`` and the benchmarks import
    the throw-away server without it; only the plugin's fixtures
    (``llm_db.testing.plugin``) need it."""
    code = (
        "import sys, llm_db.testing, llm_db.testing._server, llm_db.demo\n"
        "assert 'pytest' not in sys.modules and 'llm_db.testing.plugin' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
