"""Security: each role can do exactly what docs/design.md ("Roles and grants") gives it and
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
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg import sql

T0 = datetime(2030, 9, 10, 12, 0, tzinfo=UTC)
ROLES = ("llm_app", "llm_operator", "llm_reader", "plain")

APP = {
    "llm.admit_invocation(uuid,bigint,text,uuid,uuid,timestamp with time zone)",
    "llm.mark_dispatched(uuid,uuid,timestamp with time zone)",
    "llm.settle_invocation(uuid,uuid,bigint,bigint,bigint,bigint,timestamp with time zone)",
    "llm.fail_invocation(uuid,uuid,text,bigint,bigint,timestamp with time zone)",
    "llm.open_execution(uuid,text,text,text,text,timestamp with time zone)",
    "llm.close_execution(uuid,uuid,text,text,timestamp with time zone)",
}
OPERATOR = {
    # tenants and the task catalog (administration)
    "llm.upsert_organization(uuid,text,bigint,text,integer[],timestamp with time zone)",
    "llm.declare_task_kind(text,text)",
    "llm.set_recovery_policy(uuid,text,text)",
    "llm.set_period_stripes(uuid,integer)",
    # recovery, health, schedule
    "llm.reconcile_org(uuid,timestamp with time zone,integer,uuid)",
    "llm.run_reconciliation(timestamp with time zone,integer)",
    "llm.reconciliation_health(timestamp with time zone)",
    "llm.schedule_reconciliation(text)",
    "llm.unschedule_reconciliation()",
    # notices, reporting, the invariants check
    "llm.claim_notices(integer,timestamp with time zone)",
    "llm.complete_notice(uuid,uuid,timestamp with time zone)",
    "llm.fail_notice(uuid,uuid,text,timestamp with time zone)",
    "llm.release_notice(uuid,uuid,timestamp with time zone)",
    "llm.rearm_notices(timestamp with time zone)",
    "llm.rebuild_daily_usage(date,date)",
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
}
# Every other routine (private helpers, the twins, llm.distribute): no role at all.
EXECUTE = {"llm_app": APP, "llm_operator": OPERATOR, "llm_reader": set(), "plain": set()}

TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
CATALOGS = {"task_kinds", "settings"}


def expected_table_privilege(role: str, table: str, privilege: str) -> bool:
    if privilege != "SELECT":
        return False  # writes go through functions only
    if role in ("llm_operator", "llm_reader"):
        return True
    return role == "llm_app" and table in CATALOGS


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
    granted_somewhere = APP | OPERATOR
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
    conn.execute(
        "SELECT llm.upsert_organization(%s, 'sec', 1000::bigint, 'operational', '{50}'::int[], %s)",
        [ORG, T0 - timedelta(days=1)],
    )
    conn.execute("SELECT llm.declare_task_kind('sec.task')")
    (inv,) = conn.execute(
        "SELECT (llm.admit_invocation(%s, 600::bigint, 'm', NULL::uuid, NULL::uuid, %s)).id", [ORG, T0]
    ).fetchone()
    conn.execute("SELECT llm.settle_invocation(%s, %s, 600::bigint, 1::bigint, p_now => %s)", [ORG, inv, T0])
    return {"org": ORG, "inv": inv, "now": T0}


ALLOWED = {
    "llm_app": [
        "SELECT llm.admit_invocation(%(org)s, 1::bigint, 'm', p_now => %(now)s)",
        "SELECT llm.settle_invocation(%(org)s, %(inv)s, 1::bigint, 0::bigint, p_now => %(now)s)",
        "SELECT * FROM llm.open_execution(%(org)s, 'sec.task', p_now => %(now)s)",
        "SELECT * FROM llm.task_kinds",
        "SELECT * FROM llm.settings",
    ],
    "llm_operator": [
        "SELECT * FROM llm.reconcile_org(%(org)s, %(now)s)",
        "CALL llm.run_reconciliation(p_now => %(now)s)",
        "SELECT * FROM llm.reconciliation_health(%(now)s)",
        "SELECT * FROM llm.claim_notices(5, %(now)s)",
        "SELECT llm.rebuild_daily_usage('2030-09-01', '2030-09-30')",
        "SELECT * FROM llm.check_invariants()",
        "SELECT count(*) FROM llm.invocations",
        "SELECT count(*) FROM llm.ledger",
    ],
    "llm_reader": [
        "SELECT count(*) FROM llm.invocations",
        "SELECT count(*) FROM llm.periods",
        "SELECT count(*) FROM llm.reconciliation_runs",
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
        "SELECT llm._admit_invocation(%(org)s, 1::bigint, 'm', NULL::uuid, NULL::uuid, %(now)s)",
        "SELECT llm._book_terminal(NULL::llm.invocations, %(now)s)",
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
    assert conn.execute("SELECT current_user").fetchone()[0] == role_name(role, plain_role)
    for statement in ALLOWED[role]:
        conn.execute(statement, ids)
    for statement in REFUSED[role]:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(statement, ids)
    assert llm_conn.execute("SELECT * FROM llm.check_invariants()").fetchall() == []


# ---------------------------------------------------------------- 3. search_path hijacking

SHADOWS = """
CREATE TABLE evil.calls (name text, at timestamptz DEFAULT clock_timestamp());
GRANT INSERT, SELECT ON evil.calls TO PUBLIC;
GRANT USAGE ON SCHEMA evil TO PUBLIC;

