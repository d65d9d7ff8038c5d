"""Moved to ``llm_db.testing._pgbouncer``: ``llm_db._pgbouncer`` re-exports it for 0.3.x and is removed in 0.4."""

from llm_db._moved import forward
from llm_db.testing._pgbouncer import *  # noqa: F403
from llm_db.testing._pgbouncer import __all__  # noqa: F401

__getattr__ = forward("llm_db.testing._pgbouncer")
