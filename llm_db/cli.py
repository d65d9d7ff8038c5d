"""The ``llm-db`` command line: install, run and watch the books from a shell.

Every subcommand that talks to a database takes ``--dsn`` (default: the
``DATABASE_URL`` environment variable), a libpq URL or key=value conninfo.
Errors are one line on stderr (SQLSTATE, message, DETAIL, HINT), never a
traceback, and the exit code says what happened (see ``EXIT_*``), so each
subcommand can run as it is from cron or a monitoring check.

``python -m llm_db.cli`` is the same program as the ``llm-db`` script (whose
entry point is ``llm_db.__main__``). It is built on click, which comes with the
``cli`` extra: without it, importing this module raises ``MissingExtra`` and
``llm-db`` prints one line naming ``pip install 'llm-db[cli]'`` (exit 2).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn
from uuid import UUID

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from llm_db import errors
from llm_db._extras import missing

try:
    import click
except ModuleNotFoundError as exc:  # the cli extra is not installed
    if exc.name != "click":
        raise
    if __name__ == "__main__":  # python -m llm_db.cli: one line, as llm-db says it
        print(f"llm-db: error: {missing('click')}", file=sys.stderr)
        sys.exit(2)
    raise missing("click") from exc

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PROBLEM",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "main",
]

#: the command did what was asked and found nothing wrong
EXIT_OK = 0
#: it ran, and what it found needs attention: health late or failing, a pass that
#: was partial, failed or skipped, notices that could not be delivered
EXIT_PROBLEM = 1
#: the command line is wrong (unknown option, no --dsn and no DATABASE_URL, a webhook
#: secret that is not ``whsec_...``), the worker extra is not installed
#: (``pip install 'llm-db[worker]'``), or the worker has no session for LISTEN;
#: ``health``: no pass has ever completed
EXIT_USAGE = 2
#: a PostgreSQL extension the command needs is missing (pg_cron: LL010, citus: LL011)
EXIT_UNAVAILABLE = 3
#: the database could not be reached, or refused the call (an llm-db error or any
#: other SQL error); the message says which
EXIT_ERROR = 4
#: interrupted (Ctrl-C, SIGTERM)
EXIT_INTERRUPTED = 130

JOB_NAME = "llm-reconciliation"
JOB_COMMAND = "CALL llm.run_reconciliation()"
DEFAULT_SECRET_ENV = "LLM_DB_WEBHOOK_SECRET"

EPILOG = """\b
Exit codes (the same for every subcommand):
  0    done, nothing wrong
  1    ran, and found something that needs attention (health late or
       failing, a partial/failed/skipped pass, undelivered notices)
  2    bad command line, no database given, a webhook secret that is not
       whsec_..., the worker extra missing (pip install 'llm-db[worker]'),
       or worker without a session for LISTEN; health: no pass ever ran
  3    a needed extension is missing (pg_cron LL010, citus LL011)
  4    database unreachable, or it refused the call (SQLSTATE in the message)
  130  interrupted

