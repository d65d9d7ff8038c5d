"""Recovery: CAP-PFM-LLM-009 (BR-CAP-PFM-LLM-009-01 .. -07, SC-CAP-PFM-LLM-009-01) and the
per-organization hops of WF-PFM-LLM-004, proved against llm.reconcile_org and
CALL llm.run_reconciliation with the clock moved through ``p_now``.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

import psycopg
import pytest

from tests.helpers import (
    ADMIT_SQL,
    HOUR,
    T0,
    admit,
    admit_dispatched,
    admit_params,
    assert_books_right,
    close_task,
    health,
    invocation,
    lock_period_rows,
    new_org,
    notices,
    open_task,
    period,
    reconcile,
    row,
    rows,
    run_pass,
    set_org,
    settle,
    wait_blocked,
)

TASK = "report.generate"
ALLOWANCE = 1_000_000


# ---------------------------------------------------------------- local helpers


def org_ledger(conn: psycopg.Connection, org: uuid.UUID) -> list[tuple]:
    return conn.execute(
        "SELECT invocation_id, entry, credits, cents, recorded_at FROM llm.ledger"
        " WHERE organization_id = %s ORDER BY invocation_id, entry", [org]).fetchall()


# ---------------------------------------------------------------- BR-CAP-PFM-LLM-009-01


def test_br_cap_pfm_llm_009_01_pass_settles_stale_requests_at_estimate_and_releases_holds(llm_conn):
    """BR-CAP-PFM-LLM-009-01; WF-PFM-LLM-004 hops 2 and 3: the hourly pass visits operational
    organizations and settles requests older than 24 h at their stored estimate without a
    money figure (charged_cents NULL, settlement_kind recovered), releases their holds and
    moves their period; a suspended organization is not visited."""
    a, b, suspended = new_org(llm_conn, ALLOWANCE), new_org(llm_conn, ALLOWANCE), new_org(llm_conn, ALLOWANCE)
    inv_a = admit_dispatched(llm_conn, a, 40)
    inv_a2 = admit(llm_conn, a, 15)["id"]  # reserved, never dispatched: also stranded
    inv_b = admit_dispatched(llm_conn, b, 25)
    inv_s = admit_dispatched(llm_conn, suspended, 30)
    set_org(llm_conn, suspended, ALLOWANCE, status="suspended")
    swept_at = T0 + 25 * HOUR

    run = run_pass(llm_conn, swept_at)

    assert run["status"] == "succeeded"
    assert run["orgs_visited"] == 2 and run["requests_recovered"] == 3
    assert run["released_hold_credits"] == 40 + 15 + 25
    for org, inv, estimate in ((a, inv_a, 40), (a, inv_a2, 15), (b, inv_b, 25)):
        row = invocation(llm_conn, org, inv)
        assert row["status"] == "settled" and row["settlement_kind"] == "recovered"
        assert row["charged_credits"] == estimate and row["charged_cents"] is None
        assert row["settled_at"] == swept_at
    assert (period(llm_conn, a)["held_credits"], period(llm_conn, a)["used_credits"]) == (0, 55)
    assert period(llm_conn, a)["used_cents"] == 0
    assert (period(llm_conn, b)["held_credits"], period(llm_conn, b)["used_credits"]) == (0, 25)
    assert org_ledger(llm_conn, b) == [
        (inv_b, "charge", 25, None, swept_at), (inv_b, "hold", 25, None, T0), (inv_b, "release", 25, None, swept_at)]
    # the suspended organization was not visited: its request and hold are untouched
    assert invocation(llm_conn, suspended, inv_s)["status"] == "dispatched"
    assert (period(llm_conn, suspended)["held_credits"], period(llm_conn, suspended)["used_credits"]) == (30, 0)
    assert_books_right(llm_conn)


def test_br_cap_pfm_llm_009_01_reconcile_org_refuses_a_suspended_organization(llm_conn):
    """BR-CAP-PFM-LLM-009-01: only operational organizations are swept; a direct sweep of a
    suspended one raises LL003 and changes nothing."""
    org = new_org(llm_conn, ALLOWANCE)
    inv = admit_dispatched(llm_conn, org, 30)
    set_org(llm_conn, org, ALLOWANCE, status="suspended")
    with pytest.raises(psycopg.Error) as raised:
        reconcile(llm_conn, org, now=T0 + 25 * HOUR)
    assert raised.value.sqlstate == "LL003"
    assert invocation(llm_conn, org, inv)["status"] == "dispatched"


def test_sc_cap_pfm_llm_009_01_releases_the_hold_which_is_the_whole_point_of_the_sweep(llm_conn):
    """SC-CAP-PFM-LLM-009-01 "releases the hold, which is the whole point of the sweep": a worker
    stops after provider dispatch and leaves a reservation; 25 h later the pass's fallback
    settlement releases its hold and records the recovery charge."""
    org = new_org(llm_conn, 100)
    inv = admit_dispatched(llm_conn, org, 60)
    assert period(llm_conn, org)["held_credits"] == 60
    swept_at = T0 + 25 * HOUR
    run_pass(llm_conn, swept_at)
    assert period(llm_conn, org)["held_credits"] == 0
    assert period(llm_conn, org)["used_credits"] == 60
    entries = {entry: (credits, cents, at) for _, entry, credits, cents, at in org_ledger(llm_conn, org)}
    assert entries == {"hold": (60, None, T0), "release": (60, None, swept_at), "charge": (60, None, swept_at)}
    assert invocation(llm_conn, org, inv)["settlement_kind"] == "recovered"
    # the released credits are admissible again
    admit_dispatched(llm_conn, org, 40, now=swept_at)
    assert_books_right(llm_conn)


# ---------------------------------------------------------------- BR-CAP-PFM-LLM-009-02


def test_br_cap_pfm_llm_009_02_leaves_the_hold_in_place_so_a_live_call_keeps_the_credits_it_reserved(llm_conn):
    """BR-CAP-PFM-LLM-009-02 "leaves the hold in place, so a live call keeps the credits it
    reserved": a request 23 h old keeps its state and reservation through the sweep, and its
    worker can still settle it with measured usage."""
    org = new_org(llm_conn, 100)
    inv = admit_dispatched(llm_conn, org, 70)
    sweep = reconcile(llm_conn, org, now=T0 + 23 * HOUR)
    assert (sweep["recovered_requests"], sweep["released_hold_credits"], sweep["more_pending"]) == (0, 0, False)
    row = invocation(llm_conn, org, inv)
    assert row["status"] == "dispatched" and row["settled_at"] is None and row["past_window_alerted_at"] is None
    assert period(llm_conn, org)["held_credits"] == 70
    # the hold still counts at admission
    with pytest.raises(psycopg.Error) as raised:
        admit_dispatched(llm_conn, org, 31, now=T0 + 23 * HOUR)
    assert raised.value.sqlstate == "LL001"
    assert settle(llm_conn, org, inv, 65, 12, now=T0 + 23 * HOUR + timedelta(minutes=30)) == "settled"
    row = invocation(llm_conn, org, inv)
    assert row["settlement_kind"] == "measured" and row["charged_cents"] == 12
    assert_books_right(llm_conn)


def test_br_cap_pfm_llm_009_02_boundary_exactly_24h_is_recovered_one_second_less_is_not(llm_conn):
    """BR-CAP-PFM-LLM-009-02 / -01 boundary: a request created exactly one recovery window
    (settings.recovery_window, 24 h) before the sweep is recovered; one created a second
    later keeps its hold."""
    org = new_org(llm_conn, ALLOWANCE)
    old = admit_dispatched(llm_conn, org, 10)
    young = admit_dispatched(llm_conn, org, 20, now=T0 + timedelta(seconds=1))
    assert reconcile(llm_conn, org, now=T0 + 24 * HOUR)["recovered_requests"] == 1
    assert invocation(llm_conn, org, old)["settlement_kind"] == "recovered"
    assert invocation(llm_conn, org, young)["status"] == "dispatched"
    assert period(llm_conn, org)["held_credits"] == 20


# ---------------------------------------------------------------- BR-CAP-PFM-LLM-009-03


def test_br_cap_pfm_llm_009_03_repeating_reconcile_adds_no_charge_nor_alert(llm_conn):
    """BR-CAP-PFM-LLM-009-03: repeating a successful recovery adds no charge and no second
    past-window alert for the same request; the ledger, the period, the alert stamp and the
    notices are unchanged."""
    org = new_org(llm_conn, 100)
    inv = admit_dispatched(llm_conn, org, 90)
    first = reconcile(llm_conn, org, now=T0 + 25 * HOUR)
    assert (first["recovered_requests"], first["past_window_alerts"], first["notices_created"]) == (1, 1, 1)
    snapshot = (org_ledger(llm_conn, org), period(llm_conn, org), invocation(llm_conn, org, inv), notices(llm_conn, org))
    second = reconcile(llm_conn, org, now=T0 + 26 * HOUR)
    assert (second["recovered_requests"], second["released_hold_credits"], second["past_window_alerts"],
            second["notices_created"]) == (0, 0, 0, 0)
    assert (org_ledger(llm_conn, org), period(llm_conn, org), invocation(llm_conn, org, inv),
            notices(llm_conn, org)) == snapshot
    assert_books_right(llm_conn)


def test_br_cap_pfm_llm_009_03_repeating_the_pass_adds_no_charge_alert_or_notice(llm_conn):
    """BR-CAP-PFM-LLM-009-03 through the pass: a second pass finds nothing to recover and the
    first pass's charges, alert stamps and notices stay as they were."""
    org = new_org(llm_conn, 100)
    invs = [admit_dispatched(llm_conn, org, 45, now=T0 + timedelta(minutes=i)) for i in range(2)]
    first = run_pass(llm_conn, T0 + 25 * HOUR)
    assert (first["requests_recovered"], first["past_window_alerts"]) == (2, 2)
    snapshot = (org_ledger(llm_conn, org), period(llm_conn, org), notices(llm_conn, org),
                [invocation(llm_conn, org, i) for i in invs])
    assert len(snapshot[2]) == 1  # 90 % of 100 crossed 80
    second = run_pass(llm_conn, T0 + 26 * HOUR)
    assert (second["requests_recovered"], second["past_window_alerts"], second["released_hold_credits"]) == (0, 0, 0)
    assert (org_ledger(llm_conn, org), period(llm_conn, org), notices(llm_conn, org),
            [invocation(llm_conn, org, i) for i in invs]) == snapshot


