"""What the operator reads: ``llm-db report``, rendered as text or JSON.

The report's sections are read by the functions of sql/81_report.sql through
the driver (``Llm.report_periods`` and the like): this module only picks the
days and renders the rows. Every one only reads, so ``llm_reader`` can run
the report.

    with psycopg.connect(dsn) as conn:
        report = build_report(conn, days=7)
        print(render_report(report))            # aligned tables
        json.dumps(report_json(report))         # the same, for machines
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from datetime import date, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

from llm_db import queries
from llm_db._text import format_table, jsonable, money
from llm_db.client import Llm

__all__ = [
    "Report",
    "build_report",
    "format_table",
    "jsonable",
    "render_report",
    "report_json",
    "server_clock",
]

Row = dict[str, Any]

# ``llm-db report --by SCOPE``: the scopes a request names an id of.
BY_SCOPES = ("project", "api_key", "end_user")


# ----------------------------------------------------------- reading


def server_clock(conn: psycopg.Connection, now: datetime | None = None) -> datetime:
    """``now`` when given, else the server's ``now()``."""
    if now is not None:
        return now
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(queries.NOW).fetchone()["now"]  # type: ignore[index]


@dataclasses.dataclass(frozen=True, slots=True)
class Report:
    """What ``llm-db report`` shows: days ``since`` .. ``until`` (UTC) up to ``now``."""

    now: datetime
    since: date
    until: date
    organization_id: UUID | None
    periods: list[Row]
    daily_usage: list[Row]
    open_holds: list[Row]
    tasks: list[Row]
    #: the cost of those days by organization and model (exact nanos, llm.report_costs)
    costs: list[Row] = dataclasses.field(default_factory=list)
    #: ``--by``: the scope, its ids' usage and its budgets near their limit
    by: str | None = None
    by_usage: list[Row] = dataclasses.field(default_factory=list)
    budgets_near_limit: list[Row] = dataclasses.field(default_factory=list)


def build_report(
    conn: psycopg.Connection,
    *,
    days: int = 7,
    organization_id: UUID | str | None = None,
    now: datetime | None = None,
    by: str | None = None,
) -> Report:
    """Read the report for the last ``days`` UTC days up to ``now`` (server clock by default);
    ``by`` (project, api_key or end_user) adds the usage per id of that scope, from the
    requests admitted in those days, and its budgets near their limit now."""
    if days < 1:
        raise ValueError("days must be at least 1")
    if by is not None and by not in BY_SCOPES:
        raise ValueError(f"by must be one of {', '.join(BY_SCOPES)}")
    clock = server_clock(conn, now)
    until = _utc_day(clock)
    since = until - timedelta(days=days - 1)
    org = None if organization_id is None else UUID(str(organization_id))
    orgs = None if org is None else [str(org)]
    llm = Llm(conn)
    return Report(
        now=clock,
        since=since,
        until=until,
        organization_id=org,
        periods=llm.report_periods(since, until, orgs),
        daily_usage=llm.report_daily_usage(since, until, orgs),
        open_holds=llm.report_open_holds(orgs, now=clock),
        tasks=llm.report_tasks(since, orgs),
        costs=llm.report_costs(since, until, orgs),
        by=by,
        by_usage=[] if by is None else llm.report_scope_usage(by, since, until, orgs),
        budgets_near_limit=[] if by is None else llm.report_budgets_near_limit(by, orgs, now=clock),
    )


def _utc_day(moment: datetime) -> date:
    offset = moment.utcoffset()
    return (moment - offset).date() if offset is not None else moment.date()


# ----------------------------------------------------------- rendering


def report_json(report: Report) -> dict[str, Any]:
    """The report as plain JSON types (the shape ``llm-db report --json`` prints; ``by``,
    ``by_usage`` and ``budgets_near_limit`` only with ``--by``)."""
    shape: dict[str, Any] = {
        "now": report.now,
        "since": report.since,
        "until": report.until,
        "organization_id": report.organization_id,
        "periods": report.periods,
        "daily_usage": report.daily_usage,
        "costs": report.costs,
        "open_holds": report.open_holds,
        "tasks": report.tasks,
    }
    if report.by is not None:
        shape |= {
            "by": report.by,
            "by_usage": report.by_usage,
            "budgets_near_limit": report.budgets_near_limit,
        }
    return jsonable(shape)


def _pct(used: int, allowance: int | None) -> str:
    """Share of the allowance used, rounded down (99.9 % is not yet 100 %)."""
    if allowance is None:
        return "-"
    if allowance == 0:
        return "-" if used == 0 else "over"
    return f"{100 * used // allowance}%"


