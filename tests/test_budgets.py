"""Budgets at every level and window (docs/architecture.md "Budgets"): a request
names a project, an API key and an end user; every budget that applies to it is a hard
ceiling, checked with the allowance all or nothing, and every movement of the request
moves the counters it was admitted under."""

from __future__ import annotations

import uuid
from datetime import date, datetime, timedelta

import psycopg
import pytest

from llm_db import migrate
from llm_db.errors import _refused_by
from tests.helpers import (
    ADMIT_SQL,
    MAX_AMOUNT,
    T0,
    UTC,
    admit,
    admit_params,
    assert_sqlstate,
    budget_usage,
    call,
    dispatch,
    fail,
    fingerprint,
    invariants,
    invocation,
    new_org,
    notices,
    params,
    reconcile,
    rows,
    set_budget,
    set_org,
    settle,
    sql_of,
)

DAY = T0.date()  # 2026-01-15, a Thursday
WEEK = DAY - timedelta(days=DAY.weekday())  # Monday 2026-01-12
MONTH = DAY.replace(day=1)


SCOPES = ("organization", "project", "api_key", "end_user")
WINDOWS = ("day", "week", "month")
SET_BUDGET_SQL = sql_of("set_budget")


def window_start(window: str, at: datetime) -> date:
    """The first day of the UTC calendar window containing ``at`` (weeks from Monday)."""
    day = at.astimezone(UTC).date()
    if window == "week":
        return day - timedelta(days=day.weekday())
    return day.replace(day=1) if window == "month" else day


def expected_usage(conn: psycopg.Connection, org: uuid.UUID) -> dict[tuple, tuple[int, int, int]]:
    """(used, held, cents) per counter recomputed here from the requests, independently of
    the SQL: each request moves the counter of every bit of its budget_mask (3 * scope +
    window) in the windows of its admission time; a terminal request its charge, an open one
    its hold."""
    totals: dict[tuple, list[int]] = {}
    query = ("SELECT i.status, i.created_at, i.charged_credits, i.charged_cents, i.hold_credits,"
             " coalesce(i.project, s.project) AS project, coalesce(i.api_key, s.api_key) AS api_key,"
             " coalesce(i.end_user, s.end_user) AS end_user,"
             " coalesce(i.budget_mask, s.budget_mask, 0) AS budget_mask FROM llm.invocations AS i"
             " LEFT JOIN llm.invocation_scopes AS s"
             " ON s.organization_id = i.organization_id AND s.invocation_id = i.id AND i.budget_mask IS NULL"
             " WHERE i.organization_id = %s")  # fmt: skip
    for r in rows(conn, query, [org]):
        for bit in range(12):
            if not r["budget_mask"] & (1 << bit):
                continue
            scope, window = SCOPES[bit // 3], WINDOWS[bit % 3]
            scope_id = None if scope == "organization" else r[scope]
            key = (scope, scope_id, window, window_start(window, r["created_at"]))
            t = totals.setdefault(key, [0, 0, 0])
            if r["status"] in ("settled", "failed"):
                t[0] += r["charged_credits"]
                t[2] += r["charged_cents"] or 0
            else:
                t[1] += r["hold_credits"]
    return {k: tuple(v) for k, v in totals.items()}


def assert_books_exact(conn: psycopg.Connection, org: uuid.UUID) -> None:
    """llm.budget_usage equals the sums over the requests, and the invariants hold."""
    usage = {k: (r["used_credits"], r["held_credits"], r["used_cents"])
             for k, r in budget_usage(conn, org).items()}  # fmt: skip
    assert usage == expected_usage(conn, org)
    assert invariants(conn) == []


def refusal(conn: psycopg.Connection, org: uuid.UUID, estimate: int, **scopes) -> psycopg.Error:
    """Admit, expect LL001 with nothing written, and return the error."""
    return assert_sqlstate(conn, "LL001", ADMIT_SQL, admit_params(org, estimate, **scopes))


def refused_by(error: psycopg.Error) -> tuple[str | None, str | None, str | None] | None:
    """(TABLE, scope, window) the refusal names, as the driver reads them: the diagnostic
    fields, or on Citus, which drops them, the DETAIL (docs/scaling.md)."""
    return _refused_by(error.diag)


def test_a_key_budget_admits_up_to_its_limit_then_names_itself(llm_conn):
    org = new_org(llm_conn, 10_000)
    set_budget(llm_conn, org, "api_key", "key-1", "day", 100)
    admit(llm_conn, org, 60, api_key="key-1")
    admit(llm_conn, org, 40, api_key="key-1")
    error = refusal(llm_conn, org, 1, api_key="key-1")
    assert refused_by(error) == ("budgets", "api_key", "day")
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


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("scope", "scope_id", "window"),
    [("organization", None, "day"), ("project", "p", "month"), ("api_key", "k", "day"),
     ("end_user", "*", "day")],  # fmt: skip
)
def test_a_request_under_four_budgets_refused_by_one_holds_nothing_and_names_it(
    llm_conn, scope, scope_id, window
):
    """Budgets are exact (org day + project month + key day + user day, refused by
    exactly one): docs/contract.md "Errors": the one budget that does not fit refuses with
    LL001, nothing is held anywhere (no table changes), and the refusal names that one: its
    diagnostic fields and its DETAIL, whose first line is the real id (the end user's, not
    '*'; the organization's uuid for its own budget)."""
    org = new_org(llm_conn, 10**6)
    budgets = [("organization", None, "day"), ("project", "p", "month"), ("api_key", "k", "day"),
               ("end_user", "*", "day")]  # fmt: skip
    for b in budgets:
        set_budget(llm_conn, org, *b, 50 if b == (scope, scope_id, window) else 1000)
    scopes = {"project": "p", "api_key": "k", "end_user": "u"}
    admit(llm_conn, org, 10, **scopes)  # every counter exists and holds 10

    error = refusal(llm_conn, org, 41, **scopes)

    assert refused_by(error) == ("budgets", scope, window)
    first, rest = error.diag.message_detail.split("\n", 1)
    assert first == (str(org) if scope == "organization" else scopes[scope])
    start = window_start(window, T0)
    assert rest == f"scope={scope} window={window} window_start={start} limit=50 used=0 held=10 estimate=41"
    assert len(budget_usage(llm_conn, org)) == 4
    assert_books_exact(llm_conn, org)