CREATE FUNCTION evil.note(p text) RETURNS void LANGUAGE sql
    AS $$ INSERT INTO evil.calls (name) VALUES (p) $$;

CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.note('now'); RETURN pg_catalog.now(); END $$;
CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.note('clock_timestamp'); RETURN pg_catalog.clock_timestamp(); END $$;
CREATE FUNCTION evil.gen_random_uuid() RETURNS uuid LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.note('gen_random_uuid'); RETURN pg_catalog.gen_random_uuid(); END $$;
CREATE FUNCTION evil.format(f text, VARIADIC a text[]) RETURNS text LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.note('format'); RETURN f; END $$;
CREATE FUNCTION evil.hashtext(t text) RETURNS integer LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.note('hashtext'); RETURN pg_catalog.hashtext(t); END $$;
CREATE FUNCTION evil.date_trunc(f text, t timestamptz) RETURNS timestamptz LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.note('date_trunc'); RETURN pg_catalog.date_trunc(f, t); END $$;
CREATE FUNCTION evil.length(t text) RETURNS integer LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.note('length'); RETURN pg_catalog.length(t); END $$;
CREATE FUNCTION evil.btrim(t text) RETURNS text LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.note('btrim'); RETURN pg_catalog.btrim(t); END $$;
CREATE FUNCTION evil.cardinality(a anyarray) RETURNS integer LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.note('cardinality'); RETURN pg_catalog.cardinality(a); END $$;
CREATE FUNCTION evil.pg_try_advisory_lock(k bigint) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.note('pg_try_advisory_lock'); RETURN pg_catalog.pg_try_advisory_lock(k); END $$;
CREATE FUNCTION evil.pg_notify(c text, p text) RETURNS void LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.note('pg_notify'); PERFORM pg_catalog.pg_notify(c, p); END $$;
CREATE FUNCTION evil.isfinite(t timestamptz) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.note('isfinite'); RETURN pg_catalog.isfinite(t); END $$;

