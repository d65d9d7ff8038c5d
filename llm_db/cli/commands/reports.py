"""``llm-db report`` and ``metrics``: the books for people, and for Prometheus."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from datetime import datetime
from pathlib import Path
from uuid import UUID

import click
import psycopg

from llm_db.cli.commands import common

# ----------------------------------------------------------- report


@click.command(short_help="Usage per organization and day (or scope id), open holds, tasks.")
@common.dsn_option
@click.option("--org", "organization_id", type=click.UUID, default=None,
              help="Only this organization.")  # fmt: skip
@click.option("--days", type=click.IntRange(1, 3660), default=7, show_default=True,
              help="UTC days to cover, ending today.")  # fmt: skip
@click.option("--by", type=click.Choice(["project", "api_key", "end_user"]), default=None,
              help="Add usage per id of this scope and its budgets near their limit.")  # fmt: skip
@common.now_option
@common.json_option
def report(
    dsn: str | None,
    organization_id: UUID | None,
    days: int,
    by: str | None,
    now: datetime | None,
    as_json: bool,
) -> None:
    """Period usage per organization, daily usage, open holds and tasks by status.

    Reads tables only (llm_reader is enough). Periods overlapping the days,
    daily usage by settlement day, requests still holding credits (and how
    many are past the recovery window), tasks started in the days plus every
    running task. With --by, also the usage per project, API key or end user
    of the requests admitted in the days (every id a request named, with a
    budget or not), and that scope's budgets whose current window stands at
    or above their first threshold (used + held).

    \b
    Examples:
      llm-db report --dsn postgresql://analytics@db/app
      llm-db report --org 0b6f2d1e-... --days 31
      llm-db report --by end_user --days 1
      llm-db report --json | jq '.periods[] | {name, used_credits}'
    """
    from llm_db.cli.report import build_report, render_report, report_json

    with common.connect(dsn) as conn:
        result = build_report(conn, days=days, organization_id=organization_id, now=now, by=by)
    if as_json:
        click.echo(json.dumps(report_json(result), sort_keys=True))
    else:
        click.echo(render_report(result))


# ----------------------------------------------------------- metrics


@click.command(short_help="Prometheus exposition: pass health, last run, stale work.")
@common.dsn_option
@common.now_option
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
    llm_running_tasks, llm_drift_findings, llm_notices{status},
    llm_budgets_near_limit{scope,window} (budgets and allowances whose current
    window stands at or above their first threshold), llm_allowance_used_ratio. `llm-db worker`
    serves the same at /metrics. Needs the worker extra (prometheus_client).

    \b
    Examples:
      llm-db metrics --dsn postgresql://monitor@db/app
      # node_exporter textfile collector, every minute from cron:
      * * * * * llm-db metrics --output /var/lib/node_exporter/textfile/llm.prom
    """
    common.require_extras()
    from llm_db.service.metrics import scrape

    result = scrape(lambda: common.connect(dsn), now=now, catch=(psycopg.Error, common.Failure))
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
