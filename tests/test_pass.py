"""The hourly pass, ``CALL llm.run_reconciliation`` (WF-PFM-LLM-004 hops 2 and 6): one
recorded run per call, one pass at a time, per-organization failures recorded and
passed over, follow-up steps independent, interrupted passes marked failed.

Real failures, not mocks: an organization fails because another session holds a
row lock on its period and the sweep waits at most ``settings.org_lock_timeout``
(set to 500 ms here).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime, timedelta
from typing import Any

import psycopg
import pytest

from tests.helpers import (
    HOUR,
    T0,
    UTC,
    InThread,
    admit,
    admit_dispatched,
    assert_books_right,
    budget_usage,
    call,
    call_pass,
    close_task,
    health,
    lock_period_rows,
    new_org,
    open_task,
    row,
    rows,
    run_pass,
    set_budget,
    settle,
    wait_blocked,
    wait_for,
)

TASK = "report.generate"
ALLOWANCE = 1_000_000


# ---------------------------------------------------------------- local helpers


def runs(conn: psycopg.Connection) -> list[dict[str, Any]]:
    return rows(conn, "SELECT * FROM llm.reconciliation_runs ORDER BY started_at, id")


def bound_lock_waits(conn: psycopg.Connection, timeout: str = "500ms") -> None:
    """Make the pass give up on a lock after ``timeout`` (settings.org_lock_timeout)."""
    conn.execute("UPDATE llm.settings SET org_lock_timeout = %s::interval", [timeout])


def pass_while_locked(llm_connect: Callable[..., psycopg.Connection],
                      lock: Callable[[psycopg.Connection], Any], now: datetime) -> dict[str, Any]:
    """One pass at ``now`` (lock waits bounded to 500 ms) while another session holds what
    ``lock`` locks in its open transaction; that session rolls back after the pass."""
    blocker = llm_connect(autocommit=False)
    lock(blocker)
    pass_conn = llm_connect()
    bound_lock_waits(pass_conn)
    try:
        return run_pass(pass_conn, now)
    finally:
        blocker.rollback()


def owed_notice_claimed_at(conn: psycopg.Connection, org: uuid.UUID, claimed_at: datetime) -> uuid.UUID:
    """Cross 80 % of a 100-credit allowance and claim the notice at ``claimed_at`` (sending)."""
    inv = admit_dispatched(conn, org, 90, now=claimed_at - timedelta(minutes=1))
    settle(conn, org, inv, 90, 5, now=claimed_at - timedelta(minutes=1))
    claimed = call(conn, "claim_notices", limit=10, now=claimed_at)
    assert [n["status"] for n in claimed] == ["sending"]
    return claimed[0]["id"]


def expected_daily_rows(conn: psycopg.Connection, now: datetime) -> int:
    """Distinct (organization, UTC settlement day, model) over the pass's reporting days."""
    return conn.execute(
        "SELECT count(DISTINCT (organization_id, (settled_at AT TIME ZONE 'UTC')::date, model))"
        "  FROM llm.invocations"
        " WHERE (settled_at AT TIME ZONE 'UTC')::date"
        "       BETWEEN (%(now)s::timestamptz AT TIME ZONE 'UTC')::date - (SELECT reporting_days - 1 FROM llm.settings)"
        "           AND (%(now)s::timestamptz AT TIME ZONE 'UTC')::date",
        {"now": now}).fetchone()[0]


# ---------------------------------------------------------------- one recorded run