# Every budget a request can be under, in the order a refusal names the first that does
# not fit: the allowance, then scopes organization, project, api_key, end_user; within a
# scope, windows day, week, month.
REFUSAL_ORDER = [("periods", "organization", "month")] + [
    ("budgets", scope, window) for scope in SCOPES for window in WINDOWS
    if (scope, window) != ("organization", "month")
]


def test_with_several_budgets_that_do_not_fit_the_first_in_bit_order_is_named(llm_conn):
    """With the allowance and all eleven budgets too small, the refusal names the allowance
    (TABLE periods, its DETAIL unchanged); raising each one named in turn, the next is named
    in the order organization, project, api_key, end_user and, within a scope, day, week,
    month; each refusal writes nothing."""
    org = new_org(llm_conn, 10)
    scopes = {"project": "p", "api_key": "k", "end_user": "u"}
    for _table, scope, window in REFUSAL_ORDER[1:]:
        set_budget(llm_conn, org, scope, None if scope == "organization" else scopes[scope], window, 10)
    named = []
    for _ in REFUSAL_ORDER:
        error = refusal(llm_conn, org, 20, **scopes)
        table, scope, window = refused_by(error)
        named.append((table, scope, window))
        if table == "periods":
            assert error.diag.message_detail.startswith("allowance=10 used=0 held=0 estimate=20")
            set_org(llm_conn, org, 10**6)
        else:
            set_budget(llm_conn, org, scope, None if scope == "organization" else scopes[scope], window, 20)
    assert named == REFUSAL_ORDER
    admit(llm_conn, org, 20, **scopes)
    assert len(budget_usage(llm_conn, org)) == 11
    assert_books_exact(llm_conn, org)


# ---------------------------------------------------------------- windows


