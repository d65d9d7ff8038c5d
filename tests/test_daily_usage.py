"""Daily usage against its requests: a true-up racing the pass's rebuild of its day is
never lost, a pass run with a clock far ahead hides no earlier day
from the catch-up, and ``llm.check_daily_usage`` reports every day
whose rows differ from its requests.

``daily_usage`` is a cache: a settlement after the pass rebuilt its day is legal until
the next rebuild, so it is no invariant. With no traffic after a pass, every day must
agree, and each test ends with ``check_daily_usage`` empty (and the invariants empty).

Races are scripted with two real connections and open transactions, each wait checked
with ``pg_blocking_pids``: no sleeps, no timing.
"""

from __future__ import annotations

import uuid
from datetime import date

import psycopg
import pytest

from llm_db import Llm
from tests.helpers import (
    DAY,
    HOUR,
    T0,
    InThread,
    admit_dispatched,
    call,
    daily_usage_findings,
    invariants,
    new_org,
    on_one_node,
    reconcile,
    run_pass,
    settle,
    wait_blocked,
)

RECOVERED_AT = T0 + 25 * HOUR  # past the 24 h recovery window of a request admitted at T0
RECOVERY_DAY = RECOVERED_AT.date()
LATE = 65  # the late measured figures: credits over the recovery charge (40), 7 cents
ESTIMATE = 40


def rebuild(conn: psycopg.Connection, day: date) -> int:
    return call(conn, "rebuild_daily_usage", day, day)[0]["value"]


def true_up(conn: psycopg.Connection, org: uuid.UUID, inv: uuid.UUID) -> str:
    return settle(
        conn, org, inv, LATE, 7, input_tokens=900, output_tokens=100, now=RECOVERED_AT + HOUR
    )


def recovered_request(conn: psycopg.Connection) -> tuple[uuid.UUID, uuid.UUID]:
    """An organization that trues up late settlements, a request of it settled the same day
    (so its day's row has more than the true-up in it) and one recovered at its estimate."""
    org = new_org(conn, None)
    Llm(conn).set_recovery_policy(org, "estimate", "true_up")
    inv = admit_dispatched(conn, org, ESTIMATE)
    other = admit_dispatched(conn, org, 5, now=RECOVERED_AT - HOUR)
    assert (
        settle(conn, org, other, 5, 1, input_tokens=10, output_tokens=2, now=RECOVERED_AT - HOUR)
        == "settled"
    )
    assert reconcile(conn, org, now=RECOVERED_AT)["recovered_requests"] == 1
    return org, inv


def usage(conn: psycopg.Connection, org: uuid.UUID) -> tuple:
    return conn.execute("SELECT requests, recovered_requests, credits, cents, input_tokens, output_tokens"
                        " FROM llm.daily_usage WHERE organization_id = %s AND day = %s",
                        [org, RECOVERY_DAY]).fetchone()  # fmt: skip


def assert_day_right(conn: psycopg.Connection, org: uuid.UUID) -> None:
    """The day's row holds both requests, the true-up's measured figures included."""
    assert usage(conn, org) == (2, 1, LATE + 5, 7 + 1, 900 + 10, 100 + 2)
    assert daily_usage_findings(conn, RECOVERY_DAY, RECOVERY_DAY) == []
    assert invariants(conn) == []


# ---------------------------------------------------------------- a true-up against the rebuild


@pytest.mark.parametrize("built", [True, False], ids=["day built", "day not built yet"])
def test_a_true_up_waiting_on_the_rebuild_of_its_day_is_kept(llm_conn, llm_connect, built):
    """Rebuild first: the rebuild of the true-up's day is open (its rows
    deleted and inserted again, without the true-up, which has not happened); the true-up
    waits for the rebuild's rows and, once the rebuild commits, adds its difference to
    them. As it was, the true-up's UPDATE waited on the deleted row, found it gone and
    changed nothing (day built), or did not see the rebuild's new row and changed nothing
    (day not built yet): the day lacked the true-up for good."""
    org, inv = recovered_request(llm_conn)
    if built:
        rebuild(llm_conn, RECOVERY_DAY)
    rebuilder = llm_connect(autocommit=False)
    assert rebuild(rebuilder, RECOVERY_DAY) == 1  # not committed
    settler = llm_connect()
    trued = InThread(lambda: true_up(settler, org, inv))
    wait_blocked(llm_conn, settler.info.backend_pid)

    rebuilder.commit()

    assert trued.result() == "trued_up"
    assert_day_right(llm_conn, org)


