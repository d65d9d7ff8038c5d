"""The call layer: ``Llm`` (sync) and ``AsyncLlm`` (asyncio) clients.

Both take a psycopg connection or a pool (anything whose ``.connection()`` is a
context manager yielding a connection, such as ``psycopg_pool.ConnectionPool``)
and expose one method per ``llm`` function, returning the dataclasses of
``llm_db.models`` and raising the exceptions of ``llm_db.errors``. A consumer
writes no SQL:

    llm = Llm(pool)
    inv = llm.admit(org_id, estimate_credits=500, model="gpt-x")
    llm.mark_dispatched(org_id, inv.id)
    llm.settle(org_id, inv.id, credits=420, cents=13)

Like psycopg's own ``Connection`` / ``AsyncConnection`` split, the two classes
share everything but the thin layer that talks to the connection: each method
builds a ``_Call`` (SQL from ``llm_db.queries``, named parameters, a result
mapper) that both run the same way.

Every call is its own transaction, committed when the method returns, whether
the connection is autocommit or not (on an idle autocommit connection the one
statement is its own transaction; otherwise ``conn.transaction()`` wraps it). If the caller
already has a transaction open on that connection, the call runs in a
savepoint of it instead and commits with it. ``run_reconciliation`` is the
exception: the procedure commits after each organization, so it needs an idle
connection (it switches it to autocommit for the call and back).

No statement is prepared on the server unless the client is built with
``prepare=True``: psycopg's default (prepare after five executions) breaks
behind PgBouncer in transaction pooling mode, where the next transaction may
run on another server connection that never saw the statement.

Every method takes an optional ``now=`` (a timezone-aware datetime): the clock
the SQL uses, so tests move time instead of sleeping; None means ``now()``.
Share a pool, not a connection, between threads or tasks that work at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from datetime import date, datetime
from typing import Any, Generic, TypeVar
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

from llm_db import queries
from llm_db.errors import mapped_errors
from llm_db.models import (
    Execution,
    Health,
    InvariantViolation,
    Invocation,
    Notice,
    Organization,
    OrgSweep,
    Outcome,
    ReconciliationRun,
)

__all__ = ["AsyncLlm", "Llm"]

T = TypeVar("T")
Row = dict[str, Any]
UuidLike = UUID | str


# ----------------------------------------------------------- shared: calls and result mapping


@dataclasses.dataclass(frozen=True, slots=True)
class _Call(Generic[T]):
    """One statement, its named parameters, and how its rows become the result."""

    sql: str
    params: Mapping[str, Any]
    result: Callable[[list[Row]], T]


def _one(model: Any) -> Callable[[list[Row]], Any]:
    return lambda rows: model.from_row(rows[0])


def _many(model: Any) -> Callable[[list[Row]], Any]:
    return lambda rows: [model.from_row(row) for row in rows]


def _value(column: str, convert: Callable[[Any], T] | None = None) -> Callable[[list[Row]], T]:
    def pick(rows: list[Row]) -> Any:
        value = rows[0][column]
        return convert(value) if convert is not None else value

    return pick


def _nothing(rows: list[Row]) -> None:
    return None


class _Calls:
    """The ``_Call`` of every method, shared by ``Llm`` and ``AsyncLlm``."""

    @staticmethod
    def upsert_organization(
        organization_id: UuidLike,
        name: str,
        monthly_allowance_credits: int | None,
        status: str,
        notice_thresholds: Iterable[int],
        now: datetime | None,
    ) -> _Call[Organization]:
        return _Call(
            queries.UPSERT_ORGANIZATION,
            {
                "organization_id": organization_id,
                "name": name,
                "monthly_allowance_credits": monthly_allowance_credits,
                "status": status,
                "notice_thresholds": list(notice_thresholds),
                "now": now,
            },
            _one(Organization),
        )

    @staticmethod
    def set_recovery_policy(
        organization_id: UuidLike, recovery_charge: str, late_settlement: str
    ) -> _Call[Organization]:
        return _Call(
            queries.SET_RECOVERY_POLICY,
            {
                "organization_id": organization_id,
                "recovery_charge": recovery_charge,
                "late_settlement": late_settlement,
            },
            _one(Organization),
        )

    @staticmethod
    def set_period_stripes(organization_id: UuidLike, stripes: int) -> _Call[int]:
        return _Call(
            queries.SET_PERIOD_STRIPES,
            {"organization_id": organization_id, "stripes": stripes},
            _value("stripes", int),
        )

    @staticmethod
    def declare_task_kind(key: str, description: str | None) -> _Call[None]:
        return _Call(queries.DECLARE_TASK_KIND, {"key": key, "description": description}, _nothing)

    @staticmethod
    def admit(
        organization_id: UuidLike,
        estimate_credits: int,
        model: str,
        execution_id: UuidLike | None,
        invocation_id: UuidLike | None,
        now: datetime | None,
    ) -> _Call[Invocation]:
        return _Call(
            queries.ADMIT,
            {
                "organization_id": organization_id,
                "estimate_credits": estimate_credits,
                "model": model,
                "execution_id": execution_id,
                "invocation_id": invocation_id,
                "now": now,
            },
            _one(Invocation),
        )

    @staticmethod
    def admit_id(
        organization_id: UuidLike,
        estimate_credits: int,
        model: str,
        execution_id: UuidLike | None,
        invocation_id: UuidLike | None,
        now: datetime | None,
    ) -> _Call[UUID]:
        return _Call(
            queries.ADMIT_ID,
            {
                "organization_id": organization_id,
                "estimate_credits": estimate_credits,
                "model": model,
                "execution_id": execution_id,
                "invocation_id": invocation_id,
                "now": now,
            },
            _value("id"),
        )

    @staticmethod
    def mark_dispatched(
        organization_id: UuidLike, invocation_id: UuidLike, now: datetime | None
    ) -> _Call[Invocation]:
        return _Call(
            queries.MARK_DISPATCHED,
            {"organization_id": organization_id, "invocation_id": invocation_id, "now": now},
            _one(Invocation),
        )

    @staticmethod
    def settle(
        organization_id: UuidLike,
        invocation_id: UuidLike,
        credits: int,
        cents: int,
        input_tokens: int | None,
        output_tokens: int | None,
        now: datetime | None,
    ) -> _Call[Outcome]:
        return _Call(
            queries.SETTLE,
            {
                "organization_id": organization_id,
                "invocation_id": invocation_id,
                "credits": credits,
                "cents": cents,
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "now": now,
            },
            _value("outcome", Outcome),
        )

    @staticmethod
    def fail(
        organization_id: UuidLike,
        invocation_id: UuidLike,
        error: str,
        credits: int,
        cents: int,
        now: datetime | None,
    ) -> _Call[Outcome]:
        return _Call(
            queries.FAIL,
            {
                "organization_id": organization_id,
                "invocation_id": invocation_id,
                "error": error,
                "credits": credits,
                "cents": cents,
                "now": now,
            },
            _value("outcome", Outcome),
        )

    @staticmethod
    def open_execution(
        organization_id: UuidLike,
        task_key: str,
        subject_type: str | None,
        subject_id: str | None,
        replay_key: str | None,
        now: datetime | None,
    ) -> _Call[Execution]:
        return _Call(
            queries.OPEN_EXECUTION,
            {
                "organization_id": organization_id,
                "task_key": task_key,
                "subject_type": subject_type,
                "subject_id": subject_id,
                "replay_key": replay_key,
                "now": now,
            },
            _one(Execution),
        )

    @staticmethod
    def close_execution(
        organization_id: UuidLike,
        execution_id: UuidLike,
        outcome: str,
        error: str | None,
        now: datetime | None,
    ) -> _Call[bool]:
        return _Call(
            queries.CLOSE_EXECUTION,
            {
                "organization_id": organization_id,
                "execution_id": execution_id,
                "outcome": outcome,
                "error": error,
                "now": now,
            },
            _value("closed", bool),
        )

    @staticmethod
    def reconcile_org(
        organization_id: UuidLike, now: datetime | None, batch: int | None
    ) -> _Call[OrgSweep]:
        return _Call(
            queries.RECONCILE_ORG,
            {"organization_id": organization_id, "now": now, "batch": batch},
            _one(OrgSweep),
        )

    @staticmethod
    def health(now: datetime | None) -> _Call[Health]:
        return _Call(queries.HEALTH, {"now": now}, _one(Health))

    @staticmethod
    def schedule_reconciliation(schedule: str) -> _Call[int]:
        return _Call(queries.SCHEDULE_RECONCILIATION, {"schedule": schedule}, _value("job_id", int))

    @staticmethod
    def unschedule_reconciliation() -> _Call[bool]:
        return _Call(queries.UNSCHEDULE_RECONCILIATION, {}, _value("removed", bool))

    @staticmethod
    def claim_notices(limit: int, now: datetime | None) -> _Call[list[Notice]]:
        return _Call(queries.CLAIM_NOTICES, {"limit": limit, "now": now}, _many(Notice))

    @staticmethod
    def complete_notice(
        organization_id: UuidLike, notice_id: UuidLike, now: datetime | None
    ) -> _Call[bool]:
        return _Call(
            queries.COMPLETE_NOTICE,
            {"organization_id": organization_id, "notice_id": notice_id, "now": now},
            _value("done", bool),
        )

    @staticmethod
    def fail_notice(
        organization_id: UuidLike, notice_id: UuidLike, error: str, now: datetime | None
    ) -> _Call[bool]:
        return _Call(
            queries.FAIL_NOTICE,
            {"organization_id": organization_id, "notice_id": notice_id, "error": error, "now": now},
            _value("done", bool),
        )

    @staticmethod
    def release_notice(
        organization_id: UuidLike, notice_id: UuidLike, now: datetime | None
    ) -> _Call[bool]:
        return _Call(
            queries.RELEASE_NOTICE,
            {"organization_id": organization_id, "notice_id": notice_id, "now": now},
            _value("released", bool),
        )

    @staticmethod
    def rearm_notices(now: datetime | None) -> _Call[int]:
        return _Call(queries.REARM_NOTICES, {"now": now}, _value("rearmed", int))

    @staticmethod
    def rebuild_daily_usage(day_from: date, day_to: date) -> _Call[int]:
        return _Call(
            queries.REBUILD_DAILY_USAGE,
            {"day_from": day_from, "day_to": day_to},
            _value("rows_written", int),
        )

    @staticmethod
    def check_invariants() -> _Call[list[InvariantViolation]]:
        return _Call(queries.CHECK_INVARIANTS, {}, _many(InvariantViolation))

    @staticmethod
    def distribute(shard_count: int | None) -> _Call[str]:
        return _Call(queries.DISTRIBUTE, {"shard_count": shard_count}, _value("report", str))


def _idle_autocommit(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    return conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def _own_transaction(conn: psycopg.Connection[Any]) -> contextlib.AbstractContextManager[Any]:
    """Each call is one statement, so on an idle autocommit connection it is its own
    transaction already; BEGIN/COMMIT would add two round trips for nothing."""
    return contextlib.nullcontext() if _idle_autocommit(conn) else conn.transaction()


def _own_async_transaction(
    conn: psycopg.AsyncConnection[Any],
) -> contextlib.AbstractAsyncContextManager[Any]:
    return contextlib.nullcontext() if _idle_autocommit(conn) else conn.transaction()


def _run_params(now: datetime | None, batch: int | None) -> dict[str, Any]:
    return {"now": now, "batch": batch}


def _recorded_run(rows: Sequence[Row]) -> ReconciliationRun | None:
    return ReconciliationRun.from_row(rows[0]) if rows else None


# ----------------------------------------------------------- sync


class Llm:
    """Synchronous client over a ``psycopg.Connection`` or a connection pool."""

    def __init__(self, source: Any, *, prepare: bool = False) -> None:
        """``source``: a ``psycopg.Connection``, or anything whose ``.connection()``
        is a context manager yielding one (``psycopg_pool.ConnectionPool``).

        ``prepare``: False (the default) never prepares a statement on the server,
        so the client works unchanged through PgBouncer in transaction pooling
        mode, where consecutive transactions land on different server
        connections; True lets psycopg prepare as it does by default (after
        ``prepare_threshold`` executions), for direct or session-pooled
        connections only (docs/operations.md, "Poolers")."""
        self.source = source
        self.prepare = prepare
        self._prepare: bool | None = None if prepare else False

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """The connection the next call uses (borrowed from the pool, if one was given)."""
        if isinstance(self.source, psycopg.Connection):
            yield self.source
        else:
            with self.source.connection() as conn:
                yield conn

    def _run(self, call: _Call[T]) -> T:
        with self.connection() as conn, mapped_errors():
            with _own_transaction(conn), conn.cursor(row_factory=dict_row) as cur:
                cur.execute(call.sql, call.params, prepare=self._prepare)
                rows = cur.fetchall()
        return call.result(rows)

    # organizations and catalog

    def upsert_organization(
        self,
        organization_id: UuidLike,
        name: str,
        monthly_allowance_credits: int | None,
        *,
        status: str = "operational",
        notice_thresholds: Iterable[int] = (80, 100),
        now: datetime | None = None,
    ) -> Organization:
        """Create or update an organization (allowance None = unlimited)."""
        return self._run(
            _Calls.upsert_organization(
                organization_id, name, monthly_allowance_credits, status, notice_thresholds, now
            )
        )

    def set_recovery_policy(
        self, organization_id: UuidLike, recovery_charge: str, late_settlement: str
    ) -> Organization:
        """What recovery charges (estimate | dispatched | none) and what a late measured
        settlement does (audit | true_up) for this organization."""
        return self._run(
            _Calls.set_recovery_policy(organization_id, recovery_charge, late_settlement)
        )

    def set_period_stripes(self, organization_id: UuidLike, stripes: int) -> int:
        """Spread the organization's period counters over ``stripes`` rows (1-64)."""
        return self._run(_Calls.set_period_stripes(organization_id, stripes))

    def declare_task_kind(self, key: str, description: str | None = None) -> None:
        """Declare a task kind; idempotent."""
        return self._run(_Calls.declare_task_kind(key, description))

    # requests

    def admit(
        self,
        organization_id: UuidLike,
        estimate_credits: int,
        model: str,
        *,
        execution_id: UuidLike | None = None,
        invocation_id: UuidLike | None = None,
        now: datetime | None = None,
    ) -> Invocation:
        """Admit a request and place its hold (``AllowanceExhausted`` when it does not fit)."""
        return self._run(
            _Calls.admit(organization_id, estimate_credits, model, execution_id, invocation_id, now)
        )

    def admit_id(
        self,
        organization_id: UuidLike,
        estimate_credits: int,
        model: str,
        *,
        execution_id: UuidLike | None = None,
        invocation_id: UuidLike | None = None,
        now: datetime | None = None,
    ) -> UUID:
        """``admit``, returning only the request's id (one column instead of a whole row)."""
        return self._run(
            _Calls.admit_id(organization_id, estimate_credits, model, execution_id, invocation_id, now)
        )

    def mark_dispatched(
        self, organization_id: UuidLike, invocation_id: UuidLike, *, now: datetime | None = None
    ) -> Invocation:
        """Mark an admitted request as sent to the provider (idempotent)."""
        return self._run(_Calls.mark_dispatched(organization_id, invocation_id, now))

    def settle(
        self,
        organization_id: UuidLike,
        invocation_id: UuidLike,
        credits: int,
        cents: int,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        now: datetime | None = None,
    ) -> Outcome:
        """Settle with measured usage; ``Outcome.SETTLED``, ``TRUED_UP`` (a recovered request
        under ``late_settlement = true_up``) or an ``ALREADY_*`` outcome."""
        return self._run(
            _Calls.settle(
                organization_id, invocation_id, credits, cents, input_tokens, output_tokens, now
            )
        )

    def fail(
        self,
        organization_id: UuidLike,
        invocation_id: UuidLike,
        error: str,
        *,
        credits: int = 0,
        cents: int = 0,
        now: datetime | None = None,
    ) -> Outcome:
        """Fail a request, releasing its hold and charging optional partial usage."""
        return self._run(_Calls.fail(organization_id, invocation_id, error, credits, cents, now))

    # tasks

    def open_execution(
        self,
        organization_id: UuidLike,
        task_key: str,
        *,
        subject_type: str | None = None,
        subject_id: str | None = None,
        replay_key: str | None = None,
        now: datetime | None = None,
    ) -> Execution:
        """Open a task (or, for a known replay key, return the earlier one with replayed=True)."""
        return self._run(
            _Calls.open_execution(
                organization_id, task_key, subject_type, subject_id, replay_key, now
            )
        )

    def close_execution(
        self,
        organization_id: UuidLike,
        execution_id: UuidLike,
        outcome: str,
        *,
        error: str | None = None,
        now: datetime | None = None,
    ) -> bool:
        """Close a running task as completed or failed; False when it was no longer running."""
        return self._run(_Calls.close_execution(organization_id, execution_id, outcome, error, now))

    # recovery

    def reconcile_org(
        self, organization_id: UuidLike, *, now: datetime | None = None, batch: int | None = None
    ) -> OrgSweep:
        """Sweep one organization in one transaction."""
        return self._run(_Calls.reconcile_org(organization_id, now, batch))

    def run_reconciliation(
        self, *, now: datetime | None = None, batch: int | None = None
    ) -> ReconciliationRun | None:
        """Run one pass (``CALL llm.run_reconciliation``) and return the run row it recorded.

        The procedure commits after each organization, so the connection must
        be idle; it is switched to autocommit for the call and back. When two
        passes overlap, the row returned is the newest one that finished during
        this call (a skipped pass records its own row).
        """
        with self.connection() as conn, mapped_errors():
            previous = conn.autocommit
            conn.autocommit = True
            try:
                with conn.cursor(row_factory=dict_row) as cur:
                    since = cur.execute(queries.CLOCK, prepare=self._prepare).fetchall()[0]["clock"]
                    cur.execute(
                        queries.RUN_RECONCILIATION, _run_params(now, batch), prepare=self._prepare
                    )
                    rows = cur.execute(
                        queries.RUN_RECORDED_SINCE, {"since": since}, prepare=self._prepare
                    ).fetchall()
            finally:
                conn.autocommit = previous
        return _recorded_run(rows)

    def health(self, *, now: datetime | None = None) -> Health:
        """The missing-run alarm: ok, late, never or failing."""
        return self._run(_Calls.health(now))

    def schedule_reconciliation(self, schedule: str = "0 * * * *") -> int:
        """Schedule the pg_cron job (``CronNotInstalled`` without pg_cron); its job id."""
        return self._run(_Calls.schedule_reconciliation(schedule))

    def unschedule_reconciliation(self) -> bool:
        """Remove the pg_cron job; False when there was none."""
        return self._run(_Calls.unschedule_reconciliation())

    # notices

    def claim_notices(self, *, limit: int = 50, now: datetime | None = None) -> list[Notice]:
        """Claim up to ``limit`` due notices (owed -> sending)."""
        return self._run(_Calls.claim_notices(limit, now))

    def complete_notice(
        self, organization_id: UuidLike, notice_id: UuidLike, *, now: datetime | None = None
    ) -> bool:
        """Mark a claimed notice sent; False when it was not being sent."""
        return self._run(_Calls.complete_notice(organization_id, notice_id, now))

    def fail_notice(
        self,
        organization_id: UuidLike,
        notice_id: UuidLike,
        error: str,
        *,
        now: datetime | None = None,
    ) -> bool:
        """Return a claimed notice to owed with its error and a backoff."""
        return self._run(_Calls.fail_notice(organization_id, notice_id, error, now))

    def release_notice(
        self, organization_id: UuidLike, notice_id: UuidLike, *, now: datetime | None = None
    ) -> bool:
        """Give a claimed notice back unsent (owed, due at once, no attempt counted);
        False when it was not being sent."""
        return self._run(_Calls.release_notice(organization_id, notice_id, now))

    def rearm_notices(self, *, now: datetime | None = None) -> int:
        """Make notices owed again whose claim expired; how many."""
        return self._run(_Calls.rearm_notices(now))

    # reporting and checks

    def rebuild_daily_usage(self, day_from: date, day_to: date) -> int:
        """Recompute ``llm.daily_usage`` for those UTC days; rows written."""
        return self._run(_Calls.rebuild_daily_usage(day_from, day_to))

    def check_invariants(self) -> list[InvariantViolation]:
        """Every violated invariant; empty when the books are right."""
        return self._run(_Calls.check_invariants())

    def distribute(self, shard_count: int | None = None) -> str:
        """Shard the schema with Citus (``CitusNotInstalled`` without it); what it did."""
        return self._run(_Calls.distribute(shard_count))


