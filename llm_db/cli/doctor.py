"""``llm-db doctor``: a preflight check of a database, before and after install.

Each check answers one question a deployment on a managed PostgreSQL asks (is
pg_cron there, may the owner create roles, can the lease see other backends, is
the connection transaction-pooled, ...) with a ``Check``: ``ok``, ``warning`` or
``missing``, a one-line detail, and when not ok the fix: the exact statement to
run as the provider's admin, or the llm-db command to run. docs/install.md
has a section per provider.

Nothing here needs a privilege the owner on a managed service lacks: settings
are read from ``pg_settings``, which hides a superuser-only setting such as
``cron.database_name`` from a role without ``pg_read_all_settings`` instead of
raising as ``current_setting()`` does. Nothing is written.

All the SQL the checks run is here, as named constants.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

__all__ = ["MISSING", "OK", "WARNING", "Check", "run_checks", "worst"]

OK, WARNING, MISSING = "ok", "warning", "missing"
_RANK = {OK: 0, WARNING: 1, MISSING: 2}

#: the PostgreSQL major version the suite runs on (llm_db.testing._server)
TESTED_MAJOR = 15
#: the migrate command a fix names (the target's own DSN is the user's to give)
MIGRATE = "llm-db migrate --dsn ... (as the role that should own the schema)"

# a few key grants of sql/99_grants.sql, one or two per role's documented ability:
# (role, privilege, object); tests/test_doctor.py checks each is still granted there
KEY_GRANTS = (
    (
        "llm_app",
        "EXECUTE",
        "llm.admit_invocation(uuid, bigint, text, uuid, uuid, timestamptz, text, text, text, bigint, bigint)",
    ),
    (
        "llm_app",
        "EXECUTE",
        "llm.settle_invocation(uuid, uuid, bigint, bigint, bigint, bigint, timestamptz)",
    ),
    ("llm_operator", "EXECUTE", "llm.run_reconciliation(timestamptz, integer)"),
    ("llm_operator", "EXECUTE", "llm._clock_ok(timestamptz)"),
    ("llm_operator", "EXECUTE", "llm.reconciliation_health(timestamptz)"),
    ("llm_operator", "EXECUTE", "llm.claim_notices(integer, timestamptz)"),
    ("llm_reader", "SELECT", "llm.reconciliation_runs"),
)
ROLES = ("llm_app", "llm_operator", "llm_reader")


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report."""

    name: str
    status: str
    """``ok``, ``warning`` or ``missing``."""
    detail: str
    fix: str | None = None
    """When not ok: the statement to run as the provider's admin, or the command."""


def worst(checks: list[Check]) -> str:
    return max((c.status for c in checks), key=_RANK.__getitem__, default=OK)


# ----------------------------------------------------------- the SQL

