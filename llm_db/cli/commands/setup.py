"""``llm-db migrate``, ``distribute``, ``schedule`` and ``unschedule``: install the
schema, shard it with Citus, and put the hourly pass under pg_cron."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator

import click
import psycopg

from llm_db import queries
from llm_db.cli.commands import common
from llm_db.migrate import Event

JOB_NAME = "llm-reconciliation"
JOB_COMMAND = "CALL llm.run_reconciliation()"


# ----------------------------------------------------------- migrate


@click.command(short_help="Install or upgrade the llm schema.")
@common.dsn_option
@click.option("--lock-timeout", type=click.FloatRange(0.001, 3600), default=1.0,
              show_default=True, metavar="SECONDS",
              help="How long one statement may wait for a lock before its step is "
                   "rolled back and retried.")  # fmt: skip
@click.option("--deadline", type=click.FloatRange(0.001, 7 * 86400), default=600.0,
              show_default=True, metavar="SECONDS",
              help="When to stop retrying and exit 75, naming the session in the way.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per line for each event, then one for the result.")  # fmt: skip
def migrate(dsn: str | None, lock_timeout: float, deadline: float, as_json: bool) -> None:
    """Install or upgrade the llm schema: migrations/, then every sql/ file.

    Safe to re-run and to run from two deploys at once, and under live traffic:
    each statement waits at most --lock-timeout for a lock, so consumers queued
    behind it stall no longer; a step that timed out is rolled back and retried
    whole, with backoff, until --deadline. Run it as the role that should own
    the schema. It prints each step as it ends (and as it starts, on a
    terminal), and each wait with the session it waits for.

    \b
    Exit codes:
      0   the schema is this release's
      4   a migration or function file failed, or the database went away
          (the message names the file); what was committed before stays
      75  --deadline passed waiting for a lock (the message names the pid and
          query holding it); the database works as it is: run migrate again
      2   the command line is wrong; 130 interrupted (as for 4: run it again)

    \b
    Examples:
      llm-db migrate --dsn postgresql://owner@db.internal/app
      DATABASE_URL='host=/var/run/postgresql dbname=app' llm-db migrate --json
    """
    from llm_db.migrate import migrate as run_migrate

    on_terminal = not as_json and sys.stdout.isatty()

    def on_event(event: Event) -> None:
        if as_json:
            click.echo(json.dumps(event, default=str))
        elif on_terminal or event["event"] != "start":
            click.echo(describe_event(event))

    report = run_migrate(
        common.require_dsn(dsn), lock_timeout=lock_timeout, deadline=deadline, on_event=on_event
    )
    if as_json:
        click.echo(json.dumps({"event": "finished", "applied_migrations": report.applied_migrations,
                               "sql_files": len(report.sql_files),
                               "dropped_routines": report.dropped_routines}))  # fmt: skip
        return
    applied = ", ".join(report.applied_migrations) or "none"
    click.echo(f"migrations applied: {applied}")
    click.echo(f"sql files applied: {len(report.sql_files)}")
    if report.dropped_routines:
        click.echo(f"routines dropped (no longer defined): {', '.join(report.dropped_routines)}")


def describe_event(event: Event) -> str:
    """One line for an event of ``llm_db.migrate``."""
    step, kind = event["step"], event["event"]
    if kind == "start":
        return f"{step}: started"
    if kind == "done":
        tries = f" ({event['attempts']} attempts)" if event["attempts"] > 1 else ""
        return f"{step}: done in {event['elapsed_s']:.2f} s{tries}"
    if kind == "progress":
        return f"{step}: {event['done']}/{event['total']} rows"
    if kind == "wait":
        if event["blocker_pid"] is None:
            whom = "a lock (its holder had gone when looked for)"
        else:
            whom = (f"lock on {event['lock'] or 'an object'} ({event['mode']}) held by pid "
                    f"{event['blocker_pid']} (query: {event['blocker_query']!r})")  # fmt: skip
        return (f"{step}: waiting for {whom}, attempt {event['attempt']}, "
                f"retrying in {event['retry_in_s']:.1f} s")  # fmt: skip
    return f"{step}: {kind}"


# ----------------------------------------------------------- distribute


@click.command(short_help="Shard the schema with Citus (llm.distribute()).")
@common.dsn_option
@click.option("--shard-count", type=click.IntRange(1, 10000), default=None,
              help="citus.shard_count for the distributed tables (default: Citus's).")  # fmt: skip
def distribute(dsn: str | None, shard_count: int | None) -> None:
    """Shard the llm schema with Citus: one statement after migrate (llm.distribute()).

    Run on the coordinator, with citus in shared_preload_libraries, CREATE
    EXTENSION citus done and workers added. Without citus: LL011, exit 3.
    See docs/scaling.md.

    \b
    Example:
      llm-db distribute --dsn postgresql://owner@coordinator/app --shard-count 64
    """
    from llm_db.client import Llm

    with common.connect(dsn) as conn:
        done = Llm(conn).distribute(shard_count)
    click.echo(f"distributed: {done}")


# ----------------------------------------------------------- schedule / unschedule

_CRON_SCHEDULE_IN_DATABASE = """
SELECT cron.schedule_in_database(%(job_name)s::text, %(schedule)s::text, %(command)s::text,
                                 %(dbname)s::text) AS job_id
