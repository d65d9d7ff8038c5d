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
(``llm_db.operations``) into ``llm_db._client_methods``: each passes its arguments
by name to its statement, a named constant there, and maps the rows to its result.
The two classes here differ only in how a statement runs (``_execute``,
``_call_procedure``), like psycopg's own ``Connection`` / ``AsyncConnection``.

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
import decimal
import logging
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import psycopg
from psycopg.rows import dict_row
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
    """``numeric`` in text: a whole number (no point, as every sum of amounts is) as
    ``int``, anything else as psycopg's ``Decimal``."""

    def load(self, data: Any) -> Any:
        text = bytes(data)
        if text.lstrip(b"-").isdigit():
            return int(text)
        return super().load(data)


def _cursor(conn: Any) -> Any:
    """A cursor of ``conn`` with dict rows that reads whole numerics as ``int``."""
    cur = conn.cursor(row_factory=dict_row)
    cur.adapters.register_loader("numeric", _WholeNumberLoader)
    return cur


#: The statements whose results have no ``numeric`` column, as seen on their first
#: run: their cursors skip the loader above (a copy of the connection's loaders per
#: call). A statement whose result gains a numeric column later (an upgrade under a
#: running client) has its whole numerics made ``int`` after the read (``_rows``).
_NO_NUMERIC: set[str] = set()
_NUMERIC_OID = 1700
_IDLE = psycopg.pq.TransactionStatus.IDLE


def _statement_cursor(conn: Any, sql: str) -> Any:
    if sql in _NO_NUMERIC:
        return conn.cursor(row_factory=dict_row)
    return _cursor(conn)


def _rows(cur: Any, sql: str) -> list[Row]:
    """The rows of the statement just run, whole numerics as ``int`` either way."""
    return _rows_read(cur, sql, cur.fetchall())


def _rows_read(cur: Any, sql: str, rows: list[Row]) -> list[Row]:
    result = cur.pgresult  # the column types from the result itself: no Column objects
    if result is None:
        return rows
    numeric = [result.fname(i).decode() for i in range(result.nfields) if result.ftype(i) == _NUMERIC_OID]
    if sql not in _NO_NUMERIC:
        if not numeric:
            _NO_NUMERIC.add(sql)
    elif numeric:
        _NO_NUMERIC.discard(sql)
        for row in rows:
            for name in numeric:
                value = row[name]
                if isinstance(value, decimal.Decimal) and value == value.to_integral_value():
                    row[name] = int(value)
    return rows


