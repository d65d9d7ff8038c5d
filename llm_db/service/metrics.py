"""Prometheus exposition of the books' health (``llm-db metrics``, ``llm-db worker``).

``collect(conn)`` reads the database once, every series by ``llm.metrics()``
(sql/82_books.sql: this module adds HELP and TYPE), and returns a fresh
``prometheus_client.CollectorRegistry`` (never the process-global one, so
nothing leaks between calls); ``scrape(connect)`` adds the scrape's own gauges
and renders the text format, also when the database cannot be read. Run it from
the node_exporter textfile collector, a sidecar or cron:

    llm-db metrics --dsn "$DATABASE_URL" --output /var/lib/node_exporter/llm.prom

or scrape ``llm-db worker``'s ``/metrics``, which serves the same families plus
its delivery counters. Needs the ``worker`` extra (``prometheus_client``).

Metrics (gauges read at the moment of the scrape, unless said otherwise):

- ``llm_up``: 1 when this scrape read the database, 0 when it could not (then
  only ``llm_up`` and ``llm_scrape_duration_seconds`` are present, and
  ``--output`` still replaces the file, so a stale file never says "ok");
- ``llm_scrape_duration_seconds``: how long the scrape took;
- ``llm_reconciliation_health{status}``: 1 for the current status of
  ``llm.reconciliation_health()`` (ok, late, never, failing), 0 for the others;
- ``llm_reconciliation_last_success_timestamp_seconds``: when the last
  completed pass finished; 0 when none ever did;
- ``llm_reconciliation_last_run_*``: the newest finished pass that was not
  skipped: its figures, status (one series per status), duration and age
  (``..._age_seconds``, on the pass's clock, as health computes it). Before the
  first pass every one of them is present and 0: ``..._timestamp_seconds 0``,
  ``..._age_seconds 0``, every figure 0, and ``..._status{status}`` 0 for
  every status (alert on ``llm_reconciliation_health{status="never"} == 1``
  or ``llm_reconciliation_last_run_timestamp_seconds == 0``);
- ``llm_open_requests`` / ``llm_open_hold_credits``: requests still holding
  credits; ``llm_stale_open_requests{organization_status}`` /
  ``llm_stale_open_hold_credits{organization_status}``: those older than the
  recovery window, by their organization's status. ``operational``: the next
  pass recovers them (0 right after a pass, unless a blocked organization or a
  batch left some); ``suspended`` and ``closed``: no pass visits those
  organizations, so their holds stay until the organization is operational
  again. Every status is present, 0 when none;
- ``llm_running_tasks``, ``llm_stale_running_tasks``, ``llm_drift_findings``;
- ``llm_period_findings``: periods whose counters disagreed with their requests
  at their last audit and still do (``llm.period_findings``, unresolved);
- counters kept by the sweeps themselves (``llm.sweep_totals``), the pass's and
  direct ``reconcile_org`` calls alike, never lowered (a true-up does not undo
  a recovery): ``llm_recovered_requests_total``,
  ``llm_recovered_uncharged_requests_total`` (recovered and charged nothing,
  per the organization's ``recovery_charge``) and
  ``llm_past_window_alerts_total`` (BR-CAP-PFM-LLM-009-07);
- ``llm_notices{status}``: owed and sending threshold notices;
- ``llm_budgets_near_limit{scope, window}``: budget counters of the current windows (the
  day, week and month containing the scrape's clock) whose used + held stand at
  or above the first threshold of the budget that applies to them (the id's own,
  else the scope's ``'*'``), by scope (organization, project, api_key,
  end_user) and window (every pair present, 0 when none), the allowance counted
  under organization/month; ``llm_allowance_used_ratio{organization_id}``: used +
  held over the allowance of each organization at or past its first threshold. ``llm-db report --by SCOPE``
  lists them;
- ``llm_admission_refusals_total{scope, window}``: limit windows that refused an
  admission, by scope and window (every pair present): each limit, the allowance
  under organization/month or a budget for one id, counts once per window, on
  the first refusal reported (``note_refusal``, which the driver calls on every
  ``AllowanceExhausted``). Not one per refusal: a refusal rolls back what it
  wrote, and an exact count would cost a write per refusal (a refusal storm, a
  write storm); count each refusal in your service if you need that figure.

- ``llm_month_cost_nanos{model}``: what the requests settled in the current UTC month
  cost, by model, in nanos of the book's currency (cents x 10^7 plus what the book
  priced, as repriced), from ``llm.daily_usage`` as the last pass rebuilt it; a gauge,
  since a repricing can lower it and it starts again each month. A sample is a float64,
  exact up to 2^53 nanos: ``llm-db report`` has the exact figure.
  ``llm_month_fallback_priced_requests{model}``: those the book priced at the fallback
  price (``'*'``): a model missing from the price book.

``llm-db worker`` adds the counter ``llm_notice_deliveries_total{outcome}``
(sent, failed, released) for its own process.

A pass that stopped running shows as a growing
``llm_reconciliation_last_run_age_seconds`` and
``llm_reconciliation_health{status="late"} 1``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import psycopg
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from llm_db.client import Llm

__all__ = [
    "BUDGET_SCOPES",
    "HEALTH_STATUSES",
    "RUN_FIGURES",
    "RUN_STATUSES",
    "Scrape",
    "collect",
    "exposition",
    "scrape",
]

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
    "recovered_uncharged": "Requests the last pass recovered and charged nothing (recovery_charge).",
    "period_findings": (
        "Periods, and budget counters of the current and previous windows, whose counters"
        " disagreed with their requests in the last pass's audit."
    ),
}
ORGANIZATION_STATUSES = ("operational", "suspended", "closed")
BUDGET_SCOPES = ("organization", "project", "api_key", "end_user")
STALE_HELP = (
    "by the status of their organization: operational ones the next pass recovers; suspended"
    " and closed ones no pass visits, so their holds stay until the organization is operational."
)
#: llm.sweep_totals sum -> (counter name without _total, what it counts)
SWEEP_COUNTERS = {
    "recovered_requests": ("llm_recovered_requests", "Requests recovery settled, by any sweep, ever."),
    "recovered_uncharged": (
        "llm_recovered_uncharged_requests",
        "Requests recovery settled and charged nothing (recovery_charge dispatched or none), ever.",
    ),
    "past_window_alerts": (
        "llm_past_window_alerts",
        "Requests found past the recovery window, each alerted once, by any sweep, ever.",
    ),
}

SNAPSHOT_GAUGES = {
    "open_requests": ("llm_open_requests", "Requests admitted and not yet settled or failed."),
    "held_credits": ("llm_open_hold_credits", "Credits held by open requests."),
    "running_tasks": ("llm_running_tasks", "Tasks running."),
    "stale_running_tasks": (
        "llm_stale_running_tasks",
        "Tasks running longer than the recovery window (the next pass abandons them).",
    ),
    "drift_findings": ("llm_drift_findings", "Tasks currently listed in llm.drift_findings."),
}


#: a series of ``llm.metrics()``: its metric and the value of its one label (None: no label)
Series = dict[tuple[str, str | None], float]


def collect(
    conn: psycopg.Connection,
    *,
    now: datetime | None = None,
    registry: CollectorRegistry | None = None,
) -> CollectorRegistry:
    """Every llm-db gauge, read from ``conn`` at ``now`` (the server's clock by
    default) by ``llm.metrics()``, in ``registry`` (default: a fresh one)."""
    rows = Llm(conn).metrics(now=now)
    series: Series = {
        (r["metric"], next(iter(r["labels"].values()), None)): r["value"]
        for r in rows if r["metric"] not in MANY_LABELS
    }  # fmt: skip
    if registry is None:
        registry = CollectorRegistry(auto_describe=True)
    _health_gauges(series, registry)
    _last_run_gauges(series, registry)
    _books_gauges(series, registry)
    _budget_gauges([r for r in rows if r["metric"] in MANY_LABELS], registry)
    _cost_gauges([r for r in rows if r["metric"] in MANY_LABELS], registry)
    return registry


def _cost_gauges(rows: list[dict[str, Any]], registry: CollectorRegistry) -> None:
    """The month's cost and the requests priced at the fallback price, by model (a series
    per model with settlements this month, from llm.daily_usage)."""
    cost = Gauge("llm_month_cost_nanos", "What the requests settled this month (UTC) cost, by model,"
                 " in nanos (10^-9) of the book's currency, as repriced; from llm.daily_usage, which"
                 " the pass rebuilds. A float64 sample: exact to 2^53 nanos; llm-db report has the"
                 " exact figure.", ["model"], registry=registry)  # fmt: skip
    fallback = Gauge("llm_month_fallback_priced_requests", "Requests settled this month (UTC) that the"
                     " book priced at the fallback price ('*'): their model has no price of its own.",
                     ["model"], registry=registry)  # fmt: skip
    for r in rows:
        if r["metric"] == "llm_month_cost_nanos":
            cost.labels(model=r["labels"]["model"]).set(r["value"])
        elif r["metric"] == "llm_month_fallback_priced_requests":
            fallback.labels(model=r["labels"]["model"]).set(r["value"])


def _unlabelled(name: str, doc: str, series: Series, registry: CollectorRegistry) -> None:
    """A gauge with no label, set to its one series."""
    Gauge(name, doc, registry=registry).set(series[name, None])


def _labelled(
    name: str, doc: str, label: str, values: Iterable[str], series: Series, registry: CollectorRegistry
) -> None:
    """A gauge with one label, a series for each of ``values`` (every one present, so a
    dashboard sees 0 rather than nothing)."""
    gauge = Gauge(name, doc, [label], registry=registry)
    for value in values:
        gauge.labels(**{label: value}).set(series[name, value])


def _health_gauges(series: Series, registry: CollectorRegistry) -> None:
    """llm.reconciliation_health(): the missing-run alarm."""
    _labelled(
        "llm_reconciliation_health",
        "1 for the current status of llm.reconciliation_health() (the missing-run alarm).",
        "status", HEALTH_STATUSES, series, registry,
    )  # fmt: skip
    _unlabelled("llm_reconciliation_last_success_timestamp_seconds",
                "When the last completed pass finished (on its own clock), Unix seconds; 0: never.",
                series, registry)  # fmt: skip


def _last_run_gauges(series: Series, registry: CollectorRegistry) -> None:
    """The last (not skipped) pass's llm.reconciliation_runs row; every series at 0
    before the first pass (documented above)."""
    for name, doc in (
        ("timestamp_seconds", "When the last (not skipped) pass finished, Unix seconds; 0: no pass yet."),
        ("age_seconds", "Seconds since the last (not skipped) pass finished, on the pass's clock; 0: no pass yet."),
        ("duration_seconds", "How long the last pass took; 0: no pass yet."),
    ):
        _unlabelled(f"llm_reconciliation_last_run_{name}", doc, series, registry)
    _labelled(
        "llm_reconciliation_last_run_status",
        "1 for the status of the last (not skipped) pass; all 0: no pass yet.",
        "status", RUN_STATUSES, series, registry,
    )  # fmt: skip
    for name, doc in (
        ("errors", "Errors the last pass recorded (organizations and follow-up steps)."),
        *RUN_FIGURES.items(),
    ):
        _unlabelled(f"llm_reconciliation_last_run_{name}", doc, series, registry)


def _books_gauges(series: Series, registry: CollectorRegistry) -> None:
    """What the next pass would act on, the stale requests by organization status, and
    the sweeps' totals (counters)."""
    for name, doc in SNAPSHOT_GAUGES.values():
        _unlabelled(name, doc, series, registry)
    _labelled("llm_notices", "Threshold notices not yet delivered, by status.",
              "status", ("owed", "sending"), series, registry)  # fmt: skip

    requests = Gauge("llm_stale_open_requests", "Open requests older than the recovery window, "
                     + STALE_HELP, ["organization_status"], registry=registry)  # fmt: skip
    credits = Gauge("llm_stale_open_hold_credits", "Credits held by open requests older than the"
                    " recovery window, " + STALE_HELP, ["organization_status"], registry=registry)  # fmt: skip
    for status in ORGANIZATION_STATUSES:
        requests.labels(organization_status=status).set(series["llm_stale_open_requests", status])
        credits.labels(organization_status=status).set(series["llm_stale_open_hold_credits", status])

    _unlabelled("llm_period_findings", "Periods whose counters disagree with their requests (unresolved"
                " rows of llm.period_findings).", series, registry)  # fmt: skip
    registry.register(_SweepCounters(series))


