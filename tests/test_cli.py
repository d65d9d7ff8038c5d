"""The ``llm-db`` command line through its real entry point: a subprocess running
``python -m llm_db.cli`` (the same program as the ``llm-db`` script) against this
test's database. Each subcommand's output and exit code: 0 done, 1 needs
attention, 2 usage, 3 extension missing, 4 database error, 5 health ``never``.

The clock is moved with ``--now`` (the driver's ``now=``), never by sleeping.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llm_db.client import Llm
from llm_db.service.notices import verify_webhook
from tests.helpers import (
    CRON_JOB,
    JANUARY,
    T0,
    InThread,
    call_pass,
    cron_jobs,
    lock_period_rows,
    row,
    scalar,
    wait_blocked,
)
from tests.receiver import Receiver

SUBCOMMANDS = ["migrate", "reconcile", "health", "schedule", "unschedule", "notices deliver",
               "notices new-secret", "worker", "report", "metrics", "distribute", "demo"]  # fmt: skip
NEEDS_DSN = [c for c in SUBCOMMANDS if c not in ("demo", "notices new-secret")]
SECRET = "whsec_bGxtLWRiIENMSSB0ZXN0IHNlY3JldCwgMzIgYnl0ZXM="  # a fixed test secret
WEBHOOK_ARGS = ("notices deliver", "worker")  # the subcommands that take --url and --secret-env
SECRET_ENV = "LLM_DB_TEST_WEBHOOK_SECRET"


def llm_db(*args: str, dsn: str | None = None, env: dict[str, str] | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """Run ``python -m llm_db.cli ARGS`` (DATABASE_URL = ``dsn``, or unset)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", SECRET_ENV)}
    if dsn is not None:
        environ["DATABASE_URL"] = dsn
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "llm_db.cli", *args],
        capture_output=True, text=True, env=environ, timeout=timeout,
    )  # fmt: skip



def iso(moment) -> str:
    return moment.isoformat()


def assert_one_line_error(proc: subprocess.CompletedProcess[str], command: str, *needles: str):
    """stderr is one line ``llm-db COMMAND: error: ...`` holding every needle; no traceback."""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"llm-db {command}: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.fixture
def org(llm_conn: psycopg.Connection) -> uuid.UUID:
    """An operational organization with an allowance of 100 credits (notices at 80 and 100)."""
    org_id = uuid.uuid4()
    Llm(llm_conn).upsert_organization(org_id, "CLI Org", 100, now=T0)
    return org_id


def strand_a_request(conn: psycopg.Connection, org_id: uuid.UUID, estimate: int = 30) -> uuid.UUID:
    """Admit and dispatch a request at T0 that nobody settles (a crashed worker)."""
    llm = Llm(conn)
    inv = llm.admit(org_id, estimate, "gpt-x", now=T0)
    llm.mark_dispatched(org_id, inv.id, now=T0)
    return inv.id


# ---------------------------------------------------------------- help and entry points


def test_help_lists_every_subcommand_and_the_exit_codes():
    proc = llm_db("--help")
    assert proc.returncode == 0, proc.stderr
    for command in {c.split()[0] for c in SUBCOMMANDS}:
        assert f"  {command}" in proc.stdout
    assert "Exit codes" in proc.stdout
    assert "DATABASE_URL" in proc.stdout


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_each_subcommand_help_teaches_with_examples(command):
    proc = llm_db(*command.split(), "--help")
    assert proc.returncode == 0, proc.stderr
    assert "Example" in proc.stdout, proc.stdout
    assert "llm-db " in proc.stdout.split("Example", 1)[1]
    if command in NEEDS_DSN:
        assert "--dsn" in proc.stdout and "DATABASE_URL" in proc.stdout


def test_the_console_script_and_python_dash_m_are_the_same_program():
    script = Path(sys.executable).with_name("llm-db")
    assert script.exists(), "pip install -e . creates the llm-db script next to python"
    by_script = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    by_module = llm_db("--version")
    assert by_script.returncode == by_module.returncode == 0
    assert by_script.stdout == by_module.stdout
    assert "llm-db" in by_module.stdout


@pytest.mark.parametrize("command", NEEDS_DSN)
def test_no_dsn_and_no_database_url_is_a_clear_usage_error_exit_2(command):
    extra = ["--url", "http://127.0.0.1:9/", "--secret-env", SECRET_ENV] if command in WEBHOOK_ARGS else []
    proc = llm_db(*command.split(), *extra, env={SECRET_ENV: SECRET})
    assert proc.returncode == 2, proc.stderr
    assert "no database given: pass --dsn DSN or set DATABASE_URL" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unreachable_database_is_one_line_exit_4():
    proc = llm_db("health", "--dsn", "host=127.0.0.1 port=1 dbname=nowhere connect_timeout=3")
    assert proc.returncode == 4
    assert_one_line_error(proc, "health", "cannot connect", "Connection refused")