"""
_CRON_JOB_DATABASE = "SELECT j.database FROM cron.job AS j WHERE j.jobid = %(job_id)s::bigint"
_CRON_UNSCHEDULE_IN_DATABASE = """
SELECT cron.unschedule(j.jobid) AS removed
  FROM cron.job AS j
 WHERE j.jobname = %(job_name)s::text AND j.database = %(dbname)s::text
   AND j.username = current_user
"""
# Before 0.3.0 --cron-dsn named every database's job llm-reconciliation: the default
# name now replaces that job of this login for this database (not the cron database's own).
_CRON_UNSCHEDULE_OLD_NAME = """
SELECT cron.unschedule(j.jobid) AS removed
  FROM cron.job AS j
 WHERE j.jobname = %(old_name)s::text AND j.database = %(dbname)s::text
   AND j.database <> pg_catalog.current_database() AND j.username = current_user
"""
_CRON_INSTALLED = "SELECT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'pg_cron')"
# What pg_cron 1.4 leaves to the provider's admin: USAGE on schema cron, and EXECUTE on
# cron.schedule_in_database (revoked from PUBLIC). The CASE keeps the function's name
# from being looked up in a schema this role may not use (that lookup raises 42501).
_CRON_GRANTS = """
SELECT current_user AS role,
       pg_catalog.has_schema_privilege('cron', 'USAGE') AS usage,
       CASE WHEN pg_catalog.has_schema_privilege('cron', 'USAGE')
            THEN pg_catalog.has_function_privilege(%(function)s::text, 'EXECUTE') END AS execute
"""
_SCHEDULE_IN_DATABASE = "cron.schedule_in_database(text, text, text, text, text, boolean)"
_UNSCHEDULE = "cron.unschedule(bigint)"


def default_job_name(dbname: str) -> str:
    """The job name ``--cron-dsn`` gives the pass of database ``dbname``: one per database,
    as pg_cron keeps one job per (name, role) and never moves it to another database."""
    return f"{JOB_NAME}:{dbname}"


def _llm_database(dsn: str | None) -> str:
    with common.connect(dsn) as conn:
        installed, dbname = conn.execute(queries.LLM_INSTALLED).fetchone()
    if not installed:
        raise common.Failure(
            f"llm-db is not installed in database {dbname}: run llm-db migrate --dsn ... first",
            common.EXIT_ERROR,
        )
    return dbname


def _require_grants(cron: psycopg.Connection, function: str) -> None:
    """42501 naming the GRANT the provider's admin runs, when this role may not call
    ``function`` of pg_cron (before pg_cron says it less clearly)."""
    role, usage, execute = cron.execute(_CRON_GRANTS, {"function": function}).fetchone()
    missing = (
        f"GRANT USAGE ON SCHEMA cron TO {role};" if not usage
        else f"GRANT EXECUTE ON FUNCTION {function} TO {role};" if not execute
        else None
    )  # fmt: skip
    if missing is not None:
        raise common.Failure(
            f"42501 role {role} may not call {function} in the --cron-dsn database "
            f"{cron.info.dbname} HINT: as the provider's admin, in database {cron.info.dbname} "
            f"run: {missing}",
            common.EXIT_ERROR,
        )


def _unschedule_old_name(cron: psycopg.Connection, dbname: str) -> list[tuple]:
    """Remove this login's job for ``dbname`` under the name --cron-dsn gave before 0.3.0."""
    return cron.execute(
        _CRON_UNSCHEDULE_OLD_NAME, {"old_name": JOB_NAME, "dbname": dbname}
    ).fetchall()


@contextlib.contextmanager
def _cron_database(cron_dsn: str, function: str) -> Iterator[psycopg.Connection]:
    with common.connect(cron_dsn, option="--cron-dsn") as cron:
        if not cron.execute(_CRON_INSTALLED).fetchone()[0]:
            raise common.Failure(
                f"LL010 pg_cron is not installed in the --cron-dsn database {cron.info.dbname} "
                "HINT: connect --cron-dsn to the database named by the server setting "
                "cron.database_name, where CREATE EXTENSION pg_cron was run",
                common.EXIT_UNAVAILABLE,
            )
        _require_grants(cron, function)
        yield cron