\b
Every subcommand takes --dsn, default $DATABASE_URL (except demo, which
starts its own throw-away server unless given --dsn). Run
`llm-db COMMAND --help` for examples.
"""


# ----------------------------------------------------------- errors and exit codes


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


class Failure(click.ClickException):
    """A one-line error on stderr and an exit code; no traceback.

    ``where`` (the command path, e.g. ``llm-db schedule``) defaults to the
    command running when the failure is raised.
    """

    def __init__(self, message: str, exit_code: int = EXIT_ERROR, *, where: str | None = None):
        super().__init__(_one_line(message))
        self.exit_code = exit_code
        if where is None:
            ctx = click.get_current_context(silent=True)
            where = ctx.command_path if ctx is not None else "llm-db"
        self.where = where

    def show(self, file: Any = None) -> None:
        click.echo(f"{self.where}: error: {self.format_message()}", err=True, file=file)


def _describe_llm_error(exc: errors.LlmError) -> str:
    parts = [f"{exc.sqlstate} {exc.message}" if exc.sqlstate else exc.message]
    if exc.detail:
        parts.append(f"DETAIL: {exc.detail}")
    if exc.hint:
        parts.append(f"HINT: {exc.hint}")
    return " ".join(_one_line(p) for p in parts)


# undefined schema, function, table: what calling llm.* in a database without llm-db raises
_NOT_INSTALLED_STATES = frozenset({"3F000", "42883", "42P01"})


def _describe_pg_error(exc: psycopg.Error) -> str:
    diag = exc.diag
    message = diag.message_primary or str(exc)
    parts = [f"{exc.sqlstate} {message}" if exc.sqlstate else message]
    if diag.message_detail:
        parts.append(f"DETAIL: {diag.message_detail}")
    if diag.message_hint:
        parts.append(f"HINT: {diag.message_hint}")
    elif exc.sqlstate in _NOT_INSTALLED_STATES:
        parts.append(
            "HINT: is llm-db installed in this database? Run llm-db migrate --dsn ... first."
        )
    return " ".join(_one_line(p) for p in parts)


def _failure_for(exc: BaseException, where: str) -> Failure | None:
    """The Failure an exception from a subcommand becomes (None: not ours to map)."""
    from llm_db._extras import MissingExtra
    from llm_db._server import ServerSetupError
    from llm_db.demo import DemoError
    from llm_db.migrate import MigrationError
    from llm_db.notices import InvalidSecret

    if isinstance(exc, MissingExtra | InvalidSecret):
        return Failure(str(exc), EXIT_USAGE, where=where)
    if isinstance(exc, errors.CronNotInstalled | errors.CitusNotInstalled):
        return Failure(_describe_llm_error(exc), EXIT_UNAVAILABLE, where=where)
    if isinstance(exc, errors.LlmError):
        return Failure(_describe_llm_error(exc), EXIT_ERROR, where=where)
    if isinstance(exc, psycopg.Error):
        return Failure(_describe_pg_error(exc), EXIT_ERROR, where=where)
    if isinstance(exc, MigrationError | ServerSetupError | DemoError):
        return Failure(str(exc), EXIT_ERROR, where=where)
    if isinstance(exc, KeyboardInterrupt):
        return Failure("interrupted", EXIT_INTERRUPTED, where=where)
    return None


class _Group(click.Group):
    """A click group that turns llm-db and psycopg errors into ``Failure``."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except (Exception, KeyboardInterrupt) as exc:
            where = " ".join(filter(None, (ctx.command_path, ctx.invoked_subcommand)))
            failure = _failure_for(exc, where)
            if failure is None:
                raise
            raise failure from exc


# ----------------------------------------------------------- shared options


class _Timestamp(click.ParamType):
    """An ISO 8601 timestamp; without a zone it is UTC."""

    name = "TIMESTAMP"

    def convert(self, value: Any, param: Any, ctx: Any) -> datetime:
        if isinstance(value, datetime):
            moment = value
        else:
            try:
                moment = datetime.fromisoformat(str(value).strip())
            except ValueError:
                self.fail(
                    f"{value!r} is not an ISO 8601 timestamp (e.g. 2026-01-15T12:00:00Z)",
                    param,
                    ctx,
                )
        return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


TIMESTAMP = _Timestamp()


def dsn_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--dsn",
        envvar="DATABASE_URL",
        show_envvar=True,
        metavar="DSN",
        help="libpq URL (postgresql://user@host/db) or key=value conninfo of the llm database.",
    )(f)


def now_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--now",
        type=TIMESTAMP,
        default=None,
        help="The clock to use instead of the server's now() (ISO 8601; UTC if no zone). "
        "For tests and tooling.",
    )(f)


def json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(f)


def _require_dsn(dsn: str | None) -> str:
    if not dsn:
        raise click.UsageError(
            "no database given: pass --dsn DSN or set DATABASE_URL "
            "(a libpq URL such as postgresql://user@host/dbname, or key=value conninfo)"
        )
    return dsn


@contextlib.contextmanager
def _connect(dsn: str | None, *, option: str = "--dsn") -> Iterator[psycopg.Connection]:
    """An autocommit connection named after the subcommand (``application_name``),
    preparing no statement on the server (safe behind a transaction pooler)."""
    dsn = _require_dsn(dsn)
    try:
        given = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise click.BadParameter(_one_line(str(exc)), param_hint=option) from None
    extra: dict[str, Any] = {}
    if "application_name" not in given and "PGAPPNAME" not in os.environ:
        ctx = click.get_current_context(silent=True)
        extra["application_name"] = (ctx.command_path if ctx else "llm-db")[:63]
    if "connect_timeout" not in given and "PGCONNECT_TIMEOUT" not in os.environ:
        extra["connect_timeout"] = 10
    try:
        # prepare_threshold=None: nothing prepared on the server, so every
        # subcommand also works through PgBouncer in transaction pooling mode
        conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=None, **extra)
    except psycopg.OperationalError as exc:
        raise Failure(f"cannot connect ({option}): {exc}", EXIT_ERROR) from exc
    with conn:
        yield conn


