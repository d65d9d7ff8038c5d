"""Tasks: STATE-PFM-LLM-002 (execution lifecycle) and WF-PFM-LLM-002 (account for a
multi-request task), proved against llm.open_execution / llm.close_execution /
llm.reconcile_org with the clock moved through ``p_now``.

One test per transition and per invalid transition of STATE-PFM-LLM-002; the
two races of the lifecycle (duplicate replay-key opens, close vs abandonment)
are scripted with two real connections: one holds its transaction open, the
other runs in a thread until it blocks on the first one's row, then the first
commits.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from tests.helpers import (
    HOUR,
    T0,
    admit,
    assert_books_right,
    call,
    close_task,
    declare_task,
    execution,
    fail,
    new_org,
    reconcile,
    settle,
    wait_blocked,
)

TASK = "report.generate"
ALLOWANCE = 1_000_000


# ---------------------------------------------------------------- local helpers


def declare(conn: psycopg.Connection, key: str = TASK) -> str:
    return declare_task(conn, key, "a test task")


def open_exec(conn: psycopg.Connection, org: uuid.UUID, *, key: str = TASK, replay_key: str | None = None,
              subject: tuple[str | None, str | None] = (None, None), now: datetime = T0) -> dict[str, Any]:
    """llm.open_execution; returns its row (execution_id, status, replayed)."""
    return call(conn, "open_execution", org, key, subject_type=subject[0], subject_id=subject[1],
                replay_key=replay_key, now=now)[0]


def count_executions(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM llm.executions").fetchone()[0]


@pytest.fixture
def org(llm_conn: psycopg.Connection) -> uuid.UUID:
    declare(llm_conn)
    return new_org(llm_conn, ALLOWANCE)


# ---------------------------------------------------------------- transitions


def test_absent_to_running_opens_a_declared_task(llm_conn, org):
    """STATE-PFM-LLM-002 absent→running; WF-PFM-LLM-002 hops 1 and 2: opening a declared
    task persists a running record with its attribution and zero totals."""
    opened = open_exec(llm_conn, org, subject=("report", "r-1"), replay_key="job-1")
    assert opened["status"] == "running" and opened["replayed"] is False
    row = execution(llm_conn, org, opened["execution_id"])
    assert row["status"] == "running"
    assert row["task_key"] == TASK and (row["subject_type"], row["subject_id"]) == ("report", "r-1")
    assert row["replay_key"] == "job-1"
    assert row["started_at"] == T0 and row["ended_at"] is None and row["duration_ms"] is None
    assert (row["request_count"], row["credits"], row["cents"]) == (0, 0, 0)


def test_running_to_completed_stamps_end_and_duration(llm_conn, org):
    """STATE-PFM-LLM-002 running→completed; WF-PFM-LLM-002 hop 4: a completed close stamps
    ended_at and duration_ms and keeps the totals."""
    x = open_exec(llm_conn, org)["execution_id"]
    inv = admit(llm_conn, org, 10, execution_id=x, now=T0 + timedelta(seconds=1))["id"]
    settle(llm_conn, org, inv, 7, 3, now=T0 + timedelta(seconds=30))
    ended = T0 + timedelta(seconds=90, milliseconds=500)
    assert close_task(llm_conn, org, x, "completed", now=ended) is True
    row = execution(llm_conn, org, x)
    assert row["status"] == "completed"
    assert row["ended_at"] == ended and row["duration_ms"] == 90_500
    assert (row["request_count"], row["credits"], row["cents"]) == (1, 7, 3)
    assert row["error"] is None
    assert_books_right(llm_conn)


def test_running_to_failed_keeps_totals_and_error(llm_conn, org):
    """STATE-PFM-LLM-002 running→failed; WF-PFM-LLM-002 hop 4: a failed close keeps the
    accumulated charges and records the body's error."""
    x = open_exec(llm_conn, org)["execution_id"]
    for credits in (4, 6):
        inv = admit(llm_conn, org, 10, execution_id=x)["id"]
        settle(llm_conn, org, inv, credits, credits * 2, now=T0 + timedelta(minutes=1))
    ended = T0 + timedelta(minutes=2)
    assert close_task(llm_conn, org, x, "failed", error="body raised ValueError", now=ended) is True
    row = execution(llm_conn, org, x)
    assert row["status"] == "failed"
    assert row["error"] == "body raised ValueError"
    assert row["ended_at"] == ended and row["duration_ms"] == 120_000
    assert (row["request_count"], row["credits"], row["cents"]) == (2, 10, 20)
    assert_books_right(llm_conn)


