"""Moved to ``llm_db.client``: ``llm_db.requests`` re-exports it for 0.3.x and is removed in 0.4."""

from llm_db._moved import forward
from llm_db.client import *  # noqa: F403
from llm_db.client import __all__  # noqa: F401

__getattr__ = forward("llm_db.client")
