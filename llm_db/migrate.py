"""Install or upgrade the `llm` schema: the migrations, then the function files.

``migrate(dsn)`` runs three phases:

1. ``migrations/*.sql`` (versioned DDL: tables, types, roles), in name order,
   each once: the expand steps. A migration and its record commit in one
   transaction, so a run killed anywhere leaves none applied and unrecorded; one
   marked ``-- transactional: false`` (``CREATE INDEX CONCURRENTLY``) runs
   statement by statement and is recorded after, so it must be re-runnable. The
   record is yoyo's table ``_yoyo_migration`` (and its log), which every release
   before 0.4.0 wrote through yoyo-migrations: the files keep yoyo's format
   (``-- depends:``, ``-- transactional: false``), a database yoyo migrated is
   read as it is, and ``yoyo list`` still reads one migrated here. llm-db no
   longer needs yoyo itself: 0.3.0 subclassed its backend to commit a record with
   its migration, which its public API does not offer. A migration marked
   ``-- barrier: before`` is applied after the barrier (below): when every
   transaction open as it is reached has ended, so none still runs a statement
   the migrations before it replaced (0021 and 0022, docs/architecture.md
   Conventions 14);
2. every ``sql/*.sql`` file (function bodies, grants), in name order, all in
   ONE transaction, re-applied on every run. Before them, in that transaction,
   the function steps of ``migrations/functions/`` not recorded yet, each once
   (``llm.upgrade_steps`` records it as ``functions/<name>``, in the same
   transaction): a one-time change the files need and that must commit with
   them, such as dropping a routine whose result type the files change (CREATE OR
   REPLACE cannot), so that no caller finds it missing between two commits.
   The files must be re-runnable (``CREATE OR REPLACE``, ``DROP … IF EXISTS``);
   a failure rolls back the
   whole phase, so a database never holds half a release of functions.
   A routine of schema ``llm`` that the files no longer define (deleted, or
   its signature changed) is dropped after the barrier (phase 3): a call of
   the previous release's code still running as the functions go live may
   still call it;
3. the routines the files no longer define are dropped, then
   ``migrations/contract/*.sql``, the contract steps (docs/architecture.md
   Conventions 14), each once (``llm.upgrade_steps`` records it), after the
   barrier: every transaction that was open when the new functions went live has
   ended, so none can still run the previous release's code (a function already
   executing keeps its old body to the end of its call). A step then completes
   what the new functions keep from what the previous release wrote, and drops
   what only the previous release read (its indexes, its constraints). A step
   marked ``-- transactional: false`` runs in autocommit (``CREATE`` or ``DROP
   INDEX CONCURRENTLY``, backfills that commit in batches) and must be
   re-runnable from any point; a run interrupted anywhere is finished by the
   next ``migrate``.

The phases are serialized across processes by one transaction-level
advisory lock, held by a transaction of ``migrate``'s own connection that
spans the migrations (run on a connection of their own) and then applies the
function files; a second run polls for it
(``_begin_locked``), and the contract steps take it again, in a second
transaction of that connection, while another connection runs them. Concurrent ``migrate``
runs against one database are safe and the second finds nothing left to do.
Nothing outlives that transaction, so this also holds behind a transaction
pooler such as PgBouncer, where a session lock could stay behind on a pooled
server connection.

How a routine the files no longer define is found: before the files run,
every ``llm`` routine is marked with a setting (``ALTER ROUTINE … SET
application_name = 'llm-db migrate: stale'``); ``CREATE OR REPLACE`` replaces a
routine's settings with its definition's own, so the mark survives only on the
routines no file re-created, and those are dropped. The mark is a built-in
parameter any user may set, so the routines' owner needs no superuser: a
custom one (``llm.…``) on a routine takes a superuser in PostgreSQL 15, which
made every re-run by a managed service's owner fail with 42501.
Nothing runs with the mark: a marked routine is re-created, or unmarked before the
transaction commits and dropped after the barrier (a run killed before that drop
leaves it unmarked, and the next run finds it stale again), and a failed run
rolls the mark back.

How migrate bounds its locks: every transaction it opens,
its own and each of its worker's, starts with ``SET LOCAL lock_timeout`` (the
``lock_timeout`` argument, 1 s by default), ``statement_timeout = 0`` and
``idle_in_transaction_session_timeout = 0``: a statement queued behind a
consumer's open transaction is cancelled after one lock timeout, which lets the
consumers queued behind it go on, and a database-level timeout cannot kill
migrate's own lock-holding connection. ``SET LOCAL``, not ``SET``: behind a
transaction pooler nothing outlives the transaction. A migration (one
transaction) or the function files (one savepoint of migrate's transaction)
that fails with 55P03 are rolled back and retried whole, with exponential
backoff and jitter, until ``deadline``; then ``MigrationError`` names the
session that held the lock and its query, read by a watcher connection while
the statement waited. What was committed before stays: migrations are
additive (docs/architecture.md, "Conventions" 14), so the previous release's
functions work on it and a re-run completes the upgrade.

What migrate says: ``on_event`` receives one dict per event,
``start`` and ``done`` of each step (a migration, or the function files),
``wait`` before a retry (the lock, its holder, the attempt, the pause) and
``progress`` for a batched backfill that reports ``RAISE NOTICE 'llm-db
progress: <done>/<total>'``.

Where the code is, by job: this module holds the public call and its report;
``llm_db._migrate_run`` how a run reports and retries (its errors, events, backoff
and the watcher), ``llm_db._migrate_locks`` the migrate lock and the barrier, and
``llm_db._migrate_steps`` the steps (the migrations and their record, the function
steps and files, the routines dropped, the contract steps).

Where the SQL comes from: an installed wheel carries it as package data
(``llm_db/_sql`` and ``llm_db/_migrations``); a source checkout uses the
repository's ``sql/`` and ``migrations/`` next to the package. Both can be
overridden per call (``migrations_dir=``, ``sql_dir=``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict

# The run by job: how it reports and retries, how it locks, its steps.
from llm_db._migrate_locks import MIGRATE_LOCK_KEY, _begin_locked
from llm_db._migrate_run import DeadlineReached, Event, MigrationError, _describe, _Run, _Watcher
from llm_db._migrate_steps import (
    FUNCTIONS_STEP,
    _apply_contract_steps,
    _apply_migrations,
    _apply_sql_phase,
)

__all__ = [
    "FUNCTIONS_STEP",
    "MIGRATE_LOCK_KEY",
    "DeadlineReached",
    "Event",
    "MigrationError",
    "MigrationReport",
    "default_dirs",
    "migrate",
]


_PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class MigrationReport:
    """What one ``migrate`` call did."""

    applied_migrations: tuple[str, ...]
    """Migration ids (file stems) applied by this call (empty when already up to date)."""
    sql_files: tuple[str, ...]
    """Function files (re)applied, in order (every file, every run)."""
    migrations_dir: Path
    sql_dir: Path
    dropped_routines: tuple[str, ...] = ()
    """Routines of schema llm no file defines any more, dropped by this call."""
    contract_steps: tuple[str, ...] = ()
    """Contract steps (``migrations/contract/``) this call ran to their end."""
    function_steps: tuple[str, ...] = ()
    """Function steps (``migrations/functions/``) this call ran, with the function files."""


def default_dirs() -> tuple[Path, Path]:
    """(migrations_dir, sql_dir): packaged copies first, else the source checkout's."""
    packaged = (_PACKAGE_DIR / "_migrations", _PACKAGE_DIR / "_sql")
    if packaged[0].is_dir() and packaged[1].is_dir():
        return packaged
    checkout = (_PACKAGE_DIR.parent / "migrations", _PACKAGE_DIR.parent / "sql")
    if checkout[0].is_dir() and checkout[1].is_dir():
        return checkout
    raise MigrationError(
        f"cannot find the SQL: neither {packaged[0]} nor {checkout[0]} exists "
        "(a broken install? reinstall llm-db)"
    )