@pytest.mark.parametrize(
    ("window", "last", "first"),
    [
        ("day", datetime(2026, 1, 15, 23, 59, 59, tzinfo=UTC), datetime(2026, 1, 16, tzinfo=UTC)),
        ("week", datetime(2026, 1, 18, 23, 59, 59, tzinfo=UTC), datetime(2026, 1, 19, tzinfo=UTC)),
        ("month", datetime(2026, 1, 31, 23, 59, 59, tzinfo=UTC), datetime(2026, 2, 1, tzinfo=UTC)),
    ],
    ids=["day at midnight", "week at Monday 00:00", "month on the 1st"],
)
def test_a_window_rolls_over_at_its_utc_boundary_and_moves_stay_in_the_admission_window(
    llm_conn, window, last, first
):
    """Budgets are exact (windows): a request admitted at the window's last second
    (23:59:59 UTC; a Sunday for the week, the 31st for the month) and settled after the
    boundary moves the earlier window's counter; the new window (midnight, Monday 00:00,
    the 1st) starts from nothing; a request admitted later with the earlier p_now is still
    decided against the earlier window."""
    org = new_org(llm_conn, 10**6)
    set_budget(llm_conn, org, "api_key", "k", window, 100)
    early = admit(llm_conn, org, 100, api_key="k", now=last)["id"]
    assert refused_by(refusal(llm_conn, org, 1, api_key="k", now=last))[2] == window

    assert settle(llm_conn, org, early, 60, 2, now=first + timedelta(seconds=1)) == "settled"

    usage = budget_usage(llm_conn, org)
    assert list(usage) == [("api_key", "k", window, window_start(window, last))]
    assert (usage[("api_key", "k", window, window_start(window, last))]["used_credits"]) == 60
    admit(llm_conn, org, 100, api_key="k", now=first)  # a new window
    admit(llm_conn, org, 40, api_key="k", now=last)  # the earlier one: 60 + 40 fits
    error = refusal(llm_conn, org, 1, api_key="k", now=last)
    assert f"window_start={window_start(window, last)} limit=100 used=60 held=40 " in error.diag.message_detail
    assert window_start(window, first) == first.date() != window_start(window, last)
    assert_books_exact(llm_conn, org)


# ---------------------------------------------------------------- movements


@pytest.mark.parametrize("charge", ["estimate", "dispatched", "none"])
def test_every_movement_moves_every_budget_exactly(llm_conn, charge):
    """Budgets are exact (settle, fail, recover under every policy, true-up), invariant
    14: under an organization day, a project month, a key day and a '*' end-user week
    budget, a settlement below its hold and one above it, a failure with partial usage,
    the recovery of a dispatched and of a reserved request under recovery_charge
    ``charge``, and a late true-up (late_settlement true_up) move each counter by exactly
    what they move the request: llm.budget_usage equals the sums over the requests."""
    org = new_org(llm_conn, 10**6)
    call(llm_conn, "set_recovery_policy", org, charge, "true_up")
    set_budget(llm_conn, org, "organization", None, "day", 10**6)
    set_budget(llm_conn, org, "project", "p", "month", 10**6)
    set_budget(llm_conn, org, "api_key", "k", "day", 10**6)
    set_budget(llm_conn, org, "end_user", "*", "week", 10**6)
    scopes = {"project": "p", "api_key": "k", "end_user": "u"}
    below, above, failed, sent, reserved = (admit(llm_conn, org, 100, **scopes)["id"] for _ in range(5))
    dispatch(llm_conn, org, sent)
    settle(llm_conn, org, below, 60, 3)
    settle(llm_conn, org, above, 150, 5)
    fail(llm_conn, org, failed, credits=30, cents=2)
    sweep = T0 + timedelta(days=2)
    still_open = admit(llm_conn, org, 100, now=sweep - timedelta(hours=1), **scopes)["id"]
    reconcile(llm_conn, org, now=sweep)  # recovers sent and reserved, not still_open
    assert invocation(llm_conn, org, still_open)["status"] == "reserved"
    assert settle(llm_conn, org, sent, 55, 4, now=sweep + timedelta(hours=1)) == "trued_up"

    recovered = {"estimate": 100, "dispatched": 0, "none": 0}[charge]  # the reserved one's charge
    usage = budget_usage(llm_conn, org)
    key_day = usage[("api_key", "k", "day", DAY)]
    assert (key_day["used_credits"], key_day["held_credits"], key_day["used_cents"]) == (
        60 + 150 + 30 + 55 + recovered, 0, 14)  # fmt: skip
    user_week = usage[("end_user", "u", "week", WEEK)]
    assert (user_week["used_credits"], user_week["held_credits"]) == (295 + recovered, 100)
    assert_books_exact(llm_conn, org)


