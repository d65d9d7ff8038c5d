"""The Python driver: SQLSTATE -> exception classes (each triggered for real),
typed results, one transaction per call, the sync and asyncio clients, and
the four request helpers (admit, mark_dispatched, settle, fail).

Every test gets its own cloned database (``llm_dsn`` / ``llm_conn``); the clock
moves through ``now=``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import re
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from codegen.operations import operations
from llm_db import errors, models
from llm_db.client import AsyncLlm, Llm
from tests.fingerprint import fingerprint
from tests.helpers import HOUR, JANUARY, T0, invariants

TASK = "driver.task"


@pytest.fixture
def llm(llm_conn: psycopg.Connection) -> Llm:
    return Llm(llm_conn)


def new_org(llm: Llm, allowance: int | None = 1000, **kwargs: Any) -> uuid.UUID:
    org_id = uuid.uuid4()
    llm.upsert_organization(org_id, f"org {org_id.hex[:6]}", allowance, now=T0, **kwargs)
    return org_id


def count(conn: psycopg.Connection, table: str) -> int:
    query = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier("llm", table))
    return conn.execute(query).fetchone()[0]


# ---------------------------------------------------------------- SQLSTATE -> class


def assert_mapped(
    caught: pytest.ExceptionInfo[errors.LlmError], cls: type[errors.LlmError], sqlstate: str
) -> errors.LlmError:
    error = caught.value
    assert type(error) is cls
    assert error.sqlstate == sqlstate == cls.code
    assert isinstance(error.__cause__, psycopg.Error)
    assert error.__cause__.sqlstate == sqlstate
    assert error.message == error.__cause__.diag.message_primary
    assert error.hint == error.__cause__.diag.message_hint
    assert error.detail == error.__cause__.diag.message_detail
    return error


def test_LL001_allowance_exhausted_maps_to_AllowanceExhausted_with_detail(llm: Llm) -> None:
    org = new_org(llm, 100)
    with pytest.raises(errors.AllowanceExhausted) as caught:
        llm.admit(org, 101, "model-a", now=T0)
    error = assert_mapped(caught, errors.AllowanceExhausted, "LL001")
    assert error.detail is not None and error.hint is not None
    assert "DETAIL: " in str(error)


def test_LL002_unknown_organization_maps_to_UnknownOrganization(llm: Llm) -> None:
    with pytest.raises(errors.UnknownOrganization) as caught:
        llm.admit(uuid.uuid4(), 1, "model-a", now=T0)
    assert_mapped(caught, errors.UnknownOrganization, "LL002")


def test_LL003_suspended_organization_maps_to_OrganizationNotOperational(llm: Llm) -> None:
    org = new_org(llm, 100, status="suspended")
    with pytest.raises(errors.OrganizationNotOperational) as caught:
        llm.admit(org, 1, "model-a", now=T0)
    assert_mapped(caught, errors.OrganizationNotOperational, "LL003")


def test_LL004_undeclared_task_maps_to_UnknownTaskKind(llm: Llm) -> None:
    org = new_org(llm)
    with pytest.raises(errors.UnknownTaskKind) as caught:
        llm.open_execution(org, "never.declared", now=T0)
    assert_mapped(caught, errors.UnknownTaskKind, "LL004")


def test_LL005_unknown_invocation_maps_to_UnknownInvocation(llm: Llm) -> None:
    org = new_org(llm)
    with pytest.raises(errors.UnknownInvocation) as caught:
        llm.mark_dispatched(org, uuid.uuid4(), now=T0)
    assert_mapped(caught, errors.UnknownInvocation, "LL005")


def test_LL006_unknown_execution_maps_to_UnknownExecution(llm: Llm) -> None:
    org = new_org(llm)
    with pytest.raises(errors.UnknownExecution) as caught:
        llm.close_execution(org, uuid.uuid4(), "completed", now=T0)
    assert_mapped(caught, errors.UnknownExecution, "LL006")


def test_LL007_reused_invocation_id_maps_to_IdempotencyConflict(llm: Llm) -> None:
    org = new_org(llm)
    inv = llm.admit(org, 10, "model-a", now=T0)
    assert llm.admit(org, 10, "model-a", invocation_id=inv.id, now=T0) == dataclasses.replace(
        inv, replayed=True
    )
    with pytest.raises(errors.IdempotencyConflict) as caught:
        llm.admit(org, 11, "model-a", invocation_id=inv.id, now=T0)
    assert_mapped(caught, errors.IdempotencyConflict, "LL007")


def test_LL008_execution_of_another_org_maps_to_CrossOrganizationReference(llm: Llm) -> None:
    org, other = new_org(llm), new_org(llm)
    llm.declare_task_kind(TASK)
    foreign = llm.open_execution(other, TASK, now=T0)
    with pytest.raises(errors.CrossOrganizationReference) as caught:
        llm.admit(org, 1, "model-a", execution_id=foreign.execution_id, now=T0)
    assert_mapped(caught, errors.CrossOrganizationReference, "LL008")


def test_LL009_close_as_abandoned_maps_to_InvalidTransition(llm: Llm) -> None:
    org = new_org(llm)
    llm.declare_task_kind(TASK)
    opened = llm.open_execution(org, TASK, now=T0)
    with pytest.raises(errors.InvalidTransition) as caught:
        llm.close_execution(org, opened.execution_id, "abandoned", now=T0)
    assert_mapped(caught, errors.InvalidTransition, "LL009")


def test_LL010_schedule_without_pg_cron_maps_to_CronNotInstalled(llm: Llm) -> None:
    with pytest.raises(errors.CronNotInstalled) as caught:
        llm.schedule_reconciliation()
    error = assert_mapped(caught, errors.CronNotInstalled, "LL010")
    assert error.hint


def test_LL011_distribute_without_citus_maps_to_CitusNotInstalled(llm: Llm) -> None:
    with pytest.raises(errors.CitusNotInstalled) as caught:
        llm.distribute()
    assert_mapped(caught, errors.CitusNotInstalled, "LL011")


def test_22023_negative_estimate_maps_to_InvalidArgument_and_writes_nothing(
    llm: Llm, llm_conn: psycopg.Connection
) -> None:
    org = new_org(llm)
    with pytest.raises(errors.InvalidArgument) as caught:
        llm.admit(org, -1, "model-a", now=T0)
    assert_mapped(caught, errors.InvalidArgument, "22023")
    assert count(llm_conn, "invocations") == 0


def test_unknown_LL_code_maps_to_LlmError_and_other_errors_pass_unchanged(
    llm_conn: psycopg.Connection,
) -> None:
    with pytest.raises(errors.LlmError) as caught, errors.mapped_errors():
        llm_conn.execute(
            "DO $$ BEGIN RAISE EXCEPTION 'future' USING ERRCODE = 'LL099'; END $$"
        )
    assert type(caught.value) is errors.LlmError and caught.value.sqlstate == "LL099"

    with pytest.raises(psycopg.errors.DivisionByZero) as raw, errors.mapped_errors():
        llm_conn.execute("SELECT 1 / 0")
    assert errors.translate(raw.value) is raw.value


def test_every_contract_sqlstate_has_its_own_class() -> None:
    codes = {
        "LL001": errors.AllowanceExhausted,
        "LL002": errors.UnknownOrganization,
        "LL003": errors.OrganizationNotOperational,
        "LL004": errors.UnknownTaskKind,
        "LL005": errors.UnknownInvocation,
        "LL006": errors.UnknownExecution,
        "LL007": errors.IdempotencyConflict,
        "LL008": errors.CrossOrganizationReference,
        "LL009": errors.InvalidTransition,
        "LL010": errors.CronNotInstalled,
        "LL011": errors.CitusNotInstalled,
        "22023": errors.InvalidArgument,
    }
    for code, cls in codes.items():
        assert cls.code == code and issubclass(cls, errors.LlmError)
    assert issubclass(errors.NestedExecution, errors.LlmError) and errors.NestedExecution.code is None


# ---------------------------------------------------------------- typed results


def test_request_helpers_return_typed_results_through_the_lifecycle(
    llm: Llm, llm_conn: psycopg.Connection
) -> None:
    org_id = uuid.uuid4()
    org = llm.upsert_organization(org_id, "acme", 1000, notice_thresholds=[50, 90], now=T0)
    assert isinstance(org, models.Organization)
    assert (org.id, org.name, org.status, org.monthly_allowance_credits) == (
        org_id, "acme", "operational", 1000,
    )
    assert org.notice_thresholds == (50, 90)

    inv = llm.admit(org_id, 200, "model-a", now=T0)
    assert isinstance(inv, models.Invocation)
    assert (inv.status, inv.hold_credits, inv.period_start) == ("reserved", 200, JANUARY)
    assert isinstance(inv.id, uuid.UUID)

    dispatched = llm.mark_dispatched(org_id, inv.id, now=T0 + timedelta(seconds=1))
    assert dispatched.status == "dispatched" and dispatched.dispatched_at is not None

    outcome = llm.settle(org_id, inv.id, 600, 42, input_tokens=10, output_tokens=20, now=T0)
    assert outcome is models.Outcome.SETTLED and outcome == "settled"
    assert (llm.settle(org_id, inv.id, 600, 42, input_tokens=10, output_tokens=20, now=T0)
            is models.Outcome.ALREADY_SETTLED)
    with pytest.raises(errors.IdempotencyConflict):  # a retry with other figures says so
        llm.settle(org_id, inv.id, 600, 42, now=T0)
    assert llm.fail(org_id, inv.id, "late", now=T0) is models.Outcome.ALREADY_SETTLED

    second = llm.admit(org_id, 50, "model-b", now=T0)
    assert llm.fail(org_id, second.id, "provider 500", credits=5, now=T0) is models.Outcome.FAILED
    assert llm.settle(org_id, second.id, 1, 1, now=T0) is models.Outcome.ALREADY_FAILED

    # 605 of 1000 crossed 50 %: one notice, claimed as a typed row
    claimed = llm.claim_notices(limit=10, now=T0)
    assert [type(n) for n in claimed] == [models.Notice]
    assert (claimed[0].threshold_pct, claimed[0].status, claimed[0].attempts) == (50, "sending", 1)
    assert isinstance(claimed[0].claim_token, uuid.UUID)
    assert llm.release_notice(org_id, claimed[0].id, claimed[0].claim_token, now=T0) is True
    assert llm.release_notice(org_id, claimed[0].id, claimed[0].claim_token, now=T0) is False
    claimed = llm.claim_notices(limit=10, now=T0)
    assert (claimed[0].status, claimed[0].attempts) == ("sending", 1)  # the release counted none
    assert llm.complete_notice(org_id, claimed[0].id, claimed[0].claim_token, now=T0) is True
    assert llm.complete_notice(org_id, claimed[0].id, claimed[0].claim_token, now=T0) is False
    assert llm.rearm_notices(now=T0) == 0
    assert llm.rebuild_daily_usage(T0.date(), T0.date()) == 2
    assert llm.check_invariants() == []


def test_tasks_recovery_and_health_return_typed_results(llm: Llm) -> None:
    org = new_org(llm)
    llm.declare_task_kind(TASK, "a task")
    llm.declare_task_kind(TASK)  # idempotent

    assert llm.health(now=T0).status == "never"

    opened = llm.open_execution(org, TASK, subject_type="doc", subject_id="7",
                                replay_key="k1", now=T0)
    assert opened == models.Execution(opened.execution_id, "running", False)
    again = llm.open_execution(org, TASK, subject_type="doc", subject_id="7",
                               replay_key="k1", now=T0)
    assert again == models.Execution(opened.execution_id, "running", True)
    llm.admit(org, 30, "model-a", execution_id=opened.execution_id, now=T0)

    sweep = llm.reconcile_org(org, now=T0 + 25 * HOUR)
    assert isinstance(sweep, models.OrgSweep)
    assert (sweep.organization_id, sweep.recovered_requests, sweep.released_hold_credits,
            sweep.abandoned_executions, sweep.more_pending) == (org, 1, 30, 1, False)
    assert llm.close_execution(org, opened.execution_id, "completed", now=T0) is False

    run = llm.run_reconciliation(now=T0 + 26 * HOUR)
    assert isinstance(run, models.ReconciliationRun)
    assert (run.status, run.orgs_visited, run.orgs_failed, run.errors) == ("succeeded", 1, 0, [])

    health = llm.health(now=T0 + 27 * HOUR)
    assert isinstance(health, models.Health) and health.ok and health.last_run_status == "succeeded"
    assert llm.health(now=T0 + 30 * HOUR).status == "late"


def test_check_invariants_returns_typed_violations(
    llm: Llm, llm_conn: psycopg.Connection
) -> None:
    org = new_org(llm)
    llm.admit(org, 10, "model-a", now=T0)
    llm_conn.execute("UPDATE llm.period_stripes SET held_credits = held_credits + 1")
    violations = llm.check_invariants()
    assert violations and all(isinstance(v, models.InvariantViolation) for v in violations)
    assert violations[0].invariant == 1 and violations[0].organization_id == org


# ---------------------------------------------------------------- transactions and connections


def test_each_call_commits_on_a_non_autocommit_connection(
    llm_dsn: str, llm_connect: Any
) -> None:
    observer = llm_connect()
    with psycopg.connect(llm_dsn) as conn:  # autocommit off
        llm = Llm(conn)
        org = new_org(llm)
        inv = llm.admit(org, 10, "model-a", now=T0)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        seen = observer.execute(
            "SELECT status FROM llm.invocations WHERE id = %(id)s::uuid", {"id": inv.id}
        ).fetchone()
        assert seen == ("reserved",)

        # a failed call rolls back its own transaction and leaves the connection usable
        with pytest.raises(errors.AllowanceExhausted):
            llm.admit(org, 10_000, "model-a", now=T0)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert llm.settle(org, inv.id, 5, 0, now=T0) is models.Outcome.SETTLED

        # the procedure commits per organization: it runs on the same connection
        run = llm.run_reconciliation(now=T0)
        assert run is not None and run.status == "succeeded"
        assert conn.autocommit is False


class FakePool:
    """Anything with a ``.connection()`` context manager is accepted as a pool."""

    def __init__(self, connect: Any) -> None:
        self.connect = connect
        self.borrowed = 0

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        self.borrowed += 1
        yield self.connect()


def test_a_pool_like_source_lends_one_connection_per_call(llm_connect: Any) -> None:
    pool = FakePool(llm_connect)
    llm = Llm(pool)
    org = new_org(llm)
    inv = llm.admit(org, 10, "model-a", now=T0)
    assert llm.settle(org, inv.id, 10, 1, now=T0) is models.Outcome.SETTLED
    assert pool.borrowed == 3


def test_nothing_is_prepared_unless_the_client_opts_in(
    llm: Llm, llm_conn: psycopg.Connection
) -> None:
    """The default prepares no statement on the server (safe behind a transaction pooler);
    ``prepare=True`` lets psycopg prepare after its threshold (5 executions)."""
    org = new_org(llm, None)
    prepared = "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%%admit_invocation%%'"
    for _ in range(7):
        llm.admit(org, 1, "model-a", now=T0)
    assert llm_conn.execute(prepared).fetchone()[0] == 0
    preparing = Llm(llm_conn, prepare=True)
    for _ in range(7):
        preparing.admit(org, 1, "model-a", now=T0)
    assert llm_conn.execute(prepared).fetchone()[0] == 1


# ---------------------------------------------------------------- asyncio


def test_async_client_maps_errors_and_returns_the_same_types(llm_dsn: str) -> None:
    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(llm_dsn, autocommit=True) as conn:
            llm = AsyncLlm(conn)
            org_id = uuid.uuid4()
            org = await llm.upsert_organization(org_id, "async", 100, now=T0)
            assert isinstance(org, models.Organization)

            inv = await llm.admit(org_id, 60, "model-a", now=T0)
            assert isinstance(inv, models.Invocation)
            assert (await llm.mark_dispatched(org_id, inv.id, now=T0)).status == "dispatched"
            with pytest.raises(errors.AllowanceExhausted) as caught:
                await llm.admit(org_id, 50, "model-a", now=T0)
            assert isinstance(caught.value.__cause__, psycopg.Error)
            assert await llm.settle(org_id, inv.id, 85, 3, now=T0) is models.Outcome.SETTLED

            other = await llm.admit(org_id, 5, "model-a", now=T0)
            assert await llm.fail(org_id, other.id, "boom", now=T0) is models.Outcome.FAILED

            await llm.declare_task_kind(TASK)
            opened = await llm.open_execution(org_id, TASK, now=T0)
            assert await llm.close_execution(org_id, opened.execution_id, "completed", now=T0)

            notices = await llm.claim_notices(now=T0)
            # 80 % crossed by the settlement; 0: the allowance's refusal, reported by the client
            assert sorted(n.threshold_pct for n in notices) == [0, 80]
            assert await llm.release_notice(org_id, notices[0].id, notices[0].claim_token, now=T0) is True
            notices = await llm.claim_notices(now=T0)
            assert await llm.fail_notice(org_id, notices[0].id, notices[0].claim_token, "down", now=T0)
            assert await llm.rearm_notices(now=T0) == 0

            sweep = await llm.reconcile_org(org_id, now=T0)
            assert isinstance(sweep, models.OrgSweep) and sweep.recovered_requests == 0
            run = await llm.run_reconciliation(now=T0)
            assert run is not None and run.status == "succeeded"
            assert conn.autocommit is True
            assert (await llm.health(now=T0 + HOUR)).ok
            assert await llm.rebuild_daily_usage(JANUARY, JANUARY.replace(day=31)) == 1
            assert await llm.check_invariants() == []
            with pytest.raises(errors.CronNotInstalled):
                await llm.unschedule_reconciliation()

    asyncio.run(scenario())


def test_async_client_on_a_non_autocommit_connection_commits_each_call(
    llm_dsn: str, llm_connect: Any
) -> None:
    observer = llm_connect()

    async def scenario() -> uuid.UUID:
        async with await psycopg.AsyncConnection.connect(llm_dsn) as conn:
            llm = AsyncLlm(conn)
            org = uuid.uuid4()
            await llm.upsert_organization(org, "async", 100, now=T0)
            inv = await llm.admit(org, 10, "model-a", now=T0)
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            run = await llm.run_reconciliation(now=T0)
            assert run is not None and conn.autocommit is False
            return inv.id

    inv_id = asyncio.run(scenario())
    assert observer.execute(
        "SELECT count(*) FROM llm.invocations WHERE id = %(id)s::uuid", {"id": inv_id}
    ).fetchone() == (1,)


# ---------------------------------------------------------------- the table of operations


def test_every_public_routine_has_an_operation_and_every_operation_a_routine(
    llm_conn: psycopg.Connection,
) -> None:
    """Each routine of schema llm whose name does not start with ``_`` (procedures
    included) is reachable from the driver, and no operation names a routine that is gone."""
    routines = {
        name
        for (name,) in llm_conn.execute(
            "SELECT p.proname FROM pg_catalog.pg_proc AS p"
            " JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace"
            " WHERE n.nspname = 'llm' AND left(p.proname, 1) <> '_'"
        )
    }
    table = {op.routine for op in operations().values()}
    assert routines - table == set(), "public routines without a driver operation"
    assert table - routines == set(), "operations naming no routine"


def test_each_operation_passes_only_parameters_its_routine_has_and_all_it_requires(
    llm_conn: psycopg.Connection,
) -> None:
    """The statement built from each entry names the routine's own parameters (and every
    one without a default), with the routine's types: a renamed SQL parameter fails here."""
    signatures = {}
    for name, arg_names, modes, arg_types, defaults in llm_conn.execute(
        """SELECT p.proname, p.proargnames, p.proargmodes::text[],
                  ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) AS t), p.pronargdefaults
             FROM pg_catalog.pg_proc AS p JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
            WHERE n.nspname = 'llm' AND left(p.proname, 1) <> '_'"""
    ):
        inputs = [a for a, m in zip(arg_names or [], modes or ["i"] * len(arg_names or []), strict=True)
                  if m in ("i", "b", "v")]  # fmt: skip
        signatures[name] = dict(zip(inputs, arg_types, strict=True)) | {
            "_required": inputs[: len(inputs) - defaults]
        }
    for op in operations().values():
        routine = signatures[op.routine]
        passed = dict(re.findall(r"(p_\w+) => %\(\w+\)s::([\w\[\] ]+)", op.sql))
        assert set(passed) <= set(routine) - {"_required"}, op.name
        assert set(routine["_required"]) <= set(passed), op.name
        for name, sql_type in passed.items():
            assert _same_type(sql_type, routine[name]), (op.name, name, sql_type, routine[name])


