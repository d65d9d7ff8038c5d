"""An ephemeral PostgreSQL 15 server for tests, benchmarks and the demo.

Built on ``testing.postgresql`` (the ``testing`` extra, imported by ``start()``
only: see ``llm_db.testing._postgresql``); llm-db adds what it needs on top:

* pg_cron preloaded (``cron.database_name = llm_cron``, background workers),
  settings for fast throw-away clusters (fsync off), 200 connections;
* running as root: PostgreSQL refuses to run as root, so when the caller is
  root only the server processes (initdb, postgres) drop to the Debian
  ``postgres`` user, in a base directory that user owns;
* the server runs in its own session, so a Ctrl-C reaches the caller (which
  shuts the server down cleanly) instead of killing the server mid-teardown.

Nothing here imports pytest: ``EphemeralServer`` is a plain context manager::

    with EphemeralServer() as server:
        server.create_database("demo")
        llm_db.migrate(server.dsn("demo"))
"""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import socket
import stat
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from llm_db.testing import _sql
from llm_db.testing._process import SUPERUSER, ServerSetupError, run_as_kwargs

if TYPE_CHECKING:
    from llm_db.testing._postgresql import ServerProcess

__all__ = [
    "CRON_DATABASE",
    "EphemeralServer",
    "LOGINS",
    "OWNER",
    "ServerSetupError",
    "SUPERUSER",
    "check_installation",
    "free_port",
    "run_as_kwargs",
]

PG_MAJOR = 15
BIN_DIR = Path(os.environ.get("LLM_DB_PG_BIN", f"/usr/lib/postgresql/{PG_MAJOR}/bin"))
SHARE_DIR = Path(os.environ.get("LLM_DB_PG_SHARE", f"/usr/share/postgresql/{PG_MAJOR}"))
# The deployment's shape (docs/contract.md "Roles and grants"): the schema owner is a
# LOGIN CREATEROLE role without superuser that owns the application's database, as
# on a managed service (RDS, Cloud SQL, ...), and each llm role is used through a
# login of its own that is a member of it.
OWNER = "llm_owner"
LOGINS = {
    "llm_app": "llm_app_login",
    "llm_operator": "llm_operator_login",
    "llm_reader": "llm_reader_login",
}
CRON_DATABASE = "llm_cron"
OS_USER_WHEN_ROOT = "postgres"

BOOTSTRAP_HINT = "Run `bash scripts/bootstrap.sh` (as root) to install PostgreSQL 15 with pg_cron."

# Server settings. Durability is traded for speed: a test cluster is thrown away.
SERVER_SETTINGS: dict[str, str] = {
    "shared_preload_libraries": "pg_cron",
    "cron.database_name": CRON_DATABASE,
    "cron.use_background_workers": "on",
    "max_worker_processes": "32",
    "max_connections": "200",
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "logging_collector": "off",
    "log_min_messages": "warning",
    "log_checkpoints": "off",
    "log_line_prefix": "%m [%p] %q%u@%d ",
    "timezone": "UTC",
}


def check_installation(bin_dir: Path = BIN_DIR, share_dir: Path = SHARE_DIR) -> None:
    """Raise ServerSetupError naming what is missing and how to install it."""
    missing = [str(p) for p in (bin_dir / "initdb", bin_dir / "postgres") if not p.exists()]
    if missing:
        raise ServerSetupError(
            f"PostgreSQL {PG_MAJOR} not found ({', '.join(missing)}). {BOOTSTRAP_HINT}"
        )
    control = share_dir / "extension" / "pg_cron.control"
    if not control.exists():
        raise ServerSetupError(f"pg_cron is not installed (no {control}). {BOOTSTRAP_HINT}")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(OS_USER_WHEN_ROOT)
        except KeyError:
            raise ServerSetupError(
                f"running as root needs the OS user {OS_USER_WHEN_ROOT!r} to own the server. "
                f"{BOOTSTRAP_HINT}"
            ) from None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _traversable_by_others(path: Path) -> bool:
    """True when every directory from / down to path can be entered by another user."""
    path = path.resolve()
    for p in (path, *path.parents):
        try:
            if not p.stat().st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


def _server_process() -> type[ServerProcess]:
    """The class running the server: testing.postgresql underneath, imported here so
    that this module loads without the ``testing`` extra (``MissingExtra`` without it)."""
    from llm_db._extras import require

    require("testing.postgresql")
    from llm_db.testing._postgresql import ServerProcess

    return ServerProcess


