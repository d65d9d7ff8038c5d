"""docs/architecture.md "Conventions" 10: files are small and routines short. A routine
(a Python function, or a function or procedure of sql/) longer than 80 lines says
why in a comment that starts "Long on purpose", just above it or as the first lines
of its body, so a reader knows the length was chosen."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 80
REASON = "Long on purpose"


def tracked(suffix: str) -> list[Path]:
    """The repository's files ending in ``suffix``, tracked or not yet added (outside a
    git checkout, e.g. an unpacked sdist, the tests that need them skip)."""
    proc = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", f"*{suffix}"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        pytest.skip("not a git checkout")
    return [ROOT / name for name in proc.stdout.split() if (ROOT / name).is_file()]


def python_routines(path: Path) -> list[tuple[str, int, list[str]]]:
    """(name, lines, the lines around its start) of every function in a Python file."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            first_body = node.body[0].lineno
            context = lines[max(0, start - 4) : start - 1] + lines[node.lineno - 1 : first_body + 3]
            found.append((node.name, node.end_lineno - start + 1, context))
    return found


ROUTINE_START = re.compile(r"^CREATE OR REPLACE (?:FUNCTION|PROCEDURE) (\S+?)\(")


def sql_routines(path: Path) -> list[tuple[str, int, list[str]]]:
    """(name, lines, the comment above it and the first lines of its body) of every
    routine a file of sql/ defines: from its CREATE to the line that closes its $$ body."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for i, line in enumerate(lines):
        match = ROUTINE_START.match(line)
        if not match:
            continue
        opening = next(j for j in range(i, len(lines)) if lines[j].startswith("AS $$"))
        closing = next(j for j in range(opening + 1, len(lines)) if lines[j].startswith("$$"))
        above = i
        while above > 0 and lines[above - 1].startswith("--"):
            above -= 1
        found.append((match.group(1), closing - i + 1, lines[above:i] + lines[opening : opening + 6]))
    return found


def too_long_without_reason(routines: list[tuple[str, int, list[str]]]) -> list[tuple[str, int]]:
    return [(name, n) for name, n, context in routines
            if n > MAX_LINES and not any(REASON in line for line in context)]  # fmt: skip


def test_sql_routines_are_found():
    # the scanner itself: every file of sql/ but the last two defines routines
    counted = {p.name: len(sql_routines(p)) for p in tracked(".sql") if p.parent.name == "sql"}
    assert sum(counted.values()) >= 80
    assert [name for name, n in counted.items() if n == 0] == ["98_search_path.sql", "99_grants.sql"]


def test_no_sql_routine_over_80_lines_without_its_reason():
    offenders = {p.name: too_long_without_reason(sql_routines(p))
                 for p in tracked(".sql") if p.parent.name == "sql"}  # fmt: skip
    assert {name: bad for name, bad in offenders.items() if bad} == {}


def test_no_python_function_over_80_lines_without_its_reason():
    offenders = {str(p.relative_to(ROOT)): too_long_without_reason(python_routines(p))
                 for p in tracked(".py")}  # fmt: skip
    assert {name: bad for name, bad in offenders.items() if bad} == {}


def test_the_check_sees_a_long_routine_without_its_reason(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    plain = tmp_path / "plain.py"
    plain.write_text(f"def long():\n{body}\n", encoding="utf-8")
    assert too_long_without_reason(python_routines(plain)) == [("long", MAX_LINES + 1)]
    reasoned = tmp_path / "reasoned.py"
    reasoned.write_text(f"def long():\n    # {REASON}: a test of the test.\n{body}\n", encoding="utf-8")
    assert too_long_without_reason(python_routines(reasoned)) == []
