"""The ``llm-db`` command line: install, run and watch the books from a shell.

Every subcommand that talks to a database takes ``--dsn`` (default: the
``DATABASE_URL`` environment variable), a libpq URL or key=value conninfo.
Errors are one line on stderr (SQLSTATE, message, DETAIL, HINT), never a
traceback, and the exit code says what happened (see ``EXIT_*``), so each
subcommand can run as it is from cron or a monitoring check.

It is built on click, which comes with the ``cli`` extra: without it,
importing this module raises ``MissingExtra`` and ``llm-db`` prints one line
naming ``pip install 'llm-db[cli]'`` (exit 2).

This module is the group (``llm_db.cli.main``); the subcommands live in
``llm_db/cli/commands/``.
"""

from __future__ import annotations

from llm_db._extras import missing

try:
    import click
except ModuleNotFoundError as exc:  # the cli extra is not installed
    if exc.name != "click":
        raise
    raise missing("click") from exc

# the subcommands (one module a theme, llm_db/cli/commands/) need click: imported after it
from llm_db.cli.commands import demo, doctor, notices, passes, prices, reports, setup  # noqa: E402
from llm_db.cli.commands.common import (  # noqa: E402
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_MISSING,
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    Group,
)

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_MISSING",
    "EXIT_OK",
    "EXIT_PROBLEM",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "main",
]


EPILOG = """\b
Exit codes (the same for every subcommand):
  0    done, nothing wrong
  1    ran, and found something that needs attention (health late or
       failing, a partial/failed/skipped pass, undelivered notices)
  2    bad command line, no database given, a webhook secret that is not
       whsec_..., the worker extra missing (pip install 'llm-db[worker]'),
       or worker without a session for LISTEN
  3    a needed extension is missing (pg_cron LL010, citus LL011)
  4    database unreachable, or it refused the call (SQLSTATE in the message)
  5    health: no pass has ever completed; doctor: something llm-db needs
       is missing (each line says what to run)
  130  interrupted

\b
Every subcommand takes --dsn, default $DATABASE_URL (except demo, which
starts its own throw-away server unless given --dsn). Run
`llm-db COMMAND --help` for examples.
"""


# ----------------------------------------------------------- the group


@click.group(
    cls=Group,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=EPILOG,
)
@click.version_option(package_name="llm-db")
def main() -> None:
    """llm-db: the books for LLM usage of a multi-tenant platform, kept in PostgreSQL.

    \b
    Check a database first (managed PostgreSQL: grants, pg_cron, poolers):
      llm-db doctor    --dsn postgresql://owner@db/app
    Install into a database, then schedule the hourly pass:
      llm-db migrate   --dsn postgresql://owner@db/app
      llm-db schedule  --dsn postgresql://owner@db/app
    Watch it:
      llm-db health    --dsn ...      # exit 0 ok, 1 late/failing, 5 never
      llm-db metrics   --dsn ...      # Prometheus text format
      llm-db report    --dsn ... --days 7
    Price every request from the provider's usage:
      llm-db prices import model_prices_and_context_window.json --model gpt-4o
    Deliver threshold notices to a webhook, continuously:
      llm-db worker    --dsn ... --url https://hooks.example.com/llm
    See it work end to end on a throw-away server:
      llm-db demo
    """


for _command in (
    setup.migrate, setup.distribute, setup.schedule, setup.unschedule, doctor.doctor,
    passes.reconcile, passes.health,
    notices.notices, notices.worker,
    reports.report, reports.metrics,
    prices.prices,
    demo.demo,
):  # fmt: skip
    main.add_command(_command)