def _same_type(cast: str, declared: str) -> bool:
    aliases = {"timestamptz": "timestamp with time zone", "integer[]": "integer[]"}
    return aliases.get(cast, cast) == declared or declared.startswith("llm.")  # a domain over the cast type


def test_statuses_are_enums_that_compare_equal_to_their_sql_text(llm: Llm) -> None:
    org = uuid.uuid4()
    made = llm.upsert_organization(org, "enums", 100, now=T0)
    assert made.status is models.OrganizationStatus.OPERATIONAL and made.status == "operational"
    assert made.recovery_charge is models.RecoveryCharge.ESTIMATE
    inv = llm.admit(org, 10, "m", now=T0)
    assert inv.status is models.InvocationStatus.RESERVED
    assert llm.settle(org, inv.id, 5, 0, now=T0) is models.Outcome.SETTLED


# ---------------------------------------------------------------- budgets

ROOT = Path(__file__).resolve().parent.parent
SCOPES = {"project": "proj-1", "api_key": "key-1", "end_user": "user 42 ✓"}


def scopes_of(conn: psycopg.Connection, inv_id: uuid.UUID) -> tuple[str | None, ...]:
    query = "SELECT project, api_key, end_user FROM llm.invocations WHERE id = %(id)s::uuid"
    return conn.execute(query, {"id": inv_id}).fetchone()


