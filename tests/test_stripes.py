"""Striped period counters (schema 0007, ``llm.set_period_stripes``): one organization's
period spread over N rows so its requests do not queue on one row, while admission stays
exact (CAP-PFM-LLM-007: admitted iff used + held + estimate <= allowance over the whole
period, never rejecting one that fits, never overspending) and no threshold crossing is
missed.

A session takes its holds from stripe ``pg_backend_pid() % N``; the tests pick sessions
by their backend pid to put requests on the stripes they need. Races use real
connections and a barrier; every test ends with ``check_invariants()`` empty, which also
checks the escrow (the stripes never promise more room than the period has left, nor more
usage than its next threshold allows).
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import psycopg
import pytest

from llm_db import AllowanceExhausted, Llm
from tests.helpers import HOUR, T0, invariants, row, rows, scalar, sessions_on_stripes, wait_blocked


def striped_org(llm: Llm, allowance: int | None, stripes: int, *, thresholds=(80, 100)) -> uuid.UUID:
    org = uuid.uuid4()
    llm.upsert_organization(org, "hot tenant", allowance, notice_thresholds=thresholds, now=T0)
    assert llm.set_period_stripes(org, stripes) == stripes
    return org


def stripes_of(conn: psycopg.Connection, org: uuid.UUID) -> dict[int, dict]:
    return {r["stripe"]: r for r in rows(
        conn, "SELECT * FROM llm.period_stripes WHERE organization_id = %s ORDER BY period_start, stripe", [org])}  # fmt: skip


def period(conn: psycopg.Connection, org: uuid.UUID) -> dict:
    found = row(conn, "SELECT * FROM llm.periods WHERE organization_id = %s", [org])
    assert found is not None
    return found


def run_together(conns: list[psycopg.Connection], work) -> list[BaseException]:
    barrier = threading.Barrier(len(conns))
    errors: list[BaseException] = []

    def run(i: int, conn: psycopg.Connection) -> None:
        try:
            barrier.wait(10)
            work(i, conn)
        except BaseException as exc:  # asserted empty by the caller
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return errors


def test_set_period_stripes_returns_the_new_count_and_stores_it(llm_conn):
    llm = Llm(llm_conn)
    org = striped_org(llm, 100, 8)
    assert scalar(llm_conn, "SELECT period_stripes FROM llm.organizations WHERE id = %s", [org]) == 8
    assert llm.set_period_stripes(org, 1) == 1


def test_eight_sessions_admitting_on_one_striped_organization_never_pass_its_allowance(llm_conn, llm_connect):
    """CAP-PFM-LLM-007 / invariant 4 on 8 stripes: 8 sessions x 200 admissions of 1..50
    credits against an allowance of 20,000. The only refusal is LL001, holds never pass the
    allowance, and no refusal happened while its estimate still fitted (room only shrinks)."""
    llm = Llm(llm_conn)
    org = striped_org(llm, 20_000, 8)
    estimates = [[(i * 37 + k * 11) % 50 + 1 for k in range(200)] for i in range(8)]
    admitted: list[list[int]] = [[] for _ in range(8)]
    refused: list[list[int]] = [[] for _ in range(8)]
    conns = [llm_connect() for _ in range(8)]

    def work(i: int, conn: psycopg.Connection) -> None:
        client = Llm(conn)
        for estimate in estimates[i]:
            try:
                client.admit(org, estimate, "gpt-x", now=T0)
                admitted[i].append(estimate)
            except AllowanceExhausted:
                refused[i].append(estimate)

    assert run_together(conns, work) == []
    held = sum(map(sum, admitted))
    p = period(llm_conn, org)
    assert p["held_credits"] == held <= p["allowance_credits"] == 20_000
    every_refusal = [e for r in refused for e in r]
    assert every_refusal, "the workload must exhaust the allowance to prove anything"
    assert 20_000 - held < min(every_refusal)
    assert len({s for s in stripes_of(llm_conn, org) if stripes_of(llm_conn, org)[s]["held_credits"]}) > 1
    assert invariants(llm_conn) == []


def test_a_request_that_fits_only_across_stripes_is_admitted(llm_conn):
    """Exactness: allowance 100 over 4 stripes gives each stripe a room of 25; a request of
    60 does not fit its stripe's room but fits the period, so it is admitted (the rooms are
    spread again); one of 41 more then is refused."""
    llm = Llm(llm_conn)
    org = striped_org(llm, 100, 4)
    llm.admit(org, 1, "gpt-x", now=T0)  # creates the period and spreads the rooms
    assert sorted(s["admit_room"] for s in stripes_of(llm_conn, org).values()) == [24, 25, 25, 25]
    inv = llm.admit(org, 60, "gpt-x", now=T0)
    assert period(llm_conn, org)["held_credits"] == 61
    assert sum(s["admit_room"] for s in stripes_of(llm_conn, org).values()) == 39
    with pytest.raises(AllowanceExhausted) as refused:
        llm.admit(org, 40, "gpt-x", now=T0)
    assert "held=61" in (refused.value.detail or "")
    assert llm.admit(org, 39, "gpt-x", now=T0).hold_credits == 39
    assert inv.stripe == scalar(llm_conn, "SELECT stripe FROM llm.invocations WHERE id = %s", [inv.id])
    assert invariants(llm_conn) == []


def test_settlement_failure_recovery_and_true_up_move_the_stripe_holding_the_request(llm_conn, llm_connect):
    """Each movement lands on the stripe that holds the request's hold: a settlement on
    stripe 1, a failure on stripe 2, a recovery and then a true-up on stripe 3; the other
    stripes do not move."""
    llm = Llm(llm_conn)
    org = striped_org(llm, 10_000, 4)
    llm.set_recovery_policy(org, "estimate", "true_up")
    one, two, three = sessions_on_stripes(llm_connect, 4, [1, 2, 3])
    settled = Llm(one).admit(org, 100, "gpt-x", now=T0)
    failed = Llm(two).admit(org, 50, "gpt-x", now=T0)
    stranded = Llm(three).admit(org, 70, "gpt-x", now=T0)
    assert (settled.stripe, failed.stripe, stranded.stripe) == (1, 2, 3)

    llm.settle(org, settled.id, 90, 4, now=T0 + HOUR)
    llm.fail(org, failed.id, "provider error", credits=5, now=T0 + HOUR)
    llm.reconcile_org(org, now=T0 + 25 * HOUR)
    after_recovery = stripes_of(llm_conn, org)
    assert llm.settle(org, stranded.id, 40, 2, now=T0 + 26 * HOUR) == "trued_up"

    s = stripes_of(llm_conn, org)
    assert {k: (v["used_credits"], v["held_credits"], v["used_cents"]) for k, v in s.items()} == {
        0: (0, 0, 0), 1: (90, 0, 4), 2: (5, 0, 0), 3: (40, 0, 2)}  # fmt: skip
    assert after_recovery[3]["used_credits"] == 70
    assert invariants(llm_conn) == []


def test_changing_the_stripe_count_with_requests_open_keeps_every_hold(llm_conn, llm_connect):
    """Holds placed on 8 stripes stay on them when the organization goes to 2 stripes, then
    to 16: each settles on its own stripe, new holds land on the new stripes, and the period's
    totals never move but by the requests themselves."""
    llm = Llm(llm_conn)
    org = striped_org(llm, 100_000, 8)
    first = sessions_on_stripes(llm_connect, 8, [5, 6, 7])
    opened = [Llm(c).admit(org, 100, "gpt-x", now=T0) for c in first]
    assert [i.stripe for i in opened] == [5, 6, 7]
    llm.set_period_stripes(org, 2)
    later = [Llm(c).admit(org, 10, "gpt-x", now=T0) for c in first]
    assert {i.stripe for i in later} <= {0, 1}
    assert period(llm_conn, org)["held_credits"] == 330
    llm.set_period_stripes(org, 16)
    more = Llm(first[0]).admit(org, 1, "gpt-x", now=T0)
    assert more.stripe == first[0].info.backend_pid % 16
    assert invariants(llm_conn) == []
    for inv in opened + later + [more]:
        llm.settle(org, inv.id, inv.hold_credits, 0, now=T0 + HOUR)
    assert (period(llm_conn, org)["held_credits"], period(llm_conn, org)["used_credits"]) == (0, 331)
    assert invariants(llm_conn) == []


def test_an_exact_decision_locks_the_stripes_created_while_it_waited(llm_conn, llm_connect):
    """Scripted race. X holds the period and spreads it over a new third stripe (a raised
    count). B, the first admission on a fourth stripe that does not exist yet, takes the
    exact path and waits for the period meanwhile. When X commits, B must hold the third
    stripe too before it decides: otherwise a settlement on it could move usage between
    B's reading of the totals and its spreading of the rooms, and the rooms would promise
    more than the next threshold allows (invariant 5b). Z's uncommitted insert of the
    fourth stripe pauses B once it has locked the period, so the probe can see B's locks."""
    llm = Llm(llm_conn)
    org = striped_org(llm, 1_000_000, 2)
    first = llm.admit(org, 10, "gpt-x", now=T0)
    llm.settle(org, first.id, 10, 0, now=T0)
    month = first.period_start

    llm.set_period_stripes(org, 3)
    x = llm_connect(autocommit=False)
    x.execute("SELECT llm._lock_period(%s, %s)", [org, month])
    x.execute("SELECT llm._spread_rooms(%s, %s, 1000000)", [org, month])  # creates stripe 2
    llm.set_period_stripes(org, 4)
    z = llm_connect(autocommit=False)
    z.execute("INSERT INTO llm.period_stripes (organization_id, period_start, stripe) VALUES (%s, %s, 3)",
              [org, month])  # fmt: skip

    (b,) = sessions_on_stripes(llm_connect, 4, [3])
    admitted: list = []
    waiter = threading.Thread(target=lambda: admitted.append(Llm(b).admit(org, 100, "gpt-x", now=T0)))
    waiter.start()
    wait_blocked(llm_conn, b.info.backend_pid)  # on stripe 0, held by X
    x.commit()
    wait_blocked(llm_conn, b.info.backend_pid)  # on Z's stripe 3, with the period locked

    probe = llm_connect()
    with pytest.raises(psycopg.errors.LockNotAvailable):
        probe.execute("SELECT FROM llm.period_stripes WHERE organization_id = %s AND stripe = 2 FOR UPDATE NOWAIT",
                      [org])  # fmt: skip
    z.rollback()
    waiter.join()
    assert admitted[0].stripe == 3
    assert period(llm_conn, org)["held_credits"] == 100
    assert invariants(llm_conn) == []


