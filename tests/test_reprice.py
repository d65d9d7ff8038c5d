"""Repricing (docs/architecture.md "The price book"): a price corrected after the fact
reprices the requests the book priced from usage. A dry run writes nothing; applying
writes one correction per changed request (the settled request is never edited), moves
every cost sum by it exactly once in one transaction, leaves the credits as charged, and
repeating it changes nothing. check_invariants() (20) covers the sums and corrections."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from tests.helpers import (
    T0,
    InThread,
    assert_sqlstate,
    budget_usage,
    call,
    daily_usage_findings,
    execution,
    fingerprint,
    invariants,
    invocation,
    new_org,
    open_task,
    params,
    period,
    reconcile,
    rows,
    set_budget,
    sql_of,
    wait_blocked,
)

SINCE = T0 - timedelta(days=30)
DAY = T0.date()
FROM, TO = T0 - timedelta(days=1), T0 + timedelta(days=1)
OLD = {"input": "3", "output": "15"}
CORRECTED = {"input": "2.5", "output": "12"}
USAGE = {"input": 1000, "output": 200}  # 6,000,000 nanos at OLD, 4,900,000 at CORRECTED


@pytest.fixture
def book(llm_conn: psycopg.Connection) -> psycopg.Connection:
    call(llm_conn, "set_price", "m", OLD, effective_from=SINCE)
    call(llm_conn, "set_credit_rate", 1000, effective_from=SINCE)
    return llm_conn


def version(conn: psycopg.Connection, rates: dict[str, Any], *, org: uuid.UUID | None = None,
            model: str = "m") -> int:
    """A version of ``model`` set in the past, after the requests were priced: a
    correction published late is a version with the same effective time's past."""
    return call(conn, "set_price", model, rates, effective_from=SINCE + timedelta(days=1),
                organization_id=org)[0]["value"]


def priced(conn: psycopg.Connection, org: uuid.UUID, usage: dict[str, int] = USAGE, **kwargs: Any) -> uuid.UUID:
    inv = call(conn, "admit", org, None, "m", input_tokens=1000, max_output_tokens=1000, now=T0, **kwargs)[0]["id"]
    assert call(conn, "settle_usage", org, inv, usage, now=T0)[0]["value"] == "settled"
    return inv


def reprice(conn: psycopg.Connection, version_id: int, apply: bool = False, model: str = "m") -> dict[uuid.UUID, tuple]:
    return {r["organization_id"]: (r["requests"], r["cost_before_nanos"], r["cost_after_nanos"], r["difference_nanos"])
            for r in call(conn, "reprice", model, FROM, TO, version_id, apply=apply)}


def cost_sums(conn: psycopg.Connection, org: uuid.UUID, task: uuid.UUID) -> tuple:
    (counter,) = budget_usage(conn, org).values()
    (costs,) = call(conn, "report_costs", DAY, DAY, [org])
    return (period(conn, org)["used_cost_nanos"], counter["used_cost_nanos"],
            execution(conn, org, task)["priced_nanos"], costs["cost_nanos"], costs["original_cost_nanos"])


def test_a_dry_run_says_what_would_change_and_writes_nothing(book: psycopg.Connection) -> None:
    org = new_org(book, 10**9)
    for _ in range(3):
        priced(book, org)
    corrected = version(book, CORRECTED)
    before = fingerprint(book)
    assert reprice(book, corrected) == {org: (3, 18_000_000, 14_700_000, -3_300_000)}
    assert fingerprint(book) == before