def test_wf_pfm_llm_004_pass_records_one_run_with_its_figures(llm_conn):
    """WF-PFM-LLM-004 hops 2-6: one CALL records exactly one llm.reconciliation_runs row whose
    figures add up what the sweeps and follow-up steps did."""
    a, b = new_org(llm_conn, ALLOWANCE), new_org(llm_conn, 100)
    admit_dispatched(llm_conn, a, 10)
    admit_dispatched(llm_conn, a, 20, now=T0 + timedelta(minutes=5))
    admit_dispatched(llm_conn, b, 30)
    admit_dispatched(llm_conn, a, 99, now=T0 + 20 * HOUR)  # inside the window: stays
    open_task(llm_conn, a, TASK)  # stale: abandoned
    drifting = open_task(llm_conn, b, TASK, now=T0 + HOUR)
    close_task(llm_conn, b, drifting, now=T0 + 2 * HOUR)
    llm_conn.execute("UPDATE llm.executions SET request_count = 3 WHERE id = %s", [drifting])
    c = new_org(llm_conn, 100)
    owed_notice_claimed_at(llm_conn, c, T0 + 3 * HOUR)  # claimed, never completed: re-armed

    now = T0 + 25 * HOUR
    call_pass(llm_conn, now)

    [run] = runs(llm_conn)
    assert run["status"] == "succeeded" and run["errors"] == []
    assert run["clock"] == now and run["finished_at"] is not None and run["finished_at"] >= run["started_at"]
    assert (run["orgs_visited"], run["orgs_failed"]) == (3, 0)
    assert (run["requests_recovered"], run["released_hold_credits"], run["past_window_alerts"]) == (3, 60, 3)
    assert (run["executions_abandoned"], run["drift_findings"], run["notices_rearmed"]) == (1, 1, 1)
    assert run["more_pending_orgs"] == 0
    # (a, today), (b, today) from recovery; (c, yesterday) from its measured settlement
    assert run["daily_rows_rebuilt"] == expected_daily_rows(llm_conn, now) == 3
    assert llm_conn.execute("SELECT count(*) FROM llm.daily_usage").fetchone()[0] == 3
    assert llm_conn.execute("SELECT status FROM llm.threshold_notices").fetchone()[0] == "owed"
    assert_books_right(llm_conn)


def test_pass_rejects_a_bad_batch_and_records_nothing(llm_conn):
    """WF-PFM-LLM-004 hop 2: p_batch outside 1 .. 100000 raises 22023 before a run is recorded."""
    with pytest.raises(psycopg.Error) as raised:
        call_pass(llm_conn, T0, batch=0)
    assert raised.value.sqlstate == "22023"
    assert runs(llm_conn) == []


def test_br_cap_pfm_llm_009_03_running_the_pass_twice_adds_no_charge_alert_or_notice(llm_conn):
    """BR-CAP-PFM-LLM-009-03 through the pass: a second pass at a later clock finds nothing to
    recover; ledger, periods, alert stamps and notices are unchanged; two runs recorded."""
    org = new_org(llm_conn, 100)
    admit_dispatched(llm_conn, org, 85)
    first = run_pass(llm_conn, T0 + 25 * HOUR)
    assert (first["requests_recovered"], first["past_window_alerts"]) == (1, 1)

    def books() -> tuple:
        return (
            llm_conn.execute("SELECT * FROM llm.ledger ORDER BY invocation_id, entry").fetchall(),
            llm_conn.execute("SELECT * FROM llm.periods ORDER BY organization_id").fetchall(),
            llm_conn.execute("SELECT id, past_window_alerted_at, charged_credits FROM llm.invocations").fetchall(),
            llm_conn.execute("SELECT id, threshold_pct, status FROM llm.threshold_notices ORDER BY 2").fetchall(),
        )

    snapshot = books()
    assert len(snapshot[3]) == 1
    second = run_pass(llm_conn, T0 + 26 * HOUR)
    assert second["status"] == "succeeded"
    assert (second["requests_recovered"], second["released_hold_credits"], second["past_window_alerts"]) == (0, 0, 0)
    assert books() == snapshot
    assert len(runs(llm_conn)) == 2


# ---------------------------------------------------------------- failures


