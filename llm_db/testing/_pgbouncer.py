"""A throw-away PgBouncer in front of an ephemeral PostgreSQL, for tests.

Debian's ``pgbouncer`` (1.18 on Debian 12), started on a free loopback port
with a generated configuration: every database of the server is reachable
through it (``* = host=… port=…``), trust authentication for the superuser,
and a small pool (2 server connections per database and user by default), so
tests see what a real deployment sees: consecutive transactions of one client
land on different server connections, and one server connection serves many
clients.

PgBouncer refuses to run as root; as root the process drops to the Debian
``postgres`` user, like the server (``llm_db.testing._server``)::

    with EphemeralServer() as server, PgBouncer(server, pool_mode="transaction") as bouncer:
        conn = psycopg.connect(bouncer.dsn("mydb"))
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from llm_db.testing._server import (
    LOGINS,
    OS_USER_WHEN_ROOT,
    OWNER,
    SUPERUSER,
    EphemeralServer,
    ServerSetupError,
    free_port,
    run_as_kwargs,
)

__all__ = ["PGBOUNCER_BIN", "PgBouncer"]

PGBOUNCER_BIN = Path(
    os.environ.get("LLM_DB_PGBOUNCER", shutil.which("pgbouncer") or "/usr/sbin/pgbouncer")
)
POOL_MODES = ("session", "transaction", "statement")


class PgBouncer:
    """A PgBouncer process in front of ``server``; ``start()``/``stop()`` or a context manager.

    ``pool_mode``: ``transaction`` (the mode that breaks session state: prepared
    statements, session advisory locks, SET, LISTEN) or ``session``.
    ``pool_size``: server connections per (database, user).
    """

    def __init__(
        self,
        server: EphemeralServer,
        *,
        pool_mode: str = "transaction",
        pool_size: int = 2,
        max_client_conn: int = 400,
        boot_timeout: float = 20.0,
    ) -> None:
        if pool_mode not in POOL_MODES:
            raise ValueError(f"pool_mode must be one of {POOL_MODES}, not {pool_mode!r}")
        self.server = server
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.max_client_conn = max_client_conn
        self.boot_timeout = boot_timeout
        self.host = "127.0.0.1"
        self.port: int | None = None
        self.base_dir: str | None = None
        self._process: subprocess.Popen[bytes] | None = None

    # --- lifecycle -------------------------------------------------------------

    def start(self) -> PgBouncer:
        if self._process is not None:
            return self
        if not PGBOUNCER_BIN.exists():
            raise ServerSetupError(
                f"pgbouncer not found ({PGBOUNCER_BIN}). Run `bash scripts/bootstrap.sh` "
                "(as root) to install the Debian package pgbouncer."
            )
        run_as = pwd.getpwnam(OS_USER_WHEN_ROOT) if os.geteuid() == 0 else None
        self.base_dir = tempfile.mkdtemp(prefix="llm-db-pgbouncer-", dir="/tmp")
        if run_as is not None:
            os.chown(self.base_dir, run_as.pw_uid, run_as.pw_gid)
        self.port = free_port()
        config = Path(self.base_dir, "pgbouncer.ini")
        config.write_text(self._config())
        users = (SUPERUSER, OWNER, *LOGINS.values())  # trust, but each user must be listed
        Path(self.base_dir, "userlist.txt").write_text("".join(f'"{u}" ""\n' for u in users))
        self._process = subprocess.Popen(
            [str(PGBOUNCER_BIN), "-q", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **run_as_kwargs(run_as, self.base_dir),
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)  # PgBouncer: SIGINT is a safe shutdown
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        if self.base_dir is not None:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _config(self) -> str:
        assert self.base_dir is not None
        return "\n".join(
            [
                "[databases]",
                f"* = host={self.server.host} port={self.server.port}",
                "",
                "[pgbouncer]",
                f"listen_addr = {self.host}",
                f"listen_port = {self.port}",
                "unix_socket_dir =",
                "auth_type = trust",
                f"auth_file = {self.base_dir}/userlist.txt",
                f"admin_users = {SUPERUSER}",
                f"pool_mode = {self.pool_mode}",
                f"default_pool_size = {self.pool_size}",
                "min_pool_size = 0",
                "reserve_pool_size = 0",
                f"max_client_conn = {self.max_client_conn}",
                # a dropped test database: give its server connections up at once
                "server_login_retry = 1",
                "server_check_delay = 0",
                f"logfile = {self.base_dir}/pgbouncer.log",
                f"pidfile = {self.base_dir}/pgbouncer.pid",
                "",
            ]
        )

    def _wait_ready(self) -> None:
        assert self._process is not None and self.port is not None
        deadline = time.monotonic() + self.boot_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise ServerSetupError(
                    f"pgbouncer exited with {self._process.returncode}:\n{self.log_text()}"
                )
            try:
                with socket.create_connection((self.host, self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise ServerSetupError(f"pgbouncer did not listen within {self.boot_timeout} s")

    # --- addresses -------------------------------------------------------------

    @property
    def log_path(self) -> str | None:
        return None if self.base_dir is None else os.path.join(self.base_dir, "pgbouncer.log")

    def log_text(self) -> str:
        path = self.log_path
        try:
            return Path(path).read_text() if path else ""
        except OSError:
            return ""

    def dsn(self, dbname: str = "postgres", **extra: Any) -> str:
        """key=value conninfo of ``dbname`` through the pooler, for the superuser
        (or ``user=…``)."""
        if self.port is None:
            raise RuntimeError("PgBouncer is not running; call start() first")
        extra.setdefault("user", SUPERUSER)
        return psycopg.conninfo.make_conninfo(
            host=self.host, port=self.port, dbname=dbname, **extra
        )

    def admin(self, command: str) -> list[tuple[Any, ...]]:
        """Run a PgBouncer console command (``SHOW POOLS``, ``RECONNECT db``, …)."""
        with psycopg.connect(self.dsn("pgbouncer"), autocommit=True) as conn:
            # no parameters: psycopg sends the simple query protocol, all the console speaks
            cur = conn.execute(command)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []
