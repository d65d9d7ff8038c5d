"""Install or upgrade the `llm` schema: yoyo migrations, then the function files.

``migrate(dsn)`` runs three phases:

1. ``migrations/*.sql`` (versioned DDL: tables, types, roles) through yoyo,
   each migration once, under yoyo's lock: the expand steps. A migration marked
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
   REPLACE cannot), so that no caller finds it missing between two commits. The files must be re-runnable
   (``CREATE OR REPLACE``, ``DROP … IF EXISTS``); a failure rolls back the
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
spans yoyo's run (on its own connection; yoyo's lock table cannot cover its
own creation) and then applies the function files; a second run polls for it
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
its own and each of yoyo's, starts with ``SET LOCAL lock_timeout`` (the
``lock_timeout`` argument, 1 s by default), ``statement_timeout = 0`` and
``idle_in_transaction_session_timeout = 0``: a statement queued behind a
consumer's open transaction is cancelled after one lock timeout, which lets the
consumers queued behind it go on, and a database-level timeout cannot kill
migrate's own lock-holding connection. ``SET LOCAL``, not ``SET``: behind a
transaction pooler nothing outlives the transaction. A migration (one yoyo
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

Where the SQL comes from: an installed wheel carries it as package data
(``llm_db/_sql`` and ``llm_db/_migrations``); a source checkout uses the
repository's ``sql/`` and ``migrations/`` next to the package. Both can be
overridden per call (``migrations_dir=``, ``sql_dir=``).
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

__all__ = [
    "MIGRATE_LOCK_KEY",
    "DeadlineReached",
    "Event",
    "MigrationError",
    "MigrationReport",
    "default_dirs",
    "migrate",
    "yoyo_url",
]

# pg_advisory_lock key shared by every llm-db migrate run: b"llm_db" as a bigint.
MIGRATE_LOCK_KEY = int.from_bytes(b"llm_db", "big")

_PACKAGE_DIR = Path(__file__).resolve().parent
_SIMPLE_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*$")
_SIMPLE_DBNAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class MigrationError(RuntimeError):
    """A migration or function file failed; the message names the file and the error."""

    def __init__(self, message: str, *, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


class DeadlineReached(MigrationError):
    """migrate's deadline passed while a step still waited for a lock; what was
    committed before stays, works with the previous release's functions, and a
    re-run goes on from there. ``blocker_pid`` and ``blocker_query`` name the
    session that held the lock, when the watcher saw it."""

    def __init__(
        self, message: str, *, blocker_pid: int | None = None, blocker_query: str | None = None
    ) -> None:
        super().__init__(message)
        self.blocker_pid = blocker_pid
        self.blocker_query = blocker_query


Event = dict[str, Any]
"""One thing migrate did, for ``on_event``: ``{"event": "start" | "done" | "wait" |
"progress", "step": ..., ...}`` (docs in ``migrate``)."""


@dataclass(frozen=True)
class MigrationReport:
    """What one ``migrate`` call did."""

    applied_migrations: tuple[str, ...]
    """yoyo migration ids applied by this call (empty when already up to date)."""
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


def yoyo_url(dsn: str) -> str:
    """Turn a libpq URL or key=value conninfo into yoyo's ``postgresql+psycopg://`` URL.

    Simple parts go where a URL puts them; anything else (a unix-socket or
    multi-host ``host``, an unusual database name, sslmode, options, …) goes
    in the query string, which yoyo hands to ``psycopg.connect`` unchanged.
    """
    try:
        params: dict[str, str] = {
            k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None
        }
    except psycopg.ProgrammingError as exc:
        raise MigrationError(f"invalid connection string: {exc}") from None

    netloc = ""
    user = params.pop("user", None)
    password = params.pop("password", None)
    if user is not None:
        netloc = quote(user, safe="")
        if password is not None:
            netloc += ":" + quote(password, safe="")
        netloc += "@"
    elif password is not None:
        params["password"] = password

    host = params.get("host")
    port = params.get("port")
    if host is not None and _SIMPLE_HOST.match(host):
        netloc += params.pop("host")
        if port is not None and port.isdigit():
            netloc += ":" + params.pop("port")

    path = "/"
    dbname = params.get("dbname")
    if dbname is not None and _SIMPLE_DBNAME.match(dbname):
        path += params.pop("dbname")

    query = urlencode(sorted(params.items()), quote_via=quote)
    return f"postgresql+psycopg://{netloc}{path}" + (f"?{query}" if query else "")


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

    run = _Run(lock_timeout, time.monotonic() + deadline, on_event or (lambda event: None))
    url = yoyo_url(dsn)
    try:
        with (
            _Watcher(dsn, run),
            psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn,
        ):
            _begin_locked(conn, run)
            try:
                applied = _apply_migrations(dsn, url, migrations_path, run, conn)
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


FUNCTIONS_STEP = "functions (sql/)"
# A run's settings, the first statement of each of its transactions (an integer
# formatted in: no parameters, so the simple query protocol sends the three at once).
_SETTINGS = (
    "SET LOCAL lock_timeout = '{lock_timeout_ms}ms'; "
    "SET LOCAL statement_timeout = 0; SET LOCAL idle_in_transaction_session_timeout = 0"
)
_T = TypeVar("_T")


@dataclass
class _Run:
    """One migrate run's bounds, its events, and what the watcher last saw."""

    lock_timeout: float
    deadline_at: float  # time.monotonic()
    on_event: Callable[[Event], None]
    step_name: str = ""
    worker_pid: int | None = None  # the backend whose lock waits the watcher reads
    blocker: dict[str, Any] | None = None  # the watcher's last sighting
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def settings(self) -> str:
        """The statement every transaction of this run starts with."""
        return _SETTINGS.format(lock_timeout_ms=max(1, round(self.lock_timeout * 1000)))

    def emit(self, event: str, **fields: Any) -> None:
        self.on_event({"event": event, "step": self.step_name, **fields})

    def step(self, name: str, work: Callable[[], _T]) -> _T:
        """Run ``work`` (one transaction, or one savepoint) until it does not fail on
        a lock timeout; between attempts, back off exponentially with jitter."""
        self.step_name = name
        started = time.monotonic()
        self.emit("start")
        attempt = 1
        while True:
            with self.lock:
                self.blocker = None
            try:
                result = work()
            except pg_errors.LockNotAvailable:
                with self.lock:
                    seen = dict(self.blocker or {})
                # exponential, with jitter: retries of concurrent runs spread out
                pause = random.uniform(0.5, 1.0) * min(30.0, self.lock_timeout * 2 ** (attempt - 1))
                if time.monotonic() + pause > self.deadline_at:
                    raise DeadlineReached(
                        f"{name}: deadline reached after {attempt} attempts, still waiting for "
                        f"{_who(seen)}; nothing of this step was applied and the database works "
                        "as it is: end that session (or wait for it), then run migrate again",
                        blocker_pid=seen.get("blocker_pid"),
                        blocker_query=seen.get("blocker_query"),
                    ) from None
                self.emit(
                    "wait", attempt=attempt, retry_in_s=round(pause, 3), **_blocker_fields(seen)
                )
                time.sleep(pause)
                attempt += 1
                continue
            self.emit("done", elapsed_s=round(time.monotonic() - started, 3), attempts=attempt)
            return result

    def on_notice(self, diag: psycopg.errors.Diagnostic) -> None:
        """A backfill's ``RAISE NOTICE 'llm-db progress: <done>/<total>'``."""
        found = _PROGRESS.match(diag.message_primary or "")
        if found:
            self.emit("progress", done=int(found[1]), total=int(found[2]))


