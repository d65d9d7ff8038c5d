"""The task wrapper (WF-PFM-LLM-002, STATE-PFM-LLM-002).

    def summarize(ctx: ExecutionContext) -> str:
        inv = ctx.admit(500, "gpt-x")          # linked to the task
        ctx.mark_dispatched(inv.id)
        ...
        ctx.settle(inv.id, credits=420, cents=13)
        return text

    result = with_llm_execution(llm, org_id, "queries.summary", summarize,
                                subject_type="query", subject_id="42",
                                replay_key="summary:42", end_user="u-42")
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
  the task's totals. The wrapper's ``project``, ``api_key`` and ``end_user``
  are the scope ids of each request the helpers admit unless the
  call names its own: a value given on the call wins, None too
  (``end_user=None`` admits a request of no end user). The context travels in
  a ``contextvars.ContextVar``: asyncio tasks created inside the body copy it and keep the association;
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
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, Generic, TypeVar
from uuid import UUID

from llm_db._client_methods import AsyncExecutionContextMethods, ExecutionContextMethods
from llm_db._types import TASK_DEFAULT, TaskDefault
from llm_db.client import AsyncLlm, Llm, UuidLike
from llm_db.errors import NestedExecution

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


def _scopes(**ids: str | None) -> dict[str, str]:
    """The scope ids the wrapper was given, as defaults of its body's requests."""
    return {name: value for name, value in ids.items() if value is not None}


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
    __slots__ = ("client", "organization_id", "execution_id", "task_key", "clock", "scopes")

    def __init__(
        self,
        client: Any,
        organization_id: UuidLike,
        execution_id: UUID,
        task_key: str,
        clock: Clock = None,
        scopes: Mapping[str, str] | None = None,
    ) -> None:
        self.client = client
        self.organization_id = organization_id
        self.execution_id = execution_id
        self.task_key = task_key
        self.clock = clock
        #: the scope ids (``project``, ``api_key``, ``end_user``) the helpers admit under
        #: when a call names none
        self.scopes: Mapping[str, str] = dict(scopes or {})

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(organization_id={self.organization_id!r}, "
            f"execution_id={self.execution_id!r}, task_key={self.task_key!r})"
        )

    def _now(self, now: datetime | None) -> datetime | None:
        return now if now is not None else _read_clock(self.clock)

    def _scope(self, name: str, given: str | None | TaskDefault) -> str | None:
        """A scope id as a request helper passes it: the call's, None too; else the wrapper's."""
        return self.scopes.get(name) if given is TASK_DEFAULT else given


class ExecutionContext(_ContextBase, ExecutionContextMethods):
    """The body's handle on its task (WF-PFM-LLM-002 hop 3).

    ``organization_id``, ``execution_id``, ``task_key``, ``client``; request
    helpers (``admit``, ``admit_id``, ``mark_dispatched``, ``settle``, ``fail``:
    the client's, generated from the table of operations into
    ``llm_db._client_methods``) that pass the organization and
    link each request to this task. They default ``now`` to the wrapper's clock,
    and ``project``, ``api_key`` and ``end_user`` to the wrapper's (``scopes``).
    """

    __slots__ = ()
    client: Llm


class AsyncExecutionContext(_ContextBase, AsyncExecutionContextMethods):
    """``ExecutionContext`` for ``AsyncLlm``: the same helpers, awaited."""

    __slots__ = ()
    client: AsyncLlm


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


# The wrapper's hops, written once (for asyncio; the sync twin below is written from it,
# codegen/unasync.py): open the task, run the body, close the task.


