"""The concurrent model-based simulation ("A concurrent, model-based proof").

Each history is seeded: ``concurrent_model.plan(seed)`` draws 5 rounds for 4
sessions. In a round every session runs its short list of operations (1 to 3
slots, an admission often followed by its dispatch, a claim by the ends of what
it claimed) at once with the others, each in its own thread on its own real
connections: one logged in as role ``sim_app`` (a LOGIN member of llm_app:
admissions (estimates from 0, which hold nothing, to 40), some into a task
opened just before and sometimes closed just after, dispatches, settlements, failures, late settlements, closing tasks of
earlier rounds) and one as
``sim_operator`` (a LOGIN member of llm_operator: the pass under the round's
clock, one 20-40 days ahead or one up to two days behind (a lagging scheduler's
clock, which may precede the round's own admissions), sometimes two passes at once,
``set_period_stripes``, allowance and threshold changes, recovery-policy
changes, budgets set, changed and removed (own and ``'*'``,
organization day/week, project/api_key/end_user day/week/month, while the
admissions name scope ids of a small pool), and notice work: claiming, completing, failing, releasing, going stale,
and ending a stale claim rounds later). The superuser only creates the roles and
empties the tables between histories (a clone per history costs a checkpoint;
emptying is what tests/test_simulation.py does). Clocks move forward between
rounds by 5 minutes to 3 days from the 30th of a month, so histories cross a
month boundary and the recovery window; a first pass at the start gives later
passes a complete rebuild of daily usage to catch up from.

Commit order is exact, not guessed: every operation but the pass runs in its
own transaction, and the thread takes a Python lock around its COMMIT and the
append to the shared history, so the history lists the transactions in the
order they committed (a COMMIT never waits for a row lock, so the lock
serializes only commits, never the statements). The pass commits many times
inside ``CALL``; it is appended when it returns, and the plan keeps the rounds
with a pass decidable without its place (tests/concurrent_model.py).

The end of a round is a quiescent point: all sessions idle, all committed. The
model (``concurrent_model.Model``) is built from the committed results, never by
re-deciding what the order decided, and the books must equal it: each period's
allowance, used, held and cents; each request's status, kind, charges, period,
alert and late record, scope ids and budget_mask; each budget counter's used,
held and cents (invariant 14); each task's status and totals (no drift finding); each
notice's status and attempts, and a notice for
every level used stands at or above; ``sweep_totals``; every pass succeeded or
was skipped; ``llm.check_invariants()`` empty (docs/contract.md "Invariants");
after a round with a pass, the daily usage of the day before its clock.
At the end a final pass runs alone; then ``daily_usage`` must equal the
requests, and ``llm.check_daily_usage`` (when it exists) must return nothing.
Notice calls go through ``NoticeWorker``, which passes the claim token when
``complete_notice`` takes one and cannot before.

On 0.2.0 (e283082) it fails, as it should: it finds the concurrency defects
0.3.0 fixed (CHANGELOG 0.3.0, "Books airtight under concurrent actors"; each with its
own message), and a pass
that a fresh session of an operator LOGIN cannot run (42501 on ``llm._clock_ok``,
since granted; tests/test_roles.py proves it). With those fixes it passes.

Knobs: ``LLM_DB_SIM_HISTORIES`` (200 when ``CI=true``, 30 otherwise) from seed
``LLM_DB_SIM_SEED`` (0); ``LLM_DB_SIM_SURVEY=1`` runs every history and lists
each failing seed's first finding (and writes its history);
``LLM_DB_SIM_RECORD=<folder>`` writes every history that passed as JSON. On a
failure the test prints the seed and the committed history (one line per call:
session, op, arguments, result) and writes it as JSON to ``LLM_DB_SIM_OUT``
(default /tmp/llm-db-sim-<seed>.json). ``test_replay_committed_history`` re-runs
such a file sequentially in commit order on one session and checks the model
again (built from the replay's own results): the files of tests/sim_histories/
always, and the one named by ``LLM_DB_SIM_REPLAY``. A concurrent history is not
exactly repeatable from its seed (stripes follow backend pids, notice ids are
random, the threads interleave anew): the written history is what replays.
Run alone: ``bash scripts/test.sh tests/test_concurrent_simulation.py``.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid
from collections import Counter
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from concurrent_model import (
    ALLOWANCE,
    RETENTIONS,
    SETUP,
    START,
    TASK_KIND,
    Mismatch,
    Model,
    iso,
    plan,
    request_scopes_sql,
    retention_of,
    when,
)
from psycopg import sql

from tests.helpers import CLEAN_BOOKS, call, rows

HISTORIES = int(
    os.environ.get("LLM_DB_SIM_HISTORIES", "200" if os.environ.get("CI") == "true" else "30")
)
FIRST_SEED = int(os.environ.get("LLM_DB_SIM_SEED", "0"))
SESSIONS = 4
SURVEY = os.environ.get("LLM_DB_SIM_SURVEY") == "1"  # run every history, then list the failures
RECORD = os.environ.get("LLM_DB_SIM_RECORD")  # a folder: every history that passed, as JSON
CORPUS = Path(__file__).parent / "sim_histories"
APP_OPS = {"admit", "dispatch", "settle", "fail", "open", "close"}  # on the sim_app connection
ENDS = {"complete", "fail_notice", "release"}  # the ends of a notice claim
OPERATIONS = APP_OPS | ENDS | {"pass", "upsert", "policy", "stripes", "claim", "budget"}
RESULTS = {"admit", "settle", "fail", "close", "stripes"} | ENDS  # also tallied by result
ROLES = {"app": ("sim_app", "llm_app"), "operator": ("sim_operator", "llm_operator")}


# ---------------------------------------------------------------- notice worker adapter


class NoticeWorker:
    """Every notice call of the simulation, before and after claim tokens (0.3.0): when
    ``claim_notices`` returns a ``claim_token`` the ends pass it right after the notice
    id (``p_claim_token``); before, they cannot, and a stale worker's end reaches
    whichever claim is live (which the model refuses)."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.tokens = conn.execute(
            "SELECT EXISTS (SELECT FROM pg_catalog.pg_proc WHERE pronamespace = 'llm'::regnamespace"
            " AND proname = 'complete_notice' AND 'p_claim_token' = ANY (proargnames))"
        ).fetchone()[0]
        conn.commit()  # idle, not in a transaction: a pass sets autocommit on this connection

    def claim(self, limit: int, now: Any) -> list[dict[str, Any]]:
        return rows(self.conn, "SELECT * FROM llm.claim_notices(p_limit => %(limit)s, p_now => %(now)s)",
                    {"limit": limit, "now": now})  # fmt: skip

    def end(self, action: str, org: str, notice_id: uuid.UUID, token: Any, now: Any) -> bool:
        routine = {
            "complete": "complete_notice",
            "fail_notice": "fail_notice",
            "release": "release_notice",
        }[action]
        args = [
            sql.SQL("p_organization_id => %(org)s::uuid"),
            sql.SQL("p_notice_id => %(id)s::uuid"),
        ]
        if self.tokens:
            args.append(sql.SQL("p_claim_token => %(token)s::uuid"))
        if action == "fail_notice":
            args.append(sql.SQL("p_error => 'webhook returned 503'"))
        args.append(sql.SQL("p_now => %(now)s"))
        query = sql.SQL("SELECT llm.{}({})").format(
            sql.Identifier(routine), sql.SQL(", ").join(args)
        )
        params = {"org": org, "id": notice_id, "token": token, "now": now}
        return self.conn.execute(query, params).fetchone()[0]


