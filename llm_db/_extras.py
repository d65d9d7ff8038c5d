"""The optional libraries of the ``worker`` extra, imported when first needed.

``import llm_db`` and the driver (``Llm``, ``AsyncLlm``) need only psycopg.
Webhook delivery and verification (``httpx``, ``standardwebhooks``) and the
Prometheus exposition (``prometheus_client``) come with
``pip install 'llm-db[worker]'``; code that needs one calls ``require(name)``,
which raises ``MissingExtra`` (an ``ImportError``) saying so.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["INSTALL_HINT", "WORKER_MODULES", "MissingExtra", "require"]

#: the import names the ``worker`` extra provides
WORKER_MODULES = ("httpx", "standardwebhooks", "prometheus_client")
INSTALL_HINT = "pip install 'llm-db[worker]'"


class MissingExtra(ImportError):
    """A library of the ``worker`` extra is not installed; the message names the pip line."""


def require(name: str) -> ModuleType:
    """Import ``name`` (one of ``WORKER_MODULES``), or raise ``MissingExtra``."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise MissingExtra(
            f"{name} is not installed: webhook delivery, the worker and the metrics need the "
            f"worker extra ({INSTALL_HINT})",
            name=name,
        ) from exc
