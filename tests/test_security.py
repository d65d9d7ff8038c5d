"""Security: each role can do exactly what docs/contract.md ("Roles and grants") gives it and
nothing more, and no routine can be hijacked through the caller's search_path.

1. The privilege matrix: every function and procedure of schema ``llm`` (read
   from ``pg_proc``, so a new one is covered the day it lands: nobody may run it
   until this file says so) and every table, against llm_app, llm_operator,
   llm_reader and a plain login role with no grants. ``has_function_privilege``
   / ``has_table_privilege`` / ``has_schema_privilege`` must equal the explicit
   expectation below, cell by cell.
2. Real calls per role: the granted ones succeed, a sample of the others fails
   with 42501 (insufficient_privilege).
3. search_path hijacking: a role with its own schema ``evil`` first in its
   search_path (pg_catalog explicitly after it, so its shadows win wherever the
   path is consulted) creates look-alikes of what the bodies use — ``now()``,
   ``gen_random_uuid()``, ``format``, ``hashtext``, ``date_trunc``, ``length``,
   ``btrim``, ``cardinality``, ``jsonb_build_object``-like helpers and the
   operators ``=`` on uuid, ``<`` / ``>`` on integer, ``+`` on bigint, ``<=`` and
   ``-`` on timestamptz — each recording its use in ``evil.calls``. A control
   query proves the shadows do win for the role's own SQL; then every request,
   task, recovery and notice call, and ``CALL llm.run_reconciliation`` with a
   batch, runs as that role and ``evil.calls`` must stay empty.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

from tests.helpers import (
    INTERNAL_VIEWS,
    JANUARY,
    T0,
    admit,
    call,
    declare_task,
    invariants,
    new_org,
    settle,
)

MONTH = {"first": JANUARY, "last": JANUARY.replace(day=31)}  # the days rebuild_daily_usage covers
ROLES = ("llm_app", "llm_operator", "llm_reader", "plain")

APP = {
    "llm.admit_invocation(uuid,bigint,text,uuid,uuid,timestamp with time zone,text,text,text,bigint,bigint)",
    "llm.mark_dispatched(uuid,uuid,timestamp with time zone)",
    "llm.settle_invocation(uuid,uuid,bigint,bigint,bigint,bigint,timestamp with time zone)",
    "llm.fail_invocation(uuid,uuid,text,bigint,bigint,timestamp with time zone,jsonb)",
    "llm.settle_usage(uuid,uuid,jsonb,timestamp with time zone)",
    "llm.open_execution(uuid,text,text,text,text,timestamp with time zone)",
    "llm.close_execution(uuid,uuid,text,text,timestamp with time zone)",
    "llm.note_refusal(uuid,text,text,text,date,timestamp with time zone)",
    "llm.price_usage(text,jsonb,uuid,timestamp with time zone)",
}
OPERATOR = {
    # tenants and the task catalog (administration)
    "llm.upsert_organization(uuid,text,bigint,text,integer[],timestamp with time zone)",
    "llm.set_allowance(uuid,bigint,timestamp with time zone)",
    "llm.declare_task_kind(text,text)",
    # the price book
    "llm.set_price(text,jsonb,timestamp with time zone,uuid)",
    "llm.set_credit_rate(bigint,uuid,timestamp with time zone)",
    "llm.reprice(text,timestamp with time zone,timestamp with time zone,bigint,boolean)",
    "llm.set_recovery_policy(uuid,text,text)",
    "llm.set_period_stripes(uuid,integer)",
    "llm.set_budget(uuid,text,text,text,bigint,integer[],timestamp with time zone)",
    "llm.set_budget_stripes(uuid,text,text,text,integer,timestamp with time zone)",
    # recovery, health, schedule
    "llm.reconcile_org(uuid,timestamp with time zone,integer,uuid)",
    "llm.run_reconciliation(timestamp with time zone,integer)",
    "llm.reconciliation_health(timestamp with time zone)",
    "llm.schedule_reconciliation(text)",
    "llm.unschedule_reconciliation()",
    # notices, reporting, the invariants check
    "llm.claim_notices(integer,timestamp with time zone)",
    "llm.complete_notice(uuid,uuid,uuid,timestamp with time zone)",
    "llm.fail_notice(uuid,uuid,uuid,text,timestamp with time zone)",
    "llm.release_notice(uuid,uuid,uuid,timestamp with time zone)",
    "llm.rearm_notices(timestamp with time zone)",
    "llm.rebuild_daily_usage(date,date)",
    "llm.check_daily_usage(date,date)",
    "llm.check_invariants()",
    # the SECURITY DEFINER steps run_reconciliation (SECURITY INVOKER: it commits) calls
    "llm._begin_run(timestamp with time zone)",
    "llm._pass_organizations()",
    "llm._audits_due(timestamp with time zone)",
    "llm._run_org(uuid,uuid,uuid,timestamp with time zone,integer)",
    "llm._run_followup(uuid,uuid,text,timestamp with time zone,date)",
    "llm._rebuild_days(timestamp with time zone)",
    "llm._run_audit(uuid,uuid,timestamp with time zone)",
    "llm._finish_run(uuid,uuid)",
    "llm._check_clock(timestamp with time zone)",
    "llm._clock_ok(timestamp with time zone)",
}
# Every other routine (private helpers, the twins, llm.distribute): no role at all.
# llm_reader runs the one read-only alarm `llm-db metrics` reports.
READER = {"llm.reconciliation_health(timestamp with time zone)"}
# The reads of the books (sql/81_report.sql, sql/82_books.sql): what
# `llm-db report`, `metrics` and the demo print, for operators and readers.
READS = {
    "llm.report_periods(date,date,uuid[])",
    "llm.report_daily_usage(date,date,uuid[])",
    "llm.report_costs(date,date,uuid[])",
    "llm.report_open_holds(uuid[],timestamp with time zone)",
    "llm.report_tasks(date,uuid[])",
    "llm.report_scope_usage(text,date,date,uuid[])",
    "llm.report_budgets_near_limit(text,uuid[],timestamp with time zone)",
    "llm.books_snapshot(uuid[],timestamp with time zone)",
    "llm.stale_by_organization_status(timestamp with time zone)",
    "llm.books_history(uuid[])",
    "llm.organization_totals(uuid[])",
    "llm.last_run(timestamp with time zone)",
    "llm.pass_progress(timestamp with time zone)",
    "llm.metrics(timestamp with time zone)",
}
EXECUTE = {"llm_app": APP, "llm_operator": OPERATOR | READS, "llm_reader": READER | READS, "plain": set()}

TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
CATALOGS = {"task_kinds", "settings"}
BUDGET_VIEWS = {"budgets", "budget_usage"}  # The app reads its budgets and their usage
# ... and, the views being security_invoker (Citus runs their shard queries as the caller),
# the two tables under them
BUDGET_TABLES = {"budget_limits", "budget_counters"}
# the price book: the app reads the prices (a security_invoker view) and prices usage
PRICE_BOOK = {"prices", "price_versions", "credit_rates"}


def expected_table_privilege(role: str, table: str, privilege: str) -> bool:
    if privilege != "SELECT" or table in INTERNAL_VIEWS:
        return False  # writes go through functions only; internal views are the owner's
    if role in ("llm_operator", "llm_reader"):
        return True
    return role == "llm_app" and table in CATALOGS | BUDGET_VIEWS | BUDGET_TABLES | PRICE_BOOK


SCHEMA = {  # (USAGE, CREATE)
    "llm_app": (True, False),
    "llm_operator": (True, False),
    "llm_reader": (True, False),
    "plain": (False, False),
}


@pytest.fixture
def plain_role(llm_conn):
    """A login role with no grants at all (PUBLIC's rights only)."""
    name = f"llm_plain_{uuid.uuid4().hex[:8]}"
    llm_conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        llm_conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def role_name(role: str, plain: str) -> str:
    return plain if role == "plain" else role


# ---------------------------------------------------------------- 1. the matrix


def test_execute_privileges_match_the_matrix_for_every_routine(llm_conn, plain_role, capsys):
    routines = [r for (r,) in llm_conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_catalog.pg_proc AS p"
        " WHERE p.pronamespace = 'llm'::regnamespace ORDER BY 1")]  # fmt: skip
    granted_somewhere = APP | OPERATOR | READS
    assert granted_somewhere <= set(routines), f"matrix names missing routines: {granted_somewhere - set(routines)}"
    wrong = []
    for role in ROLES:
        for routine in routines:
            (actual,) = llm_conn.execute(
                "SELECT has_function_privilege(%s::text, %s::regprocedure, 'EXECUTE')",
                [role_name(role, plain_role), routine],
            ).fetchone()
            if actual != (routine in EXECUTE[role]):
                wrong.append(f"{role} {'can' if actual else 'cannot'} execute {routine}")
    assert wrong == []
    with capsys.disabled():
        print(f"\n[security] execute matrix: {len(routines)} routines x {len(ROLES)} roles "
              f"= {len(routines) * len(ROLES)} cells")  # fmt: skip


