"""The task wrapper (``llm_db.executions``): WF-PFM-LLM-002 hops 1-4 and its
replay branch, the STATE-PFM-LLM-002 transitions the wrapper drives, sync and
asyncio.

The four close paths are proved for real: a close fails because the body
closed the client's connection, so ``close_execution`` cannot reach the
server; a second connection observes what was committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from llm_db import executions
from llm_db.client import AsyncLlm, Llm
from llm_db.errors import AllowanceExhausted, NestedExecution, UnknownTaskKind
from tests.helpers import T0, execution, invariants

TASK = "report.generate"
LOGGER = "llm_db.executions"


class Clock:
    """A clock the test moves: the wrapper reads it at open, at close and in ctx helpers."""

    def __init__(self, t: datetime = T0) -> None:
        self.t = t

    def __call__(self) -> datetime:
        return self.t

    def advance(self, **delta: float) -> None:
        self.t += timedelta(**delta)


class Boom(Exception):
    """The body's own failure."""


@pytest.fixture
def org(llm_conn: psycopg.Connection) -> uuid.UUID:
    llm = Llm(llm_conn)
    org_id = uuid.uuid4()
    llm.upsert_organization(org_id, "wrapper org", 10_000, now=T0)
    llm.declare_task_kind(TASK)
    return org_id


@pytest.fixture
def llm(llm_connect: Any) -> Llm:
    """A client on a connection of its own (the test reads the books on llm_conn)."""
    return Llm(llm_connect())


def execution_row(conn: psycopg.Connection, org: uuid.UUID, execution_id: uuid.UUID) -> dict:
    found = execution(conn, org, execution_id)
    assert found is not None
    return found


def execution_count(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM llm.executions").fetchone()[0]


# ---------------------------------------------------------------- sync: the four close paths


def test_STATE_PFM_LLM_002_absent_to_running_commits_the_task_before_the_body_runs(
    llm: Llm, llm_conn: psycopg.Connection, org: uuid.UUID
) -> None:
    seen: dict[str, Any] = {}

    def body(ctx: executions.ExecutionContext) -> str:
        # another session already sees the running task: the open was committed
        seen["row"] = execution_row(llm_conn, org, ctx.execution_id)
        seen["current"] = executions.current_execution()
        return "done"

    result = executions.with_llm_execution(llm, org, TASK, body, subject_type="report", subject_id="9",
                                now=T0)
    assert seen["row"]["status"] == "running" and seen["row"]["ended_at"] is None
    assert (seen["row"]["subject_type"], seen["row"]["subject_id"]) == ("report", "9")
    assert isinstance(seen["current"], executions.ExecutionContext)
    assert seen["current"].execution_id == result.execution_id
    assert executions.current_execution() is None


def test_STATE_PFM_LLM_002_running_to_completed_body_ok_close_ok_stamps_end_and_duration(
    llm: Llm, llm_conn: psycopg.Connection, org: uuid.UUID
) -> None:
    clock = Clock()

    def body(ctx: executions.ExecutionContext) -> int:
        clock.advance(seconds=2.5)
        return 42

    result = executions.with_llm_execution(llm, org, TASK, body, now=clock)
    assert result == executions.ExecutionResult(result.execution_id, False, 42, "completed")
    stored = execution_row(llm_conn, org, result.execution_id)
    assert stored["status"] == "completed"
    assert stored["ended_at"] == clock.t and stored["duration_ms"] == 2500
    assert stored["error"] is None


def test_WF_PFM_LLM_002_hop4_body_ok_close_fails_raises_the_close_error_and_task_is_later_abandoned(
    llm_connect: Any, llm_conn: psycopg.Connection, org: uuid.UUID
) -> None:
    conn = llm_connect()
    llm = Llm(conn)
    opened: list[uuid.UUID] = []

    def body(ctx: executions.ExecutionContext) -> str:
        opened.append(ctx.execution_id)
        conn.close()  # the close that follows cannot reach the server
        return "work done"

    with pytest.raises(psycopg.OperationalError):
        executions.with_llm_execution(llm, org, TASK, body, now=T0)
    # STATE-PFM-LLM-002 "A running task can remain despite completed domain work" ...
    assert execution_row(llm_conn, org, opened[0])["status"] == "running"
    # ... and recovery later abandons it (running -> abandoned, WF-PFM-LLM-002 hop 5)
    observer = Llm(llm_conn)
    sweep = observer.reconcile_org(org, now=T0 + timedelta(hours=25))
    assert sweep.abandoned_executions == 1
    stored = execution_row(llm_conn, org, opened[0])
    assert stored["status"] == "abandoned" and stored["duration_ms"] is None


def test_STATE_PFM_LLM_002_running_to_failed_body_fails_close_ok_keeps_totals_and_the_error(
    llm: Llm, llm_conn: psycopg.Connection, org: uuid.UUID
) -> None:
    raised = Boom("provider said no")
    opened: list[uuid.UUID] = []

    def body(ctx: executions.ExecutionContext) -> None:
        opened.append(ctx.execution_id)
        inv = ctx.admit(100, "model-a")
        ctx.mark_dispatched(inv.id)
        ctx.settle(inv.id, 70, 9)
        raise raised

    with pytest.raises(Boom) as caught:
        executions.with_llm_execution(llm, org, TASK, body, now=T0)
    assert caught.value is raised  # the body's own exception, unchanged
    stored = execution_row(llm_conn, org, opened[0])
    assert stored["status"] == "failed" and stored["ended_at"] is not None
    assert stored["error"] == repr(raised)
    assert (stored["request_count"], stored["credits"], stored["cents"]) == (1, 70, 9)


def test_WF_PFM_LLM_002_hop4_body_fails_close_fails_logs_the_close_error_and_keeps_the_body_error(
    llm_connect: Any,
    llm_conn: psycopg.Connection,
    org: uuid.UUID,
    caplog: pytest.LogCaptureFixture,
) -> None:
    conn = llm_connect()
    llm = Llm(conn)
    raised = Boom("body failed")
    opened: list[uuid.UUID] = []

    def body(ctx: executions.ExecutionContext) -> None:
        opened.append(ctx.execution_id)
        conn.close()
        raise raised

    with caplog.at_level(logging.ERROR, logger=LOGGER), pytest.raises(Boom) as caught:
        executions.with_llm_execution(llm, org, TASK, body, now=T0)
    assert caught.value is raised
    assert caught.value.__context__ is None  # the close error did not replace or chain in
    logged = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.ERROR]
    assert len(logged) == 1
    assert isinstance(logged[0].exc_info[1], psycopg.OperationalError)
    assert str(opened[0]) in logged[0].getMessage()
    assert execution_row(llm_conn, org, opened[0])["status"] == "running"