@pytest.mark.parametrize("built", [True, False], ids=["day built", "day not built yet"])
def test_a_rebuild_waiting_on_a_true_up_of_its_day_counts_it(llm_conn, llm_connect, built):
    """True-up first: the true-up is open, its day's row moved (day
    built) or inserted from the requests (day not built yet); the rebuild waits for that
    row and, once the true-up commits, rebuilds the day with it (day not built yet: its
    INSERT skips the row the true-up inserted, and it rebuilds again). As it was, a true-up
    of a day not built yet wrote no row and the rebuild, not waiting, counted the request at
    its recovery charge; and on Citus the rebuild failed, XX000, on the inserted row."""
    org, inv = recovered_request(llm_conn)
    if built:
        rebuild(llm_conn, RECOVERY_DAY)
    settler = llm_connect(autocommit=False)
    assert true_up(settler, org, inv) == "trued_up"  # not committed
    rebuilder = llm_connect()
    rebuilt = InThread(lambda: rebuild(rebuilder, RECOVERY_DAY))
    wait_blocked(llm_conn, rebuilder.info.backend_pid)

    settler.commit()

    assert rebuilt.result() == 1
    assert_day_right(llm_conn, org)


def test_a_true_up_of_a_day_not_built_yet_writes_the_row_a_rebuild_would(llm_conn):
    """With no rebuild running, a true-up of a day the pass has not
    built since the recovery writes that day's row from the requests, and a rebuild then
    leaves it as it is."""
    org, inv = recovered_request(llm_conn)
    assert true_up(llm_conn, org, inv) == "trued_up"
    written = usage(llm_conn, org)
    rebuild(llm_conn, RECOVERY_DAY)
    assert usage(llm_conn, org) == written
    assert_day_right(llm_conn, org)


# ---------------------------------------------------------------- a far clock


def test_a_pass_run_far_ahead_hides_no_day_from_the_catch_up(llm_conn):
    """Passes run daily, then one with a clock a year ahead (``llm-db reconcile --now``);
    requests settle over three days while no pass runs; the passes resume at the real clock,
    and every day of the outage reaches daily_usage. As it was, the far pass's
    daily_rebuilt_through made the resumed pass rebuild only the last
    settings.reporting_days, so the outage's first days stayed without their usage."""
    org = new_org(llm_conn, None)
    for day in range(2):
        run_pass(llm_conn, T0 + day * DAY)
    assert run_pass(llm_conn, T0 + 365 * DAY)["status"] == "succeeded"
    for day in range(2, 5):  # the outage: no pass runs
        inv = admit_dispatched(llm_conn, org, 10, now=T0 + day * DAY)
        assert settle(llm_conn, org, inv, 10 + day, day, now=T0 + day * DAY + HOUR) == "settled"

    resumed = run_pass(llm_conn, T0 + 6 * DAY)

    assert resumed["status"] == "succeeded"
    assert daily_usage_findings(llm_conn, T0.date(), (T0 + 6 * DAY).date()) == []
    assert llm_conn.execute("SELECT day, credits FROM llm.daily_usage WHERE organization_id = %s ORDER BY day",
                            [org]).fetchall() == [((T0 + d * DAY).date(), 10 + d) for d in range(2, 5)]  # fmt: skip
    assert invariants(llm_conn) == []


def test_a_pass_run_ahead_vouches_only_for_the_days_it_really_saw(llm_conn):
    """Once real time reaches the clock a pass ran with (found in
    review): a pass today, then one run ten days ahead (``llm-db reconcile --now``); a
    request settles two days on, while no pass runs; passes resume twelve days on. The
    pass run ahead rebuilt days whose requests had not settled yet, so it vouches only
    for the days up to the one it really ran on, and the resumed pass rebuilds the
    outage. As it was, it vouched up to its clock and the outage's day stayed empty.
    Clocks count from the server's real day here: what a pass may vouch for is bounded
    by when it really ran."""
    today = llm_conn.execute("SELECT date_trunc('day', now()) + interval '12 hours'").fetchone()[0]
    org = new_org(llm_conn, None, now=today)
    assert run_pass(llm_conn, today)["status"] == "succeeded"
    assert run_pass(llm_conn, today + 10 * DAY)["status"] == "succeeded"
    inv = admit_dispatched(llm_conn, org, 10, now=today + 2 * DAY)
    assert settle(llm_conn, org, inv, 7, 3, now=today + 2 * DAY + HOUR) == "settled"

    assert run_pass(llm_conn, today + 12 * DAY)["status"] == "succeeded"

    assert daily_usage_findings(llm_conn, today.date(), (today + 12 * DAY).date()) == []
    assert llm_conn.execute("SELECT day, credits FROM llm.daily_usage WHERE organization_id = %s",
                            [org]).fetchall() == [((today + 2 * DAY).date(), 7)]  # fmt: skip
    assert invariants(llm_conn) == []


# ---------------------------------------------------------------- check_daily_usage