def test_applying_moves_every_cost_sum_once_and_keeps_the_credits(book: psycopg.Connection) -> None:
    org = new_org(book, 10**9)
    set_budget(book, org, "api_key", "k", "day", 10**9)
    task = open_task(book, org)
    invs = [priced(book, org, api_key="k", execution_id=task) for _ in range(2)]
    caller = call(book, "admit", org, 100, "m", api_key="k", execution_id=task, now=T0)[0]["id"]
    call(book, "settle", org, caller, 90, 3, now=T0)  # priced by its caller: not repriced
    call(book, "rebuild_daily_usage", DAY, DAY)
    old = 2 * 6_000_000 + 3 * 10**7
    assert cost_sums(book, org, task) == (old, old, 12_000_000, old, old)

    corrected = version(book, CORRECTED)
    assert reprice(book, corrected, apply=True) == {org: (2, 12_000_000, 9_800_000, -2_200_000)}
    new = old - 2_200_000
    assert cost_sums(book, org, task) == (new, new, 9_800_000, new, old)
    for inv in invs:  # the settled request as it was: cost and credits as charged
        stored = invocation(book, org, inv)
        assert (stored["cost_nanos"], stored["charged_credits"]) == (6_000_000, 6000)
    assert [(r["seq"], r["price_version_id"], r["difference_nanos"]) for r in rows(
        book, "SELECT * FROM llm.cost_corrections WHERE organization_id = %s ORDER BY invocation_id", (org,))] == \
        [(1, corrected, -1_100_000)] * 2
    assert period(book, org)["used_credits"] == 2 * 6000 + 90
    assert daily_usage_findings(book, DAY, DAY) == []
    assert invariants(book) == []

    # again: nothing changes, nothing is written
    before = fingerprint(book)
    assert reprice(book, corrected, apply=True) == {org: (2, 9_800_000, 9_800_000, 0)}
    assert fingerprint(book) == before
    # back to the first price: a second correction each, the sums where they began
    first = rows(book, "SELECT min(id) AS id FROM llm.prices WHERE model = 'm'")[0]["id"]
    assert reprice(book, first, apply=True) == {org: (2, 9_800_000, 12_000_000, 2_200_000)}
    assert cost_sums(book, org, task) == (old, old, 12_000_000, old, old)
    assert invariants(book) == []


def test_a_rebuilt_day_counts_the_corrections(book: psycopg.Connection) -> None:
    org = new_org(book, 10**9)
    priced(book, org)
    assert reprice(book, version(book, CORRECTED), apply=True)[org][3] == -1_100_000
    call(book, "rebuild_daily_usage", DAY, DAY)  # the day was not built: it is now, corrected
    (costs,) = call(book, "report_costs", DAY, DAY, [org])
    assert (costs["cost_nanos"], costs["original_cost_nanos"]) == (4_900_000, 6_000_000)
    assert daily_usage_findings(book, DAY, DAY) == []


def test_an_organizations_version_reprices_its_requests_and_a_book_version_no_negotiated_one(
        book: psycopg.Connection) -> None:
    plain, negotiated = new_org(book, 10**9), new_org(book, 10**9)
    own = call(book, "set_price", "m", {"input": "2", "output": "10"}, effective_from=SINCE,
               organization_id=negotiated)[0]["value"]
    priced(book, plain)
    priced(book, negotiated)  # pinned to its own version: 4,000,000
    corrected = version(book, CORRECTED)
    assert reprice(book, corrected) == {plain: (1, 6_000_000, 4_900_000, -1_100_000)}
    late = version(book, {"input": "1", "output": "5"}, org=negotiated)
    assert reprice(book, late) == {negotiated: (1, 4_000_000, 2_000_000, -2_000_000)}
    assert own != late


def test_a_version_of_another_model_or_missing_a_class_is_22023_and_writes_nothing(
        book: psycopg.Connection) -> None:
    org = new_org(book, 10**9)
    priced(book, org)
    other = version(book, {"input": "1", "output": "1"}, model="other")
    no_output = version(book, {"input": "1"})  # the requests have output tokens
    before = fingerprint(book)
    for bad in (params("reprice", "m", FROM, TO, other, apply=True),
                params("reprice", "m", FROM, TO, no_output, apply=True),
                params("reprice", "m", TO, FROM, no_output, apply=True),
                params("reprice", "m", FROM, TO, 10**12, apply=True),
                params("reprice", " ", FROM, TO, no_output, apply=True)):
        assert_sqlstate(book, "22023", sql_of("reprice"), bad)
    assert fingerprint(book) == before


def test_two_sessions_applying_the_same_correction_correct_each_request_once(
        book: psycopg.Connection, llm_connect) -> None:
    """Scripted with two real connections: the first applies and holds its
    transaction; the second waits on the requests' locks, then finds them corrected
    already and writes nothing."""
    org = new_org(book, 10**9)
    task = open_task(book, org)
    set_budget(book, org, "end_user", "u", "week", 10**9)
    for _ in range(3):
        priced(book, org, end_user="u", execution_id=task)
    corrected = version(book, CORRECTED)
    first, second = llm_connect(autocommit=False), llm_connect()
    assert rows(first, sql_of("reprice"), params("reprice", "m", FROM, TO, corrected, apply=True)) == [
        {"organization_id": org, "requests": 3, "cost_before_nanos": 18_000_000, "cost_after_nanos": 14_700_000,
         "difference_nanos": -3_300_000}]
    pid = second.info.backend_pid
    answer: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: answer.update(rows=rows(
        second, sql_of("reprice"), params("reprice", "m", FROM, TO, corrected, apply=True))))
    worker.start()
    wait_blocked(book, pid)
    first.commit()
    worker.join(30)
    assert [(r["requests"], r["difference_nanos"]) for r in answer["rows"]] == [(3, 0)]
    assert rows(book, "SELECT count(*) AS n FROM llm.cost_corrections WHERE organization_id = %s", (org,))[0]["n"] == 3
    assert execution(book, org, task)["priced_nanos"] == 18_000_000 - 3_300_000
    assert invariants(book) == []