def test_table_and_schema_privileges_match_the_matrix(llm_conn, plain_role, capsys):
    tables = [t for (t,) in llm_conn.execute(
        "SELECT c.relname FROM pg_catalog.pg_class AS c"
        " WHERE c.relnamespace = 'llm'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm') ORDER BY 1")]  # fmt: skip
    assert len(tables) >= 10
    wrong = []
    cells = 0
    for role in ROLES:
        name = role_name(role, plain_role)
        for table in tables:
            for privilege in TABLE_PRIVILEGES:
                cells += 1
                (actual,) = llm_conn.execute(
                    "SELECT has_table_privilege(%s::text, %s::regclass, %s)", [name, f"llm.{table}", privilege]
                ).fetchone()
                if actual != expected_table_privilege(role, table, privilege):
                    wrong.append(f"{role} {privilege} on llm.{table}: {actual}")
        usage, create = llm_conn.execute(
            "SELECT has_schema_privilege(%s::text, 'llm', 'USAGE'), has_schema_privilege(%s::text, 'llm', 'CREATE')",
            [name, name],
        ).fetchone()
        cells += 2
        if (usage, create) != SCHEMA[role]:
            wrong.append(f"{role} schema llm USAGE={usage} CREATE={create}")
    assert wrong == []
    with capsys.disabled():
        print(f"\n[security] table and schema matrix: {cells} cells")


