"""Each role does what docs/contract.md "Roles and grants" says, logged in as itself: the
commands and calls of a deployment, run by a login that is a plain member of llm_app,
llm_operator or llm_reader (no SET ROLE from a superuser), against a database the
non-superuser owner migrated (F4 for the operator's pass).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from llm_db.client import Llm
from llm_db.errors import AllowanceExhausted
from llm_db.testing import LOGINS
from tests.helpers import T0, call_pass, invariants, run_pass, scalar
from tests.receiver import Receiver
from tests.test_cli import SECRET, SECRET_ENV, llm_db


def login_dsn(llm_dsn: str, role: str) -> str:
    """``llm_dsn`` for the login of ``role`` (a member of it, not the role itself)."""
    return make_conninfo(llm_dsn, user=LOGINS[role])


@pytest.fixture
def org(llm_conn: psycopg.Connection) -> uuid.UUID:
    """An organization with 100 credits (notices at 80 and 100), set up by the owner."""
    org_id = uuid.uuid4()
    Llm(llm_conn).upsert_organization(org_id, "Roles Org", 100, now=T0)
    return org_id


@pytest.fixture
def webhook() -> Iterator[Receiver]:
    with Receiver(SECRET) as hook:
        hook.up()
        yield hook


def test_each_login_is_a_plain_member_of_its_role(llm_dsn):
    """The logins the tests use hold no power of their own beyond their role."""
    for role, login in LOGINS.items():
        with psycopg.connect(login_dsn(llm_dsn, role)) as conn:
            assert conn.execute(
                "SELECT session_user::text, rolsuper, rolcreaterole, rolcreatedb,"
                " pg_has_role(%s, 'MEMBER') FROM pg_roles WHERE rolname = session_user",
                [role],
            ).fetchone() == (login, False, False, False, True)


def test_the_app_login_admits_and_settles(llm_dsn, llm_conn, org):
    """BR-CAP-PFM-LLM-009-01: through the driver, logged in as the app."""
    with psycopg.connect(login_dsn(llm_dsn, "llm_app"), autocommit=True) as conn:
        llm = Llm(conn)
        inv = llm.admit(org, 30, "gpt-x", now=T0)
        llm.mark_dispatched(org, inv.id, now=T0)
        assert llm.settle(org, inv.id, 25, 2, now=T0) == "settled"
    assert invariants(llm_conn) == []


def test_the_operator_login_sets_a_budget_the_app_login_admits_under_it(llm_dsn, llm_conn, org):
    """Logged in as themselves, through the driver, the operator sets a
    key's day budget and the app admits with scope ids under it until it is refused naming
    that budget; the reader reads its usage but may not set one."""
    with psycopg.connect(login_dsn(llm_dsn, "llm_operator"), autocommit=True) as conn:
        Llm(conn).set_budget(org, "api_key", "key-1", "day", 40, now=T0)
    with psycopg.connect(login_dsn(llm_dsn, "llm_app"), autocommit=True) as conn:
        llm = Llm(conn)
        llm.admit(org, 30, "gpt-x", now=T0, project="p", api_key="key-1", end_user="u")
        with pytest.raises(AllowanceExhausted) as refused:
            llm.admit(org, 20, "gpt-x", now=T0, api_key="key-1")
        diag = refused.value.__cause__.diag  # the driver's fields for it are the driver's work
        assert (diag.constraint_name, diag.column_name, diag.message_detail.split("\n")[0]) == (
            "api_key",
            "day",
            "key-1",
        )
    with psycopg.connect(login_dsn(llm_dsn, "llm_reader"), autocommit=True) as conn:
        assert conn.execute("SELECT scope_id, held_credits FROM llm.budget_usage").fetchall() == [
            ("key-1", 30)
        ]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            Llm(conn).set_budget(org, "api_key", "key-1", "day", 1000, now=T0)
    assert invariants(llm_conn) == []


def test_the_operator_login_runs_the_pass_reconcile_and_health(llm_dsn, llm_conn, org):
    """llm_operator runs the pass (CALL, WF-PFM-LLM-004 hop 1),
    `llm-db reconcile` and `llm-db health`, logged in as itself. The pass's clock check
    runs with the caller's rights, so each step it calls must be granted to the operator."""
    Llm(llm_conn).admit(org, 30, "gpt-x", now=T0)  # a request nobody settles
    dsn = login_dsn(llm_dsn, "llm_operator")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert run_pass(conn, T0 + timedelta(days=2))["status"] == "succeeded"
    later = (T0 + timedelta(days=2, hours=1)).isoformat()
    proc = llm_db("reconcile", "--now", later, "--json", dsn=dsn)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "succeeded"
    health = llm_db("health", "--now", later, dsn=dsn)
    assert health.returncode == 0 and "ok" in health.stdout, (health.stdout, health.stderr)
    assert scalar(llm_conn, "SELECT settlement_kind FROM llm.invocations") == "recovered"
    assert invariants(llm_conn) == []


def test_the_operator_login_delivers_notices(llm_dsn, llm_conn, org, webhook):
    """`llm-db notices deliver` logged in as the operator claims, posts and completes a
    threshold notice."""
    llm = Llm(llm_conn)
    inv = llm.admit(org, 85, "gpt-x", now=T0)
    llm.settle(org, inv.id, 85, 3, now=T0)
    proc = llm_db("notices", "deliver", "--url", webhook.url, "--secret-env", SECRET_ENV,
                  "--now", (T0 + timedelta(minutes=1)).isoformat(),
                  dsn=login_dsn(llm_dsn, "llm_operator"), env={SECRET_ENV: SECRET})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "claimed 1, sent 1, failed 0"
    assert scalar(llm_conn, "SELECT status FROM llm.threshold_notices") == "sent"
    assert invariants(llm_conn) == []


def test_the_reader_login_reads_the_report_and_the_metrics(llm_dsn, llm_conn, org):
    """A monitoring scrape runs with the least privilege. `llm-db metrics` reads
    llm.reconciliation_health(), so llm_reader may execute that one read-only function
    (docs/contract.md "Roles and grants")."""
    llm = Llm(llm_conn)
    inv = llm.admit(org, 10, "gpt-x", now=T0)
    llm.settle(org, inv.id, 10, 1, now=T0)
    call_pass(llm_conn, T0 + timedelta(hours=1))
    dsn = login_dsn(llm_dsn, "llm_reader")
    later = (T0 + timedelta(hours=1, minutes=5)).isoformat()
    metrics = llm_db("metrics", "--now", later, dsn=dsn)
    assert metrics.returncode == 0, metrics.stderr
    assert 'llm_reconciliation_health{status="ok"} 1.0' in metrics.stdout
    report = llm_db("report", "--now", later, "--json", dsn=dsn)
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        call_pass(conn, T0 + timedelta(hours=2))  # reading is all it may do
