"""SC-CAP-PFM-LLM-009-01 end to end with a real worker process: it admits and dispatches
through the Python driver, inside a task, and is killed (SIGKILL) before it can settle or
close; 25 h later the hourly pass releases its hold, records the recovery charge and
abandons its task (BR-CAP-PFM-LLM-009-01, -05, -07).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from datetime import UTC, datetime, timedelta

from psycopg.rows import dict_row

T0 = datetime(2026, 3, 10, 9, 0, tzinfo=UTC)

WORKER = textwrap.dedent(
    """
    import sys, time, uuid
    from datetime import datetime
    import psycopg
    from llm_db import Llm

    dsn, org, now = sys.argv[1], uuid.UUID(sys.argv[2]), datetime.fromisoformat(sys.argv[3])
    llm = Llm(psycopg.connect(dsn, autocommit=True))
    task = llm.open_execution(org, "crash.demo", now=now)
    inv = llm.admit(org, 300, "model-x", execution_id=task.execution_id, now=now)
    llm.mark_dispatched(org, inv.id, now=now)
    print(inv.id, task.execution_id, flush=True)
    time.sleep(600)  # "waiting for the provider": the test kills the process here
    """
)


def test_sc_cap_pfm_llm_009_01_killed_worker_hold_released_by_the_pass_25h_later(llm_conn, llm_dsn):
    org = uuid.uuid4()
    llm_conn.execute(
        "SELECT llm.upsert_organization(%(org)s::uuid, 'crashy', 1000::bigint, p_now => %(now)s::timestamptz)",
        {"org": org, "now": T0},
    )
    llm_conn.execute("SELECT llm.declare_task_kind('crash.demo')")

    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, llm_dsn, str(org), T0.isoformat()],
        stdout=subprocess.PIPE, text=True, env=os.environ.copy(),
    )
    try:
        line = worker.stdout.readline().split()
        assert len(line) == 2, "the worker did not report its request"
        inv, task = uuid.UUID(line[0]), uuid.UUID(line[1])
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
    assert worker.returncode == -signal.SIGKILL

    cur = llm_conn.cursor(row_factory=dict_row)
    period = "SELECT * FROM llm.periods WHERE organization_id = %s"
    assert cur.execute(period, [org]).fetchone()["held_credits"] == 300
    status = "SELECT status FROM llm.invocations WHERE organization_id = %s AND id = %s"
    assert cur.execute(status, [org, inv]).fetchone()["status"] == "dispatched"

    swept_at = T0 + timedelta(hours=25)
    llm_conn.execute("CALL llm.run_reconciliation(p_now => %s)", [swept_at])

    row = cur.execute(period, [org]).fetchone()
    assert (row["held_credits"], row["used_credits"], row["used_cents"]) == (0, 300, 0)
    got = cur.execute(
        "SELECT * FROM llm.invocations WHERE organization_id = %s AND id = %s", [org, inv]
    ).fetchone()
    assert (got["status"], got["settlement_kind"], got["charged_credits"], got["charged_cents"]) == (
        "settled", "recovered", 300, None)
    assert got["past_window_alerted_at"] == swept_at
    x = cur.execute(
        "SELECT * FROM llm.executions WHERE organization_id = %s AND id = %s", [org, task]
    ).fetchone()
    assert (x["status"], x["ended_at"], x["duration_ms"]) == ("abandoned", swept_at, None)
    assert (x["request_count"], x["credits"]) == (1, 300)
    run = cur.execute("SELECT * FROM llm.reconciliation_runs ORDER BY started_at DESC LIMIT 1").fetchone()
    assert (run["status"], run["requests_recovered"], run["released_hold_credits"],
            run["past_window_alerts"], run["executions_abandoned"]) == ("succeeded", 1, 300, 1, 1)
    assert cur.execute("SELECT * FROM llm.check_invariants()").fetchall() == []
