"""Moved to ``llm_db.cli.commands.notices``: ``llm_db.commands.notices`` re-exports it for 0.3.x and is removed in 0.4."""

from llm_db._moved import forward
from llm_db.cli.commands.notices import *  # noqa: F403

__getattr__ = forward("llm_db.cli.commands.notices")
