"""The package's folders show its extras (issue 24 item 4).

One wheel: the core at ``llm_db/`` (the driver, ``migrate`` and what they need) and a
folder per extra (``cli/``, ``service/``, ``testing/``) and for the demo. The core
imports none of those folders; no two modules of the package import each other,
even through a chain, under ``TYPE_CHECKING`` or inside a function; the module paths
before 0.3.0 stay as re-exporting shims for 0.3.x; and every import the README and
docs/ show still imports.
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

CORE = ["llm_db", "llm_db.client", "llm_db._client_methods", "llm_db.operations", "llm_db.models", "llm_db.errors",
        "llm_db.migrate", "llm_db.executions", "llm_db._extras", "llm_db._steps", "llm_db.queries",
        "llm_db._moved", "llm_db._text", "llm_db._types", "llm_db.__main__"]  # fmt: skip
EXTRA_FOLDERS = ("llm_db.cli", "llm_db.service", "llm_db.testing", "llm_db.demo")
FOLDER_PREFIXES = tuple(f"{folder}." for folder in EXTRA_FOLDERS)
# the module paths before 0.3.0 -> where the module lives now
SHIMS = {
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
    """issue 24 item 4: none, counting imports under TYPE_CHECKING and inside functions
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
    """issue 24 item 4: the core (what ``pip install llm-db`` is for) loads nothing of
    cli/, service/, testing/ or demo/, nor a shim of a module that moved there."""
    loaded = loaded_after_import(module)
    assert module in loaded
    assert [
        m for m in loaded if m in EXTRA_FOLDERS or m.startswith(FOLDER_PREFIXES) or m in SHIMS
    ] == []


def test_llm_dbs_notice_names_load_the_service_folder_when_first_used():
    """issue 24 item 4: listed by ``__all__`` and ``dir()``, read from
    ``llm_db.service.notices`` by the module's ``__getattr__``."""
    import llm_db
    from llm_db.service import notices

    lazy = {"DeliverySummary", "InvalidSecret", "async_deliver_notices", "deliver_notices",
            "new_secret", "verify_webhook"}  # fmt: skip
    assert lazy <= set(llm_db.__all__) and lazy <= set(dir(llm_db))
    for name in lazy:
        assert getattr(llm_db, name) is getattr(notices, name)
    assert set(llm_db.__all__) <= set(dir(llm_db))
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        llm_db.nothing_here  # noqa: B018


def public_names(module) -> set[str]:
    """What ``from module import *`` binds."""
    return set(getattr(module, "__all__", [n for n in vars(module) if not n.startswith("_")]))


@pytest.mark.parametrize(("old", "new"), SHIMS.items())
def test_an_old_module_path_re_exports_the_moved_module(old, new):
    """issue 24 item 4: the paths before 0.3.0 keep working in 0.3.x, their objects the
    very ones of the new path, and each says where the module went."""
    shim, moved = importlib.import_module(old), importlib.import_module(new)
    names = public_names(moved)
    assert names or hasattr(moved, "__path__"), new  # a package may hold only its modules
    assert {n: getattr(shim, n, None) for n in names} == {n: getattr(moved, n) for n in names}
    # and every other name the moved module holds, private ones too, as 0.2.0 had them
    others = [n for n in vars(moved) if not n.startswith("__") and n not in names]
    assert {n: getattr(shim, n, None) for n in others} == {n: getattr(moved, n) for n in others}
    with pytest.raises(AttributeError, match="moved from 0.2.0's path"):
        shim.no_such_name  # noqa: B018
    assert f"``{new}``" in shim.__doc__ and "removed in 0.4" in shim.__doc__
    assert Path(shim.__file__).read_text(encoding="utf-8").count("\n") <= 8  # a shim, no code


# the public modules of 0.2.0 (`git ls-tree -r 935d250 llm_db`, private ones left out)
MODULES_0_2_0 = [
    "llm_db", "llm_db.cli", "llm_db.requests", "llm_db.commands",
    *(f"llm_db.commands.{m}" for m in ("common", "demo", "doctor", "notices", "passes", "reports", "setup")),
    "llm_db.demo", "llm_db.doctor", "llm_db.errors", "llm_db.executions", "llm_db.metrics",
    "llm_db.migrate", "llm_db.models", "llm_db.notices", "llm_db.operations", "llm_db.queries",
    "llm_db.report", "llm_db.testing", "llm_db.worker",
]  # fmt: skip


@pytest.mark.parametrize("old", MODULES_0_2_0)
def test_every_public_module_path_of_0_2_0_still_imports(old):
    """issue 24 item 4: where it is now, or as a shim (``SHIMS``) to where it went."""
    module = importlib.import_module(old)
    assert old in SHIMS or old in CORE or old in EXTRA_FOLDERS, old
    assert (old in SHIMS) == ("removed in 0.4" in (module.__doc__ or ""))


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
    """issue 24 item 4: every import shown in README.md and docs/ keeps working."""
    exec(compile(statement, f"{doc}: {statement}", "exec"), {})


def test_the_cli_package_lists_and_reads_the_groups_names():
    """``llm_db.cli`` names ``main`` and the exit codes without importing click, and
    reads each from ``llm_db.cli.group``, where they live."""
    import llm_db.cli
    from llm_db.cli import group

    assert llm_db.cli.__all__ == group.__all__
    for name in group.__all__:
        assert getattr(llm_db.cli, name) is getattr(group, name)


def test_a_consumer_does_not_import_the_table_of_operations():
    """issue 24 item 3: the generated methods are the driver at run time; the table they
    were generated from (which reads every entry's signature when imported) is for the
    generator, the docs and the tests, so ``import llm_db`` and a call do not load it."""
    code = (
        "import sys, llm_db, llm_db.executions\n"
        "assert 'llm_db.operations' not in sys.modules, 'the table was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_llm_db_reaches_the_modules_0_2_0_imported_with_it():
    """issue 24 item 4: after ``import llm_db``, 0.2.0 code reached ``llm_db.notices`` and
    ``llm_db.requests`` without importing them; they load on first use now."""
    code = (
        "import sys, llm_db\n"
        "assert 'llm_db.service.notices' not in sys.modules\n"
        "assert callable(llm_db.notices.verify_webhook) and llm_db.requests.Llm is llm_db.Llm\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_fixtures_import_by_their_0_2_0_path():
    """issue 24 item 4: 0.2.0's ``llm_db.testing`` defined the fixtures, so a conftest
    could import them from it; they are ``llm_db.testing.plugin``'s now, loaded on first
    use. Hooks are not forwarded (pytest registers each once)."""
    import llm_db.testing
    from llm_db.testing import plugin

    for name in ("llm_conn", "llm_dsn", "llm_connect", "llm_role_conn", "llm_server", "llm_template",
                 "llm_cron_dsn", "llm_pgbouncer", "llm_pgbouncer_dsn", "llm_superuser_conn", "llm_owner"):  # fmt: skip
        assert getattr(llm_db.testing, name) is getattr(plugin, name), name
    with pytest.raises(AttributeError):
        llm_db.testing.pytest_addoption  # noqa: B018
    with pytest.raises(AttributeError):
        llm_db.testing.llm_nothing  # noqa: B018


def test_the_servers_and_the_demo_import_without_pytest():
    """The ``testing`` extra brings no pytest: ``llm-db demo`` and the benchmarks import
    the throw-away server without it; only the plugin's fixtures
    (``llm_db.testing.plugin``) need it."""
    code = (
        "import sys, llm_db.testing, llm_db.testing._server, llm_db.demo\n"
        "assert 'pytest' not in sys.modules and 'llm_db.testing.plugin' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
