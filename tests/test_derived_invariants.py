"""The checker sees every derived table: ``llm.check_invariants()`` compares the sweeps'
totals (invariant 10), the unresolved period findings (11) and the drift findings (13)
with the requests and tasks they are derived from.

Every legal sequence leaves them right, a late true-up included (it keeps
``recovered_credits``); each is then corrupted behind the functions' back (a plain
UPDATE, INSERT or DELETE as the test's superuser), and its check must report it.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest

from tests.helpers import (
    HOUR,
    T0,
    admit,
    admit_dispatched,
    assert_books_right,
    call,
    close_task,
    corrupt_period,
    fail,
    invariants,
    new_org,
    open_task,
    reconcile,
    row,
    run_pass,
    scalar,
    set_budget,
    settle,
)


def reported(conn: psycopg.Connection) -> list[tuple[int, uuid.UUID]]:
    return [(r["invariant"], r["organization_id"]) for r in invariants(conn)]


def drifted_task(conn: psycopg.Connection, org: uuid.UUID, *, closed_at) -> uuid.UUID:
    """A closed task whose recorded credits were inflated by 5 by hand (drift)."""
    x = open_task(conn, org, now=closed_at - HOUR)
    settle(conn, org, admit_dispatched(conn, org, 10, execution_id=x, now=closed_at - HOUR), 9, 4,
           now=closed_at - HOUR)  # fmt: skip
    assert close_task(conn, org, x, now=closed_at)
    conn.execute(
        "UPDATE llm.executions SET credits = credits + 5 WHERE organization_id = %s AND id = %s",
        [org, x],
    )
    return x


def booked_org(conn: psycopg.Connection) -> tuple[uuid.UUID, uuid.UUID]:
    """An organization (recovery_charge 'dispatched', late_settlement 'true_up') whose
    sweeps recovered three requests: one never dispatched (charged 0: uncharged), one
    dispatched and later trued up, one with a zero estimate (charged 0, not uncharged);
    with a drift finding (task returned) and a period finding resolved after a hand fix."""
    org = new_org(conn, 10_000)
    call(conn, "set_recovery_policy", org, "dispatched", "true_up")
    admit(conn, org, 50, now=T0)  # never dispatched
    late = admit_dispatched(conn, org, 40, now=T0)
    admit(conn, org, 0, now=T0)
    settle(conn, org, admit_dispatched(conn, org, 20, now=T0), 20, 3, now=T0)
    x = drifted_task(conn, org, closed_at=T0 + HOUR)

    corrupt_period(conn, org, "used_credits", 7)
    first = run_pass(conn, T0 + 25 * HOUR)  # recovers the three, finds the drift and the period
    assert (first["requests_recovered"], first["recovered_uncharged"]) == (3, 1)
    assert (first["drift_findings"], first["period_findings"]) == (1, 1)
    corrupt_period(conn, org, "used_credits", -7)
    conn.execute(
        "UPDATE llm.sweep_totals SET audit_due_at = NULL WHERE organization_id = %s", [org]
    )
    run_pass(conn, T0 + 26 * HOUR)  # resolves the period finding
    assert scalar(
        conn, "SELECT resolved_at FROM llm.period_findings WHERE organization_id = %s", [org]
    )

    assert settle(conn, org, late, 30, 2, now=T0 + 27 * HOUR) == "trued_up"
    return org, x


def test_the_derived_tables_agree_with_the_books_after_recovery_and_a_true_up(llm_conn):
    """Invariants 10, 11 and 13: the sweeps' totals count what recovery did,
    exactly, also after a true-up replaced a recovered charge; a resolved period finding
    and a drift finding whose task still differs report nothing."""
    org, _ = booked_org(llm_conn)
    totals = row(llm_conn, "SELECT * FROM llm.sweep_totals WHERE organization_id = %s", [org])
    assert (
        totals["recovered_requests"],
        totals["recovered_uncharged"],
        totals["past_window_alerts"],
    ) == (3, 1, 3)
    assert (
        scalar(llm_conn, "SELECT count(*) FROM llm.invocations WHERE settlement_kind = 'trued_up'")
        == 1
    )
    assert scalar(llm_conn, "SELECT count(*) FROM llm.drift_findings") == 1
    assert_books_right(llm_conn)


@pytest.mark.parametrize(
    "column", ["recovered_requests", "recovered_uncharged", "past_window_alerts"]
)
def test_invariant_10_reports_sweep_totals_that_differ_from_the_requests(llm_conn, column):
    """Invariant 10: sweep_totals.recovered_requests counts the requests with
    recovered_credits, recovered_uncharged those recovered at 0 with an estimate,
    past_window_alerts those with past_window_alerted_at; a total changed by hand is
    reported."""
    org, _ = booked_org(llm_conn)
    llm_conn.execute(
        f"UPDATE llm.sweep_totals SET {column} = {column} + 1 WHERE organization_id = %s", [org]
    )
    assert reported(llm_conn) == [(10, org)]


def test_invariant_10_reports_a_missing_sweep_totals_row(llm_conn):
    """Invariant 10: an organization whose requests were recovered has its
    totals; a deleted row reads as zeros and is reported."""
    org, _ = booked_org(llm_conn)
    llm_conn.execute("DELETE FROM llm.sweep_totals WHERE organization_id = %s", [org])
    assert reported(llm_conn) == [(10, org)]


def test_invariant_11_reports_an_unresolved_finding_on_a_period_that_agrees(llm_conn):
    """Invariant 11: an unresolved period finding means its counter still
    differs; a resolved finding reopened by hand, or one written for a period that
    does not exist, is reported."""
    org, _ = booked_org(llm_conn)
    llm_conn.execute(
        "UPDATE llm.period_findings SET resolved_at = NULL WHERE organization_id = %s", [org]
    )
    assert reported(llm_conn) == [(11, org)]
    llm_conn.execute(
        "UPDATE llm.period_findings SET period_start = '2001-01-01' WHERE organization_id = %s",
        [org],
    )
    assert reported(llm_conn) == [(11, org)]


def test_invariant_13_reports_a_drift_finding_whose_task_agrees(llm_conn):
    """Invariant 13: a drift finding is kept only while its task differs from its
    requests (the sweep deletes it once they agree). A task put right by hand is
    reported until the next sweep drops its finding; a finding written by hand for an
    honest task is reported too."""
    org, x = booked_org(llm_conn)
    llm_conn.execute("UPDATE llm.executions SET credits = credits - 5 WHERE organization_id = %s AND id = %s",
                     [org, x])  # fmt: skip
    assert reported(llm_conn) == [(13, org)]
    reconcile(llm_conn, org, now=T0 + 28 * HOUR)
    assert scalar(llm_conn, "SELECT count(*) FROM llm.drift_findings") == 0
    assert_books_right(llm_conn)

    llm_conn.execute(
        "INSERT INTO llm.drift_findings (organization_id, execution_id, recorded_request_count, recorded_credits,"
        " recorded_cents, settled_request_count, settled_credits, settled_cents, first_seen_at, last_seen_at)"
        " VALUES (%s, %s, 1, 9, 4, 1, 9, 4, %s, %s)", [org, x, T0, T0])  # fmt: skip
    assert reported(llm_conn) == [(13, org)]


def test_a_drift_finding_on_a_task_closed_before_the_drift_window_is_dropped_once_it_agrees(
    llm_conn,
):
    """Invariant 13, BR-CAP-PFM-LLM-009-06: the sweep revisits every task with a
    drift finding, whatever its age. A finding whose task closed more than drift_window
    (7 days) ago is not reported again while it differs (it is kept as it was), and is
    dropped by the next sweep once its task is put right by hand."""
    org = new_org(llm_conn, 10_000)
    x = drifted_task(llm_conn, org, closed_at=T0 + HOUR)
    assert reconcile(llm_conn, org, now=T0 + 2 * HOUR)["drift_findings"] == 1
    kept = row(llm_conn, "SELECT * FROM llm.drift_findings")
    later = T0 + 9 * 24 * HOUR  # the task is out of the drift window

    assert reconcile(llm_conn, org, now=later)["drift_findings"] == 0  # not reported again
    assert row(llm_conn, "SELECT * FROM llm.drift_findings") == kept
    assert_books_right(llm_conn)

    llm_conn.execute("UPDATE llm.executions SET credits = credits - 5 WHERE organization_id = %s AND id = %s",
                     [org, x])  # fmt: skip
    assert reported(llm_conn) == [(13, org)]
    reconcile(llm_conn, org, now=later + HOUR)
    assert scalar(llm_conn, "SELECT count(*) FROM llm.drift_findings") == 0
    assert_books_right(llm_conn)


# ---------------------------------------------------------------- budget counters


def budgeted_org(conn: psycopg.Connection) -> uuid.UUID:
    """An organization with a key's day budget of 100, moved legally to its ceiling's
    edges: a request settled above its hold (50 charged on 40: a measured overrun of 10),
    a failed one that used 5, an open one holding 45; then the limit lowered to 60,
    below used + held (a limit lowered after the usage). Invariants 14 and 15 hold."""
    org = new_org(conn, 10_000)
    set_budget(conn, org, "api_key", "k", "day", 100)
    settle(conn, org, admit(conn, org, 40, api_key="k", now=T0)["id"], 50, 3, now=T0)
    fail(conn, org, admit(conn, org, 15, api_key="k", now=T0)["id"], credits=5, now=T0)
    admit(conn, org, 45, api_key="k", now=T0)
    set_budget(conn, org, "api_key", "k", "day", 60)
    assert_books_right(conn)
    return org


def corrupt_counter(conn: psycopg.Connection, org: uuid.UUID, assignment: str) -> None:
    """Change the organization's budget counter behind the functions' back."""
    conn.execute(f"UPDATE llm.budget_counters SET {assignment} WHERE organization_id = %s", [org])


@pytest.mark.parametrize(("assignment", "invariants"), [("used_credits = used_credits + 1", (14,)),
                                                         ("held_credits = held_credits - 1", (14, 18)),
                                                         ("used_cents = used_cents + 1", (14,))])  # fmt: skip
def test_invariant_14_reports_a_budget_counter_that_differs_from_its_requests(
    llm_conn, llm_superuser_conn, assignment, invariants
):
    """Invariant 14 (each counter's used, held and cents equal its requests): one
    counter figure off by one, and that invariant alone reports it; a held credit off is
    also one of the stripe's (invariant 18: each stripe holds its open requests' holds)."""
    org = budgeted_org(llm_conn)
    corrupt_counter(llm_superuser_conn, org, assignment)
    assert reported(llm_conn) == [(n, org) for n in invariants]


def test_invariant_14_reports_an_open_requests_missing_counter(llm_conn, llm_superuser_conn):
    """Invariant 14 (an open request's counters exist; only a terminal one's may be gone,
    by retention): the counter deleted under an open request is reported, by 14 alone."""
    org = budgeted_org(llm_conn)
    llm_superuser_conn.execute("DELETE FROM llm.budget_counters WHERE organization_id = %s", [org])
    assert reported(llm_conn) == [(14, org)]


def test_invariant_15_reports_a_counter_above_the_limit_it_was_admitted_under(
    llm_conn, llm_superuser_conn
):
    """Invariant 15 (a budget is a ceiling: used + held - overrun <= the limit the last
    admission was decided against): the counter's admitted limit set below its
    90 of usage that is no measured overrun is reported, by 15 alone. The legal overrun
    (settled above its hold) and the limit lowered after the usage were not."""
    org = budgeted_org(llm_conn)
    corrupt_counter(llm_superuser_conn, org, "admitted_limit = 80")
    assert reported(llm_conn) == [(15, org)]


def test_invariant_15_reports_an_admitted_limit_off_its_unchanged_budget(
    llm_conn, llm_superuser_conn
):
    """Invariant 15 (the admitted limit is the budget's limit while the budget's revision is
    the one the counter was admitted under): after the budget is raised to 120
    and a request admitted under it, the counter's admitted limit changed to 121 (still a
    ceiling above its usage) is reported, by 15 alone."""
    org = budgeted_org(llm_conn)
    set_budget(llm_conn, org, "api_key", "k", "day", 120)
    admit(llm_conn, org, 1, api_key="k", now=T0)
    assert_books_right(llm_conn)
    corrupt_counter(llm_superuser_conn, org, "admitted_limit = 121")
    assert reported(llm_conn) == [(15, org)]
