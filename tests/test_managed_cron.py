"""pg_cron and the pass lease on managed PostgreSQL: the schema owner is a role with LOGIN
CREATEROLE and no superuser, owning the application's databases, and holds only the grants a
managed provider gives.

This module starts its own server, with ``cron.database_name = appa`` (the session's server
fixes it to llm_cron, whose llm schema a superuser owns):

- ``appa``: the pg_cron database, owned by the owner; llm installed there too (the job in the
  application's own database);
- ``appb``, ``appc``: two more application databases, scheduled from appa with ``--cron-dsn``.

The superuser connection plays the provider's admin only: it creates the roles, databases and
the pg_cron extension, grants on schema cron and grants pg_read_all_stats. Everything else logs
in as the owner (migrate, schedule, the pass, the corruption of the lease) or as an operator.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from llm_db import Llm, migrate
from llm_db.testing._server import EphemeralServer
from tests.helpers import (
    CRON_JOB,
    InThread,
    call,
    call_pass,
    invariants,
    lock_period_rows,
    new_org,
    row,
    rows,
    scalar,
    wait_blocked,
)
from tests.test_cli import assert_one_line_error, llm_db

CRON_DB, APP_B, APP_C = "appa", "appb", "appc"
OWNER = "app_owner"  # LOGIN CREATEROLE, no superuser: owns the databases and the llm schema
OPERATOR = "app_ops"  # a login granted llm_operator
SCHEDULE_IN_DATABASE = "cron.schedule_in_database(text, text, text, text, text, boolean)"
PROVIDER_GRANTS = [  # the least a provider's admin grants for --cron-dsn (pg_cron 1.4)
    f"GRANT USAGE ON SCHEMA cron TO {OWNER}",
    f"GRANT EXECUTE ON FUNCTION {SCHEDULE_IN_DATABASE} TO {OWNER}",
]


class Managed:
    """The module's server, seen as the owner (``dsn``, ``connect``) or the admin (``admin``)."""

    def __init__(self, server: EphemeralServer) -> None:
        self.server = server

    def dsn(self, dbname: str, user: str = OWNER) -> str:
        return self.server.dsn(dbname, user=user)

    def connect(self, dbname: str, user: str = OWNER, **kwargs) -> psycopg.Connection:
        kwargs.setdefault("autocommit", True)
        return psycopg.connect(self.dsn(dbname, user), **kwargs)

    def admin(self, *statements: str, dbname: str = CRON_DB) -> None:
        """Run ``statements`` as the provider's admin (the superuser) in ``dbname``."""
        with self.server.connect(dbname) as conn:
            for statement in statements:
                conn.execute(statement)

    def jobs(self) -> list[tuple]:
        """(jobname, username, database, schedule) of every pg_cron job, as the admin sees them."""
        with self.server.connect(CRON_DB) as conn:
            return conn.execute("SELECT jobname, username, database, schedule FROM cron.job"
                                " ORDER BY jobname").fetchall()  # fmt: skip


@pytest.fixture(scope="module")
def managed() -> Iterator[Managed]:
    with EphemeralServer(settings={"cron.database_name": CRON_DB}) as server:
        m = Managed(server)
        m.admin(f"CREATE ROLE {OWNER} LOGIN CREATEROLE",
                f"ALTER DATABASE {CRON_DB} OWNER TO {OWNER}",
                *(f"CREATE DATABASE {db} OWNER {OWNER}" for db in (APP_B, APP_C)),
                dbname="postgres")  # fmt: skip
        m.admin("CREATE EXTENSION pg_cron")
        for db in (CRON_DB, APP_B, APP_C):
            migrate(m.dsn(db))  # a first install, as the owner
        with m.connect(CRON_DB) as owner:  # the owner, with CREATEROLE, makes the logins
            owner.execute(f"CREATE ROLE {OPERATOR} LOGIN IN ROLE llm_operator")
        yield m


@pytest.fixture(autouse=True)
def provider_defaults(managed: Managed) -> Iterator[None]:
    """Each test starts and ends with no job and only what pg_cron 1.4 grants by itself."""

    def reset() -> None:
        managed.admin("SELECT cron.unschedule(jobid) FROM cron.job",
                      *(g.replace("GRANT", "REVOKE").replace(" TO ", " FROM ") for g in PROVIDER_GRANTS),
                      f"REVOKE pg_read_all_stats FROM {OWNER}")  # fmt: skip

    reset()
    yield
    reset()


