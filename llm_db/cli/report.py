"""What the operator reads: the report, the books' snapshot, the last pass.

The SQL that ``llm-db report``, ``llm-db metrics``, ``llm-db reconcile`` and
``llm-db demo`` run lives here, once, as named constants with named
parameters and explicit casts (the driver's own calls are in
``llm_db.queries``). Every statement only reads tables, so ``llm_reader`` can
run it; the organization filter ``%(organization_id)s`` / ``%(organization_ids)s``
is NULL for "all organizations".

    with psycopg.connect(dsn) as conn:
        report = build_report(conn, days=7)
        print(render_report(report))            # aligned tables
        json.dumps(report_json(report))         # the same, for machines
"""

from __future__ import annotations

import dataclasses
import decimal
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

__all__ = [
    "Report",
    "books_history",
    "books_snapshot",
    "budgets_near_limit",
    "build_report",
    "format_table",
    "jsonable",
    "last_run",
    "render_report",
    "report_json",
    "server_clock",
]

Row = dict[str, Any]

# ----------------------------------------------------------- the report

# Periods that overlap the report's days [since, until].
PERIOD_USAGE = """
SELECT o.id AS organization_id, o.name, o.status, p.period_start, p.period_end,
       p.allowance_credits, p.used_credits, p.held_credits, p.used_cents
  FROM llm.periods AS p
  JOIN llm.organizations AS o ON o.id = p.organization_id
 WHERE (%(organization_id)s::uuid IS NULL OR p.organization_id = %(organization_id)s::uuid)
   AND p.period_end > %(since)s::date
   AND p.period_start <= %(until)s::date
 ORDER BY o.name, o.id, p.period_start
"""

DAILY_USAGE = """
SELECT d.day, d.organization_id, o.name, d.model, d.requests, d.recovered_requests,
       d.credits, d.cents, d.input_tokens, d.output_tokens
  FROM llm.daily_usage AS d
  JOIN llm.organizations AS o ON o.id = d.organization_id
 WHERE (%(organization_id)s::uuid IS NULL OR d.organization_id = %(organization_id)s::uuid)
   AND d.day BETWEEN %(since)s::date AND %(until)s::date
 ORDER BY d.day DESC, o.name, d.organization_id, d.model
"""

# Requests still holding credits; past_window ones are what the next pass recovers.
OPEN_HOLDS = """
SELECT i.organization_id, o.name,
       count(*) AS open_requests,
       sum(i.hold_credits)::bigint AS held_credits,
       min(i.created_at) AS oldest_created_at,
       count(*) FILTER (WHERE i.created_at <= %(now)s::timestamptz - s.recovery_window) AS past_window
  FROM llm.invocations AS i
  JOIN llm.organizations AS o ON o.id = i.organization_id
 CROSS JOIN llm.settings AS s
 WHERE i.status IN ('reserved', 'dispatched')
   AND (%(organization_id)s::uuid IS NULL OR i.organization_id = %(organization_id)s::uuid)
 GROUP BY i.organization_id, o.name, s.recovery_window
 ORDER BY o.name, i.organization_id
"""

# Tasks started within the report's days, and every task still running.
TASKS_BY_STATUS = """
SELECT x.organization_id, o.name, x.status,
       count(*) AS tasks,
       sum(x.request_count)::bigint AS requests,
       sum(x.credits)::bigint AS credits,
       sum(x.cents)::bigint AS cents
  FROM llm.executions AS x
  JOIN llm.organizations AS o ON o.id = x.organization_id
 WHERE (%(organization_id)s::uuid IS NULL OR x.organization_id = %(organization_id)s::uuid)
   AND (x.status = 'running' OR x.started_at >= (%(since)s::date::timestamp AT TIME ZONE 'UTC'))
 GROUP BY x.organization_id, o.name, x.status
 ORDER BY o.name, x.organization_id, x.status
"""

