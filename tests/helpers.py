"""Shared test helpers: call the SQL contract directly, fingerprint the books,
assert SQLSTATEs with a "nothing was written" check.

Every helper takes an autocommit psycopg connection (``llm_conn`` or one from
``llm_connect()``) and runs the statements of the driver's table of operations
(``codegen.operations``: ``call``, ``sql_of``, ``params``), so a test sees the raw
rows and psycopg's SQLSTATEs of exactly what the driver sends. The clock moves
through ``now`` (``None`` means the function's own ``now()``); ``T0`` is the one
instant every test starts from.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from datetime import time as clock_time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from codegen.operations import operations

OPERATIONS = operations()

# A test of what one node's own tables show (their scan statistics), or of one statement
# that settles many requests: on a Citus cluster (LLM_DB_CITUS) the coordinator's tables
# hold no rows (their shards on the workers do), and a distributed query may not run
# another inside it.
on_one_node = pytest.mark.skipif(bool(os.environ.get("LLM_DB_CITUS")), reason="reads one node's own tables")

# A quiet mid-month instant; tests move the clock relative to it.
T0 = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)
JANUARY = T0.date().replace(day=1)  # T0's month
FEBRUARY = (JANUARY + timedelta(days=31)).replace(day=1)  # the next one
NEW_MONTH = datetime.combine(FEBRUARY, clock_time(), UTC)  # its first instant: January is over
MAX_AMOUNT = 10**15  # llm._max_amount()
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
# Views of schema llm only the owner's routines read: no role has SELECT on them
# (sql/99_grants.sql, docs/contract.md "Roles and grants").
INTERNAL_VIEWS = frozenset({"_execution_charges", "_invocation_budget_keys", "_open_floors"})

# The functions granted to llm_app (docs/contract.md "Roles and grants"): the request and task calls.
APP_FUNCTIONS = frozenset(
    {
        "admit_invocation",
        "mark_dispatched",
        "settle_invocation",
        "fail_invocation",
        "note_refusal",
        "open_execution",
        "close_execution",
        "price_usage",
        "settle_usage",
    }
)


# ---------------------------------------------------------------- reading


def rows(conn: psycopg.Connection, query: str, params: Any = None) -> list[dict[str, Any]]:
    """All rows of ``query`` as dicts (none for a statement that returns no rows, a ``CALL``)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return cur.fetchall() if cur.description is not None else []


def row(conn: psycopg.Connection, query: str, params: Any = None) -> dict[str, Any] | None:
    """The first row of ``query`` as a dict, or None."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return cur.fetchone()


def scalar(conn: psycopg.Connection, query: str, params: Any = None) -> Any:
    """The first column of the first row of ``query``."""
    result = conn.execute(query, params).fetchone()
    assert result is not None, f"no row from {query!r}"
    return result[0]


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 10.0, interval: float = 0.01) -> Any:
    """Poll ``predicate`` every ``interval`` seconds until it returns something true, and
    return that; an AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} ({timeout} s)")
        time.sleep(interval)


def wait_blocked(observer: psycopg.Connection, pid: int, timeout: float = 10.0, *, by: int | None = None) -> None:
    """Poll until backend ``pid`` waits on a lock another backend holds (backend ``by``, when given).
    On a Citus coordinator the wait is on a worker, so citus_lock_waits names it, by the
    global pids of the backends (node id * 10^10 + pid) whose statements wait and block."""
    query = ("SELECT cardinality(pg_blocking_pids(%(pid)s)) > 0" if by is None
             else "SELECT %(by)s = ANY (pg_blocking_pids(%(pid)s))")  # fmt: skip
    if observer.execute("SELECT to_regclass('citus_lock_waits') IS NOT NULL").fetchone()[0]:
        query += (" OR EXISTS (SELECT FROM citus_lock_waits AS w WHERE w.waiting_gpid %% 10000000000 = %(pid)s"
                  + ("" if by is None else " AND w.blocking_gpid %% 10000000000 = %(by)s") + ")")  # fmt: skip
    wait_for(lambda: observer.execute(query, {"pid": pid, "by": by}).fetchone()[0],
             f"backend {pid} to block" + ("" if by is None else f" on backend {by}"), timeout)