class EphemeralServer:
    """A throw-away PostgreSQL 15 cluster with pg_cron, on 127.0.0.1 and a unix socket.

    ``start()``/``stop()`` or use as a context manager. ``dsn(dbname)`` gives a
    key=value conninfo for the superuser, ``url(dbname)`` the same as a URL.
    Works as root (server processes run as ``postgres``) and as a normal user.
    """

    def __init__(
        self,
        *,
        bin_dir: str | Path = BIN_DIR,
        share_dir: str | Path = SHARE_DIR,
        settings: dict[str, str] | None = None,
        boot_timeout: float = 60.0,
    ) -> None:
        self.bin_dir = Path(bin_dir)
        self.share_dir = Path(share_dir)
        self.settings = dict(SERVER_SETTINGS)
        self.settings.update(settings or {})
        self.boot_timeout = boot_timeout
        self.superuser = SUPERUSER
        self.host = "127.0.0.1"
        self._pg: ServerProcess | None = None
        self._admin_conn: psycopg.Connection | None = None
        self._admin_lock = threading.Lock()

    # --- lifecycle -------------------------------------------------------------

    def start(self) -> EphemeralServer:
        if self._pg is not None:
            return self
        process = _server_process()
        check_installation(self.bin_dir, self.share_dir)
        run_as = pwd.getpwnam(OS_USER_WHEN_ROOT) if os.geteuid() == 0 else None
        last_error: Exception | None = None
        for _attempt in range(3):  # a free port can be taken between probe and bind
            base_dir = self._make_base_dir(run_as)
            try:
                self._pg = process(
                    base_dir=base_dir,
                    port=free_port(),
                    bin_dir=self.bin_dir,
                    run_as=run_as,
                    server_settings=self.settings,
                    boot_timeout=self.boot_timeout,
                )
                break
            except ServerSetupError:
                shutil.rmtree(base_dir, ignore_errors=True)
                raise
            except RuntimeError as exc:  # testing.common: failed to launch / boot
                shutil.rmtree(base_dir, ignore_errors=True)
                last_error = exc
        else:
            raise ServerSetupError(f"PostgreSQL did not start: {last_error}")
        atexit.register(self.stop)
        return self

    def stop(self) -> None:
        with self._admin_lock:
            if self._admin_conn is not None:
                self._admin_conn.close()
                self._admin_conn = None
        pg, self._pg = self._pg, None
        if pg is not None:
            pg.stop()
            with suppress(Exception):
                atexit.unregister(self.stop)

    def __enter__(self) -> EphemeralServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @staticmethod
    def _make_base_dir(run_as: pwd.struct_passwd | None) -> str:
        parent = None
        if run_as is not None and not _traversable_by_others(Path(tempfile.gettempdir())):
            parent = "/tmp"  # the postgres user must be able to reach its files
        return tempfile.mkdtemp(prefix="llm-db-pg-", dir=parent)

    # --- addresses -------------------------------------------------------------

    @property
    def _running(self) -> ServerProcess:
        if self._pg is None:
            raise RuntimeError("EphemeralServer is not running; call start() first")
        return self._pg

    @property
    def port(self) -> int:
        return int(self._running.settings["port"])

    @property
    def base_dir(self) -> str:
        return self._running.base_dir

    @property
    def socket_dir(self) -> str:
        return os.path.join(self._running.base_dir, "tmp")

    @property
    def log_path(self) -> str:
        return os.path.join(self._running.base_dir, f"{self._running.name}.log")

    def conninfo(self, dbname: str = "postgres", **extra: Any) -> dict[str, Any]:
        params: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "user": self.superuser,
            "dbname": dbname,
        }
        params.update(extra)
        return params

    def dsn(self, dbname: str = "postgres", **extra: Any) -> str:
        """key=value conninfo for the superuser (extra libpq keywords allowed)."""
        return psycopg.conninfo.make_conninfo(**self.conninfo(dbname, **extra))

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{self.superuser}@{self.host}:{self.port}/{dbname}"

    def connect(self, dbname: str = "postgres", **kwargs: Any) -> psycopg.Connection:
        kwargs.setdefault("autocommit", True)
        return psycopg.connect(self.dsn(dbname), **kwargs)

    # --- databases -------------------------------------------------------------

    @contextmanager
    def _admin(self) -> Iterator[psycopg.Connection]:
        """One reused superuser connection to ``postgres`` for database DDL
        (a clone per test should not also pay a connection per test)."""
        with self._admin_lock:
            conn = self._admin_conn
            if conn is None or conn.closed or conn.broken:
                conn = self._admin_conn = self.connect()
            yield conn

    def create_owner(self, name: str = OWNER) -> str:
        """Create role ``name`` (LOGIN CREATEROLE, no superuser) unless it exists: the
        schema owner of a managed service. Returns ``name``."""
        with self._admin() as conn:
            if conn.execute(_sql.ROLE_EXISTS, {"name": name}).fetchone() is None:
                conn.execute(_sql.CREATE_OWNER.format(name=sql.Identifier(name)))
        return name

    def create_database(
        self,
        name: str,
        *,
        template: str | None = None,
        settings: dict[str, str] | None = None,
        owner: str | None = None,
    ) -> str:
        """Create database ``name`` (optionally cloned from ``template``) and return its dsn
        (for ``owner`` when given, else for the superuser).

        ``settings``: defaults for every later session of that database
        (``ALTER DATABASE name SET key = value``); a clone does not inherit its
        template's. ``owner``: the database's owner, as a provider's admin creates it."""
        query = _sql.CREATE_DATABASE.format(name=sql.Identifier(name))
        if owner is not None:
            query += _sql.WITH_OWNER.format(owner=sql.Identifier(owner))
        if template is not None:
            query += _sql.WITH_TEMPLATE.format(template=sql.Identifier(template))
        with self._admin() as conn:
            if template is not None:
                conn.execute(_sql.END_SESSIONS, {"name": template})
            conn.execute(query)
        self.set_database_settings(name, settings or {})
        return self.dsn(name) if owner is None else self.dsn(name, user=owner)

    def set_database_settings(self, name: str, settings: dict[str, str]) -> None:
        """``ALTER DATABASE name SET key = value`` for each setting: the default of
        every later session of that database."""
        with self._admin() as conn:
            for key, value in settings.items():
                conn.execute(
                    _sql.SET_DATABASE_SETTING.format(
                        name=sql.Identifier(name), key=sql.Identifier(key), value=sql.Literal(value)
                    )
                )

    def drop_database(self, name: str) -> None:
        with self._admin() as conn:
            conn.execute(_sql.DROP_DATABASE.format(name=sql.Identifier(name)))

    def mark_template(self, name: str) -> None:
        """Make ``name`` a template that nobody can connect to, so clones never wait."""
        with self._admin() as conn:
            conn.execute(_sql.MARK_TEMPLATE.format(name=sql.Identifier(name)))
            conn.execute(_sql.END_SESSIONS, {"name": name})