def test_running_to_abandoned_at_detection_time_without_duration(llm_conn, org):
    """STATE-PFM-LLM-002 running→abandoned; BR-CAP-PFM-LLM-009-05; WF-PFM-LLM-002 hop 5: a task
    still running after the recovery window is abandoned by reconcile_org with ended_at =
    detection time, duration_ms NULL and its totals kept."""
    x = open_exec(llm_conn, org)["execution_id"]
    inv = admit(llm_conn, org, 10, execution_id=x)["id"]
    settle(llm_conn, org, inv, 8, 5, now=T0 + HOUR)
    detected = T0 + 25 * HOUR
    sweep = reconcile(llm_conn, org, now=detected)
    assert sweep["abandoned_executions"] == 1
    row = execution(llm_conn, org, x)
    assert row["status"] == "abandoned"
    assert row["ended_at"] == detected and row["duration_ms"] is None
    assert (row["request_count"], row["credits"], row["cents"]) == (1, 8, 5)
    assert_books_right(llm_conn)


def test_running_task_inside_the_window_is_not_abandoned(llm_conn, org):
    """STATE-PFM-LLM-002 running→abandoned guard: a task running for less than the recovery
    window (23 h) stays running."""
    x = open_exec(llm_conn, org)["execution_id"]
    assert reconcile(llm_conn, org, now=T0 + 23 * HOUR)["abandoned_executions"] == 0
    assert execution(llm_conn, org, x)["status"] == "running"


def test_completed_to_completed_late_settlement_increments_totals_without_reopening(llm_conn, org):
    """STATE-PFM-LLM-002 completed→completed; WF-PFM-LLM-002 hop 3: a request settling after
    its task completed adds to request_count, credits and cents; status, ended_at and
    duration stay."""
    x = open_exec(llm_conn, org)["execution_id"]
    inv = admit(llm_conn, org, 10, execution_id=x)["id"]
    ended = T0 + timedelta(minutes=5)
    assert close_task(llm_conn, org, x, "completed", now=ended)
    before = execution(llm_conn, org, x)
    assert settle(llm_conn, org, inv, 9, 4, now=T0 + timedelta(minutes=6)) == "settled"
    after = execution(llm_conn, org, x)
    assert after["status"] == "completed"
    assert (after["ended_at"], after["duration_ms"]) == (before["ended_at"], before["duration_ms"])
    assert (after["request_count"], after["credits"], after["cents"]) == (1, 9, 4)
    assert_books_right(llm_conn)


@pytest.mark.parametrize("closed_as", ["completed", "failed", "abandoned"])
def test_late_settlement_after_close_increments_totals_and_leaves_status(llm_conn, org, closed_as):
    """STATE-PFM-LLM-002 completed→completed (and the same for failed and abandoned tasks);
    WF-PFM-LLM-002 hop 3: settlement increments remain allowed after closure; the closed
    status never changes."""
    x = open_exec(llm_conn, org)["execution_id"]
    # admitted two hours in: the sweep at +25 h abandons the task but not this request
    settled_early = admit(llm_conn, org, 10, execution_id=x, now=T0 + HOUR)["id"]
    settle(llm_conn, org, settled_early, 3, 1, now=T0 + HOUR)
    late = admit(llm_conn, org, 10, execution_id=x, now=T0 + 2 * HOUR)["id"]
    if closed_as == "abandoned":
        assert reconcile(llm_conn, org, now=T0 + 25 * HOUR)["abandoned_executions"] == 1
    else:
        assert close_task(llm_conn, org, x, closed_as, error="boom" if closed_as == "failed" else None,
                          now=T0 + 3 * HOUR)
    before = execution(llm_conn, org, x)
    assert settle(llm_conn, org, late, 6, 2, now=T0 + 25 * HOUR + timedelta(minutes=1)) == "settled"
    after = execution(llm_conn, org, x)
    assert after["status"] == closed_as
    assert (after["ended_at"], after["duration_ms"], after["error"]) == (
        before["ended_at"], before["duration_ms"], before["error"])
    assert (after["request_count"], after["credits"], after["cents"]) == (2, 9, 3)
    assert_books_right(llm_conn)