_PROGRESS = re.compile(r"^llm-db progress: (\d+)/(\d+)$")


def _blocker_fields(seen: dict[str, Any]) -> dict[str, Any]:
    return {k: seen.get(k) for k in ("lock", "mode", "blocker_pid", "blocker_query")}


def _who(seen: dict[str, Any]) -> str:
    if not seen:
        return "a lock (its holder had gone when looked for)"
    lock = f"{seen['mode']} on {seen['lock']}" if seen.get("lock") else seen.get("mode") or "a lock"
    return f"{lock} held by pid {seen['blocker_pid']} (query: {seen['blocker_query']!r})"


# Who blocks the statement migrate is running: its ungranted lock, and the first
# session pg_blocking_pids names, with what that session runs (or ran last).
_BLOCKER = """
SELECT l.relation::regclass::text AS lock, l.mode, b.pid AS blocker_pid,
       left(b.query, 200) AS blocker_query
  FROM pg_catalog.pg_locks AS l,
       LATERAL unnest(pg_catalog.pg_blocking_pids(%(pid)s)) AS bp(pid)
  JOIN pg_catalog.pg_stat_activity AS b ON b.pid = bp.pid
 WHERE l.pid = %(pid)s AND NOT l.granted
 LIMIT 1
"""


class _Watcher:
    """A thread with its own connection that looks, a few times per lock timeout,
    for whoever blocks migrate's working backend, so that a wait cancelled by
    lock_timeout can name its holder afterwards. Best effort: it reads only."""

    def __init__(self, dsn: str, run: _Run) -> None:
        self._dsn, self._run = dsn, run
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name="llm-db migrate watcher", daemon=True
        )

    def __enter__(self) -> _Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)  # a daemon: a query stuck on the network cannot hold migrate

    def _loop(self) -> None:
        interval = min(0.1, self._run.lock_timeout / 5)
        try:
            # no SET: behind a transaction pooler it would outlive this connection
            with psycopg.connect(
                self._dsn, autocommit=True, prepare_threshold=None, row_factory=dict_row
            ) as conn:
                while not self._stop.wait(interval):
                    pid = self._run.worker_pid
                    if pid is None:
                        continue
                    seen = conn.execute(_BLOCKER, {"pid": pid}).fetchone()
                    if seen is not None:
                        with self._run.lock:
                            self._run.blocker = seen
        except psycopg.Error:
            return  # the run goes on; its errors then only lack the holder's name