def test_STATE_PFM_LLM_002_running_to_failed_error_is_the_repr_truncated_to_4000_chars(
    llm: Llm, llm_conn: psycopg.Connection, org: uuid.UUID
) -> None:
    def body(ctx: executions.ExecutionContext) -> None:
        raise Boom("x" * 5000)

    with pytest.raises(Boom):
        executions.with_llm_execution(llm, org, TASK, body, now=T0)
    [error] = [r[0] for r in llm_conn.execute("SELECT error FROM llm.executions")]  # the one task
    assert len(error) == 4000 and error.startswith("Boom('xxx")


# ---------------------------------------------------------------- sync: open, replay, nesting


def test_WF_PFM_LLM_002_hop1_rejected_open_creates_no_task_and_does_not_run_the_body(
    llm: Llm, llm_conn: psycopg.Connection, org: uuid.UUID
) -> None:
    ran: list[bool] = []
    with pytest.raises(UnknownTaskKind):
        executions.with_llm_execution(llm, org, "never.declared", lambda ctx: ran.append(True), now=T0)
    assert ran == [] and execution_count(llm_conn) == 0


def test_WF_PFM_LLM_002_branch_replay_returns_the_earlier_execution_without_running_the_body(
    llm: Llm, llm_conn: psycopg.Connection, org: uuid.UUID
) -> None:
    runs: list[uuid.UUID] = []

    def body(ctx: executions.ExecutionContext) -> str:
        runs.append(ctx.execution_id)
        return "first"

    first = executions.with_llm_execution(llm, org, TASK, body, replay_key="report:9", now=T0)
    again = executions.with_llm_execution(llm, org, TASK, body, replay_key="report:9", now=T0)
    # STATE-PFM-LLM-002 invalid running -> running: the same key does not run work again
    assert runs == [first.execution_id]
    assert again == executions.ExecutionResult(first.execution_id, True, None, "completed")
    assert execution_count(llm_conn) == 1

    # a failed earlier task replays as failed, still without running the body
    def failing(ctx: executions.ExecutionContext) -> None:
        raise Boom("no")

    with pytest.raises(Boom):
        executions.with_llm_execution(llm, org, TASK, failing, replay_key="report:10", now=T0)
    replay = executions.with_llm_execution(llm, org, TASK, body, replay_key="report:10", now=T0)
    assert (replay.replayed, replay.status, replay.value) == (True, "failed", None)
    assert len(runs) == 1