def _echo_json(value: Any) -> None:
    from llm_db.report import jsonable

    click.echo(json.dumps(jsonable(value), sort_keys=True))


def _exit(code: int) -> NoReturn:
    raise click.exceptions.Exit(code)


def _figures(pairs: list[tuple[str, Any]], *, indent: int = 2) -> str:
    """``label  value`` lines, labels padded to one width, integers with separators."""
    width = max(len(label) for label, _ in pairs)
    texts = [
        f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
        for _, value in pairs
    ]
    numbers = max(
        (len(t) for t, (_, v) in zip(texts, pairs, strict=True) if type(v) is int), default=0
    )
    lines = []
    for (label, value), text in zip(pairs, texts, strict=True):
        if type(value) is int:
            text = text.rjust(numbers)
        lines.append(f"{' ' * indent}{label.ljust(width)}  {text}")
    return "\n".join(lines)


# ----------------------------------------------------------- the group


@click.group(
    cls=_Group,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=EPILOG,
)
@click.version_option(package_name="llm-db")
def main() -> None:
    """llm-db: the books for LLM usage of a multi-tenant platform, kept in PostgreSQL.

    \b
    Install into a database, then schedule the hourly pass:
      llm-db migrate   --dsn postgresql://owner@db/app
      llm-db schedule  --dsn postgresql://owner@db/app
    Watch it:
      llm-db health    --dsn ...      # exit 0 ok, 1 late/failing, 2 never
      llm-db metrics   --dsn ...      # Prometheus text format
      llm-db report    --dsn ... --days 7
    Deliver threshold notices to a webhook, continuously:
      llm-db worker    --dsn ... --url https://hooks.example.com/llm
    See it work end to end on a throw-away server:
      llm-db demo
    """


# ----------------------------------------------------------- migrate


@main.command(short_help="Install or upgrade the llm schema.")
@dsn_option
def migrate(dsn: str | None) -> None:
    """Install or upgrade the llm schema: migrations/ with yoyo, then every sql/ file.

    Safe to re-run and to run from two deploys at once. Run it as the role that
    should own the schema.

    \b
    Examples:
      llm-db migrate --dsn postgresql://owner@db.internal/app
      DATABASE_URL='host=/var/run/postgresql dbname=app' llm-db migrate
    """
    from llm_db.migrate import migrate as run_migrate

    report = run_migrate(_require_dsn(dsn))
    applied = ", ".join(report.applied_migrations) or "none"
    click.echo(f"migrations applied: {applied}")
    click.echo(f"sql files applied: {len(report.sql_files)}")
    if report.dropped_routines:
        click.echo(f"routines dropped (no longer defined): {', '.join(report.dropped_routines)}")


# ----------------------------------------------------------- reconcile


# The figures of a pass (llm.reconciliation_runs) and of one organization's sweep
# (llm.org_sweep), each labelled once: (label, field of the run, field of the sweep),
# None where one of them has no such figure; printed in this order.
_SWEEP_FIGURES = (
    ("organizations visited", "orgs_visited", None),
    ("organizations failed", "orgs_failed", None),
    ("requests recovered", "requests_recovered", "recovered_requests"),
    ("hold credits released", "released_hold_credits", "released_hold_credits"),
    ("past-window alerts", "past_window_alerts", "past_window_alerts"),
    ("tasks abandoned", "executions_abandoned", "abandoned_executions"),
    ("drift findings", "drift_findings", "drift_findings"),
    ("notices created", None, "notices_created"),
    ("notices re-armed", "notices_rearmed", None),
    ("daily usage rows rebuilt", "daily_rows_rebuilt", None),
    ("organizations with more pending", "more_pending_orgs", None),
    ("more pending", None, "more_pending"),
)


