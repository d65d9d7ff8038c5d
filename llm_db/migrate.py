"""Install or upgrade the `llm` schema: yoyo migrations, then the function files.

``migrate(dsn)`` runs two phases:

1. ``migrations/*.sql`` (versioned DDL: tables, types, roles) through yoyo,
   each migration once, under yoyo's lock;
2. every ``sql/*.sql`` file (function bodies, grants), in name order, all in
   ONE transaction, re-applied on every run. The files must be re-runnable
   (``CREATE OR REPLACE``, ``DROP … IF EXISTS``); a failure rolls back the
   whole phase, so a database never holds half a release of functions.
   A routine of schema ``llm`` that the files no longer define (deleted, or
   its signature changed) is dropped in that same transaction.

Both phases are serialized across processes by one transaction-level
advisory lock, held by a transaction of ``migrate``'s own connection that
spans yoyo's run (on its own connection; yoyo's lock table cannot cover its
own creation) and then applies the function files; a second run polls for it
(``_begin_locked``). Concurrent ``migrate``
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
made every re-run by a managed service's owner fail with 42501 (issue 21 F1).
Nothing runs with the mark: a marked routine is re-created or dropped before
the transaction commits, and a failed run rolls the mark back.

Where the SQL comes from: an installed wheel carries it as package data
(``llm_db/_sql`` and ``llm_db/_migrations``); a source checkout uses the
repository's ``sql/`` and ``migrations/`` next to the package. Both can be
overridden per call (``migrations_dir=``, ``sql_dir=``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlencode

import psycopg
from psycopg.conninfo import conninfo_to_dict

__all__ = [
    "MIGRATE_LOCK_KEY",
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
    lock_timeout: float = 30.0,
) -> MigrationReport:
    """Bring the database at ``dsn`` to this release of llm-db; safe to re-run.

    ``dsn``: any libpq URL (``postgresql://``, ``postgres://``) or key=value
    conninfo. ``lock_timeout``: seconds to wait for yoyo's lock row. Runs of
    ``migrate`` queue on the advisory lock instead, so that row is only ever
    held by a plain ``yoyo`` run or left behind by a killed one. Returns a
    ``MigrationReport``; raises ``MigrationError`` naming the failing file.
    """
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

    url = yoyo_url(dsn)
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
        _begin_locked(conn)
        try:
            applied = _apply_migrations(url, migrations_path, lock_timeout)
            dropped = _apply_sql_files(conn, sql_files)
        except BaseException:
            if not conn.closed and not conn.broken:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    return MigrationReport(
        applied_migrations=tuple(applied),
        sql_files=tuple(p.name for p in sql_files),
        migrations_dir=migrations_path,
        sql_dir=sql_path,
        dropped_routines=tuple(dropped),
    )


def _begin_locked(conn: psycopg.Connection) -> None:
    """Open a transaction on ``conn`` that holds the migrate lock (transaction-level).

    A waiting run polls with ``pg_try_advisory_xact_lock`` between short transactions
    instead of waiting inside one: a backend that waits inside a statement keeps a
    snapshot, and ``CREATE INDEX CONCURRENTLY`` in the holder's migrations (on yoyo's
    connection) would wait for that snapshot while the waiter waits for the holder.
    No parameters, so the simple query protocol: no portal keeps a snapshot either.
    """
    pause = 0.02
    while True:
        conn.execute("BEGIN")
        if conn.execute(f"SELECT pg_catalog.pg_try_advisory_xact_lock({int(MIGRATE_LOCK_KEY)})").fetchone()[0]:  # type: ignore[arg-type,index]
            return
        conn.execute("ROLLBACK")
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def _apply_migrations(url: str, migrations_dir: Path, lock_timeout: float) -> list[str]:
    from yoyo import get_backend, read_migrations
    from yoyo.exceptions import LockTimeout

    migrations = read_migrations(str(migrations_dir))
    backend = get_backend(url)
    try:
        with backend.lock(timeout=lock_timeout):
            pending = backend.to_apply(migrations)
            try:
                backend.apply_migrations(pending)
            except psycopg.Error as exc:
                raise MigrationError(
                    f"migration failed in {migrations_dir}: {_describe(exc)}", path=migrations_dir
                ) from exc
            return [m.id for m in pending]
    except LockTimeout as exc:  # only taking the lock raises it
        raise MigrationError(
            f"yoyo's lock is still taken after {lock_timeout:g}s ({exc}). If no migration is"
            " running, a killed run left it behind: DELETE FROM public.yoyo_lock;"
        ) from exc
    finally:
        backend.connection.close()


# Every routine of schema llm, marked before the function files run (see the
# module docstring); the ones still marked afterwards are dropped.
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


def _apply_sql_files(conn: psycopg.Connection, files: Sequence[Path]) -> list[str]:
    """Apply the function files in the caller's transaction; drop the routines of
    schema llm they no longer define, and return their signatures."""
    conn.execute(_MARK_ROUTINES)
    for path in files:
        text = path.read_text(encoding="utf-8")
        try:
            # No parameters: psycopg sends the whole file as one simple
            # query, so a file may hold many statements and `%` is literal.
            conn.execute(text)  # type: ignore[arg-type]
        except psycopg.Error as exc:
            raise MigrationError(
                f"{path.name}{_line_of(text, exc)}: {_describe(exc)}", path=path
            ) from exc
    stale = [row[0] for row in conn.execute(_STILL_MARKED).fetchall()]
    for routine in stale:
        try:
            # a regprocedure's text is a valid, quoted routine reference
            conn.execute(f"DROP ROUTINE {routine}")  # type: ignore[arg-type]
        except psycopg.Error as exc:
            raise MigrationError(
                f"cannot drop {routine}, which no file in sql/ defines any more: {_describe(exc)}"
            ) from exc
    return stale


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
