"""Moved to ``llm_db.cli.commands.passes``: ``llm_db.commands.passes`` re-exports it for 0.3.x and is removed in 0.4."""

from llm_db._moved import forward
from llm_db.cli.commands.passes import *  # noqa: F403

__getattr__ = forward("llm_db.cli.commands.passes")
