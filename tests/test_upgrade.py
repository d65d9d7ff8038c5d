"""Upgrades lose nothing: a database installed and used with release 0.1.0 (the
``migrations/`` and ``sql/`` of commit fd1a650, kept in
``tests/upgrade/llm-db-0.1.0-fd1a650.tar.gz``) is populated through that release's own
functions, then migrated to this checkout. Every row survives unchanged, the invariants
hold, and every public routine works on the upgraded books.
"""

from __future__ import annotations

import tarfile
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from llm_db import migrate
from tests.helpers import (
    FEBRUARY,
    HOUR,
    T0,
    budget_usage,
    call,
    call_pass,
    invariants,
    llm_tables,
    row,
    rows,
    scalar,
    set_budget,
    settle,
)

ROOT = Path(__file__).resolve().parents[1]
RELEASE_0_1_0 = ROOT / "tests" / "upgrade" / "llm-db-0.1.0-fd1a650.tar.gz"

# The 0.1.0 data set is written on these clocks, before T0: December is a closed month by then.
JAN = T0 - timedelta(days=5)
DEC = JAN - timedelta(days=31)
TASK = "upgrade.summary"


@pytest.fixture(scope="module")
def release_0_1_0(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(migrations_dir, sql_dir) of release 0.1.0."""
    target = tmp_path_factory.mktemp("llm-db-0.1.0")
    with tarfile.open(RELEASE_0_1_0) as archive:
        archive.extractall(target, filter="data")
    return target / "migrations", target / "sql"


@pytest.fixture
def old_database(llm_server, llm_owner, release_0_1_0):
    """A fresh database with release 0.1.0 installed by the non-superuser owner, who owns
    the database and runs every migrate here; dropped afterwards."""
    name = f"u_{uuid.uuid4().hex}"
    dsn = llm_server.create_database(
        name, settings={"lock_timeout": "5s", "statement_timeout": "60s"}, owner=llm_owner
    )
    migrate(dsn, migrations_dir=release_0_1_0[0], sql_dir=release_0_1_0[1])
    try:
        yield dsn
    finally:
        llm_server.drop_database(name)


# ---------------------------------------------------------------- 0.1.0 in use


class Release010:
    """Calls of the 0.1.0 SQL API, by name, on one autocommit connection: raw SQL on purpose,
    the 0.1.0 signatures are not the driver's (its table is HEAD's)."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    def one(self, query: str, params: Any = None) -> Any:
        return self.conn.execute(query, params).fetchone()[0]

    def org(self, allowance: int | None, *, now: datetime = DEC) -> uuid.UUID:
        org = uuid.uuid4()
        self.conn.execute("SELECT llm.upsert_organization(%s, %s, %s, p_now => %s)",
                          [org, f"org {org.hex[:6]}", allowance, now])  # fmt: skip
        return org

    def admit(self, org, estimate, *, task=None, now=DEC) -> uuid.UUID:
        inv = self.one("SELECT (llm.admit_invocation(%s, %s, 'gpt-x', %s, p_now => %s)).id",
                       [org, estimate, task, now])  # fmt: skip
        self.one("SELECT (llm.mark_dispatched(%s, %s, p_now => %s)).id", [org, inv, now])
        return inv

    def settle(self, org, inv, credits, cents, *, now=DEC) -> str:
        return self.one("SELECT llm.settle_invocation(%s, %s, %s, %s, 100, 20, p_now => %s)",
                        [org, inv, credits, cents, now])  # fmt: skip

    def fail(self, org, inv, credits, *, now=DEC) -> str:
        return self.one("SELECT llm.fail_invocation(%s, %s, 'provider 500', %s, 0, p_now => %s)",
                        [org, inv, credits, now])  # fmt: skip

    def task(self, org, *, replay_key=None, now=DEC) -> uuid.UUID:
        return self.one("SELECT execution_id FROM llm.open_execution(%s, %s, p_replay_key => %s, p_now => %s)",
                        [org, TASK, replay_key, now])  # fmt: skip

    def close(self, org, task, outcome, *, now=DEC) -> None:
        assert self.one("SELECT llm.close_execution(%s, %s, %s, p_now => %s)", [org, task, outcome, now])

    def run_pass(self, now: datetime) -> None:
        self.conn.execute("CALL llm.run_reconciliation(p_now => %s)", [now])


