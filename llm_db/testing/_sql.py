"""Every statement the test server runs (``llm_db.testing``), one named constant each
(docs/architecture.md, Conventions 6).

Queries take named parameters with explicit casts. DDL takes no bind parameters, so
the statements on a role, a database or a setting are ``psycopg.sql`` templates: the
caller fills each ``{placeholder}`` with ``sql.Identifier`` (a setting's value with
``sql.Literal``), which quotes it.
"""

from __future__ import annotations

from psycopg import sql

# ----------------------------------------------------------- roles

ROLE_EXISTS = "SELECT 1 FROM pg_catalog.pg_roles AS r WHERE r.rolname = %(name)s::text"

# The schema owner of a managed service: may create the llm roles, is no superuser.
CREATE_OWNER = sql.SQL("CREATE ROLE {name} LOGIN CREATEROLE NOSUPERUSER")

# The login of an llm role: the deployment uses each role through a member of it.
CREATE_LOGIN = sql.SQL("CREATE ROLE {login} LOGIN IN ROLE {role}")

SET_ROLE = sql.SQL("SET ROLE {role}")

# ----------------------------------------------------------- databases

DATABASE_EXISTS = "SELECT 1 FROM pg_catalog.pg_database AS d WHERE d.datname = %(name)s::text"

CREATE_DATABASE = sql.SQL("CREATE DATABASE {name}")
# appended to CREATE_DATABASE: the owner, as a provider's admin creates it
WITH_OWNER = sql.SQL(" OWNER {owner}")
# appended to CREATE_DATABASE: a clone, copied file by file (not block by block
# through the WAL, PostgreSQL 15's default strategy)
WITH_TEMPLATE = sql.SQL(" TEMPLATE {template} STRATEGY FILE_COPY")

# A database is copied, or marked a template, only with nobody connected to it.
END_SESSIONS = """
SELECT pg_catalog.pg_terminate_backend(a.pid)
  FROM pg_catalog.pg_stat_activity AS a
 WHERE a.datname = %(name)s::text AND a.pid <> pg_catalog.pg_backend_pid()
"""

# the default of every later session of the database
SET_DATABASE_SETTING = sql.SQL("ALTER DATABASE {name} SET {key} = {value}")

# nobody can connect to a template, so a clone never waits for a session to leave
MARK_TEMPLATE = sql.SQL("ALTER DATABASE {name} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false")
UNMARK_TEMPLATE = sql.SQL("ALTER DATABASE {name} WITH IS_TEMPLATE false")

DROP_DATABASE = sql.SQL("DROP DATABASE IF EXISTS {name} WITH (FORCE)")

CREATE_PG_CRON = "CREATE EXTENSION IF NOT EXISTS pg_cron"
