"""A request priced by the book (docs/architecture.md "The price book"): an admission
pins the price in force for its model and, without an estimate, has its tokens
priced; a settlement with the provider's usage (llm.settle_usage) charges the credits
its exact cost comes to at the pinned price and records that cost. The books move as
for any settlement (BR-CAP-PFM-LLM-009-01: a recovered request still settles at its
stored estimate, with no money figure)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from llm_db import AsyncLlm, Llm, PriceMissing, Usage
from llm_db.errors import IdempotencyConflict, InvalidArgument
from tests.helpers import (
    ADMIT_SQL,
    HOUR,
    T0,
    assert_sqlstate,
    call,
    fail,
    invariants,
    invocation,
    new_org,
    params,
    period,
    reconcile,
    scalar,
    settle,
    sql_of,
)

SINCE = T0 - timedelta(days=30)
# per million tokens; a credit is a micro-dollar (1,000 nanos)
GPT = {"input": "2.50", "cache_read": "1.25", "output": "10"}
CLAUDE = {"input": "3", "cache_write_5m": "3.75", "cache_read": "0.30", "output": "15",
          "tiers": [{"above_prompt_tokens": 200000, "input": "6", "cache_write_5m": "7.50",
                     "cache_read": "0.60", "output": "22.50"}]}


@pytest.fixture
def book(llm_conn: psycopg.Connection) -> psycopg.Connection:
    call(llm_conn, "set_price", "gpt-4o", GPT, effective_from=SINCE)
    call(llm_conn, "set_price", "claude-sonnet-4", CLAUDE, effective_from=SINCE)
    call(llm_conn, "set_credit_rate", 1000, effective_from=SINCE)
    return llm_conn


def version_of(conn: psycopg.Connection, model: str) -> int:
    return scalar(conn, "SELECT max(id) FROM llm.prices WHERE model = %(m)s", {"m": model})


def admit_priced(conn: psycopg.Connection, org: uuid.UUID, model: str, input_tokens: int, max_output: int,
                 **kwargs: Any) -> dict[str, Any]:
    kwargs.setdefault("now", T0)
    (row,) = call(conn, "admit", org, None, model, input_tokens=input_tokens, max_output_tokens=max_output, **kwargs)
    return row


def settle_usage(conn: psycopg.Connection, org: uuid.UUID, inv: uuid.UUID, usage: Usage | dict[str, int],
                 now: Any = T0 + timedelta(seconds=5)) -> str:
    (row,) = call(conn, "settle_usage", org, inv, usage, now=now)
    return row["value"]


# --- admission -------------------------------------------------------------------------


def test_a_priced_admission_holds_its_tokens_at_the_price_in_force(book: psycopg.Connection) -> None:
    org = new_org(book, 10**9)
    inv = admit_priced(book, org, "gpt-4o", 10000, 2000)
    # 10,000 * 2.50 + 2,000 * 10 = $0.045 = 45,000 credits of a micro-dollar
    assert (inv["estimate_credits"], inv["hold_credits"]) == (45000, 45000)
    stored = invocation(book, org, inv["id"])
    assert (stored["price_version_id"], stored["credit_rate_id"]) == (version_of(book, "gpt-4o"), 1)
    assert period(book, org)["held_credits"] == 45000
    assert invariants(book) == []


def test_a_priced_estimate_takes_the_tier_its_input_selects_and_rounds_up(book: psycopg.Connection) -> None:
    org = new_org(book, 10**9)
    # 200,001 input tokens: the long-context tier for all of it, 200,001 * 6 + 1 * 22.50
    assert admit_priced(book, org, "claude-sonnet-4", 200001, 1)["estimate_credits"] == 1200029  # 1,200,028.5 up
    assert admit_priced(book, org, "claude-sonnet-4", 200000, 1)["estimate_credits"] == 600015


def test_an_admission_with_credits_pins_the_price_too_and_one_without_a_price_pins_nothing(
    book: psycopg.Connection,
) -> None:
    org = new_org(book, 10**9)
    priced = call(book, "admit", org, 10, "gpt-4o", now=T0)[0]
    assert invocation(book, org, priced["id"])["price_version_id"] == version_of(book, "gpt-4o")
    unpriced = call(book, "admit", org, 10, "model-x", now=T0)[0]
    assert invocation(book, org, unpriced["id"])["price_version_id"] is None


def test_a_priced_admission_of_a_model_without_a_price_is_LL014_and_holds_nothing(book: psycopg.Connection) -> None:
    org = new_org(book, 10**9)
    error = assert_sqlstate(book, "LL014", ADMIT_SQL,
                            params("admit", org, None, "gpt-9", input_tokens=1, max_output_tokens=1, now=T0))
    assert error.diag.message_detail == f"model=gpt-9 organization={org} at=2026-01-15T12:00:00Z"
    # an unknown organization is LL002 first, a suspended one LL003
    assert_sqlstate(book, "LL002", ADMIT_SQL,
                    params("admit", uuid.uuid4(), None, "gpt-9", input_tokens=1, max_output_tokens=1, now=T0))
    suspended = new_org(book, 10, status="suspended")
    assert_sqlstate(book, "LL003", ADMIT_SQL,
                    params("admit", suspended, None, "gpt-9", input_tokens=1, max_output_tokens=1, now=T0))


def test_without_a_credit_rate_a_priced_admission_is_LL014(llm_conn: psycopg.Connection) -> None:
    call(llm_conn, "set_price", "gpt-4o", GPT, effective_from=SINCE)
    org = new_org(llm_conn, 10**9)
    error = assert_sqlstate(llm_conn, "LL014", ADMIT_SQL,
                            params("admit", org, None, "gpt-4o", input_tokens=1, max_output_tokens=1, now=T0))
    assert "credit rate" in error.diag.message_primary


@pytest.mark.parametrize(
    ("estimate", "tokens"),
    [(None, {}), (None, {"input_tokens": 5}), (None, {"max_output_tokens": 5}), (5, {"input_tokens": 5}),
     (None, {"input_tokens": -1, "max_output_tokens": 1}), (None, {"input_tokens": 1, "max_output_tokens": 10**15 + 1})],
)
def test_an_admission_names_one_estimate_source(book: psycopg.Connection, estimate: int | None,
                                                tokens: dict[str, int]) -> None:
    org = new_org(book, 10**9)
    assert_sqlstate(book, "22023", ADMIT_SQL, params("admit", org, estimate, "gpt-4o", now=T0, **tokens))


def test_a_priced_retry_replays_even_after_the_price_changed(book: psycopg.Connection) -> None:
    org = new_org(book, 10**9)
    inv_id = uuid.uuid4()
    first = admit_priced(book, org, "gpt-4o", 1000, 100, invocation_id=inv_id)
    call(book, "set_price", "gpt-4o", {"input": "5", "output": "20"}, effective_from=T0 - HOUR)
    again = admit_priced(book, org, "gpt-4o", 1000, 100, invocation_id=inv_id)
    assert again["replayed"] and again["estimate_credits"] == first["estimate_credits"] == 3500
    assert_sqlstate(book, "LL007", ADMIT_SQL, params("admit", org, None, "gpt-4o", input_tokens=100000,
                                                     max_output_tokens=100, invocation_id=inv_id, now=T0))
    assert period(book, org)["held_credits"] == 3500


# --- settlement ------------------------------------------------------------------------


def test_settle_usage_charges_the_exact_cost_in_credits_and_records_it(book: psycopg.Connection) -> None:
    org = new_org(book, 10**9)
    inv = admit_priced(book, org, "claude-sonnet-4", 60000, 1000)
    usage = Usage.from_anthropic({"input_tokens": 1200, "cache_read_input_tokens": 50000,
                                  "cache_creation_input_tokens": 3000, "output_tokens": 800})
    assert settle_usage(book, org, inv["id"], usage) == "settled"
    stored = invocation(book, org, inv["id"])
    # 1,200 * 3 + 50,000 * 0.30 + 3,000 * 3.75 + 800 * 15 = 41,850 millionths
    assert stored["cost_nanos"] == 41_850_000
    assert (stored["charged_credits"], stored["charged_cents"]) == (41850, None)
    assert (stored["input_tokens"], stored["output_tokens"]) == (54200, 800)
    assert (stored["priced_by"], stored["price_tier"], stored["settlement_kind"]) == ("model", None, "measured")
    # kept as the driver reports it: the classes with tokens (a missing class 0, requests 1)
    assert stored["usage"] == {"input": 1200, "cache_read": 50000, "cache_write_5m": 3000, "output": 800}
    p = period(book, org)
    assert (p["used_credits"], p["held_credits"], p["used_cents"]) == (41850, 0, 0)
    assert invariants(book) == []


def test_settlement_prices_at_the_pinned_version_not_the_one_in_force(book: psycopg.Connection) -> None:
    org = new_org(book, 10**9)
    inv = admit_priced(book, org, "gpt-4o", 1000, 1000)
    newer = call(book, "set_price", "gpt-4o", {"input": "100", "output": "100"}, effective_from=T0)[0]["value"]
    call(book, "set_credit_rate", 1, effective_from=T0)
    assert settle_usage(book, org, inv["id"], {"input": 1000, "output": 1000}) == "settled"
    stored = invocation(book, org, inv["id"])
    assert (stored["cost_nanos"], stored["charged_credits"]) == (12_500_000, 12500)  # wholly the pinned price
    later = admit_priced(book, org, "gpt-4o", 1000, 1000, now=T0 + HOUR)
    assert invocation(book, org, later["id"])["price_version_id"] == newer


def test_a_settlement_retry_repeats_and_other_usage_is_LL007(book: psycopg.Connection) -> None:
    org = new_org(book, 10**9)
    inv = admit_priced(book, org, "gpt-4o", 1000, 1000)
    usage = {"input": 900, "output": 10}
    assert settle_usage(book, org, inv["id"], usage) == "settled"
    assert settle_usage(book, org, inv["id"], dict(usage, reasoning=0)) == "already_settled"
    assert_sqlstate(book, "LL007", sql_of("settle_usage"),
                    params("settle_usage", org, inv["id"], {"input": 901, "output": 10}, now=T0))
    assert period(book, org)["used_credits"] == 2350


def test_settle_usage_of_a_request_admitted_without_a_price_is_LL014(book: psycopg.Connection) -> None:
    org = new_org(book, 10**9)
    inv = call(book, "admit", org, 10, "model-x", now=T0)[0]
    assert_sqlstate(book, "LL014", sql_of("settle_usage"),
                    params("settle_usage", org, inv["id"], {"input": 1}, now=T0))
    assert_sqlstate(book, "LL005", sql_of("settle_usage"),
                    params("settle_usage", org, uuid.uuid4(), {"input": 1}, now=T0))
    assert settle(book, org, inv["id"], 7, 2) == "settled"
    stored = invocation(book, org, inv["id"])
    # priced by its caller: no price figure of the book, its cost is its cents (x 10^7 nanos)
    assert (stored["priced_by"], stored["cost_nanos"], stored["charged_cents"]) == (None, None, 2)


def test_a_tokens_class_without_a_rate_refuses_the_settlement_and_keeps_the_hold(book: psycopg.Connection) -> None:
    org = new_org(book, 10**9)
    inv = admit_priced(book, org, "gpt-4o", 10, 10)
    assert_sqlstate(book, "22023", sql_of("settle_usage"),
                    params("settle_usage", org, inv["id"], {"input": 1, "cache_write_1h": 5}, now=T0))
    assert invocation(book, org, inv["id"])["status"] == "reserved"


def test_a_failure_with_usage_is_priced_and_one_with_both_is_22023(book: psycopg.Connection) -> None:
    org = new_org(book, 10**9)
    inv = admit_priced(book, org, "gpt-4o", 1000, 1000)
    assert_sqlstate(book, "22023", sql_of("fail"),
                    params("fail", org, inv["id"], "boom", credits=1, usage={"input": 1}, now=T0))
    assert fail(book, org, inv["id"], "boom", usage={"input": 400}, now=T0) == "failed"
    stored = invocation(book, org, inv["id"])
    assert (stored["status"], stored["charged_credits"], stored["cost_nanos"], stored["priced_by"]) == \
        ("failed", 1000, 1_000_000, "model")
    assert invariants(book) == []


def test_a_recovered_priced_request_has_no_cost_and_its_late_usage_trues_it_up(book: psycopg.Connection) -> None:
    """BR-CAP-PFM-LLM-009-01: recovery settles at the stored estimate with no money
    figure; its cost is NULL, never 0. A late measured usage under true_up prices it."""
    org = new_org(book, 10**9)
    call(book, "set_recovery_policy", org, "estimate", "true_up")
    inv = admit_priced(book, org, "gpt-4o", 1000, 1000)
    reconcile(book, org, now=T0 + timedelta(days=2))
    stored = invocation(book, org, inv["id"])
    assert (stored["settlement_kind"], stored["charged_credits"], stored["cost_nanos"], stored["priced_by"]) == \
        ("recovered", 12500, None, None)
    assert settle_usage(book, org, inv["id"], {"input": 1000, "output": 100},
                        now=T0 + timedelta(days=2, hours=1)) == "trued_up"
    stored = invocation(book, org, inv["id"])
    assert (stored["settlement_kind"], stored["charged_credits"], stored["cost_nanos"], stored["priced_by"]) == \
        ("trued_up", 3500, 3_500_000, "model")
    assert period(book, org)["used_credits"] == 3500
    assert invariants(book) == []


# --- races -----------------------------------------------------------------------------


def test_a_price_set_while_an_admission_runs_never_prices_it_in_part(book: psycopg.Connection, llm_connect) -> None:
    """Scripted with two real connections: the admission reads the book, the new
    version commits, the admission commits. The request is pinned to the version it
    read and its settlement prices wholly at it."""
    org = new_org(book, 10**9)
    first = version_of(book, "gpt-4o")
    admitting, setting = llm_connect(autocommit=False), llm_connect()
    admitting.execute("SET lock_timeout = '5s'")
    (row,) = admitting.execute(ADMIT_SQL, params("admit", org, None, "gpt-4o", input_tokens=1000,
                                                 max_output_tokens=0, now=T0)).fetchall()
    newer = setting.execute(sql_of("set_price"), params("set_price", "gpt-4o", {"input": "4", "output": "40"},
                                                        effective_from=T0 - HOUR)).fetchone()[0]
    admitting.commit()
    inv_id = row[1] if not isinstance(row, dict) else row["id"]
    assert invocation(book, org, inv_id)["price_version_id"] == first != newer
    assert settle_usage(book, org, inv_id, {"input": 1000, "output": 1000}) == "settled"
    assert invocation(book, org, inv_id)["cost_nanos"] == 12_500_000


def test_eight_sessions_admit_while_prices_change_and_each_request_has_one_version(
    book: psycopg.Connection, llm_connect
) -> None:
    """8 connections admit and settle priced requests while another sets a new price
    version every few requests; each request is priced wholly at the version it pinned,
    which was in force at its admission time, and the books stay exact."""
    org = new_org(book, 10**12)
    versions: dict[int, dict[str, str]] = {version_of(book, "gpt-4o"): GPT}
    stop = threading.Event()
    errors: list[BaseException] = []

    def setter() -> None:
        conn = llm_connect()
        n = 0
        while not stop.is_set() and n < 40:
            n += 1
            rates = {"input": str(n), "output": str(2 * n)}
            vid = conn.execute(sql_of("set_price"), params("set_price", "gpt-4o", rates,
                                                           effective_from=T0 - HOUR + timedelta(seconds=n))).fetchone()[0]
            versions[vid] = rates

    def worker(k: int) -> None:
        try:
            conn = llm_connect()
            llm = Llm(conn)
            for i in range(15):
                inv = llm.admit(org, None, "gpt-4o", input_tokens=1000 + k, max_output_tokens=100, now=T0)
                llm.settle_usage(org, inv.id, Usage(input=1000 + k, output=100 + i), now=T0)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    set_thread = threading.Thread(target=setter)
    for t in [set_thread, *threads]:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    set_thread.join()
    assert errors == []
    rows = book.execute(
        "SELECT i.price_version_id, i.cost_nanos, i.usage, i.charged_credits, i.created_at"
        "  FROM llm.invocations AS i WHERE i.organization_id = %s", [org]).fetchall()
    assert len(rows) == 120
    for version, cost, usage, credits, _created in rows:
        rates = versions[version]  # the version it pinned, whole: both rates from it
        assert cost == usage["input"] * Decimal(rates["input"]) * 1000 + usage["output"] * Decimal(rates["output"]) * 1000
        assert credits == -(-cost // 1000)
    assert scalar(book, "SELECT sum(charged_credits) FROM llm.invocations WHERE organization_id = %(o)s",
                  {"o": org}) == period(book, org)["used_credits"]
    assert invariants(book) == []


# --- the driver ------------------------------------------------------------------------


def test_the_driver_admits_priced_and_settles_with_usage_sync_and_async(book: psycopg.Connection,
                                                                       llm_dsn: str) -> None:
    llm = Llm(book)
    org = new_org(book, 10**9)
    inv = llm.admit(org, None, "gpt-4o", input_tokens=1000, max_output_tokens=100, now=T0)
    assert inv.estimate_credits == 3500
    usage = Usage.from_openai({"prompt_tokens": 1000, "completion_tokens": 100,
                               "prompt_tokens_details": {"cached_tokens": 600}})
    assert llm.settle_usage(org, inv.id, usage, now=T0) == "settled"
    assert invocation(book, org, inv.id)["cost_nanos"] == 400 * 2500 + 600 * 1250 + 100 * 10000
    with pytest.raises(PriceMissing):
        llm.admit(org, None, "gpt-9", input_tokens=1, max_output_tokens=1, now=T0)
    with pytest.raises(IdempotencyConflict):
        llm.settle_usage(org, inv.id, Usage(input=1), now=T0)
    with pytest.raises(InvalidArgument):
        llm.settle_usage(org, inv.id, {"input": 1.0}, now=T0)

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(llm_dsn, autocommit=True) as conn:
            allm = AsyncLlm(conn)
            other = await allm.admit(org, None, "gpt-4o", input_tokens=10, max_output_tokens=10, now=T0)
            assert await allm.fail(org, other.id, "timeout", usage=Usage(input=10), now=T0) == "failed"

    asyncio.run(scenario())
    assert invariants(book) == []


def test_a_late_usage_kept_for_audit_is_retried_as_itself(book: psycopg.Connection) -> None:
    """BR-CAP-PFM-LLM-009-01 under late_settlement = audit: the late usage of a recovered
    request is kept as credits and tokens, not charged; its retry answers as it did, and
    other figures are LL007. (The audit keeps no usage on the request, so the retry is
    compared on what was kept: found while modelling priced requests for the simulation.)"""
    org = new_org(book, 10**9)
    call(book, "set_recovery_policy", org, "estimate", "audit")
    inv = admit_priced(book, org, "gpt-4o", 1000, 1000)
    later = T0 + timedelta(days=2)
    reconcile(book, org, now=later)
    usage = {"input": 1000, "output": 100}
    assert settle_usage(book, org, inv["id"], usage, now=later) == "already_recovered"
    assert settle_usage(book, org, inv["id"], usage, now=later) == "already_recovered"
    assert_sqlstate(book, "LL007", sql_of("settle_usage"),
                    params("settle_usage", org, inv["id"], {"input": 1000, "output": 101}, now=later))
    stored = invocation(book, org, inv["id"])
    assert (stored["late_credits"], stored["late_cents"], stored["cost_nanos"], stored["charged_credits"]) == \
        (3500, None, None, 12500)
    assert invariants(book) == []
