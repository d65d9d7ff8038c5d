"""What the throw-away servers' processes share (PostgreSQL's in
``llm_db.testing._postgresql``, PgBouncer's in ``llm_db.testing._pgbouncer``): the
superuser's name, the error of a setup that failed, and how a process drops to
another OS user. Its own module so that ``llm_db.testing._server``, which starts
the PostgreSQL process, and that process's class both import it, not each other.
"""

from __future__ import annotations

import os
import pwd
from typing import Any

__all__ = ["SUPERUSER", "ServerSetupError", "run_as_kwargs"]

SUPERUSER = "postgres"


class ServerSetupError(RuntimeError):
    """PostgreSQL or a needed extension is not installed, or the server would not start."""


def run_as_kwargs(run_as: pwd.struct_passwd | None, cwd: str) -> dict[str, Any]:
    """``subprocess`` arguments that start a server process in ``cwd`` as ``run_as``
    (None: as the caller). Only the server drops privileges; the caller stays who it is."""
    kwargs: dict[str, Any] = {"cwd": cwd}
    if run_as is not None:
        kwargs.update(user=run_as.pw_uid, group=run_as.pw_gid, extra_groups=[])
        env = dict(os.environ)
        env.update(HOME=run_as.pw_dir, USER=run_as.pw_name, LOGNAME=run_as.pw_name)
        kwargs["env"] = env
    return kwargs
