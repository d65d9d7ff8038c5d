"""The throw-away PostgreSQL of llm-db's tests, benchmarks and demo, and its pytest
plugin (the ``testing`` extra).

Plain functions and classes for code outside pytest (benchmarks, the demo):
``EphemeralServer`` (``llm_db.testing._server``), ``PgBouncer``
(``llm_db.testing._pgbouncer``), ``create_template``, ``create_logins``,
``clone_database``, ``create_cron_database``. Nothing here imports pytest.

The pytest plugin is opt-in (no entry point registers it, since 0.3.0): a project
names this package in a top-level ``conftest.py`` (``pytest_plugins =
["llm_db.testing"]``, as llm-db's own ``tests/conftest.py`` does) or runs ``pytest
-p llm_db.testing``; pytest then loads the fixtures of ``llm_db.testing.plugin``,
which this package's own ``pytest_plugins`` names.
"""

from __future__ import annotations

from llm_db.testing._databases import (
    DATABASE_SETTINGS,
    TEMPLATE_DATABASE,
    clone_database,
    create_cron_database,
    create_logins,
    create_template,
)
from llm_db.testing._pgbouncer import PgBouncer
from llm_db.testing._server import (
    LOGINS,
    OWNER,
    EphemeralServer,
    ServerSetupError,
    check_installation,
)

__all__ = [
    "DATABASE_SETTINGS",
    "LOGINS",
    "OWNER",
    "TEMPLATE_DATABASE",
    "EphemeralServer",
    "PgBouncer",
    "ServerSetupError",
    "check_installation",
    "clone_database",
    "create_cron_database",
    "create_logins",
    "create_template",
]

# pytest reads this of a plugin it registers: the fixtures, which need pytest, load
# only then, so the demo and the benchmarks import this package without pytest.
pytest_plugins = ["llm_db.testing.plugin"]