def test_removing_or_changing_budgets_with_requests_open_leaves_the_books_exact(llm_conn):
    """Invariants 14 and 15: with two requests open, a key's '*' budget is removed, a user's
    own budget lowered below its usage, and a project's own budget replaced by a '*' one;
    the open requests still move the counters they were admitted under when they settle and
    fail, a new request no longer moves the key's, and the books stay exact."""
    org = new_org(llm_conn, 10**6)
    set_budget(llm_conn, org, "api_key", "*", "day", 100)
    set_budget(llm_conn, org, "end_user", "u", "day", 100)
    set_budget(llm_conn, org, "project", "p", "month", 100)
    scopes = {"project": "p", "api_key": "k", "end_user": "u"}
    a = admit(llm_conn, org, 50, **scopes)["id"]
    b = admit(llm_conn, org, 30, **scopes)["id"]

    set_budget(llm_conn, org, "api_key", "*", "day", None)
    set_budget(llm_conn, org, "end_user", "u", "day", 10)
    set_budget(llm_conn, org, "project", "p", "month", None)
    set_budget(llm_conn, org, "project", "*", "month", 1000)
    assert invariants(llm_conn) == []
    settle(llm_conn, org, a, 70)
    fail(llm_conn, org, b, credits=5)
    c = admit(llm_conn, org, 10, project="p", api_key="k")["id"]
    settle(llm_conn, org, c, 10)

    usage = budget_usage(llm_conn, org)
    assert usage[("api_key", "k", "day", DAY)]["used_credits"] == 75  # a and b only
    assert (usage[("end_user", "u", "day", DAY)]["used_credits"],
            usage[("end_user", "u", "day", DAY)]["limit_credits"]) == (75, 10)  # fmt: skip
    assert usage[("project", "p", "month", MONTH)]["used_credits"] == 85  # shared with '*'
    assert refused_by(refusal(llm_conn, org, 1, end_user="u"))[1] == "end_user"
    assert_books_exact(llm_conn, org)


# ---------------------------------------------------------------- set_budget


def budgets(conn: psycopg.Connection, org: uuid.UUID) -> list[tuple]:
    """The organization's rows of llm.budgets."""
    return [(r["scope"], r["scope_id"], r["budget_window"], r["limit_credits"], r["thresholds"])
            for r in rows(conn, "SELECT * FROM llm.budgets WHERE organization_id = %s"
                                " ORDER BY scope, scope_id, budget_window", [org])]  # fmt: skip


def test_set_budget_replaces_limit_and_thresholds_and_a_null_limit_removes_it(llm_conn):
    """Setting a budget again replaces its limit and thresholds; a
    NULL limit removes it; removing one that does not exist changes nothing."""
    org = new_org(llm_conn, 10**6)
    set_budget(llm_conn, org, "project", "p", "week", 100, thresholds=[50])
    set_budget(llm_conn, org, "project", "p", "week", 70, thresholds=[90, 100])
    assert budgets(llm_conn, org) == [("project", "p", "week", 70, [90, 100])]
    assert refused_by(refusal(llm_conn, org, 71, project="p"))[2] == "week"

    set_budget(llm_conn, org, "project", "p", "week", None)
    assert budgets(llm_conn, org) == []
    admit(llm_conn, org, 71, project="p")
    before = fingerprint(llm_conn)
    set_budget(llm_conn, org, "project", "p", "week", None)
    set_budget(llm_conn, org, "end_user", "*", "day", None)
    assert fingerprint(llm_conn) == before
    assert invariants(llm_conn) == []


def test_an_own_budget_set_mid_window_shares_the_default_counter(llm_conn):
    """Invariant 15: a user who used 60 of a '*' day budget of 100 gets a budget of
    70 of their own: they keep the 60, so 20 more is refused naming their own limit and 10
    fits; one counter, listed with the limit that applies now."""
    org = new_org(llm_conn, 10**6)
    set_budget(llm_conn, org, "end_user", "*", "day", 100)
    settle(llm_conn, org, admit(llm_conn, org, 60, end_user="u")["id"], 60)
    set_budget(llm_conn, org, "end_user", "u", "day", 70)
    error = refusal(llm_conn, org, 20, end_user="u")
    assert error.diag.message_detail.endswith("limit=70 used=60 held=0 estimate=20")
    admit(llm_conn, org, 10, end_user="u")
    usage = budget_usage(llm_conn, org)
    assert list(usage) == [("end_user", "u", "day", DAY)]
    assert (usage[("end_user", "u", "day", DAY)]["limit_credits"],
            usage[("end_user", "u", "day", DAY)]["held_credits"]) == (70, 10)  # fmt: skip
    assert_books_exact(llm_conn, org)


def test_an_id_is_exempt_from_a_default_budget_by_its_own_at_the_maximum(llm_conn):
    """An id exempt from a '*' default gets its own budget at the maximum:
    under a '*' day budget of 100 for API keys, a key with its own budget of 10^15 admits
    far above 100, another key does not."""
    org = new_org(llm_conn, None)
    set_budget(llm_conn, org, "api_key", "*", "day", 100)
    set_budget(llm_conn, org, "api_key", "vip", "day", MAX_AMOUNT)
    admit(llm_conn, org, 10**12, api_key="vip")
    assert refusal(llm_conn, org, 101, api_key="other").diag.message_detail.startswith("other\n")
    assert_books_exact(llm_conn, org)


