"""No client can block or wedge the hourly pass (WF-PFM-LLM-004 hops 2 and 6, concurrency:
"one execution slot").

- The one-pass-at-a-time guard is a lease (``llm.pass_lease``), not a session lock: a pass
  whose backend was terminated, or whose lease lapsed, is taken over at once by the next
  pass and marked failed; a pass that finds its lease taken over stops at once.
- Each organization's sweep waits at most ``settings.org_lock_timeout`` for a lock (55P03)
  and runs at most ``settings.org_time_budget`` (57014): a consumer session stuck inside a
  transaction costs that organization its sweep until the next pass, never the others.

Real blockers, never mocks: a second session holds the rows in an open transaction.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg

from llm_db import Llm
from tests.helpers import (
    T0,
    InThread,
    assert_books_right,
    call_pass,
    declare_task,
    health,
    lock_period_rows,
    new_org,
    reconcile,
    row,
    rows,
    scalar,
    wait_blocked,
)

LATER = T0 + timedelta(hours=25)  # past the 24 h recovery window


def strand(conn: psycopg.Connection, org: uuid.UUID, *, execution_id: uuid.UUID | None = None) -> uuid.UUID:
    """A request admitted and dispatched at T0 that nobody settles (a crashed worker)."""
    llm = Llm(conn)
    inv = llm.admit(org, 10, "gpt-x", execution_id=execution_id, now=T0)
    llm.mark_dispatched(org, inv.id, now=T0)
    return inv.id


def set_bounds(conn: psycopg.Connection, *, lock: str = "300ms", budget: str = "60s") -> None:
    conn.execute(
        "UPDATE llm.settings SET org_lock_timeout = %s::interval, org_time_budget = %s::interval",
        [lock, budget],
    )


def last_run(conn: psycopg.Connection) -> dict[str, Any]:
    found = row(conn, "SELECT * FROM llm.reconciliation_runs WHERE status <> 'skipped'"
                      " ORDER BY started_at DESC LIMIT 1")  # fmt: skip
    assert found is not None
    return found


def status_of(conn: psycopg.Connection, inv: uuid.UUID) -> str:
    return scalar(conn, "SELECT status FROM llm.invocations WHERE id = %s", [inv])


def pass_in_background(conn: psycopg.Connection, now) -> InThread:
    """``CALL llm.run_reconciliation`` on its own connection, in a thread."""
    return InThread(lambda: call_pass(conn, now))


# ---------------------------------------------------------------- stuck consumer sessions


def test_an_admission_left_open_in_a_transaction_costs_only_its_organization(llm_conn, llm_connect):
    """WF-PFM-LLM-004 hop 2: a consumer admits inside a transaction it never ends, holding
    its organization's period row. The pass waits org_lock_timeout for it, records that
    organization's error with 55P03, recovers the other organizations and finishes
    'partial'; the next pass after the blocker ends recovers the blocked organization."""
    set_bounds(llm_conn, lock="300ms")
    orgs = sorted(new_org(llm_conn, None) for _ in range(3))
    stranded = {org: strand(llm_conn, org) for org in orgs}
    stuck_org = orgs[1]
    stuck = llm_connect(autocommit=False)
    stuck.execute("SELECT 1")  # a transaction is open, as in a request handler's unit of work
    Llm(stuck).admit(stuck_org, 5, "gpt-x", now=LATER)  # held: its period row stays locked

    started = time.monotonic()
    run = Llm(llm_connect()).run_reconciliation(now=LATER)
    elapsed = time.monotonic() - started

    assert run is not None and run.status == "partial"
    assert (run.orgs_visited, run.orgs_failed, run.requests_recovered) == (3, 1, 2)
    [error] = run.errors
    assert (error["organization_id"], error["sqlstate"]) == (str(stuck_org), "55P03")
    assert elapsed < 20  # bounded by the lock timeout, not by the stuck session
    assert [status_of(llm_conn, stranded[o]) for o in orgs] == ["settled", "dispatched", "settled"]
    alarm = health(llm_conn, LATER)
    assert alarm["status"] == "failing" and alarm["last_run_status"] == "partial"

    stuck.commit()  # the consumer's unit of work ends
    again = Llm(llm_conn).run_reconciliation(now=LATER + timedelta(hours=1))
    assert again is not None and (again.status, again.requests_recovered) == ("succeeded", 1)
    assert status_of(llm_conn, stranded[stuck_org]) == "settled"
    assert_books_right(llm_conn)


def test_a_session_holding_a_stale_running_task_costs_only_its_organization(llm_conn, llm_connect):
    """BR-CAP-PFM-LLM-009-05 under a stuck client: a session holds the row of a task that is
    running past the recovery window. Abandoning it waits org_lock_timeout, then the
    organization is recorded with 55P03 and the others are swept; once the session ends the
    next pass abandons the task."""
    set_bounds(llm_conn, lock="300ms")
    declare_task(llm_conn, "stuck.task")
    blocked_org, free_org = new_org(llm_conn, None), new_org(llm_conn, None)
    tasks = {
        org: Llm(llm_conn).open_execution(org, "stuck.task", now=T0).execution_id
        for org in (blocked_org, free_org)
    }
    stuck = llm_connect(autocommit=False)
    stuck.execute("SELECT 1 FROM llm.executions WHERE id = %s FOR UPDATE", [tasks[blocked_org]])

    run = Llm(llm_connect()).run_reconciliation(now=LATER)

    assert run is not None and run.status == "partial"
    assert (run.orgs_visited, run.orgs_failed, run.executions_abandoned) == (2, 1, 1)
    assert [(e["organization_id"], e["sqlstate"]) for e in run.errors] == [(str(blocked_org), "55P03")]
    task_status = "SELECT status FROM llm.executions WHERE id = %s"
    assert scalar(llm_conn, task_status, [tasks[free_org]]) == "abandoned"
    assert scalar(llm_conn, task_status, [tasks[blocked_org]]) == "running"

    stuck.rollback()
    again = Llm(llm_conn).run_reconciliation(now=LATER + timedelta(hours=1))
    assert again is not None and (again.status, again.executions_abandoned) == ("succeeded", 1)
    assert scalar(llm_conn, task_status, [tasks[blocked_org]]) == "abandoned"


def test_a_sweep_past_its_time_budget_is_recorded_with_57014_and_redone_later(llm_conn):
    """An organization's sweep that runs past settings.org_time_budget (checked between its
    statements) is rolled back and recorded with 57014; with a sane budget the next pass
    recovers what it left."""
    org = new_org(llm_conn, None)
    inv = strand(llm_conn, org)
    set_bounds(llm_conn, budget="1 microsecond")

    run = Llm(llm_conn).run_reconciliation(now=LATER)

    assert run is not None and run.status == "failed"
    assert [(e["organization_id"], e["sqlstate"]) for e in run.errors] == [(str(org), "57014")]
    assert status_of(llm_conn, inv) == "dispatched"
    set_bounds(llm_conn, budget="60s")
    again = Llm(llm_conn).run_reconciliation(now=LATER + timedelta(hours=1))
    assert again is not None and (again.status, again.requests_recovered) == ("succeeded", 1)


def test_a_direct_sweep_is_bounded_too_and_restores_the_callers_lock_timeout(llm_conn, llm_connect):
    """reconcile_org from tooling runs under the same bounds (55P03 after org_lock_timeout)
    and leaves the caller's own lock_timeout as it found it."""
    set_bounds(llm_conn, lock="200ms")
    org = new_org(llm_conn, None)
    strand(llm_conn, org)
    blocker = llm_connect(autocommit=False)
    lock_period_rows(blocker, org)
    tool = llm_connect()
    tool.execute("SET lock_timeout = '7s'")
    try:
        reconcile(tool, org, now=LATER)
    except psycopg.errors.LockNotAvailable:
        pass
    else:
        raise AssertionError("the blocked sweep did not give up")
    blocker.rollback()
    with tool.transaction():
        reconcile(tool, org, now=LATER)
        assert scalar(tool, "SHOW lock_timeout") == "7s"  # inside the caller's transaction
    assert scalar(tool, "SELECT status FROM llm.invocations WHERE organization_id = %s", [org]) == "settled"


