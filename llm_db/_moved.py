"""The forwarding of 0.2.0's module paths (``llm_db.requests``, ``llm_db.report``, ...),
which 0.3.x keeps as shims of the modules that moved and 0.4 removes."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def forward(new: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` that finds any other name, private ones included, in the
    module ``new``: a shim's ``import *`` brings only the new module's ``__all__``."""

    def __getattr__(name: str) -> Any:
        try:
            return getattr(importlib.import_module(new), name)
        except AttributeError:
            raise AttributeError(
                f"module {new!r} (moved from 0.2.0's path) has no attribute {name!r}"
            ) from None

    return __getattr__