def populate(conn: psycopg.Connection, connect) -> dict[str, uuid.UUID]:
    """Books as 0.1.0 leaves them after two months of use: organizations (limited,
    unlimited, suspended), a closed and a current period, requests settled, failed, open and
    recovered (one with a late settlement kept for audit), tasks in every state, owed /
    sending / sent notices, drift findings, daily usage, and succeeded, partial, failed and
    skipped runs. All through the 0.1.0 API (raw SQL, see Release010)."""
    api = Release010(conn)
    conn.execute("SELECT llm.declare_task_kind(%s, 'summaries')", [TASK])
    small, unlimited, paused = api.org(1000), api.org(None), api.org(500)

    # December (closed by January): settled and failed work, a completed and a failed task
    done = api.task(small, replay_key="dec-1")
    for credits in (300, 250):
        api.settle(small, api.admit(small, 400, task=done), credits, 9)
    api.close(small, done, "completed", now=DEC + HOUR)
    broken = api.task(unlimited)
    api.fail(unlimited, api.admit(unlimited, 50, task=broken), 5)
    api.close(unlimited, broken, "failed", now=DEC + HOUR)
    api.settle(paused, api.admit(paused, 100), 90, 3)

    # January: 80 % then 100 % of the small allowance crossed (notices), open requests,
    # a stranded request and a stale task for recovery, a running task
    api.settle(small, api.admit(small, 850, now=JAN), 820, 20, now=JAN)
    api.admit(small, 100, now=JAN + 30 * HOUR)  # open, inside the window at the last pass
    stranded = api.admit(unlimited, 70, now=JAN)
    stale = api.task(unlimited, now=JAN)
    api.admit(unlimited, 40, task=stale, now=JAN)  # stranded inside the stale task
    running = api.task(small, replay_key="jan-live", now=JAN + 30 * HOUR)
    api.settle(small, api.admit(small, 60, task=running, now=JAN + 30 * HOUR), 190, 4,
               now=JAN + 30 * HOUR)  # fmt: skip  (measured overage: 100 % crossed)
    tiny = api.org(100, now=JAN)
    api.settle(tiny, api.admit(tiny, 85, now=JAN + 2 * HOUR), 85, 2, now=JAN + 2 * HOUR)
    drifting = api.task(unlimited, now=JAN)
    api.settle(unlimited, api.admit(unlimited, 20, task=drifting, now=JAN), 15, 1, now=JAN)
    api.close(unlimited, drifting, "completed", now=JAN + HOUR)
    conn.execute("SELECT llm.upsert_organization(%s, 'paused', 500, 'suspended', p_now => %s)",
                 [paused, JAN])  # fmt: skip

    # a pass left running by a killed backend, then real passes
    doomed = connect()
    doomed.execute("SELECT llm._begin_run(%s)", [JAN])
    conn.execute("SELECT pg_terminate_backend(%s, 5000)", [doomed.info.backend_pid])
    api.run_pass(JAN + 25 * HOUR)  # recovers the stranded requests, abandons the stale task
    assert api.settle(unlimited, stranded, 65, 2, now=JAN + 26 * HOUR) == "already_recovered"

    # drift on the December task, found by the next pass; a notice claimed and one sent
    conn.execute("UPDATE llm.executions SET credits = credits + 5 WHERE id = %s", [drifting])
    claimed = rows(conn, "SELECT * FROM llm.claim_notices(1, %s)", [JAN + 26 * HOUR])
    assert len(claimed) == 1
    conn.execute("SELECT llm.complete_notice(%s, %s, %s)",
                 [claimed[0]["organization_id"], claimed[0]["id"], JAN + 26 * HOUR])  # fmt: skip
    api.run_pass(JAN + 27 * HOUR)
    blocked = connect(autocommit=False)  # a partial pass: one organization's sweep is held
    blocked.execute("SELECT pg_advisory_xact_lock(hashtext('llm.reconcile_org'), hashtext(%s))",
                    [str(small)])  # fmt: skip
    locked_out = connect()
    locked_out.execute("SET lock_timeout = '100ms'")
    holder = connect()
    holder.execute("SELECT pg_advisory_lock(llm._pass_lock_key())")
    api.run_pass(JAN + 28 * HOUR)  # skipped: the 0.1.0 session lock is held
    holder.execute("SELECT pg_advisory_unlock(llm._pass_lock_key())")
    locked_out.execute("CALL llm.run_reconciliation(p_now => %s)", [JAN + 28 * HOUR])
    blocked.rollback()
    rows(conn, "SELECT * FROM llm.claim_notices(1, %s)", [JAN + 29 * HOUR])  # left sending
    return {"small": small, "unlimited": unlimited, "paused": paused, "done": done,
            "running": running, "stale": stale, "stranded": stranded}  # fmt: skip


