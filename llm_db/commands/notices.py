"""Moved to ``llm_db.cli.commands.notices``: ``llm_db.commands.notices`` re-exports it for 0.3.x and is removed in 0.4."""

from llm_db.cli.commands.notices import *  # noqa: F403
