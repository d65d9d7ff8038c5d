"""Concurrency: admissions racing on one organization never pass the
allowance (invariant 4), and scripted two-session interleavings prove that a
hold resolves exactly once whichever of settle / fail / recovery comes first
(invariant 3). Every test ends with llm.check_invariants() empty."""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from tests.helpers import (
    ADMIT_SQL,
    FAIL_SQL,
    SETTLE_SQL,
    T0,
    admit,
    admit_params,
    dispatch,
    fail,
    fail_params,
    invariants,
    invocation,
    ledger,
    new_org,
    notices,
    params,
    period,
    row,
    scalar,
    settle,
    settle_params,
    sql_of,
    wait_blocked,
)

# the sweep's recovered requests, one column (interleave() reads the first)
SWEEP_SQL = f"SELECT s.recovered_requests FROM ({sql_of('reconcile_org')}) AS s"

THREADS = 8
ATTEMPTS = 200
MAX_ESTIMATE = 50
RECOVERY_CLOCK = T0 + timedelta(hours=25)
ADMIT_ID_SQL = f"SELECT a.id FROM ({ADMIT_SQL}) AS a"


@dataclass
class Tally:
    admitted: list[int] = field(default_factory=list)
    refused: list[int] = field(default_factory=list)
    unexpected: list[psycopg.Error] = field(default_factory=list)


def run_threads(conns: list[psycopg.Connection], work: Callable[[int, psycopg.Connection], None]):
    """Run ``work(i, conn)`` on every connection at once; re-raise the first exception."""
    barrier = threading.Barrier(len(conns))

    def start(i: int) -> None:
        barrier.wait(timeout=30)
        work(i, conns[i])

    with ThreadPoolExecutor(len(conns)) as pool:
        for future in [pool.submit(start, i) for i in range(len(conns))]:
            future.result(timeout=120)


# ---------------------------------------------------------------- admissions under contention


def test_concurrent_admissions_never_take_used_plus_held_past_the_allowance_invariant_4(
    llm_conn, llm_connect
):
    """CAP-PFM-LLM-007 / invariant 4: 8 sessions, 200 admissions of 1..50 credits against an
    allowance of 1000; the only refusal is LL001 and the holds never exceed the allowance."""
    org = new_org(llm_conn, 1000)
    rng = random.Random(7)
    estimates = [rng.randint(1, MAX_ESTIMATE) for _ in range(ATTEMPTS)]
    tallies = [Tally() for _ in range(THREADS)]
    conns = [llm_connect() for _ in range(THREADS)]

    def work(i: int, conn: psycopg.Connection) -> None:
        for estimate in estimates[i::THREADS]:
            try:
                admit(conn, org, estimate)
                tallies[i].admitted.append(estimate)
            except psycopg.Error as err:
                if err.sqlstate == "LL001":
                    tallies[i].refused.append(estimate)
                else:
                    tallies[i].unexpected.append(err)

    run_threads(conns, work)

    assert [e for t in tallies for e in t.unexpected] == []
    admitted = [e for t in tallies for e in t.admitted]
    refused = [e for t in tallies for e in t.refused]
    assert len(admitted) + len(refused) == ATTEMPTS
    assert refused, "the workload must exhaust the allowance to prove anything"
    p = period(llm_conn, org)
    assert p["used_credits"] + p["held_credits"] <= p["allowance_credits"] == 1000
    assert p["held_credits"] == sum(admitted)
    assert scalar(llm_conn, "SELECT count(*) FROM llm.invocations") == len(admitted)
    assert scalar(llm_conn, "SELECT count(*) FROM llm.ledger WHERE entry = 'hold'") == len(admitted)
    # room only shrinks, so every refusal saw at most what is left now: none was refused
    # while its estimate still fitted
    assert 1000 - sum(admitted) < min(refused)
    assert invariants(llm_conn) == []


