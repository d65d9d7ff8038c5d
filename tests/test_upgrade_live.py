"""Upgrades under live traffic: the previous release, 0.3.0 (the
``migrations/`` and ``sql/`` of its release commit 1a824af, kept in
``tests/upgrade/llm-db-0.3.0-1a824af.tar.gz``), is installed and populated with 200k
requests and API key budgets; clients run admit -> dispatch -> settle through that
release's SQL functions, two of them naming API keys under a day budget, while this
checkout's ``migrate`` runs all its phases: the migrations (0017 makes 0.3.0's routines
safe for them, 0018 rewrites tables after a barrier, 0021 and 0022 add the lean write
path's columns and build its indexes CONCURRENTLY), the functions, and the
contract step after the barrier (the stripes' open requests and settle bounds counted,
the indexes a settlement touched dropped). What an upgrade under live traffic must keep holds: no
client error, no call waiting longer than 2 s, every admitted request in the books,
every ``settled`` settled, and ``check_invariants()`` empty afterwards; and
a settlement is a HOT update on the upgraded books. A migrate killed in its contract
step is finished by the next one.

Release 0.2.0 (``tests/upgrade/llm-db-0.2.0-e283082.tar.gz``) is kept for the steps of
its own upgrade: the books hold 12,000 threshold notices, which 0016
backfills in committed batches; 0016 is re-run after a kill in its index build and from
the middle of its backfill. A 0.2.0 database takes live traffic through 0.3.0 first:
0.2.0's admit_invocation returns the row of llm.invocations, to which 0021 adds
columns (docs/upgrading.md "Upgrading to 0.4.0").

The populated books are written straight into 0.2.0's tables by one INSERT ... SELECT
each (200k function calls would take minutes), with the period counters equal to the
requests' sums, so 0.2.0's own ``check_invariants()`` is empty before the upgrade.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from llm_db import migrate
from tests.helpers import T0, InThread, wait_for, yoyo

ROOT = Path(__file__).resolve().parents[1]
RELEASE_0_2_0 = ROOT / "tests" / "upgrade" / "llm-db-0.2.0-e283082.tar.gz"
RELEASE_0_3_0 = ROOT / "tests" / "upgrade" / "llm-db-0.3.0-1a824af.tar.gz"
BUDGET_ORGS = 20  # the first organizations: an API key '*' day budget, clients naming keys
# What a settlement touched until 0.4.0, and what replaced it.
OLD_INDEXES = ("invocations_open", "invocations_period", "invocations_settled_at")
NEW_INDEXES = ("invocations_created", "period_stripes_open", "period_stripes_settled",
               "budget_counters_stripe_key")  # fmt: skip

ORGS = 200
REQUESTS = 200_000
CLIENTS = 8  # admit -> dispatch -> settle loops; one more runs tasks
TASK = "upgrade.live"
MAX_WAIT = 2.0  # seconds: no call waits longer than 2 s (docs/upgrading.md)
# How long a consumer transaction stays open under migrate: longer than migrate's
# lock timeout (1 s), so a migrate that bounds its locks must retry.
OPEN_TRANSACTION = 3.0
HELD_TABLES = ("threshold_notices", "organizations", "period_heads", "period_stripes",
               "invocations", "executions")  # fmt: skip

# The 0.2.0 SQL API as 0.2.0's driver calls it (llm_db/operations.py at e283082):
# whole rows (SELECT *), so a prepared statement sees any change of a result type.
ADMIT = ("SELECT * FROM llm.admit_invocation(%(org)s, %(estimate)s, 'gpt-x', %(task)s, %(id)s,"
         " p_now => %(now)s)")  # fmt: skip
DISPATCH = "SELECT * FROM llm.mark_dispatched(%(org)s, %(id)s, p_now => %(now)s)"
# What the prepared client runs: admission and dispatch by named columns, as the driver
# reads them since 0.3.0. 0.4.0 returns llm.admission_result, llm.admission then replayed (migration 0019), a
# change of a public result type that a prepared SELECT * meets with 0A000 once per
# statement until it is prepared again (the CHANGELOG's shim; tests/test_result_types.py).
_NAMED = "organization_id, id, status, hold_credits"
PREPARED = {ADMIT: ADMIT.replace("*", _NAMED, 1), DISPATCH: DISPATCH.replace("*", _NAMED, 1)}
SETTLE = ("SELECT * FROM llm.settle_invocation(%(org)s, %(id)s, %(credits)s, %(cents)s, 100, 20,"
          " p_now => %(now)s)")  # fmt: skip
OPEN_TASK = "SELECT * FROM llm.open_execution(%(org)s, %(key)s, p_now => %(now)s)"
USAGE = "SELECT * FROM llm.periods WHERE organization_id = %(org)s"
NOTICES = "SELECT count(*) FROM llm.threshold_notices WHERE organization_id = %(org)s"
CLOSE_TASK = "SELECT * FROM llm.close_execution(%(org)s, %(task)s, 'completed', p_now => %(now)s)"

# The books of 0.2.0 (its migrations 0001-0009): unlimited organizations, settled requests
# in January's first two weeks on stripe 0, and each period's one stripe holding their sums.
POPULATE = """
INSERT INTO llm.organizations (id, name, monthly_allowance_credits, created_at, updated_at)
SELECT ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid, 'org ' || g, NULL,
       %(start)s, %(start)s
  FROM generate_series(1, %(orgs)s) AS g;