def test_malformed_dsn_is_a_usage_error_exit_2():
    proc = llm_db("health", "--dsn", "not a conninfo")
    assert proc.returncode == 2
    assert "Invalid value for --dsn" in proc.stderr


def test_bad_option_values_are_usage_errors_exit_2(llm_dsn):
    assert llm_db("reconcile", "--batch", "0", dsn=llm_dsn).returncode == 2
    proc = llm_db("health", "--now", "yesterday", dsn=llm_dsn)
    assert proc.returncode == 2
    assert "is not an ISO 8601 timestamp" in proc.stderr


def test_a_database_without_llm_db_says_to_migrate_exit_4(llm_server, llm_owner):
    name = f"t_empty_{uuid.uuid4().hex[:12]}"
    dsn = llm_server.create_database(name, owner=llm_owner)
    try:
        proc = llm_db("health", dsn=dsn)
        assert proc.returncode == 4
        assert_one_line_error(proc, "health", "3F000", "llm-db migrate")
    finally:
        llm_server.drop_database(name)


# ---------------------------------------------------------------- migrate


def test_migrate_on_a_migrated_database_applies_nothing_new(llm_dsn):
    proc = llm_db("migrate", dsn=llm_dsn)
    assert proc.returncode == 0, proc.stderr
    assert "migrations applied: none" in proc.stdout
    assert "sql files applied:" in proc.stdout


# ---------------------------------------------------------------- health


def test_health_never_ok_late_and_failing_exit_codes(llm_dsn, llm_conn):
    """The missing-run alarm as a monitoring check (BR-CAP-PFM-LLM-009-07): never -> 5
    (not 2, click's usage error), ok -> 0, late (no pass within
    health_max_age, 2 h) -> 1, failing -> 1."""
    never = llm_db("health", "--now", iso(T0), dsn=llm_dsn)
    assert never.returncode == 5, never.stderr
    assert never.stdout.splitlines()[0].split() == ["status", "never"]
    assert "last success  never" in never.stdout

    assert llm_db("reconcile", "--now", iso(T0), dsn=llm_dsn).returncode == 0
    ok = llm_db("health", "--now", iso(T0 + timedelta(minutes=30)), dsn=llm_dsn)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.splitlines()[0].split() == ["status", "ok"]
    assert "last run      succeeded" in ok.stdout

    late = llm_db("health", "--now", iso(T0 + timedelta(hours=3)), "--json", dsn=llm_dsn)
    assert late.returncode == 1
    body = json.loads(late.stdout)
    assert body["status"] == "late" and "llm-reconciliation" in body["detail"]

    llm_conn.execute(
        "INSERT INTO llm.reconciliation_runs (started_at, finished_at, clock, status, orgs_visited,"
        " orgs_failed, errors) VALUES (now(), now(), %s, 'partial', 2, 1,"
        " '[{\"step\": \"organization\", \"sqlstate\": \"XX000\", \"error\": \"boom\"}]')",
        [T0 + timedelta(hours=1)],
    )
    failing = llm_db("health", "--now", iso(T0 + timedelta(hours=1, minutes=5)), dsn=llm_dsn)
    assert failing.returncode == 1
    assert failing.stdout.splitlines()[0].split() == ["status", "failing"]
    assert "boom" in failing.stdout


def test_health_help_says_never_exits_5():
    """`--help` of health and of llm-db name exit 5 for never."""
    assert "5  never" in llm_db("health", "--help").stdout
    assert "5    health: no pass has ever completed" in llm_db("--help").stdout


def test_health_reads_database_url(llm_dsn):
    assert llm_db("health", dsn=llm_dsn).returncode == 5  # never, found through DATABASE_URL


# ---------------------------------------------------------------- reconcile


def test_reconcile_on_an_empty_database_succeeds_with_zero_figures(llm_dsn, llm_conn):
    proc = llm_db("reconcile", "--now", iso(T0), dsn=llm_dsn)
    assert proc.returncode == 0, proc.stderr
    first, *figures = proc.stdout.splitlines()
    run_id = first.split()[1]
    assert first.startswith(f"pass {run_id} succeeded in ")
    values = {" ".join(line.split()[:-1]): line.split()[-1] for line in figures}
    assert values["organizations visited"] == "0"
    assert values["requests recovered"] == "0"
    stored = row(llm_conn, "SELECT status, clock FROM llm.reconciliation_runs WHERE id = %s", [run_id])
    assert stored == {"status": "succeeded", "clock": T0}