def table_columns(conn: psycopg.Connection) -> dict[str, list[str]]:
    """Each llm table's columns, in order."""
    return {
        table: [r[0] for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
            " AND NOT attisdropped ORDER BY attnum", [f"llm.{table}"]).fetchall()]  # fmt: skip
        for table in llm_tables(conn)
    }


def table_contents(conn: psycopg.Connection, columns: dict[str, list[str]]) -> dict[str, list[str]]:
    """Each table's rows over the given columns, as text, in a stable order."""
    result = {}
    for table, names in columns.items():
        query = sql.SQL("SELECT ({})::text FROM {} AS t ORDER BY 1").format(
            sql.SQL(", ").join(sql.Identifier("t", c) for c in names),
            sql.Identifier("llm", table),
        )
        result[table] = [r[0] for r in conn.execute(query).fetchall()]
    return result


# ---------------------------------------------------------------- the upgrade


def test_upgrading_a_populated_0_1_0_database_loses_nothing(old_database, llm_server):
    """Populate with 0.1.0, migrate to HEAD: every table of 0.1.0 keeps every row and every
    value of its 0.1.0 columns, the invariants hold, the pass lease starts free, and the
    routines only 0.1.0 had are gone."""
    with psycopg.connect(old_database, autocommit=True) as conn:
        opened: list[psycopg.Connection] = []

        def connect(**kwargs: Any) -> psycopg.Connection:
            opened.append(psycopg.connect(old_database, autocommit=kwargs.get("autocommit", True)))
            return opened[-1]

        ids = populate(conn, connect)
        for c in opened:
            c.close()
        old_columns = table_columns(conn)
        before = table_contents(conn, old_columns)
        # schema 0011 turns a notice being sent (no claim token to end it with) back to
        # owed: those two columns are compared below, the rest of the row here
        sending = rows(conn, "SELECT * FROM llm.threshold_notices WHERE status = 'sending'")
        kept_notice_columns = [c for c in old_columns["threshold_notices"] if c not in ("status", "claimed_at")]
        notices_before = table_contents(conn, {"threshold_notices": kept_notice_columns})
        assert rows(conn, "SELECT * FROM llm.check_invariants()") == []
        statuses = {r[0] for r in conn.execute("SELECT status FROM llm.reconciliation_runs")}
        assert statuses == {"succeeded", "partial", "failed", "skipped"}
        assert {r[0] for r in conn.execute("SELECT status FROM llm.executions")} == {
            "running", "completed", "failed", "abandoned"}  # fmt: skip
        assert {r[0] for r in conn.execute("SELECT status FROM llm.threshold_notices")} == {
            "owed", "sending", "sent"}  # fmt: skip
        assert scalar(conn, "SELECT count(*) FROM llm.drift_findings") == 1
        assert scalar(conn, "SELECT count(*) FROM llm.daily_usage") > 0

    report = migrate(old_database)

    assert report.applied_migrations[:3] == ("0004_pass_lease", "0005_books", "0006_period_index")
    assert "llm._pass_lock_key()" in report.dropped_routines
    # schema 0011: the ends of a claim take its token; the old signatures are gone
    # (0.1.0 had no release_notice)
    assert {"llm.complete_notice(uuid,uuid,timestamp with time zone)",
            "llm.fail_notice(uuid,uuid,text,timestamp with time zone)"} <= set(report.dropped_routines)  # fmt: skip
    with psycopg.connect(old_database, autocommit=True) as conn:
        after = table_contents(conn, old_columns)
        for table in old_columns:
            if table != "threshold_notices":
                assert after[table] == before[table], f"llm.{table} changed in the upgrade"
        assert table_contents(conn, {"threshold_notices": kept_notice_columns}) == notices_before
        assert_sending_notices_are_owed_again(conn, sending)
        # 0016 backfills every older notice as the allowance's
        assert rows(conn, "SELECT scope, scope_id, budget_window, count(*) FROM llm.threshold_notices"
                          " GROUP BY 1, 2, 3") == [  # fmt: skip
            {"scope": "organization", "scope_id": None, "budget_window": "month", "count": len(notices_before["threshold_notices"])}]  # fmt: skip
        assert invariants(conn) == []
        assert row(conn, "SELECT token, run_id FROM llm.pass_lease") == {"token": None, "run_id": None}
        assert scalar(conn, "SELECT to_regprocedure('llm._pass_lock_key()')") is None
        # the price book (0.4.0): every request of before has its caller's cost, cents x 10^7
        assert rows(conn, "SELECT organization_id FROM llm.periods"
                          " WHERE used_cost_nanos <> used_cents::numeric * 10000000") == []  # fmt: skip
        assert rows(conn, "SELECT organization_id FROM llm.budget_usage"
                          " WHERE used_cost_nanos <> used_cents::numeric * 10000000") == []  # fmt: skip
        late = row(conn, "SELECT late_credits, charged_credits FROM llm.invocations WHERE id = %s",
                   [ids["stranded"]])  # fmt: skip
        assert late == {"late_credits": 65, "charged_credits": 70}
        exercise_every_public_routine(conn, ids)
        assert invariants(conn) == []


