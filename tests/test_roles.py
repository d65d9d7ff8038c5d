"""Roles and function hygiene (docs/contract.md "Roles and grants", "Conventions" 2): tables are
written only through functions, PUBLIC has nothing, llm_app runs exactly the
request and task calls, llm_reader reads and runs only the read-only health alarm, every SECURITY
DEFINER function pins its search_path and every routine has a COMMENT."""

from __future__ import annotations

import uuid
from datetime import timedelta

import psycopg
import pytest

from tests.helpers import (
    ADMIT_SQL,
    APP_FUNCTIONS,
    INTERNAL_VIEWS,
    T0,
    admit,
    admit_params,
    assert_sqlstate,
    call,
    call_pass,
    declare_task,
    fingerprint,
    invariants,
    llm_tables,
    new_org,
    rows,
    run_pass,
    scalar,
    set_budget,
    settle,
)

ROLES = ("llm_app", "llm_operator", "llm_reader")
PINNED_SEARCH_PATH = "search_path=pg_catalog, llm, pg_temp"

# What docs/contract.md "Roles and grants" gives llm_operator: reconcile, health, schedule, notices, rebuild.
OPERATOR_ROUTINES = {
    "reconcile_org",
    "run_reconciliation",
    "reconciliation_health",
    "schedule_reconciliation",
    "unschedule_reconciliation",
    "claim_notices",
    "complete_notice",
    "fail_notice",
    "release_notice",
    "rearm_notices",
    "rebuild_daily_usage",
    "check_daily_usage",
    "set_budget",
}


def routines(conn: psycopg.Connection) -> list[dict]:
    return rows(
        conn,
        """
        SELECT p.oid, p.oid::regprocedure::text AS signature, p.proname, p.prokind,
               p.prosecdef, p.proconfig, obj_description(p.oid, 'pg_proc') AS comment
          FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace = 'llm'::regnamespace
         ORDER BY 2
        """,
    )


def executable_by(conn: psycopg.Connection, role: str) -> set[str]:
    """Names of the llm routines ``role`` may execute."""
    return {
        r["proname"]
        for r in rows(
            conn,
            """
            SELECT p.proname FROM pg_catalog.pg_proc AS p
             WHERE p.pronamespace = 'llm'::regnamespace
               AND has_function_privilege(%(role)s::text, p.oid, 'EXECUTE')
            """,
            {"role": role},
        )
    }


# ---------------------------------------------------------------- tables


def test_no_role_can_write_any_llm_table(llm_conn):
    """Writes go through functions (docs/architecture.md "Conventions" 4): no llm table is writable by the roles."""
    tables = llm_tables(llm_conn)
    assert len(tables) >= 10
    writable = [
        (role, table, privilege)
        for role in ROLES
        for table in tables
        for privilege in ("INSERT", "UPDATE", "DELETE", "TRUNCATE")
        if scalar(llm_conn, "SELECT has_table_privilege(%(role)s::text, %(t)s::regclass, %(p)s)",
                  {"role": role, "t": f"llm.{table}", "p": privilege})
    ]
    assert writable == []


