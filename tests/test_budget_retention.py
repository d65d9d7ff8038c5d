"""Budget counters kept over time: retention under every clock and interleaving the
contract allows (docs/architecture.md "Budgets", Retention; invariant 14; LL012).

Each test is a defect the budgets-airtight attacks found on 0.3.0, met as a user
meets it: the owner is not a superuser, the app and operator are their own roles,
races are two real sessions ordered by locks (never by sleeping), and the clocks
are those the contract accepts: the caller's, behind the server's or ahead of it.
Each fails on 0.3.0.
"""

from __future__ import annotations

import threading
import uuid
from datetime import datetime
from typing import Any

import psycopg
import pytest

from llm_db import Llm, WindowRetired
from tests.helpers import (
    DAY,
    HOUR,
    T0,
    admit,
    assert_books_right,
    assert_sqlstate,
    budget_usage,
    invariants,
    new_org,
    params,
    reconcile,
    run_pass,
    scalar,
    set_budget,
    settle,
    sql_of,
    wait_blocked,
)

ADMIT = sql_of("admit")


def server_now(conn: psycopg.Connection) -> datetime:
    return scalar(conn, "SELECT now()")


def horizon(conn: psycopg.Connection, org: uuid.UUID) -> Any:
    return scalar(conn, "SELECT horizon FROM llm.budget_horizons WHERE organization_id = %s", [org])


def user_org(conn: psycopg.Connection, limit: int, *, since: datetime) -> uuid.UUID:
    """An organization without allowance whose end users have a day budget of ``limit``."""
    org = new_org(conn, None, now=since)
    set_budget(conn, org, "end_user", "*", "day", limit, now=since)
    return org


def test_a_purged_window_is_refused_not_admitted_again(llm_conn):
    """Defect 1: 90 of an end user's day budget of 100 used 500 days ago (a second 90
    refused there); one pass with the real clock purges that day's counter; the same
    second request of 90 in that day was admitted (180 of 100). It is now refused with
    LL012 (``WindowRetired``), writing nothing."""
    # noon of a day 500 days back: the request and its retry 2 hours later share its day
    # window whatever the time of day the suite runs (at 22:00 UTC or later they did not)
    old = (server_now(llm_conn) - 500 * DAY).replace(hour=12, minute=0, second=0, microsecond=0)
    org = user_org(llm_conn, 100, since=old - DAY)
    first = admit(llm_conn, org, 90, now=old, end_user="u")["id"]
    assert settle(llm_conn, org, first, 90, 1, now=old + HOUR) == "settled"
    assert_sqlstate(llm_conn, "LL001", ADMIT, params("admit", org, 90, "m", now=old + 2 * HOUR, end_user="u"))

    run_pass(llm_conn, None)  # the server's clock
    assert budget_usage(llm_conn, org) == {}  # the window is purged

    error = assert_sqlstate(llm_conn, "LL012", ADMIT,
                            params("admit", org, 90, "m", now=old + 2 * HOUR, end_user="u"))  # fmt: skip
    assert error.diag.message_detail.split("\n")[0] == "u"
    with pytest.raises(WindowRetired) as caught:
        Llm(llm_conn).admit(org, 90, "m", now=old + 2 * HOUR, end_user="u")
    assert (caught.value.scope, caught.value.scope_id, caught.value.window) == ("end_user", "u", "day")
    assert_books_right(llm_conn)


def test_the_horizon_refuses_windows_ended_on_or_before_it_and_admits_the_next(llm_conn):
    """Both sides of the horizon (the UTC day of now - budget_retention, 400 days): a day
    window ending on the horizon (the day before it) may have lost its counter and is
    refused even for an end user never seen; the horizon's own day ends after it and is
    admitted; so is a month window still running past it. A request naming no budget is
    never refused by retention."""
    now = server_now(llm_conn)
    org = user_org(llm_conn, 100, since=now - 900 * DAY)
    run_pass(llm_conn, None)
    edge = horizon(llm_conn, org)
    assert edge == (now - 400 * DAY).date()
    on_edge = datetime(edge.year, edge.month, edge.day, 12, tzinfo=now.tzinfo)

    assert_sqlstate(llm_conn, "LL012", ADMIT, params("admit", org, 5, "m", now=on_edge - DAY, end_user="new"))
    assert admit(llm_conn, org, 5, now=on_edge, end_user="new")["status"] == "reserved"
    assert admit(llm_conn, org, 5, now=on_edge - 30 * DAY)["status"] == "reserved"  # no budget
    set_budget(llm_conn, org, "project", "p", "month", 100, now=on_edge)
    month_start = on_edge.replace(day=1)
    if month_start.date() < edge:  # the horizon's month ends after it: its counter cannot be purged yet
        assert admit(llm_conn, org, 5, now=month_start, project="p")["status"] == "reserved"
    assert_books_right(llm_conn)