def test_concurrent_admit_settle_fail_keeps_the_books_and_notices_exact(llm_conn, llm_connect):
    """Invariants 1-5 under a mixed workload: each session admits, dispatches, then settles
    (at most the estimate), fails with a partial charge, or leaves the request open.
    Every threshold below the final usage is notified exactly once."""
    thresholds = list(range(10, 101, 10))
    org = new_org(llm_conn, 1000, thresholds=thresholds)
    tallies = [Tally() for _ in range(THREADS)]
    conns = [llm_connect() for _ in range(THREADS)]

    def work(i: int, conn: psycopg.Connection) -> None:
        rng = random.Random(100 + i)
        for _ in range(ATTEMPTS // THREADS):
            estimate = rng.randint(1, MAX_ESTIMATE)
            try:
                inv = admit(conn, org, estimate)
            except psycopg.Error as err:
                (tallies[i].refused if err.sqlstate == "LL001" else tallies[i].unexpected).append(
                    err
                )
                continue
            tallies[i].admitted.append(estimate)
            dispatch(conn, org, inv["id"])
            choice = rng.random()
            if choice < 0.6:
                assert settle(conn, org, inv["id"], rng.randint(0, estimate), rng.randint(0, 9)) == (
                    "settled"
                )
            elif choice < 0.8:
                assert fail(conn, org, inv["id"], "cut", rng.randint(0, estimate // 2)) == "failed"

    run_threads(conns, work)

    assert [e for t in tallies for e in t.unexpected] == []
    p = period(llm_conn, org)
    assert p["used_credits"] + p["held_credits"] <= 1000
    assert invariants(llm_conn) == []
    crossed = [t for t in thresholds if p["used_credits"] * 100 >= t * 1000]
    assert crossed, "the workload must cross thresholds to prove anything"
    assert [n["threshold_pct"] for n in notices(llm_conn, org)] == crossed


# ---------------------------------------------------------------- scripted interleavings


def interleave(
    observer: psycopg.Connection,
    llm_connect: Callable[..., psycopg.Connection],
    first: tuple[str, dict[str, Any]],
    second: tuple[str, dict[str, Any]],
    *,
    commit: bool = True,
    second_blocks: bool = True,
) -> tuple[Any, Any]:
    """Session A: BEGIN; run ``first`` (not committed). Session B runs ``second`` in a thread
    and waits on A's row lock. Then A commits (or rolls back) and B finishes.
    Returns the first column of each call's first row; B's error is returned, not raised."""
    a = llm_connect(autocommit=False)
    b = llm_connect()
    b.execute("SET lock_timeout = '30s'")
    a_result = a.execute(*first).fetchone()[0]

    def run_b() -> Any:
        try:
            return b.execute(*second).fetchone()[0]
        except psycopg.Error as err:
            return err

    with ThreadPoolExecutor(1) as pool:
        b_future = pool.submit(run_b)
        try:
            if second_blocks:
                wait_blocked(observer, b.info.backend_pid, by=a.info.backend_pid)
            else:
                b_future.result(timeout=10)  # finishes while A still holds its locks
        finally:
            a.commit() if commit else a.rollback()
        b_result = b_future.result(timeout=30)
    return a_result, b_result


@pytest.fixture
def open_invocation(llm_conn):
    org = new_org(llm_conn, 1000)
    inv = admit(llm_conn, org, 100, now=T0)
    dispatch(llm_conn, org, inv["id"])
    return org, inv["id"]


def charges(conn: psycopg.Connection, org: uuid.UUID, inv: uuid.UUID) -> list[int]:
    return [
        r[0]
        for r in conn.execute(
            "SELECT credits FROM llm.ledger WHERE organization_id = %(org)s::uuid"
            " AND invocation_id = %(inv)s::uuid AND entry = 'charge'",
            {"org": org, "inv": inv},
        ).fetchall()
    ]


RACES = {
    "settle then fail": ("settle", "fail", "settled", "already_settled", 60),
    "fail then settle": ("fail", "settle", "failed", "already_failed", 20),
    "settle then settle": ("settle", "settle2", "settled", "already_settled", 60),
    "fail then fail": ("fail", "fail2", "failed", "already_failed", 20),
}


@pytest.mark.parametrize("race", RACES.values(), ids=RACES.keys())
def test_racing_settlements_resolve_the_hold_exactly_once_invariant_3(
    llm_conn, llm_connect, open_invocation, race
):
    """A settles or fails without committing; B's settle or fail waits on the invocation row
    and, once A commits, answers with A's outcome; the ledger holds exactly one charge."""
    org, inv = open_invocation
    calls = {
        "settle": (SETTLE_SQL, settle_params(org, inv, 60, 6)),
        "settle2": (SETTLE_SQL, settle_params(org, inv, 60, 6)),  # a racing retry (other figures: LL007)
        "fail": (FAIL_SQL, fail_params(org, inv, "first", 20, 2)),
        "fail2": (FAIL_SQL, fail_params(org, inv, "second", 30, 3)),
    }
    first, second, first_outcome, second_outcome, charged = race

    a_result, b_result = interleave(llm_conn, llm_connect, calls[first], calls[second])

    assert (a_result, b_result) == (first_outcome, second_outcome)
    assert charges(llm_conn, org, inv) == [charged]
    assert sorted(ledger(llm_conn, org, inv)) == ["charge", "hold", "release"]
    p = period(llm_conn, org)
    assert (p["used_credits"], p["held_credits"]) == (charged, 0)
    assert invariants(llm_conn) == []


def test_a_waiting_settlement_proceeds_when_the_first_one_rolls_back(
    llm_conn, llm_connect, open_invocation
):
    org, inv = open_invocation
    a_result, b_result = interleave(
        llm_conn, llm_connect,
        (SETTLE_SQL, settle_params(org, inv, 60)),
        (FAIL_SQL, fail_params(org, inv, "after rollback", 10)),
        commit=False,
    )
    assert (a_result, b_result) == ("settled", "failed")
    assert charges(llm_conn, org, inv) == [10]
    assert invocation(llm_conn, org, inv)["status"] == "failed"
    assert invariants(llm_conn) == []


def test_recovery_skips_an_invocation_being_settled_and_the_live_settlement_wins(
    llm_conn, llm_connect, open_invocation
):
    """BR-CAP-PFM-LLM-009-01 with a live worker: recovery does not wait for nor take a request
    whose settlement is in progress (SKIP LOCKED); the measured settlement is charged."""
    org, inv = open_invocation
    sweep = (SWEEP_SQL, params("reconcile_org", org, now=RECOVERY_CLOCK))
    a_result, b_result = interleave(
        llm_conn, llm_connect, (SETTLE_SQL, settle_params(org, inv, 60, 6, now=RECOVERY_CLOCK)),
        sweep, second_blocks=False,
    )
    assert (a_result, b_result) == ("settled", 0)
    got = invocation(llm_conn, org, inv)
    assert (got["settlement_kind"], got["charged_credits"]) == ("measured", 60)
    assert got["past_window_alerted_at"] is None
    assert charges(llm_conn, org, inv) == [60]
    assert invariants(llm_conn) == []


def test_settlement_waiting_on_recovery_answers_already_recovered(
    llm_conn, llm_connect, open_invocation
):
    org, inv = open_invocation
    sweep = (SWEEP_SQL, params("reconcile_org", org, now=RECOVERY_CLOCK))
    a_result, b_result = interleave(
        llm_conn, llm_connect, sweep, (SETTLE_SQL, settle_params(org, inv, 60, 6, now=RECOVERY_CLOCK))
    )
    assert (a_result, b_result) == (1, "already_recovered")
    got = invocation(llm_conn, org, inv)
    assert (got["settlement_kind"], got["charged_credits"], got["late_credits"]) == (
        "recovered", 100, 60
    )
    assert charges(llm_conn, org, inv) == [100]
    assert invariants(llm_conn) == []


@pytest.mark.parametrize("same_arguments", [True, False], ids=["same arguments", "different"])
def test_concurrent_admissions_with_one_invocation_id_place_one_hold(
    llm_conn, llm_connect, same_arguments
):
    """A retried admission racing the first one waits for it; with the same arguments it
    returns the first admission, with different ones LL007. Either way one hold."""
    org = new_org(llm_conn, 1000)
    admit(llm_conn, org, 1)  # the period exists, so the race is on the invocation itself
    given = uuid.uuid4()
    a_result, b_result = interleave(
        llm_conn, llm_connect,
        (ADMIT_ID_SQL, admit_params(org, 100, invocation_id=given)),
        (ADMIT_ID_SQL, admit_params(org, 100 if same_arguments else 101, invocation_id=given)),
    )
    assert a_result == given
    if same_arguments:
        assert b_result == given
    else:
        assert isinstance(b_result, psycopg.Error) and b_result.sqlstate == "LL007"
    assert period(llm_conn, org)["held_credits"] == 101
    assert list(ledger(llm_conn, org, given)) == ["hold"]
    assert row(llm_conn, "SELECT count(*) AS n FROM llm.invocations")["n"] == 2
    assert invariants(llm_conn) == []
