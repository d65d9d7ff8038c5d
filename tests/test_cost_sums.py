"""Every sum carries the cost beside the credits (docs/architecture.md "The price
book"): a period's, a task's, a budget counter's and a day's cost is its cents x 10^7
plus the nanos the book priced, exact and never rounded, and a request recovered at its
estimate (BR-CAP-PFM-LLM-009-01: no money figure) is in no cost sum but counted as a
request with no cost."""

from __future__ import annotations

import random
import uuid
from datetime import date, timedelta
from typing import Any

import psycopg
import pytest

from tests.helpers import (
    T0,
    budget_usage,
    call,
    daily_usage_findings,
    execution,
    invariants,
    new_org,
    open_task,
    period,
    reconcile,
    rows,
    set_budget,
    settle,
)

NANOS_PER_CENT = 10**7
DAY = T0.date()
# per million tokens: 1,000 input tokens cost 150,000 nanos, 0.015 of a cent
SMALL = {"input": "0.15", "output": "0.60"}
LARGE = {"input": "3", "cache_read": "0.30", "output": "15"}


@pytest.fixture
def book(llm_conn: psycopg.Connection) -> psycopg.Connection:
    since = T0 - timedelta(days=30)
    call(llm_conn, "set_price", "small", SMALL, effective_from=since)
    call(llm_conn, "set_price", "large", LARGE, effective_from=since)
    call(llm_conn, "set_credit_rate", 1000, effective_from=since)
    return llm_conn


def admit_priced(conn: psycopg.Connection, org: uuid.UUID, model: str, **kwargs: Any) -> uuid.UUID:
    kwargs.setdefault("now", T0)
    return call(conn, "admit", org, None, model, input_tokens=1000, max_output_tokens=100, **kwargs)[0]["id"]


def settle_usage(conn: psycopg.Connection, org: uuid.UUID, inv: uuid.UUID, usage: dict[str, int],
                 now: Any = T0) -> str:
    return call(conn, "settle_usage", org, inv, usage, now=now)[0]["value"]


def day_usage(conn: psycopg.Connection, org: uuid.UUID, day: date = DAY) -> dict[str, dict[str, Any]]:
    return {r["model"]: r for r in rows(conn, "SELECT * FROM llm.daily_usage WHERE organization_id = %s"
                                               " AND day = %s", (org, day))}


def test_every_sum_adds_the_books_cost_to_the_callers_cents(book: psycopg.Connection) -> None:
    org = new_org(book, 10**9)
    set_budget(book, org, "api_key", "k", "day", 10**9)
    task = open_task(book, org)
    # priced by the book: 1,000 * 3 + 50,000 * 0.30 + 200 * 15 = 21,000 millionths
    priced = admit_priced(book, org, "large", api_key="k", execution_id=task)
    assert settle_usage(book, org, priced, {"input": 1000, "cache_read": 50000, "output": 200}) == "settled"
    # priced by its caller: 7 cents
    caller = call(book, "admit", org, 50, "large", api_key="k", execution_id=task, now=T0)[0]["id"]
    assert settle(book, org, caller, 40, 7) == "settled"
    cost = 21_000_000 + 7 * NANOS_PER_CENT

    assert period(book, org)["used_cost_nanos"] == cost
    (counter,) = budget_usage(book, org).values()
    assert counter["used_cost_nanos"] == cost
    assert execution(book, org, task)["priced_nanos"] == 21_000_000
    (report,) = call(book, "report_tasks", DAY, [org])
    assert report["cost_nanos"] == cost

    call(book, "rebuild_daily_usage", DAY, DAY)
    large = day_usage(book, org)["large"]
    assert (large["cents"], large["priced_nanos"], large["uncosted_requests"]) == (7, 21_000_000, 0)
    assert daily_usage_findings(book, DAY, DAY) == []
    assert invariants(book) == []


