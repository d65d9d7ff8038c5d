"""The operator's reads keep their output: ``llm-db report`` (text,
JSON, ``--by``, ``--org``) and the ``llm-db metrics`` exposition of one known set of books,
built with a fixed clock, equal the golden files in tests/golden/, captured from 0.2.0
before the reads moved into SQL (sql/81_report.sql, sql/82_books.sql). So do the demo's
text (``llm-db demo --dsn``) and the lines ``llm-db reconcile --progress`` draws on a
terminal, also rendered from those reads. A change of a read's SQL that changes what an
operator sees fails here.

To see a diff: ``LLM_DB_GOLDEN_DIFF=1`` prints the new output under the assertion.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import psycopg
import pytest

from llm_db import demo
from llm_db.cli.report import build_report, render_report, report_json
from llm_db.client import Llm
from llm_db.service.metrics import exposition
from tests.helpers import (
    DAY,
    HOUR,
    T0,
    admit,
    call,
    call_pass,
    close_task,
    fail,
    invariants,
    lock_period_rows,
    new_org,
    open_task,
    set_budget,
    settle,
    wait_for,
)

GOLDEN = Path(__file__).parent / "golden"
ORG_A = uuid.UUID("00000000-0000-4000-8000-00000000000a")
ORG_B = uuid.UUID("00000000-0000-4000-8000-00000000000b")
ORG_C = uuid.UUID("00000000-0000-4000-8000-00000000000c")

# Figures of the exposition that follow the wall clock (how long the pass and the
# scrape took, and so the pass's finish and age): their value is masked.
WALL_CLOCK = re.compile(
    r"^(llm_scrape_duration_seconds|llm_reconciliation_last_run_duration_seconds"
    r"|llm_reconciliation_last_run_age_seconds|llm_reconciliation_last_run_timestamp_seconds"
    r"|llm_reconciliation_last_success_timestamp_seconds) \S+$",
    re.MULTILINE,
)


def spend(
    conn: psycopg.Connection,
    org: uuid.UUID,
    credits: int,
    at,
    model: str = "model-a",
    **scopes: str,
) -> None:
    inv = admit(conn, org, credits, model, now=at - HOUR, **scopes)["id"]
    assert settle(conn, org, inv, credits, credits // 10, input_tokens=credits,
                  output_tokens=credits // 2, now=at) == "settled"  # fmt: skip


@pytest.fixture
def books(llm_conn: psycopg.Connection) -> psycopg.Connection:
    """Three organizations over four days: settled, failed and open requests (one left
    past the recovery window by a suspended organization), a pass that recovered one,
    tasks running and done, an owed notice, a budget near its limit, daily usage rebuilt."""
    new_org(llm_conn, 10_000, org_id=ORG_A, name="A org", now=T0 - 5 * DAY)
    new_org(llm_conn, None, org_id=ORG_B, name="B org", now=T0 - 5 * DAY)
    new_org(llm_conn, 500, org_id=ORG_C, name="C org", now=T0 - 5 * DAY)
    set_budget(llm_conn, ORG_A, "end_user", "*", "day", 100, thresholds=[50, 100], now=T0 - 5 * DAY)

    admit(llm_conn, ORG_A, 40, now=T0 - 4 * DAY)  # the pass recovers it
    admit(llm_conn, ORG_C, 70, "model-b", now=T0 - 4 * DAY)  # no pass visits C: stale
    new_org(llm_conn, 500, org_id=ORG_C, name="C org", status="suspended", now=T0 - 4 * DAY)
    spend(llm_conn, ORG_A, 8_000, T0 - 2 * DAY)  # 80 %: a notice owed
    spend(llm_conn, ORG_B, 120, T0 - 2 * DAY, "model-b", project="p1")
    done = open_task(llm_conn, ORG_A, now=T0 - 2 * DAY)
    close_task(llm_conn, ORG_A, done, now=T0 - 2 * DAY + HOUR)
    call_pass(llm_conn, T0 - DAY)

    spend(llm_conn, ORG_A, 30, T0 - DAY, end_user="u1")
    spend(llm_conn, ORG_A, 45, T0, end_user="u1")  # 45 of 100: under the 50 % alone
    admit(llm_conn, ORG_A, 25, now=T0, end_user="u1")  # held: 70 %, past it
    spend(llm_conn, ORG_A, 10, T0, "model-b", end_user="u2", project="p1")
    spend(llm_conn, ORG_B, 7, T0, project="p2")
    inv = admit(llm_conn, ORG_B, 9, now=T0 - HOUR)["id"]
    assert fail(llm_conn, ORG_B, inv, "timeout", now=T0) == "failed"
    open_task(llm_conn, ORG_B, now=T0 - HOUR)
    # priced by the book: 1,234 input and 567 output tokens at 0.15 and 0.60 a million
    call(llm_conn, "set_price", "model-p", {"input": "0.15", "output": "0.60"}, effective_from=T0 - 5 * DAY)
    call(llm_conn, "set_credit_rate", 1000, effective_from=T0 - 5 * DAY)
    priced = call(llm_conn, "admit", ORG_B, None, "model-p", input_tokens=2000, max_output_tokens=1000,
                  now=T0 - HOUR)[0]["id"]
    assert call(llm_conn, "settle_usage", ORG_B, priced, {"input": 1234, "output": 567}, now=T0)[0]["value"] == "settled"
    call(llm_conn, "rebuild_daily_usage", (T0 - 5 * DAY).date(), T0.date())
    assert invariants(llm_conn) == []
    return llm_conn


def outputs(conn: psycopg.Connection) -> dict[str, str]:
    """Every read's output, by the name of its golden file."""
    at = T0 + HOUR

    def as_json(report) -> str:  # as ``llm-db report --json`` prints it
        return json.dumps(report_json(report), sort_keys=True, indent=1) + "\n"

    metrics = exposition(conn, now=at + HOUR).decode()
    return {
        "report.txt": render_report(build_report(conn, days=3, now=at)) + "\n",
        "report.json": as_json(build_report(conn, days=3, now=at)),
        "report_org_a_31.json": as_json(build_report(conn, days=31, organization_id=ORG_A, now=at)),
        "report_by_end_user.txt": render_report(build_report(conn, days=2, now=at, by="end_user"))
        + "\n",
        "report_by_project.json": as_json(build_report(conn, days=5, now=at, by="project")),
        "metrics.prom": WALL_CLOCK.sub(r"\1 <wall clock>", metrics),
    }


