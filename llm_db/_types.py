"""What the generated methods (``llm_db._client_methods``) and the task wrapper need of
the driver's table at run time: its type aliases, the mapping of a one-value result and
the default of a request helper's scope id. The table itself (``llm_db.operations``),
which reads every entry's signature when imported, is for the generator, the docs and
the tests: a consumer's ``import llm_db`` does not import it."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Annotated, Any, TypeVar
from uuid import UUID

__all__ = ["TASK_DEFAULT", "Int4", "Row", "TaskDefault", "UuidArray", "UuidLike", "value_of"]

T = TypeVar("T")
Row = dict[str, Any]
UuidLike = UUID | str

#: an ``int`` passed as SQL ``integer`` (every other ``int`` is ``bigint``)
Int4 = Annotated[int, "integer"]
#: organizations passed as SQL ``uuid[]`` (the reads' filter; None: every organization)
UuidArray = Annotated[Sequence[UuidLike], "uuid[]"]


def value_of(rows: list[Row], kind: type[T]) -> T:
    """The one value of a statement ``SELECT … AS value``, as ``kind``: an ``Outcome`` from
    its text; an int, bool, str or UUID (or NULL) as psycopg read it."""
    value = rows[0]["value"]
    return value if type(value) is kind or value is None else kind(value)  # type: ignore[call-arg]


class TaskDefault(enum.Enum):
    """The default of a request helper's scope id: the wrapper's. A value given on the
    call wins, None too (``end_user=None`` admits a request of no end user)."""

    TASK_DEFAULT = "the task's"

    def __repr__(self) -> str:
        return "TASK_DEFAULT"


TASK_DEFAULT = TaskDefault.TASK_DEFAULT
