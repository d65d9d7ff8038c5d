"""Run single-node suites on a 3-node Citus cluster (opt-in: ``LLM_DB_CITUS=1``).

Citus is not in the package registries, so CI never runs this; a maintainer who
built and installed Citus (docs/scaling.md "Tested on a real cluster") runs, e.g.::

    LLM_DB_CITUS=1 .venv/bin/pytest tests/test_recovery.py tests/test_pass.py

tests/conftest.py then takes ``llm_server`` and ``llm_dsn`` from here: the session
starts a coordinator and two workers (ephemeral servers with citus preloaded), and
every test gets a database of the same name on all three nodes, the citus
extension in each, the workers added, the schema migrated on the coordinator and
``llm.distribute()`` run by the schema owner (no superuser),
as a deployment does. Everything else (the owner, the logins, the timeouts) is the
single-node fixtures' own.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from llm_db.migrate import migrate
from llm_db.testing import _sql
from llm_db.testing._databases import DATABASE_SETTINGS
from llm_db.testing._server import LOGINS, OWNER, EphemeralServer

COORDINATOR_SETTINGS = {"shared_preload_libraries": "citus,pg_cron"}
WORKER_SETTINGS = {"shared_preload_libraries": "citus"}
WORKERS = 2
ROLES = ("llm_app", "llm_operator", "llm_reader")


class Cluster:
    """The coordinator (``llm_server`` to every fixture) and its workers."""

    def __init__(self) -> None:
        self.coordinator = EphemeralServer(settings=COORDINATOR_SETTINGS)
        self.workers = [EphemeralServer(settings=WORKER_SETTINGS) for _ in range(WORKERS)]

    def start(self) -> None:
        self.coordinator.start()
        for worker in self.workers:
            worker.start()
            worker.create_owner(OWNER)
            with worker.connect() as conn:  # the roles and logins a shard query runs as
                for role in ROLES:
                    if conn.execute(_sql.ROLE_EXISTS, {"name": role}).fetchone() is None:
                        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
                for role, login in LOGINS.items():
                    if conn.execute(_sql.ROLE_EXISTS, {"name": login}).fetchone() is None:
                        conn.execute(_sql.CREATE_LOGIN.format(
                            login=sql.Identifier(login), role=sql.Identifier(role)))  # fmt: skip

    def stop(self) -> None:
        for server in (*self.workers, self.coordinator):
            with contextlib.suppress(Exception):
                server.stop()

    def create(self, owner: str) -> tuple[str, str]:
        """A database on every node, llm distributed in it; returns (name, owner dsn)."""
        name = f"t_{uuid.uuid4().hex}"
        dsn = self.coordinator.create_database(name, settings=DATABASE_SETTINGS, owner=owner)
        for worker in self.workers:
            worker.create_database(name, settings=DATABASE_SETTINGS, owner=owner)
            with worker.connect(name) as conn:
                conn.execute("CREATE EXTENSION citus")
        with self.coordinator.connect(name) as conn:
            conn.execute("CREATE EXTENSION citus")
            conn.execute("SELECT citus_set_coordinator_host(%s, %s)",
                         [self.coordinator.host, self.coordinator.port])  # fmt: skip
            for worker in self.workers:
                conn.execute("SELECT citus_add_node(%s, %s)", [worker.host, worker.port])
        # After CREATE EXTENSION citus, so Citus sees every type and routine. A role that
        # an object depends on is sent to the workers as CREATE-or-ALTER ROLE with all its
        # attributes, and NOSUPERUSER needs a superuser: the owner, who is none, sends
        # the CREATE only (the roles exist on every worker).
        migrate(psycopg.conninfo.make_conninfo(
            dsn, options="-c citus.enable_alter_role_propagation=off"))  # fmt: skip
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT llm.distribute()")
        return name, dsn

    def drop(self, name: str) -> None:
        for server in (self.coordinator, *self.workers):
            server.drop_database(name)


@pytest.fixture(scope="session")
def llm_citus_cluster() -> Iterator[Cluster]:
    cluster = Cluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def llm_server(llm_citus_cluster: Cluster) -> EphemeralServer:
    """The coordinator: what every test and fixture connects to."""
    return llm_citus_cluster.coordinator


@pytest.fixture
def llm_dsn(llm_citus_cluster: Cluster, llm_template: str, llm_owner: str) -> Iterator[str]:
    """conninfo, for the owner, of this test's distributed database on the coordinator
    (the template is still built: it creates the logins the role fixtures use)."""
    name, dsn = llm_citus_cluster.create(llm_owner)
    try:
        yield dsn
    finally:
        llm_citus_cluster.drop(name)