def test_wf_pfm_llm_004_hop_2_one_failing_organization_is_recorded_and_the_pass_goes_on(llm_conn, llm_connect):
    """WF-PFM-LLM-004 hop 2 (on failure: log the organization and continue): an organization
    whose sweep fails for real — its period row is locked by another session and
    org_lock_timeout is 500ms — is recorded in errors with its id and SQLSTATE 55P03, rolled back
    whole; the other organizations are recovered; the run is 'partial'."""
    orgs = sorted([new_org(llm_conn, ALLOWANCE) for _ in range(3)])
    bad = orgs[1]  # visited in id order: one before, one after
    invs = {org: admit_dispatched(llm_conn, org, 10) for org in orgs}

    run = pass_while_locked(llm_connect, lambda blocker: lock_period_rows(blocker, bad), T0 + 25 * HOUR)

    assert run["status"] == "partial"
    assert (run["orgs_visited"], run["orgs_failed"], run["requests_recovered"]) == (3, 1, 2)
    [error] = run["errors"]
    assert error["step"] == "organization"
    assert error["organization_id"] == str(bad) and error["sqlstate"] == "55P03"
    status = dict(llm_conn.execute("SELECT organization_id, status FROM llm.invocations").fetchall())
    assert status == {orgs[0]: "settled", bad: "dispatched", orgs[2]: "settled"}
    assert llm_conn.execute("SELECT held_credits FROM llm.periods WHERE organization_id = %s",
                            [bad]).fetchone()[0] == 10
    assert invs[bad] is not None
    # the next pass picks up what the failed sweep left
    again = run_pass(llm_conn, T0 + 26 * HOUR)
    assert (again["status"], again["requests_recovered"]) == ("succeeded", 1)
    assert_books_right(llm_conn)


def test_pass_where_every_organization_fails_is_failed(llm_conn, llm_connect):
    """WF-PFM-LLM-004 hop 2: when every visited organization fails the run is 'failed' (and the
    missing-run alarm reports it)."""
    org = new_org(llm_conn, ALLOWANCE)
    admit_dispatched(llm_conn, org, 10)
    run = pass_while_locked(llm_connect, lambda blocker: lock_period_rows(blocker, org), T0 + 25 * HOUR)
    assert run["status"] == "failed" and (run["orgs_visited"], run["orgs_failed"]) == (1, 1)
    alarm = health(llm_conn, T0 + 25 * HOUR)
    # passes ran but none completed: failing, not never (never is for "no pass ever ran")
    assert alarm["status"] == "failing" and alarm["last_run_status"] == "failed"


def test_wf_pfm_llm_004_one_pass_at_a_time_second_is_skipped_and_returns_at_once(llm_conn, llm_connect):
    """WF-PFM-LLM-004 concurrency (one execution slot): while a pass is running (blocked on a
    period row lock), a second CALL returns at once and is recorded 'skipped', touching
    nothing; the first pass then finishes normally."""
    org = new_org(llm_conn, ALLOWANCE)
    inv = admit_dispatched(llm_conn, org, 10)
    blocker = llm_connect(autocommit=False)
    lock_period_rows(blocker, org)
    first_conn, second_conn = llm_connect(), llm_connect()
    with ThreadPoolExecutor(max_workers=1) as pool:
        first = pool.submit(call_pass, first_conn, T0 + 25 * HOUR)
        wait_blocked(llm_conn, first_conn.info.backend_pid)
        started = time.monotonic()
        call_pass(second_conn, T0 + 25 * HOUR)
        elapsed = time.monotonic() - started
        skipped = row(llm_conn, "SELECT * FROM llm.reconciliation_runs WHERE status = 'skipped'")
        assert llm_conn.execute("SELECT status FROM llm.invocations WHERE id = %s", [inv]).fetchone()[0] == "dispatched"
        blocker.commit()
        first.result(timeout=10)
    assert elapsed < 1.0
    assert skipped is not None and skipped["finished_at"] is not None
    assert skipped["errors"][0]["step"] == "lease"
    assert skipped["errors"][0]["holder_pid"] == first_conn.info.backend_pid
    assert (skipped["orgs_visited"], skipped["requests_recovered"]) == (0, 0)
    statuses = sorted(r["status"] for r in runs(llm_conn))
    assert statuses == ["skipped", "succeeded"]
    assert llm_conn.execute("SELECT status FROM llm.invocations WHERE id = %s", [inv]).fetchone()[0] == "settled"