# ``llm-db report --by SCOPE``: usage per scope id from the requests admitted in the
# report's days (so ids without a budget show too). The scope's column is chosen from
# a fixed list (BY_SCOPES), never from free text.
BY_SCOPES = ("project", "api_key", "end_user")
USAGE_BY_SCOPE = """
SELECT i.organization_id, o.name, s.{scope} AS scope_id,
       count(*) AS requests,
       count(*) FILTER (WHERE i.status IN ('reserved', 'dispatched')) AS open_requests,
       coalesce(sum(i.charged_credits) FILTER (WHERE i.status IN ('settled', 'failed')), 0)::bigint
           AS used_credits,
       coalesce(sum(i.hold_credits) FILTER (WHERE i.status IN ('reserved', 'dispatched')), 0)::bigint
           AS held_credits,
       coalesce(sum(i.charged_cents) FILTER (WHERE i.status IN ('settled', 'failed')), 0)::bigint
           AS used_cents
  FROM llm.invocations AS i
  JOIN llm.invocation_scopes AS s ON s.organization_id = i.organization_id AND s.invocation_id = i.id
  JOIN llm.organizations AS o ON o.id = i.organization_id
 WHERE (%(organization_id)s::uuid IS NULL OR i.organization_id = %(organization_id)s::uuid)
   AND s.{scope} IS NOT NULL
   -- the periods of those days first, so an organization's index invocations_period serves
   AND i.period_start BETWEEN pg_catalog.date_trunc('month', %(since)s::date)::date AND %(until)s::date
   AND i.created_at >= (%(since)s::date::timestamp AT TIME ZONE 'UTC')
   AND i.created_at < ((%(until)s::date + 1)::timestamp AT TIME ZONE 'UTC')
 GROUP BY i.organization_id, o.name, s.{scope}
 ORDER BY o.name, i.organization_id, used_credits DESC, scope_id
"""

# The budgets near their limit: counters of the windows containing %(now)s whose used +
# held stand at or above the first threshold of the budget that applies to them now
# (the id's own, else the scope's '*'), as llm.budget_usage pairs them. %(scope)s NULL:
# every scope. A scan of llm.budget_counters (the current windows are not indexed).
BUDGETS_NEAR_LIMIT = """
SELECT c.organization_id, o.name, c.scope, c.scope_id, c.budget_window, c.window_start,
       b.limit_credits, b.thresholds[1] AS first_threshold,
       c.used_credits, c.held_credits, c.used_cents
  FROM llm.budget_counters AS c
  JOIN llm.organizations AS o ON o.id = c.organization_id
 CROSS JOIN LATERAL (SELECT l.limit_credits, l.thresholds FROM llm.budget_limits AS l
                      WHERE l.organization_id = c.organization_id AND l.scope = c.scope
                        AND l.budget_window = c.budget_window
                        AND (l.scope_id IS NOT DISTINCT FROM c.scope_id OR l.scope_id = '*')
                      ORDER BY l.scope_id = '*' LIMIT 1) AS b
 WHERE (%(organization_id)s::uuid IS NULL OR c.organization_id = %(organization_id)s::uuid)
   AND (%(scope)s::text IS NULL OR c.scope = %(scope)s::text)
   AND c.window_start = pg_catalog.date_trunc(c.budget_window, %(now)s::timestamptz AT TIME ZONE 'UTC')::date
   AND (c.used_credits + c.held_credits)::numeric * 100 >= b.limit_credits::numeric * b.thresholds[1]
 ORDER BY o.name, c.organization_id, c.scope, c.scope_id, c.budget_window
"""

BUDGETS_NEAR_LIMIT_BY_SCOPE = f"""
SELECT n.scope, count(*) AS budgets FROM ({BUDGETS_NEAR_LIMIT}) AS n GROUP BY n.scope
"""

# ----------------------------------------------------------- the books at a glance

SERVER_CLOCK = "SELECT pg_catalog.now() AS now"