SERVER = """
SELECT pg_catalog.current_setting('server_version_num')::integer AS num,
       pg_catalog.current_setting('server_version') AS version,
       pg_catalog.current_database() AS dbname
"""
EXTENSION = """
SELECT (SELECT e.extversion FROM pg_catalog.pg_extension AS e
         WHERE e.extname = %(name)s::text) AS installed,
       EXISTS (SELECT FROM pg_catalog.pg_available_extensions AS a
                WHERE a.name = %(name)s::text) AS available
"""
# pg_settings hides a superuser-only setting from a role without pg_read_all_settings:
# no row, no error (current_setting(..., true) raises 42501 instead to a non-superuser)
CRON_DATABASE_NAME = """
SELECT (SELECT s.setting FROM pg_catalog.pg_settings AS s
         WHERE s.name = 'cron.database_name') AS setting,
       pg_catalog.pg_has_role('pg_read_all_settings', 'USAGE') AS reads_settings
"""
# the connecting role, and the schema owner once llm is installed (else the same role):
# the owner is who migrates, and whose rights the SECURITY DEFINER routines run with
ROLE = """
SELECT r.rolname AS role, r.rolsuper AS superuser, r.rolcreaterole AS createrole,
       d.datdba = r.oid AS owns_database,
       pg_catalog.pg_get_userbyid(d.datdba) AS database_owner,
       pg_catalog.has_database_privilege(d.oid, 'CREATE') AS can_create,
       pg_catalog.quote_ident(d.datname) AS dbname_ident,
       pg_catalog.pg_get_userbyid(COALESCE(n.nspowner, r.oid)) AS owner,
       pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(COALESCE(n.nspowner, r.oid)))
           AS owner_ident,
       pg_catalog.pg_has_role(COALESCE(n.nspowner, r.oid), 'pg_read_all_stats', 'USAGE')
           AS owner_sees_backends,
       n.oid IS NOT NULL AS installed
  FROM pg_catalog.pg_roles AS r
 CROSS JOIN pg_catalog.pg_database AS d
  LEFT JOIN pg_catalog.pg_namespace AS n ON n.nspname = 'llm'
 WHERE r.rolname = CURRENT_USER AND d.datname = pg_catalog.current_database()
"""
ROLES_PRESENT = """
SELECT r.name, x.oid IS NOT NULL AS present,
       (SELECT pg_catalog.count(*) FROM pg_catalog.pg_auth_members AS m
         WHERE m.roleid = x.oid) AS members
  FROM pg_catalog.unnest(%(roles)s::text[]) WITH ORDINALITY AS r(name, n)
  LEFT JOIN pg_catalog.pg_roles AS x ON x.rolname = r.name
 ORDER BY r.n
"""
GRANTS_HELD = """
SELECT g.role, g.object,
       CASE WHEN g.privilege = 'SELECT'
            THEN pg_catalog.has_table_privilege(g.role, pg_catalog.to_regclass(g.object), 'SELECT')
            ELSE pg_catalog.has_function_privilege(g.role, pg_catalog.to_regprocedure(g.object),
                                                   'EXECUTE')
       END AS held
  FROM unnest(%(roles)s::text[], %(privileges)s::text[], %(objects)s::text[])  -- ROWS FROM
       AS g(role, privilege, object)
"""
# the migrations' record, yoyo's table (llm_db.migrate keeps it where yoyo did, in the
# first schema of the search_path); to_regclass is NULL, not an error, before the first
# migrate
YOYO_RECORDED = "SELECT pg_catalog.to_regclass('_yoyo_migration') IS NOT NULL AS recorded"
YOYO_APPLIED = "SELECT m.migration_id FROM _yoyo_migration AS m ORDER BY 1"
# what scheduling needs in the pg_cron database (pg_cron 1.4 revokes
# schedule_in_database from PUBLIC); %(role)s is who would schedule
CRON_GRANTS = """
SELECT pg_catalog.has_schema_privilege(%(role)s::text, 'cron', 'USAGE') AS usage,
       (SELECT pg_catalog.bool_and(pg_catalog.has_function_privilege(%(role)s::text, p.oid,
                                                                      'EXECUTE'))
          FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace = 'cron'::regnamespace
           AND p.proname = 'schedule_in_database') AS schedule_in_database,
       pg_catalog.quote_ident(%(role)s::text) AS role_ident,
       pg_catalog.current_database() AS dbname
"""
# cron.job has row-level security: a role that is not a superuser sees its own jobs
CRON_JOBS = """
SELECT j.jobname, j.schedule, j.username
  FROM cron.job AS j
 WHERE j.database = %(dbname)s::text
   AND pg_catalog.strpos(j.command, 'llm.run_reconciliation') > 0
 ORDER BY j.jobid
"""
HEALTH = "SELECT h.status, h.detail FROM llm.reconciliation_health() AS h"
BACKEND_PID = "SELECT pg_catalog.pg_backend_pid()"


# ----------------------------------------------------------- the checks


