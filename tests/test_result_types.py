"""Public result types are stable (docs/architecture.md Conventions): a public
routine returns its own composite type, never a table's row type, so a column added to a
table changes no public result and a statement a client prepared keeps working.

A client of 0.2.0 prepared ``SELECT * FROM llm.admit_invocation(...)``, whose result was
the ``llm.invocations`` row; once a column was added to that table, every execution failed
with 0A000 ("cached plan must not change result type") until the client reconnected.
"""

from __future__ import annotations

import dataclasses
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from codegen.operations import operations
from llm_db import migrate, models, queries
from tests.helpers import T0, invariants, rows

ROOT = Path(__file__).resolve().parents[1]
RELEASE_0_2_0 = ROOT / "tests" / "upgrade" / "llm-db-0.2.0-e283082.tar.gz"

# Each public result type and the table whose row it replaced (migration 0014): the type
# has the table's columns, names, types and order as of that migration.
RESULT_TYPES = {
    "llm.admission_result": "llm.invocations",
    "llm.organization_settings": "llm.organizations",
    "llm.notice_claim": "llm.threshold_notices",
}

# Whole rows, as 0.2.0's driver read them (codegen/operations.py at e283082): a prepared
# statement of these sees any change of the result type.
UPSERT = "SELECT * FROM llm.upsert_organization(%(org)s, 'shim', 1000, p_now => %(now)s)"
POLICY = "SELECT * FROM llm.set_recovery_policy(%(org)s, 'estimate', 'audit')"
ADMIT = "SELECT * FROM llm.admit_invocation(%(org)s, 10, 'gpt-x', p_now => %(now)s)"
DISPATCH = "SELECT * FROM llm.mark_dispatched(%(org)s, %(id)s, p_now => %(now)s)"
CLAIM = "SELECT * FROM llm.claim_notices(5, p_now => %(now)s)"


def _attributes(conn: psycopg.Connection, relation: str) -> list[tuple[str, str]]:
    """(name, type) of each live column of a table or composite type, in order."""
    return [(r["attname"], r["type"]) for r in rows(conn, """
        SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod) AS type
          FROM pg_catalog.pg_attribute AS a
         WHERE a.attrelid = (SELECT t.typrelid FROM pg_catalog.pg_type AS t WHERE t.oid = %s::regtype)
           AND a.attnum > 0 AND NOT a.attisdropped
         ORDER BY a.attnum""", [relation])]  # fmt: skip


def test_no_public_routine_returns_a_table_row(llm_conn):
    """Every public routine of schema llm returns its own declared type
    (a composite type, a RETURNS TABLE or a scalar), never a table's or view's row type."""
    offending = rows(llm_conn, """
        SELECT p.oid::regprocedure::text AS routine, p.prorettype::regtype::text AS returns
          FROM pg_catalog.pg_proc AS p
          JOIN pg_catalog.pg_type AS t ON t.oid = p.prorettype
          JOIN pg_catalog.pg_class AS c ON c.oid = t.typrelid
         WHERE p.pronamespace = 'llm'::regnamespace AND p.proname !~ '^_' AND c.relkind <> 'c'
         ORDER BY 1""")  # fmt: skip
    assert offending == []


@pytest.mark.parametrize("result_type", sorted(RESULT_TYPES))
def test_result_type_is_the_table_row_it_replaced(llm_conn, result_type):
    """Each result type has the columns, names, types and order
    of its table's row, so 0.2.0's prepared statements see the same result; a later column
    of the table comes after them (the public wrappers convert the twin's row by position)."""
    table = _attributes(llm_conn, RESULT_TYPES[result_type])
    own = _attributes(llm_conn, result_type)
    # a column of the type's own after them: llm.admission_result's replayed (migration 0019)
    own = own[:-1] if own[-1:] == [("replayed", "boolean")] else own
    assert own == table[: len(own)] and own


@pytest.fixture
def release_0_2_0_dsn(llm_server, llm_owner: str, tmp_path: Path) -> Iterator[str]:
    """A fresh database with release 0.2.0 installed by the schema owner; dropped afterwards."""
    with tarfile.open(RELEASE_0_2_0) as archive:
        archive.extractall(tmp_path, filter="data")
    name = f"u_{uuid.uuid4().hex}"
    dsn = llm_server.create_database(name, owner=llm_owner)
    try:
        migrate(dsn, migrations_dir=tmp_path / "migrations", sql_dir=tmp_path / "sql")
        yield dsn
    finally:
        llm_server.drop_database(name)


