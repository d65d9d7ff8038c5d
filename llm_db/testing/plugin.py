"""pytest plugin: an ephemeral PostgreSQL 15 (pg_cron preloaded), a migrated
template database, and a fresh clone of it for every test.

Opt-in (no entry point registers it, since 0.3.0): a project names it in a
top-level ``conftest.py`` (``pytest_plugins = ["llm_db.testing"]``, as llm-db's own
``tests/conftest.py`` does) or runs ``pytest -p llm_db.testing``.

The plugin loads in the core install; the throw-away server needs the ``testing``
extra (``testing.postgresql``), imported when a fixture first starts the server
(``llm_db.testing._postgresql``). Without it, the tests that use these fixtures
fail with one line naming ``pip install 'llm-db[testing]'``.

Fixtures (scope):

``llm_server`` (session)
    The running ``EphemeralServer``: ``.dsn(dbname, user=)``, ``.url(dbname)``,
    ``.superuser``, ``.connect(dbname)``, ``.create_owner()``,
    ``.create_database(name, template=, owner=)``, ``.drop_database(name)``,
    ``.log_path``.
``llm_template`` (session)
    Name (str) of database ``llm_template``: migrated once, then marked
    template and closed to connections.
``llm_owner`` (session)
    Name of the role that owns the test databases and runs ``migrate``:
    ``llm_owner``, LOGIN CREATEROLE and no superuser, as the schema owner of a
    managed service (RDS, Cloud SQL, Azure, Supabase) is. With the ini option
    ``llm_db_superuser_owner = true``, the superuser instead (the behaviour
    before 0.3.0).
``llm_dsn`` (function)
    conninfo (str), for the owner, of a fresh clone of the template, dropped
    after the test.
``llm_conn`` (function)
    Autocommit connection of the OWNER to that clone: it owns the tables, so a
    test corrupts rows through it, and it calls every routine. Every clone
    carries ``lock_timeout=5s`` and ``statement_timeout=60s`` as database
    settings (``ALTER DATABASE … SET``, see ``DATABASE_SETTINGS``), so a
    test that waits on a lock fails fast on any connection to it, through a
    pooler too (PgBouncer rejects the ``options`` startup parameter).
``llm_superuser_conn`` (function)
    Autocommit superuser connection to that clone, for what only a provider's
    admin does: creating extensions, signalling other roles' backends, server
    settings. A test using it says why.
``llm_connect`` (function)
    Factory ``llm_connect(*, role=None, superuser=False, autocommit=True, **kwargs)``
    opening more connections to the same clone (same timeouts), for race tests;
    all closed at teardown. Without ``role`` the owner's; ``role``: see
    ``llm_role_conn``.
``llm_role_conn`` (function)
    Factory ``llm_role_conn(role, *, autocommit=True, **kwargs)``: a connection
    that logged in as ``role``: for ``llm_app``, ``llm_operator`` and
    ``llm_reader``, as the login role that is a member of it
    (``llm_app_login``, … see ``LOGINS``), any other name as itself. No
    ``SET ROLE`` (with ``llm_db_superuser_owner``: a superuser login, then
    ``SET ROLE role``, as before 0.3.0).
``llm_cron_dsn`` (session)
    conninfo of database ``llm_cron`` (the pg_cron database):
    ``CREATE EXTENSION pg_cron`` then migrated. Shared by the session: tests
    using it clean up the cron jobs they create.
``llm_pgbouncer`` (session)
    A running ``PgBouncer`` (Debian's pgbouncer) in front of the server, in
    ``pool_mode = transaction`` with 2 server connections per database and
    user: ``.dsn(dbname)``, ``.admin("SHOW POOLS")``, ``.log_text()``.
``llm_pgbouncer_dsn`` (function)
    conninfo of this test's clone (``llm_dsn``) through that PgBouncer, for the owner.

The plain functions these fixtures use (``create_template``, ``clone_database``, …)
are ``llm_db.testing``'s, for code outside pytest too.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql

from llm_db._extras import MissingExtra
from llm_db.testing import _sql
from llm_db.testing._databases import clone_database, create_cron_database, create_template
from llm_db.testing._pgbouncer import PgBouncer
from llm_db.testing._server import LOGINS, OWNER, EphemeralServer


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Let a SIGTERM (e.g. a CI timeout) unwind like Ctrl-C, so the server is stopped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _connect(
    dsn: str, *, set_role: str | None = None, autocommit: bool = True, **kwargs: Any
) -> psycopg.Connection:
    conn = psycopg.connect(dsn, autocommit=autocommit, **kwargs)
    role = set_role
    if role is not None:
        try:
            conn.execute(_sql.SET_ROLE.format(role=sql.Identifier(role)))
            if not autocommit:
                conn.commit()
        except BaseException:
            conn.close()
            raise
    return conn


@contextmanager
def _started(server: EphemeralServer) -> Iterator[EphemeralServer]:
    """``server`` started (a missing ``testing`` extra fails the test in one line) and
    stopped at the end."""
    missing: MissingExtra | None = None
    try:
        server.start()
    except MissingExtra as exc:
        missing = exc
    if missing is not None:  # outside the except: the report is this line, not a chain
        pytest.fail(f"llm_server: {missing}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


# ---------------------------------------------------------------- fixtures


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "llm_db_superuser_owner",
        "llm_db fixtures: the superuser owns and migrates the test databases and "
        "llm_role_conn uses SET ROLE (the behaviour before llm-db 0.3.0)",
        type="bool",
        default=False,
    )


@pytest.fixture(scope="session")
def llm_server() -> Iterator[EphemeralServer]:
    """The session's ephemeral PostgreSQL 15 server (pg_cron preloaded)."""
    with _sigterm_as_interrupt(), _started(EphemeralServer()) as server:
        yield server