def test_reconcile_recovers_a_stranded_request_and_prints_the_run_row(llm_dsn, llm_conn, org):
    """BR-CAP-PFM-LLM-009-01 through the CLI: a request unsettled for 25 h is settled at
    its estimate and its hold released; the printed figures are the run row's."""
    inv_id = strand_a_request(llm_conn, org, estimate=30)
    proc = llm_db("reconcile", "--now", iso(T0 + timedelta(hours=25)), "--json", dsn=llm_dsn)
    assert proc.returncode == 0, proc.stderr
    run = json.loads(proc.stdout)
    assert run["status"] == "succeeded"
    assert (run["orgs_visited"], run["requests_recovered"], run["released_hold_credits"],
            run["past_window_alerts"]) == (1, 1, 30, 1)  # fmt: skip
    stored = row(llm_conn, "SELECT * FROM llm.reconciliation_runs WHERE id = %s", [run["id"]])
    assert stored["requests_recovered"] == 1 and stored["released_hold_credits"] == 30
    inv = row(llm_conn, "SELECT status, settlement_kind, charged_credits FROM llm.invocations"
                        " WHERE organization_id = %s AND id = %s", [org, inv_id])  # fmt: skip
    assert inv == {"status": "settled", "settlement_kind": "recovered", "charged_credits": 30}


def test_reconcile_text_output_names_each_figure(llm_dsn, llm_conn, org):
    Llm(llm_conn).upsert_organization(org, "CLI Org", None, now=T0)  # unlimited
    strand_a_request(llm_conn, org, estimate=1234)
    proc = llm_db("reconcile", "--now", iso(T0 + timedelta(hours=25)), dsn=llm_dsn)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.split() == ["requests", "recovered", "1"] for line in lines), proc.stdout
    assert any(line.split() == ["hold", "credits", "released", "1,234"] for line in lines)


def test_reconcile_one_organization_with_org(llm_dsn, llm_conn, org):
    strand_a_request(llm_conn, org, estimate=40)
    proc = llm_db("reconcile", "--org", str(org), "--now", iso(T0 + timedelta(hours=25)),
                  "--batch", "10", "--json", dsn=llm_dsn)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    sweep = json.loads(proc.stdout)
    assert sweep["organization_id"] == str(org)
    assert (sweep["recovered_requests"], sweep["released_hold_credits"]) == (1, 40)
    assert sweep["more_pending"] is False
    # one organization's sweep records no pass
    assert scalar(llm_conn, "SELECT count(*) FROM llm.reconciliation_runs") == 0


def test_reconcile_unknown_organization_is_one_line_ll002_exit_4(llm_dsn):
    proc = llm_db("reconcile", "--org", str(uuid.uuid4()), dsn=llm_dsn)
    assert proc.returncode == 4
    assert_one_line_error(proc, "reconcile", "LL002", "HINT:")


def test_reconcile_progress_follows_the_organizations_of_the_pass(llm_dsn, llm_conn):
    llm = Llm(llm_conn)
    orgs = [uuid.uuid4() for _ in range(5)]
    for org_id in orgs:
        llm.upsert_organization(org_id, "P", None, now=T0)
        strand_a_request(llm_conn, org_id, estimate=10)
    proc = llm_db("reconcile", "--progress", "--now", iso(T0 + timedelta(hours=25)), dsn=llm_dsn)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("organizations")  # the bar's label (no terminal: label only)
    lines = proc.stdout.splitlines()
    assert any(line.split() == ["organizations", "visited", "5"] for line in lines), proc.stdout
    assert any(line.split() == ["requests", "recovered", "5"] for line in lines)


