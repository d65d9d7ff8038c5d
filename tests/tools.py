"""The programs outside Python that some tests run, and the one rule for a missing one.

scripts/bootstrap.sh installs them from Debian packages: promtool (prometheus),
plpgsql_check (postgresql-15-plpgsql-check), pgbouncer (pgbouncer) and the isolation
tester (postgresql-client-15). A test that needs one and does not find it skips,
naming the package; under ``LLM_DB_REQUIRE_TOOLS=1`` (which ``.ci/run`` sets) or
``CI`` it fails instead, so a CI run cannot turn green by skipping what it was
meant to check. A program bootstrap does not install
(``systemd-analyze``) is not routed through here: it stays a plain skip.
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

REQUIRE_ENV = "LLM_DB_REQUIRE_TOOLS"


def tools_required() -> bool:
    """True where a missing tool must fail the run: ``.ci/run``, or any CI (``CI`` set)."""
    return os.environ.get(REQUIRE_ENV) == "1" or bool(os.environ.get("CI"))


def missing_tool(what: str, package: str) -> NoReturn:
    """Skip the test for the missing ``what`` naming its Debian ``package``, or fail it
    when tools are required."""
    reason = f"{what} is missing: apt-get install {package} (scripts/bootstrap.sh installs it)"
    if tools_required():
        pytest.fail(f"{reason}; {REQUIRE_ENV}=1 or CI requires it", pytrace=False)
    pytest.skip(reason)


def require_tool(name: str, package: str) -> str:
    """The path of the program ``name`` (looked up on PATH, or an absolute path that
    must be executable), or skip/fail as ``missing_tool`` says."""
    found = shutil.which(name)
    if found is None:
        missing_tool(name, package)
    return found