# ---------------------------------------------------------------- 2. real calls


ORG = uuid.UUID("00000000-0000-4000-8000-00000000e001")


def setup_books(conn: psycopg.Connection) -> dict:
    new_org(conn, 1000, org_id=ORG, name="sec", thresholds=[50], now=T0 - timedelta(days=1))
    declare_task(conn, "sec.task")
    inv = admit(conn, ORG, 600, "m")["id"]
    settle(conn, ORG, inv, 600, 1)
    return {"org": ORG, "inv": inv, "now": T0, **MONTH}


# The grant matrix is the raw SQL surface per role (positional and defaulted forms, private
# routines, tables), not the driver's statements: raw SQL on purpose.
ALLOWED = {
    "llm_app": [
        "SELECT llm.admit_invocation(%(org)s, 1::bigint, 'm', p_now => %(now)s)",
        "SELECT llm.settle_invocation(%(org)s, %(inv)s, 600::bigint, 1::bigint, p_now => %(now)s)",
        "SELECT * FROM llm.open_execution(%(org)s, 'sec.task', p_now => %(now)s)",
        "SELECT * FROM llm.task_kinds",
        "SELECT * FROM llm.settings",
        "SELECT * FROM llm.budgets",
        "SELECT * FROM llm.budget_usage",
    ],
    "llm_operator": [
        "SELECT * FROM llm.reconcile_org(%(org)s, %(now)s)",
        "CALL llm.run_reconciliation(p_now => %(now)s)",
        "SELECT * FROM llm.reconciliation_health(%(now)s)",
        "SELECT * FROM llm.claim_notices(5, %(now)s)",
        "SELECT llm.rebuild_daily_usage(%(first)s, %(last)s)",
        "SELECT * FROM llm.check_invariants()",
        "SELECT count(*) FROM llm.invocations",
        "SELECT count(*) FROM llm.ledger",
    ],
    "llm_reader": [
        "SELECT count(*) FROM llm.invocations",
        "SELECT count(*) FROM llm.periods",
        "SELECT count(*) FROM llm.reconciliation_runs",
        "SELECT * FROM llm.reconciliation_health()",
    ],
    "plain": [],
}
REFUSED = {
    "llm_app": [
        "SELECT * FROM llm.reconcile_org(%(org)s, %(now)s)",
        "CALL llm.run_reconciliation(p_now => %(now)s)",
        "SELECT llm.upsert_organization(%(org)s, 'x', 1::bigint)",
        "SELECT * FROM llm.check_invariants()",
        "SELECT count(*) FROM llm.invocations",
        "UPDATE llm.period_stripes SET used_credits = 0",
        "INSERT INTO llm.task_kinds (key) VALUES ('app.own')",
        "SELECT llm._admit_invocation(%(org)s, 1::bigint, 'm', NULL::uuid, NULL::uuid, %(now)s,"
        " NULL, NULL, NULL, NULL, NULL)",
        "SELECT llm.set_budget(%(org)s, 'api_key', 'k', 'day', 10::bigint)",
        "SELECT llm.set_budget_stripes(%(org)s, 'api_key', 'k', 'day', 2)",
        "SELECT llm._move_budgets(%(org)s, ARRAY[]::llm.invocations[], false, %(now)s)",
    ],
    "llm_operator": [
        "SELECT llm.admit_invocation(%(org)s, 1::bigint, 'm')",
        "SELECT llm.settle_invocation(%(org)s, %(inv)s, 1::bigint, 0::bigint)",
        "UPDATE llm.period_stripes SET used_credits = 0",
        "DELETE FROM llm.period_heads",
        "TRUNCATE llm.threshold_notices",
        "SELECT llm.distribute()",
        "SELECT llm._reconcile_org(%(org)s, %(now)s, 10, NULL::uuid)",
        "CREATE TABLE llm.operator_own (x int)",
    ],
    "llm_reader": [
        "SELECT llm.admit_invocation(%(org)s, 1::bigint, 'm')",
        "SELECT * FROM llm.reconcile_org(%(org)s, %(now)s)",
        "CALL llm.run_reconciliation()",
        "SELECT * FROM llm.check_invariants()",
        "DELETE FROM llm.invocations",
        "INSERT INTO llm.period_findings DEFAULT VALUES",
    ],
    "plain": [
        "SELECT count(*) FROM llm.organizations",
        "SELECT llm.admit_invocation(%(org)s, 1::bigint, 'm')",
        "SELECT * FROM llm.reconciliation_health()",
        "CALL llm.run_reconciliation()",
        "SELECT * FROM llm.check_invariants()",
    ],
}