def refused(llm: Llm, org: uuid.UUID, estimate: int, **scopes: str) -> errors.AllowanceExhausted:
    """Admit, expect LL001 mapped to AllowanceExhausted with nothing written; the error."""
    before = count(llm.source, "invocations")
    with pytest.raises(errors.AllowanceExhausted) as caught:
        llm.admit(org, estimate, "model-a", now=T0, **scopes)
    assert count(llm.source, "invocations") == before
    return assert_mapped(caught, errors.AllowanceExhausted, "LL001")  # type: ignore[return-value]


def test_AllowanceExhausted_names_the_budget_that_refused(
    llm: Llm, llm_conn: psycopg.Connection
) -> None:
    """The driver's AllowanceExhausted exposes scope, scope_id and window: the scope
    and window from the diagnostic fields, the real id (never '*') from the DETAIL's first line;
    None for the organization scope, as set_budget spells it. The allowance is
    ("organization", None, "month")."""
    org = new_org(llm, 10_000)
    llm.set_budget(org, "organization", None, "week", 900, now=T0)
    llm.set_budget(org, "project", "proj-1", "month", 800, now=T0)
    llm.set_budget(org, "api_key", "*", "day", 700, now=T0)
    llm.set_budget(org, "end_user", "user 42 ✓", "week", 600, now=T0)
    llm.admit(org, 500, "model-a", now=T0, **SCOPES)

    cases = [  # (estimate, scopes) -> what refused
        (101, SCOPES, ("end_user", "user 42 ✓", "week")),
        (201, {"api_key": "key-1"}, ("api_key", "key-1", "day")),  # '*' names the real id
        (301, {"project": "proj-1"}, ("project", "proj-1", "month")),
        (401, {}, ("organization", None, "week")),
        (9_501, SCOPES, ("organization", None, "month")),  # the allowance, named first
    ]
    for estimate, scopes, named in cases:
        error = refused(llm, org, estimate, **scopes)
        assert (error.scope, error.scope_id, error.window) == named, estimate
    assert invariants(llm_conn) == []