def _prepared_client(dsn: str) -> psycopg.Connection[dict[str, Any]]:
    """A client that prepares every statement on the server at its first execution."""
    return psycopg.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row)


def _add_columns(dsn: str, tables: tuple[str, ...]) -> None:
    """What a later release's migration may do: a new nullable column on each table."""
    with psycopg.connect(dsn, autocommit=True) as owner:
        for table in tables:
            owner.execute(f"ALTER TABLE {table} ADD COLUMN later_release_probe integer")


def test_prepared_admission_of_0_2_0_survives_the_upgrade_and_a_later_column(release_0_2_0_dsn):
    """A 0.2.0 client that prepared ``SELECT * FROM llm.admit_invocation(...)`` (and
    mark_dispatched, upsert_organization, set_recovery_policy) keeps working when migrate
    installs this release's functions, and again when a column is added to llm.invocations
    and llm.organizations afterwards, before and after the functions are re-created. On
    0.2.0's functions the last step fails with 0A000.

    0.4.0 broke this once, as the CHANGELOG says: the two return llm.admission_result,
    llm.admission's columns then ``replayed`` (migration 0019), so the two ``SELECT *`` statements of admission and dispatch fail
    with 0A000 once after the upgrade, and the shim (DEALLOCATE them, or reconnect)
    brings them back with the new last column; a client that names the columns, as the
    driver does since 0.3.0, never notices."""
    dsn = release_0_2_0_dsn
    org = uuid.uuid4()
    named = ADMIT.replace("*", ", ".join(f.name for f in dataclasses.fields(models.Invocation)
                                         if f.name != "replayed"))
    def calls(client: psycopg.Connection) -> list[list[str]]:
        organization = client.execute(UPSERT, {"org": org, "now": T0}).fetchone()
        inv = client.execute(ADMIT, {"org": org, "now": T0}).fetchone()
        return [
            list(organization),
            list(client.execute(POLICY, {"org": org}).fetchone()),
            list(inv)[:25],
            list(client.execute(DISPATCH, {"org": org, "id": inv["id"], "now": T0}).fetchone())[:25],
            list(client.execute(named, {"org": org, "now": T0}).fetchone())[2:],
        ]

    with _prepared_client(dsn) as client:
        before = calls(client)
        prepared = client.execute(
            "SELECT count(*) AS n FROM pg_catalog.pg_prepared_statements WHERE statement ~ 'llm\\.'"
        ).fetchone()
        assert prepared["n"] >= 5, "the client did not prepare its calls"

        migrate(dsn)  # this release: the functions now return their own types
        for statement in (ADMIT, DISPATCH):  # the break of 0.4.0, once per statement
            with pytest.raises(psycopg.errors.FeatureNotSupported, match="cached plan"):
                client.execute(statement, {"org": org, "id": uuid.uuid4(), "now": T0})
        assert client.execute(named, {"org": org, "now": T0}).fetchone()  # named: unaffected

    with _prepared_client(dsn) as client:  # the shim: a new connection prepares them again
        assert calls(client) == before
        assert client.execute(ADMIT, {"org": org, "now": T0}).fetchone()["replayed"] is False

        _add_columns(dsn, ("llm.invocations", "llm.organizations"))
        assert calls(client) == before  # the functions in force run on the wider tables
        migrate(dsn)  # and once re-created, which invalidates every cached plan
        assert calls(client) == before
        assert invariants(client) == []


def test_prepared_claim_survives_a_later_column(llm_dsn, llm_conn):
    """A prepared ``SELECT * FROM llm.claim_notices(...)`` keeps its
    result when a column is added to llm.threshold_notices (0A000 while claim_notices
    returned that table's rows)."""
    with _prepared_client(llm_dsn) as client:
        before = client.execute(CLAIM, {"now": T0}).description
        _add_columns(llm_dsn, ("llm.threshold_notices",))
        migrate(llm_dsn)  # re-creating the functions invalidates every cached plan
        after = client.execute(CLAIM, {"now": T0}).description
    assert [c.name for c in after] == [c.name for c in before]
    assert invariants(llm_conn) == []


def test_the_driver_reads_named_columns():
    """"The driver reads named columns": no statement of the driver
    selects ``*``, so a column added to a result type or table later leaves every
    statement it prepared unchanged."""
    statements = {name: op.sql for name, op in operations().items()}
    statements["RUN_RECORDED_SINCE"] = queries.RUN_RECORDED_SINCE
    assert [name for name, sql in statements.items() if "*" in sql] == []