def test_a_new_month_gets_its_own_stripes_and_the_old_month_settles_on_its_own(llm_conn, llm_connect):
    """Month rollover: January's holds settle on January's stripes after February began;
    February's first admission creates February's period with the organization's stripes."""
    llm = Llm(llm_conn)
    org = striped_org(llm, 1000, 4)
    (conn,) = sessions_on_stripes(llm_connect, 4, [2])
    january = Llm(conn).admit(org, 100, "gpt-x", now=T0)
    february_now = T0 + timedelta(days=20)
    february = Llm(conn).admit(org, 300, "gpt-x", now=february_now)
    assert (january.period_start.month, february.period_start.month) == (1, 2)
    llm.settle(org, january.id, 80, 1, now=february_now)
    periods = {r["period_start"].month: r for r in rows(
        llm_conn, "SELECT * FROM llm.periods WHERE organization_id = %s", [org])}  # fmt: skip
    assert (periods[1]["used_credits"], periods[1]["held_credits"]) == (80, 0)
    assert (periods[2]["used_credits"], periods[2]["held_credits"]) == (0, 300)
    feb_stripes = rows(llm_conn, "SELECT stripe FROM llm.period_stripes WHERE organization_id = %s"
                                 " AND period_start = %s ORDER BY 1", [org, february.period_start])  # fmt: skip
    assert [r["stripe"] for r in feb_stripes] == [0, 1, 2, 3]
    assert invariants(llm_conn) == []


