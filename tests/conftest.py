"""Shared test setup. The fixtures (llm_server, llm_template, llm_dsn, llm_conn,
llm_connect, llm_role_conn, llm_cron_dsn) come from the llm_db.testing plugin; cron_conn
is here.

The plugin is also registered by the package's pytest11 entry point under the
same name, so pytest loads it once either way (and this line still loads it
when plugin autoloading is disabled)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.helpers import CRON_JOB

pytest_plugins = ["llm_db.testing"]

# Tests that fail only because the schema owner is no superuser, for a product bug
# another branch of issue 21 fixes. Strict: each entry fails the run once the fix
# is merged, so it is removed then, not forgotten.
AWAITING_FIX = {
    # issue 21 F2 (i21-cron): _require_cron reads cron.database_name with
    # current_setting, which 42501s for a non-superuser owner instead of LL010.
    "tests/test_bad_input.py::test_bad_input_is_rejected_with_its_sqlstate_and_writes_nothing"
    "[schedule_reconciliation-pg_cron_not_installed_here]": "issue 21 F2",
    "tests/test_bad_input.py::test_bad_input_is_rejected_with_its_sqlstate_and_writes_nothing"
    "[unschedule_reconciliation-pg_cron_not_installed_here]": "issue 21 F2",
    "tests/test_cli.py::test_schedule_without_pg_cron_is_ll010_with_the_hint_exit_3": "issue 21 F2",
    "tests/test_cron.py::test_schedule_without_pg_cron_raises_ll010_with_schedule_in_database_hint"
    "[schedule]": "issue 21 F2",
    "tests/test_cron.py::test_schedule_without_pg_cron_raises_ll010_with_schedule_in_database_hint"
    "[unschedule]": "issue 21 F2",
    "tests/test_driver.py::test_LL010_schedule_without_pg_cron_maps_to_CronNotInstalled": "issue 21 F2",
    "tests/test_driver.py::test_async_client_maps_errors_and_returns_the_same_types": "issue 21 F2",
    # the upgrade itself passes as the owner; its last check calls schedule without pg_cron
    "tests/test_upgrade.py::test_upgrading_a_populated_0_1_0_database_loses_nothing": "issue 21 F2",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        reason = AWAITING_FIX.get(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(strict=True, reason=f"{reason}, fixed elsewhere"))


@pytest.fixture
def cron_conn(llm_cron_dsn: str) -> Iterator[psycopg.Connection]:
    """Autocommit connection to the pg_cron database; the llm-reconciliation job is removed
    before and after."""
    unschedule = "SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname = %s"
    with psycopg.connect(llm_cron_dsn, autocommit=True) as conn:
        conn.execute(unschedule, [CRON_JOB])
        try:
            yield conn
        finally:
            conn.execute(unschedule, [CRON_JOB])
