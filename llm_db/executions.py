"""The task wrapper (WF-PFM-LLM-002, STATE-PFM-LLM-002).

    def summarize(ctx: ExecutionContext) -> str:
        inv = ctx.admit(500, "gpt-x")          # linked to the task
        ctx.mark_dispatched(inv.id)
        ...
        ctx.settle(inv.id, credits=420, cents=13)
        return text

    result = with_llm_execution(llm, org_id, "queries.summary", summarize,
                                subject_type="query", subject_id="42",
                                replay_key="summary:42")
    if result.replayed:
        ...  # done before; the body did not run this time

The body is a callable rather than a ``with`` block because a replay must not
run it (WF-PFM-LLM-002 branch), and a ``with`` block cannot be skipped.

The rules, hop by hop:

- hop 1 (STATE-PFM-LLM-002 absent -> running guard): a wrapper inside another
  wrapper's body raises ``NestedExecution`` before anything is written; an
  unknown task key or organization is rejected by ``open_execution``
  (``UnknownTaskKind``, ``UnknownOrganization``, ...) and creates nothing.
- hop 2: the open is committed before the body runs; if it fails, the body
  does not run. A known replay key returns the earlier execution
  (``replayed=True``, its stored status) without running the body
  (invalid transition running -> running).
- hop 3: the body gets an ``ExecutionContext`` whose request helpers
  (``ctx.admit`` ...) link each request to the task, so its settlement adds to
  the task's totals. The context travels in a ``contextvars.ContextVar``:
  asyncio tasks created inside the body copy it and keep the association;
  threads do not, so run thread work with
  ``contextvars.copy_context().run(fn, ...)`` (or pass ``ctx`` explicitly).
  ``current_execution()`` returns it.
- hop 4: a body that returns closes the task ``completed``
  (running -> completed); a close error is then raised to the caller. A body
  that raises closes it ``failed`` with ``repr(exc)`` (at most 4000
  characters) as its error (running -> failed); a close error is then logged
  on the ``llm_db.executions`` logger and the body's own exception propagates
  unchanged. A task whose close did not happen stays running until the hourly
  pass abandons it (running -> abandoned, hop 5).
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Generic, TypeVar
from uuid import UUID

from llm_db.errors import NestedExecution
from llm_db.models import Invocation, Outcome
from llm_db.requests import AsyncLlm, Llm, UuidLike

__all__ = [
    "AsyncExecutionContext",
    "ExecutionContext",
    "ExecutionResult",
    "async_with_llm_execution",
    "current_execution",
    "with_llm_execution",
]

log = logging.getLogger("llm_db.executions")

T = TypeVar("T")

#: the longest error text ``close_execution`` accepts
MAX_ERROR_CHARS = 4000

#: A fixed datetime, or a clock called at open, at close and by the request helpers.
Clock = datetime | Callable[[], datetime] | None

_current: contextvars.ContextVar[ExecutionContext | AsyncExecutionContext | None] = (
    contextvars.ContextVar("llm_db_execution", default=None)
)


def current_execution() -> ExecutionContext | AsyncExecutionContext | None:
    """The task whose body is running in this context, or None."""
    return _current.get()


@dataclasses.dataclass(frozen=True, slots=True)
class ExecutionResult(Generic[T]):
    """What the wrapper did.

    ``value`` is the body's return value (None on replay: the body did not run).
    ``status`` is ``completed`` when this call closed the task, the stored
    status on replay, and None when the close found the task no longer running
    (recovery abandoned it first, or the body closed it itself).
    """

    execution_id: UUID
    replayed: bool
    value: T | None
    status: str | None


def _error_text(exc: BaseException) -> str:
    return repr(exc)[:MAX_ERROR_CHARS]


def _read_clock(now: Clock) -> datetime | None:
    return now() if callable(now) else now


def _reject_nesting(task_key: str) -> None:
    outer = _current.get()
    if outer is not None:
        raise NestedExecution(
            f"llm: task {task_key!r} was opened inside the body of task {outer.task_key!r} "
            f"(execution {outer.execution_id})",
            hint="Call the inner work without its own wrapper; its requests already count "
            "for the enclosing task.",
        )


class _ContextBase:
    __slots__ = ("client", "organization_id", "execution_id", "task_key", "clock")

    def __init__(
        self,
        client: Any,
        organization_id: UuidLike,
        execution_id: UUID,
        task_key: str,
        clock: Clock = None,
    ) -> None:
        self.client = client
        self.organization_id = organization_id
        self.execution_id = execution_id
        self.task_key = task_key
        self.clock = clock

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(organization_id={self.organization_id!r}, "
            f"execution_id={self.execution_id!r}, task_key={self.task_key!r})"
        )

    def _now(self, now: datetime | None) -> datetime | None:
        return now if now is not None else _read_clock(self.clock)


class ExecutionContext(_ContextBase):
    """The body's handle on its task (WF-PFM-LLM-002 hop 3).

    ``organization_id``, ``execution_id``, ``task_key``, ``client``; request
    helpers that pass the organization and link each request to this task.
    They default ``now`` to the wrapper's clock.
    """

    __slots__ = ()
    client: Llm

    def admit(
        self,
        estimate_credits: int,
        model: str,
        *,
        invocation_id: UuidLike | None = None,
        now: datetime | None = None,
    ) -> Invocation:
        """Admit a request of this task's organization, linked to this task."""
        return self.client.admit(
            self.organization_id,
            estimate_credits,
            model,
            execution_id=self.execution_id,
            invocation_id=invocation_id,
            now=self._now(now),
        )

    def mark_dispatched(self, invocation_id: UuidLike, *, now: datetime | None = None) -> Invocation:
        """Mark a request of this task as sent to the provider."""
        return self.client.mark_dispatched(self.organization_id, invocation_id, now=self._now(now))

    def settle(
        self,
        invocation_id: UuidLike,
        credits: int,
        cents: int,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        now: datetime | None = None,
    ) -> Outcome:
        """Settle a request with measured usage; it adds to this task's totals."""
        return self.client.settle(
            self.organization_id,
            invocation_id,
            credits,
            cents,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            now=self._now(now),
        )

    def fail(
        self,
        invocation_id: UuidLike,
        error: str,
        *,
        credits: int = 0,
        cents: int = 0,
        now: datetime | None = None,
    ) -> Outcome:
        """Fail a request; its partial charge (if any) adds to this task's totals."""
        return self.client.fail(
            self.organization_id,
            invocation_id,
            error,
            credits=credits,
            cents=cents,
            now=self._now(now),
        )