@pytest.mark.parametrize("role", ROLES)
def test_each_role_can_call_what_it_is_granted_and_nothing_else(llm_conn, llm_role_conn, plain_role, role):
    ids = setup_books(llm_conn)
    conn = llm_role_conn(role_name(role, plain_role))
    # logged in as a member of the role (its login), not SET ROLE
    assert conn.execute(
        "SELECT session_user = current_user AND pg_has_role(%s, 'MEMBER')",
        [role_name(role, plain_role)],
    ).fetchone() == (True,)
    for statement in ALLOWED[role]:
        conn.execute(statement, ids)
    for statement in REFUSED[role]:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(statement, ids)
    assert invariants(llm_conn) == []


# ---------------------------------------------------------------- 3. search_path hijacking

SHADOWS = """
CREATE TABLE evil.calls (name text, at timestamptz DEFAULT clock_timestamp());
GRANT INSERT, SELECT ON evil.calls TO PUBLIC;
GRANT USAGE ON SCHEMA evil TO PUBLIC;

CREATE FUNCTION evil.note(p text) RETURNS void LANGUAGE sql
    AS $$ INSERT INTO evil.calls (name) VALUES (p) $$;

CREATE FUNCTION evil.format(f text, VARIADIC a text[]) RETURNS text LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.note('format'); RETURN f; END $$;
CREATE FUNCTION evil.pg_notify(c text, p text) RETURNS void LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.note('pg_notify'); PERFORM pg_catalog.pg_notify(c, p); END $$;
"""
# More functions of the same name in the caller's schema, each noting its use and then
# returning what pg_catalog's returns, by result type.
SHADOW_FUNCTIONS = {
    "timestamptz": ["now()", "clock_timestamp()", "date_trunc(f text, t timestamptz)"],
    "uuid": ["gen_random_uuid()"],
    "integer": ["hashtext(t text)", "length(t text)", "cardinality(a anyarray)"],
    "text": ["btrim(t text)"],
    "boolean": ["pg_try_advisory_lock(k bigint)", "isfinite(t timestamptz)"],
}
for result, functions in SHADOW_FUNCTIONS.items():
    for function in functions:
        name, args = function.rstrip(")").split("(")
        passed = ", ".join(arg.split()[0] for arg in args.split(", ") if arg)
        SHADOWS += (f"CREATE FUNCTION evil.{function} RETURNS {result} LANGUAGE plpgsql\n"
                    f"    AS $$ BEGIN PERFORM evil.note('{name}'); RETURN pg_catalog.{name}({passed}); END $$;\n")
