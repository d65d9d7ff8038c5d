"""Daily reporting: llm.rebuild_daily_usage recomputes days from the invocations by UTC
settlement day and model, idempotently (WF-PFM-LLM-004 hop 6 rebuilds it each pass; see
test_pass.py for the pass step)."""

from __future__ import annotations

import uuid
from datetime import date, datetime, timedelta
from typing import Any

import psycopg
import pytest

from llm_db.cli.report import build_report, render_report, report_json
from tests.helpers import (
    DAY,
    HOUR,
    JANUARY,
    T0,
    admit,
    call,
    call_pass,
    fail,
    invariants,
    reconcile,
    set_budget,
    settle,
)
from tests.helpers import new_org as _new_org

# The terminal requests, which the oracle below sums in Python: an aggregate independent
# of the SQL under test (llm.rebuild_daily_usage), not a copy of it.
TERMINAL_REQUESTS = """
    SELECT i.organization_id, (i.settled_at AT TIME ZONE 'UTC')::date AS day, i.model,
           i.settlement_kind, i.charged_credits, i.charged_cents, i.input_tokens, i.output_tokens
      FROM llm.invocations AS i
     WHERE i.status IN ('settled', 'failed')
"""
DAILY_USAGE = """
    SELECT organization_id, day, model, requests, recovered_requests, credits, cents, input_tokens, output_tokens
      FROM llm.daily_usage ORDER BY 1, 2, 3
"""


# ---------------------------------------------------------------- local helpers


def new_org(conn: psycopg.Connection) -> uuid.UUID:
    """An organization without an allowance."""
    return _new_org(conn, None)


def admitted(conn: psycopg.Connection, org: uuid.UUID, estimate: int, model: str, now: datetime) -> uuid.UUID:
    return admit(conn, org, estimate, model, now=now)["id"]


def settled(conn: psycopg.Connection, org: uuid.UUID, model: str, at: datetime, credits: int = 10,
            cents: int = 3, tokens: tuple[int, int] = (100, 20)) -> uuid.UUID:
    inv = admitted(conn, org, credits, model, at - HOUR)
    assert settle(conn, org, inv, credits, cents, input_tokens=tokens[0], output_tokens=tokens[1],
                  now=at) == "settled"
    return inv


def rebuild(conn: psycopg.Connection, start: date, end: date) -> int:
    return call(conn, "rebuild_daily_usage", start, end)[0]["value"]


def daily(conn: psycopg.Connection) -> list[tuple[Any, ...]]:
    return conn.execute(DAILY_USAGE).fetchall()


def direct(conn: psycopg.Connection, start: date, end: date) -> list[tuple[Any, ...]]:
    """What llm.daily_usage should hold for days start .. end, summed here from the requests:
    per (organization, UTC settlement day, model), requests, recovered (or trued-up) ones,
    credits, cents and tokens."""
    sums: dict[tuple[Any, ...], list[int]] = {}
    for org, day, model, kind, credits, cents, tokens_in, tokens_out in conn.execute(TERMINAL_REQUESTS):
        if start <= day <= end:
            row = sums.setdefault((org, day, model), [0] * 6)
            for i, value in enumerate((1, kind in ("recovered", "trued_up"), credits, cents, tokens_in, tokens_out)):
                row[i] += value or 0
    return [(*key, *row) for key, row in sorted(sums.items())]


def mixed_history(conn: psycopg.Connection) -> tuple[uuid.UUID, uuid.UUID]:
    """Measured, failed (with partial charge), zero-charge failed and recovered requests of two
    organizations and two models over three UTC days."""
    a, b = new_org(conn), new_org(conn)
    for day in range(3):
        at = T0 + day * 24 * HOUR
        settled(conn, a, "model-a", at, credits=10 + day, cents=day)
        settled(conn, a, "model-b", at + HOUR, credits=5, cents=1, tokens=(7, 3))
        settled(conn, b, "model-a", at + 2 * HOUR, credits=1, cents=0)
    partial = admitted(conn, a, 9, "model-a", T0)
    fail(conn, a, partial, "cut off", 4, 2, now=T0 + HOUR)
    free = admitted(conn, b, 9, "model-b", T0)
    fail(conn, b, free, "refused", now=T0 + HOUR)
    admitted(conn, b, 33, "model-a", T0)  # stranded: recovered at T0 + 25 h (day 2)
    reconcile(conn, b, now=T0 + 25 * HOUR)
    admitted(conn, a, 50, "model-a", T0 + HOUR)  # still open: never reported
    return a, b


# ---------------------------------------------------------------- tests


def test_rebuild_daily_usage_equals_direct_aggregate_by_utc_settlement_day(llm_conn):
    """WF-PFM-LLM-004 hop 6: rebuild_daily_usage writes, per (organization, UTC settlement day,
    model), the requests, recovered requests, credits, cents and tokens of the terminal
    invocations — exactly a direct aggregate over llm.invocations; open requests are not
    reported."""
    mixed_history(llm_conn)
    start, end = T0.date(), (T0 + 2 * 24 * HOUR).date()
    written = rebuild(llm_conn, start, end)
    expected = direct(llm_conn, start, end)
    assert daily(llm_conn) == expected
    assert written == len(expected) == 3 * 3 + 1  # 3 days x (a/model-a, a/model-b, b/model-a) + b/model-b failed
    recovered = llm_conn.execute("SELECT day, recovered_requests, credits, cents FROM llm.daily_usage"
                                 " WHERE recovered_requests > 0").fetchall()
    assert recovered == [((T0 + 25 * HOUR).date(), 1, 33 + 1, 0)]