CREATE FUNCTION evil.uuid_eq(a uuid, b uuid) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.note('uuid ='); RETURN pg_catalog.uuid_eq(a, b); END $$;
CREATE OPERATOR evil.= (LEFTARG = uuid, RIGHTARG = uuid, FUNCTION = evil.uuid_eq);
CREATE FUNCTION evil.int4lt(a integer, b integer) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.note('integer <'); RETURN pg_catalog.int4lt(a, b); END $$;
CREATE OPERATOR evil.< (LEFTARG = integer, RIGHTARG = integer, FUNCTION = evil.int4lt);
CREATE FUNCTION evil.int4gt(a integer, b integer) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.note('integer >'); RETURN pg_catalog.int4gt(a, b); END $$;
CREATE OPERATOR evil.> (LEFTARG = integer, RIGHTARG = integer, FUNCTION = evil.int4gt);
CREATE FUNCTION evil.int8pl(a bigint, b bigint) RETURNS bigint LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.note('bigint +'); RETURN pg_catalog.int8pl(a, b); END $$;
CREATE OPERATOR evil.+ (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.int8pl);
CREATE FUNCTION evil.tsle(a timestamptz, b timestamptz) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.note('timestamptz <='); RETURN pg_catalog.timestamptz_le(a, b); END $$;
CREATE OPERATOR evil.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.tsle);
CREATE FUNCTION evil.tsmi(a timestamptz, b interval) RETURNS timestamptz LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.note('timestamptz -'); RETURN pg_catalog.timestamptz_mi_interval(a, b); END $$;
CREATE OPERATOR evil.- (LEFTARG = timestamptz, RIGHTARG = interval, FUNCTION = evil.tsmi);
"""

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
    llm_conn.execute(sql.SQL("CREATE SCHEMA evil AUTHORIZATION {}").format(ident))
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
    llm_conn.execute(
        "SELECT llm.upsert_organization(%s, 'victim', 100::bigint, 'operational', '{50,80}'::int[], %s)",
        [org, T0 - timedelta(days=1)],
    )
    llm_conn.execute("SELECT llm.declare_task_kind('sec.task')")
    e = evil_conn
    q = {"org": org, "now": T0, "later": T0 + timedelta(hours=30)}
    (task,) = e.execute(
        "SELECT execution_id FROM llm.open_execution(%(org)s, 'sec.task', 'doc', '1', 'replay-9', %(now)s)", q
    ).fetchone()
    q["task"] = task
    e.execute("SELECT * FROM llm.open_execution(%(org)s, 'sec.task', 'doc', '1', 'replay-9', %(now)s)", q)
    invs = []
    for estimate in (30, 20, 10):
        (inv,) = e.execute(
            "SELECT (llm.admit_invocation(%(org)s, %(est)s::bigint, 'm', %(task)s, NULL::uuid, %(now)s)).id",
            {**q, "est": estimate},
        ).fetchone()
        invs.append(inv)
    e.execute("SELECT llm.mark_dispatched(%s, %s, %s)", [org, invs[0], T0])
    assert e.execute(
        "SELECT llm.settle_invocation(%s, %s, 70::bigint, 9::bigint, 100::bigint, 20::bigint, %s)",
        [org, invs[0], T0],
    ).fetchone() == ("settled",)
    assert e.execute("SELECT llm.fail_invocation(%s, %s, 'boom', 1::bigint, 0::bigint, %s)",
                     [org, invs[1], T0]).fetchone() == ("failed",)  # fmt: skip
    assert e.execute("SELECT llm.close_execution(%s, %s, 'completed', NULL, %s)", [org, task, T0]).fetchone() == (True,)
    with pytest.raises(psycopg.Error) as refused:
        e.execute("SELECT llm.admit_invocation(%s, 500::bigint, 'm', p_now => %s)", [org, T0])
    assert refused.value.sqlstate == "LL001"
    e.execute("SELECT * FROM llm.reconcile_org(%(org)s, %(later)s, 5)", q)
    e.execute("CALL llm.run_reconciliation(p_now => %(later)s, p_batch => 10)", q)
    e.execute("CALL llm.run_reconciliation(%(later)s)", q)
    for notice_org, notice in e.execute("SELECT organization_id, id FROM llm.claim_notices(10, %(later)s)", q).fetchall():
        assert e.execute("SELECT llm.release_notice(%s, %s, %s)", [notice_org, notice, T0 + timedelta(hours=30)]).fetchone() == (True,)
    for notice_org, notice in e.execute("SELECT organization_id, id FROM llm.claim_notices(10, %(later)s)", q).fetchall():
        e.execute("SELECT llm.complete_notice(%s, %s, %s)", [notice_org, notice, T0 + timedelta(hours=31)])
    e.execute("SELECT llm.rearm_notices(%(later)s)", q)
    e.execute("SELECT * FROM llm.reconciliation_health(%(later)s)", q)
    e.execute("SELECT llm.rebuild_daily_usage('2030-09-01', '2030-09-30')")
    e.execute("SELECT llm.upsert_organization(%(org)s, 'victim', 200::bigint, 'operational', '{50,80}'::int[], %(later)s)", q)
    e.execute("SELECT llm.declare_task_kind('sec.other', 'declared by the evil role')")
    assert e.execute("SELECT count(*) FROM llm.check_invariants()").fetchone() == (0,)

    assert shadow_calls(e) == [], "a shadow in the caller's search_path ran inside an llm routine"
    # and the calls did their work
    (recovered,) = llm_conn.execute(
        "SELECT count(*) FROM llm.invocations WHERE settlement_kind = 'recovered'"
    ).fetchone()
    assert recovered == 1
    assert llm_conn.execute(
        "SELECT status FROM llm.reconciliation_runs ORDER BY started_at"
    ).fetchall() == [("succeeded",), ("succeeded",)]