def test_report_and_metrics_outputs_are_the_golden_ones(books, llm_role_conn):
    """Read as llm_reader (who runs ``llm-db report`` and ``metrics``), the
    report in every form and the exposition are unchanged, byte for byte but the figures that
    follow the wall clock."""
    found = outputs(llm_role_conn("llm_reader"))
    for name, text in found.items():
        if os.environ.get("LLM_DB_WRITE_GOLDEN") == "1":  # a meant change: write, review the diff
            (GOLDEN / name).write_text(text)
        expected = (GOLDEN / name).read_text()
        assert text == expected, name + (f"\n{text}" if _show_diff() else "")


def _show_diff() -> bool:
    return os.environ.get("LLM_DB_GOLDEN_DIFF") == "1"


# ---------------------------------------------------------------- the reads themselves

# Each read of sql/81_report.sql and sql/82_books.sql (llm.sweep_summary is a view),
# with arguments that pass on the books above.
READS = {
    "report_periods": ((T0 - DAY).date(), T0.date()),
    "report_daily_usage": ((T0 - DAY).date(), T0.date()),
    "report_costs": ((T0 - DAY).date(), T0.date()),
    "report_open_holds": (),
    "report_tasks": ((T0 - DAY).date(),),
    "report_scope_usage": ("end_user", (T0 - DAY).date(), T0.date()),
    "report_budgets_near_limit": (),
    "books_snapshot": (),
    "stale_by_organization_status": (),
    "books_history": ([ORG_A],),
    "organization_totals": ([ORG_A],),
    "last_run": (),
    "pass_progress": (T0,),
    "metrics": (),
}


def test_the_reads_are_every_public_read_and_run_as_llm_reader_and_llm_operator(
    books, llm_role_conn
):
    """docs/contract.md "Roles and grants": the monitoring and reporting roles
    run every read; llm_app, the application's role, runs none (42501)."""
    granted = {
        r[0]
        for r in books.execute(
            "SELECT p.proname FROM pg_catalog.pg_proc AS p"
            " WHERE p.pronamespace = 'llm'::regnamespace"
            " AND has_function_privilege('llm_reader', p.oid, 'EXECUTE')"
        )
    }
    assert granted == {*READS, "reconciliation_health"}
    for role in ("llm_reader", "llm_operator"):
        conn = llm_role_conn(role)
        for name, args in READS.items():
            call(conn, name, *args)
    app = llm_role_conn("llm_app")
    for name, args in READS.items():
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            call(app, name, *args)
        app.rollback()


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("report_scope_usage", ("model", T0.date(), T0.date())),  # not a scope of a request
        ("report_scope_usage", (None, T0.date(), T0.date())),
        ("report_periods", (T0.date(), (T0 - DAY).date())),  # days out of order
        ("report_daily_usage", (None, T0.date())),
        ("report_costs", (T0.date(), (T0 - DAY).date())),
        ("report_tasks", (None,)),
    ],
)
def test_a_read_refuses_a_bad_argument_with_22023(llm_conn, name, args):
    """A read's scope and days are checked as the other calls' are."""
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        call(llm_conn, name, *args)


