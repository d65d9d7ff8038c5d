"""Rows of the books' reads (sql/81_report.sql, sql/82_books.sql), as ``TypedDict``\\ s.

The reads' rows stay plain dicts, column name to value: ``llm-db report`` renders
them by column and prints them as JSON as they come, and ``llm-db metrics`` picks
its figures out of them. Each class names the columns of one routine's result,
in its order, for the driver's table (``codegen.operations``), which selects them
by name.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import TypedDict
from uuid import UUID

__all__ = [
    "BooksHistory",
    "BooksSnapshot",
    "BudgetNearLimit",
    "CostByModel",
    "DailyUsage",
    "MetricSeries",
    "OpenHolds",
    "OrganizationTotals",
    "PassProgress",
    "PeriodUsage",
    "ScopeUsage",
    "StaleByStatus",
    "TasksByStatus",
]


class PeriodUsage(TypedDict):
    """``llm.report_periods``: a period overlapping the report's days."""

    organization_id: UUID
    name: str
    status: str
    period_start: date
    period_end: date
    allowance_credits: int | None
    used_credits: int
    held_credits: int
    used_cents: int
    used_cost_nanos: int


class DailyUsage(TypedDict):
    """``llm.report_daily_usage``: a row of ``llm.daily_usage`` with its organization's name."""

    day: date
    organization_id: UUID
    name: str
    model: str
    requests: int
    recovered_requests: int
    credits: int
    cents: int
    input_tokens: int
    output_tokens: int
    cost_nanos: int
    uncosted_requests: int
    fallback_requests: int


class CostByModel(TypedDict):
    """``llm.report_costs``: what one organization's calls of one model cost, in exact
    nanos of the book's currency."""

    organization_id: UUID
    name: str
    model: str
    currency: str
    requests: int
    cost_nanos: int
    original_cost_nanos: int
    uncosted_requests: int
    fallback_requests: int


class OpenHolds(TypedDict):
    """``llm.report_open_holds``: an organization's requests still holding credits."""

    organization_id: UUID
    name: str
    open_requests: int
    held_credits: int
    oldest_created_at: datetime
    past_window: int


class TasksByStatus(TypedDict):
    """``llm.report_tasks``: an organization's tasks of one status."""

    organization_id: UUID
    name: str
    status: str
    tasks: int
    requests: int
    credits: int
    cents: int
    cost_nanos: int


class ScopeUsage(TypedDict):
    """``llm.report_scope_usage``: the usage of one id of a scope."""

    organization_id: UUID
    name: str
    scope_id: str
    requests: int
    open_requests: int
    used_credits: int
    held_credits: int
    used_cents: int
    used_cost_nanos: int


class BudgetNearLimit(TypedDict):
    """``llm.report_budgets_near_limit``: a current window at or past its first threshold."""

    organization_id: UUID
    name: str
    scope: str
    scope_id: str | None
    budget_window: str
    window_start: date
    limit_credits: int
    first_threshold: int
    used_credits: int
    held_credits: int
    used_cents: int
    used_cost_nanos: int


class BooksSnapshot(TypedDict):
    """``llm.books_snapshot``: what the next pass would act on."""

    open_requests: int
    held_credits: int
    stale_open_requests: int
    stale_held_credits: int
    running_tasks: int
    stale_running_tasks: int
    drift_findings: int
    notices_owed: int
    notices_sending: int


class StaleByStatus(TypedDict):
    """``llm.stale_by_organization_status``: stale open requests of one organization status."""

    organization_status: str
    stale_open_requests: int
    stale_held_credits: int


class BooksHistory(TypedDict):
    """``llm.books_history``: what passes did to some organizations, ever."""

    recovered_requests: int
    past_window_alerts: int
    abandoned_tasks: int
    notices_sent: int


class OrganizationTotals(TypedDict):
    """``llm.organization_totals``: an organization's allowance, period sums and notices."""

    organization_id: UUID
    name: str
    status: str
    allowance_credits: int | None
    used_credits: int
    held_credits: int
    used_cents: int
    notices: int


class PassProgress(TypedDict):
    """``llm.pass_progress``: the organizations a pass visits, and how many it has."""

    organizations: int
    orgs_visited: int | None


class MetricSeries(TypedDict):
    """``llm.metrics``: one series of the exposition."""

    metric: str
    labels: dict[str, str]
    value: float