def test_failed_request_adds_its_partial_charge_to_the_task(llm_conn, org):
    """WF-PFM-LLM-002 hop 3: a failed request follows its own accounting path and still counts
    once in the task totals with its partial charge."""
    x = open_exec(llm_conn, org)["execution_id"]
    inv = admit(llm_conn, org, 10, execution_id=x)["id"]
    assert fail(llm_conn, org, inv, "provider 500", 2, 1, now=T0 + HOUR) == "failed"
    row = execution(llm_conn, org, x)
    assert (row["request_count"], row["credits"], row["cents"]) == (1, 2, 1)
    assert_books_right(llm_conn)


# ---------------------------------------------------------------- invalid transitions


def test_completed_to_running_is_invalid_close_returns_false_and_admit_raises_ll009(llm_conn, org):
    """STATE-PFM-LLM-002 invalid completed→running: a closed task is never reopened — a second
    close returns false and leaves it as it was, and a new request into it raises LL009."""
    x = open_exec(llm_conn, org)["execution_id"]
    assert close_task(llm_conn, org, x, "completed", now=T0 + HOUR)
    before = execution(llm_conn, org, x)
    assert close_task(llm_conn, org, x, "completed", now=T0 + 2 * HOUR) is False
    assert close_task(llm_conn, org, x, "failed", error="late", now=T0 + 2 * HOUR) is False
    assert execution(llm_conn, org, x) == before
    with pytest.raises(psycopg.Error) as raised:
        admit(llm_conn, org, 5, execution_id=x, now=T0 + 2 * HOUR)
    assert raised.value.sqlstate == "LL009"
    assert llm_conn.execute("SELECT count(*) FROM llm.invocations").fetchone()[0] == 0
    assert execution(llm_conn, org, x) == before


def test_failed_to_completed_is_invalid_close_returns_false(llm_conn, org):
    """STATE-PFM-LLM-002 invalid failed→completed: a later successful close cannot replace a
    failed close; close returns false and the status stays failed."""
    x = open_exec(llm_conn, org)["execution_id"]
    assert close_task(llm_conn, org, x, "failed", error="boom", now=T0 + HOUR)
    before = execution(llm_conn, org, x)
    assert close_task(llm_conn, org, x, "completed", now=T0 + 2 * HOUR) is False
    after = execution(llm_conn, org, x)
    assert after["status"] == "failed" and after == before


def test_abandoned_to_completed_is_invalid_close_returns_false(llm_conn, org):
    """STATE-PFM-LLM-002 invalid abandoned→completed: an abandoned status prevents a late
    completed close."""
    x = open_exec(llm_conn, org)["execution_id"]
    reconcile(llm_conn, org, now=T0 + 25 * HOUR)
    before = execution(llm_conn, org, x)
    assert before["status"] == "abandoned"
    assert close_task(llm_conn, org, x, "completed", now=T0 + 26 * HOUR) is False
    after = execution(llm_conn, org, x)
    assert after == before and after["duration_ms"] is None


@pytest.mark.parametrize("status_before_replay", ["running", "completed"])
def test_running_to_running_replay_key_returns_the_earlier_task(llm_conn, org, status_before_replay):
    """STATE-PFM-LLM-002 invalid running→running; WF-PFM-LLM-002 hop 2: opening the same
    replay key returns the earlier task (whatever its status) with replayed = true and
    creates no new row."""
    first = open_exec(llm_conn, org, replay_key="job-42", subject=("doc", "7"))
    if status_before_replay == "completed":
        close_task(llm_conn, org, first["execution_id"], "completed", now=T0 + HOUR)
    again = open_exec(llm_conn, org, replay_key="job-42", subject=("doc", "7"), now=T0 + 2 * HOUR)
    assert again["execution_id"] == first["execution_id"]
    assert again["replayed"] is True
    assert again["status"] == status_before_replay
    assert count_executions(llm_conn) == 1
    assert execution(llm_conn, org, first["execution_id"])["started_at"] == T0