def _sweep_figures(row: Any, *, of_run: bool) -> list[tuple[str, Any]]:
    """The labelled figures of a pass's run row (``of_run``) or of one sweep."""
    pairs = []
    for label, run_field, sweep_field in _SWEEP_FIGURES:
        field = run_field if of_run else sweep_field
        if field is not None:
            value = getattr(row, field)
            pairs.append((label, ("yes" if value else "no") if isinstance(value, bool) else value))
    return pairs


def _pass_with_progress(dsn: str, now: datetime | None, batch: int | None) -> Any:
    """CALL the pass on one connection while another one watches its run row
    (the procedure commits after each organization) and moves a progress bar."""
    from llm_db import queries
    from llm_db.report import OPERATIONAL_ORGANIZATIONS, RUN_PROGRESS
    from llm_db.requests import Llm

    with _connect(dsn) as watcher, _connect(dsn) as worker:
        with watcher.cursor(row_factory=dict_row) as cur:
            total = cur.execute(OPERATIONAL_ORGANIZATIONS).fetchone()["organizations"]
            since = cur.execute(queries.CLOCK).fetchone()["clock"]
        outcome: dict[str, Any] = {}

        def work() -> None:
            try:
                outcome["run"] = Llm(worker).run_reconciliation(now=now, batch=batch)
            except BaseException as exc:  # handed to the main thread
                outcome["error"] = exc

        thread = threading.Thread(target=work, name="llm-db reconcile", daemon=True)
        thread.start()
        try:
            with click.progressbar(length=max(total, 1), label="organizations") as bar:
                shown = 0
                while thread.is_alive():
                    thread.join(0.2)
                    row = watcher.execute(RUN_PROGRESS, {"since": since}).fetchone()
                    visited = min(row[0], total) if row else shown
                    bar.update(visited - shown)
                    shown = visited
                bar.update(max(total, 1) - shown)
        except BaseException:
            worker.cancel_safe(timeout=5)
            thread.join(10)
            raise
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("run")


@main.command(short_help="Run one reconciliation pass now.")
@dsn_option
@click.option(
    "--org",
    "organization_id",
    type=click.UUID,
    default=None,
    help="Sweep only this organization (llm.reconcile_org), in one transaction.",
)
@now_option
@click.option(
    "--batch",
    type=click.IntRange(1, 100000),
    default=None,
    help="Requests recovered per organization (default: llm.settings.sweep_batch, 200).",
)
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bar over organizations (default: when stdout is a terminal).",
)
@json_option
def reconcile(
    dsn: str | None,
    organization_id: UUID | None,
    now: datetime | None,
    batch: int | None,
    progress: bool | None,
    as_json: bool,
) -> None:
    """Run one reconciliation pass now, as the hourly pg_cron job does.

    CALL llm.run_reconciliation(): recovers requests unsettled after the
    recovery window (24 h) at their estimate and releases their holds,
    abandons stale tasks, refreshes drift findings, re-arms owed notices and
    rebuilds daily usage; prints the figures of the llm.reconciliation_runs row
    it recorded. Exit 0 when the pass succeeded, 1 when it was partial, failed
    or skipped (another pass was running).

    \b
    Examples:
      llm-db reconcile --dsn postgresql://ops@db/app
      llm-db reconcile --org 0b6f2d1e-... --batch 1000      # one tenant, bigger batch
      llm-db reconcile --now 2026-02-01T00:00:00Z --json    # a moved clock (tests)
    """
    from llm_db.requests import Llm

    dsn = _require_dsn(dsn)
    if organization_id is not None:
        with _connect(dsn) as conn:
            sweep = Llm(conn).reconcile_org(organization_id, now=now, batch=batch)
        if as_json:
            _echo_json(dataclasses.asdict(sweep))
        else:
            click.echo(f"organization {sweep.organization_id} swept")
            click.echo(_figures(_sweep_figures(sweep, of_run=False)))
        return

    if progress is None:
        progress = sys.stdout.isatty() and not as_json
    if progress:
        run = _pass_with_progress(dsn, now, batch)
    else:
        with _connect(dsn) as conn:
            run = Llm(conn).run_reconciliation(now=now, batch=batch)
    if run is None:
        raise Failure("the pass recorded no llm.reconciliation_runs row", EXIT_ERROR)
    _echo_run(run, as_json)
    _exit(EXIT_OK if run.status == "succeeded" else EXIT_PROBLEM)