@pytest.fixture(scope="session")
def llm_owner(llm_server: EphemeralServer, pytestconfig: pytest.Config) -> str:
    """Name of the role that owns the test databases and runs migrate (see the module
    docstring; the ini option ``llm_db_superuser_owner`` makes it the superuser)."""
    if pytestconfig.getini("llm_db_superuser_owner"):
        return llm_server.superuser
    return llm_server.create_owner(OWNER)


@pytest.fixture(scope="session")
def llm_template(llm_server: EphemeralServer, llm_owner: str) -> str:
    """Name of the migrated template database every ``llm_dsn`` clones."""
    return create_template(llm_server, owner=llm_owner)


@pytest.fixture
def llm_dsn(llm_server: EphemeralServer, llm_template: str, llm_owner: str) -> Iterator[str]:
    """conninfo, for the owner, of a fresh clone of the template, dropped after the test."""
    name, dsn = clone_database(llm_server, llm_template, owner=llm_owner)
    try:
        yield dsn
    finally:
        llm_server.drop_database(name)


@pytest.fixture
def llm_connect(
    llm_server: EphemeralServer, llm_dsn: str, llm_owner: str
) -> Iterator[Callable[..., psycopg.Connection]]:
    """Factory ``llm_connect(*, role=None, superuser=False, autocommit=True, **kwargs)``
    for more connections to this test's database; all are closed at teardown."""
    opened: list[psycopg.Connection] = []
    old_behaviour = llm_owner == llm_server.superuser

    def connect(
        *,
        role: str | None = None,
        superuser: bool = False,
        autocommit: bool = True,
        **kwargs: Any,
    ) -> psycopg.Connection:
        user, set_role = llm_owner, None
        if superuser:
            user = llm_server.superuser
        elif role is not None and old_behaviour:
            set_role = role
        elif role is not None:
            user = LOGINS.get(role, role)
        dsn = psycopg.conninfo.make_conninfo(llm_dsn, user=user)
        conn = _connect(dsn, set_role=set_role, autocommit=autocommit, **kwargs)
        opened.append(conn)
        return conn

    try:
        yield connect
    finally:
        for conn in opened:
            conn.close()


@pytest.fixture
def llm_conn(llm_connect: Callable[..., psycopg.Connection]) -> psycopg.Connection:
    """Autocommit connection of the owner (``llm_owner``) to this test's database."""
    return llm_connect()


@pytest.fixture
def llm_superuser_conn(llm_connect: Callable[..., psycopg.Connection]) -> psycopg.Connection:
    """Autocommit superuser connection to this test's database: only for what a
    provider's admin does (extensions, other roles' backends, server settings)."""
    return llm_connect(superuser=True)


@pytest.fixture
def llm_role_conn(
    llm_connect: Callable[..., psycopg.Connection],
) -> Callable[..., psycopg.Connection]:
    """Factory ``llm_role_conn(role, *, autocommit=True, **kwargs)``: a connection that
    logged in as ``role`` (the llm roles through their logins, ``LOGINS``)."""

    def connect(role: str, *, autocommit: bool = True, **kwargs: Any) -> psycopg.Connection:
        return llm_connect(role=role, autocommit=autocommit, **kwargs)

    return connect


@pytest.fixture(scope="session")
def llm_cron_dsn(llm_server: EphemeralServer) -> str:
    """conninfo of ``llm_cron``, the pg_cron database, with pg_cron and llm-db installed."""
    return create_cron_database(llm_server)


@pytest.fixture(scope="session")
def llm_pgbouncer(llm_server: EphemeralServer) -> Iterator[PgBouncer]:
    """A PgBouncer in transaction pooling mode (2 server connections per database
    and user) in front of the session's server; stopped at the end of the session."""
    with PgBouncer(llm_server, pool_mode="transaction", pool_size=2) as bouncer:
        yield bouncer


@pytest.fixture
def llm_pgbouncer_dsn(llm_pgbouncer: PgBouncer, llm_dsn: str) -> str:
    """conninfo of this test's database through ``llm_pgbouncer``, for the owner."""
    params = psycopg.conninfo.conninfo_to_dict(llm_dsn)
    return llm_pgbouncer.dsn(params["dbname"], user=params["user"])