def test_STATE_PFM_LLM_002_absent_to_running_guard_rejects_nesting_and_creates_no_task(
    llm: Llm, llm_conn: psycopg.Connection, org: uuid.UUID
) -> None:
    inner_ran: list[bool] = []
    outer: list[uuid.UUID] = []

    def inner(ctx: executions.ExecutionContext) -> None:
        inner_ran.append(True)

    def body(ctx: executions.ExecutionContext) -> None:
        outer.append(ctx.execution_id)
        executions.with_llm_execution(llm, org, TASK, inner, now=T0)

    with pytest.raises(NestedExecution) as caught:
        executions.with_llm_execution(llm, org, TASK, body, now=T0)
    assert caught.value.sqlstate is None and caught.value.hint
    assert inner_ran == [] and execution_count(llm_conn) == 1
    # the outer body failed with the nesting error and was closed failed
    stored = execution_row(llm_conn, org, outer[0])
    assert stored["status"] == "failed" and "NestedExecution" in stored["error"]
    # the association ended with the wrapper: a new top-level task opens fine
    assert executions.with_llm_execution(llm, org, TASK, lambda ctx: 1, now=T0).status == "completed"


def test_WF_PFM_LLM_002_hop3_context_links_requests_and_a_late_settlement_adds_without_reopening(
    llm: Llm, llm_conn: psycopg.Connection, org: uuid.UUID
) -> None:
    clock = Clock()
    pending: list[uuid.UUID] = []

    def body(ctx: executions.ExecutionContext) -> None:
        done = ctx.admit(50, "model-a")
        ctx.mark_dispatched(done.id)
        assert ctx.settle(done.id, 40, 4, input_tokens=10, output_tokens=5) == "settled"
        failed = ctx.admit(20, "model-a")
        assert ctx.fail(failed.id, "provider 500", credits=2) == "failed"
        late = ctx.admit(30, "model-b")
        assert late.execution_id == ctx.execution_id and late.created_at == clock.t
        pending.append(late.id)
        clock.advance(seconds=1)

    result = executions.with_llm_execution(llm, org, TASK, body, now=clock)
    stored = execution_row(llm_conn, org, result.execution_id)
    assert (stored["status"], stored["request_count"], stored["credits"], stored["cents"]) == (
        "completed", 2, 42, 4,
    )
    # STATE-PFM-LLM-002 completed -> completed: a request settling after the close
    llm.settle(org, pending[0], 25, 3, now=clock.t)
    after = execution_row(llm_conn, org, result.execution_id)
    assert (after["status"], after["request_count"], after["credits"], after["cents"]) == (
        "completed", 3, 67, 7,
    )
    assert after["ended_at"] == stored["ended_at"]
    assert llm.check_invariants() == []


def test_WF_PFM_LLM_002_hop3_a_thread_keeps_the_task_only_through_copy_context(
    llm: Llm, org: uuid.UUID
) -> None:
    seen: dict[str, Any] = {}

    def body(ctx: executions.ExecutionContext) -> None:
        plain = threading.Thread(target=lambda: seen.__setitem__("plain", executions.current_execution()))
        copied_context = contextvars.copy_context()
        copied = threading.Thread(
            target=copied_context.run,
            args=(lambda: seen.__setitem__("copied", executions.current_execution()),),
        )
        for thread in (plain, copied):
            thread.start()
            thread.join()
        seen["ctx"] = ctx

    executions.with_llm_execution(llm, org, TASK, body, now=T0)
    assert seen["plain"] is None  # "a derived context loses the task association"
    assert seen["copied"] is seen["ctx"]


