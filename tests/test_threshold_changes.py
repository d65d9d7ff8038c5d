"""An organization's allowance or threshold list changed while its periods have usage
(``llm.upsert_organization``; docs/architecture.md "Notices, the worker and metrics").

A changed threshold list re-spreads the notice rooms of every period
of the organization, so invariant 5b holds right after the change and a later
settlement of an earlier period that crosses a new threshold records its notice,
whichever path (fast or exact) moves it.

A change that puts used credits at or above a threshold's level
owes that threshold's notice at once, in the change's own transaction, for the period
containing ``p_now`` and any later one already open; once per threshold and period.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import psycopg
import pytest

from llm_db import Llm
from tests.helpers import (
    FEBRUARY,
    HOUR,
    JANUARY,
    NEW_MONTH,
    T0,
    InThread,
    admit,
    heard,
    invariants,
    new_org,
    notice_listener,
    notices,
    period,
    rows,
    set_org,
    settle,
    wait_blocked,
)

IN_FEBRUARY = NEW_MONTH + timedelta(days=2)


def used_up(conn: psycopg.Connection, org: uuid.UUID, credits: int, now) -> None:
    """A request of ``credits`` admitted and settled at ``now``: the period's usage grows by it."""
    assert (
        settle(conn, org, admit(conn, org, credits, now=now)["id"], credits, 0, now=now)
        == "settled"
    )


def owed(conn: psycopg.Connection, org: uuid.UUID) -> list[tuple]:
    """(period, threshold, used, allowance, crossed_at, status) of every notice of ``org``."""
    return [(n["period_start"], n["threshold_pct"], n["used_credits"], n["allowance_credits"],
             n["crossed_at"], n["status"]) for n in notices(conn, org)]  # fmt: skip


# ---------------------------------------------------------------- every period's rooms


def january_with_an_open_request(conn: psycopg.Connection) -> tuple[uuid.UUID, uuid.UUID]:
    """An organization on 8 stripes (allowance 1000, thresholds 80 and 100) whose January
    used 495 credits and still has a request of 100 open, and whose February is open too."""
    org = new_org(conn, 1000, thresholds=[80, 100])
    assert Llm(conn).set_period_stripes(org, 8) == 8
    used_up(conn, org, 495, T0)
    late = admit(conn, org, 100, now=T0)["id"]
    used_up(conn, org, 300, IN_FEBRUARY)
    # January's rooms as the old list left them: 305 credits to 80 %, about 38 a stripe
    rooms = rows(conn, "SELECT notice_room FROM llm.period_stripes WHERE organization_id = %s"
                       " AND period_start = %s", [org, JANUARY])  # fmt: skip
    assert sum(r["notice_room"] for r in rooms) == 305 and len(rooms) == 8
    return org, late


@pytest.mark.parametrize(
    "credits", [10, 200], ids=["small-move-fast-path-before", "large-move-exact-path"]
)
def test_a_changed_threshold_list_respreads_an_earlier_periods_rooms(llm_conn, credits):
    """Invariant 5 (5b): in February the list gains 50 % while a January
    request is still open. Right after the upsert the invariants hold (January's rooms now
    stop short of 50 %: 5 credits), and the late settlement of the January request that
    takes January from 49.5 % past 50 % records one notice for January, whether it is a
    small move that the old rooms (about 38 a stripe) let through on one stripe or a
    large one that takes the exact path anyway."""
    org, late = january_with_an_open_request(llm_conn)
    set_org(llm_conn, org, 1000, thresholds=[50, 80, 100], now=IN_FEBRUARY + HOUR)
    assert invariants(llm_conn) == []
    for start in (JANUARY, FEBRUARY):
        rooms = rows(llm_conn, "SELECT notice_room FROM llm.period_stripes WHERE organization_id = %s"
                               " AND period_start = %s", [org, start])  # fmt: skip
        assert sum(r["notice_room"] for r in rooms) == {JANUARY: 5, FEBRUARY: 200}[start]

    assert settle(llm_conn, org, late, credits, 0, now=IN_FEBRUARY + 2 * HOUR) == "settled"
    assert [
        (n["period_start"], n["threshold_pct"], n["used_credits"]) for n in notices(llm_conn, org)
    ] == [(JANUARY, 50, 495 + credits)]
    assert invariants(llm_conn) == []