def test_reconcile_skipped_while_another_pass_is_running_exit_1(llm_dsn, llm_conn, llm_connect):
    """A pass really running (blocked inside an organization's sweep) holds the lease:
    ``llm-db reconcile`` records a skipped pass and exits 1."""
    org_id = uuid.uuid4()
    Llm(llm_conn).upsert_organization(org_id, "busy", None, now=T0)
    strand_a_request(llm_conn, org_id)
    llm_conn.execute("UPDATE llm.settings SET org_lock_timeout = '60s'")
    blocker = llm_connect(autocommit=False)
    lock_period_rows(blocker, org_id)
    holder = llm_connect()
    running = InThread(lambda: call_pass(holder, T0 + timedelta(hours=25)))
    try:
        wait_blocked(llm_conn, holder.info.backend_pid)
        proc = llm_db("reconcile", "--now", iso(T0 + timedelta(hours=25)), dsn=llm_dsn)
    finally:
        blocker.rollback()
        running.result()
    assert proc.returncode == 1, proc.stderr
    assert " skipped in " in proc.stdout.splitlines()[0]
    assert "another reconciliation pass is running" in proc.stdout


# ---------------------------------------------------------------- schedule / unschedule


def test_schedule_without_pg_cron_is_ll010_with_the_hint_exit_3(llm_dsn, llm_conn):
    dbname = llm_conn.info.dbname
    proc = llm_db("schedule", dsn=llm_dsn)
    assert proc.returncode == 3
    assert_one_line_error(
        proc, "schedule", "LL010", "HINT:",
        f"cron.schedule_in_database('llm-reconciliation:{dbname}', '0 * * * *', "
        f"'CALL llm.run_reconciliation()', '{dbname}')", "--cron-dsn",
    )  # fmt: skip
    proc = llm_db("unschedule", dsn=llm_dsn)
    assert proc.returncode == 3
    assert_one_line_error(proc, "unschedule", "LL010")


def test_schedule_and_unschedule_in_the_pg_cron_database(llm_cron_dsn, cron_conn):
    """WF-PFM-LLM-004 hop 1 through the CLI, where pg_cron lives with llm."""
    proc = llm_db("schedule", "--schedule", "17 3 1 1 *", dsn=llm_cron_dsn)
    assert proc.returncode == 0, proc.stderr
    ((job_id, schedule, command, database),) = cron_jobs(cron_conn)
    assert (schedule, command, database) == ("17 3 1 1 *", "CALL llm.run_reconciliation()",
                                             cron_conn.info.dbname)  # fmt: skip
    assert f"(id {job_id})" in proc.stdout
    again = llm_db("schedule", "--schedule", "18 3 1 1 *", dsn=llm_cron_dsn)
    assert again.returncode == 0
    assert [j[:2] for j in cron_jobs(cron_conn)] == [(job_id, "18 3 1 1 *")]

    removed = llm_db("unschedule", dsn=llm_cron_dsn)
    assert (removed.returncode, removed.stdout.strip()) == (0, f"removed pg_cron job {CRON_JOB}")
    assert cron_jobs(cron_conn) == []
    nothing = llm_db("unschedule", dsn=llm_cron_dsn)
    assert (nothing.returncode, nothing.stdout.strip()) == (0, f"no pg_cron job {CRON_JOB}")


def test_schedule_with_cron_dsn_schedules_in_the_cron_database_for_this_one(
    llm_dsn, llm_conn, llm_cron_dsn, cron_conn
):
    """LL010's way out: --cron-dsn runs cron.schedule_in_database(..., <llm database>) in the
    pg_cron database, as job llm-reconciliation:<llm database>; idempotent;
    unschedule --cron-dsn removes that job only."""
    dbname = llm_conn.info.dbname
    job = f"{CRON_JOB}:{dbname}"
    proc = llm_db("schedule", "--cron-dsn", llm_cron_dsn, "--schedule", "17 3 1 1 *", dsn=llm_dsn)
    assert proc.returncode == 0, proc.stderr
    ((job_id, schedule, command, database),) = cron_jobs(cron_conn, job)
    assert (schedule, command, database) == ("17 3 1 1 *", "CALL llm.run_reconciliation()", dbname)
    assert f"in database {dbname}" in proc.stdout
    again = llm_db("schedule", "--cron-dsn", llm_cron_dsn, "--schedule", "17 3 1 1 *", dsn=llm_dsn)
    assert again.returncode == 0
    assert [j[0] for j in cron_jobs(cron_conn, job)] == [job_id]

    proc = llm_db("unschedule", "--cron-dsn", llm_cron_dsn, dsn=llm_dsn)
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"removed pg_cron job {job} for database {dbname}"
    assert cron_jobs(cron_conn, job) == []


def test_schedule_with_a_cron_dsn_without_pg_cron_exit_3(llm_dsn):
    proc = llm_db("schedule", "--cron-dsn", llm_dsn, dsn=llm_dsn)
    assert proc.returncode == 3
    assert_one_line_error(proc, "schedule", "pg_cron is not installed in the --cron-dsn database",
                          "cron.database_name")  # fmt: skip


