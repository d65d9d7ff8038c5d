"""The driver's operations, each spelled once: name, SQL, parameters, result.

``Operations`` is the table. Each entry is a stub method whose signature is
the operation's Python signature and whose docstring is its documentation;
``@operation`` reads the stub once, at import, and builds from it the SQL
statement (``SELECT … FROM llm.<routine>(p_<name> => %(name)s::<type>, …)``,
the parameter types read from the annotations) and the mapping of the rows to
the result. ``Llm`` and ``AsyncLlm`` (``llm_db.client``) inherit the table
and differ only in how a statement runs; the task contexts
(``llm_db.executions``) take their request helpers from it with the
organization, the task and the clock filled in.

A new SQL routine becomes a driver method by one entry here;
tests/test_driver.py fails while a public routine of schema ``llm`` has no
entry, or an entry names no routine.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import types
import typing
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from datetime import date, datetime
from typing import Annotated, Any, Generic, Literal, ParamSpec, Protocol, TypeVar, overload
from uuid import UUID

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
    ReconciliationRun,
    RecoveryCharge,
)
from llm_db.rows import (
    BooksHistory,
    BooksSnapshot,
    BudgetNearLimit,
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

__all__ = ["Call", "Operation", "Operations", "Scoped", "operations", "scoped_method"]

P = ParamSpec("P")
T = TypeVar("T")
U = TypeVar("U")
Row = dict[str, Any]
UuidLike = UUID | str

#: an ``int`` passed as SQL ``integer`` (every other ``int`` is ``bigint``)
Int4 = Annotated[int, "integer"]
#: organizations passed as SQL ``uuid[]`` (the reads' filter; None: every organization)
UuidArray = Annotated[Sequence[UuidLike], "uuid[]"]


# ----------------------------------------------------------- what a call is


@dataclasses.dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One statement, its named parameters, and how its rows become the result.

    ``procedure``: a ``CALL`` of a procedure that commits on its own, so it runs on
    an idle connection in autocommit; its result comes from ``RUN_RECORDED_SINCE``
    (the run row recorded since the server clock read just before the ``CALL``).
    """

    sql: str
    params: Mapping[str, Any]
    result: Callable[[list[Row]], T]
    procedure: bool = False



# ----------------------------------------------------------- results


def _from_row(model: Any) -> Callable[[Row], Any]:
    """A model's ``from_row``; a ``TypedDict`` (``llm_db.rows``) keeps the row a dict."""
    return model.from_row if hasattr(model, "from_row") else dict


def _one(model: Any) -> Callable[[list[Row]], Any]:
    build = _from_row(model)
    return lambda rows: build(rows[0])


def _many(model: Any) -> Callable[[list[Row]], Any]:
    build = _from_row(model)
    return lambda rows: [build(row) for row in rows]


def _maybe_one(model: Any) -> Callable[[list[Row]], Any]:
    build = _from_row(model)
    return lambda rows: build(rows[0]) if rows else None


def _value(kind: type) -> Callable[[list[Row]], Any]:
    def pick(rows: list[Row]) -> Any:
        value = rows[0]["value"]
        return value if type(value) is kind or value is None else kind(value)

    return pick


def _nothing(rows: list[Row]) -> None:
    return None


