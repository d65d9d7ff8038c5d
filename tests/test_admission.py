"""CAP-PFM-LLM-007 admission (llm.admit_invocation) and dispatch
(llm.mark_dispatched): the hold on the current period, every SQLSTATE with
nothing written, idempotent retries (LL007), and invariant 4."""

from __future__ import annotations

import os
import uuid
from datetime import timedelta, timezone

import pytest

from tests.helpers import (
    ADMIT_SQL,
    DISPATCH_SQL,
    FEBRUARY,
    JANUARY,
    MAX_AMOUNT,
    NEW_MONTH,
    T0,
    InThread,
    admit,
    admit_params,
    assert_sqlstate,
    call,
    close_task,
    dispatch,
    fail,
    fingerprint,
    invariants,
    invocation,
    ledger,
    new_org,
    open_task,
    period,
    reconcile,
    scalar,
    sessions_on_stripes,
    set_org,
    settle,
    wait_blocked,
)

# ---------------------------------------------------------------- normal path


def test_admission_places_the_hold_on_the_current_period_CAP_PFM_LLM_007(llm_conn):
    org = new_org(llm_conn, 1000)
    assert period(llm_conn, org) is None  # created on first use

    inv = admit(llm_conn, org, 120, "gpt-x", now=T0)

    assert inv["organization_id"] == org
    assert inv["status"] == "reserved"
    assert inv["model"] == "gpt-x"
    assert inv["estimate_credits"] == inv["hold_credits"] == 120
    assert inv["period_start"] == JANUARY
    assert inv["created_at"] == T0
    assert inv["charged_credits"] is None and inv["settlement_kind"] is None
    p = period(llm_conn, org)
    assert (p["allowance_credits"], p["used_credits"], p["held_credits"]) == (1000, 0, 120)
    assert p["period_end"] == FEBRUARY
    hold = ledger(llm_conn, org, inv["id"])
    assert list(hold) == ["hold"]
    assert (hold["hold"]["credits"], hold["hold"]["period_start"]) == (120, JANUARY)
    assert invariants(llm_conn) == []


def test_admission_period_is_the_utc_calendar_month(llm_conn):
    org = new_org(llm_conn, 1000)
    # 23:30 on 31 January in New York is 04:30 on 1 February UTC
    late_evening = (NEW_MONTH + timedelta(hours=4, minutes=30)).astimezone(timezone(timedelta(hours=-5)))
    assert late_evening.day == 31
    assert admit(llm_conn, org, 1, now=late_evening)["period_start"] == FEBRUARY
    assert admit(llm_conn, org, 1, now=NEW_MONTH - timedelta(seconds=1))[
        "period_start"
    ] == JANUARY


def test_admission_admits_up_to_exactly_the_allowance_then_raises_LL001(llm_conn):
    """CAP-PFM-LLM-007: admitted iff used + held + estimate <= allowance."""
    org = new_org(llm_conn, 100)
    admit(llm_conn, org, 60)
    admit(llm_conn, org, 40)  # used + held + estimate == allowance
    assert period(llm_conn, org)["held_credits"] == 100
    assert_sqlstate(llm_conn, "LL001", ADMIT_SQL, admit_params(org, 1))


def test_admission_counts_used_credits_against_the_allowance(llm_conn):
    org = new_org(llm_conn, 100)
    first = admit(llm_conn, org, 10)
    settle(llm_conn, org, first["id"], 70)  # measured usage above the estimate
    admit(llm_conn, org, 30)
    assert_sqlstate(llm_conn, "LL001", ADMIT_SQL, admit_params(org, 1))


def test_allowance_exhausted_LL001_detail_gives_allowance_used_held_and_estimate(llm_conn):
    org = new_org(llm_conn, 1000)
    first = admit(llm_conn, org, 300)
    settle(llm_conn, org, first["id"], 250, 40)
    admit(llm_conn, org, 600)
    err = assert_sqlstate(llm_conn, "LL001", ADMIT_SQL, admit_params(org, 151))
    detail = err.diag.message_detail
    for figure in ("allowance=1000", "used=250", "held=600", "estimate=151"):
        assert figure in detail, detail
    assert err.diag.message_hint


def test_first_admission_refused_with_LL001_creates_no_period(llm_conn):
    org = new_org(llm_conn, 10)
    assert_sqlstate(llm_conn, "LL001", ADMIT_SQL, admit_params(org, 11))
    assert period(llm_conn, org) is None