def assert_sending_notices_are_owed_again(conn: psycopg.Connection, sending: list[dict[str, Any]]) -> None:
    """Invariant 12: schema 0011 gives every notice a claim token while
    it is sent; a notice being sent before the upgrade has none to end its claim with, so
    the upgrade makes it owed again (claim cleared, due as it was, attempts kept) and the
    next claim takes it with a token."""
    assert len(sending) == 1
    upgraded = row(conn, "SELECT * FROM llm.threshold_notices WHERE id = %s", [sending[0]["id"]])
    assert (upgraded["status"], upgraded["claimed_at"], upgraded["claim_token"]) == ("owed", None, None)
    assert (upgraded["attempts"], upgraded["next_attempt_at"]) == (
        sending[0]["attempts"], sending[0]["next_attempt_at"])  # fmt: skip
    assert scalar(conn, "SELECT count(*) FROM llm.threshold_notices WHERE claim_token IS NOT NULL") == 0


# Long on purpose: one table of calls, one for each public routine, checked whole against pg_proc.
def exercise_every_public_routine(conn: psycopg.Connection, ids: dict[str, uuid.UUID]) -> None:
    """Call each public routine of schema llm once on the upgraded books. The table of calls
    is checked against pg_proc, so a new public routine must be added here."""
    small, unlimited, running = ids["small"], ids["unlimited"], ids["running"]
    feb = T0 + timedelta(days=19)  # in February
    state: dict[str, Any] = {}

    def value(operation: str, *args: Any, **kwargs: Any) -> Any:
        return call(conn, operation, *args, **kwargs)[0]["value"]

    def admit() -> None:
        state["inv"] = value("admit_id", small, 30, "gpt-y", execution_id=running, now=feb)

    def sent_notice() -> uuid.UUID:
        return scalar(conn, "SELECT id FROM llm.threshold_notices WHERE status = 'sent' LIMIT 1")

    def expect(sqlstate: str, operation: str) -> None:
        with pytest.raises(psycopg.Error) as raised:
            call(conn, operation)
        assert raised.value.sqlstate == sqlstate

    calls = {  # by routine name: the driver's operation for each
        "upsert_organization": lambda: call(conn, "upsert_organization", small, "small", 2000, now=feb),
        "set_allowance": lambda: call(conn, "set_allowance", small, 2000, now=feb),
        "declare_task_kind": lambda: call(conn, "declare_task_kind", "upgrade.new"),
        # the price book (0.4.0): the requests admitted before it pinned no price
        "set_price": lambda: call(conn, "set_price", "gpt-y", {"input": "1.5", "output": 6}, effective_from=DEC),
        "set_credit_rate": lambda: call(conn, "set_credit_rate", 1000, effective_from=DEC),
        "price_usage": lambda: call(conn, "price_usage", "gpt-y", {"input": 10}, organization_id=small, at=feb),
        "set_recovery_policy": lambda: call(conn, "set_recovery_policy", unlimited, "dispatched", "true_up"),
        "set_period_stripes": lambda: call(conn, "set_period_stripes", small, 4),
        "admit_invocation": admit,
        "set_budget": lambda: budgets_work(conn, unlimited, feb),
        "set_budget_stripes": lambda: call(conn, "set_budget_stripes", unlimited, "end_user", "*", "day", 4, now=feb),
        "note_refusal": lambda: call(conn, "note_refusal", small, "organization", None, "month",
                                     feb.date().replace(day=1), now=feb),
        "mark_dispatched": lambda: call(conn, "mark_dispatched", small, state["inv"], now=feb),
        "settle_invocation": lambda: settle(conn, small, state["inv"], 25, 1, now=feb),
        "settle_usage": lambda: call(conn, "settle_usage", small,
                                     value("admit_id", small, None, "gpt-y", input_tokens=100, max_output_tokens=10,
                                           now=feb),
                                     {"input": 90, "output": 4}, now=feb),
        # a corrected price, applied: the request settled above costs less
        "reprice": lambda: assert_repriced(call(conn, "reprice", "gpt-y", DEC, feb + HOUR,
                                                value("set_price", "gpt-y", {"input": "1", "output": 6},
                                                      effective_from=DEC + timedelta(days=1)), apply=True)),
        "fail_invocation": lambda: call(conn, "fail", small, value("admit_id", small, 5, "gpt-y", now=feb),
                                        "boom", now=feb),
        "open_execution": lambda: call(conn, "open_execution", unlimited, "upgrade.new", now=feb),
        "close_execution": lambda: call(conn, "close_execution", small, running, "completed", now=feb),
        "reconcile_org": lambda: call(conn, "reconcile_org", unlimited, now=feb),
        "run_reconciliation": lambda: call_pass(conn, feb + HOUR),
        "reconciliation_health": lambda: call(conn, "health", now=feb + HOUR),
        "claim_notices": lambda: state.update(notices=call(conn, "claim_notices", limit=10, now=feb + 2 * HOUR)),
        "complete_notice": lambda: call(conn, "complete_notice", state["notices"][0]["organization_id"],
                                        state["notices"][0]["id"], state["notices"][0]["claim_token"],
                                        now=feb + 2 * HOUR),  # fmt: skip
        "fail_notice": lambda: call(conn, "fail_notice", small, sent_notice(), uuid.uuid4(), "x",
                                    now=feb + 2 * HOUR),  # fmt: skip
        "release_notice": lambda: call(conn, "release_notice", small, sent_notice(), uuid.uuid4(),
                                       now=feb + 2 * HOUR),  # fmt: skip
        "rearm_notices": lambda: call(conn, "rearm_notices", now=feb + 3 * HOUR),
        "rebuild_daily_usage": lambda: call(conn, "rebuild_daily_usage", DEC.date().replace(day=1),
                                            FEBRUARY.replace(day=28)),
        "check_daily_usage": lambda: call(conn, "check_daily_usage", DEC.date().replace(day=1),
                                          FEBRUARY.replace(day=28)),
        "check_invariants": lambda: invariants(conn),
        "schedule_reconciliation": lambda: expect("LL010", "schedule_reconciliation"),  # pg_cron: in llm_cron
        "unschedule_reconciliation": lambda: expect("LL010", "unschedule_reconciliation"),
        "distribute": lambda: expect("LL011", "distribute"),
        **read_calls(conn, small, unlimited, feb),
    }
    public = {
        r[0] for r in conn.execute(
            "SELECT proname FROM pg_proc WHERE pronamespace = 'llm'::regnamespace"
            " AND proname NOT LIKE '\\_%'").fetchall()}  # fmt: skip
    assert public == set(calls), "the upgrade test must call every public routine"
    for name, run in calls.items():
        try:
            run()
        except Exception as exc:
            raise AssertionError(f"llm.{name} failed after the upgrade: {exc}") from exc
    assert scalar(conn, "SELECT status FROM llm.invocations WHERE id = %s", [state["inv"]]) == "settled"
    # recorded for audit under 0.1.0: never trued up, whatever the policy now
    assert settle(conn, unlimited, ids["stranded"], 65, 2, input_tokens=100, output_tokens=20,
                  now=feb) == "already_recovered"
    with pytest.raises(psycopg.Error) as caught:  # its figures are kept, not replaced
        settle(conn, unlimited, ids["stranded"], 99, 9, now=feb)
    assert caught.value.sqlstate == "LL007"


