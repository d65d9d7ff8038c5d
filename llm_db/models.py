"""Typed results of the driver: frozen dataclasses built from dict rows.

Each class is built with ``from_row(row)`` from a psycopg ``dict_row``, by
column name, never by position. Columns the class does not name are ignored,
so adding a column to a table or a composite type breaks no client; a column
the class names but the row lacks raises ``KeyError`` at once.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Mapping
from datetime import date, datetime
from typing import Any, Self
from uuid import UUID

__all__ = [
    "CloseOutcome",
    "Execution",
    "ExecutionStatus",
    "Health",
    "HealthStatus",
    "InvariantViolation",
    "Invocation",
    "InvocationStatus",
    "LastRun",
    "LateSettlement",
    "Notice",
    "NoticeStatus",
    "Organization",
    "OrganizationStatus",
    "OrgSweep",
    "Outcome",
    "PriceQuote",
    "ReconciliationRun",
    "RecoveryCharge",
    "Repricing",
    "RunStatus",
    "SettlementKind",
]


class _Row:
    """Mixin: ``from_row`` picks this dataclass's fields out of a mapping by name.

    The annotations say how a value is stored: a field annotated ``tuple[...]``
    holds an SQL array as a tuple (frozen, hashable), one annotated with a
    ``StrEnum`` holds that enum's member for the SQL text."""

    __slots__ = ()

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        columns = _COLUMNS.get(cls)
        if columns is None:  # once per class: read the fields and their annotations
            columns = _COLUMNS[cls] = _columns(cls)
        names, converters = columns
        values = {name: row[name] for name in names}
        for name, convert in converters:
            if values[name] is not None:
                values[name] = convert(values[name])
        return cls(**values)


Converter = Callable[[Any], Any]


def _columns(cls: type) -> tuple[tuple[str, ...], tuple[tuple[str, Converter], ...]]:
    """The field names, and how the non-NULL value of each field that is not kept as
    is gets converted: ``tuple`` for ``tuple[...]``, the enum for a ``StrEnum``."""
    hints = typing.get_type_hints(cls)
    names = tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    converters = []
    for name in names:
        hint = hints[name]
        for member in typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,):
            if typing.get_origin(member) is tuple:
                converters.append((name, tuple))
            elif isinstance(member, type) and issubclass(member, enum.StrEnum):
                converters.append((name, member))
    return names, tuple(converters)


_COLUMNS: dict[type, tuple[tuple[str, ...], tuple[tuple[str, Converter], ...]]] = {}


# The fixed sets of text values (docs/architecture.md, "Schema"). Each member compares equal
# to its SQL text, so ``inv.status == "settled"`` holds as well as
# ``inv.status is InvocationStatus.SETTLED``.


class OrganizationStatus(enum.StrEnum):
    OPERATIONAL = "operational"
    SUSPENDED = "suspended"
    CLOSED = "closed"


class RecoveryCharge(enum.StrEnum):
    """What the pass charges a request it recovers."""

    ESTIMATE = "estimate"
    DISPATCHED = "dispatched"  # the estimate if it was dispatched, else nothing
    NONE = "none"


class LateSettlement(enum.StrEnum):
    """What a measured settlement reported after recovery does."""

    AUDIT = "audit"  # recorded beside the recovery charge, never charged
    TRUE_UP = "true_up"  # replaces the recovery charge by the measured one


class InvocationStatus(enum.StrEnum):
    RESERVED = "reserved"
    DISPATCHED = "dispatched"
    SETTLED = "settled"
    FAILED = "failed"


class SettlementKind(enum.StrEnum):
    MEASURED = "measured"
    RECOVERED = "recovered"
    TRUED_UP = "trued_up"


