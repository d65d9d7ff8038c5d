"""The operator's reads keep their output (issue 24 item 2): ``llm-db report`` (text,
JSON, ``--by``, ``--org``) and the ``llm-db metrics`` exposition of one known set of books,
built with a fixed clock, equal the golden files in tests/golden/, captured from 0.2.0
before the reads moved into SQL (sql/81_reads.sql). A change of a read's SQL that
changes what an operator sees fails here.

To see a diff: ``LLM_DB_GOLDEN_DIFF=1`` prints the new output under the assertion.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from llm_db.metrics import exposition
from llm_db.report import build_report, render_report, report_json
from tests.helpers import (
    T0,
    admit,
    call,
    call_pass,
    close_task,
    fail,
    invariants,
    new_org,
    open_task,
    set_budget,
    settle,
)

GOLDEN = Path(__file__).parent / "golden"
DAY = timedelta(days=1)
HOUR = timedelta(hours=1)
ORG_A = uuid.UUID("00000000-0000-4000-8000-00000000000a")
ORG_B = uuid.UUID("00000000-0000-4000-8000-00000000000b")
ORG_C = uuid.UUID("00000000-0000-4000-8000-00000000000c")

# Figures of the exposition that follow the wall clock (how long the pass and the
# scrape took, and so the pass's finish and age): their value is masked.
WALL_CLOCK = re.compile(
    r"^(llm_scrape_duration_seconds|llm_reconciliation_last_run_duration_seconds"
    r"|llm_reconciliation_last_run_age_seconds|llm_reconciliation_last_run_timestamp_seconds"
    r"|llm_reconciliation_last_success_timestamp_seconds) \S+$",
    re.MULTILINE,
)


def spend(
    conn: psycopg.Connection,
    org: uuid.UUID,
    credits: int,
    at,
    model: str = "model-a",
    **scopes: str,
) -> None:
    inv = admit(conn, org, credits, model, now=at - HOUR, **scopes)["id"]
    assert settle(conn, org, inv, credits, credits // 10, input_tokens=credits,
                  output_tokens=credits // 2, now=at) == "settled"  # fmt: skip


@pytest.fixture
def books(llm_conn: psycopg.Connection) -> psycopg.Connection:
    """Three organizations over four days: settled, failed and open requests (one left
    past the recovery window by a suspended organization), a pass that recovered one,
    tasks running and done, an owed notice, a budget near its limit, daily usage rebuilt."""
    new_org(llm_conn, 10_000, org_id=ORG_A, name="A org", now=T0 - 5 * DAY)
    new_org(llm_conn, None, org_id=ORG_B, name="B org", now=T0 - 5 * DAY)
    new_org(llm_conn, 500, org_id=ORG_C, name="C org", now=T0 - 5 * DAY)
    set_budget(llm_conn, ORG_A, "end_user", "*", "day", 100, thresholds=[50, 100], now=T0 - 5 * DAY)

    admit(llm_conn, ORG_A, 40, now=T0 - 4 * DAY)  # the pass recovers it
    admit(llm_conn, ORG_C, 70, "model-b", now=T0 - 4 * DAY)  # no pass visits C: stale
    new_org(llm_conn, 500, org_id=ORG_C, name="C org", status="suspended", now=T0 - 4 * DAY)
    spend(llm_conn, ORG_A, 8_000, T0 - 2 * DAY)  # 80 %: a notice owed
    spend(llm_conn, ORG_B, 120, T0 - 2 * DAY, "model-b", project="p1")
    done = open_task(llm_conn, ORG_A, now=T0 - 2 * DAY)
    close_task(llm_conn, ORG_A, done, now=T0 - 2 * DAY + HOUR)
    call_pass(llm_conn, T0 - DAY)

    spend(llm_conn, ORG_A, 30, T0 - DAY, end_user="u1")
    spend(llm_conn, ORG_A, 45, T0, end_user="u1")  # 45 of 100: under the 50 % alone
    admit(llm_conn, ORG_A, 25, now=T0, end_user="u1")  # held: 70 %, past it
    spend(llm_conn, ORG_A, 10, T0, "model-b", end_user="u2", project="p1")
    spend(llm_conn, ORG_B, 7, T0, project="p2")
    inv = admit(llm_conn, ORG_B, 9, now=T0 - HOUR)["id"]
    assert fail(llm_conn, ORG_B, inv, "timeout", now=T0) == "failed"
    open_task(llm_conn, ORG_B, now=T0 - HOUR)
    call(llm_conn, "rebuild_daily_usage", (T0 - 5 * DAY).date(), T0.date())
    assert invariants(llm_conn) == []
    return llm_conn


def outputs(conn: psycopg.Connection) -> dict[str, str]:
    """Every read's output, by the name of its golden file."""
    at = T0 + HOUR

    def as_json(report) -> str:  # as ``llm-db report --json`` prints it
        return json.dumps(report_json(report), sort_keys=True, indent=1) + "\n"

    metrics = exposition(conn, now=at + HOUR).decode()
    return {
        "report.txt": render_report(build_report(conn, days=3, now=at)) + "\n",
        "report.json": as_json(build_report(conn, days=3, now=at)),
        "report_org_a_31.json": as_json(build_report(conn, days=31, organization_id=ORG_A, now=at)),
        "report_by_end_user.txt": render_report(build_report(conn, days=2, now=at, by="end_user"))
        + "\n",
        "report_by_project.json": as_json(build_report(conn, days=5, now=at, by="project")),
        "metrics.prom": WALL_CLOCK.sub(r"\1 <wall clock>", metrics),
    }


def test_report_and_metrics_outputs_are_the_golden_ones(books, llm_role_conn):
    """issue 24 item 2: read as llm_reader (who runs ``llm-db report`` and ``metrics``), the
    report in every form and the exposition are unchanged, byte for byte but the figures that
    follow the wall clock."""
    found = outputs(llm_role_conn("llm_reader"))
    for name, text in found.items():
        expected = (GOLDEN / name).read_text()
        assert text == expected, name + (f"\n{text}" if _show_diff() else "")


def _show_diff() -> bool:
    import os

    return os.environ.get("LLM_DB_GOLDEN_DIFF") == "1"
