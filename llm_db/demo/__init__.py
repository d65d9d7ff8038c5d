"""``llm-db demo``: the main job, end to end, in a few seconds.

1. Start a throw-away PostgreSQL 15 with pg_cron (``llm_db.testing._server``), or use
   the database given with ``--dsn``; install llm-db; create three
   organizations (a small allowance so threshold notices fire, an unlimited
   one, a suspended one) and two task kinds; give the unlimited one a project
   budget and a default budget for every end user of its app.
2. Send a day of traffic through the Python driver from worker threads, each
   with its own seeded random plan: single requests and tasks
   (``with_llm_execution``); some requests fail at the provider; some workers
   "crash" right after dispatching a request (they close their connection and
   never settle it); one worker dies inside a task, which stays running; some
   of Globex's requests are refused by its budgets (LL001 naming them). Then
   one fault is injected behind the functions' back: a superuser UPDATE of a
   closed task's credits.
3. Move the clock 25 hours past the end of that day (past the 24 h recovery
   window), run the hourly pass and show the books before and after, side by
   side: stranded holds released, requests recovered, past-window alerts,
   tasks abandoned, drift found, notices owed, health, invariant violations;
   then each organization's books and Globex's budgets.
4. Deliver the owed threshold notices to a local webhook (throw-away server
   only) and end with ``check_invariants()``.

The clock: the pass runs at the real time (``now()``, to the second), and the
simulated day is the 24 hours that ended 25 hours before it. So on a real
database (``--dsn``) the one pass the demo runs is exactly what the hourly job
would do at that moment; the demo's organizations have fresh ids there.

``run_demo`` returns every figure it printed as a dict (``llm-db demo --json``
prints it, one JSON document and nothing else). The seed fixes each worker's plan;
with one worker (``--workers 1``) it fixes the whole run, every figure but
durations and ids (tests/golden/demo_seed3.txt). With several, the order in which
their requests reach the database varies between runs, and with it which of them
the small allowance refuses and so the figures that follow. The traffic of step 2 (the cast, the seeded plan, the
worker threads) is ``llm_db.demo._traffic``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from llm_db import queries
from llm_db._text import format_table, jsonable, money
from llm_db.client import Llm
from llm_db.demo._traffic import (
    BUDGETS,
    DAY,
    NANOS_PER_CREDIT,
    PRICES,
    TASK_KINDS,
    DemoOrg,
    Tally,
    _organizations,
    _run_workers,
    plan_traffic,
)

__all__ = ["DemoError", "run_demo"]

Out = Callable[[str], Any]

RECOVERY_SHIFT = timedelta(hours=25)  # how far past the end of the day the pass runs
DRIFT_CREDITS = 250  # what the injected fault adds to a closed task
# the demo's own Standard Webhooks secret (base64 of 32 fixed bytes): a throw-away
# receiver on 127.0.0.1, never a real one; make real ones with `llm-db notices new-secret`
WEBHOOK_SECRET = "whsec_bGxtLWRiIGRlbW8gd2ViaG9vaywgbm90IGEgc2VjcmV0IQ=="


class DemoError(RuntimeError):
    """The demo cannot run (e.g. llm-db is not installed in the --dsn database)."""


# ----------------------------------------------------------- the demo's own SQL

PASS_CLOCK = "SELECT pg_catalog.date_trunc('second', pg_catalog.now()) AS now"

# a closed task with some requests, for the injected fault
PICK_CLOSED_TASK = """
SELECT x.organization_id, x.id
  FROM llm.executions AS x
 WHERE x.organization_id = ANY (%(organization_ids)s::uuid[])
   AND x.status = 'completed' AND x.request_count > 0
 ORDER BY x.started_at, x.id
 LIMIT 1
