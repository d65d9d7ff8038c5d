"""SQLSTATE -> exception classes (docs/contract.md "Errors").

Every error the `llm` schema raises carries an SQLSTATE from docs/contract.md; the
driver maps that code, and only that code, to a class below. Message, DETAIL
and HINT are kept as attributes for people to read; no code should parse them.
One exception, written down as a format in docs/contract.md "Errors": a budget's
refusal (LL001) carries its scope id as the DETAIL's first line, which
``AllowanceExhausted.scope_id`` reads.

    try:
        llm.admit(org, 500, "gpt-x", end_user="u-42")
    except AllowanceExhausted as e:
        log.info("over the %s %s budget of %s: %s", e.window, e.scope, e.scope_id, e.detail)

The mapped exception is raised ``from`` the psycopg error, so ``__cause__``
still holds the original (with its full ``diag``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, Self

import psycopg

__all__ = [
    "AllowanceExhausted",
    "CitusNotInstalled",
    "CronNotInstalled",
    "CrossOrganizationReference",
    "IdempotencyConflict",
    "InvalidArgument",
    "InvalidTransition",
    "LlmError",
    "NestedExecution",
    "OrganizationNotOperational",
    "PriceMissing",
    "SumLimitExceeded",
    "UnknownExecution",
    "UnknownInvocation",
    "UnknownOrganization",
    "UnknownTaskKind",
    "WindowRetired",
    "mapped_errors",
    "sent",
    "translate",
]


class LlmError(Exception):
    """Base of every llm-db error.

    ``sqlstate`` is the contract; ``message``, ``detail`` and ``hint`` are the
    server's words (from psycopg's ``e.diag``), for logs and people.
    """

    #: the SQLSTATE this class stands for (None for errors raised by the driver)
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        sqlstate: str | None = None,
        detail: str | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate if sqlstate is not None else self.code
        self.detail = detail
        self.hint = hint

    @classmethod
    def _from_diag(cls, sqlstate: str, diag: psycopg.errors.Diagnostic, fallback: str) -> Self:
        """This error as the server reported it (``fallback``: the message when the
        diagnostics have none)."""
        return cls(diag.message_primary or fallback, sqlstate=sqlstate,
                   detail=diag.message_detail, hint=diag.message_hint)  # fmt: skip

    def __str__(self) -> str:
        parts = [self.message]
        if self.detail:
            parts.append(f"DETAIL: {self.detail}")
        if self.hint:
            parts.append(f"HINT: {self.hint}")
        return "\n".join(parts)


def _refused_by(diag: psycopg.errors.Diagnostic) -> tuple[str | None, str | None, str | None] | None:
    """(TABLE, scope, window) of a refusal naming a budget or the allowance (LL001, LL012),
    or None. From the diagnostic fields where they arrived; a Citus coordinator re-raises a
    worker's error with its message, DETAIL and HINT only, so there they come from the
    DETAIL (docs/contract.md "Errors"): ``allowance=...`` for the allowance, and a budget's
    second line ``scope=<scope> window=<window> ...``."""
    if diag.schema_name == "llm" and diag.table_name in ("periods", "budgets"):
        return diag.table_name, diag.constraint_name, diag.column_name
    if diag.schema_name is not None or not diag.message_detail:
        return None
    lines = diag.message_detail.split("\n")
    if lines[0].startswith("allowance="):
        return "periods", "organization", "month"
    if len(lines) > 1:
        fields = dict(f.split("=", 1) for f in lines[1].split() if "=" in f)
        if "scope" in fields and "window" in fields:
            return "budgets", fields["scope"], fields["window"]
    return None


class _NamedRefusal(LlmError):
    """A refusal that names the allowance or the budget it is by (LL001, LL012):
    ``scope``, ``scope_id`` and ``window``, read as ``AllowanceExhausted`` says."""

    def __init__(
        self,
        message: str,
        *,
        scope: str | None = None,
        scope_id: str | None = None,
        window: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(message, **kwargs)
        self.scope = scope
        self.scope_id = scope_id
        self.window = window

    @classmethod
    def _from_diag(cls, sqlstate: str, diag: psycopg.errors.Diagnostic, fallback: str) -> Self:
        error = super()._from_diag(sqlstate, diag, fallback)
        _, error.scope, error.window = _refused_by(diag) or (None, None, None)
        if error.scope not in (None, "organization") and error.detail:
            # an id has no control character, so no line break: the line is the id
            error.scope_id = error.detail.split("\n", 1)[0]
        return error


class AllowanceExhausted(_NamedRefusal):
    """LL001: admission would take used + held + estimate over the allowance or over a
    budget that applies to the request; nothing was held anywhere.

    ``scope``, ``scope_id`` and ``window`` name the one that refused (when several do,
    the first in the order of docs/contract.md "Errors"):

    - the monthly allowance: ``("organization", None, "month")``;
    - a budget: its scope (``organization``, ``project``, ``api_key``, ``end_user``),
      the request's real id in that scope (never ``'*'``; None for the organization's
      day and week budgets, as ``set_budget`` spells them) and its window (``day``,
      ``week``, ``month``);
    - a server older than budgets, which names nothing: all three None.

    The scope and window come from the error's diagnostic fields (``TABLE`` ``periods``
    or ``budgets``, ``CONSTRAINT`` the scope, ``COLUMN`` the window; under Citus, which
    drops them, from the DETAIL), the id from the DETAIL's first line. The figures of the
    refusal come from the DETAIL, a documented format (docs/contract.md "Errors"):
    ``limit_credits``, ``used_credits``, ``held_credits``, ``estimate_credits`` (ints),
    ``window_start`` (a date) and ``resets_at`` (the window's end, a UTC datetime); so
    "120 credits left, resets at midnight UTC" is ``limit - used - held`` and
    ``resets_at``. All None when the DETAIL has no figures (a server older than 0.4.0's
    format, or a refusal raised by hand).
    """

    code = "LL001"

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.limit_credits: int | None = None
        self.used_credits: int | None = None
        self.held_credits: int | None = None
        self.estimate_credits: int | None = None
        self.window_start: date | None = None
        self.resets_at: datetime | None = None

    @classmethod
    def _from_diag(cls, sqlstate: str, diag: psycopg.errors.Diagnostic, fallback: str) -> Self:
        error = super()._from_diag(sqlstate, diag, fallback)
        table = (_refused_by(diag) or (None,))[0]
        figures = _refusal_figures(table, error.window, error.detail) if table else None
        if figures is not None:
            (error.limit_credits, error.used_credits, error.held_credits, error.estimate_credits,
             error.window_start, error.resets_at) = figures  # fmt: skip
        return error


def _window_end(window: str | None, start: date) -> date:
    """The day after a UTC window's last day (llm._window_end)."""
    if window == "day":
        return start + timedelta(days=1)
    if window == "week":
        return start + timedelta(days=7)
    return (start.replace(day=28) + timedelta(days=4)).replace(day=1)


def _refusal_figures(
    table: str | None, window: str | None, detail: str | None
) -> tuple[int, int, int, int, date, datetime] | None:
    """(limit, used, held, estimate, window start, resets at) from a refusal's DETAIL: the
    allowance's one line ``allowance=<n> used=<n> held=<n> estimate=<n> period=<date>``,
    a budget's second line ``scope=… window=… window_start=<date> limit=<n> used=<n>
    held=<n> estimate=<n>`` (docs/contract.md "Errors"); None if they are not there."""
    if not detail:
        return None
    lines = detail.split("\n")
    line = lines[0] if table == "periods" else lines[1] if len(lines) > 1 else ""
    fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
    limit, start = ("allowance", "period") if table == "periods" else ("limit", "window_start")
    try:
        begins = date.fromisoformat(fields[start])
        return (int(fields[limit]), int(fields["used"]), int(fields["held"]), int(fields["estimate"]),
                begins, datetime.combine(_window_end(window, begins), time(), UTC))  # fmt: skip
    except (KeyError, ValueError):
        return None


class UnknownOrganization(LlmError):
    """LL002: no organization with that id."""

    code = "LL002"


class OrganizationNotOperational(LlmError):
    """LL003: the organization is suspended or closed."""

    code = "LL003"


class UnknownTaskKind(LlmError):
    """LL004: the task key was never declared (``declare_task_kind``)."""

    code = "LL004"


class UnknownInvocation(LlmError):
    """LL005: no such invocation in that organization."""

    code = "LL005"


class UnknownExecution(LlmError):
    """LL006: no such execution in that organization."""

    code = "LL006"


class IdempotencyConflict(LlmError):
    """LL007: an invocation id or replay key reused with different arguments."""

    code = "LL007"


class CrossOrganizationReference(LlmError):
    """LL008: the execution belongs to another organization."""

    code = "LL008"


class InvalidTransition(LlmError):
    """LL009: the requested state change is not allowed from the current state."""

    code = "LL009"


class CronNotInstalled(LlmError):
    """LL010: pg_cron is not installed in this database (see ``hint``)."""

    code = "LL010"


class CitusNotInstalled(LlmError):
    """LL011: the citus extension is not installed in this database."""

    code = "LL011"


class WindowRetired(_NamedRefusal):
    """LL012: admission would create the counter of a budget window that ended on or
    before the organization's retention horizon (docs/architecture.md "Budgets",
    Retention): its counter may have been purged, so the window is not admitted
    again; nothing was held anywhere.

    ``scope``, ``scope_id`` and ``window`` name the budget, read as for
    ``AllowanceExhausted`` (the DETAIL's first line is the id)."""

    code = "LL012"


class SumLimitExceeded(LlmError):
    """LL013: the call would take a sum the books keep past the sum limit, 10^18 of
    its unit (docs/architecture.md "Sum limits"): a period's used + held credits or
    used cents, or a budget counter's; nothing was written.

    ``table`` and ``column`` name the sum (``periods`` or ``budget_counters``, and
    ``held_credits``, ``used_credits`` or ``used_cents``)."""

    code = "LL013"

    def __init__(
        self, message: str, *, table: str | None = None, column: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(message, **kwargs)
        self.table = table
        self.column = column

    @classmethod
    def _from_diag(cls, sqlstate: str, diag: psycopg.errors.Diagnostic, fallback: str) -> Self:
        error = super()._from_diag(sqlstate, diag, fallback)
        error.table, error.column = diag.table_name, diag.column_name
        return error


class PriceMissing(LlmError):
    """LL014: no price version (nor the fallback ``'*'``) or no credit rate is in force
    for the model and organization at that time: an unknown model is never priced at
    0 (docs/architecture.md "The price book"); nothing was written. The DETAIL is
    ``model=<model> organization=<uuid or -> at=<time>``."""

    code = "LL014"


class InvalidArgument(LlmError):
    """22023: a NULL, negative, empty or out-of-range argument; nothing was written."""

    code = "22023"


class NestedExecution(LlmError):
    """Raised by the task wrapper, not by SQL: a task was opened inside another task's body.

    STATE-PFM-LLM-002 absent -> running guard: "no execution is already attached".
    """


_BY_SQLSTATE: dict[str, type[LlmError]] = {
    cls.code: cls
    for cls in (
        AllowanceExhausted,
        UnknownOrganization,
        OrganizationNotOperational,
        UnknownTaskKind,
        UnknownInvocation,
        UnknownExecution,
        IdempotencyConflict,
        CrossOrganizationReference,
        InvalidTransition,
        CronNotInstalled,
        CitusNotInstalled,
        WindowRetired,
        SumLimitExceeded,
        PriceMissing,
        InvalidArgument,
    )
    if cls.code is not None
}


def translate(exc: psycopg.Error) -> Exception:
    """The llm-db exception for a psycopg error, chosen by SQLSTATE alone.

    Codes of the ``LL`` class this driver does not know yet become a plain
    ``LlmError``; anything else (connection loss, serialization failure, ...)
    is returned unchanged, so the caller re-raises the psycopg error itself.
    The result's ``__cause__`` is left to the caller (``raise ... from exc``).
    """
    sqlstate = exc.sqlstate
    if sqlstate is None:
        return exc
    cls = _BY_SQLSTATE.get(sqlstate)
    if cls is None:
        if not sqlstate.startswith("LL"):
            return exc
        cls = LlmError
    return cls._from_diag(sqlstate, exc.diag, str(exc))


@contextlib.contextmanager
def mapped_errors() -> Iterator[None]:
    """Re-raise a psycopg error as its llm-db exception, ``from`` the original.

    Usable as ``with mapped_errors():`` (also inside ``async def``) or as a
    decorator of a plain function. Unmapped errors propagate untouched.
    """
    try:
        yield
    except psycopg.Error as exc:
        mapped = translate(exc)
        if mapped is exc:
            raise
        raise mapped from exc


@contextlib.contextmanager
def sent() -> Iterator[None]:
    """Around the statement's ``execute``: a value psycopg cannot send (a NUL in a text
    argument, which no PostgreSQL text can hold) is refused before anything reaches the
    server, as ``psycopg.DataError`` with no SQLSTATE; raise it as the ``InvalidArgument``
    (22023) the server gives every other malformed argument. Nothing was written.

    Only the sending side: a ``DataError`` without SQLSTATE while *reading* a result (a
    value Python cannot hold) comes after the statement ran, and is no bad argument."""
    try:
        yield
    except psycopg.DataError as exc:
        raise unsendable(exc) from exc


def unsendable(exc: psycopg.DataError) -> Exception:
    """What ``sent`` raises for a ``DataError`` of ``execute``: ``InvalidArgument`` for one
    psycopg raised before sending (no SQLSTATE), else the error itself."""
    if exc.sqlstate is not None:
        return exc
    return InvalidArgument(f"llm: invalid argument: {exc}", sqlstate=InvalidArgument.code)