def test_br_cap_pfm_llm_009_03_late_measured_settlement_after_recovery_is_not_charged(llm_conn):
    """BR-CAP-PFM-LLM-009-03: a worker reporting after recovery gets already_recovered; its
    figures are kept for audit and nothing is charged twice."""
    org = new_org(llm_conn, ALLOWANCE)
    inv = admit_dispatched(llm_conn, org, 50)
    reconcile(llm_conn, org, now=T0 + 25 * HOUR)
    before = (org_ledger(llm_conn, org), period(llm_conn, org))
    assert settle(llm_conn, org, inv, 44, 9, now=T0 + 26 * HOUR) == "already_recovered"
    assert (org_ledger(llm_conn, org), period(llm_conn, org)) == before
    row = invocation(llm_conn, org, inv)
    assert (row["charged_credits"], row["charged_cents"], row["late_credits"], row["late_cents"]) == (50, None, 44, 9)
    assert_books_right(llm_conn)


# ---------------------------------------------------------------- BR-CAP-PFM-LLM-009-04


def test_br_cap_pfm_llm_009_04_settles_only_as_many_as_the_batch_allows_so_one_tenant_cannot_make_a_run_unbounded(
        llm_conn):
    """BR-CAP-PFM-LLM-009-04 "settles only as many as the batch allows, so one tenant cannot
    make a run unbounded": with a batch of 3 and 5 stranded requests, the oldest 3 are
    recovered and more_pending is true; the next sweep recovers the other 2."""
    org = new_org(llm_conn, ALLOWANCE)
    # admitted newest-first so oldest-first order differs from insertion order
    invs = {i: admit_dispatched(llm_conn, org, 10 + i, now=T0 + timedelta(minutes=10 - i)) for i in range(5)}
    oldest_first = [invs[i] for i in (4, 3, 2, 1, 0)]
    first = reconcile(llm_conn, org, now=T0 + 25 * HOUR, batch=3)
    assert (first["recovered_requests"], first["more_pending"]) == (3, True)
    recovered = {r["id"] for r in rows(llm_conn, "SELECT id FROM llm.invocations WHERE settlement_kind = 'recovered'")}
    assert recovered == set(oldest_first[:3])
    assert first["released_hold_credits"] == 14 + 13 + 12
    second = reconcile(llm_conn, org, now=T0 + 25 * HOUR, batch=3)
    assert (second["recovered_requests"], second["more_pending"]) == (2, False)
    assert period(llm_conn, org)["held_credits"] == 0
    assert_books_right(llm_conn)


