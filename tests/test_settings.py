"""Every setting of ``llm.settings`` has a documented range (docs/install.md,
"Settings"), enforced by a CHECK constraint named ``settings_<setting>_range``: an UPDATE
out of range fails with 23514 naming the setting and changes nothing. Migration 0010
stops, naming the setting, its value and its range, when the database already holds a
value out of range.
"""

from __future__ import annotations

import tarfile
import uuid
from pathlib import Path

import psycopg
import pytest

from llm_db.migrate import MigrationError, migrate
from tests.helpers import T0, assert_sqlstate, new_org, reconcile, scalar

ROOT = Path(__file__).resolve().parents[1]

# setting -> (its highest value, a value just past it, a value below its lowest)
RANGES = {
    "recovery_window": ("365 days", "366 days", "0"),
    "drift_window": ("365 days", "366 days", "-1 second"),
    "sweep_batch": (100_000, 100_001, 0),
    "reporting_days": (35, 36, 0),
    "health_max_age": ("30 days", "31 days", "0"),
    "notice_claim_timeout": ("1 day", "1 day 1 second", "0"),
    "notice_backoff_base": ("1 hour", "61 minutes", "0"),
    "notice_backoff_max": ("30 days", "31 days", "0"),
    "org_lock_timeout": ("1 hour", "61 minutes", "0"),
    "org_time_budget": ("1 day", "25 hours", "0"),
    "pass_lease": ("1 day", "25 hours", "0"),
    "budget_retention": ("100 years", "100 years 1 day", "0"),
    # a text: three capitals (ISO 4217); one too many, and lower case
    "currency": ("EUR", "EURO", "usd"),
}


def test_the_ranges_cover_every_column_and_each_is_one_named_constraint(llm_conn):
    """One constraint settings_<setting>_range per column of
    llm.settings (but the singleton key), and no other CHECK on those columns."""
    columns = {
        r[0]
        for r in llm_conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'llm.settings'::regclass"
            " AND attnum > 0 AND NOT attisdropped AND attname <> 'singleton'"
        )
    }
    assert columns == set(RANGES)
    checks = {
        r[0]
        for r in llm_conn.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = 'llm.settings'::regclass"
            " AND contype = 'c' AND conname <> 'settings_singleton_check'"
        )
    }
    assert checks == {f"settings_{c}_range" for c in RANGES}


@pytest.mark.parametrize("setting", sorted(RANGES))
def test_a_setting_out_of_range_is_refused_naming_it(llm_conn, setting):
    """A value past the setting's highest and one below its lowest are
    refused with 23514 by the constraint named after it, and nothing changes; its highest
    value is accepted."""
    highest, too_high, too_low = RANGES[setting]
    update = f"UPDATE llm.settings SET {setting} = %s"
    for value in (too_high, too_low):
        error = assert_sqlstate(llm_conn, "23514", update, [value])
        assert error.diag.constraint_name == f"settings_{setting}_range"
        assert error.diag.table_name == "settings"
    llm_conn.execute(update, [highest])


def test_a_recovery_window_of_100000_years_is_refused_and_the_sweeps_go_on(llm_conn):
    """recovery_window = '100000 years' made every organization's sweep
    fail with 22008; it is refused (23514, naming the setting), so the sweep still runs."""
    error = assert_sqlstate(
        llm_conn, "23514", "UPDATE llm.settings SET recovery_window = '100000 years'"
    )
    assert error.diag.constraint_name == "settings_recovery_window_range"
    org = new_org(llm_conn)
    assert reconcile(llm_conn, org, now=T0)["recovered_requests"] == 0


# ---------------------------------------------------------------- migration 0010


@pytest.fixture
def database_at_0009(llm_server, llm_owner, tmp_path):
    """A fresh database at 0009, release 0.2.0 (its migrations and function files, kept in
    tests/upgrade/, as tests/test_upgrade_live.py installs it); dropped afterwards."""
    with tarfile.open(ROOT / "tests" / "upgrade" / "llm-db-0.2.0-e283082.tar.gz") as archive:
        archive.extractall(tmp_path, filter="data")
    assert max(p.name for p in (tmp_path / "migrations").glob("*.sql")) < "0010"
    name = f"s_{uuid.uuid4().hex}"
    dsn = llm_server.create_database(name, owner=llm_owner)
    migrate(dsn, migrations_dir=tmp_path / "migrations", sql_dir=tmp_path / "sql")
    try:
        yield dsn
    finally:
        llm_server.drop_database(name)


def applied(conn: psycopg.Connection) -> list[str]:
    return [
        r[0] for r in conn.execute("SELECT migration_id FROM public._yoyo_migration ORDER BY 1")
    ]


def test_migration_0010_stops_naming_a_stored_setting_out_of_range(database_at_0009):
    """A database holding recovery_window = '100000 years' (allowed
    before 0010) does not migrate: 0010 stops with 23514 naming the setting, its value and
    its range, and changes nothing. Once the value is set in range, it migrates."""
    with psycopg.connect(database_at_0009, autocommit=True) as conn:
        conn.execute("UPDATE llm.settings SET recovery_window = '100000 years', sweep_batch = 7")
        before = applied(conn)
        assert before[-1] == "0009_periods_view_for_citus"

    with pytest.raises(MigrationError) as caught:
        migrate(database_at_0009)
    message = str(caught.value)
    assert "23514" in message and "recovery_window" in message and "100000 years" in message
    assert "365 days" in message  # its range
    cause = caught.value.__cause__
    assert (
        isinstance(cause, psycopg.Error)
        and cause.diag.constraint_name == "settings_recovery_window_range"
    )

    with psycopg.connect(database_at_0009, autocommit=True) as conn:
        assert applied(conn) == before
        assert scalar(conn, "SELECT recovery_window::text FROM llm.settings") == "100000 years"
        assert (
            scalar(
                conn, "SELECT count(*) FROM pg_constraint WHERE conname LIKE 'settings\\_%\\_range'"
            )
            == 0
        )
        conn.execute("UPDATE llm.settings SET recovery_window = '2 days'")

    assert migrate(database_at_0009).applied_migrations[0] == "0010_settings_ranges"
    with psycopg.connect(database_at_0009, autocommit=True) as conn:
        assert scalar(conn, "SELECT sweep_batch FROM llm.settings") == 7  # kept
        assert scalar(conn, "SELECT count(*) FROM pg_constraint WHERE conname LIKE 'settings\\_%\\_range'"
                            " AND convalidated") == len(RANGES)  # fmt: skip