def test_the_books_reads_on_known_books(books):
    """The reads the demo and `reconcile --progress` use, on the books above:
    each organization's allowance, period sums and notices; what passes did to them; the
    operational organizations a pass visits (C is suspended) and none visited while no pass
    runs; the last pass, its age on its own clock; the stale open request of the suspended
    organization only."""
    totals = call(books, "organization_totals", [ORG_C, ORG_B, ORG_A])
    assert [(r["name"], r["status"], r["allowance_credits"], r["used_credits"], r["held_credits"],
             r["used_cents"], r["notices"]) for r in totals] == [
        ("A org", "operational", 10_000, 8_125, 25, 808, 1),
        ("B org", "operational", None, 127 + 526, 0, 12, 0),
        ("C org", "suspended", 500, 0, 70, 0, 0),
    ]  # fmt: skip
    history = call(books, "books_history", [ORG_A, ORG_B, ORG_C])[0]
    assert history == {
        "recovered_requests": 1,
        "past_window_alerts": 1,
        "abandoned_tasks": 0,
        "notices_sent": 0,
    }
    assert call(books, "books_history", [ORG_B])[0]["recovered_requests"] == 0
    assert call(books, "pass_progress", T0 - 2 * DAY)[0] == {
        "organizations": 2,
        "orgs_visited": None,
    }
    stale = {r["organization_status"]: (r["stale_open_requests"], r["stale_held_credits"])
             for r in call(books, "stale_by_organization_status", now=T0)}  # fmt: skip
    assert stale == {"operational": (0, 0), "suspended": (1, 70), "closed": (0, 0)}
    run = Llm(books).last_run(now=T0)
    assert (run.status, run.orgs_visited, run.requests_recovered, run.clock) == (
        "succeeded",
        2,
        1,
        T0 - DAY,
    )
    assert run.duration_seconds >= 0
    assert run.age_seconds == pytest.approx(DAY.total_seconds() - run.duration_seconds, abs=1e-6)
    # T0 - 4 days + 24 h: the suspended organization's request just entered the window
    assert call(books, "books_snapshot", now=T0 - 3 * DAY - HOUR)[0]["stale_open_requests"] == 0


def test_before_the_first_pass_last_run_is_no_row_and_metrics_says_0(llm_conn):
    """docs/monitoring.md: no pass yet is no run row, and every series of the
    pass in llm.metrics() is present at 0 but the health's never."""
    assert call(llm_conn, "last_run", now=T0) == []
    series = {
        (r["metric"], json.dumps(r["labels"])): r["value"]
        for r in call(llm_conn, "metrics", now=T0)
    }
    pass_series = {k: v for k, v in series.items() if k[0].startswith("llm_reconciliation_")}
    assert len(pass_series) == 4 + 1 + 3 + 1 + 15
    assert {k for k, v in pass_series.items() if v != 0} == {
        ("llm_reconciliation_health", '{"status": "never"}')
    }


# ---------------------------------------------------------------- the demo, the progress bar

# What follows the wall clock or the machine, masked in the texts below: durations, ids
# (fresh at every run), the clone's database name.
DURATION = re.compile(r"\b\d+(?:\.\d+)? s\b")
AN_ID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
DATABASE = re.compile(r"^(  database +)\S+", re.MULTILINE)
# The pass of the demo runs at this clock instead of the real time to the second, so the
# day of traffic, its UTC days and months, and what the budgets refuse are the same at
# every run.
DEMO_PASS_CLOCK = "SELECT timestamptz '2026-03-12 10:00:00+00' AS now"


def masked(text: str) -> str:
    text = DATABASE.sub(r"\1<database>", text)
    return AN_ID.sub("<id>", DURATION.sub("<n> s", text))


