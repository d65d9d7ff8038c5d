"""``llm-db migrate`` under live traffic bounds its own locks and says what it does
(items 2 and 4).

A consumer transaction is left open on a table a test migration (``9999``, appended
to a copy of ``migrations/``) or a test function file must lock. migrate's statement
waits at most its lock timeout, is cancelled, which frees the consumers queued behind
it, and its step is retried whole until the transaction ends or the deadline passes.
Who waits for whom is read with ``pg_blocking_pids``; elapsed times are only bounded
generously. The books end with ``llm.check_invariants()`` empty.
"""

from __future__ import annotations

import importlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg.conninfo import conninfo_to_dict

from llm_db.cli import main
from llm_db.migrate import FUNCTIONS_STEP, DeadlineReached, MigrationError, migrate
from tests.helpers import (
    InThread,
    admit,
    invariants,
    new_org,
    scalar,
    settle,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[1]
TEST_STEP = "9999_test_lock"
# the consumer's open transaction: a read of the requests, as a report would do
OPEN_READ = "SELECT count(*) FROM llm.invocations"


def migrations_with(tmp_path: Path, body: str) -> Path:
    """A copy of migrations/ with one more migration, 9999, after the last."""
    target = tmp_path / "migrations"
    shutil.copytree(ROOT / "migrations", target)
    last = sorted(p.stem for p in target.glob("*.sql"))[-1]
    (target / f"{TEST_STEP}.sql").write_text(f"-- depends: {last}\n{body}\n")
    return target


ADD_COLUMN = "ALTER TABLE llm.invocations ADD COLUMN test_note text;"


def has_test_column(conn: psycopg.Connection) -> bool:
    return scalar(conn, "SELECT count(*) FROM pg_attribute WHERE attrelid = 'llm.invocations'::regclass"
                        " AND attname = 'test_note'") == 1  # fmt: skip


def open_consumer_read(llm_connect) -> psycopg.Connection:
    """A consumer transaction left open, holding ACCESS SHARE on llm.invocations."""
    consumer = llm_connect(autocommit=False)
    consumer.execute(OPEN_READ)
    return consumer


def waits(events: list[dict[str, Any]], step: str) -> list[dict[str, Any]]:
    return [e for e in list(events) if e["event"] == "wait" and e["step"] == step]


def migrate_until_it_waits(
    dsn: str, step: str, *, migrations_dir: Path, sql_dir: Path, lock_timeout: float
) -> tuple[InThread, list[dict[str, Any]], dict[str, Any]]:
    """migrate (deadline 60 s) in a thread, once it logged a wait at ``step``: the thread,
    the events it logs, and that first wait."""
    events: list[dict[str, Any]] = []
    run = InThread(lambda: migrate(dsn, migrations_dir=migrations_dir, sql_dir=sql_dir,
                                   lock_timeout=lock_timeout, deadline=60, on_event=events.append))  # fmt: skip
    first = wait_for(lambda: waits(events, step), f"migrate to retry {step}")[0]
    return run, events, first


def test_an_open_transaction_makes_migrate_retry_without_stalling_consumers(
    llm_dsn, llm_conn, llm_connect, tmp_path
):
    """A consumer transaction left open makes migrate wait and retry,
    each wait naming the blocking pid and its query; a consumer call
    queued behind migrate's lock request goes on within about one lock timeout while
    the transaction is still open; migrate completes once it ends. Invariant 1 holds."""
    org = new_org(llm_conn, 1000)
    consumer = open_consumer_read(llm_connect)
    migrations = migrations_with(tmp_path, ADD_COLUMN)
    run, events, first = migrate_until_it_waits(llm_dsn, TEST_STEP, migrations_dir=migrations, sql_dir=ROOT / "sql",
                                                lock_timeout=0.5)  # fmt: skip
    assert first["blocker_pid"] == consumer.info.backend_pid
    assert first["blocker_query"] == OPEN_READ
    assert first["lock"] == "llm.invocations" and first["mode"] == "AccessExclusiveLock"

    # An admission queued behind migrate's ACCESS EXCLUSIVE request: it is let through
    # when that request times out, although the consumer's transaction is still open.
    caller = llm_connect()
    started = time.monotonic()
    admitted = admit(caller, org, 10)
    assert time.monotonic() - started < 0.5 + 2.0  # one lock timeout, and scheduling slack
    assert consumer.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    assert run.thread.is_alive()

    consumer.rollback()
    report = run.result()
    assert TEST_STEP in report.applied_migrations and has_test_column(llm_conn)
    done = [e for e in events if e["event"] == "done" and e["step"] == TEST_STEP]
    assert len(done) == 1 and done[0]["attempts"] >= 2
    assert settle(caller, org, admitted["id"], 7) == "settled"
    assert invariants(llm_conn) == []


def test_a_deadline_stops_migrate_naming_the_blocker_and_leaves_a_working_database(
    llm_dsn, llm_conn, llm_connect, tmp_path
):
    """At its deadline migrate stops with a MigrationError naming the
    blocking pid and its query; the failed migration is neither applied nor recorded,
    the functions work (admit, settle) and a re-run completes.
    Invariant 1 holds."""
    migrations = migrations_with(tmp_path, ADD_COLUMN)
    consumer = open_consumer_read(llm_connect)
    with pytest.raises(DeadlineReached) as caught:
        migrate(llm_dsn, migrations_dir=migrations, sql_dir=ROOT / "sql", lock_timeout=0.2,
                deadline=1.5)  # fmt: skip
    pid = consumer.info.backend_pid
    assert caught.value.blocker_pid == pid and caught.value.blocker_query == OPEN_READ
    assert f"pid {pid}" in str(caught.value) and OPEN_READ in str(caught.value)
    assert not has_test_column(llm_conn)
    assert scalar(llm_conn, "SELECT count(*) FROM public._yoyo_migration WHERE migration_id = %s",
                  [TEST_STEP]) == 0  # fmt: skip

    org = new_org(llm_conn, 1000)
    assert settle(llm_conn, org, admit(llm_conn, org, 10)["id"], 7) == "settled"
    consumer.rollback()
    report = migrate(llm_dsn, migrations_dir=migrations, sql_dir=ROOT / "sql", lock_timeout=0.2)
    assert report.applied_migrations == (TEST_STEP,) and has_test_column(llm_conn)
    assert invariants(llm_conn) == []


def test_the_function_files_are_retried_whole_when_a_view_they_replace_is_read(
    llm_dsn, llm_conn, llm_connect, tmp_path
):
    """The sql/ phase (one savepoint of migrate's transaction) that times
    out on a lock is rolled back and retried whole; a consumer reading a view the files
    replace only delays it."""
    sql_dir = tmp_path / "sql"
    shutil.copytree(ROOT / "sql", sql_dir)
    view = "CREATE OR REPLACE VIEW llm.test_view AS SELECT 1 AS one;"
    llm_conn.execute(view)
    (sql_dir / "96_test_view.sql").write_text(view + "\n")
    consumer = llm_connect(autocommit=False)
    consumer.execute("SELECT * FROM llm.test_view")
    run, events, wait = migrate_until_it_waits(llm_dsn, FUNCTIONS_STEP, migrations_dir=ROOT / "migrations",
                                               sql_dir=sql_dir, lock_timeout=0.3)  # fmt: skip
    assert wait["blocker_pid"] == consumer.info.backend_pid and wait["lock"] == "llm.test_view"
    consumer.rollback()
    run.result()
    done = [e for e in events if e["event"] == "done" and e["step"] == FUNCTIONS_STEP]
    assert len(done) == 1 and done[0]["attempts"] >= 2


def test_database_timeouts_do_not_kill_migrate(llm_server, llm_dsn, llm_conn, tmp_path):
    """Migrate's connections set idle_in_transaction_session_timeout = 0
    and statement_timeout = 0 for themselves, so a database's own settings cannot end
    migrate's lock-holding connection (idle in transaction while yoyo works) nor cancel
    a long migration."""
    dbname = conninfo_to_dict(llm_dsn)["dbname"]
    llm_conn.execute(f'ALTER DATABASE "{dbname}" SET idle_in_transaction_session_timeout = 100')
    llm_conn.execute(f'ALTER DATABASE "{dbname}" SET statement_timeout = 200')
    slow = "SELECT pg_catalog.pg_sleep(0.5);\n" + ADD_COLUMN
    report = migrate(llm_dsn, migrations_dir=migrations_with(tmp_path, slow), sql_dir=ROOT / "sql")
    assert report.applied_migrations == (TEST_STEP,)
    with psycopg.connect(llm_dsn) as conn:
        assert has_test_column(conn)


CONCURRENT_INDEX = """-- transactional: false
DROP INDEX CONCURRENTLY IF EXISTS llm.invocations_test;
CREATE INDEX CONCURRENTLY invocations_test ON llm.invocations (model);"""


def test_a_concurrent_index_build_is_bounded_and_retried_too(
    llm_dsn, llm_conn, llm_connect, tmp_path
):
    """Conventions 14: a `-- transactional: false` migration runs with the
    same settings (for the session, while it runs): CREATE INDEX CONCURRENTLY waiting for
    a consumer's open write times out, is retried from its DROP of the invalid leftover,
    and builds a valid index once the write commits. Invariant 1 holds."""
    org = new_org(llm_conn, 1000)
    consumer = llm_connect(autocommit=False)
    admitted = admit(consumer, org, 10)
    migrations = migrations_with(tmp_path, CONCURRENT_INDEX)
    run, _, wait = migrate_until_it_waits(llm_dsn, TEST_STEP, migrations_dir=migrations, sql_dir=ROOT / "sql",
                                          lock_timeout=0.3)  # fmt: skip
    assert wait["blocker_pid"] == consumer.info.backend_pid
    consumer.commit()
    run.result()
    assert scalar(
        llm_conn,
        "SELECT indisvalid FROM pg_index WHERE indexrelid = 'llm.invocations_test'::regclass",
    )
    assert settle(llm_conn, org, admitted["id"], 7) == "settled"
    assert invariants(llm_conn) == []


def test_a_backfill_reports_its_progress(llm_dsn, tmp_path):
    """A migration's `RAISE NOTICE 'llm-db progress: <done>/<total>'`
    becomes one progress event of its step (Conventions 14)."""
    # not transactional, as a batched backfill is (Conventions 14)
    backfill = ("-- transactional: false\nDO $$ BEGIN RAISE NOTICE 'llm-db progress: 1/2'; RAISE NOTICE 'something else';"
                " RAISE NOTICE 'llm-db progress: 2/2'; END $$;")  # fmt: skip
    events: list[dict[str, Any]] = []
    migrate(llm_dsn, migrations_dir=migrations_with(tmp_path, backfill), sql_dir=ROOT / "sql",
            on_event=events.append)  # fmt: skip
    assert [e for e in events if e["event"] == "progress"] == [
        {"event": "progress", "step": TEST_STEP, "done": 1, "total": 2},
        {"event": "progress", "step": TEST_STEP, "done": 2, "total": 2},
    ]


def test_a_lost_connection_is_a_migration_error_and_a_rerun_completes(
    llm_dsn, llm_conn, llm_connect, tmp_path
):
    """Migrate's lock-holding connection ended under it (here by
    pg_terminate_backend while it waits for a consumer) is a MigrationError, not a raw
    psycopg exception; what was committed stays, the functions work, a re-run completes."""
    migrations = migrations_with(tmp_path, ADD_COLUMN)
    consumer = open_consumer_read(llm_connect)
    run, _, _ = migrate_until_it_waits(llm_dsn, TEST_STEP, migrations_dir=migrations, sql_dir=ROOT / "sql",
                                       lock_timeout=0.3)  # fmt: skip
    holder = scalar(llm_conn, "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted")
    assert scalar(llm_conn, "SELECT pg_terminate_backend(%s)", [holder])
    consumer.rollback()
    with pytest.raises(MigrationError, match="migrate stopped: .*terminat"):
        run.result()
    org = new_org(llm_conn, 1000)
    assert settle(llm_conn, org, admit(llm_conn, org, 10)["id"], 7) == "settled"
    report = migrate(llm_dsn, migrations_dir=migrations, sql_dir=ROOT / "sql")
    assert has_test_column(llm_conn) and report.sql_files
    assert invariants(llm_conn) == []


def test_a_migration_and_its_record_commit_together(llm_dsn, llm_conn, tmp_path, monkeypatch):
    """A run killed as a migration's transaction commits leaves it applied and recorded,
    or neither, so a re-run completes instead of applying it again (which failed:
    column already exists). yoyo committed a migration, then recorded it in a second
    transaction. Here the run dies in the first statement after that one transaction:
    the record is already there."""
    import llm_db._migrate_steps as steps

    migrations = migrations_with(tmp_path, ADD_COLUMN)
    real_apply = steps._apply_recorded

    def die_after(worker, path, run, records, failure):
        real_apply(worker, path, run, records, failure)
        if path.stem == TEST_STEP:
            raise RuntimeError("killed after the migration's commit")

    monkeypatch.setattr(steps, "_apply_recorded", die_after)
    with pytest.raises(RuntimeError, match="killed"):
        migrate(llm_dsn, migrations_dir=migrations, sql_dir=ROOT / "sql")
    monkeypatch.setattr(steps, "_apply_recorded", real_apply)
    assert has_test_column(llm_conn)
    assert scalar(llm_conn, "SELECT count(*) FROM public._yoyo_migration WHERE migration_id = %s",
                  [TEST_STEP]) == 1  # fmt: skip
    report = migrate(llm_dsn, migrations_dir=migrations, sql_dir=ROOT / "sql")
    assert report.applied_migrations == ()


def test_a_migration_that_fails_is_neither_applied_nor_recorded_and_names_its_line(
    llm_dsn, llm_conn, tmp_path
):
    """A migration's statements and its record are one transaction: one failing in its
    second statement leaves neither its first nor its record, and the error names the
    file and the line."""
    migrations = migrations_with(tmp_path, ADD_COLUMN + "\nSELECT 1;\nSELECT no_such_column FROM llm.organizations;\n")
    with pytest.raises(MigrationError, match=f"migration {TEST_STEP} failed in .* line [0-9]+: 42703") as caught:
        migrate(llm_dsn, migrations_dir=migrations, sql_dir=ROOT / "sql")
    assert caught.value.path == migrations / f"{TEST_STEP}.sql"
    assert not has_test_column(llm_conn)
    assert scalar(llm_conn, "SELECT count(*) FROM public._yoyo_migration WHERE migration_id = %s",
                  [TEST_STEP]) == 0  # fmt: skip


# ---------------------------------------------------------------- the command line


@pytest.fixture
def cli_dirs(monkeypatch, tmp_path):
    """Point ``llm-db migrate`` (in process) at a copy of migrations/ with 9999."""
    migrations = migrations_with(tmp_path, ADD_COLUMN)
    # llm_db.migrate the attribute is the function; the module is in sys.modules
    monkeypatch.setattr(
        importlib.import_module("llm_db.migrate"),
        "default_dirs",
        lambda: (migrations, ROOT / "sql"),
    )


def test_cli_json_prints_one_event_per_line(llm_dsn, cli_dirs):
    """``--json`` prints one JSON object a line: each step's start and
    end, then the result."""
    result = CliRunner().invoke(main, ["migrate", "--dsn", llm_dsn, "--json"])
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in result.output.splitlines()]
    assert [(e["event"], e.get("step")) for e in events] == [
        ("start", TEST_STEP), ("done", TEST_STEP),
        ("start", FUNCTIONS_STEP), ("done", FUNCTIONS_STEP),
        ("finished", None),
    ]  # fmt: skip
    assert events[-1]["applied_migrations"] == [TEST_STEP]


def test_cli_text_prints_one_line_a_step_when_not_on_a_terminal(llm_dsn, cli_dirs):
    """Off a terminal, one line a step (as it ends) with its time."""
    result = CliRunner().invoke(main, ["migrate", "--dsn", llm_dsn])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"{TEST_STEP}: done in ")
    assert lines[1].startswith(f"{FUNCTIONS_STEP}: done in ")
    assert lines[2] == f"migrations applied: {TEST_STEP}"


def test_cli_exits_75_at_its_deadline_naming_the_blocker(llm_dsn, llm_connect, cli_dirs):
    """The deadline is exit 75 with the blocking pid on stderr, after
    lines that show each wait."""
    consumer = open_consumer_read(llm_connect)
    result = CliRunner().invoke(
        main, ["migrate", "--dsn", llm_dsn, "--lock-timeout", "0.2", "--deadline", "1"]
    )
    pid = consumer.info.backend_pid
    assert result.exit_code == 75, result.output
    assert (
        f"{TEST_STEP}: waiting for lock on llm.invocations (AccessExclusiveLock) held by pid {pid}"
        in result.stdout
    )
    assert f"pid {pid}" in result.stderr and "deadline reached" in result.stderr
