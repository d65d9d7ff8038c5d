"""Settlement (llm.settle_invocation) and failure (llm.fail_invocation): the
hold resolves exactly once with a distinct answer for each already-resolved
case, every SQLSTATE writes nothing, threshold notices are created once per
crossing, and an invocation is charged to its own period across a month end."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from tests.helpers import (
    FAIL_SQL,
    FEBRUARY,
    JANUARY,
    MAX_AMOUNT,
    NEW_MONTH,
    SETTLE_SQL,
    T0,
    admit,
    assert_sqlstate,
    close_task,
    execution,
    fail,
    fail_params,
    fingerprint,
    invariants,
    invocation,
    ledger,
    new_org,
    notices,
    open_task,
    period,
    reconcile,
    settle,
    settle_params,
)

LATER = T0 + timedelta(minutes=1)
RECOVERY_CLOCK = T0 + timedelta(hours=25)  # past the 24 h recovery window

# ---------------------------------------------------------------- settle: normal path

EARLY_JANUARY = T0 - timedelta(days=13)  # the 2nd, 12:00


def test_settlement_charges_measured_usage_and_releases_the_hold(llm_conn):
    org = new_org(llm_conn, 1000)
    inv = admit(llm_conn, org, 100, now=T0)

    outcome = settle(llm_conn, org, inv["id"], 80, 12, input_tokens=1500, output_tokens=300,
                     now=LATER)

    assert outcome == "settled"
    got = invocation(llm_conn, org, inv["id"])
    assert got["status"] == "settled"
    assert got["settlement_kind"] == "measured"
    assert (got["charged_credits"], got["charged_cents"]) == (80, 12)
    assert (got["input_tokens"], got["output_tokens"]) == (1500, 300)
    assert got["settled_at"] == LATER
    p = period(llm_conn, org)
    assert (p["used_credits"], p["used_cents"], p["held_credits"]) == (80, 12, 0)
    entries = ledger(llm_conn, org, inv["id"])
    assert sorted(entries) == ["charge", "hold", "release"]
    assert (entries["charge"]["credits"], entries["charge"]["cents"]) == (80, 12)
    assert entries["release"]["credits"] == 100
    assert entries["release"]["recorded_at"] == LATER
    assert invariants(llm_conn) == []


def test_settlement_may_charge_more_than_the_estimate(llm_conn):
    """Invariant 4: overage comes only through measured settlement."""
    org = new_org(llm_conn, 100)
    inv = admit(llm_conn, org, 10)
    admit(llm_conn, org, 90)
    assert settle(llm_conn, org, inv["id"], 60) == "settled"
    p = period(llm_conn, org)
    assert (p["used_credits"], p["held_credits"]) == (60, 90)
    assert invariants(llm_conn) == []


def test_settlement_of_zero_usage_writes_a_release_and_no_charge(llm_conn):
    org = new_org(llm_conn)
    inv = admit(llm_conn, org, 10)
    assert settle(llm_conn, org, inv["id"], 0, 0) == "settled"
    assert sorted(ledger(llm_conn, org, inv["id"])) == ["hold", "release"]
    assert invariants(llm_conn) == []


def test_settlement_of_cents_only_writes_a_charge_row(llm_conn):
    org = new_org(llm_conn)
    inv = admit(llm_conn, org, 10)
    settle(llm_conn, org, inv["id"], 0, 3)
    assert ledger(llm_conn, org, inv["id"])["charge"]["cents"] == 3
    assert period(llm_conn, org)["used_cents"] == 3
    assert invariants(llm_conn) == []


def test_settlement_adds_to_its_task_totals_also_after_the_task_closed(llm_conn):
    """STATE-PFM-LLM-002 completed -> completed: a late settlement adds to the totals and
    never reopens the task."""
    org = new_org(llm_conn)
    execution_id = open_task(llm_conn, org)
    first = admit(llm_conn, org, 10, execution_id=execution_id)
    second = admit(llm_conn, org, 20, execution_id=execution_id)
    settle(llm_conn, org, first["id"], 8, 2)
    close_task(llm_conn, org, execution_id, "completed", now=LATER)
    settle(llm_conn, org, second["id"], 15, 4, now=LATER + timedelta(seconds=5))
    x = execution(llm_conn, org, execution_id)
    assert x["status"] == "completed" and x["ended_at"] == LATER
    assert (x["request_count"], x["credits"], x["cents"]) == (2, 23, 6)
    assert invariants(llm_conn) == []


# ---------------------------------------------------------------- settle: exactly once


def test_settlement_charges_once_and_a_repeat_returns_already_settled(llm_conn):
    org = new_org(llm_conn)
    inv = admit(llm_conn, org, 100)
    assert settle(llm_conn, org, inv["id"], 80) == "settled"
    before = fingerprint(llm_conn)
    assert settle(llm_conn, org, inv["id"], 80) == "already_settled"
    assert settle(llm_conn, org, inv["id"], 80, now=LATER) == "already_settled"
    assert fingerprint(llm_conn) == before
    assert period(llm_conn, org)["used_credits"] == 80


@pytest.mark.parametrize("figures", [
    {"credits": 999}, {"cents": 9}, {"input_tokens": 10}, {"output_tokens": None},
])  # fmt: skip
def test_a_repeated_settlement_with_other_figures_is_LL007_naming_both(llm_conn, figures):
    """A settlement is reported once: its retry with the same figures answers
    already_settled, one with other credits, cents or tokens is LL007 (stored and given
    in the DETAIL) and changes nothing, never a silent already_settled."""
    org = new_org(llm_conn)
    inv = admit(llm_conn, org, 100)
    first = {"credits": 80, "cents": 3, "input_tokens": 7, "output_tokens": 11}
    settle(llm_conn, org, inv["id"], first["credits"], first["cents"],
           input_tokens=first["input_tokens"], output_tokens=first["output_tokens"])
    given = {**first, **figures}
    error = assert_sqlstate(llm_conn, "LL007", SETTLE_SQL, settle_params(
        org, inv["id"], given["credits"], given["cents"],
        input_tokens=given["input_tokens"], output_tokens=given["output_tokens"], now=LATER))
    assert error.diag.message_detail == (
        "stored: credits=80 cents=3 input_tokens=7 output_tokens=11; given: "
        + " ".join(f"{k}={'' if v is None else v}" for k, v in given.items()))
    assert invocation(llm_conn, org, inv["id"])["charged_credits"] == 80


def test_settlement_after_failure_returns_already_failed_and_changes_nothing(llm_conn):
    org = new_org(llm_conn)
    inv = admit(llm_conn, org, 100)
    assert fail(llm_conn, org, inv["id"], "timeout", 5) == "failed"
    before = fingerprint(llm_conn)
    assert settle(llm_conn, org, inv["id"], 80) == "already_failed"
    assert fingerprint(llm_conn) == before


def test_settlement_after_recovery_returns_already_recovered_and_keeps_late_figures_for_audit(
    llm_conn,
):
    """BR-CAP-PFM-LLM-009-03: recovery charged the estimate; the late measured settlement is
    recorded in late_credits/late_cents and never charged twice."""
    org = new_org(llm_conn, 1000)
    inv = admit(llm_conn, org, 100, now=T0)
    assert reconcile(llm_conn, org, now=RECOVERY_CLOCK)["recovered_requests"] == 1
    recovered = invocation(llm_conn, org, inv["id"])
    assert (recovered["settlement_kind"], recovered["charged_credits"]) == ("recovered", 100)
    period_before = period(llm_conn, org)
    ledger_before = ledger(llm_conn, org, inv["id"])

    late_at = RECOVERY_CLOCK + timedelta(minutes=3)
    outcome = settle(llm_conn, org, inv["id"], 70, 9, input_tokens=10, output_tokens=20,
                     now=late_at)

    assert outcome == "already_recovered"
    got = invocation(llm_conn, org, inv["id"])
    assert (got["late_credits"], got["late_cents"]) == (70, 9)
    assert (got["late_input_tokens"], got["late_output_tokens"]) == (10, 20)
    assert got["late_reported_at"] == late_at
    assert (got["status"], got["settlement_kind"]) == ("settled", "recovered")
    assert (got["charged_credits"], got["charged_cents"]) == (100, None)
    assert period(llm_conn, org) == period_before  # period used unchanged
    assert ledger(llm_conn, org, inv["id"]) == ledger_before
    assert invariants(llm_conn) == []


def test_second_late_settlement_after_recovery_keeps_the_first_report(llm_conn):
    org = new_org(llm_conn)
    inv = admit(llm_conn, org, 100, now=T0)
    reconcile(llm_conn, org, now=RECOVERY_CLOCK)
    settle(llm_conn, org, inv["id"], 70, now=RECOVERY_CLOCK)
    before = fingerprint(llm_conn)
    assert settle(llm_conn, org, inv["id"], 70, now=RECOVERY_CLOCK + timedelta(hours=1)) == (
        "already_recovered"
    )
    # a second late report with other figures: LL007 (the first one is kept), not silence
    assert_sqlstate(llm_conn, "LL007", SETTLE_SQL, settle_params(
        org, inv["id"], 5, now=RECOVERY_CLOCK + timedelta(hours=1)))
    assert fingerprint(llm_conn) == before


# ---------------------------------------------------------------- settle: rejections


def test_settlement_of_an_unknown_invocation_raises_LL005(llm_conn):
    org = new_org(llm_conn)
    admit(llm_conn, org, 10)
    assert_sqlstate(llm_conn, "LL005", SETTLE_SQL, settle_params(org, uuid.uuid4(), 1))


def test_settlement_of_another_organizations_invocation_raises_LL005(llm_conn):
    mine, theirs = new_org(llm_conn), new_org(llm_conn)
    their_inv = admit(llm_conn, theirs, 10)
    assert_sqlstate(llm_conn, "LL005", SETTLE_SQL, settle_params(mine, their_inv["id"], 1))
    assert invocation(llm_conn, theirs, their_inv["id"])["status"] == "reserved"


def test_settlement_for_an_unknown_organization_raises_LL002(llm_conn):
    org = new_org(llm_conn)
    inv = admit(llm_conn, org, 10)
    assert_sqlstate(llm_conn, "LL002", SETTLE_SQL, settle_params(uuid.uuid4(), inv["id"], 1))


INVALID_SETTLEMENTS = {
    "null organization": {"organization_id": None},
    "null invocation": {"invocation_id": None},
    "null credits": {"credits": None},
    "negative credits": {"credits": -1},
    "credits over 10^15": {"credits": MAX_AMOUNT + 1},
    "null cents": {"cents": None},
    "negative cents": {"cents": -1},
    "negative input tokens": {"input_tokens": -1},
    "negative output tokens": {"output_tokens": -5},
    "output tokens over 10^15": {"output_tokens": MAX_AMOUNT + 1},
}


@pytest.mark.parametrize("change", INVALID_SETTLEMENTS.values(), ids=INVALID_SETTLEMENTS.keys())
def test_settlement_rejects_invalid_argument_with_22023_and_writes_nothing(llm_conn, change):
    org = new_org(llm_conn)
    inv = admit(llm_conn, org, 10)
    params = settle_params(org, inv["id"], 5, 1, input_tokens=1, output_tokens=1)
    params.update(change)
    assert_sqlstate(llm_conn, "22023", SETTLE_SQL, params)


def test_invalid_settlement_of_a_settled_invocation_is_still_22023(llm_conn):
    """Arguments are checked before the outcome is looked up: a bad retry is not silently
    answered already_settled."""
    org = new_org(llm_conn)
    inv = admit(llm_conn, org, 10)
    settle(llm_conn, org, inv["id"], 5)
    assert_sqlstate(llm_conn, "22023", SETTLE_SQL, settle_params(org, inv["id"], -5))


# ---------------------------------------------------------------- fail: normal path


def test_failure_releases_the_hold_and_charges_nothing_by_default(llm_conn):
    org = new_org(llm_conn)
    inv = admit(llm_conn, org, 100, now=T0)
    outcome = fail(llm_conn, org, inv["id"], "provider 500", now=LATER)
    assert outcome == "failed"
    got = invocation(llm_conn, org, inv["id"])
    assert (got["status"], got["error"], got["settled_at"]) == ("failed", "provider 500", LATER)
    assert got["settlement_kind"] is None
    assert (got["charged_credits"], got["charged_cents"]) == (0, 0)
    p = period(llm_conn, org)
    assert (p["used_credits"], p["used_cents"], p["held_credits"]) == (0, 0, 0)
    assert sorted(ledger(llm_conn, org, inv["id"])) == ["hold", "release"]
    assert invariants(llm_conn) == []


def test_failure_charges_the_partial_usage_once(llm_conn):
    org = new_org(llm_conn)
    execution_id = open_task(llm_conn, org)
    inv = admit(llm_conn, org, 100, execution_id=execution_id)
    assert fail(llm_conn, org, inv["id"], "stream cut", 30, 4) == "failed"
    p = period(llm_conn, org)
    assert (p["used_credits"], p["used_cents"], p["held_credits"]) == (30, 4, 0)
    assert ledger(llm_conn, org, inv["id"])["charge"]["credits"] == 30
    x = execution(llm_conn, org, execution_id)
    assert (x["request_count"], x["credits"], x["cents"]) == (1, 30, 4)
    assert invariants(llm_conn) == []


# A failure of a recovered request is a late report, recorded or
# trued up: tests/test_recovery_policy.py, "a late failure".
@pytest.mark.parametrize("first, expected", [("fail", "already_failed"), ("settle", "already_settled")])
def test_failure_of_a_terminal_invocation_returns_its_outcome_and_changes_nothing(
    llm_conn, first, expected
):
    org = new_org(llm_conn)
    inv = admit(llm_conn, org, 100, now=T0)
    if first == "fail":
        fail(llm_conn, org, inv["id"], "first")
    else:
        settle(llm_conn, org, inv["id"], 50)
    before = fingerprint(llm_conn)
    assert fail(llm_conn, org, inv["id"], "second", 7, 7, now=RECOVERY_CLOCK) == expected
    assert fingerprint(llm_conn) == before


# ---------------------------------------------------------------- fail: rejections


def test_failure_of_an_unknown_invocation_raises_LL005(llm_conn):
    org = new_org(llm_conn)
    assert_sqlstate(llm_conn, "LL005", FAIL_SQL, fail_params(org, uuid.uuid4()))


def test_failure_of_another_organizations_invocation_raises_LL005(llm_conn):
    mine, theirs = new_org(llm_conn), new_org(llm_conn)
    their_inv = admit(llm_conn, theirs, 10)
    assert_sqlstate(llm_conn, "LL005", FAIL_SQL, fail_params(mine, their_inv["id"]))


def test_failure_for_an_unknown_organization_raises_LL002(llm_conn):
    org = new_org(llm_conn)
    inv = admit(llm_conn, org, 10)
    assert_sqlstate(llm_conn, "LL002", FAIL_SQL, fail_params(uuid.uuid4(), inv["id"]))


INVALID_FAILURES = {
    "null organization": {"organization_id": None},
    "null invocation": {"invocation_id": None},
    "null error text": {"error": None},
    "blank error text": {"error": " "},
    "error text over 4000 characters": {"error": "e" * 4001},
    "null credits": {"credits": None},
    "negative credits": {"credits": -1},
    "credits over 10^15": {"credits": MAX_AMOUNT + 1},
    "null cents": {"cents": None},
    "negative cents": {"cents": -1},
}


@pytest.mark.parametrize("change", INVALID_FAILURES.values(), ids=INVALID_FAILURES.keys())
def test_failure_rejects_invalid_argument_with_22023_and_writes_nothing(llm_conn, change):
    org = new_org(llm_conn)
    inv = admit(llm_conn, org, 10)
    params = fail_params(org, inv["id"], "boom", 1, 1)
    params.update(change)
    assert_sqlstate(llm_conn, "22023", FAIL_SQL, params)


# ---------------------------------------------------------------- threshold notices


def test_one_settlement_crossing_80_and_100_creates_both_notices_once(llm_conn):
    org = new_org(llm_conn, 1000)
    inv = admit(llm_conn, org, 500, now=T0)
    settle(llm_conn, org, inv["id"], 1000, now=LATER)
    owed = notices(llm_conn, org)
    assert [(n["threshold_pct"], n["status"]) for n in owed] == [(80, "owed"), (100, "owed")]
    for n in owed:
        assert n["period_start"] == JANUARY
        assert n["crossed_at"] == LATER and n["next_attempt_at"] == LATER
        assert (n["used_credits"], n["allowance_credits"]) == (1000, 1000)
        assert n["attempts"] == 0

    later = admit(llm_conn, org, 0, now=LATER)
    settle(llm_conn, org, later["id"], 50, now=LATER + timedelta(minutes=1))
    assert [n["id"] for n in notices(llm_conn, org)] == [n["id"] for n in owed]
    assert invariants(llm_conn) == []


def test_a_threshold_is_crossed_at_exactly_its_percentage(llm_conn):
    org = new_org(llm_conn, 1000)
    first = admit(llm_conn, org, 799)
    settle(llm_conn, org, first["id"], 799)
    assert notices(llm_conn, org) == []
    second = admit(llm_conn, org, 1)
    settle(llm_conn, org, second["id"], 1)  # 800 of 1000 = 80 %
    assert [n["threshold_pct"] for n in notices(llm_conn, org)] == [80]


def test_successive_settlements_create_each_notice_when_its_threshold_is_crossed(llm_conn):
    org = new_org(llm_conn, 1000)
    for credits, expected in [(500, []), (350, [80]), (100, [80]), (50, [80, 100]), (10, [80, 100])]:
        inv = admit(llm_conn, org, 0)
        settle(llm_conn, org, inv["id"], credits)
        assert [n["threshold_pct"] for n in notices(llm_conn, org)] == expected
    assert invariants(llm_conn) == []


def test_thresholds_are_per_organization(llm_conn):
    fifty = new_org(llm_conn, 1000, thresholds=[50])
    default = new_org(llm_conn, 1000)
    silent = new_org(llm_conn, 1000, thresholds=[])
    for org in (fifty, default, silent):
        inv = admit(llm_conn, org, 600)
        settle(llm_conn, org, inv["id"], 600)
    assert [n["threshold_pct"] for n in notices(llm_conn, fifty)] == [50]
    assert notices(llm_conn, default) == []
    assert notices(llm_conn, silent) == []


def test_thresholds_above_100_percent_are_notified_on_overage(llm_conn):
    org = new_org(llm_conn, 100, thresholds=[100, 150])
    inv = admit(llm_conn, org, 100)
    settle(llm_conn, org, inv["id"], 160)
    assert [n["threshold_pct"] for n in notices(llm_conn, org)] == [100, 150]


def test_unlimited_allowance_creates_no_notices(llm_conn):
    org = new_org(llm_conn, None)
    inv = admit(llm_conn, org, 10)
    settle(llm_conn, org, inv["id"], MAX_AMOUNT)
    assert notices(llm_conn, org) == []


def test_partial_charge_of_a_failure_crosses_thresholds_too(llm_conn):
    org = new_org(llm_conn, 100)
    inv = admit(llm_conn, org, 90)
    fail(llm_conn, org, inv["id"], "cut", 85)
    assert [n["threshold_pct"] for n in notices(llm_conn, org)] == [80]


def test_settlement_in_a_new_month_notifies_on_the_new_period(llm_conn):
    org = new_org(llm_conn, 100)
    jan = admit(llm_conn, org, 90, now=T0)
    settle(llm_conn, org, jan["id"], 90, now=T0)
    feb_clock = NEW_MONTH + timedelta(days=9)
    feb = admit(llm_conn, org, 90, now=feb_clock)
    settle(llm_conn, org, feb["id"], 90, now=feb_clock)
    assert [(n["period_start"], n["threshold_pct"]) for n in notices(llm_conn, org)] == [
        (JANUARY, 80),
        (FEBRUARY, 80),
    ]


# ---------------------------------------------------------------- month boundary


def test_invocation_admitted_on_the_last_second_of_a_month_charges_its_own_period(llm_conn):
    org = new_org(llm_conn, 1000, now=EARLY_JANUARY)
    last_second = NEW_MONTH - timedelta(seconds=1)
    next_month = NEW_MONTH + timedelta(seconds=5)
    inv = admit(llm_conn, org, 900, now=last_second)
    february_inv = admit(llm_conn, org, 40, now=next_month)  # opens February's period

    assert settle(llm_conn, org, inv["id"], 850, 70, now=next_month) == "settled"

    jan = period(llm_conn, org, JANUARY)
    assert (jan["used_credits"], jan["used_cents"], jan["held_credits"]) == (850, 70, 0)
    feb = period(llm_conn, org, FEBRUARY)
    assert (feb["used_credits"], feb["used_cents"]) == (0, 0)
    assert feb["held_credits"] == february_inv["hold_credits"] == 40
    assert {e["period_start"] for e in ledger(llm_conn, org, inv["id"]).values()} == {JANUARY}
    # the crossing belongs to January too
    assert [(n["period_start"], n["threshold_pct"]) for n in notices(llm_conn, org)] == [
        (JANUARY, 80)
    ]
    assert invariants(llm_conn) == []


def test_a_new_month_starts_with_the_full_allowance(llm_conn):
    org = new_org(llm_conn, 100, now=EARLY_JANUARY)
    jan = admit(llm_conn, org, 100, now=NEW_MONTH - timedelta(seconds=1))
    assert jan["period_start"] == JANUARY
    feb = admit(llm_conn, org, 100, now=NEW_MONTH)
    assert feb["period_start"] == FEBRUARY
    assert period(llm_conn, org, JANUARY)["held_credits"] == 100
    assert period(llm_conn, org, FEBRUARY)["held_credits"] == 100