def _result_of(hint: Any) -> tuple[Callable[[list[Row]], Any], bool]:
    """How rows become a result of type ``hint``, and whether the routine returns rows
    (a composite or a set: ``SELECT <columns> FROM``) rather than one value (``SELECT llm.f() AS value``)."""
    if hint is None or hint is type(None):
        return _nothing, False
    origin = typing.get_origin(hint)
    if origin is list:
        return _many(typing.get_args(hint)[0]), True
    if origin in (types.UnionType, typing.Union):  # ``Model | None``: a row that may be absent
        (model,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _maybe_one(model), True
    if hasattr(hint, "from_row") or typing.is_typeddict(hint):
        return _one(hint), True
    return _value(hint), False


def _columns_of(hint: Any) -> tuple[str, ...]:
    """The columns a row result of type ``hint`` reads: its model's fields, by name."""
    # ``list[Model]`` and ``Model | None`` read Model's columns
    wrapped = typing.get_origin(hint) in (list, types.UnionType, typing.Union)
    (model,) = [a for a in typing.get_args(hint) if a is not type(None)] if wrapped else [hint]
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


def _convert(hint: Any) -> Callable[[Any], Any] | None:
    """Iterables go to the server as lists (psycopg adapts a list, not a generator)."""
    union = typing.get_origin(hint) in (types.UnionType, typing.Union)
    for member in typing.get_args(hint) if union else (hint,):
        if typing.get_origin(member) is Annotated:  # ``UuidArray``: the sequence it annotates
            member = typing.get_args(member)[0]
        origin = typing.get_origin(member)
        if origin is not None and issubclass(origin, Iterable):
            return lambda v: list(v) if v is not None else None
    return None


# ----------------------------------------------------------- one operation


class Operation(Generic[P, T]):
    """One entry of the table: built from its stub method by ``@operation``."""

    def __init__(
        self,
        stub: Callable[..., T],
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
        #: the signature a caller sees (bound: without ``self``)
        self.signature = signature.replace(parameters=parameters)
        self.names = tuple(p.name for p in parameters)
        self.positional = tuple(p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD)
        self.required = frozenset(p.name for p in parameters if p.default is p.empty)
        self.defaults = {p.name: p.default for p in parameters if p.default is not p.empty}
        self.converters = {n: c for n in self.names if (c := _convert(hints[n])) is not None}

        names = sql_names or {}
        arguments = ",\n    ".join(
            f"{names.get(n, 'p_' + n)} => %({n})s::{_sql_type(hints[n])}" for n in self.names
        )
        self.call = call = f"llm.{routine}(\n    {arguments})" if arguments else f"llm.{routine}()"
        self.result, returns_rows = _result_of(hints["return"])
        if procedure:
            self.sql = f"CALL {call}"
        elif returns_rows:
            # Named columns, never ``*``: a statement prepared on the server keeps its
            # result when the routine's type gains a column (issue 22 item 3).
            self.sql = f"SELECT {', '.join(_columns_of(hints['return']))} FROM {call}"
        else:
            self.sql = f"SELECT {call} AS value"
        self.procedure = procedure

    def one_column(self, column: str, kind: type[U], *, name: str, doc: str) -> Operation[P, U]:
        """This operation under another name, returning only one column of its row (as
        a value of ``kind``): the same signature, parameters and routine."""
        narrow: Operation[P, U] = copy.copy(self)  # type: ignore[assignment]
        narrow.name, narrow.doc = name, doc
        narrow.signature = self.signature.replace(return_annotation=kind.__name__)  # as the stubs spell it
        narrow.sql = f"SELECT r.{column} AS value FROM {self.call} AS r"
        narrow.result = _value(kind)
        return narrow

    def __repr__(self) -> str:
        return f"<operation {self.name}{self.signature} -> llm.{self.routine}>"

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any], preset: Mapping[str, Any] = {}) -> Call[T]:  # noqa: B006
        """The call of this operation with these arguments (``preset``: values the caller
        does not pass, such as a task context's organization)."""
        positional = [n for n in self.positional if n not in preset] if preset else self.positional
        if len(args) > len(positional):
            raise TypeError(f"{self.name}() takes {len(positional)} positional arguments but {len(args)} were given")
        params = {**self.defaults, **preset, **dict(zip(positional, args, strict=False))}
        for name, value in kwargs.items():
            if name not in self.names or name in preset:
                raise TypeError(f"{self.name}() got an unexpected keyword argument {name!r}")
            if name in positional[: len(args)]:
                raise TypeError(f"{self.name}() got multiple values for argument {name!r}")
            params[name] = value
        missing = self.required.difference(params)
        if missing:
            raise TypeError(f"{self.name}() missing required arguments: {', '.join(sorted(missing))}")
        for name, convert in self.converters.items():
            params[name] = convert(params[name])
        return Call(self.sql, params, self.result, self.procedure)

    # Llm.admit(...) returns an Invocation, AsyncLlm.admit(...) an awaitable of one.
    @overload
    def __get__(self, client: None, owner: type | None = None) -> Operation[P, T]: ...
    @overload
    def __get__(self, client: AwaitedClient, owner: type | None = None) -> Callable[P, Coroutine[Any, Any, T]]: ...
    @overload
    def __get__(self, client: Operations, owner: type | None = None) -> Callable[P, T]: ...
    def __get__(self, client: Any, owner: type | None = None) -> Any:
        if client is None:
            return self
        return _method(self, client._asynchronous).__get__(client, owner)


