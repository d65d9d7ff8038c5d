"""The steps of an ``llm_db.migrate`` run: the migrations through yoyo, the function
steps and files in one transaction, the routines the files no longer define and the
contract steps after the barrier (docs in ``llm_db.migrate``)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from llm_db._migrate_locks import _barrier_of, _begin_locked
from llm_db._migrate_run import _RESET, MigrationError, _describe, _line_of, _Run

FUNCTIONS_STEP = "functions (sql/)"


YOYO_LOCK_WAIT = 30.0  # seconds, at most, for yoyo's lock row


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
    done = {row[0] for row in conn.execute(_STEPS_DONE).fetchall()}
    ran = []
    for path in steps:
        record = f"{_FUNCTION_STEP_PREFIX}{path.stem}"
        if record in done:
            continue
        _execute_file(conn, path, "function step ")
        conn.execute(_STEP_RECORD, {"step": record})
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


BARRIER_STEP = "barrier (transactions of the previous functions)"
DROP_STEP = "routines sql/ no longer defines"
_BARRIER_BEFORE = re.compile(r"^-- barrier: before$", re.M)
# The one-time steps done (contract steps by name, function steps as functions/<name>)
_STEPS_DONE = "SELECT u.step FROM llm.upgrade_steps AS u"
_STEP_RECORD = (
    "INSERT INTO llm.upgrade_steps (step, finished_at) VALUES (%(step)s, pg_catalog.now())"
    " ON CONFLICT (step) DO NOTHING"
)


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
        done = {row[0] for row in conn.execute(_STEPS_DONE).fetchall()} if files else set()
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
                worker.execute(_STEP_RECORD, {"step": path.stem})
            return
        worker.execute(settings)  # type: ignore[arg-type]
        try:
            # statement by statement: CONCURRENTLY refuses a multi-statement query string
            for statement in _statements(text):
                worker.execute(statement)  # type: ignore[arg-type]
            worker.execute(_STEP_RECORD, {"step": path.stem})
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
