"""A budget's threshold notices (docs/architecture.md "Budgets"): a notice's
period_start holds its budget's window start, which for a day or week window is
rarely the first of a month, so a notice is not tied to a period."""

from __future__ import annotations

from datetime import timedelta

from tests.helpers import T0, admit, invariants, new_org, notices, set_budget, settle

DAY = T0.date()  # 2026-01-15, a Thursday
WEEK = DAY - timedelta(days=DAY.weekday())  # Monday 2026-01-12


def test_a_day_and_a_week_budget_owe_their_notices_mid_month(llm_conn):
    """A settlement crossing a day budget's and a week budget's thresholds on the 15th
    settles and owes a notice per threshold, with the window start as period_start. Failed
    before (a foreign key tied period_start to a period: 23503, the settlement rolled back)."""
    org = new_org(llm_conn, 10_000)
    set_budget(llm_conn, org, "api_key", "key-1", "day", 100, thresholds=[50])
    set_budget(llm_conn, org, "organization", None, "week", 1000, thresholds=[5])
    inv = admit(llm_conn, org, 60, api_key="key-1")["id"]
    assert settle(llm_conn, org, inv, 60, 3) == "settled"

    owed = [(n["scope"], n["scope_id"], n["budget_window"], n["period_start"], n["threshold_pct"],
             n["used_credits"], n["allowance_credits"], n["status"]) for n in notices(llm_conn, org)]  # fmt: skip
    assert sorted(owed) == [
        ("api_key", "key-1", "day", DAY, 50, 60, 100, "owed"),
        ("organization", None, "week", WEEK, 5, 60, 1000, "owed"),
    ]
    assert invariants(llm_conn) == []