def hint_statement(text: str) -> str:
    """The statement after ``run: `` in a HINT: what the provider's admin is told to run."""
    return text.split("run: ", 1)[1].strip()


# ---------------------------------------------------------------- F2: LL010 for everyone


def schedule_errors(conn: psycopg.Connection, code: str) -> list[psycopg.Error]:
    """schedule_reconciliation, then unschedule_reconciliation, on ``conn``: each refused
    with SQLSTATE ``code``; their errors."""
    errors = []
    for operation in ("schedule_reconciliation", "unschedule_reconciliation"):
        with pytest.raises(psycopg.Error) as raised:
            call(conn, operation)
        assert raised.value.sqlstate == code, raised.value
        errors.append(raised.value)
    return errors


def test_without_pg_cron_a_non_superuser_owner_gets_ll010_and_its_hint(managed):
    """In a database without pg_cron, schedule and unschedule raise LL010 for a
    schema owner that may not read cron.database_name (superuser-only), not 42501; the HINT
    gives the cron.schedule_in_database call, with this database's job name, to run in the
    pg_cron database; ``llm-db schedule`` exits 3 with it."""
    with managed.connect(APP_B) as owner:
        *_, unscheduling = schedule_errors(owner, "LL010")
    hint = unscheduling.diag.message_hint or ""
    assert f"cron.schedule_in_database('{CRON_JOB}:{APP_B}', '0 * * * *', " in hint
    assert "cron.database_name" in hint and "--cron-dsn" in hint

    proc = llm_db("schedule", dsn=managed.dsn(APP_B))
    assert proc.returncode == 3, proc.stderr
    assert_one_line_error(proc, "schedule", "LL010", "HINT:", f"'{CRON_JOB}:{APP_B}'")
    proc = llm_db("unschedule", dsn=managed.dsn(APP_B))
    assert proc.returncode == 3, proc.stderr
    assert managed.jobs() == []


# ---------------------------------------------------------------- F3: grants, not syntax


def test_without_usage_on_schema_cron_schedule_is_42501_naming_the_grant(managed):
    """In the pg_cron database, an owner without USAGE on schema cron gets 42501
    whose HINT is the GRANT to run as the provider's admin, never the five-field syntax hint;
    nothing is scheduled. Once granted, the job is the owner's own (a non-superuser schedules
    only as itself), and a malformed schedule is still 22023 (pg_cron's own code) with the
    syntax hint."""
    with managed.connect(CRON_DB) as owner:
        for error in schedule_errors(owner, "42501"):
            hint = error.diag.message_hint or ""
            assert hint_statement(hint) == f"GRANT USAGE ON SCHEMA cron TO {OWNER};"
            assert "five-field" not in hint
        proc = llm_db("schedule", dsn=managed.dsn(CRON_DB))
        assert proc.returncode == 4, proc.stderr
        assert_one_line_error(proc, "schedule", "42501", f"GRANT USAGE ON SCHEMA cron TO {OWNER};")
        assert "five-field" not in proc.stderr
        assert managed.jobs() == []

        managed.admin(hint_statement(hint))  # the HINT's statement, as it is
        job = call(owner, "schedule_reconciliation")[0]["value"]
        assert managed.jobs() == [(CRON_JOB, OWNER, CRON_DB, "0 * * * *")]
        with pytest.raises(psycopg.Error) as raised:
            call(owner, "schedule_reconciliation", "every hour please")
        assert raised.value.sqlstate == "22023"
        assert "five-field" in (raised.value.diag.message_hint or "")
        assert managed.jobs() == [(CRON_JOB, OWNER, CRON_DB, "0 * * * *")]
        assert scalar(owner, "SELECT llm.unschedule_reconciliation()") is True
        assert job is not None and managed.jobs() == []