def test_a_sweep_and_a_repricing_of_one_organization_never_deadlock_on_its_tasks(
        book: psycopg.Connection, llm_connect) -> None:
    """Scripted with three real connections (docs/architecture.md "Lock order", row 3).
    The sweep abandons a stale task A, then adds its recovered request to task B;
    repricing takes its tasks by id, B first. With a third session holding B, the
    repricing queues for B and the sweep, holding A, queues behind it: once B is free,
    the repricing held B and waited for A while the sweep held A and waited for B, and
    PostgreSQL aborted one (40P01). Now both take the organization's sweep lock before
    they move a task: the sweep waits for the repricing's transaction, and both land,
    each exactly once."""
    org = new_org(book, 10**9)
    low, high = sorted([open_task(book, org), open_task(book, org)])
    b, a = low, high  # repricing locks b, then a
    stranded = call(book, "admit", org, 50, "m", execution_id=b, now=T0)[0]["id"]
    priced(book, org, execution_id=b)
    priced(book, org, execution_id=a)
    assert call(book, "close_execution", org, b, "completed", now=T0 + timedelta(minutes=1))[0]["value"]
    corrected = version(book, CORRECTED)

    book.execute("UPDATE llm.settings SET org_lock_timeout = '60s'")  # the sweep waits its turn
    holder = llm_connect(autocommit=False)
    holder.execute("SELECT FROM llm.executions WHERE organization_id = %s AND id = %s FOR UPDATE", (org, b))
    repricer, sweeper = llm_connect(), llm_connect()
    repriced = InThread(lambda: rows(repricer, sql_of("reprice"),
                                     params("reprice", "m", FROM, TO, corrected, apply=True)))
    wait_blocked(book, repricer.info.backend_pid)
    swept = InThread(lambda: reconcile(sweeper, org, now=T0 + timedelta(hours=25)))
    wait_blocked(book, sweeper.info.backend_pid, by=repricer.info.backend_pid)
    holder.commit()

    assert [(r["requests"], r["difference_nanos"]) for r in repriced.result()] == [(2, -2_200_000)]
    sweep = swept.result()
    assert (sweep["abandoned_executions"], sweep["recovered_requests"]) == (1, 1)
    assert execution(book, org, a)["status"] == "abandoned"
    assert execution(book, org, b)["priced_nanos"] == 4_900_000
    assert invocation(book, org, stranded)["settlement_kind"] == "recovered"
    assert invariants(book) == []


def test_a_repricing_holds_the_sweep_lock_only_of_the_organizations_it_changes(
        book: psycopg.Connection, llm_connect) -> None:
    """The sweep lock is taken only where a cost moves: while a repricing's transaction
    is open, the sweep of an organization it left as it was runs at once, and that of
    one it corrected waits (here past org_lock_timeout: 55P03) until it commits."""
    changed, untouched = new_org(book, 10**9), new_org(book, 10**9)
    priced(book, changed)
    book.execute("UPDATE llm.settings SET org_lock_timeout = '200ms'")
    corrected = version(book, CORRECTED)
    repricer = llm_connect(autocommit=False)
    assert [(r["organization_id"], r["requests"]) for r in rows(
        repricer, sql_of("reprice"), params("reprice", "m", FROM, TO, corrected, apply=True))] == [(changed, 1)]
    sweeper = llm_connect()
    later = T0 + timedelta(hours=25)

    assert reconcile(sweeper, untouched, now=later)["recovered_requests"] == 0
    assert_sqlstate(sweeper, "55P03", sql_of("reconcile_org"), params("reconcile_org", changed, now=later))
    repricer.commit()
    assert reconcile(sweeper, changed, now=later)["recovered_requests"] == 0
    assert invariants(book) == []
