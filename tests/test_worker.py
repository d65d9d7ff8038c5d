"""``llm-db worker`` as a real subprocess (``python -m llm_db.cli worker``) against this
test's database, delivering to a receiver on 127.0.0.1 that verifies every POST with the
``standardwebhooks`` package.

These tests run in real time (a NOTIFY, a backoff, a signal are real events); each is
bounded, uses short settings (``notice_backoff_base`` of a fraction of a second) and
asserts only the bounds the issue sets (delivered within 5 s, stopped within 10 s), never
a tighter timing. The pass's re-arm after a SIGKILL moves the clock through ``p_now``.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

import llm_db
from llm_db.client import Llm
from llm_db.service.worker import Log, SessionRequired, Worker, WorkerConfig, check_session
from llm_db.testing import LOGINS, create_logins
from llm_db.testing._server import EphemeralServer
from tests.helpers import (
    admit,
    call_pass,
    new_org,
    notices,
    run_pass,
    set_budget,
    settle,
    wait_for,
)
from tests.receiver import Receiver
from tests.tools import require_tool

SECRET = "whsec_bGxtLWRiIHdvcmtlciB0ZXN0IHNlY3JldCwgMzIgYnl0ZXM="
SECRET_ENV = "LLM_DB_TEST_WORKER_SECRET"


# ---------------------------------------------------------------- the worker process


class WorkerProcess:
    """``llm-db worker`` in a subprocess with --log-json; its stderr lines are parsed as
    they come (a thread drains the pipe, so the worker never blocks on it)."""

    def __init__(self, dsn: str, url: str, *args: str, secret: str = SECRET) -> None:
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        env[SECRET_ENV] = secret
        self.command = [sys.executable, "-m", "llm_db.cli", "worker", "--dsn", dsn, "--url", url,
                        "--secret-env", SECRET_ENV, "--metrics-addr", "127.0.0.1:0", "--log-json",
                        *args]  # fmt: skip
        self.proc = subprocess.Popen(self.command, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
        self.lines: list[str] = []
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict):
                    self.events.put(event)

    def wait_for(self, name: str, timeout: float = 20.0) -> dict[str, Any]:
        """The next log event named ``name`` (earlier ones already seen count too)."""
        for event in self.seen:
            if event["event"] == name and not event.get("_taken"):
                event["_taken"] = True
                return event
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.proc.poll() is not None and self.events.empty():
                raise AssertionError(f"no {name!r} event; worker log:\n{self.log()}")
            try:
                event = self.events.get(timeout=min(remaining, 0.2))
            except queue.Empty:
                continue
            self.seen.append(event)
            if event["event"] == name:
                event["_taken"] = True
                return event

    def named(self, name: str) -> list[dict[str, Any]]:
        """Every event named ``name`` logged so far."""
        while not self.events.empty():
            self.seen.append(self.events.get())
        return [e for e in self.seen if e["event"] == name]

    def started(self) -> str:
        """Wait for the start; the http://host:port of /metrics and /healthz."""
        return "http://" + self.wait_for("started")["metrics_addr"]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> tuple[int, float]:
        """Send ``sig``; (exit code, seconds it took to exit)."""
        started = time.monotonic()
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=timeout)
        return code, time.monotonic() - started

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self._reader.join(timeout=5)

    def log(self) -> str:
        return "".join(self.lines)


@pytest.fixture
def start_worker() -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(dsn: str, url: str, *args: str, **kwargs: Any) -> WorkerProcess:
        # the worker logs in as the operator, as deployed
        dsn = psycopg.conninfo.make_conninfo(dsn, user=LOGINS["llm_operator"])
        worker = WorkerProcess(dsn, url, *args, **kwargs)
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            worker.kill()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver(SECRET) as hook:
        yield hook


# ---------------------------------------------------------------- the books


def fast_backoff(conn: psycopg.Connection, base: str = "0.2 seconds", most: str = "1 second") -> None:
    conn.execute("UPDATE llm.settings SET notice_backoff_base = %s::interval,"
                 " notice_backoff_max = %s::interval", [base, most])  # fmt: skip


def worker_org(conn: psycopg.Connection, thresholds: list[int]) -> uuid.UUID:
    """An organization of 100 credits, created at the real time (the worker runs on it)."""
    return new_org(conn, 100, name="worker test", thresholds=thresholds, now=None)