def test_STATE_PFM_LLM_002_invalid_failed_to_completed_close_returns_status_none(
    llm: Llm,
    llm_conn: psycopg.Connection,
    org: uuid.UUID,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def body(ctx: executions.ExecutionContext) -> str:
        # the task is closed failed behind the wrapper's back; its completed close must not win
        assert llm.close_execution(org, ctx.execution_id, "failed", error="by hand", now=T0)
        return "value"

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        result = executions.with_llm_execution(llm, org, TASK, body, now=T0)
    assert (result.value, result.status, result.replayed) == ("value", None, False)
    assert execution_row(llm_conn, org, result.execution_id)["status"] == "failed"
    assert any(r.levelno == logging.WARNING and r.name == LOGGER for r in caplog.records)


# ---------------------------------------------------------------- asyncio


class AsyncConnections:
    """A pool-like source: one new async connection per call, so tasks work at once."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            yield conn


def test_async_STATE_PFM_LLM_002_running_to_completed_body_ok_close_ok(
    llm_dsn: str, llm_conn: psycopg.Connection, org: uuid.UUID
) -> None:
    clock = Clock()

    async def body(ctx: executions.AsyncExecutionContext) -> str:
        assert executions.current_execution() is ctx
        inv = await ctx.admit(10, "model-a")
        await ctx.mark_dispatched(inv.id)
        assert await ctx.settle(inv.id, 8, 1) == "settled"
        other = await ctx.admit(10, "model-a")
        assert await ctx.fail(other.id, "nope") == "failed"
        clock.advance(seconds=1)
        return "ok"

    async def scenario() -> executions.ExecutionResult[str]:
        async with await psycopg.AsyncConnection.connect(llm_dsn, autocommit=True) as conn:
            return await executions.async_with_llm_execution(AsyncLlm(conn), org, TASK, body, now=clock)

    result = asyncio.run(scenario())
    assert (result.value, result.status, result.replayed) == ("ok", "completed", False)
    stored = execution_row(llm_conn, org, result.execution_id)
    assert (stored["status"], stored["duration_ms"], stored["request_count"], stored["credits"]) == (
        "completed", 1000, 2, 8,
    )
    assert executions.current_execution() is None


def async_task_whose_connection_dies(
    llm_dsn: str, org: uuid.UUID, raised: BaseException | None
) -> tuple[uuid.UUID, BaseException]:
    """async_with_llm_execution whose body closes the client's connection (so the close
    fails), then returns or raises ``raised``: the task's id and what the wrapper raised."""
    opened: list[uuid.UUID] = []

    async def scenario() -> BaseException:
        conn = await psycopg.AsyncConnection.connect(llm_dsn, autocommit=True)

        async def body(ctx: executions.AsyncExecutionContext) -> str:
            opened.append(ctx.execution_id)
            await conn.close()
            if raised is not None:
                raise raised
            return "done"

        try:
            await executions.async_with_llm_execution(AsyncLlm(conn), org, TASK, body, now=T0)
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            return exc
        raise AssertionError("the wrapper returned although its close failed")

    error = asyncio.run(scenario())
    return opened[0], error


def test_async_WF_PFM_LLM_002_hop4_body_ok_close_fails_raises_the_close_error(
    llm_dsn: str, llm_conn: psycopg.Connection, org: uuid.UUID
) -> None:
    task, error = async_task_whose_connection_dies(llm_dsn, org, None)
    assert isinstance(error, psycopg.OperationalError)
    assert execution_row(llm_conn, org, task)["status"] == "running"


def test_async_STATE_PFM_LLM_002_running_to_failed_body_fails_close_ok(
    llm_dsn: str, llm_conn: psycopg.Connection, org: uuid.UUID
) -> None:
    raised = Boom("async failure")
    opened: list[uuid.UUID] = []

    async def body(ctx: executions.AsyncExecutionContext) -> None:
        opened.append(ctx.execution_id)
        raise raised

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(llm_dsn, autocommit=True) as conn:
            with pytest.raises(Boom) as caught:
                await executions.async_with_llm_execution(AsyncLlm(conn), org, TASK, body, now=T0)
            assert caught.value is raised

    asyncio.run(scenario())
    stored = execution_row(llm_conn, org, opened[0])
    assert (stored["status"], stored["error"]) == ("failed", repr(raised))


def test_async_WF_PFM_LLM_002_hop4_body_fails_close_fails_logs_and_keeps_the_body_error(
    llm_dsn: str,
    llm_conn: psycopg.Connection,
    org: uuid.UUID,
    caplog: pytest.LogCaptureFixture,
) -> None:
    raised = Boom("async body failed")
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        task, error = async_task_whose_connection_dies(llm_dsn, org, raised)
    assert error is raised
    logged = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.ERROR]
    assert len(logged) == 1 and isinstance(logged[0].exc_info[1], psycopg.OperationalError)
    assert execution_row(llm_conn, org, task)["status"] == "running"