def _echo_run(run: Any, as_json: bool) -> None:
    """A pass's llm.reconciliation_runs row: its figures and errors, or as JSON."""
    if as_json:
        _echo_json(dataclasses.asdict(run))
        return
    duration = (run.finished_at - run.started_at).total_seconds() if run.finished_at else 0.0
    click.echo(
        f"pass {run.id} {run.status} in {duration:.2f} s (clock {run.clock:%Y-%m-%d %H:%M:%S %Z})"
    )
    if run.status == "skipped":
        click.echo("  another reconciliation pass is running; this one did nothing")
        return
    click.echo(_figures(_sweep_figures(run, of_run=True)))
    for error in run.errors:
        where = " ".join(
            f"{k}={error[k]}" for k in ("step", "organization_id", "sqlstate") if error.get(k)
        )
        click.echo(f"  error: {where}: {error.get('error')}")


# ----------------------------------------------------------- health


@main.command(short_help="The missing-run alarm: exit 0 ok, 1 late/failing, 2 never.")
@dsn_option
@now_option
@json_option
def health(dsn: str | None, now: datetime | None, as_json: bool) -> None:
    """The missing-run alarm: is the hourly pass running? Made for monitoring checks.

    Prints llm.reconciliation_health(): status, last success, last run, detail.

    \b
    Exit code:
      0  ok       a pass completed within settings.health_max_age (2 h), no errors
      1  late     the last completed pass is older than that: check the pg_cron job
      1  failing  the last pass recorded errors: see llm.reconciliation_runs.errors
      2  never    no pass has ever completed: run llm-db schedule

    \b
    Examples:
      llm-db health --dsn postgresql://monitor@db/app
      llm-db health --json
      llm-db health --now 2026-01-15T15:00:00Z      # as if it were then
    """
    from llm_db.requests import Llm

    with _connect(dsn) as conn:
        result = Llm(conn).health(now=now)
    if as_json:
        _echo_json(dataclasses.asdict(result))
    else:
        last_success = (
            "never"
            if result.last_success_at is None
            else f"{result.last_success_at:%Y-%m-%d %H:%M:%S %Z}"
        )
        click.echo(
            _figures(
                [
                    ("status", result.status),
                    ("last success", last_success),
                    ("last run", result.last_run_status or "-"),
                    ("detail", result.detail),
                ],
                indent=0,
            )
        )
    _exit({"ok": EXIT_OK, "never": EXIT_USAGE}.get(result.status, EXIT_PROBLEM))


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
    with _connect(dsn) as conn:
        installed, dbname = conn.execute(_LLM_INSTALLED).fetchone()
    if not installed:
        raise Failure(
            f"llm-db is not installed in database {dbname}: run llm-db migrate --dsn ... first",
            EXIT_ERROR,
        )
    return dbname


@contextlib.contextmanager
def _cron_database(cron_dsn: str) -> Iterator[psycopg.Connection]:
    with _connect(cron_dsn, option="--cron-dsn") as cron:
        if not cron.execute(_CRON_INSTALLED).fetchone()[0]:
            raise Failure(
                f"LL010 pg_cron is not installed in the --cron-dsn database {cron.info.dbname} "
                "HINT: connect --cron-dsn to the database named by the server setting "
                "cron.database_name, where CREATE EXTENSION pg_cron was run",
                EXIT_UNAVAILABLE,
            )
        yield cron


@main.command(short_help="Schedule the hourly pass with pg_cron.")
@dsn_option
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
        with _connect(dsn) as conn:
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


@main.command(short_help="Remove the pg_cron job of the hourly pass.")
@dsn_option
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
        with _connect(dsn) as conn:
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


# ----------------------------------------------------------- notices


def _require_extras() -> None:
    """The worker extra (httpx, standardwebhooks, prometheus_client), or exit 2 saying so."""
    from llm_db._extras import WORKER_MODULES, require

    for name in WORKER_MODULES:
        require(name)