# ---------------------------------------------------------------- notices deliver


@pytest.fixture
def webhook() -> Iterator[Receiver]:
    with Receiver(SECRET) as hook:
        hook.up()
        yield hook


def cross_80_percent(conn: psycopg.Connection, org_id: uuid.UUID) -> None:
    llm = Llm(conn)
    inv = llm.admit(org_id, 85, "gpt-x", now=T0)
    llm.settle(org_id, inv.id, 85, 3, now=T0)


def test_notices_deliver_posts_signed_notices_from_the_secret_env(llm_dsn, llm_conn, org, webhook):
    cross_80_percent(llm_conn, org)
    proc = llm_db("notices", "deliver", "--url", webhook.url, "--secret-env", SECRET_ENV,
                  "--now", iso(T0 + timedelta(minutes=1)), dsn=llm_dsn,
                  env={SECRET_ENV: SECRET})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "claimed 1, sent 1, failed 0"
    (got,) = webhook.received
    body, headers = got.body, got.headers
    assert verify_webhook(body, headers, SECRET)["data"]["threshold_pct"] == 80
    status = scalar(llm_conn, "SELECT status FROM llm.threshold_notices WHERE organization_id = %s",
                    [org])  # fmt: skip
    assert status == "sent"
    # nothing owed: a second run claims nothing and succeeds
    again = llm_db("notices", "deliver", "--url", webhook.url, "--secret-env", SECRET_ENV,
                   "--now", iso(T0 + timedelta(minutes=2)), "--json", dsn=llm_dsn,
                   env={SECRET_ENV: SECRET})  # fmt: skip
    assert again.returncode == 0
    assert json.loads(again.stdout) == {"claimed": 0, "sent": 0, "failed": 0, "last_error": None, "lost": 0}


def test_notices_deliver_to_a_failing_endpoint_keeps_them_owed_exit_1(
    llm_dsn, llm_conn, org, webhook
):
    webhook.status = 500
    cross_80_percent(llm_conn, org)
    proc = llm_db("notices", "deliver", "--url", webhook.url, "--secret-env", SECRET_ENV,
                  "--now", iso(T0 + timedelta(minutes=1)), dsn=llm_dsn,
                  env={SECRET_ENV: SECRET})  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith("claimed 1, sent 0, failed 1; last error: HTTP 500")
    notice = row(llm_conn, "SELECT status, last_error FROM llm.threshold_notices"
                           " WHERE organization_id = %s", [org])  # fmt: skip
    assert notice["status"] == "owed" and notice["last_error"].startswith("HTTP 500")


def test_notices_deliver_counts_a_claim_taken_again_lost_logs_it_and_exits_1(
    llm_dsn, llm_conn, org, webhook
):
    """While the run's POST is held by the receiver, its claim expires, the
    pass re-arms it and another deliverer claims it. The run's complete_notice then changes
    nothing: it counts the notice lost, logs it on stderr and exits 1; the other claim
    stands."""
    cross_80_percent(llm_conn, org)
    webhook.block.clear()  # the receiver holds its answer until the claim was taken again
    run = InThread(lambda: llm_db("notices", "deliver", "--url", webhook.url, "--secret-env", SECRET_ENV,
                                  "--now", iso(T0 + timedelta(minutes=1)), "--timeout", "60",
                                  dsn=llm_dsn, env={SECRET_ENV: SECRET}))  # fmt: skip
    try:
        webhook.wait_for(1, timeout=30)
        llm = Llm(llm_conn)
        assert llm.rearm_notices(now=T0 + timedelta(minutes=20)) == 1
        [taken] = llm.claim_notices(now=T0 + timedelta(minutes=20))
    finally:
        webhook.block.set()
    proc = run.result()
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.strip() == "claimed 1, sent 0, failed 0, lost 1"
    assert "claim lost" in proc.stderr and str(taken.id) in proc.stderr
    notice = row(llm_conn, "SELECT status, claim_token FROM llm.threshold_notices"
                           " WHERE organization_id = %s", [org])  # fmt: skip
    assert notice == {"status": "sending", "claim_token": taken.claim_token}


def test_notices_deliver_needs_the_secret_in_the_environment_exit_2(llm_dsn, webhook):
    proc = llm_db("notices", "deliver", "--url", webhook.url, "--secret-env", SECRET_ENV,
                  dsn=llm_dsn)  # fmt: skip
    assert proc.returncode == 2
    assert f"environment variable {SECRET_ENV} is not set" in proc.stderr
    assert webhook.received == []
    proc = llm_db("notices", "deliver", "--secret", SECRET, "--url", webhook.url, dsn=llm_dsn)
    assert proc.returncode == 2  # there is no option that takes the secret itself
    assert "No such option" in proc.stderr