def test_zero_allowance_admits_only_zero_estimates(llm_conn):
    org = new_org(llm_conn, 0)
    assert admit(llm_conn, org, 0)["hold_credits"] == 0
    assert_sqlstate(llm_conn, "LL001", ADMIT_SQL, admit_params(org, 1))


def test_unlimited_allowance_admits_any_estimate(llm_conn):
    org = new_org(llm_conn, None)
    admit(llm_conn, org, MAX_AMOUNT)
    admit(llm_conn, org, MAX_AMOUNT)
    p = period(llm_conn, org)
    assert p["allowance_credits"] is None and p["held_credits"] == 2 * MAX_AMOUNT
    assert invariants(llm_conn) == []


def test_admission_with_the_client_id_uses_it(llm_conn):
    org = new_org(llm_conn)
    given = uuid.uuid4()
    assert admit(llm_conn, org, 5, invocation_id=given)["id"] == given


def test_admission_links_a_running_execution_of_the_same_organization(llm_conn):
    org = new_org(llm_conn)
    execution_id = open_task(llm_conn, org)
    inv = admit(llm_conn, org, 5, execution_id=execution_id)
    assert inv["execution_id"] == execution_id


def test_admission_of_one_organization_leaves_another_alone(llm_conn):
    a, b = new_org(llm_conn, 100), new_org(llm_conn, 100)
    admit(llm_conn, a, 100)
    assert period(llm_conn, b) is None
    assert admit(llm_conn, b, 100)["status"] == "reserved"


# ---------------------------------------------------------------- idempotent retry (LL007)


def test_readmitting_the_same_invocation_id_places_no_second_hold(llm_conn):
    org = new_org(llm_conn, 1000)
    given = uuid.uuid4()
    first = admit(llm_conn, org, 100, invocation_id=given)
    before = fingerprint(llm_conn)

    again = admit(llm_conn, org, 100, invocation_id=given, now=T0 + timedelta(minutes=5))

    assert first["replayed"] is False and again["replayed"] is True
    assert again == {**first, "replayed": True}
    assert fingerprint(llm_conn) == before
    assert period(llm_conn, org)["held_credits"] == 100
    assert list(ledger(llm_conn, org, given)) == ["hold"]


def test_readmitting_returns_the_first_admission_even_when_the_allowance_is_now_spent(llm_conn):
    org = new_org(llm_conn, 100)
    given = uuid.uuid4()
    admit(llm_conn, org, 100, invocation_id=given)
    assert admit(llm_conn, org, 100, invocation_id=given)["hold_credits"] == 100
    assert period(llm_conn, org)["held_credits"] == 100


def test_readmitting_a_settled_invocation_returns_it_without_a_new_hold(llm_conn):
    org = new_org(llm_conn, 1000)
    given = uuid.uuid4()
    admit(llm_conn, org, 100, invocation_id=given)
    settle(llm_conn, org, given, 80)
    before = fingerprint(llm_conn)
    again = admit(llm_conn, org, 100, invocation_id=given)
    assert again["status"] == "settled"
    assert fingerprint(llm_conn) == before


@pytest.mark.parametrize(
    "change",
    [{"estimate": 101}, {"model": "model-b"}, {"execution": "other"}, {"execution": "none"}],
    ids=["different estimate", "different model", "different execution", "execution dropped"],
)
def test_readmitting_the_same_id_with_different_arguments_raises_LL007(llm_conn, change):
    org = new_org(llm_conn, 1000)
    first_execution = open_task(llm_conn, org)
    other_execution = open_task(llm_conn, org)
    given = uuid.uuid4()
    admit(llm_conn, org, 100, execution_id=first_execution, invocation_id=given)
    params = admit_params(org, 100, execution_id=first_execution, invocation_id=given)
    if "estimate" in change:
        params["estimate_credits"] = change["estimate"]
    if "model" in change:
        params["model"] = change["model"]
    if change.get("execution") == "other":
        params["execution_id"] = other_execution
    if change.get("execution") == "none":
        params["execution_id"] = None
    err = assert_sqlstate(llm_conn, "LL007", ADMIT_SQL, params)
    assert "stored:" in err.diag.message_detail


