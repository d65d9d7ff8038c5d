"""The price book (docs/architecture.md "The price book"): versioned prices per model,
credit rates and the exact cost of a measured usage, in nanos (10^-9 of the book's
currency), rounded once.

The golden cases price each provider's own usage object (normalized by
``llm_db.Usage``) at its published prices; each price names its source. Prices as
published on the provider's pricing page; where a page has changed since, the figures
are those of the copy cited.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from llm_db import Usage
from tests.helpers import (
    MAX_AMOUNT,
    T0,
    assert_sqlstate,
    call,
    new_org,
    params,
    rows,
    scalar,
    sql_of,
)

# One credit is worth a micro-dollar here, so credits read as millionths of a dollar.
MICRO = 1000  # nanos per credit

# --- published prices, per million tokens (USD) -------------------------------------

# https://platform.claude.com/docs/en/about-claude/pricing ("Model pricing" and "Long
# context pricing", copy of 2025-11): Claude Sonnet 4 and 4.5, prompts above 200K input
# tokens (cache reads and writes included) wholly at the long-context rates; "prompt
# caching multipliers apply on top of long context pricing" (1.25x, 2x, 0.1x of $6).
CLAUDE_SONNET_4 = {
    "input": "3", "cache_write_5m": "3.75", "cache_write_1h": "6", "cache_read": "0.30", "output": "15",
    "tiers": [{"above_prompt_tokens": 200000, "input": "6", "cache_write_5m": "7.50",
               "cache_write_1h": "12", "cache_read": "0.60", "output": "22.50"}],
}
# https://platform.openai.com/docs/pricing (gpt-4o: input $2.50, cached input $1.25,
# output $10; o4-mini: $1.10, $0.275, $4.40); reasoning tokens "are billed as output
# tokens" (https://platform.openai.com/docs/guides/reasoning).
GPT_4O = {"input": "2.50", "cache_read": "1.25", "output": "10.00"}
O4_MINI = {"input": "1.10", "cache_read": "0.275", "output": "4.40"}
# https://ai.google.dev/gemini-api/docs/pricing (gemini-2.5-pro: input $1.25 / $2.50,
# output including thinking tokens $10 / $15, context caching $0.125 / $0.25, for
# prompts <= 200k / > 200k tokens).
GEMINI_25_PRO = {
    "input": "1.25", "cache_read": "0.125", "output": "10.00",
    "tiers": [{"above_prompt_tokens": 200000, "input": "2.50", "cache_read": "0.25", "output": "15.00"}],
}


@pytest.fixture
def book(llm_conn: psycopg.Connection) -> psycopg.Connection:
    """The owner's connection to a book holding the four prices above, from T0 - 1 year,
    and a credit rate of a micro-dollar."""
    since = T0 - timedelta(days=365)
    for model, rates in (("claude-sonnet-4", CLAUDE_SONNET_4), ("gpt-4o", GPT_4O),
                         ("o4-mini", O4_MINI), ("gemini-2.5-pro", GEMINI_25_PRO)):
        set_price(llm_conn, model, rates, effective_from=since)
    call(llm_conn, "set_credit_rate", MICRO, effective_from=since)
    return llm_conn


def set_price(conn: psycopg.Connection, model: str, rates: dict[str, Any], **kwargs: Any) -> int:
    return int(scalar(conn, sql_of("set_price"), params("set_price", model, rates, **kwargs)))


def quote(conn: psycopg.Connection, model: str, usage: Usage | dict[str, int], **kwargs: Any) -> dict[str, Any]:
    kwargs.setdefault("at", T0)
    (result,) = call(conn, "price_usage", model, usage, **kwargs)
    return result


def cost(conn: psycopg.Connection, model: str, usage: Usage | dict[str, int], **kwargs: Any) -> int:
    return int(quote(conn, model, usage, **kwargs)["cost_nanos"])


def nanos(dollars: str) -> int:
    """An exact dollar figure as nanos (it must be a whole number of nanos)."""
    value = Decimal(dollars) * 10**9
    assert value == value.to_integral_value(), dollars
    return int(value)


# --- golden cases ----------------------------------------------------------------------


def test_an_anthropic_call_with_cache_reads_and_both_cache_writes(book: psycopg.Connection) -> None:
    usage = Usage.from_anthropic({
        "input_tokens": 1200, "cache_read_input_tokens": 50000, "cache_creation_input_tokens": 3000,
        "cache_creation": {"ephemeral_5m_input_tokens": 2000, "ephemeral_1h_input_tokens": 1000},
        "output_tokens": 800,
    })
    # 1200 * 3 + 50000 * 0.30 + 2000 * 3.75 + 1000 * 6 + 800 * 15 = 44,100 millionths
    assert cost(book, "claude-sonnet-4", usage) == nanos("0.0441")


def test_the_anthropic_long_context_tier_below_at_and_above_200k(book: psycopg.Connection) -> None:
    def priced(input_tokens: int, cache_read: int) -> dict[str, Any]:
        usage = Usage.from_anthropic({"input_tokens": input_tokens, "cache_read_input_tokens": cache_read,
                                      "output_tokens": 1000})
        return quote(book, "claude-sonnet-4", usage)

    below, at, above = priced(99_999, 100_000), priced(100_000, 100_000), priced(100_001, 100_000)
    # 199,999 and 200,000 prompt tokens: base rates; 99,999 * 3 + 100,000 * 0.30 + 1000 * 15
    assert (below["cost_nanos"], below["price_tier"]) == (nanos("0.344997"), None)
    assert (at["cost_nanos"], at["price_tier"]) == (nanos("0.345"), None)
    # 200,001 (the cache reads count toward the threshold): every token at the tier's rates,
    # 100,001 * 6 + 100,000 * 0.60 + 1000 * 22.50
    assert (above["cost_nanos"], above["price_tier"]) == (nanos("0.682506"), 200000)


def test_an_openai_chat_completion_removes_cached_and_reasoning_overlaps(book: psycopg.Connection) -> None:
    # Chat Completions counts the cached tokens inside prompt_tokens and the reasoning
    # tokens inside completion_tokens.
    usage = Usage.from_openai({
        "prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
        "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 192, "audio_tokens": 0,
                                      "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
    })
    assert usage == Usage(input=86, cache_read=1920, output=108, reasoning=192)
    # 86 * 1.10 + 1920 * 0.275 + (108 + 192) * 4.40 = 1,942.6 millionths
    assert cost(book, "o4-mini", usage) == nanos("0.0019426")


def test_an_openai_response_prices_like_the_same_chat_completion(book: psycopg.Connection) -> None:
    responses = Usage.from_openai({
        "input_tokens": 2006, "input_tokens_details": {"cached_tokens": 1920},
        "output_tokens": 300, "output_tokens_details": {"reasoning_tokens": 192}, "total_tokens": 2306,
    })
    assert responses == Usage(input=86, cache_read=1920, output=108, reasoning=192)
    assert cost(book, "o4-mini", responses) == nanos("0.0019426")
    # gpt-4o: 86 * 2.50 + 1920 * 1.25 + 300 * 10
    assert cost(book, "gpt-4o", responses) == nanos("0.005615")


def test_a_gemini_call_with_cached_content_and_thoughts_below_and_above_200k(book: psycopg.Connection) -> None:
    # promptTokenCount includes cachedContentTokenCount; thoughtsTokenCount is beside
    # candidatesTokenCount and billed at the output rate.
    small = Usage.from_gemini({"promptTokenCount": 12000, "cachedContentTokenCount": 8000,
                               "candidatesTokenCount": 500, "thoughtsTokenCount": 1500, "totalTokenCount": 14000})
    assert small == Usage(input=4000, cache_read=8000, output=500, reasoning=1500)
    # 4000 * 1.25 + 8000 * 0.125 + 2000 * 10
    assert cost(book, "gemini-2.5-pro", small) == nanos("0.026")
    large = Usage.from_gemini({"prompt_token_count": 250000, "cached_content_token_count": 100000,
                               "candidates_token_count": 500, "thoughts_token_count": 1500})
    q = quote(book, "gemini-2.5-pro", large)
    # 150,000 * 2.50 + 100,000 * 0.25 + 2000 * 15
    assert (q["cost_nanos"], q["price_tier"]) == (nanos("0.43"), 200000)


# --- the defects of the peers, each priced right ------------------------------------------


def test_cached_tokens_are_not_counted_twice_nor_priced_as_input(book: psycopg.Connection) -> None:
    openai = {"prompt_tokens": 10000, "prompt_tokens_details": {"cached_tokens": 8000}, "completion_tokens": 0}
    right = cost(book, "gpt-4o", Usage.from_openai(openai))
    assert right == nanos("0.015")  # 2000 * 2.50 + 8000 * 1.25
    assert right != cost(book, "gpt-4o", {"input": 10000, "cache_read": 8000})  # counted twice
    assert right != cost(book, "gpt-4o", {"input": 10000})  # priced as input


def test_reasoning_tokens_are_not_billed_twice(book: psycopg.Connection) -> None:
    usage = Usage.from_openai({"prompt_tokens": 0, "completion_tokens": 1000,
                               "completion_tokens_details": {"reasoning_tokens": 900}})
    assert cost(book, "o4-mini", usage) == nanos("0.0044")  # 1000 output tokens, once


def test_a_reasoning_rate_of_its_own_is_used_and_a_tier_without_one_takes_its_output_rate(
    llm_conn: psycopg.Connection,
) -> None:
    call(llm_conn, "set_credit_rate", MICRO, effective_from=T0)
    set_price(llm_conn, "thinker", {"input": 1, "output": 10, "reasoning": 5,
                                    "tiers": [{"above_prompt_tokens": 100, "output": 20}]}, effective_from=T0)
    assert cost(llm_conn, "thinker", {"reasoning": 1000}) == nanos("0.005")
    # above the tier: the tier lists no reasoning rate but the base does; the base's wins
    # over the tier's output rate ("a class's rate is the tier's, else the base's")
    assert cost(llm_conn, "thinker", {"input": 101, "reasoning": 1000}) == nanos("0.005101")
    set_price(llm_conn, "plain", {"input": 1, "output": 10, "tiers": [{"above_prompt_tokens": 100, "output": 20}]},
              effective_from=T0)
    # no reasoning rate anywhere: the request's output rate, the tier's above it
    assert cost(llm_conn, "plain", {"reasoning": 1000}) == nanos("0.01")
    assert cost(llm_conn, "plain", {"input": 101, "reasoning": 1000}) == nanos("0.020101")


def test_a_negotiated_price_wins_for_its_organization_only(book: psycopg.Connection) -> None:
    acme, other = new_org(book), new_org(book)
    version = set_price(book, "gpt-4o", {"input": "2", "cache_read": "1", "output": "8"},
                        effective_from=T0 - timedelta(days=30), organization_id=acme)
    usage = {"input": 1000, "output": 1000}
    mine = quote(book, "gpt-4o", usage, organization_id=acme)
    assert (mine["cost_nanos"], mine["price_version_id"]) == (nanos("0.01"), version)
    assert cost(book, "gpt-4o", usage, organization_id=other) == nanos("0.0125")
    assert cost(book, "gpt-4o", usage) == nanos("0.0125")
    # a later book version does not displace the organization's own
    set_price(book, "gpt-4o", {"input": "5", "output": "20"}, effective_from=T0 - timedelta(days=1))
    assert cost(book, "gpt-4o", usage, organization_id=acme) == nanos("0.01")
    assert cost(book, "gpt-4o", usage, organization_id=other) == nanos("0.025")


def test_an_unknown_model_is_refused_never_priced_at_zero(book: psycopg.Connection) -> None:
    error = assert_sqlstate(book, "LL014", sql_of("price_usage"),
                            params("price_usage", "gpt-9", {"input": 1}, at=T0))
    assert error.diag.message_detail == "model=gpt-9 organization=- at=2026-01-15T12:00:00Z"


def test_the_fallback_prices_only_a_model_without_a_version_in_force(book: psycopg.Connection) -> None:
    fallback = set_price(book, "*", {"input": "100", "output": "100"}, effective_from=T0 - timedelta(days=1))
    q = quote(book, "gpt-9", {"input": 1000})
    assert (q["cost_nanos"], q["price_version_id"], q["priced_by"]) == (nanos("0.1"), fallback, "fallback")
    assert quote(book, "gpt-4o", {"input": 1000})["priced_by"] == "model"
    # before gpt-4o's first version the fallback prices it too
    set_price(book, "gpt-5", {"input": "1"}, effective_from=T0)
    assert quote(book, "gpt-5", {"input": 1000}, at=T0 - timedelta(seconds=1))["priced_by"] == "fallback"
    assert quote(book, "gpt-5", {"input": 1000}, at=T0)["priced_by"] == "model"


def test_tokens_of_a_class_without_a_rate_are_refused_naming_class_and_version(book: psycopg.Connection) -> None:
    error = assert_sqlstate(book, "22023", sql_of("price_usage"),
                            params("price_usage", "gpt-4o", {"input": 1, "cache_write_1h": 10}, at=T0))
    assert "cache_write_1h" in error.diag.message_primary
    assert error.diag.message_detail.startswith("Price version ")
    # zero tokens of it price fine
    assert cost(book, "gpt-4o", {"input": 1000, "cache_write_1h": 0}) == nanos("0.0025")


def test_a_tiny_cost_is_kept_to_the_nano_where_cents_would_round_it_away(book: psycopg.Connection) -> None:
    set_price(book, "gpt-4o-mini", {"input": "0.15", "cache_read": "0.075", "output": "0.60"},
              effective_from=T0 - timedelta(days=1))
    assert cost(book, "gpt-4o-mini", {"input": 1000}) == 150_000  # $0.00015, 0.015 of a cent
    assert cost(book, "gpt-4o-mini", {"cache_read": 1}) == 75  # 7.5e-8 dollars
    # half up, once: 1 token at $0.0005 per million is half a nano
    set_price(book, "half", {"input": "0.0005", "output": "0.0015"}, effective_from=T0 - timedelta(days=1))
    assert cost(book, "half", {"input": 1}) == 1
    assert cost(book, "half", {"input": 1, "output": 1}) == 2  # 0.5 + 1.5, rounded once
    assert cost(book, "half", {"output": 1}) == 2


def test_a_million_tiny_requests_sum_exactly(book: psycopg.Connection) -> None:
    """A million calls of about 1,000 input tokens of a small model: $150.075 exactly,
    each priced both ways a priced call goes: from the version's units in one expression
    (llm._unit_cost, the request path) and class by class from its rates
    (llm._usage_cost). In cents each would round to 0 and the sum would be $0."""
    version = set_price(book, "gpt-4o-mini", {"input": "0.15", "output": "0.60"}, effective_from=T0 - timedelta(days=1))
    totals = rows(book, """
        SELECT sum(pg_catalog.round(llm._unit_cost(v.unit_nanos, llm._full_usage(u.usage)))) AS by_units,
               sum((llm._usage_cost(v.model, v.id, v.rates, u.usage, 1)).cost_nanos) AS by_classes
          FROM llm.price_versions AS v, pg_catalog.generate_series(1, 1000000) AS n,
               LATERAL (SELECT pg_catalog.jsonb_build_object('input', 1000 + n %% 2) AS usage) AS u
         WHERE v.id = %(version)s""", {"version": version})[0]
    # 500,000 calls of 1,000 tokens and 500,000 of 1,001: 150,000 and 150,150 nanos each
    assert totals["by_units"] == totals["by_classes"] == 500_000 * 150_000 + 500_000 * 150_150 == nanos("150.075")
    assert cost(book, "gpt-4o-mini", {"input": 1001}) == 150_150
    assert round(Decimal(150_150) / 10**7) == 0  # the same call in whole cents: nothing


def test_the_per_call_fee_is_charged_once_per_call(book: psycopg.Connection) -> None:
    set_price(book, "search", {"input": "1", "requests": "0.035"}, effective_from=T0 - timedelta(days=1))
    assert cost(book, "search", {"input": 1000}) == nanos("0.036")
    assert cost(book, "search", {"input": 1000, "requests": 0}) == nanos("0.001")
    assert cost(book, "search", {"requests": 3}) == nanos("0.105")


# --- credits -------------------------------------------------------------------------


def test_credits_are_the_cost_divided_by_the_credit_rate_rounded_up(book: psycopg.Connection) -> None:
    q = quote(book, "gpt-4o", {"input": 1})  # 2,500 nanos at 1,000 a credit
    assert (q["cost_nanos"], q["credits"]) == (2500, 3)
    assert quote(book, "gpt-4o", {"input": 2})["credits"] == 5
    assert quote(book, "gpt-4o", {"input": 0, "requests": 0})["credits"] == 0


def test_an_organizations_credit_rate_wins_and_versions_take_effect_in_time(book: psycopg.Connection) -> None:
    acme = new_org(book)
    plan = call(book, "set_credit_rate", 500, organization_id=acme, effective_from=T0 + timedelta(hours=1))
    later = T0 + timedelta(hours=2)
    assert quote(book, "gpt-4o", {"input": 1000}, organization_id=acme)["credits"] == 2500
    q = quote(book, "gpt-4o", {"input": 1000}, organization_id=acme, at=later)
    assert (q["credits"], q["credit_rate_id"]) == (5000, plan[0]["value"])
    assert quote(book, "gpt-4o", {"input": 1000}, at=later)["credits"] == 2500


def test_without_a_credit_rate_pricing_is_refused_like_a_missing_price(llm_conn: psycopg.Connection) -> None:
    set_price(llm_conn, "gpt-4o", GPT_4O, effective_from=T0)
    error = assert_sqlstate(llm_conn, "LL014", sql_of("price_usage"),
                            params("price_usage", "gpt-4o", {"input": 1}, at=T0))
    assert "credit rate" in error.diag.message_primary


# --- versions ------------------------------------------------------------------------


def test_versions_are_immutable_and_setting_the_same_rates_again_adds_none(book: psycopg.Connection) -> None:
    since = T0 - timedelta(days=365)
    before = rows(book, "SELECT * FROM llm.prices ORDER BY id")
    # the same rates spelled otherwise: numbers for strings, trailing zeros, tiers reordered
    same = {"input": 3, "cache_write_5m": 3.75, "cache_write_1h": "6.0", "cache_read": "0.3", "output": 15,
            "currency": "USD",
            "tiers": [{"above_prompt_tokens": 200000, "input": 6, "cache_write_5m": "7.5",
                       "cache_write_1h": 12, "cache_read": "0.6", "output": "22.5"}]}
    same_json = {k: (Decimal(str(v)) if isinstance(v, float) else v) for k, v in same.items()}
    version = set_price(book, "claude-sonnet-4", same_json, effective_from=since)
    assert version == before[0]["id"]
    assert rows(book, "SELECT * FROM llm.prices ORDER BY id") == before
    assert_sqlstate(book, "22023", sql_of("set_price"),
                    params("set_price", "claude-sonnet-4", {"input": "3.01", "output": "15"}, effective_from=since))
    # exactly the rates in force at a later time add no version either
    assert set_price(book, "claude-sonnet-4", CLAUDE_SONNET_4, effective_from=T0) == version
    assert rows(book, "SELECT * FROM llm.prices ORDER BY id") == before
    # a correction is a later version; the earlier one still prices its own time
    fixed = set_price(book, "claude-sonnet-4", {"input": "3.01", "output": "15"}, effective_from=T0)
    assert fixed > version
    assert quote(book, "claude-sonnet-4", {"input": 1000}, at=T0 - timedelta(microseconds=1))["price_version_id"] == version
    assert quote(book, "claude-sonnet-4", {"input": 1000}, at=T0)["price_version_id"] == fixed


def test_the_prices_view_lists_exact_rates_and_tiers_in_order(book: psycopg.Connection) -> None:
    set_price(book, "tiered", {"input": "1.000", "tiers": [{"above_prompt_tokens": 500, "input": "3"},
                                                          {"above_prompt_tokens": 100, "input": "2"}]},
              effective_from=T0)
    (listed,) = rows(book, "SELECT model, organization_id, currency, rates FROM llm.prices WHERE model = 'tiered'")
    assert listed == {"model": "tiered", "organization_id": None, "currency": "USD",
                      "rates": {"input": 1, "tiers": [{"above_prompt_tokens": 100, "input": 2},
                                                      {"above_prompt_tokens": 500, "input": 3}]}}
    assert cost(book, "tiered", {"input": 100}) == 100_000
    assert cost(book, "tiered", {"input": 101}) == 202_000
    assert cost(book, "tiered", {"input": 501}) == 1_503_000


@pytest.mark.parametrize(
    ("rates", "reason"),
    [
        ({}, "no rate"),
        ({"input": -1}, "out of range"),
        ({"input": "1e3"}, "no number"),
        ({"input": "0.0000000000001"}, "out of range"),
        ({"input": 1000001}, "out of range"),
        ({"input": True}, "no number"),
        ({"prompt": 1}, "unknown token class"),
        ({"input": 1, "currency": "EUR"}, "another currency"),
        ({"input": 1, "tiers": {"above_prompt_tokens": 1}}, "no list"),
        ({"input": 1, "tiers": [{"input": 2}]}, "without above_prompt_tokens"),
        ({"input": 1, "tiers": [{"above_prompt_tokens": 1.5, "input": 2}]}, "threshold out of range"),
        ({"input": 1, "tiers": [{"above_prompt_tokens": 5}]}, "tier with no rate"),
        ({"input": 1, "tiers": [{"above_prompt_tokens": 5, "input": 2}, {"above_prompt_tokens": 5, "input": 3}]},
         "two tiers"),
    ],
)
def test_a_price_that_cannot_price_is_refused_and_writes_nothing(
    llm_conn: psycopg.Connection, rates: dict[str, Any], reason: str
) -> None:
    error = assert_sqlstate(llm_conn, "22023", "SELECT llm.set_price('m', %(rates)s::jsonb)",
                            {"rates": psycopg.types.json.Jsonb(rates)})
    assert reason in error.diag.message_primary


def test_a_price_for_an_unknown_organization_is_LL002(llm_conn: psycopg.Connection) -> None:
    assert_sqlstate(llm_conn, "LL002", sql_of("set_price"),
                    params("set_price", "m", {"input": 1}, organization_id=uuid.uuid4()))
    assert_sqlstate(llm_conn, "LL002", sql_of("set_credit_rate"),
                    params("set_credit_rate", 10, organization_id=uuid.uuid4()))


@pytest.mark.parametrize(
    "usage",
    [{"input": -1}, {"input": 1.5}, {"input": "3"}, {"input": 10**15 + 1}, {"prompt": 3}, {"input": None}],
)
def test_a_usage_that_is_no_token_count_by_class_is_22023(book: psycopg.Connection, usage: dict[str, Any]) -> None:
    assert_sqlstate(book, "22023", "SELECT * FROM llm.price_usage('gpt-4o', %(usage)s::jsonb)",
                    {"usage": psycopg.types.json.Jsonb(usage)})


def test_a_usage_costing_more_than_one_call_may_is_22023(book: psycopg.Connection) -> None:
    set_price(book, "dear", {"input": 1000000}, effective_from=T0 - timedelta(days=1))
    assert cost(book, "dear", {"input": 10**6}) == 10**15
    assert_sqlstate(book, "22023", sql_of("price_usage"),
                    params("price_usage", "dear", {"input": 10**6 + 1}, at=T0))


def test_the_app_prices_and_reads_the_book_but_only_the_operator_sets_it(
    book: psycopg.Connection, llm_role_conn: Any
) -> None:
    app, operator = llm_role_conn("llm_app"), llm_role_conn("llm_operator")
    assert cost(app, "gpt-4o", {"input": 1000}) == nanos("0.0025")
    assert len(rows(app, "SELECT * FROM llm.prices")) == 4
    assert_sqlstate(app, "42501", sql_of("set_price"), params("set_price", "m", {"input": 1}), unchanged=False)
    assert_sqlstate(app, "42501", sql_of("set_credit_rate"), params("set_credit_rate", 1), unchanged=False)
    assert set_price(operator, "m", {"input": 1}) > 0
    assert call(operator, "set_credit_rate", 7)[0]["value"] > 0


# --- the driver ------------------------------------------------------------------------


def test_the_driver_sets_prices_and_prices_usage_sync_and_async(llm_conn: psycopg.Connection, llm_dsn: str) -> None:
    from llm_db import AsyncLlm, Llm, PriceMissing, PriceQuote
    from llm_db.errors import InvalidArgument

    llm = Llm(llm_conn)
    version = llm.set_price("claude-sonnet-4", {"input": Decimal("3"), "output": "15", "cache_read": Decimal("0.30")},
                            effective_from=T0)
    assert llm.set_credit_rate(MICRO, effective_from=T0) > 0
    usage = Usage.from_anthropic({"input_tokens": 1000, "cache_read_input_tokens": 1000, "output_tokens": 100})
    q = llm.price_usage("claude-sonnet-4", usage, at=T0)
    assert q == PriceQuote(cost_nanos=nanos("0.0048"), credits=4800, price_version_id=version,
                           credit_rate_id=q.credit_rate_id, price_tier=None, priced_by="model", currency="USD")
    with pytest.raises(PriceMissing) as caught:
        llm.price_usage("gpt-9", Usage(input=1), at=T0)
    assert caught.value.detail == "model=gpt-9 organization=- at=2026-01-15T12:00:00Z"
    # a float is refused before anything is sent: 0.1 is not a tenth
    before = rows(llm_conn, "SELECT * FROM llm.prices")
    with pytest.raises(InvalidArgument, match="no float"):
        llm.set_price("m", {"input": 0.1})
    with pytest.raises(InvalidArgument, match="no float"):
        llm.price_usage("claude-sonnet-4", {"input": 1.0})
    assert rows(llm_conn, "SELECT * FROM llm.prices") == before

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(llm_dsn, autocommit=True) as conn:
            allm = AsyncLlm(conn)
            assert await allm.set_price("claude-sonnet-4", {"input": 3, "output": 15, "cache_read": "0.3"},
                                        effective_from=T0) == version
            assert await allm.price_usage("claude-sonnet-4", usage, at=T0) == q
            with pytest.raises(InvalidArgument):
                await allm.set_price("m", {"input": 0.5})

    asyncio.run(scenario())


# --- pricing on the request path -------------------------------------------------------
# Admission and settlement price from a version's unit_nanos in one expression
# (llm._unit_estimate, llm._unit_cost) and fall back to the class-by-class llm._usage_cost
# for a price with tiers and for what it refuses; these hold the two to one answer.

CLASSES = ("input", "cache_read", "cache_write_5m", "cache_write_1h", "output", "reasoning", "requests")
RATE = st.one_of(st.decimals(min_value=0, max_value=1000, places=3),
                 st.decimals(min_value=0, max_value=1000000, places=12))
TOKENS = st.one_of(st.just(0), st.integers(0, 10**6), st.integers(0, 10**15))


def priced_both_ways(conn: psycopg.Connection, rates: dict[str, Any], usage: dict[str, int]) -> tuple[Any, Any]:
    """(the cost from units, or None where they leave it to the classes; the class-by-class
    cost, or the SQLSTATE it refuses with) of ``usage`` at ``rates`` as set_price stores them.
    The stored rates stay on the server: read into Python, a jsonb number is a float."""
    params = {"r": Jsonb(rates), "u": Jsonb(usage)}
    by_units = scalar(conn, "SELECT pg_catalog.round(llm._unit_cost(llm._unit_nanos(llm._normalized_rates('m', %(r)s)),"
                            " llm._full_usage(%(u)s)))", params)  # fmt: skip
    try:
        with conn.transaction():
            by_classes = scalar(conn, "SELECT (llm._usage_cost('m', 0, llm._normalized_rates('m', %(r)s), %(u)s, 1))"
                                      ".cost_nanos", params)  # fmt: skip
    except psycopg.Error as error:
        by_classes = error.sqlstate
    return (by_units if by_units is not None and by_units <= MAX_AMOUNT else None), by_classes


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rates=st.dictionaries(st.sampled_from(CLASSES), RATE, min_size=1),
       usage=st.dictionaries(st.sampled_from(CLASSES), TOKENS))
# found by a run: a call's fee whose nanos end in .477, which a float rounds to .5
@example(rates={"requests": Decimal("999999.999999999477")}, usage={})
# and one whose estimate (a call and a token) passes 10^15 where its usage does not
@example(rates={"requests": Decimal("999999.999986090420"), "input": Decimal("13.990")},
         usage={"requests": 0, "input": 1})
def test_property_units_price_every_usage_as_the_classes_do(llm_conn: psycopg.Connection,
                                                            rates: dict[str, Decimal], usage: dict[str, int]) -> None:
    """For any base price and any usage: the one-expression cost from units is the
    class-by-class cost exactly, and where the units leave a usage to the classes (a sum
    past 10^15: tokens of a class with no rate, or a cost too high) the classes refuse it
    (22023), so the request path never charges what the class-by-class rule would not."""
    by_units, by_classes = priced_both_ways(llm_conn, {k: format(v, "f") for k, v in rates.items()}, usage)
    if by_units is None:
        assert by_classes == "22023"
    else:
        assert by_units == by_classes
        # admission's estimate from units, where admission takes it (at most 10^15), is
        # the classes' cost of the usage it stands for; past it, the classes refuse
        estimate = {k: usage.get(k, 0) for k in ("input", "output")}
        from_units = scalar(llm_conn, "SELECT pg_catalog.round(llm._unit_estimate("
                                      "llm._unit_nanos(llm._normalized_rates('m', %(r)s)), %(i)s, %(o)s))",
                            {"r": Jsonb({k: format(v, "f") for k, v in rates.items()}),
                             "i": estimate["input"], "o": estimate["output"]})  # fmt: skip
        from_classes = priced_both_ways(llm_conn, {k: format(v, "f") for k, v in rates.items()}, estimate)[1]
        assert from_classes == ("22023" if from_units > MAX_AMOUNT else from_units)


def test_a_version_keeps_its_base_rates_as_units_and_one_with_tiers_none(book: psycopg.Connection) -> None:
    units = {r["model"]: r["unit_nanos"] for r in rows(book, "SELECT model, unit_nanos FROM llm.price_versions")}
    # per token: $2.50 per million is 2,500 nanos; reasoning at the output rate; requests
    # 0; a class with no rate at 10^30, past any cost
    assert units["gpt-4o"] == {"input": 2500, "cache_read": 1250, "cache_write_5m": 10**30, "cache_write_1h": 10**30,
                               "output": 10000, "reasoning": 10000, "requests": 0}
    assert units["claude-sonnet-4"] is None and units["gemini-2.5-pro"] is None  # tiers: class by class
    set_price(book, "search", {"input": "1", "reasoning": "2", "requests": "0.035"}, effective_from=T0)
    assert scalar(book, "SELECT unit_nanos FROM llm.price_versions WHERE model = 'search'") == {
        "input": 1000, "cache_read": 10**30, "cache_write_5m": 10**30, "cache_write_1h": 10**30,
        "output": 10**30, "reasoning": 2000, "requests": 35000000}


def test_a_settlement_priced_from_units_refuses_tokens_of_a_class_without_a_rate(book: psycopg.Connection) -> None:
    """Units put tokens of an unpriced class past any cost; the settlement then prices
    class by class, which refuses them by name with nothing written, and zero tokens of
    the class settle from the units."""
    org = new_org(book, 10**9)
    first = call(book, "admit", org, None, "gpt-4o", input_tokens=1000, max_output_tokens=100, now=T0)[0]["id"]
    before = rows(book, "SELECT * FROM llm.invocations WHERE organization_id = %s", [org])
    error = assert_sqlstate(book, "22023", sql_of("settle_usage"),
                            params("settle_usage", org, first, {"input": 1000, "cache_write_1h": 1}, now=T0))
    assert "no rate for cache_write_1h" in error.diag.message_primary
    assert rows(book, "SELECT * FROM llm.invocations WHERE organization_id = %s", [org]) == before
    assert call(book, "settle_usage", org, first, {"input": 1000, "cache_write_1h": 0}, now=T0)[0]["value"] == "settled"
    assert scalar(book, "SELECT cost_nanos FROM llm.invocations WHERE id = %s", [first]) == nanos("0.0025")