@pytest.mark.parametrize("command", WEBHOOK_ARGS)
@pytest.mark.parametrize("secret", ["cli-test-secret", "whsec_???", f"{SECRET} old-plain-secret"])
def test_a_secret_without_whsec_makes_deliver_and_worker_exit_2_saying_how_to_make_one(
    llm_dsn, webhook, command, secret
):
    """Issue #13: a secret that is not whsec_<base64> (Standard Webhooks) is refused before
    anything is claimed or served, with the command that makes one."""
    proc = llm_db(*command.split(), "--url", webhook.url, "--secret-env", SECRET_ENV,
                  "--metrics-addr", "127.0.0.1:0", dsn=llm_dsn, env={SECRET_ENV: secret},
                  ) if command == "worker" else llm_db(
                  *command.split(), "--url", webhook.url, "--secret-env", SECRET_ENV,
                  dsn=llm_dsn, env={SECRET_ENV: secret})  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc, command, "whsec_", "llm-db notices new-secret")
    assert webhook.received == []


def test_notices_new_secret_prints_a_fresh_valid_secret():
    first, second = llm_db("notices", "new-secret"), llm_db("notices", "new-secret", "--bytes", "24")
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    made = [first.stdout.strip(), second.stdout.strip()]
    assert all(m.startswith("whsec_") for m in made) and made[0] != made[1]
    from llm_db.service.notices import parse_secrets

    assert parse_secrets(" ".join(made)) == made
    assert [len(base64.b64decode(m[6:])) for m in made] == [32, 24]
    import standardwebhooks

    standardwebhooks.Webhook(made[0])  # the reference library takes it


def test_notices_deliver_rejects_a_non_http_url_exit_2(llm_dsn):
    proc = llm_db("notices", "deliver", "--url", "file:///etc/passwd", "--secret-env", SECRET_ENV,
                  dsn=llm_dsn, env={SECRET_ENV: SECRET})  # fmt: skip
    assert proc.returncode == 2
    assert "is not an http(s) URL" in proc.stderr


# ---------------------------------------------------------------- report


def test_report_json_parses_and_holds_periods_daily_usage_holds_and_tasks(llm_dsn, llm_conn, org):
    llm = Llm(llm_conn)
    llm.declare_task_kind("cli.task")
    task = llm.open_execution(org, "cli.task", now=T0)
    inv = llm.admit(org, 20, "gpt-x", execution_id=task.execution_id, now=T0)
    llm.settle(org, inv.id, 15, 4, input_tokens=100, output_tokens=50, now=T0)
    llm.close_execution(org, task.execution_id, "completed", now=T0)
    strand_a_request(llm_conn, org, estimate=30)
    llm.rebuild_daily_usage(T0.date(), T0.date())

    proc = llm_db("report", "--json", "--now", iso(T0 + timedelta(hours=25)), "--days", "3",
                  dsn=llm_dsn)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["since"], report["until"]) == (str(T0.date() - timedelta(days=1)), str(T0.date() + timedelta(days=1)))
    (period,) = report["periods"]
    assert (period["name"], period["period_start"], period["allowance_credits"],
            period["used_credits"], period["held_credits"], period["used_cents"]) == (
        "CLI Org", str(JANUARY), 100, 15, 30, 4)  # fmt: skip
    (daily,) = report["daily_usage"]
    assert (daily["day"], daily["model"], daily["requests"], daily["credits"],
            daily["input_tokens"]) == (str(T0.date()), "gpt-x", 1, 15, 100)  # fmt: skip
    (holds,) = report["open_holds"]
    assert (holds["open_requests"], holds["held_credits"], holds["past_window"]) == (1, 30, 1)
    (tasks,) = report["tasks"]
    assert (tasks["status"], tasks["tasks"], tasks["requests"], tasks["credits"]) == (
        "completed", 1, 1, 15)  # fmt: skip


