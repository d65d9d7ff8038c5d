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
from datetime import timedelta

from tests.helpers import (
    T0,
    assert_books_right,
    declare_task,
    execution,
    invocation,
    new_org,
    period,
    run_pass,
)

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
    """SC-CAP-PFM-LLM-009-01 with a SIGKILLed worker: the pass settles its request at the
    estimate with no money figure and releases the hold (BR-CAP-PFM-LLM-009-01), abandons
    its task with no duration and its totals (BR-CAP-PFM-LLM-009-05), and stamps the
    request's one past-window alert (BR-CAP-PFM-LLM-009-07)."""
    org = new_org(llm_conn, 1000, name="crashy")
    declare_task(llm_conn, "crash.demo")

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

    assert period(llm_conn, org)["held_credits"] == 300
    assert invocation(llm_conn, org, inv)["status"] == "dispatched"

    swept_at = T0 + timedelta(hours=25)
    run = run_pass(llm_conn, swept_at)

    held = period(llm_conn, org)
    assert (held["held_credits"], held["used_credits"], held["used_cents"]) == (0, 300, 0)
    got = invocation(llm_conn, org, inv)
    assert (got["status"], got["settlement_kind"], got["charged_credits"], got["charged_cents"]) == (
        "settled", "recovered", 300, None)
    assert got["past_window_alerted_at"] == swept_at
    x = execution(llm_conn, org, task)
    assert (x["status"], x["ended_at"], x["duration_ms"]) == ("abandoned", swept_at, None)
    assert (x["request_count"], x["credits"]) == (1, 300)
    assert (run["status"], run["requests_recovered"], run["released_hold_credits"],
            run["past_window_alerts"], run["executions_abandoned"]) == ("succeeded", 1, 300, 1, 1)
    assert_books_right(llm_conn)
