"""Citus-ready by construction (docs/architecture.md "Citus rules"): the catalog is read on
every run, so a schema or function change that would break sharding by
organization_id fails here, on plain PostgreSQL, long before a cluster."""

from __future__ import annotations

import re

import psycopg
from psycopg import sql

from tests.helpers import assert_sqlstate, llm_tables, params, rows, scalar, sql_of

# Tables whose keys need not include organization_id, and why.
NOT_SHARDED = {
    "organizations": "its id IS the organization id (the distribution column)",
    "task_kinds": "catalog: a reference table copied to every node",
    "settings": "catalog: a reference table copied to every node",
    "upgrade_steps": "the contract steps migrate ran: a reference table copied to every node",
    "price_versions": "the price book: a reference table copied to every node, where every"
    " admission reads the book's versions and an organization's own in one statement",
    "credit_rates": "the price book's credit rates: a reference table, read as price_versions",
    "reconciliation_runs": "coordinator-local record of the pass, never distributed",
    "pass_lease": "coordinator-local one-pass-at-a-time lease, never distributed",
}
REFERENCE_TABLES = {"task_kinds", "settings", "upgrade_steps", "price_versions", "credit_rates"}
COORDINATOR_TABLES = {"reconciliation_runs", "pass_lease"}
ORG = "organization_id"
# Functions with a p_organization_id argument that are not per-organization operations.
COORDINATOR_STEPS = {
    "_run_org": "a step of the pass on the coordinator: it records into reconciliation_runs"
    " and calls the public reconcile_org, so it is never distributed",
    "_run_audit": "a step of the pass on the coordinator: it records into reconciliation_runs"
    " and calls the distributed twin _audit_org, so it is never distributed",
}


def org_column(table: str) -> str:
    return "id" if table == "organizations" else ORG


def per_org_tables(conn: psycopg.Connection) -> list[str]:
    return [t for t in llm_tables(conn) if t not in REFERENCE_TABLES | COORDINATOR_TABLES]


UNIQUE_INDEXES_SQL = """
SELECT c.relname AS table_name, x.relname AS index_name, i.indisprimary AS is_primary,
       array(SELECT a.attname::text
               FROM unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
               JOIN pg_catalog.pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
              ORDER BY k.n) AS columns
  FROM pg_catalog.pg_index AS i
  JOIN pg_catalog.pg_class AS c ON c.oid = i.indrelid
  JOIN pg_catalog.pg_class AS x ON x.oid = i.indexrelid
 WHERE c.relnamespace = 'llm'::regnamespace AND i.indisunique
 ORDER BY 1, 2
"""

FOREIGN_KEYS_SQL = """
SELECT f.conname, c.relname AS child, p.relname AS parent,
       array(SELECT a.attname::text FROM unnest(f.conkey) WITH ORDINALITY AS k(attnum, n)
               JOIN pg_catalog.pg_attribute AS a ON a.attrelid = f.conrelid AND a.attnum = k.attnum
              ORDER BY k.n) AS child_columns,
       array(SELECT a.attname::text FROM unnest(f.confkey) WITH ORDINALITY AS k(attnum, n)
               JOIN pg_catalog.pg_attribute AS a ON a.attrelid = f.confrelid AND a.attnum = k.attnum
              ORDER BY k.n) AS parent_columns
  FROM pg_catalog.pg_constraint AS f
  JOIN pg_catalog.pg_class AS c ON c.oid = f.conrelid
  JOIN pg_catalog.pg_class AS p ON p.oid = f.confrelid
 WHERE f.contype = 'f' AND f.connamespace = 'llm'::regnamespace
 ORDER BY 1
"""

