"""``llm-db doctor``, the preflight check of a database, through its real
entry point against the test server: before install, after install, as an owner that is
not a superuser (as on a managed service), with pg_cron in another database, and through
PgBouncer. Exit 0 all ok, 1 a warning, 6 something missing; never 2 for a finding.

The clock is the server's: health is checked after a pass run at now().
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from llm_db.cli.doctor import KEY_GRANTS
from llm_db.migrate import migrate
from tests.helpers import call_pass, invariants
from tests.test_cli import llm_db

ROOT = Path(__file__).resolve().parents[1]
EXIT_OK, EXIT_WARNING, EXIT_MISSING = 0, 1, 5


def doctor(dsn: str, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, dict]]:
    """``llm-db doctor --json ARGS`` on ``dsn``: the process and its checks by name."""
    proc = llm_db("doctor", "--json", *args, dsn=dsn)
    assert "Traceback" not in proc.stderr, proc.stderr
    checks = json.loads(proc.stdout)
    assert all(set(c) == {"name", "status", "detail", "fix"} for c in checks), checks
    assert all((c["fix"] is None) == (c["status"] == "ok") for c in checks), checks
    return proc, {c["name"]: c for c in checks}


def statuses(checks: dict[str, dict]) -> dict[str, str]:
    return {name: c["status"] for name, c in checks.items()}


@pytest.fixture
def empty_dsn(llm_server) -> Iterator[str]:
    """A database with nothing of llm-db in it."""
    name = f"doctor_{uuid.uuid4().hex}"
    dsn = llm_server.create_database(name)
    try:
        yield dsn
    finally:
        llm_server.drop_database(name)


@pytest.fixture
def owner_dsn(llm_server) -> Iterator[str]:
    """A fresh database owned by a LOGIN CREATEROLE role that is no superuser, as a
    managed provider gives it; its conninfo logs in as that role. The superuser here
    only does what the provider's admin does: create the role and the database."""
    name = f"doctor_{uuid.uuid4().hex[:12]}"
    with llm_server.connect() as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN CREATEROLE").format(sql.Identifier(name)))
        admin.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(*map(sql.Identifier, (name, name)))
        )
    try:
        yield llm_server.dsn(name, user=name)
    finally:
        llm_server.drop_database(name)
        with llm_server.connect() as admin:
            for database in ("postgres", "llm_cron"):  # what it was granted there, then it
                with llm_server.connect(database) as conn:
                    conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_before_install_everything_llm_db_creates_is_missing_exit_6(empty_dsn):
    """A database before install: no schema llm, so the migration level
    and the pass are missing, each with the command that fixes it; exit 5 (as health never), never 2."""
    proc, checks = doctor(empty_dsn)
    assert proc.returncode == EXIT_MISSING, proc.stdout + proc.stderr
    assert checks["migrations"]["status"] == "missing"
    assert "not installed" in checks["migrations"]["detail"]
    assert checks["migrations"]["fix"].startswith("llm-db migrate")
    assert checks["health"]["status"] == "missing"
    assert checks["server"]["status"] == "ok" and "PostgreSQL 15" in checks["server"]["detail"]
    assert checks["owner"]["status"] == "ok" and "superuser" in checks["owner"]["detail"]


def test_after_install_with_the_cron_database_only_warnings_remain(
    llm_server, llm_dsn, llm_cron_dsn
):
    """After migrate, with --cron-dsn: pg_cron found in the cron database,
    the grants held, the migration level equal to the package's, a direct connection;
    the pass not scheduled and never run are warnings (exit 1)."""
    proc, checks = doctor(llm_dsn, "--cron-dsn", llm_cron_dsn)
    assert proc.returncode == EXIT_WARNING, proc.stdout + proc.stderr
    migrations = sorted(p.stem for p in (ROOT / "migrations").glob("*.sql"))
    assert list(checks) == [
        "server", "pg_cron", "pg_cron grants", "plpgsql_check", "citus", "owner", "lease",
        "roles", "migrations", "schedule", "health", "pooling",
    ]  # fmt: skip
    # owner and lease depend on who owns the test database (a superuser here): see the
    # non-superuser test for their warnings
    assert {k: v for k, v in statuses(checks).items() if k not in ("owner", "lease")} == {
        "server": "ok", "pg_cron": "ok", "pg_cron grants": "ok", "plpgsql_check": "ok",
        "citus": "ok", "roles": "ok", "migrations": "ok", "schedule": "warning",
        "health": "warning", "pooling": "ok",
    }  # fmt: skip
    assert "in database llm_cron (--cron-dsn)" in checks["pg_cron"]["detail"]
    assert f"{len(migrations)} of {len(migrations)} applied" in checks["migrations"]["detail"]
    assert "no pg_cron job" in checks["schedule"]["detail"]
    assert checks["health"]["detail"].startswith("the pass is never")

    # without --cron-dsn a superuser reads cron.database_name and is told where pg_cron is
    dbname = psycopg.conninfo.conninfo_to_dict(llm_dsn)["dbname"]
    proc, checks = doctor(llm_server.dsn(dbname))
    assert proc.returncode == EXIT_WARNING
    assert checks["pg_cron"]["status"] == "warning"
    assert "pg_cron runs from database llm_cron" in checks["pg_cron"]["detail"]


