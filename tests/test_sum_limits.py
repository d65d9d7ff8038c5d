"""The sums the books keep, driven to their limits (docs/architecture.md "Sum limits").

Every amount one call passes is capped at 10^15 (``MAX_AMOUNT``), but the books add
them up. 0.3.0 kept every sum in bigint and concluded that period sums could not
overflow: on an organization without an allowance the 9,224th open admission of
10^15 of a month failed with 22003 (bigint out of range), as did every admission of
that month while those holds stood (found by the budgets-airtight attacks). Now a
period's used + held credits, its used cents and a budget counter's are refused past
the sum limit, 10^18, with LL013 (``SumLimitExceeded``), nothing written; and what
nothing bounds (a task's credits, a day's usage, the reports) is numeric, read by the
driver as an exact ``int`` past 2^63.

The requests are admitted and settled by set-based statements (one statement, a
thousand calls of the public functions) so that a limit of 10^18 is reached in a
second; every call is a real one, by the owner, who is not a superuser.
"""

from __future__ import annotations

import uuid
from datetime import date, datetime, timedelta

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_db import AllowanceExhausted, Llm, SumLimitExceeded
from tests.fingerprint import fingerprint
from tests.helpers import (
    MAX_AMOUNT,
    T0,
    assert_sqlstate,
    invariants,
    new_org,
    open_task,
    row,
    rows,
    scalar,
    set_budget,
)

MAX_SUM = 10**18  # llm._max_sum()
FULL = MAX_SUM // MAX_AMOUNT  # the largest holds that fit one period: 1,000
UTC = T0.tzinfo


def admit_many(conn: psycopg.Connection, org: uuid.UUID, n: int, estimate: int, at: datetime, *,
               project: str | None = None, execution_id: uuid.UUID | None = None) -> None:
    """``n`` admissions by one statement (each a call of llm.admit_invocation)."""
    conn.execute(
        "SELECT count(a) FROM (SELECT llm.admit_invocation(p_organization_id => %(org)s,"
        "   p_estimate_credits => %(e)s, p_model => 'big', p_execution_id => %(x)s, p_now => %(at)s,"
        "   p_project => %(p)s) AS a FROM generate_series(1, %(n)s)) AS g",
        {"n": n, "org": org, "e": estimate, "at": at, "p": project, "x": execution_id})


def settle_open(conn: psycopg.Connection, org: uuid.UUID, credits: int, cents: int, at: datetime, *,
                tokens: int | None = None, admitted_before: datetime | None = None) -> int:
    """Settle the organization's open requests (admitted before ``admitted_before``), in
    admission order, each by one call of llm.settle_invocation; how many settled."""
    return scalar(
        conn,
        "SELECT count(llm.settle_invocation(i.organization_id, i.id, %(c)s, %(k)s, %(t)s, %(t)s, %(at)s))"
        "  FROM (SELECT organization_id, id FROM llm.invocations"
        "         WHERE organization_id = %(org)s AND status IN ('reserved', 'dispatched')"
        "           AND created_at < coalesce(%(before)s::timestamptz, 'infinity') ORDER BY created_at, id) AS i",
        {"org": org, "c": credits, "k": cents, "t": tokens, "at": at, "before": admitted_before})


def period(conn: psycopg.Connection, org: uuid.UUID, start: date) -> dict:
    return row(conn, "SELECT * FROM llm.periods WHERE organization_id = %s AND period_start = %s",
               [org, start])