def test_an_earlier_period_owes_no_notice_for_a_threshold_it_passed_before_the_list_had_it(
    llm_conn,
):
    """The period rule: a list change in February owes a new
    threshold already passed in February (the current period) at once, not in January, a
    month that is over; January's rooms are spread for the new list all the same, so its
    next crossing (80 %) is still notified."""
    org, late = january_with_an_open_request(llm_conn)  # January at 49.5 %, February at 30 %
    set_org(llm_conn, org, 1000, thresholds=[25, 80, 100], now=IN_FEBRUARY + HOUR)
    assert owed(llm_conn, org) == [(FEBRUARY, 25, 300, 1000, IN_FEBRUARY + HOUR, "owed")]
    assert invariants(llm_conn) == []
    assert settle(llm_conn, org, late, 400, 0, now=IN_FEBRUARY + 2 * HOUR) == "settled"  # 89.5 %
    assert [(n["period_start"], n["threshold_pct"]) for n in notices(llm_conn, org)] == [
        (JANUARY, 80),
        (FEBRUARY, 25),
    ]
    assert invariants(llm_conn) == []


def test_a_list_change_waits_for_a_settlement_holding_an_earlier_period_and_spreads_after_it(
    llm_conn, llm_connect
):
    """The lock order of docs/architecture.md (the organization, then its periods
    in period order, each period's stripes before its notices): an upsert changing the list
    waits for a settlement still holding January's stripes, then spreads January's rooms from
    the usage that settlement committed (invariant 5b right after)."""
    org, late = january_with_an_open_request(llm_conn)
    settler = llm_connect(autocommit=False)
    assert settle(settler, org, late, 1, 0, now=IN_FEBRUARY) == "settled"  # holds its stripe
    changer = llm_connect()
    change = InThread(
        lambda: set_org(changer, org, 1000, thresholds=[50, 80, 100], now=IN_FEBRUARY + HOUR)
    )
    wait_blocked(llm_conn, changer.info.backend_pid)
    settler.commit()
    change.result()
    assert period(llm_conn, org, JANUARY)["used_credits"] == 496
    rooms = rows(llm_conn, "SELECT notice_room FROM llm.period_stripes WHERE organization_id = %s"
                           " AND period_start = %s", [org, JANUARY])  # fmt: skip
    assert sum(r["notice_room"] for r in rooms) == 4
    assert invariants(llm_conn) == []


def test_a_settlement_waiting_for_a_list_change_moves_with_the_new_rooms(llm_conn, llm_connect):
    """The other order: while an upsert changing the list holds January's
    stripes, the late settlement of the January request waits for it, then finds the rooms
    spread for the new list, so its small move crossing 50 % records the notice."""
    org, late = january_with_an_open_request(llm_conn)
    changer = llm_connect(autocommit=False)
    set_org(changer, org, 1000, thresholds=[50, 80, 100], now=IN_FEBRUARY + HOUR)
    settler = llm_connect()
    settlement = InThread(lambda: settle(settler, org, late, 10, 0, now=IN_FEBRUARY + 2 * HOUR))
    wait_blocked(llm_conn, settler.info.backend_pid)
    changer.commit()
    assert settlement.result() == "settled"
    assert [
        (n["period_start"], n["threshold_pct"], n["used_credits"]) for n in notices(llm_conn, org)
    ] == [(JANUARY, 50, 505)]
    assert invariants(llm_conn) == []


# ---------------------------------------------------------------- owed by the change