def test_async_WF_PFM_LLM_002_branch_replay_returns_the_earlier_execution_without_running_the_body(
    llm_dsn: str, llm_conn: psycopg.Connection, org: uuid.UUID
) -> None:
    runs: list[uuid.UUID] = []

    async def body(ctx: executions.AsyncExecutionContext) -> int:
        runs.append(ctx.execution_id)
        return 1

    async def scenario() -> tuple[executions.ExecutionResult[int], executions.ExecutionResult[int]]:
        async with await psycopg.AsyncConnection.connect(llm_dsn, autocommit=True) as conn:
            llm = AsyncLlm(conn)
            first = await executions.async_with_llm_execution(llm, org, TASK, body, replay_key="k", now=T0)
            again = await executions.async_with_llm_execution(llm, org, TASK, body, replay_key="k", now=T0)
            return first, again

    first, again = asyncio.run(scenario())
    assert runs == [first.execution_id]
    assert again == executions.ExecutionResult(first.execution_id, True, None, "completed")
    assert execution_count(llm_conn) == 1


def test_async_STATE_PFM_LLM_002_absent_to_running_guard_rejects_nesting_even_in_a_child_task(
    llm_dsn: str, llm_conn: psycopg.Connection, org: uuid.UUID
) -> None:
    llm = AsyncLlm(AsyncConnections(llm_dsn))

    async def inner(ctx: executions.AsyncExecutionContext) -> None:
        raise AssertionError("the nested body must not run")

    async def body(ctx: executions.AsyncExecutionContext) -> None:
        with pytest.raises(NestedExecution):
            await executions.async_with_llm_execution(llm, org, TASK, inner, now=T0)
        # a child task inherits the association, so nesting is rejected there too
        child = asyncio.create_task(executions.async_with_llm_execution(llm, org, TASK, inner, now=T0))
        with pytest.raises(NestedExecution):
            await child

    result = asyncio.run(executions.async_with_llm_execution(llm, org, TASK, body, now=T0))
    assert result.status == "completed" and execution_count(llm_conn) == 1


def test_async_WF_PFM_LLM_002_hop3_child_tasks_keep_the_task_association(
    llm_dsn: str, llm_conn: psycopg.Connection, org: uuid.UUID
) -> None:
    llm = AsyncLlm(AsyncConnections(llm_dsn))

    async def one_request(n: int) -> uuid.UUID:
        ctx = executions.current_execution()  # found through the copied context, not passed in
        assert isinstance(ctx, executions.AsyncExecutionContext)
        inv = await ctx.admit(10, f"model-{n}")
        await ctx.settle(inv.id, n, 0)
        return ctx.execution_id

    async def body(ctx: executions.AsyncExecutionContext) -> list[uuid.UUID]:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one_request(n)) for n in (1, 2, 3)]
        return [t.result() for t in tasks]

    result = asyncio.run(executions.async_with_llm_execution(llm, org, TASK, body, now=T0))
    assert result.value == [result.execution_id] * 3
    stored = execution_row(llm_conn, org, result.execution_id)
    assert (stored["request_count"], stored["credits"]) == (3, 6)


def test_async_independent_top_level_tasks_run_wrappers_side_by_side_without_nesting(
    llm_dsn: str, llm_conn: psycopg.Connection, org: uuid.UUID
) -> None:
    llm = AsyncLlm(AsyncConnections(llm_dsn))

    async def scenario() -> list[executions.ExecutionResult[uuid.UUID]]:
        arrived: list[uuid.UUID] = []
        gate = asyncio.Event()

        async def body(ctx: executions.AsyncExecutionContext) -> uuid.UUID:
            arrived.append(ctx.execution_id)
            if len(arrived) == 2:
                gate.set()
            await asyncio.wait_for(gate.wait(), timeout=10)  # both bodies are running at once
            assert executions.current_execution() is ctx
            return ctx.execution_id

        return await asyncio.gather(
            executions.async_with_llm_execution(llm, org, TASK, body, now=T0),
            executions.async_with_llm_execution(llm, org, TASK, body, now=T0),
        )

    first, second = asyncio.run(scenario())
    assert first.execution_id != second.execution_id
    assert first.value == first.execution_id and second.value == second.execution_id
    assert execution_count(llm_conn) == 2