def _webhook_secrets(secret_env: str) -> list[str]:
    """The whsec_ secrets in $secret_env (several separated by spaces), or exit 2."""
    from llm_db.notices import parse_secrets

    value = os.environ.get(secret_env)
    if not value or not value.strip():
        raise click.UsageError(
            f"environment variable {secret_env} is not set: the webhook secret is read from the "
            "environment (--secret-env NAME), never from the command line; make one with "
            "`llm-db notices new-secret`"
        )
    return parse_secrets(value)  # InvalidSecret: exit 2, saying how to make one


def _check_http_url(url: str) -> None:
    if not re.match(r"^https?://", url, re.IGNORECASE):
        raise click.BadParameter(f"{url!r} is not an http(s) URL", param_hint="--url")


def url_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--url", required=True,
                        help="http(s) URL the notices are POSTed to, as JSON.")(f)  # fmt: skip


def secret_env_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--secret-env",
        default=DEFAULT_SECRET_ENV,
        show_default=True,
        metavar="NAME",
        help="Environment variable holding the Standard Webhooks secret, whsec_... (several, "
        "separated by spaces, while rotating: one signature each). Never the secret itself.",
    )(f)


@main.group(cls=_Group, short_help="Deliver threshold notices to a webhook.")
def notices() -> None:
    """Threshold notices (80 %, 100 % of the allowance): deliver them to a webhook.

    Deliveries follow Standard Webhooks (standardwebhooks.com): headers
    webhook-id (the notice id, the same on every retry), webhook-timestamp and
    webhook-signature (v1,<base64 HMAC-SHA256 of id.timestamp.body>, one per
    secret). For continuous delivery run `llm-db worker`.
    """


@notices.command("deliver", short_help="Claim due notices and POST them, signed; one run.")
@dsn_option
@url_option
@secret_env_option
@click.option("--limit", type=click.IntRange(1, 10000), default=50, show_default=True,
              help="Notices claimed in this run.")  # fmt: skip
@click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds for the connect and for each read and write.")  # fmt: skip
@now_option
@json_option
def notices_deliver(
    dsn: str | None,
    url: str,
    secret_env: str,
    limit: int,
    timeout: float,
    now: datetime | None,
    as_json: bool,
) -> None:
    """Claim due notices and POST each, signed, to --url; one run.

    Each POST is signed as Standard Webhooks with every secret in the
    environment variable --secret-env (a receiver verifies with the
    standardwebhooks package, or llm_db.notices.verify_webhook). A 2xx marks the
    notice sent; anything else leaves it owed with the error and a backoff, for
    a later run. Exit 0 when every claimed notice was delivered (or none was
    due), 1 when some were not, 2 when the secret is not whsec_... (make one with
    `llm-db notices new-secret`) or the worker extra is missing.

    \b
    Examples:
      export LLM_DB_WEBHOOK_SECRET=whsec_...       # from your secret store
      llm-db notices deliver --dsn ... --url https://hooks.example.com/llm
      # while rotating: both secrets, each delivery signed with each
      LLM_DB_WEBHOOK_SECRET="whsec_new... whsec_old..." llm-db notices deliver --url ...
    """
    dsn = _require_dsn(dsn)
    _require_extras()
    secrets = _webhook_secrets(secret_env)
    _check_http_url(url)
    from llm_db.notices import deliver_notices
    from llm_db.requests import Llm

    with _connect(dsn) as conn:
        summary = deliver_notices(Llm(conn), url, secrets, limit=limit, timeout=timeout, now=now)
    if as_json:
        _echo_json(dataclasses.asdict(summary))
    else:
        line = f"claimed {summary.claimed}, sent {summary.sent}, failed {summary.failed}"
        if summary.last_error:
            line += f"; last error: {summary.last_error}"
        click.echo(line)
    _exit(EXIT_PROBLEM if summary.failed else EXIT_OK)


@notices.command("new-secret", short_help="Print a fresh whsec_ webhook secret.")
@click.option("--bytes", "nbytes", type=click.IntRange(24, 64), default=32, show_default=True,
              help="Random bytes in the secret (Standard Webhooks: 24 to 64).")  # fmt: skip
def notices_new_secret(nbytes: int) -> None:
    """Print a fresh random secret in the Standard Webhooks form whsec_<base64>.

    Give it to the receiver and put it in the deliverer's environment. To rotate
    without a gap: set the variable to "NEW OLD" (both signed), switch the
    receiver to NEW, then drop OLD.

    \b
    Examples:
      llm-db notices new-secret
      export LLM_DB_WEBHOOK_SECRET="$(llm-db notices new-secret)"
    """
    from llm_db.notices import new_secret

    click.echo(new_secret(nbytes))


