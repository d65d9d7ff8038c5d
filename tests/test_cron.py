"""Scheduling the hourly pass with pg_cron (WF-PFM-LLM-004 hop 1): llm.schedule_reconciliation
/ llm.unschedule_reconciliation in the pg_cron database (``llm_cron_dsn``), where the real
scheduler fires the job; and LL010 with a usable HINT in a database without pg_cron.

The pg_cron test waits for the real scheduler (bounded poll, at most 90 s): pg_cron 1.4
schedules by the minute.
"""

from __future__ import annotations

import psycopg
import pytest

from tests.helpers import (
    admit,
    call,
    call_pass,
    cron_jobs,
    lock_period_rows,
    new_org,
    scalar,
    wait_for,
)

FIRE_TIMEOUT_S = 90.0


def test_wf_pfm_llm_004_hop_1_schedule_is_idempotent_fires_and_unschedules(cron_conn, llm_cron_dsn):
    """WF-PFM-LLM-004 hop 1 (invoke hourly reconciliation through the declared schedule):
    schedule_reconciliation is idempotent (same job id twice, one cron.job row running
    CALL llm.run_reconciliation() in this database); pg_cron really fires it. While the
    fired pass is held inside an organization's sweep, the lease knows pg_cron's background
    worker is running it: a pass started by hand is skipped and names that worker. Then the
    cron pass finishes 'succeeded'; unschedule returns true, then false."""
    # at the real time: pg_cron fires the pass with the server's clock
    org = new_org(cron_conn, None, name="cron org", now=None)
    admit(cron_conn, org, 10, "gpt-x", now=scalar(cron_conn, "SELECT now() - interval '2 days'"))  # stranded
    cron_conn.execute("UPDATE llm.settings SET org_lock_timeout = '100s'")
    blocker = psycopg.connect(llm_cron_dsn)
    lock_period_rows(blocker, org)
    try:
        scheduled_at = cron_conn.execute("SELECT now()").fetchone()[0]
        first = schedule(cron_conn, "* * * * *")
        second = schedule(cron_conn, "* * * * *")
        assert first == second
        dbname = cron_conn.info.dbname
        assert cron_jobs(cron_conn) == [(first, "* * * * *", "CALL llm.run_reconciliation()", dbname)]

        cron_pid = fired(cron_conn, "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
                                   " AND query = 'CALL llm.run_reconciliation()'"
                                   " AND wait_event_type = 'Lock'")  # fmt: skip
        call_pass(cron_conn, None)  # by hand, while pg_cron's pass runs
        skipped = cron_conn.execute(
            "SELECT errors->0->>'holder_pid' FROM llm.reconciliation_runs"
            " WHERE status = 'skipped' AND started_at >= %s", [scheduled_at]).fetchall()
        assert skipped == [(str(cron_pid),)]
    finally:
        blocker.rollback()
        blocker.close()
        cron_conn.execute("UPDATE llm.settings SET org_lock_timeout = DEFAULT")

    run = fired(cron_conn, "SELECT status FROM llm.reconciliation_runs WHERE started_at >= %s"
                           " AND status IN ('succeeded', 'partial', 'failed')", [scheduled_at])  # fmt: skip
    details = cron_conn.execute(
        "SELECT status, return_message FROM cron.job_run_details WHERE jobid = %s ORDER BY start_time",
        [first]).fetchall()
    assert run == "succeeded", details

    assert call(cron_conn, "unschedule_reconciliation")[0]["value"] is True
    assert cron_jobs(cron_conn) == []
    assert call(cron_conn, "unschedule_reconciliation")[0]["value"] is False


def schedule(conn: psycopg.Connection, *cron: str) -> int:
    """llm.schedule_reconciliation (``cron``: the schedule, or its default); the job id."""
    return call(conn, "schedule_reconciliation", *cron)[0]["value"]


def fired(conn: psycopg.Connection, query: str, params: list | None = None) -> object:
    """The first column of ``query``'s first row, once there is one (pg_cron fires by the
    minute: at most FIRE_TIMEOUT_S); the job's runs are named when it never comes."""
    try:
        found = wait_for(lambda: conn.execute(query, params).fetchone(), "pg_cron's job", FIRE_TIMEOUT_S, interval=0.2)
    except AssertionError as timeout:
        details = conn.execute("SELECT status, return_message FROM cron.job_run_details").fetchall()
        raise AssertionError(f"{timeout}; job runs: {details}") from None
    return found[0]