def assert_repriced(rows: list[dict[str, Any]]) -> None:
    """One organization, one request, 45 nanos cheaper (90 input tokens at $1.5 -> $1 a million)."""
    assert [(r["requests"], r["difference_nanos"]) for r in rows] == [(1, -45_000)], rows


def seen(rows: list[dict[str, Any]], at_least: int = 1) -> None:
    assert len(rows) >= at_least, rows


def read_calls(
    conn: psycopg.Connection, small: uuid.UUID, unlimited: uuid.UUID, feb: datetime
) -> dict[str, Callable[[], Any]]:
    """The reads of the books, on the upgraded books: each returns what it
    must see there, not merely no error (last_run and metrics after the pass)."""
    return {
        "report_periods": lambda: seen(call(conn, "report_periods", DEC.date(), FEBRUARY.replace(day=28), [small])),
        "report_daily_usage": lambda: call(conn, "report_daily_usage", DEC.date(), FEBRUARY.replace(day=28), [small]),
        "report_costs": lambda: seen(call(conn, "report_costs", DEC.date(), FEBRUARY.replace(day=28), [small])),
        "report_open_holds": lambda: call(conn, "report_open_holds", [small], now=feb),
        "report_tasks": lambda: seen(call(conn, "report_tasks", DEC.date(), [small])),
        "report_scope_usage": lambda: call(conn, "report_scope_usage", "project", DEC.date(), FEBRUARY.replace(day=28)),
        "report_budgets_near_limit": lambda: call(conn, "report_budgets_near_limit", now=feb),
        "books_snapshot": lambda: seen(call(conn, "books_snapshot", [small], now=feb)),
        "stale_by_organization_status": lambda: seen(call(conn, "stale_by_organization_status", now=feb)),
        "books_history": lambda: seen(call(conn, "books_history", [small, unlimited])),
        "organization_totals": lambda: seen(call(conn, "organization_totals", [small, unlimited]), 2),
        "last_run": lambda: seen(call(conn, "last_run", now=feb + 4 * HOUR)),  # after run_reconciliation
        "pass_progress": lambda: seen(call(conn, "pass_progress", feb)),
        "metrics": lambda: seen(call(conn, "metrics", now=feb + 4 * HOUR), 20),
    }