@pytest.mark.parametrize("stripes", [1, 4])
def test_an_unlimited_period_holds_up_to_the_sum_limit_then_refuses_ll013(llm_conn, stripes):
    """Defect 6 as the attack met it: holds of 10^15 on an organization without an
    allowance. 1,000 fit exactly (10^18); the next is LL013 naming periods.held_credits,
    with nothing written, where 0.3.0 went on to 22003 at the 9,224th; the period's
    escrow (admit_room) keeps the limit on every stripe."""
    llm = Llm(llm_conn)
    org = new_org(llm_conn, None)
    assert llm.set_period_stripes(org, stripes) == stripes
    admit_many(llm_conn, org, FULL, MAX_AMOUNT, T0)
    assert period(llm_conn, org, T0.date().replace(day=1))["held_credits"] == MAX_SUM

    before = fingerprint(llm_conn)
    with pytest.raises(SumLimitExceeded) as refused:
        llm.admit(org, MAX_AMOUNT, "big", now=T0)
    assert refused.value.sqlstate == "LL013"
    assert (refused.value.table, refused.value.column) == ("periods", "held_credits")
    assert fingerprint(llm_conn) == before, "a refused admission wrote something"
    # one credit more is refused too, and 0 still fits (nothing grows)
    assert_sqlstate(llm_conn, "LL013",
                    "SELECT llm.admit_invocation(%s, 1, 'big', p_now => %s)", [org, T0])
    assert llm.admit(org, 0, "big", now=T0).hold_credits == 0
    # another month is a period of its own
    assert llm.admit(org, MAX_AMOUNT, "big", now=T0 + timedelta(days=31)).hold_credits == MAX_AMOUNT
    assert invariants(llm_conn) == []


@pytest.fixture
def unlimited_at_the_limit(llm_conn):
    """Requests admitted with estimate 0 hold nothing, so only their settlements grow
    the period: an organization without an allowance whose January has 1,000 of them
    settled at 10^15 each (used exactly 10^18) and one more open."""
    org = new_org(llm_conn, None)
    admit_many(llm_conn, org, FULL, 0, T0)
    assert settle_open(llm_conn, org, MAX_AMOUNT, 0, T0 + timedelta(minutes=1)) == FULL
    open_one = Llm(llm_conn).admit(org, 0, "big", now=T0 + timedelta(minutes=2)).id
    return org, open_one


def test_a_settlement_past_the_sum_limit_is_refused_ll013(llm_conn, unlimited_at_the_limit):
    """One credit more than the limit is LL013 naming periods.used_credits, with nothing
    written; a measured 0 then settles it."""
    org, inv = unlimited_at_the_limit
    llm = Llm(llm_conn)
    january = T0.date().replace(day=1)
    assert period(llm_conn, org, january)["used_credits"] == MAX_SUM
    before = fingerprint(llm_conn)
    with pytest.raises(SumLimitExceeded) as refused:
        llm.settle(org, inv, 1, 0, now=T0 + timedelta(minutes=3))
    assert (refused.value.table, refused.value.column) == ("periods", "used_credits")
    assert fingerprint(llm_conn) == before
    assert llm.settle(org, inv, 0, 0, now=T0 + timedelta(minutes=3)).value == "settled"
    assert invariants(llm_conn) == []


def test_an_open_request_refused_at_the_limit_is_recovered_by_the_pass(llm_conn, unlimited_at_the_limit):
    """The request whose settlement was refused stays open; the pass recovers it after
    the recovery window at its estimate (0), which fits, and the books are right."""
    org, inv = unlimited_at_the_limit
    llm = Llm(llm_conn)
    with pytest.raises(SumLimitExceeded):
        llm.settle(org, inv, MAX_AMOUNT, 0, now=T0 + timedelta(minutes=3))
    assert scalar(llm_conn, "SELECT status FROM llm.invocations WHERE id = %s", [inv]) == "reserved"
    swept = llm.reconcile_org(org, now=T0 + timedelta(hours=25))
    assert swept.recovered_requests == 1
    assert scalar(llm_conn, "SELECT settlement_kind FROM llm.invocations WHERE id = %s", [inv]) == "recovered"
    assert invariants(llm_conn) == []


