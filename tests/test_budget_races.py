"""Budgets are exact under concurrency ("Exactness", docs/architecture.md "Budgets",
invariants 14 and 15): sessions admitting at once against one budget admit exactly as
many requests as fit, whether its counter exists or is created by the race itself (the
first requests of an end user never seen before, the race the gateways lose); and a
set_budget running while an admission runs decides it wholly with or wholly without it.

The many-session races run real connections of the app role (llm_app) started together
at a barrier; the two-session interleavings are scripted with open transactions and
checked with pg_blocking_pids: no sleeps, no timing.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg

from llm_db.errors import _refused_by
from tests.helpers import (
    ADMIT_SQL,
    T0,
    InThread,
    admit,
    admit_params,
    budget_usage,
    call,
    invariants,
    new_org,
    rows,
    sessions_on_stripes,
    set_budget,
    wait_blocked,
)

SESSIONS = 8
STRIPES = 64  # llm.set_period_stripes' maximum
DAY = T0.date()


def striped_org(conn: psycopg.Connection) -> uuid.UUID:
    """An organization whose allowance (10^9) is spread over STRIPES rows, so concurrent
    admissions from sessions on different stripes do not wait for each other on it: only
    a budget's counter can order them (with one stripe, the allowance's row would
    serialize every admission of the organization and hide a budget's race)."""
    org = new_org(conn, 10**9)
    call(conn, "set_period_stripes", org, STRIPES)
    admit(conn, org, 1)  # the month's period and its stripes exist before the race
    return org


def app_sessions(
    connect: Callable[..., psycopg.Connection], n: int, **kwargs: Any
) -> list[psycopg.Connection]:
    """``n`` app-role connections on ``n`` different stripes (a session's stripe is its
    backend pid modulo the stripes); the others opened on the way are closed."""
    return sessions_on_stripes(lambda: connect("llm_app", **kwargs), STRIPES, n)


def race(
    connections: list[psycopg.Connection],
    attempt: Callable[[psycopg.Connection, int], None],
    rounds: int,
) -> None:
    """Run ``attempt(conn, round)`` in every session for each round, all sessions
    released together at a barrier each round, and re-raise what a session raised."""
    barrier = threading.Barrier(len(connections))

    def session(conn: psycopg.Connection) -> None:
        for n in range(rounds):
            barrier.wait(timeout=30)
            attempt(conn, n)

    threads = [InThread(lambda c=c: session(c)) for c in connections]
    for t in threads:
        t.result()


def admit_or_refusal(
    conn: psycopg.Connection, org: uuid.UUID, estimate: int, **kwargs: Any
) -> psycopg.Error | None:
    """Admit (``admit_params``' keywords); None when admitted, the LL001 error when
    refused (any other error raises)."""
    try:
        rows(conn, ADMIT_SQL, admit_params(org, estimate, **kwargs))
    except psycopg.Error as error:
        if error.sqlstate != "LL001":
            raise
        return error
    return None


def assert_names_budget(
    error: psycopg.Error | None, scope: str, scope_id: str, window: str, limit: int, estimate: int
) -> None:
    """The refusal names this one budget (DETAIL's first line the real id, the
    diagnostic fields the budget), with figures that do not fit."""
    assert error is not None, "admitted"
    # the diagnostic fields, or on Citus, which drops them, the DETAIL (as the driver reads it)
    assert _refused_by(error.diag) == ("budgets", scope, window)
    first, rest = error.diag.message_detail.split("\n", 1)
    assert first == scope_id
    fields = dict(f.split("=", 1) for f in rest.split(" "))
    assert (fields["scope"], fields["window"], fields["limit"], fields["estimate"]) == (
        scope,
        window,
        str(limit),
        str(estimate),
    )
    assert int(fields["used"]) + int(fields["held"]) + estimate > limit


