"""llm.upsert_organization and llm.declare_task_kind: normal paths, every
rejection (22023) with nothing written, and the allowance that applies to the
current period at once."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from tests.helpers import (
    FEBRUARY,
    JANUARY,
    MAX_AMOUNT,
    T0,
    admit,
    assert_sqlstate,
    declare_task,
    fingerprint,
    invariants,
    new_org,
    params,
    period,
    row,
    rows,
    set_org,
    sql_of,
)

UPSERT_SQL = sql_of("upsert_organization")


def upsert_params(org, **overrides):
    """The parameters of UPSERT_SQL: Acme, 1000 credits, operational, 80 and 100 %, at T0."""
    arguments = {"organization_id": org, "name": "Acme", "monthly_allowance_credits": 1000,
                 "status": "operational", "notice_thresholds": [80, 100], "now": T0}
    return params("upsert_organization", **(arguments | overrides))


# ---------------------------------------------------------------- upsert_organization


def test_upsert_organization_creates_an_operational_organization_with_default_thresholds(llm_conn):
    org = uuid.uuid4()
    # the SQL function's own defaults (status, thresholds, clock): the driver passes every
    # parameter, so only a call without them reaches these
    created = row(
        llm_conn,
        "SELECT * FROM llm.upsert_organization(%(org)s::uuid, 'Acme', 5000::bigint)",
        {"org": org},
    )
    assert created["id"] == org
    assert created["name"] == "Acme"
    assert created["status"] == "operational"
    assert created["monthly_allowance_credits"] == 5000
    assert created["notice_thresholds"] == [80, 100]
    assert rows(llm_conn, "SELECT id FROM llm.organizations") == [{"id": org}]


def test_upsert_organization_updates_every_field_and_keeps_created_at(llm_conn):
    org = uuid.uuid4()
    first = row(llm_conn, UPSERT_SQL, upsert_params(org))
    later = T0 + timedelta(days=3)
    second = row(
        llm_conn,
        UPSERT_SQL,
        upsert_params(org, name="Acme Ltd", monthly_allowance_credits=None, status="suspended",
                      notice_thresholds=[50, 90], now=later),
    )
    assert second["name"] == "Acme Ltd"
    assert second["monthly_allowance_credits"] is None
    assert second["status"] == "suspended"
    assert second["notice_thresholds"] == [50, 90]
    assert second["created_at"] == first["created_at"] == T0
    assert second["updated_at"] == later
    assert len(rows(llm_conn, "SELECT * FROM llm.organizations")) == 1


def test_upsert_organization_stores_thresholds_sorted_and_accepts_an_empty_list(llm_conn):
    org = uuid.uuid4()
    assert row(llm_conn, UPSERT_SQL, upsert_params(org, notice_thresholds=[100, 50, 1000, 1]))[
        "notice_thresholds"
    ] == [1, 50, 100, 1000]
    assert row(llm_conn, UPSERT_SQL, upsert_params(org, notice_thresholds=[]))["notice_thresholds"] == []


@pytest.mark.parametrize("allowance", [0, MAX_AMOUNT, None])
def test_upsert_organization_accepts_allowance_bounds_and_null_for_unlimited(llm_conn, allowance):
    org = uuid.uuid4()
    assert row(llm_conn, UPSERT_SQL, upsert_params(org, monthly_allowance_credits=allowance))[
        "monthly_allowance_credits"
    ] == allowance


INVALID_UPSERTS = {
    "null organization id": {"organization_id": None},
    "null name": {"name": None},
    "empty name": {"name": ""},
    "blank name": {"name": "   "},
    "name over 200 characters": {"name": "x" * 201},
    "negative allowance": {"monthly_allowance_credits": -1},
    "allowance over 10^15": {"monthly_allowance_credits": MAX_AMOUNT + 1},
    "unknown status": {"status": "active"},
    "null threshold element": {"notice_thresholds": [80, None]},
    "duplicate thresholds": {"notice_thresholds": [80, 80, 100]},
    "threshold 0": {"notice_thresholds": [0, 100]},
    "threshold 1001": {"notice_thresholds": [80, 1001]},
    "negative threshold": {"notice_thresholds": [-5]},
    "two-dimensional thresholds": {"notice_thresholds": [[80, 100], [90, 95]]},
    "more than 20 thresholds": {"notice_thresholds": list(range(1, 22))},
}


@pytest.mark.parametrize("overrides", INVALID_UPSERTS.values(), ids=INVALID_UPSERTS.keys())
def test_upsert_organization_rejects_invalid_argument_with_22023_and_writes_nothing(
    llm_conn, overrides
):
    org = new_org(llm_conn, 1000)  # an existing organization, so the update path is covered too
    assert_sqlstate(llm_conn, "22023", UPSERT_SQL, upsert_params(org, **overrides))


@pytest.mark.parametrize(
    "overrides",
    [{"name": ""}, {"monthly_allowance_credits": -1}, {"notice_thresholds": [80, None]}],
    ids=["blank name", "negative allowance", "null threshold"],
)
def test_upsert_organization_rejects_a_new_organization_without_creating_it(llm_conn, overrides):
    err = assert_sqlstate(llm_conn, "22023", UPSERT_SQL, upsert_params(uuid.uuid4(), **overrides))
    assert err.diag.message_primary.startswith("llm:")
    assert rows(llm_conn, "SELECT * FROM llm.organizations") == []


def test_invalid_thresholds_error_explains_the_accepted_list(llm_conn):
    err = assert_sqlstate(llm_conn, "22023", UPSERT_SQL,
                          upsert_params(uuid.uuid4(), notice_thresholds=[0]))
    assert "between 1 and 1000" in err.diag.message_detail
    assert err.diag.message_hint


# ---------------------------------------------------------------- allowance and the current period


def test_an_upsert_without_status_or_thresholds_keeps_the_organizations(llm_conn):
    """Upsert_organization(id, name, allowance), as the operator's docs raised an
    allowance, set a suspended tenant operational again and reset its thresholds (50, 90)
    to (80, 100): the defaults of the arguments not given overwrote the row. A NULL status
    or threshold list now keeps the organization's."""
    org = new_org(llm_conn, 5000, status="suspended", thresholds=[50, 90])
    keep = {"status": None, "notice_thresholds": None}
    updated = row(llm_conn, UPSERT_SQL, upsert_params(org, name="Suspended Co",
                                                      monthly_allowance_credits=6000, **keep))  # fmt: skip
    assert (updated["name"], updated["status"], updated["monthly_allowance_credits"],
            updated["notice_thresholds"]) == ("Suspended Co", "suspended", 6000, [50, 90])  # fmt: skip
    assert_sqlstate(llm_conn, "LL003", sql_of("admit"), params("admit", org, 1, "model-a", now=T0))
    # given, each still changes
    assert row(llm_conn, UPSERT_SQL, upsert_params(org, status="operational", notice_thresholds=None)
               )["notice_thresholds"] == [50, 90]  # fmt: skip
    assert row(llm_conn, UPSERT_SQL, upsert_params(org, status=None, notice_thresholds=[70])
               )["status"] == "operational"  # fmt: skip
    assert invariants(llm_conn) == []


