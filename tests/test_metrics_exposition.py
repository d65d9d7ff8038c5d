"""The Prometheus exposition (``llm_db.service.metrics``, ``llm-db metrics``) is what Prometheus'
own tools accept: ``promtool check metrics`` (Debian's prometheus package, which
scripts/bootstrap.sh installs) passes on it before any pass, after a pass and when the
database is down; the text parses with prometheus_client's parser; before the first pass
the run series are present with their documented values.

Skipped only when promtool is missing outside CI; under ``LLM_DB_REQUIRE_TOOLS=1`` (.ci/run)
or ``CI`` a missing promtool fails, so the check cannot go quiet there (tests/tools.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

from prometheus_client.parser import text_string_to_metric_families

from llm_db.service.metrics import BUDGET_SCOPES, RUN_FIGURES, RUN_STATUSES
from tests.helpers import T0, admit, call_pass, invariants, new_org, set_budget, settle
from tests.tools import require_tool

DOWN_DSN = "host=127.0.0.1 port=1 dbname=nowhere connect_timeout=3"


def promtool() -> str:
    return require_tool("promtool", "prometheus")


def metrics(*args: str) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return subprocess.run([sys.executable, "-m", "llm_db.cli", "metrics", *args],
                          capture_output=True, env=env, timeout=60)  # fmt: skip


def check(exposition: bytes) -> None:
    proc = subprocess.run([promtool(), "check", "metrics"], input=exposition,
                          capture_output=True, timeout=30)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()


def test_promtool_accepts_the_exposition_before_a_pass_after_one_and_with_the_database_down(
    llm_dsn, llm_conn
):
    before = metrics("--dsn", llm_dsn, "--now", T0.isoformat())
    assert before.returncode == 0, before.stderr
    check(before.stdout)
    call_pass(llm_conn, T0)
    after = metrics("--dsn", llm_dsn, "--now", (T0 + timedelta(minutes=5)).isoformat())
    assert after.returncode == 0, after.stderr
    check(after.stdout)
    down = metrics("--dsn", DOWN_DSN)
    assert down.returncode == 4
    check(down.stdout)


def test_before_the_first_pass_every_run_series_is_present_at_its_documented_value(llm_dsn):
    """Issue #13: no pass yet is not an absent series: timestamps, age, duration and every
    figure are 0, and the status series are all 0 (llm_db.service.metrics, docs/monitoring.md)."""
    proc = metrics("--dsn", llm_dsn, "--now", T0.isoformat())
    assert proc.returncode == 0, proc.stderr
    families = {f.name: f for f in text_string_to_metric_families(proc.stdout.decode())}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families.values() for s in f.samples}  # fmt: skip
    zero = ["llm_reconciliation_last_success_timestamp_seconds",
            "llm_reconciliation_last_run_timestamp_seconds",
            "llm_reconciliation_last_run_age_seconds",
            "llm_reconciliation_last_run_duration_seconds",
            "llm_reconciliation_last_run_errors",
            *(f"llm_reconciliation_last_run_{c}" for c in RUN_FIGURES)]  # fmt: skip
    assert {name: samples[(name, ())] for name in zero} == dict.fromkeys(zero, 0)
    assert [samples[("llm_reconciliation_last_run_status", (("status", s),))]
            for s in RUN_STATUSES] == [0] * len(RUN_STATUSES)  # fmt: skip
    assert samples[("llm_reconciliation_health", (("status", "never"),))] == 1
    assert samples[("llm_up", ())] == 1
    # every family a gauge, but the sweeps' own totals, which are counters (0 before any pass)
    counters = {"llm_recovered_requests", "llm_recovered_uncharged_requests", "llm_past_window_alerts"}
    assert {name for name, f in families.items() if f.type != "gauge"} == counters | {"llm_admission_refusals"}
    assert all(samples[(f"{name}_total", ())] == 0 for name in counters)
    # the limit windows that refused, by scope and window: every pair present, 0
    refusals = {labels: v for (name, labels), v in samples.items() if name == "llm_admission_refusals_total"}
    assert len(refusals) == 12 and set(refusals.values()) == {0}


def test_budgets_near_limit_counts_current_windows_at_their_first_threshold_by_scope(
    llm_dsn, llm_conn
):
    """The metrics: llm_budgets_near_limit{scope} counts the budget counters of the
    windows containing the scrape's clock whose used + held stand at or above the first
    threshold of the budget that applies (own, else '*'): yesterday's full day does not
    count, nor a counter under its threshold; every scope is present; promtool accepts it."""
    org = new_org(llm_conn, 100_000)
    set_budget(llm_conn, org, "organization", None, "week", 100, thresholds=[50])
    set_budget(llm_conn, org, "end_user", "*", "day", 10)  # 80, 100
    set_budget(llm_conn, org, "project", "p", "month", 50)
    set_budget(llm_conn, org, "api_key", "k", "day", 1000)
    yesterday = admit(llm_conn, org, 10, end_user="u0", now=T0 - timedelta(days=1))["id"]
    settle(llm_conn, org, yesterday, 10, 0, now=T0 - timedelta(days=1))  # a full day, ended
    for user, estimate in (("u1", 8), ("u2", 9), ("u3", 5)):  # 80 %, 90 %: near; 50 %: not
        admit(llm_conn, org, estimate, end_user=user)
    admit(llm_conn, org, 40, project="p", api_key="k")  # project 80 %: near; key 4 %: not
    # the organization's week: 10 + 8 + 9 + 5 + 40 = 72 of 100, past its 50 %: near

    # An allowance at 99 % counts under organization/month (it stayed 0)
    near_org = new_org(llm_conn, 1000)
    admit(llm_conn, near_org, 990)

    proc = metrics("--dsn", llm_dsn, "--now", (T0 + timedelta(hours=1)).isoformat())
    assert proc.returncode == 0, proc.stderr
    check(proc.stdout)
    families = list(text_string_to_metric_families(proc.stdout.decode()))
    near = {(s.labels["scope"], s.labels["window"]): s.value for f in families
            if f.name == "llm_budgets_near_limit" for s in f.samples}  # fmt: skip
    expected = {(scope, window): 0 for scope in BUDGET_SCOPES for window in ("day", "week", "month")}
    expected |= {("organization", "week"): 1, ("organization", "month"): 1, ("project", "month"): 1,
                 ("end_user", "day"): 2}  # fmt: skip
    assert near == expected
    ratios = {s.labels["organization_id"]: s.value for f in families
              if f.name == "llm_allowance_used_ratio" for s in f.samples}  # fmt: skip
    assert ratios == {str(near_org): 0.99}  # the other's 72 of 100,000 is not near
    assert invariants(llm_conn) == []
