"""Limits that signal (docs/architecture.md "Budgets", Refusals): a budget caps
commitments (used + held + estimate) while a threshold counts used credits, so with
honest estimates usage stops short of the limit and no 100 % notice ever comes. The
first refusal by each limit (the allowance, or a budget for one id) in each window owes
one ``llm.limit_reached`` notice, reported by the driver in a second transaction
(``note_refusal``: an LL001 rolls back what its own transaction wrote), and the limit
windows that refused are counted in ``llm_admission_refusals_total{scope, window}``.
A refusal storm writes once per limit and window.
"""

from __future__ import annotations

import json
import uuid
from datetime import date, timedelta

import psycopg
import pytest

from llm_db import errors
from llm_db.client import Llm
from llm_db.models import Notice
from llm_db.service.notices import LIMIT_EVENT_TYPE, notice_body
from tests.helpers import T0, assert_sqlstate, fingerprint, invariants, notices, rows

JANUARY = date(2026, 1, 1)
MODEL = "gpt-x"
NOTE = ("SELECT llm.note_refusal(%(org)s, %(scope)s, %(scope_id)s, %(window)s, %(start)s,"
        " p_now => %(now)s)")  # fmt: skip


def limit_notices(conn: psycopg.Connection, org: uuid.UUID) -> list[tuple]:
    return [(n["scope"], n["scope_id"], n["budget_window"], n["period_start"], n["used_credits"],
             n["allowance_credits"]) for n in notices(conn, org) if n["threshold_pct"] == 0]  # fmt: skip


def refusals_total(llm: Llm) -> dict[tuple[str, str], float]:
    return {(r["labels"]["scope"], r["labels"]["window"]): r["value"]
            for r in llm.metrics(now=T0) if r["metric"] == "llm_admission_refusals_total"}  # fmt: skip


def fill(llm: Llm, org: uuid.UUID, estimate: int, n: int, **scope) -> None:
    """n requests admitted and settled at one credit under their honest estimate."""
    for _ in range(n):
        inv = llm.admit(org, estimate, MODEL, now=T0, **scope)
        llm.settle(org, inv.id, estimate - 1, 0, now=T0)


def test_usage_that_stops_short_of_the_allowance_still_signals_its_limit(llm_conn):
    """The first-hour report: with honest estimates usage stops at 594 of 600 and the 100 %
    notice never comes; the first refusal now owes one limit_reached notice, the storm of
    refusals after it none, and the series counts the window once."""
    llm = Llm(llm_conn)
    org = uuid.uuid4()
    llm.upsert_organization(org, "acme", 600, notice_thresholds=[100], now=T0)
    fill(llm, org, 100, 6)  # used 594: 100 % is never crossed
    for _ in range(50):
        with pytest.raises(errors.AllowanceExhausted) as refused:
            llm.admit(org, 100, MODEL, now=T0)
    assert (refused.value.scope, refused.value.window, refused.value.used_credits) == (
        "organization", "month", 594)
    assert limit_notices(llm_conn, org) == [("organization", None, "month", JANUARY, 594, 600)]
    assert [n["threshold_pct"] for n in notices(llm_conn, org)] == [0], "no 100 % notice: usage is 594"
    assert refusals_total(llm)[("organization", "month")] == 1
    assert invariants(llm_conn) == []


def test_each_budget_and_window_signals_once(llm_conn):
    """A budget for one id: its first refusal in a window owes one notice naming scope, id,
    window and window start; another id, and the next day, owe their own."""
    llm = Llm(llm_conn)
    org = uuid.uuid4()
    llm.upsert_organization(org, "acme", None, now=T0)
    llm.set_budget(org, "end_user", "*", "day", 100, now=T0)
    for user in ("u-1", "u-2"):
        inv = llm.admit(org, 90, MODEL, end_user=user, now=T0)
        llm.settle(org, inv.id, 90, 0, now=T0)
    for user, day in (("u-1", T0), ("u-1", T0), ("u-2", T0), ("u-1", T0 + timedelta(days=1))):
        with pytest.raises(errors.AllowanceExhausted):
            llm.admit(org, 150, MODEL, end_user=user, now=day)
    assert sorted(limit_notices(llm_conn, org)) == [
        ("end_user", "u-1", "day", T0.date(), 90, 100),
        ("end_user", "u-1", "day", T0.date() + timedelta(days=1), 0, 100),
        ("end_user", "u-2", "day", T0.date(), 90, 100),
    ]
    assert refusals_total(llm)[("end_user", "day")] == 3
    assert invariants(llm_conn) == []


