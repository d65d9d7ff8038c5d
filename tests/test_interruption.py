"""Interruption: a call killed between two of its writes leaves nothing behind.

docs/architecture.md "Architecture": "Every state change is one PL/pgSQL call in one transaction:
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

The price book: a settlement priced from usage and a repricing applied, each killed
between its budget counters (the request, its task, its stripe and the first counter
moved with their cost), leave nothing either, and retried, every cost sum equals its
requests and corrections (invariant 20).

Budgets: an admission and a settlement under two budgets killed
between their counters (the first counter written, waiting for the second), and
set_budget killed waiting for the counter it governs, leave nothing behind
either; retried, the counters equal their requests (invariant 14).

WF-PFM-LLM-004 asks for "interruption proof around each separate write" and
names the gap this closes: "a request settled before its failed period
movement will not be selected again".
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

import psycopg
import pytest
from fingerprint import changed_tables, fingerprint

from tests import helpers
from tests.helpers import (
    T0,
    call,
    call_pass,
    invariants,
    reconcile,
    sessions_on_stripes,
    settle,
    wait_for,
)

ORG = uuid.UUID("00000000-0000-4000-8000-0000000000a1")
ORG2 = uuid.UUID("00000000-0000-4000-8000-0000000000a2")
PERIOD = T0.date().replace(day=1)
LATER = T0 + timedelta(hours=25)  # past the 24 h recovery window
TASK = "reliability.interrupt"
MODEL = "model-i"


# ---------------------------------------------------------------- setup helpers


def make_org(conn: psycopg.Connection, org: uuid.UUID = ORG, allowance: int | None = 100) -> None:
    helpers.new_org(conn, allowance, org_id=org, thresholds=[50, 80, 100], now=T0 - timedelta(days=40))
    helpers.declare_task(conn, TASK, "interruption tests")


def admit(
    conn: psycopg.Connection,
    credits: int,
    *,
    org: uuid.UUID = ORG,
    execution: uuid.UUID | None = None,
    at: datetime = T0,
    dispatch: bool = True,
) -> uuid.UUID:
    inv = helpers.admit(conn, org, credits, MODEL, execution_id=execution, now=at)["id"]
    if dispatch:
        helpers.dispatch(conn, org, inv, now=at)
    return inv


def open_task(
    conn: psycopg.Connection, *, org: uuid.UUID = ORG, at: datetime = T0, replay: str | None = None
) -> uuid.UUID:
    return call(conn, "open_execution", org, TASK, replay_key=replay, now=at)[0]["execution_id"]


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
    assert invariants(llm_conn) == [], "the prepared books must be right"
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
    assert invariants(llm_conn) == []
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
                       allowance_credits, next_attempt_at, window_start, limit_credits)
               VALUES (%s, %s, %s, %s, 0, 100, %s, %s, 100)""",
            [ORG, PERIOD, threshold, T0, T0, PERIOD],
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
                   allowance_credits, next_attempt_at, window_start, limit_credits)
           VALUES (%s, %s, %s, %s, 0, 100, %s, %s, 100)""",
        [ORG, PERIOD, threshold, T0, T0, PERIOD],
    )


def invocation_inserted(ctx: dict) -> Probe:
    return Probe(
        "A must have inserted the invocation (uncommitted)",
        """INSERT INTO llm.invocations (organization_id, id, period_start, model,
                                        estimate_credits, hold_credits, created_at)
           VALUES (%s, %s, %s, 'x', 1, 1, %s)""",
        [ORG, ctx["inv"], PERIOD, T0],
    )


def invocation_locked(ctx: dict, name: str = "inv", org: uuid.UUID = ORG) -> Probe:
    return row_locked("invocations", "organization_id = %s AND id = %s", org, ctx[name])


# ---------------------------------------------------------------- the cases


def prep_admit(conn: psycopg.Connection) -> dict:
    make_org(conn)
    admit(conn, 10)  # the period row exists
    return {"inv": uuid.uuid4()}


def call_admit(a: psycopg.Connection, ctx: dict) -> Any:
    return helpers.admit(a, ORG, 40, MODEL, invocation_id=ctx["inv"], now=T0)


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
    return settle(a, ORG, ctx["inv"], 90, 12, input_tokens=1000, output_tokens=200,
                  now=T0 + timedelta(minutes=1))


def call_fail(a: psycopg.Connection, ctx: dict) -> Any:
    return helpers.fail(a, ORG, ctx["inv"], "provider timeout", 85, 3, now=T0 + timedelta(minutes=1))


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
        settle(conn, ORG, inv, 1, 1, now=T0 + timedelta(hours=2))
        helpers.close_task(conn, ORG, closed, now=T0 + timedelta(hours=3))
        conn.execute(
            "UPDATE llm.executions SET credits = credits + 7 WHERE organization_id = %s AND id = %s",
            [ORG, closed],
        )
        reconcile(conn, ORG, now=T0 + timedelta(hours=4))
        assert conn.execute("SELECT count(*) FROM llm.drift_findings").fetchone() == (1,)
        ctx["drifting"] = closed
    return ctx


def call_reconcile(a: psycopg.Connection, ctx: dict) -> Any:
    return reconcile(a, ORG, now=LATER)


def lock_drift_finding(b: psycopg.Connection, ctx: dict) -> None:
    b.execute(
        "SELECT FROM llm.drift_findings WHERE organization_id = %s AND execution_id = %s FOR UPDATE",
        [ORG, ctx["drifting"]],
    )


def call_upsert(a: psycopg.Connection, ctx: dict) -> Any:
    # a changed allowance applies to the current period: organization row, then period row
    return call(a, "upsert_organization", ORG, "renamed", 500, notice_thresholds=[50, 80, 100], now=T0)


def call_open(a: psycopg.Connection, ctx: dict) -> Any:
    return call(a, "open_execution", ORG, TASK, subject_type="invoice", subject_id="42",
                replay_key="replay-1", now=T0)


def prep_claim(conn: psycopg.Connection) -> dict:
    make_org(conn)
    inv = admit(conn, 10)
    settle(conn, ORG, inv, 100, 0, now=T0)
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
    return call(a, "claim_notices", limit=10, now=T0)


def prep_rebuild(conn: psycopg.Connection) -> dict:
    make_org(conn, allowance=None)
    for day in range(3):
        at = T0 + timedelta(days=day)
        inv = admit(conn, 3, at=at)
        settle(conn, ORG, inv, 3, 1, now=at)
    call_rebuild(conn, {})
    # a later measurement changes the last day, so a rebuild has work to do
    inv = admit(conn, 3, at=T0 + timedelta(days=2))
    settle(conn, ORG, inv, 3, 1, now=T0 + timedelta(days=2))
    return {}


def lock_last_day(b: psycopg.Connection, ctx: dict) -> None:
    b.execute(
        "SELECT FROM llm.daily_usage WHERE organization_id = %s AND day = %s FOR UPDATE",
        [ORG, T0.date() + timedelta(days=2)],
    )


def call_rebuild(a: psycopg.Connection, ctx: dict) -> Any:
    return call(a, "rebuild_daily_usage", T0.date(), T0.date() + timedelta(days=2))


# ---------------------------------------------------------------- budgets

SCOPE = {"api_key": "key-1", "end_user": "user-1"}  # two budgets: bits 6 (api_key day), 9 (end_user day)


def prep_budgets(conn: psycopg.Connection) -> dict:
    """Day budgets on an API key and an end user, and a settled request under both, so
    both counters exist; a second request (30) under both is open."""
    make_org(conn)
    for scope, scope_id in SCOPE.items():
        helpers.set_budget(conn, ORG, scope, scope_id, "day", 100, now=T0)
    helpers.settle(conn, ORG, helpers.admit(conn, ORG, 5, MODEL, now=T0, **SCOPE)["id"], 5, now=T0)
    inv = helpers.admit(conn, ORG, 30, MODEL, now=T0, **SCOPE)["id"]
    return {"inv": inv, "new": uuid.uuid4()}


def call_admit_under_budgets(a: psycopg.Connection, ctx: dict) -> Any:
    return helpers.admit(a, ORG, 20, MODEL, invocation_id=ctx["new"], now=T0, **SCOPE)


def call_settle_under_budgets(a: psycopg.Connection, ctx: dict) -> Any:
    # 5 + 80 used of the end user's 100: crosses its 80% threshold
    return settle(a, ORG, ctx["inv"], 80, 3, now=T0 + timedelta(minutes=1))


def call_lower_budget(a: psycopg.Connection, ctx: dict) -> Any:
    # lowered below what the counter holds: owes its thresholds at once (after the lock)
    return helpers.set_budget(a, ORG, "end_user", "user-1", "day", 10, now=T0 + timedelta(minutes=1))


def lock_end_user_counter(b: psycopg.Connection, ctx: dict) -> None:
    # NO KEY UPDATE: conflicts with A's update of the counter (and set_budget's FOR UPDATE)
    b.execute("SELECT FROM llm.budget_counters WHERE organization_id = %s AND scope = 'end_user'"
              " FOR NO KEY UPDATE", [ORG])  # fmt: skip


def api_key_counter_locked(ctx: dict) -> Probe:
    return row_locked("budget_counters", "organization_id = %s AND scope = 'api_key'", ORG)


BUDGET_CASES = [
    Case(
        "admit_invocation under two budgets: invocation, stripe and the API key's counter written,"
        " waiting for the end user's counter (invariant 14)",
        prep_budgets, lock_end_user_counter, call_admit_under_budgets,
        ("invocations", "period_stripes", "budget_counters"),
        lambda ctx: [Probe("A must have inserted the invocation (uncommitted)",
                           "INSERT INTO llm.invocations (organization_id, id, period_start, model, estimate_credits,"
                           " hold_credits, created_at) VALUES (%s, %s, %s, 'x', 1, 1, %s)",
                           [ORG, ctx["new"], PERIOD, T0]),
                     api_key_counter_locked(ctx)],
    ),
    Case(
        "settle_invocation under two budgets: settled, period and the API key's counter moved,"
        " waiting for the end user's counter (invariant 14)",
        prep_budgets, lock_end_user_counter, call_settle_under_budgets,
        ("invocations", "period_stripes", "budget_counters"),
        lambda ctx: [invocation_locked(ctx), api_key_counter_locked(ctx)],
    ),
    Case(
        "set_budget: budget replaced, waiting for the counter it governs",
        prep_budgets, lock_end_user_counter, call_lower_budget, ("budget_limits",),
        lambda ctx: [row_locked("budget_limits", "organization_id = %s AND scope = 'end_user'", ORG)],
    ),
]


# The price book: a settlement priced from usage, and a repricing applied, each
# killed with its request, task, stripe and first budget counter written (their cost sums
# among them), waiting for the second counter.
PRICED = "model-priced"


def prep_priced(conn: psycopg.Connection) -> dict:
    """A price of $3 and $15 a million tokens, a credit a micro-dollar; day budgets on an
    API key and an end user; in a task, one request settled with its usage (both counters
    exist) and one open."""
    make_org(conn, allowance=10**9)
    call(conn, "set_price", PRICED, {"input": "3", "output": "15"}, effective_from=T0 - timedelta(days=9))
    call(conn, "set_credit_rate", 1000, effective_from=T0 - timedelta(days=9))
    for scope, scope_id in SCOPE.items():
        helpers.set_budget(conn, ORG, scope, scope_id, "day", 10**9, now=T0)
    ctx: dict[str, Any] = {"execution": open_task(conn)}

    def priced(at: datetime) -> uuid.UUID:
        return call(conn, "admit", ORG, None, PRICED, execution_id=ctx["execution"], input_tokens=1000,
                    max_output_tokens=200, now=at, **SCOPE)[0]["id"]

    ctx["settled"] = priced(T0)
    call(conn, "settle_usage", ORG, ctx["settled"], {"input": 1000, "output": 200}, now=T0)
    ctx["inv"] = priced(T0 + timedelta(seconds=1))
    return ctx


def call_settle_usage(a: psycopg.Connection, ctx: dict) -> Any:
    return call(a, "settle_usage", ORG, ctx["inv"], {"input": 900, "output": 100}, now=T0 + timedelta(minutes=1))


def prep_reprice(conn: psycopg.Connection) -> dict:
    """As prep_priced, both requests settled, and a corrected price published late."""
    ctx = prep_priced(conn)
    call_settle_usage(conn, ctx)
    ctx["version"] = call(conn, "set_price", PRICED, {"input": "2.5", "output": "12"},
                          effective_from=T0 - timedelta(days=8))[0]["value"]
    return ctx


def call_reprice(a: psycopg.Connection, ctx: dict) -> Any:
    return call(a, "reprice", PRICED, T0 - timedelta(days=1), T0 + timedelta(days=1), ctx["version"], apply=True)


PRICE_CASES = [
    Case(
        "settle_usage under two budgets: priced and settled, task, stripe and the API key's counter"
        " moved with their cost, waiting for the end user's counter (invariant 20)",
        prep_priced, lock_end_user_counter, call_settle_usage,
        ("invocations", "executions", "period_stripes", "budget_counters"),
        lambda ctx: [invocation_locked(ctx), api_key_counter_locked(ctx),
                     row_locked("executions", "organization_id = %s AND id = %s", ORG, ctx["execution"])],
    ),
    Case(
        "reprice: corrections written, task, stripe and the API key's counter moved, waiting for the"
        " end user's counter (invariant 20)",
        prep_reprice, lock_end_user_counter, call_reprice,
        ("cost_corrections", "executions", "period_stripes", "budget_counters"),
        lambda ctx: [invocation_locked(ctx), invocation_locked(ctx, "settled"), api_key_counter_locked(ctx),
                     row_locked("executions", "organization_id = %s AND id = %s", ORG, ctx["execution"])],
    ),
]


def request_written_then_waiting(routine: str, done: str, call: Callable) -> list[Case]:
    """The request's row written (``done``), then waiting for its stripe of the period; and,
    for a request of a task, waiting for its task."""
    return [
        Case(f"{routine}: {done}, waiting for its stripe of the period",
             prep_settle, lock_period(), call, ("invocations",), lambda ctx: [invocation_locked(ctx)]),
        Case(f"{routine}: {done}, waiting for its task",
             lambda c: prep_settle(c, with_task=True), lock_execution, call, ("invocations",),
             lambda ctx: [invocation_locked(ctx)]),
    ]


CASES = [
    Case(
        "admit_invocation: invocation written, waiting for its stripe of the period",
        prep_admit, lock_period(), call_admit, ("invocations",),
        lambda ctx: [invocation_inserted(ctx)],
    ),
    Case(
        "admit_invocation: the month's first, invocation written, waiting for its organization"
        " (an upsert_organization in flight) to create the period (invariant 9)",
        prep_admit_first_use, lock_organization, call_admit, ("invocations",),
        lambda ctx: [invocation_inserted(ctx)],
    ),
    *request_written_then_waiting("settle_invocation", "settled", call_settle),
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
    *request_written_then_waiting("fail_invocation", "failed", call_fail),
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


CASES += BUDGET_CASES + PRICE_CASES


@pytest.mark.parametrize("case", CASES, ids=[c.name.split(":")[0] + "-" + str(i) for i, c in enumerate(CASES)])
def test_a_call_terminated_between_its_writes_leaves_nothing(llm_conn, llm_connect, case):
    ctx = run_interrupted(llm_conn, llm_connect, case)
    # the worker retries the same call; it completes once and the books stay right
    retry = llm_connect()
    case.call(retry, ctx)
    assert invariants(llm_conn) == []


def test_settlement_retried_after_a_kill_charges_once(llm_conn, llm_connect):
    """WF-PFM-LLM-004: a settlement killed before its period movement is not half-done;
    retried, it is charged exactly once."""
    case = CASES[2]
    ctx = run_interrupted(llm_conn, llm_connect, case)
    retry = llm_connect()
    assert case.call(retry, ctx) == "settled"
    assert case.call(retry, ctx) == "already_settled"
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

    case = Case(
        "run_reconciliation", prepare, lock_period(ORG2), lambda a, ctx: call_pass(a, LATER), ("invocations",),
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
    call_pass(llm_conn, LATER + timedelta(hours=1))
    runs = llm_conn.execute(
        "SELECT status, errors::text LIKE '%abandoned%' FROM llm.reconciliation_runs ORDER BY started_at"
    ).fetchall()
    assert runs == [("failed", True), ("succeeded", False)]
    (open_requests,) = llm_conn.execute(
        "SELECT count(*) FROM llm.invocations WHERE status IN ('reserved', 'dispatched')"
    ).fetchone()
    assert open_requests == 0
    assert invariants(llm_conn) == []


# ---------------------------------------------------------------- the rebalance


def test_an_admission_killed_in_its_rebalance_leaves_nothing_behind(llm_conn, llm_connect):
    """A striped organization (4 stripes) whose admitting session's stripe lacks room
    for the estimate: admission writes its request, then takes the exact path (every
    stripe locked in order, stripe 0 first, the rooms spread again). B holds stripe 0,
    so A waits there with its request written; A is terminated mid-rebalance. Nothing
    stays behind, the books are right, and the retried admission (same id) places
    its one hold."""
    make_org(llm_conn, allowance=1000)
    settle(llm_conn, ORG, admit(llm_conn, 10), 10)
    call(llm_conn, "set_period_stripes", ORG, 4)
    # a session whose stripe (pid % 4) does not exist yet takes the exact path: the four
    # stripes are made and their rooms spread (on stripe 0 its admission could fit there)
    (spreader,) = sessions_on_stripes(llm_connect, 4, [1])
    settle(spreader, ORG, admit(spreader, 10), 10)
    rooms = llm_conn.execute(
        "SELECT stripe, admit_room FROM llm.period_stripes WHERE organization_id = %s ORDER BY stripe",
        [ORG],
    ).fetchall()
    assert [s for s, _ in rooms] == [0, 1, 2, 3]
    estimate = max(room for _, room in rooms) + 1  # fits the period, no one stripe's room
    assert estimate <= 1000 - 20

    # A must run on a stripe other than 0, so that it reaches the rebalance before it
    # meets B's lock (on stripe 0 its fast path would wait there first).
    (victim_conn,) = sessions_on_stripes(llm_connect, 4, [1])
    victim_conn.execute("SET lock_timeout = '60s'")
    victim_pid = victim_conn.info.backend_pid
    assert invariants(llm_conn) == []
    before = fingerprint(llm_conn)

    blocker = llm_connect(autocommit=False)
    blocker.execute(
        "SELECT FROM llm.period_stripes WHERE organization_id = %s AND stripe = 0 FOR NO KEY UPDATE",
        [ORG],
    )
    inv = uuid.uuid4()
    victim = Victim(victim_conn, lambda: helpers.admit(victim_conn, ORG, estimate, MODEL, invocation_id=inv))
    victim.start()
    try:
        wait_for(
            lambda: (w := lock_wait(llm_conn, victim_pid))[0] == "Lock" and blocker.info.backend_pid in w[2],
            "A to wait on B's stripe 0 in its rebalance",
        )
        assert "invocations" in tables_written(llm_conn, victim_pid), "A had not written its request"
        (terminated,) = llm_conn.execute("SELECT pg_terminate_backend(%s)", [victim_pid]).fetchone()
        assert terminated
        victim.join(10)
        assert isinstance(victim.error, psycopg.OperationalError), victim.error
    finally:
        blocker.rollback()
        if victim.is_alive():
            llm_conn.execute("SELECT pg_terminate_backend(%s)", [victim_pid])
            victim.join(10)

    assert changed_tables(before, fingerprint(llm_conn)) == []
    assert invariants(llm_conn) == []
    held = helpers.period(llm_conn, ORG, PERIOD)["held_credits"]
    assert helpers.admit(llm_conn, ORG, estimate, MODEL, invocation_id=inv)["id"] == inv
    assert helpers.period(llm_conn, ORG, PERIOD)["held_credits"] == held + estimate
    assert invariants(llm_conn) == []