def returned_or_blocked(observer, call: InThread, conn) -> str:
    """Wait until the call running on ``conn`` has returned or waits for a lock; says which."""
    def state() -> str | None:
        if not call.thread.is_alive():
            return "returned"
        blocked = observer.execute("SELECT cardinality(pg_blocking_pids(%s)) > 0",
                                   [conn.info.backend_pid]).fetchone()[0]  # fmt: skip
        return "blocked" if blocked else None

    return wait_for(state, "the call to return or to block")


def test_two_passes_started_together_one_sweeps_the_other_is_skipped(llm_conn, llm_connect):
    """WF-PFM-LLM-004 concurrency (one execution slot): two passes started
    at the same moment. The first holds the lease row, its lease not committed yet (paused
    in llm._begin_run on a 'running' run row another session keeps locked); the second must
    not read that row as free. It returns at once, without waiting on any lock, recorded
    'skipped' naming the first's pid (its run id is not committed yet); exactly one pass
    sweeps, and the books stay right."""
    org = new_org(llm_conn, ALLOWANCE)
    inv = admit_dispatched(llm_conn, org, 10)
    # the pause: _begin_run marks a run left 'running' failed after it locked the lease row
    blocker = llm_connect(autocommit=False)
    stale = blocker.execute("INSERT INTO llm.reconciliation_runs (started_at, clock, status)"
                            " VALUES (now(), now(), 'running') RETURNING id").fetchone()[0]
    blocker.commit()
    blocker.execute("SELECT FROM llm.reconciliation_runs WHERE id = %s FOR UPDATE", [stale])
    first_conn, second_conn = llm_connect(), llm_connect()
    first = InThread(lambda: call_pass(first_conn, T0 + 25 * HOUR))
    wait_blocked(llm_conn, first_conn.info.backend_pid)
    assert row(llm_conn, "SELECT token FROM llm.pass_lease")["token"] is None  # not committed yet

    second = InThread(lambda: call_pass(second_conn, T0 + 25 * HOUR))
    second_waited = returned_or_blocked(llm_conn, second, second_conn)
    blocker.commit()  # the first pass goes on (the old code: both go on)
    first.result()
    second.result()

    assert second_waited == "returned", "the second pass waited for the first instead of being skipped"
    skipped = rows(llm_conn, "SELECT * FROM llm.reconciliation_runs WHERE status = 'skipped'")
    assert len(skipped) == 1
    assert skipped[0]["errors"][0]["step"] == "lease"
    assert skipped[0]["errors"][0]["holder_pid"] == first_conn.info.backend_pid
    assert skipped[0]["errors"][0]["holder_run_id"] is None
    assert (skipped[0]["orgs_visited"], skipped[0]["requests_recovered"]) == (0, 0)
    swept = rows(llm_conn, "SELECT * FROM llm.reconciliation_runs WHERE orgs_visited > 0")
    assert [(r["status"], r["requests_recovered"]) for r in swept] == [("succeeded", 1)]
    assert row(llm_conn, "SELECT status FROM llm.reconciliation_runs WHERE id = %s", [stale])["status"] == "failed"
    assert row(llm_conn, "SELECT status FROM llm.invocations WHERE id = %s", [inv])["status"] == "settled"
    assert row(llm_conn, "SELECT token FROM llm.pass_lease")["token"] is None
    assert_books_right(llm_conn)


