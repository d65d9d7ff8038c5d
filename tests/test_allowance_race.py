"""Invariant 9: the current period carries the allowance of the last committed
``upsert_organization``, whatever the interleaving with the month's first admission
(which creates the period row).

The race, as it was: admission read the organization's allowance in one statement and
created the month's period row in a later one; an ``upsert_organization`` committing in
between updated no period row (there was none yet), so the month kept the old allowance.
Now the first admission creates the row under a share lock of its organization.

Both orders are scripted with two real connections and open transactions, each step
checked with ``pg_blocking_pids``: no sleeps, no timing.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import psycopg
import pytest

from llm_db import AllowanceExhausted, Llm
from tests.helpers import FEBRUARY, T0, InThread, invariants, row, scalar, wait_blocked

FEBRUARY_NOW = T0 + timedelta(days=20)  # the organization's first request of February


def period_allowance(conn: psycopg.Connection, org: uuid.UUID) -> int | None:
    return scalar(conn, "SELECT allowance_credits FROM llm.periods WHERE organization_id = %s"
                        " AND period_start = %s", [org, FEBRUARY])  # fmt: skip


@pytest.fixture
def org(llm_conn) -> uuid.UUID:
    org_id = uuid.uuid4()
    Llm(llm_conn).upsert_organization(org_id, "race", 1000, now=T0)
    return org_id


def test_an_allowance_lowered_while_the_first_admission_runs_applies_to_the_month(
    llm_conn, llm_connect, org
):
    """Invariant 9, upsert first: an upsert_organization lowering the allowance to 100 is
    open when the month's first admission starts; the admission reads the organization
    (1000 then), reaches the period's creation and waits; the upsert commits; the period is
    created with 100, and the admission of 900 that fitted under 1000 is refused (LL001)."""
    admin = llm_connect(autocommit=False)
    admin.execute("SELECT 1")  # a transaction is open: the call runs inside it
    Llm(admin).upsert_organization(org, "race", 100, now=FEBRUARY_NOW)  # not committed
    worker = llm_connect()
    admission = InThread(lambda: Llm(worker).admit(org, 900, "gpt-x", now=FEBRUARY_NOW))
    wait_blocked(llm_conn, worker.info.backend_pid)

    admin.commit()

    with pytest.raises(AllowanceExhausted) as refused:
        admission.result()
    assert "allowance=100 " in (refused.value.detail or "")  # it saw the committed allowance
    # the refused admission wrote nothing, its period row included
    assert scalar(llm_conn, "SELECT count(*) FROM llm.periods WHERE organization_id = %s"
                            " AND period_start = %s", [org, FEBRUARY]) == 0  # fmt: skip
    assert Llm(llm_conn).admit(org, 50, "gpt-x", now=FEBRUARY_NOW).hold_credits == 50
    assert period_allowance(llm_conn, org) == 100
    with pytest.raises(AllowanceExhausted):
        Llm(llm_conn).admit(org, 60, "gpt-x", now=FEBRUARY_NOW)
    assert invariants(llm_conn) == []


def test_an_allowance_lowered_after_the_first_admission_created_the_period_moves_it(
    llm_conn, llm_connect, org
):
    """Invariant 9, admission first: the month's first admission (900, under 1000) is open,
    its period row created; an upsert_organization lowering the allowance to 100 waits for
    it, then moves the new period row: 100, with 900 held, and a later admission of 50 is
    refused."""
    worker = llm_connect(autocommit=False)
    worker.execute("SELECT 1")  # a transaction is open: the call runs inside it
    admitted = Llm(worker).admit(org, 900, "gpt-x", now=FEBRUARY_NOW)  # not committed
    admin = llm_connect()
    upsert = InThread(lambda: Llm(admin).upsert_organization(org, "race", 100, now=FEBRUARY_NOW))
    wait_blocked(llm_conn, admin.info.backend_pid)

    worker.commit()

    assert upsert.result().monthly_allowance_credits == 100
    period = row(llm_conn, "SELECT allowance_credits, held_credits FROM llm.periods"
                           " WHERE organization_id = %s AND period_start = %s", [org, FEBRUARY])  # fmt: skip
    assert period == {"allowance_credits": 100, "held_credits": admitted.hold_credits}
    with pytest.raises(AllowanceExhausted):
        Llm(llm_conn).admit(org, 50, "gpt-x", now=FEBRUARY_NOW)
    # holds placed before the change may exceed the new allowance (invariant 4 allows it)
    assert invariants(llm_conn) == []


def test_check_invariants_reports_a_period_left_on_an_old_allowance_invariant_9(llm_conn, org):
    """The invariant 9 check can fail: a current period whose allowance differs from its
    organization's (here corrupted behind the functions' back) is reported; an older month's
    period is not, since the allowance may have changed since."""
    llm = Llm(llm_conn)
    llm.admit(org, 10, "gpt-x", now=T0)  # January's period, allowance 1000
    llm.upsert_organization(org, "race", 500, now=FEBRUARY_NOW)  # February: 500
    llm.admit(org, 10, "gpt-x", now=FEBRUARY_NOW)
    assert invariants(llm_conn) == []  # January kept 1000: a closed month, before the change
    llm_conn.execute("UPDATE llm.period_heads SET allowance_credits = 1000 WHERE organization_id = %s"
                     " AND period_start = %s", [org, FEBRUARY])  # fmt: skip
    assert [(r["invariant"], r["subject"]) for r in invariants(llm_conn)] == [(9, f"period {FEBRUARY}")]


def test_an_upsert_with_an_earlier_clock_moves_every_later_period_too(llm_conn, org):
    """Invariant 9 with a moved clock: an upsert at January's clock changes the allowance of
    January and of every later month already opened, so no period from the month of the
    organization's last update on carries another allowance."""
    llm = Llm(llm_conn)
    llm.admit(org, 10, "gpt-x", now=FEBRUARY_NOW)
    llm.upsert_organization(org, "race", 300, now=T0)
    assert period_allowance(llm_conn, org) == 300
    assert invariants(llm_conn) == []
