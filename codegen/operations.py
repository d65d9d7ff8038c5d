"""The driver's operations, each spelled once: name, SQL, parameters, result.

``Operations`` is the table. Each entry is a stub method whose signature is the
operation's Python signature and whose docstring is its documentation;
``@operation`` reads the stub once, at import, and builds from it the SQL
statement (``SELECT … FROM llm.<routine>(p_<name> => %(name)s::<type>, …)``,
the parameter types read from the annotations) and the shape of its result.

Nothing calls the stubs. ``scripts/generate_client.py`` writes from the table the
plain methods of ``Llm`` and ``AsyncLlm`` and the request helpers of the task
contexts (``TASK_HELPERS``), into ``llm_db/_client_methods.py``, which is checked
in: "go to definition" on ``Llm.settle`` lands on a real method naming its
statement and how its rows become the result. tests/test_generated_client.py
fails when that file differs from what the script writes.

A new SQL routine becomes a driver method by one entry here and a run of the
script; tests/test_driver.py fails while a public routine of schema ``llm`` has
no entry, or an entry names no routine.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from datetime import date, datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from llm_db._types import (
    TASK_DEFAULT,
    Int4,
    JsonObject,
    TaskDefault,
    UuidArray,
    UuidLike,
    json_arg,
    uuid_arg,
    value_as,
    whole,
)
from llm_db.models import (
    CloseOutcome,
    DailyUsageFinding,
    Execution,
    Health,
    InvariantViolation,
    Invocation,
    LastRun,
    LateSettlement,
    Notice,
    Organization,
    OrganizationStatus,
    OrgSweep,
    Outcome,
    PriceQuote,
    ReconciliationRun,
    RecoveryCharge,
    Repricing,
)
from llm_db.rows import (
    BooksHistory,
    BooksSnapshot,
    BudgetNearLimit,
    CostByModel,
    DailyUsage,
    MetricSeries,
    OpenHolds,
    OrganizationTotals,
    PassProgress,
    PeriodUsage,
    ScopeUsage,
    StaleByStatus,
    TasksByStatus,
)

__all__ = [
    "SCOPE_IDS",
    "TASK_DEFAULT",
    "TASK_HELPERS",
    "Operation",
    "Operations",
    "TaskDefault",
    "operations",
    "value_as",
]

#: How a statement's rows become the result: ``nothing``; ``one`` row, ``many`` rows or
#: ``maybe_one`` (a row that may be absent) of a model; the ``value`` of one column.
Shape = Literal["nothing", "one", "many", "maybe_one", "value"]


# ----------------------------------------------------------- results


def _result_of(hint: Any) -> tuple[Shape, Any]:
    """The shape of a result of type ``hint`` and its model (or, for a value, its type)."""
    if hint is None or hint is type(None):
        return "nothing", None
    origin = typing.get_origin(hint)
    if origin is list:
        return "many", typing.get_args(hint)[0]
    if origin in (types.UnionType, typing.Union):  # ``Model | None``: a row that may be absent
        (model,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return "maybe_one", model
    if hasattr(hint, "from_row") or typing.is_typeddict(hint):
        return "one", hint
    return "value", hint


def _columns_of(model: Any) -> tuple[str, ...]:
    """The columns a row result reads: its model's fields (a ``TypedDict``'s keys), by name."""
    if typing.is_typeddict(model):
        return tuple(model.__annotations__)
    return tuple(f.name for f in dataclasses.fields(model))


# ----------------------------------------------------------- SQL types

_SQL_TYPES: tuple[tuple[Any, str], ...] = (
    (UUID, "uuid"),
    (bool, "boolean"),
    (int, "bigint"),
    (datetime, "timestamptz"),  # before date: a datetime is a date
    (date, "date"),
    (str, "text"),
)


def _sql_type(hint: Any) -> str:
    """The SQL cast of a parameter annotated ``hint``: ``Int4`` is ``integer``, an
    iterable of ints ``integer[]``, a union its first non-None member's type."""
    union = typing.get_origin(hint) in (types.UnionType, typing.Union)
    members = [a for a in typing.get_args(hint) if a is not type(None)] if union else [hint]
    for member in members:
        if typing.get_origin(member) is Annotated:
            return typing.get_args(member)[1]
        if typing.get_origin(member) is not None and issubclass(typing.get_origin(member), Iterable):
            return "integer[]"
        for python, sql in _SQL_TYPES:
            if isinstance(member, type) and issubclass(member, python):
                return sql
    raise TypeError(f"no SQL type for a parameter annotated {hint!r}")