def _one(conn: psycopg.Connection, query: str, params: dict[str, Any] | None = None) -> Any:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query, params).fetchone()  # type: ignore[arg-type]


def _all(conn: psycopg.Connection, query: str, params: dict[str, Any] | None = None) -> list:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query, params).fetchall()  # type: ignore[arg-type]


def check_server(conn: psycopg.Connection) -> Check:
    row = _one(conn, SERVER)
    major = row["num"] // 10000
    detail = f"PostgreSQL {row['version']}"
    if major >= TESTED_MAJOR:
        return Check("server", OK, detail)
    return Check(
        "server",
        WARNING,
        f"{detail}: llm-db is tested on PostgreSQL {TESTED_MAJOR}",
        f"upgrade the server to PostgreSQL {TESTED_MAJOR} or later",
    )


def check_pg_cron(conn: psycopg.Connection, cron: psycopg.Connection | None) -> Check:
    """Where pg_cron is: this database, the --cron-dsn one, or where the setting says."""
    here = _one(conn, EXTENSION, {"name": "pg_cron"})
    if here["installed"]:
        return Check("pg_cron", OK, f"pg_cron {here['installed']} in this database")
    if cron is not None:
        there = _one(cron, EXTENSION, {"name": "pg_cron"})
        if there["installed"]:
            return Check(
                "pg_cron",
                OK,
                f"pg_cron {there['installed']} in database {cron.info.dbname} (--cron-dsn)",
            )
        return Check(
            "pg_cron",
            MISSING,
            f"pg_cron is not installed in the --cron-dsn database {cron.info.dbname}",
            "CREATE EXTENSION pg_cron; -- in the database named "
            "by cron.database_name (docs/pass.md)",
        )
    setting = _one(conn, CRON_DATABASE_NAME)
    if setting["setting"] is not None:
        name = setting["setting"]
        if name == conn.info.dbname:
            return Check(
                "pg_cron",
                MISSING,
                "pg_cron is preloaded for this database (cron.database_name) but not created",
                "CREATE EXTENSION pg_cron;",
            )
        return Check(
            "pg_cron",
            WARNING,
            f"pg_cron runs from database {name} (cron.database_name): schedule through it",
            f"llm-db doctor --dsn ... --cron-dsn <the DSN of database {name}>",
        )
    if setting["reads_settings"]:  # the role could read the setting: pg_cron is not loaded
        return Check(
            "pg_cron",
            MISSING,
            "pg_cron is not preloaded (no cron.database_name)",
            "shared_preload_libraries = 'pg_cron' and cron.database_name = "
            f"'{conn.info.dbname}' in the server's parameters (restart), then "
            "CREATE EXTENSION pg_cron; (docs/install.md, per provider)",
        )
    return Check(
        "pg_cron",
        WARNING,
        "pg_cron's database is not readable without pg_read_all_settings: pass --cron-dsn",
        "llm-db doctor --dsn ... --cron-dsn <the DSN of the database named by cron.database_name>",
    )


def check_cron_grants(cron: psycopg.Connection, role: str, *, in_database: bool) -> Check:
    """What scheduling needs in the pg_cron database, for the role that schedules:
    USAGE on schema cron (F3), and EXECUTE on cron.schedule_in_database from
    another database (pg_cron 1.4 revokes it from PUBLIC)."""
    row = _one(cron, CRON_GRANTS, {"role": role})
    ident = row["role_ident"]
    missing = []
    if not row["usage"]:
        missing.append(f"GRANT USAGE ON SCHEMA cron TO {ident};")
    if not in_database:
        if row["schedule_in_database"] is None:
            return Check(
                "pg_cron grants",
                MISSING,
                "cron.schedule_in_database does not exist: pg_cron 1.4 or later is needed",
                "ALTER EXTENSION pg_cron UPDATE;",
            )
        if not row["schedule_in_database"]:
            missing.append(
                "GRANT EXECUTE ON FUNCTION cron.schedule_in_database(text, text, "
                f"text, text, text, boolean) TO {ident};"
            )
    where = f"in database {row['dbname']}"
    if missing:
        return Check(
            "pg_cron grants", MISSING, f"{role} cannot schedule the pass {where}", " ".join(missing)
        )
    what = "USAGE on schema cron" + ("" if in_database else ", EXECUTE on schedule_in_database")
    return Check("pg_cron grants", OK, f"{role} has {what} {where}")


