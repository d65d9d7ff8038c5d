"""The daily audit of every period counter: each hourly pass audits a share of the
organizations, so that every organization's current and previous period (used credits,
used cents, held credits) is recomputed from its requests at least once every 24 hours.
A disagreement is a finding (``llm.period_findings``), logged and counted on the run,
never repaired; it is resolved once the counter is right again.

The counters are corrupted behind the functions' back (a plain UPDATE as the owner), the
only way they can go wrong, and the clock moves an hour per pass.
"""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from llm_db import Llm
from llm_db.service.metrics import collect
from tests.helpers import (
    HOUR,
    T0,
    admit,
    assert_books_right,
    budget_usage,
    corrupt_period,
    new_org,
    row,
    rows,
    run_pass,
    scalar,
    set_budget,
    settle,
)


def busy_org(llm: Llm) -> uuid.UUID:
    """An organization with settled, failed and open requests in January."""
    org = uuid.uuid4()
    llm.upsert_organization(org, "audited", 10_000, now=T0)
    for credits in (30, 45):
        inv = llm.admit(org, 50, "gpt-x", now=T0)
        llm.settle(org, inv.id, credits, 2, now=T0)
    llm.fail(org, llm.admit(org, 20, "gpt-x", now=T0).id, "boom", credits=5, now=T0)
    llm.admit(org, 60, "gpt-x", now=T0 + 100 * HOUR)  # open (too recent to recover) in every pass below
    return org


def hourly_passes(llm: Llm, start, hours: int) -> list:
    return [llm.run_reconciliation(now=start + h * HOUR) for h in range(hours)]


def finding(conn: psycopg.Connection, org: uuid.UUID) -> dict | None:
    return row(conn, "SELECT * FROM llm.period_findings WHERE organization_id = %s", [org])


@pytest.mark.parametrize(
    ("column", "delta"), [("used_credits", 7), ("used_cents", 3), ("held_credits", 11)]
)
def test_a_corrupted_counter_is_found_within_24_passes_and_resolved_when_right(llm_conn, column, delta):
    """The audit finds a period counter changed behind the functions' back within 24 hourly
    passes: one finding with both figures, counted on that pass's run, and the counter is
    left as it is. Once the counter is right again the finding is resolved within 24 more."""
    llm = Llm(llm_conn)
    org = busy_org(llm)
    start = T0 + 31 * HOUR
    hourly_passes(llm, start, 1)  # the organization's first audit: clean
    assert finding(llm_conn, org) is None
    corrupt_period(llm_conn, org, column, delta)
    recorded = scalar(llm_conn, f"SELECT {column} FROM llm.periods WHERE organization_id = %s", [org])

    runs = hourly_passes(llm, start + HOUR, 24)

    found = finding(llm_conn, org)
    assert found is not None and found["resolved_at"] is None
    short = {"used_credits": "used_credits", "used_cents": "used_cents", "held_credits": "held_credits"}[column]
    assert found[f"recorded_{short}"] == recorded
    assert found[f"computed_{short}"] == recorded - delta
    # counted on the run of every pass whose audit saw it (once or twice in 24 passes)
    found_by = [r for r in runs if r.period_findings == 1]
    assert 1 <= len(found_by) <= 2 and sum(r.period_findings for r in runs) == len(found_by)
    assert found["first_seen_at"] == found_by[0].clock
    assert (found["last_run_id"], found["last_seen_at"]) == (found_by[-1].id, found_by[-1].clock)
    assert scalar(llm_conn, f"SELECT {column} FROM llm.periods WHERE organization_id = %s", [org]) == recorded

    corrupt_period(llm_conn, org, column, -delta)
    later = hourly_passes(llm, start + 25 * HOUR, 24)
    resolved = finding(llm_conn, org)
    assert resolved["resolved_at"] is not None
    assert sum(r.period_findings for r in later) == 0
    assert_books_right(llm_conn)


def test_a_finding_on_a_period_older_than_the_previous_month_is_resolved_when_right(llm_conn):
    """The audit revisits every period with an unresolved finding, not
    only the current and previous month. A January finding whose counter is put right by
    hand in April is resolved within April's next 24 hourly passes, and the
    llm_period_findings gauge drops from 1 to 0."""
    llm = Llm(llm_conn)
    org = busy_org(llm)
    corrupt_period(llm_conn, org, "used_credits", 7)
    hourly_passes(llm, T0 + 31 * HOUR, 1)  # the organization's first audit finds it
    assert finding(llm_conn, org)["resolved_at"] is None
    april = datetime(2026, 4, 10, 12, tzinfo=UTC)  # January is three months back

    def gauge() -> float | None:
        return collect(llm_conn, now=april + 24 * HOUR).get_sample_value("llm_period_findings")

    assert gauge() == 1
    corrupt_period(llm_conn, org, "used_credits", -7)
    hourly_passes(llm, april, 24)

    assert finding(llm_conn, org)["resolved_at"] is not None
    assert gauge() == 0
    assert_books_right(llm_conn)


