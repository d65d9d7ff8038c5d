"""Bad input: every public routine of schema ``llm`` rejects what it must, with
the SQLSTATE of docs/contract.md ("Errors"), and a rejected call writes nothing.

The catalogue (tests/bad_input.tsv, one case a line) covers every public function
and procedure, named below by its identity from ``pg_proc``;
``test_the_catalogue_covers_every_public_routine`` fails when one is added without
cases. For each: NULLs, negatives, zero where it is
invalid, bigint extremes (9223372036854775807, 10^15 + 1), empty, blank and
1 MB strings, unknown and other-organization ids, unknown outcomes, malformed
threshold lists, unknown task keys, state errors, and clocks that are not a
finite time. Each case is its own test: the call must fail with the listed
SQLSTATE (or, for the few marked accepted, succeed) and a fingerprint of every
``llm`` table (md5 of all rows in primary-key order) must be unchanged.

The cases are raw SQL on purpose: the argument expressions are what the driver's typed
statements cannot send (SQL NULLs of each type, bigint extremes, ``repeat()``, arrays
built in SQL, infinite dates and clocks, positional and defaulted forms). The world
they refer to is made through the driver's statements (tests/helpers.py).

The cases share one database (a clone of the template, prepared once): each
proves it changed nothing, so none can disturb the next.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fingerprint import changed_tables, fingerprint

from llm_db.testing import clone_database
from tests import helpers
from tests.helpers import T0, call, declare_task, invariants, new_org

MB = 1 << 20

# Every public routine of schema llm, by identity (pg_proc's regprocedure text).
SIGNATURES = {
    "upsert_organization": "llm.upsert_organization(uuid,text,bigint,text,integer[],timestamp with time zone)",
    "declare_task_kind": "llm.declare_task_kind(text,text)",
    "set_allowance": "llm.set_allowance(uuid,bigint,timestamp with time zone)",
    "set_recovery_policy": "llm.set_recovery_policy(uuid,text,text)",
    "set_period_stripes": "llm.set_period_stripes(uuid,integer)",
    "set_budget": "llm.set_budget(uuid,text,text,text,bigint,integer[],timestamp with time zone)",
    "set_budget_stripes": "llm.set_budget_stripes(uuid,text,text,text,integer,timestamp with time zone)",
    "set_price": "llm.set_price(text,jsonb,timestamp with time zone,uuid)",
    "set_credit_rate": "llm.set_credit_rate(bigint,uuid,timestamp with time zone)",
    "reprice": "llm.reprice(text,timestamp with time zone,timestamp with time zone,bigint,boolean)",
    "price_usage": "llm.price_usage(text,jsonb,uuid,timestamp with time zone)",
    "admit_invocation": "llm.admit_invocation(uuid,bigint,text,uuid,uuid,timestamp with time zone,text,text,text,bigint,bigint)",
    "mark_dispatched": "llm.mark_dispatched(uuid,uuid,timestamp with time zone)",
    "note_refusal": "llm.note_refusal(uuid,text,text,text,date,timestamp with time zone)",
    "settle_invocation": "llm.settle_invocation(uuid,uuid,bigint,bigint,bigint,bigint,timestamp with time zone)",
    "fail_invocation": "llm.fail_invocation(uuid,uuid,text,bigint,bigint,timestamp with time zone,jsonb)",
    "settle_usage": "llm.settle_usage(uuid,uuid,jsonb,timestamp with time zone)",
    "open_execution": "llm.open_execution(uuid,text,text,text,text,timestamp with time zone)",
    "close_execution": "llm.close_execution(uuid,uuid,text,text,timestamp with time zone)",
    "reconcile_org": "llm.reconcile_org(uuid,timestamp with time zone,integer,uuid)",
    "run_reconciliation": "llm.run_reconciliation(timestamp with time zone,integer)",
    "reconciliation_health": "llm.reconciliation_health(timestamp with time zone)",
    "claim_notices": "llm.claim_notices(integer,timestamp with time zone)",
    "complete_notice": "llm.complete_notice(uuid,uuid,uuid,timestamp with time zone)",
    "fail_notice": "llm.fail_notice(uuid,uuid,uuid,text,timestamp with time zone)",
    "release_notice": "llm.release_notice(uuid,uuid,uuid,timestamp with time zone)",
    "rearm_notices": "llm.rearm_notices(timestamp with time zone)",
    "rebuild_daily_usage": "llm.rebuild_daily_usage(date,date)",
    "check_daily_usage": "llm.check_daily_usage(date,date)",
    "schedule_reconciliation": "llm.schedule_reconciliation(text)",
    "unschedule_reconciliation": "llm.unschedule_reconciliation()",
    "check_invariants": "llm.check_invariants()",
    "distribute": "llm.distribute(integer)",
    "report_periods": "llm.report_periods(date,date,uuid[])",
    "report_daily_usage": "llm.report_daily_usage(date,date,uuid[])",
    "report_costs": "llm.report_costs(date,date,uuid[])",
    "report_open_holds": "llm.report_open_holds(uuid[],timestamp with time zone)",
    "report_tasks": "llm.report_tasks(date,uuid[])",
    "report_scope_usage": "llm.report_scope_usage(text,date,date,uuid[])",
    "report_budgets_near_limit": "llm.report_budgets_near_limit(text,uuid[],timestamp with time zone)",
    "books_snapshot": "llm.books_snapshot(uuid[],timestamp with time zone)",
    "stale_by_organization_status": "llm.stale_by_organization_status(timestamp with time zone)",
    "books_history": "llm.books_history(uuid[])",
    "organization_totals": "llm.organization_totals(uuid[])",
    "last_run": "llm.last_run(timestamp with time zone)",
    "pass_progress": "llm.pass_progress(timestamp with time zone)",
    "metrics": "llm.metrics(timestamp with time zone)",
}

PUBLIC_ROUTINES = """
SELECT p.oid::regprocedure::text
  FROM pg_catalog.pg_proc AS p
 WHERE p.pronamespace = 'llm'::regnamespace AND p.proname NOT LIKE '\\_%'
 ORDER BY 1