# An operator of the same name in the caller's schema, noting its use: (operator, left, right,
# result, the function behind pg_catalog's operator, a name for the shadow's function).
SHADOW_OPERATORS = [
    ("=", "uuid", "uuid", "boolean", "uuid_eq", "uuid_eq"),
    ("<", "integer", "integer", "boolean", "int4lt", "int4lt"),
    (">", "integer", "integer", "boolean", "int4gt", "int4gt"),
    ("+", "bigint", "bigint", "bigint", "int8pl", "int8pl"),
    ("<=", "timestamptz", "timestamptz", "boolean", "timestamptz_le", "tsle"),
    ("-", "timestamptz", "interval", "timestamptz", "timestamptz_mi_interval", "tsmi"),
]
SHADOWS += "".join(
    f"CREATE FUNCTION evil.{name}(a {left}, b {right}) RETURNS {result} LANGUAGE plpgsql\n"
    f"    AS $$ BEGIN PERFORM evil.note('{left} {op}'); RETURN pg_catalog.{target}(a, b); END $$;\n"
    f"CREATE OPERATOR evil.{op} (LEFTARG = {left}, RIGHTARG = {right}, FUNCTION = evil.{name});\n"
    for op, left, right, result, target, name in SHADOW_OPERATORS
)

# The shadows must win for the role's own SQL, or the test proves nothing.
CONTROL = [
    "SELECT now()",
    "SELECT gen_random_uuid()",
    "SELECT format('%s', 'x')",
    "SELECT hashtext('x')",
    "SELECT '00000000-0000-0000-0000-000000000001'::uuid = '00000000-0000-0000-0000-000000000001'::uuid",
    "SELECT 1 < 2",
    "SELECT 2 > 1",
    "SELECT 1::bigint + 2::bigint",
    "SELECT now() <= now()",
    "SELECT now() - interval '1 hour'",
    "SELECT length('x'), btrim(' x '), cardinality('{1}'::int[])",
]


@pytest.fixture
def evil_conn(llm_conn, llm_connect):
    """A role that runs the app's and the operator's calls, with a schema of shadows
    first in its search_path (pg_catalog explicitly after it)."""
    role = f"llm_evil_{uuid.uuid4().hex[:8]}"
    ident = sql.Identifier(role)
    llm_conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
    llm_conn.execute(sql.SQL("GRANT llm_app, llm_operator TO {}").format(ident))
    # the owner (CREATEROLE, but no member of the role) creates the schema and lends it
    llm_conn.execute("CREATE SCHEMA evil")
    llm_conn.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA evil TO {}").format(ident))
    conn = llm_connect(role=role)
    conn.execute(SHADOWS)
    conn.execute("SET search_path = evil, pg_catalog, public")
    try:
        yield conn
    finally:
        conn.close()
        llm_conn.execute("DROP SCHEMA evil CASCADE")
        llm_conn.execute(sql.SQL("DROP ROLE {}").format(ident))