def test_a_new_organization_without_status_or_thresholds_is_operational_at_80_and_100(llm_conn):
    org = uuid.uuid4()
    created = row(llm_conn, UPSERT_SQL, upsert_params(org, status=None, notice_thresholds=None))
    assert (created["status"], created["notice_thresholds"]) == ("operational", [80, 100])


def test_a_kept_threshold_list_owes_the_levels_a_lowered_allowance_puts_behind(llm_conn):
    """A lowered allowance with the list kept (NULL) owes at once the kept levels usage now
    stands at or above, as a changed allowance always did."""
    org = new_org(llm_conn, 1000, thresholds=[50, 90], now=T0 - timedelta(days=1))
    inv = admit(llm_conn, org, 600, now=T0)["id"]
    llm_conn.execute(sql_of("settle"), params("settle", org, inv, 600, 0, now=T0))
    row(llm_conn, UPSERT_SQL, upsert_params(org, monthly_allowance_credits=650, status=None,
                                            notice_thresholds=None, now=T0 + timedelta(hours=1)))  # fmt: skip
    owed = [r["threshold_pct"] for r in rows(
        llm_conn, "SELECT threshold_pct FROM llm.threshold_notices WHERE organization_id = %s ORDER BY 1",
        [org])]  # fmt: skip
    assert owed == [50, 90]  # 50 % at the settlement, 90 % by the change (600 of 650)
    assert period(llm_conn, org, JANUARY)["allowance_credits"] == 650
    assert invariants(llm_conn) == []


