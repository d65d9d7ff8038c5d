"""``llm-db prices set | list | import | reprice`` (docs/architecture.md "The price book"): every
number read as an exact decimal, LiteLLM's per-token costs converted exactly to rates per
million tokens, and an import repeated adding no version."""

from __future__ import annotations

import json
from datetime import UTC
from decimal import Decimal
from pathlib import Path

import psycopg

from tests.helpers import rows, scalar
from tests.test_cli import assert_one_line_error, llm_db

# Three entries as LiteLLM publishes them (model_prices_and_context_window.json, BerriAI/
# litellm), floats in exponent form as there, beside its sample_spec and an entry with no
# token cost.
LITELLM = """{
  "sample_spec": {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0, "mode": "one of: chat"},
  "claude-sonnet-4-5-20250929": {
    "cache_creation_input_token_cost": 3.75e-06,
    "cache_creation_input_token_cost_above_1hr": 6e-06,
    "cache_creation_input_token_cost_above_1hr_above_200k_tokens": 1.2e-05,
    "cache_read_input_token_cost": 3e-07,
    "input_cost_per_token": 3e-06,
    "input_cost_per_token_above_200k_tokens": 6e-06,
    "output_cost_per_token_above_200k_tokens": 2.25e-05,
    "cache_creation_input_token_cost_above_200k_tokens": 7.5e-06,
    "cache_read_input_token_cost_above_200k_tokens": 6e-07,
    "litellm_provider": "anthropic", "max_input_tokens": 200000, "mode": "chat",
    "output_cost_per_token": 1.5e-05,
    "search_context_cost_per_query": {"search_context_size_high": 0.01}
  },
  "gemini/gemini-2.5-pro": {
    "cache_read_input_token_cost": 1.25e-07,
    "cache_read_input_token_cost_above_200k_tokens": 2.5e-07,
    "input_cost_per_token": 1.25e-06,
    "input_cost_per_token_above_200k_tokens": 2.5e-06,
    "litellm_provider": "gemini", "mode": "chat",
    "output_cost_per_token": 1e-05,
    "output_cost_per_token_above_200k_tokens": 1.5e-05
  },
  "gpt-4o-mini": {
    "cache_read_input_token_cost": 7.5e-08,
    "input_cost_per_token": 1.5e-07,
    "litellm_provider": "openai", "mode": "chat",
    "output_cost_per_token": 6e-07
  },
  "dall-e-3": {"input_cost_per_pixel": 3.81469e-08, "litellm_provider": "openai", "mode": "image_generation"}
}
"""


def prices(conn: psycopg.Connection) -> dict[str, dict]:
    return {r["model"]: json.loads(r["rates"], parse_float=Decimal)
            for r in rows(conn, "SELECT model, rates::text AS rates FROM llm.prices")}  # fmt: skip


def test_importing_litellm_converts_per_token_costs_exactly_and_again_adds_nothing(
    llm_dsn: str, llm_conn: psycopg.Connection, tmp_path: Path
) -> None:
    path = tmp_path / "model_prices_and_context_window.json"
    path.write_text(LITELLM)
    proc = llm_db("prices", "import", str(path), "--from", "2026-01-01T00:00:00Z", dsn=llm_dsn)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "3 price versions added, 0 models unchanged"
    book = prices(llm_conn)
    assert set(book) == {"claude-sonnet-4-5-20250929", "gemini/gemini-2.5-pro", "gpt-4o-mini"}
    assert book["claude-sonnet-4-5-20250929"] == {
        "input": 3, "cache_write_5m": Decimal("3.75"), "cache_write_1h": 6, "cache_read": Decimal("0.3"), "output": 15,
        "tiers": [{"above_prompt_tokens": 200000, "input": 6, "cache_write_5m": Decimal("7.5"), "cache_write_1h": 12,
                   "cache_read": Decimal("0.6"), "output": Decimal("22.5")}]}  # fmt: skip
    assert book["gpt-4o-mini"] == {"input": Decimal("0.15"), "cache_read": Decimal("0.075"), "output": Decimal("0.6")}
    assert book["gemini/gemini-2.5-pro"]["tiers"] == [
        {"above_prompt_tokens": 200000, "input": Decimal("2.5"), "cache_read": Decimal("0.25"), "output": 15}]
    # priced exactly: 1,000 input tokens of gpt-4o-mini are $0.00015, 150,000 nanos
    llm_conn.execute("SELECT llm.set_credit_rate(1000, NULL, '2026-01-01')")
    assert scalar(llm_conn, "SELECT cost_nanos FROM llm.price_usage('gpt-4o-mini', '{\"input\": 1000}')") == 150_000

    again = llm_db("prices", "import", str(path), dsn=llm_dsn)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "0 price versions added, 3 models unchanged"
    assert scalar(llm_conn, "SELECT count(*) FROM llm.prices") == 3


