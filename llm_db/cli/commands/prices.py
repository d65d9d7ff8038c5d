"""``llm-db prices set | list | import | reprice``: the price book from a shell
(docs/architecture.md "The price book").

Every number is read as an exact decimal, never a float: a JSON file is parsed
with ``parse_float=Decimal``, a CSV's cells are decimal strings, and LiteLLM's
per-token costs (``model_prices_and_context_window.json``) become rates per
million tokens by an exact multiplication. Importing the same rates again adds
no version (``llm.set_price`` returns the version already in force).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from datetime import datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any
from uuid import UUID

import click

from llm_db import queries
from llm_db.cli.commands import common

CLASSES = ("input", "cache_read", "cache_write_5m", "cache_write_1h", "output", "reasoning", "requests")

# LiteLLM's keys (per token; per request for input_cost_per_request) -> a class
LITELLM_BASE = {
    "input_cost_per_token": "input",
    "cache_read_input_token_cost": "cache_read",
    "cache_creation_input_token_cost": "cache_write_5m",
    "cache_creation_input_token_cost_above_1hr": "cache_write_1h",
    "output_cost_per_token": "output",
    "output_cost_per_reasoning_token": "reasoning",
}
# a tier's keys: <base key>_above_<N>k_tokens, N thousand prompt tokens
LITELLM_TIER = re.compile(r"^(?P<base>.+)_above_(?P<k>\d+)k_tokens$")
MILLION = Decimal(1_000_000)


class PriceFileError(click.ClickException):
    exit_code = common.EXIT_USAGE


def _decimal(value: Any, where: str) -> Decimal:
    """An exact rate: a Decimal (JSON read with parse_float), an int or a decimal string."""
    if isinstance(value, bool) or isinstance(value, float):
        raise PriceFileError(f"{where}: {value!r} is no exact number")
    try:
        number = Decimal(value) if isinstance(value, int | str) else value
    except InvalidOperation:
        raise PriceFileError(f"{where}: {value!r} is no number") from None
    if not isinstance(number, Decimal) or not number.is_finite():
        raise PriceFileError(f"{where}: {value!r} is no number")
    return number


def _text(number: Decimal) -> str:
    """A rate as the decimal string the routine reads: no exponent, no trailing zeros."""
    text = format(number.normalize(), "f")
    return text if text != "-0" else "0"


def from_litellm(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """model -> rates from LiteLLM's price map: per-token costs times a million, exactly;
    ``*_above_<N>k_tokens`` keys as a tier above N thousand prompt tokens. Entries with
    no token cost (images, audio by the second, the ``sample_spec``) are left out."""
    book: dict[str, dict[str, Any]] = {}
    for model, entry in document.items():
        if model == "sample_spec" or not isinstance(entry, dict):
            continue
        rates: dict[str, Any] = {}
        tiers: dict[int, dict[str, str]] = {}
        for key, value in entry.items():
            if value is None:
                continue
            if key in LITELLM_BASE:
                rates[LITELLM_BASE[key]] = _text(_decimal(value, f"{model}.{key}") * MILLION)
            elif key == "input_cost_per_request":
                rates["requests"] = _text(_decimal(value, f"{model}.{key}"))
            elif (tier := LITELLM_TIER.match(key)) and tier["base"] in LITELLM_BASE:
                above = int(tier["k"]) * 1000
                tiers.setdefault(above, {})[LITELLM_BASE[tier["base"]]] = _text(
                    _decimal(value, f"{model}.{key}") * MILLION)
        if not any(c in rates for c in ("input", "output")):
            continue
        if tiers:
            rates["tiers"] = [{"above_prompt_tokens": above, **tiers[above]} for above in sorted(tiers)]
        book[model] = rates
    return book


def from_json(document: Any) -> dict[str, dict[str, Any]]:
    """Our own JSON: ``{"model": {"input": "3", ..., "tiers": [...]}, ...}``, rates per
    million tokens as exact numbers or decimal strings."""
    if not isinstance(document, dict):
        raise PriceFileError("a price file in JSON is an object of model -> rates")
    book = {}
    for model, rates in document.items():
        if not isinstance(rates, dict):
            raise PriceFileError(f"{model}: rates must be an object")
        book[model] = _exact(rates, model)
    return book


def _exact(rates: dict[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in rates.items():
        if key == "tiers":
            out["tiers"] = [_exact(tier, f"{where}.tiers") for tier in value]
        elif key == "above_prompt_tokens":
            out[key] = int(_decimal(value, f"{where}.{key}"))
        elif key == "currency":
            out[key] = value
        else:
            out[key] = _text(_decimal(value, f"{where}.{key}"))
    return out


def from_csv(text: str) -> dict[str, dict[str, Any]]:
    """A CSV with a ``model`` column and one column per class (per million tokens; an
    empty cell: no rate). Tiers need JSON."""
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None or "model" not in reader.fieldnames:
        raise PriceFileError("a price file in CSV has a header with a 'model' column")
    unknown = set(reader.fieldnames) - {"model", "currency", *CLASSES}
    if unknown:
        raise PriceFileError(f"unknown CSV columns: {', '.join(sorted(unknown))} (classes: {', '.join(CLASSES)})")
    book = {}
    for line, row in enumerate(reader, start=2):
        model = (row.get("model") or "").strip()
        if not model:
            raise PriceFileError(f"line {line}: no model")
        book[model] = {k: (v.strip() if k == "currency" else _text(_decimal(v.strip(), f"line {line} {k}")))
                       for k, v in row.items() if k != "model" and v is not None and v.strip()}  # fmt: skip
    return book


def read_price_file(path: Path, fmt: str | None) -> dict[str, dict[str, Any]]:
    """The rates of a price file, its format given or detected: CSV by its extension,
    LiteLLM's map by its per-token keys, else our JSON."""
    text = path.read_text(encoding="utf-8")
    if fmt is None:
        fmt = "csv" if path.suffix.lower() == ".csv" else "json"
    if fmt == "csv":
        return from_csv(text)
    try:
        document = json.loads(text, parse_float=Decimal)
    except json.JSONDecodeError as exc:
        raise PriceFileError(f"{path}: not JSON ({exc})") from None
    if fmt == "litellm" or (fmt == "json" and _looks_like_litellm(document)):
        return from_litellm(document)
    return from_json(document)