def shadow_calls(conn: psycopg.Connection) -> list[str]:
    return sorted({name for (name,) in conn.execute("SELECT name FROM evil.calls")})


def test_the_shadows_win_for_the_roles_own_sql(llm_conn, evil_conn):
    """Control: without pinned search paths, each shadow would be used."""
    for query in CONTROL:
        evil_conn.execute(query)
    assert shadow_calls(evil_conn) == sorted(
        ["now", "gen_random_uuid", "format", "hashtext", "uuid =", "integer <", "integer >",
         "bigint +", "timestamptz <=", "timestamptz -", "length", "btrim", "cardinality"]
    )  # fmt: skip


def test_no_call_can_be_hijacked_through_the_search_path(llm_conn, evil_conn):
    """Every SECURITY DEFINER function pins search_path = pg_catalog, llm, pg_temp;
    run_reconciliation (a committing procedure, so it cannot) calls only qualified
    steps and qualified operators. None of the shadows runs."""
    org = uuid.UUID("00000000-0000-4000-8000-00000000e0e1")
    new_org(llm_conn, 100, org_id=org, name="victim", thresholds=[50, 80], now=T0 - timedelta(days=1))
    declare_task(llm_conn, "sec.task")
    e = evil_conn  # every call through the driver's statements, as that role
    later = T0 + timedelta(hours=30)
    opened = {"subject_type": "doc", "subject_id": "1", "replay_key": "replay-9", "now": T0}
    task = call(e, "open_execution", org, "sec.task", **opened)[0]["execution_id"]
    assert call(e, "open_execution", org, "sec.task", **opened)[0]["replayed"]
    invs = [call(e, "admit_id", org, estimate, "m", execution_id=task, now=T0)[0]["value"] for estimate in (30, 20, 10)]
    call(e, "mark_dispatched", org, invs[0], now=T0)
    assert settle(e, org, invs[0], 70, 9, input_tokens=100, output_tokens=20, now=T0) == "settled"
    assert call(e, "fail", org, invs[1], "boom", credits=1, now=T0)[0]["value"] == "failed"
    assert call(e, "close_execution", org, task, "completed", now=T0)[0]["value"] is True
    with pytest.raises(psycopg.Error) as refused:
        admit(e, org, 500, "m", now=T0)
    assert refused.value.sqlstate == "LL001"
    call(e, "reconcile_org", org, now=later, batch=5)
    call(e, "run_reconciliation", now=later, batch=10)
    call(e, "run_reconciliation", now=later)
    for notice in call(e, "claim_notices", limit=10, now=later):
        assert call(e, "release_notice", notice["organization_id"], notice["id"], notice["claim_token"],
                    now=later)[0]["value"] is True  # fmt: skip
    for notice in call(e, "claim_notices", limit=10, now=later):
        call(e, "complete_notice", notice["organization_id"], notice["id"], notice["claim_token"],
             now=T0 + timedelta(hours=31))  # fmt: skip
    call(e, "rearm_notices", now=later)
    call(e, "health", now=later)
    call(e, "rebuild_daily_usage", MONTH["first"], MONTH["last"])
    call(e, "upsert_organization", org, "victim", 200, notice_thresholds=[50, 80], now=later)
    call(e, "declare_task_kind", "sec.other", "declared by the evil role")
    assert invariants(e) == []

    assert shadow_calls(e) == [], "a shadow in the caller's search_path ran inside an llm routine"
    # and the calls did their work
    (recovered,) = llm_conn.execute(
        "SELECT count(*) FROM llm.invocations WHERE settlement_kind = 'recovered'"
    ).fetchone()
    assert recovered == 1
    assert llm_conn.execute(
        "SELECT status FROM llm.reconciliation_runs ORDER BY started_at"
    ).fetchall() == [("succeeded",), ("succeeded",)]