ROUTINES_SQL = """
SELECT p.proname, p.oid::regprocedure::text AS signature, l.lanname AS language, p.prosrc,
       p.prokind, coalesce(p.proargnames, '{}') AS arg_names, p.pronargs, p.pronargdefaults,
       array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) AS t) AS arg_types
  FROM pg_catalog.pg_proc AS p
  JOIN pg_catalog.pg_language AS l ON l.oid = p.prolang
 WHERE p.pronamespace = 'llm'::regnamespace
 ORDER BY 2
"""


def routines(conn: psycopg.Connection) -> list[dict]:
    return rows(conn, ROUTINES_SQL)


# Functions with a p_organization_id argument that select an organization's rows of the
# price book, a reference table (NULL: the book's): they run where they are called.
PRICE_BOOK_ROUTINES = {
    "set_price": "writes a version to the reference table price_versions",
    "set_credit_rate": "writes a rate to the reference table credit_rates",
    "price_usage": "reads the reference tables; the organization's existence is a router query",
}


def per_org_routines(conn: psycopg.Connection) -> list[dict]:
    return [r for r in routines(conn)
            if "p_organization_id" in r["arg_names"] and r["proname"] not in PRICE_BOOK_ROUTINES]


# Public per-organization functions the catalog query must find: a query that finds none
# (or misses the calls on the hot path) fails here instead of passing the loops over it.
KNOWN_PUBLIC_PER_ORG = {"upsert_organization", "admit_invocation", "settle_invocation", "reconcile_org"}


def public_per_org_routines(conn: psycopg.Connection) -> list[dict]:
    """The public (not ``_``-prefixed) per-organization functions; known ones among them."""
    public = [r for r in per_org_routines(conn) if not r["proname"].startswith("_")]
    assert KNOWN_PUBLIC_PER_ORG <= {r["proname"] for r in public}, "the catalog query misses known functions"
    return public


def distributed_twins(conn: psycopg.Connection) -> list[str]:
    """The twin names listed in llm.distribute()."""
    source = scalar(conn, "SELECT prosrc FROM pg_proc WHERE oid = 'llm.distribute(integer)'::regprocedure")
    listing = re.search(r"proname\s+IN\s*\(([^)]*)\)", source)
    assert listing, "llm.distribute() no longer lists its twins as proname IN (...)"
    return re.findall(r"'(\w+)'", listing.group(1))


# ---------------------------------------------------------------- keys


def test_exempt_tables_exist_so_the_exception_list_is_not_stale(llm_conn):
    assert set(NOT_SHARDED) <= set(llm_tables(llm_conn))


def test_every_unique_key_on_a_per_organization_table_includes_organization_id(llm_conn):
    """Citus: a unique constraint must include the distribution column."""
    indexes = rows(llm_conn, UNIQUE_INDEXES_SQL)
    assert {i["table_name"] for i in indexes} >= set(per_org_tables(llm_conn))  # every table keyed
    offenders = [
        (i["table_name"], i["index_name"], i["columns"])
        for i in indexes
        if i["table_name"] not in NOT_SHARDED and ORG not in i["columns"]
    ]
    assert offenders == []


def test_organizations_unique_keys_are_on_its_id(llm_conn):
    keys = [i for i in rows(llm_conn, UNIQUE_INDEXES_SQL) if i["table_name"] == "organizations"]
    assert keys and all("id" in i["columns"] for i in keys)


def test_invocations_are_keyed_by_organization_and_id(llm_conn):
    primary = [i for i in rows(llm_conn, UNIQUE_INDEXES_SQL)
               if i["table_name"] == "invocations" and i["is_primary"]]
    assert [i["columns"] for i in primary] == [[ORG, "id"]]


def test_every_per_organization_table_has_a_not_null_uuid_organization_id(llm_conn):
    found = {
        r["table_name"]: (r["data_type"], r["is_nullable"])
        for r in rows(
            llm_conn,
            "SELECT table_name, data_type, is_nullable FROM information_schema.columns"
            " WHERE table_schema = 'llm' AND column_name = %(col)s",
            {"col": ORG},
        )
    }
    expected = [t for t in per_org_tables(llm_conn) if t != "organizations"]
    assert {t: found.get(t) for t in expected} == {t: ("uuid", "NO") for t in expected}


