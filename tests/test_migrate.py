"""llm_db.migrate: idempotent, safe under concurrency, any libpq dsn, shipped in the wheel."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import threading
import uuid
import zipfile
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import llm_db
from llm_db.migrate import MigrationError, MigrationReport, default_dirs, migrate
from llm_db.testing._server import CRON_DATABASE, ServerSetupError, check_installation
from tests.helpers import yoyo

ROOT = Path(__file__).resolve().parents[1]
REPO_MIGRATIONS = sorted(p.name for p in (ROOT / "migrations").glob("*.sql"))
REPO_SQL = sorted(p.name for p in (ROOT / "sql").glob("*.sql"))

# Everything a migration or a function file can change, as comparable text rows,
# for every non-system schema (llm, and public, where the migrations' record is).
FINGERPRINT_SQL = """
WITH ns AS (
    SELECT oid, nspname FROM pg_namespace
    WHERE nspname !~ '^pg_' AND nspname <> 'information_schema'
)
SELECT 'schema', nspname, coalesce(n.nspacl::text, ''), coalesce(obj_description(n.oid, 'pg_namespace'), '')
FROM pg_namespace n WHERE n.oid IN (SELECT oid FROM ns)
UNION ALL
SELECT 'relation', c.oid::regclass::text, c.relkind::text || ' ' || coalesce(c.relacl::text, ''),
       coalesce(obj_description(c.oid, 'pg_class'), '')
FROM pg_class c WHERE c.relnamespace IN (SELECT oid FROM ns)
UNION ALL
SELECT 'column', c.oid::regclass::text || '.' || a.attname,
       format_type(a.atttypid, a.atttypmod) || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
           || ' ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '') || ' ' || coalesce(a.attacl::text, ''),
       coalesce(col_description(c.oid, a.attnum), '')
FROM pg_class c
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
WHERE c.relnamespace IN (SELECT oid FROM ns)
UNION ALL
SELECT 'constraint', conrelid::regclass::text || ' ' || conname, pg_get_constraintdef(oid), ''
FROM pg_constraint WHERE connamespace IN (SELECT oid FROM ns)
UNION ALL
SELECT 'index', indexrelid::regclass::text, pg_get_indexdef(indexrelid), ''
FROM pg_index WHERE indrelid IN (SELECT oid FROM pg_class WHERE relnamespace IN (SELECT oid FROM ns))
UNION ALL
SELECT 'view', c.oid::regclass::text, pg_get_viewdef(c.oid), ''
FROM pg_class c WHERE c.relkind IN ('v', 'm') AND c.relnamespace IN (SELECT oid FROM ns)
UNION ALL
SELECT 'routine', p.oid::regprocedure::text,
       md5(CASE WHEN p.prokind IN ('f', 'p', 'w') THEN pg_get_functiondef(p.oid) ELSE p.prosrc END)
           || ' ' || coalesce(p.proacl::text, ''),
       coalesce(obj_description(p.oid, 'pg_proc'), '')
FROM pg_proc p WHERE p.pronamespace IN (SELECT oid FROM ns)
UNION ALL
SELECT 'type', t.oid::regtype::text, t.typtype::text || ' ' || coalesce(t.typacl::text, '') || ' '
           || coalesce((SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
                        FROM pg_enum e WHERE e.enumtypid = t.oid), ''),
       coalesce(obj_description(t.oid, 'pg_type'), '')