"""

# The demo's budgets as they stand: a project's counters one by one, and the end users
# under the scope's '*' budget summed per window start (how many counted, how many
# reached the first threshold, 80 %, of the limit). llm.budget_usage pairs each
# counter with the budget in force (NULL limit: none).
BUDGET_TOTALS = """
SELECT u.scope, CASE WHEN u.budget_scope_id = '*' THEN '*' ELSE u.scope_id END AS scope_id,
       u.budget_window, u.window_start, u.limit_credits,
       count(*) AS ids,
       sum(u.used_credits)::bigint AS used_credits,
       max(u.used_credits) AS most_used,
       count(*) FILTER (WHERE (u.used_credits + u.held_credits)::numeric * 100
                              >= u.limit_credits::numeric * u.thresholds[1]) AS near_limit
  FROM llm.budget_usage AS u
 WHERE u.organization_id = %(organization_id)s::uuid AND u.limit_credits IS NOT NULL
 GROUP BY 1, 2, 3, 4, 5
 ORDER BY 1 DESC, 2, 3, 4
"""

# The injected fault: an edit behind the functions' back (only a table owner can).
INJECT_DRIFT = """
UPDATE llm.executions AS x
   SET credits = x.credits + %(credits)s::bigint
 WHERE x.organization_id = %(organization_id)s::uuid AND x.id = %(execution_id)s::uuid
"""


# ----------------------------------------------------------- the webhook


@dataclasses.dataclass
class _Inbox:
    received: int = 0
    verified: int = 0


@contextlib.contextmanager
def _webhook() -> Iterator[tuple[str, _Inbox]]:
    """A local webhook receiver that verifies each notice as Standard Webhooks, with the
    reference library, as a real receiver would."""
    import standardwebhooks

    receiver = standardwebhooks.Webhook(WEBHOOK_SECRET)
    inbox = _Inbox()
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                receiver.verify(body, dict(self.headers.items()))
                ok = True
            except standardwebhooks.WebhookVerificationError:
                ok = False
            with lock:
                inbox.received += 1
                inbox.verified += ok
            self.send_response(204 if ok else 401)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="llm-db demo webhook", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/llm-notices", inbox
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


# ----------------------------------------------------------- the run


@contextlib.contextmanager
def _signals_as_interrupt() -> Iterator[None]:
    """Ctrl-C and SIGTERM unwind as KeyboardInterrupt, so the throw-away server is
    stopped. A signal that lands while a finalizer (``__del__``) runs has its exception
    swallowed by Python and the demo would finish as if never interrupted, so a signal
    received is raised again once the body is done; Python's report of the swallowed one
    ("Exception ignored in ... Traceback") is not printed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def _raise(signum: int, frame: Any) -> None:
        received.append(signum)
        raise KeyboardInterrupt(f"signal {signum}")

    def _quiet(unraisable: Any) -> None:
        if not (received and isinstance(unraisable.exc_value, KeyboardInterrupt)):
            report(unraisable)

    report = sys.unraisablehook
    previous = {s: signal.signal(s, _raise) for s in (signal.SIGINT, signal.SIGTERM)}
    sys.unraisablehook = _quiet
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sys.unraisablehook = report
    if received:
        raise KeyboardInterrupt(f"signal {received[0]}")


def run_demo(
    *, dsn: str | None = None, seed: int = 7, workers: int = 6, out: Out = print
) -> dict[str, Any]:
    """Run the demo (see the module doc), printing through ``out``; returns its figures.

    Without ``dsn`` a throw-away server is started and always stopped, also on
    Ctrl-C or SIGTERM. With ``dsn`` that database is used; it must be migrated.
    """
    started = time.monotonic()
    out(f"llm-db demo - seed {seed}, {workers} worker threads")
    out("")
    with _signals_as_interrupt():
        if dsn is not None:
            result = _demo(dsn, seed, workers, out, embedded=None)
        else:
            result = _embedded(seed, workers, out)
    result["elapsed_seconds"] = round(time.monotonic() - started, 2)
    out("")
    tail = "; the server is stopped, nothing is left running" if dsn is None else ""
    out(f"Done in {result['elapsed_seconds']:.1f} s{tail}.")
    out("Next: docs/integration.md, `llm-db --help`, or `llm-db demo --dsn <your database>`.")
    return result