def test_eight_settlers_on_eight_stripes_crossing_80_percent_together_leave_one_notice(llm_conn, llm_connect):
    """No threshold crossing is missed, nor recorded twice: 8 requests of 100 on 8 stripes
    (allowance 1000) settle at the same moment, together taking the period from 0 to 800
    credits, across 80 %. Exactly one owed notice for 80 %, recorded by the settlement whose
    movement crossed it, with the total at that moment."""
    llm = Llm(llm_conn)
    org = striped_org(llm, 1000, 8, thresholds=(80, 100))
    conns = sessions_on_stripes(llm_connect, 8, list(range(8)))
    invs = [Llm(c).admit(org, 100, "gpt-x", now=T0) for c in conns]
    assert sorted(i.stripe for i in invs) == list(range(8))

    outcomes: list[str] = []
    errors = run_together(conns, lambda i, c: outcomes.append(
        Llm(c).settle(org, invs[i].id, 100, 1, now=T0 + HOUR)))  # fmt: skip

    assert errors == [] and sorted(outcomes) == ["settled"] * 8
    notices = rows(llm_conn, "SELECT threshold_pct, used_credits, status FROM llm.threshold_notices"
                             " WHERE organization_id = %s", [org])  # fmt: skip
    assert notices == [{"threshold_pct": 80, "used_credits": 800, "status": "owed"}]
    assert period(llm_conn, org)["used_credits"] == 800
    assert invariants(llm_conn) == []