def _idle_autocommit(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Each call is one statement, so on an idle autocommit connection it is its own
    transaction already; BEGIN/COMMIT would add two round trips for nothing."""
    return conn.autocommit and conn.pgconn.transaction_status == _IDLE


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
        connections only (docs/operations.md, "Poolers")."""
        self.source = source
        self.prepare = prepare
        self._prepare: bool | None = None if prepare else False
        self._refusals = _Refusals()

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """The connection the next call uses (borrowed from the pool, if one was given)."""
        if isinstance(self.source, psycopg.Connection):
            yield self.source
        else:
            with self.source.connection() as conn:
                yield conn

    def _execute(self, sql: str, params: Mapping[str, Any]) -> list[Row]:
        """Run one statement in its own transaction (module doc); its rows. Plain code,
        no context-manager generators: this is every call's path (issue 32 item 5)."""
        try:
            if isinstance(self.source, psycopg.Connection):
                return self._run(self.source, sql, params)
            with self.source.connection() as conn:
                return self._run(conn, sql, params)
        except AllowanceExhausted as refusal:
            self._report(refusal, params)
            raise

    def _run(self, conn: psycopg.Connection[Any], sql: str, params: Mapping[str, Any]) -> list[Row]:
        try:
            if _idle_autocommit(conn):
                return self._once(conn, sql, params)
            with conn.transaction():
                return self._once(conn, sql, params)
        except psycopg.Error as exc:
            mapped = translate(exc)
            if mapped is exc:
                raise
            raise mapped from exc

    def _once(self, conn: psycopg.Connection[Any], sql: str, params: Mapping[str, Any]) -> list[Row]:
        with _statement_cursor(conn, sql) as cur:
            try:
                cur.execute(sql, params, prepare=self._prepare)
            except psycopg.DataError as exc:
                raise unsendable(exc) from exc
            return _rows(cur, sql)

    def _report(self, refusal: AllowanceExhausted, params: Mapping[str, Any]) -> None:
        """Report a refusal in a transaction of its own (module doc)."""
        report = self._refusals.to_report(refusal, params)
        if report is None:
            return
        try:
            self.note_refusal(**report)
        except (LlmError, psycopg.Error) as exc:
            log.warning("llm-db: could not report the refusal by %s %s %s: %s",
                        report["scope"], report["scope_id"], report["window"], exc)  # fmt: skip
        else:
            self._refusals.reported(report)

    def _call_procedure(self, sql: str, params: Mapping[str, Any]) -> list[Row]:
        """``CALL`` on the connection switched to autocommit (the procedure commits on its
        own), then the run row it recorded since the server clock read before it."""
        with self.connection() as conn, mapped_errors():
            previous = conn.autocommit
            conn.autocommit = True
            try:
                with _cursor(conn) as cur:
                    since = cur.execute(queries.CLOCK, prepare=self._prepare).fetchall()[0]["clock"]
                    with sent():
                        cur.execute(sql, params, prepare=self._prepare)
                    recorded = cur.execute(queries.RUN_RECORDED_SINCE, {"since": since}, prepare=self._prepare)
                    return recorded.fetchall()
            finally:
                conn.autocommit = previous


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

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """The connection the next call uses (borrowed from the pool, if one was given)."""
        if isinstance(self.source, psycopg.AsyncConnection):
            yield self.source
        else:
            async with self.source.connection() as conn:
                yield conn

    async def _execute(self, sql: str, params: Mapping[str, Any]) -> list[Row]:
        try:
            if isinstance(self.source, psycopg.AsyncConnection):
                return await self._run(self.source, sql, params)
            async with self.source.connection() as conn:
                return await self._run(conn, sql, params)
        except AllowanceExhausted as refusal:
            await self._report(refusal, params)
            raise

    async def _run(self, conn: psycopg.AsyncConnection[Any], sql: str, params: Mapping[str, Any]) -> list[Row]:
        try:
            if _idle_autocommit(conn):
                return await self._once(conn, sql, params)
            async with conn.transaction():
                return await self._once(conn, sql, params)
        except psycopg.Error as exc:
            mapped = translate(exc)
            if mapped is exc:
                raise
            raise mapped from exc

    async def _once(self, conn: psycopg.AsyncConnection[Any], sql: str, params: Mapping[str, Any]) -> list[Row]:
        async with _statement_cursor(conn, sql) as cur:
            try:
                await cur.execute(sql, params, prepare=self._prepare)
            except psycopg.DataError as exc:
                raise unsendable(exc) from exc
            rows = await cur.fetchall()
            return _rows_read(cur, sql, rows)

    async def _report(self, refusal: AllowanceExhausted, params: Mapping[str, Any]) -> None:
        report = self._refusals.to_report(refusal, params)
        if report is None:
            return
        try:
            await self.note_refusal(**report)
        except (LlmError, psycopg.Error) as exc:
            log.warning("llm-db: could not report the refusal by %s %s %s: %s",
                        report["scope"], report["scope_id"], report["window"], exc)  # fmt: skip
        else:
            self._refusals.reported(report)

    async def _call_procedure(self, sql: str, params: Mapping[str, Any]) -> list[Row]:
        async with self.connection() as conn:
            with mapped_errors():
                previous = conn.autocommit
                await conn.set_autocommit(True)
                try:
                    async with _cursor(conn) as cur:
                        await cur.execute(queries.CLOCK, prepare=self._prepare)
                        since = (await cur.fetchall())[0]["clock"]
                        with sent():
                            await cur.execute(sql, params, prepare=self._prepare)
                        await cur.execute(queries.RUN_RECORDED_SINCE, {"since": since}, prepare=self._prepare)
                        return await cur.fetchall()
                finally:
                    await conn.set_autocommit(previous)
