"""Plain text and JSON of the books' rows: the aligned tables and JSON-ready values the
command line (``llm_db.cli``) and the demo (``llm_db.demo``) print. It imports nothing
of llm_db, so neither extra's folder needs the other's."""

from __future__ import annotations

import decimal
from collections.abc import Mapping, Sequence
from datetime import date, datetime, timedelta
from typing import Any
from uuid import UUID

__all__ = ["format_table", "jsonable", "money"]


def jsonable(value: Any) -> Any:
    """``value`` with uuids, dates, datetimes and decimals turned into JSON types."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | decimal.Decimal):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    if isinstance(value, date):
        return value.isoformat()
    return str(value)


def format_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    align: str | None = None,
    indent: int = 2,
    empty: str = "none",
) -> str:
    """An aligned text table: numbers right-aligned (with thousands separators),
    text left-aligned, None as ``-``; ``align`` ("lrr…") overrides per column.
    ``empty`` is printed when there are no rows."""
    pad = " " * indent
    if not rows:
        return f"{pad}({empty})"
    cells = [[_cell(v) for v in r] for r in rows]
    if align is not None:
        numeric = [a == "r" for a in align.ljust(len(headers), "l")]
    else:
        numeric = [
            all(isinstance(r[i], int | float | decimal.Decimal) or r[i] is None for r in rows)
            and not all(r[i] is None for r in rows)
            for i in range(len(headers))
        ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return (pad + "  ".join(parts)).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(c) for c in cells]
    return "\n".join(out)


def money(nanos: int) -> str:
    """Nanos (10^-9 of the book's currency) as an exact decimal amount: 21000000 ->
    '0.021000000'; never rounded."""
    return format(decimal.Decimal(nanos).scaleb(-9), "f")