def test_recovery_across_stripes_records_each_crossing_once(llm_conn, llm_connect):
    """The sweep moves each recovered request's stripe under the period's lock and records
    each threshold the total crosses once: 4 stranded requests of 25 on 4 stripes (allowance
    100) take the period to 100, across 80 % and 100 %, in one sweep."""
    llm = Llm(llm_conn)
    org = striped_org(llm, 100, 4)
    for conn in sessions_on_stripes(llm_connect, 4, [0, 1, 2, 3]):
        Llm(conn).admit(org, 25, "gpt-x", now=T0)
    sweep = llm.reconcile_org(org, now=T0 + 25 * HOUR)
    assert (sweep.recovered_requests, sweep.notices_created) == (4, 2)
    notices = rows(llm_conn, "SELECT threshold_pct, used_credits FROM llm.threshold_notices"
                             " WHERE organization_id = %s ORDER BY 1", [org])  # fmt: skip
    assert notices == [{"threshold_pct": 80, "used_credits": 100}, {"threshold_pct": 100, "used_credits": 100}]
    assert {k: v["used_credits"] for k, v in stripes_of(llm_conn, org).items()} == {0: 25, 1: 25, 2: 25, 3: 25}
    assert invariants(llm_conn) == []


# ---------------------------------------------------------------- the escrow, checked


def test_check_invariants_reports_stripe_rooms_past_the_allowance_invariant_4(llm_conn):
    """Invariant 4 (b): together the stripes' admit_room never promise more than the period
    has left; a room raised behind the functions' back, or one left unset, is reported."""
    llm = Llm(llm_conn)
    org = striped_org(llm, 100, 4)
    llm.admit(org, 1, "gpt-x", now=T0)  # the period and its four stripes, rooms spread
    assert invariants(llm_conn) == []
    llm_conn.execute("UPDATE llm.period_stripes SET admit_room = admit_room + 1 "
                     "WHERE organization_id = %s AND stripe = 2", [org])  # fmt: skip
    (found,) = [v for v in invariants(llm_conn) if v["organization_id"] == org]
    assert found["invariant"] == 4 and "admit_room: sum 100, unset 0" in found["detail"]
    llm_conn.execute("UPDATE llm.period_stripes SET admit_room = NULL "
                     "WHERE organization_id = %s AND stripe = 2", [org])  # fmt: skip
    (found,) = [v for v in invariants(llm_conn) if v["organization_id"] == org]
    assert "unset 1" in found["detail"]