# The sections of the text report, in order: title, the Report rows it shows, the
# alignment (None: numbers right, text left), and its columns as (header, the row's
# column shown, or how the cell is made from the row).
_Cell = str | Callable[[Mapping[str, Any]], Any]
_SECTIONS: tuple[tuple[str, str, str | None, tuple[tuple[str, _Cell], ...]], ...] = (
    ("Period usage", "periods", "lllrrrrr", (
        ("organization", "name"),
        ("status", "status"),
        ("period", lambda r: r["period_start"].strftime("%Y-%m")),
        ("allowance", lambda r: "unlimited" if r["allowance_credits"] is None else r["allowance_credits"]),
        ("used", "used_credits"),
        ("held", "held_credits"),
        ("used %", lambda r: _pct(r["used_credits"], r["allowance_credits"])),
        ("cents", "used_cents"),
    )),
    ("Daily usage (by settlement day)", "daily_usage", None, (
        ("day", "day"),
        ("organization", "name"),
        ("model", "model"),
        ("requests", "requests"),
        ("recovered", "recovered_requests"),
        ("credits", "credits"),
        ("cents", "cents"),
        ("tokens in", "input_tokens"),
        ("tokens out", "output_tokens"),
    )),
    ("Cost by model (by settlement day, exact; repriced: as corrected, and as first booked)", "costs", None, (
        ("organization", "name"),
        ("model", "model"),
        ("requests", "requests"),
        ("cost", lambda r: f"{money(r['cost_nanos'])} {r['currency']}"),
        ("first booked", lambda r: money(r["original_cost_nanos"])),
        ("no cost", "uncosted_requests"),
        ("fallback price", "fallback_requests"),
    )),
    ("Open holds", "open_holds", None, (
        ("organization", "name"),
        ("open requests", "open_requests"),
        ("held credits", "held_credits"),
        ("oldest", "oldest_created_at"),
        ("past window", "past_window"),
    )),
    ("Tasks by status (started in these days, and all running)", "tasks", None, (
        ("organization", "name"),
        ("status", "status"),
        ("tasks", "tasks"),
        ("requests", "requests"),
        ("credits", "credits"),
        ("cents", "cents"),
    )),
)  # fmt: skip


#: printed under an empty daily usage: why it can be empty while requests were settled
DAILY_USAGE_EMPTY = ("  Daily usage is rebuilt by the hourly pass (llm.run_reconciliation): a day's"
                     " settlements show after the first pass that follows them; `llm-db reconcile`"
                     " runs one now. Period usage above is live.")  # fmt: skip


def render_report(report: Report) -> str:
    """The report as aligned tables, one section each (``_SECTIONS``)."""
    scope = "all organizations" if report.organization_id is None else str(report.organization_id)
    days = (report.until - report.since).days + 1
    out = [
        f"llm-db report: {scope}, {days} day(s) {report.since} .. {report.until} (UTC), "
        f"as of {report.now:%Y-%m-%d %H:%M:%S %Z}".rstrip(),
    ]
    for title, rows, align, columns in _SECTIONS:
        cells = [
            tuple(row[cell] if isinstance(cell, str) else cell(row) for _, cell in columns)
            for row in getattr(report, rows)
        ]
        out += ["", title, format_table([header for header, _ in columns], cells, align=align)]
        if rows == "daily_usage" and not cells:
            out.append(DAILY_USAGE_EMPTY)
    if report.by is not None:
        for title, rows, columns in _by_sections(report.by):
            cells = [tuple(cell(row) for _, cell in columns) for row in getattr(report, rows)]
            out += ["", title, format_table([header for header, _ in columns], cells)]
    return "\n".join(out)


def _by_sections(
    by: str,
) -> tuple[tuple[str, str, tuple[tuple[str, Callable[[Mapping[str, Any]], Any]], ...]], ...]:
    """The sections ``--by`` adds: usage per id of the scope, and its budgets near their limit."""
    return (
        (f"Usage by {by} (requests admitted in these days)", "by_usage", (
            ("organization", lambda r: r["name"]),
            (by, lambda r: r["scope_id"]),
            ("requests", lambda r: r["requests"]),
            ("open", lambda r: r["open_requests"]),
            ("used", lambda r: r["used_credits"]),
            ("held", lambda r: r["held_credits"]),
            ("cents", lambda r: r["used_cents"]),
        )),
        (f"Budgets near their limit ({by}, current windows, used + held at or above the first threshold)",
         "budgets_near_limit", (
            ("organization", lambda r: r["name"]),
            (by, lambda r: r["scope_id"]),
            ("window", lambda r: r["budget_window"]),
            ("start", lambda r: r["window_start"]),
            ("limit", lambda r: r["limit_credits"]),
            ("used", lambda r: r["used_credits"]),
            ("held", lambda r: r["held_credits"]),
            ("used+held %", lambda r: _pct(r["used_credits"] + r["held_credits"], r["limit_credits"])),
        )),
    )  # fmt: skip
