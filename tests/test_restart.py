"""Crash and restart: the server stopped in immediate mode at random moments of
mixed traffic comes back with right books, and one pass completes them.

This suite runs its OWN throw-away PostgreSQL (the session server of the other
suites is never stopped): initdb once, then for every cycle

1. a burst of traffic from a few threads, each with its own connection —
   admit (naming a project, an API key and an end user, under organization,
   project, key and end-user budgets) / dispatch / settle / fail /
   open / close, an organization suspended and reactivated — and a thread running ``CALL llm.run_reconciliation``,
   ``llm.reconcile_org`` and the notice calls, all on a moved clock;
2. right after a seeded number of acknowledged calls, ``pg_ctl stop -m immediate``
   while the other calls are in flight (every backend killed as by a power cut of
   the processes; no shutdown checkpoint);
3. ``pg_ctl start`` (crash recovery from WAL), then:
   * ``llm.check_invariants()`` is empty;
   * every call acknowledged before the stop is still there (commits are
     durable once acknowledged: ``synchronous_commit = on``; ``fsync = off``
     keeps the cycle fast and is safe here because the OS does not crash);
   * the pass at a clock 25 h after the traffic completes the books: no
     reserved or dispatched request and no running task older than the
     recovery window, no ``running`` pass row (the ones the crash left are
     marked ``failed``), and the invariants still hold.

``LLM_DB_INTERRUPTIONS`` sets the number of stops (default 200);
``LLM_DB_SEED`` the base seed (default fixed, printed, so a failure replays the
same schedule of stop points and operations; thread timing still varies).
"""

from __future__ import annotations

import os
import pwd
import random
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from testing.common.database import get_unused_port

from llm_db.migrate import migrate
from llm_db.testing._server import BIN_DIR, SUPERUSER, check_installation
from tests.helpers import (
    T0,
    call,
    call_pass,
    declare_task,
    invariants,
    new_org,
    reconcile,
    scalar,
    set_budget,
)

INTERRUPTIONS = int(os.environ.get("LLM_DB_INTERRUPTIONS", "200"))
# The server stops right after the Nth acknowledged call of a cycle, N seeded in this range:
# an event, not a moment of the wall clock, so a slow machine crashes at the same point.
CRASH_AFTER = (10, 170)
SEED = int(os.environ.get("LLM_DB_SEED", "20300101"))

ORG_LIMITED = uuid.UUID("00000000-0000-4000-8000-00000000c001")  # small allowance
ORG_UNLIMITED = uuid.UUID("00000000-0000-4000-8000-00000000c002")
ORG_TOGGLED = uuid.UUID("00000000-0000-4000-8000-00000000c003")  # suspended and reactivated
ORGS = (ORG_LIMITED, ORG_UNLIMITED, ORG_TOGGLED)
TASK = "reliability.restart"
START = T0
CYCLE = timedelta(hours=26)  # each cycle's traffic starts after the previous completion pass
TRAFFIC_SPAN = timedelta(minutes=50)  # the traffic clock runs from Tc to Tc + 50 min
COMPLETION = timedelta(hours=25)  # the completing pass runs at Tc + 25 h
WINDOW = timedelta(hours=24)
THRESHOLDS = [50, 80, 100]
# Budgets: every request names a project, an API key and an end user of
# small pools; the budgets are tight enough to refuse (LL001) and to cross thresholds
SCOPE_IDS = {"project": ("p-1", "p-2"), "api_key": ("k-1", "k-2", "k-3"), "end_user": ("u-1", "u-2", "u-3", "u-4")}
BUDGETS = [  # (scope, scope id, window, limit) on every organization
    ("organization", None, "day", 3000), ("project", "p-1", "month", 20000), ("api_key", "*", "day", 1500),
    ("api_key", "k-1", "week", 4000), ("end_user", "*", "day", 700),
]  # fmt: skip

# Errors the contract raises for legitimate races of the traffic (allowance
# exhausted, suspended organization, closed/abandoned task, replay conflicts…).
EXPECTED = {"LL001", "LL003", "LL005", "LL006", "LL007", "LL008", "LL009"}

SERVER_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "fsync": "off",  # the OS survives an immediate stop; only the processes die
    "synchronous_commit": "on",  # an acknowledged commit is in the OS: durable here
    "full_page_writes": "off",
    "max_connections": "40",
    "shared_buffers": "16MB",
    "timezone": "UTC",
    "log_min_messages": "fatal",
    "logging_collector": "off",
}


