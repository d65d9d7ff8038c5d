"""Moved to ``llm_db.service.metrics``: ``llm_db.metrics`` re-exports it for 0.3.x and is removed in 0.4."""

from llm_db._moved import forward
from llm_db.service.metrics import *  # noqa: F403
from llm_db.service.metrics import __all__  # noqa: F401

__getattr__ = forward("llm_db.service.metrics")