def spend(conn: psycopg.Connection, org: uuid.UUID, credits: int) -> float:
    """Admit and settle ``credits`` at the real time: the settlement commits the notices of
    the thresholds it crossed. Returns time.monotonic() just before the settlement was sent
    (so "committed -> received" is measured from no later than the commit)."""
    inv = admit(conn, org, credits, "model-w", now=None)["id"]
    settling = time.monotonic()
    assert settle(conn, org, inv, credits, 0, now=None) == "settled"
    return settling


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=15) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


# ---------------------------------------------------------------- delivery


def test_a_notice_created_after_the_worker_starts_is_delivered_within_5_seconds(
    llm_dsn, llm_conn, receiver, start_worker
):
    """Issue #13: the settling transaction's NOTIFY llm_notices wakes the worker, which
    delivers at once: within 5 s, with --poll 60 so the poll cannot be what found it. The
    receiver verifies the Standard Webhooks signature with the standardwebhooks package."""
    receiver.up()
    worker = start_worker(llm_dsn, receiver.url, "--poll", "60")
    worker.started()
    org = worker_org(llm_conn, [80])
    committed = spend(llm_conn, org, 85)
    got = receiver.wait_for(1, timeout=5)
    assert got[0].arrived - committed < 5
    assert got[0].verified, got[0].error
    [notice] = notices(llm_conn, org)
    assert got[0].headers["webhook-id"] == str(notice["id"])
    assert json.loads(got[0].body)["data"]["threshold_pct"] == 80
    wait_for(lambda: notices(llm_conn, org)[0]["status"] == "sent", "notice marked sent", 5)
    event = worker.wait_for("delivered")
    assert (event["notice_id"], event["http_status"]) == (str(notice["id"]), 204)


def test_a_budget_s_notice_is_delivered_by_the_worker_naming_its_budget(
    llm_dsn, llm_conn, receiver, start_worker
):
    """A budget's threshold notice takes the allowance's path (NOTIFY, claim,
    signed POST) through the running worker: its payload is llm.budget_threshold_crossed
    naming scope, id, window and window start, and the worker's log line names the budget."""
    receiver.up()
    worker = start_worker(llm_dsn, receiver.url, "--poll", "60")
    worker.started()
    org = new_org(llm_conn, None, name="worker budgets", now=None)
    set_budget(llm_conn, org, "end_user", "*", "day", 100, thresholds=[80], now=None)
    inv = admit(llm_conn, org, 85, "model-w", now=None, end_user="user 7")["id"]
    assert settle(llm_conn, org, inv, 85, 0, now=None) == "settled"
    [got] = receiver.wait_for(1, timeout=5)
    assert got.verified, got.error
    envelope = json.loads(got.body)
    [notice] = notices(llm_conn, org)
    assert envelope["type"] == "llm.budget_threshold_crossed"
    assert {k: envelope["data"][k] for k in ("scope", "scope_id", "window", "window_start")} == {
        "scope": "end_user", "scope_id": "user 7", "window": "day",
        "window_start": str(notice["period_start"]),
    }  # fmt: skip
    event = worker.wait_for("delivered")
    assert (event["notice_id"], event["scope"], event["scope_id"], event["window"]) == (
        str(notice["id"]), "end_user", "user 7", "day")  # fmt: skip