# ----------------------------------------------------------- asyncio


class AsyncLlm:
    """Asyncio client over a ``psycopg.AsyncConnection`` or an async connection pool.

    The same methods, arguments and results as ``Llm``, awaited.
    """

    def __init__(self, source: Any, *, prepare: bool = False) -> None:
        """``source``: a ``psycopg.AsyncConnection``, or anything whose ``.connection()``
        is an async context manager yielding one (``psycopg_pool.AsyncConnectionPool``).
        ``prepare``: as for ``Llm``."""
        self.source = source
        self.prepare = prepare
        self._prepare: bool | None = None if prepare else False

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """The connection the next call uses (borrowed from the pool, if one was given)."""
        if isinstance(self.source, psycopg.AsyncConnection):
            yield self.source
        else:
            async with self.source.connection() as conn:
                yield conn

    async def _run(self, call: _Call[T]) -> T:
        async with self.connection() as conn:
            with mapped_errors():
                async with _own_async_transaction(conn), conn.cursor(row_factory=dict_row) as cur:
                    await cur.execute(call.sql, call.params, prepare=self._prepare)
                    rows = await cur.fetchall()
        return call.result(rows)

    # organizations and catalog

    async def upsert_organization(
        self,
        organization_id: UuidLike,
        name: str,
        monthly_allowance_credits: int | None,
        *,
        status: str = "operational",
        notice_thresholds: Iterable[int] = (80, 100),
        now: datetime | None = None,
    ) -> Organization:
        """Create or update an organization (allowance None = unlimited)."""
        return await self._run(
            _Calls.upsert_organization(
                organization_id, name, monthly_allowance_credits, status, notice_thresholds, now
            )
        )

    async def set_recovery_policy(
        self, organization_id: UuidLike, recovery_charge: str, late_settlement: str
    ) -> Organization:
        """What recovery charges (estimate | dispatched | none) and what a late measured
        settlement does (audit | true_up) for this organization."""
        return await self._run(
            _Calls.set_recovery_policy(organization_id, recovery_charge, late_settlement)
        )

    async def set_period_stripes(self, organization_id: UuidLike, stripes: int) -> int:
        """Spread the organization's period counters over ``stripes`` rows (1-64)."""
        return await self._run(_Calls.set_period_stripes(organization_id, stripes))

    async def declare_task_kind(self, key: str, description: str | None = None) -> None:
        """Declare a task kind; idempotent."""
        return await self._run(_Calls.declare_task_kind(key, description))

    # requests

    async def admit(
        self,
        organization_id: UuidLike,
        estimate_credits: int,
        model: str,
        *,
        execution_id: UuidLike | None = None,
        invocation_id: UuidLike | None = None,
        now: datetime | None = None,
    ) -> Invocation:
        """Admit a request and place its hold (``AllowanceExhausted`` when it does not fit)."""
        return await self._run(
            _Calls.admit(organization_id, estimate_credits, model, execution_id, invocation_id, now)
        )

    async def admit_id(
        self,
        organization_id: UuidLike,
        estimate_credits: int,
        model: str,
        *,
        execution_id: UuidLike | None = None,
        invocation_id: UuidLike | None = None,
        now: datetime | None = None,
    ) -> UUID:
        """``admit``, returning only the request's id (one column instead of a whole row)."""
        return await self._run(
            _Calls.admit_id(organization_id, estimate_credits, model, execution_id, invocation_id, now)
        )

    async def mark_dispatched(
        self, organization_id: UuidLike, invocation_id: UuidLike, *, now: datetime | None = None
    ) -> Invocation:
        """Mark an admitted request as sent to the provider (idempotent)."""
        return await self._run(_Calls.mark_dispatched(organization_id, invocation_id, now))

    async def settle(
        self,
        organization_id: UuidLike,
        invocation_id: UuidLike,
        credits: int,
        cents: int,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        now: datetime | None = None,
    ) -> Outcome:
        """Settle with measured usage; ``Outcome.SETTLED``, ``TRUED_UP`` (a recovered request
        under ``late_settlement = true_up``) or an ``ALREADY_*`` outcome."""
        return await self._run(
            _Calls.settle(
                organization_id, invocation_id, credits, cents, input_tokens, output_tokens, now
            )
        )

    async def fail(
        self,
        organization_id: UuidLike,
        invocation_id: UuidLike,
        error: str,
        *,
        credits: int = 0,
        cents: int = 0,
        now: datetime | None = None,
    ) -> Outcome:
        """Fail a request, releasing its hold and charging optional partial usage."""
        return await self._run(
            _Calls.fail(organization_id, invocation_id, error, credits, cents, now)
        )

    # tasks

    async def open_execution(
        self,
        organization_id: UuidLike,
        task_key: str,
        *,
        subject_type: str | None = None,
        subject_id: str | None = None,
        replay_key: str | None = None,
        now: datetime | None = None,
    ) -> Execution:
        """Open a task (or, for a known replay key, return the earlier one with replayed=True)."""
        return await self._run(
            _Calls.open_execution(
                organization_id, task_key, subject_type, subject_id, replay_key, now
            )
        )

    async def close_execution(
        self,
        organization_id: UuidLike,
        execution_id: UuidLike,
        outcome: str,
        *,
        error: str | None = None,
        now: datetime | None = None,
    ) -> bool:
        """Close a running task as completed or failed; False when it was no longer running."""
        return await self._run(
            _Calls.close_execution(organization_id, execution_id, outcome, error, now)
        )

    # recovery

    async def reconcile_org(
        self, organization_id: UuidLike, *, now: datetime | None = None, batch: int | None = None
    ) -> OrgSweep:
        """Sweep one organization in one transaction."""
        return await self._run(_Calls.reconcile_org(organization_id, now, batch))

    async def run_reconciliation(
        self, *, now: datetime | None = None, batch: int | None = None
    ) -> ReconciliationRun | None:
        """Run one pass and return the run row it recorded (see ``Llm.run_reconciliation``)."""
        async with self.connection() as conn:
            with mapped_errors():
                previous = conn.autocommit
                await conn.set_autocommit(True)
                try:
                    async with conn.cursor(row_factory=dict_row) as cur:
                        await cur.execute(queries.CLOCK, prepare=self._prepare)
                        since = (await cur.fetchall())[0]["clock"]
                        await cur.execute(
                            queries.RUN_RECONCILIATION, _run_params(now, batch), prepare=self._prepare
                        )
                        await cur.execute(
                            queries.RUN_RECORDED_SINCE, {"since": since}, prepare=self._prepare
                        )
                        rows = await cur.fetchall()
                finally:
                    await conn.set_autocommit(previous)
        return _recorded_run(rows)

    async def health(self, *, now: datetime | None = None) -> Health:
        """The missing-run alarm: ok, late, never or failing."""
        return await self._run(_Calls.health(now))

    async def schedule_reconciliation(self, schedule: str = "0 * * * *") -> int:
        """Schedule the pg_cron job (``CronNotInstalled`` without pg_cron); its job id."""
        return await self._run(_Calls.schedule_reconciliation(schedule))

    async def unschedule_reconciliation(self) -> bool:
        """Remove the pg_cron job; False when there was none."""
        return await self._run(_Calls.unschedule_reconciliation())

    # notices

    async def claim_notices(self, *, limit: int = 50, now: datetime | None = None) -> list[Notice]:
        """Claim up to ``limit`` due notices (owed -> sending)."""
        return await self._run(_Calls.claim_notices(limit, now))

    async def complete_notice(
        self, organization_id: UuidLike, notice_id: UuidLike, *, now: datetime | None = None
    ) -> bool:
        """Mark a claimed notice sent; False when it was not being sent."""
        return await self._run(_Calls.complete_notice(organization_id, notice_id, now))

    async def fail_notice(
        self,
        organization_id: UuidLike,
        notice_id: UuidLike,
        error: str,
        *,
        now: datetime | None = None,
    ) -> bool:
        """Return a claimed notice to owed with its error and a backoff."""
        return await self._run(_Calls.fail_notice(organization_id, notice_id, error, now))

    async def release_notice(
        self, organization_id: UuidLike, notice_id: UuidLike, *, now: datetime | None = None
    ) -> bool:
        """Give a claimed notice back unsent (owed, due at once, no attempt counted);
        False when it was not being sent."""
        return await self._run(_Calls.release_notice(organization_id, notice_id, now))

    async def rearm_notices(self, *, now: datetime | None = None) -> int:
        """Make notices owed again whose claim expired; how many."""
        return await self._run(_Calls.rearm_notices(now))

    # reporting and checks

    async def rebuild_daily_usage(self, day_from: date, day_to: date) -> int:
        """Recompute ``llm.daily_usage`` for those UTC days; rows written."""
        return await self._run(_Calls.rebuild_daily_usage(day_from, day_to))

    async def check_invariants(self) -> list[InvariantViolation]:
        """Every violated invariant; empty when the books are right."""
        return await self._run(_Calls.check_invariants())

    async def distribute(self, shard_count: int | None = None) -> str:
        """Shard the schema with Citus (``CitusNotInstalled`` without it); what it did."""
        return await self._run(_Calls.distribute(shard_count))