def test_unkeyed_opens_create_a_new_task_each_time(llm_conn, org):
    """STATE-PFM-LLM-002 running→running (unkeyed branch); WF-PFM-LLM-002 idempotency: an
    open without a replay key always creates another task."""
    ids = {open_exec(llm_conn, org, subject=("doc", "7"))["execution_id"] for _ in range(3)}
    assert len(ids) == 3
    assert count_executions(llm_conn) == 3


def test_replay_key_is_unique_per_organization_not_globally(llm_conn, org):
    """WF-PFM-LLM-002 hop 2: a replay key is unique within the organization; another
    organization may use the same key for its own task."""
    other = new_org(llm_conn, ALLOWANCE)
    a = open_exec(llm_conn, org, replay_key="shared")
    b = open_exec(llm_conn, other, replay_key="shared")
    assert a["execution_id"] != b["execution_id"]
    assert (a["replayed"], b["replayed"]) == (False, False)


@pytest.mark.parametrize("change", ["task_key", "subject"])
def test_replay_key_with_different_task_raises_ll007(llm_conn, org, change):
    """WF-PFM-LLM-002 hop 2 (LL007): a replay key names one task; reusing it for another task
    kind or subject is an idempotency conflict and writes nothing."""
    declare(llm_conn, "other.task")
    open_exec(llm_conn, org, replay_key="job-1", subject=("doc", "1"))
    kwargs: dict[str, Any] = {"key": "other.task"} if change == "task_key" else {"subject": ("doc", "2")}
    with pytest.raises(psycopg.Error) as raised:
        open_exec(llm_conn, org, replay_key="job-1", **({"subject": ("doc", "1")} | kwargs))
    assert raised.value.sqlstate == "LL007"
    assert count_executions(llm_conn) == 1


# ---------------------------------------------------------------- rejected calls


def test_open_rejects_unknown_organization_ll002_and_writes_nothing(llm_conn):
    """WF-PFM-LLM-002 hop 1; STATE-PFM-LLM-002 absent→running guard (the context identifies an
    organization): an unknown organization raises LL002 and no task is created."""
    declare(llm_conn)
    with pytest.raises(psycopg.Error) as raised:
        open_exec(llm_conn, uuid.uuid4())
    assert raised.value.sqlstate == "LL002"
    assert count_executions(llm_conn) == 0


def test_open_rejects_null_organization_22023(llm_conn):
    """WF-PFM-LLM-002 hop 1: a missing organization is rejected (22023) before anything is written."""
    declare(llm_conn)
    with pytest.raises(psycopg.Error) as raised:
        call(llm_conn, "open_execution", None, TASK)
    assert raised.value.sqlstate == "22023"
    assert count_executions(llm_conn) == 0


@pytest.mark.parametrize("status", ["suspended", "closed"])
def test_open_rejects_non_operational_organization_ll003_and_writes_nothing(llm_conn, status):
    """WF-PFM-LLM-002 hop 1: a suspended or closed organization cannot open tasks (LL003);
    no task is created."""
    declare(llm_conn)
    org = new_org(llm_conn, ALLOWANCE, status=status)
    with pytest.raises(psycopg.Error) as raised:
        open_exec(llm_conn, org, replay_key="k")
    assert raised.value.sqlstate == "LL003"
    assert count_executions(llm_conn) == 0


def test_open_rejects_undeclared_task_key_ll004_and_writes_nothing(llm_conn, org):
    """WF-PFM-LLM-002 hop 1; STATE-PFM-LLM-002 absent→running guard (the task key is declared):
    an unknown key raises LL004 and no task is created."""
    with pytest.raises(psycopg.Error) as raised:
        open_exec(llm_conn, org, key="never.declared", replay_key="k")
    assert raised.value.sqlstate == "LL004"
    assert count_executions(llm_conn) == 0


@pytest.mark.parametrize("outcome", ["abandoned", "bogus", "running"])
def test_close_with_an_outcome_other_than_completed_or_failed_raises_ll009(llm_conn, org, outcome):
    """STATE-PFM-LLM-002: only recovery abandons; a close asking for abandoned (or any other
    outcome) raises LL009 and the task stays running."""
    x = open_exec(llm_conn, org)["execution_id"]
    with pytest.raises(psycopg.Error) as raised:
        close_task(llm_conn, org, x, outcome, now=T0 + HOUR)
    assert raised.value.sqlstate == "LL009"
    assert execution(llm_conn, org, x)["status"] == "running"