def budgets_work(conn: psycopg.Connection, org: uuid.UUID, now: datetime) -> None:
    """On upgraded books: a '*' end-user day budget set by set_budget holds every
    unseen end user's first request (the second one of 30 over 50 is refused, naming the
    budget) and settlement moves the counter; the invariants check it (14, 15)."""
    set_budget(conn, org, "end_user", "*", "day", 50, now=now)
    first = call(conn, "admit_id", org, 30, "gpt-y", project="p", api_key="k", end_user="u-1", now=now)
    with pytest.raises(psycopg.Error) as refused:
        call(conn, "admit_id", org, 30, "gpt-y", end_user="u-1", now=now)
    assert (refused.value.sqlstate, refused.value.diag.table_name, refused.value.diag.constraint_name,
            refused.value.diag.column_name) == ("LL001", "budgets", "end_user", "day")  # fmt: skip
    assert settle(conn, org, first[0]["value"], 20, 1, now=now) == "settled"
    usage = budget_usage(conn, org)
    assert [(k[:3], r["limit_credits"], r["used_credits"], r["held_credits"]) for k, r in usage.items()] == [
        (("end_user", "u-1", "day"), 50, 20, 0)]  # fmt: skip
    assert invariants(conn) == []


def test_the_sweeps_totals_are_recounted_from_the_books_on_upgrade(old_database):
    """Invariant 10: 0005 started llm.sweep_totals from the 0.1.0 books but
    counted a request recovered at its zero estimate as uncharged, which no sweep does;
    0012 recounts them from the requests, so an upgraded database's totals are exact."""
    with psycopg.connect(old_database, autocommit=True) as conn:
        api = Release010(conn)
        org = api.org(1000)
        api.admit(org, 0)  # recovered at its estimate: 0, yet not uncharged
        api.admit(org, 30)
        api.run_pass(DEC + 25 * HOUR)
        assert scalar(conn, "SELECT count(*) FROM llm.invocations WHERE settlement_kind = 'recovered'") == 2

    migrate(old_database)

    with psycopg.connect(old_database, autocommit=True) as conn:
        totals = row(conn, "SELECT recovered_requests, recovered_uncharged, past_window_alerts"
                           " FROM llm.sweep_totals WHERE organization_id = %s", [org])  # fmt: skip
        assert totals == {"recovered_requests": 2, "recovered_uncharged": 0, "past_window_alerts": 2}
        assert invariants(conn) == []
