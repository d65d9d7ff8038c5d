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

Their methods are plain code generated from the table of operations
(``codegen.operations``) into ``llm_db._client_methods``: each passes its arguments
by name to its statement, a named constant there, and maps the rows to its result.
The classes here say how a statement runs (``_execute``, ``_execute_value``,
``_call_procedure``), like psycopg's own ``Connection`` / ``AsyncConnection``:
``AsyncLlm`` is written, and ``Llm`` is written from it by
``scripts/generate_client.py`` (``codegen.unasync``: the same code without
``await``), so read and edit ``AsyncLlm``.

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

A client built on a connection keeps its cursor from one call to the next: making
one (a copy of the connection's adapters, the numeric loader below registered in
it) cost as much client CPU as the rest of the driver's work on a call. So adapters
registered on that connection after the client's first call do not apply to the client's statements. A call that fails, or reads more than one
row, drops its cursor rather than keep it (and its result) for the next. A client
on a pool makes a cursor per call, on the connection it borrows. The client reads
rows as tuples, whatever row factory the connection has, and maps them by column
name (``models``); a ``SELECT … AS value`` gives its one value.

A sum of the books that nothing bounds (a task's credits, a day's tokens, a
report's totals) is ``numeric`` in SQL and so never overflows; the client reads
every whole ``numeric`` as a Python ``int`` (exact, unbounded) and one with a
fractional part as ``decimal.Decimal``, never a float.

A refusal (``AllowanceExhausted``, LL001) rolls back everything its transaction
wrote, so the refusing call cannot record itself. The client reports it right
after, in a second transaction (``note_refusal``), and then raises it: the first
refusal by each limit and window owes one ``llm.limit_reached`` notice. Each
client remembers the windows it reported (the last ``NOTED_WINDOWS``), so a
storm of refusals costs one more round trip per limit and window, not one per
refusal. A report that fails is logged (logger ``llm_db.client``) and never
hides the refusal.

Every method takes an optional ``now=`` (a timezone-aware datetime): the clock
the SQL uses, so tests move time instead of sleeping; None means ``now()``.
Share a pool, not a connection, between threads or tasks that work at once.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg.types.numeric import NumericLoader

from llm_db import queries
from llm_db._client_methods import AsyncLlmMethods, LlmMethods
from llm_db._types import Row, UuidLike
from llm_db.errors import AllowanceExhausted, LlmError, mapped_errors, sent, translate, unsendable

__all__ = ["NOTED_WINDOWS", "AsyncLlm", "Llm", "UuidLike"]

log = logging.getLogger("llm_db.client")

#: how many (organization, limit, window) a client remembers having reported
NOTED_WINDOWS = 4096

Window = tuple[Any, ...]


class _Refusals:
    """The refusals a client reported (``note_refusal``), the newest ``NOTED_WINDOWS``
    windows; shared by the threads of one client."""

    def __init__(self) -> None:
        self._noted: collections.OrderedDict[Window, None] = collections.OrderedDict()
        self._lock = threading.Lock()

    def to_report(self, refusal: AllowanceExhausted, params: Mapping[str, Any]) -> dict[str, Any] | None:
        """``note_refusal``'s arguments for a refusal not reported yet; None when it was,
        or when it names no window (a server older than 0.4.0's figures)."""
        if refusal.scope is None or refusal.window is None or refusal.window_start is None:
            return None
        report = {
            "organization_id": params["organization_id"], "scope": refusal.scope,
            "scope_id": refusal.scope_id, "window": refusal.window,
            "window_start": refusal.window_start, "now": params.get("now"),
        }  # fmt: skip
        with self._lock:
            if self._key(report) in self._noted:
                return None
        return report

    def reported(self, report: Mapping[str, Any]) -> None:
        with self._lock:
            self._noted[self._key(report)] = None
            while len(self._noted) > NOTED_WINDOWS:
                self._noted.popitem(last=False)

    @staticmethod
    def _key(report: Mapping[str, Any]) -> Window:
        return tuple(report[k] for k in ("organization_id", "scope", "scope_id", "window", "window_start"))


class _WholeNumberLoader(NumericLoader):
    """``numeric`` in text: a whole number (digits, and only zeros after a point: every
    sum of amounts is one) as ``int``, anything else as psycopg's ``Decimal``."""

    def load(self, data: Any) -> Any:
        text = bytes(data)
        digits, _, fraction = text.partition(b".")
        if digits.lstrip(b"-").isdigit() and not fraction.strip(b"0"):
            return int(digits)
        return super().load(data)


def _cursor(conn: Any, row_factory: Any = tuple_row) -> Any:
    """A cursor of ``conn`` that reads whole numerics as ``int``."""
    cur = conn.cursor(row_factory=row_factory)
    cur.adapters.register_loader("numeric", _WholeNumberLoader)
    return cur


_IDLE = psycopg.pq.TransactionStatus.IDLE


def _dicts(cur: Any, rows: list[tuple[Any, ...]]) -> list[Row]:
    """The rows just fetched from ``cur`` as dicts of column name to value."""
    result = cur.pgresult
    names = [result.fname(i).decode() for i in range(result.nfields)]
    return [dict(zip(names, row, strict=True)) for row in rows]


class AsyncLlm(AsyncLlmMethods):
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
        self._refusals = _Refusals()
        #: the idle cursors of ``source`` when it is a connection (module doc); popped
        #: and appended, so two calls at once never share one
        self._cursors: list[psycopg.AsyncCursor[Any]] = []

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """The connection the next call uses (borrowed from the pool, if one was given)."""
        if isinstance(self.source, psycopg.AsyncConnection):
            yield self.source
        else:
            async with self.source.connection() as conn:
                yield conn

    async def _execute(self, sql: str, params: Mapping[str, Any]) -> list[Row]:
        """Run one statement in its own transaction (module doc); its rows."""
        return await self._call(sql, params, False)  # type: ignore[no-any-return]

    async def _execute_value(self, sql: str, params: Mapping[str, Any]) -> Any:
        """Run one ``SELECT … AS value`` in its own transaction; its one value."""
        return await self._call(sql, params, True)

    async def _call(self, sql: str, params: Mapping[str, Any], value: bool) -> Any:
        """Every call's path, plain code: the statement run on one of
        the client's idle cursors (module doc), or on a pool's connection; a refusal
        reported; the one value read, or the rows as dicts."""
        source = self.source
        try:
            if isinstance(source, psycopg.AsyncConnection):
                idle = self._cursors
                cur = idle.pop() if idle else _cursor(source)
                rows = await self._run(source, cur, sql, params)
                result = rows[0][0] if value else _dicts(cur, rows)
                if len(rows) <= 1:  # a longer result is not kept alive by an idle cursor
                    idle.append(cur)
                return result
            async with source.connection() as conn, _cursor(conn) as cur:
                rows = await self._run(conn, cur, sql, params)
                return rows[0][0] if value else _dicts(cur, rows)
        except AllowanceExhausted as refusal:
            await self._report(refusal, params)
            raise

    async def _run(
        self, conn: psycopg.AsyncConnection[Any], cur: psycopg.AsyncCursor[Any], sql: str,
        params: Mapping[str, Any],
    ) -> list[tuple[Any, ...]]:  # fmt: skip
        """The statement in its own transaction: on an idle autocommit connection it is
        one already (BEGIN/COMMIT would add two round trips for nothing), else in
        ``conn.transaction()``; its rows; psycopg's errors raised as llm-db's."""
        try:
            try:
                if conn.autocommit and conn.pgconn.transaction_status == _IDLE:
                    await cur.execute(sql, params, prepare=self._prepare)
                else:
                    async with conn.transaction():
                        await cur.execute(sql, params, prepare=self._prepare)
            except psycopg.DataError as exc:
                raise unsendable(exc) from exc
            return await cur.fetchall()
        except psycopg.Error as exc:
            mapped = translate(exc)
            if mapped is exc:
                raise
            raise mapped from exc

    async def _report(self, refusal: AllowanceExhausted, params: Mapping[str, Any]) -> None:
        """Report a refusal in a transaction of its own (module doc)."""
        report = self._refusals.to_report(refusal, params)
        if report is None:
            return
        try:
            await self.note_refusal(**report)
        except (LlmError, psycopg.Error) as exc:
            log.warning(
                "llm-db: could not report the refusal by %s %s %s: %s",
                report["scope"], report["scope_id"], report["window"], exc,
            )  # fmt: skip
        else:
            self._refusals.reported(report)

    async def _call_procedure(self, sql: str, params: Mapping[str, Any]) -> list[Row]:
        """``CALL`` on the connection switched to autocommit (the procedure commits on its
        own), then the run row it recorded since the server clock read before it."""
        async with self.connection() as conn:
            with mapped_errors():
                previous = conn.autocommit
                await conn.set_autocommit(True)
                try:
                    async with _cursor(conn, dict_row) as cur:
                        await cur.execute(queries.CLOCK, prepare=self._prepare)
                        since = (await cur.fetchall())[0]["clock"]
                        with sent():
                            await cur.execute(sql, params, prepare=self._prepare)
                        await cur.execute(queries.RUN_RECORDED_SINCE, {"since": since}, prepare=self._prepare)
                        return await cur.fetchall()
                finally:
                    await conn.set_autocommit(previous)


# The sync twin of the definition above: written by scripts/generate_client.py.
class Llm(LlmMethods):
    """Synchronous client over a ``psycopg.Connection`` or a connection pool."""

    def __init__(self, source: Any, *, prepare: bool = False) -> None:
        """``source``: a ``psycopg.Connection``, or anything whose ``.connection()``
        is a context manager yielding one (``psycopg_pool.ConnectionPool``).

        ``prepare``: False (the default) never prepares a statement on the server,
        so the client works unchanged through PgBouncer in transaction pooling
        mode, where consecutive transactions land on different server
        connections; True lets psycopg prepare as it does by default (after
        ``prepare_threshold`` executions), for direct or session-pooled
        connections only (docs/install.md, "Poolers: PgBouncer")."""
        self.source = source
        self.prepare = prepare
        self._prepare: bool | None = None if prepare else False
        self._refusals = _Refusals()
        #: the idle cursors of ``source`` when it is a connection (module doc); popped
        #: and appended, so two calls at once never share one
        self._cursors: list[psycopg.Cursor[Any]] = []

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """The connection the next call uses (borrowed from the pool, if one was given)."""
        if isinstance(self.source, psycopg.Connection):
            yield self.source
        else:
            with self.source.connection() as conn:
                yield conn

    def _execute(self, sql: str, params: Mapping[str, Any]) -> list[Row]:
        """Run one statement in its own transaction (module doc); its rows."""
        return self._call(sql, params, False)  # type: ignore[no-any-return]

    def _execute_value(self, sql: str, params: Mapping[str, Any]) -> Any:
        """Run one ``SELECT … AS value`` in its own transaction; its one value."""
        return self._call(sql, params, True)

    def _call(self, sql: str, params: Mapping[str, Any], value: bool) -> Any:
        """Every call's path, plain code: the statement run on one of
        the client's idle cursors (module doc), or on a pool's connection; a refusal
        reported; the one value read, or the rows as dicts."""
        source = self.source
        try:
            if isinstance(source, psycopg.Connection):
                idle = self._cursors
                cur = idle.pop() if idle else _cursor(source)
                rows = self._run(source, cur, sql, params)
                result = rows[0][0] if value else _dicts(cur, rows)
                if len(rows) <= 1:  # a longer result is not kept alive by an idle cursor
                    idle.append(cur)
                return result
            with source.connection() as conn, _cursor(conn) as cur:
                rows = self._run(conn, cur, sql, params)
                return rows[0][0] if value else _dicts(cur, rows)
        except AllowanceExhausted as refusal:
            self._report(refusal, params)
            raise

    def _run(
        self, conn: psycopg.Connection[Any], cur: psycopg.Cursor[Any], sql: str,
        params: Mapping[str, Any],
    ) -> list[tuple[Any, ...]]:  # fmt: skip
        """The statement in its own transaction: on an idle autocommit connection it is
        one already (BEGIN/COMMIT would add two round trips for nothing), else in
        ``conn.transaction()``; its rows; psycopg's errors raised as llm-db's."""
        try:
            try:
                if conn.autocommit and conn.pgconn.transaction_status == _IDLE:
                    cur.execute(sql, params, prepare=self._prepare)
                else:
                    with conn.transaction():
                        cur.execute(sql, params, prepare=self._prepare)
            except psycopg.DataError as exc:
                raise unsendable(exc) from exc
            return cur.fetchall()
        except psycopg.Error as exc:
            mapped = translate(exc)
            if mapped is exc:
                raise
            raise mapped from exc

    def _report(self, refusal: AllowanceExhausted, params: Mapping[str, Any]) -> None:
        """Report a refusal in a transaction of its own (module doc)."""
        report = self._refusals.to_report(refusal, params)
        if report is None:
            return
        try:
            self.note_refusal(**report)
        except (LlmError, psycopg.Error) as exc:
            log.warning(
                "llm-db: could not report the refusal by %s %s %s: %s",
                report["scope"], report["scope_id"], report["window"], exc,
            )  # fmt: skip
        else:
            self._refusals.reported(report)

    def _call_procedure(self, sql: str, params: Mapping[str, Any]) -> list[Row]:
        """``CALL`` on the connection switched to autocommit (the procedure commits on its
        own), then the run row it recorded since the server clock read before it."""
        with self.connection() as conn:
            with mapped_errors():
                previous = conn.autocommit
                conn.set_autocommit(True)
                try:
                    with _cursor(conn, dict_row) as cur:
                        cur.execute(queries.CLOCK, prepare=self._prepare)
                        since = (cur.fetchall())[0]["clock"]
                        with sent():
                            cur.execute(sql, params, prepare=self._prepare)
                        cur.execute(queries.RUN_RECORDED_SINCE, {"since": since}, prepare=self._prepare)
                        return cur.fetchall()
                finally:
                    conn.set_autocommit(previous)