def test_cron_dsn_names_each_grant_the_owner_lacks_then_schedules_as_the_owner(managed):
    """``llm-db schedule --cron-dsn`` as the owner needs USAGE on schema cron
    and EXECUTE on cron.schedule_in_database (pg_cron 1.4 revokes it from PUBLIC): each
    missing grant is a 42501 whose HINT is the statement to run, exit 4. With both, the job
    llm-reconciliation:appb is the owner's and runs in appb; unschedule removes it."""
    cron_dsn = managed.dsn(CRON_DB)
    for grant in PROVIDER_GRANTS:
        proc = llm_db("schedule", "--cron-dsn", cron_dsn, dsn=managed.dsn(APP_B))
        assert proc.returncode == 4, proc.stderr
        assert_one_line_error(proc, "schedule", "42501", f"HINT: as the provider's admin, in database {CRON_DB}")
        assert hint_statement(proc.stderr) == grant + ";"
        assert managed.jobs() == []
        managed.admin(grant)

    proc = llm_db("schedule", "--cron-dsn", cron_dsn, dsn=managed.dsn(APP_B))
    assert proc.returncode == 0, proc.stderr
    assert managed.jobs() == [(f"{CRON_JOB}:{APP_B}", OWNER, APP_B, "0 * * * *")]
    proc = llm_db("unschedule", "--cron-dsn", cron_dsn, dsn=managed.dsn(APP_B))
    assert proc.stdout.strip() == f"removed pg_cron job {CRON_JOB}:{APP_B} for database {APP_B}"
    assert managed.jobs() == []


# ---------------------------------------------------------------- F5: a job per database


def test_each_database_gets_its_own_job_and_a_name_running_elsewhere_is_refused(managed):
    """pg_cron upserts a job on (name, role) and never moves it to another
    database. With --cron-dsn the default name is llm-reconciliation:<database>, so one owner
    schedules appb and appc as two jobs beside appa's own llm-reconciliation; unschedule for
    appb removes appb's job only. A name that already runs in another database is refused
    (42710, naming that database) and changes nothing: by the CLI, and by
    schedule_reconciliation when llm-reconciliation runs elsewhere (as --cron-dsn named it
    before 0.3.0); scheduling that database again with the default name replaces it."""
    managed.admin(*PROVIDER_GRANTS)
    cron_dsn = managed.dsn(CRON_DB)
    for db in (APP_B, APP_C):
        proc = llm_db("schedule", "--cron-dsn", cron_dsn, dsn=managed.dsn(db))
        assert proc.returncode == 0, proc.stderr
        assert f"runs CALL llm.run_reconciliation() in database {db}" in proc.stdout
    assert llm_db("schedule", dsn=managed.dsn(CRON_DB)).returncode == 0
    everyone = [(CRON_JOB, OWNER, CRON_DB, "0 * * * *"),
                (f"{CRON_JOB}:{APP_B}", OWNER, APP_B, "0 * * * *"),
                (f"{CRON_JOB}:{APP_C}", OWNER, APP_C, "0 * * * *")]  # fmt: skip
    assert managed.jobs() == everyone

    proc = llm_db("schedule", "--cron-dsn", cron_dsn, "--job-name", f"{CRON_JOB}:{APP_B}",
                  "--schedule", "5 * * * *", dsn=managed.dsn(APP_C))  # fmt: skip
    assert proc.returncode == 4
    assert_one_line_error(proc, "schedule", "42710", f"already runs in database {APP_B}, not {APP_C}")
    assert managed.jobs() == everyone  # not even its schedule changed

    proc = llm_db("unschedule", "--cron-dsn", cron_dsn, dsn=managed.dsn(APP_B))
    assert proc.stdout.strip() == f"removed pg_cron job {CRON_JOB}:{APP_B} for database {APP_B}"
    assert managed.jobs() == [everyone[0], everyone[2]]

    # llm-reconciliation taken for appb: appa's schedule_reconciliation refuses, naming appb
    with managed.connect(CRON_DB) as owner:
        assert scalar(owner, "SELECT llm.unschedule_reconciliation()") is True
        proc = llm_db("schedule", "--cron-dsn", cron_dsn, "--job-name", CRON_JOB, dsn=managed.dsn(APP_B))
        assert proc.returncode == 0, proc.stderr
        with pytest.raises(psycopg.Error) as raised:
            call(owner, "schedule_reconciliation", "7 * * * *")
        assert raised.value.sqlstate == "42710"
        assert f"runs in database {APP_B}" in raised.value.diag.message_primary
        assert managed.jobs() == [(CRON_JOB, OWNER, APP_B, "0 * * * *"), everyone[2]]
        assert scalar(owner, "SELECT llm.unschedule_reconciliation()") is False  # not appa's

        # scheduling appb under the default name replaces its job of the old name
        proc = llm_db("schedule", "--cron-dsn", cron_dsn, dsn=managed.dsn(APP_B))
        assert proc.returncode == 0, proc.stderr
        assert f"removed pg_cron job {CRON_JOB} for database {APP_B}" in proc.stdout
        assert managed.jobs() == everyone[1:]
        assert call(owner, "schedule_reconciliation")[0]["value"] is not None
        assert managed.jobs() == everyone


