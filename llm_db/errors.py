"""SQLSTATE -> exception classes (docs/design.md "Errors").

Every error the `llm` schema raises carries an SQLSTATE from docs/design.md; the
driver maps that code, and only that code, to a class below. Message, DETAIL
and HINT are kept as attributes for people to read; no code should parse them.

    try:
        llm.admit(org, 500, "gpt-x")
    except AllowanceExhausted as e:
        log.info("over allowance: %s", e.detail)

The mapped exception is raised ``from`` the psycopg error, so ``__cause__``
still holds the original (with its full ``diag``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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
    "UnknownExecution",
    "UnknownInvocation",
    "UnknownOrganization",
    "UnknownTaskKind",
    "mapped_errors",
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

    def __str__(self) -> str:
        parts = [self.message]
        if self.detail:
            parts.append(f"DETAIL: {self.detail}")
        if self.hint:
            parts.append(f"HINT: {self.hint}")
        return "\n".join(parts)


class AllowanceExhausted(LlmError):
    """LL001: admission would take used + held + estimate over the allowance."""

    code = "LL001"


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
    diag = exc.diag
    message = diag.message_primary or str(exc)
    return cls(message, sqlstate=sqlstate, detail=diag.message_detail, hint=diag.message_hint)


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
