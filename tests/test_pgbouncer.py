"""Through a real PgBouncer (Debian's pgbouncer, ``llm_pgbouncer``) in transaction pooling
mode with 2 server connections: the driver with psycopg's defaults, the task wrapper, the
CLI and the demo work unchanged, and a pass cancelled through the pooler leaves nothing that
blocks the next one.

Transaction pooling hands each transaction of a client to whichever server connection is
free, so anything that lives in a session breaks there: server-side prepared statements
(psycopg prepares a statement after five executions), session advisory locks, SET.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from llm_db import AsyncLlm, Llm, async_with_llm_execution, with_llm_execution
from tests.helpers import (
    T0,
    InThread,
    assert_books_right,
    call_pass,
    declare_task,
    lock_period_rows,
    new_org,
    row,
    rows,
    scalar,
    wait_blocked,
    wait_for,
)

CLIENTS = 8
CYCLES = 200
LATER = T0 + timedelta(hours=25)  # past the 24 h recovery window


def assert_books_closed(conn: psycopg.Connection, org: uuid.UUID, cycles: int) -> None:
    """Every cycle settled once, nothing held, invariants empty."""
    counts = dict(
        conn.execute(
            "SELECT status, count(*) FROM llm.invocations WHERE organization_id = %s GROUP BY 1",
            [org],
        ).fetchall()
    )
    assert counts == {"settled": cycles}
    period = row(conn, "SELECT * FROM llm.periods WHERE organization_id = %s", [org])
    assert period is not None
    assert (period["held_credits"], period["used_credits"]) == (0, 7 * cycles)
    assert_books_right(conn)


def cycles(llm: Llm, org: uuid.UUID, count: int = CYCLES) -> None:
    """``count`` admit -> dispatch -> settle cycles."""
    for _ in range(count):
        inv = llm.admit(org, 10, "gpt-x")
        llm.mark_dispatched(org, inv.id)
        assert llm.settle(org, inv.id, 7, 1, input_tokens=100, output_tokens=20) == "settled"


async def async_cycle(llm: AsyncLlm, org: uuid.UUID) -> None:
    inv = await llm.admit(org, 10, "gpt-x")
    await llm.mark_dispatched(org, inv.id)
    assert await llm.settle(org, inv.id, 7, 1, input_tokens=100, output_tokens=20) == "settled"


def run_threads(target: Callable[[], None]) -> list[BaseException]:
    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            target()
        except BaseException as exc:  # collected, asserted empty below
            errors.append(exc)

    threads = [threading.Thread(target=guarded) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return errors


# ---------------------------------------------------------------- the driver with defaults


def test_sync_clients_with_psycopg_defaults_work_through_transaction_pooling(
    llm_conn, llm_pgbouncer_dsn
):
    """8 connections opened with psycopg's defaults x 200 admit -> dispatch -> settle cycles
    through PgBouncer (transaction mode, 2 server connections): no error, and the books are
    closed. psycopg would prepare each statement after 5 executions; the driver does not."""
    org = new_org(llm_conn, None)

    def client() -> None:
        with psycopg.connect(llm_pgbouncer_dsn, autocommit=True) as conn:
            cycles(Llm(conn), org)

    assert run_threads(client) == []
    assert_books_closed(llm_conn, org, CLIENTS * CYCLES)


def test_a_connection_pool_with_defaults_works_through_transaction_pooling(
    llm_conn, llm_pgbouncer_dsn
):
    """``Llm(pool)`` over a psycopg_pool.ConnectionPool with its defaults (connections not
    autocommit): 8 threads x 200 cycles, no error, books closed."""
    org = new_org(llm_conn, None)
    with ConnectionPool(llm_pgbouncer_dsn, min_size=CLIENTS, max_size=CLIENTS, open=True) as pool:
        assert run_threads(lambda: cycles(Llm(pool), org)) == []
    assert_books_closed(llm_conn, org, CLIENTS * CYCLES)


def test_async_clients_and_an_async_pool_work_through_transaction_pooling(
    llm_conn, llm_pgbouncer_dsn
):
    """``AsyncLlm`` over 8 AsyncConnections with their defaults, then over an
    AsyncConnectionPool: 8 tasks x 200 cycles each way, no error, books closed."""
    conns_org, pool_org = new_org(llm_conn, None), new_org(llm_conn, None)

    async def main() -> None:
        async def over_connection() -> None:
            async with await psycopg.AsyncConnection.connect(llm_pgbouncer_dsn) as conn:
                llm = AsyncLlm(conn)
                for _ in range(CYCLES):
                    await async_cycle(llm, conns_org)

        await asyncio.gather(*(over_connection() for _ in range(CLIENTS)))

        async with AsyncConnectionPool(
            llm_pgbouncer_dsn, min_size=CLIENTS, max_size=CLIENTS, open=False
        ) as pool:
            llm = AsyncLlm(pool)

            async def over_pool() -> None:
                for _ in range(CYCLES):
                    await async_cycle(llm, pool_org)

            await asyncio.gather(*(over_pool() for _ in range(CLIENTS)))

    asyncio.run(main())
    assert_books_closed(llm_conn, conns_org, CLIENTS * CYCLES)
    assert_books_closed(llm_conn, pool_org, CLIENTS * CYCLES)


def test_the_driver_prepares_nothing_unless_asked(llm_conn, llm_connect):
    """The default keeps no session state on the server; ``prepare=True`` opts in to
    psycopg's own behaviour (prepared after prepare_threshold executions), for direct or
    session-pooled connections."""
    org = new_org(llm_conn, None)
    plain, preparing = llm_connect(), llm_connect()
    for _ in range(8):
        cycles(Llm(plain), org, 1)
        cycles(Llm(preparing, prepare=True), org, 1)
    assert scalar(plain, "SELECT count(*) FROM pg_prepared_statements") == 0
    assert scalar(preparing, "SELECT count(*) FROM pg_prepared_statements") >= 3


def test_the_task_wrapper_works_through_transaction_pooling(llm_conn, llm_pgbouncer_dsn):
    """with_llm_execution and async_with_llm_execution over connections with psycopg's
    defaults, behind the pooler: the open commits before the body, the body's requests are
    linked, the task closes completed with their totals."""
    org = new_org(llm_conn, None)
    declare_task(llm_conn, "pooled.task")

    def body(ctx) -> str:
        for _ in range(6):
            inv = ctx.admit(10, "gpt-x")
            ctx.mark_dispatched(inv.id)
            ctx.settle(inv.id, credits=7, cents=1)
        return "done"

    async def async_body(ctx) -> str:
        for _ in range(6):
            inv = await ctx.admit(10, "gpt-x")
            await ctx.mark_dispatched(inv.id)
            await ctx.settle(inv.id, credits=7, cents=1)
        return "done"

    with psycopg.connect(llm_pgbouncer_dsn) as conn:
        result = with_llm_execution(Llm(conn), org, "pooled.task", body, replay_key="sync")
    assert result.value == "done"

    async def main():
        async with await psycopg.AsyncConnection.connect(llm_pgbouncer_dsn) as conn:
            return await async_with_llm_execution(
                AsyncLlm(conn), org, "pooled.task", async_body, replay_key="async"
            )

    async_result = asyncio.run(main())
    assert async_result.value == "done"
    tasks = rows(
        llm_conn,
        "SELECT replay_key, status, request_count, credits FROM llm.executions ORDER BY 1",
    )
    assert tasks == [
        {"replay_key": "async", "status": "completed", "request_count": 6, "credits": 42},
        {"replay_key": "sync", "status": "completed", "request_count": 6, "credits": 42},
    ]
    assert_books_right(llm_conn)


# ---------------------------------------------------------------- the CLI and the demo


def llm_db_cli(*args: str, dsn: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["DATABASE_URL"] = dsn
    return subprocess.run(
        [sys.executable, "-m", "llm_db.cli", *args],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip


def test_the_cli_works_through_transaction_pooling(llm_conn, llm_pgbouncer_dsn):
    """migrate, reconcile (with its progress watcher), health, report and metrics, each
    through the pooler, each as a user would run it."""
    org = new_org(llm_conn, 100)
    llm = Llm(llm_conn)
    for _ in range(3):
        inv = llm.admit(org, 10, "gpt-x", now=T0)
        llm.mark_dispatched(org, inv.id, now=T0)
    later = LATER.isoformat()

    migrated = llm_db_cli("migrate", dsn=llm_pgbouncer_dsn)
    assert migrated.returncode == 0, migrated.stderr
    for args in (["reconcile", "--now", later], ["reconcile", "--progress", "--now", later]):
        proc = llm_db_cli(*args, dsn=llm_pgbouncer_dsn)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert " succeeded " in proc.stdout
    health = llm_db_cli("health", "--now", later, dsn=llm_pgbouncer_dsn)
    assert health.returncode == 0, health.stdout + health.stderr
    report = llm_db_cli("report", "--json", "--now", later, dsn=llm_pgbouncer_dsn)
    assert report.returncode == 0, report.stderr
    metrics = llm_db_cli("metrics", "--now", later, dsn=llm_pgbouncer_dsn)
    assert metrics.returncode == 0, metrics.stderr
    assert 'llm_reconciliation_health{status="ok"} 1.0' in metrics.stdout
    assert_books_right(llm_conn)


def test_the_demo_with_dsn_works_through_transaction_pooling(llm_pgbouncer_dsn):
    """``llm-db demo --dsn <pgbouncer>``: the whole walk-through, exit 0, books right."""
    proc = subprocess.run(
        [sys.executable, "-m", "llm_db.cli", "demo", "--dsn", llm_pgbouncer_dsn,
         "--seed", "4", "--workers", "6"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


# ---------------------------------------------------------------- the pass guard


def test_a_pass_cancelled_through_the_pooler_never_blocks_the_next(
    llm_conn, llm_connect, llm_pgbouncer_dsn
):
    """A pass started through PgBouncer is cancelled mid-sweep and its client disconnects;
    the pooled server connection that ran it lives on. The next direct pass is not skipped:
    it takes the lease over at once, marks the abandoned run failed and recovers the
    request the cancelled pass could not."""
    org = new_org(llm_conn, None)
    llm = Llm(llm_conn)
    inv = llm.admit(org, 10, "gpt-x", now=T0)
    llm.mark_dispatched(org, inv.id, now=T0)
    llm_conn.execute("UPDATE llm.settings SET org_lock_timeout = '60s'")  # wait until cancelled
    blocker = llm_connect(autocommit=False)
    lock_period_rows(blocker, org)

    client = psycopg.connect(llm_pgbouncer_dsn, autocommit=True)
    cancelled = InThread(lambda: call_pass(client, LATER))
    pid = wait_for_pass_backend(llm_conn)
    wait_blocked(llm_conn, pid)
    client.cancel_safe()
    cancelled.join(20)
    assert isinstance(cancelled.error, psycopg.errors.QueryCanceled)
    client.close()
    blocker.rollback()
    # the server connection that ran the cancelled pass is still there, idle in the pool
    assert scalar(llm_conn, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]) == 1

    run = Llm(llm_connect()).run_reconciliation(now=LATER)
    assert run is not None and run.status == "succeeded" and run.requests_recovered == 1
    runs = rows(llm_conn, "SELECT status, errors FROM llm.reconciliation_runs ORDER BY started_at")
    assert [r["status"] for r in runs] == ["failed", "succeeded"]
    assert "abandoned" in runs[0]["errors"][-1]["error"]
    assert scalar(llm_conn, "SELECT token FROM llm.pass_lease") is None


def wait_for_pass_backend(observer: psycopg.Connection, timeout: float = 10.0) -> int:
    """The pid of the backend running CALL llm.run_reconciliation."""
    return wait_for(
        lambda: scalar(observer, "SELECT max(pid) FROM pg_stat_activity WHERE query ILIKE 'CALL llm.run_reconciliation%%'"
                                 " AND state = 'active' AND pid <> pg_backend_pid()"),
        "a backend running the pass", timeout,
    )


def test_the_driver_works_through_session_pooling(llm_server, llm_conn, llm_dsn):
    """Session mode keeps one server connection per client: the driver works with its
    defaults and with prepare=True there."""
    from llm_db.testing._pgbouncer import PgBouncer

    org = new_org(llm_conn, None)
    dbname = psycopg.conninfo.conninfo_to_dict(llm_dsn)["dbname"]
    with PgBouncer(llm_server, pool_mode="session", pool_size=4) as bouncer:
        with psycopg.connect(bouncer.dsn(dbname), autocommit=True) as conn:
            for _ in range(10):
                cycles(Llm(conn), org, 1)
                cycles(Llm(conn, prepare=True), org, 1)
    assert_books_closed(llm_conn, org, 20)


def test_the_pass_runs_through_transaction_pooling(llm_conn, llm_pgbouncer_dsn):
    """``Llm.run_reconciliation`` through the pooler: the procedure's commits keep one server
    connection for the whole CALL; the run it recorded is found and returned."""
    org = new_org(llm_conn, None)
    llm = Llm(llm_conn)
    inv = llm.admit(org, 10, "gpt-x", now=T0)
    with psycopg.connect(llm_pgbouncer_dsn) as conn:
        run = Llm(conn).run_reconciliation(now=LATER)
    assert run is not None and (run.status, run.requests_recovered) == ("succeeded", 1)
    assert scalar(llm_conn, "SELECT status FROM llm.invocations WHERE id = %s", [inv.id]) == "settled"