def test_every_foreign_key_between_per_organization_tables_includes_organization_id(llm_conn):
    """Co-located foreign keys: the organization column of the child maps onto the parent's."""
    keys = rows(llm_conn, FOREIGN_KEYS_SQL)
    assert keys, "the schema has foreign keys; an empty result means the query broke"
    offenders = []
    for fk in keys:
        if fk["parent"] in REFERENCE_TABLES:
            continue  # distributed -> reference table is allowed
        pairs = set(zip(fk["child_columns"], fk["parent_columns"], strict=True))
        if (ORG, org_column(fk["parent"])) not in pairs:
            offenders.append((fk["conname"], fk["child"], fk["parent"], sorted(pairs)))
    assert offenders == []


def test_no_catalog_or_coordinator_table_references_a_per_organization_table(llm_conn):
    offenders = [
        (fk["conname"], fk["child"], fk["parent"])
        for fk in rows(llm_conn, FOREIGN_KEYS_SQL)
        if fk["child"] in REFERENCE_TABLES | COORDINATOR_TABLES
        and fk["parent"] not in REFERENCE_TABLES
    ]
    assert offenders == []


# ---------------------------------------------------------------- objects Citus cannot shard


def test_no_triggers_on_llm_tables(llm_conn):
    triggers = rows(
        llm_conn,
        """
        SELECT c.relname, t.tgname FROM pg_catalog.pg_trigger AS t
          JOIN pg_catalog.pg_class AS c ON c.oid = t.tgrelid
         WHERE c.relnamespace = 'llm'::regnamespace AND NOT t.tgisinternal
        """,
    )
    assert triggers == []


def test_no_view_depends_on_a_constraint(llm_conn):
    """Learned on a real Citus 13.2.2 cluster: a view that shows a column through a
    primary key (GROUP BY the key, a functional dependency) depends on that constraint,
    and Citus does not propagate it to the workers. llm.periods did (schema 0007), so the
    daily audit, delegated to a worker, failed there with 42P01; schema 0009 fixed it."""
    dependent = rows(
        llm_conn,
        """
        SELECT DISTINCT r.ev_class::regclass::text AS view, c.conname
          FROM pg_catalog.pg_depend AS d
          JOIN pg_catalog.pg_rewrite AS r ON r.oid = d.objid
          JOIN pg_catalog.pg_constraint AS c ON c.oid = d.refobjid
          JOIN pg_catalog.pg_class AS v ON v.oid = r.ev_class
         WHERE d.classid = 'pg_catalog.pg_rewrite'::regclass
           AND d.refclassid = 'pg_catalog.pg_constraint'::regclass
           AND v.relnamespace = 'llm'::regnamespace
        """,
    )
    assert dependent == []


VIEW_READS_SQL = """
SELECT DISTINCT v.relname AS view, t.relname AS reads, g.role
  FROM pg_catalog.pg_class AS v
  JOIN pg_catalog.pg_rewrite AS r ON r.ev_class = v.oid
  JOIN pg_catalog.pg_depend AS d ON d.classid = 'pg_catalog.pg_rewrite'::regclass AND d.objid = r.oid
   AND d.refclassid = 'pg_catalog.pg_class'::regclass AND d.refobjid <> v.oid
  JOIN pg_catalog.pg_class AS t ON t.oid = d.refobjid
 CROSS JOIN unnest(ARRAY['llm_app', 'llm_operator', 'llm_reader']) AS g(role)
 WHERE v.relnamespace = 'llm'::regnamespace AND v.relkind = 'v'
   AND pg_catalog.has_table_privilege(g.role, v.oid, 'SELECT')
   AND NOT pg_catalog.has_table_privilege(g.role, t.oid, 'SELECT')
 ORDER BY 1, 2, 3
"""