async def _async_hops(
    client: Any, organization_id: UuidLike, task_key: str, body: Callable[[Any], Any],
    context: type[_ContextBase], options: dict[str, Any], now: Clock, scopes: dict[str, str],
) -> ExecutionResult[Any]:  # fmt: skip
    _reject_nesting(task_key)  # hop 1: nothing is written
    # hop 2: the open is committed before the body runs; if it raises, the body does not run
    opened = await client.open_execution(organization_id, task_key, now=_read_clock(now), **options)
    if opened.replayed:  # branch: the earlier execution, without running the body
        return ExecutionResult(opened.execution_id, True, None, opened.status)

    ctx = context(client, organization_id, opened.execution_id, task_key, now, scopes)
    token = _current.set(ctx)
    failure: BaseException | None = None
    try:
        value = await body(ctx)  # hop 3
    except BaseException as exc:
        failure = exc
    finally:
        _current.reset(token)
    if failure is not None:  # hop 4, running -> failed; the body's error propagates
        try:
            closed = await client.close_execution(
                organization_id, opened.execution_id, "failed", error=_error_text(failure),
                now=_read_clock(now),
            )
        except Exception as close_error:  # logged; anything else (a KeyboardInterrupt) propagates
            _log_close_failure(opened.execution_id, close_error)
        else:
            if not closed:
                _log_not_running(opened.execution_id, "failed")
        raise failure

    # hop 4, running -> completed; a close error reaches the caller
    closed = await client.close_execution(
        organization_id, opened.execution_id, "completed", now=_read_clock(now)
    )
    if not closed:
        _log_not_running(opened.execution_id, "completed")
    return ExecutionResult(opened.execution_id, False, value, "completed" if closed else None)


# The sync twin of the definition above: written by scripts/generate_client.py.
def _hops(
    client: Any, organization_id: UuidLike, task_key: str, body: Callable[[Any], Any],
    context: type[_ContextBase], options: dict[str, Any], now: Clock, scopes: dict[str, str],
) -> ExecutionResult[Any]:  # fmt: skip
    _reject_nesting(task_key)  # hop 1: nothing is written
    # hop 2: the open is committed before the body runs; if it raises, the body does not run
    opened = client.open_execution(organization_id, task_key, now=_read_clock(now), **options)
    if opened.replayed:  # branch: the earlier execution, without running the body
        return ExecutionResult(opened.execution_id, True, None, opened.status)

    ctx = context(client, organization_id, opened.execution_id, task_key, now, scopes)
    token = _current.set(ctx)
    failure: BaseException | None = None
    try:
        value = body(ctx)  # hop 3
    except BaseException as exc:
        failure = exc
    finally:
        _current.reset(token)
    if failure is not None:  # hop 4, running -> failed; the body's error propagates
        try:
            closed = client.close_execution(
                organization_id, opened.execution_id, "failed", error=_error_text(failure),
                now=_read_clock(now),
            )
        except Exception as close_error:  # logged; anything else (a KeyboardInterrupt) propagates
            _log_close_failure(opened.execution_id, close_error)
        else:
            if not closed:
                _log_not_running(opened.execution_id, "failed")
        raise failure

    # hop 4, running -> completed; a close error reaches the caller
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
    project: str | None = None,
    api_key: str | None = None,
    end_user: str | None = None,
) -> ExecutionResult[T]:
    """``with_llm_execution`` for asyncio: ``await body(ctx)`` as one declared task.

    Tasks the body creates (``asyncio.create_task``, ``TaskGroup``) copy the
    context and keep the task association (WF-PFM-LLM-002 hop 3); a cancelled
    body closes the task ``failed`` and the cancellation propagates.
    """
    options = {"subject_type": subject_type, "subject_id": subject_id, "replay_key": replay_key}
    scopes = _scopes(project=project, api_key=api_key, end_user=end_user)
    return await _async_hops(
        client, organization_id, task_key, body, AsyncExecutionContext, options, now, scopes
    )


# The sync twin of the definition above: written by scripts/generate_client.py.
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
    project: str | None = None,
    api_key: str | None = None,
    end_user: str | None = None,
) -> ExecutionResult[T]:
    """Run ``body(ctx)`` as one declared task (WF-PFM-LLM-002 hops 1-4, see the module doc).

    ``now`` is a datetime or a zero-argument clock, used for the open, the
    close and as the default of the context's request helpers; ``project``,
    ``api_key`` and ``end_user`` are the defaults of the helpers' requests (a
    value given on a call wins). The client's connection must not be inside a
    transaction of the caller's: each client call then commits on its own, so
    the open is committed before the body.
    """
    options = {"subject_type": subject_type, "subject_id": subject_id, "replay_key": replay_key}
    scopes = _scopes(project=project, api_key=api_key, end_user=end_user)
    return _hops(
        client, organization_id, task_key, body, ExecutionContext, options, now, scopes
    )