class AsyncExecutionContext(_ContextBase):
    """``ExecutionContext`` for ``AsyncLlm``: the same helpers, awaited."""

    __slots__ = ()
    client: AsyncLlm

    async def admit(
        self,
        estimate_credits: int,
        model: str,
        *,
        invocation_id: UuidLike | None = None,
        now: datetime | None = None,
    ) -> Invocation:
        """Admit a request of this task's organization, linked to this task."""
        return await self.client.admit(
            self.organization_id,
            estimate_credits,
            model,
            execution_id=self.execution_id,
            invocation_id=invocation_id,
            now=self._now(now),
        )

    async def mark_dispatched(
        self, invocation_id: UuidLike, *, now: datetime | None = None
    ) -> Invocation:
        """Mark a request of this task as sent to the provider."""
        return await self.client.mark_dispatched(
            self.organization_id, invocation_id, now=self._now(now)
        )

    async def settle(
        self,
        invocation_id: UuidLike,
        credits: int,
        cents: int,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        now: datetime | None = None,
    ) -> Outcome:
        """Settle a request with measured usage; it adds to this task's totals."""
        return await self.client.settle(
            self.organization_id,
            invocation_id,
            credits,
            cents,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            now=self._now(now),
        )

    async def fail(
        self,
        invocation_id: UuidLike,
        error: str,
        *,
        credits: int = 0,
        cents: int = 0,
        now: datetime | None = None,
    ) -> Outcome:
        """Fail a request; its partial charge (if any) adds to this task's totals."""
        return await self.client.fail(
            self.organization_id,
            invocation_id,
            error,
            credits=credits,
            cents=cents,
            now=self._now(now),
        )