#: the series of llm.metrics() with more than one label, or a label per organization
MANY_LABELS = ("llm_budgets_near_limit", "llm_allowance_used_ratio", "llm_admission_refusals_total",
               "llm_month_cost_nanos", "llm_month_fallback_priced_requests")

REFUSALS_HELP = ("Limit windows that refused an admission, by the limit's scope and window: each"
                 " limit (the allowance, a budget per id) counts once per window, on its first"
                 " refusal reported (llm.note_refusal), not once per refusal.")  # fmt: skip


def _budget_gauges(rows: list[dict[str, Any]], registry: CollectorRegistry) -> None:
    """Budgets and allowances near their limit: by scope and window (every pair present),
    and the committed share of each allowance at or past its first threshold."""
    near = Gauge("llm_budgets_near_limit", "Budgets at or above their first threshold (used + held) in"
                 " the windows containing the scrape's clock, by scope and window; the allowance counts"
                 " under organization/month.", ["scope", "window"], registry=registry)  # fmt: skip
    ratio = Gauge("llm_allowance_used_ratio", "(used + held) / allowance of the current month, for the"
                  " organizations at or above their first notice threshold.", ["organization_id"],
                  registry=registry)  # fmt: skip
    for r in rows:
        if r["metric"] not in ("llm_budgets_near_limit", "llm_allowance_used_ratio"):
            continue
        gauge = near if r["metric"] == "llm_budgets_near_limit" else ratio
        gauge.labels(**r["labels"]).set(r["value"])
    registry.register(_RefusalCounters([r for r in rows if r["metric"] == "llm_admission_refusals_total"]))