# ---------------------------------------------------------------- the server


class RestartableServer:
    """A PostgreSQL cluster driven with pg_ctl, so it can be stopped in immediate
    mode and started again on the same data directory.

    As root, the server processes run as the ``postgres`` OS user (PostgreSQL
    refuses root), in a base directory that user owns, as llm_db.testing._server does.
    """

    def __init__(self) -> None:
        check_installation()
        self.run_as = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        self.base = Path(tempfile.mkdtemp(prefix="llm-db-restart-", dir="/tmp"))
        if self.run_as is not None:
            os.chown(self.base, self.run_as.pw_uid, self.run_as.pw_gid)
        self.data = self.base / "data"
        self.log = self.base / "server.log"
        self.port = get_unused_port()
        self.running = False

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        kwargs: dict[str, Any] = {"cwd": self.base, "capture_output": True, "text": True}
        if self.run_as is not None:
            env = dict(os.environ, HOME=self.run_as.pw_dir, USER="postgres", LOGNAME="postgres")
            kwargs.update(user=self.run_as.pw_uid, group=self.run_as.pw_gid, extra_groups=[], env=env)
        proc = subprocess.run(list(args), **kwargs)
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args[:2])} … failed ({proc.returncode}): {proc.stderr or proc.stdout}\n"
                f"{self.tail_log()}"
            )
        return proc

    def tail_log(self) -> str:
        try:
            return "server log tail:\n" + "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return ""

    def initdb(self) -> None:
        self._run(
            str(BIN_DIR / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "-A", "trust",
            "-E", "UTF8", "--locale=C", "--no-sync",
        )  # fmt: skip

    def start(self) -> float:
        """Start (after a crash: with crash recovery); returns the seconds it took."""
        options = f"-p {self.port} -c unix_socket_directories={self.base} " + " ".join(
            f"-c {k}={v}" for k, v in SERVER_SETTINGS.items()
        )
        began = time.monotonic()
        self._run(
            str(BIN_DIR / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options,
            "-w", "-t", "60", "start",
        )  # fmt: skip
        self.running = True
        return time.monotonic() - began

    def stop(self, mode: str = "immediate") -> None:
        self._run(str(BIN_DIR / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")
        self.running = False

    def dsn(self, dbname: str = "postgres") -> str:
        return psycopg.conninfo.make_conninfo(
            host="127.0.0.1", port=self.port, user=SUPERUSER, dbname=dbname, connect_timeout=10
        )

    def destroy(self) -> None:
        if self.running:
            self._run(str(BIN_DIR / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop", check=False)
            self.running = False
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(scope="module")
def restart_dsn() -> Any:
    server = RestartableServer()
    try:
        server.initdb()
        server.start()
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE llm")
        dsn = server.dsn("llm")
        migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            declare_task(conn, TASK, "restart suite")
            for org, allowance in zip(ORGS, (60000, None, 20000), strict=True):
                new_org(conn, allowance, org_id=org, thresholds=THRESHOLDS, now=START - timedelta(days=1))
                for scope, scope_id, window, limit in BUDGETS:
                    set_budget(conn, org, scope, scope_id, window, limit, thresholds=THRESHOLDS, now=START)
        yield server, dsn
    finally:
        server.destroy()


# ---------------------------------------------------------------- traffic


@dataclass
class Report:
    """What the traffic threads saw; acknowledged calls must survive the crash. The
    ``crash_after``-th acknowledged call sets ``crash_point``: the moment of the stop."""

    crash_after: int
    crash_point: threading.Event = field(default_factory=threading.Event)
    calls: int = 0
    expected_errors: Counter = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    admitted: list[tuple[uuid.UUID, uuid.UUID]] = field(default_factory=list)
    terminal: list[tuple[uuid.UUID, uuid.UUID]] = field(default_factory=list)
    closed: list[tuple[uuid.UUID, uuid.UUID]] = field(default_factory=list)
    lock = threading.Lock()

    def add(self, attr: str, item: Any) -> None:
        with self.lock:
            getattr(self, attr).append(item)

    def acknowledged(self) -> None:
        with self.lock:
            self.calls += 1
            if self.calls == self.crash_after:
                self.crash_point.set()


def server_gone(conn: psycopg.Connection, exc: psycopg.Error) -> bool:
    """The error is the immediate stop: a lost connection, or the server's own
    shutdown codes (57P01-57P03 admin/crash shutdown, cannot connect now, 08xxx)."""
    if conn.broken or conn.closed:
        return True
    code = exc.sqlstate
    if isinstance(exc, psycopg.OperationalError) and code is None:
        return True  # e.g. "connection socket closed" before psycopg marked it broken
    return code is not None and (code in ("57P01", "57P02", "57P03") or code.startswith("08"))


def run_calls(
    dsn: str, report: Report, step: Callable[[psycopg.Connection], None], stop: threading.Event
) -> None:
    """Call ``step`` until the server goes away (or ``stop`` is set); classify errors."""
    try:
        conn = psycopg.connect(dsn, autocommit=True, options="-c lock_timeout=20s")
    except psycopg.OperationalError:
        return  # the stop came before this thread got in
    try:
        while not stop.is_set():
            try:
                step(conn)
                report.acknowledged()
            except psycopg.Error as exc:
                if server_gone(conn, exc):
                    return  # the server was stopped under us: the outcome is unknown
                if exc.sqlstate in EXPECTED:
                    with report.lock:
                        report.expected_errors[exc.sqlstate] += 1
                    continue
                report.add("unexpected", f"{exc.sqlstate}: {exc}")
                return
    finally:
        conn.close()


def request_worker(seed: int, clock: Callable[[], datetime], report: Report) -> Callable[[psycopg.Connection], None]:
    rng = random.Random(seed)
    open_invs: list[tuple[uuid.UUID, uuid.UUID]] = []
    open_tasks: list[tuple[uuid.UUID, uuid.UUID]] = []

    def step(conn: psycopg.Connection) -> None:
        op = rng.choices(
            ["admit", "dispatch", "settle", "fail", "open", "close", "toggle"],
            weights=[30, 10, 22, 6, 8, 5, 1],
        )[0]
        if op in ("dispatch", "settle", "fail") and not open_invs:
            op = "admit"
        if op == "close" and not open_tasks:
            op = "open"
        if op == "admit":
            org = rng.choice(ORGS)
            tasks = [t for o, t in open_tasks if o == org]
            execution = rng.choice(tasks) if tasks and rng.random() < 0.5 else None
            inv = uuid.uuid4()
            scopes = {scope: rng.choice(ids) for scope, ids in SCOPE_IDS.items() if rng.random() < 0.8}
            call(conn, "admit_id", org, rng.randint(1, 300), rng.choice(["m-small", "m-large"]),
                 execution_id=execution, invocation_id=inv, now=clock(), **scopes)
            open_invs.append((org, inv))
            report.add("admitted", (org, inv))
        elif op == "dispatch":
            org, inv = rng.choice(open_invs)
            call(conn, "mark_dispatched", org, inv, now=clock())
        elif op == "settle":
            org, inv = open_invs.pop(rng.randrange(len(open_invs)))
            outcome = call(conn, "settle", org, inv, rng.randint(0, 400), rng.randint(0, 40),
                           input_tokens=rng.randint(0, 9000), output_tokens=rng.randint(0, 900),
                           now=clock())[0]["value"]
            if outcome in ("settled", "already_settled", "already_recovered", "already_failed"):
                report.add("terminal", (org, inv))
        elif op == "fail":
            org, inv = open_invs.pop(rng.randrange(len(open_invs)))
            call(conn, "fail", org, inv, "provider error", credits=rng.choice([0, 0, rng.randint(1, 50)]),
                 cents=rng.randint(0, 3), now=clock())
            report.add("terminal", (org, inv))
        elif op == "open":
            org = rng.choice(ORGS)
            replay = f"r-{rng.randint(0, 10**9)}" if rng.random() < 0.5 else None
            execution = call(conn, "open_execution", org, TASK, replay_key=replay, now=clock())[0]["execution_id"]
            open_tasks.append((org, execution))
        elif op == "close":
            org, execution = open_tasks.pop(rng.randrange(len(open_tasks)))
            closed = call(conn, "close_execution", org, execution, rng.choice(["completed", "failed"]),
                          now=clock())[0]["value"]
            if closed:
                report.add("closed", (org, execution))
        else:  # suspend or reactivate the third organization (its allowance unchanged)
            set_toggled(conn, rng.choice(["suspended", "operational", "operational"]), clock())

    return step


def set_toggled(conn: psycopg.Connection, status: str, at: datetime) -> None:
    """Suspend or reactivate the third organization (its allowance unchanged)."""
    new_org(conn, 20000, org_id=ORG_TOGGLED, status=status, thresholds=THRESHOLDS, now=at)


def operator_worker(seed: int, clock: Callable[[], datetime]) -> Callable[[psycopg.Connection], None]:
    rng = random.Random(seed)

    def step(conn: psycopg.Connection) -> None:
        time.sleep(rng.uniform(0.005, 0.04))
        op = rng.choices(["pass", "pass_late", "reconcile_org", "notices"], weights=[4, 1, 3, 3])[0]
        if op == "pass":
            call_pass(conn, clock() + timedelta(hours=1))
        elif op == "pass_late":  # recovery racing live settlements
            call_pass(conn, clock() + timedelta(hours=25))
        elif op == "reconcile_org":
            reconcile(conn, rng.choice(ORGS), now=clock() + rng.choice([timedelta(hours=1), timedelta(hours=25)]),
                      batch=rng.choice([None, 3]))
        else:
            for notice in call(conn, "claim_notices", limit=3, now=clock()):
                org, notice_id, token = notice["organization_id"], notice["id"], notice["claim_token"]
                if rng.random() < 0.7:
                    call(conn, "complete_notice", org, notice_id, token, now=clock())
                else:
                    call(conn, "fail_notice", org, notice_id, token, "webhook down", now=clock())

    return step


# ---------------------------------------------------------------- checks after the restart


def connect_after_restart(dsn: str) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=True, options="-c lock_timeout=20s -c statement_timeout=120s")


def assert_acknowledged_calls_survived(conn: psycopg.Connection, report: Report, where: str) -> None:
    def present(pairs: list[tuple[uuid.UUID, uuid.UUID]], table: str, condition: str) -> int:
        if not pairs:
            return 0
        (n,) = conn.execute(
            f"SELECT count(*) FROM llm.{table} AS t"
            " JOIN unnest(%s::uuid[], %s::uuid[]) AS k(org, id) ON t.organization_id = k.org AND t.id = k.id"
            f" WHERE {condition}",
            [[o for o, _ in pairs], [i for _, i in pairs]],
        ).fetchone()
        return n

    admitted = set(report.admitted)
    assert present(list(admitted), "invocations", "true") == len(admitted), (
        f"{where}: an acknowledged admission was lost in the crash"
    )
    terminal = set(report.terminal)
    assert present(list(terminal), "invocations", "t.status IN ('settled', 'failed')") == len(terminal), (
        f"{where}: an acknowledged settlement or failure was lost in the crash"
    )
    closed = set(report.closed)
    assert present(list(closed), "executions", "t.status <> 'running'") == len(closed), (
        f"{where}: an acknowledged close was lost in the crash"
    )


def complete_the_books(conn: psycopg.Connection, at: datetime, where: str) -> int:
    """Run the pass at ``at`` until nothing is pending; check the books are complete.
    Returns how many interrupted pass rows it marked failed."""
    def runs(status: str) -> int:
        return scalar(conn, "SELECT count(*) FROM llm.reconciliation_runs WHERE status = %s", [status])

    def still_open(table: str, started: str, open_status: str) -> int:
        """Rows of ``table`` still open (``open_status``) from before the window, of operational organizations."""
        return scalar(
            conn,
            f"SELECT count(*) FROM llm.{table} AS t JOIN llm.organizations AS o ON o.id = t.organization_id"
            f" WHERE t.status IN ({open_status}) AND t.{started} <= %s AND o.status = 'operational'",
            [at - WINDOW],
        )

    dead_runs, failed_before = runs("running"), runs("failed")
    for _ in range(20):
        call_pass(conn, at)
        status, more = conn.execute(
            "SELECT status, more_pending_orgs FROM llm.reconciliation_runs"
            " WHERE status <> 'skipped' ORDER BY started_at DESC LIMIT 1"
        ).fetchone()
        assert status == "succeeded", f"{where}: the completing pass ended {status}"
        if more == 0:
            break
    else:
        raise AssertionError(f"{where}: the pass never caught up")

    stale_requests = still_open("invocations", "created_at", "'reserved', 'dispatched'")
    assert stale_requests == 0, f"{where}: {stale_requests} requests older than the window are still open"
    held = scalar(conn, "SELECT coalesce(sum(c.held_credits), 0) FROM llm.budget_counters AS c"
                        " JOIN llm.organizations AS o ON o.id = c.organization_id WHERE o.status = 'operational'")  # fmt: skip
    assert held == 0, f"{where}: budget counters still hold {held} credits of recovered requests"
    stale_tasks = still_open("executions", "started_at", "'running'")
    assert stale_tasks == 0, f"{where}: {stale_tasks} tasks older than the window are still running"
    assert runs("running") == 0, f"{where}: a pass row is still running"
    failed_after = runs("failed")
    assert failed_after - failed_before == dead_runs, (
        f"{where}: {dead_runs} passes died in the crash but {failed_after - failed_before} were marked failed"
    )
    violations = invariants(conn)
    assert violations == [], f"{where}: after the completing pass: {violations}"
    return dead_runs


def reactivate(conn: psycopg.Connection, at: datetime) -> None:
    """The suspended organization is not swept; reactivate it so its books complete too."""
    set_toggled(conn, "operational", at)


# ---------------------------------------------------------------- the test


def test_immediate_stops_during_mixed_traffic_keep_the_books(restart_dsn, capsys):
    """Invariants 1-8 hold after every crash, acknowledged calls survive, and the
    pass completes the books (WF-PFM-LLM-004, BR-CAP-PFM-LLM-009-01/-05); the budget
    counters too (invariants 14 and 15): held by the crashed admissions,
    recovered by the completing pass."""
    server, dsn = restart_dsn
    totals: dict[str, Any] = {"calls": 0, "errors": Counter(), "admitted": 0, "dead_passes": 0}
    restart_seconds: list[float] = []
    began = time.monotonic()

    for cycle in range(INTERRUPTIONS):
        rng = random.Random(SEED * 1_000_003 + cycle)
        tc = START + cycle * CYCLE
        where = f"cycle {cycle} (LLM_DB_SEED={SEED})"
        t_start = time.monotonic()

        def clock(tc: datetime = tc, t_start: float = t_start) -> datetime:
            # wall time scaled 600x, so the order of calls and of their clocks agree
            return tc + min(timedelta(seconds=(time.monotonic() - t_start) * 600), TRAFFIC_SPAN)

        report = Report(crash_after=rng.randint(*CRASH_AFTER))  # the seeded point of the crash
        stop = threading.Event()
        steps = [request_worker(rng.getrandbits(32), clock, report) for _ in range(3)]
        steps.append(operator_worker(rng.getrandbits(32), clock))
        threads = [threading.Thread(target=run_calls, args=(dsn, report, s, stop), daemon=True) for s in steps]
        for t in threads:
            t.start()
        reached = report.crash_point.wait(60)
        server.stop("immediate")  # the other calls in flight die with it
        stop.set()
        for t in threads:
            t.join(30)
            assert not t.is_alive(), f"{where}: a traffic thread hung after the stop"
        assert report.unexpected == [], f"{where}: unexpected errors during traffic: {report.unexpected}"
        assert reached, f"{where}: the traffic stopped before {report.crash_after} acknowledged calls"

        restart_seconds.append(server.start())
        with connect_after_restart(dsn) as conn:
            violations = invariants(conn)
            assert violations == [], f"{where}: right after the restart: {violations}"
            assert_acknowledged_calls_survived(conn, report, where)
            reactivate(conn, tc + COMPLETION - timedelta(minutes=1))
            totals["dead_passes"] += complete_the_books(conn, tc + COMPLETION, where)

        totals["calls"] += report.calls
        totals["errors"] += report.expected_errors
        totals["admitted"] += len(report.admitted)

    elapsed = time.monotonic() - began
    with capsys.disabled():
        print(
            f"\n[restart] {INTERRUPTIONS} immediate stops (LLM_DB_SEED={SEED}) in {elapsed:.0f} s: "
            f"{totals['calls']} acknowledged calls ({totals['admitted']} admissions), "
            f"contract errors {dict(sorted(totals['errors'].items()))}, {totals['dead_passes']} passes killed mid-run "
            f"and marked failed; restart {sum(restart_seconds) / len(restart_seconds):.2f} s on average"
        )
    assert totals["admitted"] > INTERRUPTIONS, "the traffic did too little to prove anything"
