"""The optional libraries of llm-db's extras, imported when first needed.

``import llm_db`` and the driver (``Llm``, ``AsyncLlm``, ``migrate``) need only
psycopg, the core install. Everything else comes with an extra:

* ``cli``: the ``llm-db`` command (``click``);
* ``testing``: the throw-away PostgreSQL of the pytest fixtures
  (``llm_db.testing``) and of ``llm-db demo`` (``testing.postgresql``);
* ``worker``: webhook delivery and verification (``httpx``, ``standardwebhooks``)
  and the Prometheus exposition (``prometheus_client``).

Code that needs one calls ``require(name)``, which raises ``MissingExtra`` (an
``ImportError``) naming the pip line of the extra.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = [
    "EXTRAS",
    "INSTALL_HINT",
    "WORKER_MODULES",
    "MissingExtra",
    "install_hint",
    "missing",
    "require",
]

_WORKER = "webhook delivery, the worker and the metrics need"
#: import name -> (the extra that installs it, what needs it)
EXTRAS: dict[str, tuple[str, str]] = {
    "httpx": ("worker", _WORKER),
    "standardwebhooks": ("worker", _WORKER),
    "prometheus_client": ("worker", _WORKER),
    "click": ("cli", "the llm-db command needs"),
    "testing.postgresql": (
        "testing",
        "the throw-away PostgreSQL (the llm_db.testing fixtures, llm-db demo without --dsn) needs",
    ),
}
#: the import names the ``worker`` extra provides
WORKER_MODULES = tuple(name for name, (extra, _) in EXTRAS.items() if extra == "worker")


def install_hint(extra: str) -> str:
    """``pip install 'llm-db[extra]'``"""
    return f"pip install 'llm-db[{extra}]'"


INSTALL_HINT = install_hint("worker")


class MissingExtra(ImportError):
    """A library of an extra is not installed; the message names the pip line.

    ``extra`` is the extra's name (``cli``, ``testing``, ``worker``)."""

    def __init__(self, message: str, *, name: str, extra: str) -> None:
        super().__init__(message, name=name)
        self.extra = extra


def missing(name: str) -> MissingExtra:
    """The ``MissingExtra`` for ``name`` (a key of ``EXTRAS``), to raise."""
    extra, needed_by = EXTRAS[name]
    return MissingExtra(
        f"{name} is not installed: {needed_by} the {extra} extra ({install_hint(extra)})",
        name=name,
        extra=extra,
    )


def require(name: str) -> ModuleType:
    """Import ``name`` (a key of ``EXTRAS``), or raise ``MissingExtra``."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise missing(name) from exc
