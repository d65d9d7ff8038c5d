"""Shared test setup. The fixtures (llm_server, llm_template, llm_dsn, llm_conn,
llm_connect, llm_role_conn, llm_cron_dsn) come from the llm_db.testing plugin, which
no entry point registers: ``pytest_plugins`` below opts in, as a consumer's conftest
does. ``cron_conn`` and ``wheel`` are here."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.helpers import CRON_JOB

pytest_plugins = ["llm_db.testing"]

if os.environ.get("LLM_DB_CITUS"):  # the same tests on a 3-node Citus cluster (opt-in)
    from tests.citus_cluster import llm_citus_cluster, llm_dsn, llm_server  # noqa: F401


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from this checkout, offline (hatchling is in the test extra)."""
    out = tmp_path_factory.mktemp("wheel")
    root = Path(__file__).resolve().parents[1]
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-q", "-w", str(out), str(root)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    (built,) = out.glob("llm_db-*.whl")
    return built


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
