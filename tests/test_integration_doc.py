"""docs/integration.md is true: its Python blocks run, in order, against a fresh
database (``DATABASE_URL``); the consumer test it shows passes with the plugin's
fixtures; documentation-only Python compiles; every SQL statement prepares.

Fences: ```` ```python ```` runs, ```` ```python test-file ```` is a consumer's test
module (its ``test_*`` functions are called with this test's fixtures),
```` ```python fastapi-app ```` is the FastAPI application tests/test_fastapi_example.py runs; ```` ```sql ```` statements are
PREPAREd (their ``$n`` parameters typed by the functions they call).
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "integration.md"
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)[ \t]*([^\n]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def blocks(language: str, info: str | None = None, doc: Path = DOC) -> list[tuple[int, str]]:
    """(line number, code) of each fenced block in ``language`` with that info string;
    none is a failure, so no test that loops over them can pass having run nothing."""
    text = doc.read_text(encoding="utf-8")
    found = []
    for m in FENCE.finditer(text):
        if m.group(1) == language and (info is None or m.group(2).strip() == info):
            found.append((text[: m.start()].count("\n") + 2, m.group(3)))
    assert found, f"{doc.name} has no ```{language} block" + (f" marked {info!r}" if info is not None else "")
    return found


def test_the_doc_has_each_kind_of_block():
    assert len(blocks("python", "")) >= 5
    assert len(blocks("python", "test-file")) == 1
    assert len(blocks("python", "fastapi-app")) == 1  # run by tests/test_fastapi_example.py
    assert blocks("sql")


def test_the_python_blocks_run_in_order(llm_dsn, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", llm_dsn)
    namespace: dict = {"__name__": "integration_doc"}
    found = blocks("python", "")
    assert len(found) >= 5
    try:
        for line, code in found:
            exec(compile(code, f"{DOC}:{line}", "exec"), namespace)
    finally:
        conn = namespace.get("conn")
        if isinstance(conn, psycopg.Connection):
            conn.close()


def test_the_consumer_test_file_passes_with_the_plugin_fixtures(request):
    ((line, code),) = blocks("python", "test-file")
    namespace: dict = {"__name__": "consumer_tests"}
    exec(compile(code, f"{DOC}:{line}", "exec"), namespace)
    tests = [fn for name, fn in namespace.items() if name.startswith("test_") and callable(fn)]
    assert len(tests) >= 2
    for fn in tests:
        fixtures = {name: request.getfixturevalue(name) for name in inspect.signature(fn).parameters}
        fn(**fixtures)


@pytest.mark.parametrize("info", ["fastapi-app", "test-file"])
def test_documentation_only_python_compiles(info):
    """The one block of each kind is found, then compiled."""
    ((line, code),) = blocks("python", info)
    compile(code, f"{DOC}:{line}", "exec")


def sql_statements() -> list[str]:
    statements = []
    for _, code in blocks("sql"):
        text = re.sub(r"--[^\n]*", "", code)
        statements += [s.strip() for s in text.split(";") if s.strip()]
    return statements


def test_every_sql_statement_prepares_against_the_schema(llm_conn):
    statements = sql_statements()
    assert len(statements) >= 8
    for n, statement in enumerate(statements):
        llm_conn.execute(f"PREPARE doc_{n} AS {statement}")
        llm_conn.execute(f"DEALLOCATE doc_{n}")


def test_the_readme_python_runs_as_written(llm_dsn, monkeypatch):
    """README.md's Python blocks (the service example over a psycopg_pool pool, budgets
    and prices, the ephemeral server for benchmarks) run as a new user would paste them."""
    monkeypatch.setenv("DATABASE_URL", llm_dsn)
    found = blocks("python", "", doc=README)
    assert len(found) >= 2
    for line, code in found:
        exec(compile(code, f"{README}:{line}", "exec"), {"__name__": "readme"})
    with psycopg.connect(llm_dsn) as conn:
        settled = conn.execute("SELECT count(*), count(cost_nanos) FROM llm.invocations WHERE status = 'settled'")
        assert settled.fetchone() == (2, 1)  # the service's request, and the priced one


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _brought_by(requirements: list[str]) -> set[str]:
    """The distributions that installing these requirements brings, their dependencies
    and the extras they name (``psycopg[binary,pool]`` brings psycopg-pool), by
    normalized name; those not installed here count as themselves alone."""
    from importlib import metadata

    from packaging.requirements import Requirement

    found: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        found.add(_norm(req.name))
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for r in requires:
            sub = Requirement(r)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in req.extras):
                if _norm(sub.name) not in found:
                    todo.append(sub)
    return found


def test_what_the_docs_call_your_dependency_is_not_llm_dbs():
    """integration.md called psycopg_pool "your dependency, not
    llm-db's" while pyproject depends on ``psycopg[binary,pool]``. Each module of the
    docs' Python blocks that a plain install brings must not be called yours, and each
    that it does not bring must come with a ``pip install`` naming it."""
    from importlib import metadata

    text = DOC.read_text(encoding="utf-8")
    distributions = metadata.packages_distributions()
    imported = {
        m.group(1)
        for info in ("", "fastapi-app")  # not the test module: pytest is what runs it
        for _, code in blocks("python", info)
        for m in re.finditer(r"^\s*(?:from|import) (\w+)", code, re.MULTILINE)
    }
    from importlib import metadata as md

    ours = _brought_by([r for r in md.requires("llm-db") or [] if "extra ==" not in r])
    flat = text.replace("\n", " ")
    installed = [m.group(1).replace("llm-db", "llm_db") for m in
                 re.finditer(r"pip install '?([A-Za-z][\w.\-]*(?:\[[\w,]+\])?)", flat)]
    yours_installed = _brought_by([i for i in installed if not i.startswith("llm_db")])
    prose = FENCE.sub("", text).replace("\n", " ")
    yours = [s for s in re.split(r"(?<=[.;])\s", prose) if "your dependenc" in s]
    checked = 0
    for module in sorted(imported):
        dists = {_norm(d) for d in distributions.get(module, [])}
        if not dists or module == "llm_db" or module in sys.stdlib_module_names:
            continue
        checked += 1
        if dists & ours:
            names = [module, *dists]
            called_yours = [
                s for s in yours if any(re.search(rf"\b{re.escape(n)}\b", s, re.I) for n in names)
            ]
            assert not called_yours, f"{module} comes with llm-db, yet: {called_yours}"
        else:
            assert dists & yours_installed, (
                f"{module} ({dists}) does not come with llm-db and no `pip install` brings it"
            )
    assert checked >= 2  # psycopg_pool and fastapi at least
