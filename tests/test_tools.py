"""The rule for a missing tool (tests/tools.py): a test that needs a
tool scripts/bootstrap.sh installs skips naming its package, and fails instead under
``LLM_DB_REQUIRE_TOOLS=1``, which ``.ci/run`` sets; every such test goes through it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.tools import REQUIRE_ENV, require_tool

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
# a package named once in a module constant (tests/test_isolation.py)
# the packages of promtool, plpgsql_check, pgbouncer and the isolation tester
BOOTSTRAP_TOOLS = {"prometheus", "postgresql-15-plpgsql-check", "pgbouncer", "postgresql-client-15"}
CONSTANT = re.compile(r'^PACKAGE = "([\w.+-]+)"$', re.MULTILINE)


def bootstrap_packages() -> set[str]:
    found = re.search(r"^APT_PACKAGES=\((.*)\)$", (ROOT / "scripts" / "bootstrap.sh").read_text(),
                      re.MULTILINE)  # fmt: skip
    assert found is not None
    return set(found.group(1).split())


def test_ci_run_requires_the_bootstrap_tools():
    """CI (.ci/run) turns a skip for a missing bootstrap tool into a failure."""
    assert f"\nexport {REQUIRE_ENV}=1\n" in (ROOT / ".ci" / "run").read_text()


def test_a_missing_tool_skips_naming_its_package_or_fails_when_required(monkeypatch):
    """Skip outside CI, fail under LLM_DB_REQUIRE_TOOLS=1 or CI."""
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install prometheus"):
        require_tool("promtool", "prometheus")
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="apt-get install prometheus"):
        require_tool("promtool", "prometheus")
    monkeypatch.delenv(REQUIRE_ENV)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="apt-get install prometheus"):
        require_tool("promtool", "prometheus")


def test_every_test_needing_a_bootstrap_tool_goes_through_the_rule():
    """No test skips for promtool, plpgsql_check, pgbouncer or the
    isolation tester on its own, and each package the rule names is one bootstrap installs."""
    own_skip = re.compile(r"(?:pytest\.skip\(|skipif\()[^\n]*(?:promtool|plpgsql|pgbouncer|PGBOUNCER|isolation)",
                          re.IGNORECASE)  # fmt: skip
    named = re.compile(r"(?:require_tool|missing_tool)\([^()\n]*?,\s*\"([\w.+-]+)\"\)")
    offenders, packages = [], set()
    for path in sorted(TESTS.glob("*.py")):
        if path.name in ("tools.py", Path(__file__).name):
            continue
        text = path.read_text()
        offenders += [f"{path.name}: {m.group(0)}" for m in own_skip.finditer(text)]
        packages |= set(named.findall(text)) | set(CONSTANT.findall(text))
    assert offenders == []
    assert packages <= bootstrap_packages(), packages - bootstrap_packages()
    assert packages >= BOOTSTRAP_TOOLS