def assert_golden(name: str, text: str) -> None:
    if os.environ.get("LLM_DB_WRITE_GOLDEN") == "1":  # a meant change: write, review the diff
        (GOLDEN / name).write_text(text)
    expected = (GOLDEN / name).read_text()
    assert text == expected, name + (f"\n{text}" if _show_diff() else "")


def demo_text(dsn: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """What ``llm-db demo --dsn DSN --seed 3 --workers 1`` prints, with the pass's clock
    fixed; one worker thread, so the order of the requests is the seed's alone."""
    monkeypatch.setattr(demo, "PASS_CLOCK", DEMO_PASS_CLOCK)
    lines: list[str] = []
    demo.run_demo(dsn=dsn, seed=3, workers=1, out=lines.append)
    return masked("\n".join(lines) + "\n")


def test_the_demo_prints_the_golden_text(llm_dsn, monkeypatch):
    """The demo's story (its traffic table, the books before and after
    the pass, each organization's books, Globex's budgets), rendered from the reads of
    sql/82_books.sql, is unchanged, but for durations, ids and the database's name."""
    assert_golden("demo_seed3.txt", demo_text(llm_dsn, monkeypatch))


ORGS = [uuid.UUID(f"00000000-0000-4000-8000-00000000001{n}") for n in range(5)]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
ETA = re.compile(r"  \d\d:\d\d:\d\d$")  # the bar's estimate of the time left, once it has one
BAR = "organizations  ["


def terminal_lines(output: bytes) -> list[str]:
    """What a terminal showed, line by line: the bar redraws its line after each carriage
    return; colours and cursor codes and the time estimate are dropped."""
    text = ANSI.sub("", output.decode())
    lines = (ETA.sub("", line.rstrip()) for line in re.split(r"\r\n|\r|\n", text))
    return [line for line in lines if line]


def progress_text(output: bytes, released_at: int) -> str:
    """The bar when the pass started, when it was let go (the frame drawn last before
    ``released_at``: click draws each frame after a carriage return, and draws none while
    nothing moves) and when it ended, then the lines printed after it. While the pass runs
    freely the bar shows wherever a poll caught it, so only those three are the same at
    every run."""
    held = output.rindex(b"\r", 0, released_at)
    before, after = terminal_lines(output[:held]), terminal_lines(output[held:])
    started = [line for line in before if line.startswith(BAR)][0]
    drawn = [line for line in after if line.startswith(BAR)]  # from the held frame on
    printed = [line for line in before + after if not line.startswith(BAR)]
    return masked("\n".join([started, drawn[0], drawn[-1], *printed]) + "\n")


def reconcile_on_a_terminal(dsn: str, conn: psycopg.Connection, connect, env=None) -> str:
    """``llm-db reconcile --progress`` under a pseudo-terminal, the pass held at the third
    of five organizations (their period rows locked) until the bar has drawn it."""
    conn.execute("UPDATE llm.settings SET org_lock_timeout = '60s'")
    blocker = connect(autocommit=False)
    lock_period_rows(blocker, ORGS[2])
    leader, follower = pty.openpty()
    command = [sys.executable, "-m", "llm_db.cli", "reconcile", "--progress"]
    proc = subprocess.Popen(
        [*command, "--now", (T0 + 25 * HOUR).isoformat()],
        stdout=follower, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "DATABASE_URL": dsn, **(env or {})},
    )  # fmt: skip
    os.close(follower)
    output = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the process closed the terminal
                return
            if not chunk:
                return
            output.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(lambda: b"40%" in output, "the bar at 2 of 5 organizations", timeout=30)
        released_at = len(output)
    finally:
        blocker.rollback()
        _, errors = proc.communicate(timeout=60)
        reader.join(10)
        os.close(leader)
    assert proc.returncode == 0, errors
    return progress_text(bytes(output), released_at)


def test_reconcile_progress_draws_the_golden_lines(llm_dsn, llm_conn, llm_connect):
    """On a terminal, ``llm-db reconcile --progress`` draws its bar from
    llm.pass_progress (sql/82_books.sql): empty, then 2 of 5 organizations while the pass
    waits on the third, then full; and prints the pass's figures. Unchanged, but for the
    time estimate, the duration and the run's id."""
    for org in ORGS:
        new_org(llm_conn, None, org_id=org, name=f"P{org.int % 16}", now=T0)
        admit(llm_conn, org, 10, now=T0)
    assert_golden("reconcile_progress.txt", reconcile_on_a_terminal(llm_dsn, llm_conn, llm_connect))