@click.command(short_help="Schedule the hourly pass with pg_cron.")
@common.dsn_option
@click.option(
    "--schedule",
    default="0 * * * *",
    show_default=True,
    help="Five-field cron expression for the pass.",
)
@click.option(
    "--cron-dsn",
    default=None,
    metavar="DSN",
    help="The pg_cron database (server setting cron.database_name), when it is not the llm one.",
)
@click.option(
    "--job-name",
    default=None,
    help=f"pg_cron job name, with --cron-dsn only [default: {JOB_NAME}:<llm database>].",
)
def schedule(dsn: str | None, schedule: str, cron_dsn: str | None, job_name: str | None) -> None:
    """Schedule the hourly pass with pg_cron (idempotent: reschedules the same job).

    pg_cron runs jobs from one database, the server's cron.database_name.
    When llm-db is installed in that database, this runs
    llm.schedule_reconciliation(): job llm-reconciliation. When it is
    installed elsewhere, give the cron database with --cron-dsn and this runs
    cron.schedule_in_database(job, schedule, 'CALL llm.run_reconciliation()',
    <the llm database>) there: job llm-reconciliation:<the llm database>.
    A job name that already runs in another database is refused (pg_cron
    would keep it there). The job runs as the role that schedules it: the
    schema owner, or the --cron-dsn login. Without pg_cron: LL010 with the
    statement to run, exit 3; without pg_cron's grants: 42501 with the GRANT
    to run, exit 4.

    \b
    Examples:
      llm-db schedule --dsn postgresql://owner@db/app
      llm-db schedule --dsn postgresql://owner@db/app --schedule '*/30 * * * *'
      llm-db schedule --dsn postgresql://owner@db/app --cron-dsn postgresql://owner@db/postgres
    """
    from llm_db.client import Llm

    if cron_dsn is None:
        if job_name is not None and job_name != JOB_NAME:
            raise click.UsageError("--job-name needs --cron-dsn (in-database jobs are named "
                                   f"{JOB_NAME})")  # fmt: skip
        with common.connect(dsn) as conn:
            job_id = Llm(conn).schedule_reconciliation(schedule)
            dbname = conn.info.dbname
        click.echo(f"scheduled pg_cron job {JOB_NAME} (id {job_id}): {schedule!r} runs "
                   f"{JOB_COMMAND} in database {dbname}")  # fmt: skip
        return
    dbname = _llm_database(dsn)
    replaced = []
    with _cron_database(cron_dsn, _SCHEDULE_IN_DATABASE) as cron, cron.transaction():
        if job_name is None:
            job_name = default_job_name(dbname)
            replaced = _unschedule_old_name(cron, dbname)
        job_id = cron.execute(
            _CRON_SCHEDULE_IN_DATABASE,
            {"job_name": job_name, "schedule": schedule, "command": JOB_COMMAND, "dbname": dbname},
        ).fetchone()[0]
        # pg_cron upserts on (job name, role) and keeps the database: check, and roll
        # back (schedule and command too) when the name already runs elsewhere
        runs_in = cron.execute(_CRON_JOB_DATABASE, {"job_id": job_id}).fetchone()[0]
        if runs_in != dbname:
            raise common.Failure(
                f"42710 pg_cron job {job_name} (id {job_id}) already runs in database {runs_in}, "
                f"not {dbname} HINT: leave --job-name out (default {default_job_name(dbname)}) "
                f"or give another name",
                common.EXIT_ERROR,
            )
        click.echo(
            f"scheduled pg_cron job {job_name} (id {job_id}) in database {cron.info.dbname}: "
            f"{schedule!r} runs {JOB_COMMAND} in database {dbname}"
        )
        if replaced:
            click.echo(
                f"removed pg_cron job {JOB_NAME} for database {dbname} (its name before 0.3.0)"
            )


@click.command(short_help="Remove the pg_cron job of the hourly pass.")
@common.dsn_option
@click.option(
    "--cron-dsn", default=None, metavar="DSN", help="The pg_cron database, as for schedule."
)
@click.option(
    "--job-name",
    default=None,
    help=f"pg_cron job name, as for schedule [default: {JOB_NAME}:<llm database>].",
)
def unschedule(dsn: str | None, cron_dsn: str | None, job_name: str | None) -> None:
    """Remove the pg_cron job of the hourly pass (exit 0 also when there was none).

    With --cron-dsn: the job of that name, of the --cron-dsn login, that runs in the
    llm database.

    \b
    Examples:
      llm-db unschedule --dsn postgresql://owner@db/app
      llm-db unschedule --dsn postgresql://owner@db/app --cron-dsn postgresql://owner@db/postgres
    """
    from llm_db.client import Llm

    if cron_dsn is None:
        with common.connect(dsn) as conn:
            removed = Llm(conn).unschedule_reconciliation()
        click.echo(f"removed pg_cron job {JOB_NAME}" if removed else f"no pg_cron job {JOB_NAME}")
        return
    dbname = _llm_database(dsn)
    with _cron_database(cron_dsn, _UNSCHEDULE) as cron:
        old = [] if job_name is not None else _unschedule_old_name(cron, dbname)
        job_name = job_name or default_job_name(dbname)
        rows = cron.execute(
            _CRON_UNSCHEDULE_IN_DATABASE, {"job_name": job_name, "dbname": dbname}
        ).fetchall()
    if old:
        click.echo(f"removed pg_cron job {JOB_NAME} for database {dbname} (its name before 0.3.0)")
    if rows:
        click.echo(f"removed pg_cron job {job_name} for database {dbname}")
    elif not old:
        click.echo(f"no pg_cron job {job_name} for database {dbname}")