def _embedded(seed: int, workers: int, out: Out) -> dict[str, Any]:
    from llm_db.migrate import migrate
    from llm_db.testing._server import EphemeralServer

    t0 = time.monotonic()
    server = EphemeralServer()
    try:
        server.start()
        out(_kv("PostgreSQL 15 + pg_cron", f"started in {time.monotonic() - t0:.1f} s "
                f"(throw-away, port {server.port}, {server.base_dir})"))  # fmt: skip
        t1 = time.monotonic()
        dsn = server.create_database("llm_demo")
        report = migrate(dsn)
        applied = ", ".join(report.applied_migrations) or "none new"
        out(_kv("llm schema", f"migrated in {time.monotonic() - t1:.1f} s "
                f"(migrations: {applied}; {len(report.sql_files)} sql files)"))  # fmt: skip
        embedded = {"port": server.port, "base_dir": server.base_dir}
        return _demo(dsn, seed, workers, out, embedded=embedded)
    finally:
        server.stop()


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def _kv(label: str, text: str) -> str:
    return f"  {label:<26} {text}"


def _demo(
    dsn: str, seed: int, workers: int, out: Out, *, embedded: dict[str, Any] | None
) -> dict[str, Any]:
    # Long on purpose: the demo is a script told in numbered steps (the day of traffic,
    # the pass 25 hours later, the books afterwards) on one connection; it reads top to
    # bottom as the story it prints, and its steps share the figures they compare.
    # prepare_threshold=None: the demo also runs through PgBouncer's transaction pooling
    with psycopg.connect(
        dsn, autocommit=True, prepare_threshold=None, application_name="llm-db demo"
    ) as conn:
        installed, dbname = conn.execute(queries.LLM_INSTALLED).fetchone()
        if not installed:
            raise DemoError(
                f"llm-db is not installed in database {dbname}: run `llm-db migrate --dsn ...` "
                "first, or run `llm-db demo` without --dsn for a throw-away server"
            )
        if embedded is None:
            out(_kv("database", f"{dbname} (given with --dsn; demo organizations get fresh ids)"))
        llm = Llm(conn)
        pass_clock: datetime = conn.execute(PASS_CLOCK).fetchone()[0]
        day_end = pass_clock - RECOVERY_SHIFT
        day_start = day_end - DAY

        orgs = _organizations()
        by_key = {o.key: o for o in orgs}
        ids = [o.id for o in orgs]
        for o in orgs:
            llm.upsert_organization(o.id, o.name, o.allowance, status=o.status, now=day_start)
        for key, description in TASK_KINDS.items():
            llm.declare_task_kind(key, description)
        for scope, scope_id, window, limit in BUDGETS:
            llm.set_budget(by_key["globex"].id, scope, scope_id, window, limit, now=day_start)
        # the price book: each organization's own versions, from the day's start
        for o in orgs:
            for model, rates in PRICES.items():
                llm.set_price(model, rates, effective_from=day_start, organization_id=o.id)
            llm.set_credit_rate(NANOS_PER_CREDIT, organization_id=o.id, effective_from=day_start)
        names = max(len(o.name) for o in orgs)
        for n, o in enumerate(orgs):
            what = (
                "suspended: every request is refused" if o.status != "operational"
                else "unlimited" if o.allowance is None
                else f"{o.allowance:,} credits a month, notices at 80 % and 100 %"
            )  # fmt: skip
            out(_kv("organizations" if n == 0 else "", f"{o.name:<{names}}  {what}"))
        for n, (scope, scope_id, window, limit) in enumerate(BUDGETS):
            default = scope_id == "*"
            whom = f"every {scope.replace('_', ' ')} ('*')" if default else f"{scope} {scope_id}"
            out(_kv("budgets" if n == 0 else "", f"{by_key['globex'].name}: {whom}, "
                    f"{limit:,} credits a {window}, notices at 80 % and 100 %"))  # fmt: skip
        out(_kv("task kinds", ", ".join(TASK_KINDS)))
        for n, (model, rates) in enumerate(PRICES.items()):
            listed = ", ".join(f"{c} {r}" for c, r in rates.items())
            out(_kv("prices (a million tokens)" if n == 0 else "", f"{model}: {listed}"))
        out(_kv("", f"a credit is {NANOS_PER_CREDIT:,} nanos ({money(NANOS_PER_CREDIT)} USD); every request is"
                " admitted with its token counts and settled with the provider's usage"))  # fmt: skip

        # 1. the day of traffic
        out("")
        out(f"1. A day of traffic: {day_start:%Y-%m-%d %H:%M} -> {day_end:%Y-%m-%d %H:%M} UTC "
            f"(a simulated clock, passed as now=)")  # fmt: skip
        t = time.monotonic()
        tally = _run_workers(dsn, plan_traffic(seed, workers, orgs), by_key, day_start)
        traffic_seconds = time.monotonic() - t
        traffic = _traffic_figures(tally, orgs)
        out("")
        out(format_table(
            ["organization", "admitted", "settled", "failed", "crashed", "refused"],
            [
                (o.name, traffic["by_organization"][o.key]["admitted"],
                 traffic["by_organization"][o.key]["settled"],
                 traffic["by_organization"][o.key]["failed"],
                 traffic["by_organization"][o.key]["crashed"],
                 traffic["by_organization"][o.key]["refused"])
                for o in orgs
            ],
        ))  # fmt: skip
        out("")
        out(f"  {traffic['admitted']:,} requests admitted in {traffic_seconds:.1f} s of wall time "
            f"({workers} threads, each its own connection)")  # fmt: skip
        out(f"  refused: {traffic['refused_allowance']} over the allowance (LL001), "
            f"{traffic['refused_budget']} over a budget (LL001 naming it), "
            f"{traffic['refused_suspended']} for the suspended organization (LL003)")  # fmt: skip
        out(f"  tasks: {traffic['tasks_completed']} completed, {traffic['tasks_failed']} failed "
            f"(the body raised), {traffic['tasks_left_running']} left running "
            "(its worker died inside it)")  # fmt: skip
        out(f"  crashed workers: {_n(traffic['crashed'], 'request')} dispatched and never "
            f"settled, holding {traffic['crashed_hold_credits']:,} credits")  # fmt: skip

        drift = _inject_drift(conn, ids, out)

        # 2. the pass, 25 hours later
        before = _state(llm, pass_clock, ids)
        out("")
        out(f"2. 25 hours later: the clock moves to {pass_clock:%Y-%m-%d %H:%M} UTC, past the "
            "24 h recovery window,")  # fmt: skip
        out(f"   and the hourly pass runs: CALL llm.run_reconciliation(p_now => "
            f"'{pass_clock:%Y-%m-%d %H:%M:%S}+00')")  # fmt: skip
        run = llm.run_reconciliation(now=pass_clock)
        if run is None:
            raise DemoError("the pass recorded no llm.reconciliation_runs row")
        llm.rebuild_daily_usage(day_start.date(), pass_clock.date())
        after = _state(llm, pass_clock, ids)
        out("")
        out(_before_after(before, after, drift is not None))
        out("")
        duration = (run.finished_at - run.started_at).total_seconds() if run.finished_at else 0
        out(f"  the pass: {run.status} in {duration:.2f} s; "
            f"{_n(run.orgs_visited, 'organization')} visited, "
            f"{_n(run.requests_recovered, 'request')} recovered at their estimate,")  # fmt: skip
        out(f"  {run.released_hold_credits:,} hold credits released, "
            f"{_n(run.past_window_alerts, 'past-window alert')}, "
            f"{_n(run.executions_abandoned, 'task')} abandoned, "
            f"{_n(run.drift_findings, 'drift finding')}")  # fmt: skip
        if run.status == "skipped":
            out("  (another pass held the lock: run the demo again in a minute)")

        # 3. the books afterwards
        out("")
        out("3. The books afterwards")
        out("")
        books = _books_by_month(llm, orgs, day_start, pass_clock)
        out(format_table(
            ["organization", "month", "status", "allowance", "used", "held", "used %", "cost (USD, exact)"],
            [
                (b["name"], b["month"], b["status"],
                 "unlimited" if b["allowance_credits"] is None else b["allowance_credits"],
                 b["used_credits"], b["held_credits"],
                 "-" if not b["allowance_credits"] else
                 f"{100 * b['used_credits'] // b['allowance_credits']}%",
                 money(b["used_cost_nanos"]))
                for b in books
            ],
            align="lllrrrrr",
        ))  # fmt: skip
        out("  (one row per month: an allowance is a month's, so each month is judged on its own;")
        out("   the cost is what the book priced from the providers' usage, to the nano; a request")
        out("   recovered at its estimate has none)")
        out("")
        budgets = _budget_totals(conn, by_key["globex"], out)
        out("")
        delivered = None
        if embedded is not None:
            delivered = _deliver(llm, pass_clock, out)
        else:
            out("  notices: left owed in your database (deliver them with "
                "`llm-db worker --url ...`)")  # fmt: skip
        violations = [v for v in llm.check_invariants() if v.organization_id in set(ids)]
        verdict = "the books are right" if not violations else "VIOLATED"
        out(f"  check_invariants(): {len(violations)} violations - {verdict}")
        for v in violations[:10]:
            out(f"    invariant {v.invariant}: {v.subject}: {v.detail}")

    return {
        "mode": "dsn" if embedded is None else "embedded",
        "seed": seed,
        "workers": workers,
        "database": dbname,
        "server": embedded,
        "organizations": {
            o.key: {"id": o.id, "name": o.name, "status": o.status, "allowance": o.allowance}
            for o in orgs
        },
        "clock": {"day_start": day_start, "day_end": day_end, "pass": pass_clock},
        "traffic": traffic,
        "injected_drift": drift,
        "books": books,
        "budgets": budgets,
        "before": before,
        "after": after,
        "run": jsonable(dataclasses.asdict(run)),
        "notices_delivered": delivered,
        "invariant_violations": len(violations),
    }


