"""Where the benchmark runs: its own ephemeral server, or a server given by ``--dsn``.

The ephemeral server is the project's ``EphemeralServer`` with durability as
PostgreSQL ships it (the test harness turns fsync off; a benchmark must not),
and room for the bulk loads: a larger ``shared_buffers`` and no checkpoint
forced by WAL volume in the middle of a measurement.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

# What the benchmark server changes from the harness defaults. fsync,
# synchronous_commit and full_page_writes are PostgreSQL's own defaults (on);
# the rest only sizes memory and WAL for the bulk loads.
DURABLE_SETTINGS: dict[str, str] = {
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "shared_buffers": "512MB",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "30min",
    "log_min_messages": "warning",
}

PROFILE_SETTINGS: dict[str, str] = {
    "shared_preload_libraries": "pg_cron,pg_stat_statements",
    "pg_stat_statements.track": "all",
    "track_functions": "all",
}

REPORTED_SETTINGS = (
    "server_version", "fsync", "synchronous_commit", "full_page_writes", "wal_sync_method",
    "shared_buffers", "max_wal_size", "max_connections",
)  # fmt: skip

PGBENCH_CANDIDATES = ("/usr/lib/postgresql/15/bin/pgbench", "/usr/bin/pgbench")


def find_pgbench() -> str:
    """The pgbench binary: PostgreSQL 15's, else the one on PATH."""
    for candidate in PGBENCH_CANDIDATES:
        if Path(candidate).exists():
            return candidate
    found = shutil.which("pgbench")
    if found is None:
        raise SystemExit("pgbench not found: install postgresql-client-15 (scripts/bootstrap.sh does).")
    return found


@dataclass
class Target:
    """A server the benchmark may create and drop its own databases on."""

    base_dsn: str
    prefix: str = "llmbench_"
    created: list[str] = field(default_factory=list)

    def dsn(self, name: str) -> str:
        """conninfo of database ``name`` (a short name; the prefix is added)."""
        return make_conninfo(self.base_dsn, dbname=self.prefix + name)

    def connect(self, name: str | None = None, **kwargs: Any) -> psycopg.Connection:
        kwargs.setdefault("autocommit", True)
        dsn = self.base_dsn if name is None else self.dsn(name)
        return psycopg.connect(dsn, **kwargs)

    def create_database(self, name: str, *, template: str | None = None) -> str:
        """(Re)create database ``name``, optionally as a file copy of ``template``."""
        full = self.prefix + name
        with self.connect() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(full)))
            query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(full))
            if template is not None:
                source = self.prefix + template
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s AND pid <> pg_backend_pid()",
                    [source],
                )
                query = sql.SQL("{} TEMPLATE {} STRATEGY FILE_COPY").format(query, sql.Identifier(source))
            conn.execute(query)
        if full not in self.created:
            self.created.append(full)
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        full = self.prefix + name
        with self.connect() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(full)))
        if full in self.created:
            self.created.remove(full)

    def drop_all(self) -> None:
        with self.connect() as conn:
            for full in reversed(self.created):
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(full)))
        self.created.clear()

    def settings(self) -> dict[str, str]:
        with self.connect() as conn:
            return {
                name: conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()[0]
                for name in REPORTED_SETTINGS
            }

    def is_superuser(self) -> bool:
        with self.connect() as conn:
            return conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]

    def pgbench_args(self, name: str) -> list[str]:
        """The connection as pgbench takes it: one conninfo string as its dbname argument."""
        params = conninfo_to_dict(self.dsn(name))
        return [make_conninfo(**params)]


@contextlib.contextmanager
def open_target(dsn: str | None, *, profile: bool = False) -> Iterator[Target]:
    """A Target on ``dsn``, or on an ephemeral server started (and stopped) here."""
    if dsn is not None:
        target = Target(dsn)
        try:
            yield target
        finally:
            target.drop_all()
        return

    from llm_db.testing._server import (
        EphemeralServer,  # the project's helper; root runs it as postgres
    )

    settings = dict(DURABLE_SETTINGS)
    if profile:
        settings.update(PROFILE_SETTINGS)
    with EphemeralServer(settings=settings) as server:
        yield Target(server.dsn("postgres"))