def test_an_invocation_id_is_scoped_to_its_organization(llm_conn):
    """Citus rule: invocations are keyed (organization_id, id); another organization's id
    is unknown here, not a conflict."""
    a, b = new_org(llm_conn), new_org(llm_conn)
    given = uuid.uuid4()
    admit(llm_conn, a, 10, invocation_id=given)
    assert admit(llm_conn, b, 20, invocation_id=given)["organization_id"] == b
    assert invocation(llm_conn, a, given)["estimate_credits"] == 10


# ---------------------------------------------------------------- rejections


def test_admission_for_an_unknown_organization_raises_LL002(llm_conn):
    err = assert_sqlstate(llm_conn, "LL002", ADMIT_SQL, admit_params(uuid.uuid4(), 1))
    assert err.diag.message_hint


@pytest.mark.parametrize("status", ["suspended", "closed"])
def test_admission_for_a_non_operational_organization_raises_LL003(llm_conn, status):
    org = new_org(llm_conn, 1000)
    admit(llm_conn, org, 10)  # a period exists; it must not move
    new_org(llm_conn, 1000, org_id=org, status=status)
    err = assert_sqlstate(llm_conn, "LL003", ADMIT_SQL, admit_params(org, 1))
    assert status in err.diag.message_detail


def test_admission_linked_to_an_unknown_execution_raises_LL006(llm_conn):
    org = new_org(llm_conn)
    assert_sqlstate(llm_conn, "LL006", ADMIT_SQL,
                    admit_params(org, 1, execution_id=uuid.uuid4()))


def test_admission_linked_to_another_organizations_execution_raises_LL008(llm_conn):
    """Under Citus the call runs on the worker holding the admitting organization,
    which cannot see the other's task: LL006, unknown (docs/scaling.md, by design)."""
    mine, theirs = new_org(llm_conn), new_org(llm_conn)
    their_execution = open_task(llm_conn, theirs)
    expected = "LL006" if os.environ.get("LLM_DB_CITUS") else "LL008"
    assert_sqlstate(llm_conn, expected, ADMIT_SQL,
                    admit_params(mine, 1, execution_id=their_execution))


@pytest.mark.parametrize("outcome", ["completed", "failed"])
def test_admission_linked_to_a_closed_execution_raises_LL009(llm_conn, outcome):
    org = new_org(llm_conn)
    execution_id = open_task(llm_conn, org)
    close_task(llm_conn, org, execution_id, outcome)
    assert_sqlstate(llm_conn, "LL009", ADMIT_SQL, admit_params(org, 1, execution_id=execution_id))


def test_admission_linked_to_an_abandoned_execution_raises_LL009(llm_conn):
    org = new_org(llm_conn)
    execution_id = open_task(llm_conn, org, now=T0)
    reconcile(llm_conn, org, now=T0 + timedelta(hours=25))
    assert_sqlstate(llm_conn, "LL009", ADMIT_SQL,
                    admit_params(org, 1, execution_id=execution_id, now=T0 + timedelta(hours=26)))


INVALID_ADMISSIONS = {
    "null organization": {"organization_id": None},
    "null estimate": {"estimate_credits": None},
    "negative estimate": {"estimate_credits": -1},
    "estimate over 10^15": {"estimate_credits": MAX_AMOUNT + 1},
    "null model": {"model": None},
    "empty model": {"model": ""},
    "blank model": {"model": "  "},
    "model over 200 characters": {"model": "m" * 201},
}


@pytest.mark.parametrize("change", INVALID_ADMISSIONS.values(), ids=INVALID_ADMISSIONS.keys())
def test_admission_rejects_invalid_argument_with_22023_and_writes_nothing(llm_conn, change):
    org = new_org(llm_conn, None)
    admit(llm_conn, org, 1)
    params = admit_params(org, 10)
    params.update(change)
    assert_sqlstate(llm_conn, "22023", ADMIT_SQL, params)


def test_argument_errors_come_before_the_organization_look_up(llm_conn):
    """Arguments are checked in the public function, before the twin looks anything up."""
    assert_sqlstate(llm_conn, "22023", ADMIT_SQL, admit_params(uuid.uuid4(), -1))


# ---------------------------------------------------------------- invariant 4