def _books_by_month(
    llm: Llm, orgs: list[DemoOrg], day_start: datetime, pass_clock: datetime
) -> list[dict[str, Any]]:
    """Each organization's books per month (``llm.report_periods``) from the day of traffic
    to the pass: a month's usage against that month's allowance, never two months against
    one. An organization that never opened a period (the suspended one) has one row of
    zeros for the month of the traffic."""
    periods = llm.report_periods(day_start.date(), pass_clock.date(), [o.id for o in orgs])
    books = []
    for o in orgs:
        mine = [p for p in periods if p["organization_id"] == o.id]
        books += [
            {"organization": o.key, "name": o.name, "month": p["period_start"].strftime("%Y-%m"),
             "status": p["status"], "allowance_credits": p["allowance_credits"],
             "used_credits": p["used_credits"], "held_credits": p["held_credits"],
             "used_cents": p["used_cents"], "used_cost_nanos": p["used_cost_nanos"]}
            for p in mine
        ] or [
            {"organization": o.key, "name": o.name, "month": f"{day_start:%Y-%m}",
             "status": o.status, "allowance_credits": o.allowance,
             "used_credits": 0, "held_credits": 0, "used_cents": 0, "used_cost_nanos": 0}
        ]  # fmt: skip
    return books


def _traffic_figures(tally: Tally, orgs: list[DemoOrg]) -> dict[str, Any]:
    by_org = {}
    for o in orgs:
        c = tally.by_org.get(o.key, Counter())
        by_org[o.key] = {
            "admitted": c["admitted"],
            "settled": c["settled"],
            "failed": c["failed"],
            "crashed": c["crashed"],
            "crashed_hold_credits": c["crashed_hold_credits"],
            "refused_allowance": c["refused_allowance"],
            "refused_budget": c["refused_budget"],
            "refused_suspended": c["refused_suspended"],
            "refused": c["refused_allowance"] + c["refused_budget"] + c["refused_suspended"],
        }
    total = {
        k: sum(v[k] for v in by_org.values())
        for k in ("admitted", "settled", "failed", "crashed", "crashed_hold_credits",
                  "refused_allowance", "refused_budget", "refused_suspended")
    }  # fmt: skip
    return {
        **total,
        "tasks_completed": tally.tasks["completed"],
        "tasks_failed": tally.tasks["failed"],
        "tasks_left_running": tally.tasks["left_running"],
        "by_organization": by_org,
    }