def test_a_scheduled_healthy_pass_in_the_cron_database_is_all_ok(llm_cron_dsn, cron_conn):
    """Llm-db installed in pg_cron's own database, the pass scheduled
    (llm.schedule_reconciliation) and run at now(): every check ok, exit 0."""
    proc, checks = doctor(llm_cron_dsn)
    assert checks["pg_cron"]["detail"].endswith("in this database")
    assert checks["schedule"]["status"] == "warning"
    cron_conn.execute("SELECT llm.schedule_reconciliation()")
    call_pass(cron_conn, None)
    proc, checks = doctor(llm_cron_dsn)
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    assert set(statuses(checks).values()) == {"ok"}
    assert "llm-reconciliation '0 * * * *'" in checks["schedule"]["detail"]
    assert "healthy" in checks["health"]["detail"]
    assert invariants(cron_conn) == []


def test_a_lost_grant_is_missing_with_the_command_that_restores_it(llm_conn, llm_dsn):
    """llm_operator needs EXECUTE on llm._clock_ok to run the pass; the
    doctor names the routine that lost it, and migrate (sql/99_grants.sql) restores it."""
    llm_conn.execute("REVOKE EXECUTE ON FUNCTION llm._clock_ok(timestamptz) FROM llm_operator")
    proc, checks = doctor(llm_dsn)
    assert proc.returncode == EXIT_MISSING
    assert checks["roles"]["status"] == "missing"
    assert "llm_operator: llm._clock_ok(timestamptz)" in checks["roles"]["detail"]
    assert "llm-db migrate" in checks["roles"]["fix"]


def test_a_non_superuser_owner_installs_and_is_told_the_grants_it_lacks(
    llm_server, owner_dsn, llm_cron_dsn
):
    """As on a managed service: an owner with LOGIN CREATEROLE
    and no superuser installs llm-db (a first migrate works); the doctor then says that
    cron.database_name is hidden from it (read from pg_settings, not current_setting(), which raises 42501 to it),
    that the lease cannot see other roles' backends, and with --cron-dsn the pg_cron
    grants it lacks, each with the GRANT to run as the provider's admin."""
    role = psycopg.conninfo.conninfo_to_dict(owner_dsn)["user"]
    proc, checks = doctor(owner_dsn)
    assert proc.returncode == EXIT_MISSING
    assert checks["owner"]["status"] == "ok"
    assert checks["owner"]["detail"] == f"{role}: not a superuser; CREATEROLE; owns the database"

    migrate(owner_dsn)  # the first install, as the owner
    proc, checks = doctor(owner_dsn)
    assert proc.returncode == EXIT_WARNING, proc.stdout + proc.stderr
    assert checks["migrations"]["status"] == "ok" and checks["roles"]["status"] == "ok"
    assert checks["pg_cron"] == {
        "name": "pg_cron", "status": "warning",
        "detail": "pg_cron's database is not readable without pg_read_all_settings: "
                  "pass --cron-dsn",
        "fix": "llm-db doctor --dsn ... --cron-dsn <the DSN of the database named by "
               "cron.database_name>",
    }  # fmt: skip
    # why pg_settings: current_setting's missing_ok does not cover a privilege
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT current_setting('cron.database_name', true)")
    assert checks["lease"]["status"] == "warning"
    assert "taken over only when settings.pass_lease lapses" in checks["lease"]["detail"]
    assert checks["lease"]["fix"] == f"GRANT pg_read_all_stats TO {role};"

    cron_as_owner = llm_server.dsn("llm_cron", user=role)
    proc, checks = doctor(owner_dsn, "--cron-dsn", cron_as_owner)
    assert proc.returncode == EXIT_MISSING
    assert checks["pg_cron"]["status"] == "ok"
    assert checks["pg_cron grants"]["status"] == "missing"
    assert checks["pg_cron grants"]["fix"] == (
        f"GRANT USAGE ON SCHEMA cron TO {role}; GRANT EXECUTE ON FUNCTION "
        f"cron.schedule_in_database(text, text, text, text, text, boolean) TO {role};"
    )

    # the provider's admin runs the statements the doctor gave; then they are ok
    with llm_server.connect() as admin:
        admin.execute(checks["lease"]["fix"])
    with llm_server.connect("llm_cron") as admin:
        admin.execute(checks["pg_cron grants"]["fix"])
    proc, checks = doctor(owner_dsn, "--cron-dsn", cron_as_owner)
    assert checks["lease"]["status"] == "ok"
    assert checks["pg_cron grants"]["status"] == "ok"
    assert checks["schedule"]["status"] == "warning"  # not scheduled: a warning, exit 1
    assert proc.returncode == EXIT_WARNING, proc.stdout