def _log_close_failure(execution_id: UUID, close_error: BaseException) -> None:
    # STATE-PFM-LLM-002 running -> failed: log the close error, keep the body's error
    log.error(
        "llm: closing execution %s as failed raised %r; the body's own exception propagates",
        execution_id,
        close_error,
        exc_info=close_error,
    )


def _log_not_running(execution_id: UUID, outcome: str) -> None:
    log.warning(
        "llm: execution %s was no longer running when closing it as %s "
        "(abandoned by recovery or closed by the body); its stored status stands",
        execution_id,
        outcome,
    )


def with_llm_execution(
    client: Llm,
    organization_id: UuidLike,
    task_key: str,
    body: Callable[[ExecutionContext], T],
    *,
    subject_type: str | None = None,
    subject_id: str | None = None,
    replay_key: str | None = None,
    now: Clock = None,
) -> ExecutionResult[T]:
    """Run ``body(ctx)`` as one declared task (WF-PFM-LLM-002 hops 1-4, see the module doc).

    ``now`` is a datetime or a zero-argument clock, used for the open, the
    close and as the default of the context's request helpers. The client's
    connection must not be inside a transaction of the caller's: each client
    call then commits on its own, so the open is committed before the body.
    """
    _reject_nesting(task_key)  # hop 1: nothing is written
    opened = client.open_execution(  # hop 2: committed before the body runs
        organization_id,
        task_key,
        subject_type=subject_type,
        subject_id=subject_id,
        replay_key=replay_key,
        now=_read_clock(now),
    )
    if opened.replayed:  # branch: the earlier execution, without running the body
        return ExecutionResult(opened.execution_id, True, None, opened.status)

    ctx = ExecutionContext(client, organization_id, opened.execution_id, task_key, now)
    token = _current.set(ctx)
    try:
        value = body(ctx)  # hop 3
    except BaseException as exc:
        try:  # hop 4, running -> failed
            if not client.close_execution(
                organization_id, opened.execution_id, "failed",
                error=_error_text(exc), now=_read_clock(now),
            ):
                _log_not_running(opened.execution_id, "failed")
        except Exception as close_error:
            _log_close_failure(opened.execution_id, close_error)
        raise
    finally:
        _current.reset(token)

    # hop 4, running -> completed: a close error reaches the caller
    closed = client.close_execution(
        organization_id, opened.execution_id, "completed", now=_read_clock(now)
    )
    if not closed:
        _log_not_running(opened.execution_id, "completed")
    return ExecutionResult(opened.execution_id, False, value, "completed" if closed else None)


async def async_with_llm_execution(
    client: AsyncLlm,
    organization_id: UuidLike,
    task_key: str,
    body: Callable[[AsyncExecutionContext], Awaitable[T]],
    *,
    subject_type: str | None = None,
    subject_id: str | None = None,
    replay_key: str | None = None,
    now: Clock = None,
) -> ExecutionResult[T]:
    """``with_llm_execution`` for asyncio: ``await body(ctx)`` as one declared task.

    Tasks the body creates (``asyncio.create_task``, ``TaskGroup``) copy the
    context and keep the task association (WF-PFM-LLM-002 hop 3); a cancelled
    body closes the task ``failed`` and the cancellation propagates.
    """
    _reject_nesting(task_key)
    opened = await client.open_execution(
        organization_id,
        task_key,
        subject_type=subject_type,
        subject_id=subject_id,
        replay_key=replay_key,
        now=_read_clock(now),
    )
    if opened.replayed:
        return ExecutionResult(opened.execution_id, True, None, opened.status)

    ctx = AsyncExecutionContext(client, organization_id, opened.execution_id, task_key, now)
    token = _current.set(ctx)
    try:
        value = await body(ctx)
    except BaseException as exc:
        try:
            if not await client.close_execution(
                organization_id, opened.execution_id, "failed",
                error=_error_text(exc), now=_read_clock(now),
            ):
                _log_not_running(opened.execution_id, "failed")
        except Exception as close_error:
            _log_close_failure(opened.execution_id, close_error)
        raise
    finally:
        _current.reset(token)

    closed = await client.close_execution(
        organization_id, opened.execution_id, "completed", now=_read_clock(now)
    )
    if not closed:
        _log_not_running(opened.execution_id, "completed")
    return ExecutionResult(opened.execution_id, False, value, "completed" if closed else None)