def test_lowering_the_allowance_under_used_credits_owes_the_notices_at_once(llm_conn, llm_connect):
    """Invariant 5: used 850 of 1100 (77 %, nothing owed). Lowered to 900
    (94 %) the change itself owes 80 %, in its own transaction, with the figures as of the
    change, and notifies at commit; lowered to 800 (106 %) it owes 100 %; later changes
    owe no second notice for either."""
    org = new_org(llm_conn, 1100, thresholds=[80, 100])
    used_up(llm_conn, org, 850, T0)
    assert notices(llm_conn, org) == []
    ear = notice_listener(llm_connect)

    changer = llm_connect(autocommit=False)
    set_org(changer, org, 900, thresholds=[80, 100], now=T0 + HOUR)
    assert owed(changer, org) == [(JANUARY, 80, 850, 900, T0 + HOUR, "owed")]
    assert notices(llm_conn, org) == [] and heard(ear) == []  # not before the commit
    changer.commit()
    assert heard(ear) == ["created"]
    assert notices(llm_conn, org)[0]["next_attempt_at"] == T0 + HOUR  # due at once
    assert invariants(llm_conn) == []

    set_org(llm_conn, org, 800, thresholds=[80, 100], now=T0 + 2 * HOUR)
    assert owed(llm_conn, org) == [
        (JANUARY, 80, 850, 900, T0 + HOUR, "owed"),
        (JANUARY, 100, 850, 800, T0 + 2 * HOUR, "owed"),
    ]
    for allowance in (700, 5000, 800):  # lower again, raise, lower back: nothing new
        set_org(llm_conn, org, allowance, thresholds=[80, 100], now=T0 + 3 * HOUR)
    assert len(notices(llm_conn, org)) == 2
    assert invariants(llm_conn) == []


def test_lowering_the_allowance_owes_the_notices_of_a_later_period_already_open(llm_conn):
    """Invariant 9: a moved clock already opened February; lowering the
    allowance in January applies to both periods and owes each its notice at once."""
    org = new_org(llm_conn, 1100, thresholds=[80, 100])
    used_up(llm_conn, org, 850, T0)
    used_up(llm_conn, org, 700, IN_FEBRUARY)
    set_org(llm_conn, org, 850, thresholds=[80, 100], now=T0 + HOUR)
    assert owed(llm_conn, org) == [
        (JANUARY, 80, 850, 850, T0 + HOUR, "owed"),
        (JANUARY, 100, 850, 850, T0 + HOUR, "owed"),
        (FEBRUARY, 80, 700, 850, T0 + HOUR, "owed"),
    ]
    assert invariants(llm_conn) == []


def test_a_threshold_list_adding_a_threshold_already_passed_owes_it_at_once(llm_conn):
    """Used 450 of 1000 and the list gains 40 %: owed by the change, once;
    a further list change owes it no second time and owes nothing for 50 % still ahead."""
    org = new_org(llm_conn, 1000, thresholds=[80, 100])
    used_up(llm_conn, org, 450, T0)
    set_org(llm_conn, org, 1000, thresholds=[40, 80, 100], now=T0 + HOUR)
    assert owed(llm_conn, org) == [(JANUARY, 40, 450, 1000, T0 + HOUR, "owed")]
    set_org(llm_conn, org, 1000, thresholds=[40, 50, 80, 100], now=T0 + 2 * HOUR)
    assert [n["threshold_pct"] for n in notices(llm_conn, org)] == [40]
    assert invariants(llm_conn) == []
    used_up(llm_conn, org, 60, T0 + 3 * HOUR)  # 51 %: crosses 50 % the usual way
    assert [n["threshold_pct"] for n in notices(llm_conn, org)] == [40, 50]
    assert invariants(llm_conn) == []


def test_an_allowance_of_zero_owes_every_threshold_at_once(llm_conn):
    """At its edge: at an allowance of 0 every threshold's level is 0, so
    used credits stand at or above all of them, even at 0; the organization, refused with
    LL001 from now on, is told so by the change itself, and a raise back owes nothing."""
    org = new_org(llm_conn, 1000, thresholds=[80, 100])
    admit(llm_conn, org, 10, now=T0)  # opens January, nothing used
    set_org(llm_conn, org, 0, thresholds=[80, 100], now=T0 + HOUR)
    assert owed(llm_conn, org) == [
        (JANUARY, 80, 0, 0, T0 + HOUR, "owed"),
        (JANUARY, 100, 0, 0, T0 + HOUR, "owed"),
    ]
    set_org(llm_conn, org, 1000, thresholds=[80, 100], now=T0 + 2 * HOUR)
    assert len(notices(llm_conn, org)) == 2
    assert invariants(llm_conn) == []