def test_a_pass_in_a_follow_up_step_holds_the_lease_and_is_named_with_its_run(llm_conn, llm_connect):
    """WF-PFM-LLM-004 concurrency (one execution slot): a pass holds the
    lease row locked through a follow-up step (here rearm_notices, waiting on a notice row
    another session holds). A second pass started meanwhile returns at once, recorded
    'skipped' naming the holder's pid and, its lease being committed, its run id."""
    bound_lock_waits(llm_conn, "60s")  # the step waits for the blocker, not for a clock
    org = new_org(llm_conn, 100)
    notice_id = owed_notice_claimed_at(llm_conn, org, T0)
    blocker = llm_connect(autocommit=False)
    blocker.execute("SELECT FROM llm.threshold_notices WHERE organization_id = %s AND id = %s FOR UPDATE",
                    [org, notice_id])  # fmt: skip
    first_conn, second_conn = llm_connect(), llm_connect()
    first = InThread(lambda: call_pass(first_conn, T0 + 25 * HOUR))
    wait_blocked(llm_conn, first_conn.info.backend_pid)
    holder = row(llm_conn, "SELECT * FROM llm.pass_lease")
    assert holder["holder_pid"] == first_conn.info.backend_pid  # committed when the pass began

    second = InThread(lambda: call_pass(second_conn, T0 + 25 * HOUR))
    second_waited = returned_or_blocked(llm_conn, second, second_conn)
    blocker.commit()
    first.result()
    second.result()

    assert second_waited == "returned"
    [skipped] = rows(llm_conn, "SELECT * FROM llm.reconciliation_runs WHERE status = 'skipped'")
    error = skipped["errors"][0]
    assert (error["holder_pid"], error["holder_run_id"]) == (first_conn.info.backend_pid, str(holder["run_id"]))
    done = row(llm_conn, "SELECT * FROM llm.reconciliation_runs WHERE id = %s", [holder["run_id"]])
    assert (done["status"], done["notices_rearmed"]) == ("succeeded", 1)
    assert_books_right(llm_conn)


def test_a_pass_ending_an_organization_and_a_takeover_take_the_lease_before_the_run_row(
    llm_conn, llm_connect
):
    """docs/architecture.md "Lock order", rows 1 and 15: a pass that ends an organization
    renews its lease before it adds to its run row, the order in which a pass taking over
    an expired lease takes the lease, then marks that run failed. Here a takeover holds the
    lease while the first pass ends an organization: the first waits for the lease alone,
    the takeover marks the run failed at once, and the first learns that it lost the lease.
    Before 0.4.0 the first held its run row while it waited for the lease, the takeover
    waited for that row, and PostgreSQL aborted one of them (40P01)."""
    org = new_org(llm_conn, ALLOWANCE)
    inv = admit_dispatched(llm_conn, org, 10)
    first = llm_connect()
    run_id, token = first.execute("SELECT run_id, token FROM llm._begin_run(%s)", [T0]).fetchone()
    taker = llm_connect(autocommit=False)
    taker.execute("SET lock_timeout = '10s'")
    taker.execute("SELECT FROM llm.pass_lease FOR UPDATE")  # a takeover's first step
    ending = InThread(lambda: first.execute("SELECT llm._run_org(%s, %s, %s, %s, 100)",
                                            [run_id, token, org, T0 + 25 * HOUR]).fetchone()[0])  # fmt: skip
    wait_blocked(llm_conn, first.info.backend_pid, by=taker.info.backend_pid)
    # its second step, as llm._begin_run takes it: the lost pass's run row
    taker.execute("UPDATE llm.reconciliation_runs SET status = 'failed', finished_at = now()"
                  " WHERE id = %s AND status = 'running'", [run_id])  # fmt: skip
    taker.execute("UPDATE llm.pass_lease SET run_id = NULL, token = gen_random_uuid()")
    taker.commit()

    assert ending.result() is False  # the lease was lost: the pass stops
    run = row(llm_conn, "SELECT * FROM llm.reconciliation_runs WHERE id = %s", [run_id])
    assert (run["status"], run["orgs_visited"], run["requests_recovered"]) == ("failed", 1, 1)
    assert [e["step"] for e in run["errors"]] == ["lease"]
    assert row(llm_conn, "SELECT status FROM llm.invocations WHERE id = %s", [inv])["status"] == "settled"
    assert_books_right(llm_conn)


