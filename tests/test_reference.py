"""The reference pages (docs/reference/) are what scripts/reference.py
writes from a freshly migrated database: a page per public routine with its signature,
parameters, result, roles, SQLSTATEs, Python method and an example with its output.

Like schema.sql, the pages are generated and checked in; when a routine, its COMMENT, its
grants, the operations table, docs/contract.md or an example changes, rewrite them with
``.venv/bin/python scripts/reference.py`` and commit the difference.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
# scripts/ is no package: load the generator from its file (registered first, as its
# dataclass needs its module in sys.modules)
SPEC = importlib.util.spec_from_file_location("llm_db_reference", ROOT / "scripts" / "reference.py")
assert SPEC is not None and SPEC.loader is not None
reference = sys.modules["llm_db_reference"] = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(reference)

# Raised by PostgreSQL itself, not by a RAISE: a lock waited for past org_lock_timeout.
RAISED_BY_POSTGRESQL = {"55P03"}


def committed() -> dict[str, str]:
    return {path.name: path.read_text(encoding="utf-8") for path in reference.OUT.glob("*.md")}


def differences(written: dict[str, str], kept: dict[str, str]) -> list[str]:
    return [
        f"docs/reference/{name}: "
        + ("missing" if name not in kept else "not written" if name not in written else "differs")
        for name in sorted(set(written) | set(kept))
        if written.get(name) != kept.get(name)
    ]


def test_the_reference_pages_are_what_the_generator_writes(llm_dsn: str) -> None:
    """A page per public routine, generated from the COMMENTs, the
    catalog and the operations table, with examples whose output is the real one."""
    pages = reference.render(llm_dsn)
    with psycopg.connect(llm_dsn) as conn:
        public = conn.execute(reference.ROUTINES).fetchall()
    assert len(public) >= 20 and len(pages) == len(public) + 1  # and README.md
    wrong = differences(pages, committed())
    assert not wrong, (
        f"the reference pages are stale; rewrite them with `{reference.COMMAND}`:\n"
        + "\n".join(wrong)
    )


def test_a_stale_page_is_reported() -> None:
    """The comparison can fail: a page edited, one missing and one left over."""
    written = {"edited": "new", "same": "same", "new": "x"}
    kept = {"edited": "old", "same": "same", "gone": "y"}
    assert differences(written, kept) == [
        "docs/reference/edited: differs",
        "docs/reference/gone: not written",
        "docs/reference/new: missing",
    ]


def test_every_sqlstate_the_contract_lists_for_a_routine_is_raised_by_it(
    llm_conn: psycopg.Connection,
) -> None:
    """The SQLSTATEs of a reference page come from docs/contract.md
    "Functions"; each is raised (RAISE ... ERRCODE) by the routine or a routine it calls,
    so the contract lists no error its routine cannot raise."""
    bodies = reference.bodies(llm_conn)
    names = [row[1] for row in llm_conn.execute(reference.ROUTINES).fetchall()]
    listed = {name: set(reference.documented(name)) for name in names}
    assert sum(len(codes) for codes in listed.values()) >= 40, listed
    unraised = {
        name: sorted(codes - reference.raised(name, bodies) - RAISED_BY_POSTGRESQL)
        for name, codes in listed.items()
    }
    assert not {name: codes for name, codes in unraised.items() if codes}


def test_the_database_name_is_replaced_only_where_it_stands_alone() -> None:
    """The pages do not depend on the database they were generated in: its name is shown
    as ``app``, but not inside another name (a database called llm)."""
    hint = "'llm-reconciliation:llm', 'CALL llm.run_reconciliation()', 'llm'; database llm"
    assert reference.anonymous(hint, "llm", "llm_owner") == (
        "'llm-reconciliation:app', 'CALL llm.run_reconciliation()', 'app'; database app"
    )


def test_every_parameter_of_a_public_routine_has_a_meaning(llm_conn: psycopg.Connection) -> None:
    """Each parameter on a reference page says what it means, from
    scripts/reference_parameters.tsv, and that file holds no line for a parameter that is
    gone; a 22023 in a contract bullet gives the routine's own reason."""
    routines = [reference.Routine(*row) for row in llm_conn.execute(reference.ROUTINES)]
    table = reference.meanings()
    assert len(table) >= 50
    assert reference.unexplained(routines, table) == []
    assert reference.unreasoned(routines) == []


def test_a_parameter_without_a_meaning_or_a_line_left_over_is_reported() -> None:
    """The check above can fail: a routine's own line wins over the shared one, a
    parameter with neither is named, and so is a line no routine uses."""
    routine = reference.Routine(
        0, "r", False, "p_now timestamp with time zone, p_x text", "void", ""
    )
    table = {("*", "p_now"): "The clock.", ("r", "p_gone"): "Was.", ("*", "p_spare"): "Unused."}
    assert reference.unexplained([routine], table) == [
        "llm.r(p_x) has no meaning",
        "* p_spare is no parameter of a public routine",
        "r p_gone is no parameter of a public routine",
    ]
    table["r", "p_now"] = "Its own clock."
    assert reference.meaning_of("r", "p_now", table) == "Its own clock."


def test_a_pages_sqlstates_are_the_routines_own_reasons() -> None:
    """A page gives the reason its routine's contract bullet gives for
    each code, not the union of every routine's ("an unknown notice" is a notice
    routine's reason, never a report's); a code without one takes the "Errors" meaning,
    and a number inside a reason is no code."""
    near_limit = reference.documented("report_budgets_near_limit")
    assert list(near_limit) == ["22023"]
    assert near_limit["22023"].startswith("a scope other than organization, project")
    assert "notice" not in "\n".join(reference.sqlstates("report_budgets_near_limit"))
    claim = reference.documented("claim_notices")
    assert list(claim) == ["22023"] and "1 to 10000" in claim["22023"]  # not code 10000
    admit = reference.documented("admit_invocation")
    assert admit["LL009"] == "the task is not running" and admit["LL002"] is None
    page = "\n".join(reference.sqlstates("admit_invocation"))
    assert "| LL002 | `UnknownOrganization` | no organization with that id |" in page