def _looks_like_litellm(document: Any) -> bool:
    return isinstance(document, dict) and any(
        isinstance(entry, dict) and ("input_cost_per_token" in entry or "output_cost_per_token" in entry)
        for entry in document.values()
    )


# ----------------------------------------------------------- the commands


@click.group(cls=common.Group, short_help="Set, list and import the price book.")
def prices() -> None:
    """The price book: versioned rates per model that price every request exactly
    (docs/architecture.md "The price book"). Setting and importing need llm_operator;
    listing needs SELECT on llm.prices."""


@prices.command("set", short_help="Add a price version of one model.")
@common.dsn_option
@click.argument("model")
@click.argument("rates")
@click.option("--from", "effective_from", type=common.TIMESTAMP, default=None,
              help="When the version takes effect (default: now).")  # fmt: skip
@click.option("--org", "organization_id", type=click.UUID, default=None,
              help="The organization whose negotiated price this is (default: the book's).")  # fmt: skip
def set_price(dsn: str | None, model: str, rates: str, effective_from: datetime | None,
              organization_id: UUID | None) -> None:
    """Add a price version: RATES is a JSON object per million tokens, numbers read
    exactly. Prints the version's id (the same id when the rates are already in force).

    \b
    Examples:
      llm-db prices set gpt-4o '{"input": "2.50", "cache_read": "1.25", "output": "10"}'
      llm-db prices set '*' '{"input": "10", "output": "30"}'   # the fallback
    """
    from llm_db import Llm

    try:
        parsed = json.loads(rates, parse_float=Decimal)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="RATES") from None
    if not isinstance(parsed, dict):
        raise click.BadParameter("a JSON object of class -> rate", param_hint="RATES")
    with common.connect(dsn) as conn:
        version = Llm(conn).set_price(model, _exact(parsed, model), effective_from=effective_from,
                                      organization_id=organization_id)
    click.echo(version)


@prices.command("list", short_help="List every price version.")
@common.dsn_option
@click.option("--model", default=None, help="Only this model's versions.")
@common.json_option
def list_prices(dsn: str | None, model: str | None, as_json: bool) -> None:
    """Every price version (llm.prices), oldest first; rates exactly as stored."""
    with common.connect(dsn) as conn:
        rows = conn.execute(queries.PRICE_VERSIONS, {"model": model}).fetchall()
    versions = [{"id": r[0], "model": r[1], "organization_id": r[2], "effective_from": r[3], "currency": r[4],
                 "rates": json.loads(r[5], parse_float=Decimal)} for r in rows]  # fmt: skip
    if as_json:
        common.echo_json(versions)
        return
    for v in versions:
        whose = f"org {v['organization_id']}" if v["organization_id"] else "book"
        rates = json.dumps(v["rates"], default=_text, sort_keys=True)
        click.echo(f"{v['id']:>6}  {v['model']}  {whose}  from {v['effective_from'].isoformat()}  {v['currency']}  {rates}")