# The migrate lock, tried (transaction-level); an integer formatted in: no parameters.
_TRY_MIGRATE_LOCK = f"SELECT pg_catalog.pg_try_advisory_xact_lock({int(MIGRATE_LOCK_KEY)})"


def _begin_locked(conn: psycopg.Connection, run: _Run) -> None:
    """Open a transaction on ``conn`` that holds the migrate lock (transaction-level).

    A waiting run polls with ``pg_try_advisory_xact_lock`` between short transactions
    instead of waiting inside one: a backend that waits inside a statement keeps a
    snapshot, and ``CREATE INDEX CONCURRENTLY`` in the holder's migrations (on yoyo's
    connection) would wait for that snapshot while the waiter waits for the holder.
    No parameters, so the simple query protocol: no portal keeps a snapshot either.
    The transaction then carries the run's settings, so a database's
    ``idle_in_transaction_session_timeout`` cannot end it while yoyo works.
    """
    pause = 0.02
    while True:
        conn.execute("BEGIN")
        if conn.execute(_TRY_MIGRATE_LOCK).fetchone()[0]:  # type: ignore[arg-type,index]
            conn.execute(run.settings)  # type: ignore[arg-type]
            return
        conn.execute("ROLLBACK")
        if time.monotonic() + pause > run.deadline_at:
            raise DeadlineReached("deadline reached waiting for another llm-db migrate to finish")
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


YOYO_LOCK_WAIT = 30.0  # seconds, at most, for yoyo's lock row
_RESET = "RESET lock_timeout; RESET statement_timeout; RESET idle_in_transaction_session_timeout"


