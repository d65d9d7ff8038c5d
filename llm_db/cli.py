"""The `llm-db` command line. Subcommands are added by the modules that own them."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="llm-db")
def main() -> None:
    """llm-db: the books for LLM usage, kept in PostgreSQL."""


@main.command()
@click.option(
    "--dsn",
    envvar="DATABASE_URL",
    required=True,
    show_envvar=True,
    help="libpq URL or key=value conninfo of the database to migrate.",
)
def migrate(dsn: str) -> None:
    """Apply migrations/ with yoyo, then (re)apply every sql/ file in one transaction."""
    import psycopg

    from llm_db.migrate import MigrationError
    from llm_db.migrate import migrate as run_migrate

    try:
        report = run_migrate(dsn)
    except (MigrationError, psycopg.Error) as exc:
        raise click.ClickException(str(exc)) from exc
    applied = ", ".join(report.applied_migrations) or "none"
    click.echo(f"migrations applied: {applied}")
    click.echo(f"sql files applied: {len(report.sql_files)}")
