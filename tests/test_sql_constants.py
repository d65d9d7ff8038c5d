"""docs/architecture.md "Conventions" 6: the package's SQL is named
constants, one module per component (llm_db/queries.py, migrate.py, cli/doctor.py,
cli/commands/setup.py, demo/, testing/_sql.py), so no call to ``execute`` spells its
statement: not as a string, an f-string, or a ``psycopg.sql.SQL`` built in place.
Transaction control (BEGIN, COMMIT, ROLLBACK) is the one exception."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRANSACTION_CONTROL = {"BEGIN", "COMMIT", "ROLLBACK"}


def spelled(node: ast.expr) -> str | None:
    """The statement text an ``execute`` argument spells in place, else None (a name)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return ast.unparse(node)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == "SQL" and node.args:  # sql.SQL("...")
            return spelled(node.args[0])
        if node.func.attr == "format":  # "...".format(...) or sql.SQL("...").format(...)
            return spelled(node.func.value)
    return None


def statements_in_place(path: Path) -> list[str]:
    """``file:line: statement`` for every execute call of ``path`` spelling its SQL."""
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("execute", "executemany") and node.args):  # fmt: skip
            text = spelled(node.args[0])
            if text is not None and text.strip() not in TRANSACTION_CONTROL:
                found.append(f"{shown}:{node.lineno}: {text.strip()[:60]}")
    return found


def test_no_execute_call_spells_its_statement():
    """Conventions 6: every statement the package runs is a named constant."""
    found = [
        hit for path in sorted((ROOT / "llm_db").rglob("*.py")) for hit in statements_in_place(path)
    ]
    assert found == []


def test_the_check_sees_a_statement_spelled_in_place(tmp_path):
    source = tmp_path / "x.py"
    source.write_text(
        "from psycopg import sql\n"
        "QUERY = 'SELECT 1'\n"
        "def f(conn, name):\n"
        "    conn.execute(QUERY)\n"
        "    conn.execute('BEGIN')\n"
        "    conn.execute('SELECT 2')\n"
        "    conn.execute(f'LISTEN {name}')\n"
        "    conn.execute(sql.SQL('DROP DATABASE {}').format(sql.Identifier(name)))\n",
        encoding="utf-8",
    )
    found = [hit.split(": ", 1)[1] for hit in statements_in_place(source)]
    assert sorted(found) == ["DROP DATABASE {}", "SELECT 2", "f'LISTEN {name}'"]