def test_br_cap_pfm_llm_009_04_the_pass_defers_the_rest_to_the_next_run(llm_conn):
    """BR-CAP-PFM-LLM-009-04 through the pass: a batch of 3 of 5 records one organization with
    more pending; the next pass recovers the rest."""
    org = new_org(llm_conn, ALLOWANCE)
    for i in range(5):
        admit_dispatched(llm_conn, org, 10, now=T0 + timedelta(minutes=i))
    first = run_pass(llm_conn, T0 + 25 * HOUR, batch=3)
    assert (first["requests_recovered"], first["more_pending_orgs"]) == (3, 1)
    second = run_pass(llm_conn, T0 + 26 * HOUR, batch=3)
    assert (second["requests_recovered"], second["more_pending_orgs"]) == (2, 0)
    assert period(llm_conn, org)["held_credits"] == 0


def test_wf_pfm_llm_004_hop_3_default_batch_is_two_hundred(llm_conn):
    """WF-PFM-LLM-004 hop 3; BR-CAP-PFM-LLM-009-04: without p_batch the sweep takes up to
    settings.sweep_batch (200) requests; the 201st waits for the next sweep."""
    org = new_org(llm_conn, ALLOWANCE)
    assert llm_conn.execute("SELECT sweep_batch FROM llm.settings").fetchone()[0] == 200
    llm_conn.cursor().executemany(
        ADMIT_SQL, [admit_params(org, 1, now=T0 + timedelta(seconds=g)) for g in range(1, 202)])
    first = reconcile(llm_conn, org, now=T0 + 25 * HOUR)
    assert (first["recovered_requests"], first["more_pending"]) == (200, True)
    second = reconcile(llm_conn, org, now=T0 + 25 * HOUR)
    assert (second["recovered_requests"], second["more_pending"]) == (1, False)


