"""Budgets at every level and window (issue 23, docs/design.md "Budgets"): a request
names a project, an API key and an end user; every budget that applies to it is a hard
ceiling, checked with the allowance all or nothing, and every movement of the request
moves the counters it was admitted under."""

from __future__ import annotations

import uuid
from datetime import timedelta

import psycopg

from tests.helpers import (
    ADMIT_SQL,
    T0,
    admit,
    admit_params,
    assert_sqlstate,
    budget_usage,
    fail,
    invariants,
    invocation,
    new_org,
    reconcile,
    set_budget,
    settle,
)

DAY = T0.date()  # 2026-01-15, a Thursday
WEEK = DAY - timedelta(days=DAY.weekday())  # Monday 2026-01-12
MONTH = DAY.replace(day=1)


def refusal(conn: psycopg.Connection, org: uuid.UUID, estimate: int, **scopes) -> psycopg.Error:
    """Admit, expect LL001 with nothing written, and return the error."""
    return assert_sqlstate(conn, "LL001", ADMIT_SQL, admit_params(org, estimate, **scopes))


def test_a_key_budget_admits_up_to_its_limit_then_names_itself(llm_conn):
    org = new_org(llm_conn, 10_000)
    set_budget(llm_conn, org, "api_key", "key-1", "day", 100)
    admit(llm_conn, org, 60, api_key="key-1")
    admit(llm_conn, org, 40, api_key="key-1")
    error = refusal(llm_conn, org, 1, api_key="key-1")
    assert error.diag.table_name == "budgets"
    assert error.diag.constraint_name == "api_key"
    assert error.diag.column_name == "day"
    first, rest = error.diag.message_detail.split("\n", 1)
    assert first == "key-1"
    assert rest == f"scope=api_key window=day window_start={DAY} limit=100 used=0 held=100 estimate=1"
    admit(llm_conn, org, 1, api_key="key-2")  # another key has no budget
    usage = budget_usage(llm_conn, org)
    assert list(usage) == [("api_key", "key-1", "day", DAY)]
    assert usage[("api_key", "key-1", "day", DAY)]["held_credits"] == 100
    assert invariants(llm_conn) == []


def test_settle_fail_and_recover_move_every_counter(llm_conn):
    org = new_org(llm_conn, 10_000)
    set_budget(llm_conn, org, "organization", None, "day", 1000)
    set_budget(llm_conn, org, "project", "p", "month", 1000)
    set_budget(llm_conn, org, "api_key", "k", "day", 1000)
    set_budget(llm_conn, org, "end_user", "*", "day", 1000)
    scopes = {"project": "p", "api_key": "k", "end_user": "u"}
    a = admit(llm_conn, org, 100, **scopes)["id"]
    b = admit(llm_conn, org, 100, **scopes)["id"]
    c = admit(llm_conn, org, 100, **scopes)["id"]
    settle(llm_conn, org, a, 150, 7)
    fail(llm_conn, org, b, credits=30)
    reconcile(llm_conn, org, now=T0 + timedelta(days=2))
    usage = budget_usage(llm_conn, org)
    assert set(usage) == {("organization", None, "day", DAY), ("project", "p", "month", MONTH),
                          ("api_key", "k", "day", DAY), ("end_user", "u", "day", DAY)}
    for r in usage.values():
        assert (r["used_credits"], r["held_credits"], r["used_cents"]) == (
            150 + 30 + invocation(llm_conn, org, c)["charged_credits"], 0, 7)
    assert invariants(llm_conn) == []