def test_a_recovered_request_is_in_no_cost_sum_until_its_late_usage_trues_it_up(
        book: psycopg.Connection) -> None:
    """BR-CAP-PFM-LLM-009-01: recovery charges the stored estimate, with no money figure:
    the request counts as one with no cost. Its late usage under true_up moves every
    cost sum by its cost, the daily row the pass built included."""
    org = new_org(book, 10**9)
    call(book, "set_recovery_policy", org, "estimate", "true_up")
    set_budget(book, org, "project", "p", "month", 10**9)
    task = open_task(book, org)
    inv = admit_priced(book, org, "small", project="p", execution_id=task)
    recovered_at = T0 + timedelta(days=2)
    reconcile(book, org, now=recovered_at)
    day = recovered_at.date()
    call(book, "rebuild_daily_usage", day, day)
    assert day_usage(book, org, day)["small"]["uncosted_requests"] == 1
    assert period(book, org)["used_cost_nanos"] == 0
    assert next(iter(budget_usage(book, org).values()))["used_cost_nanos"] == 0

    assert settle_usage(book, org, inv, {"input": 1000, "output": 100}, now=recovered_at) == "trued_up"
    cost = 150_000 + 60_000
    assert period(book, org)["used_cost_nanos"] == cost
    assert next(iter(budget_usage(book, org).values()))["used_cost_nanos"] == cost
    assert execution(book, org, task)["priced_nanos"] == cost
    small = day_usage(book, org, day)["small"]
    assert (small["priced_nanos"], small["uncosted_requests"]) == (cost, 0)
    assert daily_usage_findings(book, day, day) == []
    assert invariants(book) == []


def test_a_thousand_calls_of_a_fraction_of_a_cent_add_up_exactly(book: psycopg.Connection) -> None:
    """Each call costs 0.021 of a cent: whole cents would book every one at 0. The
    period, the budget, the task and the day hold the exact sum, 21,000,000 nanos."""
    org = new_org(book, 10**9)
    set_budget(book, org, "organization", None, "week", 10**9)
    task = open_task(book, org)
    for _ in range(1000):
        inv = admit_priced(book, org, "small", execution_id=task)
        assert settle_usage(book, org, inv, {"input": 1000, "output": 100}) == "settled"
    assert period(book, org)["used_cost_nanos"] == 1000 * 210_000
    assert next(iter(budget_usage(book, org).values()))["used_cost_nanos"] == 1000 * 210_000
    assert execution(book, org, task)["priced_nanos"] == 1000 * 210_000
    call(book, "rebuild_daily_usage", DAY, DAY)
    assert day_usage(book, org)["small"]["priced_nanos"] == 1000 * 210_000
    # and what cents would have booked
    assert period(book, org)["used_cents"] == 0
    assert invariants(book) == []


def test_striped_periods_and_counters_sum_the_cost_of_mixed_settlements(
        book: psycopg.Connection, llm_connect) -> None:
    """A property run: requests on four period stripes and four budget stripes (two
    sessions, so two stripes in use), settled by the book, by their caller, failed with
    usage, or recovered, in a random order; each sum's cost is exact, the stripes are
    restriped midway, and check_invariants() returns nothing."""
    rng = random.Random(20261205)
    org = new_org(book, 10**12)
    call(book, "set_period_stripes", org, 4)
    set_budget(book, org, "end_user", "u", "week", 10**12)
    call(book, "set_budget_stripes", org, "end_user", "u", "week", 4)
    other = llm_connect()
    expected = 0
    for n in range(200):
        conn = book if n % 2 else other
        inv = admit_priced(conn, org, rng.choice(("small", "large")), end_user="u")
        kind = rng.choice(("book", "caller", "fail", "open"))
        tokens = {"input": rng.randrange(0, 5000), "output": rng.randrange(0, 500)}
        if kind == "book":
            settle_usage(conn, org, inv, tokens)
        elif kind == "caller":
            cents = rng.randrange(0, 100)
            settle(conn, org, inv, rng.randrange(0, 100), cents)
            expected += cents * NANOS_PER_CENT
        elif kind == "fail":
            call(conn, "fail", org, inv, "boom", usage=tokens, now=T0)
        if kind in ("book", "fail"):
            expected += rows(book, "SELECT cost_nanos FROM llm.invocations WHERE organization_id = %s"
                                   " AND id = %s", (org, inv))[0]["cost_nanos"]
        if n == 100:
            call(book, "set_budget_stripes", org, "end_user", "u", "week", 2)
    reconcile(book, org, now=T0 + timedelta(days=3))  # the open ones: recovered, no cost
    assert period(book, org)["used_cost_nanos"] == expected
    assert next(iter(budget_usage(book, org).values()))["used_cost_nanos"] == expected
    assert invariants(book) == []