# ---------------------------------------------------------------- BR-CAP-PFM-LLM-009-05


def test_br_cap_pfm_llm_009_05_stale_running_execution_becomes_abandoned(llm_conn):
    """BR-CAP-PFM-LLM-009-05; WF-PFM-LLM-004 hop 5: a task running longer than 24 h becomes
    abandoned with the detection time, no duration and its existing settlement totals; a
    younger running task and a completed one are untouched."""
    org = new_org(llm_conn, ALLOWANCE)
    stale = open_task(llm_conn, org, TASK)
    young = open_task(llm_conn, org, TASK, now=T0 + 2 * HOUR)
    done = open_task(llm_conn, org, TASK)
    inv = admit_dispatched(llm_conn, org, 10, execution_id=stale, now=T0 + HOUR)
    settle(llm_conn, org, inv, 7, 2, now=T0 + HOUR)
    assert close_task(llm_conn, org, done, now=T0 + HOUR)
    detected = T0 + 25 * HOUR
    run = run_pass(llm_conn, detected)
    assert run["executions_abandoned"] == 1
    x = row(llm_conn, "SELECT * FROM llm.executions WHERE id = %s", [stale])
    assert (x["status"], x["ended_at"], x["duration_ms"]) == ("abandoned", detected, None)
    assert (x["request_count"], x["credits"], x["cents"]) == (1, 7, 2)
    assert row(llm_conn, "SELECT status FROM llm.executions WHERE id = %s", [young])["status"] == "running"
    assert row(llm_conn, "SELECT status FROM llm.executions WHERE id = %s", [done])["status"] == "completed"
    # repeated: nothing more to abandon, the detection time stays
    assert reconcile(llm_conn, org, now=detected + timedelta(minutes=30))["abandoned_executions"] == 0
    assert row(llm_conn, "SELECT ended_at FROM llm.executions WHERE id = %s", [stale])["ended_at"] == detected
    assert_books_right(llm_conn)