def _iterable(hint: Any) -> bool:
    """Whether a parameter annotated ``hint`` takes any iterable, which goes to the server
    as a list (psycopg adapts a list, not a generator)."""
    union = typing.get_origin(hint) in (types.UnionType, typing.Union)
    for member in typing.get_args(hint) if union else (hint,):
        if typing.get_origin(member) is Annotated:  # ``UuidArray``: the sequence it annotates
            if typing.get_args(member)[1] == "jsonb":  # ``JsonObject``: one value, not a list
                continue
            member = typing.get_args(member)[0]
        origin = typing.get_origin(member)
        if origin is not None and issubclass(origin, Iterable):
            return True
    return False


# ----------------------------------------------------------- one operation

#: the SQL types whose arguments the driver checks before sending, and how
_CHECKS = {"bigint": "whole", "integer": "whole", "uuid": "uuid", "jsonb": "json"}


class Operation:
    """One entry of the table: built from its stub method by ``@operation``."""

    def __init__(
        self,
        stub: Callable[..., Any],
        *,
        routine: str,
        sql_names: Mapping[str, str] | None = None,
        procedure: bool = False,
    ) -> None:
        self.name = stub.__name__
        self.routine = routine
        self.doc = inspect.getdoc(stub) or ""
        signature = inspect.signature(stub)
        hints = typing.get_type_hints(stub, include_extras=True)
        parameters = list(signature.parameters.values())[1:]  # without self
        #: the signature a caller sees (bound: without ``self``), annotations as written
        self.signature = signature.replace(parameters=parameters)
        self.names = tuple(p.name for p in parameters)
        #: the parameters that take any iterable and go to the server as a list
        self.listed = frozenset(n for n in self.names if _iterable(hints[n]))
        #: the parameters checked before sending: "whole" (an SQL integer), "uuid" or "json"
        self.checked = {n: _CHECKS[t] for n in self.names if (t := _sql_type(hints[n])) in _CHECKS}

        names = sql_names or {}
        arguments = ",\n    ".join(
            f"{names.get(n, 'p_' + n)} => %({n})s::{_sql_type(hints[n])}" for n in self.names
        )
        self.call = call = f"llm.{routine}(\n    {arguments})" if arguments else f"llm.{routine}()"
        self.shape, self.returns = _result_of(hints["return"])
        if procedure:
            self.sql = f"CALL {call}"
        elif self.shape == "value" or self.shape == "nothing":
            self.sql = f"SELECT {call} AS value"
        else:
            # Named columns, never ``*``: a statement prepared on the server keeps its
            # result when the routine's type gains a column.
            self.sql = f"SELECT {', '.join(_columns_of(self.returns))} FROM {call}"
        self.procedure = procedure

    def one_column(self, column: str, kind: type, *, name: str, doc: str) -> Operation:
        """This operation under another name, returning only one column of its row (as
        a value of ``kind``): the same signature, parameters and routine."""
        narrow = copy.copy(self)
        narrow.name, narrow.doc = name, doc
        narrow.signature = self.signature.replace(return_annotation=kind.__name__)  # as the stubs spell it
        narrow.sql = f"SELECT r.{column} AS value FROM {self.call} AS r"
        narrow.shape, narrow.returns = "value", kind
        return narrow

    def __repr__(self) -> str:
        return f"<operation {self.name}{self.signature} -> llm.{self.routine}>"

    def params(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The named parameters of ``sql`` for these arguments, as the generated method
        passes them (for tests and tools: the clients never call this)."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        for name in self.listed:
            values[name] = list(values[name]) if values[name] is not None else None
        for name, kind in self.checked.items():
            values[name] = {"whole": whole, "uuid": uuid_arg, "json": json_arg}[kind](name, values[name])
        return values


def operation(
    routine: str, *, sql_names: Mapping[str, str] | None = None, procedure: bool = False
) -> Callable[[Callable[..., Any]], Operation]:
    """Make the stub below an entry of the table: it calls ``llm.<routine>``.

    ``sql_names``: SQL parameter names that are not ``p_`` + the Python name.
    ``procedure``: a ``CALL``. (``Operation.one_column``: an entry returning one
    column of another's row.)"""

    def build(stub: Callable[..., Any]) -> Operation:
        return Operation(stub, routine=routine, sql_names=sql_names, procedure=procedure)

    return build


class Operations:
    """The table: every operation of the driver, in the order of docs/contract.md.

    Each stub is the signature and documentation of the method ``Llm`` and ``AsyncLlm``
    get (``llm_db/_client_methods.py``, generated). Every ``now`` is the clock the SQL
    uses (a timezone-aware datetime; None means the server's ``now()``).
    """

    # organizations and catalog

    @operation("upsert_organization")
    def upsert_organization(
        self,
        organization_id: UuidLike,
        name: str,
        monthly_allowance_credits: int | None,
        *,
        status: OrganizationStatus | str | None = None,
        notice_thresholds: Iterable[int] | None = None,
        now: datetime | None = None,
    ) -> Organization:
        """Create or update an organization (allowance None = unlimited). ``status`` and
        ``notice_thresholds`` None keep the organization's (a new one: operational,
        (80, 100)); pass them to change them."""

    @operation("set_allowance")
    def set_allowance(
        self,
        organization_id: UuidLike,
        monthly_allowance_credits: int | None,
        *,
        now: datetime | None = None,
    ) -> Organization:
        """Change only the monthly allowance of an existing organization (None = unlimited;
        UnknownOrganization otherwise): name, status and thresholds stay."""

    @operation("set_recovery_policy")
    def set_recovery_policy(
        self,
        organization_id: UuidLike,
        recovery_charge: RecoveryCharge | str,
        late_settlement: LateSettlement | str,
    ) -> Organization:
        """What recovery charges (estimate | dispatched | none) and what a late measured
        settlement does (audit | true_up) for this organization."""

    @operation("set_period_stripes")
    def set_period_stripes(self, organization_id: UuidLike, stripes: Int4) -> int:
        """Spread the organization's period counters over ``stripes`` rows (1-64); the new count."""

    @operation("set_budget")
    def set_budget(
        self,
        organization_id: UuidLike,
        scope: str,
        scope_id: str | None,
        window: str,
        limit_credits: int | None,
        *,
        thresholds: Iterable[int] = (80, 100),
        now: datetime | None = None,
    ) -> None:
        """Set the budget of a scope id (``'*'``: every id of the scope without one) per
        ``day``, ``week`` or ``month`` in UTC; ``limit_credits`` None removes it. Scopes:
        ``organization`` (id None; day and week), ``project``, ``api_key``, ``end_user``."""

    @operation("set_budget_stripes")
    def set_budget_stripes(
        self,
        organization_id: UuidLike,
        scope: str,
        scope_id: str | None,
        window: str,
        stripes: Int4,
        *,
        now: datetime | None = None,
    ) -> int:
        """Spread the counters of a budget (``'*'``: of every id it governs) over ``stripes``
        rows (1-64), for a key or end user many sessions share; the new count."""

    @operation("declare_task_kind")
    def declare_task_kind(self, key: str, description: str | None = None) -> None:
        """Declare a task kind; idempotent."""

    # the price book

    @operation("set_price")
    def set_price(
        self,
        model: str,
        rates: JsonObject,
        *,
        effective_from: datetime | None = None,
        organization_id: UuidLike | None = None,
    ) -> int:
        """Add a price version of ``model`` (``'*'``: the fallback) from ``effective_from``
        (None: now), for the book or one organization; returns its id. ``rates``: per
        million tokens of each class (per call for ``requests``), as ints, ``Decimal`` or
        decimal strings (never a float), and optionally ``tiers``. The same rates at the
        same time return that version; other rates there are ``InvalidArgument``."""

    @operation("reprice", sql_names={"time_from": "p_from", "time_to": "p_to"})
    def reprice(
        self,
        model: str,
        time_from: datetime,
        time_to: datetime,
        version_id: int,
        *,
        apply: bool = False,
    ) -> list[Repricing]:
        """Reprice ``model``'s requests admitted in ``[time_from, time_to)`` that were
        priced from usage at price version ``version_id`` (an organization's own version:
        that organization's; a book version: those pinned to the book's): one row per
        organization. With ``apply``, one correction per changed request and every cost
        sum moved by it, in one transaction; credits stay as charged; repeating it
        changes nothing."""

    @operation("set_credit_rate")
    def set_credit_rate(
        self,
        nanos_per_credit: int,
        *,
        organization_id: UuidLike | None = None,
        effective_from: datetime | None = None,
    ) -> int:
        """What a credit is worth in nanos (10^-9) of the book's currency from
        ``effective_from`` (None: now), for the book or one organization; returns its id."""

    @operation("price_usage")
    def price_usage(
        self,
        model: str,
        usage: JsonObject,
        *,
        organization_id: UuidLike | None = None,
        at: datetime | None = None,
    ) -> PriceQuote:
        """What ``usage`` (a ``Usage`` or its dict) of ``model`` costs, exactly, and is
        charged in credits, at the prices in force for the organization (None: the
        book's) at ``at`` (None: now); writes nothing. ``PriceMissing`` without a price."""

    # requests

    @operation("admit_invocation")
    def admit(
        self,
        organization_id: UuidLike,
        estimate_credits: int | None,
        model: str,
        *,
        execution_id: UuidLike | None = None,
        invocation_id: UuidLike | None = None,
        now: datetime | None = None,
        project: str | None = None,
        api_key: str | None = None,
        end_user: str | None = None,
        input_tokens: int | None = None,
        max_output_tokens: int | None = None,
    ) -> Invocation:
        """Admit a request and place its hold on the allowance and on every budget of its
        ``project``, ``api_key`` (the key's id, never its secret) and ``end_user``
        (``AllowanceExhausted`` naming the first that does not fit). ``estimate_credits``
        None: the book prices the estimate from ``input_tokens`` and ``max_output_tokens``
        (``PriceMissing`` without a price for ``model``)."""

    admit_id = admit.one_column(
        "id", UUID, name="admit_id",
        doc="``admit``, returning only the request's id (one column instead of a whole row).",
    )  # fmt: skip

    @operation("note_refusal")
    def note_refusal(
        self,
        organization_id: UuidLike,
        scope: str,
        scope_id: str | None,
        window: str,
        window_start: date,
        *,
        now: datetime | None = None,
    ) -> bool:
        """Report a refusal (``AllowanceExhausted``) in a transaction of its own: the first
        report of each limit and window owes one ``llm.limit_reached`` notice (True); later
        ones write nothing (False). ``admit`` calls it on every refusal it raises."""

    @operation("mark_dispatched")
    def mark_dispatched(
        self, organization_id: UuidLike, invocation_id: UuidLike, *, now: datetime | None = None
    ) -> Invocation:
        """Mark an admitted request as sent to the provider (idempotent)."""

    @operation("settle_invocation")
    def settle(
        self,
        organization_id: UuidLike,
        invocation_id: UuidLike,
        credits: int,
        cents: int,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        now: datetime | None = None,
    ) -> Outcome:
        """Settle with measured usage; ``Outcome.SETTLED``, ``TRUED_UP`` (a recovered request
        under ``late_settlement = true_up``) or an ``ALREADY_*`` outcome."""

    @operation("fail_invocation")
    def fail(
        self,
        organization_id: UuidLike,
        invocation_id: UuidLike,
        error: str,
        *,
        credits: int = 0,
        cents: int = 0,
        now: datetime | None = None,
        usage: JsonObject | None = None,
    ) -> Outcome:
        """Fail a request, releasing its hold and charging optional partial usage
        (``credits`` and ``cents``, or ``usage`` priced by the book at the request's pinned
        price); ``Outcome.FAILED``, ``TRUED_UP`` (a recovered request under
        ``late_settlement = true_up``: the books move to the partial charge) or an
        ``ALREADY_*`` outcome."""

    @operation("settle_usage")
    def settle_usage(
        self,
        organization_id: UuidLike,
        invocation_id: UuidLike,
        usage: JsonObject,
        *,
        now: datetime | None = None,
    ) -> Outcome:
        """Settle with the provider's measured ``usage`` (a ``Usage`` or its dict), priced
        exactly at the version and credit rate the admission pinned; the same outcomes as
        ``settle`` (``PriceMissing`` for a request admitted with no price)."""

    # tasks

    @operation("open_execution")
    def open_execution(
        self,
        organization_id: UuidLike,
        task_key: str,
        *,
        subject_type: str | None = None,
        subject_id: str | None = None,
        replay_key: str | None = None,
        now: datetime | None = None,
    ) -> Execution:
        """Open a task (or, for a known replay key, return the earlier one with replayed=True)."""

    @operation("close_execution")
    def close_execution(
        self,
        organization_id: UuidLike,
        execution_id: UuidLike,
        outcome: CloseOutcome | str,
        *,
        error: str | None = None,
        now: datetime | None = None,
    ) -> bool:
        """Close a running task as completed or failed; False when it was no longer running."""

    # recovery

    @operation("reconcile_org")
    def reconcile_org(
        self, organization_id: UuidLike, *, now: datetime | None = None, batch: Int4 | None = None
    ) -> OrgSweep:
        """Sweep one organization in one transaction."""

    @operation("run_reconciliation", procedure=True)
    def run_reconciliation(
        self, *, now: datetime | None = None, batch: Int4 | None = None
    ) -> ReconciliationRun | None:
        """Run one pass (``CALL llm.run_reconciliation``) and return the run row it recorded.

        The procedure commits after each organization, so the connection must be
        idle; it is switched to autocommit for the call and back. When two passes
        overlap, the row returned is the newest one that finished during this call
        (a skipped pass records its own row)."""

    @operation("reconciliation_health")
    def health(self, *, now: datetime | None = None) -> Health:
        """The missing-run alarm: ok, late, never or failing."""

    @operation("schedule_reconciliation")
    def schedule_reconciliation(self, schedule: str = "0 * * * *") -> int:
        """Schedule the pg_cron job (``CronNotInstalled`` without pg_cron); its job id."""

    @operation("unschedule_reconciliation")
    def unschedule_reconciliation(self) -> bool:
        """Remove the pg_cron job; False when there was none."""

    # notices

    @operation("claim_notices")
    def claim_notices(self, *, limit: Int4 = 50, now: datetime | None = None) -> list[Notice]:
        """Claim up to ``limit`` due notices (owed -> sending)."""

    @operation("complete_notice")
    def complete_notice(
        self,
        organization_id: UuidLike,
        notice_id: UuidLike,
        claim_token: UuidLike,
        *,
        now: datetime | None = None,
    ) -> bool:
        """Mark a claimed notice sent; False, changing nothing, unless it is still claimed
        under ``claim_token`` (``Notice.claim_token``): the claim was lost."""

    @operation("fail_notice")
    def fail_notice(
        self,
        organization_id: UuidLike,
        notice_id: UuidLike,
        claim_token: UuidLike,
        error: str,
        *,
        now: datetime | None = None,
    ) -> bool:
        """Return a claimed notice to owed with its error and a backoff; False, changing
        nothing, when the claim under ``claim_token`` was lost."""

    @operation("release_notice")
    def release_notice(
        self,
        organization_id: UuidLike,
        notice_id: UuidLike,
        claim_token: UuidLike,
        *,
        now: datetime | None = None,
    ) -> bool:
        """Give a claimed notice back unsent (owed, due at once, no attempt counted);
        False, changing nothing, when the claim under ``claim_token`` was lost."""

    @operation("rearm_notices")
    def rearm_notices(self, *, now: datetime | None = None) -> int:
        """Make notices owed again whose claim expired; how many."""

    # reporting and checks

    @operation("rebuild_daily_usage", sql_names={"day_from": "p_from", "day_to": "p_to"})
    def rebuild_daily_usage(self, day_from: date, day_to: date) -> int:
        """Recompute ``llm.daily_usage`` for those UTC days; rows written."""

    @operation("check_daily_usage", sql_names={"day_from": "p_from", "day_to": "p_to"})
    def check_daily_usage(self, day_from: date, day_to: date) -> list[DailyUsageFinding]:
        """Each organization's day in that range whose ``daily_usage`` differs from its
        requests, with both sides; empty when they agree (with no traffic after a pass)."""

    @operation("check_invariants")
    def check_invariants(self) -> list[InvariantViolation]:
        """Every violated invariant; empty when the books are right."""

    # the books' reads (sql/81_report.sql, 82_books.sql): rows as dicts (llm_db.rows);
    # ``organization_ids`` None: every organization

    @operation("report_periods", sql_names={"day_from": "p_from", "day_to": "p_to"})
    def report_periods(
        self, day_from: date, day_to: date, organization_ids: UuidArray | None = None
    ) -> list[PeriodUsage]:
        """The periods overlapping those UTC days: allowance, used, held, cents, cost."""

    @operation("report_daily_usage", sql_names={"day_from": "p_from", "day_to": "p_to"})
    def report_daily_usage(
        self, day_from: date, day_to: date, organization_ids: UuidArray | None = None
    ) -> list[DailyUsage]:
        """The ``llm.daily_usage`` rows of those UTC days, newest first, with their cost."""

    @operation("report_costs", sql_names={"day_from": "p_from", "day_to": "p_to"})
    def report_costs(
        self, day_from: date, day_to: date, organization_ids: UuidArray | None = None
    ) -> list[CostByModel]:
        """What those UTC days cost per organization and model, in exact nanos of the
        book's currency, with the requests that have no cost or were priced by the
        fallback; dearest first."""

    @operation("report_open_holds")
    def report_open_holds(
        self, organization_ids: UuidArray | None = None, *, now: datetime | None = None
    ) -> list[OpenHolds]:
        """Per organization, the requests still holding credits, and how many are past
        the recovery window."""

    @operation("report_tasks", sql_names={"day_from": "p_from"})
    def report_tasks(self, day_from: date, organization_ids: UuidArray | None = None) -> list[TasksByStatus]:
        """Per organization and status, the tasks started since that UTC day and every
        running one."""

    @operation("report_scope_usage", sql_names={"day_from": "p_from", "day_to": "p_to"})
    def report_scope_usage(
        self, scope: str, day_from: date, day_to: date, organization_ids: UuidArray | None = None
    ) -> list[ScopeUsage]:
        """Usage per id of ``scope`` (project, api_key, end_user) of the requests admitted
        in those UTC days (``InvalidArgument`` for another scope)."""

    @operation("report_budgets_near_limit")
    def report_budgets_near_limit(
        self,
        scope: str | None = None,
        organization_ids: UuidArray | None = None,
        *,
        now: datetime | None = None,
    ) -> list[BudgetNearLimit]:
        """The current windows' budget counters at or past their first threshold."""

    @operation("books_snapshot")
    def books_snapshot(
        self, organization_ids: UuidArray | None = None, *, now: datetime | None = None
    ) -> BooksSnapshot:
        """What the next pass would act on: open and stale requests, tasks, findings, notices."""

    @operation("stale_by_organization_status")
    def stale_by_organization_status(self, *, now: datetime | None = None) -> list[StaleByStatus]:
        """Open requests past the recovery window, and their holds, by organization status."""

    @operation("books_history")
    def books_history(self, organization_ids: UuidArray) -> BooksHistory:
        """Requests recovered, past-window alerts, tasks abandoned, notices sent, ever."""

    @operation("organization_totals")
    def organization_totals(self, organization_ids: UuidArray) -> list[OrganizationTotals]:
        """Per organization: allowance, sums over its periods, notices."""

    @operation("last_run")
    def last_run(self, *, now: datetime | None = None) -> LastRun | None:
        """The newest finished pass not skipped, its duration and age; None before any."""

    @operation("pass_progress")
    def pass_progress(self, since: datetime) -> PassProgress:
        """The organizations a pass visits, and how many the pass running since ``since`` has."""

    @operation("metrics")
    def metrics(self, *, now: datetime | None = None) -> list[MetricSeries]:
        """Every series of the Prometheus exposition: metric, labels, value."""

    @operation("distribute")
    def distribute(self, shard_count: Int4 | None = None) -> str:
        """Shard the schema with Citus (``CitusNotInstalled`` without it); what it did."""


def operations() -> dict[str, Operation]:
    """The table by name."""
    return {name: op for name, op in vars(Operations).items() if isinstance(op, Operation)}


# ----------------------------------------------------------- task contexts

#: The operations a task context (``llm_db.executions``) offers as request helpers: the
#: client's, with the context's organization and, where the operation takes one, its task
#: (``execution_id``) filled in, and ``now`` left None read from its clock.
TASK_HELPERS = ("admit", "admit_id", "mark_dispatched", "settle", "settle_usage", "fail")

#: The scope ids a request helper takes from its wrapper when the call names none.
SCOPE_IDS = ("project", "api_key", "end_user")