def check_optional(conn: psycopg.Connection, name: str, use: str) -> Check:
    """An extension llm-db uses when present (plpgsql_check, citus): ok either way."""
    row = _one(conn, EXTENSION, {"name": name})
    if row["installed"]:
        return Check(name, OK, f"{name} {row['installed']} installed ({use})")
    where = "available, not created" if row["available"] else "not available on this server"
    return Check(name, OK, f"{name} {where}: optional, only for {use}")


def check_owner(role: dict[str, Any]) -> Check:
    """The connecting role as migrate needs it: it creates the schema (CREATE on the
    database) and, on a first install, the roles llm_app/operator/reader (CREATEROLE)."""
    name = role["role"]
    kind = "superuser" if role["superuser"] else "not a superuser"
    facts = [
        f"{name}: {kind}",
        "CREATEROLE" if role["createrole"] else "no CREATEROLE",
        "owns the database"
        if role["owns_database"]
        else f"the database is owned by {role['database_owner']}",
    ]
    if role["installed"] and role["owner"] != name:
        return Check(
            "owner",
            WARNING,
            "; ".join(facts) + f"; schema llm is owned by "
            f"{role['owner']}: run migrate as that role",
            f"llm-db migrate --dsn postgresql://{role['owner']}@...",
        )
    if not role["superuser"] and not role["can_create"]:
        return Check(
            "owner",
            MISSING,
            "; ".join(facts) + "; cannot create a schema here",
            f"GRANT CREATE ON DATABASE {role['dbname_ident']} TO {role['owner_ident']};",
        )
    if not role["superuser"] and not role["createrole"] and not role["installed"]:
        return Check(
            "owner",
            WARNING,
            "; ".join(facts) + "; the first migrate creates roles "
            "llm_app, llm_operator and llm_reader unless they exist",
            f"ALTER ROLE {role['owner_ident']} CREATEROLE;",
        )
    return Check("owner", OK, "; ".join(facts))


def check_lease(role: dict[str, Any]) -> Check:
    """Whether the pass's lease sees other roles' backends (pg_stat_activity's
    backend_start): then it takes over a cancelled or pooled-away holder at once."""
    owner = role["owner"]
    if role["owner_sees_backends"]:
        return Check(
            "lease",
            OK,
            f"{owner} sees every backend's start (pg_read_all_stats): "
            "a pass cancelled or pooled away is taken over at once",
        )
    return Check(
        "lease",
        WARNING,
        f"{owner} is not a member of pg_read_all_stats or "
        "pg_monitor: a pass cancelled or pooled away is taken over only when "
        "settings.pass_lease lapses",
        f"GRANT pg_read_all_stats TO {role['owner_ident']};",
    )


def check_roles(conn: psycopg.Connection, installed: bool) -> Check:
    """llm_app, llm_operator and llm_reader exist and hold their key grants."""
    rows = _all(conn, ROLES_PRESENT, {"roles": list(ROLES)})
    absent = [r["name"] for r in rows if not r["present"]]
    if absent:
        return Check(
            "roles", MISSING, f"no role {', '.join(absent)}: migrate creates them", MIGRATE
        )
    members = ", ".join(f"{r['name']} ({r['members']} members)" for r in rows)
    if not installed:
        return Check("roles", OK, f"{members}; grants: llm-db is not installed yet")
    roles, privileges, objects = (list(column) for column in zip(*KEY_GRANTS, strict=True))
    held = _all(conn, GRANTS_HELD, {"roles": roles, "privileges": privileges, "objects": objects})
    lost = [f"{g['role']}: {g['object']}" for g in held if not g["held"]]
    if lost:
        return Check(
            "roles",
            MISSING,
            f"{members}; not granted: {'; '.join(lost)}",
            MIGRATE + " (sql/99_grants.sql grants them again)",
        )
    return Check("roles", OK, f"{members}; key grants of sql/99_grants.sql held")