def test_an_LL001_without_the_budget_fields_names_nothing(llm_conn: psycopg.Connection) -> None:
    """An LL001 without the budget fields whose DETAIL is neither documented form
    maps to AllowanceExhausted with scope, scope_id and window None; so does a TABLE other
    than the allowance's or a budget's (then the DETAIL is not read at all)."""
    raise_ll001 = """DO $$ BEGIN RAISE EXCEPTION 'llm: allowance exhausted' USING ERRCODE = 'LL001',
        DETAIL = E'key-1\\nallowance=1 used=1 held=0 estimate=1 period=2026-01-01' {fields}; END $$"""
    elsewhere = ", SCHEMA = 'llm', TABLE = 'invocations', CONSTRAINT = 'api_key', COLUMN = 'day'"
    for fields in ("", elsewhere):
        with pytest.raises(errors.AllowanceExhausted) as caught, errors.mapped_errors():
            llm_conn.execute(raise_ll001.format(fields=fields))
        error = caught.value
        assert (error.scope, error.scope_id, error.window) == (None, None, None)


def test_a_refusal_relayed_by_citus_is_named_from_its_DETAIL(llm_conn: psycopg.Connection) -> None:
    """A coordinator re-raises a worker's error with its message, DETAIL and
    HINT only, so a refusal arrives without SCHEMA, TABLE, CONSTRAINT and COLUMN. The driver
    then names the budget from the documented DETAIL: the allowance's ``allowance=...``
    line, a budget's second line (LL001 and LL012 alike)."""
    raise_without_fields = "DO $$ BEGIN RAISE EXCEPTION 'llm: refused' USING ERRCODE = '{code}', DETAIL = E'{detail}'; END $$"
    cases = [
        ("LL001", "allowance=100 used=90 held=0 estimate=20 period=2026-01-01",
         errors.AllowanceExhausted, ("organization", None, "month")),
        ("LL001", "key 1\\nscope=api_key window=day window_start=2026-01-15 limit=5 used=5 held=0 estimate=1",
         errors.AllowanceExhausted, ("api_key", "key 1", "day")),
        ("LL001", "00000000-0000-4000-8000-000000000001\\nscope=organization window=week window_start=2026-01-12"
         " limit=5 used=5 held=0 estimate=1", errors.AllowanceExhausted, ("organization", None, "week")),
        ("LL012", "u-1\\nscope=end_user window=month window_start=2024-01-01 horizon=2025-01-01",
         errors.WindowRetired, ("end_user", "u-1", "month")),
    ]  # fmt: skip
    for code, detail, kind, named in cases:
        with pytest.raises(kind) as caught, errors.mapped_errors():
            llm_conn.execute(raise_without_fields.format(code=code, detail=detail))
        assert (caught.value.scope, caught.value.scope_id, caught.value.window) == named, detail