FROM pg_type t WHERE t.typnamespace IN (SELECT oid FROM ns) AND t.typtype <> 'b'
UNION ALL
SELECT 'default_acl', defaclrole::regrole::text || ' ' || defaclobjtype::text, defaclacl::text, ''
FROM pg_default_acl
UNION ALL
SELECT 'role', rolname, rolcanlogin::text || rolinherit::text, ''
FROM pg_roles WHERE left(rolname, 4) = 'llm_'
UNION ALL
SELECT 'extension', extname, extversion, '' FROM pg_extension
"""


def schema_fingerprint(dsn: str) -> set[tuple[str, ...]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(FINGERPRINT_SQL).fetchall()
        yoyo = conn.execute("SELECT migration_id FROM public._yoyo_migration").fetchall()
    return {tuple(r) for r in rows} | {("yoyo", r[0], "", "") for r in yoyo}


@pytest.fixture
def fresh_db(llm_server, llm_owner):
    """Factory: an empty database (from template1) owned by the non-superuser owner, as a
    managed service's admin creates it, and the owner's dsn; dropped after the test."""
    names: list[str] = []

    def make() -> tuple[str, str]:
        name = f"m_{uuid.uuid4().hex}"
        names.append(name)
        return name, llm_server.create_database(name, owner=llm_owner)

    yield make
    for name in names:
        llm_server.drop_database(name)


def _repo_dirs() -> tuple[Path, Path]:
    return ROOT / "migrations", ROOT / "sql"


# ---------------------------------------------------------------- the dsn


def test_migrate_rejects_a_garbage_dsn_naming_it():
    with pytest.raises(MigrationError, match="invalid connection string"):
        migrate("host=x port")


# ---------------------------------------------------------------- migrate


def test_migrate_applies_every_migration_then_every_sql_file(fresh_db):
    _, dsn = fresh_db()
    report = llm_db.migrate(dsn)
    assert report.applied_migrations == tuple(n.removesuffix(".sql") for n in REPO_MIGRATIONS)
    assert list(report.sql_files) == REPO_SQL
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT to_regnamespace('llm') IS NOT NULL").fetchone() == (True,)


def test_migrate_twice_changes_nothing(fresh_db):
    _, dsn = fresh_db()
    first = migrate(dsn)
    before = schema_fingerprint(dsn)
    second = migrate(dsn)
    after = schema_fingerprint(dsn)
    assert first.applied_migrations
    assert second.applied_migrations == ()
    assert second.sql_files == first.sql_files
    assert before == after, sorted(before ^ after)


def test_template_matches_a_freshly_migrated_database(fresh_db, llm_dsn):
    _, dsn = fresh_db()
    migrate(dsn)
    assert schema_fingerprint(dsn) == schema_fingerprint(llm_dsn)


def two_migrates_at_once(dsn: str) -> list[MigrationReport]:
    """Run two migrates of ``dsn`` at once (released together by a barrier); both must
    finish without an error. Returns their reports."""
    barrier = threading.Barrier(2)
    results: list[object] = [None, None]

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = migrate(dsn)
        except BaseException as exc:  # reported below, in the test's thread
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a migrate run hung"
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    return results  # type: ignore[return-value]


def test_two_concurrent_migrate_runs_on_a_fresh_database_both_succeed(fresh_db, llm_dsn):
    """Two first installs at once by the non-superuser owner ("two at
    once"): each migration applies once, and the result is the template's schema."""
    _, dsn = fresh_db()
    results = two_migrates_at_once(dsn)
    applied = [m for r in results for m in r.applied_migrations]
    assert sorted(applied) == [n.removesuffix(".sql") for n in REPO_MIGRATIONS]  # each once
    assert schema_fingerprint(dsn) == schema_fingerprint(llm_dsn)


@pytest.mark.parametrize(
    "form", ["conninfo_tcp", "conninfo_socket", "url_postgresql", "url_postgres"]
)
def test_migrate_accepts_key_value_and_url_dsns(llm_server, llm_owner, fresh_db, form):
    name, owner_dsn = fresh_db()
    url = llm_server.url(name).replace(f"//{llm_server.superuser}@", f"//{llm_owner}@")
    dsn = {
        "conninfo_tcp": owner_dsn,
        "conninfo_socket": f"host={llm_server.socket_dir} port={llm_server.port} user={llm_owner} dbname={name}",
        "url_postgresql": url,
        "url_postgres": url.replace("postgresql://", "postgres://"),
    }[form]
    report = migrate(dsn)
    assert report.applied_migrations
    with psycopg.connect(owner_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM public._yoyo_migration").fetchone() == (
            len(REPO_MIGRATIONS),
        )


def test_sql_files_apply_in_one_transaction_and_errors_name_the_file(fresh_db, tmp_path):
    _, dsn = fresh_db()
    migrations, sql_dir = tmp_path / "migrations", tmp_path / "sql"
    migrations.mkdir()
    sql_dir.mkdir()
    (migrations / "0001_base.sql").write_text(
        "CREATE SCHEMA scratch;\nCREATE TABLE scratch.t (id int);\n"
    )
    (sql_dir / "10_good.sql").write_text(
        "CREATE OR REPLACE FUNCTION scratch.good() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;\n"
    )
    (sql_dir / "20_bad.sql").write_text("-- a comment\nSELECT 1;\nSELEC broken;\n")
    with pytest.raises(MigrationError, match=r"20_bad\.sql line 3: 42601") as info:
        migrate(dsn, migrations_dir=migrations, sql_dir=sql_dir)
    assert info.value.path == sql_dir / "20_bad.sql"
    with psycopg.connect(dsn) as conn:
        # the migration committed; the function phase rolled back as a whole
        assert conn.execute("SELECT to_regclass('scratch.t') IS NOT NULL").fetchone() == (True,)
        assert conn.execute("SELECT to_regproc('scratch.good') IS NULL").fetchone() == (True,)
    (sql_dir / "20_bad.sql").write_text("SELECT 1;\n")
    report = migrate(dsn, migrations_dir=migrations, sql_dir=sql_dir)
    assert report.applied_migrations == ()
    assert report.sql_files == ("10_good.sql", "20_bad.sql")


def test_routines_sql_no_longer_defines_are_dropped_by_the_next_migrate(fresh_db, tmp_path):
    """A routine deleted from sql/, or left behind by a signature change, is dropped in the
    same transaction that re-applies sql/; every routine sql/ defines stays, with its grants."""
    _, dsn = fresh_db()
    migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION llm.retired() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$")
        conn.execute(
            "CREATE FUNCTION llm.reconcile_org(uuid) RETURNS int LANGUAGE sql AS $$ SELECT 1 $$"
        )
        conn.execute("CREATE PROCEDURE llm.retired_step() LANGUAGE sql AS $$ SELECT 1 $$")
        before = schema_fingerprint(dsn)

    report = migrate(dsn)

    assert set(report.dropped_routines) == {
        "llm.retired()", "llm.reconcile_org(uuid)", "llm.retired_step()"}  # fmt: skip
    after = schema_fingerprint(dsn)
    assert {r for r in before - after if r[0] == "routine"} == {
        r for r in before if r[0] == "routine"
        and r[1] in ("llm.retired()", "llm.reconcile_org(uuid)", "llm.retired_step()")
    }  # fmt: skip
    assert after <= before  # nothing else changed, grants and comments included
    assert migrate(dsn).dropped_routines == ()


def test_a_failed_migrate_drops_no_routine(fresh_db, tmp_path):
    """The sweep of routines rides in the function files' transaction: when a file fails,
    nothing is dropped."""
    _, dsn = fresh_db()
    migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION llm.retired() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$")
    migrations, sql_dir = _repo_dirs()
    broken = tmp_path / "sql"
    broken.mkdir()
    for path in sql_dir.glob("*.sql"):
        (broken / path.name).write_text(path.read_text())
    (broken / "98_broken.sql").write_text("SELEC 1;\n")
    with pytest.raises(MigrationError, match=r"98_broken\.sql"):
        migrate(dsn, migrations_dir=migrations, sql_dir=broken)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT to_regprocedure('llm.retired()') IS NOT NULL").fetchone()[0]
        marked = conn.execute(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'llm'::regnamespace"
            " AND proconfig::text LIKE '%%llm-db migrate: stale%%'"
        ).fetchone()[0]
        assert marked == 0


REPO_FUNCTION_STEPS = sorted(p.stem for p in (ROOT / "migrations" / "functions").glob("*.sql"))


def _recorded_steps(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT step FROM llm.upgrade_steps ORDER BY step").fetchall()]


def test_a_function_step_runs_once_per_database_and_is_recorded(fresh_db):
    """migrations/functions/ holds what runs once, with the function files: the
    re-applied files of sql/ hold no one-time upgrade. A fresh install runs each step
    (finding nothing to change) and records it; the next run runs none."""
    _, dsn = fresh_db()
    assert REPO_FUNCTION_STEPS == ["0001_result_types"]
    first = migrate(dsn)
    assert first.function_steps == tuple(REPO_FUNCTION_STEPS)
    assert {f"functions/{step}" for step in REPO_FUNCTION_STEPS} <= set(_recorded_steps(dsn))
    assert migrate(dsn).function_steps == ()
    sql = "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "sql").glob("*.sql")))
    assert "DROP FUNCTION %s" not in sql  # the result types' drop is the step's only


def test_a_function_step_commits_with_the_function_files_or_not_at_all(fresh_db, tmp_path):
    """A step that drops a routine its file re-creates: callers find the old routine or the
    new one. When a function file fails, the step's drop and its record roll back with it,
    and the next run, the file fixed, runs the step again."""
    _, dsn = fresh_db()
    migrate(dsn)
    migrations = shutil.copytree(ROOT / "migrations", tmp_path / "migrations")
    sql_dir = shutil.copytree(ROOT / "sql", tmp_path / "sql")
    (migrations / "functions" / "0002_drop_claim_notices.sql").write_text(
        "DROP FUNCTION llm.claim_notices(integer, timestamptz);\n", encoding="utf-8"
    )
    (sql_dir / "98_broken.sql").write_text("SELEC 1;\n", encoding="utf-8")
    with pytest.raises(MigrationError, match=r"98_broken\.sql"):
        migrate(dsn, migrations_dir=migrations, sql_dir=sql_dir)
    assert "functions/0002_drop_claim_notices" not in _recorded_steps(dsn)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT to_regprocedure('llm.claim_notices(integer, timestamptz)') IS NOT NULL").fetchone()[0]
    (sql_dir / "98_broken.sql").unlink()
    report = migrate(dsn, migrations_dir=migrations, sql_dir=sql_dir)
    assert report.function_steps == ("0002_drop_claim_notices",) and report.dropped_routines == ()
    assert "functions/0002_drop_claim_notices" in _recorded_steps(dsn)
    with psycopg.connect(dsn) as conn:  # dropped, then created again by its file
        assert conn.execute("SELECT to_regprocedure('llm.claim_notices(integer, timestamptz)') IS NOT NULL").fetchone()[0]
    assert migrate(dsn, migrations_dir=migrations, sql_dir=sql_dir).function_steps == ()


def test_a_failing_function_step_names_its_file_and_changes_nothing(fresh_db, tmp_path):
    _, dsn = fresh_db()
    migrate(dsn)
    migrations = shutil.copytree(ROOT / "migrations", tmp_path / "migrations")
    (migrations / "functions" / "0002_broken.sql").write_text("SELECT 1;\nSELEC 2;\n", encoding="utf-8")
    before = schema_fingerprint(dsn)
    with pytest.raises(MigrationError, match=r"function step 0002_broken\.sql.*line 2"):
        migrate(dsn, migrations_dir=migrations, sql_dir=ROOT / "sql")
    assert schema_fingerprint(dsn) == before
    assert "functions/0002_broken" not in _recorded_steps(dsn)


def test_a_non_superuser_owner_installs_reruns_and_sweeps(fresh_db, llm_owner):
    """The schema owner of a managed service (LOGIN CREATEROLE, no
    superuser, owning the database) installs, re-runs migrate, and has a routine sql/ no
    longer defines dropped. The re-run failed with 42501 "permission denied to set
    parameter" while stale routines were marked with a custom parameter."""
    _, dsn = fresh_db()
    with psycopg.connect(dsn) as conn:
        assert conn.execute(
            "SELECT current_user, rolsuper, rolcreaterole FROM pg_roles WHERE rolname = current_user"
        ).fetchone() == (llm_owner, False, True)
    assert migrate(dsn).applied_migrations
    before = schema_fingerprint(dsn)
    again = migrate(dsn)
    assert again.applied_migrations == () and again.dropped_routines == ()
    assert schema_fingerprint(dsn) == before
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION llm.retired() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$")
    assert migrate(dsn).dropped_routines == ("llm.retired()",)
    assert schema_fingerprint(dsn) == before


def test_two_migrates_at_once_through_pgbouncer_as_the_owner(llm_server, llm_pgbouncer, fresh_db):
    """Two runs by the non-superuser owner through a transaction pooler, on a database
    installed by an earlier run, both succeed; the first install through the pooler works
    too."""
    name, owner_dsn = fresh_db()
    dsn = llm_pgbouncer.dsn(name, user=conninfo_to_dict(owner_dsn)["user"])
    assert migrate(dsn).applied_migrations
    before = schema_fingerprint(dsn)
    two_migrates_at_once(dsn)
    assert schema_fingerprint(dsn) == before


def test_checkout_uses_the_repository_sql():
    assert default_dirs() == (ROOT / "migrations", ROOT / "sql")


# ---------------------------------------------------------------- packaging


def test_wheel_carries_sql_migrations_and_entry_points(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry_text = zf.read(entry_points).decode()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [line for line in zf.read(metadata).decode().splitlines()
                    if line.startswith("Requires-Dist:") and "extra ==" not in line]  # fmt: skip
    # the pool the README's example uses is installed with the package
    assert any(r.startswith("Requires-Dist: psycopg[") and "pool" in r for r in requires), requires
    assert {f"llm_db/_sql/{n}" for n in REPO_SQL} <= names
    assert {f"llm_db/_migrations/{n}" for n in REPO_MIGRATIONS} <= names
    assert REPO_SQL and REPO_MIGRATIONS
    assert "llm-db = llm_db.__main__:main" in entry_text
    # The pytest plugin is opt-in, so the wheel registers none
    assert "pytest11" not in entry_text and "llm_db.testing" not in entry_text, entry_text
    # and it holds every folder of the package (the wheel is one, the extras its folders)
    assert {f"llm_db/{folder}/__init__.py" for folder in ("cli", "service", "testing", "demo")} <= names


def test_cli_migrate_from_the_unpacked_wheel_works_from_any_directory(wheel, fresh_db, tmp_path):
    _, dsn = fresh_db()
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site), DATABASE_URL=dsn)
    code = (
        "import sys, llm_db, llm_db.cli;"
        "print(llm_db.__file__); print(sys.modules['llm_db.migrate'].default_dirs()[1]);"
        "llm_db.cli.main(['migrate'])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    package_file, sql_dir, *rest = proc.stdout.splitlines()
    assert package_file == str(site / "llm_db" / "__init__.py")
    assert sql_dir == str(site / "llm_db" / "_sql")
    assert any("migrations applied: " in line for line in rest), proc.stdout
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT to_regnamespace('llm') IS NOT NULL").fetchone() == (True,)


def test_schema_fingerprint_sees_a_changed_function(llm_dsn):
    # guards the idempotency tests above against a fingerprint that cannot fail
    before = schema_fingerprint(llm_dsn)
    with psycopg.connect(llm_dsn, autocommit=True) as conn:
        (name,) = conn.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p"
            " WHERE p.pronamespace = 'llm'::regnamespace ORDER BY 1 LIMIT 1"
        ).fetchone()
        conn.execute(f"COMMENT ON FUNCTION {name} IS 'changed by a test'")
    assert schema_fingerprint(llm_dsn) != before


# ---------------------------------------------------------------- the harness these tests run on


def test_missing_pg_cron_fails_with_the_bootstrap_hint(tmp_path):
    with pytest.raises(ServerSetupError, match=r"pg_cron is not installed.*scripts/bootstrap\.sh"):
        check_installation(share_dir=tmp_path)


def test_server_preloads_pg_cron_for_the_llm_cron_database(llm_superuser_conn):
    # superuser: server settings, which pg_settings hides from others (shared_preload_libraries)
    settings = dict(
        llm_superuser_conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN"
            " ('shared_preload_libraries', 'cron.database_name', 'cron.use_background_workers',"
            "  'max_connections', 'lock_timeout', 'statement_timeout')"
        ).fetchall()
    )
    assert "pg_cron" in settings["shared_preload_libraries"]
    assert settings["cron.database_name"] == CRON_DATABASE
    assert settings["cron.use_background_workers"] == "on"
    assert int(settings["max_connections"]) >= 200
    assert settings["lock_timeout"] == "5000" and settings["statement_timeout"] == "60000"


