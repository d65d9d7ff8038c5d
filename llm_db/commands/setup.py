"""``llm-db migrate``, ``distribute``, ``schedule`` and ``unschedule``: install the
schema, shard it with Citus, and put the hourly pass under pg_cron."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator

import click
import psycopg

from llm_db.commands import common
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
    """Install or upgrade the llm schema: migrations/ with yoyo, then every sql/ file.

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
    from llm_db.requests import Llm

    with common.connect(dsn) as conn:
        done = Llm(conn).distribute(shard_count)
    click.echo(f"distributed: {done}")


# ----------------------------------------------------------- schedule / unschedule

_CRON_SCHEDULE_IN_DATABASE = """
SELECT cron.schedule_in_database(%(job_name)s::text, %(schedule)s::text, %(command)s::text,
                                 %(dbname)s::text) AS job_id
"""
_CRON_UNSCHEDULE_IN_DATABASE = """
SELECT cron.unschedule(j.jobid) AS removed
  FROM cron.job AS j
 WHERE j.jobname = %(job_name)s::text AND j.database = %(dbname)s::text
"""
_CRON_INSTALLED = "SELECT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'pg_cron')"
_LLM_INSTALLED = (
    "SELECT pg_catalog.to_regproc('llm.run_reconciliation') IS NOT NULL AS installed, "
    "pg_catalog.current_database() AS dbname"
)


def _llm_database(dsn: str | None) -> str:
    with common.connect(dsn) as conn:
        installed, dbname = conn.execute(_LLM_INSTALLED).fetchone()
    if not installed:
        raise common.Failure(
            f"llm-db is not installed in database {dbname}: run llm-db migrate --dsn ... first",
            common.EXIT_ERROR,
        )
    return dbname


@contextlib.contextmanager
def _cron_database(cron_dsn: str) -> Iterator[psycopg.Connection]:
    with common.connect(cron_dsn, option="--cron-dsn") as cron:
        if not cron.execute(_CRON_INSTALLED).fetchone()[0]:
            raise common.Failure(
                f"LL010 pg_cron is not installed in the --cron-dsn database {cron.info.dbname} "
                "HINT: connect --cron-dsn to the database named by the server setting "
                "cron.database_name, where CREATE EXTENSION pg_cron was run",
                common.EXIT_UNAVAILABLE,
            )
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
    default=JOB_NAME,
    show_default=True,
    help="pg_cron job name (with --cron-dsn: give each llm database its own).",
)
def schedule(dsn: str | None, schedule: str, cron_dsn: str | None, job_name: str) -> None:
    """Schedule the hourly pass with pg_cron (idempotent: reschedules the same job).

    pg_cron runs jobs from one database, the server's cron.database_name.
    When llm-db is installed in that database, this runs
    llm.schedule_reconciliation(). When it is installed elsewhere, give the
    cron database with --cron-dsn and this runs
    cron.schedule_in_database(job, schedule, 'CALL llm.run_reconciliation()',
    <the llm database>) there. Without pg_cron: LL010 with the statement to
    run, exit 3.

    \b
    Examples:
      llm-db schedule --dsn postgresql://owner@db/app
      llm-db schedule --dsn postgresql://owner@db/app --schedule '*/30 * * * *'
      llm-db schedule --dsn postgresql://owner@db/app --cron-dsn postgresql://owner@db/postgres
    """
    from llm_db.requests import Llm

    if cron_dsn is None:
        if job_name != JOB_NAME:
            raise click.UsageError("--job-name needs --cron-dsn (in-database jobs are named "
                                   f"{JOB_NAME})")  # fmt: skip
        with common.connect(dsn) as conn:
            job_id = Llm(conn).schedule_reconciliation(schedule)
            dbname = conn.info.dbname
        click.echo(f"scheduled pg_cron job {JOB_NAME} (id {job_id}): {schedule!r} runs "
                   f"{JOB_COMMAND} in database {dbname}")  # fmt: skip
        return
    dbname = _llm_database(dsn)
    with _cron_database(cron_dsn) as cron:
        job_id = cron.execute(
            _CRON_SCHEDULE_IN_DATABASE,
            {"job_name": job_name, "schedule": schedule, "command": JOB_COMMAND, "dbname": dbname},
        ).fetchone()[0]
        click.echo(
            f"scheduled pg_cron job {job_name} (id {job_id}) in database {cron.info.dbname}: "
            f"{schedule!r} runs {JOB_COMMAND} in database {dbname}"
        )


@click.command(short_help="Remove the pg_cron job of the hourly pass.")
@common.dsn_option
@click.option(
    "--cron-dsn", default=None, metavar="DSN", help="The pg_cron database, as for schedule."
)
@click.option("--job-name", default=JOB_NAME, show_default=True, help="pg_cron job name.")
def unschedule(dsn: str | None, cron_dsn: str | None, job_name: str) -> None:
    """Remove the pg_cron job of the hourly pass (exit 0 also when there was none).

    \b
    Examples:
      llm-db unschedule --dsn postgresql://owner@db/app
      llm-db unschedule --dsn postgresql://owner@db/app --cron-dsn postgresql://owner@db/postgres
    """
    from llm_db.requests import Llm

    if cron_dsn is None:
        with common.connect(dsn) as conn:
            removed = Llm(conn).unschedule_reconciliation()
        click.echo(f"removed pg_cron job {JOB_NAME}" if removed else f"no pg_cron job {JOB_NAME}")
        return
    dbname = _llm_database(dsn)
    with _cron_database(cron_dsn) as cron:
        rows = cron.execute(
            _CRON_UNSCHEDULE_IN_DATABASE, {"job_name": job_name, "dbname": dbname}
        ).fetchall()
    if rows:
        click.echo(f"removed pg_cron job {job_name} for database {dbname}")
    else:
        click.echo(f"no pg_cron job {job_name} for database {dbname}")
