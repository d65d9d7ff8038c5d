"""llm-db: the books for LLM usage of a multi-tenant platform, kept in PostgreSQL.

A consumer needs no SQL::

    import psycopg
    from llm_db import Llm, with_llm_execution

    llm = Llm(psycopg.connect(dsn))
    inv = llm.admit(org_id, estimate_credits=120, model="gpt-4o")
    llm.mark_dispatched(org_id, inv.id)
    llm.settle(org_id, inv.id, credits=97, cents=3)
"""

import importlib
from typing import Any

from llm_db.client import AsyncLlm, Llm

# Bound after the submodule import on purpose: `llm_db.migrate` is the function,
# `llm_db.migrate` the module stays reachable as sys.modules["llm_db.migrate"]
# (use `from llm_db.migrate import …` for its other names).
from llm_db.errors import (
    AllowanceExhausted,
    CitusNotInstalled,
    CronNotInstalled,
    CrossOrganizationReference,
    IdempotencyConflict,
    InvalidArgument,
    InvalidTransition,
    LlmError,
    NestedExecution,
    OrganizationNotOperational,
    PriceMissing,
    SumLimitExceeded,
    UnknownExecution,
    UnknownInvocation,
    UnknownOrganization,
    UnknownTaskKind,
    WindowRetired,
)
from llm_db.executions import (
    AsyncExecutionContext,
    ExecutionContext,
    ExecutionResult,
    async_with_llm_execution,
    current_execution,
    with_llm_execution,
)
from llm_db.migrate import migrate
from llm_db.models import (
    DailyUsageFinding,
    Execution,
    Health,
    InvariantViolation,
    Invocation,
    Notice,
    Organization,
    OrgSweep,
    Outcome,
    PriceQuote,
    ReconciliationRun,
    Repricing,
)
from llm_db.usage import Usage

__version__ = "0.3.0"

# The notice names live with the worker in llm_db.service.notices; they load when
# first used, so that `import llm_db` (the core) imports nothing of the service folder.
_NOTICE_NAMES = frozenset(
    {"DeliverySummary", "InvalidSecret", "async_deliver_notices", "deliver_notices"}
    | {"new_secret", "verify_webhook"}
)


def __getattr__(name: str) -> Any:
    if name in _NOTICE_NAMES:
        from llm_db.service import notices

        return getattr(notices, name)
    # 0.2.0's `import llm_db` imported these two modules, so `llm_db.notices.…` and
    # `llm_db.requests.…` worked without their own import: their 0.2.0 paths, on first
    # use (import_module: `from llm_db import notices` would ask this function again)
    if name in ("notices", "requests"):
        return importlib.import_module(f"llm_db.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_NOTICE_NAMES})

__all__ = [
    "AllowanceExhausted", "AsyncExecutionContext", "AsyncLlm", "CitusNotInstalled",
    "CronNotInstalled", "CrossOrganizationReference", "DailyUsageFinding", "DeliverySummary",
    "Execution",
    "ExecutionContext", "ExecutionResult", "Health", "IdempotencyConflict", "InvalidArgument",
    "InvalidSecret",
    "InvalidTransition", "InvariantViolation", "Invocation", "Llm", "LlmError",
    "NestedExecution", "Notice", "OrgSweep", "Organization", "OrganizationNotOperational",
    "Outcome", "PriceMissing", "PriceQuote", "ReconciliationRun", "Repricing",
    "SumLimitExceeded",
    "UnknownExecution", "UnknownInvocation", "UnknownOrganization", "UnknownTaskKind", "Usage",
    "WindowRetired", "__version__", "async_deliver_notices",
    "async_with_llm_execution", "current_execution", "deliver_notices", "migrate", "new_secret",
    "verify_webhook", "with_llm_execution",
]