def test_the_driver_changes_one_thing_at_a_time(llm: Llm, llm_conn: psycopg.Connection) -> None:
    """The driver's upsert_organization without status or thresholds keeps
    the organization's (it reset them to operational and (80, 100)), and set_allowance
    changes the allowance alone; an unknown organization is UnknownOrganization."""
    org = uuid.uuid4()
    llm.upsert_organization(org, "Suspended Co", 5_000, status="suspended", notice_thresholds=(50, 90), now=T0)
    kept = llm.upsert_organization(org, "Suspended Co", 6_000, now=T0)
    assert (kept.status, kept.notice_thresholds, kept.monthly_allowance_credits) == ("suspended", (50, 90), 6_000)
    changed = llm.set_allowance(org, 7_000, now=T0)
    assert (changed.name, changed.status, changed.notice_thresholds, changed.monthly_allowance_credits) == (
        "Suspended Co", "suspended", (50, 90), 7_000)  # fmt: skip
    with pytest.raises(errors.UnknownOrganization):
        llm.set_allowance(uuid.uuid4(), 1, now=T0)
    assert invariants(llm_conn) == []


def contract_errors_section() -> str:
    text = (ROOT / "docs" / "contract.md").read_text(encoding="utf-8")
    return text.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]


def test_the_budget_DETAIL_is_the_format_contract_md_documents(llm: Llm) -> None:
    """A budget's LL001 DETAIL is two lines, the id verbatim and then the documented key=value
    line. The format is read from the doc and matched against a real refusal, so neither can
    change alone."""
    shown = r"\n    (<scope_id>\n    scope=<scope> [^\n]*)\n"  # an indented block of two lines
    documented = re.search(shown, contract_errors_section())
    assert documented is not None, "contract.md 'Errors' no longer shows the budget DETAIL"
    detail_format = documented.group(1).replace("\n    ", "\n")  # without the block's indent
    # a <placeholder> is a value without spaces (<n> a number), the id anything but a line break
    pattern = "".join(
        re.escape(part) if i % 2 == 0 else
        r"\d+" if part == "n" else
        rf"(?P<{part}>[^\n]+)" if part == "scope_id" else rf"(?P<{part}>[^ ]+)"
        for i, part in enumerate(re.split(r"<(\w+)>", detail_format))
    )  # fmt: skip
    org = new_org(llm, 1000)
    llm.set_budget(org, "end_user", "*", "day", 10, now=T0)
    error = refused(llm, org, 11, end_user="user 42 ✓")
    match = re.fullmatch(pattern, error.detail or "")
    assert match is not None, (pattern, error.detail)
    assert match.groupdict() == {"scope_id": "user 42 ✓", "scope": "end_user", "window": "day",
                                 "date": str(T0.date())}  # fmt: skip
    assert (error.scope, error.scope_id, error.window) == ("end_user", "user 42 ✓", "day")


def test_admit_and_admit_id_store_the_scope_ids_and_a_retry_compares_them(
    llm: Llm, llm_conn: psycopg.Connection
) -> None:
    """Admit and admit_id take project=, api_key=, end_user=, stored on the request;
    a retried invocation id with other scope ids is LL007 (IdempotencyConflict)."""
    org = new_org(llm, 1000)
    inv = llm.admit(org, 10, "model-a", now=T0, **SCOPES)
    assert scopes_of(llm_conn, inv.id) == tuple(SCOPES.values())
    inv_id = llm.admit_id(org, 10, "model-a", now=T0, api_key="key-9")
    assert scopes_of(llm_conn, inv_id) == (None, "key-9", None)
    assert llm.admit_id(org, 10, "model-a", invocation_id=inv_id, now=T0, api_key="key-9") == inv_id
    with pytest.raises(errors.IdempotencyConflict):
        llm.admit_id(org, 10, "model-a", invocation_id=inv_id, now=T0, api_key="key-8")
    with pytest.raises(errors.InvalidArgument):
        llm.admit(org, 10, "model-a", now=T0, end_user="*")  # '*' is reserved
    assert count(llm_conn, "invocations") == 2
    assert invariants(llm_conn) == []


def budgets(conn: psycopg.Connection, org: uuid.UUID) -> list[tuple]:
    return conn.execute(
        "SELECT scope, scope_id, budget_window, limit_credits, thresholds FROM llm.budgets"
        " WHERE organization_id = %(org)s::uuid ORDER BY scope, scope_id, budget_window",
        {"org": org},
    ).fetchall()