def _yoyo_backend(url: str, run: _Run) -> Any:
    """yoyo's psycopg backend, each of whose transactions starts with the run's
    settings and reports its backend to the watcher. yoyo opens a connection per
    migration (``copy()``, which keeps the class), so the class carries the run."""
    from yoyo.backends.core.postgresql import PostgresqlPsycopgBackend
    from yoyo.connections import parse_uri

    class Backend(PostgresqlPsycopgBackend):  # type: ignore[misc]
        marking: Any = None  # the migration whose record commits with its transaction

        def apply_one(self, migration: Any, force: bool = False, mark: bool = True) -> None:
            # yoyo commits a migration, then records it in a second transaction: a run
            # killed between the two left it applied but unrecorded, and every re-run
            # then failed applying it again. Here the record is in the migration's own
            # transaction; a non-transactional one (re-runnable, Conventions 14) is
            # recorded after it, as yoyo does.
            self.ensure_internal_schema_updated()
            migration.load()
            with self.copy() as own:
                own._internal_schema_updated = True
                own.marking = migration if mark and migration.use_transactions else None
                migration.process_steps(own, "apply", force=force)
            self.log_migration(migration, "apply")
            if mark and not migration.use_transactions:
                with self.transaction():
                    self.mark_one(migration, log=False)

        def commit(self) -> None:
            if self.marking is not None:
                self.mark_one(self.marking, log=False)
                self.marking = None
            super().commit()

        def connect(self, dburi: Any) -> psycopg.Connection:
            # here, not in init_connection, which yoyo calls again after each rollback
            connection = super().connect(dburi)
            # prepare nothing: begin() repeats one SET statement per transaction, which
            # psycopg would prepare after five, and a transaction pooler hands the next
            # transaction another server connection (42P05 "already exists" there)
            connection.prepare_threshold = None
            connection.add_notice_handler(run.on_notice)
            return connection

        def begin(self) -> None:
            super().begin()
            self.connection.execute(run.settings)
            run.worker_pid = self.connection.info.backend_pid

        @contextmanager
        def disable_transactions(self) -> Iterator[None]:
            # a `-- transactional: false` migration (CREATE INDEX CONCURRENTLY) has no
            # transaction to SET LOCAL in: the settings are the session's while it runs
            with super().disable_transactions():
                self.connection.execute(run.settings.replace("SET LOCAL", "SET"))
                run.worker_pid = self.connection.info.backend_pid
                try:
                    yield
                finally:
                    if not self.connection.broken:
                        self.connection.execute(_RESET)

    backend = Backend(parse_uri(url), "_yoyo_migration")
    backend.init_database()
    return backend


def _apply_migrations(dsn: str, url: str, migrations_dir: Path, run: _Run, conn: psycopg.Connection) -> list[str]:
    """Apply the pending migrations, each one yoyo transaction, each its own step; one
    marked ``-- barrier: before`` after the barrier, which waits for every transaction
    but ``conn``'s (migrate's, holding the migrate lock; yoyo's connections are
    autocommit)."""
    from yoyo import read_migrations
    from yoyo.exceptions import LockTimeout

    migrations = read_migrations(str(migrations_dir))
    backend = _yoyo_backend(url, run)
    try:
        _break_stale_yoyo_lock(backend, run)
        # Runs of migrate queue on the advisory lock, so this row is only ever held by a
        # plain yoyo run or left behind by a killed one: no use waiting long for it.
        with backend.lock(
            timeout=max(0.1, min(YOYO_LOCK_WAIT, run.deadline_at - time.monotonic()))
        ):
            pending = backend.to_apply(migrations)
            for migration in pending:
                if _BARRIER_BEFORE.search(Path(migration.path).read_text(encoding="utf-8")):
                    step = f"barrier before {migration.id}"
                    run.step(step, lambda s=step: _barrier_of(
                        dsn, conn, run, s, "the previous release's functions are live and the database works"))
                # a 55P03 rolls the migration's transaction back, unmarked: retried whole
                run.step(migration.id, lambda m=migration: _apply_one(backend, m, migrations_dir))
            backend.run_post_apply(pending)
            return [m.id for m in pending]
    except LockTimeout as exc:  # only taking the lock raises it
        raise MigrationError(
            f"yoyo's lock is still taken ({exc}): a plain yoyo run holds it; llm-db"
            " migrate removes a row a killed migrate left behind by itself."
        ) from exc
    finally:
        backend.connection.close()