# One row: what the next pass would act on, for some organizations (NULL: all).
# Cheap on a large database: every count is over a partial index (open requests,
# running tasks, owed / sending notices) or a small table (drift findings), so
# `llm-db metrics` can run it at every scrape. The open requests and the running
# tasks are each read once, their stale share counted by FILTER.
BOOKS_SNAPSHOT = """
WITH s AS (SELECT st.recovery_window FROM llm.settings AS st)
SELECT i.open_requests, i.held_credits, i.stale_open_requests, i.stale_held_credits,
       x.running_tasks, x.stale_running_tasks,
    (SELECT count(*) FROM llm.drift_findings AS f
      WHERE (%(organization_ids)s::uuid[] IS NULL OR f.organization_id = ANY (%(organization_ids)s::uuid[])))
        AS drift_findings,
    (SELECT count(*) FROM llm.threshold_notices AS n
      WHERE n.status = 'owed'
        AND (%(organization_ids)s::uuid[] IS NULL OR n.organization_id = ANY (%(organization_ids)s::uuid[])))
        AS notices_owed,
    (SELECT count(*) FROM llm.threshold_notices AS n
      WHERE n.status = 'sending'
        AND (%(organization_ids)s::uuid[] IS NULL OR n.organization_id = ANY (%(organization_ids)s::uuid[])))
        AS notices_sending
  FROM (SELECT count(*) AS open_requests,
               coalesce(sum(i.hold_credits), 0)::bigint AS held_credits,
               count(*) FILTER (WHERE i.stale) AS stale_open_requests,
               coalesce(sum(i.hold_credits) FILTER (WHERE i.stale), 0)::bigint AS stale_held_credits
          FROM (SELECT i.hold_credits, i.created_at <= %(now)s::timestamptz - s.recovery_window AS stale
                  FROM llm.invocations AS i CROSS JOIN s
                 WHERE i.status IN ('reserved', 'dispatched')
                   AND (%(organization_ids)s::uuid[] IS NULL
                        OR i.organization_id = ANY (%(organization_ids)s::uuid[]))) AS i) AS i
 CROSS JOIN
       (SELECT count(*) AS running_tasks,
               count(*) FILTER (WHERE x.started_at <= %(now)s::timestamptz - s.recovery_window)
                   AS stale_running_tasks
          FROM llm.executions AS x CROSS JOIN s
         WHERE x.status = 'running'
           AND (%(organization_ids)s::uuid[] IS NULL OR x.organization_id = ANY (%(organization_ids)s::uuid[])))
           AS x
"""

# The stale open requests by their organization's status, what every sweep ever
# recovered (the totals the sweeps keep, llm.sweep_totals: one row per organization)
# and the open period findings: the rest of what `llm-db metrics` reads at a scrape.
STALE_BY_ORGANIZATION_STATUS = """
SELECT o.status AS organization_status, count(*) AS stale_open_requests,
       coalesce(sum(i.hold_credits), 0)::bigint AS stale_held_credits
  FROM llm.invocations AS i
  JOIN llm.organizations AS o ON o.id = i.organization_id
 CROSS JOIN llm.settings AS s
 WHERE i.status IN ('reserved', 'dispatched')
   AND i.created_at <= %(now)s::timestamptz - s.recovery_window
 GROUP BY o.status
"""

SWEEP_TOTALS = """
SELECT coalesce(sum(t.recovered_requests), 0)::bigint AS recovered_requests,
       coalesce(sum(t.recovered_uncharged), 0)::bigint AS recovered_uncharged,
       coalesce(sum(t.past_window_alerts), 0)::bigint AS past_window_alerts,
       (SELECT count(*) FROM llm.period_findings AS f WHERE f.resolved_at IS NULL) AS period_findings
  FROM llm.sweep_totals AS t
"""

