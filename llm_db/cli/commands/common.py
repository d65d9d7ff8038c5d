"""What every subcommand of ``llm-db`` shares: exit codes, one-line errors and the
group that maps exceptions to them, the common options, and the database connection."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, NoReturn

import click
import psycopg
from psycopg.conninfo import conninfo_to_dict

from llm_db import errors

EXIT_OK = 0
#: it ran, and what it found needs attention: health late or failing, a pass that
#: was partial, failed or skipped, notices that could not be delivered
EXIT_PROBLEM = 1
#: the command line is wrong (unknown option, no --dsn and no DATABASE_URL, a webhook
#: secret that is not ``whsec_...``), the worker extra is not installed
#: (``pip install 'llm-db[worker]'``), or the worker has no session for LISTEN.
#: It is click's own code for a bad command line, so nothing else may use it.
EXIT_USAGE = 2
#: a PostgreSQL extension the command needs is missing (pg_cron: LL010, citus: LL011)
EXIT_UNAVAILABLE = 3
#: the database could not be reached, or refused the call (an llm-db error or any
#: other SQL error); the message says which
EXIT_ERROR = 4
#: something the deployment needs is missing: ``health``, no pass has ever
#: completed (before 0.3.0 this was 2, which a monitoring check could not tell
#: from a mistyped command line); ``doctor``, a check is missing (its line says
#: the statement to run)
EXIT_MISSING = 5
#: interrupted (Ctrl-C, SIGTERM)
EXIT_INTERRUPTED = 130
#: ``migrate``: its deadline passed while a step waited for a lock some session held
#: (sysexits' EX_TEMPFAIL: the database works as it is; run it again later)
EXIT_RETRY_LATER = 75


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
    from llm_db.demo import DemoError
    from llm_db.migrate import DeadlineReached, MigrationError
    from llm_db.service.notices import InvalidSecret
    from llm_db.testing._server import ServerSetupError

    if isinstance(exc, MissingExtra | InvalidSecret):
        return Failure(str(exc), EXIT_USAGE, where=where)
    if isinstance(exc, errors.CronNotInstalled | errors.CitusNotInstalled):
        return Failure(_describe_llm_error(exc), EXIT_UNAVAILABLE, where=where)
    if isinstance(exc, errors.LlmError):
        return Failure(_describe_llm_error(exc), EXIT_ERROR, where=where)
    if isinstance(exc, psycopg.Error):
        return Failure(_describe_pg_error(exc), EXIT_ERROR, where=where)
    if isinstance(exc, DeadlineReached):
        return Failure(str(exc), EXIT_RETRY_LATER, where=where)
    if isinstance(exc, MigrationError | ServerSetupError | DemoError):
        return Failure(str(exc), EXIT_ERROR, where=where)
    if isinstance(exc, KeyboardInterrupt):
        return Failure("interrupted", EXIT_INTERRUPTED, where=where)
    return None


class Group(click.Group):
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


def require_dsn(dsn: str | None) -> str:
    if not dsn:
        raise click.UsageError(
            "no database given: pass --dsn DSN or set DATABASE_URL "
            "(a libpq URL such as postgresql://user@host/dbname, or key=value conninfo)"
        )
    return dsn


@contextlib.contextmanager
def connect(dsn: str | None, *, option: str = "--dsn") -> Iterator[psycopg.Connection]:
    """An autocommit connection named after the subcommand (``application_name``),
    preparing no statement on the server (safe behind a transaction pooler)."""
    dsn = require_dsn(dsn)
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


def echo_json(value: Any) -> None:
    from llm_db._text import jsonable

    click.echo(json.dumps(jsonable(value), sort_keys=True))


def exit_with(code: int) -> NoReturn:
    raise click.exceptions.Exit(code)


def figures(pairs: list[tuple[str, Any]], *, indent: int = 2) -> str:
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


def require_extras() -> None:
    """The worker extra (httpx, standardwebhooks, prometheus_client), or exit 2 saying so."""
    from llm_db._extras import WORKER_MODULES, require

    for name in WORKER_MODULES:
        require(name)
