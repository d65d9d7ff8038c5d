"""Daily usage against its requests: ``llm.check_daily_usage`` reports every day whose
rows differ from its requests.

``daily_usage`` is a cache: a settlement after the pass rebuilt its day is legal until
the next rebuild, so it is no invariant. With no traffic after a pass, every day must
agree, and each test ends with ``check_daily_usage`` empty (and the invariants empty).
"""

from __future__ import annotations

from datetime import timedelta

from llm_db import Llm
from tests.helpers import (
    T0,
    admit_dispatched,
    call,
    daily_usage_findings,
    invariants,
    new_org,
    settle,
)

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


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
    right = {"model-a": {"requests": 1, "recovered_requests": 0, "credits": 10, "cents": 2,
                         "input_tokens": 100, "output_tokens": 20}}  # fmt: skip

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
    }
    assert (findings[2]["recorded"], findings[2]["computed"]) == ({**right, "ghost": ghost}, right)
    typed = Llm(llm_conn).check_daily_usage(days[0], days[2])
    assert [(f.organization_id, f.day, f.recorded, f.computed) for f in typed] == [
        (f["organization_id"], f["day"], f["recorded"], f["computed"]) for f in findings]  # fmt: skip

    call(llm_conn, "rebuild_daily_usage", days[0], days[-1])  # the pass heals them
    assert daily_usage_findings(llm_conn, days[0], days[-1]) == []
    assert invariants(llm_conn) == []