# What passes have done to some organizations, over their whole history: requests
# recovered, past-window alerts, tasks abandoned, notices sent. These scan the
# organizations' rows, so only the demo (a handful of organizations) reads them.
BOOKS_HISTORY = """
SELECT
    (SELECT count(*) FROM llm.invocations AS i
      WHERE i.organization_id = ANY (%(organization_ids)s::uuid[])
        AND i.settlement_kind = 'recovered') AS recovered_requests,
    (SELECT count(*) FROM llm.invocations AS i
      WHERE i.organization_id = ANY (%(organization_ids)s::uuid[])
        AND i.past_window_alerted_at IS NOT NULL) AS past_window_alerts,
    (SELECT count(*) FROM llm.executions AS x
      WHERE x.organization_id = ANY (%(organization_ids)s::uuid[])
        AND x.status = 'abandoned') AS abandoned_tasks,
    (SELECT count(*) FROM llm.threshold_notices AS n
      WHERE n.organization_id = ANY (%(organization_ids)s::uuid[])
        AND n.status = 'sent') AS notices_sent
"""

# The newest finished pass that was not skipped (the one health judges), with
# its age on the pass's own clock, as llm.reconciliation_health computes it.
LAST_RUN = """
SELECT r.*,
       pg_catalog.date_part('epoch', r.finished_at - r.started_at) AS duration_seconds,
       pg_catalog.date_part('epoch', %(now)s::timestamptz - (r.clock + (r.finished_at - r.started_at)))
           AS age_seconds
  FROM llm.reconciliation_runs AS r
 WHERE r.finished_at IS NOT NULL AND r.status <> 'skipped'
 ORDER BY r.clock DESC, r.started_at DESC
 LIMIT 1
"""

# Per organization: its allowance and the sum over its periods, and its notices.
ORGANIZATION_TOTALS = """
SELECT o.id AS organization_id, o.name, o.status,
       o.monthly_allowance_credits AS allowance_credits,
       coalesce(sum(p.used_credits), 0)::bigint AS used_credits,
       coalesce(sum(p.held_credits), 0)::bigint AS held_credits,
       coalesce(sum(p.used_cents), 0)::bigint AS used_cents,
       (SELECT count(*) FROM llm.threshold_notices AS n WHERE n.organization_id = o.id) AS notices
  FROM llm.organizations AS o
  LEFT JOIN llm.periods AS p ON p.organization_id = o.id
 WHERE o.id = ANY (%(organization_ids)s::uuid[])
 GROUP BY o.id, o.name, o.status, o.monthly_allowance_credits
 ORDER BY o.name, o.id
"""

# ----------------------------------------------------------- a pass in progress

OPERATIONAL_ORGANIZATIONS = """
SELECT count(*) AS organizations FROM llm.organizations AS o WHERE o.status = 'operational'
"""

# How far the pass that started after %(since)s has got (it commits after each organization).
RUN_PROGRESS = """
SELECT r.orgs_visited
  FROM llm.reconciliation_runs AS r
 WHERE r.started_at >= %(since)s::timestamptz AND r.status = 'running'
 ORDER BY r.started_at DESC
 LIMIT 1
"""

CURRENT_DATABASE = "SELECT pg_catalog.current_database() AS dbname"


# ----------------------------------------------------------- reading


def _rows(conn: psycopg.Connection, query: str, params: Mapping[str, Any]) -> list[Row]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)  # type: ignore[arg-type]
        return cur.fetchall()


def server_clock(conn: psycopg.Connection, now: datetime | None = None) -> datetime:
    """``now`` when given, else the server's ``now()``."""
    if now is not None:
        return now
    return _rows(conn, SERVER_CLOCK, {})[0]["now"]


def books_snapshot(
    conn: psycopg.Connection,
    *,
    now: datetime | None = None,
    organization_ids: Sequence[UUID | str] | None = None,
) -> Row:
    """Open requests and holds (all, and older than the recovery window), tasks running
    (all, and older than the window), drift findings, and owed / sending notices, for
    ``organization_ids`` (None: every organization)."""
    params = {
        "now": server_clock(conn, now),
        "organization_ids": None
        if organization_ids is None
        else [str(i) for i in organization_ids],
    }
    return _rows(conn, BOOKS_SNAPSHOT, params)[0]


