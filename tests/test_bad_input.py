"""Bad input: every public routine of schema ``llm`` rejects what it must, with
the SQLSTATE of docs/design.md ("Errors"), and a rejected call writes nothing.

The catalogue below names every public function and procedure (its identity
from ``pg_proc``); ``test_the_catalogue_covers_every_public_routine`` fails
when one is added without cases. For each: NULLs, negatives, zero where it is
invalid, bigint extremes (9223372036854775807, 10^15 + 1), empty, blank and
1 MB strings, unknown and other-organization ids, unknown outcomes, malformed
threshold lists, unknown task keys, state errors, and clocks that are not a
finite time. Each case is its own test: the call must fail with the listed
SQLSTATE (or, for the few marked accepted, succeed) and a fingerprint of every
``llm`` table (md5 of all rows in primary-key order) must be unchanged.

The cases share one database (a clone of the template, prepared once): each
proves it changed nothing, so none can disturb the next.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from fingerprint import changed_tables, fingerprint

from llm_db.testing import clone_database

T0 = datetime(2030, 6, 10, 12, 0, tzinfo=UTC)
MB = 1 << 20
MAX_BIGINT = "9223372036854775807::bigint"
MIN_BIGINT = "(-9223372036854775807 - 1)::bigint"
OVER_MAX = "1000000000000001::bigint"  # llm._max_amount() + 1

# Every public routine of schema llm, by identity (pg_proc's regprocedure text).
SIGNATURES = {
    "upsert_organization": "llm.upsert_organization(uuid,text,bigint,text,integer[],timestamp with time zone)",
    "declare_task_kind": "llm.declare_task_kind(text,text)",
    "set_recovery_policy": "llm.set_recovery_policy(uuid,text,text)",
    "set_period_stripes": "llm.set_period_stripes(uuid,integer)",
    "admit_invocation": "llm.admit_invocation(uuid,bigint,text,uuid,uuid,timestamp with time zone)",
    "mark_dispatched": "llm.mark_dispatched(uuid,uuid,timestamp with time zone)",
    "settle_invocation": "llm.settle_invocation(uuid,uuid,bigint,bigint,bigint,bigint,timestamp with time zone)",
    "fail_invocation": "llm.fail_invocation(uuid,uuid,text,bigint,bigint,timestamp with time zone)",
    "open_execution": "llm.open_execution(uuid,text,text,text,text,timestamp with time zone)",
    "close_execution": "llm.close_execution(uuid,uuid,text,text,timestamp with time zone)",
    "reconcile_org": "llm.reconcile_org(uuid,timestamp with time zone,integer,uuid)",
    "run_reconciliation": "llm.run_reconciliation(timestamp with time zone,integer)",
    "reconciliation_health": "llm.reconciliation_health(timestamp with time zone)",
    "claim_notices": "llm.claim_notices(integer,timestamp with time zone)",
    "complete_notice": "llm.complete_notice(uuid,uuid,timestamp with time zone)",
    "fail_notice": "llm.fail_notice(uuid,uuid,text,timestamp with time zone)",
    "release_notice": "llm.release_notice(uuid,uuid,timestamp with time zone)",
    "rearm_notices": "llm.rearm_notices(timestamp with time zone)",
    "rebuild_daily_usage": "llm.rebuild_daily_usage(date,date)",
    "schedule_reconciliation": "llm.schedule_reconciliation(text)",
    "unschedule_reconciliation": "llm.unschedule_reconciliation()",
    "check_invariants": "llm.check_invariants()",
    "distribute": "llm.distribute(integer)",
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


CATALOGUE: list[Bad] = []


def bad(function: str, expect: str | None, *cases: tuple[str, str]) -> None:
    """Add cases ``(label, argument list)`` for ``llm.function(argument list)``."""
    assert function in SIGNATURES, function
    call = "CALL" if function == "run_reconciliation" else "SELECT * FROM"
    for label, args in cases:
        CATALOGUE.append(Bad(function, label, f"{call} llm.{function}({args})", expect))


def clocks(function: str, args: str) -> None:
    """A clock that is not a finite time (``args`` has ``{now}`` where p_now goes): 22023."""
    bad(function, "22023",
        ("p_now infinity", args.replace("{now}", "'infinity'::timestamptz")),
        ("p_now -infinity", args.replace("{now}", "'-infinity'::timestamptz")),
        ("p_now year 294276", args.replace("{now}", "'294276-12-31 00:00+00'::timestamptz")))  # fmt: skip


# ---------------------------------------------------------------- organizations and catalog

UPSERT = "{org}, {name}, {allowance}, {status}, {thresholds}"
U = {"org": "%(new_org)s", "name": "'acme'", "allowance": "100::bigint", "status": "'operational'",
     "thresholds": "'{80,100}'::int[]"}  # fmt: skip


def upsert(**change: str) -> str:
    return UPSERT.format(**{**U, **change})


bad("upsert_organization", "22023",
    ("organization NULL", upsert(org="NULL::uuid")),
    ("name NULL", upsert(name="NULL::text")),
    ("name empty", upsert(name="''")),
    ("name blank", upsert(name="'   '")),
    ("name 201 characters", upsert(name="repeat('n', 201)")),
    ("name 1 MB", upsert(name="%(huge)s")),
    ("allowance negative", upsert(allowance="-1::bigint")),
    ("allowance min bigint", upsert(allowance=MIN_BIGINT)),
    ("allowance max bigint", upsert(allowance=MAX_BIGINT)),
    ("allowance over 10^15", upsert(allowance=OVER_MAX)),
    ("status NULL", upsert(status="NULL::text")),
    ("status empty", upsert(status="''")),
    ("status unknown", upsert(status="'deleted'")),
    ("status wrong case", upsert(status="'Operational'")),
    ("thresholds NULL", upsert(thresholds="NULL::int[]")),
    ("thresholds zero", upsert(thresholds="'{0,100}'::int[]")),
    ("thresholds negative", upsert(thresholds="'{-80}'::int[]")),
    ("thresholds over 1000", upsert(thresholds="'{1001}'::int[]")),
    ("thresholds duplicate", upsert(thresholds="'{80,80}'::int[]")),
    ("thresholds NULL element", upsert(thresholds="'{80,NULL}'::int[]")),
    ("thresholds two-dimensional", upsert(thresholds="'{{80,90},{95,100}}'::int[]")),
    ("thresholds 21 entries", upsert(thresholds="(SELECT array_agg(g) FROM generate_series(1, 21) AS g)")),
    ("existing organization to a NULL name", upsert(org="%(org)s", name="NULL::text")))  # fmt: skip
clocks("upsert_organization", upsert() + ", p_now => {now}")

bad("declare_task_kind", "22023",
    ("key NULL", "NULL::text"),
    ("key empty", "''"),
    ("key blank", "' '"),
    ("key 201 characters", "repeat('k', 201)"),
    ("key 1 MB", "%(huge)s"),
    ("description empty", "'bad.new', ''"),
    ("description 1 MB", "'bad.new', %(huge)s"))  # fmt: skip

bad("set_recovery_policy", "22023",
    ("organization NULL", "NULL::uuid, 'estimate', 'audit'"),
    ("recovery charge NULL", "%(org)s, NULL::text, 'audit'"),
    ("recovery charge empty", "%(org)s, '', 'audit'"),
    ("recovery charge unknown", "%(org)s, 'half', 'audit'"),
    ("recovery charge wrong case", "%(org)s, 'Estimate', 'audit'"),
    ("recovery charge 1 MB", "%(org)s, %(huge)s, 'audit'"),
    ("late settlement NULL", "%(org)s, 'estimate', NULL::text"),
    ("late settlement unknown", "%(org)s, 'estimate', 'trueup'"),
    ("late settlement 1 MB", "%(org)s, 'estimate', %(huge)s"),
    ("both unknown, organization unknown", "%(unknown)s, 'x', 'y'"))  # fmt: skip
bad("set_recovery_policy", "LL002", ("unknown organization", "%(unknown)s, 'none', 'true_up'"))

bad("set_period_stripes", "22023",
    ("organization NULL", "NULL::uuid, 8"),
    ("stripes NULL", "%(org)s, NULL::integer"),
    ("stripes zero", "%(org)s, 0"),
    ("stripes negative", "%(org)s, -1"),
    ("stripes 65", "%(org)s, 65"),
    ("stripes max int", "%(org)s, 2147483647"),
    ("stripes out of range, organization unknown", "%(unknown)s, 0"))  # fmt: skip
bad("set_period_stripes", "LL002", ("unknown organization", "%(unknown)s, 8"))

# ---------------------------------------------------------------- requests

ADMIT = "{org}, {estimate}, {model}, {execution}, {inv}"
A = {"org": "%(org)s", "estimate": "5::bigint", "model": "'model-x'", "execution": "NULL::uuid",
     "inv": "NULL::uuid"}  # fmt: skip


def admit(**change: str) -> str:
    return ADMIT.format(**{**A, **change})


bad("admit_invocation", "22023",
    ("organization NULL", admit(org="NULL::uuid")),
    ("estimate NULL", admit(estimate="NULL::bigint")),
    ("estimate negative", admit(estimate="-1::bigint")),
    ("estimate min bigint", admit(estimate=MIN_BIGINT)),
    ("estimate max bigint", admit(estimate=MAX_BIGINT)),
    ("estimate over 10^15", admit(estimate=OVER_MAX)),
    ("model NULL", admit(model="NULL::text")),
    ("model empty", admit(model="''")),
    ("model blank", admit(model="'  '")),
    ("model 1 MB", admit(model="%(huge)s")))  # fmt: skip
bad("admit_invocation", "LL002", ("unknown organization", admit(org="%(unknown)s")))
bad("admit_invocation", "LL003", ("suspended organization", admit(org="%(suspended)s")))
bad("admit_invocation", "LL006", ("unknown execution", admit(execution="%(unknown)s")))
bad("admit_invocation", "LL008", ("execution of another organization", admit(execution="%(other_task)s")))
bad("admit_invocation", "LL009", ("closed execution", admit(execution="%(closed_task)s")))
bad("admit_invocation", "LL007",
    ("retried id, different estimate", admit(inv="%(inv)s", estimate="11::bigint")),
    ("retried id, different model", admit(inv="%(inv)s", estimate="10::bigint", model="'other-model'")),
    ("retried id, different execution", admit(inv="%(inv)s", estimate="10::bigint", model="'m'",
                                              execution="%(task)s")))  # fmt: skip
bad("admit_invocation", "LL001", ("estimate over the allowance", admit(estimate="1000::bigint")))
clocks("admit_invocation", admit() + ", p_now => {now}")

bad("mark_dispatched", "22023",
    ("organization NULL", "NULL::uuid, %(inv)s"),
    ("invocation NULL", "%(org)s, NULL::uuid"))  # fmt: skip
bad("mark_dispatched", "LL002", ("unknown organization", "%(unknown)s, %(inv)s"))
bad("mark_dispatched", "LL005",
    ("unknown invocation", "%(org)s, %(unknown)s"),
    ("invocation of another organization", "%(org)s, %(other_inv)s"))  # fmt: skip
bad("mark_dispatched", "LL009", ("settled invocation", "%(org)s, %(done_inv)s"))
clocks("mark_dispatched", "%(org)s, %(inv)s, {now}")

SETTLE = "{org}, {inv}, {credits}, {cents}, {tin}, {tout}"
S = {"org": "%(org)s", "inv": "%(inv)s", "credits": "1::bigint", "cents": "1::bigint",
     "tin": "NULL::bigint", "tout": "NULL::bigint"}  # fmt: skip


def settle(**change: str) -> str:
    return SETTLE.format(**{**S, **change})


bad("settle_invocation", "22023",
    ("organization NULL", settle(org="NULL::uuid")),
    ("invocation NULL", settle(inv="NULL::uuid")),
    ("credits NULL", settle(credits="NULL::bigint")),
    ("credits negative", settle(credits="-1::bigint")),
    ("credits min bigint", settle(credits=MIN_BIGINT)),
    ("credits max bigint", settle(credits=MAX_BIGINT)),
    ("credits over 10^15", settle(credits=OVER_MAX)),
    ("cents NULL", settle(cents="NULL::bigint")),
    ("cents negative", settle(cents="-5::bigint")),
    ("cents max bigint", settle(cents=MAX_BIGINT)),
    ("input tokens negative", settle(tin="-1::bigint")),
    ("input tokens max bigint", settle(tin=MAX_BIGINT)),
    ("output tokens negative", settle(tout="-1::bigint")),
    ("output tokens over 10^15", settle(tout=OVER_MAX)))  # fmt: skip
bad("settle_invocation", "LL002", ("unknown organization", settle(org="%(unknown)s")))
bad("settle_invocation", "LL005",
    ("unknown invocation", settle(inv="%(unknown)s")),
    ("invocation of another organization", settle(inv="%(other_inv)s")),
    ("organization of another invocation", settle(org="%(other)s")))  # fmt: skip
clocks("settle_invocation", settle() + ", {now}")

FAIL = "{org}, {inv}, {error}, {credits}, {cents}"
F = {"org": "%(org)s", "inv": "%(inv)s", "error": "'timeout'", "credits": "0::bigint", "cents": "0::bigint"}


def fail(**change: str) -> str:
    return FAIL.format(**{**F, **change})


bad("fail_invocation", "22023",
    ("organization NULL", fail(org="NULL::uuid")),
    ("invocation NULL", fail(inv="NULL::uuid")),
    ("error NULL", fail(error="NULL::text")),
    ("error empty", fail(error="''")),
    ("error 1 MB", fail(error="%(huge)s")),
    ("credits NULL", fail(credits="NULL::bigint")),
    ("credits negative", fail(credits="-1::bigint")),
    ("credits max bigint", fail(credits=MAX_BIGINT)),
    ("cents NULL", fail(cents="NULL::bigint")),
    ("cents over 10^15", fail(cents=OVER_MAX)))  # fmt: skip
bad("fail_invocation", "LL002", ("unknown organization", fail(org="%(unknown)s")))
bad("fail_invocation", "LL005",
    ("unknown invocation", fail(inv="%(unknown)s")),
    ("invocation of another organization", fail(inv="%(other_inv)s")))  # fmt: skip
clocks("fail_invocation", fail() + ", {now}")

# ---------------------------------------------------------------- tasks

OPEN = "{org}, {task}, {stype}, {sid}, {replay}"
OPN = {"org": "%(org)s", "task": "'bad.task'", "stype": "NULL::text", "sid": "NULL::text", "replay": "NULL::text"}


def open_(**change: str) -> str:
    return OPEN.format(**{**OPN, **change})


bad("open_execution", "22023",
    ("organization NULL", open_(org="NULL::uuid")),
    ("task key NULL", open_(task="NULL::text")),
    ("task key empty", open_(task="''")),
    ("task key 1 MB", open_(task="%(huge)s")),
    ("subject type empty", open_(stype="''")),
    ("subject type 1 MB", open_(stype="%(huge)s")),
    ("subject id blank", open_(sid="'  '")),
    ("subject id 1 MB", open_(sid="%(huge)s")),
    ("replay key empty", open_(replay="''")),
    ("replay key 1 MB", open_(replay="%(huge)s")))  # fmt: skip
bad("open_execution", "LL002", ("unknown organization", open_(org="%(unknown)s")))
bad("open_execution", "LL003", ("suspended organization", open_(org="%(suspended)s")))
bad("open_execution", "LL004",
    ("unknown task key", open_(task="'bad.undeclared'")),
    ("task key of another case", open_(task="'BAD.TASK'")))  # fmt: skip
bad("open_execution", "LL007",
    ("replay key of another task kind", open_(task="'bad.other'", replay="'replay-1'")),
    ("replay key of another subject", open_(sid="'invoice-2'", replay="'replay-1'")))  # fmt: skip
clocks("open_execution", open_() + ", {now}")

CLOSE = "{org}, {task}, {outcome}, {error}"
C = {"org": "%(org)s", "task": "%(task)s", "outcome": "'completed'", "error": "NULL::text"}


def close(**change: str) -> str:
    return CLOSE.format(**{**C, **change})


bad("close_execution", "22023",
    ("organization NULL", close(org="NULL::uuid")),
    ("execution NULL", close(task="NULL::uuid")),
    ("error empty", close(outcome="'failed'", error="''")),
    ("error 1 MB", close(outcome="'failed'", error="%(huge)s")))  # fmt: skip
bad("close_execution", "LL009",
    ("outcome NULL", close(outcome="NULL::text")),
    ("outcome empty", close(outcome="''")),
    ("outcome abandoned", close(outcome="'abandoned'")),
    ("outcome running", close(outcome="'running'")),
    ("outcome wrong case", close(outcome="'Completed'")),
    ("outcome unknown", close(outcome="'cancelled'")))  # fmt: skip
bad("close_execution", "LL006",
    ("unknown execution", close(task="%(unknown)s")),
    ("execution of another organization", close(task="%(other_task)s")),
    ("unknown organization", close(org="%(unknown)s")))  # fmt: skip
clocks("close_execution", close() + ", {now}")

# ---------------------------------------------------------------- recovery

bad("reconcile_org", "22023",
    ("organization NULL", "NULL::uuid"),
    ("batch zero", "%(org)s, p_batch => 0"),
    ("batch negative", "%(org)s, p_batch => -1"),
    ("batch over 100000", "%(org)s, p_batch => 100001"),
    ("batch max integer", "%(org)s, p_batch => 2147483647"))  # fmt: skip
bad("reconcile_org", "LL002", ("unknown organization", "%(unknown)s"))
bad("reconcile_org", "LL003", ("suspended organization", "%(suspended)s"))
clocks("reconcile_org", "%(org)s, {now}")

bad("run_reconciliation", "22023",
    ("batch zero", "p_batch => 0"),
    ("batch negative", "p_batch => -7"),
    ("batch over 100000", "p_batch => 100001"))  # fmt: skip
clocks("run_reconciliation", "{now}")

clocks("reconciliation_health", "{now}")
bad("reconciliation_health", None, ("p_now NULL reads the clock", "NULL::timestamptz"))

# ---------------------------------------------------------------- notices and reporting

bad("claim_notices", "22023",
    ("limit NULL", "NULL::integer"),
    ("limit zero", "0"),
    ("limit negative", "-1"),
    ("limit over 10000", "10001"),
    ("limit max integer", "2147483647"))  # fmt: skip
clocks("claim_notices", "10, {now}")

bad("complete_notice", "22023",
    ("organization NULL", "NULL::uuid, %(notice)s"),
    ("notice NULL", "%(org)s, NULL::uuid"),
    ("unknown notice", "%(org)s, %(unknown)s"),
    ("notice of another organization", "%(other)s, %(notice)s"),
    ("unknown organization", "%(unknown)s, %(notice)s"))  # fmt: skip
clocks("complete_notice", "%(org)s, %(notice)s, {now}")

bad("fail_notice", "22023",
    ("organization NULL", "NULL::uuid, %(notice)s, 'down'"),
    ("notice NULL", "%(org)s, NULL::uuid, 'down'"),
    ("error NULL", "%(org)s, %(notice)s, NULL::text"),
    ("error empty", "%(org)s, %(notice)s, ''"),
    ("error 1 MB", "%(org)s, %(notice)s, %(huge)s"),
    ("unknown notice", "%(org)s, %(unknown)s, 'down'"),
    ("notice of another organization", "%(other)s, %(notice)s, 'down'"))  # fmt: skip
clocks("fail_notice", "%(org)s, %(notice)s, 'down', {now}")

bad("release_notice", "22023",
    ("organization NULL", "NULL::uuid, %(notice)s"),
    ("notice NULL", "%(org)s, NULL::uuid"),
    ("unknown notice", "%(org)s, %(unknown)s"),
    ("notice of another organization", "%(other)s, %(notice)s"),
    ("unknown organization", "%(unknown)s, %(notice)s"))  # fmt: skip
clocks("release_notice", "%(org)s, %(notice)s, {now}")
# the world's notice is owed, not being sent: false, and nothing changes
bad("release_notice", None, ("notice not being sent", "%(org)s, %(notice)s"))

clocks("rearm_notices", "{now}")
bad("rearm_notices", None, ("p_now NULL reads the clock", "NULL::timestamptz"))

bad("rebuild_daily_usage", "22023",
    ("from NULL", "NULL::date, '2030-06-10'::date"),
    ("to NULL", "'2030-06-10'::date, NULL::date"),
    ("to before from", "'2030-06-10'::date, '2030-06-09'::date"),
    ("more than ten years", "'2020-01-01'::date, '2030-06-10'::date"),
    ("from -infinity", "'-infinity'::date, '2030-06-10'::date"),
    ("to infinity", "'2030-06-10'::date, 'infinity'::date"))  # fmt: skip

bad("schedule_reconciliation", "22023",
    ("schedule NULL", "NULL::text"),
    ("schedule empty", "''"),
    ("schedule 1 MB", "%(huge)s"))  # fmt: skip
bad("schedule_reconciliation", "LL010", ("pg_cron not installed here", "'0 * * * *'"))
bad("unschedule_reconciliation", "LL010", ("pg_cron not installed here", ""))

bad("check_invariants", None, ("no arguments: reads only", ""))

bad("distribute", "LL011",
    ("citus not installed", ""),
    ("shard count NULL", "NULL::integer"),
    ("shard count zero", "0"))  # fmt: skip


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
        conn.execute(
            "SELECT llm.upsert_organization(%s, %s, %s::bigint, %s, '{50,80,100}'::int[], %s)",
            [org, f"org {org}", allowance, status, T0 - timedelta(days=1)],
        )
    for key in ("bad.task", "bad.other"):
        conn.execute("SELECT llm.declare_task_kind(%s)", [key])
    opened = "SELECT execution_id FROM llm.open_execution(%s, 'bad.task', %s::text, %s::text, %s::text, %s)"
    ids: dict[str, Any] = {
        "org": ORG, "other": OTHER, "suspended": SUSPENDED,
        "unknown": uuid.UUID("00000000-0000-4000-8000-00000000bfff"),
        "new_org": uuid.UUID("00000000-0000-4000-8000-00000000b0ff"),
        "huge": "x" * MB,
        "task": one(opened, ORG, None, None, None, T0),
        "closed_task": one(opened, ORG, None, None, None, T0),
        "other_task": one(opened, OTHER, None, None, None, T0),
    }  # fmt: skip
    one(opened, ORG, "invoice", "invoice-1", "replay-1", T0)
    conn.execute("SELECT llm.close_execution(%s, %s, 'completed', p_now => %s)", [ORG, ids["closed_task"], T0])
    admitted = "SELECT (llm.admit_invocation(%s, %s::bigint, 'm', NULL::uuid, NULL::uuid, %s)).id"
    ids["inv"] = one(admitted, ORG, 10, T0)
    ids["other_inv"] = one(admitted, OTHER, 10, T0)
    ids["done_inv"] = one(admitted, ORG, 10, T0)
    conn.execute(
        "SELECT llm.settle_invocation(%s, %s, 60::bigint, 7::bigint, p_now => %s)", [ORG, ids["done_inv"], T0]
    )
    ids["notice"] = one(
        "SELECT id FROM llm.threshold_notices WHERE organization_id = %s AND threshold_pct = 50", ORG
    )
    assert conn.execute("SELECT * FROM llm.check_invariants()").fetchall() == []
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
