"""Moved to ``llm_db.cli.doctor``: ``llm_db.doctor`` re-exports it for 0.3.x and is removed in 0.4."""

from llm_db._moved import forward
from llm_db.cli.doctor import *  # noqa: F403
from llm_db.cli.doctor import __all__  # noqa: F401

__getattr__ = forward("llm_db.cli.doctor")