def package_migrations(migrations_dir: Path | None = None) -> list[str]:
    """The migration ids this llm-db carries, in the order migrate applies them."""
    from llm_db._migrate_steps import migration_files
    from llm_db.migrate import default_dirs

    return [p.stem for p in migration_files(migrations_dir or default_dirs()[0])]


def check_migrations(conn: psycopg.Connection, installed: bool) -> Check:
    """The database's migration level (its record, yoyo's table) against this package's."""
    package = package_migrations()
    if not installed or not _one(conn, YOYO_RECORDED)["recorded"]:
        return Check(
            "migrations",
            MISSING,
            f"llm-db is not installed (no schema llm); this "
            f"package has {len(package)} migrations, up to {package[-1]}",
            MIGRATE,
        )
    applied = [r["migration_id"] for r in _all(conn, YOYO_APPLIED)]
    pending = [m for m in package if m not in applied]
    unknown = [m for m in applied if m not in package]
    if unknown:
        return Check(
            "migrations",
            WARNING,
            f"the database has migrations this package lacks "
            f"({', '.join(unknown)}): it was migrated by a newer llm-db",
            "pip install --upgrade llm-db",
        )
    if pending:
        return Check(
            "migrations",
            WARNING,
            f"{len(pending)} of {len(package)} migrations to apply ({', '.join(pending)})",
            MIGRATE,
        )
    return Check("migrations", OK, f"{len(applied)} of {len(package)} applied, up to {package[-1]}")


def check_schedule(
    conn: psycopg.Connection, cron: psycopg.Connection | None, role: dict[str, Any]
) -> Check:
    """A pg_cron job that runs the pass in this database (the jobs this role may see)."""
    if cron is None:
        return Check(
            "schedule",
            WARNING,
            "cannot tell whether the pass is scheduled: pg_cron's database is not known",
            "llm-db doctor --dsn ... --cron-dsn ...",
        )
    dbname = conn.info.dbname
    try:
        jobs = _all(cron, CRON_JOBS, {"dbname": dbname})
    except psycopg.errors.InsufficientPrivilege:
        return Check(
            "schedule",
            MISSING,
            f"cron.job is not readable by {cron.info.user}",
            f"GRANT USAGE ON SCHEMA cron TO {role['owner_ident']};",
        )
    if not jobs:
        seen = "" if role["superuser"] else f" (of the jobs {cron.info.user} may see)"
        return Check(
            "schedule",
            WARNING,
            f"no pg_cron job runs the pass in {dbname}{seen}",
            "llm-db schedule --dsn ..." + ("" if cron is conn else " --cron-dsn ..."),
        )
    named = ", ".join(f"{j['jobname']} {j['schedule']!r} as {j['username']}" for j in jobs)
    return Check("schedule", OK, f"pg_cron job {named} in database {cron.info.dbname}")


def check_health(conn: psycopg.Connection, installed: bool) -> Check:
    """llm.reconciliation_health(): has the pass run lately, without errors."""
    if not installed:
        return Check("health", MISSING, "llm-db is not installed: no pass can run", MIGRATE)
    row = _one(conn, HEALTH)
    if row["status"] == "ok":
        return Check("health", OK, f"the pass is healthy: {row['detail']}")
    return Check(
        "health",
        WARNING,
        f"the pass is {row['status']}: {row['detail']}",
        "llm-db schedule --dsn ... ; llm-db health --dsn ...",
    )