class ExecutionStatus(enum.StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    ABANDONED = "abandoned"


class CloseOutcome(enum.StrEnum):
    """How ``close_execution`` ends a running task."""

    COMPLETED = "completed"
    FAILED = "failed"


class NoticeStatus(enum.StrEnum):
    OWED = "owed"
    SENDING = "sending"
    SENT = "sent"


class RunStatus(enum.StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    PARTIAL = "partial"
    FAILED = "failed"
    SKIPPED = "skipped"


class HealthStatus(enum.StrEnum):
    OK = "ok"
    LATE = "late"
    NEVER = "never"
    FAILING = "failing"


class Outcome(enum.StrEnum):
    """What ``settle`` / ``fail`` did; compares equal to the SQL text."""

    SETTLED = "settled"
    FAILED = "failed"
    TRUED_UP = "trued_up"
    ALREADY_SETTLED = "already_settled"
    ALREADY_RECOVERED = "already_recovered"
    ALREADY_FAILED = "already_failed"


@dataclasses.dataclass(frozen=True, slots=True)
class Organization(_Row):
    """A row of ``llm.organizations``; ``monthly_allowance_credits`` None is unlimited."""

    id: UUID
    name: str
    status: OrganizationStatus
    monthly_allowance_credits: int | None
    notice_thresholds: tuple[int, ...]
    created_at: datetime
    updated_at: datetime
    recovery_charge: RecoveryCharge
    late_settlement: LateSettlement


@dataclasses.dataclass(frozen=True, slots=True)
class Invocation(_Row):
    """One model request and its hold, as ``admit`` and ``mark_dispatched`` return it
    (``llm.admission_result``): its row of ``llm.invocations``, then ``replayed``.

    ``replayed`` is True when the call created or changed nothing: ``admit`` of an
    invocation id admitted before (a retry, answered with the request as it stands now,
    whatever its ``status``) or ``mark_dispatched`` of a request already dispatched."""

    organization_id: UUID
    id: UUID
    period_start: date
    execution_id: UUID | None
    model: str
    status: InvocationStatus
    estimate_credits: int
    hold_credits: int
    charged_credits: int | None
    charged_cents: int | None
    input_tokens: int | None
    output_tokens: int | None
    settlement_kind: SettlementKind | None
    created_at: datetime
    dispatched_at: datetime | None
    settled_at: datetime | None
    past_window_alerted_at: datetime | None
    error: str | None
    # a measured settlement reported after recovery: kept for audit, never charged
    late_credits: int | None
    late_cents: int | None
    late_input_tokens: int | None
    late_output_tokens: int | None
    late_reported_at: datetime | None
    # what recovery charged (kept after a true-up replaced charged_credits)
    recovered_credits: int | None
    # the stripe of its period that holds its hold (llm.set_period_stripes)
    stripe: int
    # this call returned an earlier admission (or dispatch) unchanged
    replayed: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Execution(_Row):
    """What ``open_execution`` returned: the task, and whether a replay key found it."""

    execution_id: UUID
    status: ExecutionStatus
    replayed: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Notice(_Row):
    """A row of ``llm.threshold_notices``: a crossed threshold owed to the webhook.

    Of the monthly allowance (``scope`` ``organization``, ``scope_id`` None,
    ``budget_window`` ``month``) or of a budget: then ``scope_id`` is the
    real id (None for the organization's day and week budgets).

    ``window_start`` is the first day of the window (the allowance's month, a budget's
    day, week or month) and ``limit_credits`` the limit whose threshold was crossed.
    ``period_start`` and ``allowance_credits`` are the same two under their names of
    0.3.0, kept through 0.4.x and removed in 0.5.0."""

    organization_id: UUID
    id: UUID
    period_start: date
    threshold_pct: int
    crossed_at: datetime
    used_credits: int
    allowance_credits: int
    status: NoticeStatus
    attempts: int
    last_error: str | None
    next_attempt_at: datetime
    claimed_at: datetime | None
    sent_at: datetime | None
    #: the live claim's token while ``sending`` (what ends the claim); None otherwise
    claim_token: UUID | None
    scope: str
    scope_id: str | None
    budget_window: str
    window_start: date
    limit_credits: int

    @property
    def is_allowance(self) -> bool:
        """True for a notice of the monthly allowance, False for one of a budget."""
        return self.scope == "organization" and self.budget_window == "month"

    @property
    def is_limit_reached(self) -> bool:
        """True for the notice of a limit's first refusal in its window (threshold 0,
        ``llm.note_refusal``): its commitments would have passed the limit."""
        return self.threshold_pct == 0


@dataclasses.dataclass(frozen=True, slots=True)
class OrgSweep(_Row):
    """``llm.org_sweep``: what one organization's reconciliation did."""

    organization_id: UUID
    recovered_requests: int
    released_hold_credits: int
    past_window_alerts: int
    abandoned_executions: int
    drift_findings: int
    notices_created: int
    more_pending: bool
    recovered_uncharged: int


@dataclasses.dataclass(frozen=True, slots=True)
class ReconciliationRun(_Row):
    """A row of ``llm.reconciliation_runs``: one pass."""

    id: UUID
    started_at: datetime
    finished_at: datetime | None
    clock: datetime
    status: RunStatus
    orgs_visited: int
    orgs_failed: int
    requests_recovered: int
    released_hold_credits: int
    past_window_alerts: int
    executions_abandoned: int
    drift_findings: int
    notices_rearmed: int
    daily_rows_rebuilt: int
    more_pending_orgs: int
    errors: list[dict[str, Any]]
    recovered_uncharged: int
    period_findings: int
    daily_rebuilt_through: date | None


@dataclasses.dataclass(frozen=True, slots=True)
class LastRun(ReconciliationRun):
    """``llm.last_run()``: the newest finished pass that was not skipped, how long it
    took and its age, in seconds (on the pass's clock, as health judges it)."""

    duration_seconds: float
    age_seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class Health(_Row):
    """``llm.reconciliation_health``: ok, late, never or failing, and why."""

    status: HealthStatus
    last_success_at: datetime | None
    last_run_status: RunStatus | None
    detail: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclasses.dataclass(frozen=True, slots=True)
class DailyUsageFinding(_Row):
    """A row of ``llm.check_daily_usage()``: an organization's UTC day whose
    ``daily_usage`` rows (``recorded``) differ from its requests (``computed``), each
    by model: requests, recovered_requests, credits, cents, input_tokens, output_tokens."""

    organization_id: UUID
    day: date
    recorded: dict[str, dict[str, int]]
    computed: dict[str, dict[str, int]]


@dataclasses.dataclass(frozen=True, slots=True)
class InvariantViolation(_Row):
    """A row of ``llm.check_invariants()``: which invariant broke, where (docs/contract.md)."""

    invariant: int
    organization_id: UUID | None
    subject: str
    detail: str


@dataclasses.dataclass(frozen=True, slots=True)
class Repricing(_Row):
    """A row of ``llm.reprice``: one organization's requests the version reprices, their
    cost before (as already corrected) and after, and the difference, in exact nanos."""

    organization_id: UUID
    requests: int
    cost_before_nanos: int
    cost_after_nanos: int
    difference_nanos: int


@dataclasses.dataclass(frozen=True, slots=True)
class PriceQuote(_Row):
    """What ``llm.price_usage`` returns: a usage's exact cost in nanos (10^-9 of
    ``currency``), the credits it is charged (cost / the credit rate, rounded up), the
    price version and credit rate that priced it, the tier (``above_prompt_tokens``; None
    at base rates) and ``priced_by``: ``model`` or ``fallback`` (the ``'*'`` price)."""

    cost_nanos: int
    credits: int
    price_version_id: int
    credit_rate_id: int
    price_tier: int | None
    priced_by: str
    currency: str