def test_a_budget_set_mid_window_counts_only_requests_admitted_after_it(llm_conn):
    """A key that spent 500 today without a budget gets a day budget of 60: 50 fits, 20 more
    does not."""
    org = new_org(llm_conn, 10**6)
    settle(llm_conn, org, admit(llm_conn, org, 500, api_key="k")["id"], 500)
    set_budget(llm_conn, org, "api_key", "k", "day", 60)
    admit(llm_conn, org, 50, api_key="k")
    assert refusal(llm_conn, org, 20, api_key="k").diag.message_detail.endswith("used=0 held=50 estimate=20")
    assert_books_exact(llm_conn, org)


def test_the_allowance_is_not_a_budget_and_an_unknown_organization_is_ll002(llm_conn):
    """('organization', NULL, 'month') is the allowance: 22023 with
    a HINT naming upsert_organization; an unknown organization is LL002; both write nothing."""
    org = new_org(llm_conn, 100)
    error = assert_sqlstate(llm_conn, "22023", SET_BUDGET_SQL,
                            params("set_budget", org, "organization", None, "month", 50))  # fmt: skip
    assert "upsert_organization" in error.diag.message_hint
    assert_sqlstate(llm_conn, "LL002", SET_BUDGET_SQL,
                    params("set_budget", uuid.uuid4(), "project", "p", "day", 50))  # fmt: skip
    assert invariants(llm_conn) == []


def budget_notices(conn: psycopg.Connection, org: uuid.UUID) -> list[tuple]:
    """(scope, scope_id, window, window start, threshold) of the organization's notices."""
    return sorted((n["scope"], n["scope_id"], n["budget_window"], n["period_start"], n["threshold_pct"])
                  for n in notices(conn, org))  # fmt: skip


def test_a_lowered_limit_owes_in_its_own_transaction_what_the_window_of_p_now_reached(
    llm_connect, llm_conn
):
    """A key used 60 of 100 today (the 50% notice owed); lowered
    to 70 with p_now tomorrow it owes nothing (that window is empty); with p_now today it
    owes 80% inside its transaction, not 50% again; a new day's crossing is its own."""
    org = new_org(llm_conn, 10**6)
    set_budget(llm_conn, org, "api_key", "k", "day", 100, thresholds=[50, 80, 100])
    settle(llm_conn, org, admit(llm_conn, org, 60, api_key="k")["id"], 60)
    assert budget_notices(llm_conn, org) == [("api_key", "k", "day", DAY, 50)]
    set_budget(llm_conn, org, "api_key", "k", "day", 70, thresholds=[50, 80, 100], now=T0 + timedelta(days=1))
    assert budget_notices(llm_conn, org) == [("api_key", "k", "day", DAY, 50)]

    admin = llm_connect(autocommit=False)
    set_budget(admin, org, "api_key", "k", "day", 70, thresholds=[50, 80, 100])
    assert budget_notices(admin, org) == [("api_key", "k", "day", DAY, 50), ("api_key", "k", "day", DAY, 80)]
    admin.commit()

    tomorrow = T0 + timedelta(days=1)
    settle(llm_conn, org, admit(llm_conn, org, 40, api_key="k", now=tomorrow)["id"], 40, now=tomorrow)
    assert budget_notices(llm_conn, org) == [
        ("api_key", "k", "day", DAY, 50), ("api_key", "k", "day", DAY, 80),
        ("api_key", "k", "day", DAY + timedelta(days=1), 50)]  # fmt: skip
    assert invariants(llm_conn) == []


def test_an_allowance_notice_and_a_budget_notice_of_the_same_start_and_pct_both_exist(llm_conn):
    """Invariant 5: an allowance of 100 and a project month budget of 100, both notified at
    80%, crossed by one settlement of 90: two notices for January 1st at 80%, one each."""
    org = new_org(llm_conn, 100, thresholds=[80])
    set_budget(llm_conn, org, "project", "p", "month", 100, thresholds=[80])
    settle(llm_conn, org, admit(llm_conn, org, 90, project="p")["id"], 90)
    assert budget_notices(llm_conn, org) == [("organization", None, "month", MONTH, 80),
                                             ("project", "p", "month", MONTH, 80)]  # fmt: skip
    assert invariants(llm_conn) == []


# ---------------------------------------------------------------- retries