def test_a_transaction_pooled_dsn_is_told_what_needs_a_session(llm_dsn, llm_pgbouncer_dsn):
    """Through PgBouncer in transaction mode two transactions are answered
    by different backends; the doctor says so, and that the worker (LISTEN) and
    prepare=True need a direct or session-pooled DSN. Directly: one backend, ok."""
    proc, checks = doctor(llm_pgbouncer_dsn)
    assert proc.returncode == EXIT_WARNING, proc.stdout + proc.stderr
    assert checks["pooling"]["status"] == "warning"
    assert checks["pooling"]["detail"].startswith("transaction-pooled")
    assert "LISTEN" in checks["pooling"]["detail"] and "prepare=True" in checks["pooling"]["detail"]
    assert checks["migrations"]["status"] == "ok"  # everything else works through it
    _, direct = doctor(llm_dsn)
    assert direct["pooling"]["status"] == "ok"


def test_the_text_report_gives_one_line_a_check_and_the_fix_under_it(empty_dsn):
    """The text form: status, name, detail; ``fix:`` under a line not ok."""
    proc = llm_db("doctor", dsn=empty_dsn)
    assert proc.returncode == EXIT_MISSING
    lines = proc.stdout.splitlines()
    assert re.match(r"^ok +server +PostgreSQL 15", lines[0]), lines
    migrations = next(i for i, line in enumerate(lines) if " migrations " in line)
    assert lines[migrations].startswith("MISSING ")
    assert lines[migrations + 1].split()[:3] == ["fix:", "llm-db", "migrate"]


def test_help_names_doctor_with_examples_and_its_exit_codes():
    """``llm-db --help`` lists doctor and exit code 5; ``doctor --help``
    teaches with examples, as every subcommand does."""
    top = llm_db("--help")
    assert "  doctor" in top.stdout and "  5 " in top.stdout
    proc = llm_db("doctor", "--help")
    assert proc.returncode == 0
    assert "Examples:" in proc.stdout and "llm-db doctor --dsn" in proc.stdout
    assert "5  something is missing" in proc.stdout


def test_the_key_grants_the_doctor_checks_are_granted_by_sql_99():
    """Each grant the doctor checks is one sql/99_grants.sql makes (a
    routine by its signature, the reader's SELECT on every table), so the check cannot
    go stale silently."""
    text = re.sub(r"--[^\n]*", "", (ROOT / "sql" / "99_grants.sql").read_text())
    statements = [" ".join(s.split()) for s in text.split(";")]
    for role, privilege, name in KEY_GRANTS:
        if privilege == "SELECT":
            wanted = re.compile(rf"GRANT SELECT ON ALL TABLES IN SCHEMA llm TO .*\b{role}\b")
            assert any(wanted.match(s) for s in statements), name
            continue
        assert any(s.startswith("GRANT EXECUTE") and name in s and s.endswith(f"TO {role}")
                   for s in statements), name  # fmt: skip


def test_no_database_given_is_click_usage_exit_2_and_unreachable_is_exit_4():
    """Exit 2 stays click's usage error (no --dsn, no DATABASE_URL), and
    an unreachable database is exit 4 as for every subcommand; neither is a finding."""
    proc = llm_db("doctor")
    assert proc.returncode == 2 and "no database given" in proc.stderr
    proc = llm_db("doctor", "--dsn", "host=127.0.0.1 port=1 dbname=nowhere connect_timeout=3")
    assert proc.returncode == 4 and "cannot connect" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_cron_dsn_without_pg_cron_is_missing_and_says_where_to_create_it(llm_dsn, empty_dsn):
    """--cron-dsn naming a database where pg_cron is not created: missing,
    with the statement and where to run it (exit 5); the schedule cannot be read there."""
    proc, checks = doctor(llm_dsn, "--cron-dsn", empty_dsn)
    assert proc.returncode == EXIT_MISSING
    assert checks["pg_cron"]["status"] == "missing"
    assert "not installed in the --cron-dsn database doctor_" in checks["pg_cron"]["detail"]
    assert checks["pg_cron"]["fix"].startswith("CREATE EXTENSION pg_cron;")
    assert "pg_cron grants" not in checks
    assert checks["schedule"]["status"] == "warning"