def test_llm_app_write_attempts_are_refused_on_every_table(llm_conn, llm_role_conn):
    app = llm_role_conn("llm_app")
    for table in llm_tables(llm_conn):
        for statement in (
            f"INSERT INTO llm.{table} DEFAULT VALUES",
            f"UPDATE llm.{table} SET {first_column(llm_conn, table)} = NULL WHERE false",
            f"DELETE FROM llm.{table} WHERE false",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute(statement)


def first_column(conn: psycopg.Connection, table: str) -> str:
    return scalar(
        conn,
        # not an identity column: updating one fails on the identity rule before privileges
        "SELECT attname FROM pg_catalog.pg_attribute WHERE attrelid = %(t)s::regclass"
        " AND attnum > 0 AND attidentity = '' ORDER BY attnum LIMIT 1",
        {"t": f"llm.{table}"},
    )


RELATIONS = """
SELECT c.relname FROM pg_catalog.pg_class AS c
 WHERE c.relnamespace = 'llm'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm')
 ORDER BY 1
"""

PUBLIC_PRIVILEGES = """
SELECT c.relname, p.privilege
  FROM pg_catalog.pg_class AS c
 CROSS JOIN unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE']) AS p(privilege)
 WHERE c.relnamespace = 'llm'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm')
   AND pg_catalog.has_table_privilege('public', c.oid, p.privilege)
 ORDER BY 1, 2
"""


def llm_relations(conn: psycopg.Connection) -> list[str]:
    """Every table and view of schema llm: at least the tables and the five views."""
    names = [name for (name,) in conn.execute(RELATIONS)]
    assert {"invocations", "organizations", "periods", "ledger", "budget_usage", "sweep_summary"} <= set(names)
    return names


def test_public_has_no_privilege_on_schema_tables_or_routines(llm_conn):
    """docs/contract.md "Roles and grants": PUBLIC has nothing in schema llm, tables and
    views alike (the check must see a grant, so a grant to PUBLIC made
    and rolled back here is found by the same query)."""
    assert not scalar(llm_conn, "SELECT has_schema_privilege('public', 'llm', 'USAGE')")
    assert not scalar(llm_conn, "SELECT has_schema_privilege('public', 'llm', 'CREATE')")
    assert len(llm_relations(llm_conn)) >= 20
    assert llm_conn.execute(PUBLIC_PRIVILEGES).fetchall() == []
    with llm_conn.transaction(force_rollback=True):
        llm_conn.execute("GRANT SELECT ON llm.budget_usage TO PUBLIC")
        assert llm_conn.execute(PUBLIC_PRIVILEGES).fetchall() == [("budget_usage", "SELECT")]


def test_public_can_execute_no_function_or_procedure(llm_conn):
    """docs/contract.md "Roles and grants": PUBLIC executes no llm routine, procedures
    included (the check must see a grant, so a grant to PUBLIC made and
    rolled back here is found by the same helper)."""
    all_routines = routines(llm_conn)
    assert any(r["prokind"] == "p" for r in all_routines)
    assert executable_by(llm_conn, "public") == set()
    with llm_conn.transaction(force_rollback=True):
        llm_conn.execute("GRANT EXECUTE ON FUNCTION llm.reconciliation_health(timestamptz) TO PUBLIC")
        assert executable_by(llm_conn, "public") == {"reconciliation_health"}


def test_llm_reader_selects_every_table(llm_conn, llm_role_conn):
    """docs/contract.md "Roles and grants": the reader selects every table and view but
    the internal ones (INTERNAL_VIEWS), which it may not read at all."""
    reader = llm_role_conn("llm_reader")
    for relation in llm_relations(llm_conn):
        if relation in INTERNAL_VIEWS:
            assert_sqlstate(reader, "42501", f"SELECT * FROM llm.{relation} LIMIT 1", unchanged=False)
        else:
            reader.execute(f"SELECT * FROM llm.{relation} LIMIT 1")


# ---------------------------------------------------------------- routines per role


def test_llm_app_executes_exactly_the_request_and_task_functions(llm_conn):
    assert executable_by(llm_conn, "llm_app") == APP_FUNCTIONS


def test_llm_reader_executes_only_the_health_alarm_and_the_reads_none_of_which_writes(llm_conn):
    """A monitoring scrape (`llm-db metrics`) and the report
    run as llm_reader: llm.reconciliation_health() and the reads of sql/81, 82 (the exact list:
    tests/test_read_outputs.py), every one STABLE, so none can write."""
    granted = executable_by(llm_conn, "llm_reader")
    assert "reconciliation_health" in granted and "metrics" in granted
    volatile = scalar(
        llm_conn,
        "SELECT array_agg(p.proname) FROM pg_catalog.pg_proc AS p"
        " WHERE p.pronamespace = 'llm'::regnamespace AND p.provolatile = 'v'"
        " AND has_function_privilege('llm_reader', p.oid, 'EXECUTE')",
    )
    assert volatile is None


def test_llm_operator_runs_recovery_health_schedule_notices_and_reporting(llm_conn):
    granted = executable_by(llm_conn, "llm_operator")
    assert OPERATOR_ROUTINES <= granted
    assert not (APP_FUNCTIONS & granted), "the request calls belong to llm_app"


def test_llm_operator_runs_the_pass_with_its_clock(llm_conn, llm_role_conn):
    """docs/contract.md "Roles and grants": llm_operator runs the hourly pass
    (WF-PFM-LLM-004 hop 1), with a clock or without. The procedure is SECURITY
    INVOKER (it commits), so the clock check it calls runs with the operator's
    rights, and that check calls llm._clock_ok: without a grant on it every
    CALL by the operator failed with 42501 before the pass began."""
    org = new_org(llm_conn, 1000)
    admit(llm_conn, org, 100, now=T0)
    operator = llm_role_conn("llm_operator")
    assert scalar(operator, "SELECT pg_has_role('llm_operator', 'MEMBER')")  # its login
    summary = run_pass(operator, T0 + timedelta(days=2))
    assert (summary["status"], summary["requests_recovered"]) == ("succeeded", 1)
    call_pass(operator, None)  # the transaction's own clock
    assert invariants(llm_conn) == []


def test_llm_app_admits_and_settles_through_security_definer_functions(llm_conn, llm_role_conn):
    org = new_org(llm_conn, 1000)
    app = llm_role_conn("llm_app")
    assert scalar(app, "SELECT pg_has_role('llm_app', 'MEMBER')")  # its login
    inv = app.execute(f"SELECT a.id FROM ({ADMIT_SQL}) AS a", admit_params(org, 10)).fetchone()[0]
    assert settle(app, org, inv, 7) == "settled"
    declare_task(llm_conn, "summarize")
    assert scalar(app, "SELECT key FROM llm.task_kinds") == "summarize"  # the catalog is readable


@pytest.mark.parametrize(
    "query",
    [
        ("upsert_organization", uuid.uuid4(), "x", 1),
        ("declare_task_kind", "x"),
        ("reconcile_org", uuid.uuid4()),
        ("check_invariants",),
        ("run_reconciliation",),
        ("set_budget", uuid.uuid4(), "project", "p", "day", 1),
        "SELECT * FROM llm.invocations",
        "SELECT * FROM llm.periods",
        "SELECT * FROM llm.ledger",
    ],
    ids=lambda q: q[0] if isinstance(q, tuple) else q,
)
def test_llm_app_cannot_run_operator_calls_nor_read_the_books(llm_conn, llm_role_conn, query):
    """An operation of the driver's table (a tuple) or a read of a table (SQL)."""
    app = llm_role_conn("llm_app")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        if isinstance(query, tuple):
            call(app, *query)
        else:
            app.execute(query)


def test_llm_app_admits_with_scopes_and_reads_the_budget_views(llm_conn, llm_role_conn):
    """The app names a project, key and end user on a request under a '*' end-user budget, and
    reads that budget in llm.budgets and its counter in llm.budget_usage."""
    org = new_org(llm_conn, 1000)
    set_budget(llm_conn, org, "end_user", "*", "day", 50)
    app = llm_role_conn("llm_app")
    admit(app, org, 20, project="p", api_key="k", end_user="u")
    assert rows(app, "SELECT scope, scope_id, budget_window, limit_credits FROM llm.budgets") == [
        {"scope": "end_user", "scope_id": "*", "budget_window": "day", "limit_credits": 50}]
    assert rows(app, "SELECT scope_id, limit_credits, held_credits FROM llm.budget_usage") == [
        {"scope_id": "u", "limit_credits": 50, "held_credits": 20}]
    assert invariants(llm_conn) == []


@pytest.mark.parametrize("role", ["llm_app", "llm_reader"])
def test_only_llm_operator_sets_budgets(llm_conn, llm_role_conn, role):
    """llm_app and llm_reader get 42501 and write nothing; llm_operator sets the budget."""
    org = new_org(llm_conn, 1000)
    before = fingerprint(llm_conn)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        set_budget(llm_role_conn(role), org, "api_key", "k", "day", 10)
    assert fingerprint(llm_conn) == before
    set_budget(llm_role_conn("llm_operator"), org, "api_key", "k", "day", 10)
    assert rows(llm_conn, "SELECT scope_id, limit_credits FROM llm.budgets") == [
        {"scope_id": "k", "limit_credits": 10}]
    assert invariants(llm_conn) == []


def test_llm_reader_cannot_admit(llm_conn, llm_role_conn):
    org = new_org(llm_conn, 1000)
    reader = llm_role_conn("llm_reader")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        reader.execute(ADMIT_SQL, admit_params(org, 1, now=T0))


# ---------------------------------------------------------------- function hygiene


def test_every_security_definer_function_pins_its_search_path(llm_conn):
    definers = [r for r in routines(llm_conn) if r["prosecdef"]]
    assert {r["proname"] for r in definers} >= APP_FUNCTIONS
    unpinned = [r["signature"] for r in definers
                if PINNED_SEARCH_PATH not in (r["proconfig"] or [])]
    assert unpinned == []


# The private routines of the request path that run under their caller's pinned path
# (sql/98_search_path.sql says why): every call of a cycle pays the pin once, not at
# each layer.
REQUEST_PATH_UNPINNED = [
    "_admit_invocation", "_budgets_revision", "_end_invocation", "_fail_invocation", "_mark_dispatched",
    "_mask_elements", "_move_request_counters", "_move_stripe", "_move_within_counter_room", "_move_within_rooms",
    "_price_request", "_require_price", "_settle_invocation", "_settle_usage", "_usage_cost",
]


def test_every_function_pins_its_search_path_except_the_committing_procedure(llm_conn):
    """docs/architecture.md "Conventions" 2. A procedure that COMMITs may carry no SET clause (PostgreSQL), so
    run_reconciliation is an exception; it is SECURITY INVOKER and calls only
    schema-qualified steps. The others are the pure SQL predicates, constants and budget
    calendar of the request path (a SET clause stops PostgreSQL from inlining an SQL
    function, and each is one fully qualified expression, operators included) and the
    request path's private PL/pgSQL routines, which run only under a pinned caller (the
    next test)."""
    unpinned = [r for r in routines(llm_conn) if PINNED_SEARCH_PATH not in (r["proconfig"] or [])]
    assert sorted((r["proname"], r["prokind"], r["prosecdef"]) for r in unpinned) == sorted([
        ("_admission", "f", False),
        ("_amount_ok", "f", False),
        ("_budget_keys", "f", False),
        ("_budget_scopes", "f", False),
        ("_budget_slot", "f", False),
        ("_budget_windows", "f", False),
        ("_class_cost", "f", False),
        ("_clock_ok", "f", False),
        ("_credits_of", "f", False),
        ("_estimate_usage", "f", False),
        ("_full_usage", "f", False),
        ("_hours_up", "f", False),
        ("_max_amount", "f", False),
        ("_max_sum", "f", False),
        ("_may_cross", "f", False),
        ("_named_scopes_mask", "f", False),
        ("_open_since", "f", False),
        ("_organization_settings", "f", False),
        ("_period_start", "f", False),
        ("_price_classes", "f", False),
        ("_price_tier", "f", False),
        ("_scope_id_ok", "f", False),
        ("_text_ok", "f", False),
        ("_unit_cost", "f", False),
        ("_unit_estimate", "f", False),
        ("_unit_nanos", "f", False),
        ("_usage_ok", "f", False),
        ("_window_end", "f", False),
        ("_window_start", "f", False),
        ("run_reconciliation", "p", False),
        *((name, "f", False) for name in REQUEST_PATH_UNPINNED),
    ])


def test_the_unpinned_request_path_runs_only_under_a_pinned_caller(llm_conn):
    """An unpinned PL/pgSQL routine of the request path is SECURITY INVOKER and no role
    (nor PUBLIC) may execute it: only our pinned routines call it (or the owner, or
    Citus delegating a twin), so a caller's search_path never reaches it through a
    grant. tests/test_lint.py checks every routine's names resolve without llm on the
    path."""
    found = rows(
        llm_conn,
        """
        SELECT p.proname, p.prosecdef,
               array_remove(ARRAY[
                   CASE WHEN has_function_privilege('llm_app', p.oid, 'EXECUTE') THEN 'llm_app' END,
                   CASE WHEN has_function_privilege('llm_operator', p.oid, 'EXECUTE') THEN 'llm_operator' END,
                   CASE WHEN has_function_privilege('llm_reader', p.oid, 'EXECUTE') THEN 'llm_reader' END,
                   CASE WHEN EXISTS (SELECT FROM aclexplode(p.proacl) AS a
                                      WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE') THEN 'PUBLIC' END],
                   NULL) AS executors
          FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace = 'llm'::regnamespace AND p.proname = ANY (%(names)s)
         ORDER BY 1
        """,
        {"names": REQUEST_PATH_UNPINNED},
    )
    assert sorted({r["proname"] for r in found}) == REQUEST_PATH_UNPINNED
    assert [(r["proname"], r["prosecdef"], r["executors"]) for r in found
            if r["prosecdef"] or r["executors"]] == []


def test_every_function_and_procedure_has_a_comment(llm_conn):
    missing = [r["signature"] for r in routines(llm_conn) if not (r["comment"] or "").strip()]
    assert missing == []


def test_every_llm_table_has_a_comment(llm_conn):
    missing = [
        t for t in llm_tables(llm_conn)
        if not scalar(llm_conn, "SELECT obj_description(%(t)s::regclass, 'pg_class')",
                      {"t": f"llm.{t}"})
    ]
    assert missing == []