def test_unschedule_with_the_default_name_also_removes_the_job_of_the_old_name(managed):
    """Upgrading: a job --cron-dsn scheduled before 0.3.0 is named
    llm-reconciliation; ``llm-db unschedule --cron-dsn`` without --job-name removes it too."""
    managed.admin(*PROVIDER_GRANTS)
    cron_dsn = managed.dsn(CRON_DB)
    proc = llm_db("schedule", "--cron-dsn", cron_dsn, "--job-name", CRON_JOB, dsn=managed.dsn(APP_B))
    assert proc.returncode == 0, proc.stderr
    assert managed.jobs() == [(CRON_JOB, OWNER, APP_B, "0 * * * *")]
    proc = llm_db("unschedule", "--cron-dsn", cron_dsn, dsn=managed.dsn(APP_B))
    assert proc.stdout.strip() == f"removed pg_cron job {CRON_JOB} for database {APP_B} (its name before 0.3.0)"
    assert managed.jobs() == []


# ---------------------------------------------------------------- lease visibility


@pytest.fixture
def lease_db(managed: Managed) -> Iterator[str]:
    """A fresh database owned by the owner, llm installed by it."""
    name = "lease"
    managed.admin(f"CREATE DATABASE {name} OWNER {OWNER}", dbname="postgres")
    try:
        migrate(managed.dsn(name))
        yield name
    finally:
        managed.server.drop_database(name)


@pytest.mark.parametrize("read_all_stats", [True, False], ids=["pg_read_all_stats", "no_stats"])
def test_a_cancelled_operator_pass_is_taken_over_at_once_only_if_the_owner_sees_it(
    managed, lease_db, read_all_stats
):
    """WF-PFM-LLM-004 concurrency: a pass an operator login started is cancelled mid-sweep; its
    backend lives on, idle. The pass's functions run as the owner, so the owner's rights
    decide what it sees of that backend. With pg_read_all_stats the next pass sees the
    holder no longer runs the pass and takes over at once ('abandoned'). Without it the
    holder's backend_start and state are hidden: the next pass is skipped, naming the
    holder's pid and its lease's expiry, and takes over once the lease lapsed (the owner
    moves expires_at into the past, as pass_lease later would)."""
    if read_all_stats:
        managed.admin(f"GRANT pg_read_all_stats TO {OWNER}")
    owner = managed.connect(lease_db)
    blocker = managed.connect(lease_db, autocommit=False)
    holder = managed.connect(lease_db, user=OPERATOR, application_name="operator pass")
    try:
        org = new_org(owner, None)
        llm = Llm(owner)
        stale = scalar(owner, "SELECT now() - interval '2 days'")
        inv = llm.admit(org, 10, "gpt-x", now=stale)
        llm.mark_dispatched(org, inv.id, now=stale)
        owner.execute("UPDATE llm.settings SET org_lock_timeout = '60s'")  # wait until cancelled
        lock_period_rows(blocker, org)
        cancelled = InThread(lambda: call_pass(holder, None))
        wait_blocked(owner, holder.info.backend_pid)
        holder.cancel_safe()
        cancelled.join(20)
        assert isinstance(cancelled.error, psycopg.errors.QueryCanceled)
        blocker.rollback()
        held = row(owner, "SELECT run_id, holder_pid, expires_at FROM llm.pass_lease")
        assert held["holder_pid"] == holder.info.backend_pid

        run = llm.run_reconciliation()
        if not read_all_stats:
            assert run is not None and run.status == "skipped"
            [why] = scalar(owner, "SELECT errors FROM llm.reconciliation_runs WHERE status = 'skipped'")
            assert why["holder_pid"] == holder.info.backend_pid
            assert why["holder_run_id"] == str(held["run_id"])
            assert why["lease_expires_at"] is not None
            owner.execute("UPDATE llm.pass_lease SET expires_at = clock_timestamp() - interval '1 second'")
            run = llm.run_reconciliation()

        assert run is not None and (run.status, run.requests_recovered) == ("succeeded", 1)
        [old] = rows(owner, "SELECT status, errors FROM llm.reconciliation_runs WHERE id = %s", [held["run_id"]])
        assert old["status"] == "failed"
        why = old["errors"][-1]["error"]
        assert ("abandoned" in why) if read_all_stats else ("expired" in why and "taken over" in why)
        assert scalar(owner, "SELECT token FROM llm.pass_lease") is None
        assert invariants(owner) == []
    finally:
        for conn in (holder, blocker, owner):
            conn.close()