SET_ALLOWANCE_SQL = sql_of("set_allowance")


def test_set_allowance_changes_the_allowance_alone_and_applies_it_to_the_period(llm_conn):
    """Llm.set_allowance changes only the allowance; name, status and
    thresholds stay, the current period takes it at once, and a level usage now stands at
    or above is owed in the same transaction."""
    org = new_org(llm_conn, 1000, name="Keep Co", status="suspended", thresholds=[50, 90],
                  now=T0 - timedelta(days=1))  # fmt: skip
    set_org(llm_conn, org, 1000, status="operational", thresholds=[50, 90], now=T0 - timedelta(days=1))
    inv = admit(llm_conn, org, 600, now=T0)["id"]
    llm_conn.execute(sql_of("settle"), params("settle", org, inv, 600, 0, now=T0))
    call_suspend = upsert_params(org, name="Keep Co", status="suspended", notice_thresholds=None)
    row(llm_conn, UPSERT_SQL, call_suspend)
    changed = row(llm_conn, SET_ALLOWANCE_SQL, params("set_allowance", org, 650, now=T0 + timedelta(hours=1)))
    assert (changed["name"], changed["status"], changed["monthly_allowance_credits"],
            changed["notice_thresholds"]) == ("Keep Co", "suspended", 650, [50, 90])  # fmt: skip
    assert period(llm_conn, org, JANUARY)["allowance_credits"] == 650
    owed = [r["threshold_pct"] for r in rows(
        llm_conn, "SELECT threshold_pct FROM llm.threshold_notices WHERE organization_id = %s"
                  " AND scope = 'organization' AND budget_window = 'month' ORDER BY 1", [org])]  # fmt: skip
    assert owed == [50, 90]  # 600 of 650 is 92 %: the 50 % crossed at settlement, 90 % now
    assert invariants(llm_conn) == []


def test_set_allowance_of_an_unknown_organization_is_LL002_and_writes_nothing(llm_conn):
    new_org(llm_conn, 1000)
    assert_sqlstate(llm_conn, "LL002", SET_ALLOWANCE_SQL, params("set_allowance", uuid.uuid4(), 10, now=T0))


@pytest.mark.parametrize("allowance", [-1, MAX_AMOUNT + 1], ids=["negative", "over 10^15"])
def test_set_allowance_rejects_a_bad_allowance_with_22023_and_writes_nothing(llm_conn, allowance):
    org = new_org(llm_conn, 1000)
    assert_sqlstate(llm_conn, "22023", SET_ALLOWANCE_SQL, params("set_allowance", org, allowance, now=T0))


def test_set_allowance_to_unlimited(llm_conn):
    org = new_org(llm_conn, 10)
    assert row(llm_conn, SET_ALLOWANCE_SQL, params("set_allowance", org, None, now=T0)
               )["monthly_allowance_credits"] is None  # fmt: skip
    assert admit(llm_conn, org, 10**12, now=T0)["status"] == "reserved"
    assert invariants(llm_conn) == []


def test_allowance_raised_mid_month_applies_to_the_current_period_at_once(llm_conn):
    """docs/contract.md "Functions", upsert_organization: a changed allowance also applies to the current period;
    an admission refused with LL001 succeeds right after the raise (CAP-PFM-LLM-007)."""
    org = new_org(llm_conn, 100, now=T0 - timedelta(days=10))
    admit(llm_conn, org, 80, now=T0)
    refused = assert_sqlstate(
        llm_conn, "LL001",
        sql_of("admit"), params("admit", org, 50, "model-a", now=T0 + timedelta(hours=1)),
    )
    assert "allowance=100" in refused.diag.message_detail

    set_org(llm_conn, org, 500, now=T0 + timedelta(hours=2))
    assert period(llm_conn, org, JANUARY)["allowance_credits"] == 500

    admitted = admit(llm_conn, org, 50, now=T0 + timedelta(hours=3))
    assert admitted["status"] == "reserved"
    assert period(llm_conn, org, JANUARY)["held_credits"] == 130
    assert invariants(llm_conn) == []