def test_async_STATE_PFM_LLM_002_running_to_failed_when_the_body_is_cancelled(
    llm_dsn: str, llm_conn: psycopg.Connection, org: uuid.UUID
) -> None:
    llm = AsyncLlm(AsyncConnections(llm_dsn))
    opened: list[uuid.UUID] = []

    async def scenario() -> None:
        started = asyncio.Event()

        async def body(ctx: executions.AsyncExecutionContext) -> None:
            opened.append(ctx.execution_id)
            started.set()
            await asyncio.Event().wait()  # never set: the task is cancelled here

        task = asyncio.create_task(executions.async_with_llm_execution(llm, org, TASK, body, now=T0))
        await asyncio.wait_for(started.wait(), timeout=10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    stored = execution_row(llm_conn, org, opened[0])
    assert stored["status"] == "failed" and "CancelledError" in stored["error"]


# ---------------------------------------------------------------- scope ids


def scope_ids(conn: psycopg.Connection, execution_id: uuid.UUID) -> list[tuple]:
    """(estimate, project, api_key, end_user) of the task's requests, in admission order."""
    return conn.execute(
        "SELECT i.estimate_credits, i.project, i.api_key, i.end_user FROM llm.invocations AS i"
        " WHERE i.execution_id = %(id)s::uuid ORDER BY i.created_at, i.estimate_credits",
        {"id": execution_id},
    ).fetchall()


#: what each body below admits, and under which scope ids it must have been admitted
SCOPED_REQUESTS = [
    (1, {}, ("proj-1", None, "user-1")),  # the wrapper's defaults
    (2, {"end_user": "user-2"}, ("proj-1", None, "user-2")),  # a value on the call wins
    (3, {"end_user": None}, ("proj-1", None, None)),  # None too: no end user
    (4, {"api_key": "key-1"}, ("proj-1", "key-1", "user-1")),  # the others stay defaults
]


def test_the_wrapper_s_scope_ids_are_its_requests_defaults_and_a_call_s_own_win(
    llm: Llm, llm_conn: psycopg.Connection, org: uuid.UUID
) -> None:
    """with_llm_execution takes project=, api_key=, end_user= as the defaults of
    its body's requests (ctx.admit and ctx.admit_id); a value given on a call wins, None
    included. A budget that refuses names the default id, and the task closes failed."""
    Llm(llm_conn).set_budget(org, "end_user", "*", "day", 20, now=T0)

    def body(ctx: executions.ExecutionContext) -> None:
        for estimate, scopes, _ in SCOPED_REQUESTS:
            admit = ctx.admit_id if estimate % 2 else ctx.admit
            admit(estimate, "model-a", **scopes)
        ctx.admit(20, "model-a")  # user-1 has 1 + 4 held under its default budget of 20

    scopes = {"project": "proj-1", "end_user": "user-1"}
    with pytest.raises(AllowanceExhausted) as caught:
        executions.with_llm_execution(llm, org, TASK, body, now=T0, **scopes)
    error = caught.value
    assert (error.scope, error.scope_id, error.window) == ("end_user", "user-1", "day")
    [(execution_id, status)] = llm_conn.execute("SELECT id, status FROM llm.executions").fetchall()
    assert status == "failed"
    assert scope_ids(llm_conn, execution_id) == [(e, *ids) for e, _, ids in SCOPED_REQUESTS]
    assert invariants(llm_conn) == []


def test_async_the_wrapper_s_scope_ids_are_its_requests_defaults_and_a_call_s_own_win(
    llm_dsn: str, llm_conn: psycopg.Connection, org: uuid.UUID
) -> None:
    """On asyncio: async_with_llm_execution takes project=, api_key=, end_user= as
    the defaults of its body's requests, including in child tasks; a value on a call wins."""

    async def body(ctx: executions.AsyncExecutionContext) -> int:
        async def one(estimate: int, scopes: dict) -> None:
            admit = ctx.admit_id if estimate % 2 else ctx.admit
            await admit(estimate, "model-a", **scopes)

        for estimate, scopes, _ in SCOPED_REQUESTS:  # one by one: admission order is the check's
            await asyncio.create_task(one(estimate, scopes))
        return len(SCOPED_REQUESTS)

    async def scenario() -> executions.ExecutionResult[int]:
        async with await psycopg.AsyncConnection.connect(llm_dsn, autocommit=True) as conn:
            return await executions.async_with_llm_execution(
                AsyncLlm(conn), org, TASK, body, now=T0, project="proj-1", end_user="user-1"
            )

    result = asyncio.run(scenario())
    assert (result.status, result.value) == ("completed", 4)
    assert scope_ids(llm_conn, result.execution_id) == [(e, *ids) for e, _, ids in SCOPED_REQUESTS]
    assert invariants(llm_conn) == []