def test_importing_our_json_and_a_csv_and_one_model_only(llm_dsn: str, llm_conn: psycopg.Connection,
                                                         tmp_path: Path) -> None:
    ours = tmp_path / "prices.json"
    ours.write_text('{"m1": {"input": 0.1, "output": "0.30", "tiers": [{"above_prompt_tokens": 1000, "input": 0.2}]},'
                    ' "m2": {"input": 5}}')
    proc = llm_db("prices", "import", str(ours), "--model", "m1", dsn=llm_dsn)
    assert proc.returncode == 0, proc.stderr
    assert prices(llm_conn) == {"m1": {"input": Decimal("0.1"), "output": Decimal("0.3"),
                                       "tiers": [{"above_prompt_tokens": 1000, "input": Decimal("0.2")}]}}
    table = tmp_path / "prices.csv"
    table.write_text("model,input,cache_read,output\nm3,1.10,0.275,4.40\nm4,2,,8\n")
    proc = llm_db("prices", "import", str(table), dsn=llm_dsn)
    assert proc.returncode == 0, proc.stderr
    book = prices(llm_conn)
    assert book["m3"] == {"input": Decimal("1.1"), "cache_read": Decimal("0.275"), "output": Decimal("4.4")}
    assert book["m4"] == {"input": 2, "output": 8}


def test_set_and_list(llm_dsn: str, llm_conn: psycopg.Connection) -> None:
    proc = llm_db("prices", "set", "gpt-4o", '{"input": 2.50, "cache_read": "1.25", "output": 10}',
                  "--from", "2026-01-01T00:00:00Z", dsn=llm_dsn)
    assert proc.returncode == 0, proc.stderr
    version = int(proc.stdout)
    listed = llm_db("prices", "list", "--json", dsn=llm_dsn)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert (row["id"], row["model"], row["currency"]) == (version, "gpt-4o", "USD")
    assert row["rates"] == {"input": 2.5, "cache_read": 1.25, "output": 10}
    text = llm_db("prices", "list", dsn=llm_dsn)
    assert '"input": "2.5"' in text.stdout and "book" in text.stdout


def test_bad_price_files_and_rates_are_one_line_errors(llm_dsn: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("model,prompt\nm,1\n")
    proc = llm_db("prices", "import", str(bad), dsn=llm_dsn)
    assert proc.returncode == 2
    assert "unknown CSV columns: prompt" in proc.stderr
    proc = llm_db("prices", "set", "m", '{"input": -1}', dsn=llm_dsn)
    assert proc.returncode == 4
    assert_one_line_error(proc, "prices set", "22023", "out of range")


def test_reprice_dry_run_then_apply(llm_dsn: str, llm_conn: psycopg.Connection) -> None:
    """``llm-db prices reprice``: the dry run prints what would change and writes nothing;
    --apply writes the corrections, and the period's cost follows."""
    from datetime import datetime, timedelta

    from tests.helpers import call, new_org, period

    t0 = datetime(2026, 1, 15, 12, tzinfo=UTC)
    call(llm_conn, "set_price", "m", {"input": "3", "output": "15"}, effective_from=t0 - timedelta(days=9))
    call(llm_conn, "set_credit_rate", 1000, effective_from=t0 - timedelta(days=9))
    org = new_org(llm_conn, 10**9, now=t0)
    inv = call(llm_conn, "admit", org, None, "m", input_tokens=1000, max_output_tokens=200, now=t0)[0]["id"]
    call(llm_conn, "settle_usage", org, inv, {"input": 1000, "output": 200}, now=t0)
    corrected = call(llm_conn, "set_price", "m", {"input": "2.5", "output": "12"},
                     effective_from=t0 - timedelta(days=8))[0]["value"]
    window = ("--from", "2026-01-01T00:00:00Z", "--to", "2026-02-01T00:00:00Z")
    dry = llm_db("prices", "reprice", "m", str(corrected), *window, dsn=llm_dsn)
    assert dry.returncode == 0, dry.stderr
    assert f"{org}  1 requests  0.006000000 -> 0.004900000  (-0.001100000)" in dry.stdout
    assert "dry run, nothing written" in dry.stdout
    assert scalar(llm_conn, "SELECT count(*) FROM llm.cost_corrections") == 0
    applied = llm_db("prices", "reprice", "m", str(corrected), *window, "--apply", "--json", dsn=llm_dsn)
    assert applied.returncode == 0, applied.stderr
    assert json.loads(applied.stdout) == [{"organization_id": str(org), "requests": 1, "cost_before_nanos": 6_000_000,
                                           "cost_after_nanos": 4_900_000, "difference_nanos": -1_100_000}]
    assert period(llm_conn, org, t0.date().replace(day=1))["used_cost_nanos"] == 4_900_000