def test_every_organization_is_audited_at_least_once_in_any_24_hourly_passes(llm_conn):
    """A share per pass, spread over the day: after each organization's first audit, any 24
    consecutive hourly passes audit it at least once, and no pass audits them all again."""
    llm = Llm(llm_conn)
    orgs = []
    for n in range(30):
        org = uuid.uuid4()
        llm.upsert_organization(org, f"org {n}", None, now=T0)
        orgs.append(org)
    first = T0 + HOUR
    llm.run_reconciliation(now=first)  # every organization's first audit
    audits: dict[uuid.UUID, list] = {org: [] for org in orgs}
    per_pass = []
    for h in range(1, 49):
        now = first + h * HOUR
        llm.run_reconciliation(now=now)
        audited = rows(llm_conn, "SELECT organization_id FROM llm.sweep_totals WHERE audited_at = %s", [now])
        per_pass.append(len(audited))
        for r in audited:
            audits[r["organization_id"]].append(h)
    for org, hours in audits.items():
        gaps = [b - a for a, b in zip([0, *hours], [*hours, 49], strict=True)]
        assert max(gaps) <= 24, (org, hours)
    assert max(per_pass) < len(orgs) / 2, per_pass


def test_an_audit_that_fails_never_rolls_back_the_organizations_recovery(llm_conn, llm_connect):
    """The audit is its own step after the organization's sweep: when it cannot finish (here
    its finding row is locked elsewhere past org_lock_timeout) it is recorded on the run as
    the 'audit' step of that organization, and the sweep's recovery stays committed."""
    llm = Llm(llm_conn)
    org = busy_org(llm)
    corrupt_period(llm_conn, org, "used_credits", 1)
    llm.run_reconciliation(now=T0 + 31 * HOUR)  # finds it
    assert finding(llm_conn, org) is not None
    stranded = llm.admit(org, 10, "gpt-x", now=T0 + 31 * HOUR)
    llm_conn.execute("UPDATE llm.sweep_totals SET audit_due_at = NULL WHERE organization_id = %s", [org])
    llm_conn.execute("UPDATE llm.settings SET org_lock_timeout = '200ms'")
    blocker = llm_connect(autocommit=False)
    blocker.execute("SELECT 1 FROM llm.period_findings WHERE organization_id = %s FOR UPDATE", [org])

    run = llm.run_reconciliation(now=T0 + 56 * HOUR)
    blocker.rollback()

    assert run is not None and run.status == "partial"
    assert [(e["step"], e["organization_id"], e["sqlstate"]) for e in run.errors] == [
        ("audit", str(org), "55P03")]  # fmt: skip
    assert run.requests_recovered >= 1
    assert scalar(llm_conn, "SELECT status FROM llm.invocations WHERE id = %s", [stranded.id]) == "settled"


def test_live_traffic_never_makes_a_period_look_wrong_to_the_audit(llm_conn, llm_connect):
    """Each period is audited in one statement and every request moves its period in one
    transaction: admissions and settlements running during forced audits give no finding."""
    llm = Llm(llm_conn)
    org = busy_org(llm)
    stop = threading.Event()
    errors: list[BaseException] = []

    def traffic() -> None:
        client = Llm(llm_connect())
        try:
            while not stop.is_set():
                inv = client.admit(org, 10, "gpt-x", now=T0 + 40 * HOUR)
                client.settle(org, inv.id, 8, 1, now=T0 + 40 * HOUR)
        except BaseException as exc:  # asserted empty below
            errors.append(exc)

    workers = [threading.Thread(target=traffic) for _ in range(3)]
    for w in workers:
        w.start()
    try:
        auditor = llm_connect()
        for _ in range(40):
            auditor.execute("SELECT llm._audit_org(%s, %s, NULL)", [org, T0 + 40 * HOUR])
            auditor.execute("UPDATE llm.sweep_totals SET audit_due_at = NULL WHERE organization_id = %s", [org])
    finally:
        stop.set()
        for w in workers:
            w.join(30)
    assert errors == []
    assert scalar(llm_conn, "SELECT count(*) FROM llm.invocations WHERE organization_id = %s", [org]) > 10
    assert finding(llm_conn, org) is None


# ---------------------------------------------------------------- budget counters