def test_recovered_charge_is_added_to_the_task_totals(llm_conn):
    """BR-CAP-PFM-LLM-009-01 with WF-PFM-LLM-002 hop 3: a recovered request linked to a task adds
    one request and its estimate (no cents) to the task totals, also after the task closed."""
    org = new_org(llm_conn, ALLOWANCE)
    x = open_task(llm_conn, org, TASK)
    measured = admit_dispatched(llm_conn, org, 10, execution_id=x)
    settle(llm_conn, org, measured, 8, 3, now=T0 + HOUR)
    admit_dispatched(llm_conn, org, 30, execution_id=x)
    assert close_task(llm_conn, org, x, now=T0 + 2 * HOUR)
    assert reconcile(llm_conn, org, now=T0 + 25 * HOUR)["recovered_requests"] == 1
    task = row(llm_conn, "SELECT * FROM llm.executions WHERE id = %s", [x])
    assert task["status"] == "completed"
    assert (task["request_count"], task["credits"], task["cents"]) == (2, 38, 3)
    assert llm_conn.execute("SELECT count(*) FROM llm.drift_findings").fetchone()[0] == 0
    assert_books_right(llm_conn)


# ---------------------------------------------------------------- BR-CAP-PFM-LLM-009-06


def drifted_execution(conn: psycopg.Connection, org: uuid.UUID, *, closed_at: datetime) -> uuid.UUID:
    """A closed task whose recorded credits a superuser inflated by 5 (the drift under test)."""
    x = open_task(conn, org, TASK, now=closed_at - HOUR)
    inv = admit_dispatched(conn, org, 10, execution_id=x, now=closed_at - HOUR)
    settle(conn, org, inv, 9, 4, now=closed_at - timedelta(minutes=30))
    assert close_task(conn, org, x, now=closed_at)
    conn.execute("UPDATE llm.executions SET credits = credits + 5 WHERE organization_id = %s AND id = %s", [org, x])
    return x


def test_br_cap_pfm_llm_009_06_drift_is_reported_with_both_figures_and_changes_no_totals(llm_conn):
    """BR-CAP-PFM-LLM-009-06; WF-PFM-LLM-004 hop 5; WF-PFM-LLM-002 hop 5: a recently closed task
    whose totals disagree with its settled requests is reported in llm.drift_findings with
    both figures and identities; the sweep changes no totals; the next pass refreshes
    last_seen_at; once totals agree the finding is dropped."""
    org = new_org(llm_conn, ALLOWANCE)
    x = drifted_execution(llm_conn, org, closed_at=T0 + HOUR)
    honest = open_task(llm_conn, org, TASK)
    assert close_task(llm_conn, org, honest, now=T0 + HOUR)
    before = row(llm_conn, "SELECT * FROM llm.executions WHERE id = %s", [x])
    period_before = period(llm_conn, org)

    first_at = T0 + 2 * HOUR
    run = run_pass(llm_conn, first_at)
    assert run["drift_findings"] == 1
    finding = row(llm_conn, "SELECT * FROM llm.drift_findings")
    assert (finding["organization_id"], finding["execution_id"]) == (org, x)
    assert (finding["recorded_request_count"], finding["recorded_credits"], finding["recorded_cents"]) == (1, 14, 4)
    assert (finding["settled_request_count"], finding["settled_credits"], finding["settled_cents"]) == (1, 9, 4)
    assert finding["first_seen_at"] == finding["last_seen_at"] == first_at
    assert finding["last_run_id"] == run["id"]
    # no totals changed
    assert row(llm_conn, "SELECT * FROM llm.executions WHERE id = %s", [x]) == before
    assert period(llm_conn, org) == period_before

    second_at = T0 + 3 * HOUR
    run2 = run_pass(llm_conn, second_at)
    refreshed = row(llm_conn, "SELECT * FROM llm.drift_findings")
    assert (refreshed["first_seen_at"], refreshed["last_seen_at"], refreshed["last_run_id"]) == (
        first_at, second_at, run2["id"])

    llm_conn.execute("UPDATE llm.executions SET credits = credits - 5 WHERE id = %s", [x])
    assert reconcile(llm_conn, org, now=T0 + 4 * HOUR)["drift_findings"] == 0
    assert llm_conn.execute("SELECT count(*) FROM llm.drift_findings").fetchone()[0] == 0
    assert_books_right(llm_conn)