def test_eight_sessions_on_one_key_day_budget_admit_exactly_what_fits(llm_conn, llm_role_conn):
    """Budgets are exact (8 sessions, one API key's daily budget), invariants 14/15: on
    each of 5 days, 8 app sessions released together make 4 attempts each of 7 credits
    against the key's day budget of 100: exactly floor(100/7) = 14 are admitted a day, 98
    held, and every refusal names that key's day budget."""
    org = striped_org(llm_conn)
    set_budget(llm_conn, org, "api_key", "key-hot", "day", 100)
    sessions = app_sessions(llm_role_conn, SESSIONS)
    days = [T0 + timedelta(days=n) for n in range(5)]  # all in January: one period
    lock = threading.Lock()
    admitted = {day.date(): 0 for day in days}
    refused: list[psycopg.Error] = []

    def attempt(conn: psycopg.Connection, n: int) -> None:
        for _ in range(4):
            error = admit_or_refusal(conn, org, 7, api_key="key-hot", now=days[n])
            with lock:
                if error is None:
                    admitted[days[n].date()] += 1
                else:
                    refused.append(error)

    race(sessions, attempt, rounds=len(days))

    assert admitted == {day.date(): 100 // 7 for day in days}
    assert len(refused) == len(days) * (SESSIONS * 4 - 100 // 7)
    for error in refused:
        assert_names_budget(error, "api_key", "key-hot", "day", 100, 7)
    usage = budget_usage(llm_conn, org)
    assert {k[3]: r["held_credits"] for k, r in usage.items()} == {d.date(): 98 for d in days}
    assert invariants(llm_conn) == []


def test_the_first_requests_of_new_end_users_under_a_default_budget_are_exact(
    llm_conn, llm_role_conn
):
    """Budgets are exact (the race the gateways lose), invariant 14: for each of 6 end
    users never seen before, 8 app sessions released together at a barrier admit their
    first requests (10 credits) under the '*' day budget of 35: the counter is created by
    the race, and exactly 3 are admitted per user, the others refused naming that user."""
    org = striped_org(llm_conn)
    set_budget(llm_conn, org, "end_user", "*", "day", 35)
    sessions = app_sessions(llm_role_conn, SESSIONS)
    users = [f"user-{n}" for n in range(6)]
    lock = threading.Lock()
    outcomes: dict[str, list[psycopg.Error | None]] = {u: [] for u in users}

    def attempt(conn: psycopg.Connection, n: int) -> None:
        error = admit_or_refusal(conn, org, 10, end_user=users[n])
        with lock:
            outcomes[users[n]].append(error)

    race(sessions, attempt, rounds=len(users))

    usage = budget_usage(llm_conn, org)
    for user in users:
        refused = [e for e in outcomes[user] if e is not None]
        assert len(refused) == SESSIONS - 3, user
        for error in refused:
            assert_names_budget(error, "end_user", user, "day", 35, 10)
        counter = usage[("end_user", user, "day", DAY)]
        assert (counter["held_credits"], counter["limit_credits"]) == (30, 35)
    assert invariants(llm_conn) == []


def test_seven_sessions_blocked_on_a_new_end_users_first_counter_decide_on_its_figures(
    llm_conn, llm_connect, llm_role_conn
):
    """Budgets are exact, scripted: the first request of a new end user (10 credits,
    '*' day budget 35) is open, its counter row inserted but not committed; 7 more sessions
    admitting that user block on it (pg_blocking_pids); it commits; each then decides on
    the committed counter: exactly 2 more are admitted, 5 refused naming the user."""
    org = striped_org(llm_conn)
    set_budget(llm_conn, org, "end_user", "*", "day", 35)
    first, *others = app_sessions(llm_role_conn, SESSIONS)
    first.autocommit = False
    rows(first, ADMIT_SQL, admit_params(org, 10, end_user="new-user"))  # not committed
    calls = [
        InThread(lambda c=c: admit_or_refusal(c, org, 10, end_user="new-user")) for c in others
    ]
    for conn in others:
        wait_blocked(llm_conn, conn.info.backend_pid)

    first.commit()

    refused = [e for e in (c.result() for c in calls) if e is not None]
    assert len(refused) == len(others) - 2
    for error in refused:
        assert_names_budget(error, "end_user", "new-user", "day", 35, 10)
    assert budget_usage(llm_conn, org)[("end_user", "new-user", "day", DAY)]["held_credits"] == 30
    assert invariants(llm_conn) == []


def test_an_admission_blocked_by_a_lowering_set_budget_is_decided_wholly_without_it(
    llm_conn, llm_connect, llm_role_conn
):
    """Invariant 15: a set_budget lowering a key's day budget from 100 to 10 is
    open, its counter locked; an admission (7 more, read under 100) blocks on the counter;
    set_budget commits; the admission is decided wholly under the limit it read (admitted,
    the counter's admitted limit 100); the next admission is decided under 10 and refused."""
    org = new_org(llm_conn, 10**9)
    set_budget(llm_conn, org, "api_key", "k", "day", 100)
    admit(llm_conn, org, 7, api_key="k")
    admin = llm_connect(autocommit=False)
    set_budget(admin, org, "api_key", "k", "day", 10)  # not committed
    app = llm_role_conn("llm_app")
    admission = InThread(lambda: admit_or_refusal(app, org, 7, api_key="k"))
    wait_blocked(llm_conn, app.info.backend_pid)

    admin.commit()

    assert admission.result() is None
    counter = rows(llm_conn, "SELECT * FROM llm.budget_counters WHERE organization_id = %s", [org])
    assert [(c["held_credits"], c["admitted_limit"]) for c in counter] == [(14, 100)]
    assert_names_budget(admit_or_refusal(app, org, 1, api_key="k"), "api_key", "k", "day", 10, 1)
    assert invariants(llm_conn) == []


def test_a_budget_applies_to_every_admission_called_after_set_budget_commits(
    llm_conn, llm_connect, llm_role_conn
):
    """The organization's first budget (a key's day budget of 10) is open in set_budget's
    transaction; an admission of the key runs meanwhile, without waiting, wholly without it
    (no counter, no budget bit); set_budget commits (its p_now a day later); an admission
    called then with a p_now five days earlier is under the budget: 10 fits, 1 more is
    refused."""
    org = new_org(llm_conn, 10**9)
    admit(llm_conn, org, 1)  # the month's period exists: its creation would wait for set_budget
    admin = llm_connect(autocommit=False)
    set_budget(admin, org, "api_key", "k", "day", 10, now=T0 + timedelta(days=1))  # not committed
    app = llm_role_conn("llm_app")
    during = admit(app, org, 50, api_key="k")
    assert rows(
        llm_conn, "SELECT budget_mask FROM llm.invocations WHERE id = %s", [during["id"]]
    ) == [{"budget_mask": 0}]

    admin.commit()

    earlier = T0 - timedelta(days=5)
    admit(app, org, 10, api_key="k", now=earlier)
    assert_names_budget(
        admit_or_refusal(app, org, 1, api_key="k", now=earlier), "api_key", "k", "day", 10, 1
    )
    assert list(budget_usage(llm_conn, org)) == [("api_key", "k", "day", earlier.date())]
    assert invariants(llm_conn) == []


def test_a_removal_racing_a_set_of_the_same_budget_waits_and_commits_last(llm_conn, llm_connect):
    """A key's day budget is set in one transaction, left open; its removal, called
    meanwhile, waits for that transaction (it would find no row to delete and lose to the
    set committing after it, found by the concurrent simulation); once the set commits, the
    removal deletes the budget it set. Admissions of the key are then under no budget."""
    org = new_org(llm_conn, 10**9)
    setter = llm_connect(autocommit=False)
    set_budget(setter, org, "api_key", "k", "day", 10)  # not committed
    remover = llm_connect(autocommit=True)
    removal = InThread(lambda: set_budget(remover, org, "api_key", "k", "day", None))
    wait_blocked(llm_conn, remover.info.backend_pid)
    setter.commit()
    removal.join()
    removal.result()
    assert rows(llm_conn, "SELECT * FROM llm.budgets WHERE organization_id = %s", [org]) == []
    admit(llm_conn, org, 50, api_key="k")
    assert list(budget_usage(llm_conn, org)) == []
    assert invariants(llm_conn) == []
