"""The ``llm-db`` command line (the ``cli`` extra): the group, its commands and the
report's rendering.

``python -m llm_db.cli`` is the same program as the ``llm-db`` script (whose entry
point is ``llm_db.__main__``). The group is ``llm_db.cli.group``; ``main`` and the
``EXIT_*`` codes are read from it when first asked for, so that importing this
package, or the report's rendering (``llm_db.cli.report``), needs no click. ``from llm_db.cli import main`` without click raises
``MissingExtra`` naming ``pip install 'llm-db[cli]'``.
"""

from __future__ import annotations

from typing import Any

# the names of llm_db.cli.group's __all__, read from it when first asked for
__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_MISSING", "EXIT_OK", "EXIT_PROBLEM",
           "EXIT_UNAVAILABLE", "EXIT_USAGE", "main"]  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in __all__:
        from llm_db.cli import group

        return getattr(group, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