def test_every_role_that_reads_a_view_may_read_what_the_view_reads(llm_conn):
    """Learned on a real Citus 13.2.2 cluster (Citus cause 5): Citus runs a view's
    shard queries as the caller, so llm_app, with SELECT on llm.budget_usage but not on
    budget_counters, got 42501 there while one node answered. A role that may read a view
    must be able to read every relation under it."""
    assert rows(llm_conn, VIEW_READS_SQL) == []


def test_the_views_llm_app_reads_run_with_its_rights_on_one_node_too(llm_conn, llm_role_conn):
    """security_invoker makes one node check the reader's rights on the tables as Citus does,
    so a grant missing from the rule above fails every llm_app read in the suite, not only
    on a cluster."""
    invoker = rows(llm_conn, """
        SELECT c.relname, coalesce('security_invoker=true' = ANY (c.reloptions), false) AS invoker
          FROM pg_catalog.pg_class AS c
         WHERE c.relnamespace = 'llm'::regnamespace AND c.relkind = 'v'
           AND pg_catalog.has_table_privilege('llm_app', c.oid, 'SELECT')
         ORDER BY 1""")  # fmt: skip
    assert invoker == [{"relname": "budget_usage", "invoker": True}, {"relname": "budgets", "invoker": True},
                       {"relname": "prices", "invoker": True}]
    llm_conn.execute("REVOKE SELECT ON llm.budget_counters FROM llm_app")
    app = llm_role_conn("llm_app")
    assert_sqlstate(app, "42501", "SELECT * FROM llm.budget_usage", unchanged=False)
    assert rows(llm_conn, VIEW_READS_SQL) == [{"view": "budget_usage", "reads": "budget_counters", "role": "llm_app"}]


def test_no_routine_forces_a_generic_plan(llm_conn):
    """Learned on a real Citus 13.2.2 cluster: `SET plan_cache_mode = force_generic_plan` on a
    delegated routine makes Citus fail to plan its parameterized shard queries ("could not
    create distributed plan", 0A000), so every reconcile_org failed."""
    forced = rows(
        llm_conn,
        """
        SELECT p.proname, p.proconfig FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace = 'llm'::regnamespace
           AND EXISTS (SELECT FROM unnest(p.proconfig) AS c(setting)
                        WHERE c.setting LIKE 'plan_cache_mode=%%')
        """,
    )
    assert forced == []


def test_no_integer_or_smallint_sequences_in_llm(llm_conn):
    small = rows(
        llm_conn,
        """
        SELECT c.relname, format_type(s.seqtypid, NULL) AS type
          FROM pg_catalog.pg_sequence AS s
          JOIN pg_catalog.pg_class AS c ON c.oid = s.seqrelid
         WHERE c.relnamespace = 'llm'::regnamespace
           AND s.seqtypid IN ('smallint'::regtype, 'integer'::regtype)
        """,
    )
    assert small == []


def test_no_function_ever_moves_a_row_to_another_organization(llm_conn):
    """Citus cannot update a distribution column: no UPDATE assigns organization_id."""
    assignment = re.compile(r"(?:\bSET\s+|,\s*)organization_id\s*=(?!=)", re.IGNORECASE)
    offenders = [r["signature"] for r in routines(llm_conn) if assignment.search(r["prosrc"])]
    assert offenders == []


def test_no_sql_language_function_reads_an_llm_table(llm_conn):
    """Citus: SQL-language functions over distributed tables misbehave; write PL/pgSQL."""
    tables = set(llm_tables(llm_conn))
    sql_functions = [r for r in routines(llm_conn) if r["language"] == "sql"]
    assert sql_functions, "the check must look at something"
    offenders = [
        (r["signature"], name)
        for r in sql_functions
        for name in re.findall(r"\bllm\s*\.\s*(\w+)", r["prosrc"], re.IGNORECASE)
        if name.lower() in tables
    ]
    assert offenders == []