def test_report_text_has_a_section_each_and_org_filters(llm_dsn, llm_conn, org):
    other = uuid.uuid4()
    Llm(llm_conn).upsert_organization(other, "Other Org", None, now=T0)
    strand_a_request(llm_conn, org)
    strand_a_request(llm_conn, other)
    proc = llm_db("report", "--now", iso(T0), dsn=llm_dsn)
    assert proc.returncode == 0, proc.stderr
    for section in ("Period usage", "Daily usage", "Open holds", "Tasks by status"):
        assert f"\n{section}" in proc.stdout
    assert "CLI Org" in proc.stdout and "Other Org" in proc.stdout
    only = llm_db("report", "--org", str(org), "--now", iso(T0), "--json", dsn=llm_dsn)
    assert {p["name"] for p in json.loads(only.stdout)["periods"]} == {"CLI Org"}


def test_report_by_end_user_adds_its_two_sections_and_refuses_another_scope(llm_dsn, llm_conn, org):
    """`llm-db report --by end_user` adds the usage per end user and the budgets near
    their limit (text and JSON); --by takes project, api_key or end_user only (exit 2)."""
    llm = Llm(llm_conn)
    llm.set_budget(org, "end_user", "*", "day", 10, now=T0)
    inv = llm.admit(org, 9, "gpt-x", end_user="user-7", now=T0)
    llm.settle(org, inv.id, 9, 1, now=T0)
    text = llm_db("report", "--by", "end_user", "--now", iso(T0), dsn=llm_dsn)
    assert text.returncode == 0, text.stderr
    assert "\nUsage by end_user" in text.stdout and "\nBudgets near their limit" in text.stdout
    assert "user-7" in text.stdout and "90%" in text.stdout
    report = json.loads(llm_db("report", "--by", "end_user", "--now", iso(T0), "--json",
                               dsn=llm_dsn).stdout)  # fmt: skip
    assert report["by"] == "end_user"
    assert [(r["scope_id"], r["used_credits"]) for r in report["by_usage"]] == [("user-7", 9)]
    assert [(r["scope_id"], r["limit_credits"]) for r in report["budgets_near_limit"]] == [
        ("user-7", 10)]  # fmt: skip
    wrong = llm_db("report", "--by", "model", dsn=llm_dsn)
    assert wrong.returncode == 2 and "--by" in wrong.stderr


def test_report_on_an_empty_database(llm_dsn):
    proc = llm_db("report", dsn=llm_dsn)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("(none)") == 5
    # an empty daily usage says why: the pass rebuilds it, the periods are live
    assert "Daily usage is rebuilt by the hourly pass" in proc.stdout


# ---------------------------------------------------------------- metrics


COUNTERS = {"llm_recovered_requests", "llm_recovered_uncharged_requests", "llm_past_window_alerts",
            "llm_notice_deliveries", "llm_admission_refusals"}  # fmt: skip
OPERATIONAL = (("organization_status", "operational"),)


def parse_metrics(text: str) -> dict[tuple[str, tuple], float]:
    samples = {}
    for family in text_string_to_metric_families(text):
        assert family.type == ("counter" if family.name in COUNTERS else "gauge"), family.name
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_metrics_parse_and_show_stale_requests_then_the_pass(llm_dsn, llm_conn, org):
    strand_a_request(llm_conn, org, estimate=30)
    later = T0 + timedelta(hours=25)
    before = llm_db("metrics", "--now", iso(later), dsn=llm_dsn)
    assert before.returncode == 0, before.stderr
    m = parse_metrics(before.stdout)
    assert m[("llm_reconciliation_health", (("status", "never"),))] == 1
    assert m[("llm_reconciliation_health", (("status", "ok"),))] == 0
    assert m[("llm_stale_open_requests", OPERATIONAL)] == 1
    assert m[("llm_stale_open_hold_credits", OPERATIONAL)] == 30
    assert m[("llm_stale_open_requests", (("organization_status", "suspended"),))] == 0
    assert m[("llm_recovered_requests_total", ())] == 0
    assert m[("llm_up", ())] == 1
    # no pass yet: the run series are present, at their documented 0
    assert m[("llm_reconciliation_last_run_age_seconds", ())] == 0
    assert m[("llm_reconciliation_last_run_timestamp_seconds", ())] == 0
    assert m[("llm_reconciliation_last_success_timestamp_seconds", ())] == 0
    assert m[("llm_reconciliation_last_run_requests_recovered", ())] == 0
    assert [m[("llm_reconciliation_last_run_status", (("status", s),))]
            for s in ("succeeded", "partial", "failed")] == [0, 0, 0]  # fmt: skip

    assert llm_db("reconcile", "--now", iso(later), dsn=llm_dsn).returncode == 0
    after = parse_metrics(
        llm_db("metrics", "--now", iso(later + timedelta(minutes=10)), dsn=llm_dsn).stdout
    )
    assert after[("llm_reconciliation_health", (("status", "ok"),))] == 1
    assert after[("llm_stale_open_requests", OPERATIONAL)] == 0
    assert after[("llm_recovered_requests_total", ())] == 1
    assert after[("llm_past_window_alerts_total", ())] == 1
    assert after[("llm_open_requests", ())] == 0
    assert after[("llm_reconciliation_last_run_requests_recovered", ())] == 1
    assert after[("llm_reconciliation_last_run_released_hold_credits", ())] == 30
    assert after[("llm_reconciliation_last_run_status", (("status", "succeeded"),))] == 1
    assert 590 < after[("llm_reconciliation_last_run_age_seconds", ())] <= 600  # minus its duration
    assert after[("llm_notices", (("status", "owed"),))] == 0