def test_a_retried_invocation_id_compares_its_scope_ids(llm_conn):
    """The same ids return the first admission and hold nothing more; a different, added or
    missing id is LL007 and writes nothing."""
    org = new_org(llm_conn, 10**6)
    set_budget(llm_conn, org, "end_user", "*", "day", 100)
    iid = uuid.uuid4()
    first = admit(llm_conn, org, 10, invocation_id=iid, api_key="k", end_user="u")
    assert admit(llm_conn, org, 10, invocation_id=iid, api_key="k", end_user="u") == {**first, "replayed": True}
    assert budget_usage(llm_conn, org)[("end_user", "u", "day", DAY)]["held_credits"] == 10
    for changed in ({"api_key": "k", "end_user": "v"}, {"api_key": "k", "end_user": "u", "project": "p"},
                    {"end_user": "u"}):  # fmt: skip
        assert_sqlstate(llm_conn, "LL007", ADMIT_SQL, admit_params(org, 10, invocation_id=iid, **changed))
    assert_books_exact(llm_conn, org)


@pytest.mark.parametrize("window", ["day", "week"])
def test_a_budget_notice_of_a_window_that_is_no_period_is_owed(llm_conn, window):
    """A key's day or week budget crossed mid-month (the 15th, in the week of Monday the 12th)
    owes its notice for that window's start. The notices' foreign key to the period heads
    refused it, and the settlement that crossed the threshold failed (fixed in
    sql/28_budgets.sql)."""
    org = new_org(llm_conn, 10**6)
    set_budget(llm_conn, org, "api_key", "k", window, 100, thresholds=[50])
    assert settle(llm_conn, org, admit(llm_conn, org, 60, api_key="k")["id"], 60) == "settled"
    assert budget_notices(llm_conn, org) == [("api_key", "k", window, window_start(window, T0), 50)]
    assert_books_exact(llm_conn, org)


def test_the_refusals_first_detail_line_is_the_id_verbatim(llm_conn):
    """docs/contract.md "Errors": an end user id of 200 characters with
    spaces, '=', a quote and non-ASCII letters, refused under the '*' budget, is the
    DETAIL's first line exactly; the rest is the one line of figures."""
    org = new_org(llm_conn, 10**6)
    set_budget(llm_conn, org, "end_user", "*", "day", 5)
    user = ("Zoë O'Brien = user 7 " * 10)[:200]
    error = refusal(llm_conn, org, 6, end_user=user)
    first, rest = error.diag.message_detail.split("\n", 1)
    assert first == user
    assert rest == f"scope=end_user window=day window_start={DAY} limit=5 used=0 held=0 estimate=6"
    assert invariants(llm_conn) == []


def test_an_own_budget_replaces_the_default_only_for_its_window(llm_conn):
    """A user with a day budget of their own is still under the '*' week budget; the other
    users are under both defaults."""
    org = new_org(llm_conn, 10**6)
    set_budget(llm_conn, org, "end_user", "*", "day", 10)
    set_budget(llm_conn, org, "end_user", "*", "week", 50)
    set_budget(llm_conn, org, "end_user", "u", "day", 1000)
    admit(llm_conn, org, 40, end_user="u")
    assert refused_by(refusal(llm_conn, org, 11, end_user="u"))[2] == "week"
    assert refused_by(refusal(llm_conn, org, 11, end_user="v"))[2] == "day"
    assert set(budget_usage(llm_conn, org)) == {("end_user", "u", "day", DAY), ("end_user", "u", "week", WEEK)}
    assert_books_exact(llm_conn, org)


def test_a_lowered_default_owes_the_notices_of_the_ids_it_governs_only(llm_conn):
    """For a '*' budget: lowered from 100 to 70, it owes 80% for the user it governs (used 60)
    and nothing for a user with a budget of their own (also used 60)."""
    org = new_org(llm_conn, 10**6)
    set_budget(llm_conn, org, "end_user", "*", "day", 100)
    set_budget(llm_conn, org, "end_user", "own", "day", 1000)
    for user in ("governed", "own"):
        settle(llm_conn, org, admit(llm_conn, org, 60, end_user=user)["id"], 60)
    assert budget_notices(llm_conn, org) == []
    set_budget(llm_conn, org, "end_user", "*", "day", 70)
    assert budget_notices(llm_conn, org) == [("end_user", "governed", "day", DAY, 80)]
    assert invariants(llm_conn) == []


