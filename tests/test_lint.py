"""Static checks: ruff over the repository, plpgsql_check over every PL/pgSQL routine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.tools import missing_tool

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_is_clean():
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format=concise", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# Levels plpgsql_check reports: error, warning, warning extra, performance,
# security. Errors, warnings and extra warnings (unused parameters or
# variables, …) fail the build; the routines were clean of all three when this
# test landed. A deliberate exception goes in the routine's body as a comment,
# e.g. `-- @plpgsql_check_options: extra_warnings = off`, with the reason
# beside it. Performance warnings (implicit casts and the like) stay off:
# plpgsql_check's default, advice rather than defects.
PLPGSQL_CHECK = """
SELECT p.oid::regprocedure::text AS routine, r.lineno, r.level, r.sqlstate, r.message,
       r.detail, r.hint, r.statement, r.query
FROM pg_catalog.pg_proc p
JOIN pg_catalog.pg_language l ON l.oid = p.prolang
CROSS JOIN LATERAL public.plpgsql_check_function_tb(
    p.oid, fatal_errors := false, extra_warnings := true) r
WHERE l.lanname = 'plpgsql'
  AND p.pronamespace = 'llm'::regnamespace
  AND p.prorettype NOT IN ('pg_catalog.trigger'::regtype, 'pg_catalog.event_trigger'::regtype)
  AND r.level IN ('error', 'warning', 'warning extra')
ORDER BY 1, 2
"""

PLPGSQL_ROUTINES = """
SELECT count(*)
FROM pg_catalog.pg_proc p
JOIN pg_catalog.pg_language l ON l.oid = p.prolang
WHERE l.lanname = 'plpgsql'
  AND p.pronamespace = 'llm'::regnamespace
  AND p.prorettype NOT IN ('pg_catalog.trigger'::regtype, 'pg_catalog.event_trigger'::regtype)
"""


def test_plpgsql_check_finds_no_error_or_warning(llm_conn, llm_superuser_conn):
    available = llm_conn.execute(
        "SELECT 1 FROM pg_available_extensions WHERE name = 'plpgsql_check'"
    ).fetchone()
    if available is None:
        missing_tool("the plpgsql_check extension", "postgresql-15-plpgsql-check")
    # superuser: creating an extension is the provider admin's; the owner checks its routines
    llm_superuser_conn.execute("CREATE EXTENSION plpgsql_check SCHEMA public")
    # without llm on the path: every name a routine uses must be qualified, so a routine
    # left unpinned (sql/98_search_path.sql) resolves the same under any caller's path
    llm_conn.execute("SET search_path = pg_catalog, pg_temp")
    (checked,) = llm_conn.execute(PLPGSQL_ROUTINES).fetchone()
    assert checked > 0, "no PL/pgSQL routine in schema llm: nothing was checked"
    findings = llm_conn.execute(PLPGSQL_CHECK).fetchall()
    report = "\n".join(
        f"{routine} line {lineno}: {level} {sqlstate} {message}"
        + (f"\n    DETAIL: {detail}" if detail else "")
        + (f"\n    HINT: {hint}" if hint else "")
        + (f"\n    statement: {statement}" if statement else "")
        + (f"\n    query: {query}" if query else "")
        for routine, lineno, level, sqlstate, message, detail, hint, statement, query in findings
    )
    assert not findings, (
        f"plpgsql_check found {len(findings)} problem(s) in {checked} routines:\n{report}"
    )