def test_br_cap_pfm_llm_009_06_executions_closed_more_than_seven_days_ago_are_not_checked(llm_conn):
    """BR-CAP-PFM-LLM-009-06: the drift check covers executions closed within the last seven
    days (settings.drift_window); an older drifting task is not reported, a recent one is."""
    org = new_org(llm_conn, ALLOWANCE)
    old = drifted_execution(llm_conn, org, closed_at=T0)
    recent = drifted_execution(llm_conn, org, closed_at=T0 + 2 * 24 * HOUR)
    sweep = reconcile(llm_conn, org, now=T0 + 7 * 24 * HOUR + HOUR)
    assert sweep["drift_findings"] == 1
    found = [r["execution_id"] for r in rows(llm_conn, "SELECT execution_id FROM llm.drift_findings")]
    assert found == [recent]
    assert old not in found


def test_br_cap_pfm_llm_009_06_running_executions_are_not_drift_checked(llm_conn):
    """BR-CAP-PFM-LLM-009-06: only closed executions are compared (a running task may still be
    settling)."""
    org = new_org(llm_conn, ALLOWANCE)
    x = open_task(llm_conn, org, TASK)
    llm_conn.execute("UPDATE llm.executions SET credits = 99 WHERE id = %s", [x])
    assert reconcile(llm_conn, org, now=T0 + HOUR)["drift_findings"] == 0


# ---------------------------------------------------------------- BR-CAP-PFM-LLM-009-07


def test_br_cap_pfm_llm_009_07_past_window_alert_is_stamped_once(llm_conn):
    """BR-CAP-PFM-LLM-009-07; WF-PFM-LLM-004 hop 4: a request beyond the recovery window
    contributes one alert: past_window_alerted_at is stamped at its recovery and never
    rewritten; the sweep and pass count it once."""
    org = new_org(llm_conn, ALLOWANCE)
    inv = admit_dispatched(llm_conn, org, 10)
    young = admit_dispatched(llm_conn, org, 10, now=T0 + 20 * HOUR)
    first_at = T0 + 25 * HOUR
    run = run_pass(llm_conn, first_at)
    assert run["past_window_alerts"] == 1
    assert invocation(llm_conn, org, inv)["past_window_alerted_at"] == first_at
    assert invocation(llm_conn, org, young)["past_window_alerted_at"] is None
    run2 = run_pass(llm_conn, first_at + 24 * HOUR)  # now recovers the young one only
    assert (run2["requests_recovered"], run2["past_window_alerts"]) == (1, 1)
    assert invocation(llm_conn, org, inv)["past_window_alerted_at"] == first_at
    run3 = run_pass(llm_conn, first_at + 48 * HOUR)
    assert (run3["requests_recovered"], run3["past_window_alerts"]) == (0, 0)
    assert llm_conn.execute(
        "SELECT count(*) FROM llm.invocations WHERE past_window_alerted_at IS NOT NULL").fetchone()[0] == 2
    assert_books_right(llm_conn)


def test_br_cap_pfm_llm_009_07_missing_run_alarm_never_ok_late_failing(llm_conn, llm_connect):
    """BR-CAP-PFM-LLM-009-07 (the separate missing-run alarm): reconciliation_health is
    'never' before any pass, 'ok' right after one, 'late' when no pass succeeded within
    settings.health_max_age (3 h later), and 'failing' after a partial pass."""
    org = new_org(llm_conn, ALLOWANCE)
    assert health(llm_conn, T0)["status"] == "never"

    run_pass(llm_conn, T0)
    h = health(llm_conn, T0 + timedelta(minutes=1))
    assert h["status"] == "ok" and h["last_run_status"] == "succeeded"
    assert h["last_success_at"] is not None

    late = health(llm_conn, T0 + 3 * HOUR)
    assert late["status"] == "late"
    assert "llm-reconciliation" in late["detail"]
    assert f"llm-reconciliation:{llm_conn.info.dbname}" in late["detail"]  # --cron-dsn's name

    # a partial pass: one organization's sweep times out on a period row another session holds
    admit_dispatched(llm_conn, org, 10, now=T0)
    new_org(llm_conn, ALLOWANCE)
    blocker = llm_connect(autocommit=False)
    lock_period_rows(blocker, org)
    pass_conn = llm_connect()
    pass_conn.execute("UPDATE llm.settings SET org_lock_timeout = '500ms'")
    partial = run_pass(pass_conn, T0 + 25 * HOUR)
    blocker.rollback()
    assert partial["status"] == "partial"
    failing = health(llm_conn, T0 + 25 * HOUR + timedelta(minutes=1))
    assert failing["status"] == "failing" and failing["last_run_status"] == "partial"
    assert str(org) in failing["detail"]

    # the next clean pass clears the alarm
    run_pass(llm_conn, T0 + 26 * HOUR)
    assert health(llm_conn, T0 + 26 * HOUR + timedelta(minutes=1))["status"] == "ok"