# ---------------------------------------------------------------- the lease


def test_a_pass_whose_backend_is_terminated_mid_run_is_taken_over_at_once(llm_conn, llm_connect):
    """WF-PFM-LLM-004 hop 1: a pass blocked inside an organization's sweep is terminated;
    the very next pass is not skipped: it marks the dead run failed and does the work."""
    set_bounds(llm_conn, lock="60s")
    org = new_org(llm_conn, None)
    inv = strand(llm_conn, org)
    blocker = llm_connect(autocommit=False)
    lock_period_rows(blocker, org)
    doomed_conn = llm_connect()
    doomed = pass_in_background(doomed_conn, LATER)
    wait_blocked(llm_conn, doomed_conn.info.backend_pid)
    assert scalar(llm_conn, "SELECT pg_terminate_backend(%s, 5000)", [doomed_conn.info.backend_pid])
    doomed.join()
    blocker.rollback()

    run = Llm(llm_conn).run_reconciliation(now=LATER)

    assert run is not None and (run.status, run.requests_recovered) == ("succeeded", 1)
    history = rows(llm_conn, "SELECT status, errors FROM llm.reconciliation_runs ORDER BY started_at")
    assert [h["status"] for h in history] == ["failed", "succeeded"]
    assert "abandoned" in history[0]["errors"][-1]["error"]
    assert status_of(llm_conn, inv) == "settled"