def test_used_cents_past_the_sum_limit_are_refused_ll013(llm_conn):
    """Cents are a sum of their own: 1,000 settlements of 10^15 cents reach 10^18, the
    next cent is LL013 naming periods.used_cents (the stripes' cents_room keeps it)."""
    llm = Llm(llm_conn)
    org = new_org(llm_conn, None)
    assert llm.set_period_stripes(org, 2) == 2
    admit_many(llm_conn, org, FULL + 1, 0, T0)
    inv = scalar(llm_conn, "SELECT id FROM llm.invocations WHERE organization_id = %s"
                           " ORDER BY created_at, id LIMIT 1", [org])  # fmt: skip
    llm_conn.execute(
        "SELECT count(llm.settle_invocation(i.organization_id, i.id, 0, %(m)s, NULL, NULL, %(at)s))"
        "  FROM (SELECT organization_id, id FROM llm.invocations WHERE organization_id = %(org)s"
        "         AND id <> %(inv)s ORDER BY created_at, id) AS i",
        {"org": org, "inv": inv, "m": MAX_AMOUNT, "at": T0 + timedelta(minutes=1)})
    assert period(llm_conn, org, T0.date().replace(day=1))["used_cents"] == MAX_SUM
    before = fingerprint(llm_conn)
    with pytest.raises(SumLimitExceeded) as refused:
        llm.settle(org, inv, 0, 1, now=T0 + timedelta(minutes=2))
    assert (refused.value.table, refused.value.column) == ("periods", "used_cents")
    assert fingerprint(llm_conn) == before
    assert invariants(llm_conn) == []


def test_a_week_budget_across_two_months_is_refused_at_the_sum_limit(llm_conn):
    """A week's counter spans two periods, so it can grow past what one period may: the
    week of Monday 30 November 2026 under a project's week budget. 1,000 requests of
    estimate 0 admitted on 30 November and 1,000 on 1 December (each within the budget:
    they hold nothing); settled at 10^15 each, November's fill the counter to 10^18 and
    the first of December's is LL013 naming budget_counters.used_credits, though its own
    period (December) is empty. Nothing written; invariants empty."""
    llm = Llm(llm_conn)
    monday = datetime(2026, 11, 30, 12, tzinfo=UTC)
    tuesday = monday + timedelta(days=1)
    org = new_org(llm_conn, None, now=monday)
    set_budget(llm_conn, org, "project", "*", "week", MAX_AMOUNT, now=monday)
    admit_many(llm_conn, org, FULL, 0, monday, project="p")
    admit_many(llm_conn, org, 1, 0, tuesday, project="p")
    assert settle_open(llm_conn, org, MAX_AMOUNT, 0, tuesday, admitted_before=tuesday) == FULL
    (counter,) = [r for r in rows(llm_conn, "SELECT * FROM llm.budget_usage WHERE organization_id = %s",
                                  [org]) if r["budget_window"] == "week"]  # fmt: skip
    assert counter["used_credits"] == MAX_SUM
    inv = scalar(llm_conn, "SELECT id FROM llm.invocations WHERE organization_id = %s"
                           " AND status = 'reserved'", [org])  # fmt: skip
    before = fingerprint(llm_conn)
    with pytest.raises(SumLimitExceeded) as refused:
        llm.settle(org, inv, MAX_AMOUNT, 0, now=tuesday)
    assert (refused.value.table, refused.value.column) == ("budget_counters", "used_credits")
    assert fingerprint(llm_conn) == before
    assert period(llm_conn, org, date(2026, 12, 1))["used_credits"] == 0
    assert invariants(llm_conn) == []