INSERT INTO llm.invocations (organization_id, id, period_start, model, status, estimate_credits,
                             hold_credits, charged_credits, charged_cents, input_tokens,
                             output_tokens, settlement_kind, created_at, dispatched_at,
                             settled_at, stripe)
SELECT o.id, gen_random_uuid(), %(period)s, 'gpt-x', 'settled', 10, 10, 1 + g %% 10, g %% 3,
       100, 20, 'measured', t.at, t.at, t.at + interval '1 second', 0
  FROM generate_series(1, %(requests)s) AS g
  JOIN LATERAL (SELECT ('00000000-0000-4000-8000-'
                        || lpad((1 + g %% %(orgs)s)::text, 12, '0'))::uuid AS id) AS o ON true
  JOIN LATERAL (SELECT %(start)s + (g %% 1000000) * interval '1 second' AS at) AS t ON true;

INSERT INTO llm.period_heads (organization_id, period_start, period_end, allowance_credits)
SELECT id, %(period)s, (%(period)s + interval '1 month')::date, NULL FROM llm.organizations;

INSERT INTO llm.period_stripes (organization_id, period_start, stripe, used_credits,
                                held_credits, used_cents, admit_room, notice_room)
SELECT organization_id, period_start, 0, sum(charged_credits), 0, sum(charged_cents), NULL, NULL
  FROM llm.invocations GROUP BY organization_id, period_start;

INSERT INTO llm.threshold_notices (organization_id, period_start, threshold_pct, crossed_at, used_credits,
                                   allowance_credits, status, attempts, next_attempt_at, sent_at)
SELECT o.id, %(period)s, t, %(start)s, 0, 100, 'sent', 1, %(start)s, %(start)s
  FROM llm.organizations AS o CROSS JOIN generate_series(1, %(notices)s) AS t;

INSERT INTO llm.task_kinds (key, description) VALUES (%(task)s, 'live upgrade test');
"""
NOTICES_PER_ORG = 60  # 12,000 notices: 0016 backfills them in three committed batches


def install_release(release: Path, dsn: str, target: Path, *, requests: int = REQUESTS) -> None:
    """Install a release (0.2.0 or 0.3.0) at ``dsn`` and populate it; its invariants hold.
    0.3.0 also gets an API key '*' day budget in its first organizations (its own
    set_budget)."""
    with tarfile.open(release) as archive:
        archive.extractall(target, filter="data")
    # the release's migrate applied its migrations through yoyo, whose record this
    # checkout's migrate reads; then its functions
    with yoyo(dsn, target / "migrations") as (backend, migrations):
        backend.apply_migrations(backend.to_apply(migrations))
    migrate(dsn, migrations_dir=target / "migrations", sql_dir=target / "sql")
    with psycopg.connect(dsn, autocommit=True) as conn:
        values = {
            "orgs": ORGS,
            "requests": requests,
            "task": TASK,
            "start": T0 - timedelta(days=14),
            "period": T0.date().replace(day=1),
            "notices": NOTICES_PER_ORG,
        }
        with conn.transaction():
            for statement in POPULATE.split(";\n\n"):
                conn.execute(statement, values)
        assert conn.execute("SELECT count(*) FROM llm.invocations").fetchone()[0] == requests
        if release == RELEASE_0_3_0:
            for i in range(1, BUDGET_ORGS + 1):
                conn.execute("SELECT llm.set_budget(%s, 'api_key', '*', 'day', 1000000000, p_now => %s)",
                             [org_id(i), T0])  # fmt: skip
        conn.execute("ANALYZE")
        assert conn.execute("SELECT * FROM llm.check_invariants()").fetchall() == []


def org_id(i: int) -> uuid.UUID:
    """The populated books' organization ``i`` (1 .. ORGS)."""
    return uuid.UUID(f"00000000-0000-4000-8000-{i:012d}")


def populated(release: Path, llm_server, llm_owner: str, target: Path) -> Iterator[str]:
    """Name of a template database: ``release`` installed by the schema owner (no
    superuser), 200 organizations, 200k requests."""
    name = f"u_{release.name.split('-')[2].replace('.', '')}_{uuid.uuid4().hex}"
    dsn = llm_server.create_database(name, owner=llm_owner)
    try:
        install_release(release, dsn, target)
        yield name
    finally:
        llm_server.drop_database(name)