def test_check_invariants_reports_holds_over_the_allowance_invariant_4(llm_conn):
    """The invariant 4 check can fail: a period whose holds exceed its allowance with no
    measured overage and no allowance change after the holds is reported."""
    org = new_org(llm_conn, 100, now=T0 - timedelta(days=10))
    admit(llm_conn, org, 100, now=T0)
    assert invariants(llm_conn) == []
    llm_conn.execute(
        "UPDATE llm.period_heads SET allowance_credits = 50 WHERE organization_id = %(org)s::uuid",
        {"org": org},
    )
    # the same corruption also leaves the current period off its organization's allowance
    # (9), and its stripes' notice budgets beyond the 80 % of the new allowance (5)
    assert [r["invariant"] for r in invariants(llm_conn)] == [4, 5, 9]


def test_an_allowance_lowered_under_settled_usage_is_legal_until_the_next_admission_invariant_4(
    llm_conn,
):
    """Invariant 4's lowered allowance: usage settled under 100 stays over an allowance
    lowered to 50 with nothing held (no report); the check applies again from the first
    admission after the update, which fitted (here after raising it to 200), so one credit
    held beyond what admission granted is then reported."""
    hour = timedelta(hours=1)
    org = new_org(llm_conn, 100, now=T0 - hour)
    settle(llm_conn, org, admit(llm_conn, org, 80, now=T0)["id"], 80, now=T0)
    set_org(llm_conn, org, 50, now=T0 + hour)
    assert period(llm_conn, org)["held_credits"] == 0
    assert invariants(llm_conn) == []  # used 80 > 50: lowered under it
    set_org(llm_conn, org, 200, now=T0 + 2 * hour)
    inv = admit(llm_conn, org, 100, now=T0 + 3 * hour)
    assert invariants(llm_conn) == []
    llm_conn.execute("UPDATE llm.invocations SET estimate_credits = 121, hold_credits = 121"
                     " WHERE organization_id = %s AND id = %s", [org, inv["id"]])  # fmt: skip
    llm_conn.execute("UPDATE llm.period_stripes SET held_credits = held_credits + 21, admit_room = 0"
                     " WHERE organization_id = %s AND held_credits > 0", [org])  # fmt: skip
    assert [r["invariant"] for r in invariants(llm_conn)] == [4]


@pytest.mark.parametrize("stripes", [1, 4])
def test_an_admission_of_zero_into_a_period_over_its_allowance_is_refused(llm_conn, stripes):
    """CAP-PFM-LLM-007: admit iff used + held + estimate <= allowance, an estimate of 0
    too. Found by the simulation: with 50 held and the allowance lowered to 40, every
    stripe's admit_room is 0, and an admission of 0 "fitted" a room of 0 on the fast
    path. A room of 0 cannot tell "nothing left" from "already over", so a movement of
    nothing takes the exact path there, which refuses it (LL001) and writes nothing."""
    org = new_org(llm_conn, 100, now=T0)
    llm_conn.execute("SELECT llm.set_period_stripes(%s, %s)", [org, stripes])
    admit(llm_conn, org, 50, now=T0)
    set_org(llm_conn, org, 40, now=T0 + timedelta(hours=1))
    assert_sqlstate(llm_conn, "LL001", ADMIT_SQL, admit_params(org, 0, now=T0 + timedelta(hours=2)))
    set_org(llm_conn, org, 50, now=T0 + timedelta(hours=3))  # exactly full: 0 fits
    admit(llm_conn, org, 0, now=T0 + timedelta(hours=4))
    assert invariants(llm_conn) == []


@pytest.mark.parametrize("admitted", ["this month", "next month, opened by a clock ahead"])
def test_an_allowance_lowered_under_holds_whose_clocks_follow_it_is_legal_invariant_4(
    llm_conn, admitted
):
    """Invariant 4 orders a lowered allowance and the admissions by the stripes' locks, not
    by their clocks: holds placed (and committed) before the allowance was lowered may carry
    later clocks than the change. As it was, the check compared the last admission's
    created_at with the organization's updated_at and reported both cases (found in
    review); now the change records how far used + held stood over the new allowance."""
    org = new_org(llm_conn, 1000, now=T0)
    when = T0 + timedelta(hours=2) if admitted == "this month" else NEW_MONTH + timedelta(days=1)
    admit(llm_conn, org, 600, now=when)
    admit(llm_conn, org, 300, now=when)
    set_org(llm_conn, org, 500, now=T0 + timedelta(hours=1))  # later in commit order, earlier clock
    assert invariants(llm_conn) == []
    # the excess shrinks as holds are released, and a hold beyond it is reported
    llm_conn.execute("UPDATE llm.period_stripes SET held_credits = held_credits + 1, admit_room = 0"
                     " WHERE organization_id = %s AND held_credits > 0", [org])  # fmt: skip
    assert 4 in [r["invariant"] for r in invariants(llm_conn)]