class AwaitedClient(Protocol):
    """A client whose methods are awaited (``llm_db.client.AsyncLlm``), as the typing of
    ``Operation.__get__`` knows it: by its flag, so that this table imports no client
    (the clients import the table)."""

    _asynchronous: Literal[True]


def _method(op: Operation[Any, Any], asynchronous: bool) -> Callable[..., Any]:
    """The method a client class gets for ``op`` (made once per class and operation)."""
    cached = _METHODS.get((op, asynchronous))
    if cached is not None:
        return cached
    bind = op.bind
    if asynchronous:

        async def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await self._run(bind(args, kwargs))
    else:

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return self._run(bind(args, kwargs))

    method.__name__ = method.__qualname__ = op.name
    method.__doc__ = op.doc
    method.__signature__ = op.signature.replace(  # type: ignore[attr-defined]
        parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY), *op.signature.parameters.values()]
    )
    _METHODS[op, asynchronous] = method
    return method


_METHODS: dict[tuple[Operation[Any, Any], bool], Callable[..., Any]] = {}


def operation(
    routine: str, *, sql_names: Mapping[str, str] | None = None, procedure: bool = False
) -> Callable[[Callable[P, T]], Operation[P, T]]:
    """Make the stub below an entry of the table: it calls ``llm.<routine>``.

    ``sql_names``: SQL parameter names that are not ``p_`` + the Python name.
    ``procedure``: a ``CALL``. (``Operation.one_column``: an entry returning one
    column of another's row.)"""

    def build(stub: Callable[..., T]) -> Operation[P, T]:
        return Operation(stub, routine=routine, sql_names=sql_names, procedure=procedure)

    return build  # type: ignore[return-value]


class Operations:
    """The table: every operation of the driver, in the order of docs/contract.md.

    Subclasses set ``_asynchronous`` and ``_run(call)``; each stub becomes a method
    that builds its ``Call`` and runs it. Every ``now`` is the clock the SQL uses
    (a timezone-aware datetime; None means the server's ``now()``).
    """

    _asynchronous = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for op in operations().values():  # plain methods: no descriptor on each call
            setattr(cls, op.name, _method(op, cls._asynchronous))

    def _run(self, call: Call[T]) -> T | Awaitable[T]:  # pragma: no cover - each client has its own
        raise NotImplementedError

    # organizations and catalog

    @operation("upsert_organization")
    def upsert_organization(
        self,
        organization_id: UuidLike,
        name: str,
        monthly_allowance_credits: int | None,
        *,
        status: OrganizationStatus | str = OrganizationStatus.OPERATIONAL,
        notice_thresholds: Iterable[int] = (80, 100),
        now: datetime | None = None,
    ) -> Organization:
        """Create or update an organization (allowance None = unlimited)."""

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

    @operation("declare_task_kind")
    def declare_task_kind(self, key: str, description: str | None = None) -> None:
        """Declare a task kind; idempotent."""

    # requests

    @operation("admit_invocation")
    def admit(
        self,
        organization_id: UuidLike,
        estimate_credits: int,
        model: str,
        *,
        execution_id: UuidLike | None = None,
        invocation_id: UuidLike | None = None,
        now: datetime | None = None,
        project: str | None = None,
        api_key: str | None = None,
        end_user: str | None = None,
    ) -> Invocation:
        """Admit a request and place its hold on the allowance and on every budget of its
        ``project``, ``api_key`` (the key's id, never its secret) and ``end_user``
        (``AllowanceExhausted`` naming the first that does not fit)."""

    admit_id = admit.one_column(
        "id", UUID, name="admit_id",
        doc="``admit``, returning only the request's id (one column instead of a whole row).",
    )  # fmt: skip

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
    ) -> Outcome:
        """Fail a request, releasing its hold and charging optional partial usage;
        ``Outcome.FAILED``, ``TRUED_UP`` (a recovered request under ``late_settlement =
        true_up``: the books move to the partial charge) or an ``ALREADY_*`` outcome."""

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
        """The periods overlapping those UTC days: allowance, used, held, cents."""

    @operation("report_daily_usage", sql_names={"day_from": "p_from", "day_to": "p_to"})
    def report_daily_usage(
        self, day_from: date, day_to: date, organization_ids: UuidArray | None = None
    ) -> list[DailyUsage]:
        """The ``llm.daily_usage`` rows of those UTC days, newest first."""

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


