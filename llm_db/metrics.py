"""Prometheus exposition of the books' health (``llm-db metrics``).

``collect(conn)`` reads the database once and returns a fresh
``prometheus_client.CollectorRegistry`` (never the process-global one, so
nothing leaks between calls); ``exposition(conn)`` renders it in the text
format. Run it from the node_exporter textfile collector, a sidecar or cron:

    llm-db metrics --dsn "$DATABASE_URL" --output /var/lib/node_exporter/llm.prom

Metrics (all gauges, read at the moment of the call):

- ``llm_reconciliation_health{status}``: 1 for the current status of
  ``llm.reconciliation_health()`` (ok, late, never, failing), 0 for the others;
- ``llm_reconciliation_last_success_timestamp_seconds``;
- ``llm_reconciliation_last_run_*``: the newest finished pass that was not
  skipped: its figures, status (one series per status), duration and age
  (``..._age_seconds``, on the pass's clock, as health computes it);
- ``llm_open_requests`` / ``llm_open_hold_credits``: requests still holding
  credits; ``llm_stale_open_requests`` / ``llm_stale_open_hold_credits``: those
  older than the recovery window, which the next pass recovers (they should be
  0 right after a pass);
- ``llm_running_tasks``, ``llm_stale_running_tasks``, ``llm_drift_findings``;
- ``llm_notices{status}``: owed and sending threshold notices.

A pass that stopped running shows as a growing
``llm_reconciliation_last_run_age_seconds`` and
``llm_reconciliation_health{status="late"} 1``.
"""

from __future__ import annotations

from datetime import datetime

import psycopg
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from llm_db.report import books_snapshot, last_run, server_clock
from llm_db.requests import Llm

__all__ = ["HEALTH_STATUSES", "RUN_FIGURES", "RUN_STATUSES", "collect", "exposition"]

HEALTH_STATUSES = ("ok", "late", "never", "failing")
RUN_STATUSES = ("succeeded", "partial", "failed")

#: llm.reconciliation_runs column -> what the gauge says
RUN_FIGURES = {
    "orgs_visited": "Organizations the last pass visited.",
    "orgs_failed": "Organizations whose sweep failed in the last pass.",
    "requests_recovered": "Requests the last pass settled at their estimate.",
    "released_hold_credits": "Hold credits the last pass released.",
    "past_window_alerts": "Requests the last pass found past the recovery window (alerted once each).",
    "executions_abandoned": "Tasks the last pass marked abandoned.",
    "drift_findings": "Tasks whose totals disagreed with their requests in the last pass.",
    "notices_rearmed": "Threshold notices the last pass made owed again.",
    "daily_rows_rebuilt": "llm.daily_usage rows the last pass rebuilt.",
    "more_pending_orgs": "Organizations with more stranded requests than the last pass's batch.",
}

SNAPSHOT_GAUGES = {
    "open_requests": ("llm_open_requests", "Requests admitted and not yet settled or failed."),
    "held_credits": ("llm_open_hold_credits", "Credits held by open requests."),
    "stale_open_requests": (
        "llm_stale_open_requests",
        "Open requests older than the recovery window (the next pass recovers them).",
    ),
    "stale_held_credits": (
        "llm_stale_open_hold_credits",
        "Credits held by open requests older than the recovery window.",
    ),
    "running_tasks": ("llm_running_tasks", "Tasks running."),
    "stale_running_tasks": (
        "llm_stale_running_tasks",
        "Tasks running longer than the recovery window (the next pass abandons them).",
    ),
    "drift_findings": ("llm_drift_findings", "Tasks currently listed in llm.drift_findings."),
}


def collect(conn: psycopg.Connection, *, now: datetime | None = None) -> CollectorRegistry:
    """A fresh registry holding every llm-db gauge, read from ``conn`` at ``now``
    (the server's clock by default)."""
    clock = server_clock(conn, now)
    registry = CollectorRegistry(auto_describe=True)

    health = Llm(conn).health(now=clock)
    gauge = Gauge(
        "llm_reconciliation_health",
        "1 for the current status of llm.reconciliation_health() (the missing-run alarm).",
        ["status"],
        registry=registry,
    )
    for status in HEALTH_STATUSES:
        gauge.labels(status=status).set(1 if health.status == status else 0)
    if health.last_success_at is not None:
        Gauge(
            "llm_reconciliation_last_success_timestamp_seconds",
            "When the last completed pass finished (on its own clock), Unix seconds.",
            registry=registry,
        ).set(health.last_success_at.timestamp())

    run = last_run(conn, now=clock)
    if run is not None:
        Gauge(
            "llm_reconciliation_last_run_timestamp_seconds",
            "When the last (not skipped) pass finished, Unix seconds.",
            registry=registry,
        ).set(run["finished_at"].timestamp())
        Gauge(
            "llm_reconciliation_last_run_age_seconds",
            "Seconds since the last (not skipped) pass finished, on the pass's clock.",
            registry=registry,
        ).set(run["age_seconds"])
        Gauge(
            "llm_reconciliation_last_run_duration_seconds",
            "How long the last pass took.",
            registry=registry,
        ).set(run["duration_seconds"])
        status_gauge = Gauge(
            "llm_reconciliation_last_run_status",
            "1 for the status of the last (not skipped) pass.",
            ["status"],
            registry=registry,
        )
        for status in RUN_STATUSES:
            status_gauge.labels(status=status).set(1 if run["status"] == status else 0)
        Gauge(
            "llm_reconciliation_last_run_errors",
            "Errors the last pass recorded (organizations and follow-up steps).",
            registry=registry,
        ).set(len(run["errors"]))
        for column, doc in RUN_FIGURES.items():
            Gauge(f"llm_reconciliation_last_run_{column}", doc, registry=registry).set(run[column])

    books = books_snapshot(conn, now=clock)
    for column, (name, doc) in SNAPSHOT_GAUGES.items():
        Gauge(name, doc, registry=registry).set(books[column])
    notices = Gauge(
        "llm_notices", "Threshold notices not yet delivered, by status.", ["status"],
        registry=registry,
    )  # fmt: skip
    notices.labels(status="owed").set(books["notices_owed"])
    notices.labels(status="sending").set(books["notices_sending"])
    return registry


def exposition(conn: psycopg.Connection, *, now: datetime | None = None) -> bytes:
    """The Prometheus text exposition of ``collect(conn, now=now)``."""
    return generate_latest(collect(conn, now=now))
