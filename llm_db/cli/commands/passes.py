"""``llm-db reconcile`` and ``health``: run the hourly pass now, and the alarm that
says whether it runs."""

from __future__ import annotations

import dataclasses
import sys
import threading
from datetime import datetime
from typing import Any
from uuid import UUID

import click
from psycopg.rows import dict_row

from llm_db.cli.commands import common

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
    from llm_db.client import Llm

    with common.connect(dsn) as watcher, common.connect(dsn) as worker:
        with watcher.cursor(row_factory=dict_row) as cur:
            since = cur.execute(queries.CLOCK).fetchone()["clock"]
        progress = Llm(watcher).pass_progress
        total = progress(since)["organizations"]
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
                    visited = progress(since)["orgs_visited"]
                    visited = shown if visited is None else min(visited, total)
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


@click.command(short_help="Run one reconciliation pass now.")
@common.dsn_option
@click.option(
    "--org",
    "organization_id",
    type=click.UUID,
    default=None,
    help="Sweep only this organization (llm.reconcile_org), in one transaction.",
)
@common.now_option
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
@common.json_option
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
    from llm_db.client import Llm

    dsn = common.require_dsn(dsn)
    if organization_id is not None:
        with common.connect(dsn) as conn:
            sweep = Llm(conn).reconcile_org(organization_id, now=now, batch=batch)
        if as_json:
            common.echo_json(dataclasses.asdict(sweep))
        else:
            click.echo(f"organization {sweep.organization_id} swept")
            click.echo(common.figures(_sweep_figures(sweep, of_run=False)))
        return

    if progress is None:
        progress = sys.stdout.isatty() and not as_json
    if progress:
        run = _pass_with_progress(dsn, now, batch)
    else:
        with common.connect(dsn) as conn:
            run = Llm(conn).run_reconciliation(now=now, batch=batch)
    if run is None:
        raise common.Failure("the pass recorded no llm.reconciliation_runs row", common.EXIT_ERROR)
    _echo_run(run, as_json)
    common.exit_with(common.EXIT_OK if run.status == "succeeded" else common.EXIT_PROBLEM)


def _echo_run(run: Any, as_json: bool) -> None:
    """A pass's llm.reconciliation_runs row: its figures and errors, or as JSON."""
    if as_json:
        common.echo_json(dataclasses.asdict(run))
        return
    duration = (run.finished_at - run.started_at).total_seconds() if run.finished_at else 0.0
    click.echo(
        f"pass {run.id} {run.status} in {duration:.2f} s (clock {run.clock:%Y-%m-%d %H:%M:%S %Z})"
    )
    if run.status == "skipped":
        click.echo("  another reconciliation pass is running; this one did nothing")
        return
    click.echo(common.figures(_sweep_figures(run, of_run=True)))
    for error in run.errors:
        where = " ".join(
            f"{k}={error[k]}" for k in ("step", "organization_id", "sqlstate") if error.get(k)
        )
        click.echo(f"  error: {where}: {error.get('error')}")


# ----------------------------------------------------------- health


@click.command(short_help="The missing-run alarm: exit 0 ok, 1 late/failing, 5 never.")
@common.dsn_option
@common.now_option
@common.json_option
def health(dsn: str | None, now: datetime | None, as_json: bool) -> None:
    """The missing-run alarm: is the hourly pass running? Made for monitoring checks.

    Prints llm.reconciliation_health(): status, last success, last run, detail.

    \b
    Exit code:
      0  ok       a pass completed within settings.health_max_age (2 h), no errors
      1  late     the last completed pass is older than that: check the pg_cron job
      1  failing  the last pass recorded errors: see llm.reconciliation_runs.errors
      5  never    no pass has ever completed: run llm-db schedule

    \b
    Examples:
      llm-db health --dsn postgresql://monitor@db/app
      llm-db health --json
      llm-db health --now 2026-01-15T15:00:00Z      # as if it were then
    """
    from llm_db.client import Llm

    with common.connect(dsn) as conn:
        result = Llm(conn).health(now=now)
    if as_json:
        common.echo_json(dataclasses.asdict(result))
    else:
        last_success = (
            "never"
            if result.last_success_at is None
            else f"{result.last_success_at:%Y-%m-%d %H:%M:%S %Z}"
        )
        click.echo(
            common.figures(
                [
                    ("status", result.status),
                    ("last success", last_success),
                    ("last run", result.last_run_status or "-"),
                    ("detail", result.detail),
                ],
                indent=0,
            )
        )
    codes = {"ok": common.EXIT_OK, "never": common.EXIT_MISSING}
    common.exit_with(codes.get(result.status, common.EXIT_PROBLEM))