# yoyo's lock row, read and removed through yoyo's backend (its :name parameters);
# the table's name is yoyo's, already quoted.
_YOYO_LOCK_TABLE_EXISTS = "SELECT pg_catalog.to_regclass(:name) IS NOT NULL"
_YOYO_REMOVE_LOCK = "DELETE FROM {lock_table} RETURNING pid, ctime"


def _break_stale_yoyo_lock(backend: Any, run: _Run) -> None:
    """Remove yoyo's lock row left behind by a killed migrate, so a re-run completes.

    Every migrate run takes yoyo's row only while it holds the migrate advisory lock,
    which this run holds now and which a killed run's backend released with its
    transaction: a row there now belongs to no running migrate. (A plain ``yoyo
    apply`` against the same database would not be excluded; migrate is the one way
    to apply llm-db's migrations.) Emits ``stale_lock`` with the killed run's pid."""
    with backend.transaction():
        exists = backend.execute(
            _YOYO_LOCK_TABLE_EXISTS, {"name": backend.lock_table_quoted}
        ).fetchone()[0]
        if not exists:
            return  # a first install: yoyo creates its lock table when it locks
        rows = backend.execute(
            _YOYO_REMOVE_LOCK.format(lock_table=backend.lock_table_quoted)
        ).fetchall()
    for pid, ctime in rows:
        run.emit("stale_lock", pid=pid, since=str(ctime))


def _apply_one(backend: Any, migration: Any, migrations_dir: Path) -> None:
    try:
        backend.apply_one(migration)
    except pg_errors.LockNotAvailable:
        raise
    except psycopg.Error as exc:
        raise MigrationError(
            f"migration {migration.id} failed in {migrations_dir}: {_describe(exc)}",
            path=Path(migration.path),
        ) from exc


# The function files' attempt, a savepoint of migrate's transaction.
_SAVEPOINT = "SAVEPOINT llm_db_functions"
_ROLLBACK_TO_SAVEPOINT = "ROLLBACK TO SAVEPOINT llm_db_functions"
_RELEASE_SAVEPOINT = "RELEASE SAVEPOINT llm_db_functions"


def _apply_sql_phase(
    conn: psycopg.Connection, steps: Sequence[Path], files: Sequence[Path]
) -> tuple[list[str], list[str]]:
    """One attempt at the function steps not recorded yet and the function files, in a
    savepoint of migrate's transaction (which keeps the migrate lock and the settings
    across attempts); returns (the steps run, the routines the files no longer define,
    to drop after the barrier)."""
    conn.execute(_SAVEPOINT)
    try:
        ran = _apply_function_steps(conn, steps)
        dropped = _apply_sql_files(conn, files)
    except BaseException:
        if not conn.closed and not conn.broken:
            conn.execute(_ROLLBACK_TO_SAVEPOINT)
        raise
    conn.execute(_RELEASE_SAVEPOINT)
    return ran, dropped


# a function step's record in llm.upgrade_steps, beside the contract steps' own names
_FUNCTION_STEP_PREFIX = "functions/"


