"""The steps of an ``llm_db.migrate`` run: the migrations, each with its record in
yoyo's table, the function steps and files in one transaction, the routines the files
no longer define and the contract steps after the barrier (docs in
``llm_db.migrate``)."""

from __future__ import annotations

import getpass
import hashlib
import re
import socket
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql

from llm_db._migrate_locks import _barrier_of, _begin_locked
from llm_db._migrate_run import _RESET, MigrationError, _describe, _line_of, _Run

FUNCTIONS_STEP = "functions (sql/)"


# ---------------------------------------------------------------- the migrations

# The record of the migrations applied: yoyo's tables (its internal schema 2, which
# yoyo 6 to 9 write), so a database every release before 0.4.0 migrated through yoyo
# is read as it is, and `yoyo list` still reads one migrated here. On a first install
# they are created where yoyo creates them: in the first schema of the search path.
_RECORD_SCHEMA = """
SELECT coalesce((SELECT n.nspname::text FROM pg_catalog.pg_class AS c
                   JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
                  WHERE c.oid = pg_catalog.to_regclass('_yoyo_migration')),
                pg_catalog.current_schema()::text)
"""
# Each table created only where it is missing: CREATE TABLE IF NOT EXISTS would need
# the CREATE privilege on the schema on every run, which a managed service's owner may
# no longer have once installed (PostgreSQL 15 grants none on public).
_MISSING_RECORD_TABLES = """
SELECT t.name FROM pg_catalog.unnest(ARRAY['_yoyo_migration', '_yoyo_log', '_yoyo_version']) AS t(name)
 WHERE pg_catalog.to_regclass(pg_catalog.quote_ident(%(schema)s) || '.' || t.name) IS NULL
"""
_CREATE_RECORD = {
    "_yoyo_migration": """CREATE TABLE {schema}._yoyo_migration (
        migration_hash varchar(64), migration_id varchar(255), applied_at_utc timestamp,
        PRIMARY KEY (migration_hash))""",
    "_yoyo_log": """CREATE TABLE {schema}._yoyo_log (
        id varchar(36), migration_hash varchar(64), migration_id varchar(255),
        operation varchar(10), username varchar(255), hostname varchar(255),
        comment varchar(255), created_at_utc timestamp, PRIMARY KEY (id))""",
    "_yoyo_version": """CREATE TABLE {schema}._yoyo_version (
        version integer NOT NULL PRIMARY KEY, installed_at_utc timestamp)""",
}
# yoyo's internal schema 2, the one these tables are
_VERSION_RECORD = (
    "INSERT INTO {schema}._yoyo_version (version, installed_at_utc)"
    " VALUES (2, pg_catalog.timezone('UTC', pg_catalog.now()))"
)
_APPLIED = "SELECT m.migration_id FROM {schema}._yoyo_migration AS m"
# a migration's record (yoyo's hash of its id is the key) and its line in yoyo's log
_RECORD = (
    "INSERT INTO {schema}._yoyo_migration (migration_hash, migration_id, applied_at_utc)"
    " VALUES (%(hash)s, %(id)s, pg_catalog.timezone('UTC', pg_catalog.now()))"
)
_LOG = (
    "INSERT INTO {schema}._yoyo_log (id, migration_hash, migration_id, operation, username,"
    " hostname, created_at_utc) VALUES (%(log_id)s, %(hash)s, %(id)s, 'apply', %(username)s,"
    " %(hostname)s, pg_catalog.timezone('UTC', pg_catalog.now()))"
)
_DEPENDS = re.compile(r"^-- depends:(.*)$", re.M)
_NOT_TRANSACTIONAL = re.compile(r"^-- transactional: false$", re.M | re.I)


def migration_files(migrations_dir: Path) -> list[Path]:
    """The migrations of ``migrations_dir`` in the order they apply: the ``*.sql`` files
    directly in it, by name (a migration's id is its file's stem, as for yoyo)."""
    return sorted(migrations_dir.glob("*.sql"), key=lambda p: p.name)


def _apply_migrations(dsn: str, migrations_dir: Path, run: _Run, conn: psycopg.Connection) -> list[str]:
    """Apply the migrations not recorded yet, in order, each a step of its own on a
    connection of their own (autocommit), each recorded in its own transaction; one
    marked ``-- barrier: before`` after the barrier, which waits for every transaction
    but ``conn``'s (migrate's, holding the migrate lock). Returns their ids."""
    with _worker(dsn, run) as worker:
        schema = _record_schema(worker, run)
        with worker.transaction():
            applied = {row[0] for row in worker.execute(_APPLIED.format(schema=schema)).fetchall()}  # type: ignore[arg-type]
        files = migration_files(migrations_dir)
        pending = [path for path in files if path.stem not in applied]
        _check_depends(pending, applied)
        for path in pending:
            if _BARRIER_BEFORE.search(path.read_text(encoding="utf-8")):
                step = f"barrier before {path.stem}"
                run.step(step, lambda s=step: _barrier_of(
                    dsn, conn, run, s, "the previous release's functions are live and the database works"))
            run.worker_pid = worker.info.backend_pid
            params = _record_params(path.stem)
            records = [(_RECORD.format(schema=schema), params), (_LOG.format(schema=schema), params)]
            # a 55P03 rolls the migration's transaction back, unrecorded: retried whole
            run.step(path.stem, lambda p=path, r=records: _apply_recorded(
                worker, p, run, r, f"migration {p.stem} failed in {p}"))
        return [path.stem for path in pending]


