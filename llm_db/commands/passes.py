"""Moved to ``llm_db.cli.commands.passes``: ``llm_db.commands.passes`` re-exports it for 0.3.x and is removed in 0.4."""

from llm_db.cli.commands.passes import *  # noqa: F403