def migrate(
    dsn: str,
    *,
    migrations_dir: str | Path | None = None,
    sql_dir: str | Path | None = None,
    lock_timeout: float = 1.0,
    deadline: float = 600.0,
    on_event: Callable[[Event], None] | None = None,
) -> MigrationReport:
    """Bring the database at ``dsn`` to this release of llm-db; safe to re-run.

    ``dsn``: any libpq URL (``postgresql://``, ``postgres://``) or key=value
    conninfo. ``lock_timeout``: seconds any one statement may wait for a lock
    before its step is rolled back and retried. ``deadline``: seconds from the
    start after which no step is retried (nor another migrate waited for):
    ``DeadlineReached``; a step under way is not cut short. ``on_event``: called
    with each ``Event``:

    - ``{"event": "start", "step": s}``, ``s`` a migration id or ``"functions (sql/)"``;
    - ``{"event": "done", "step": s, "elapsed_s": t, "attempts": n}``;
    - ``{"event": "wait", "step": s, "attempt": n, "retry_in_s": t, "lock": relation or
      None, "mode": lock mode or None, "blocker_pid": pid or None, "blocker_query": text
      or None}`` when a step failed on its lock timeout and is retried;
    - ``{"event": "progress", "step": s, "done": d, "total": t}`` for a backfill's notices.

    Returns a ``MigrationReport``; every failure is a ``MigrationError``
    naming the failing file, or the lock and its holder.
    """
    if not lock_timeout > 0 or not deadline > 0:
        raise MigrationError("lock_timeout and deadline must be positive seconds")
    default_migrations, default_sql = (None, None)
    if migrations_dir is None or sql_dir is None:
        default_migrations, default_sql = default_dirs()
    migrations_path = Path(migrations_dir) if migrations_dir is not None else default_migrations
    sql_path = Path(sql_dir) if sql_dir is not None else default_sql
    assert migrations_path is not None and sql_path is not None
    for label, p in (("migrations", migrations_path), ("sql", sql_path)):
        if not p.is_dir():
            raise MigrationError(f"{label} directory not found: {p}", path=p)
    sql_files = sorted(sql_path.glob("*.sql"), key=lambda p: p.name)
    function_dir = migrations_path / "functions"
    function_steps = sorted(function_dir.glob("*.sql"), key=lambda p: p.name) if function_dir.is_dir() else []

    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise MigrationError(f"invalid connection string: {exc}") from None
    run = _Run(lock_timeout, time.monotonic() + deadline, on_event or (lambda event: None))
    try:
        with (
            _Watcher(dsn, run),
            psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn,
        ):
            _begin_locked(conn, run)
            try:
                applied = _apply_migrations(dsn, migrations_path, run, conn)
                run.worker_pid = conn.info.backend_pid
                once, stale = run.step(FUNCTIONS_STEP, lambda: _apply_sql_phase(conn, function_steps, sql_files))
            except BaseException:
                if not conn.closed and not conn.broken:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            dropped, contracted = _apply_contract_steps(dsn, conn, migrations_path / "contract", stale, run)
    except psycopg.Error as exc:  # the connection lost, the server shut down, …
        raise MigrationError(f"migrate stopped: {_describe(exc)}") from exc

    return MigrationReport(
        applied_migrations=tuple(applied),
        sql_files=tuple(p.name for p in sql_files),
        migrations_dir=migrations_path,
        sql_dir=sql_path,
        dropped_routines=tuple(dropped),
        contract_steps=tuple(contracted),
        function_steps=tuple(once),
    )


# ---------------------------------------------------------------- contract steps