def test_an_admission_that_fitted_before_a_lowering_waiting_for_its_stripe_is_legal_invariant_4(
    llm_conn, llm_connect
):
    """Invariant 4, scripted with stripes (found in review): X holds stripe 0 with a hold in
    an open transaction; an upsert lowering the allowance from 1000 to 300 waits for it;
    meanwhile Y admits 300 on stripe 1, which fits the old allowance, and commits with a
    later clock than the upsert's. Every interleaving of lock order is legal, so the books
    report nothing once all three committed."""
    org = new_org(llm_conn, 1000, now=T0)
    call(llm_conn, "set_period_stripes", org, 2)

    (x,) = sessions_on_stripes(lambda: llm_connect(autocommit=False), 2, [0])
    y, u = sessions_on_stripes(llm_connect, 2, [1, 0])
    admit(y, org, 1, now=T0)  # the period and its two stripes' rooms
    admit(x, org, 100, now=T0 + timedelta(hours=1))  # stripe 0, not committed
    upsert = InThread(lambda: set_org(u, org, 300, now=T0 + timedelta(hours=2)))
    wait_blocked(llm_conn, u.info.backend_pid)
    admit(y, org, 300, now=T0 + timedelta(hours=3))  # stripe 1, fast path, committed
    x.commit()
    upsert.result()
    assert period(llm_conn, org)["held_credits"] == 401
    assert invariants(llm_conn) == []


def test_invocations_carry_no_foreign_key_to_the_hot_period_and_task_rows(llm_conn):
    """Schema 0003: a foreign key check share-locks the referenced row, and the period
    and task rows are the ones every request of an organization updates; the functions
    and invariant 8 keep the rule instead (docs/benchmarks.md, 0.1.0 history: faster with 8 clients
    on one organization)."""
    def parents(table: str) -> list[str]:
        return [r[0] for r in llm_conn.execute(
            "SELECT confrelid::regclass::text FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'f'",
            [table],
        )]  # fmt: skip

    assert parents("llm.invocations") == []
    # the ledger is derived from the requests (schema 0008): a view, no rows of its own
    assert scalar(llm_conn, "SELECT relkind FROM pg_class WHERE oid = 'llm.ledger'::regclass") == "v"


def test_check_invariants_reports_an_invocation_without_its_period_invariant_8(llm_conn):
    """Invariant 8 can fail: an invocation whose period row is gone is reported."""
    org = new_org(llm_conn, 1000)
    inv = admit(llm_conn, org, 10)
    assert invariants(llm_conn) == []
    llm_conn.execute("DELETE FROM llm.period_stripes WHERE organization_id = %s", [org])
    llm_conn.execute("DELETE FROM llm.period_heads WHERE organization_id = %s", [org])
    found = [(r["invariant"], r["subject"]) for r in invariants(llm_conn)]
    assert found == [(8, f"invocation {inv['id']}")]


def test_check_invariants_reports_an_invocation_linked_to_a_missing_task_invariant_8(llm_conn):
    """Invariant 8 can fail: an invocation linked to a task row that does not exist in its
    organization (here: deleted behind the functions' back; no foreign key stops it, and
    Citus cannot move a row to another organization, the distribution column)."""
    org = new_org(llm_conn, 1000)
    task = open_task(llm_conn, org)
    inv = admit(llm_conn, org, 10, execution_id=task)
    assert invariants(llm_conn) == []
    llm_conn.execute("DELETE FROM llm.executions WHERE organization_id = %s AND id = %s", [org, task])
    found = [(r["invariant"], r["subject"]) for r in invariants(llm_conn)]
    assert (8, f"invocation {inv['id']}") in found


def test_admission_still_refuses_an_unknown_task_without_the_foreign_key(llm_conn):
    """The task check is the function's (LL006), before anything is written."""
    org = new_org(llm_conn, 1000)
    assert_sqlstate(llm_conn, "LL006", ADMIT_SQL, admit_params(org, 10, execution_id=uuid.UUID(int=7)))


