"""``llm-db doctor``: the preflight check of a database (the checks and their SQL
live in ``llm_db.cli.doctor``; this is the command around them)."""

from __future__ import annotations

import contextlib
import dataclasses

import click

from llm_db.cli.commands import common

_MARK = {"ok": "ok", "warning": "warning", "missing": "MISSING"}


@click.command(short_help="Preflight check of a database: exit 0 ok, 1 warning, 5 missing.")
@common.dsn_option
@click.option(
    "--cron-dsn",
    default=None,
    metavar="DSN",
    help="The pg_cron database (server setting cron.database_name), when it is not this one.",
)
@common.json_option
def doctor(dsn: str | None, cron_dsn: str | None, as_json: bool) -> None:
    """Preflight check of a database, before and after install: what llm-db needs
    of the server, the extensions, the owner and the roles, and what is missing.

    One line a check, ok / warning / missing, with the exact statement to run as
    the provider's admin (or the llm-db command) when it is not ok: the server
    version; pg_cron (in this database or the --cron-dsn one) and its grants;
    plpgsql_check and citus (optional); the connecting role (superuser?
    CREATEROLE? owns the database?) and whether the lease sees other backends
    (pg_read_all_stats); the roles llm_app, llm_operator, llm_reader and their
    grants; the migration level against this package's; whether the pass is
    scheduled and healthy; whether the DSN is transaction-pooled. Writes nothing.
    docs/install.md has a section per managed provider.

    \b
    Exit code:
      0  every check ok
      1  a warning (e.g. transaction-pooled, pg_cron's database not given)
      5  something is missing (e.g. not installed yet, a grant)

    \b
    Examples:
      llm-db doctor --dsn postgresql://owner@db.internal/app
      llm-db doctor --dsn postgresql://owner@db/app --cron-dsn postgresql://owner@db/postgres
      llm-db doctor --json | jq '.[] | select(.status != "ok")'
    """
    from llm_db.cli.doctor import run_checks, worst

    with contextlib.ExitStack() as stack:
        conn = stack.enter_context(common.connect(dsn))
        cron = (
            stack.enter_context(common.connect(cron_dsn, option="--cron-dsn")) if cron_dsn else None
        )
        checks = run_checks(conn, lambda: stack.enter_context(common.connect(dsn)), cron)
    if as_json:
        common.echo_json([dataclasses.asdict(c) for c in checks])
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            click.echo(f"{_MARK[c.status]:<8} {c.name:<{width}}  {c.detail}")
            if c.fix:
                click.echo(f"{'':<8} {'':<{width}}  fix: {c.fix}")
    status = worst(checks)
    common.exit_with(
        {"ok": common.EXIT_OK, "warning": common.EXIT_PROBLEM}.get(status, common.EXIT_MISSING)
    )