def test_set_budget_sets_replaces_and_removes_and_maps_its_errors(
    llm: Llm, llm_conn: psycopg.Connection, llm_role_conn: Any
) -> None:
    """llm.set_budget as llm_operator (the one role that may call it) sets, replaces
    and removes (None) a budget; bad input is 22023 (InvalidArgument, the allowance's HINT
    naming upsert_organization) and an unknown organization LL002 (UnknownOrganization), each
    writing nothing; llm_app may not call it (42501)."""
    org = new_org(llm, 1000)
    operator = Llm(llm_role_conn("llm_operator"))
    assert operator.set_budget(org, "end_user", "*", "day", 50, now=T0) is None
    operator.set_budget(org, "project", "p", "month", 500, thresholds=[50, 90], now=T0)
    operator.set_budget(org, "project", "p", "month", 400, thresholds=iter([75]), now=T0)
    assert budgets(llm_conn, org) == [("end_user", "*", "day", 50, [80, 100]),
                                      ("project", "p", "month", 400, [75])]  # fmt: skip
    operator.set_budget(org, "end_user", "*", "day", None, now=T0)
    operator.set_budget(org, "api_key", "never-set", "day", None, now=T0)  # nothing to remove
    assert budgets(llm_conn, org) == [("project", "p", "month", 400, [75])]

    bad = [
        ("organization", None, "month", 10),  # the allowance: upsert_organization sets it
        ("organization", "x", "day", 10),  # the organization scope has no id
        ("project", None, "day", 10),  # the other scopes need one
        ("team", "x", "day", 10),
        ("project", "x", "year", 10),
        ("project", "x", "day", -1),
    ]
    for scope, scope_id, window, limit in bad:
        with pytest.raises(errors.InvalidArgument) as caught:
            operator.set_budget(org, scope, scope_id, window, limit, now=T0)
        assert_mapped(caught, errors.InvalidArgument, "22023")
    with pytest.raises(errors.InvalidArgument) as caught:
        operator.set_budget(org, "organization", None, "month", 10, now=T0)
    assert "upsert_organization" in (caught.value.hint or "")
    with pytest.raises(errors.UnknownOrganization) as caught:
        operator.set_budget(uuid.uuid4(), "project", "p", "day", 10, now=T0)
    assert_mapped(caught, errors.UnknownOrganization, "LL002")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        Llm(llm_role_conn("llm_app")).set_budget(org, "project", "p", "day", 10, now=T0)
    assert budgets(llm_conn, org) == [("project", "p", "month", 400, [75])]
    assert invariants(llm_conn) == []


def test_the_async_client_admits_with_scope_ids_sets_budgets_and_names_the_refusal(
    llm_dsn: str, llm_conn: psycopg.Connection
) -> None:
    """On AsyncLlm: admit and admit_id take project=, api_key=, end_user=;
    set_budget sets a budget and maps 22023 and LL002; a refusal is AllowanceExhausted
    naming the budget."""

    async def scenario() -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
        async with await psycopg.AsyncConnection.connect(llm_dsn, autocommit=True) as conn:
            llm = AsyncLlm(conn)
            org = uuid.uuid4()
            await llm.upsert_organization(org, "async budgets", 1000, now=T0)
            assert await llm.set_budget(org, "api_key", "*", "day", 100, now=T0) is None
            with pytest.raises(errors.InvalidArgument):
                await llm.set_budget(org, "api_key", None, "day", 100, now=T0)
            with pytest.raises(errors.UnknownOrganization):
                await llm.set_budget(uuid.uuid4(), "api_key", "*", "day", 100, now=T0)
            inv = await llm.admit(org, 60, "model-a", now=T0, **SCOPES)
            inv_id = await llm.admit_id(org, 40, "model-a", now=T0, api_key="key-1", end_user="u")
            with pytest.raises(errors.AllowanceExhausted) as caught:
                await llm.admit(org, 1, "model-a", now=T0, api_key="key-1")
            error = caught.value
            assert (error.scope, error.scope_id, error.window) == ("api_key", "key-1", "day")
            return org, inv.id, inv_id

    org, first, second = asyncio.run(scenario())
    assert scopes_of(llm_conn, first) == tuple(SCOPES.values())
    assert scopes_of(llm_conn, second) == (None, "key-1", "u")
    assert budgets(llm_conn, org) == [("api_key", "*", "day", 100, [80, 100])]
    assert invariants(llm_conn) == []


def test_a_day_or_week_budget_s_crossing_owes_its_notice(
    llm: Llm, llm_conn: psycopg.Connection
) -> None:
    """"Notices": each budget's thresholds are notified once per (scope, id,
    window, window start), with period_start the window's start. A day or a week starts on
    no period of the organization: before migration 0015 dropped the notices' foreign key to
    period_heads, the settlement that crossed such a threshold failed (23503), and so did
    the set_budget that lowered a limit under the usage."""
    org = new_org(llm, None)
    monday = T0.date() - timedelta(days=T0.weekday())
    llm.set_budget(org, "api_key", "*", "day", 100, thresholds=[80], now=T0)
    inv = llm.admit(org, 90, "model-a", now=T0, api_key="key-1")
    assert llm.settle(org, inv.id, 90, 1, now=T0) == "settled"
    llm.set_budget(org, "organization", None, "week", 100, thresholds=[50], now=T0)
    inv = llm.admit(org, 10, "model-a", now=T0)  # counted from now on: 10 of 100
    llm.settle(org, inv.id, 10, 0, now=T0)
    llm.set_budget(org, "organization", None, "week", 20, thresholds=[50], now=T0)  # lowered
    owed = {(n.scope, n.scope_id, n.budget_window, n.period_start, n.threshold_pct)
            for n in llm.claim_notices(now=T0)}  # fmt: skip
    assert owed == {("api_key", "key-1", "day", T0.date(), 80),
                    ("organization", None, "week", monday, 50)}  # fmt: skip
    assert invariants(llm_conn) == []


# ----------------------------------------------------------- a NUL in a text argument


def _placeholder(hint: Any) -> Any:
    """A value of a parameter's type that psycopg can send, whatever the routine makes of it."""
    text = str(hint)
    if "JsonObject" in text:
        return {"input": 1}
    if "UUID" in text or "Uuid" in text:
        return [uuid.uuid4()] if "Sequence" in text or "UuidArray" in text else uuid.uuid4()
    if "datetime" in text:
        return T0
    if "date" in text:
        return JANUARY
    if "bool" in text:
        return True
    if "int" in text.lower():  # int, Int4
        return [80, 100] if "Iterable" in text or "Sequence" in text else 1
    return "x"


def _text_parameters() -> list[tuple[str, str]]:
    """Every (operation, parameter) of the driver that takes a str (enums given as text too)."""
    found = []
    for op in operations().values():
        for name, parameter in op.signature.parameters.items():
            hint = str(parameter.annotation)
            if "str" in hint and "UuidLike" not in hint:
                found.append((op.name, name))
    return found


def _nul_call(op_name: str, name: str) -> tuple[str, dict[str, Any]]:
    op = operations()[op_name]
    arguments = {p: _placeholder(parameter.annotation) for p, parameter in op.signature.parameters.items()
                 if parameter.default is inspect.Parameter.empty}  # fmt: skip
    arguments[name] = "a\x00b"
    return op.name, arguments