def test_a_pass_with_a_clock_ahead_deletes_nothing_of_today(llm_conn):
    """Defect 2: ``run_reconciliation`` with a clock 402 days ahead deleted today's
    counters that held nothing, and the next admission spent today's budget again.
    Retention's clock is LEAST(p_now, now()): the counter stays and the admission is
    refused."""
    now = server_now(llm_conn)
    org = user_org(llm_conn, 100, since=now - DAY)
    first = admit(llm_conn, org, 100, now=now, end_user="u")["id"]
    assert settle(llm_conn, org, first, 100, 3, now=now) == "settled"

    run_pass(llm_conn, now + 402 * DAY)

    assert budget_usage(llm_conn, org)[("end_user", "u", "day", now.date())]["used_credits"] == 100
    assert_sqlstate(llm_conn, "LL001", ADMIT, params("admit", org, 1, "m", now=now, end_user="u"))
    assert_books_right(llm_conn)


def test_a_counter_missing_inside_the_horizon_is_an_invariant_violation(llm_conn):
    """Defect 3: invariant 14 excused a missing counter whenever its requests were all
    terminal, so today's counter deleted by a hand edit (or lost to a partial restore)
    was reported by nothing. Only a window ended on or before the organization's horizon
    is excused now."""
    org = user_org(llm_conn, 100, since=T0 - DAY)
    inv = admit(llm_conn, org, 10, now=T0, end_user="u")["id"]
    assert settle(llm_conn, org, inv, 7, 1, now=T0) == "settled"
    llm_conn.execute("DELETE FROM llm.budget_counters WHERE organization_id = %s", [org])  # the fault
    found = [v for v in invariants(llm_conn) if v["invariant"] == 14]
    assert [v["subject"] for v in found] == [f"budget end_user u day {T0.date()}"]

    # past the horizon, the same gap is what retention does
    llm_conn.execute("INSERT INTO llm.budget_horizons VALUES (%s, %s, %s)", [org, (T0 + DAY).date(), T0])
    assert_books_right(llm_conn)


def test_retention_keeps_the_counter_of_an_open_request_that_holds_nothing(llm_conn):
    """Defect 4: retention tested ``held_credits = 0``, which an open request of estimate
    0 leaves at 0. With budget_retention 1 hour and the 24 h recovery window, a pass
    deleted the counter of a request admitted 3 h earlier on the previous UTC day; its
    settlement of 70 then found no counter and moved nothing. The horizon never passes
    the oldest open request's day: the counter stays and takes the 70."""
    llm_conn.execute("UPDATE llm.settings SET budget_retention = '1 hour'")
    at = datetime(2026, 1, 15, 1, 0, tzinfo=T0.tzinfo)
    org = user_org(llm_conn, 100, since=at - 10 * DAY)
    inv = admit(llm_conn, org, 0, now=at - 3 * HOUR, end_user="u")["id"]

    run_pass(llm_conn, at)
    assert horizon(llm_conn, org) == (at - 3 * HOUR).date()
    assert_books_right(llm_conn)
    assert settle(llm_conn, org, inv, 70, 2, now=at) == "settled"
    assert budget_usage(llm_conn, org)[("end_user", "u", "day", (at - 3 * HOUR).date())]["used_credits"] == 70
    assert_books_right(llm_conn)


def test_requests_a_small_sweep_batch_leaves_open_keep_their_counters(llm_conn):
    """Defect 4's sibling: a sweep recovers at most ``sweep_batch`` requests, so older
    ones stay open past the recovery window; no bound between the settings could keep
    retention off their counters. Three requests of estimate 0, five, four and three days old, a batch of
    one: each pass recovers the oldest, and a counter goes only once the request admitted
    under it is terminal (the horizon follows the oldest request still open)."""
    llm_conn.execute("UPDATE llm.settings SET budget_retention = '1 hour', recovery_window = '1 hour',"
                     " sweep_batch = 1")  # fmt: skip
    org = user_org(llm_conn, 100, since=T0 - 10 * DAY)
    for n in range(3):
        admit(llm_conn, org, 0, now=T0 - (5 - n) * DAY, end_user=f"u{n}")
    for n in range(3):
        reconcile(llm_conn, org, now=T0)
        assert_books_right(llm_conn)
        assert sorted(k[1] for k in budget_usage(llm_conn, org)) == [f"u{m}" for m in range(n + 1, 3)]
    assert scalar(llm_conn, "SELECT count(*) FROM llm.invocations WHERE organization_id = %s"
                            " AND status IN ('reserved', 'dispatched')", [org]) == 0  # fmt: skip


