"""``llm-db demo``: the main job end to end, on a throw-away server or a given database."""

from __future__ import annotations

import click

from llm_db.cli.commands import common

# ----------------------------------------------------------- demo


def _quiet(*args: object, **kwargs: object) -> None:
    """The report's printer under --json: nothing."""


@click.command(short_help="The main job end to end, on a throw-away server.")
@click.option(
    "--dsn",
    default=None,
    metavar="DSN",
    help="Use this database instead of a throw-away server (DATABASE_URL is NOT read: the demo "
    "runs a reconciliation pass there).",
)
@click.option("--seed", type=int, default=7, show_default=True,
              help="Random seed of each worker's traffic; with --workers 1 it reproduces the whole run "
                   "(several workers interleave differently each run, so refusals vary).")
@click.option("--workers", type=click.IntRange(1, 32), default=6, show_default=True,
              help="Worker threads sending traffic.")  # fmt: skip
@common.json_option
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
      llm-db demo --json | jq .after     # the figures only, one JSON document
    """
    from llm_db.demo import run_demo

    # --json: one JSON document on stdout and nothing else (the report is for people)
    result = run_demo(dsn=dsn, seed=seed, workers=workers, out=_quiet if as_json else click.echo)
    if as_json:
        common.echo_json(result)
    if result["invariant_violations"]:
        common.exit_with(common.EXIT_PROBLEM)