def test_task_and_daily_sums_past_two_to_the_63_are_exact(llm_conn):
    """What nothing bounds is numeric: one task whose requests span ten months, 930 of
    10^15 credits (and 10^15 input tokens) in each, all settled on one day. The task's
    credits, the day's credits and tokens are 9.3 * 10^18, past 2^63 - 1, where 0.3.0
    failed with 22003; the reports return them through the driver as exact ints."""
    llm = Llm(llm_conn)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    day = datetime(2026, 10, 31, 12, tzinfo=UTC)
    org = new_org(llm_conn, None, now=start)
    task = open_task(llm_conn, org, now=start)
    per_month = 930
    for month in range(1, 11):
        admit_many(llm_conn, org, per_month, 0, datetime(2026, month, 2, tzinfo=UTC), execution_id=task)
    assert settle_open(llm_conn, org, MAX_AMOUNT, 0, day, tokens=MAX_AMOUNT) == 10 * per_month
    total = 10 * per_month * MAX_AMOUNT
    assert total > 2**63 - 1

    (tasks,) = llm.report_tasks(start.date(), [org])
    assert (tasks["requests"], tasks["credits"], tasks["cents"]) == (10 * per_month, total, 0)
    assert type(tasks["credits"]) is int
    llm.rebuild_daily_usage(day.date(), day.date())
    (usage,) = llm.report_daily_usage(day.date(), day.date(), [org])
    assert (usage["credits"], usage["input_tokens"], usage["output_tokens"]) == (total, total, total)
    assert type(usage["input_tokens"]) is int
    assert llm.check_daily_usage(day.date(), day.date()) == []
    (totals,) = llm.organization_totals([org])
    assert totals["used_credits"] == total
    assert invariants(llm_conn) == []


# ---------------------------------------------------------------- the property

AMOUNTS = st.sampled_from([0, 1, MAX_AMOUNT - 1, MAX_AMOUNT]) | st.integers(0, MAX_AMOUNT)
OPS = st.lists(
    st.tuples(st.sampled_from(["admit", "settle", "fail"]), AMOUNTS, AMOUNTS), min_size=1, max_size=12)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prefill=st.integers(FULL - 3, FULL - 1), allowance=st.sampled_from([None, MAX_AMOUNT]), ops=OPS)
def test_property_every_call_near_the_limit_succeeds_or_is_refused_whole(llm_conn, prefill, allowance, ops):
    """From a period filled near the sum limit (``prefill`` settled requests of 10^15 and
    one hold of 10^15 open), any sequence of admissions, settlements and failures with
    the extreme amounts either succeeds or is refused, LL013 (or LL001 under an
    allowance), with nothing written; the period never passes the limit and
    ``check_invariants()`` ends empty."""
    llm = Llm(llm_conn)
    org = new_org(llm_conn, None)
    admit_many(llm_conn, org, prefill, 0, T0)
    settle_open(llm_conn, org, MAX_AMOUNT, MAX_AMOUNT, T0)
    admit_many(llm_conn, org, 1, MAX_AMOUNT - 1, T0)
    if allowance is not None:
        new_org(llm_conn, allowance, org_id=org)
    open_ids = [r["id"] for r in rows(llm_conn, "SELECT id FROM llm.invocations WHERE organization_id = %s"
                                                " AND status = 'reserved'", [org])]  # fmt: skip
    now = T0 + timedelta(minutes=1)
    for op, a, b in ops:
        before = fingerprint(llm_conn, org)
        try:
            if op == "admit":
                open_ids.append(llm.admit(org, a, "big", now=now).id)
            elif open_ids and op == "settle":
                llm.settle(org, open_ids[0], a, b, now=now)
                open_ids.pop(0)
            elif open_ids:
                llm.fail(org, open_ids[0], "provider error", credits=a, cents=b, now=now)
                open_ids.pop(0)
        except (SumLimitExceeded, AllowanceExhausted) as refused:
            after = fingerprint(llm_conn, org)
            if isinstance(refused, AllowanceExhausted):  # the driver's report of it: a notice at most
                before.pop("threshold_notices")
                after.pop("threshold_notices")
            assert after == before, f"{op} refused with {refused.sqlstate} wrote"
        p = period(llm_conn, org, T0.date().replace(day=1))
        assert p["used_credits"] + p["held_credits"] <= MAX_SUM and p["used_cents"] <= MAX_SUM
    assert invariants(llm_conn) == []