# ----------------------------------------------------------- worker


class _Address(click.ParamType):
    name = "HOST:PORT"

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[str, int]:
        from llm_db.worker import parse_address

        if isinstance(value, tuple):
            return value
        try:
            return parse_address(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


@main.command(short_help="Deliver notices continuously; serve /metrics and /healthz.")
@dsn_option
@url_option
@secret_env_option
@click.option("--metrics-addr", type=_Address(), default="127.0.0.1:9187", show_default=True,
              help="Where /metrics and /healthz are served (port 0: any free port).")  # fmt: skip
@click.option("--poll", type=click.FloatRange(min=0.05), default=30.0, show_default=True,
              help="Seconds between looks for due notices when no NOTIFY arrives.")  # fmt: skip
@click.option("--limit", type=click.IntRange(1, 1000), default=10, show_default=True,
              help="Notices claimed at a time.")  # fmt: skip
@click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds for the connect and for each read and write of a POST; "
              "--limit x --timeout must stay below llm.settings.notice_claim_timeout.")
@click.option("--log-json", is_flag=True, help="Log one JSON object per line instead of text.")
def worker(
    dsn: str | None,
    url: str,
    secret_env: str,
    metrics_addr: tuple[str, int],
    poll: float,
    limit: int,
    timeout: float,
    log_json: bool,
) -> None:
    """Deliver threshold notices continuously, and serve /metrics and /healthz.

    A long-running process. It LISTENs on channel llm_notices: the transaction
    that makes a notice owed (a settlement or recovery crossing a threshold, a
    retry, a release, a re-arm) notifies at commit, and the worker delivers at
    once; --poll is the fallback (under Citus the only path). Each POST is
    signed as Standard Webhooks; a failure leaves the notice owed with a
    backoff. /metrics is the `llm-db metrics` exposition plus
    llm_notice_deliveries_total{outcome}; /healthz is 200 when the database
    answers and the pass is healthy, 503 otherwise.

    SIGTERM or SIGINT: the notice being POSTed is finished, every other claimed
    notice is released (owed, due at once), exit 0. It needs a session of its
    own for LISTEN: a direct connection, or PgBouncer in session mode (exit 2
    otherwise). Exit 4 when the database cannot be reached at start; later
    outages are logged and retried. One log line per event on stderr.

    \b
    Examples:
      export LLM_DB_WEBHOOK_SECRET=whsec_...
      llm-db worker --dsn postgresql://notifier@db/app --url https://hooks.example.com/llm
      llm-db worker --url https://hooks.example.com/llm --metrics-addr 0.0.0.0:9187 --log-json
    """
    dsn = _require_dsn(dsn)
    _require_extras()
    secrets = _webhook_secrets(secret_env)
    _check_http_url(url)
    from llm_db.worker import ConfigError, SessionRequired, Worker, WorkerConfig

    config = WorkerConfig(
        dsn=dsn, url=url, secrets=secrets, metrics_addr=metrics_addr, poll=poll, limit=limit,
        timeout=timeout, log_json=log_json,
    )  # fmt: skip
    try:
        code = Worker(config).run()
    except (ConfigError, SessionRequired) as exc:
        raise Failure(str(exc), EXIT_USAGE) from exc
    except psycopg.OperationalError as exc:
        raise Failure(f"cannot connect (--dsn): {exc}", EXIT_ERROR) from exc
    _exit(code)


# ----------------------------------------------------------- report


@main.command(short_help="Usage per organization and day, open holds, tasks by status.")
@dsn_option
@click.option("--org", "organization_id", type=click.UUID, default=None,
              help="Only this organization.")  # fmt: skip
@click.option("--days", type=click.IntRange(1, 3660), default=7, show_default=True,
              help="UTC days to cover, ending today.")  # fmt: skip
