"""Scheduling the hourly pass with pg_cron (WF-PFM-LLM-004 hop 1): llm.schedule_reconciliation
/ llm.unschedule_reconciliation in the pg_cron database (``llm_cron_dsn``), where the real
scheduler fires the job; and LL010 with a usable HINT in a database without pg_cron.

The pg_cron test waits for the real scheduler (bounded poll, at most 90 s): pg_cron 1.4
schedules by the minute.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

JOB_NAME = "llm-reconciliation"
FIRE_TIMEOUT_S = 90.0


@pytest.fixture
def cron_conn(llm_cron_dsn: str) -> Iterator[psycopg.Connection]:
    """Autocommit connection to the pg_cron database; the job is removed before and after."""
    with psycopg.connect(llm_cron_dsn, autocommit=True) as conn:
        conn.execute("SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname = %s", [JOB_NAME])
        try:
            yield conn
        finally:
            conn.execute("SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname = %s", [JOB_NAME])


def jobs(conn: psycopg.Connection) -> list[tuple]:
    return conn.execute("SELECT jobid, schedule, command, database FROM cron.job WHERE jobname = %s",
                        [JOB_NAME]).fetchall()


def test_wf_pfm_llm_004_hop_1_schedule_is_idempotent_fires_and_unschedules(cron_conn):
    """WF-PFM-LLM-004 hop 1 (invoke hourly reconciliation through the declared schedule):
    schedule_reconciliation is idempotent (same job id twice, one cron.job row running
    CALL llm.run_reconciliation() in this database); pg_cron really fires it and a
    llm.reconciliation_runs row appears; unschedule returns true, then false."""
    scheduled_at = cron_conn.execute("SELECT now()").fetchone()[0]
    first = cron_conn.execute("SELECT llm.schedule_reconciliation('* * * * *')").fetchone()[0]
    second = cron_conn.execute("SELECT llm.schedule_reconciliation('* * * * *')").fetchone()[0]
    assert first == second
    dbname = cron_conn.info.dbname
    assert jobs(cron_conn) == [(first, "* * * * *", "CALL llm.run_reconciliation()", dbname)]

    deadline = time.monotonic() + FIRE_TIMEOUT_S
    run = None
    while time.monotonic() < deadline:
        run = cron_conn.execute(
            "SELECT id, status FROM llm.reconciliation_runs"
            " WHERE started_at >= %s AND status IN ('succeeded', 'partial', 'failed')"
            " ORDER BY started_at LIMIT 1", [scheduled_at]).fetchone()
        if run is not None:
            break
        time.sleep(0.5)
    details = cron_conn.execute(
        "SELECT status, return_message FROM cron.job_run_details WHERE jobid = %s ORDER BY start_time",
        [first]).fetchall()
    assert run is not None, f"pg_cron did not run the pass within {FIRE_TIMEOUT_S} s; job runs: {details}"
    assert run[1] == "succeeded"

    assert cron_conn.execute("SELECT llm.unschedule_reconciliation()").fetchone()[0] is True
    assert jobs(cron_conn) == []
    assert cron_conn.execute("SELECT llm.unschedule_reconciliation()").fetchone()[0] is False


def test_schedule_reconciliation_replaces_the_schedule_of_the_one_job(cron_conn):
    """WF-PFM-LLM-004 hop 1: scheduling again with another cron expression reschedules the same
    job instead of adding a second one."""
    hourly = cron_conn.execute("SELECT llm.schedule_reconciliation()").fetchone()[0]
    assert jobs(cron_conn)[0][:2] == (hourly, "0 * * * *")
    again = cron_conn.execute("SELECT llm.schedule_reconciliation('15 * * * *')").fetchone()[0]
    assert again == hourly
    assert [j[:2] for j in jobs(cron_conn)] == [(hourly, "15 * * * *")]


def test_schedule_reconciliation_rejects_a_bad_cron_expression_22023(cron_conn):
    """schedule_reconciliation turns pg_cron's refusal of a malformed schedule into 22023 with a
    HINT, and schedules nothing."""
    with pytest.raises(psycopg.Error) as raised:
        cron_conn.execute("SELECT llm.schedule_reconciliation('every hour please')")
    assert raised.value.sqlstate == "22023"
    assert raised.value.diag.message_hint
    assert jobs(cron_conn) == []


@pytest.mark.parametrize("call", ["SELECT llm.schedule_reconciliation('0 * * * *')",
                                  "SELECT llm.unschedule_reconciliation()"])
def test_schedule_without_pg_cron_raises_ll010_with_schedule_in_database_hint(llm_conn, call):
    """WF-PFM-LLM-004 hop 1: in a database without the pg_cron extension, scheduling raises
    LL010; since pg_cron lives in another database (cron.database_name), the HINT gives the
    cron.schedule_in_database call to run there."""
    with pytest.raises(psycopg.Error) as raised:
        llm_conn.execute(call)
    assert raised.value.sqlstate == "LL010"
    hint = raised.value.diag.message_hint or ""
    cron_db = llm_conn.execute("SELECT current_setting('cron.database_name')").fetchone()[0]
    assert cron_db != llm_conn.info.dbname
    assert "cron.schedule_in_database" in hint
    assert llm_conn.info.dbname in hint and "CALL llm.run_reconciliation()" in hint
    assert cron_db in (raised.value.diag.message_detail or "")