def test_a_refusal_storm_writes_once_per_window(llm_conn, llm_role_conn, monkeypatch):
    """At most one write per limit window: after the first report, a refusal is one read
    on the database (note_refusal answers False and changes nothing), and the client asks
    only once per window at all."""
    owner = Llm(llm_conn)
    org = uuid.uuid4()
    owner.upsert_organization(org, "acme", 100, now=T0)
    app = Llm(llm_role_conn("llm_app"))  # as the consumer service runs
    calls = []
    note = Llm.note_refusal
    monkeypatch.setattr(Llm, "note_refusal", lambda self, *a, **k: calls.append(a) or note(self, *a, **k))
    with pytest.raises(errors.AllowanceExhausted):
        app.admit(org, 101, MODEL, now=T0)
    before = fingerprint(llm_conn)
    for _ in range(100):
        with pytest.raises(errors.AllowanceExhausted):
            app.admit(org, 101, MODEL, now=T0)
    assert len(calls) == 1, "the client reports each window once"
    assert fingerprint(llm_conn) == before
    params = {"org": org, "scope": "organization", "scope_id": None, "window": "month",
              "start": JANUARY, "now": T0}  # fmt: skip
    assert rows(llm_conn, NOTE, params)[0]["note_refusal"] is False
    assert fingerprint(llm_conn) == before


def test_a_plain_sql_caller_reports_its_refusal_itself(llm_conn):
    """LL001 stays what plain SQL sees, and it writes nothing, notice included: the caller
    reports the refusal with note_refusal (docs/integration.md), which owes the notice once."""
    org = uuid.uuid4()
    Llm(llm_conn).upsert_organization(org, "acme", 100, now=T0)
    error = assert_sqlstate(llm_conn, "LL001", "SELECT llm.admit_invocation(%s, 101, 'm', p_now => %s)",
                            [org, T0])  # fmt: skip
    assert error.diag.table_name == "periods"
    params = {"org": org, "scope": "organization", "scope_id": None, "window": "month",
              "start": JANUARY, "now": T0}  # fmt: skip
    assert rows(llm_conn, NOTE, params)[0]["note_refusal"] is True
    assert rows(llm_conn, NOTE, params)[0]["note_refusal"] is False
    assert limit_notices(llm_conn, org) == [("organization", None, "month", JANUARY, 0, 100)]


def test_a_report_for_a_limit_not_in_force_writes_nothing(llm_conn):
    """The figures come from the books: a report naming a budget that does not exist (or
    no longer does), or the allowance of an unlimited organization, owes nothing."""
    org = uuid.uuid4()
    Llm(llm_conn).upsert_organization(org, "acme", None, now=T0)
    before = fingerprint(llm_conn)
    for scope, scope_id, window in (("organization", None, "month"), ("api_key", "k", "day")):
        params = {"org": org, "scope": scope, "scope_id": scope_id, "window": window,
                  "start": T0.date() if window == "day" else JANUARY, "now": T0}  # fmt: skip
        assert rows(llm_conn, NOTE, params)[0]["note_refusal"] is False
    assert fingerprint(llm_conn) == before


@pytest.mark.parametrize(("scope", "scope_id", "window", "start", "code"), [
    ("tenant", None, "month", JANUARY, "22023"),
    ("organization", None, "year", JANUARY, "22023"),
    ("organization", "x", "month", JANUARY, "22023"),
    ("api_key", None, "day", JANUARY, "22023"),
    ("api_key", "*", "day", JANUARY, "22023"),
    ("api_key", " ", "day", JANUARY, "22023"),
    ("organization", None, "month", JANUARY + timedelta(days=1), "22023"),
    ("organization", None, "week", JANUARY, "22023"),  # 2026-01-01 is a Thursday
    ("organization", None, "month", None, "22023"),
    ("organization", None, "month", date.max, "22023"),
])  # fmt: skip
def test_a_malformed_report_is_22023_and_writes_nothing(llm_conn, scope, scope_id, window, start, code):
    org = uuid.uuid4()
    Llm(llm_conn).upsert_organization(org, "acme", 100, now=T0)
    assert_sqlstate(llm_conn, code, NOTE, {"org": org, "scope": scope, "scope_id": scope_id,
                                          "window": window, "start": start, "now": T0})  # fmt: skip


def test_a_report_for_an_unknown_organization_is_LL002(llm_conn):
    assert_sqlstate(llm_conn, "LL002", NOTE, {"org": uuid.uuid4(), "scope": "organization",
                                             "scope_id": None, "window": "month", "start": JANUARY,
                                             "now": T0})  # fmt: skip


def test_the_limit_reached_notice_is_delivered_as_its_own_event(llm_conn):
    """Claimed and signed as every notice; its body is ``llm.limit_reached`` naming the
    limit, the window and the used credits when it was reported."""
    llm = Llm(llm_conn)
    org = uuid.uuid4()
    llm.upsert_organization(org, "acme", None, now=T0)
    llm.set_budget(org, "project", "p-1", "week", 50, now=T0)
    with pytest.raises(errors.AllowanceExhausted):
        llm.admit(org, 60, MODEL, project="p-1", now=T0)
    (claimed,) = llm.claim_notices(limit=5, now=T0)
    assert isinstance(claimed, Notice) and claimed.is_limit_reached
    body = json.loads(notice_body(claimed))
    assert body["type"] == LIMIT_EVENT_TYPE == "llm.limit_reached"
    assert body["data"] == {
        "organization_id": str(org), "notice_id": str(claimed.id), "scope": "project",
        "scope_id": "p-1", "window": "week", "window_start": "2026-01-12", "limit_credits": 50,
        "used_credits": 0, "refused_at": T0.isoformat(), "attempts": 1,
    }  # fmt: skip
    assert invariants(llm_conn) == []