def _apply_function_steps(conn: psycopg.Connection, steps: Sequence[Path]) -> list[str]:
    """The function steps (``migrations/functions/``) this database has not recorded,
    each run and recorded in the caller's transaction; returns their names."""
    if not steps:
        return []
    done = {row[0] for row in conn.execute(_CONTRACT_DONE).fetchall()}
    ran = []
    for path in steps:
        record = f"{_FUNCTION_STEP_PREFIX}{path.stem}"
        if record in done:
            continue
        _execute_file(conn, path, "function step ")
        conn.execute(_CONTRACT_RECORD, {"step": record})
        ran.append(path.stem)
    return ran


# Every routine of schema llm, marked before the function files run (see the
# module docstring); the ones still marked afterwards are unmarked, and dropped after
# the barrier.
_MARK_ROUTINES = """
DO $mark$
DECLARE
    v_routine regprocedure;
BEGIN
    FOR v_routine IN
        SELECT p.oid::regprocedure FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace = (SELECT n.oid FROM pg_catalog.pg_namespace AS n
                                  WHERE n.nspname = 'llm')
           AND p.prokind IN ('f', 'p')
    LOOP
        EXECUTE pg_catalog.format('ALTER ROUTINE %s SET application_name = %L',
                                  v_routine, 'llm-db migrate: stale');
    END LOOP;
END
$mark$
"""
_STILL_MARKED = """
SELECT p.oid::regprocedure::text AS routine
  FROM pg_catalog.pg_proc AS p
 WHERE p.pronamespace = (SELECT n.oid FROM pg_catalog.pg_namespace AS n WHERE n.nspname = 'llm')
   AND p.proconfig @> ARRAY['application_name=llm-db migrate: stale']
 ORDER BY 1
"""
# a routine _STILL_MARKED names: a regprocedure's text is a valid, quoted reference
_UNMARK_ROUTINE = "ALTER ROUTINE {routine} RESET application_name"
_DROP_ROUTINE = "DROP ROUTINE IF EXISTS {routine}"


def _execute_file(conn: psycopg.Connection, path: Path, what: str) -> None:
    """Run one SQL file in the caller's transaction; a failure names the file (after
    ``what``) and its line. No parameters: psycopg sends the whole file as one simple
    query, so a file may hold many statements and `%` is literal."""
    text = path.read_text(encoding="utf-8")
    try:
        conn.execute(text)  # type: ignore[arg-type]
    except pg_errors.LockNotAvailable:
        raise  # retried whole by the caller
    except psycopg.Error as exc:
        raise MigrationError(f"{what}{path.name}{_line_of(text, exc)}: {_describe(exc)}", path=path) from exc


def _apply_sql_files(conn: psycopg.Connection, files: Sequence[Path]) -> list[str]:
    """Apply the function files in the caller's transaction; unmark the routines of
    schema llm they no longer define, and return their signatures."""
    conn.execute(_MARK_ROUTINES)
    for path in files:
        _execute_file(conn, path, "")
    stale = [row[0] for row in conn.execute(_STILL_MARKED).fetchall()]
    for routine in stale:
        conn.execute(_UNMARK_ROUTINE.format(routine=routine))  # type: ignore[arg-type]
    return stale


def _drop_routines(worker: psycopg.Connection, routines: Sequence[str], run: _Run) -> None:
    """Drop the routines the function files no longer define, in one transaction of
    ``worker`` (after the barrier: no call of the previous release's code runs)."""
    with worker.transaction():
        worker.execute(run.settings)  # type: ignore[arg-type]
        for routine in routines:
            try:
                worker.execute(_DROP_ROUTINE.format(routine=routine))  # type: ignore[arg-type]
            except pg_errors.LockNotAvailable:
                raise  # retried whole by the caller
            except psycopg.Error as exc:
                raise MigrationError(
                    f"cannot drop {routine}, which no file in sql/ defines any more: {_describe(exc)}"
                ) from exc


def _line_of(text: str, exc: psycopg.Error) -> str:
    position = exc.diag.statement_position
    if position and position.isdigit():
        return f" line {text[: int(position)].count(chr(10)) + 1}"
    return ""


