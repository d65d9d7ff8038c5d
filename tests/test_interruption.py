"""Interruption: a call killed between two of its writes leaves nothing behind.

docs/design.md "Architecture": "Every state change is one PL/pgSQL call in one transaction:
settlement, the period movement (charge in, hold out), task totals, ledger
rows, threshold notices and the past-window alert stamp commit together or not
at all."

For every function that writes more than one row, a second connection (B)
holds a lock the call needs, so the call (A) has already written some of its
rows when it stops to wait. The test proves A is waiting on B
(``pg_stat_activity.wait_event_type = 'Lock'``, B in ``pg_blocking_pids``),
proves A has written (it holds ``RowExclusiveLock`` on the tables and its
uncommitted rows or row locks make probes from a third connection wait), then
terminates A's backend with ``pg_terminate_backend`` (a crashed worker, an OOM
kill, a failover), releases B and checks that every table of schema ``llm`` is
byte-for-byte what it was before the call and that ``llm.check_invariants()``
is empty. Finally the same call is retried to completion, as a worker would,
and the books are still right.

``run_reconciliation`` commits after each organization, so there the unit of
atomicity is one organization's sweep: the organization swept before the kill
stays swept, the interrupted one is untouched, the run row stays ``running``
and the next pass marks it ``failed`` (WF-PFM-LLM-004: one organization's
failure is logged without stopping other visits).

WF-PFM-LLM-004 asks for "interruption proof around each separate write" and
names the gap this closes: "a request settled before its failed period
movement will not be selected again".
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import psycopg
import pytest
from fingerprint import changed_tables, fingerprint

ORG = uuid.UUID("00000000-0000-4000-8000-0000000000a1")
ORG2 = uuid.UUID("00000000-0000-4000-8000-0000000000a2")
T0 = datetime(2030, 3, 10, 12, 0, tzinfo=UTC)
PERIOD = date(2030, 3, 1)
LATER = T0 + timedelta(hours=25)  # past the 24 h recovery window
TASK = "reliability.interrupt"
MODEL = "model-i"


# ---------------------------------------------------------------- setup helpers


def make_org(conn: psycopg.Connection, org: uuid.UUID = ORG, allowance: int | None = 100) -> None:
    conn.execute(
        "SELECT llm.upsert_organization(%s, %s, %s::bigint, 'operational', %s::int[], %s)",
        [org, f"org {org}", allowance, [50, 80, 100], T0 - timedelta(days=40)],
    )
    conn.execute("SELECT llm.declare_task_kind(%s, 'interruption tests')", [TASK])


def admit(
    conn: psycopg.Connection,
    credits: int,
    *,
    org: uuid.UUID = ORG,
    execution: uuid.UUID | None = None,
    at: datetime = T0,
    dispatch: bool = True,
) -> uuid.UUID:
    inv = uuid.uuid4()
    conn.execute(
        "SELECT llm.admit_invocation(%s, %s::bigint, %s, %s::uuid, %s::uuid, %s)",
        [org, credits, MODEL, execution, inv, at],
    )
    if dispatch:
        conn.execute("SELECT llm.mark_dispatched(%s, %s, %s)", [org, inv, at])
    return inv


def open_task(
    conn: psycopg.Connection, *, org: uuid.UUID = ORG, at: datetime = T0, replay: str | None = None
) -> uuid.UUID:
    (execution,) = conn.execute(
        "SELECT execution_id FROM llm.open_execution(%s, %s, p_replay_key => %s::text, p_now => %s)",
        [org, TASK, replay, at],
    ).fetchone()
    return execution


def invariant_violations(conn: psycopg.Connection) -> list[tuple]:
    return conn.execute("SELECT * FROM llm.check_invariants()").fetchall()


# ---------------------------------------------------------------- the machinery


@dataclass
class Probe:
    """A statement from a third connection that must wait on A's uncommitted work
    (55P03 under a short lock_timeout): proof that A wrote that row before it blocked."""

    why: str
    statement: str
    params: list[Any] = field(default_factory=list)


@dataclass
class Case:
    name: str
    prepare: Callable[[psycopg.Connection], dict[str, Any]]
    block: Callable[[psycopg.Connection, dict[str, Any]], None]  # runs in B's open transaction
    call: Callable[[psycopg.Connection, dict[str, Any]], Any]  # A's call (autocommit)
    written: tuple[str, ...]  # tables A holds RowExclusiveLock on while it waits
    probes: Callable[[dict[str, Any]], list[Probe]] = lambda ctx: []
    scope: uuid.UUID | None = None  # fingerprint only this organization (run_reconciliation)


class Victim(threading.Thread):
    """Runs A's call in its own thread so the test can watch it wait and kill it."""

    def __init__(self, conn: psycopg.Connection, call: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.conn = conn
        self.call = call
        self.error: BaseException | None = None
        self.result: Any = None

    def run(self) -> None:
        try:
            self.result = self.call()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def lock_wait(observer: psycopg.Connection, pid: int) -> tuple[str | None, str | None, list[int]]:
    row = observer.execute(
        "SELECT wait_event_type, wait_event, pg_blocking_pids(pid) FROM pg_stat_activity WHERE pid = %s",
        [pid],
    ).fetchone()
    return row if row is not None else (None, None, [])


def tables_written(observer: psycopg.Connection, pid: int) -> set[str]:
    rows = observer.execute(
        """SELECT c.relname FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation
            WHERE l.pid = %s AND l.granted AND l.mode = 'RowExclusiveLock'
              AND c.relnamespace = 'llm'::regnamespace AND c.relkind = 'r'""",
        [pid],
    ).fetchall()
    return {name for (name,) in rows}


def probe_outcome(observer: psycopg.Connection, probe: Probe) -> str:
    """'held' when the statement had to wait on A (55P03), else what happened; never commits."""
    with observer.transaction(force_rollback=True):
        observer.execute("SET LOCAL lock_timeout = '250ms'")
        try:
            with observer.transaction():
                observer.execute(probe.statement, probe.params)
        except psycopg.errors.LockNotAvailable:
            return "held"
        except psycopg.Error as exc:
            return f"{exc.sqlstate}: {exc}"
    return "free"


def run_interrupted(llm_conn: psycopg.Connection, llm_connect: Callable[..., psycopg.Connection], case: Case) -> dict[str, Any]:
    ctx = case.prepare(llm_conn)
    assert invariant_violations(llm_conn) == [], "the prepared books must be right"
    before = fingerprint(llm_conn, case.scope)

    blocker = llm_connect(autocommit=False)
    victim_conn = llm_connect()
    victim_conn.execute("SET lock_timeout = '60s'")
    victim_pid = victim_conn.info.backend_pid
    blocker_pid = blocker.info.backend_pid

    case.block(blocker, ctx)  # B's transaction stays open, holding the lock
    victim = Victim(victim_conn, lambda: case.call(victim_conn, ctx))
    victim.start()
    try:
        wait_type, wait_event, blocking = wait_for(
            lambda: (w := lock_wait(llm_conn, victim_pid))[0] == "Lock" and blocker_pid in w[2] and w,
            f"{case.name}: A (pid {victim_pid}) to wait on B's lock (pid {blocker_pid})",
        )
        assert victim.is_alive() and victim.error is None, victim.error

        # A is in the middle of its transaction: it has written, not committed.
        (xid,) = llm_conn.execute(
            "SELECT backend_xid FROM pg_stat_activity WHERE pid = %s", [victim_pid]
        ).fetchone()
        assert xid is not None, f"{case.name}: A had not written anything before it blocked"
        written = tables_written(llm_conn, victim_pid)
        assert set(case.written) <= written, (
            f"{case.name}: A should have written {sorted(case.written)} before blocking "
            f"on {wait_event}; it holds write locks on {sorted(written)}"
        )
        for probe in case.probes(ctx):
            assert probe_outcome(llm_conn, probe) == "held", f"{case.name}: {probe.why}"

        # kill A mid-call, then let B go
        (terminated,) = llm_conn.execute("SELECT pg_terminate_backend(%s)", [victim_pid]).fetchone()
        assert terminated
        victim.join(10)
        assert not victim.is_alive(), f"{case.name}: A survived pg_terminate_backend"
        assert isinstance(victim.error, psycopg.OperationalError), (
            f"{case.name}: A should have died with its connection, got {victim.error!r}"
        )
        wait_for(
            lambda: llm_conn.execute(
                "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = %s)", [victim_pid]
            ).fetchone()[0],
            f"{case.name}: A's backend to exit",
        )
    finally:
        blocker.rollback()
        if victim.is_alive():  # a failed assertion above: do not leave A waiting
            llm_conn.execute("SELECT pg_terminate_backend(%s)", [victim_pid])
            victim.join(10)

    after = fingerprint(llm_conn, case.scope)
    assert changed_tables(before, after) == [], (
        f"{case.name}: rows written by the terminated call remain in {changed_tables(before, after)}"
    )
    assert invariant_violations(llm_conn) == []
    return ctx


# ---------------------------------------------------------------- lock helpers (run in B)


def lock_period(org: uuid.UUID = ORG, period: date = PERIOD) -> Callable[[psycopg.Connection, dict], None]:
    # NO KEY UPDATE: conflicts with A's UPDATE of the row but not with the
    # KEY SHARE locks foreign-key checks take, so A gets past its inserts first.
    def block(b: psycopg.Connection, ctx: dict) -> None:
        b.execute(
            "SELECT FROM llm.period_heads AS h JOIN llm.period_stripes AS s USING (organization_id, period_start)"
            " WHERE h.organization_id = %s AND h.period_start = %s FOR NO KEY UPDATE",
            [org, period],
        )

    return block


def lock_execution(b: psycopg.Connection, ctx: dict) -> None:
    b.execute(
        "SELECT FROM llm.executions WHERE organization_id = %s AND id = %s FOR NO KEY UPDATE",
        [ORG, ctx["execution"]],
    )


def lock_organization(b: psycopg.Connection, ctx: dict) -> None:
    # FOR UPDATE (an upsert_organization in flight) blocks the share lock the month's
    # first admission takes on its organization before it creates the period row.
    b.execute("SELECT FROM llm.organizations WHERE id = %s FOR UPDATE", [ORG])


def insert_notice(threshold: int) -> Callable[[psycopg.Connection, dict], None]:
    # B inserts (uncommitted) the notice A is about to create: A waits on the unique key
    def block(b: psycopg.Connection, ctx: dict) -> None:
        b.execute(
            """INSERT INTO llm.threshold_notices
                      (organization_id, period_start, threshold_pct, crossed_at, used_credits,
                       allowance_credits, next_attempt_at)
               VALUES (%s, %s, %s, %s, 0, 100, %s)""",
            [ORG, PERIOD, threshold, T0, T0],
        )

    return block


# ---------------------------------------------------------------- probes


def row_locked(table: str, key: str, *values: Any) -> Probe:
    return Probe(
        f"A must hold the {table} row it updated",
        f"SELECT FROM llm.{table} WHERE {key} FOR SHARE NOWAIT",
        list(values),
    )


def notice_row(threshold: int) -> Probe:
    return Probe(
        f"A must have inserted the {threshold}% notice (uncommitted)",
        """INSERT INTO llm.threshold_notices
                  (organization_id, period_start, threshold_pct, crossed_at, used_credits,
                   allowance_credits, next_attempt_at)
           VALUES (%s, %s, %s, %s, 0, 100, %s)""",
        [ORG, PERIOD, threshold, T0, T0],
    )


def invocation_locked(ctx: dict, name: str = "inv", org: uuid.UUID = ORG) -> Probe:
    return row_locked("invocations", "organization_id = %s AND id = %s", org, ctx[name])


# ---------------------------------------------------------------- the cases


def prep_admit(conn: psycopg.Connection) -> dict:
    make_org(conn)
    admit(conn, 10)  # the period row exists
    return {"inv": uuid.uuid4()}


def call_admit(a: psycopg.Connection, ctx: dict) -> Any:
    return a.execute(
        "SELECT llm.admit_invocation(%s, 40::bigint, %s, NULL::uuid, %s::uuid, %s)",
        [ORG, MODEL, ctx["inv"], T0],
    ).fetchone()


def prep_admit_first_use(conn: psycopg.Connection) -> dict:
    make_org(conn)  # no period row yet
    return {"inv": uuid.uuid4()}


def prep_settle(conn: psycopg.Connection, *, with_task: bool = False) -> dict:
    make_org(conn)
    ctx: dict[str, Any] = {"execution": open_task(conn) if with_task else None}
    admit(conn, 5)
    ctx["inv"] = admit(conn, 30, execution=ctx["execution"])
    return ctx


def call_settle(a: psycopg.Connection, ctx: dict) -> Any:
    # 5 settled below + 90 = 95: crosses the 50% and 80% thresholds of 100
    return a.execute(
        "SELECT llm.settle_invocation(%s, %s, 90::bigint, 12::bigint, 1000::bigint, 200::bigint, %s)",
        [ORG, ctx["inv"], T0 + timedelta(minutes=1)],
    ).fetchone()


def call_fail(a: psycopg.Connection, ctx: dict) -> Any:
    return a.execute(
        "SELECT llm.fail_invocation(%s, %s, 'provider timeout', 85::bigint, 3::bigint, %s)",
        [ORG, ctx["inv"], T0 + timedelta(minutes=1)],
    ).fetchone()


def prep_reconcile(conn: psycopg.Connection, *, drift: bool = False) -> dict:
    make_org(conn)
    ctx: dict[str, Any] = {}
    ctx["stale_task"] = open_task(conn)  # running past the window: abandoned
    ctx["inv"] = admit(conn, 45, execution=ctx["stale_task"])
    ctx["inv2"] = admit(conn, 40, dispatch=False)
    if drift:
        # a task closed recently whose totals disagree with its requests: a finding exists
        closed = open_task(conn, at=T0 + timedelta(hours=2))
        inv = admit(conn, 1, execution=closed, at=T0 + timedelta(hours=2))
        conn.execute(
            "SELECT llm.settle_invocation(%s, %s, 1::bigint, 1::bigint, p_now => %s)",
            [ORG, inv, T0 + timedelta(hours=2)],
        )
        conn.execute(
            "SELECT llm.close_execution(%s, %s, 'completed', p_now => %s)",
            [ORG, closed, T0 + timedelta(hours=3)],
        )
        conn.execute(
            "UPDATE llm.executions SET credits = credits + 7 WHERE organization_id = %s AND id = %s",
            [ORG, closed],
        )
        conn.execute("SELECT llm.reconcile_org(%s, %s)", [ORG, T0 + timedelta(hours=4)])
        assert conn.execute("SELECT count(*) FROM llm.drift_findings").fetchone() == (1,)
        ctx["drifting"] = closed
    return ctx


def call_reconcile(a: psycopg.Connection, ctx: dict) -> Any:
    return a.execute("SELECT * FROM llm.reconcile_org(%s, %s)", [ORG, LATER]).fetchone()


def lock_drift_finding(b: psycopg.Connection, ctx: dict) -> None:
    b.execute(
        "SELECT FROM llm.drift_findings WHERE organization_id = %s AND execution_id = %s FOR UPDATE",
        [ORG, ctx["drifting"]],
    )


def call_upsert(a: psycopg.Connection, ctx: dict) -> Any:
    # a changed allowance applies to the current period: organization row, then period row
    return a.execute(
        "SELECT llm.upsert_organization(%s, 'renamed', 500::bigint, 'operational', '{50,80,100}'::int[], %s)",
        [ORG, T0],
    ).fetchone()


def call_open(a: psycopg.Connection, ctx: dict) -> Any:
    return a.execute(
        "SELECT * FROM llm.open_execution(%s, %s, 'invoice', '42', 'replay-1', %s)", [ORG, TASK, T0]
    ).fetchone()


def prep_claim(conn: psycopg.Connection) -> dict:
    make_org(conn)
    inv = admit(conn, 10)
    conn.execute(
        "SELECT llm.settle_invocation(%s, %s, 100::bigint, 0::bigint, p_now => %s)", [ORG, inv, T0]
    )
    rows = conn.execute(
        "SELECT id FROM llm.threshold_notices ORDER BY crossed_at, organization_id, id"
    ).fetchall()
    assert len(rows) == 3
    return {"notices": [r[0] for r in rows]}


def lock_last_notice(b: psycopg.Connection, ctx: dict) -> None:
    b.execute(
        "SELECT FROM llm.threshold_notices WHERE organization_id = %s AND id = %s FOR UPDATE",
        [ORG, ctx["notices"][-1]],
    )


def call_claim(a: psycopg.Connection, ctx: dict) -> Any:
    return a.execute("SELECT * FROM llm.claim_notices(10, %s)", [T0]).fetchall()


def prep_rebuild(conn: psycopg.Connection) -> dict:
    make_org(conn, allowance=None)
    for day in range(3):
        at = T0 + timedelta(days=day)
        inv = admit(conn, 3, at=at)
        conn.execute("SELECT llm.settle_invocation(%s, %s, 3::bigint, 1::bigint, p_now => %s)", [ORG, inv, at])
    conn.execute("SELECT llm.rebuild_daily_usage(%s, %s)", [T0.date(), T0.date() + timedelta(days=2)])
    # a later measurement changes the last day, so a rebuild has work to do
    inv = admit(conn, 3, at=T0 + timedelta(days=2))
    conn.execute(
        "SELECT llm.settle_invocation(%s, %s, 3::bigint, 1::bigint, p_now => %s)",
        [ORG, inv, T0 + timedelta(days=2)],
    )
    return {}


def lock_last_day(b: psycopg.Connection, ctx: dict) -> None:
    b.execute(
        "SELECT FROM llm.daily_usage WHERE organization_id = %s AND day = %s FOR UPDATE",
        [ORG, T0.date() + timedelta(days=2)],
    )


def call_rebuild(a: psycopg.Connection, ctx: dict) -> Any:
    return a.execute(
        "SELECT llm.rebuild_daily_usage(%s, %s)", [T0.date(), T0.date() + timedelta(days=2)]
    ).fetchone()


CASES = [
    Case(
        "admit_invocation: invocation written, waiting for its stripe of the period",
        prep_admit, lock_period(), call_admit, ("invocations",),
        lambda ctx: [
            Probe("A must have inserted the invocation (uncommitted)",
                  """INSERT INTO llm.invocations (organization_id, id, period_start, model,
                                                  estimate_credits, hold_credits, created_at)
                     VALUES (%s, %s, %s, 'x', 1, 1, %s)""", [ORG, ctx["inv"], PERIOD, T0]),
        ],
    ),
    Case(
        "admit_invocation: the month's first, invocation written, waiting for its organization"
        " (an upsert_organization in flight) to create the period (invariant 9)",
        prep_admit_first_use, lock_organization, call_admit, ("invocations",),
        lambda ctx: [
            Probe("A must have inserted the invocation (uncommitted)",
                  """INSERT INTO llm.invocations (organization_id, id, period_start, model,
                                                  estimate_credits, hold_credits, created_at)
                     VALUES (%s, %s, %s, 'x', 1, 1, %s)""", [ORG, ctx["inv"], PERIOD, T0]),
        ],
    ),
    Case(
        "settle_invocation: settled, waiting for its stripe of the period",
        prep_settle, lock_period(), call_settle, ("invocations",),
        lambda ctx: [invocation_locked(ctx)],
    ),
    Case(
        "settle_invocation: settled, waiting for its task",
        lambda c: prep_settle(c, with_task=True), lock_execution, call_settle, ("invocations",),
        lambda ctx: [invocation_locked(ctx)],
    ),
    Case(
        "settle_invocation: everything but the second threshold notice written",
        lambda c: prep_settle(c, with_task=True), insert_notice(80), call_settle,
        ("invocations", "executions", "period_stripes", "threshold_notices"),
        lambda ctx: [
            invocation_locked(ctx),
            row_locked("executions", "organization_id = %s AND id = %s", ORG, ctx["execution"]),
            row_locked("period_stripes", "organization_id = %s AND period_start = %s", ORG, PERIOD),
            notice_row(50),
        ],
    ),
    Case(
        "fail_invocation: failed, waiting for its stripe of the period",
        prep_settle, lock_period(), call_fail, ("invocations",),
        lambda ctx: [invocation_locked(ctx)],
    ),
    Case(
        "fail_invocation: failed, waiting for its task",
        lambda c: prep_settle(c, with_task=True), lock_execution, call_fail, ("invocations",),
        lambda ctx: [invocation_locked(ctx)],
    ),
    Case(
        "reconcile_org: task abandoned and requests recovered, waiting for the period",
        prep_reconcile, lock_period(), call_reconcile, ("executions", "invocations"),
        lambda ctx: [
            row_locked("executions", "organization_id = %s AND id = %s", ORG, ctx["stale_task"]),
            invocation_locked(ctx), invocation_locked(ctx, "inv2"),
        ],
    ),
    Case(
        "reconcile_org: recovery, period movement and notices written, waiting on the drift finding",
        lambda c: prep_reconcile(c, drift=True), lock_drift_finding, call_reconcile,
        ("executions", "invocations", "period_stripes", "threshold_notices"),
        lambda ctx: [
            row_locked("executions", "organization_id = %s AND id = %s", ORG, ctx["stale_task"]),
            invocation_locked(ctx),
            row_locked("period_stripes", "organization_id = %s AND period_start = %s", ORG, PERIOD),
            notice_row(80),
        ],
    ),
    Case(
        "upsert_organization: organization updated, waiting to apply the allowance to the period",
        prep_admit, lock_period(), call_upsert, ("organizations",),
        lambda ctx: [row_locked("organizations", "id = %s", ORG)],
    ),
    Case(
        "open_execution: task row written, waiting in its foreign-key check",
        lambda c: (make_org(c), {})[1], lock_organization, call_open, ("executions",),
        lambda ctx: [
            Probe("A must have inserted the task with its replay key (uncommitted)",
                  """INSERT INTO llm.executions (organization_id, id, task_key, replay_key, started_at)
                     VALUES (%s, gen_random_uuid(), %s, 'replay-1', %s)""", [ORG, TASK, T0]),
        ],
    ),
    Case(
        "claim_notices: first notices claimed, waiting on the last",
        prep_claim, lock_last_notice, call_claim, ("threshold_notices",),
        lambda ctx: [row_locked("threshold_notices", "organization_id = %s AND id = %s", ORG, ctx["notices"][0])],
    ),
    Case(
        "rebuild_daily_usage: rows deleted, waiting on a locked day",
        prep_rebuild, lock_last_day, call_rebuild, ("daily_usage",),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name.split(":")[0] + "-" + str(i) for i, c in enumerate(CASES)])
def test_a_call_terminated_between_its_writes_leaves_nothing(llm_conn, llm_connect, case):
    ctx = run_interrupted(llm_conn, llm_connect, case)
    # the worker retries the same call; it completes once and the books stay right
    retry = llm_connect()
    case.call(retry, ctx)
    assert invariant_violations(llm_conn) == []


def test_settlement_retried_after_a_kill_charges_once(llm_conn, llm_connect):
    """WF-PFM-LLM-004: a settlement killed before its period movement is not half-done;
    retried, it is charged exactly once."""
    case = CASES[2]
    ctx = run_interrupted(llm_conn, llm_connect, case)
    retry = llm_connect()
    assert case.call(retry, ctx) == ("settled",)
    assert case.call(retry, ctx) == ("already_settled",)
    used, held = llm_conn.execute(
        "SELECT used_credits, held_credits FROM llm.periods WHERE organization_id = %s", [ORG]
    ).fetchone()
    assert (used, held) == (90, 5)
    (charges,) = llm_conn.execute(
        "SELECT count(*) FROM llm.ledger WHERE invocation_id = %s AND entry = 'charge'", [ctx["inv"]]
    ).fetchone()
    assert charges == 1


# ---------------------------------------------------------------- the pass


def test_run_reconciliation_killed_mid_pass_keeps_each_organization_whole(llm_conn, llm_connect):
    """The pass commits per organization: killed while sweeping the second one,
    the first stays swept, the second is untouched, the run row stays running and
    the next pass marks it failed and completes the books (WF-PFM-LLM-004)."""

    def prepare(conn: psycopg.Connection) -> dict:
        ctx: dict[str, Any] = {}
        for org in (ORG, ORG2):  # the pass visits organizations in id order: ORG first
            make_org(conn, org)
            ctx[org] = [admit(conn, 20, org=org), admit(conn, 30, org=org, dispatch=False)]
        ctx["org1_before"] = fingerprint(conn, ORG)
        return ctx

    def call(a: psycopg.Connection, ctx: dict) -> Any:
        a.execute("CALL llm.run_reconciliation(p_now => %s)", [LATER])

    case = Case(
        "run_reconciliation", prepare, lock_period(ORG2), call, ("invocations",),
        lambda ctx: [invocation_locked({"inv": ctx[ORG2][0]}, org=ORG2)],
        scope=ORG2,
    )
    ctx = run_interrupted(llm_conn, llm_connect, case)

    # the first organization's sweep committed before the kill
    assert changed_tables(ctx["org1_before"], fingerprint(llm_conn, ORG)) != []
    statuses = llm_conn.execute(
        "SELECT organization_id, status, settlement_kind FROM llm.invocations ORDER BY organization_id, status"
    ).fetchall()
    assert statuses == [(ORG, "settled", "recovered")] * 2 + [(ORG2, "dispatched", None), (ORG2, "reserved", None)]
    runs = llm_conn.execute("SELECT status, orgs_visited, requests_recovered FROM llm.reconciliation_runs").fetchall()
    assert runs == [("running", 1, 2)]

    # the next pass marks the dead one failed and finishes the work
    llm_conn.execute("CALL llm.run_reconciliation(p_now => %s)", [LATER + timedelta(hours=1)])
    runs = llm_conn.execute(
        "SELECT status, errors::text LIKE '%abandoned%' FROM llm.reconciliation_runs ORDER BY started_at"
    ).fetchall()
    assert runs == [("failed", True), ("succeeded", False)]
    (open_requests,) = llm_conn.execute(
        "SELECT count(*) FROM llm.invocations WHERE status IN ('reserved', 'dispatched')"
    ).fetchone()
    assert open_requests == 0
    assert invariant_violations(llm_conn) == []