def test_a_lapsed_lease_is_taken_over_and_the_old_pass_stops_at_once(llm_conn, llm_connect):
    """A live pass that stopped renewing its lease (stuck longer than settings.pass_lease)
    is taken over by the next pass; when the old pass comes back it finds the lease gone,
    records 'lease lost' and stops before any follow-up step, so two passes never run the
    same step together."""
    set_bounds(llm_conn, lock="60s")
    stuck_org, other_org = sorted(new_org(llm_conn, None) for _ in range(2))
    strand(llm_conn, stuck_org)
    strand(llm_conn, other_org)
    blocker = llm_connect(autocommit=False)
    lock_period_rows(blocker, stuck_org)
    old_conn = llm_connect()
    old = pass_in_background(old_conn, LATER)
    wait_blocked(llm_conn, old_conn.info.backend_pid)
    old_run = scalar(llm_conn, "SELECT run_id FROM llm.pass_lease")
    # the old pass is alive but its lease lapsed (as if it had been stuck for pass_lease)
    llm_conn.execute("UPDATE llm.pass_lease SET expires_at = clock_timestamp() - interval '1 second'")
    set_bounds(llm_conn, lock="200ms")

    new = Llm(llm_connect()).run_reconciliation(now=LATER)
    blocker.rollback()
    old.result()  # returned without an error

    assert new is not None and new.status == "partial"  # stuck_org was still locked for it
    assert new.requests_recovered == 1
    old_row = row(llm_conn, "SELECT * FROM llm.reconciliation_runs WHERE id = %s", [old_run])
    assert old_row["status"] == "failed"
    errors = [e["error"] for e in old_row["errors"]]
    assert any("expired" in e for e in errors) and any("lease lost" in e for e in errors)
    assert (old_row["notices_rearmed"], old_row["daily_rows_rebuilt"]) == (0, 0)
    assert scalar(llm_conn, "SELECT token FROM llm.pass_lease") is None
    assert_books_right(llm_conn)


def test_a_skipped_pass_names_a_holder_that_is_really_running(llm_conn, llm_connect):
    """While a pass is really running (blocked in a sweep), a second one is skipped at once
    and names the holder: its run, pid, backend start and application name."""
    set_bounds(llm_conn, lock="60s")
    org = new_org(llm_conn, None)
    strand(llm_conn, org)
    blocker = llm_connect(autocommit=False)
    lock_period_rows(blocker, org)
    holder_conn = llm_connect(application_name="hourly pass")
    holder = pass_in_background(holder_conn, LATER)
    wait_blocked(llm_conn, holder_conn.info.backend_pid)

    Llm(llm_connect()).run_reconciliation(now=LATER)
    skipped = row(llm_conn, "SELECT * FROM llm.reconciliation_runs WHERE status = 'skipped'")
    blocker.rollback()
    holder.join()

    [why] = skipped["errors"]
    assert why["holder_pid"] == holder_conn.info.backend_pid
    assert why["holder_application_name"] == "hourly pass"
    assert why["holder_run_id"] == str(last_run(llm_conn)["id"])
    assert last_run(llm_conn)["status"] == "succeeded"
