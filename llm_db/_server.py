"""Moved to ``llm_db.testing._server``: ``llm_db._server`` re-exports it for 0.3.x and is removed in 0.4."""

from llm_db._moved import forward
from llm_db.testing._server import *  # noqa: F403
from llm_db.testing._server import __all__  # noqa: F401

__getattr__ = forward("llm_db.testing._server")
