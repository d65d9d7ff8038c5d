"""llm-db: the books for LLM usage of a multi-tenant platform, kept in PostgreSQL.

A consumer needs no SQL::

    import psycopg
    from llm_db import Llm, with_llm_execution

    llm = Llm(psycopg.connect(dsn))
    inv = llm.admit(org_id, estimate_credits=120, model="gpt-4o")
    llm.mark_dispatched(org_id, inv.id)
    llm.settle(org_id, inv.id, credits=97, cents=3)
"""

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

__version__ = "0.4.0.dev0"

__all__ = [
    "AllowanceExhausted", "AsyncExecutionContext", "AsyncLlm", "CitusNotInstalled",
    "CronNotInstalled", "CrossOrganizationReference", "DailyUsageFinding",
    "Execution",
    "ExecutionContext", "ExecutionResult", "Health", "IdempotencyConflict", "InvalidArgument",
    "InvalidTransition", "InvariantViolation", "Invocation", "Llm", "LlmError",
    "NestedExecution", "Notice", "OrgSweep", "Organization", "OrganizationNotOperational",
    "Outcome", "PriceMissing", "PriceQuote", "ReconciliationRun", "Repricing",
    "SumLimitExceeded",
    "UnknownExecution", "UnknownInvocation", "UnknownOrganization", "UnknownTaskKind", "Usage",
    "WindowRetired", "__version__",
    "async_with_llm_execution", "current_execution", "migrate", "with_llm_execution",
]