@pytest.fixture(scope="module")
def populated_0_3_0(llm_server, llm_owner: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from populated(RELEASE_0_3_0, llm_server, llm_owner, tmp_path_factory.mktemp("llm-db-0.3.0"))


@pytest.fixture(scope="module")
def populated_0_2_0(llm_server, llm_owner: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from populated(RELEASE_0_2_0, llm_server, llm_owner, tmp_path_factory.mktemp("llm-db-0.2.0"))


def clone(llm_server, llm_owner: str, template: str) -> Iterator[str]:
    """A clone of a populated database. No lock_timeout of its own: the clients wait for
    locks as a consumer does; statement_timeout only stops a hang."""
    name = f"u_{uuid.uuid4().hex}"
    dsn = llm_server.create_database(name, template=template, owner=llm_owner,
                                     settings={"statement_timeout": "60s"})  # fmt: skip
    try:
        yield dsn
    finally:
        llm_server.drop_database(name)


@pytest.fixture
def old_dsn(llm_server, llm_owner: str, populated_0_3_0: str) -> Iterator[str]:
    """The previous release, 0.3.0, populated."""
    yield from clone(llm_server, llm_owner, populated_0_3_0)


@pytest.fixture
def dsn_0_2_0(llm_server, llm_owner: str, populated_0_2_0: str) -> Iterator[str]:
    """Release 0.2.0, populated: the steps of its own upgrade."""
    yield from clone(llm_server, llm_owner, populated_0_2_0)


# ---------------------------------------------------------------- the clients


@dataclass
class Client:
    """One consumer on its own autocommit connection, looping admit -> dispatch -> settle
    (inside a task it opens and closes when ``tasks``) over its organizations, through the
    0.2.0 SQL; or, when ``reads``, reading an organization's usage and notices as a
    dashboard does (llm_reader). Every call is timed; every error is kept, never raised."""

    dsn: str
    orgs: list[uuid.UUID]
    prepare: bool = False  # server-side prepared statements, as Llm(prepare=True) does
    tasks: bool = False
    reads: bool = False
    admitted: list[tuple[uuid.UUID, uuid.UUID]] = field(default_factory=list)
    settled: list[tuple[uuid.UUID, uuid.UUID]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    calls: int = 0
    worst: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, daemon=True)
        thread.start()
        return thread

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True, prepare_threshold=0 if self.prepare
                             else None) as conn:  # fmt: skip
            n = 0
            while not self.stop.is_set():
                self.cycle(conn, self.orgs[n % len(self.orgs)], T0 + timedelta(milliseconds=n))
                n += 1

    def call(self, conn: psycopg.Connection, query: str, **params: Any) -> Any:
        started = time.monotonic()
        try:
            if self.prepare:
                query = PREPARED.get(query, query)
            return conn.execute(query, params, prepare=self.prepare).fetchone()
        except psycopg.Error as exc:
            context = " ".join((exc.diag.context or "").split())[:300]
            self.errors.append(f"{exc.sqlstate}: {str(exc).splitlines()[0]} ({query.split('(')[0]}) {context}")
            return None
        finally:
            self.worst = max(self.worst, time.monotonic() - started)
            self.calls += 1

    def cycle(self, conn: psycopg.Connection, org: uuid.UUID, now: Any) -> None:
        if self.reads:
            self.call(conn, USAGE, org=org)
            self.call(conn, NOTICES, org=org)
            return
        task = None
        if self.tasks:
            opened = self.call(conn, OPEN_TASK, org=org, key=TASK, now=now)
            if opened is None:
                return
            task = opened[0]
        inv = uuid.uuid4()  # chosen by the client: a retried admission is safe
        if self.call(conn, ADMIT, org=org, estimate=5, task=task, id=inv, now=now) is None:
            return
        if not self.finish(conn, org, inv, now):
            return
        if task is not None:
            self.call(conn, CLOSE_TASK, org=org, task=task, now=now)

    def finish(self, conn: psycopg.Connection, org: uuid.UUID, inv: uuid.UUID, now: Any) -> bool:
        """Dispatches and settles an admitted request, recording how far it got; false
        when the dispatch failed (the request stays open, its task too)."""
        self.admitted.append((org, inv))
        if self.call(conn, DISPATCH, org=org, id=inv, now=now) is None:
            return False
        outcome = self.call(conn, SETTLE, org=org, id=inv, credits=3, cents=1, now=now)
        if outcome is not None and outcome[0] == "settled":
            self.settled.append((org, inv))
        return True


ADMIT_KEY = ("SELECT id, status FROM llm.admit_invocation(%(org)s, %(estimate)s, 'gpt-x', NULL, %(id)s,"
             " p_now => %(now)s, p_api_key => %(key)s)")  # fmt: skip


class KeyClient(Client):
    """A client of 0.3.0's API naming an API key under its organization's day budget."""

    def cycle(self, conn: psycopg.Connection, org: uuid.UUID, now: Any) -> None:
        inv = uuid.uuid4()
        if self.call(conn, ADMIT_KEY, org=org, estimate=5, id=inv, key=f"key-{self.calls % 5}", now=now) is None:
            return
        self.finish(conn, org, inv, now)


@dataclass
class Traffic:
    clients: list[Client]
    threads: list[threading.Thread]

    @property
    def calls(self) -> int:
        return sum(c.calls for c in self.clients)

    def run_for(self, calls: int) -> None:
        """Wait until the clients made ``calls`` more calls (progress, not time)."""
        target = self.calls + calls
        wait_for(lambda: self.calls >= target, f"{calls} client calls", timeout=120)

    def stop(self) -> None:
        for client in self.clients:
            client.stop.set()
        for thread in self.threads:
            thread.join(30)
            assert not thread.is_alive(), "a client did not stop"


@pytest.fixture
def traffic(old_dsn: str) -> Iterator[Traffic]:
    """8 clients (the last with prepared statements), 2 more naming API keys under a day
    budget, a task client and a reader, on 0.3.0's SQL."""
    orgs = [org_id(i) for i in range(1, ORGS + 1)]
    clients = [Client(old_dsn, orgs[i::CLIENTS], prepare=i == CLIENTS - 1)
               for i in range(CLIENTS)]  # fmt: skip
    clients += [KeyClient(old_dsn, orgs[i:BUDGET_ORGS:2]) for i in range(2)]
    clients.append(Client(old_dsn, orgs[:10], tasks=True))
    clients.append(Client(old_dsn, orgs[:10], reads=True))
    live = Traffic(clients, [c.start() for c in clients])
    try:
        yield live
    finally:
        live.stop()


def assert_no_harm(dsn: str, live: Traffic) -> None:
    """0 client errors, no call over 2 s, every admitted id in the books,
    every ``settled`` settled, check_invariants() (this release's) empty."""
    live.stop()
    errors = [e for c in live.clients for e in c.errors]
    assert errors == [], f"{len(errors)} client errors, first: {errors[:5]}"
    worst = max(c.worst for c in live.clients)
    assert worst <= MAX_WAIT, f"a call waited {worst:.2f} s"
    admitted = [a for c in live.clients for a in c.admitted]
    settled = [s for c in live.clients for s in c.settled]
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = dict(conn.execute(
            "SELECT i.id, i.status::text FROM llm.invocations AS i"
            " WHERE (i.organization_id, i.id) IN (SELECT * FROM unnest(%s::uuid[], %s::uuid[]))",
            [[o for o, _ in admitted], [i for _, i in admitted]]).fetchall())  # fmt: skip
        assert len(found) == len(admitted), "an admitted request is missing from the books"
        assert all(found[i] == "settled" for _, i in settled)
        assert conn.execute("SELECT * FROM llm.check_invariants()").fetchall() == []


def timed_migrate(dsn: str) -> tuple[float, tuple[str, ...]]:
    """migrate's duration in seconds, and the migrations it applied."""
    started = time.monotonic()
    applied = migrate(dsn).applied_migrations
    return time.monotonic() - started, applied


def report(label: str, seconds: float, live: Traffic) -> None:
    print(f"\n{label}: migrate {seconds:.2f} s; {live.calls} client calls, "
          f"{sum(len(c.errors) for c in live.clients)} errors, "
          f"worst wait {max(c.worst for c in live.clients):.3f} s")  # fmt: skip


def rerun_completes(dsn: str, live: Traffic, label: str) -> None:
    """After killed runs, migrate re-run under traffic completes; the live-traffic assertions hold."""
    seconds, _ = timed_migrate(dsn)
    live.run_for(300)
    report(label, seconds, live)
    assert_no_harm(dsn, live)


# ---------------------------------------------------------------- the tests


def test_migrate_under_traffic_fails_no_call(old_dsn: str, traffic: Traffic) -> None:
    """0.3.0 populated with 200k requests and API key budgets, 10 clients and a task client on
    0.3.0's SQL (one with prepared statements, two naming keys), this release's migrate, all
    three phases, in the middle: no client error, no call over 2 s, nothing lost, invariants
    1-18 hold; the contract step ran, and a settlement is a HOT update on the upgraded
    books."""
    traffic.run_for(500)
    seconds, applied = timed_migrate(old_dsn)
    # every migration since 0.3.0's last (0016) ran under the traffic
    assert applied == tuple(sorted(p.stem for p in (ROOT / "migrations").glob("*.sql") if p.stem[:4] > "0016"))
    traffic.run_for(500)  # the clients go on against the new functions
    report("live upgrade 0.3.0 -> this checkout", seconds, traffic)
    with psycopg.connect(old_dsn, autocommit=True) as conn:
        assert_0016_done(conn)
        assert_budgets_work(conn)
        assert_lean(conn)
    assert_no_harm(old_dsn, traffic)
    with psycopg.connect(old_dsn, autocommit=True) as conn:
        assert_settlement_hot(conn)


def test_migrate_waits_out_an_open_transaction(old_dsn: str, traffic: Traffic) -> None:
    """A consumer transaction that read the tables of the requests and the notices (as a report
    does) stays open longer than migrate's lock timeout while migrate needs one of them.
    migrate waits and completes once it ends; the clients meanwhile stall at most a lock
    timeout per attempt, and item 1's assertions hold. From 0.3.0, migrate meets it first at
    the barrier before 0018 (docs/architecture.md Conventions 14), where it waits holding no
    lock."""
    traffic.run_for(500)
    with psycopg.connect(old_dsn) as holder:
        # the tables of the requests (0011 alters threshold_notices, which a settlement
        # crossing a threshold writes): a migration that needs a strong lock on any of them
        # waits for this transaction, and every later statement on it queues behind
        for table in HELD_TABLES:
            holder.execute(f"SELECT 1 FROM llm.{table} LIMIT 1")
        holder_pid = holder.info.backend_pid
        started = time.monotonic()
        events: list[dict[str, Any]] = []
        upgrade = threading.Thread(target=lambda: migrate(old_dsn, on_event=events.append), daemon=True)
        upgrade.start()
        with psycopg.connect(old_dsn, autocommit=True) as observer:
            wait_for(lambda: any(e["event"] == "start" and e["step"].startswith("barrier") for e in events)
                     or observer.execute(
                         "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY (pg_blocking_pids(pid))",
                         [holder_pid]).fetchone()[0], "migrate to wait for the open transaction")  # fmt: skip
        open_since = time.monotonic()
        # the clients go on while migrate waits; the transaction outlives a lock timeout
        wait_for(lambda: time.monotonic() - open_since >= OPEN_TRANSACTION
                 and traffic.calls > 0, "the open transaction's time", timeout=60)  # fmt: skip
        traffic.run_for(200)
        holder.rollback()
    upgrade.join(120)
    assert not upgrade.is_alive(), "migrate did not complete after the transaction ended"
    seconds = time.monotonic() - started
    traffic.run_for(500)
    report(f"live upgrade with a transaction open {OPEN_TRANSACTION:.0f} s", seconds, traffic)
    assert_no_harm(old_dsn, traffic)


# ---------------------------------------------------------------- a call in flight at 0015


def test_a_0_2_0_admission_in_flight_when_0015_commits_completes(dsn_0_2_0: str) -> None:
    """A 0.2.0 admission in flight when 0015 commits must complete. Scripted: 0015 waits for a
    reader of llm.settings; a 0.2.0 admission starts (its wrapper plans its call of the
    twin, whose result is a row of llm.invocations) and either waits for 0015 or completes;
    the reader ends and 0015 commits. When 0015 added columns to llm.invocations (as first
    written), the twin returned the wider row and the call failed with 42804 "Returned row
    contains 29 attributes, but query expects 25", as the live test met once per client; the
    scope ids now live in llm.invocation_scopes, and 0015 changes no table whose row a 0.2.0
    routine returns."""
    org = uuid.UUID(f"00000000-0000-4000-8000-{1:012d}")
    params = {"org": org, "estimate": 5, "task": None, "id": uuid.uuid4(), "now": T0}
    with (psycopg.connect(dsn_0_2_0) as reader, psycopg.connect(dsn_0_2_0, autocommit=True) as client,
          psycopg.connect(dsn_0_2_0, autocommit=True) as observer):  # fmt: skip
        client.execute(ADMIT, {**params, "id": uuid.uuid4()})  # the session has planned its calls

        def on_event(event: dict[str, Any]) -> None:
            if event["event"] == "start" and event["step"] == "0015_budgets":
                reader.execute("SELECT FROM llm.settings")  # held until the rollback below

        upgrade = InThread(lambda: migrate(dsn_0_2_0, lock_timeout=60, on_event=on_event))
        migrate_pid = wait_for(lambda: observer.execute(
            "SELECT pid FROM pg_stat_activity WHERE %s = ANY (pg_blocking_pids(pid))",
            [reader.info.backend_pid]).fetchone(), "0015 to wait for the reader of llm.settings")[0]  # fmt: skip
        admission = InThread(lambda: client.execute(ADMIT, params).fetchone())
        # it waits for 0015 when 0015 holds a table the twin reads before its row is built
        wait_for(lambda: not admission.thread.is_alive() or observer.execute(
            "SELECT %s = ANY (pg_blocking_pids(%s))", [migrate_pid, client.info.backend_pid]).fetchone()[0],
            "the admission to wait for 0015 or complete")  # fmt: skip
        reader.rollback()
        upgrade.result()
        assert admission.result() is not None


# ---------------------------------------------------------------- budgets on the upgraded books


def assert_0016_done(conn: psycopg.Connection) -> None:
    """Migration 0016: every notice 0.2.0 wrote is the allowance's
    (organization, NULL, month), the new key is valid and the old one gone."""
    assert conn.execute(
        "SELECT scope, scope_id, budget_window, count(*) FROM llm.threshold_notices GROUP BY 1, 2, 3"
    ).fetchall() == [("organization", None, "month", ORGS * NOTICES_PER_ORG)]
    assert conn.execute(
        "SELECT i.indisvalid AND i.indisunique FROM pg_catalog.pg_index AS i"
        " WHERE i.indexrelid = 'llm.threshold_notices_key'::regclass"
    ).fetchone() == (True,)
    assert conn.execute(
        "SELECT count(*) FROM pg_catalog.pg_constraint WHERE conrelid = 'llm.threshold_notices'::regclass"
        " AND contype = 'u' AND conname <> 'threshold_notices_key'"
    ).fetchone() == (0,)


def assert_budgets_work(conn: psycopg.Connection) -> None:
    """On books upgraded from 0.2.0: set_budget, admissions naming scope ids (the
    second refused by the key's day budget, naming it), a settlement crossing its
    thresholds (notices under the new key), and check_invariants() empty."""
    org = uuid.uuid4()
    conn.execute("SELECT llm.upsert_organization(%s, 'budgets', 1000, p_now => %s)", [org, T0])
    conn.execute("SELECT llm.set_budget(%s, 'api_key', 'key-1', 'day', 100, p_now => %s)", [org, T0])
    first = conn.execute("SELECT id FROM llm.admit_invocation(%s, 60, 'gpt-x', p_now => %s, p_project => 'p',"
                         " p_api_key => 'key-1', p_end_user => 'u')", [org, T0]).fetchone()[0]  # fmt: skip
    with pytest.raises(psycopg.Error) as refused:
        conn.execute("SELECT llm.admit_invocation(%s, 60, 'gpt-x', p_now => %s, p_api_key => 'key-1')", [org, T0])
    assert (refused.value.sqlstate, refused.value.diag.table_name, refused.value.diag.constraint_name,
            refused.value.diag.column_name) == ("LL001", "budgets", "api_key", "day")  # fmt: skip
    assert conn.execute("SELECT llm.settle_invocation(%s, %s, 90, 1, p_now => %s)",
                        [org, first, T0]).fetchone() == ("settled",)  # fmt: skip
    assert conn.execute(
        "SELECT scope, scope_id, budget_window, used_credits, held_credits FROM llm.budget_usage"
        " WHERE organization_id = %s", [org]).fetchall() == [("api_key", "key-1", "day", 90, 0)]  # fmt: skip
    assert conn.execute(
        "SELECT array_agg(threshold_pct ORDER BY threshold_pct) FROM llm.threshold_notices"
        " WHERE organization_id = %s AND scope = 'api_key'", [org]).fetchone() == ([80],)  # fmt: skip
    assert conn.execute("SELECT * FROM llm.check_invariants()").fetchall() == []


def test_0016_interrupted_in_its_unique_index_reruns(dsn_0_2_0: str) -> None:
    """0016 is re-runnable from any point. migrate killed (SIGKILL, its backends
    terminated) while 0016 builds its key CONCURRENTLY (held there by a transaction whose
    snapshot is older, as a long report's is): the backfill is done, the index is left
    invalid, the old key still serves the previous release's functions; the books work,
    and a re-run drops the invalid index, builds it and puts this release live."""
    with psycopg.connect(dsn_0_2_0, autocommit=True) as conn, psycopg.connect(dsn_0_2_0) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")  # its snapshot is taken; it locks no table of migrate's
        child = start_migrate(dsn_0_2_0)
        waiting = wait_for(lambda: conn.execute(
            "SELECT query FROM pg_stat_activity WHERE application_name = %s AND %s = ANY (pg_blocking_pids(pid))",
            [APP, holder.info.backend_pid]).fetchone(), "0016's index build to wait for the old snapshot")  # fmt: skip
        assert "CREATE UNIQUE INDEX CONCURRENTLY" in waiting[0]
        kill(conn, child)
        holder.rollback()
        assert conn.execute("SELECT indisvalid FROM pg_catalog.pg_index"
                            " WHERE indexrelid = 'llm.threshold_notices_key'::regclass").fetchone() == (False,)  # fmt: skip
        assert conn.execute("SELECT count(*) FROM llm.threshold_notices WHERE scope IS NULL").fetchone() == (0,)
        assert_books_work(conn)
    assert timed_migrate(dsn_0_2_0)[1][0] == "0016_notice_scope_key"  # and the later ones
    with psycopg.connect(dsn_0_2_0, autocommit=True) as conn:
        assert_0016_done(conn)
        assert_budgets_work(conn)


def test_0016_interrupted_in_its_backfill_reruns(dsn_0_2_0: str, tmp_path: Path) -> None:
    """0016 is re-runnable from any point. Its backfill commits batch by batch,
    so a kill inside it leaves some batches committed and nothing of the one under way:
    that state (0015 applied, the previous release's functions live, one batch of 5000
    notices backfilled) is built exactly, then migrate completes it."""
    with tarfile.open(RELEASE_0_2_0) as archive:
        archive.extractall(tmp_path, filter="data")
    upto_0015 = tmp_path / "upto-0015"
    upto_0015.mkdir()
    for path in sorted((ROOT / "migrations").glob("*.sql")):
        if path.stem < "0016":
            (upto_0015 / path.name).write_text(path.read_text())
    migrate(dsn_0_2_0, migrations_dir=upto_0015, sql_dir=tmp_path / "sql")  # 0.2.0's functions stay live
    with psycopg.connect(dsn_0_2_0, autocommit=True) as conn:
        conn.execute("UPDATE llm.threshold_notices SET scope = 'organization', budget_window = 'month'"
                     " WHERE id IN (SELECT id FROM llm.threshold_notices WHERE scope IS NULL LIMIT 5000)")  # fmt: skip
        assert conn.execute("SELECT count(*) FROM llm.threshold_notices WHERE scope IS NULL").fetchone() == (
            ORGS * NOTICES_PER_ORG - 5000,)  # fmt: skip
        assert_books_work(conn)
    assert timed_migrate(dsn_0_2_0)[1][0] == "0016_notice_scope_key"  # and the later ones
    with psycopg.connect(dsn_0_2_0, autocommit=True) as conn:
        assert_0016_done(conn)
        assert_budgets_work(conn)


# ---------------------------------------------------------------- migrate killed

KILL_POINTS = 3
APP = "llm-db upgrade-live migrate"
# A migrate of its own process, which says when it starts migrating (after the imports),
# then writes its own output to /dev/null: nobody drains the pipe, and a full pipe would
# stop migrate in a write instead of where the kill lands.
MIGRATE = (
    "import os, sys; from llm_db import migrate; print('go', flush=True);"
    " os.dup2(os.open(os.devnull, os.O_WRONLY), 1); migrate(sys.argv[1])"
)


def start_migrate(dsn: str) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-c", MIGRATE, f"{dsn} application_name='{APP}'"],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdout is not None and child.stdout.readline() == "go\n"
    return child


def kill(conn: psycopg.Connection, child: subprocess.Popen[str]) -> int:
    """SIGKILL ``child`` and terminate its backends (a backend in the middle of a statement
    does not notice that its client is gone); how many were still there."""
    child.send_signal(signal.SIGKILL)
    child.wait()
    return conn.execute(
        "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity"
        " WHERE application_name = %s", [APP]).fetchone()[0]  # fmt: skip


def assert_books_work(conn: psycopg.Connection) -> None:
    """An admit -> dispatch -> settle through whichever functions are live (the three
    signatures are the same in 0.2.0 and this release), and the live check_invariants()."""
    org = uuid.UUID(f"00000000-0000-4000-8000-{ORGS:012d}")
    params = {"org": org, "estimate": 5, "task": None, "id": uuid.uuid4(), "now": T0,
              "credits": 3, "cents": 1}  # fmt: skip
    conn.execute(ADMIT, params)
    conn.execute(DISPATCH, params)
    assert conn.execute(SETTLE, params).fetchone()[0] == "settled"
    assert conn.execute("SELECT * FROM llm.check_invariants()").fetchall() == []


# A migration under way: a backend of migrate's holding a transaction id (DDL assigns
# one; migrate's lock and its watcher never do), while migrations are left to record.
IN_A_MIGRATION = """
SELECT EXISTS (SELECT FROM pg_catalog.pg_stat_activity
                WHERE application_name = %(app)s AND backend_xid IS NOT NULL)
   AND (SELECT count(*) FROM public._yoyo_migration) < %(all)s
"""


def test_migrate_killed_in_its_migrations_reruns(old_dsn: str, traffic: Traffic) -> None:
    """Migrate killed (SIGKILL, its backends terminated) in the middle of a migration
    under traffic: the books and the previous release's functions work, and a re-run
    completes, applying that migration again (its DDL went with its record, one
    transaction); the live-traffic assertions hold."""
    every = len(list((ROOT / "migrations").glob("*.sql")))
    traffic.run_for(300)
    with psycopg.connect(old_dsn, autocommit=True) as conn:
        child = start_migrate(old_dsn)
        wait_for(lambda: conn.execute(IN_A_MIGRATION, {"app": APP, "all": every}).fetchone()[0]
                 or child.poll() is not None, "a migration under way", interval=0.002)  # fmt: skip
        assert child.poll() is None, "migrate ended before it could be killed"
        terminated = kill(conn, child)
        recorded = conn.execute("SELECT count(*) FROM public._yoyo_migration").fetchone()[0]
        print(f"\nkilled in a migration, {recorded} of {every} recorded, {terminated} backends terminated")
        # the migration under way is recorded or not with its DDL: the re-run applies
        # every one not recorded, and would fail on DDL committed without its record
        assert recorded < every
        assert_books_work(conn)
        traffic.run_for(100)
    rerun_completes(old_dsn, traffic, "re-run after a kill in the migrations")


def test_migrate_killed_at_random_points_reruns(old_dsn: str, traffic: Traffic) -> None:
    """Migrate killed at random points under traffic, each run continuing what the killed ones
    applied, until one completes or three were killed: after each kill the books and the
    live functions work; a re-run completes; the live-traffic assertions hold. The seed is
    printed; LLM_DB_KILL_SEED replays it (up to where migrate is when each kill lands)."""
    seed = int(os.environ.get("LLM_DB_KILL_SEED", random.randrange(2**32)))
    print(f"\nkill seed {seed} (LLM_DB_KILL_SEED={seed} replays it)")
    rng = random.Random(seed)
    traffic.run_for(300)
    with psycopg.connect(old_dsn, autocommit=True) as conn:
        for point in range(KILL_POINTS):
            delay = rng.uniform(0.0, 0.5)  # migrate takes 0.4-0.8 s on these books
            child = start_migrate(old_dsn)
            try:
                child.wait(delay)
                print(f"point {point}: migrate completed within {delay:.2f} s")
                break
            except subprocess.TimeoutExpired:
                print(f"point {point}: killed after {delay:.2f} s, "
                      f"{kill(conn, child)} backends terminated")  # fmt: skip
            assert_books_work(conn)
            traffic.run_for(100)
    rerun_completes(old_dsn, traffic, "re-run after the kills")


# ---------------------------------------------------------------- The lean write path


def assert_lean(conn: psycopg.Connection) -> None:
    """The contract steps ran: the stripes' open requests and settle bounds are known, the
    indexes a settlement touched and the requests' CHECK constraints are gone, the new
    indexes valid; every notice holds its window start and limit under their new names;
    every organization whose budgets name no id holds them on its row."""
    steps = {r[0] for r in conn.execute("SELECT step FROM llm.upgrade_steps").fetchall()}
    assert {"functions_only", "settle_bounds", "0021_lean_write_path", "0029_uniform_budgets"} <= steps
    # 0029: every organization whose budgets name no id has them on its row
    assert conn.execute("SELECT count(*) FROM llm.organizations AS o WHERE o.uniform_budget_mask IS NULL"
                        " AND NOT EXISTS (SELECT FROM llm.budget_limits AS b"
                        "                  WHERE b.organization_id = o.id AND b.scope_id <> '*')").fetchone() == (0,)  # fmt: skip
    assert conn.execute("SELECT count(*) FROM llm.period_stripes WHERE open_requests IS NULL"
                        " OR settle_lag_hours IS NULL").fetchone() == (0,)  # fmt: skip
    indexes = dict(conn.execute(
        "SELECT c.relname::text, i.indisvalid FROM pg_catalog.pg_index AS i"
        " JOIN pg_catalog.pg_class AS c ON c.oid = i.indexrelid"
        " WHERE c.relnamespace = 'llm'::regnamespace").fetchall())  # fmt: skip
    assert not set(OLD_INDEXES) & set(indexes)
    assert all(indexes[name] for name in NEW_INDEXES)
    assert conn.execute("SELECT count(*) FROM pg_catalog.pg_constraint"
                        " WHERE conrelid = 'llm.invocations'::regclass AND contype = 'c'").fetchone() == (0,)  # fmt: skip
    # 0028: every notice, the previous release's 12,000 included, under its new names
    assert conn.execute("SELECT count(*) FILTER (WHERE window_start IS NULL OR limit_credits IS NULL),"
                        " count(*) >= %s FROM llm.threshold_notices", [ORGS * NOTICES_PER_ORG]).fetchone() == (0, True)  # fmt: skip
    assert conn.execute("SELECT convalidated FROM pg_catalog.pg_constraint"
                        " WHERE conname = 'threshold_notices_names'").fetchone() == (True,)  # fmt: skip


def settled_hot(conn: psycopg.Connection, org: uuid.UUID, inv: uuid.UUID) -> tuple[int, int]:
    """Settles a request in a transaction of its own; (updates, HOT updates) of
    llm.invocations by that settlement, this backend's counts before and after it in that
    transaction (they are flushed only at its end). The table's counters are not used:
    other backends' updates reach them when those flush, at times this test does not
    control."""
    counts = ("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables"
              " WHERE relid = 'llm.invocations'::regclass")  # fmt: skip
    with conn.transaction():
        before = conn.execute(counts).fetchone()
        assert conn.execute("SELECT llm.settle_invocation(%s, %s, 3, 1, p_now => %s)",
                            [org, inv, T0]).fetchone() == ("settled",)  # fmt: skip
        after = conn.execute(counts).fetchone()
    return after[0] - before[0], after[1] - before[1]


def quiet_horizon(conn: psycopg.Connection) -> None:
    """No other transaction of this database holds the horizon back. A page's earlier
    versions are pruned, and their room given to the next update, only once no snapshot
    can see them; an ANALYZE holds one, and an update it overlaps finds a full page and is
    not HOT. So the database is analyzed now (its owner may, catalogs included: the
    migration's DDL would otherwise call autovacuum to analyze them), autovacuum is off
    for the owner's tables, and no worker of autovacuum runs here any more."""
    conn.execute("ANALYZE")
    conn.execute("""
        DO $$
        DECLARE t regclass;
        BEGIN
          FOR t IN SELECT oid FROM pg_catalog.pg_class
                    WHERE relkind = 'r' AND relowner = current_user::regrole
          LOOP
            EXECUTE format('ALTER TABLE %s SET (autovacuum_enabled = false)', t);
          END LOOP;
        END $$""")
    wait_for(lambda: not conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND backend_type = 'autovacuum worker'").fetchone()[0],
        "autovacuum's workers to finish", timeout=120)  # fmt: skip


def assert_settlement_hot(conn: psycopg.Connection) -> None:
    """A settlement rewrites its request's row in place. Of 200 requests admitted,
    then settled one by one, on the upgraded books, every settlement's update of
    llm.invocations is HOT (the rows admitted on pages the fillfactor left room on, the
    settled versions pruned as the next settlements need their room: quiet_horizon)."""
    quiet_horizon(conn)
    org, ids = org_id(ORGS), [uuid.uuid4() for _ in range(200)]
    for inv in ids:
        conn.execute("SELECT llm.admit_invocation(%s, 5, 'gpt-x', NULL, %s, p_now => %s)", [org, inv, T0])
    counts = [settled_hot(conn, org, inv) for inv in ids]
    assert [(n, c) for n, c in enumerate(counts) if c != (1, 1)] == [], "a settlement was not HOT"


def test_migrate_killed_in_its_contract_step_reruns(old_dsn: str, traffic: Traffic) -> None:
    """The contract step is re-runnable from any point. migrate killed in its
    contract step (held there by a stripe a transaction of the test locks while the step
    counts the stripes' open requests): the new functions are live and serve, the books
    work; the next migrate finishes the step; the traffic saw no error."""
    traffic.run_for(300)
    with psycopg.connect(old_dsn, autocommit=True) as conn, psycopg.connect(old_dsn) as holder:
        live = threading.Event()

        def hold_when_live() -> None:
            wait_for(lambda: conn.execute(
                "SELECT count(*) FROM pg_catalog.pg_class WHERE relname = 'upgrade_steps'").fetchone()[0]
                and conn.execute("SELECT count(*) FROM llm.upgrade_steps WHERE step = 'functions_only'").fetchone()[0],
                "the contract step to start", timeout=120)  # fmt: skip
            holder.execute("SELECT 1 FROM llm.period_stripes WHERE organization_id = %s FOR UPDATE", [org_id(ORGS)])
            live.set()

        watcher = threading.Thread(target=hold_when_live, daemon=True)
        watcher.start()
        child = start_migrate(old_dsn)
        assert live.wait(120), "the contract step never started"
        wait_for(lambda: conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY (pg_blocking_pids(pid))",
            [holder.info.backend_pid]).fetchone()[0] or child.poll() is not None,
            "the contract step to wait for the held stripe")  # fmt: skip
        print(f"\nkilled in the contract step, {kill(conn, child)} backends terminated")
        holder.rollback()
        steps = {r[0] for r in conn.execute("SELECT step FROM llm.upgrade_steps").fetchall()}
        assert "functions_only" in steps and "0021_lean_write_path" not in steps
        assert_books_work(conn)
        traffic.run_for(200)  # the new functions serve the half-contracted books
    rerun_completes(old_dsn, traffic, "re-run after a kill in the contract step")
    with psycopg.connect(old_dsn, autocommit=True) as conn:
        assert_lean(conn)
