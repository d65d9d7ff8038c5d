"""The reference pages (docs/reference/, issue 24 item 7) are what scripts/reference.py
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
    """issue 24 item 7: a page per public routine, generated from the COMMENTs, the
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
    """issue 24 item 7: the SQLSTATEs of a reference page come from docs/contract.md
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