def sessions_on_stripes(
    connect: Callable[[], psycopg.Connection], stripes: int, wanted: list[int] | int, tries: int = 200
) -> list[psycopg.Connection]:
    """One connection per entry of ``wanted``, whose admissions hold on that stripe (or,
    ``wanted`` a number, that many connections on different stripes, any): a session's
    stripe is its backend pid modulo ``stripes`` (sql/30_admission.sql), so connections
    are opened until each entry has one, and the others closed. Fails (never skips)
    after ``tries`` connections."""
    any_stripes = isinstance(wanted, int)
    slots: list[int | None] = [None] * wanted if any_stripes else list(wanted)  # type: ignore[list-item, operator]
    found: list[psycopg.Connection | None] = [None] * len(slots)
    taken: set[int] = set()
    pids = []
    for _ in range(tries):
        conn = connect()
        pids.append(conn.info.backend_pid)
        stripe = pids[-1] % stripes
        slot = next((i for i, s in enumerate(slots)
                     if found[i] is None and (s == stripe or (s is None and stripe not in taken))), None)  # fmt: skip
        if slot is None:
            conn.close()
            continue
        found[slot] = conn
        taken.add(stripe)
        if None not in found:
            return found  # type: ignore[return-value]
    for conn in found:
        if conn is not None:
            conn.close()
    raise AssertionError(f"no session on every stripe of {wanted} (of {stripes}) in {tries} backends: pids {pids}")


class InThread:
    """Run ``fn`` in a thread at once; ``join()`` waits for it, ``result()`` also re-raises
    what it raised or returns what it returned."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,))
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to result()
            self.error = exc

    def join(self, timeout: float = 30) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the thread did not return"

    def result(self) -> Any:
        self.join()
        if self.error is not None:
            raise self.error
        return self.value


def lock_period_rows(conn: psycopg.Connection, org_id: uuid.UUID) -> None:
    """Lock every row of the organization's periods, head and stripes (FOR UPDATE), in
    ``conn``'s open transaction: as a session stuck in the middle of a settlement would."""
    conn.execute(
        "SELECT 1 FROM llm.period_heads AS h JOIN llm.period_stripes AS s"
        " USING (organization_id, period_start) WHERE h.organization_id = %s FOR UPDATE",
        [org_id],
    )


def corrupt_period(conn: psycopg.Connection, org_id: uuid.UUID, column: str, delta: int) -> None:
    """Change a period counter behind the functions' back (stripe 0 of every period of
    the organization): what only a manual UPDATE or a bug can do."""
    assert column in ("used_credits", "held_credits", "used_cents")
    conn.execute(
        sql.SQL("UPDATE llm.period_stripes SET {c} = {c} + %s WHERE organization_id = %s AND stripe = 0").format(
            c=sql.Identifier(column)
        ),
        [delta, org_id],
    )


def llm_tables(conn: psycopg.Connection) -> list[str]:
    """Names of every table in schema llm, sorted."""
    return [
        r[0]
        for r in conn.execute(
            "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = 'llm' ORDER BY 1"
        ).fetchall()
    ]


def _primary_key(conn: psycopg.Connection, table: str) -> list[str]:
    return [
        r[0]
        for r in conn.execute(
            """
            SELECT a.attname
              FROM pg_catalog.pg_index AS i
              CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
              JOIN pg_catalog.pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
             WHERE i.indrelid = %(table)s::regclass AND i.indisprimary
             ORDER BY k.n
            """,
            {"table": f"llm.{table}"},
        ).fetchall()
    ]


def fingerprint(conn: psycopg.Connection) -> dict[str, list[str]]:
    """Every llm table's full content, each row as text, ordered by primary key.

    Compare two fingerprints to prove a call wrote nothing (docs/contract.md "Errors": "A
    rejected call writes nothing")."""
    result: dict[str, list[str]] = {}
    for table in llm_tables(conn):
        order = _primary_key(conn, table)
        assert order, f"llm.{table} has no primary key"
        query = sql.SQL("SELECT t::text FROM {} AS t ORDER BY {}").format(
            sql.Identifier("llm", table),
            sql.SQL(", ").join(sql.Identifier("t", c) for c in order),
        )
        result[table] = [r[0] for r in conn.execute(query).fetchall()]
    return result