def test_receiver_down_retries_with_backoff_loses_nothing_and_delivers_once_back(
    llm_dsn, llm_conn, receiver, start_worker
):
    """Issue #13: while the receiver refuses connections each notice goes back to owed with
    its error and a backoff (settings.notice_backoff_base, 0.2 s here), is retried when due,
    and is delivered once the receiver is back: nothing lost, nothing stuck in sending."""
    fast_backoff(llm_conn)
    worker = start_worker(llm_dsn, receiver.url, "--poll", "60", "--timeout", "2")
    worker.started()
    org = worker_org(llm_conn, [50, 80])
    spend(llm_conn, org, 85)
    for _ in range(3):  # the first notice failed, came due after its backoff, failed again ...
        worker.wait_for("failed", timeout=15)
    down = notices(llm_conn, org)
    assert all(n["status"] in ("owed", "sending") and n["sent_at"] is None for n in down)
    errors = {n["last_error"] for n in down if n["last_error"]}
    assert errors and all(e.startswith(("connection failed", "not attempted")) for e in errors)
    assert max(n["attempts"] for n in down) >= 2

    receiver.up()
    wait_for(lambda: [n["status"] for n in notices(llm_conn, org)] == ["sent", "sent"],
             "both notices delivered after the receiver came back", 15)  # fmt: skip
    got = receiver.received
    assert {r.headers["webhook-id"] for r in got} == {str(n["id"]) for n in down}
    assert all(r.verified for r in got)
    assert len(got) == 2  # refused connections never reached it; each notice arrived once


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_finishes_the_notice_in_flight_releases_the_rest_and_exits_0_within_10_s(
    llm_dsn, llm_conn, receiver, start_worker, sig
):
    """Issue #13, shutdown: on SIGTERM (or SIGINT) mid-batch the worker finishes the POST in
    flight, releases every other notice it claimed (owed, due at once, no attempt counted:
    llm.release_notice) and exits 0 within 10 s, leaving nothing sending."""
    receiver.up()
    receiver.delay = 0.5  # each answer takes half a second: the signal lands mid-batch
    worker = start_worker(llm_dsn, receiver.url, "--poll", "60", "--limit", "10")
    worker.started()
    org = worker_org(llm_conn, [10, 20, 30, 40, 50, 60])
    spend(llm_conn, org, 65)  # six notices in one transaction
    receiver.wait_for(1, timeout=10)
    code, seconds = worker.stop(sig)
    assert code == 0, worker.log()
    assert seconds < 10
    rows = notices(llm_conn, org)
    assert [n["status"] for n in rows].count("sending") == 0
    sent = [n for n in rows if n["status"] == "sent"]
    owed = [n for n in rows if n["status"] == "owed"]
    assert len(sent) >= 1 and len(sent) + len(owed) == 6
    assert {r.headers["webhook-id"] for r in receiver.received} == {str(n["id"]) for n in sent}
    assert owed, "the signal should have landed before the last of six notices"
    assert all(n["attempts"] == 0 and n["claimed_at"] is None for n in owed)
    assert {e["notice_id"] for e in worker.named("released")} == {str(n["id"]) for n in owed}
    assert worker.named("stopped")[0]["left_sending"] == 0