@prices.command("import", short_help="Import a price file (JSON, CSV or LiteLLM's map).")
@common.dsn_option
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["json", "csv", "litellm"]), default=None,
              help="The file's format (default: detected).")  # fmt: skip
@click.option("--from", "effective_from", type=common.TIMESTAMP, default=None,
              help="When the versions take effect (default: now).")  # fmt: skip
@click.option("--model", "models", multiple=True, help="Only these models (repeatable).")
def import_prices(dsn: str | None, file: Path, fmt: str | None, effective_from: datetime | None,
                  models: tuple[str, ...]) -> None:
    """Import rates for many models at once: our JSON ({"model": {"input": "3", ...}}),
    a CSV (a 'model' column and one per class), or LiteLLM's
    model_prices_and_context_window.json (per-token costs, converted exactly).
    A model whose rates are already in force gets no new version. Prints how many
    versions were added and how many models were unchanged.

    \b
    Examples:
      llm-db prices import prices.json
      llm-db prices import model_prices_and_context_window.json --model gpt-4o --model gpt-4o-mini
    """
    from llm_db import Llm

    book = read_price_file(file, fmt)
    if models:
        missing = sorted(set(models) - set(book))
        if missing:
            raise PriceFileError(f"not in {file.name}: {', '.join(missing)}")
        book = {m: book[m] for m in models}
    added = unchanged = 0
    with common.connect(dsn) as conn:
        llm = Llm(conn)
        before = {r[0] for r in conn.execute(queries.PRICE_VERSION_IDS)}
        for model, rates in book.items():
            version = llm.set_price(model, rates, effective_from=effective_from)
            if version in before:
                unchanged += 1
            else:
                added += 1
                before.add(version)
    click.echo(f"{added} price versions added, {unchanged} models unchanged")


@prices.command("reprice", short_help="Price past requests again at a corrected version.")
@common.dsn_option
@click.argument("model")
@click.argument("version_id", type=int)
@click.option("--from", "time_from", type=common.TIMESTAMP, required=True,
              help="The first admission time covered.")  # fmt: skip
@click.option("--to", "time_to", type=common.TIMESTAMP, required=True,
              help="The admission time the range stops before.")  # fmt: skip
@click.option("--apply", is_flag=True, default=False,
              help="Write the corrections (default: a dry run that writes nothing).")  # fmt: skip
@common.json_option
def reprice(dsn: str | None, model: str, version_id: int, time_from: datetime, time_to: datetime,
            apply: bool, as_json: bool) -> None:
    """Price MODEL's requests admitted from --from until --to that the book priced from
    usage again, at price version VERSION_ID (an organization's own version: its
    requests; a book version: those pinned to the book's). Prints, per organization, the
    requests and their cost before (as corrected), after and the difference, in exact
    amounts of the book's currency. Without --apply nothing is written; with it each
    changed request gets one correction and every cost sum moves by it, in one
    transaction; credits stay as charged, and repeating it changes nothing.

    \b
    Examples:
      llm-db prices reprice gpt-4o 42 --from 2026-11-01T00:00:00Z --to 2026-12-01T00:00:00Z
      llm-db prices reprice gpt-4o 42 --from 2026-11-01T00:00:00Z --to 2026-12-01T00:00:00Z --apply
    """
    from llm_db import Llm
    from llm_db._text import money

    with common.connect(dsn) as conn:
        rows = Llm(conn).reprice(model, time_from, time_to, version_id, apply=apply)
    if as_json:
        common.echo_json([dataclasses.asdict(r) for r in rows])
        return
    for r in rows:
        click.echo(f"{r.organization_id}  {r.requests} requests  {money(r.cost_before_nanos)} -> "
                   f"{money(r.cost_after_nanos)}  ({money(r.difference_nanos)})")
    click.echo(f"{'applied' if apply else 'dry run, nothing written'}: {len(rows)} organizations,"
               f" {sum(r.requests for r in rows)} requests, difference"
               f" {money(sum(r.difference_nanos for r in rows))}")