def invariants(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """The rows of ``llm.check_invariants()``: empty when the books are right."""
    return call(conn, "check_invariants")


def daily_usage_findings(conn: psycopg.Connection, day_from: date, day_to: date) -> list[dict[str, Any]]:
    """The rows of ``llm.check_daily_usage()``: empty when those days of ``daily_usage``
    agree with the requests."""
    return call(conn, "check_daily_usage", day_from, day_to)


def assert_sqlstate(
    conn: psycopg.Connection,
    code: str,
    query: str,
    params: Any = None,
    *,
    unchanged: bool = True,
) -> psycopg.Error:
    """Run ``query``, expect SQLSTATE ``code``; with ``unchanged`` (the default)
    also prove that no llm table changed. Returns the error for DETAIL checks."""
    before = fingerprint(conn) if unchanged else None
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(query, params)
    error = caught.value
    assert error.sqlstate == code, (
        f"expected SQLSTATE {code}, got {error.sqlstate}: {error.diag.message_primary}"
    )
    if unchanged:
        assert fingerprint(conn) == before, "a rejected call wrote something"
    return error


# Empties the books between a simulation's histories, children before parents; the
# catalogs (task_kinds, settings) and the lease row stay.
CLEAN_BOOKS = [
    "DELETE FROM llm.period_findings",
    "DELETE FROM llm.sweep_totals",
    "DELETE FROM llm.budget_horizons",
    "DELETE FROM llm.drift_findings",
    "DELETE FROM llm.threshold_notices",
    "DELETE FROM llm.cost_corrections",
    "DELETE FROM llm.daily_usage",
    "DELETE FROM llm.budget_counters",
    "DELETE FROM llm.budget_limits",
    "DELETE FROM llm.invocation_scopes",
    "DELETE FROM llm.invocations",
    "DELETE FROM llm.executions",
    "DELETE FROM llm.period_stripes",
    "DELETE FROM llm.period_heads",
    "DELETE FROM llm.organizations",
    "DELETE FROM llm.reconciliation_runs",
]


# ---------------------------------------------------------------- writing


def call(conn: psycopg.Connection, operation: str, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """Run one operation of the driver's table (``codegen.operations``) on ``conn``, with
    the driver's signature, and return its rows as dicts: the raw rows, and psycopg's
    own errors with their SQLSTATE (the driver would map them to ``llm_db.errors``)."""
    op = OPERATIONS[operation]
    return rows(conn, op.sql, op.params(*args, **kwargs))


def sql_of(operation: str) -> str:
    """The statement of one operation of the driver's table; its parameters are named as
    the operation's (``params(operation, ...)``)."""
    return OPERATIONS[operation].sql


def params(operation: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """The named parameters of ``sql_of(operation)`` for these arguments."""
    return OPERATIONS[operation].params(*args, **kwargs)


def new_org(
    conn: psycopg.Connection,
    allowance: int | None = 1000,
    *,
    org_id: uuid.UUID | None = None,
    name: str | None = None,
    status: str = "operational",
    thresholds: list[int] | None = None,
    now: datetime | None = T0,
) -> uuid.UUID:
    """Create (or update) an organization through llm.upsert_organization; returns its id."""
    org_id = org_id or uuid.uuid4()
    call(conn, "upsert_organization", org_id, name or f"org {org_id.hex[:8]}", allowance,
         status=status, notice_thresholds=(80, 100) if thresholds is None else thresholds, now=now)
    return org_id


def set_org(
    conn: psycopg.Connection,
    org_id: uuid.UUID,
    allowance: int | None,
    *,
    status: str = "operational",
    thresholds: list[int] | None = None,
    now: datetime | None = T0,
) -> dict[str, Any]:
    """Update an organization; returns the llm.organizations row."""
    return call(conn, "upsert_organization", org_id, "updated", allowance, status=status,
                notice_thresholds=(80, 100) if thresholds is None else thresholds, now=now)[0]


ADMIT_SQL = sql_of("admit")


def admit_params(
    org_id: uuid.UUID | None,
    estimate: int | None,
    model: str | None = "model-a",
    *,
    execution_id: uuid.UUID | None = None,
    invocation_id: uuid.UUID | None = None,
    now: datetime | None = T0,
    project: str | None = None,
    api_key: str | None = None,
    end_user: str | None = None,
) -> dict[str, Any]:
    """The parameters of ADMIT_SQL."""
    return params("admit", org_id, estimate, model, execution_id=execution_id,
                  invocation_id=invocation_id, now=now, project=project, api_key=api_key,
                  end_user=end_user)


def admit(conn: psycopg.Connection, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """llm.admit_invocation with ``admit_params``' arguments; returns the llm.admission_result row."""
    return rows(conn, ADMIT_SQL, admit_params(*args, **kwargs))[0]


def set_budget(conn: psycopg.Connection, org_id: uuid.UUID, scope: str, scope_id: str | None,
               window: str, limit: int | None, *, thresholds: list[int] | None = None,
               now: datetime | None = T0) -> None:
    """llm.set_budget (thresholds {80,100} unless given); a None limit removes the budget."""
    call(conn, "set_budget", org_id, scope, scope_id, window, limit,
         thresholds=(80, 100) if thresholds is None else thresholds, now=now)


def budget_usage(conn: psycopg.Connection, org_id: uuid.UUID) -> dict[tuple, dict[str, Any]]:
    """The organization's rows of llm.budget_usage by (scope, scope_id, window, window_start)."""
    return {(r["scope"], r["scope_id"], r["budget_window"], r["window_start"]): r
            for r in rows(conn, "SELECT * FROM llm.budget_usage WHERE organization_id = %s", (org_id,))}


def admit_dispatched(conn: psycopg.Connection, org_id: uuid.UUID, estimate: int, *,
                     execution_id: uuid.UUID | None = None, now: datetime | None = T0) -> uuid.UUID:
    """Admit a request and mark it dispatched at ``now``; returns its id."""
    inv = admit(conn, org_id, estimate, execution_id=execution_id, now=now)["id"]
    dispatch(conn, org_id, inv, now=now)
    return inv


DISPATCH_SQL = sql_of("mark_dispatched")


def dispatch(
    conn: psycopg.Connection, org_id: uuid.UUID, invocation_id: uuid.UUID, *,
    now: datetime | None = T0,
) -> dict[str, Any]:
    """llm.mark_dispatched; returns the llm.admission_result row."""
    return call(conn, "mark_dispatched", org_id, invocation_id, now=now)[0]


SETTLE_SQL = sql_of("settle")


def settle_params(
    org_id: uuid.UUID | None,
    invocation_id: uuid.UUID | None,
    credits: int | None,
    cents: int | None = 0,
    *,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    now: datetime | None = T0,
) -> dict[str, Any]:
    """The parameters of SETTLE_SQL."""
    return params("settle", org_id, invocation_id, credits, cents, input_tokens=input_tokens,
                  output_tokens=output_tokens, now=now)


def settle(conn: psycopg.Connection, *args: Any, **kwargs: Any) -> str:
    """llm.settle_invocation with ``settle_params``' arguments; returns its outcome text."""
    return rows(conn, SETTLE_SQL, settle_params(*args, **kwargs))[0]["value"]


FAIL_SQL = sql_of("fail")


def fail_params(
    org_id: uuid.UUID | None,
    invocation_id: uuid.UUID | None,
    error: str | None = "provider error",
    credits: int | None = 0,
    cents: int | None = 0,
    *,
    now: datetime | None = T0,
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The parameters of FAIL_SQL."""
    return params("fail", org_id, invocation_id, error, credits=credits, cents=cents, now=now, usage=usage)


def fail(conn: psycopg.Connection, *args: Any, **kwargs: Any) -> str:
    """llm.fail_invocation with ``fail_params``' arguments; returns its outcome text."""
    return rows(conn, FAIL_SQL, fail_params(*args, **kwargs))[0]["value"]


def declare_task(conn: psycopg.Connection, key: str = "summarize",
                 description: str | None = None) -> str:
    """llm.declare_task_kind; returns the key."""
    call(conn, "declare_task_kind", key, description)
    return key


def open_task(
    conn: psycopg.Connection, org_id: uuid.UUID, task_key: str = "summarize", *,
    now: datetime | None = T0, **options: Any,
) -> uuid.UUID:
    """Declare the task kind and open a running execution (``options``: subject_type,
    subject_id, replay_key); returns its id."""
    declare_task(conn, task_key)
    return call(conn, "open_execution", org_id, task_key, now=now, **options)[0]["execution_id"]


def close_task(
    conn: psycopg.Connection, org_id: uuid.UUID, execution_id: uuid.UUID,
    outcome: str = "completed", *, now: datetime | None = T0, error: str | None = None,
) -> bool:
    """llm.close_execution; returns whether it closed."""
    return call(conn, "close_execution", org_id, execution_id, outcome, error=error, now=now)[0]["value"]


def reconcile(conn: psycopg.Connection, org_id: uuid.UUID, *, now: datetime,
              batch: int | None = None) -> dict[str, Any]:
    """llm.reconcile_org at ``now``; returns the llm.org_sweep figures."""
    return call(conn, "reconcile_org", org_id, now=now, batch=batch)[0]


def call_pass(conn: psycopg.Connection, now: datetime | None, batch: int | None = None) -> None:
    """``CALL llm.run_reconciliation`` at ``now`` (on an idle autocommit connection)."""
    call(conn, "run_reconciliation", now=now, batch=batch)


def run_pass(conn: psycopg.Connection, now: datetime | None, batch: int | None = None) -> dict[str, Any]:
    """One pass at ``now``; returns the newest llm.reconciliation_runs row that is not 'skipped'."""
    call_pass(conn, now, batch)
    return row(conn, "SELECT * FROM llm.reconciliation_runs WHERE status <> 'skipped'"
                     " ORDER BY started_at DESC LIMIT 1")


def health(conn: psycopg.Connection, now: datetime | None) -> dict[str, Any]:
    """The row of llm.reconciliation_health at ``now``."""
    return call(conn, "health", now=now)[0]


def assert_books_right(conn: psycopg.Connection) -> None:
    """llm.check_invariants() finds nothing."""
    assert invariants(conn) == []


# ---------------------------------------------------------------- looking up


CRON_JOB = "llm-reconciliation"  # the pg_cron job schedule_reconciliation makes


def cron_jobs(conn: psycopg.Connection, name: str = CRON_JOB) -> list[tuple]:
    """(jobid, schedule, command, database) of the pg_cron job(s) ``name``
    (``llm-reconciliation:<database>`` for one scheduled with --cron-dsn)."""
    return conn.execute("SELECT jobid, schedule, command, database FROM cron.job WHERE jobname = %s"
                        " ORDER BY jobid", [name]).fetchall()  # fmt: skip


def period(conn: psycopg.Connection, org_id: uuid.UUID, start: date = JANUARY) -> dict[str, Any] | None:
    """The llm.periods row of ``org_id`` starting ``start`` (a date), or None."""
    return row(
        conn,
        "SELECT * FROM llm.periods WHERE organization_id = %(org)s::uuid"
        " AND period_start = %(start)s::date",
        {"org": org_id, "start": start},
    )


def _by_id(conn: psycopg.Connection, table: str, org_id: uuid.UUID, key: uuid.UUID) -> dict[str, Any] | None:
    return row(conn, sql.SQL("SELECT * FROM {} WHERE organization_id = %(org)s::uuid AND id = %(id)s::uuid").format(
        sql.Identifier("llm", table)), {"org": org_id, "id": key})


def invocation(conn: psycopg.Connection, org_id: uuid.UUID,
               invocation_id: uuid.UUID) -> dict[str, Any] | None:
    """The llm.invocations row, or None."""
    return _by_id(conn, "invocations", org_id, invocation_id)


def ledger(conn: psycopg.Connection, org_id: uuid.UUID,
           invocation_id: uuid.UUID) -> dict[str, dict[str, Any]]:
    """The ledger rows of one invocation, keyed by entry (hold, release, charge)."""
    return {
        r["entry"]: r
        for r in rows(
            conn,
            "SELECT * FROM llm.ledger WHERE organization_id = %(org)s::uuid"
            " AND invocation_id = %(id)s::uuid",
            {"org": org_id, "id": invocation_id},
        )
    }


def notices(conn: psycopg.Connection, org_id: uuid.UUID) -> list[dict[str, Any]]:
    """The organization's threshold notices, by period and threshold."""
    return rows(
        conn,
        "SELECT * FROM llm.threshold_notices WHERE organization_id = %(org)s::uuid"
        " ORDER BY period_start, threshold_pct",
        {"org": org_id},
    )


def notice_listener(connect: Callable[[], psycopg.Connection]) -> psycopg.Connection:
    """A new connection that LISTENs on llm_notices (a transaction that makes a notice owed
    notifies it at commit)."""
    conn = connect()
    conn.execute("LISTEN llm_notices")
    return conn


def heard(conn: psycopg.Connection) -> list[str]:
    """Payloads of the llm_notices notifications delivered to ``conn`` so far."""
    return [n.payload for n in conn.notifies(timeout=0.5) if n.channel == "llm_notices"]


def execution(conn: psycopg.Connection, org_id: uuid.UUID,
              execution_id: uuid.UUID) -> dict[str, Any] | None:
    """The llm.executions row, or None."""
    return _by_id(conn, "executions", org_id, execution_id)


@contextlib.contextmanager
def yoyo(dsn: str, migrations: Path) -> Iterator[tuple[Any, list[Any]]]:
    """yoyo-migrations itself on the database at ``dsn`` (key=value, TCP), as every
    release before 0.4.0 applied its migrations: its backend, under its lock, and the
    migrations of ``migrations`` as it reads them."""
    from psycopg.conninfo import conninfo_to_dict
    from yoyo import get_backend, read_migrations

    info = conninfo_to_dict(dsn)
    backend = get_backend(f"postgresql+psycopg://{info['user']}@{info['host']}:{info['port']}/{info['dbname']}")
    try:
        with backend.lock():
            yield backend, read_migrations(str(migrations))
    finally:
        backend.connection.close()
