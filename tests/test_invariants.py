"""Each invariant of docs/contract.md "Invariants" has its own function, ``llm._invariant_<N>()``
(2b, 4b and 5b too), and a case here that breaks it alone.

Every case starts from the same legal books, one organization holding a row of every kind
an invariant reads, on which every ``_invariant_*`` function returns nothing. The case then
corrupts them behind the functions' back (a superuser's UPDATE, INSERT or DELETE, on
purpose), and exactly its function reports it: ``check_invariants()`` returns those rows,
all under the invariant's number (2b, 4b and 5b under 2, 4 and 5), and nothing else.

The table is checked against the catalog: a ``_invariant_*`` function without a case, or a
call in ``check_invariants()`` to a function that does not exist, fails.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from tests.helpers import (
    HOUR,
    T0,
    admit,
    admit_dispatched,
    assert_books_right,
    call,
    close_task,
    invariants,
    new_org,
    open_task,
    reconcile,
    rows,
    scalar,
    set_budget,
    set_org,
    settle,
)

LATER = T0 + 25 * HOUR  # past the recovery window of what was dispatched at T0


@dataclass(frozen=True)
class Case:
    key: str  # the N of llm._invariant_<N>()
    breaks: str  # what the statements do to the books
    statements: tuple[str, ...]  # run as the superuser, with %(org)s and %(now)s
    also: tuple[str, ...] = ()  # other functions the breach must fire (see case 2)

    @property
    def reported_as(self) -> int:
        return int(self.key.rstrip("b"))


def one(table: str, where: str) -> str:
    """A subquery naming one row of ``table`` of the organization (by its id) where ``where``."""
    return (f"(SELECT t.id FROM llm.{table} AS t WHERE t.organization_id = %(org)s AND {where}"
            " ORDER BY t.id LIMIT 1)")  # fmt: skip


STRIPES = "UPDATE llm.period_stripes SET {} WHERE organization_id = %(org)s"
RECOVERED = one("invocations", "t.settlement_kind = 'recovered'")
MEASURED = one("invocations", "t.settlement_kind = 'measured'")
BUSIEST = ("(SELECT s.stripe FROM llm.period_stripes AS s WHERE s.organization_id = %(org)s"
           " ORDER BY s.used_credits DESC, s.stripe LIMIT 1)")  # fmt: skip

CASES = (
    Case(
        "1",
        "a stripe's held credits one below its open holds",
        (STRIPES.format("held_credits = held_credits - 1") + " AND held_credits > 0",),
    ),
    Case(
        "2b",
        "a used credit moved from one stripe to the other: the period's sum still agrees",
        (
            STRIPES.format(
                f"used_credits = used_credits + CASE WHEN stripe = {BUSIEST} THEN -1 ELSE 1 END"
            ),
        ),
    ),
    # The period is the sum of its stripes (a view since schema 0007) and the ledger is
    # derived from the requests (a view since 0008): a period that differs from its
    # requests has a stripe that differs (2b), and one that differs from its ledger has
    # a request that does (3). So 2 never fires alone; this breach fires 2 and 2b, and
    # both report under 2.
    Case(
        "2",
        "a used credit taken from a stripe",
        (STRIPES.format("used_credits = used_credits - 1") + f" AND stripe = {BUSIEST}",),
        also=("2b",),
    ),
    # With the ledger a view, 3 holds by the requests' rows agreeing with their status,
    # which 16 checks (0.3.0's CHECK constraints): a recovery charge off its request's
    # charge breaks both.
    Case(
        "3",
        "the recovery charges of two requests of a period moved by one credit, one up and "
        "one down, off their charges: the period's sums still agree",
        (
            "UPDATE llm.invocations SET recovered_credits = recovered_credits"
            " + CASE WHEN hold_credits = 40 THEN -1 ELSE 1 END"
            " WHERE organization_id = %(org)s AND settlement_kind = 'recovered'",
        ),
        also=("16",),
    ),
    Case(
        "4",
        "the allowance's excess forgotten, after the allowance was lowered under holds",
        ("UPDATE llm.period_heads SET allowance_excess = 0 WHERE organization_id = %(org)s",),
    ),
    Case(
        "4b",
        "a stripe's admit_room unset under a limited allowance",
        (STRIPES.format("admit_room = NULL") + " AND stripe = 0",),
    ),
    Case(
        "5b",
        "a stripe's notice_room unset while the 100 % threshold is ahead",
        (STRIPES.format("notice_room = NULL") + " AND stripe = 0",),
    ),
    Case(
        "5",
        "a past-window alert moved from a recovered request to a measured one",
        (
            "UPDATE llm.invocations SET past_window_alerted_at = NULL"
            f" WHERE organization_id = %(org)s AND id = {RECOVERED}",
            "UPDATE llm.invocations SET past_window_alerted_at = %(now)s"
            f" WHERE organization_id = %(org)s AND id = {MEASURED}",
        ),
    ),
    Case(
        "6",
        "a closed task's credits one above its requests'",
        ("UPDATE llm.executions SET credits = credits + 1 WHERE organization_id = %(org)s",),
    ),
    Case(
        "7",
        "a completed task's duration unset",
        ("UPDATE llm.executions SET duration_ms = NULL WHERE organization_id = %(org)s",),
    ),
    Case(
        "8",
        "the period deleted under its requests",
        (
            "DELETE FROM llm.period_stripes WHERE organization_id = %(org)s",
            "DELETE FROM llm.period_heads WHERE organization_id = %(org)s",
        ),
    ),
    Case(
        "9",
        "the organization's allowance changed without its current period's",
        ("UPDATE llm.organizations SET monthly_allowance_credits = 300 WHERE id = %(org)s",),
    ),
    Case(
        "10",
        "a recovery added to the sweeps' totals",
        (
            "UPDATE llm.sweep_totals SET recovered_requests = recovered_requests + 1"
            " WHERE organization_id = %(org)s",
        ),
    ),
    Case(
        "11",
        "an unresolved finding written for a period that agrees with its requests",
        (
            "INSERT INTO llm.period_findings (organization_id, period_start, recorded_used_credits,"
            " computed_used_credits, recorded_used_cents, computed_used_cents, recorded_held_credits,"
            " computed_held_credits, first_seen_at, last_seen_at)"
            " SELECT organization_id, period_start, used_credits, used_credits, used_cents, used_cents,"
            " held_credits, held_credits, %(now)s, %(now)s FROM llm.periods WHERE organization_id = %(org)s",
        ),
    ),
    Case(
        "12",
        "a claim token on notices that are not being sent",
        (
            # a constant token: Citus refuses a VOLATILE call in a distributed UPDATE
            "UPDATE llm.threshold_notices SET claim_token = '00000000-0000-4000-8000-0000000c1a12'"
            " WHERE organization_id = %(org)s AND status <> 'sending'",
        ),
    ),
    Case(
        "13",
        "a drift finding written for a task that agrees with its requests",
        (
            "INSERT INTO llm.drift_findings (organization_id, execution_id, recorded_request_count,"
            " recorded_credits, recorded_cents, settled_request_count, settled_credits, settled_cents,"
            " first_seen_at, last_seen_at)"
            " SELECT organization_id, id, request_count, credits, cents, request_count, credits, cents,"
            " %(now)s, %(now)s FROM llm.executions WHERE organization_id = %(org)s",
        ),
    ),
    Case(
        "14",
        "a budget counter's used credits one below its requests'",
        (
            "UPDATE llm.budget_counters SET used_credits = used_credits - 1"
            " WHERE organization_id = %(org)s AND used_credits > 0",
        ),
    ),
    Case(
        "15",
        "a budget counter's admitted limit set below its usage (its rooms emptied with it)",
        (
            "UPDATE llm.budget_counters SET admitted_limit = 90, admit_room = 0"
            " WHERE organization_id = %(org)s",
        ),
    ),
    Case(
        "16",
        "a measured settlement marked failed, its kind kept",
        (f"UPDATE llm.invocations SET status = 'failed' WHERE organization_id = %(org)s AND id = {MEASURED}",),
    ),
    Case(
        "17",
        "a stripe counting one open request more than it holds",
        (STRIPES.format("open_requests = open_requests + 1") + " AND stripe = 0",),
    ),
    Case(
        "18",
        "a budget counter's admit room raised past what its limit leaves",
        (
            "UPDATE llm.budget_counters SET admit_room = admit_room + 1000"
            " WHERE organization_id = %(org)s AND rooms_revision IS NOT NULL",
        ),
    ),
    Case(
        "19",
        "a request priced by the book recorded one nano dearer than its usage at its pinned price"
        " (and its stripe's cost sum with it: a lie 20 cannot see)",
        (
            "UPDATE llm.invocations SET cost_nanos = cost_nanos + 1"
            " WHERE organization_id = %(org)s AND priced_by = 'model'",
            STRIPES.format("priced_nanos = priced_nanos + 1") + " AND priced_nanos > 0",
        ),
    ),
    Case(
        "20",
        "a nano of cost the book priced lost from the stripe of the request it priced",
        (
            STRIPES.format("priced_nanos = priced_nanos - 1")
            + " AND priced_nanos > 0",
        ),
    ),
    Case(
        "21",
        "an organization with a budget marked as having none (its admissions would skip it)",
        ("UPDATE llm.organizations SET has_budgets = false WHERE id = %(org)s",),
    ),
)


def books(conn: psycopg.Connection) -> uuid.UUID:
    """One organization's legal books, with a row of every kind the invariants read: two
    stripes; two dispatched requests (holds 40 and 30) recovered at their holds, with
    past-window alerts; a measured request in a completed task; a day budget of 100 with
    85 used (its 80 % notice) and 10 held; 40 more held; a request priced by the book
    (4.5 credits of cost, charged 5); and the allowance then lowered from 10,000 to 200,
    under used + held (219: an excess of 19, the 100 % still ahead)."""
    org = new_org(conn, 10_000)
    call(conn, "set_period_stripes", org, 2)
    call(conn, "set_recovery_policy", org, "dispatched", "true_up")
    admit_dispatched(conn, org, 40)
    admit_dispatched(conn, org, 30)
    task = open_task(conn, org)
    settle(conn, org, admit_dispatched(conn, org, 10, execution_id=task), 9, 4)
    assert close_task(conn, org, task, now=T0 + HOUR)
    assert reconcile(conn, org, now=LATER)["recovered_requests"] == 2

    set_budget(conn, org, "api_key", "k", "day", 100, now=LATER)
    settle(conn, org, admit(conn, org, 90, api_key="k", now=LATER)["id"], 85, 3, now=LATER)
    admit(conn, org, 10, api_key="k", now=LATER)
    admit(conn, org, 40, now=LATER)
    call(conn, "set_price", "model-p", {"input": 1, "output": 2}, effective_from=T0)
    call(conn, "set_credit_rate", 1_000_000, effective_from=T0)
    priced = call(conn, "admit", org, None, "model-p", input_tokens=1000, max_output_tokens=1000, now=LATER)[0]
    assert call(conn, "settle_usage", org, priced["id"], {"input": 1500, "output": 1500}, now=LATER)[0]["value"] == "settled"
    set_org(conn, org, 200, now=LATER)

    assert (
        scalar(conn, "SELECT count(*) FROM llm.period_stripes WHERE organization_id = %s", [org])
        == 2
    )
    assert (
        scalar(
            conn, "SELECT allowance_excess FROM llm.period_heads WHERE organization_id = %s", [org]
        )
        == 19
    )
    assert (
        scalar(conn, "SELECT count(*) FROM llm.threshold_notices WHERE organization_id = %s", [org])
        > 0
    )
    return org


def invariant_functions(conn: psycopg.Connection) -> set[str]:
    """The N of every llm._invariant_<N>() in the catalog."""
    return {name.removeprefix("_invariant_") for (name,) in conn.execute(
        r"SELECT proname FROM pg_catalog.pg_proc WHERE pronamespace = 'llm'::regnamespace"
        r" AND proname LIKE '\_invariant\_%'")}  # fmt: skip


def violations(conn: psycopg.Connection, key: str) -> list[tuple]:
    """The rows of llm._invariant_<key>(), as tuples."""
    query = sql.SQL("SELECT * FROM llm.{}()").format(sql.Identifier(f"_invariant_{key}"))
    return [tuple(r.values()) for r in rows(conn, query)]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.key) for c in CASES])
def test_each_invariant_has_a_breach_that_only_it_reports(llm_conn, llm_superuser_conn, case):
    """Every invariant of docs/contract.md (1..21, 2b, 4b, 5b) is one private
    function, and a breach of it alone is reported by that function alone (case 2: with
    2b, see the table), under its number, for the organization broken; on legal books
    every function returns nothing."""
    org = books(llm_conn)
    assert {key: violations(llm_conn, key) for key in invariant_functions(llm_conn)} == {
        key: [] for key in invariant_functions(llm_conn)}  # fmt: skip
    assert_books_right(llm_conn)

    for statement in case.statements:
        llm_superuser_conn.execute(statement, {"org": org, "now": LATER})

    found = {key: violations(llm_conn, key) for key in invariant_functions(llm_conn)}
    assert {key for key, found_rows in found.items() if found_rows} == {case.key, *case.also}
    reported = [tuple(r.values()) for r in invariants(llm_conn)]
    assert {(r[0], r[1]) for r in reported} == {(int(k.rstrip("b")), org) for k in (case.key, *case.also)}
    assert sorted(reported) == sorted(r for found_rows in found.values() for r in found_rows)


def test_every_invariant_function_has_a_case_and_is_called(llm_conn):
    """The table above covers every llm._invariant_* function, and
    check_invariants() calls each of them once, and nothing that does not exist (a new
    invariant takes the next number and needs its function, its call and its case)."""
    functions = invariant_functions(llm_conn)
    assert functions == {c.key for c in CASES}
    assert len(CASES) == len({c.key for c in CASES})

    body = scalar(
        llm_conn,
        "SELECT prosrc FROM pg_catalog.pg_proc WHERE oid = 'llm.check_invariants()'::regprocedure",
    )
    calls = re.findall(r"\bllm\._invariant_(\w+)\(\)", body)
    assert sorted(calls) == sorted(set(calls)), "an invariant called twice"
    assert set(calls) == functions