def _budget_totals(conn: psycopg.Connection, org: DemoOrg, out: Out) -> list[dict[str, Any]]:
    """Print and return the organization's budgets per window (``BUDGET_TOTALS``)."""
    with conn.cursor(row_factory=dict_row) as cur:
        found = cur.execute(BUDGET_TOTALS, {"organization_id": org.id}).fetchall()
    out(f"  {org.name}'s budgets, from llm.budget_usage ('*': every end user, each counted "
        "on its own)")  # fmt: skip
    out(format_table(
        ["scope", "id", "window", "start", "limit", "ids", "used", "most used", "at 80 %"],
        [(r["scope"], r["scope_id"], r["budget_window"], r["window_start"], r["limit_credits"],
          r["ids"], r["used_credits"], r["most_used"], r["near_limit"]) for r in found],
        align="llllrrrrr",
    ))  # fmt: skip
    return jsonable(found)


def _inject_drift(
    conn: psycopg.Connection, ids: list[uuid.UUID], out: Out
) -> dict[str, Any] | None:
    found = conn.execute(PICK_CLOSED_TASK, {"organization_ids": ids}).fetchone()
    if found is None:
        out("  injected fault: skipped (no completed task to edit)")
        return None
    organization_id, execution_id = found
    try:
        conn.execute(INJECT_DRIFT, {"credits": DRIFT_CREDITS, "organization_id": organization_id,
                                    "execution_id": execution_id})  # fmt: skip
    except psycopg.errors.InsufficientPrivilege:
        out("  injected fault: skipped (this role may not write llm.executions directly, "
            "as it should be)")  # fmt: skip
        return None
    out(f"  injected fault: UPDATE llm.executions SET credits = credits + {DRIFT_CREDITS}")
    out(f"                  WHERE id = '{execution_id}'")
    out("                  a superuser edit behind the functions' back: that task's totals")
    out("                  no longer match its requests")
    return {"organization_id": organization_id, "execution_id": execution_id,
            "credits_added": DRIFT_CREDITS}  # fmt: skip