# ---------------------------------------------------------------- per-organization functions


def test_every_per_organization_function_takes_p_organization_id_first(llm_conn):
    """docs/architecture.md "Citus rules": every per-organization function (public ones, their twins and the private
    helpers they call) takes p_organization_id first; the listed pass steps are not
    per-organization operations."""
    per_org = [r for r in per_org_routines(llm_conn) if r["proname"] not in COORDINATOR_STEPS]
    assert len(per_org) >= 20
    offenders = [r["signature"] for r in per_org if r["arg_names"][0] != "p_organization_id"]
    assert offenders == []


def test_coordinator_steps_are_not_distributed(llm_conn):
    names = {r["proname"] for r in routines(llm_conn)}
    assert set(COORDINATOR_STEPS) <= names, "stale exception list"
    assert not set(COORDINATOR_STEPS) & set(distributed_twins(llm_conn))


def test_every_twin_listed_in_distribute_exists_and_takes_p_organization_id_first(llm_conn):
    twins = distributed_twins(llm_conn)
    assert len(twins) >= 10
    by_name = {r["proname"]: r for r in routines(llm_conn)}
    missing = [t for t in twins if t not in by_name]
    assert missing == []
    assert [t for t in twins if not t.startswith("_")] == [], "only private twins are distributed"
    assert [t for t in twins if by_name[t]["arg_names"][:1] != ["p_organization_id"]] == []


# docs/architecture.md "Citus rules" 4: a twin is named `_<public name>`, but for these
SHARED_TWINS = {"complete_notice": "_end_claim", "fail_notice": "_end_claim",
                "release_notice": "_end_claim"}


def test_every_public_per_organization_function_delegates_to_a_distributed_twin(llm_conn):
    """docs/architecture.md "Citus rules": the public function validates (NULL organization -> 22023) and calls its
    `_twin` in the FROM form, which Citus delegates; only the twins are distributed."""
    twins = set(distributed_twins(llm_conn))
    public = public_per_org_routines(llm_conn)
    assert len(public) >= 10
    offenders = []
    for r in public:
        twin = SHARED_TWINS.get(r["proname"], f"_{r['proname']}")
        if twin not in twins:
            offenders.append((r["signature"], "twin not listed in llm.distribute()"))
        elif not re.search(rf"\bFROM\s+llm\.{twin}\s*\(", r["prosrc"]):
            offenders.append((r["signature"], f"does not call llm.{twin}(...) in the FROM form"))
    assert offenders == []


def test_every_public_per_organization_function_rejects_a_null_organization_with_22023(llm_conn):
    """Calling a distributed function with a NULL distribution argument crashes a Citus
    coordinator, so the public function must refuse it first, writing nothing (over a list that holds the known functions, never an empty one)."""
    for r in public_per_org_routines(llm_conn):
        required = r["pronargs"] - r["pronargdefaults"]
        call = sql.SQL("SELECT * FROM llm.{}({})").format(
            sql.Identifier(r["proname"]),
            sql.SQL(", ").join(
                sql.SQL("NULL::{}").format(sql.SQL(t)) for t in r["arg_types"][:required]
            ),
        )
        assert_sqlstate(llm_conn, "22023", call)


def test_distribute_covers_every_table_but_the_coordinator_one(llm_conn):
    source = scalar(llm_conn, "SELECT prosrc FROM pg_proc WHERE oid = 'llm.distribute(integer)'::regprocedure")
    named = set(re.findall(r"'llm\.(\w+)'", source))
    assert named == set(llm_tables(llm_conn)) - COORDINATOR_TABLES


def test_distribute_without_citus_raises_LL011_and_writes_nothing(llm_conn):
    err = assert_sqlstate(llm_conn, "LL011", sql_of("distribute"), params("distribute"))
    assert "distribute" in err.diag.message_hint