"""


@dataclass(frozen=True)
class Bad:
    function: str
    label: str
    sql: str  # %(name)s placeholders name ids of the prepared world (see world())
    expect: str | None  # SQLSTATE; None: accepted, and still writes nothing

    @property
    def id(self) -> str:
        return f"{self.function}-{re.sub(r'[^A-Za-z0-9.=+-]+', '_', self.label).strip('_')}"


CASES = Path(__file__).with_name("bad_input.tsv")


def load_catalogue(path: Path = CASES) -> list[Bad]:
    """The cases of ``bad_input.tsv``: routine, SQLSTATE (or "accepted"), case, statement."""
    cases = []
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            function, expect, label, statement = line.split("\t")
            assert function in SIGNATURES, function
            cases.append(Bad(function, label, statement, None if expect == "accepted" else expect))
    return cases


CATALOGUE = load_catalogue()


# ---------------------------------------------------------------- the world the cases refer to

ORG = uuid.UUID("00000000-0000-4000-8000-00000000b001")
OTHER = uuid.UUID("00000000-0000-4000-8000-00000000b002")
SUSPENDED = uuid.UUID("00000000-0000-4000-8000-00000000b003")


class World:
    """One clone shared by every case: three organizations, tasks, requests and a
    notice. A case that wrongly wrote something rebuilds it for the next case."""

    def __init__(self, server: Any, template: str) -> None:
        self.server, self.template = server, template
        self.name: str | None = None
        self.conn: psycopg.Connection | None = None
        self.ids: dict[str, Any] = {}
        self.rebuild()

    def rebuild(self) -> None:
        self.close()
        self.name, dsn = clone_database(self.server, self.template)
        self.conn = psycopg.connect(dsn, autocommit=True, options="-c lock_timeout=5s -c statement_timeout=60s")
        self.ids = prepare(self.conn)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        if self.name is not None:
            self.server.drop_database(self.name)
        self.conn, self.name = None, None


@pytest.fixture(scope="module")
def world(llm_server, llm_template):
    holder = World(llm_server, llm_template)
    try:
        yield holder
    finally:
        holder.close()


def prepare(conn: psycopg.Connection) -> dict[str, Any]:
    def one(query: str, *params: Any) -> Any:
        return conn.execute(query, list(params)).fetchone()[0]

    for org, allowance, status in ((ORG, 100, "operational"), (OTHER, 1000, "operational"),
                                   (SUSPENDED, 1000, "suspended")):  # fmt: skip
        new_org(conn, allowance, org_id=org, status=status, thresholds=[50, 80, 100], now=T0 - timedelta(days=1))
    for key in ("bad.task", "bad.other"):
        declare_task(conn, key)

    def opened(org: uuid.UUID, *subject_and_replay: str) -> uuid.UUID:
        subject = dict(zip(("subject_type", "subject_id", "replay_key"), subject_and_replay, strict=False))
        return call(conn, "open_execution", org, "bad.task", now=T0, **subject)[0]["execution_id"]

    today = T0.date()
    ids: dict[str, Any] = {
        "org": ORG, "other": OTHER, "suspended": SUSPENDED,
        "unknown": uuid.UUID("00000000-0000-4000-8000-00000000bfff"),
        "new_org": uuid.UUID("00000000-0000-4000-8000-00000000b0ff"),
        "huge": "x" * MB,
        "task": opened(ORG),
        "closed_task": opened(ORG),
        "other_task": opened(OTHER),
        "today": today, "yesterday": today - timedelta(days=1),
        "eleven_years_ago": today.replace(year=today.year - 11),
    }  # fmt: skip
    opened(ORG, "invoice", "invoice-1", "replay-1")
    call(conn, "close_execution", ORG, ids["closed_task"], "completed", now=T0)
    ids["inv"] = helpers.admit(conn, ORG, 10, "m")["id"]
    ids["other_inv"] = helpers.admit(conn, OTHER, 10, "m")["id"]
    ids["done_inv"] = helpers.admit(conn, ORG, 10, "m")["id"]
    helpers.settle(conn, ORG, ids["done_inv"], 60, 7)
    # a key's day budget of 20, 10 of it held by a request naming all three scope ids
    helpers.set_budget(conn, ORG, "api_key", "key-b", "day", 20, now=T0)
    ids["scoped_inv"] = helpers.admit(conn, ORG, 10, "m", project="p", api_key="key-b", end_user="u")["id"]
    ids["t0"] = T0
    # the price book: a model priced from a day before T0, with a credit rate
    one("SELECT llm.set_price('gpt-x', '{\"input\": 1, \"output\": 2}', %s)", T0 - timedelta(days=1))
    one("SELECT llm.set_credit_rate(1000, NULL, %s)", T0 - timedelta(days=1))
    priced = "SELECT id FROM llm.admit_invocation(%s, NULL, 'gpt-x', p_input_tokens => 1, p_max_output_tokens => 1)"
    ids["priced_inv"] = one(priced, ORG)
    ids["priced_done"] = one(priced, ORG)
    one("SELECT llm.settle_usage(%s, %s, '{\"input\": 1}')", ORG, ids["priced_done"])
    ids["notice"] = one(
        "SELECT id FROM llm.threshold_notices WHERE organization_id = %s AND threshold_pct = 50", ORG
    )
    assert invariants(conn) == []
    return ids


# ---------------------------------------------------------------- the tests


def test_the_catalogue_covers_every_public_routine(world):
    routines = {r for (r,) in world.conn.execute(PUBLIC_ROUTINES)}
    missing = routines - set(SIGNATURES.values())
    assert not missing, f"public routines without bad-input cases: {sorted(missing)}"
    stale = set(SIGNATURES.values()) - routines
    assert not stale, f"catalogued routines that no longer exist: {sorted(stale)}"
    uncovered = set(SIGNATURES) - {case.function for case in CATALOGUE}
    assert not uncovered, f"routines with no case: {sorted(uncovered)}"
    ids = [case.id for case in CATALOGUE]
    assert len(ids) == len(set(ids)), "two cases share a test id"


@pytest.mark.parametrize("case", CATALOGUE, ids=[case.id for case in CATALOGUE])
def test_bad_input_is_rejected_with_its_sqlstate_and_writes_nothing(world, case):
    conn = world.conn
    before = fingerprint(conn)
    try:
        conn.execute(case.sql, world.ids).fetchall()
        raised = None
    except psycopg.Error as exc:
        raised = exc
    after = fingerprint(conn)
    if changed_tables(before, after) or (raised is None) != (case.expect is None):
        world.rebuild()  # do not let this case's writes disturb the next ones
    assert changed_tables(before, after) == [], f"{case.sql}: wrote to {changed_tables(before, after)}"
    if case.expect is None:
        assert raised is None, f"{case.sql}: expected to be accepted, raised {raised!r}"
    else:
        assert raised is not None, f"{case.sql}: accepted, expected SQLSTATE {case.expect}"
        assert raised.sqlstate == case.expect, (
            f"{case.sql}: SQLSTATE {raised.sqlstate} ({raised.diag.message_primary or raised}), "
            f"expected {case.expect}"
        )


def test_catalogue_size(capsys):
    """The count docs/reliability.md quotes."""
    with capsys.disabled():
        print(f"\n[bad input] {len(CATALOGUE)} cases over {len(SIGNATURES)} public routines")
    assert len(CATALOGUE) >= 150