def test_check_invariants_reports_stripe_rooms_past_the_next_threshold_invariant_5(llm_conn):
    """Invariant 5 (b): while a threshold is ahead and not notified, the stripes'
    notice_room together stay below the usage that reaches it. Checked against the next
    threshold not yet notified: after the 80 % notice, the 100 % one."""
    llm = Llm(llm_conn)
    org = striped_org(llm, 100, 4)
    inv = llm.admit(org, 1, "gpt-x", now=T0)
    assert invariants(llm_conn) == []
    llm_conn.execute("UPDATE llm.period_stripes SET notice_room = 80 "
                     "WHERE organization_id = %s AND stripe = 0", [org])  # fmt: skip
    (found,) = [v for v in invariants(llm_conn) if v["organization_id"] == org]
    assert found["invariant"] == 5
    assert "next threshold 80% of 100 needs 80 more" in found["detail"]

    llm.settle(org, inv.id, 85, 0, now=T0)  # crosses 80 %: notified, the rooms spread again
    assert invariants(llm_conn) == []
    assert scalar(llm_conn, "SELECT count(*) FROM llm.threshold_notices WHERE organization_id = %s",
                  [org]) == 1  # fmt: skip
    llm_conn.execute("UPDATE llm.period_stripes SET notice_room = NULL "
                     "WHERE organization_id = %s AND stripe = 1", [org])  # fmt: skip
    (found,) = [v for v in invariants(llm_conn) if v["organization_id"] == org]
    assert "next threshold 100% of 100 needs 15 more" in found["detail"] and "unset 1" in found["detail"]

    # a notified threshold is behind, even when usage falls below it again: with the
    # allowance raised to 200 the period is at 42 %, 80 % was notified, 100 % is next
    llm.upsert_organization(org, "hot tenant", 200, notice_thresholds=(80, 100), now=T0)
    llm_conn.execute("UPDATE llm.period_stripes SET notice_room = NULL "
                     "WHERE organization_id = %s AND stripe = 1", [org])  # fmt: skip
    (found,) = [v for v in invariants(llm_conn) if v["organization_id"] == org]
    assert "next threshold 100% of 200 needs 115 more" in found["detail"]


def test_no_cents_room_is_spread_until_only_this_releases_functions_write(llm_conn):
    """Invariant 4 (b) through an upgrade. Between its functions step and its contract
    step, a settlement of the previous release still running adds cents to a stripe and
    takes none from a cents_room (0.3.0 had none). So until the mark 'functions_only',
    the exact path spreads cents_rooms of 0, and such a settlement leaves no stripe
    promising a cent the period does not have; a movement of no cents (an admission)
    still fits its stripe. Once the mark is there, the next exact movement spreads
    them."""
    llm = Llm(llm_conn)
    org = striped_org(llm, None, 4)
    llm_conn.execute("DELETE FROM llm.upgrade_steps WHERE step = 'functions_only'")
    inv = llm.admit(org, 10, "gpt-x", now=T0)  # the period's first movement: exact, spread
    stripes = stripes_of(llm_conn, org)
    assert [s["cents_room"] for s in stripes.values()] == [0] * 4
    assert all(s["admit_room"] is not None for s in stripes.values())
    rooms = [s["admit_room"] for s in stripes.values()]
    llm.admit(org, 5, "gpt-x", now=T0)  # no cents: on its stripe, nothing spread again
    assert sorted(r - s["admit_room"] for r, s in zip(rooms, stripes_of(llm_conn, org).values(), strict=True)) == [0, 0, 0, 5]
    # what the previous release's _move_within_rooms does with a settlement's cent
    held = next(k for k, s in stripes.items() if s["held_credits"] == 10)
    llm_conn.execute("UPDATE llm.period_stripes SET used_cents = used_cents + 1"
                     " WHERE organization_id = %s AND stripe = %s", [org, held])  # fmt: skip
    assert rows(llm_conn, "SELECT * FROM llm._invariant_4b() WHERE organization_id = %s", [org]) == []
    llm_conn.execute("UPDATE llm.period_stripes SET used_cents = used_cents - 1"
                     " WHERE organization_id = %s AND stripe = %s", [org, held])  # fmt: skip

    llm_conn.execute("INSERT INTO llm.upgrade_steps (step, finished_at) VALUES ('functions_only', now())")
    assert llm.settle(org, inv.id, 3, 1, now=T0) == "settled"  # no cents_room fits: exact
    assert scalar(llm_conn, "SELECT sum(cents_room) = llm._max_sum() - 1 FROM llm.period_stripes"
                            " WHERE organization_id = %s", [org]) is True  # fmt: skip
    assert invariants(llm_conn) == []
