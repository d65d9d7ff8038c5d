"""The operator files in deploy/ are checked by the tools that will read
them: the Prometheus rules by ``promtool check rules`` and, with input series for
every alert, ``promtool test rules``; the worker's systemd unit by ``systemd-analyze
verify``. docs/monitoring.md points to these files instead of repeating them.

promtool comes with Debian's prometheus package, which scripts/bootstrap.sh installs: a
missing one skips, or fails under ``LLM_DB_REQUIRE_TOOLS=1`` (tests/tools.py).
systemd-analyze is not something bootstrap installs (a container has no systemd), so
without it the unit's test simply skips.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools import require_tool

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "llm-db.rules.yml"
RULES_TEST = RULES.with_name("llm-db.rules.test.yml")
UNIT = ROOT / "deploy" / "systemd" / "llm-db-worker.service"
MONITORING = ROOT / "docs" / "monitoring.md"

# the operator's docs' third suggested alert in 0.2.0: `and` matches on every
# label, organization_status is on its left side only, so it matched nothing.
OLD_STALE_EXPR = (
    'llm_stale_open_requests{organization_status="operational"} > 0'
    " and llm_reconciliation_last_run_age_seconds < 600"
)


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_tool("promtool", "prometheus"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def alerts(path: Path) -> list[str]:
    return re.findall(r"^\s*- alert: (\w+)$", path.read_text(), re.MULTILINE)


def test_promtool_checks_the_rules_file():
    """The rules file loads in Prometheus (syntax, PromQL, templates)."""
    proc = promtool("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alerts(RULES))} rules found" in proc.stdout


def test_promtool_unit_tests_fire_every_alert_on_its_input_series():
    """Each alert fires on the series that mean trouble and stays quiet
    on the others (deploy/prometheus/llm-db.rules.test.yml); no alert goes untested."""
    proc = promtool("test", "rules", str(RULES_TEST))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tested = set(re.findall(r"alertname: (\w+)", RULES_TEST.read_text()))
    assert alerts(RULES) and set(alerts(RULES)) == tested


def test_the_old_stale_requests_alert_never_fires(tmp_path):
    """The docs' third alert, `... > 0 and llm_reconciliation_last_run_age_seconds < 600`,
    fails the stale-requests unit test (it matched no labels, so it could never fire); the
    rules file's expression passes."""
    rules = RULES.read_text()
    fixed = re.search(r"expr: >-\n\s+(llm_stale_open_requests.*\n\s+and .*)\n", rules)
    assert fixed is not None and "ignoring(organization_status)" in fixed.group(1)
    (tmp_path / RULES.name).write_text(rules.replace(fixed.group(1), OLD_STALE_EXPR))
    shutil.copy(RULES_TEST, tmp_path / RULES_TEST.name)
    proc = promtool("test", "rules", RULES_TEST.name, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed = re.findall(r"alertname: (\w+), time: (\w+)", proc.stdout + proc.stderr)
    assert failed == [("LlmStaleRequestsAfterPass", "3m")], proc.stdout + proc.stderr


def test_the_monitoring_page_points_to_the_files_instead_of_repeating_them():
    """One copy of each, the tested one."""
    text = MONITORING.read_text()
    assert "deploy/prometheus/llm-db.rules.yml" in text
    assert "deploy/systemd/llm-db-worker.service" in text
    assert not re.findall(r"^llm_\w+.* (?:==|>) ", text, re.MULTILINE)  # no alert list of its own
    assert "[Service]" not in text  # no unit of its own


def test_systemd_analyze_verifies_the_worker_unit(tmp_path):
    """`systemd-analyze verify` accepts the unit with no warning (it exits
    0 on an unknown key, so its output must be empty too). verify requires ExecStart's
    program to exist, so the copy checked here runs this environment's llm-db instead of
    /opt/llm-db/bin/llm-db; every other line is the file's own."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (package systemd; not a bootstrap tool)")
    installed = Path(sys.executable).with_name("llm-db")
    assert installed.exists(), installed
    unit = UNIT.read_text()
    assert unit.count("ExecStart=/opt/llm-db/bin/llm-db worker ") == 1
    copy = tmp_path / UNIT.name
    copy.write_text(unit.replace("ExecStart=/opt/llm-db/bin/llm-db", f"ExecStart={installed}"))

    def verify() -> str:
        proc = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        return f"exit {proc.returncode}: {proc.stdout}{proc.stderr}"

    assert verify() == "exit 0: "
    # the empty output is the check: a misspelled key is only a warning
    copy.write_text(copy.read_text().replace("RestartSec=5", "RestartSec=5\nRestartSecs=5"))
    assert "Unknown key 'RestartSecs'" in verify()


def test_the_units_command_line_is_one_llm_db_worker_accepts():
    """The options ExecStart passes exist (a renamed option would restart-loop the unit),
    and RestartPreventExitStatus is the worker's configuration-error code."""
    from llm_db.cli import EXIT_USAGE

    unit = UNIT.read_text()
    command = re.search(r"^ExecStart=\S+ worker (.*?)(?<!\\)$", unit, re.MULTILINE | re.DOTALL)
    assert command is not None
    options = re.findall(r"(--[a-z-]+)", command.group(1))
    help_text = subprocess.run([sys.executable, "-m", "llm_db.cli", "worker", "--help"],
                               capture_output=True, text=True, timeout=60).stdout  # fmt: skip
    assert options and all(option in help_text for option in options), options
    assert f"RestartPreventExitStatus={EXIT_USAGE}\n" in unit