def test_the_sweep_never_waits_for_a_counter_a_call_holds(llm_connect, llm_conn):
    """Defect 5 (and tests/isolation/specs/retention_vs_admission.spec): retention's
    DELETE locked the counters in the order its scan met them and waited on one another
    session held; with an admission taking the counters in the lock order, one of them
    failed with 40P01. Now it locks in the lock order and skips what is locked: with an
    operator holding the end user's counter (set_budget in an open transaction), the
    sweep completes at once (here under a 2 s lock_timeout, which 0.3.0 hit)."""
    llm_conn.execute("UPDATE llm.settings SET budget_retention = '30 days'")
    org = new_org(llm_conn, None, now=T0 - 100 * DAY)
    set_budget(llm_conn, org, "project", "p", "day", 100, now=T0 - 100 * DAY)
    set_budget(llm_conn, org, "end_user", "*", "day", 100, now=T0 - 100 * DAY)
    old = T0 - 60 * DAY
    inv = admit(llm_conn, org, 10, now=old, project="p", end_user="u")["id"]
    assert settle(llm_conn, org, inv, 10, 1, now=old) == "settled"

    holder = llm_connect(role="llm_operator", autocommit=False)
    holder.execute("SELECT llm.set_budget(%s, 'end_user', 'u', 'day', 100, p_now => %s)", [org, old])
    sweeper = llm_connect(role="llm_operator")
    sweeper.execute("SET lock_timeout = '2s'")
    reconcile(sweeper, org, now=T0)
    assert set(budget_usage(llm_conn, org)) == {("end_user", "u", "day", old.date())}  # p's went

    # the purged window is refused (an admission naming the end user too would wait for the
    # operator's transaction, which holds that counter: its stripes are locked in bit order)
    app = llm_connect(role="llm_app")
    assert_sqlstate(app, "LL012", ADMIT, params("admit", org, 5, "m", now=old, project="p"),
                    unchanged=False)  # fmt: skip
    holder.commit()
    reconcile(sweeper, org, now=T0)
    assert budget_usage(llm_conn, org) == {}
    assert_books_right(llm_conn)


def test_a_counter_past_the_horizon_keeps_an_open_request_admitted_into_it(llm_connect, llm_conn):
    """Defect 4, the case the horizon's bound alone does not cover: a counter that outlived
    the horizon (its pass skipped it, locked) takes an estimate-0 request dated into its
    window, which the horizon, already past that day, cannot bound any more. The next pass
    must keep the counter while the request is open (it holds nothing), so its settlement
    of 70 is counted. Found by a mutation of retention that the simulation survived."""
    llm_conn.execute("UPDATE llm.settings SET budget_retention = '1 hour'")
    org = user_org(llm_conn, 100, since=T0 - 10 * DAY)
    day = T0 - DAY
    first = admit(llm_conn, org, 10, now=day, end_user="u")["id"]
    assert settle(llm_conn, org, first, 10, 1, now=day) == "settled"

    holder = llm_connect(role="llm_operator", autocommit=False)  # holds the counter of that day
    holder.execute("SELECT llm.set_budget(%s, 'end_user', 'u', 'day', 100, p_now => %s)", [org, day])
    sweeper = llm_connect(role="llm_operator")
    sweeper.execute("SET lock_timeout = '2s'")
    reconcile(sweeper, org, now=T0)
    assert horizon(llm_conn, org) == T0.date()  # past the counter's window, which survived
    holder.commit()

    late = admit(llm_conn, org, 0, now=day + HOUR, end_user="u")["id"]  # its counter exists
    reconcile(sweeper, org, now=T0 + HOUR / 2)  # too young to recover: open, holding nothing
    assert_books_right(llm_conn)
    assert settle(llm_conn, org, late, 70, 2, now=T0 + HOUR) == "settled"
    assert budget_usage(llm_conn, org)[("end_user", "u", "day", day.date())]["used_credits"] == 80
    assert_books_right(llm_conn)


@pytest.mark.parametrize("used", [90, 10], ids=["waits-in-the-insert", "waits-in-the-update"])
def test_an_admission_waiting_on_a_counter_the_pass_deletes_sees_its_horizon(llm_connect, llm_conn, used):
    """The race the horizon is read for: a pass deletes a counter and raises the horizon
    in one transaction; an admission dated into that window that does not fit the old
    counter goes to create it, waits on the unique key of the row being deleted, and
    would create it anew from zero once the pass commits (0.3.0 admitted it: 180 of
    100). It reads the horizon again after that wait and refuses (LL012). One that
    fits the old counter waits in its UPDATE instead, finds the row gone, and its
    INSERT, a later snapshot, sees the horizon."""
    llm_conn.execute("UPDATE llm.settings SET budget_retention = '30 days'")
    org = user_org(llm_conn, 100, since=T0 - 100 * DAY)
    old = T0 - 60 * DAY
    inv = admit(llm_conn, org, used, now=old, end_user="u")["id"]
    assert settle(llm_conn, org, inv, used, 1, now=old) == "settled"

    sweeper = llm_connect(role="llm_operator", autocommit=False)
    reconcile(sweeper, org, now=T0)  # deleted, horizon raised: not committed
    app = llm_connect(role="llm_app")
    outcome: dict[str, Any] = {}

    def second() -> None:
        try:
            admit(app, org, 90, now=old + HOUR, end_user="u")
            outcome["admitted"] = True
        except psycopg.Error as exc:
            outcome["sqlstate"] = exc.sqlstate

    thread = threading.Thread(target=second)
    thread.start()
    wait_blocked(llm_conn, app.info.backend_pid, by=sweeper.info.backend_pid)
    sweeper.commit()
    thread.join(10)
    assert outcome == {"sqlstate": "LL012"}
    assert budget_usage(llm_conn, org) == {}
    assert_books_right(llm_conn)