def test_a_session_that_took_the_lease_and_went_idle_does_not_block_the_next_pass(llm_conn, llm_connect):
    """WF-PFM-LLM-004 concurrency (one execution slot) without a session lock: a session that
    began a run (llm._begin_run took the lease) and then went idle is not running a pass, so
    the next pass takes over at once, marks the abandoned run failed and does the work."""
    holder = llm_connect()
    abandoned = holder.execute("SELECT run_id FROM llm._begin_run(%s)", [T0]).fetchone()[0]
    assert abandoned is not None
    admit_dispatched(llm_conn, new_org(llm_conn, ALLOWANCE), 10)
    run = run_pass(llm_conn, T0 + 25 * HOUR)
    assert (run["status"], run["requests_recovered"]) == ("succeeded", 1)
    old = row(llm_conn, "SELECT * FROM llm.reconciliation_runs WHERE id = %s", [abandoned])
    assert old["status"] == "failed" and "abandoned" in old["errors"][-1]["error"]
    assert row(llm_conn, "SELECT * FROM llm.pass_lease")["token"] is None


def test_pass_left_running_by_a_killed_backend_is_marked_failed_by_the_next(llm_conn, llm_connect):
    """WF-PFM-LLM-004 hop 1 (on failure: stale requests remain until a successful later pass):
    a pass whose backend was terminated mid-run stays 'running' until the next pass, which
    runs at once, marks it failed ("abandoned") and does the work itself."""
    doomed = llm_connect()
    interrupted = doomed.execute("SELECT run_id FROM llm._begin_run(%s)", [T0 + 24 * HOUR]).fetchone()[0]
    assert llm_conn.execute("SELECT pg_terminate_backend(%s::integer, 5000)", [doomed.info.backend_pid]).fetchone()[0]
    org = new_org(llm_conn, ALLOWANCE)
    admit_dispatched(llm_conn, org, 10)

    run = run_pass(llm_conn, T0 + 25 * HOUR)

    old = row(llm_conn, "SELECT * FROM llm.reconciliation_runs WHERE id = %s", [interrupted])
    assert old["status"] == "failed" and old["finished_at"] is not None
    assert old["errors"][-1]["step"] == "pass"
    assert (run["status"], run["requests_recovered"]) == ("succeeded", 1)


def test_pass_cancelled_in_a_long_lived_session_leaves_nothing_behind(llm_conn, llm_connect):
    """WF-PFM-LLM-004 concurrency (one execution slot) and hop 1 (stale requests remain until a
    successful later pass): a pass cancelled by statement_timeout in a session that lives on
    (a pooled connection) keeps no lock: another session's pass runs at once, is not skipped,
    marks the cancelled run failed and does the work."""
    org = new_org(llm_conn, ALLOWANCE)
    admit_dispatched(llm_conn, org, 10)
    blocker = llm_connect(autocommit=False)
    lock_period_rows(blocker, org)
    pooled = llm_connect()  # e.g. a pooled application connection that survives the cancel
    pooled.execute("SET statement_timeout = '500ms'")
    with pytest.raises(psycopg.Error) as raised:
        call_pass(pooled, T0 + 25 * HOUR)
    assert raised.value.sqlstate == "57014"
    blocker.rollback()
    pooled.execute("RESET statement_timeout")

    other = llm_connect()
    resumed = run_pass(other, T0 + 26 * HOUR)
    assert (resumed["status"], resumed["requests_recovered"]) == ("succeeded", 1)
    statuses = [r["status"] for r in runs(llm_conn)]
    assert statuses == ["failed", "succeeded"]
    assert "abandoned" in runs(llm_conn)[0]["errors"][-1]["error"]
    later = run_pass(pooled, T0 + 28 * HOUR)
    assert later["status"] == "succeeded"
    assert llm_conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()[0] == 0


