"""asyncpg, a client that is not ours, through the test PgBouncer (``llm_pgbouncer``:
transaction pooling, 2 server connections), as docs/integration.md ("Behind a
pooler: PgBouncer in transaction mode") tells its users.

asyncpg prepares every statement under a name (``__asyncpg_stmt_N__``) and keeps it in a
per-connection cache; transaction pooling runs the next transaction on whichever server
connection is free, which never saw that name. The move is made deterministic: after the
first query, that server connection is held in an open transaction by another client, so
the second query can only run on the other one. With ``statement_cache_size=0`` asyncpg
uses the unnamed statement, which lives within one round trip, and the documented SQL
runs the request cycle with the books right.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import psycopg
import pytest

from tests.helpers import assert_books_right, new_org, row

CLIENTS = 2
CYCLES = 50
INTEGRATION = Path(__file__).resolve().parents[1] / "docs" / "integration.md"

# The request cycle as docs/integration.md "From any other language: plain SQL" writes it
# (test_the_statements_are_the_documented_ones checks that it still does).
ADMIT = """SELECT id, hold_credits
  FROM llm.admit_invocation(p_organization_id => $1, p_estimate_credits => $2, p_model => $3);"""
DISPATCH = "SELECT status FROM llm.mark_dispatched(p_organization_id => $1, p_invocation_id => $2);"
SETTLE = """SELECT llm.settle_invocation(p_organization_id => $1, p_invocation_id => $2,
                             p_credits => $3, p_cents => $4,
                             p_input_tokens => $5, p_output_tokens => $6);"""
PID = "SELECT pg_backend_pid()"


def connect_kwargs(dsn: str) -> dict[str, Any]:
    """asyncpg takes a URL or keywords, not a libpq key=value conninfo."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    return {"host": info["host"], "port": int(info["port"]), "user": info["user"],
            "database": info["dbname"]}  # fmt: skip


async def on_another_server(
    dsn: str, conn: asyncpg.Connection, query: Callable[[], Awaitable[Any]]
) -> tuple[int, Any]:
    """Run ``query`` on ``conn`` after the server connection that answered its previous
    statement is held in an open transaction by another client, so the pool (2 server
    connections) can give it only the other one. Returns that first backend's pid and
    what ``query`` returned."""
    first = await conn.fetchval(PID)
    holders = [psycopg.connect(dsn) for _ in range(2)]  # one transaction on each server connection
    try:
        held = {h.execute(PID).fetchone()[0]: h for h in holders}
        assert first in held and len(held) == 2, (first, held)
        for pid, holder in held.items():
            if pid != first:
                holder.commit()  # frees the other server connection
        return first, await query()
    finally:
        for holder in holders:
            holder.close()


def test_asyncpgs_default_statement_cache_fails_behind_transaction_pooling(llm_pgbouncer_dsn):
    """With asyncpg's defaults the same statement, run again, is looked up by
    its name on a server connection that never prepared it: 26000, whose message asyncpg
    itself completes with a HINT naming statement_cache_size=0."""

    async def scenario() -> None:
        conn = await asyncpg.connect(**connect_kwargs(llm_pgbouncer_dsn))
        try:
            with pytest.raises(asyncpg.exceptions.InvalidSQLStatementNameError) as caught:
                await on_another_server(llm_pgbouncer_dsn, conn, lambda: conn.fetchval(PID))
        finally:
            await conn.close()
        assert caught.value.sqlstate == "26000"
        assert re.fullmatch(r'prepared statement "__asyncpg_stmt_\d+__" does not exist',
                            caught.value.args[0]), caught.value.args  # fmt: skip
        assert "statement_cache_size to 0" in caught.value.hint

    asyncio.run(scenario())


def test_asyncpg_without_a_statement_cache_runs_the_request_cycle_behind_transaction_pooling(
    llm_conn, llm_pgbouncer_dsn
):
    """With statement_cache_size=0 the same move works (the query ran on the
    other server connection), and 2 connections x 50 admit -> dispatch -> settle cycles of the
    documented SQL go through: every request settled once, llm.check_invariants() empty."""
    org = new_org(llm_conn, None, now=None)

    async def cycles(conn: asyncpg.Connection) -> None:
        for _ in range(CYCLES):
            admitted = await conn.fetchrow(ADMIT, org, 10, "gpt-4o")
            assert admitted["hold_credits"] == 10
            assert await conn.fetchval(DISPATCH, org, admitted["id"]) == "dispatched"
            assert await conn.fetchval(SETTLE, org, admitted["id"], 7, 1, 100, 20) == "settled"

    async def connect() -> asyncpg.Connection:
        return await asyncpg.connect(**connect_kwargs(llm_pgbouncer_dsn), statement_cache_size=0)

    async def main() -> None:
        conn = await connect()
        try:  # the move first, on its own: it needs the pool's 2 server connections
            first, moved = await on_another_server(
                llm_pgbouncer_dsn, conn, lambda: conn.fetchval(PID)
            )
            assert moved != first
        finally:
            await conn.close()
        conns = [await connect() for _ in range(CLIENTS)]
        try:
            await asyncio.gather(*(cycles(c) for c in conns))
        finally:
            for c in conns:
                await c.close()

    asyncio.run(main())
    settled = CLIENTS * CYCLES
    period = row(llm_conn, "SELECT held_credits, used_credits FROM llm.periods"
                 " WHERE organization_id = %s", [org])  # fmt: skip
    assert period == {"held_credits": 0, "used_credits": 7 * settled}
    assert row(llm_conn, "SELECT count(*) AS n FROM llm.invocations WHERE organization_id = %s"
               " AND status = 'settled'", [org]) == {"n": settled}  # fmt: skip
    assert_books_right(llm_conn)


def test_the_statements_are_the_documented_ones():
    """The SQL run above is docs/integration.md's, and the doc says how to run it behind a
    transaction pooler from asyncpg, JDBC and node-postgres."""
    doc = " ".join(INTEGRATION.read_text().split())
    for statement in (ADMIT, DISPATCH, SETTLE):
        assert " ".join(statement.split()) in doc, statement
    for advice in ("statement_cache_size=0", "prepareThreshold=0", "node-postgres"):
        assert advice in doc, advice
    # The task example returns named columns, not one composite column
    assert "SELECT llm.admit_invocation(" not in doc