@contextmanager
def _worker(dsn: str, run: _Run) -> Iterator[psycopg.Connection]:
    """The connection the migrations or the contract steps run on: autocommit, nothing
    prepared (a transaction pooler hands each transaction another server connection),
    its notices reported, its backend the one the watcher looks at."""
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as worker:
        worker.add_notice_handler(run.on_notice)
        run.worker_pid = worker.info.backend_pid
        yield worker


def _record_schema(worker: psycopg.Connection, run: _Run) -> str:
    """The schema of the migrations' record, quoted; its tables created there when
    missing (a first install)."""
    with worker.transaction():
        worker.execute(run.settings)  # type: ignore[arg-type]
        name = worker.execute(_RECORD_SCHEMA).fetchone()[0]  # type: ignore[index]
        if name is None:
            raise MigrationError(
                "no schema to keep the migrations' record in: the search path names none that"
                " exists (create one, such as public, or set search_path)")  # fmt: skip
        schema = sql.Identifier(name).as_string(worker)
        for (table,) in worker.execute(_MISSING_RECORD_TABLES, {"schema": name}).fetchall():
            worker.execute(_CREATE_RECORD[table].format(schema=schema))  # type: ignore[arg-type]
            if table == "_yoyo_version":
                worker.execute(_VERSION_RECORD.format(schema=schema))  # type: ignore[arg-type]
    return schema


def _check_depends(pending: Sequence[Path], applied: set[str]) -> None:
    """Each ``-- depends:`` of a pending migration names one applied or before it."""
    before = set(applied)
    for path in pending:
        for match in _DEPENDS.finditer(path.read_text(encoding="utf-8")):
            missing = [dep for dep in match[1].split() if dep not in before]
            if missing:
                raise MigrationError(
                    f"migration {path.stem} depends on {', '.join(missing)}, which is neither"
                    " applied nor before it in the folder", path=path)  # fmt: skip
        before.add(path.stem)


def _record_params(migration_id: str) -> dict[str, Any]:
    return {
        "id": migration_id, "hash": hashlib.sha256(migration_id.encode("utf-8")).hexdigest(),
        "log_id": str(uuid.uuid4()), "username": _username(), "hostname": socket.gethostname()[:255],
    }  # fmt: skip


def _username() -> str | None:
    try:
        return getpass.getuser()[:255]
    except (KeyError, OSError):  # no login name and no passwd entry (a container)
        return None


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
            with _worker(dsn, run) as worker:
                if stale:
                    run.step(DROP_STEP, lambda: _drop_routines(worker, stale, run))
                for path in pending:
                    run.worker_pid = worker.info.backend_pid
                    run.step(f"contract {path.stem}", lambda p=path: _apply_recorded(
                        worker, p, run, [(_STEP_RECORD, {"step": p.stem})], f"contract step {p.name}"))
    except BaseException:
        if not conn.closed and not conn.broken:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return list(stale), [p.stem for p in pending]


def _apply_recorded(
    worker: psycopg.Connection, path: Path, run: _Run,
    records: Sequence[tuple[str, dict[str, Any]]], failure: str,
) -> None:  # fmt: skip
    """One migration or contract step on ``worker`` (autocommit), with its ``records``
    (statement, parameters): a transactional one in one transaction with them; one
    marked ``-- transactional: false`` statement by statement in autocommit (its own
    COMMITs allowed), then them in a transaction. A failure names the file (after
    ``failure``) and, in a transactional one, its line."""
    text = path.read_text(encoding="utf-8")
    transactional = _NOT_TRANSACTIONAL.search(text) is None
    try:
        if transactional:
            with worker.transaction():
                worker.execute(run.settings)  # type: ignore[arg-type]
                worker.execute(text)  # type: ignore[arg-type]
                for statement, params in records:
                    worker.execute(statement, params)  # type: ignore[arg-type]
            return
        worker.execute(run.settings.replace("SET LOCAL", "SET"))  # type: ignore[arg-type]
        try:
            # statement by statement: CONCURRENTLY refuses a multi-statement query string
            for statement in _statements(text):
                worker.execute(statement)  # type: ignore[arg-type]
        finally:
            if not worker.broken:
                worker.execute(_RESET)
        with worker.transaction():
            worker.execute(run.settings)  # type: ignore[arg-type]
            for statement, params in records:
                worker.execute(statement, params)  # type: ignore[arg-type]
    except pg_errors.LockNotAvailable:
        raise  # retried whole by the caller
    except psycopg.Error as exc:
        line = _line_of(text, exc) if transactional else ""
        raise MigrationError(f"{failure}{line}: {_describe(exc)}", path=path) from exc


def _statements(text: str) -> list[str]:
    """The statements of a migration or contract step: split on the semicolons outside
    quotes, dollar quotes and comments (a non-transactional one runs them one by one:
    CONCURRENTLY refuses a query string of several)."""
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