def test_check_daily_usage_reports_each_day_whose_rows_differ_from_its_requests(llm_conn):
    """llm.check_daily_usage names, per organization and day of the range, both sides of
    a disagreement: a row changed, a row deleted and a row of a model nobody used, each by
    hand; a day that agrees and a day outside the range are not reported."""
    a, b = new_org(llm_conn, None), new_org(llm_conn, None)
    for day in range(4):
        for org in (a, b):
            inv = admit_dispatched(llm_conn, org, 10, now=T0 + day * DAY)
            assert settle(llm_conn, org, inv, 10, 2, input_tokens=100, output_tokens=20,
                          now=T0 + day * DAY + HOUR) == "settled"  # fmt: skip
    days = [(T0 + d * DAY).date() for d in range(4)]
    call(llm_conn, "rebuild_daily_usage", days[0], days[-1])
    assert daily_usage_findings(llm_conn, days[0], days[-1]) == []
    # the price book's figures (0.4.0): none priced, none without a cost; a row written
    # without them (the ghost below, as the previous release wrote) reads them as 0
    cost = {"priced_nanos": 0, "uncosted_requests": 0, "fallback_requests": 0, "corrections_nanos": 0}
    right = {"model-a": {"requests": 1, "recovered_requests": 0, "credits": 10, "cents": 2,
                         "input_tokens": 100, "output_tokens": 20, **cost}}  # fmt: skip

    llm_conn.execute(
        "UPDATE llm.daily_usage SET credits = 999 WHERE organization_id = %s AND day = %s",
        [a, days[0]],
    )
    llm_conn.execute(
        "DELETE FROM llm.daily_usage WHERE organization_id = %s AND day = %s", [b, days[1]]
    )
    llm_conn.execute(
        "INSERT INTO llm.daily_usage VALUES (%s, %s, 'ghost', 1, 0, 5, 0, 0, 0)", [a, days[2]]
    )
    # outside the range checked below
    llm_conn.execute("UPDATE llm.daily_usage SET credits = 1 WHERE day = %s", [days[3]])

    findings = daily_usage_findings(llm_conn, days[0], days[2])

    assert [(f["organization_id"], f["day"]) for f in findings] == [
        (a, days[0]),
        (b, days[1]),
        (a, days[2]),
    ]
    assert findings[0]["recorded"] == {"model-a": {**right["model-a"], "credits": 999}}
    assert findings[0]["computed"] == right
    assert (findings[1]["recorded"], findings[1]["computed"]) == ({}, right)
    ghost = {
        "requests": 1,
        "recovered_requests": 0,
        "credits": 5,
        "cents": 0,
        "input_tokens": 0,
        "output_tokens": 0,
        **cost,
    }
    assert (findings[2]["recorded"], findings[2]["computed"]) == ({**right, "ghost": ghost}, right)
    typed = Llm(llm_conn).check_daily_usage(days[0], days[2])
    assert [(f.organization_id, f.day, f.recorded, f.computed) for f in typed] == [
        (f["organization_id"], f["day"], f["recorded"], f["computed"]) for f in findings]  # fmt: skip

    call(llm_conn, "rebuild_daily_usage", days[0], days[-1])  # the pass heals them
    assert daily_usage_findings(llm_conn, days[0], days[-1]) == []
    assert invariants(llm_conn) == []


@on_one_node
def test_a_rebuild_reads_each_organizations_requests_by_index_with_stale_statistics(llm_conn):
    """docs/architecture.md "The write path" (settlement days found from the settle bounds):
    the rebuild reads each organization's requests by their admission-time range through
    ``invocations_created``, never by scanning ``llm.invocations``. With statistics taken
    while every request was open (as on the pass right after a recovery), a plain join
    scanned the whole table once per organization: 6.4 s for the recovery benchmark's
    100,000 requests."""
    # enough requests that a scan of the table costs more than an organization's range
    orgs = [new_org(llm_conn, 10**9) for _ in range(40)]
    for org in orgs:
        llm_conn.execute(
            """SELECT count(*) FROM generate_series(1, 200) AS k,
                      LATERAL llm.admit_invocation(%(org)s, 1, 'model-a', NULL, NULL,
                                                   %(now)s + k * interval '1 second') AS a""",
            {"org": org, "now": T0},
        )
    llm_conn.execute("ANALYZE llm.invocations")  # every request open: settled_at all NULL
    for org in orgs:
        llm_conn.execute(
            """SELECT count(llm.settle_invocation(i.organization_id, i.id, 1, 0, p_now => %(now)s))
                 FROM llm.invocations AS i WHERE i.organization_id = %(org)s""",
            {"org": org, "now": T0 + HOUR},
        )

    with llm_conn.transaction():
        written = llm_conn.execute(
            "SELECT llm.rebuild_daily_usage(%s, %s)", [T0.date(), T0.date()]
        ).fetchone()[0]
        seq, idx = llm_conn.execute(
            """SELECT coalesce(seq_scan, 0), coalesce(idx_scan, 0) FROM pg_stat_xact_user_tables
                WHERE schemaname = 'llm' AND relname = 'invocations'"""
        ).fetchone()
    assert written == len(orgs)
    assert seq == 0, f"{seq} sequential scans of llm.invocations"
    assert idx >= len(orgs)
    assert daily_usage_findings(llm_conn, T0.date(), T0.date()) == []
    assert invariants(llm_conn) == []