@now_option
@json_option
def report(
    dsn: str | None, organization_id: UUID | None, days: int, now: datetime | None, as_json: bool
) -> None:
    """Period usage per organization, daily usage, open holds and tasks by status.

    Reads tables only (llm_reader is enough). Periods overlapping the days,
    daily usage by settlement day, requests still holding credits (and how
    many are past the recovery window), tasks started in the days plus every
    running task.

    \b
    Examples:
      llm-db report --dsn postgresql://analytics@db/app
      llm-db report --org 0b6f2d1e-... --days 31
      llm-db report --json | jq '.periods[] | {name, used_credits}'
    """
    from llm_db.report import build_report, render_report, report_json

    with _connect(dsn) as conn:
        result = build_report(conn, days=days, organization_id=organization_id, now=now)
    if as_json:
        click.echo(json.dumps(report_json(result), sort_keys=True))
    else:
        click.echo(render_report(result))


# ----------------------------------------------------------- metrics


@main.command(short_help="Prometheus exposition: pass health, last run, stale work.")
@dsn_option
@now_option
@click.option(
    "--output",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    help="Write to this file atomically (node_exporter textfile collector) instead of stdout.",
)
def metrics(dsn: str | None, now: datetime | None, output: Path | None) -> None:
    """Prometheus text exposition: pass health, last run figures and age, stale work.

    Gauges: llm_up (1: the database was read; 0: it could not be, exit 4, and
    --output still replaces the file so a stale "ok" never stays behind),
    llm_scrape_duration_seconds, llm_reconciliation_health{status},
    llm_reconciliation_last_run_* (figures, status, duration, age_seconds; all 0
    before the first pass), llm_stale_open_requests (older than the recovery
    window: should be 0 after a pass), llm_open_requests, llm_open_hold_credits,
    llm_running_tasks, llm_drift_findings, llm_notices{status}. `llm-db worker`
    serves the same at /metrics. Needs the worker extra (prometheus_client).

    \b
    Examples:
      llm-db metrics --dsn postgresql://monitor@db/app
      # node_exporter textfile collector, every minute from cron:
      * * * * * llm-db metrics --output /var/lib/node_exporter/textfile/llm.prom
    """
    _require_extras()
    from llm_db.metrics import scrape

    result = scrape(lambda: _connect(dsn), now=now, catch=(psycopg.Error, Failure))
    if output is None:
        click.echo(result.text.decode(), nl=False)
    else:
        _write_atomically(output, result.text)
    if result.error is not None:
        raise result.error


def _write_atomically(output: Path, text: bytes) -> None:
    output = output.resolve()
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, output)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ----------------------------------------------------------- distribute


@main.command(short_help="Shard the schema with Citus (llm.distribute()).")
@dsn_option
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

    with _connect(dsn) as conn:
        done = Llm(conn).distribute(shard_count)
    click.echo(f"distributed: {done}")


# ----------------------------------------------------------- demo


@main.command(short_help="The main job end to end, on a throw-away server.")
@click.option(
    "--dsn",
    default=None,
    metavar="DSN",
    help="Use this database instead of a throw-away server (DATABASE_URL is NOT read: the demo "
    "runs a reconciliation pass there).",
)
@click.option("--seed", type=int, default=7, show_default=True, help="Random seed of the traffic.")
@click.option("--workers", type=click.IntRange(1, 32), default=6, show_default=True,
              help="Worker threads sending traffic.")  # fmt: skip
@json_option
def demo(dsn: str | None, seed: int, workers: int, as_json: bool) -> None:
    """See llm-db do its job, end to end, in a few seconds.

    Starts a throw-away PostgreSQL 15 with pg_cron, installs llm-db, creates
    three organizations (a small allowance, unlimited, suspended), sends a day
    of traffic from worker threads of which some crash after dispatching a
    request, leaves one task running and injects one accounting fault; then
    moves the clock 25 h on, runs the hourly pass and shows the books before
    and after. The server is stopped at the end, also on Ctrl-C.

    With --dsn it uses that database instead (it must be migrated): it creates
    demo organizations with fresh ids and runs one real pass there, at the real
    time, as the hourly job would.

    \b
    Examples:
      llm-db demo
      llm-db demo --seed 42 --workers 8
      llm-db demo --json | tail -n 1 | jq .after     # the figures, for machines
    """
    from llm_db.demo import run_demo

    result = run_demo(dsn=dsn, seed=seed, workers=workers, out=click.echo)
    if as_json:
        _echo_json(result)
    if result["invariant_violations"]:
        _exit(EXIT_PROBLEM)


if __name__ == "__main__":
    main(prog_name="llm-db")