# ---------------------------------------------------------------- follow-up steps


def test_wf_pfm_llm_004_hop_6_rearm_failure_does_not_stop_the_rebuild(llm_conn, llm_connect):
    """WF-PFM-LLM-004 hop 6 (follow-up steps are independent): rearm_notices fails for real (the
    expired claim's row is locked elsewhere, org_lock_timeout 500ms) and is recorded with its step
    and SQLSTATE; rebuild_daily_usage still runs and counts its rows; the run is 'partial'."""
    org = new_org(llm_conn, 100)
    notice = owed_notice_claimed_at(llm_conn, org, T0 + HOUR)
    admit_dispatched(llm_conn, org, 5)
    now = T0 + 25 * HOUR

    run = pass_while_locked(
        llm_connect,
        lambda blocker: blocker.execute(
            "SELECT 1 FROM llm.threshold_notices WHERE organization_id = %s AND id = %s FOR UPDATE", [org, notice]),
        now,
    )

    assert run["status"] == "partial"
    assert (run["orgs_visited"], run["orgs_failed"], run["requests_recovered"]) == (1, 0, 1)
    assert [(e["step"], e["sqlstate"]) for e in run["errors"]] == [("rearm_notices", "55P03")]
    assert run["notices_rearmed"] == 0
    assert run["daily_rows_rebuilt"] == expected_daily_rows(llm_conn, now) == 2
    assert llm_conn.execute("SELECT status FROM llm.threshold_notices").fetchone()[0] == "sending"


def test_wf_pfm_llm_004_hop_6_rebuild_failure_does_not_undo_the_rearm(llm_conn, llm_connect):
    """WF-PFM-LLM-004 hop 6, the other order: rearm_notices succeeds and commits, then
    rebuild_daily_usage fails for real (daily_usage locked elsewhere) and is recorded; the
    re-armed notice stays owed."""
    org = new_org(llm_conn, 100)
    owed_notice_claimed_at(llm_conn, org, T0 + HOUR)

    run = pass_while_locked(
        llm_connect, lambda blocker: blocker.execute("LOCK TABLE llm.daily_usage IN EXCLUSIVE MODE"), T0 + 25 * HOUR
    )

    assert run["status"] == "partial"
    # one error per day rebuilt (settings.reporting_days = 2), each its own transaction
    assert [(e["step"], e["sqlstate"], e["day"]) for e in run["errors"]] == [
        ("rebuild_daily_usage", "55P03", str(T0.date())),
        ("rebuild_daily_usage", "55P03", str((T0 + 25 * HOUR).date())),
    ]
    assert run["daily_rebuilt_through"] is None  # the next pass rebuilds those days again
    assert (run["notices_rearmed"], run["daily_rows_rebuilt"]) == (1, 0)
    assert llm_conn.execute("SELECT status FROM llm.threshold_notices").fetchone()[0] == "owed"


def test_wf_pfm_llm_004_hop_6_rebuild_daily_usage_runs_over_the_reporting_days(llm_conn):
    """WF-PFM-LLM-004 hop 6: the pass rebuilds settings.reporting_days (2) UTC days up to its
    clock: yesterday's and today's settlements are counted, older days are left alone."""
    org = new_org(llm_conn, ALLOWANCE)
    now = T0 + 3 * 24 * HOUR
    for day_offset in (0, 1, 2, 3):  # settled on T0, T0+1d, T0+2d, T0+3d
        inv = admit_dispatched(llm_conn, org, 10, now=T0 + day_offset * 24 * HOUR)
        settle(llm_conn, org, inv, 4, 1, now=T0 + day_offset * 24 * HOUR + HOUR)
    run = run_pass(llm_conn, now + 2 * HOUR)
    assert run["daily_rows_rebuilt"] == 2
    days = [r[0] for r in llm_conn.execute("SELECT day FROM llm.daily_usage ORDER BY day").fetchall()]
    assert days == [(T0 + 2 * 24 * HOUR).date(), (T0 + 3 * 24 * HOUR).date()]


