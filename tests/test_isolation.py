"""The lock-order claims of docs/architecture.md "Lock order" (its column "proven by")
as isolation specs, run by PostgreSQL's own isolation tester.

Each ``tests/isolation/specs/NAME.spec`` scripts sessions, steps and permutations of
the real public routines; ``tests/isolation/expected/NAME.out`` is what the tester
must print: which step waits for which, what each call returns, and the books
(``llm.periods``, ``llm.check_invariants()``) after every permutation. Every spec runs
in a fresh clone of the migrated template, through ``pg_isolation_regress
--use-existing --dbname=<clone>``, which then creates and drops no database.

The tester comes with Debian's ``postgresql-client-15`` (scripts/bootstrap.sh installs
it). Without it the test skips, or fails when ``LLM_DB_REQUIRE_TOOLS=1`` (tests/tools.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.tools import REQUIRE_ENV, require_tool

ISOLATION_DIR = Path(__file__).parent / "isolation"
SPECS = sorted(p.stem for p in (ISOLATION_DIR / "specs").glob("*.spec"))
REGRESS = Path("/usr/lib/postgresql/15/lib/pgxs/src/test/isolation/pg_isolation_regress")
TESTER = REGRESS.with_name("isolationtester")  # pg_isolation_regress runs it from beside itself
PACKAGE = "postgresql-client-15"


def _require_tester() -> None:
    for program in (REGRESS, TESTER):
        require_tool(str(program), PACKAGE)


def test_a_missing_tester_skips_or_fails_when_tools_are_required(monkeypatch):
    """Without the tester the specs skip naming the package to install, and fail
    instead under LLM_DB_REQUIRE_TOOLS=1 (a CI that must run them)."""
    monkeypatch.setattr(sys.modules[__name__], "TESTER", Path("/nonexistent/isolationtester"))
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=PACKAGE):
        _require_tester()
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=PACKAGE):
        _require_tester()


def test_the_lock_order_table_and_the_specs_folder_name_the_same_specs():
    """The table is where a reader learns which spec proves which claim: every spec of
    the folder proves a row of it, and it names no spec the folder does not hold."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = text.split("### Lock order", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and line[2:3].isdigit()]
    assert len(rows) >= 15, rows
    named = {name for row in rows for name in re.findall(r"([a-z_]+)\.spec", row.rstrip(" |").rsplit("|", 1)[1])}
    assert sorted(set(SPECS) - named) == [] and sorted(named - set(SPECS)) == []


def test_every_spec_has_its_expected_output():
    """Conventions 8: a spec without an expected output would never be compared."""
    expected = sorted(p.stem for p in (ISOLATION_DIR / "expected").glob("*.out"))
    assert SPECS and expected == SPECS


@pytest.fixture
def owner_plays_the_roles(llm_conn):
    """The tester logs every session in as the owner (setup and teardown write tables, as
    only the owner may), and a session's ``SET ROLE llm_app`` needs membership, which the
    owner (CREATEROLE, no superuser) grants itself for the test and revokes after."""
    llm_conn.execute("GRANT llm_app, llm_operator TO CURRENT_USER")
    try:
        yield
    finally:
        llm_conn.execute("REVOKE llm_app, llm_operator FROM CURRENT_USER")


@pytest.mark.parametrize("spec", SPECS)
def test_isolation_spec(spec, llm_dsn, tmp_path, owner_plays_the_roles):
    """The permutations of one spec print exactly its expected output (the lock order
    of docs/architecture.md "Architecture": who waits for whom, what each call returns, and
    invariants 1 to 9 holding after each permutation)."""
    _require_tester()
    info = psycopg.conninfo.conninfo_to_dict(llm_dsn)
    result = subprocess.run(
        [
            str(REGRESS),
            "--use-existing",
            f"--host={info['host']}",
            f"--port={info['port']}",
            f"--user={info['user']}",
            f"--dbname={info['dbname']}",
            f"--inputdir={ISOLATION_DIR}",
            f"--outputdir={tmp_path}",
            spec,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    diffs = tmp_path / "regression.diffs"
    assert result.returncode == 0, (
        f"pg_isolation_regress exited {result.returncode}\n{result.stdout}{result.stderr}\n"
        + (diffs.read_text() if diffs.exists() else "(no regression.diffs)")
    )
