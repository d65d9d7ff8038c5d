"""A budget's threshold notices (docs/architecture.md "Budgets"): a notice's
window_start holds its budget's window start, which for a day or week window is
rarely the first of a month, so a notice is not tied to a period, and its
limit_credits the budget's limit. Through 0.4.x each is also under its name of 0.3.0,
period_start and allowance_credits, and a CHECK constraint keeps the two equal."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest

from llm_db import Llm, migrate
from llm_db.service.notices import notice_body
from tests.helpers import T0, admit, invariants, new_org, notices, rows, set_budget, settle

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


def test_a_notice_holds_its_window_start_and_limit_under_their_names_and_the_old_ones(llm_conn):
    """The allowance's notice and a day budget's: window_start is the month's first day
    and the budget's day, limit_credits the allowance and the budget's limit; the
    columns of 0.3.0 hold the same; the claimed Notice and the webhook's body carry
    the new names."""
    org = new_org(llm_conn, 1_000, thresholds=[50])
    set_budget(llm_conn, org, "api_key", "key-1", "day", 800, thresholds=[50])
    inv = admit(llm_conn, org, 600, api_key="key-1")["id"]
    assert settle(llm_conn, org, inv, 600, 3) == "settled"

    held = sorted((n["scope"], n["window_start"], n["limit_credits"], n["period_start"], n["allowance_credits"])
                  for n in notices(llm_conn, org))  # fmt: skip
    assert held == [("api_key", DAY, 800, DAY, 800), ("organization", DAY.replace(day=1), 1_000, DAY.replace(day=1), 1_000)]
    claimed = {n.scope: n for n in Llm(llm_conn).claim_notices(now=T0)}
    assert (claimed["api_key"].window_start, claimed["api_key"].limit_credits) == (DAY, 800)
    assert (claimed["organization"].window_start, claimed["organization"].limit_credits) == (DAY.replace(day=1), 1_000)
    assert b'"window_start":"2026-01-15"' in notice_body(claimed["api_key"])
    assert b'"limit_credits":800' in notice_body(claimed["api_key"])
    assert invariants(llm_conn) == []


def test_a_notice_whose_new_names_differ_from_its_old_ones_is_refused_23514(llm_conn):
    """threshold_notices_names: every row's window_start and limit_credits equal its
    period_start and allowance_credits (NULL included), so 0.5.0's readers need only the new names."""
    org = new_org(llm_conn, 100, thresholds=[50])
    settle(llm_conn, org, admit(llm_conn, org, 60)["id"], 60, 0)
    for change in ("window_start = window_start + 1", "limit_credits = NULL", "allowance_credits = 101"):
        with pytest.raises(psycopg.errors.CheckViolation, match="threshold_notices_names"):
            llm_conn.execute(f"UPDATE llm.threshold_notices SET {change} WHERE organization_id = %s", [org])


def test_a_notice_the_previous_release_owed_gets_its_new_names_by_claim_and_contract_step(
    llm_conn, llm_dsn
):
    """Through an upgrade from 0.3.0 (whose functions write neither new name) until its
    contract step: a claim fills the notice it claims; the contract step fills the rest
    and validates the constraint. Replayed here by taking the constraint and the names
    off two notices, as the previous release leaves them, and the step's record."""
    org = new_org(llm_conn, 100, thresholds=[50, 80])
    settle(llm_conn, org, admit(llm_conn, org, 90)["id"], 90, 0)
    llm_conn.execute("ALTER TABLE llm.threshold_notices DROP CONSTRAINT threshold_notices_names")
    llm_conn.execute("UPDATE llm.threshold_notices SET window_start = NULL, limit_credits = NULL")
    llm_conn.execute("DELETE FROM llm.upgrade_steps WHERE step = '0028_notice_names'")

    (claimed,) = Llm(llm_conn).claim_notices(limit=1, now=T0)
    assert (claimed.window_start, claimed.limit_credits) == (DAY.replace(day=1), 100)
    left = rows(llm_conn, "SELECT threshold_pct FROM llm.threshold_notices WHERE window_start IS NULL")
    assert [n["threshold_pct"] for n in left] == [130 - claimed.threshold_pct]  # the other one

    assert "0028_notice_names" in migrate(llm_dsn).contract_steps
    assert rows(llm_conn, "SELECT convalidated FROM pg_catalog.pg_constraint"
                          " WHERE conname = 'threshold_notices_names'") == [{"convalidated": True}]  # fmt: skip
    assert [(n["window_start"], n["limit_credits"]) for n in notices(llm_conn, org)] == [(DAY.replace(day=1), 100)] * 2
    assert invariants(llm_conn) == []