# ---------------------------------------------------------------- budget retention


def test_the_pass_deletes_budget_counters_of_windows_ended_past_the_retention(llm_conn):
    """Retention: the pass deletes the counters of windows that ended at least
    settings.budget_retention before its clock's day (here 30 days before 2026-01-15:
    2025-12-16) and hold nothing, but never past the day of the organization's oldest
    open request (its horizon): while a request admitted on 2025-12-01 is open, the
    windows ending after 2025-12-01 stay; once it settles, the next pass takes the
    horizon to 2025-12-16. A window ending after that day and the current windows stay.
    The requests keep their figures, and the books stay right (invariant 14)."""
    llm_conn.execute("UPDATE llm.settings SET budget_retention = '30 days', recovery_window = '365 days'")
    org = new_org(llm_conn, ALLOWANCE)

    def at(year: int, month: int, day: int) -> datetime:
        return datetime(year, month, day, 10, tzinfo=UTC)

    set_budget(llm_conn, org, "organization", None, "week", 1000, now=at(2025, 11, 1))
    set_budget(llm_conn, org, "api_key", "*", "day", 1000, now=at(2025, 11, 1))
    set_budget(llm_conn, org, "project", "p", "month", 1000, now=at(2025, 11, 1))
    settled = {}
    for when in (at(2025, 11, 10), at(2025, 12, 15), at(2025, 12, 16), T0):
        inv = admit(llm_conn, org, 10, now=when, project="p", api_key="k")["id"]
        assert settle(llm_conn, org, inv, 7, 1, now=when + HOUR) == "settled"
        settled[inv] = 7
    held = admit(llm_conn, org, 10, now=at(2025, 12, 1), api_key="h")["id"]  # open: not past recovery_window
    before = set(budget_usage(llm_conn, org))

    run_pass(llm_conn, T0 + HOUR)

    gone = {
        ("organization", None, "week", date(2025, 11, 10)),  # ended 11-17
        ("project", "p", "month", date(2025, 11, 1)),  # ended 12-01: the open request's day
        ("api_key", "k", "day", date(2025, 11, 10)),
    }
    assert gone <= before
    assert set(budget_usage(llm_conn, org)) == before - gone
    kept = budget_usage(llm_conn, org)
    assert kept[("api_key", "k", "day", date(2025, 12, 15))]["used_credits"] == 7  # after the horizon
    assert kept[("api_key", "h", "day", date(2025, 12, 1))]["held_credits"] == 10  # holding
    assert kept[("organization", None, "week", date(2025, 12, 1))]["held_credits"] == 10
    assert_books_right(llm_conn)

    assert settle(llm_conn, org, held, 4, 0, now=T0) == "settled"
    settled[held] = 4
    run_pass(llm_conn, T0 + 2 * HOUR)
    gone |= {
        ("api_key", "k", "day", date(2025, 12, 15)),  # ended 12-16: the last day deleted
        ("api_key", "h", "day", date(2025, 12, 1)),
        ("organization", None, "week", date(2025, 12, 1)),  # ended 12-08
    }
    assert set(budget_usage(llm_conn, org)) == before - gone
    kept = budget_usage(llm_conn, org)
    assert kept[("api_key", "k", "day", date(2025, 12, 16))]["used_credits"] == 7  # ends 12-17
    assert kept[("project", "p", "month", date(2025, 12, 1))]["used_credits"] == 14  # ends 2026-01-01
    charged = dict(llm_conn.execute("SELECT id, charged_credits FROM llm.invocations"
                                    " WHERE organization_id = %s AND status = 'settled'", [org]).fetchall())
    assert charged == settled
    assert_books_right(llm_conn)