def operations() -> dict[str, Operation[Any, Any]]:
    """The table by name."""
    return {name: op for name, op in vars(Operations).items() if isinstance(op, Operation)}


# ----------------------------------------------------------- task contexts


class Scoped(Generic[T]):
    """A task context's helper for an operation: the context fills in its organization,
    its task (where the operation takes ``execution_id``), for ``now`` left None, its
    clock, and for a scope id the call does not name (``project``, ``api_key``,
    ``end_user``), the wrapper's default (issue 23). ``ctx.admit(500, "gpt-x")`` is
    ``client.admit(org, 500, "gpt-x", execution_id=task, now=clock(), **defaults)``."""

    FILLED = ("organization_id", "execution_id")

    def __init__(self, op: Operation[Any, T]) -> None:
        self.op = op
        self.name = op.name
        kept = [p for p in op.signature.parameters.values() if p.name not in self.FILLED]
        self.signature = op.signature.replace(parameters=kept)

    @overload
    def __get__(self, ctx: None, owner: type | None = None) -> Scoped[T]: ...
    @overload
    def __get__(self, ctx: Any, owner: type | None = None) -> Callable[..., T]: ...
    def __get__(self, ctx: Any, owner: type | None = None) -> Any:
        if ctx is None:
            return self
        return scoped_method(self, ctx._asynchronous).__get__(ctx, owner)


def scoped_method(scoped: Scoped[Any], asynchronous: bool) -> Callable[..., Any]:
    cached = _METHODS.get((scoped, asynchronous))  # type: ignore[arg-type]
    if cached is not None:
        return cached
    op = scoped.op
    links_task = "execution_id" in op.names

    def call(ctx: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Call[Any]:
        preset = {"organization_id": ctx.organization_id}
        if links_task:
            preset["execution_id"] = ctx.execution_id
        if "now" in op.names and kwargs.get("now") is None:
            kwargs["now"] = ctx._now(None)
        for name, value in ctx.scopes.items():  # a value given on the call wins, None too
            if name in op.names:
                kwargs.setdefault(name, value)
        return op.bind(args, kwargs, preset)

    if asynchronous:

        async def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await self.client._run(call(self, args, kwargs))
    else:

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return self.client._run(call(self, args, kwargs))

    method.__name__ = method.__qualname__ = scoped.name
    method.__doc__ = op.doc + "\n\nOf this task's organization" + (", linked to this task." if links_task else ".")
    method.__signature__ = scoped.signature.replace(  # type: ignore[attr-defined]
        parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY), *scoped.signature.parameters.values()]
    )
    _METHODS[scoped, asynchronous] = method  # type: ignore[index]
    return method