def _describe(exc: psycopg.Error) -> str:
    diag = exc.diag
    parts = [f"{diag.sqlstate or '?'} {diag.message_primary or str(exc).strip()}"]
    if diag.message_detail:
        parts.append(f"DETAIL: {diag.message_detail}")
    if diag.context:
        parts.append(f"CONTEXT: {diag.context.strip()}")
    return "\n".join(parts)


# ---------------------------------------------------------------- contract steps

BARRIER_STEP = "barrier (transactions of the previous functions)"
DROP_STEP = "routines sql/ no longer defines"
_BARRIER_BEFORE = re.compile(r"^-- barrier: before$", re.M)
_BACKEND_PID = "SELECT pg_catalog.pg_backend_pid()"
_CONTRACT_DONE = "SELECT u.step FROM llm.upgrade_steps AS u"
_CONTRACT_RECORD = (
    "INSERT INTO llm.upgrade_steps (step, finished_at) VALUES (%(step)s, pg_catalog.now())"
    " ON CONFLICT (step) DO NOTHING"
)
# The transactions open now in this database, but migrate's own: each holds the lock on
# its virtual transaction id until it ends (pg_locks and pg_stat_activity's pid and
# datname are visible to every role, unlike the other sessions' queries).
_OPEN_TRANSACTIONS = """
SELECT l.virtualxid, l.pid
  FROM pg_catalog.pg_locks AS l
  JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid
 WHERE l.locktype = 'virtualxid' AND l.granted AND a.datname = pg_catalog.current_database()
   AND NOT (l.pid = ANY (%(ours)s))
"""
_STILL_OPEN = """
SELECT l.virtualxid, l.pid, a.state, left(a.query, 200) AS query
  FROM pg_catalog.pg_locks AS l
  LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid
 WHERE l.locktype = 'virtualxid' AND l.granted AND l.virtualxid = ANY (%(open)s)
 LIMIT 1
"""


def _apply_contract_steps(
    dsn: str, conn: psycopg.Connection, contract_dir: Path, stale: Sequence[str], run: _Run
) -> tuple[list[str], list[str]]:
    """Phase 3 (module docstring), under the migrate lock (a transaction of ``conn``),
    after the barrier, on a connection of their own: drop the ``stale`` routines, then
    run the contract steps not recorded yet, each once. Returns (the routines dropped,
    the steps run)."""
    files = sorted(contract_dir.glob("*.sql"), key=lambda p: p.name) if contract_dir.is_dir() else []
    if not files and not stale:
        return [], []
    _begin_locked(conn, run)
    try:
        done = {row[0] for row in conn.execute(_CONTRACT_DONE).fetchall()} if files else set()
        pending = [p for p in files if p.stem not in done]
        if pending or stale:
            run.step(BARRIER_STEP, lambda: _barrier_of(dsn, conn, run, BARRIER_STEP,
                                                       "the new functions are live and the database works"))
            with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as worker:
                worker.add_notice_handler(run.on_notice)
                run.worker_pid = worker.info.backend_pid
                if stale:
                    run.step(DROP_STEP, lambda: _drop_routines(worker, stale, run))
                for path in pending:
                    run.worker_pid = worker.info.backend_pid
                    run.step(f"contract {path.stem}", lambda p=path: _apply_contract_file(worker, p, run))
    except BaseException:
        if not conn.closed and not conn.broken:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return list(stale), [p.stem for p in pending]


BARRIER_POLL = 0.05  # seconds between two looks at the transactions the barrier waits for