def test_budget_usage_pairs_each_counter_with_the_budget_the_writers_apply(llm_conn):
    """Llm.budget_usage gives each counter the limit, thresholds and llm.budgets key
    (budget_scope_id) of the budget in force, the same as llm._budget_terms, by which the
    writers owe notices: an own budget, a '*', an organization budget (id NULL) and a
    removed one (NULL: none)."""
    org = new_org(llm_conn, 10**6)
    set_budget(llm_conn, org, "organization", None, "day", 500, thresholds=[60])
    set_budget(llm_conn, org, "end_user", "*", "day", 100, thresholds=[50])
    set_budget(llm_conn, org, "end_user", "u", "day", 200, thresholds=[90, 100])
    set_budget(llm_conn, org, "api_key", "k", "day", 300)
    admit(llm_conn, org, 10, end_user="u", api_key="k")
    admit(llm_conn, org, 10, end_user="v")
    set_budget(llm_conn, org, "api_key", "k", "day", None)
    usage = {k[:2]: (r["limit_credits"], r["thresholds"], r["budget_scope_id"])
             for k, r in budget_usage(llm_conn, org).items()}  # fmt: skip
    assert usage == {("organization", None): (500, [60], None),
                     ("end_user", "u"): (200, [90, 100], "u"),
                     ("end_user", "v"): (100, [50], "*"),
                     ("api_key", "k"): (None, None, None)}  # fmt: skip
    # the writers' rule, asked per counter (a call per row, not a LATERAL over the view:
    # under Citus that would nest a distributed query inside a shard's)
    counters = rows(llm_conn, "SELECT scope, scope_id, budget_window, limit_credits, thresholds"
                              " FROM llm.budget_usage WHERE organization_id = %s", [org])  # fmt: skip
    assert len(counters) == 4
    for r in counters:
        b = rows(llm_conn, "SELECT limit_credits, thresholds FROM llm._budget_terms(%s, %s, %s, %s)",
                 [org, r["scope"], r["scope_id"], r["budget_window"]])  # fmt: skip
        b = b[0] if b else {"limit_credits": None, "thresholds": None}
        assert (r["limit_credits"], r["thresholds"]) == (b["limit_credits"], b["thresholds"]), r


# ---------------------------------------------------------------- the organization's row


def uniform_row(conn: psycopg.Connection, org: uuid.UUID) -> tuple:
    """(has_budgets, uniform_budget_mask, limits, revisions) of the organization's row."""
    r = rows(conn, "SELECT has_budgets, uniform_budget_mask, uniform_budget_limits, uniform_budget_revisions"
                   " FROM llm.organizations WHERE id = %s", [org])[0]  # fmt: skip
    return r["has_budgets"], r["uniform_budget_mask"], r["uniform_budget_limits"], r["uniform_budget_revisions"]


def expected_row(conn: psycopg.Connection, org: uuid.UUID) -> tuple:
    """The same, worked out here from llm.budgets: every budget's bit, limit and revision in
    bit order when none names an id, else NULL."""
    budgets = sorted(((3 * SCOPES.index(b["scope"]) + WINDOWS.index(b["budget_window"]), b)
                      for b in rows(conn, "SELECT * FROM llm.budget_limits WHERE organization_id = %s", [org])),
                     key=lambda bit_budget: bit_budget[0])  # fmt: skip
    if any(b["scope_id"] not in (None, "*") for _, b in budgets):
        return bool(budgets), None, None, None
    return (bool(budgets), sum(1 << bit for bit, _ in budgets), [b["limit_credits"] for _, b in budgets],
            [b["revision"] for _, b in budgets])


def test_the_organizations_row_holds_its_budgets_while_none_names_an_id(llm_conn):
    """Invariant 21: set_budget and set_budget_stripes keep on the organization's row
    whether it has a budget, and, while none names an id, all of them (bits, limits and
    revisions in bit order), which admission reads instead of llm.budget_limits; an
    own budget of an id empties them, its removal brings them back."""
    org = new_org(llm_conn, 10**9)
    assert uniform_row(llm_conn, org) == (False, None, None, None)  # none: nothing to read either way
    steps = [
        ("api_key", "*", "day", 50),
        ("organization", None, "week", 500),
        ("project", "*", "month", 300),
        ("end_user", "*", "week", 40),
        ("project", "*", "month", 200),  # a change: the same bit, a new limit and revision
        ("api_key", "k-1", "day", 5),  # an own budget: the row names none
        ("project", "p-1", "month", 9),
        ("api_key", "k-1", "day", None),
        ("project", "p-1", "month", None),  # no own budget left: back on the row
        ("organization", None, "week", None),
        ("api_key", "*", "day", None),
        ("project", "*", "month", None),
        ("end_user", "*", "week", None),
    ]
    for scope, scope_id, window, limit in steps:
        set_budget(llm_conn, org, scope, scope_id, window, limit)
        assert uniform_row(llm_conn, org) == expected_row(llm_conn, org), (scope, scope_id, window, limit)
        assert invariants(llm_conn) == []
        if limit is not None and scope_id != "k-1":
            call(llm_conn, "set_budget_stripes", org, scope, scope_id, window, 4)
            assert uniform_row(llm_conn, org) == expected_row(llm_conn, org)
    assert uniform_row(llm_conn, org) == (False, 0, [], [])