# ---------------------------------------------------------------- notices from recovery


def test_recovery_charges_that_cross_thresholds_create_notices(llm_conn):
    """BR-CAP-PFM-LLM-009-01 with the notices rule: a recovery charge moving used credits across
    80 % and 100 % of the allowance creates one owed notice per threshold, in the sweep's
    transaction, stamped at recovery time."""
    org = new_org(llm_conn, 100, thresholds=[50, 80, 100])
    early = admit_dispatched(llm_conn, org, 55)
    settle(llm_conn, org, early, 55, 1, now=T0 + HOUR)  # crosses 50 by measured settlement
    admit_dispatched(llm_conn, org, 45)
    assert [n["threshold_pct"] for n in notices(llm_conn, org)] == [50]
    swept_at = T0 + 25 * HOUR
    sweep = reconcile(llm_conn, org, now=swept_at)
    assert sweep["notices_created"] == 2
    owed = notices(llm_conn, org)
    assert [(n["threshold_pct"], n["status"]) for n in owed] == [(50, "owed"), (80, "owed"), (100, "owed")]
    assert [n["crossed_at"] for n in owed[1:]] == [swept_at, swept_at]
    assert owed[2]["used_credits"] == 100 and owed[2]["allowance_credits"] == 100
    assert_books_right(llm_conn)


def test_recovery_below_thresholds_creates_no_notice(llm_conn):
    """BR-CAP-PFM-LLM-009-01: a recovery charge that stays below every threshold owes nothing;
    an unlimited organization never owes notices."""
    capped, unlimited = new_org(llm_conn, 100), new_org(llm_conn, None)
    admit_dispatched(llm_conn, capped, 79)
    admit_dispatched(llm_conn, unlimited, 10_000)
    run_pass(llm_conn, T0 + 25 * HOUR)
    assert llm_conn.execute("SELECT count(*) FROM llm.threshold_notices").fetchone()[0] == 0
    assert period(llm_conn, unlimited)["used_credits"] == 10_000


# ---------------------------------------------------------------- lock order


def test_sweep_and_late_settlement_of_a_sibling_request_do_not_deadlock(llm_conn, llm_connect):
    """BR-CAP-PFM-LLM-009-01 under concurrency (WF-PFM-LLM-004 hop 3; STATE-PFM-LLM-002
    completed→completed): a stale request of a closed task is recovered while its live
    sibling settles late. Both take the task row and the period row; they must take them in
    the same order (task, then period) or they deadlock. Scripted: C holds the task row; A's
    settlement waits for it; B's sweep waits for it too (having recovered its request); C
    commits; both finish — before the fix in sql/60_recovery.sql the settlement died 40P01."""
    org = new_org(llm_conn, ALLOWANCE)
    x = open_task(llm_conn, org, TASK)
    stale = admit_dispatched(llm_conn, org, 30, execution_id=x, now=T0 + timedelta(minutes=1))
    live = admit_dispatched(llm_conn, org, 20, execution_id=x, now=T0 + timedelta(minutes=2))
    assert close_task(llm_conn, org, x, now=T0 + HOUR)
    c, a, b = llm_connect(autocommit=False), llm_connect(), llm_connect()
    c.execute("SELECT 1 FROM llm.executions WHERE organization_id = %s AND id = %s FOR UPDATE", [org, x])

    with ThreadPoolExecutor(max_workers=2) as pool:
        settling = pool.submit(settle, a, org, live, 18, 4, now=T0 + 25 * HOUR)
        wait_blocked(llm_conn, a.info.backend_pid)
        sweeping = pool.submit(reconcile, b, org, now=T0 + 25 * HOUR)
        wait_blocked(llm_conn, b.info.backend_pid)
        c.commit()
        outcomes = []
        for future in (settling, sweeping):
            try:
                outcomes.append(future.result(timeout=10))
            except psycopg.Error as error:
                outcomes.append(error.sqlstate)
    assert outcomes[0] == "settled"
    assert outcomes[1]["recovered_requests"] == 1
    assert invocation(llm_conn, org, stale)["settlement_kind"] == "recovered"
    assert_books_right(llm_conn)