def test_measured_overage_is_not_an_admission_violation_invariant_4(llm_conn):
    org = new_org(llm_conn, 100)
    first = admit(llm_conn, org, 50)
    admit(llm_conn, org, 50)
    settle(llm_conn, org, first["id"], 90)  # used 90 + held 50 > 100, through settlement
    assert invariants(llm_conn) == []


# ---------------------------------------------------------------- mark_dispatched


def test_mark_dispatched_moves_reserved_to_dispatched(llm_conn):
    org = new_org(llm_conn)
    inv = admit(llm_conn, org, 10, now=T0)
    sent = dispatch(llm_conn, org, inv["id"], now=T0 + timedelta(seconds=2))
    assert sent["status"] == "dispatched"
    assert sent["dispatched_at"] == T0 + timedelta(seconds=2)
    assert sent["hold_credits"] == 10
    assert period(llm_conn, org)["held_credits"] == 10
    assert invariants(llm_conn) == []


def test_mark_dispatched_repeat_is_idempotent(llm_conn):
    org = new_org(llm_conn)
    inv = admit(llm_conn, org, 10)
    first = dispatch(llm_conn, org, inv["id"], now=T0 + timedelta(seconds=1))
    before = fingerprint(llm_conn)
    again = dispatch(llm_conn, org, inv["id"], now=T0 + timedelta(seconds=9))
    assert first["replayed"] is False
    assert again == {**first, "replayed": True}
    assert fingerprint(llm_conn) == before


def test_mark_dispatched_of_an_unknown_invocation_raises_LL005(llm_conn):
    org = new_org(llm_conn)
    assert_sqlstate(llm_conn, "LL005", DISPATCH_SQL,
                    {"organization_id": org, "invocation_id": uuid.uuid4(), "now": T0})


def test_mark_dispatched_of_another_organizations_invocation_raises_LL005(llm_conn):
    mine, theirs = new_org(llm_conn), new_org(llm_conn)
    their_inv = admit(llm_conn, theirs, 10)
    assert_sqlstate(llm_conn, "LL005", DISPATCH_SQL,
                    {"organization_id": mine, "invocation_id": their_inv["id"], "now": T0})
    assert invocation(llm_conn, theirs, their_inv["id"])["status"] == "reserved"


def test_mark_dispatched_for_an_unknown_organization_raises_LL002(llm_conn):
    assert_sqlstate(llm_conn, "LL002", DISPATCH_SQL,
                    {"organization_id": uuid.uuid4(), "invocation_id": uuid.uuid4(), "now": T0})


@pytest.mark.parametrize("end", ["settled", "failed", "recovered"])
def test_mark_dispatched_of_a_terminal_invocation_raises_LL009(llm_conn, end):
    org = new_org(llm_conn)
    inv = admit(llm_conn, org, 10, now=T0)
    if end == "settled":
        settle(llm_conn, org, inv["id"], 5)
    elif end == "failed":
        fail(llm_conn, org, inv["id"])
    else:
        reconcile(llm_conn, org, now=T0 + timedelta(hours=25))
    err = assert_sqlstate(llm_conn, "LL009", DISPATCH_SQL,
                          {"organization_id": org, "invocation_id": inv["id"], "now": T0 + timedelta(days=2)})
    assert err.diag.message_hint


@pytest.mark.parametrize("which", ["organization", "invocation"])
def test_mark_dispatched_with_a_null_id_raises_22023(llm_conn, which):
    org = new_org(llm_conn)
    inv = admit(llm_conn, org, 10)
    params = {"organization_id": org, "invocation_id": inv["id"], "now": T0}
    params["organization_id" if which == "organization" else "invocation_id"] = None
    assert_sqlstate(llm_conn, "22023", DISPATCH_SQL, params)


def test_dispatched_invocation_settles_and_releases_its_hold(llm_conn):
    org = new_org(llm_conn)
    inv = admit(llm_conn, org, 10)
    dispatch(llm_conn, org, inv["id"])
    assert settle(llm_conn, org, inv["id"], 7) == "settled"
    assert invocation(llm_conn, org, inv["id"])["dispatched_at"] == T0
    p = period(llm_conn, org)
    assert (p["held_credits"], p["used_credits"]) == (0, 7)
    assert invariants(llm_conn) == []