# ---------------------------------------------------------------- sessions


class Session:
    """One actor: an app and an operator connection, and the notice claims it holds
    (name -> (org, period, pct, notice id, token)), kept across rounds when it goes stale."""

    def __init__(self, index: int, app: psycopg.Connection, operator: psycopg.Connection) -> None:
        self.index, self.app, self.operator = index, app, operator
        self.worker = NoticeWorker(operator)
        self.held: dict[str, tuple[str, str, int, uuid.UUID, Any]] = {}
        self.claims = 0


class Runner:
    """Runs calls on sessions and records what committed, in commit order."""

    def __init__(self, tally: Counter) -> None:
        self.lock = threading.Lock()
        self.history: list[dict[str, Any]] = []
        self.tally = tally  # calls by operation and by result, for the summary
        self.tasks: dict[str, uuid.UUID] = {}  # replay key -> execution id, as opened

    def commit(self, conn: psycopg.Connection, entry: dict[str, Any]) -> dict[str, Any]:
        with self.lock:  # the history's order is the commit order
            if "err" in entry:
                conn.rollback()
            else:
                conn.commit()
            self.history.append(entry)
        self.tally[entry["op"]] += 1
        result = entry.get("err") or entry.get("ok") if entry["op"] in RESULTS else "ok"
        if "budget" in entry:  # a refusal: which budget (periods: the allowance)
            result = f"{result} {entry['budget'][0]}"
        self.tally[f"{entry['op']}: {result}"] += 1
        return entry

    def call(
        self, s: Session, op: str, args: dict[str, Any], recorded: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """One call as one transaction; ``recorded``: the entry of a replayed history."""
        entry: dict[str, Any] = {"session": s.index, "op": op, "args": args}
        if op in ENDS and args["claim"] not in s.held:
            # a replay in which this claim went elsewhere (the pass's place in the history
            # is where its CALL returned, not where it re-armed): nothing to end
            entry["op"] = "skipped"
            return entry
        if op == "pass":
            return self._pass(s, entry)
        conn = s.app if op in APP_OPS else s.operator
        try:
            entry["ok"] = self._run(s, conn, op, args, recorded)
        except psycopg.Error as exc:
            entry.update(_error(exc))
        return self.commit(conn, entry)

    def _pass(self, s: Session, entry: dict[str, Any]) -> dict[str, Any]:
        conn = s.operator
        conn.autocommit = True  # the procedure commits on its own
        try:
            call(conn, "run_reconciliation", now=when(entry["args"]["now"]))
            entry["ok"] = None
        except psycopg.Error as exc:
            entry.update(_error(exc))
        finally:
            conn.autocommit = False
        with self.lock:
            self.history.append(entry)
        self.tally["pass"] += 1
        return entry

    def _run(self, s: Session, conn, op: str, a: dict[str, Any], recorded) -> Any:  # noqa: C901 - one branch per op
        now = when(a["now"]) if "now" in a else None
        if op == "admit":
            task = self.tasks.get(a["task"], uuid.UUID(int=0)) if a.get("task") else None
            call(conn, "admit", a["org"], a["estimate"], a["model"], execution_id=task, invocation_id=a["inv"],
                 now=now, project=a.get("project"), api_key=a.get("api_key"), end_user=a.get("end_user"))  # fmt: skip
            return "admitted"
        if op == "open":
            opened = call(
                conn, "open_execution", a["org"], TASK_KIND, replay_key=a["task"], now=now
            )[0]
            self.tasks[a["task"]] = opened["execution_id"]
            return opened["replayed"]
        if op == "close":
            task = self.tasks.get(a["task"], uuid.UUID(int=0))
            return call(conn, "close_execution", a["org"], task, a["outcome"], now=now)[0]["value"]
        if op == "dispatch":
            call(conn, "mark_dispatched", a["org"], a["inv"], now=now)
            return "dispatched"
        if op == "settle":
            return call(conn, "settle", a["org"], a["inv"], a["credits"], a["cents"], input_tokens=a["tokens"],
                        output_tokens=a["tokens"], now=now)[0]["value"]  # fmt: skip
        if op == "fail":
            return call(conn, "fail", a["org"], a["inv"], "provider error", credits=a["credits"], cents=a["cents"],
                        now=now)[0]["value"]  # fmt: skip
        if op == "upsert":
            call(conn, "upsert_organization", a["org"], "sim", a["allowance"], notice_thresholds=a["thresholds"],
                 now=now)  # fmt: skip
            return None
        if op == "policy":
            call(conn, "set_recovery_policy", a["org"], a["charge"], a["late"])
            return None
        if op == "budget":
            call(conn, "set_budget", a["org"], a["scope"], a["scope_id"], a["window"], a["limit"],
                 thresholds=a["thresholds"], now=now)  # fmt: skip
            return None
        if op == "stripes":
            return call(conn, "set_period_stripes", a["org"], a["stripes"])[0]["value"]
        if op == "claim":
            # a claim names its notice (org, window start, threshold) and, for a budget's
            # notice, its scope, id and window after the claim's name
            names = {
                (*k[:3], *(k[4:] or ALLOWANCE)): k[3] for k in (recorded or {}).get("ok") or []
            }
            claimed = []
            for n in s.worker.claim(a["limit"], now):
                key = (str(n["organization_id"]), n["period_start"].isoformat(), n["threshold_pct"])
                budget = (n["scope"], n["scope_id"], n["budget_window"])
                s.claims += 1
                # a replay names a claim its recording did not make apart from the recorded ones
                name = names.get((*key, *budget), f"{'replay' if recorded else s.index}.{s.claims}")
                s.held[name] = (*key, n["id"], n.get("claim_token"), budget)
                claimed.append([*key, name, *(budget if budget != ALLOWANCE else ())])
            return claimed
        if op in ENDS:
            org, _, _, notice_id, token, _ = s.held.pop(a["claim"])
            return s.worker.end(op, org, notice_id, token, now)
        raise AssertionError(f"unknown op {op}")

    # ------------------------------------------------------------ a round of the plan

    def session_round(
        self, s: Session, ops: list[dict[str, Any]], clock: str, pass_clock: str
    ) -> None:
        """Translate the plan's ops into calls (notice work decided from what was claimed)."""
        for op in ops:
            kind = op["op"]
            if kind == "pass":
                self.call(s, "pass", {"now": pass_clock})
            elif kind == "claim":
                rng = random.Random(op["seed"])
                entry = self.call(s, "claim", {"limit": op["limit"], "now": clock})
                for org, period, pct, name, *budget in entry.get("ok") or []:
                    action = rng.choices(
                        ("complete", "fail_notice", "release", "stale"), (35, 15, 10, 40)
                    )[0]
                    # stale: kept, never finished (until end_stale, rounds later)
                    if action != "stale":
                        self.call(s, action, _end_args(org, period, pct, name, budget, clock))
            elif kind == "end_stale":
                rng = random.Random(op["seed"])
                for name, (org, period, pct, _, _, budget) in sorted(s.held.items()):
                    action = rng.choice(("complete", "fail_notice", "release"))
                    self.call(s, action, _end_args(org, period, pct, name, budget, clock))
            else:
                args = {k: v for k, v in op.items() if k not in ("op", "back_hours")}
                now = (
                    clock
                    if "back_hours" not in op
                    else iso(when(clock) - timedelta(hours=op["back_hours"]))
                )
                self.call(s, kind, {**args, "now": now})


def _end_args(org: str, period: str, pct: int, name: str, budget, clock: str) -> dict[str, Any]:
    """The arguments of the end of a claim; a budget's notice adds its scope, id and window."""
    args = {"org": org, "period": period, "pct": pct, "claim": name, "now": clock}
    return args | ({"budget": list(budget)} if budget and tuple(budget) != ALLOWANCE else {})


def _error(exc: psycopg.Error) -> dict[str, Any]:
    """A refused call in the history: its SQLSTATE (the result) and message (for people);
    a refusal (LL001) also the budget it names: TABLE (budgets, or periods for the
    allowance), CONSTRAINT (scope), COLUMN (window) and the DETAIL's first line (the id)."""
    found = {"err": exc.sqlstate or type(exc).__name__, "msg": exc.diag.message_primary}
    if exc.sqlstate == "LL001":
        d = exc.diag
        found["budget"] = [
            d.table_name,
            d.constraint_name,
            d.column_name,
            (d.message_detail or "").split("\n")[0],
        ]
    return found


# ---------------------------------------------------------------- checks


def check_books(conn: psycopg.Connection, model: Model) -> None:
    """The books equal the model at a quiescent point (see the module docstring)."""
    q = conn.execute
    counters = {(o, s, i, w, d): (u, h, c) for o, s, i, w, d, u, h, c in q(
        "SELECT organization_id::text, scope, scope_id, budget_window, window_start, used_credits,"
        " held_credits, used_cents FROM llm.budget_counters")}  # fmt: skip
    model.retain(counters)  # first: a purged window owes no notice (a late true-up moves nothing)
    db_notices = {}
    for org, start, pct, scope, scope_id, window, status, attempts, due in q(
        "SELECT organization_id::text, period_start, threshold_pct, scope, scope_id, budget_window, status,"
        " attempts, next_attempt_at FROM llm.threshold_notices"
    ):
        model.learn_notice((org, start, pct, scope, scope_id, window), status, attempts, due)
        db_notices[(org, start, pct, scope, scope_id, window)] = (status, attempts)
    _same("notices (status, attempts)", db_notices, model.notice_states())
    missing = model.required_notices() - db_notices.keys()
    if missing:
        raise Mismatch(
            f"no notice for levels used stands at or above: {sorted(missing)} (a threshold or allowance change owes them)"
        )
    _same("periods (allowance, used, held, cents)", {
        (o, s): tuple(r) for o, s, *r in q(
            "SELECT organization_id::text, period_start, allowance_credits, used_credits, held_credits, used_cents"
            " FROM llm.periods")}, model.periods())  # fmt: skip
    scopes = {str(i): tuple(r) for _, i, *r in q(request_scopes_sql(conn))}
    requests = {i: (*r, *scopes[i]) for i, *r in q(
        "SELECT id::text, status, settlement_kind, charged_credits, charged_cents, period_start,"
        " past_window_alerted_at IS NOT NULL, late_reported_at IS NOT NULL, recovered_credits"
        " FROM llm.invocations")}  # fmt: skip
    expected = model.invocations()
    unlate = {k: v[:6] + v[7:] for k, v in expected.items()}  # all but the late record
    late_only = requests.keys() == expected.keys() and all(
        v[:6] + v[7:] == unlate[k] for k, v in requests.items()
    )
    hint = "; only late records differ: a late failure after recovery records its figures since 0.3.0"
    _same("requests", requests, expected, hint if late_only else "")
    _same("budget counters (used, held, cents)", counters, model.counters())
    _same("tasks (status, requests, credits, cents, ended)", {
        k: tuple(r) for k, *r in q(
            "SELECT replay_key, status, request_count, credits, cents, ended_at IS NOT NULL"
            " FROM llm.executions")}, model.executions())  # fmt: skip
    drift = q(
        "SELECT execution_id, recorded_credits, settled_credits FROM llm.drift_findings"
    ).fetchall()
    if drift:
        raise Mismatch(f"drift findings: {drift}")
    totals = {o: tuple(r) for o, *r in q(
        "SELECT organization_id::text, recovered_requests, recovered_uncharged, past_window_alerts"
        " FROM llm.sweep_totals")}  # fmt: skip
    _same("sweep_totals", {o: totals.get(o, (0, 0, 0)) for o in model.orgs}, model.sweep_totals())
    # a skipped pass records the holder it met as its one error; a failed one lost its lease
    bad_runs = q("SELECT status, errors::text FROM llm.reconciliation_runs"
                 " WHERE status NOT IN ('succeeded', 'skipped') OR status = 'succeeded' AND errors <> '[]'").fetchall()  # fmt: skip
    if bad_runs:
        raise Mismatch(f"passes that did not succeed: {bad_runs}")
    violations = call(conn, "check_invariants")
    if violations:
        raise Mismatch(f"check_invariants(): {violations}")


def check_daily(conn: psycopg.Connection, model: Model) -> None:
    """After the final pass, with no traffic: daily usage equals the requests (a true-up
    racing the rebuild of its day, a pass with a clock ahead), and llm.check_daily_usage agrees where it exists."""
    _same("daily_usage", _daily(conn), model.daily())
    if conn.execute(
        "SELECT to_regprocedure('llm.check_daily_usage(date, date)') IS NOT NULL"
    ).fetchone()[0]:
        days = [d for _, d, _ in model.daily()] or [START.date()]
        found = rows(conn, "SELECT * FROM llm.check_daily_usage(%s, %s)", [min(days), max(days)])
        if found:
            raise Mismatch(f"check_daily_usage: {found}")


def check_yesterday(conn: psycopg.Connection, model: Model, day: date) -> None:
    """After a round with a pass: the day before the pass's clock is one every pass
    rebuilds (the last settings.reporting_days), and no call of the round settles on it
    (a round's calls run on the round's clock), so it must equal its requests: a true-up
    of a request recovered that day counts whatever the interleaving."""
    expected = {k: v for k, v in model.daily().items() if k[1] == day}
    _same(f"daily_usage of {day}", {k: v for k, v in _daily(conn).items() if k[1] == day}, expected)


def _daily(conn: psycopg.Connection) -> dict[tuple, tuple]:
    """daily_usage keyed by (organization, day, model)."""
    return {(o, d, m): tuple(r) for o, d, m, *r in conn.execute(
        "SELECT organization_id::text, day, model, requests, recovered_requests, credits, cents,"
        " input_tokens, output_tokens FROM llm.daily_usage")}  # fmt: skip


def _same(what: str, db: dict, expected: dict, hint: str = "") -> None:
    if db != expected:
        diff = {
            k: (db.get(k), expected.get(k))
            for k in db.keys() | expected.keys()
            if db.get(k) != expected.get(k)
        }
        raise Mismatch(
            f"{what} differ (database, model): {dict(sorted(diff.items(), key=str))}{hint}"
        )


# ---------------------------------------------------------------- one history


def setup_books(conn: psycopg.Connection, model: Model, seed: int) -> list[dict[str, Any]]:
    """The organizations, their policies and stripes, and a first pass (so a later pass
    has a complete rebuild to catch up from); returns the setup calls."""
    rng = random.Random(seed ^ 0x5EED)
    calls = []
    for org, (allowance, thresholds, stripes) in SETUP.items():
        charge, late = (
            rng.choice(("estimate", "dispatched", "none")),
            rng.choice(("audit", "true_up")),
        )
        call(
            conn,
            "upsert_organization",
            org,
            "sim",
            allowance,
            notice_thresholds=thresholds,
            now=START,
        )
        call(conn, "set_recovery_policy", org, charge, late)
        call(conn, "set_period_stripes", org, stripes)
        model.setup(org, allowance, thresholds, charge, late)
        calls.append({"org": org, "allowance": allowance, "thresholds": list(thresholds), "charge": charge,
                      "late": late, "stripes": stripes})  # fmt: skip
    call(conn, "declare_task_kind", TASK_KIND)
    call(conn, "run_reconciliation", now=START)
    return calls


def run_history(record: dict[str, Any], sessions: list[Session], checker: psycopg.Connection,
                superuser: psycopg.Connection, tally: Counter, *,
                replay: dict[str, Any] | None = None) -> None:  # fmt: skip
    """One history, concurrent (or, with ``replay``, that committed history re-run on one
    session in commit order), written into ``record`` as it commits; counts into ``tally``.
    Raises Mismatch."""
    seed = record["seed"]
    for statement in CLEAN_BOOKS:
        superuser.execute(statement)
    for s in sessions:
        s.held.clear()
    model = Model()
    # budget_retention: a replay keeps its recording's (none recorded: the default)
    retention = (replay or {}).get("retention", "400 days") if replay else retention_of(seed)
    superuser.execute("UPDATE llm.settings SET budget_retention = %s::interval", [retention])
    model.retention = RETENTIONS[retention]
    record.update(retention=retention, setup=setup_books(checker, model, seed), rounds=[])
    model.observe(horizons(checker))
    model.horizons = dict(model.horizons_end)  # where the setup's pass left them
    runner = Runner(tally)
    rounds = replay["rounds"] if replay else plan(seed, len(sessions))
    for info in rounds:
        runner.history = []
        if replay:
            for entry in info["history"]:  # one session replays every call, in commit order
                done = runner.call(sessions[0], entry["op"], entry["args"], entry)
                done["session"] = entry["session"]  # the worker the model knows the claims by
        else:
            crashed: list[BaseException] = []
            threads = [threading.Thread(target=_session, args=(runner, s, ops, info, crashed))
                       for s, ops in zip(sessions, info["sessions"], strict=True)]  # fmt: skip
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
                assert not t.is_alive(), "a session did not finish its round"
            assert not crashed, f"a session stopped in its round: {crashed[0]!r}"
        masks(checker, runner.history)
        record["rounds"].append({k: v for k, v in info.items() if k not in ("sessions", "history")}
                                | {"history": runner.history})  # fmt: skip
        model.observe(horizons(checker))
        model.round(info, runner.history)
        check_books(checker, model)
        if any(e["op"] == "pass" for e in runner.history):
            check_yesterday(checker, model, when(info["pass_clock"]).date() - timedelta(days=1))
    final = iso(when(rounds[-1]["clock"]) + timedelta(hours=1)) if rounds else iso(START)
    call(checker, "run_reconciliation", now=when(final))
    record["final_pass"] = final
    model.observe(horizons(checker))
    model.round(
        {"clock": final, "pass_clock": final},
        [{"session": -1, "op": "pass", "args": {"now": final}}],
    )
    check_books(checker, model)
    check_daily(checker, model)
    tally["counters purged"] += len(model.purged)
    tally["admitted dated back"] += sum(
        1 for r in record["rounds"] for e in r["history"]
        if e["op"] == "admit" and "err" not in e and when(e["args"]["now"]) < when(r["clock"]))  # fmt: skip
    tally["histories passed"] += 1


def horizons(conn: psycopg.Connection) -> dict[str, date]:
    """Each organization's budget retention horizon (llm.budget_horizons)."""
    return dict(
        conn.execute("SELECT organization_id::text, horizon FROM llm.budget_horizons").fetchall()
    )


def _session(runner: Runner, s: Session, ops: list[dict[str, Any]], info: dict[str, Any],
             crashed: list[BaseException]) -> None:  # fmt: skip
    """A session's round in its thread; what stops it is kept: a lost round fails the history."""
    try:
        runner.session_round(s, ops, info["clock"], info["pass_clock"])
    except BaseException as exc:
        crashed.append(exc)


def masks(conn: psycopg.Connection, history: list[dict[str, Any]]) -> None:
    """Each committed admission's budget_mask, the counters it was admitted under (read
    after the round: llm_app may not read llm.invocations), into its history entry."""
    admitted = [e for e in history if e["op"] == "admit" and "err" not in e]
    found = {str(i): r[-1] for _, i, *r in conn.execute(request_scopes_sql(conn))}
    for e in admitted:
        e["mask"] = found.get(e["args"]["inv"], 0)


def describe(record: dict[str, Any]) -> str:
    """The committed history, one line per call: round, session, op, args, result."""
    lines = [f"seed {record['seed']}; setup {record['setup']}"]
    for r, info in enumerate(record["rounds"]):
        lines.append(f"round {r}: clock {info['clock']}, pass clock {info['pass_clock']}")
        for e in info["history"]:
            result = f"ERROR {e['err']} {e.get('msg')}" if "err" in e else repr(e.get("ok"))
            lines.append(
                f"  s{e['session']} {e['op']} {json.dumps(e['args'], default=str)} -> {result}"
            )
    lines.append(f"final pass at {record.get('final_pass')}")
    return "\n".join(lines)


# ---------------------------------------------------------------- fixtures and tests


@pytest.fixture
def sim_sessions(llm_conn, llm_dsn) -> list[Session]:
    """SESSIONS sessions, each logged in as sim_app and as sim_operator (LOGIN roles that
    are members of llm_app and llm_operator, not a superuser under SET ROLE)."""
    for login, group in ROLES.values():
        llm_conn.execute(sql.SQL(
            "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {n}) THEN CREATE ROLE {i} LOGIN IN ROLE {g};"
            " END IF; END $$").format(n=sql.Literal(login), i=sql.Identifier(login), g=sql.Identifier(group)))  # fmt: skip
    opened = []

    def login(role: str, autocommit: bool = False) -> psycopg.Connection:
        conn = psycopg.connect(llm_dsn, user=ROLES[role][0], autocommit=autocommit)
        opened.append(conn)
        return conn

    sessions = [Session(i, login("app"), login("operator")) for i in range(SESSIONS)]
    checker = Session(SESSIONS, login("app"), login("operator", autocommit=True))
    sessions.append(checker)
    try:
        yield sessions
    finally:
        for conn in opened:
            conn.close()
        for login_role, _ in ROLES.values():  # cluster-wide: leave none behind for later tests
            llm_conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(login_role)))