def test_allowance_lowered_mid_month_applies_at_once_and_refuses_new_holds(llm_conn):
    org = new_org(llm_conn, 1000)
    admit(llm_conn, org, 300, now=T0)
    set_org(llm_conn, org, 200, now=T0 + timedelta(hours=1))
    assert period(llm_conn, org, JANUARY)["allowance_credits"] == 200
    assert_sqlstate(
        llm_conn, "LL001",
        sql_of("admit"), params("admit", org, 1, "model-a", now=T0 + timedelta(hours=2)),
    )
    # the hold admitted before the change stands: invariant 4 allows a lowered allowance
    assert invariants(llm_conn) == []


def test_allowance_change_leaves_earlier_periods_alone(llm_conn):
    org = new_org(llm_conn, 100)
    admit(llm_conn, org, 10, now=T0)  # January period
    set_org(llm_conn, org, 900, now=T0 + timedelta(days=20))  # in February
    assert period(llm_conn, org, JANUARY)["allowance_credits"] == 100
    assert period(llm_conn, org, FEBRUARY) is None
    # February's period is created on first use with the allowance in force then
    admit(llm_conn, org, 10, now=T0 + timedelta(days=21))
    assert period(llm_conn, org, FEBRUARY)["allowance_credits"] == 900


def test_upsert_with_unchanged_allowance_does_not_touch_the_period(llm_conn):
    org = new_org(llm_conn, 100)
    admit(llm_conn, org, 10, now=T0)
    before = fingerprint(llm_conn)
    set_org(llm_conn, org, 100, now=T0 + timedelta(hours=1))
    after = fingerprint(llm_conn)
    assert (after["period_heads"], after["period_stripes"]) == (before["period_heads"], before["period_stripes"])


def test_allowance_set_to_unlimited_applies_to_the_current_period(llm_conn):
    org = new_org(llm_conn, 10)
    admit(llm_conn, org, 10, now=T0)
    set_org(llm_conn, org, None, now=T0 + timedelta(hours=1))
    assert period(llm_conn, org, JANUARY)["allowance_credits"] is None
    assert admit(llm_conn, org, MAX_AMOUNT, now=T0 + timedelta(hours=2))["status"] == "reserved"


# ---------------------------------------------------------------- declare_task_kind

DECLARE_SQL = sql_of("declare_task_kind")


def test_declare_task_kind_creates_the_catalog_entry(llm_conn):
    declare_task(llm_conn, "summarize", "Summarize a document")
    assert rows(llm_conn, "SELECT key, description FROM llm.task_kinds") == [
        {"key": "summarize", "description": "Summarize a document"}
    ]


def test_declare_task_kind_is_idempotent(llm_conn):
    declare_task(llm_conn, "summarize", "Summarize")
    before = fingerprint(llm_conn)
    declare_task(llm_conn, "summarize", "Summarize")
    declare_task(llm_conn, "summarize", None)  # NULL keeps the description
    assert fingerprint(llm_conn) == before


def test_declare_task_kind_repeat_with_new_description_updates_it(llm_conn):
    declare_task(llm_conn, "summarize", "old")
    declare_task(llm_conn, "summarize", "new")
    assert rows(llm_conn, "SELECT key, description FROM llm.task_kinds") == [
        {"key": "summarize", "description": "new"}
    ]


INVALID_DECLARES = {
    "null key": {"key": None, "description": None},
    "empty key": {"key": "", "description": None},
    "blank key": {"key": "  ", "description": None},
    "key over 200 characters": {"key": "k" * 201, "description": None},
    "blank description": {"key": "summarize", "description": " "},
    "description over 2000 characters": {"key": "summarize", "description": "d" * 2001},
}


@pytest.mark.parametrize("arguments", INVALID_DECLARES.values(), ids=INVALID_DECLARES.keys())
def test_declare_task_kind_rejects_invalid_argument_with_22023_and_writes_nothing(
    llm_conn, arguments
):
    assert_sqlstate(llm_conn, "22023", DECLARE_SQL, params("declare_task_kind", **arguments))
