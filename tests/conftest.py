"""Shared test setup. The fixtures (llm_server, llm_template, llm_dsn, llm_conn,
llm_connect, llm_role_conn, llm_cron_dsn) come from the llm_db.testing plugin; cron_conn
is here.

The plugin is also registered by the package's pytest11 entry point under the
same name, so pytest loads it once either way (and this line still loads it
when plugin autoloading is disabled)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import psycopg
import pytest

from tests.helpers import CRON_JOB

pytest_plugins = ["llm_db.testing"]

if os.environ.get("LLM_DB_CITUS"):  # the same tests on a 3-node Citus cluster (opt-in)
    from tests.citus_cluster import llm_citus_cluster, llm_dsn, llm_server  # noqa: F401


@pytest.fixture
def cron_conn(llm_cron_dsn: str) -> Iterator[psycopg.Connection]:
    """Autocommit connection to the pg_cron database; the llm-reconciliation jobs (also
    llm-reconciliation:<database>, scheduled with --cron-dsn) are removed before and after."""
    unschedule = "SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname = %s OR jobname LIKE %s"
    jobs = [CRON_JOB, f"{CRON_JOB}:%"]
    with psycopg.connect(llm_cron_dsn, autocommit=True) as conn:
        conn.execute(unschedule, jobs)
        try:
            yield conn
        finally:
            conn.execute(unschedule, jobs)