SHAPES = [dict(zip(("project", "api_key", "end_user"), ids, strict=True))
          for ids in [(p, k, u) for p in (None, "p-1") for k in (None, "k-1") for u in (None, "u-1")]]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "+".join(k for k, v in s.items() if v) or "none")
def test_an_admission_applies_the_same_budgets_from_the_row_as_from_the_budgets(llm_conn, shape):
    """A request naming any of the three scopes is held on the same budgets, and refused
    by the same first one, whether its organization's budgets are on its row (none names
    an id) or read from llm.budget_limits (an own budget of an id no request names keeps
    them off the row of the second, identical organization): the organization's day,
    the project '*' week, the key '*' day (10, the one that refuses 20) and the end user
    '*' month, each bit of the scopes the request names, in bit order."""
    orgs = [new_org(llm_conn, 10**9), new_org(llm_conn, 10**9)]
    for org in orgs:
        for scope, scope_id, window, limit in [("organization", None, "day", 1000), ("project", "*", "week", 1000),
                                               ("api_key", "*", "day", 10), ("end_user", "*", "month", 1000)]:
            set_budget(llm_conn, org, scope, scope_id, window, limit)
    set_budget(llm_conn, orgs[1], "api_key", "nobody", "day", 10)
    assert uniform_row(llm_conn, orgs[0])[1] == 1 | 1 << 4 | 1 << 6 | 1 << 11
    assert uniform_row(llm_conn, orgs[1])[1] is None

    expected = 1 | (1 << 4 if shape["project"] else 0) | (1 << 6 if shape["api_key"] else 0) \
        | (1 << 11 if shape["end_user"] else 0)
    for org in orgs:
        assert invocation(llm_conn, org, admit(llm_conn, org, 10, **shape)["id"])["budget_mask"] == expected
        if shape["api_key"]:
            assert refused_by(refusal(llm_conn, org, 20, **shape)) == ("budgets", "api_key", "day")
        else:
            assert invocation(llm_conn, org, admit(llm_conn, org, 20, **shape)["id"])["budget_mask"] == expected
    assert budget_usage(llm_conn, orgs[0]).keys() == budget_usage(llm_conn, orgs[1]).keys()
    for org in orgs:
        assert_books_exact(llm_conn, org)


def test_the_contract_step_puts_the_previous_releases_budgets_on_the_row(llm_conn, llm_dsn):
    """Through an upgrade (the previous release's functions never write the row's budgets,
    which stay NULL: admissions read llm.budget_limits) until its contract step: the step
    writes them for each organization whose budgets name no id, leaves NULL the one whose
    budget names one, and admissions then read the row, held on the same budgets.
    Replayed here by emptying the rows and the step's record."""
    uniform, named = new_org(llm_conn, 10**9), new_org(llm_conn, 10**9)
    for org in (uniform, named):
        set_budget(llm_conn, org, "api_key", "*", "day", 25)
    set_budget(llm_conn, named, "project", "p-1", "month", 100)
    llm_conn.execute("UPDATE llm.organizations SET uniform_budget_mask = NULL, uniform_budget_limits = NULL,"
                     " uniform_budget_revisions = NULL")  # fmt: skip
    llm_conn.execute("DELETE FROM llm.upgrade_steps WHERE step = '0029_uniform_budgets'")
    admit(llm_conn, uniform, 20, api_key="k-1")  # read from llm.budget_limits
    assert invariants(llm_conn) == []

    assert "0029_uniform_budgets" in migrate(llm_dsn).contract_steps
    assert uniform_row(llm_conn, uniform)[1:3] == (1 << 6, [25])
    assert uniform_row(llm_conn, named) == expected_row(llm_conn, named) == (True, None, None, None)
    assert refused_by(refusal(llm_conn, uniform, 10, api_key="k-1")) == ("budgets", "api_key", "day")
    admit(llm_conn, uniform, 5, api_key="k-1")
    assert_books_exact(llm_conn, uniform)