def key_history(conn: psycopg.Connection) -> uuid.UUID:
    """An organization whose key k spent 5, 6 and 7 credits on 13, 14 and 15 January, with a
    request of key k and project p still holding 9 on the 15th (T0)."""
    org = new_org(conn, 100_000)
    set_budget(conn, org, "api_key", "*", "day", 1000)
    set_budget(conn, org, "project", "p", "month", 1000)
    for days_ago, credits in ((2, 5), (1, 6), (0, 7)):
        at = T0 - timedelta(days=days_ago)
        assert settle(conn, org, admit(conn, org, 10, now=at, api_key="k")["id"], credits, 1, now=at) == "settled"
    admit(conn, org, 9, now=T0, api_key="k", project="p")
    return org


def corrupt_counter(conn: psycopg.Connection, org: uuid.UUID, scope: str, window: str, start, column: str,
                    delta: int) -> None:
    """Change a budget counter behind the functions' back."""
    assert column in ("used_credits", "held_credits", "used_cents")
    done = conn.execute(f"UPDATE llm.budget_counters SET {column} = {column} + %s WHERE organization_id = %s"
                        " AND scope = %s AND budget_window = %s AND window_start = %s", [delta, org, scope, window, start])
    assert done.rowcount == 1


def test_the_audit_finds_budget_counters_that_disagree_in_the_current_and_previous_windows(llm_conn):
    """Invariant 14: at the organization's audit, a budget counter of the
    current or previous window that disagrees with its requests is logged (a WARNING naming it)
    and counted on the run with the periods' findings, and left as it is; a window before the
    previous one is not audited. Put right, the next audit finds nothing."""
    org = key_history(llm_conn)
    jan13, jan14 = (T0 - timedelta(days=2)).date(), (T0 - timedelta(days=1)).date()
    corrupt_counter(llm_conn, org, "api_key", "day", jan13, "used_credits", 7)  # not audited
    corrupt_counter(llm_conn, org, "api_key", "day", jan14, "used_cents", 7)  # yesterday
    corrupt_counter(llm_conn, org, "project", "month", T0.date().replace(day=1), "held_credits", 3)
    before = budget_usage(llm_conn, org)
    warnings: list[str] = []
    llm_conn.add_notice_handler(lambda d: warnings.append(d.message_primary or ""))

    run = run_pass(llm_conn, T0 + HOUR)  # the organization's first audit

    assert run["period_findings"] == 2
    assert sorted(w.split(" of organization")[0] for w in warnings if "budget counter" in w) == [
        f"llm: budget counter api_key k day {jan14}",
        "llm: budget counter project p month 2026-01-01",
    ]
    assert budget_usage(llm_conn, org) == before  # never repaired
    corrupt_counter(llm_conn, org, "api_key", "day", jan13, "used_credits", -7)
    corrupt_counter(llm_conn, org, "api_key", "day", jan14, "used_cents", -7)
    corrupt_counter(llm_conn, org, "project", "month", T0.date().replace(day=1), "held_credits", -3)
    assert scalar(llm_conn, "SELECT llm._audit_budgets(%s, %s)", [org, T0 + HOUR]) == 0
    assert_books_right(llm_conn)


def test_a_deleted_budget_counter_is_a_finding_unless_retention_could_have_deleted_it(llm_conn):
    """Invariant 14 as the audit applies it: a missing counter is a finding unless its
    window ended on or before the organization's retention horizon and no open request
    is admitted under it. Before, yesterday's counter, whose requests are all terminal,
    was taken for retention's work whatever the horizon (the checker went blind to a
    counter lost by a hand edit or a partial restore); today's, held by an open request,
    is a finding even past the horizon."""
    org = key_history(llm_conn)
    for day in (T0 - timedelta(days=1), T0):
        llm_conn.execute("DELETE FROM llm.budget_counters WHERE organization_id = %s AND scope = 'api_key'"
                         " AND window_start = %s", [org, day.date()])  # fmt: skip
    warnings: list[str] = []
    llm_conn.add_notice_handler(lambda d: warnings.append(d.message_primary or ""))
    assert scalar(llm_conn, "SELECT llm._audit_budgets(%s, %s)", [org, T0 + HOUR]) == 2
    # retention's horizon at today: yesterday's window ended on it, so it may be gone
    llm_conn.execute("INSERT INTO llm.budget_horizons VALUES (%s, %s, %s)", [org, T0.date(), T0])
    warnings.clear()
    assert scalar(llm_conn, "SELECT llm._audit_budgets(%s, %s)", [org, T0 + HOUR]) == 1
    assert [w for w in warnings if "budget counter" in w] == [
        f"llm: budget counter api_key k day {T0.date()} of organization {org} disagrees with its"
        " requests: used credits none (requests say 7), used cents none (1), held credits none (9)"
    ]