def test_server_processes_never_run_as_root(llm_server):
    data = Path(llm_server.base_dir) / "data"
    owner = data.stat().st_uid
    assert owner != 0 or os.geteuid() != 0
    if os.geteuid() == 0:
        assert owner == pwd.getpwnam("postgres").pw_uid


def test_each_test_gets_its_own_clone_of_the_template(llm_conn, llm_connect, llm_template):
    dbname = llm_conn.info.dbname
    assert dbname.startswith("t_") and dbname != llm_template
    other = llm_connect(autocommit=False)
    assert other.info.dbname == dbname
    assert other.execute("SELECT to_regnamespace('llm') IS NOT NULL").fetchone() == (True,)


def test_role_connection_logs_in_as_a_member_of_the_role(llm_role_conn):
    """llm_role_conn logs in as the role's own login (no SET ROLE from a
    superuser), a plain member of it."""
    conn = llm_role_conn("llm_reader")
    assert conn.execute(
        "SELECT session_user = current_user, current_user, pg_has_role('llm_reader', 'MEMBER'),"
        " rolsuper FROM pg_roles WHERE rolname = current_user"
    ).fetchone() == (True, "llm_reader_login", True, False)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("CREATE TABLE llm.nope (id int)")


def test_the_test_database_is_owned_by_a_non_superuser_owner(llm_conn, llm_owner):
    """llm_conn is the owner's: LOGIN CREATEROLE, no superuser, owning the
    database and every table and routine of schema llm (the template was migrated by it)."""
    assert llm_conn.execute(
        "SELECT r.rolname, r.rolsuper, r.rolcreaterole, r.rolcanlogin,"
        "       pg_get_userbyid(d.datdba) = r.rolname"
        "  FROM pg_roles AS r, pg_database AS d"
        " WHERE r.rolname = current_user AND d.datname = current_database()"
    ).fetchone() == (llm_owner, False, True, True, True)
    assert llm_conn.execute(
        "SELECT count(*) FROM pg_class WHERE relnamespace = 'llm'::regnamespace"
        " AND relowner <> current_user::regrole"
    ).fetchone() == (0,)
    assert llm_conn.execute(
        "SELECT count(*) FROM pg_proc WHERE pronamespace = 'llm'::regnamespace"
        " AND proowner <> current_user::regrole"
    ).fetchone() == (0,)


