"""Logic written once for the sync and the asyncio driver.

Where a piece of work calls a client (``Llm`` or ``AsyncLlm``), it is written as a
generator that yields each step, a zero-argument call (a client method, a POST, a
pause), and gets back what the step returned, or has what it raised thrown in at that
``yield``. ``run`` calls the steps; ``run_async`` awaits them. The task wrapper's hops
(``llm_db.executions``) and the delivery of notices (``llm_db.service.notices``) are
written this way, so only these runners differ between the two clients.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

__all__ = ["Steps", "run", "run_async"]

T = TypeVar("T")

#: A generator of steps that returns a ``T``.
Steps = Generator[Callable[[], Any], Any, T]


@dataclasses.dataclass(frozen=True, slots=True)
class _Done:
    value: Any


def _next(resume: Callable[[Any], Callable[[], Any]], value: Any) -> Any:
    """The next step, resuming the generator with ``value`` (sent, or thrown in); or
    ``_Done`` with what the generator returned."""
    try:
        return resume(value)
    except StopIteration as done:
        return _Done(done.value)


def _performed(steps: Steps[Any], step: Callable[[], Any]) -> tuple[Callable[[Any], Any], Any]:
    try:
        return steps.send, step()
    except BaseException as exc:  # thrown back in: the generator decides
        return steps.throw, exc


async def _awaited(
    steps: Steps[Any], step: Callable[[], Awaitable[Any]]
) -> tuple[Callable[[Any], Any], Any]:
    try:
        return steps.send, await step()
    except BaseException as exc:
        return steps.throw, exc


def run(steps: Steps[T]) -> T:
    """Perform the steps by calling each one; what the generator returns."""
    step = _next(steps.send, None)
    while not isinstance(step, _Done):
        step = _next(*_performed(steps, step))
    return step.value


async def run_async(steps: Steps[T]) -> T:
    """Perform the steps by awaiting each one; what the generator returns."""
    step = _next(steps.send, None)
    while not isinstance(step, _Done):
        step = _next(*await _awaited(steps, step))
    return step.value