def stale_by_organization_status(conn: psycopg.Connection, *, now: datetime | None = None) -> dict[str, Row]:
    """Open requests older than the recovery window, and their holds, by the status of
    their organization (operational ones the next pass recovers; the others it never
    visits)."""
    found = _rows(conn, STALE_BY_ORGANIZATION_STATUS, {"now": server_clock(conn, now)})
    return {r["organization_status"]: r for r in found}


def sweep_totals(conn: psycopg.Connection) -> Row:
    """Requests recovered (and of them, charged nothing) and past-window alerts, ever, as
    the sweeps counted them, and the period findings still open."""
    return _rows(conn, SWEEP_TOTALS, {})[0]


def books_history(conn: psycopg.Connection, organization_ids: Sequence[UUID | str]) -> Row:
    """Requests recovered, past-window alerts, tasks abandoned and notices sent, ever,
    for these organizations (a scan of their rows: not for every scrape)."""
    return _rows(conn, BOOKS_HISTORY, {"organization_ids": [str(i) for i in organization_ids]})[0]


def last_run(conn: psycopg.Connection, *, now: datetime | None = None) -> Row | None:
    """The newest finished, not skipped ``llm.reconciliation_runs`` row, with
    ``duration_seconds`` and ``age_seconds`` (on the pass's clock); None if none."""
    found = _rows(conn, LAST_RUN, {"now": server_clock(conn, now)})
    return found[0] if found else None


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
    #: ``--by``: the scope, its ids' usage (USAGE_BY_SCOPE) and its budgets near their limit
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
    org = None if organization_id is None else str(organization_id)
    params = {"organization_id": org, "since": since, "until": until, "now": clock}
    return Report(
        now=clock,
        since=since,
        until=until,
        organization_id=None if org is None else UUID(org),
        periods=_rows(conn, PERIOD_USAGE, params),
        daily_usage=_rows(conn, DAILY_USAGE, params),
        open_holds=_rows(conn, OPEN_HOLDS, params),
        tasks=_rows(conn, TASKS_BY_STATUS, params),
        by=by,
        by_usage=[] if by is None else _rows(conn, USAGE_BY_SCOPE.format(scope=by), params),
        budgets_near_limit=[]
        if by is None
        else _rows(conn, BUDGETS_NEAR_LIMIT, {**params, "scope": by}),
    )


def budgets_near_limit(conn: psycopg.Connection, *, now: datetime | None = None) -> dict[str, int]:
    """How many budget counters of the current windows stand at or above their budget's
    first threshold, by scope (scopes with none are absent)."""
    params = {"organization_id": None, "scope": None, "now": server_clock(conn, now)}
    return {r["scope"]: r["budgets"] for r in _rows(conn, BUDGETS_NEAR_LIMIT_BY_SCOPE, params)}


def _utc_day(moment: datetime) -> date:
    offset = moment.utcoffset()
    return (moment - offset).date() if offset is not None else moment.date()


# ----------------------------------------------------------- rendering


def jsonable(value: Any) -> Any:
    """``value`` with uuids, dates, datetimes and decimals turned into JSON types."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


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


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | decimal.Decimal):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    if isinstance(value, date):
        return value.isoformat()
    return str(value)


def format_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    align: str | None = None,
    indent: int = 2,
    empty: str = "none",
) -> str:
    """An aligned text table: numbers right-aligned (with thousands separators),
    text left-aligned, None as ``-``; ``align`` ("lrr…") overrides per column.
    ``empty`` is printed when there are no rows."""
    pad = " " * indent
    if not rows:
        return f"{pad}({empty})"
    cells = [[_cell(v) for v in r] for r in rows]
    if align is not None:
        numeric = [a == "r" for a in align.ljust(len(headers), "l")]
    else:
        numeric = [
            all(isinstance(r[i], int | float | decimal.Decimal) or r[i] is None for r in rows)
            and not all(r[i] is None for r in rows)
            for i in range(len(headers))
        ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return (pad + "  ".join(parts)).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(c) for c in cells]
    return "\n".join(out)


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