def _state(llm: Llm, now: datetime, ids: list[uuid.UUID]) -> dict[str, Any]:
    state: dict[str, Any] = {**llm.books_snapshot(ids, now=now), **llm.books_history(ids)}
    state["health"] = llm.health(now=now).status
    state["invariant_violations"] = sum(
        1 for v in llm.check_invariants() if v.organization_id in set(ids)
    )
    return state


BEFORE_AFTER_ROWS = [
    ("open_requests", "requests holding credits"),
    ("held_credits", "credits held"),
    ("stale_open_requests", "  of them past the 24 h recovery window"),
    ("recovered_requests", "requests settled by recovery"),
    ("past_window_alerts", "past-window alerts stamped"),
    ("running_tasks", "tasks running"),
    ("abandoned_tasks", "tasks abandoned"),
    ("drift_findings", "drift findings"),
    ("notices_owed", "threshold notices owed"),
    ("health", "reconciliation health"),
    ("invariant_violations", "invariant violations"),
]


def _before_after(before: dict[str, Any], after: dict[str, Any], injected: bool) -> str:
    rows = []
    for key, label in BEFORE_AFTER_ROWS:
        b, a = before[key], after[key]
        if key == "invariant_violations" and injected and b:
            b = f"{b} *"
        rows.append((label, b, a))
    table = format_table(["", "before the pass", "after"], rows, align="lrr")
    if injected and before["invariant_violations"]:
        table += ("\n  * the injected fault; the pass lists it in llm.drift_findings "
                  "(reported, never repaired)")  # fmt: skip
    return table


def _deliver(llm: Llm, now: datetime, out: Out) -> int | None:
    from llm_db._extras import INSTALL_HINT, WORKER_MODULES, MissingExtra, require
    from llm_db.service.notices import deliver_notices

    try:
        for name in WORKER_MODULES:
            require(name)
    except MissingExtra:
        out(f"  notices: left owed (delivering them to a local webhook needs {INSTALL_HINT})")
        return None
    sent = 0
    with _webhook() as (url, inbox):
        while True:
            summary = deliver_notices(llm, url, WEBHOOK_SECRET, now=now, timeout=5.0)
            sent += summary.sent
            if summary.claimed == 0 or summary.failed:
                break
    out(f"  notices: {_n(sent, 'notice')} delivered to a local webhook, "
        f"{inbox.verified} of {inbox.received} signatures verified")  # fmt: skip
    return sent
