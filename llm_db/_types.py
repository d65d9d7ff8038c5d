"""What the generated methods (``llm_db._client_methods``) and the task wrapper need of
the driver's table at run time: its type aliases, the mapping of a one-value result and
the default of a request helper's scope id. The table itself (``codegen.operations``),
which reads every entry's signature when imported, is for the generator, the docs and
the tests: a consumer's ``import llm_db`` does not import it."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Annotated, Any, TypeVar
from uuid import UUID

from llm_db.usage import Usage

__all__ = [
    "TASK_DEFAULT", "Int4", "JsonObject", "Row", "TaskDefault", "UuidArray", "UuidLike",
    "json_arg", "uuid_arg", "value_as", "whole",
]

T = TypeVar("T")
Row = dict[str, Any]
UuidLike = UUID | str

#: an ``int`` passed as SQL ``integer`` (every other ``int`` is ``bigint``)
Int4 = Annotated[int, "integer"]
#: a JSON object passed as SQL ``jsonb`` (rates, usage): numbers exact, never a float
JsonObject = Annotated[Mapping[str, Any], "jsonb"]
#: organizations passed as SQL ``uuid[]`` (the reads' filter; None: every organization)
UuidArray = Annotated[Sequence[UuidLike], "uuid[]"]


def value_as(value: Any, kind: type[T]) -> T:
    """The one value of a statement ``SELECT … AS value``, as ``kind``: an ``Outcome`` from
    its text; an int, bool, str or UUID (or NULL) as psycopg read it."""
    if type(value) is kind or value is None:
        return value  # type: ignore[no-any-return]
    members = getattr(kind, "_value2member_map_", None)  # an Enum: its member, no call
    if members is not None and value in members:
        return members[value]  # type: ignore[no-any-return]
    return kind(value)  # type: ignore[call-arg]


class TaskDefault(enum.Enum):
    """The default of a request helper's scope id: the wrapper's. A value given on the
    call wins, None too (``end_user=None`` admits a request of no end user)."""

    TASK_DEFAULT = "the task's"

    def __repr__(self) -> str:
        return "TASK_DEFAULT"


TASK_DEFAULT = TaskDefault.TASK_DEFAULT


def _refuse(name: str, value: Any, what: str) -> Exception:
    from llm_db.errors import InvalidArgument  # errors imports nothing of this module

    return InvalidArgument(f"llm: {name} must be {what}, not {value!r} ({type(value).__name__})",
                           sqlstate=InvalidArgument.code)  # fmt: skip


def whole(name: str, value: Any) -> Any:
    """An integer argument as sent: an ``int`` (not a bool) or a ``Decimal`` without a
    fraction; anything else (a float, which the server would round: 1.5 charged 2) is
    ``InvalidArgument`` before anything is sent. None stays None (the routine decides)."""
    if type(value) is int or value is None:  # the common case first: one type check
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, Decimal) and value.is_finite() and value == value.to_integral_value():
        return int(value)
    raise _refuse(name, value, "a whole number (int)")


def uuid_arg(name: str, value: Any) -> Any:
    """A uuid argument as sent: a ``UUID``, or a ``str`` that is one; anything else is
    ``InvalidArgument`` before anything is sent (the server's cast said 22P02)."""
    if type(value) is UUID or value is None or isinstance(value, UUID):
        return value
    if isinstance(value, str):
        try:
            return UUID(value)
        except ValueError:
            pass
    raise _refuse(name, value, "a UUID")


def _exact_json(name: str, value: Any) -> Any:
    """``value`` with every number exact: an int as it is, a ``Decimal`` as its integer
    or its decimal string (the routines read both), a float refused (0.1 is not 1/10)."""
    if isinstance(value, Mapping):
        return {_exact_json(name, str(k)): _exact_json(name, v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_exact_json(name, v) for v in value]
    if isinstance(value, str):
        if "\x00" in value:  # jsonb holds no NUL (22P05), as no text does
            raise _refuse(name, value, "text without NUL (U+0000)")
        return value
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, Decimal) and value.is_finite():
        return int(value) if value == value.to_integral_value() else format(value, "f")
    raise _refuse(name, value, "a JSON object of ints, Decimals or decimal strings (no float)")


def json_arg(name: str, value: Any) -> Any:
    """A ``jsonb`` argument as sent: a mapping (or a dataclass; a ``Usage`` as its
    ``reported()`` classes) as ``Jsonb`` with exact numbers; a float anywhere in it is
    ``InvalidArgument`` before anything is sent. None stays None (the routine decides)."""
    from psycopg.types.json import Jsonb

    if value is None:
        return None
    if isinstance(value, Usage):
        value = value.reported()
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if not isinstance(value, Mapping):
        raise _refuse(name, value, "a mapping")
    return Jsonb(_exact_json(name, value))