def _written(record: dict[str, Any]) -> Path:
    """The committed history as JSON, where a replay can read it."""
    path = Path(os.environ.get("LLM_DB_SIM_OUT", f"/tmp/llm-db-sim-{record['seed']}.json"))
    path.write_text(json.dumps(record, default=str, indent=1))
    return path


def _fail_with(record: dict[str, Any], error: Exception) -> None:
    path = _written(record)
    pytest.fail(f"seed {record['seed']}: {error}\ncommitted history (also in {path}; replay it with "
                f"LLM_DB_SIM_REPLAY={path}):\n{describe(record)}", pytrace=False)  # fmt: skip


def test_concurrent_histories_keep_the_books_equal_to_the_model(sim_sessions, llm_conn, capsys):
    """Invariants 1-9 and the model at every quiescent point of HISTORIES seeded histories
    of 4 sessions at once (CAP-PFM-LLM-007 admission with stripes, WF-PFM-LLM-004 passes,
    BR-CAP-PFM-LLM-009-01 recovery charges, BR-CAP-PFM-LLM-009-07 sweep totals, notices),
    with the right behaviour of every concurrency defect 0.3.0 fixed; and budgets
    (invariants 14 and 15): every admission decided wholly with or wholly without each
    concurrent set_budget, no counter over its limit, every counter equal to its requests,
    refusals naming the first budget that does not fit; and retention under a
    budget_retention from 1 hour to 400 days with admissions dated into old windows: no
    purged window admitted again, LL012 only past the horizon, the horizon never past an
    open request."""
    sessions, checker = sim_sessions[:SESSIONS], sim_sessions[SESSIONS].operator
    started, tally, survey = time.monotonic(), Counter(), []
    for seed in range(FIRST_SEED, FIRST_SEED + HISTORIES):
        record: dict[str, Any] = {"seed": seed}
        try:
            run_history(record, sessions, checker, llm_conn, tally)
            if RECORD:
                Path(RECORD, f"seed-{seed}.json").write_text(
                    json.dumps(record, default=str, indent=1)
                )
        except Mismatch as error:
            if not SURVEY:
                _fail_with(record, error)
            survey.append(f"seed {seed}: {str(error)[:300]} ({_written(record)})")
    with capsys.disabled():
        calls = sum(v for k, v in tally.items() if k in OPERATIONS)
        print(f"\n[concurrent simulation] {HISTORIES} histories x {SESSIONS} sessions, {calls} calls in "
              f"{time.monotonic() - started:.1f} s; {dict(sorted(tally.items()))}")  # fmt: skip
    if survey:
        pytest.fail(
            f"{len(survey)} of {HISTORIES} histories failed:\n" + "\n".join(survey), pytrace=False
        )


def _corpus() -> list[Path]:
    files = sorted(CORPUS.glob("*.json"))
    if os.environ.get("LLM_DB_SIM_REPLAY"):
        files.append(Path(os.environ["LLM_DB_SIM_REPLAY"]))
    return files


@pytest.mark.parametrize("path", _corpus(), ids=lambda p: p.stem)
def test_replay_committed_history(path, sim_sessions, llm_conn):
    """A recorded committed history re-run sequentially in commit order on one session
    keeps the books equal to the model built from its results (invariants 1-9).

    A replay may claim notices in another order than its recording (notices crossed at
    one instant are claimed in the order of their random ids, and the pass runs where
    its CALL returned): its model follows its own results, and an end of a claim it
    never made is skipped. On 0.2.0 such a divergence can itself meet a stale claim's end,
    so the corpus keeps histories whose replays were seen to pass five times in a row."""
    recorded = json.loads(path.read_text())
    try:
        run_history(
            {"seed": recorded["seed"]},
            sim_sessions[:1],
            sim_sessions[SESSIONS].operator,
            llm_conn,
            Counter(),
            replay=recorded,
        )
    except Mismatch as error:
        pytest.fail(f"replay of {path.name} (seed {recorded['seed']}): {error}", pytrace=False)