def test_metrics_count_direct_sweeps_and_split_stale_holds_by_organization_status(
    llm_dsn, llm_conn, org
):
    """BR-CAP-PFM-LLM-009-07: recoveries and past-window alerts of a direct
    ``llm-db reconcile --org`` (reconcile_org) are counted like the pass's; a suspended
    organization's stale holds, which no pass recovers, show under their own label."""
    llm = Llm(llm_conn)
    strand_a_request(llm_conn, org, estimate=30)
    paused = uuid.uuid4()
    llm.upsert_organization(paused, "paused", 100, now=T0)
    strand_a_request(llm_conn, paused, estimate=12)
    llm.upsert_organization(paused, "paused", 100, status="suspended", now=T0)
    later = T0 + timedelta(hours=25)

    swept = llm_db("reconcile", "--org", str(org), "--now", iso(later), dsn=llm_dsn)
    assert swept.returncode == 0, swept.stderr
    m = parse_metrics(llm_db("metrics", "--now", iso(later), dsn=llm_dsn).stdout)

    assert m[("llm_recovered_requests_total", ())] == 1
    assert m[("llm_past_window_alerts_total", ())] == 1
    assert m[("llm_recovered_uncharged_requests_total", ())] == 0
    assert m[("llm_stale_open_requests", OPERATIONAL)] == 0
    assert m[("llm_stale_open_requests", (("organization_status", "suspended"),))] == 1
    assert m[("llm_stale_open_hold_credits", (("organization_status", "suspended"),))] == 12
    assert m[("llm_period_findings", ())] == 0


def test_metrics_output_with_the_database_down_writes_llm_up_0_and_exits_4(tmp_path):
    """Issue #13: a failed scrape must not leave the last good file saying all is well: --output
    is replaced by llm_up 0 (and the scrape's duration), and the exit code is 4."""
    target = tmp_path / "llm.prom"
    target.write_text('llm_up 1\nllm_reconciliation_health{status="ok"} 1\n')  # a stale "ok"
    proc = llm_db("metrics", "--output", str(target),
                  "--dsn", "host=127.0.0.1 port=1 dbname=nowhere connect_timeout=3")  # fmt: skip
    assert proc.returncode == 4
    assert_one_line_error(proc, "metrics", "cannot connect")
    samples = parse_metrics(target.read_text())
    assert samples[("llm_up", ())] == 0
    assert samples[("llm_scrape_duration_seconds", ())] >= 0
    assert not any(name.startswith("llm_reconciliation") for name, _ in samples)
    assert [p.name for p in tmp_path.iterdir()] == ["llm.prom"]
    # on stdout too, for a sidecar that pipes it
    piped = llm_db("metrics", "--dsn", "host=127.0.0.1 port=1 dbname=nowhere connect_timeout=3")
    assert piped.returncode == 4
    stdout = parse_metrics(piped.stdout)
    assert set(stdout) == {("llm_up", ()), ("llm_scrape_duration_seconds", ())}
    assert stdout[("llm_up", ())] == 0


def test_metrics_output_file_is_written_whole(llm_dsn, tmp_path):
    target = tmp_path / "llm.prom"
    proc = llm_db("metrics", "--output", str(target), dsn=llm_dsn)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    samples = parse_metrics(target.read_text())
    assert samples[("llm_reconciliation_health", (("status", "never"),))] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["llm.prom"]  # no temporary file left


# ---------------------------------------------------------------- distribute


def test_distribute_without_citus_is_ll011_exit_3(llm_dsn):
    proc = llm_db("distribute", dsn=llm_dsn)
    assert proc.returncode == 3
    assert_one_line_error(proc, "distribute", "LL011", "citus is not installed", "HINT:")