@pytest.mark.parametrize(("op_name", "name"), _text_parameters())
def test_a_NUL_in_any_text_argument_is_InvalidArgument_sync_and_async(
    llm_conn: psycopg.Connection, llm_dsn: str, op_name: str, name: str
) -> None:
    """A NUL in a text argument: psycopg refuses to send it (no PostgreSQL text holds
    one) with a bare ``psycopg.DataError``; the driver gives the documented
    ``InvalidArgument`` (22023), as the server does for 'a\\x01b', on both clients,
    and nothing reaches the server (the connection is still idle, in no transaction)."""
    method, arguments = _nul_call(op_name, name)
    with pytest.raises(errors.InvalidArgument) as caught:
        getattr(Llm(llm_conn), method)(**arguments)
    assert caught.value.sqlstate == "22023" and "NUL" in caught.value.message
    assert llm_conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(llm_dsn, autocommit=True) as conn:
            with pytest.raises(errors.InvalidArgument):
                await getattr(AsyncLlm(conn), method)(**arguments)

    asyncio.run(scenario())


def test_a_NUL_in_an_end_user_writes_nothing_like_a_control_character(llm: Llm) -> None:
    """The reproduction: ``admit(org, 1, 'm', end_user='a\\x00b')`` raised psycopg's
    DataError while 'a\\x01b' raised InvalidArgument; both are now InvalidArgument and
    neither admits anything."""
    org = new_org(llm)
    for bad in ("a\x00b", "a\x01b"):
        with pytest.raises(errors.InvalidArgument):
            llm.admit(org, 1, "m", end_user=bad, now=T0)
    assert llm.admit(org, 1, "m", end_user="ab", now=T0).hold_credits == 1
    with llm.connection() as conn:
        assert conn.execute("SELECT count(*) FROM llm.invocations WHERE organization_id = %s",
                            [org]).fetchone() == (1,)  # fmt: skip


def test_a_value_python_cannot_read_is_no_bad_argument() -> None:
    """``sent()`` maps only what psycopg refuses to send; a server-side DataError keeps
    its own SQLSTATE and mapping."""
    server_side = psycopg.errors.NumericValueOutOfRange("out of range")
    with pytest.raises(psycopg.errors.NumericValueOutOfRange), errors.sent():
        raise server_side


# ---------------------------------------------------------------- amounts and ids

NOT_WHOLE = [1.5, 2.0, True, "3", float("nan")]


@pytest.mark.parametrize("amount", NOT_WHOLE, ids=repr)
def test_an_amount_that_is_no_integer_is_refused_before_anything_is_sent(
    llm: Llm, llm_conn: psycopg.Connection, amount: Any
) -> None:
    """settle(org, inv, 1.5, 0) charged 2 (the server rounded the float
    cast to bigint); a float, a bool or a string is InvalidArgument (22023), and the
    books do not change."""
    from decimal import Decimal

    org = new_org(llm, 1000)
    inv = llm.admit(org, 10, "model-a", now=T0).id
    before = fingerprint(llm_conn)
    with pytest.raises(errors.InvalidArgument) as caught:
        llm.settle(org, inv, amount, 0, now=T0)
    assert caught.value.sqlstate == "22023" and "credits" in caught.value.message
    with pytest.raises(errors.InvalidArgument):
        llm.admit(org, amount, "model-a", now=T0)
    assert fingerprint(llm_conn) == before
    assert llm.settle(org, inv, Decimal("2"), 0, now=T0) == models.Outcome.SETTLED  # a whole Decimal is one
    with pytest.raises(errors.InvalidArgument):
        llm.admit(org, Decimal("1.5"), "model-a", now=T0)


@pytest.mark.parametrize("org_id", ["not-a-uuid", "", 12, b"\x00" * 16], ids=repr)
def test_an_id_that_is_no_uuid_is_invalid_argument_not_22P02(
    llm: Llm, llm_conn: psycopg.Connection, org_id: Any
) -> None:
    """A non-UUID organization id surfaced as the raw 22P02 of the
    server's cast; the driver refuses it with InvalidArgument before sending anything."""
    before = fingerprint(llm_conn)
    with pytest.raises(errors.InvalidArgument) as caught:
        llm.admit(org_id, 1, "model-a", now=T0)
    assert "organization_id" in caught.value.message
    with pytest.raises(errors.InvalidArgument):
        llm.upsert_organization(org_id, "x", 1, now=T0)
    assert fingerprint(llm_conn) == before
    assert llm.upsert_organization(str(uuid.UUID(int=7)), "x", 1, now=T0).id == uuid.UUID(int=7)


def test_the_async_client_checks_amounts_and_ids_too(llm_dsn: str) -> None:
    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(llm_dsn, autocommit=True) as conn:
            llm = AsyncLlm(conn)
            with pytest.raises(errors.InvalidArgument):
                await llm.admit(uuid.uuid4(), 1.5, "model-a", now=T0)
            with pytest.raises(errors.InvalidArgument):
                await llm.admit("nope", 1, "model-a", now=T0)

    asyncio.run(run())


def test_a_refusal_carries_its_figures_as_fields(llm: Llm, llm_conn: psycopg.Connection) -> None:
    """AllowanceExhausted exposes limit, used, held and estimate, the
    window's start and when it resets (its end, UTC), parsed from the documented DETAIL
    of real refusals: the allowance and a budget of each window."""
    from datetime import UTC, date, datetime

    org = new_org(llm, 1_000)
    llm.set_budget(org, "api_key", "k", "day", 300, now=T0)
    llm.set_budget(org, "project", "p", "week", 400, now=T0)
    llm.set_budget(org, "end_user", "*", "month", 500, now=T0)
    inv = llm.admit(org, 200, "model-a", now=T0, api_key="k", project="p", end_user="u").id
    llm.settle(org, inv, 120, 0, now=T0)
    llm.admit(org, 50, "model-a", now=T0, api_key="k", project="p", end_user="u")  # held 50

    # T0 is Thursday 2026-01-15: day ends the 16th, the week (from Monday the 12th) the 19th
    cases = [
        ({"api_key": "k"}, 181, ("api_key", 300, date(2026, 1, 15), datetime(2026, 1, 16, tzinfo=UTC))),
        ({"project": "p"}, 231, ("project", 400, date(2026, 1, 12), datetime(2026, 1, 19, tzinfo=UTC))),
        ({"end_user": "u"}, 331, ("end_user", 500, date(2026, 1, 1), datetime(2026, 2, 1, tzinfo=UTC))),
        ({}, 831, ("organization", 1_000, date(2026, 1, 1), datetime(2026, 2, 1, tzinfo=UTC))),
    ]
    for scopes, estimate, (scope, limit, start, resets) in cases:
        error = refused(llm, org, estimate, **scopes)
        assert error.scope == scope
        assert (error.limit_credits, error.used_credits, error.held_credits, error.estimate_credits,
                error.window_start, error.resets_at) == (limit, 120, 50, estimate, start, resets), scope  # fmt: skip
        assert error.limit_credits - error.used_credits - error.held_credits < estimate  # why it refused
    assert invariants(llm_conn) == []