CONSUMER_TEST = """
def test_who(llm_conn, llm_role_conn):
    print("OWNER", llm_conn.execute("SELECT current_user, rolsuper FROM pg_roles"
                                    " WHERE rolname = current_user").fetchone())
    print("ROLE", llm_role_conn("llm_app").execute("SELECT session_user, current_user").fetchone())
"""


@pytest.mark.parametrize(
    ("ini", "owner", "role"),
    [
        ("", "('llm_owner', False)", "('llm_app_login', 'llm_app_login')"),
        ("llm_db_superuser_owner = true", "('postgres', True)", "('postgres', 'llm_app')"),
    ],
)
def test_a_consumer_gets_the_owner_or_with_the_ini_option_the_superuser(tmp_path, ini, owner, role):
    """A project that opts in to the plugin gets the same fixtures, the owner's llm_conn by
    default, and the superuser's with ``llm_db_superuser_owner`` (as before)."""
    (tmp_path / "pytest.ini").write_text(f"[pytest]\n{ini}\n")
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["llm_db.testing"]\n')
    (tmp_path / "test_consumer.py").write_text(CONSUMER_TEST)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "test_consumer.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"OWNER {owner}" in proc.stdout and f"ROLE {role}" in proc.stdout, proc.stdout


def test_cron_database_has_pg_cron_and_llm(llm_cron_dsn):
    with psycopg.connect(llm_cron_dsn) as conn:
        assert conn.info.dbname == CRON_DATABASE
        assert conn.execute(
            "SELECT count(*) FROM pg_extension WHERE extname = 'pg_cron'"
        ).fetchone() == (1,)
        assert conn.execute("SELECT to_regnamespace('llm') IS NOT NULL").fetchone() == (True,)