def test_close_of_another_organizations_execution_raises_ll006(llm_conn, org):
    """WF-PFM-LLM-002 hop 4: an execution of another organization is unknown here (LL006) and
    stays running."""
    x = open_exec(llm_conn, org)["execution_id"]
    other = new_org(llm_conn, ALLOWANCE)
    with pytest.raises(psycopg.Error) as raised:
        close_task(llm_conn, other, x, "completed", now=T0 + HOUR)
    assert raised.value.sqlstate == "LL006"
    assert execution(llm_conn, org, x)["status"] == "running"
    with pytest.raises(psycopg.Error) as raised:
        close_task(llm_conn, org, uuid.uuid4(), "completed", now=T0 + HOUR)
    assert raised.value.sqlstate == "LL006"


# ---------------------------------------------------------------- races


def test_concurrent_opens_of_one_replay_key_get_one_task(llm_conn, llm_connect, org):
    """STATE-PFM-LLM-002 invalid running→running under concurrency: the organization-wide
    unique replay key makes two simultaneous opens return the same task. A opens inside an
    open transaction; B's open blocks on the unique index; A commits; B returns replayed."""
    a = llm_connect(autocommit=False)
    b = llm_connect()
    first = open_exec(a, org, replay_key="race-1")  # uncommitted
    with ThreadPoolExecutor(max_workers=1) as pool:
        second = pool.submit(open_exec, b, org, replay_key="race-1", now=T0 + timedelta(seconds=1))
        wait_blocked(llm_conn, b.info.backend_pid)
        a.commit()
        result = second.result(timeout=10)
    assert first["replayed"] is False
    assert result["execution_id"] == first["execution_id"]
    assert result["replayed"] is True
    assert count_executions(llm_conn) == 1


def test_close_racing_abandonment_close_wins_and_sweep_abandons_nothing(llm_conn, llm_connect, org):
    """STATE-PFM-LLM-002 concurrency (close and abandonment compare running; one wins): A closes
    inside an open transaction; B's sweep at +25 h blocks on the task row; A commits; B's
    sweep abandons 0 and the task stays completed with its duration."""
    x = open_exec(llm_conn, org)["execution_id"]
    a = llm_connect(autocommit=False)
    b = llm_connect()
    assert close_task(a, org, x, "completed", now=T0 + 24 * HOUR + timedelta(minutes=59)) is True
    with ThreadPoolExecutor(max_workers=1) as pool:
        sweep = pool.submit(reconcile, b, org, now=T0 + 25 * HOUR)
        wait_blocked(llm_conn, b.info.backend_pid)
        a.commit()
        result = sweep.result(timeout=10)
    assert result["abandoned_executions"] == 0
    row = execution(llm_conn, org, x)
    assert row["status"] == "completed" and row["duration_ms"] is not None
    assert_books_right(llm_conn)


def test_abandonment_racing_close_sweep_wins_and_close_returns_false(llm_conn, llm_connect, org):
    """STATE-PFM-LLM-002 concurrency, the mirror: B's sweep abandons the task inside an open
    transaction; A's close blocks on the task row; B commits; A's close returns false and the
    task stays abandoned at detection time."""
    x = open_exec(llm_conn, org)["execution_id"]
    a = llm_connect()
    b = llm_connect(autocommit=False)
    detected = T0 + 25 * HOUR
    assert reconcile(b, org, now=detected)["abandoned_executions"] == 1  # uncommitted
    with ThreadPoolExecutor(max_workers=1) as pool:
        closing = pool.submit(close_task, a, org, x, "completed", now=detected + timedelta(seconds=1))
        wait_blocked(llm_conn, a.info.backend_pid)
        b.commit()
        closed = closing.result(timeout=10)
    assert closed is False
    row = execution(llm_conn, org, x)
    assert row["status"] == "abandoned" and row["ended_at"] == detected and row["duration_ms"] is None
    assert_books_right(llm_conn)