class _RefusalCounters:
    """``llm_admission_refusals_total{scope, window}``: a counter (limit_reached notices
    are never deleted, so it never goes down)."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily("llm_admission_refusals", REFUSALS_HELP, labels=["scope", "window"])
        for r in self.rows:
            family.add_metric([r["labels"]["scope"], r["labels"]["window"]], r["value"])
        yield family

    def describe(self) -> Iterable[Any]:
        return self.collect()


class _SweepCounters:
    """The sweeps' own monotonic totals (llm.sweep_totals), exposed as counters."""

    def __init__(self, series: Series) -> None:
        self.series = series

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily

        for name, doc in SWEEP_COUNTERS.values():
            yield CounterMetricFamily(name, doc, value=self.series[f"{name}_total", None])

    def describe(self) -> Iterable[Any]:
        return self.collect()


def _scrape_gauges(registry: CollectorRegistry, *, up: bool, seconds: float) -> None:
    Gauge(
        "llm_up", "1 when this scrape read the llm database, 0 when it could not.",
        registry=registry,
    ).set(1 if up else 0)  # fmt: skip
    Gauge(
        "llm_scrape_duration_seconds", "How long this scrape of the llm database took.",
        registry=registry,
    ).set(seconds)  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class Scrape:
    """One scrape: the exposition (always renderable) and the error that made it
    ``llm_up 0`` (None when the database was read)."""

    text: bytes
    error: BaseException | None

    @property
    def up(self) -> bool:
        return self.error is None