def _barrier(conn: psycopg.Connection, ours: list[int], run: _Run, step: str, left_as: str) -> None:
    """Wait until every transaction open now in this database (migrate's own aside) has
    ended: the ones that began before the new functions went live (or before the
    migrations so far committed) may still be running the code they replaced. Past the
    deadline, ``DeadlineReached`` names one; ``left_as`` says what the database is left
    with."""
    open_now = [row[0] for row in conn.execute(_OPEN_TRANSACTIONS, {"ours": ours}).fetchall()]
    while open_now:
        left = conn.execute(_STILL_OPEN, {"open": open_now}).fetchone()
        if left is None:
            return
        if time.monotonic() + BARRIER_POLL > run.deadline_at:
            raise DeadlineReached(
                f"{step}: deadline reached, transaction {left[0]} of pid {left[1]} ({left[2]}, "
                f"query: {left[3]!r}) is still open; {left_as}: "
                "end that session (or wait for it), then run migrate again to finish the upgrade",
                blocker_pid=left[1],
                blocker_query=left[3],
            )
        time.sleep(BARRIER_POLL)


def _barrier_of(dsn: str, conn: psycopg.Connection, run: _Run, step: str, left_as: str) -> None:
    """The barrier for every transaction but ``conn``'s (migrate's own, which holds the
    migrate lock), watched from a connection of its own in autocommit: a query with
    parameters in migrate's transaction would leave a portal, and its snapshot, open
    there, which a later ``CREATE INDEX CONCURRENTLY`` waits for. Backend pids are asked
    of the server (behind a transaction pooler the client's is the pooler's)."""
    ours = conn.execute(_BACKEND_PID).fetchone()[0]  # type: ignore[index]
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as observer:
        own = observer.execute(_BACKEND_PID).fetchone()[0]  # type: ignore[index]
        _barrier(observer, [ours, own], run, step, left_as)


def _apply_contract_file(worker: psycopg.Connection, path: Path, run: _Run) -> None:
    """One contract step on ``worker`` (autocommit): a transactional one in a transaction
    with its record, one marked ``-- transactional: false`` statement by statement in
    autocommit (its own COMMITs allowed), then its record."""
    text = path.read_text(encoding="utf-8")
    transactional = re.search(r"^-- transactional: false$", text, re.M | re.I) is None
    settings = run.settings if transactional else run.settings.replace("SET LOCAL", "SET")
    try:
        if transactional:
            with worker.transaction():
                worker.execute(settings)  # type: ignore[arg-type]
                worker.execute(text)  # type: ignore[arg-type]
                worker.execute(_CONTRACT_RECORD, {"step": path.stem})
            return
        worker.execute(settings)  # type: ignore[arg-type]
        try:
            # statement by statement: CONCURRENTLY refuses a multi-statement query string
            for statement in _statements(text):
                worker.execute(statement)  # type: ignore[arg-type]
            worker.execute(_CONTRACT_RECORD, {"step": path.stem})
        finally:
            if not worker.broken:
                worker.execute(_RESET)
    except pg_errors.LockNotAvailable:
        raise  # retried whole by the caller
    except psycopg.Error as exc:
        raise MigrationError(f"contract step {path.name}: {_describe(exc)}", path=path) from exc


def _statements(text: str) -> list[str]:
    """The statements of a contract step: split on the semicolons outside quotes, dollar
    quotes and comments (a non-transactional step runs them one by one: CONCURRENTLY
    refuses a query string of several)."""
    statements, start, i, n = [], 0, 0, len(text)
    while i < n:
        if text.startswith("--", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text[i] == "'":
            i = text.find("'", i + 1)
            i = n if i < 0 else i + 1
            continue
        elif text[i] == "$":
            tag = re.match(r"\$[A-Za-z_]*\$", text[i:])
            if tag:
                end = text.find(tag[0], i + len(tag[0]))
                i = n if end < 0 else end + len(tag[0])
                continue
        elif text[i] == ";":
            statements.append(text[start : i + 1])
            start = i + 1
        i += 1
    statements.append(text[start:])
    return [s.strip() for s in statements if not _only_comments(s)]


def _only_comments(statement: str) -> bool:
    return all(not line.strip() or line.strip().startswith("--") for line in statement.splitlines())
