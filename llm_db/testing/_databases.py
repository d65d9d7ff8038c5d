"""The throw-away databases of llm-db's tests: the migrated template, the login roles,
a clone per test and pg_cron's database (re-exported by ``llm_db.testing``; used by its
pytest plugin, ``llm_db.testing.plugin``, which imports this module rather than the
package, so the package may load the plugin lazily without an import cycle)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg import sql

from llm_db.migrate import migrate
from llm_db.testing import _sql
from llm_db.testing._server import CRON_DATABASE, LOGINS, OWNER, EphemeralServer

__all__ = [
    "DATABASE_SETTINGS",
    "TEMPLATE_DATABASE",
    "clone_database",
    "create_cron_database",
    "create_logins",
    "create_template",
]

TEMPLATE_DATABASE = "llm_template"
# A test that waits on a lock fails in 5 s instead of hanging the run. Set on
# each clone (ALTER DATABASE ... SET), not as a connection's startup options:
# PgBouncer refuses the options parameter, and a database setting reaches every
# session, the pooler's and pg_cron's included.
DATABASE_SETTINGS = {"lock_timeout": "5s", "statement_timeout": "60s"}


def create_template(
    server: EphemeralServer,
    name: str = TEMPLATE_DATABASE,
    *,
    owner: str | None = OWNER,
    **migrate_kwargs: Any,
) -> str:
    """Create database ``name`` (replacing an older one) owned by ``owner``, migrate it
    as ``owner``, give each llm role its login (``LOGINS``), and mark it a template.
    ``owner=None``: the superuser owns and migrates it. Returns ``name``."""
    _drop_template(server, name)
    if owner is not None:
        server.create_owner(owner)
    dsn = server.create_database(name, owner=owner)
    migrate(dsn, **migrate_kwargs)
    create_logins(dsn)
    server.mark_template(name)
    return name


def create_logins(dsn: str) -> None:
    """Create the login of each llm role (``LOGINS``) unless it exists, as the role at
    ``dsn``: the schema owner has CREATEROLE, which is all this needs."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for role, login in LOGINS.items():
            if conn.execute(_sql.ROLE_EXISTS, {"name": login}).fetchone():
                continue
            conn.execute(
                _sql.CREATE_LOGIN.format(login=sql.Identifier(login), role=sql.Identifier(role))
            )


def clone_database(
    server: EphemeralServer,
    template: str = TEMPLATE_DATABASE,
    name: str | None = None,
    *,
    owner: str | None = OWNER,
) -> tuple[str, str]:
    """Clone ``template`` into a new database owned by ``owner`` (None: the superuser);
    returns ``(name, dsn of the owner)``. Drop it with ``server.drop_database(name)``."""
    name = name or f"t_{uuid.uuid4().hex}"
    dsn = server.create_database(name, template=template, settings=DATABASE_SETTINGS, owner=owner)
    return name, dsn


def create_cron_database(server: EphemeralServer, **migrate_kwargs: Any) -> str:
    """Install pg_cron and llm-db in the pg_cron database (``llm_cron``); returns its dsn."""
    dsn = server.dsn(CRON_DATABASE)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(_sql.CREATE_PG_CRON)
    server.set_database_settings(CRON_DATABASE, DATABASE_SETTINGS)
    migrate(dsn, **migrate_kwargs)
    return dsn


def _drop_template(server: EphemeralServer, name: str) -> None:
    with server.connect() as conn:
        if conn.execute(_sql.DATABASE_EXISTS, {"name": name}).fetchone() is None:
            return
        conn.execute(_sql.UNMARK_TEMPLATE.format(name=sql.Identifier(name)))
    server.drop_database(name)