def scrape(
    connect: Callable[[], contextlib.AbstractContextManager[psycopg.Connection]],
    *,
    now: datetime | None = None,
    extra: Iterable[Any] = (),
    catch: tuple[type[BaseException], ...] = (psycopg.Error,),
) -> Scrape:
    """Connect with ``connect()``, collect, and render with ``llm_up`` and the scrape's
    duration; an exception of ``catch`` gives ``llm_up 0`` instead (and is returned).
    ``extra``: more collectors to render with it (the worker's counters)."""
    started = time.monotonic()
    registry = CollectorRegistry(auto_describe=True)
    error: BaseException | None = None
    try:
        with connect() as conn:
            collect(conn, now=now, registry=registry)
    except catch as exc:
        error = exc
        registry = CollectorRegistry(auto_describe=True)  # nothing half-read
    _scrape_gauges(registry, up=error is None, seconds=time.monotonic() - started)
    for collector in extra:
        registry.register(collector)
    return Scrape(generate_latest(registry), error)


def exposition(conn: psycopg.Connection, *, now: datetime | None = None) -> bytes:
    """The Prometheus text exposition of ``collect(conn, now=now)`` with ``llm_up 1``."""
    return scrape(lambda: contextlib.nullcontext(conn), now=now, catch=()).text
