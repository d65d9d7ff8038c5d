"""llm-db: the books for LLM usage of a multi-tenant platform, kept in PostgreSQL."""

# Bound after the submodule import on purpose: `llm_db.migrate` is the function,
# `llm_db.migrate` the module stays reachable as sys.modules["llm_db.migrate"]
# (use `from llm_db.migrate import …` for its other names).
from llm_db.migrate import migrate

__version__ = "0.1.0"

__all__ = ["__version__", "migrate"]