def check_pooling(conn: psycopg.Connection, connect: Callable[[], psycopg.Connection]) -> Check:
    """Is this DSN transaction-pooled? Directly or through a session pooler a
    connection keeps one backend, which no other connection shares. So: note this
    connection's backend, let a second connection hold a transaction open, and ask
    again. A pooler in transaction mode hands the idle backend to the second
    connection (LIFO, PgBouncer's default), or this one another backend while the
    second holds one; asking twice on one connection alone would see the same
    backend whenever nobody else uses the pool."""
    first = conn.execute(BACKEND_PID).fetchone()[0]  # type: ignore[index]
    with connect() as other:
        other.execute("BEGIN")
        shared = other.execute(BACKEND_PID).fetchone()[0] == first  # type: ignore[index]
        moved = not shared and conn.execute(BACKEND_PID).fetchone()[0] != first  # type: ignore[index]
        other.execute("COMMIT")
    if shared or moved:
        return Check(
            "pooling",
            WARNING,
            "transaction-pooled: two transactions were answered "
            "by different backends. Everything works here except what needs a "
            "session: llm-db worker (LISTEN) and Llm(conn, prepare=True)",
            "give llm-db worker and prepare=True a direct or session-pooled DSN",
        )
    return Check(
        "pooling",
        OK,
        "one backend per connection (direct or session pooling): "
        "llm-db worker (LISTEN) and prepare=True work",
    )


def run_checks(
    conn: psycopg.Connection,
    connect: Callable[[], psycopg.Connection],
    cron: psycopg.Connection | None = None,
) -> list[Check]:
    """Every check of ``conn``'s database, in report order. ``connect`` opens another
    connection to the same DSN (the pooling check); ``cron`` is the --cron-dsn one."""
    return list(_checks(conn, connect, cron))


def _checks(
    conn: psycopg.Connection,
    connect: Callable[[], psycopg.Connection],
    cron: psycopg.Connection | None,
) -> Iterator[Check]:
    role = _one(conn, ROLE)
    installed = role["installed"]
    yield _guarded("server", check_server, conn)
    pg_cron = _guarded("pg_cron", check_pg_cron, conn, cron)
    yield pg_cron
    if cron is None and _one(conn, EXTENSION, {"name": "pg_cron"})["installed"]:
        cron = conn  # pg_cron in this database: it is its own cron database
    if pg_cron.status == OK and cron is not None:
        # in this database llm.schedule_reconciliation schedules as the owner;
        # through --cron-dsn the connecting role calls schedule_in_database
        who = role["owner"] if cron is conn else cron.info.user
        yield _guarded("pg_cron grants", check_cron_grants, cron, who, in_database=cron is conn)
    yield _guarded("plpgsql_check", check_optional, conn, "plpgsql_check", "the test suite's lint")
    yield _guarded("citus", check_optional, conn, "citus", "sharding: llm-db distribute")
    yield check_owner(role)
    yield check_lease(role)
    yield _guarded("roles", check_roles, conn, installed)
    yield _guarded("migrations", check_migrations, conn, installed)
    yield _guarded("schedule", check_schedule, conn, cron if pg_cron.status == OK else None, role)
    yield _guarded("health", check_health, conn, installed)
    yield _guarded("pooling", check_pooling, conn, connect)


def _guarded(name: str, check: Callable[..., Check], *args: Any, **kwargs: Any) -> Check:
    """One check; an SQL error it meets (a privilege the doctor lacks, say) is its
    warning, and the other checks still run."""
    try:
        return check(*args, **kwargs)
    except psycopg.OperationalError:
        raise  # the connection is gone: nothing else can be checked
    except psycopg.Error as exc:
        message = " ".join((exc.diag.message_primary or str(exc)).split())
        return Check(
            name,
            WARNING,
            f"could not check: {exc.sqlstate} {message}",
            "run llm-db doctor as the schema owner",
        )