def test_schedule_reconciliation_replaces_the_schedule_of_the_one_job(cron_conn):
    """WF-PFM-LLM-004 hop 1: scheduling again with another cron expression reschedules the same
    job instead of adding a second one."""
    hourly = schedule(cron_conn)
    assert cron_jobs(cron_conn)[0][:2] == (hourly, "0 * * * *")
    again = schedule(cron_conn, "15 * * * *")
    assert again == hourly
    assert [j[:2] for j in cron_jobs(cron_conn)] == [(hourly, "15 * * * *")]


def test_schedule_reconciliation_rejects_a_bad_cron_expression_22023(cron_conn):
    """schedule_reconciliation turns pg_cron's refusal of a malformed schedule into 22023 with a
    HINT, and schedules nothing."""
    with pytest.raises(psycopg.Error) as raised:
        schedule(cron_conn, "every hour please")
    assert raised.value.sqlstate == "22023"
    assert raised.value.diag.message_hint
    assert cron_jobs(cron_conn) == []


@pytest.mark.parametrize("operation", [("schedule_reconciliation", "0 * * * *"), ("unschedule_reconciliation",)],
                         ids=["schedule", "unschedule"])
def test_schedule_without_pg_cron_raises_ll010_with_schedule_in_database_hint(
    llm_conn, llm_superuser_conn, operation
):
    """WF-PFM-LLM-004 hop 1: in a database without the pg_cron extension, scheduling raises
    LL010; since pg_cron lives in another database (cron.database_name), the HINT gives the
    cron.schedule_in_database call to run there. The owner, no superuser, cannot read
    cron.database_name (pg_settings hides it), so the HINT names the pg_cron
    database by its setting; an owner granted pg_read_all_settings is told its name."""
    # superuser: reading a server setting hidden from the owner, as the provider's admin
    cron_db = llm_superuser_conn.execute("SELECT current_setting('cron.database_name')").fetchone()[0]
    assert cron_db != llm_conn.info.dbname
    with pytest.raises(psycopg.Error) as raised:
        call(llm_conn, *operation)
    assert raised.value.sqlstate == "LL010"
    hint = raised.value.diag.message_hint or ""
    assert "cron.schedule_in_database" in hint and "cron.database_name" in hint
    assert llm_conn.info.dbname in hint and "CALL llm.run_reconciliation()" in hint
    owner = llm_conn.info.user
    llm_superuser_conn.execute(f'GRANT pg_read_all_settings TO "{owner}"')
    try:
        with pytest.raises(psycopg.Error) as raised:
            call(llm_conn, *operation)
    finally:
        llm_superuser_conn.execute(f'REVOKE pg_read_all_settings FROM "{owner}"')
    assert raised.value.sqlstate == "LL010"
    assert cron_db in (raised.value.diag.message_detail or "")
    assert f"database {cron_db}" in (raised.value.diag.message_hint or "")


def test_health_before_the_first_pass_says_whether_a_job_is_scheduled(cron_conn, llm_conn):
    """The first hour: ``llm-db health`` right after ``llm-db schedule`` said to schedule
    one. Before the first pass its detail now says what it can see from the database: the
    job and its schedule, no job, or (pg_cron elsewhere) that none is visible from here."""
    assert "no pg_cron job llm-reconciliation runs in this database" in scalar(
        cron_conn, "SELECT llm._cron_job_seen()")
    schedule(cron_conn, "15 * * * *")
    assert scalar(cron_conn, "SELECT llm._cron_job_seen()") == (
        "the pg_cron job llm-reconciliation is scheduled (15 * * * *): the first pass runs at its next match")
    # a database without pg_cron: the health row itself, before any pass
    (health,) = call(llm_conn, "health")
    assert health["status"] == "never"
    assert health["detail"].startswith("no reconciliation pass has completed yet; pg_cron is not installed"
                                       " in this database")