def test_the_record_is_yoyos_both_ways(fresh_db, tmp_path):
    """migrate keeps yoyo's record without yoyo: a database yoyo migrated (0.3.0's
    migrate applied migrations through it) goes on from where yoyo left it, and yoyo
    finds nothing to apply on one migrate installed. The record's key is yoyo's hash
    of the id, and yoyo's log has a line per migration."""
    first = tmp_path / "first"
    first.mkdir()
    for name in REPO_MIGRATIONS[:10]:
        shutil.copy(ROOT / "migrations" / name, first / name)
    _, dsn = fresh_db()
    with yoyo(dsn, first) as (backend, migrations):
        backend.apply_migrations(backend.to_apply(migrations))

    report = migrate(dsn)
    assert list(report.applied_migrations) == [Path(n).stem for n in REPO_MIGRATIONS[10:]]
    with yoyo(dsn, ROOT / "migrations") as (backend, migrations):
        assert list(backend.to_apply(migrations)) == []
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FILTER (WHERE migration_hash = encode(sha256(migration_id::bytea), 'hex')),"
                            " count(*) FROM public._yoyo_migration").fetchone() == (len(REPO_MIGRATIONS),) * 2  # fmt: skip
        assert conn.execute("SELECT count(DISTINCT migration_id) FROM public._yoyo_log WHERE operation = 'apply'"
                            ).fetchone() == (len(REPO_MIGRATIONS),)  # fmt: skip

    _, fresh = fresh_db()
    migrate(fresh)
    with yoyo(fresh, ROOT / "migrations") as (backend, migrations):
        assert list(backend.to_apply(migrations)) == []