def test_rebuild_daily_usage_is_idempotent(llm_conn):
    """rebuild_daily_usage is idempotent: rebuilding the same days again writes the same rows and
    returns the same count; a rebuild after more settlements reflects them without duplicates."""
    org, _ = mixed_history(llm_conn)
    start, end = T0.date(), (T0 + 2 * 24 * HOUR).date()
    first_count = rebuild(llm_conn, start, end)
    first = daily(llm_conn)
    assert rebuild(llm_conn, start, end) == first_count
    assert daily(llm_conn) == first
    settled(llm_conn, org, "model-a", T0 + 3 * HOUR, credits=100, cents=50)
    rebuild(llm_conn, start, end)
    rebuild(llm_conn, start, end)
    assert daily(llm_conn) == direct(llm_conn, start, end)


def test_settlements_at_235959_and_000001_utc_land_on_different_days(llm_conn):
    """A settlement at 23:59:59 UTC and one at 00:00:01 UTC the next day land on different
    days, whatever the session time zone."""
    org = new_org(llm_conn)
    first_day, second_day = T0.date(), T0.date() + DAY
    before_midnight = T0.replace(hour=23, minute=59, second=59)
    after_midnight = before_midnight + timedelta(seconds=2)
    settled(llm_conn, org, "model-a", before_midnight, credits=7)
    settled(llm_conn, org, "model-a", after_midnight, credits=11)
    llm_conn.execute("SET TIME ZONE 'America/Los_Angeles'")  # 15:59:59 and 16:00:01 the same local day
    assert rebuild(llm_conn, first_day, second_day) == 2
    assert llm_conn.execute("SELECT day, requests, credits FROM llm.daily_usage ORDER BY day").fetchall() == [
        (first_day, 1, 7), (second_day, 1, 11)]
    llm_conn.execute("SET TIME ZONE 'Asia/Tokyo'")
    assert rebuild(llm_conn, second_day, second_day) == 1
    assert llm_conn.execute("SELECT day, credits FROM llm.daily_usage ORDER BY day").fetchall() == [
        (first_day, 7), (second_day, 11)]


def test_rebuild_touches_only_the_requested_days(llm_conn):
    """rebuild_daily_usage replaces exactly p_from .. p_to: a stale row inside the range is
    removed, rows outside it are left as they were."""
    org = new_org(llm_conn)
    settled(llm_conn, org, "model-a", T0)
    settled(llm_conn, org, "model-a", T0 + 24 * HOUR)
    rebuild(llm_conn, T0.date(), (T0 + 24 * HOUR).date())
    llm_conn.execute("UPDATE llm.daily_usage SET credits = 999 WHERE day = %s", [T0.date()])
    llm_conn.execute("INSERT INTO llm.daily_usage VALUES (%s, %s, 'ghost', 1, 0, 1, 0, 0, 0)",
                     [org, (T0 + 24 * HOUR).date()])
    assert rebuild(llm_conn, (T0 + 24 * HOUR).date(), (T0 + 24 * HOUR).date()) == 1
    assert llm_conn.execute("SELECT day, model, credits FROM llm.daily_usage ORDER BY day, model").fetchall() == [
        (T0.date(), "model-a", 999), ((T0 + 24 * HOUR).date(), "model-a", 10)]


@pytest.mark.parametrize("start, end", [(JANUARY + DAY, JANUARY), (None, JANUARY), (JANUARY, None),
                                        (JANUARY.replace(year=JANUARY.year - 30), JANUARY)])
def test_rebuild_daily_usage_rejects_a_bad_range_22023(llm_conn, start, end):
    """rebuild_daily_usage raises 22023 for a NULL bound, p_to before p_from or a range over ten
    years."""
    with pytest.raises(psycopg.Error) as raised:
        rebuild(llm_conn, start, end)
    assert raised.value.sqlstate == "22023"


# ---------------------------------------------------------------- healing after an outage


def test_daily_usage_heals_after_a_three_day_outage(llm_conn):
    """WF-PFM-LLM-004 hop 6 ("stale daily totals await later passes"): the pass was down for
    three days. The first pass after it rebuilds every day since the last complete rebuild
    (each day its own transaction), not only settings.reporting_days: the day of the last
    pass before the outage, whose later settlements that pass never saw, is counted too."""
    org = new_org(llm_conn)
    last_before = T0 + 2 * HOUR
    call_pass(llm_conn, last_before)
    rebuilt = llm_conn.execute("SELECT daily_rebuilt_through FROM llm.reconciliation_runs").fetchone()[0]
    assert rebuilt == T0.date()
    for day in range(4):  # T0's day after its last pass, then the three days of the outage
        settled(llm_conn, org, "model-a", T0 + timedelta(days=day, hours=6))
    after = T0 + timedelta(days=3, hours=9)

    call_pass(llm_conn, after)

    run = llm_conn.execute("SELECT daily_rows_rebuilt, daily_rebuilt_through, status FROM"
                           " llm.reconciliation_runs ORDER BY started_at DESC LIMIT 1").fetchone()  # fmt: skip
    assert run == (4, after.date(), "succeeded")
    days = [r[0] for r in llm_conn.execute("SELECT day FROM llm.daily_usage ORDER BY day")]
    assert days == [(T0 + timedelta(days=d)).date() for d in range(4)]
    assert daily(llm_conn) == direct(llm_conn, T0.date(), after.date())


