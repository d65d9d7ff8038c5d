"""The server process under ``llm_db.testing._server.EphemeralServer``: ``testing.postgresql``
(the ``testing`` extra) with what llm-db needs on top.

Imported by ``EphemeralServer.start()`` only, so ``llm_db.testing._server``, ``llm_db.testing._pgbouncer``
and the pytest plugin ``llm_db.testing`` load without the extra; a start without it
raises ``MissingExtra`` naming ``pip install 'llm-db[testing]'``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from testing.postgresql import Postgresql

from llm_db.testing import _sql
from llm_db.testing._process import SUPERUSER, ServerSetupError, run_as_kwargs

__all__ = ["ServerProcess"]


class ServerProcess(Postgresql):
    """testing.postgresql.Postgresql that drops privileges when run as root.

    Settings beyond testing.postgresql's own: ``run_as`` (a pwd entry or None),
    ``server_settings`` (dict of -c options) and ``bin_dir``.
    """

    def initialize(self) -> None:
        bin_dir = Path(self.settings.pop("bin_dir"))
        self.settings["initdb"] = str(bin_dir / "initdb")
        self.settings["postgres"] = str(bin_dir / "postgres")
        self.run_as = self.settings.pop("run_as")
        self.server_settings = self.settings.pop("server_settings")
        super().initialize()

    # --- privileges ---------------------------------------------------------

    def _popen_kwargs(self) -> dict[str, Any]:
        return run_as_kwargs(self.run_as, self.base_dir)

    def _give_away(self, path: str) -> None:
        if self.run_as is not None:
            os.chown(path, self.run_as.pw_uid, self.run_as.pw_gid)

    # --- testing.postgresql hooks -------------------------------------------

    def initialize_database(self) -> None:
        data = os.path.join(self.base_dir, "data")
        if os.path.exists(os.path.join(data, "PG_VERSION")):
            return
        self._give_away(self.base_dir)
        for sub in self.subdirectories:
            self._give_away(os.path.join(self.base_dir, sub))
        args = [
            self.initdb, "-D", data, "-U", SUPERUSER, "-A", "trust",
            "-E", "UTF8", "--locale=C", "--lc-messages=C", "--no-sync",
        ]  # fmt: skip
        proc = subprocess.run(args, capture_output=True, text=True, **self._popen_kwargs())
        if proc.returncode != 0:
            raise ServerSetupError(
                f"initdb failed ({proc.returncode}):\n{proc.stderr or proc.stdout}"
            )

    def get_server_commandline(self) -> list[str]:
        cmd = [
            self.postgres,
            "-D", os.path.join(self.base_dir, "data"),
            "-p", str(self.settings["port"]),
            "-c", f"unix_socket_directories={os.path.join(self.base_dir, 'tmp')}",
        ]  # fmt: skip
        for key, value in self.server_settings.items():
            cmd += ["-c", f"{key}={value}"]
        return cmd

    def start(self) -> None:
        # testing.common's start(), with our Popen arguments: the server runs as
        # run_as, in its own session (a terminal's Ctrl-C goes to the caller only).
        if self.child_process:
            return
        self.prestart()
        log_path = os.path.join(self.base_dir, f"{self.name}.log")
        with open(log_path, "w") as log:
            try:
                self.child_process = subprocess.Popen(
                    self.get_server_commandline(),
                    stdout=log,
                    stderr=log,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    **self._popen_kwargs(),
                )
            except OSError as exc:
                raise ServerSetupError(f"failed to launch postgres: {exc!r}") from exc
        try:
            self.wait_booting()
            self.poststart()
        except BaseException:
            self.stop()
            raise

    def is_server_available(self) -> bool:
        try:
            with psycopg.connect(**self.dsn(database="postgres"), connect_timeout=2):
                return True
        except psycopg.Error:
            return False

    def dsn(self, **kwargs: Any) -> dict[str, Any]:
        params = dict(kwargs)
        params.setdefault("port", self.settings["port"])
        params.setdefault("host", "127.0.0.1")
        params.setdefault("user", SUPERUSER)
        params.setdefault("dbname", params.pop("database", "postgres"))
        return params

    def poststart(self) -> None:
        # The pg_cron launcher connects to cron.database_name: create it at once,
        # so the launcher does not restart in a loop looking for it.
        cron_db = self.server_settings.get("cron.database_name")
        if not cron_db:
            return
        with psycopg.connect(**self.dsn(database="postgres"), autocommit=True) as conn:
            if conn.execute(_sql.DATABASE_EXISTS, {"name": cron_db}).fetchone() is None:
                conn.execute(_sql.CREATE_DATABASE.format(name=sql.Identifier(cron_db)))

    def cleanup(self) -> None:
        if self.child_process is not None:
            return
        shutil.rmtree(self.base_dir, ignore_errors=True)