def test_sigkill_mid_delivery_the_pass_rearms_and_it_is_delivered_again_with_the_same_id(
    llm_dsn, llm_conn, receiver, start_worker
):
    """Issue #13: a worker killed (SIGKILL) while its POST is in flight leaves the notice
    sending; the hourly pass re-arms it once notice_claim_timeout (15 min) has passed (the
    clock moved through p_now), and the next delivery carries the same webhook-id, so the
    receiver can tell it is the same notice."""
    receiver.up()
    receiver.block.clear()  # the receiver holds the first POST: the worker is mid-delivery
    worker = start_worker(llm_dsn, receiver.url, "--poll", "60")
    worker.started()
    org = worker_org(llm_conn, [80])
    spend(llm_conn, org, 85)
    [first] = receiver.wait_for(1, timeout=10)
    worker.proc.kill()
    worker.proc.wait(timeout=10)
    receiver.block.set()
    [notice] = notices(llm_conn, org)
    assert (notice["status"], notice["attempts"]) == ("sending", 1)

    later = llm_conn.execute("SELECT now() + interval '16 minutes'").fetchone()[0]
    run = run_pass(llm_conn, later)
    assert (run["status"], run["notices_rearmed"]) == ("succeeded", 1)
    [rearmed] = notices(llm_conn, org)
    assert (rearmed["status"], rearmed["next_attempt_at"]) == ("owed", later)

    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | {SECRET_ENV: SECRET}
    again = subprocess.run(
        [sys.executable, "-m", "llm_db.cli", "notices", "deliver", "--dsn", llm_dsn, "--url",
         receiver.url, "--secret-env", SECRET_ENV, "--now", (later + timedelta(seconds=1)).isoformat()],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    first_again, second = receiver.received
    assert first_again is first
    assert second.headers["webhook-id"] == first.headers["webhook-id"] == str(notice["id"])
    assert second.verified and json.loads(second.body)["data"]["attempts"] == 2
    assert notices(llm_conn, org)[0]["status"] == "sent"


# ---------------------------------------------------------------- endpoints


def test_metrics_parse_and_healthz_turns_503_when_the_database_stops(receiver, start_worker):
    """Issue #13: /metrics is Prometheus text that prometheus_client's parser reads (llm_up,
    the scrape duration, the books' gauges, the delivery counters; promtool check metrics
    passes when promtool is there); /healthz is 200 while the database answers and the pass is
    healthy, 503 once the database stops. A server of its own, so it can be stopped."""
    with EphemeralServer() as server:
        dsn = server.create_database("worker_health")
        llm_db.migrate(dsn)
        create_logins(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            call_pass(conn, None)
        receiver.up()
        worker = start_worker(dsn, receiver.url, "--poll", "0.5")
        base = worker.started()

        status, body = get(base + "/healthz")
        assert status == 200, body
        assert json.loads(body)["status"] == "ok"
        status, text = get(base + "/metrics")
        assert status == 200
        families = {f.name: f for f in text_string_to_metric_families(text.decode())}
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in families.values() for s in f.samples}  # fmt: skip
        assert samples[("llm_up", ())] == 1
        assert samples[("llm_reconciliation_health", (("status", "ok"),))] == 1
        assert families["llm_notice_deliveries"].type == "counter"
        assert samples[("llm_notice_deliveries_total", (("outcome", "sent"),))] == 0
        assert families["llm_scrape_duration_seconds"].type == "gauge"
        promtool_check(text)

        server.stop()
        status, body = wait_for(lambda: (lambda r: r if r[0] == 503 else None)(get(base + "/healthz")),
                                "healthz 503 after the database stopped", 15)  # fmt: skip
        assert json.loads(body)["database"] == "down"
        status, text = get(base + "/metrics")
        assert status == 200
        down = {s.name: s.value for f in text_string_to_metric_families(text.decode()) for s in f.samples}
        assert down["llm_up"] == 0 and "llm_reconciliation_health" not in down
        promtool_check(text)
        code, seconds = worker.stop()
        assert code == 0 and seconds < 10, worker.log()


def test_healthz_is_503_while_no_pass_ever_ran(llm_dsn, receiver, start_worker):
    worker = start_worker(llm_dsn, receiver.url)
    base = worker.started()
    assert get(base + "/nowhere")[0] == 404
    status, body = get(base + "/healthz")
    assert status == 503
    assert json.loads(body) | {"detail": None} == {
        "status": "unhealthy", "database": "up", "reconciliation": "never", "detail": None,
        "delivery_loop": "up"}  # fmt: skip


# ---------------------------------------------------------------- refusals at start


def test_a_timeout_not_below_the_claim_timeout_is_refused_exit_2(llm_dsn, llm_conn, receiver,
                                                                 start_worker):  # fmt: skip
    """The POSTs of one batch must end before its claims expire (settings.notice_claim_timeout),
    or the pass would re-arm notices still being sent."""
    llm_conn.execute("UPDATE llm.settings SET notice_claim_timeout = '30 seconds'")
    worker = start_worker(llm_dsn, receiver.url, "--limit", "10", "--timeout", "5")
    assert worker.proc.wait(timeout=30) == 2
    worker.kill()
    assert "llm.settings.notice_claim_timeout" in worker.log()
    assert "--limit" in worker.log() and "Traceback" not in worker.log()


def test_a_claim_taken_again_is_logged_lost_on_release_and_left_to_its_holder(
    llm_dsn, llm_conn, receiver
):
    """A worker holding a claim that expired, was re-armed and was claimed
    again by another worker cannot release it: release_notice answers False, the worker logs
    claim_lost and counts the outcome lost, and the other worker's claim stands. (In
    process, on the worker's own release step: no timing involved.)"""
    org = worker_org(llm_conn, [50])
    spend(llm_conn, org, 60)
    llm = Llm(llm_conn)
    now = llm_conn.execute("SELECT now()").fetchone()[0]
    [stale] = llm.claim_notices(now=now)
    assert llm.rearm_notices(now=now + timedelta(minutes=16)) == 1
    [taken] = llm.claim_notices(now=now + timedelta(minutes=16))
    lines: list[str] = []
    worker = Worker(WorkerConfig(dsn=llm_dsn, url=receiver.url, secrets=[SECRET]),
                    Log(json_lines=True, stream=_Lines(lines)))  # fmt: skip
    try:
        worker.work = psycopg.connect(llm_dsn, autocommit=True)
        worker.held[(stale.organization_id, stale.id)] = stale
        assert worker._release_held() == 0
        assert worker.deliveries.labels(outcome="lost")._value.get() == 1
        assert worker.deliveries.labels(outcome="released")._value.get() == 0
    finally:
        worker._close()
    events = [json.loads(line) for line in lines]
    assert [(e["event"], e["notice_id"]) for e in events] == [("claim_lost", str(stale.id))]
    [row] = notices(llm_conn, org)
    assert (row["status"], row["claim_token"]) == ("sending", taken.claim_token)
    assert llm.complete_notice(org, taken.id, taken.claim_token, now=now + timedelta(minutes=17))


class _Lines:
    """A text stream collecting the lines written to it."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def write(self, text: str) -> None:
        self.lines.extend(t for t in text.splitlines() if t)

    def flush(self) -> None:
        pass


def test_check_session_accepts_direct_connections(llm_connect):
    listen, other = llm_connect(), llm_connect()
    assert check_session(listen, other) == listen.info.backend_pid


PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


@pytest.mark.parametrize("pool_mode", ["transaction", "session"])
def test_the_worker_needs_a_session_pgbouncer_transaction_mode_exits_2(
    llm_server, llm_dsn, receiver, start_worker, pool_mode
):
    """Issue #13: LISTEN needs a session. Through PgBouncer in transaction mode the worker sees
    its backend change (or handed to another client) and exits 2 saying what it needs; in
    session mode it starts."""
    require_tool(PGBOUNCER, "pgbouncer")
    dbname = psycopg.conninfo.conninfo_to_dict(llm_dsn)["dbname"]
    with pgbouncer(llm_server, dbname, pool_mode) as bouncer_dsn:
        with psycopg.connect(bouncer_dsn, autocommit=True) as a, \
                psycopg.connect(bouncer_dsn, autocommit=True) as b:  # fmt: skip
            if pool_mode == "transaction":
                with pytest.raises(SessionRequired):
                    check_session(a, b)
            else:
                check_session(a, b)
        worker = start_worker(bouncer_dsn, receiver.url)
        if pool_mode == "transaction":
            assert worker.proc.wait(timeout=30) == 2
            worker.kill()
            assert "PgBouncer in session mode" in worker.log(), worker.log()
        else:
            worker.started()
            code, _ = worker.stop()
            assert code == 0, worker.log()


@contextlib.contextmanager
def pgbouncer(server: EphemeralServer, dbname: str, pool_mode: str) -> Iterator[str]:
    """PgBouncer in ``pool_mode`` in front of ``dbname``, in a directory under /tmp that the
    postgres user (PgBouncer's, when the tests run as root) can reach."""
    from testing.common.database import get_unused_port

    port = get_unused_port()
    where = Path(tempfile.mkdtemp(prefix="llm-db-pgbouncer-", dir="/tmp"))
    where.chmod(0o777)
    ini = where / "pgbouncer.ini"
    ini.write_text(
        f"[databases]\n{dbname} = host={server.host} port={server.port} dbname={dbname}\n"
        f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nauth_type = trust\n"
        f"auth_file = {where / 'users.txt'}\npool_mode = {pool_mode}\ndefault_pool_size = 4\n"
        f"unix_socket_dir =\nlogfile = {where / 'pgbouncer.log'}\n"
        f"pidfile = {where / 'pgbouncer.pid'}\n"
    )
    operator = LOGINS["llm_operator"]  # the worker's login
    (where / "users.txt").write_text(f'"{operator}" ""\n')
    for path in where.iterdir():
        path.chmod(0o666)
    command = [PGBOUNCER, str(ini)]
    if os.geteuid() == 0:
        command[1:1] = ["-u", "postgres"]  # PgBouncer refuses to run as root
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dsn = f"host=127.0.0.1 port={port} user={operator} dbname={dbname}"
    try:
        wait_for(lambda: _connects(dsn), "pgbouncer accepting connections", 10)
        yield dsn
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(where, ignore_errors=True)


def _connects(dsn: str) -> bool:
    try:
        psycopg.connect(dsn, connect_timeout=2).close()
        return True
    except psycopg.OperationalError:
        return False


# ---------------------------------------------------------------- promtool


def promtool_check(exposition: bytes) -> None:
    """``promtool check metrics`` (Debian's prometheus package, which bootstrap installs):
    names, types and help pass Prometheus' own linter (a missing promtool: tests/tools.py)."""
    promtool = require_tool("promtool", "prometheus")
    proc = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True,
                          timeout=30)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()


# ---------------------------------------------------------------- latency


def test_delivery_latency_from_commit_to_receiver_over_100_notices(
    llm_dsn, llm_conn, receiver, start_worker, capsys
):
    """Notice committed -> received by the receiver, with the worker running: 100 notices one
    after another (each waits for the previous delivery). Prints median and max (the figures
    of docs/monitoring.md); asserts only the issue's 5 s per notice."""
    receiver.up()
    worker = start_worker(llm_dsn, receiver.url, "--poll", "60")
    worker.started()
    orgs = [worker_org(llm_conn, [80]) for _ in range(100)]
    latencies = []
    for n, org in enumerate(orgs, start=1):
        committed = spend(llm_conn, org, 85)
        got = receiver.wait_for(n, timeout=5)
        latencies.append(got[-1].arrived - committed)
    assert all(r.verified for r in receiver.received)
    assert max(latencies) < 5
    with capsys.disabled():
        print(f"\n[worker] delivery latency over {len(latencies)} notices (commit -> received): "
              f"median {statistics.median(latencies) * 1000:.1f} ms, "
              f"max {max(latencies) * 1000:.1f} ms")  # fmt: skip