def test_a_refusal_without_figures_has_none(llm_conn: psycopg.Connection) -> None:
    raise_ll001 = "DO $$ BEGIN RAISE EXCEPTION 'llm: refused' USING ERRCODE = 'LL001', DETAIL = 'allowance=1 used=x'; END $$"
    with pytest.raises(errors.AllowanceExhausted) as caught, errors.mapped_errors():
        llm_conn.execute(raise_ll001)
    assert (caught.value.scope, caught.value.limit_credits, caught.value.resets_at) == ("organization", None, None)


# ---------------------------------------------------------------- the call path


def test_a_result_that_turns_numeric_under_a_running_client_still_reads_whole_numbers(llm_conn):
    """A result type changed under a running client (0.4.0's migration 0018 made sums
    numeric) must still read a whole numeric as int, not Decimal, and a non-whole one as
    Decimal: the client's cursors, kept from call to call, read every
    numeric through the whole-number loader, whatever the statement read before."""
    from decimal import Decimal

    llm_conn.execute("CREATE FUNCTION pg_temp.figure() RETURNS bigint LANGUAGE sql AS 'SELECT 7::bigint'")
    llm = Llm(llm_conn)
    statement = "SELECT pg_temp.figure() AS value"
    assert llm._execute(statement, {}) == [{"value": 7}]
    llm_conn.execute("DROP FUNCTION pg_temp.figure()")
    llm_conn.execute("CREATE FUNCTION pg_temp.figure() RETURNS numeric LANGUAGE sql AS 'SELECT 10::numeric ^ 20'")
    (value,) = [r["value"] for r in llm._execute(statement, {})]
    assert value == 10**20 and type(value) is int
    llm_conn.execute("DROP FUNCTION pg_temp.figure()")
    llm_conn.execute("CREATE FUNCTION pg_temp.figure() RETURNS numeric LANGUAGE sql AS 'SELECT 1.5'")
    assert llm._execute(statement, {}) == [{"value": Decimal("1.5")}]
    assert type(llm._execute(statement, {})[0]["value"]) is Decimal


def test_numerics_read_as_int_when_whole_and_as_decimal_otherwise(llm: Llm) -> None:
    """Module doc of llm_db.client: a whole numeric (digits, only zeros after a point) is
    an exact int however large, any other a Decimal, never a float; in a row as in a
    statement's one value."""
    from decimal import Decimal

    cases = {
        "12345678901234567890123": 12345678901234567890123, "-7": -7, "5.000": 5, "-0.0": 0,
        "1.50": Decimal("1.50"), "-0.001": Decimal("-0.001"),
    }  # fmt: skip
    for text, expected in cases.items():
        statement = f"SELECT '{text}'::numeric AS value"
        for value in (llm._execute_value(statement, {}), llm._execute(statement, {})[0]["value"]):
            assert value == expected and type(value) is type(expected), (text, value)
    nan = llm._execute_value("SELECT 'NaN'::numeric AS value", {})
    assert type(nan) is Decimal and nan.is_nan()


def test_a_client_on_one_connection_keeps_one_cursor(llm: Llm, monkeypatch: Any) -> None:
    """A cursor (a copy of the connection's adapters, the numeric loader
    registered in it) cost as much client CPU as the rest of a call; a client built on a
    connection makes one and reuses it, after a failed call too, and one that read many
    rows is not kept (it would hold its result)."""
    from llm_db import client

    made: list[Any] = []
    make = client._cursor

    def counted(conn: Any, *args: Any) -> Any:
        made.append(make(conn, *args))
        return made[-1]

    monkeypatch.setattr(client, "_cursor", counted)
    org = new_org(llm)
    for _ in range(5):
        inv = llm.admit_id(org, 1, "model-a", now=T0)
        assert llm.settle(org, inv, 1, 0, now=T0) is models.Outcome.SETTLED
    assert len(made) == 1
    with pytest.raises(errors.UnknownInvocation):
        llm.settle(org, uuid.uuid4(), 1, 0, now=T0)
    assert llm.admit(org, 1, "model-a", now=T0).organization_id == org
    assert len(made) == 2  # the failed call's cursor was dropped, not given back
    many = llm._execute("SELECT g AS value FROM generate_series(1, 3) AS g", {})
    assert [r["value"] for r in many] == [1, 2, 3]
    assert llm._execute_value("SELECT 4 AS value", {}) == 4
    assert len(made) == 3


def test_the_connections_row_factory_does_not_change_results(llm_connect: Any) -> None:
    """The driver reads rows its own way (tuples, mapped by column name), whatever row
    factory the application gave its connection."""
    from psycopg.rows import dict_row, namedtuple_row

    for factory in (dict_row, namedtuple_row):
        llm = Llm(llm_connect(row_factory=factory))
        org = new_org(llm)
        inv = llm.admit(org, 10, "model-a", now=T0)
        assert (inv.organization_id, inv.estimate_credits, inv.status) == (org, 10, "reserved")
        assert llm.settle(org, inv.id, 10, 1, now=T0) is models.Outcome.SETTLED


def test_each_value_statement_has_one_column_named_value(llm_conn: psycopg.Connection) -> None:
    """``_execute_value`` reads the first column of the first row: every statement the
    table gives the ``value`` shape returns exactly one column, ``value``, as the
    server describes it (prepared here with ``$n`` for its named parameters)."""
    values = [op for op in operations().values() if op.shape == "value"]
    assert len(values) > 10
    for n, op in enumerate(values):
        text = op.sql
        for i, name in enumerate(op.names, start=1):
            text = text.replace(f"%({name})s", f"${i}")
        llm_conn.execute(f"PREPARE value_{n} AS {text}")
        described = llm_conn.pgconn.describe_prepared(f"value_{n}".encode())
        names = [described.fname(i) for i in range(described.nfields)]
        assert names == [b"value"], (op.name, names)