def test_a_rerun_needs_no_create_privilege_where_the_record_is(fresh_db, llm_server):
    """Installed, the owner of a managed service may hold no CREATE on public any more
    (PostgreSQL 15 grants none to PUBLIC, and the provider owns the schema): a re-run
    reads the record there and creates nothing, so it completes."""
    name, dsn = fresh_db()
    migrate(dsn)
    with llm_server.connect(name, autocommit=True) as admin:
        admin.execute(f"ALTER SCHEMA public OWNER TO {llm_server.superuser}")
        admin.execute("REVOKE ALL ON SCHEMA public FROM PUBLIC")
        admin.execute("GRANT USAGE ON SCHEMA public TO PUBLIC")
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT has_schema_privilege('public', 'CREATE')").fetchone() == (False,)
    report = migrate(dsn)
    assert report.applied_migrations == () and report.sql_files


def test_a_migration_naming_a_dependency_that_is_not_there_stops_migrate(fresh_db, tmp_path):
    """``-- depends:`` names migrations applied or before it (yoyo's rule): one naming
    another stops migrate before anything is applied, naming both."""
    migrations = tmp_path / "migrations"
    shutil.copytree(ROOT / "migrations", migrations)
    (migrations / "9999_lost.sql").write_text("-- depends: 9998_nowhere\nSELECT 1;\n")
    _, dsn = fresh_db()
    with pytest.raises(MigrationError, match="9999_lost depends on 9998_nowhere"):
        migrate(dsn, migrations_dir=migrations)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT to_regclass('llm.organizations')").fetchone() == (None,)


def test_migrate_prepares_no_statement_on_any_of_its_connections(fresh_db, llm_pgbouncer, monkeypatch):
    """Migrate through a transaction pooler: its worker repeats one SET statement a
    transaction, which psycopg would prepare after five, and PgBouncer in transaction
    mode hands the next transaction another server connection, where the prepared name
    collides (42P05; seen once in a full run). Every connection migrate opens
    prepares nothing (prepare_threshold None), and a migrate through the pooler
    completes."""
    real_connect = psycopg.connect
    opened: list[object] = []

    def connect(*args, **kwargs):
        opened.append(kwargs.get("prepare_threshold", "psycopg's default"))
        return real_connect(*args, **kwargs)

    monkeypatch.setattr(psycopg, "connect", connect)
    name, dsn = fresh_db()
    report = migrate(llm_pgbouncer.dsn(name, user=conninfo_to_dict(dsn)["user"]))
    assert report.applied_migrations and report.contract_steps
    assert len(opened) >= 3 and set(opened) == {None}, opened