def test_the_healing_reaches_back_at_most_35_days(llm_conn):
    """After a longer outage the pass rebuilds the last 35 days (today included), no more."""
    new_org(llm_conn)
    call_pass(llm_conn, T0)
    later = T0 + timedelta(days=50)
    call_pass(llm_conn, later)
    days = llm_conn.execute("SELECT array_length(llm._rebuild_days(%s), 1)", [later + HOUR]).fetchone()[0]
    assert days == 2  # just rebuilt: the next pass owes only the reporting days
    errors = llm_conn.execute("SELECT errors FROM llm.reconciliation_runs ORDER BY started_at DESC"
                              " LIMIT 1").fetchone()[0]  # fmt: skip
    assert errors == []
    first, last = llm_conn.execute(
        "SELECT min(d), max(d) FROM unnest(llm._rebuild_days(%s)) AS d", [later + timedelta(days=40)]
    ).fetchone()
    assert (first, last) == ((later + timedelta(days=6)).date(), (later + timedelta(days=40)).date())


# ---------------------------------------------------------------- llm-db report --by


def test_report_by_scope_counts_every_id_from_the_requests_and_lists_budgets_near_their_limit(
    llm_conn, llm_role_conn
):
    """`llm-db report --by`: the usage per end user comes from the requests admitted
    in the report's days, so an id with no budget shows too, and a request naming no end user
    does not; the budgets near their limit are the current windows whose used + held stand at
    or above the first threshold of the budget that applies (own, else '*'): not yesterday's
    window, not an id under its own higher budget. Read as llm_reader; the report without
    --by keeps its shape."""
    org = _new_org(llm_conn, 10_000, name="A org")
    bare = _new_org(llm_conn, 10_000, name="B org")  # no budget at all
    set_budget(llm_conn, org, "end_user", "*", "day", 100, thresholds=[50, 100])
    set_budget(llm_conn, org, "end_user", "vip", "day", 1000)  # thresholds 80, 100

    def spend(org: uuid.UUID, credits: int, at: datetime, **scopes: str) -> None:
        inv = admit(llm_conn, org, credits, now=at, **scopes)["id"]
        assert settle(llm_conn, org, inv, credits, 1, now=at) == "settled"

    spend(org, 60, T0 - DAY, end_user="u1")  # yesterday: 60 of 100, past the 50 % then
    spend(org, 30, T0, end_user="u1")
    admit(llm_conn, org, 25, now=T0, end_user="u1")  # open: used 30 + held 25 >= 50 %
    spend(org, 10, T0, end_user="u2")
    spend(org, 700, T0, end_user="vip")  # 70 % of its own 1000: under its 80 %
    spend(org, 5, T0, project="p")  # names no end user
    spend(bare, 3, T0, end_user="u9")

    reader = llm_role_conn("llm_reader")
    report = build_report(reader, days=1, now=T0 + HOUR, by="end_user")
    usage = [(r["name"], r["scope_id"], r["requests"], r["open_requests"], r["used_credits"],
              r["held_credits"], r["used_cents"]) for r in report.by_usage]  # fmt: skip
    assert usage == [
        ("A org", "vip", 1, 0, 700, 0, 1),
        ("A org", "u1", 2, 1, 30, 25, 1),
        ("A org", "u2", 1, 0, 10, 0, 1),
        ("B org", "u9", 1, 0, 3, 0, 1),
    ]
    near = [(r["name"], r["scope"], r["scope_id"], r["budget_window"], r["window_start"],
             r["limit_credits"], r["first_threshold"], r["used_credits"], r["held_credits"])
            for r in report.budgets_near_limit]  # fmt: skip
    assert near == [("A org", "end_user", "u1", "day", T0.date(), 100, 50, 30, 25)]
    text = render_report(report)
    assert "\nUsage by end_user" in text and "\nBudgets near their limit (end_user" in text
    assert "55%" in text  # u1's used + held of its limit

    by_project = build_report(reader, days=1, now=T0 + HOUR, by="project")
    assert [(r["scope_id"], r["used_credits"]) for r in by_project.by_usage] == [("p", 5)]
    assert by_project.budgets_near_limit == []
    plain = report_json(build_report(reader, days=1, now=T0 + HOUR))
    assert "by" not in plain and "by_usage" not in plain and "budgets_near_limit" not in plain
    with pytest.raises(ValueError):
        build_report(reader, by="model")
    assert invariants(llm_conn) == []
